"""The public surface of turnguard: the names a user may import and keep, listed and checked.

    python tools/public_surface.py            print it, one dotted name a line
    python tools/public_surface.py --check    compare it with tools/public_surface.txt (exit 1, the difference)
    python tools/public_surface.py --write    rewrite tools/public_surface.txt after a change made on purpose

The surface is the facade's ``turnguard.__all__`` and the ``__all__`` of each module the API
reference documents (``docs/reference/*.md``: a ``::: dotted.name`` line names a module, or a name
in one); everything else is internal, whatever its name (``internal_modules``: what
``tools/privatize.py`` renames to ``_name``). Read from the source, nothing imported, so the
integrations' frameworks need not be installed.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
REFERENCE = ROOT / "docs" / "reference"
SURFACE = Path(__file__).resolve().parent / "public_surface.txt"
FACADE = "turnguard"
TARGET = re.compile(r"^:::\s+([\w.]+)", re.MULTILINE)
KEPT_IN_PLACE = {
    "turnguard.agents": "an installed hook runs turnguard/agents/client.py by its path (`turnguard install` writes "
                        "it into each agent's settings): moved, every installed hook would fail (exit 1, which the "
                        "agents show and go on from), leaving the agents unguarded until installed again",
}
"""Internal packages that keep their name: a path outside Python names them (``tools/privatize.py``
renames every other internal module to ``_name``)."""
UPDATE = "python tools/public_surface.py --write"


def module_path(dotted: str, src: Path = SRC) -> Path | None:
    """The source file of module ``dotted`` (a package's ``__init__.py``), or ``None``."""
    base = src.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def reference_targets(reference: Path = REFERENCE) -> list[str]:
    return [m.group(1) for page in sorted(reference.glob("*.md")) for m in TARGET.finditer(page.read_text("utf-8"))]


def owning_module(dotted: str, src: Path = SRC) -> str:
    """The module a documented name is in (the name itself when it is a module)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if module_path(".".join(parts[:end]), src):
            return ".".join(parts[:end])
    raise ValueError(f"{dotted}: no module of that name under {src}")


def public_modules(targets: list[str], src: Path = SRC) -> list[str]:
    return sorted({FACADE, *(owning_module(t, src) for t in targets)})


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"), str(path))


def declared_all(path: Path) -> list[str] | None:
    """The module's ``__all__`` as written (a literal list or tuple), or ``None``."""
    for node in parsed(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))  # type: ignore[union-attr, arg-type]
    return None


def bound_names(path: Path) -> set[str]:
    """The names a module binds at its top level (in ``if``/``try`` blocks too): definitions,
    assignments and imports; not the names bound inside its functions and classes."""
    names: set[str] = set()
    statements = list(parsed(path).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            statements += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                           *(s for h in getattr(node, "handlers", []) for s in h.body)]
        else:
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names


def surface(src: Path = SRC, reference: Path = REFERENCE) -> list[str]:
    targets = reference_targets(reference)
    names = []
    for module in public_modules(targets, src):
        declared = declared_all(module_path(module, src))  # type: ignore[arg-type]
        names += [f"{module}.{name}" for name in declared or ()]
    return sorted(names)


def problems(src: Path = SRC, reference: Path = REFERENCE) -> list[str]:
    """What breaks the rule: a public module without ``__all__``, a name in one that the module
    does not bind, a documented name outside the surface."""
    targets = reference_targets(reference)
    found = []
    for module in public_modules(targets, src):
        path = module_path(module, src)
        declared = declared_all(path)  # type: ignore[arg-type]
        if declared is None:
            found.append(f"{module}: documented in docs/reference/ but has no __all__")
            continue
        found += [f"{module}.{name}: in __all__ but not defined there" for name in declared
                  if name not in bound_names(path)]  # type: ignore[arg-type]
    listed = set(surface(src, reference))
    found += [f"{t}: documented in docs/reference/ but not in its module's __all__" for t in targets
              if t not in listed and owning_module(t, src) != t]
    return found


def internal_modules(src: Path = SRC, reference: Path = REFERENCE) -> list[str]:
    """Every module of the package outside the surface (packages' ``__init__`` and ``__main__`` aside)."""
    public = set(public_modules(reference_targets(reference), src))
    found = []
    for path in sorted((src / FACADE).rglob("*.py")):
        dotted = ".".join(path.relative_to(src).with_suffix("").parts)
        if path.stem not in ("__init__", "__main__") and dotted not in public:
            found.append(dotted)
    return found


def kept_in_place(module: str) -> bool:
    return any(module == kept or module.startswith(kept + ".") for kept in KEPT_IN_PLACE)


def unmarked_internal_modules(src: Path = SRC, reference: Path = REFERENCE) -> list[str]:
    """Internal modules whose dotted name has no ``_`` part, outside ``KEPT_IN_PLACE``: none, once
    ``tools/privatize.py`` has run."""
    return [m for m in internal_modules(src, reference)
            if not kept_in_place(m) and not any(part.startswith("_") for part in m.split("."))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List or check turnguard's public surface.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"compare with {SURFACE.name}; exit 1 when they differ")
    mode.add_argument("--write", action="store_true", help=f"rewrite {SURFACE.name}")
    args = parser.parse_args(argv)
    found = problems()
    for problem in found:
        print(f"public_surface.py: {problem}", file=sys.stderr)
    now = [f"{name}\n" for name in surface()]
    if args.write:
        SURFACE.write_text("".join(now), encoding="utf-8")
        return 1 if found else 0
    if not args.check:
        sys.stdout.writelines(now)
        return 1 if found else 0
    kept = SURFACE.read_text(encoding="utf-8").splitlines(keepends=True) if SURFACE.exists() else []
    if kept != now:
        sys.stdout.writelines(difflib.unified_diff(kept, now, SURFACE.name, "the source now"))
        print(f"The public surface changed. If on purpose: `{UPDATE}`, a CHANGELOG line, and the API "
              "reference (docs/reference/) for each added name.")
        return 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
