"""The package's modules form layers: a module imports only from its own layer or the ones below,
and the imports between modules have no cycle. Every import counts: at module level, inside a
function, or under ``TYPE_CHECKING`` (a type-only dependency is still one: it ties the two
modules' meanings together), and so does a module named in a string (``"module:attr"``, as
entry points and factory registries write them, or a whole module name, as ``import_module``
takes it): it is imported at run time all the same."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("turnguard._model", "turnguard._probe", "turnguard._state"),
    ("turnguard._keys",),
    ("turnguard._config", "turnguard._profiles"),
    ("turnguard._ledger", "turnguard._task_results"),
    ("turnguard.hookspecs", "turnguard._firing"),
    ("turnguard._policies",),
    ("turnguard._plugins",),
    ("turnguard._dispatch", "turnguard._driver", "turnguard._guard", "turnguard._snapshot"),
    ("turnguard._shadow",),
    ("turnguard.telemetry",),
    ("turnguard",),
    ("turnguard._terminal",),
    ("turnguard._calibrate",),
    ("turnguard.integrations",),
    ("turnguard.agents",),
    ("turnguard._demo", "turnguard._assets", "turnguard._boards"),
    ("turnguard._cli",),
    ("turnguard.__main__",),
)
"""Lowest first. The core: facts (model, keys, config, ledger), the hook contract and what a policy
tells calibrate (firing), the policies, the plugin registry, the guard, the shadows built on it,
reporting (telemetry: plugins that only observe); then the public facade ``turnguard`` (the core's
names; it registers the shadow and telemetry plugins with the registry below them), the text
layout of the command line's output (terminal), calibration, the framework adapters, the
coding-agent hooks, the demo,
the deployable files (assets) and the board generator (boards), and the command line. A module
belongs to the layer of the longest name above that is it or a package holding it (``turnguard``
itself is the facade only, not every module of the package)."""

def module_files() -> dict[str, Path]:
    files = {}
    for path in sorted((SRC / "turnguard").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


MODULES = module_files()


NAMED_IN_A_STRING = re.compile(r"(turnguard(?:\.\w+)*)(:[\w.]+)?")
"""A string naming a module of the package: ``"turnguard.x.y"`` or ``"turnguard.x:attr"``."""


def string_imports(tree: ast.AST) -> set[str]:
    """The package's modules named by a string constant anywhere in ``tree`` (a dict value, an
    ``import_module`` argument, a default): ``"module:attr"``, or a dotted module name. Not a
    logger's name (``logging.getLogger("turnguard.telemetry")``: no module is loaded by it), nor
    the bare project name ``"turnguard"`` (the logger, the entry-point group)."""
    loggers = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
               and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "getLogger"
               for arg in node.args}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in loggers:
            named = NAMED_IN_A_STRING.fullmatch(node.value)
            if named and (named.group(2) or "." in node.value) and named.group(1) in MODULES:
                found.add(named.group(1))
    return found


def imported_modules(module: str, path: Path) -> set[str]:
    """The package's modules ``module`` imports anywhere in its source: ``from a import b`` names
    module ``a.b`` when that is a module, else ``a``; a module named in a string
    (``string_imports``) counts too."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = string_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.partition(".")[0] == "turnguard")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.partition(".")[0] != "turnguard":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    found.discard(module)
    return found


GRAPH = {module: imported_modules(module, path) for module, path in MODULES.items()}


def layer_of(module: str) -> int:
    best, depth = None, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            holds = module == prefix or ("." in prefix and module.startswith(prefix + "."))
            if holds and prefix.count(".") > depth:
                best, depth = i, prefix.count(".")
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def upward_imports() -> set[tuple[str, str]]:
    return {(module, target) for module, targets in GRAPH.items() for target in targets
            if layer_of(target) > layer_of(module)}


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_a_new_top_level_module_is_in_no_layer_until_declared() -> None:
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("turnguard.newcomer")
    assert layer_of("turnguard.telemetry.newcomer") == layer_of("turnguard.telemetry")


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = upward_imports()
    assert not upward, "imports from a higher layer: " + ", ".join(f"{a} -> {b}" for a, b in sorted(upward))


def cycles(graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    """Every strongly connected set of more than one module of ``graph`` (default: the
    package's; Tarjan's algorithm)."""
    graph = GRAPH if graph is None else graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    assert cycles() == []


@pytest.mark.parametrize(("source", "expected"), [
    ("import turnguard._guard\n", {"turnguard._guard"}),
    ("def f():\n    from turnguard._guard import Turn\n", {"turnguard._guard"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from turnguard import _guard as guard\n",
     {"turnguard._guard"}),
    ("from turnguard import Guard\n", {"turnguard"}),
    ("from . import _names\n", {"turnguard.telemetry._names"}),
    ("from .._keys import Keyer\n", {"turnguard._keys"}),
    ("FACTORIES = {'shadow': 'turnguard._shadow:plugin_for'}\n", {"turnguard._shadow"}),
    ("import importlib\nimportlib.import_module('turnguard._calibrate.replay')\n", {"turnguard._calibrate.replay"}),
    ("def f(target='turnguard._cli:main'):\n    pass\n", {"turnguard._cli"}),
    ("MODULES = ('turnguard._policies.cap',)\n", {"turnguard._policies.cap"}),
])
def test_imports_are_found_wherever_they_hide(tmp_path: Path, source: str, expected: set[str]) -> None:
    path = tmp_path / "_probe.py"
    path.write_text(source, encoding="utf-8")
    assert imported_modules("turnguard.telemetry.probe", path) == expected


@pytest.mark.parametrize("source", [
    "import logging\nlog = logging.getLogger('turnguard._calibrate')\n",
    "GROUP = 'turnguard'\n",
    "NAME = 'turnguard.loop.soft_cap'\n",  # a telemetry attribute, no module
    "TEXT = 'see turnguard._shadow:plugin_for'\n",  # prose, not a target
])
def test_strings_that_load_no_module_are_no_import(tmp_path: Path, source: str) -> None:
    path = tmp_path / "_probe.py"
    path.write_text(source, encoding="utf-8")
    assert imported_modules("turnguard.telemetry.probe", path) == set()


def test_a_registry_that_names_an_upper_module_in_a_string_is_an_upward_import(tmp_path: Path) -> None:
    """What ``_plugins.py`` once held: ``"turnguard._shadow:plugin_for"``, loaded by ``import_module``
    below the module it names (and the shadows import the registry back: a cycle at run time)."""
    path = tmp_path / "_plugins.py"
    path.write_text("FACTORY_PLUGINS = {'shadow': 'turnguard._shadow:plugin_for'}\n", encoding="utf-8")
    targets = imported_modules("turnguard._plugins", path)
    assert "turnguard._shadow" in targets and layer_of("turnguard._shadow") > layer_of("turnguard._plugins")
    graph = {**GRAPH, "turnguard._plugins": targets}
    assert any({"turnguard._plugins", "turnguard._shadow"} <= set(c) for c in cycles(graph))
