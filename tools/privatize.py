"""Rename turnguard's internal modules to ``_name`` and rewrite every reference to them.

    python tools/privatize.py --dry-run     print the renames, change nothing
    python tools/privatize.py               git mv, then rewrite the tracked text files

Internal is what ``tools/public_surface.py`` says is not public (the facade, hookspecs, telemetry
and the integrations are). A package holding no public module is renamed whole
(``turnguard/calibrate/`` -> ``turnguard/_calibrate/``), any other internal module alone
(``turnguard/guard.py`` -> ``turnguard/_guard.py``, ``turnguard/telemetry/otel.py`` ->
``turnguard/telemetry/_otel.py``). Then, in every tracked text file but CHANGELOG.md (a record),
this script and its test:
dotted references that name a renamed module or a name bound in one (``turnguard.guard``,
``turnguard.firing.Quiet``, ``from turnguard import plugins``), paths (``src/turnguard/guard.py``,
``turnguard/assets/...`` in pyproject.toml) and bare file names that are unique in the package
(``ledger.py``). A dotted name whose next part the module does not bind is left as it is: it is
a telemetry name (``turnguard.shadow.policy``, ``turnguard.probe.main_threshold``), as is one
after ``.`` (``[tool.turnguard.probe]``) or before ``.*``. Run it on a clean tree, then the tests.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import public_surface

ROOT = public_surface.ROOT
SRC = public_surface.SRC
PKG = public_surface.FACADE
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".txt", ".sh", ".json", ".html"}
KEEP = {"CHANGELOG.md", "privatize.py", "test_privatize.py"}
PROTECTED = ('("turnguard.snapshot", {"probe": 1})',)
"""Text that looks like a module reference but is data: the snapshot format's probe call (its
digest is every snapshot's ``key_check``), kept to the letter."""
DOTTED = re.compile(r"(?<![\w.])turnguard(?:\.[A-Za-z_]\w*)+(?:\.\*)?")
PATH = re.compile(r"(?<![\w.])turnguard((?:/[A-Za-z_][\w-]*)+(?:\.py)?)")


def renames(src: Path = SRC, reference: Path = public_surface.REFERENCE) -> dict[str, str]:
    """Old dotted name -> new, for each module or package moved (the topmost that can be)."""
    public = set(public_surface.public_modules(public_surface.reference_targets(reference), src))
    holders = {".".join(m.split(".")[:i]) for m in public for i in range(1, m.count(".") + 1)}
    packages = [".".join(p.parent.relative_to(src).parts) for p in sorted((src / PKG).rglob("__init__.py"))]
    moved: dict[str, str] = {}
    for module in [*public_surface.internal_modules(src, reference), *(p for p in packages if p not in public)]:
        parts = module.split(".")
        if len(parts) == 1 or module in holders:
            continue
        if any(p.startswith("_") for p in parts) or public_surface.kept_in_place(module):
            continue
        top = next(i for i in range(2, len(parts) + 1) if ".".join(parts[:i]) not in holders | public)
        old = ".".join(parts[:top])
        moved[old] = ".".join([*parts[: top - 1], "_" + parts[top - 1]])
    return moved


def new_name(dotted: str, moved: dict[str, str]) -> str:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        head = ".".join(parts[:end])
        if head in moved:
            return ".".join([moved[head], *parts[end:]])
    return dotted


ALIAS = re.compile(r"^\s*import turnguard as (\w+)\s*$", re.MULTILINE)


def rewrite_dotted(text: str, moved: dict[str, str], src: Path) -> str:
    """``turnguard.x...`` chains, and ``tg.x...`` where the text says ``import turnguard as tg``."""
    for alias in dict.fromkeys(ALIAS.findall(text)):
        pattern = re.compile(rf"(?<![\w.]){re.escape(alias)}(?:\.[A-Za-z_]\w*)+")
        text = pattern.sub(lambda m, a=alias: a + rewrite_dotted(PKG + m.group(0)[len(a):], moved, src)[len(PKG):],
                           text)
    return DOTTED.sub(lambda m: one_chain(m.group(0), moved, src), text)


def one_chain(chain: str, moved: dict[str, str], src: Path) -> str:
    """The chain renamed, unless it is not a module's: its next part one the module does not bind
    (a telemetry name), or ``.*`` (a family of them)."""
    if chain.endswith(".*"):
        return chain
    module = public_surface.owning_module(chain, src)
    rest = chain.split(".")[module.count(".") + 1:]
    if rest and rest[0] not in public_surface.bound_names(public_surface.module_path(module, src)):  # type: ignore[arg-type]
        return chain
    return new_name(chain, moved)


FROM_IMPORT = re.compile(r"(?:(?<![\w.])|(?<=\\n))from (turnguard(?:\.\w+)*) import (\([^)]*\)|[\w ,]+)")
IMPORTED = re.compile(r"(\w+)(\s+as\s+\w+)?")


def rewrite_from_imports(text: str, moved: dict[str, str]) -> str:
    """``from turnguard.pkg import sub`` where ``sub`` is a renamed module: ``import _sub as sub``
    (the code keeps its name for it; an alias already given stays). In code, and in the code
    that docs and tests hold as text."""

    def names(module: str, listed: str) -> str:
        def one(match: re.Match[str]) -> str:
            name, alias = match.group(1), match.group(2)
            renamed = moved.get(f"{module}.{name}")
            if renamed is None:
                return match.group(0)
            return renamed.rsplit(".", 1)[1] + (alias or f" as {name}")

        return IMPORTED.sub(one, listed)

    return FROM_IMPORT.sub(lambda m: f"from {m.group(1)} import {names(m.group(1), m.group(2))}", text)


def rewrite_paths(text: str, moved: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        parts = match.group(1).strip("/").split("/")
        dotted = [PKG]
        out = [PKG]
        for part in parts:
            dotted.append(part.removesuffix(".py"))
            renamed = moved.get(".".join(dotted))
            out.append(("_" + part) if renamed else part)
        return "/".join(out)

    return PATH.sub(one, text)


def rewrite_bare_files(text: str, unique: dict[str, str]) -> str:
    if not unique:
        return text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(unique))) + r")\.py\b")
    return pattern.sub(lambda m: f"{unique[m.group(1)]}.py", text)


def unique_stems(moved: dict[str, str], src: Path) -> dict[str, str]:
    """Renamed modules' file stems that name no other file in the package: ``ledger`` -> ``_ledger``."""
    stems: dict[str, int] = {}
    for path in (src / PKG).rglob("*.py"):
        stems[path.stem] = stems.get(path.stem, 0) + 1
    found = {}
    for old, new in moved.items():
        path = public_surface.module_path(old, src)
        if path and path.name != "__init__.py" and stems[path.stem] == 1:
            found[path.stem] = new.rsplit(".", 1)[1]
    return found


def rewrite(text: str, moved: dict[str, str], unique: dict[str, str], src: Path) -> str:
    kept = {f"\0{i}\0": literal for i, literal in enumerate(PROTECTED)}
    for mark, literal in kept.items():
        text = text.replace(literal, mark)
    text = rewrite_from_imports(text, moved)
    text = rewrite_bare_files(rewrite_paths(rewrite_dotted(text, moved, src), moved), unique)
    for mark, literal in kept.items():
        text = text.replace(mark, literal)
    return text


def tracked_files(root: Path) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [root / p for p in out.split("\0") if p and Path(p).suffix in SUFFIXES and Path(p).name not in KEEP]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rename turnguard's internal modules to _name.")
    parser.add_argument("--dry-run", action="store_true", help="print the renames; change nothing")
    args = parser.parse_args(argv)
    moved = renames()
    for old, new in moved.items():
        print(f"{old} -> {new}")
    if args.dry_run or not moved:
        return 0
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    if dirty.strip():
        print("privatize.py: the work tree has changes; commit or stash them first", file=sys.stderr)
        return 2
    unique = unique_stems(moved, SRC)
    contents = {path: path.read_text(encoding="utf-8") for path in tracked_files(ROOT) if path.is_file()}
    changed = {path: rewrite(text, moved, unique, SRC) for path, text in contents.items()}
    for old, new in moved.items():
        path = public_surface.module_path(old, SRC)
        source = path.parent if path and path.name == "__init__.py" else path
        target = source.with_name(new.rsplit(".", 1)[1] + source.suffix)  # type: ignore[union-attr]
        subprocess.run(["git", "mv", str(source), str(target)], cwd=ROOT, check=True)
    rewritten = [path for path, text in changed.items() if text != contents[path]]
    for path in rewritten:  # where the file is after the moves: its path rewritten as any other
        (ROOT / rewrite_paths(path.relative_to(ROOT).as_posix(), moved)).write_text(changed[path], encoding="utf-8")
    # Imports sort by the new names (ruff's isort rules, as ./dev.sh lint checks them).
    subprocess.run([sys.executable, "-m", "ruff", "check", "--fix", "--select", "I", "-q"], cwd=ROOT, check=False)
    print(f"privatize.py: moved {len(moved)}, rewrote {len(rewritten)} files; now ./dev.sh lint and ./dev.sh test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
