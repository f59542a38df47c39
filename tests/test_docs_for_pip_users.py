"""The user pages work for someone who ran ``pip install turnguard``, and the extras are named after
what they add.

A pip user has the wheel: no checkout (``.venv/``, ``./dev.sh``, ``tests/``, ``tools/``,
``benchmarks/``, ``src/``), no research data outside the repository (``../shared/``), no
``python -m turnguard._boards.build`` (the command is ``turnguard assets --config``). A user page may
still show a contributor's command, in a block or an inline command introduced by a paragraph
that says so (``from a clone of the repository``, any case); ``docs/development.md`` and
``docs/benchmarks.md`` are the contributors' own pages.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
CONTRIBUTOR_PAGES = {"docs/development.md", "docs/benchmarks.md"}
USER_PAGES = [p for p in (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
              if p.relative_to(ROOT).as_posix() not in CONTRIBUTOR_PAGES]
FROM_A_CLONE = "From a clone of the repository"
CHECKOUT_ONLY = re.compile(r"(?<![\w./-])(?:\.venv/|\./dev\.sh|tests/|tools/|benchmarks/|src/turnguard/)"
                           r"|python -m turnguard\.(?:_\w|boards\b)"
                           r"|pip install (?:-e|--editable)\b|pip install [\"']?\.(?![\w/])"
                           r"|\bmkdocs (?:serve|build|gh-deploy)\b")
"""A path or command that exists only in a checkout: an install of the checkout itself, and the
documentation site's builder, which reads the checkout's ``mkdocs.yml``."""
OUTSIDE = re.compile(r"\.\./shared\b")
"""Data outside the repository: in no checkout either."""
COMMAND = re.compile(r"^(?:\S+/)?(?:python\d?|pip|turnguard|mkdocs|\./dev\.sh|\.venv/)\b")


def commands(page: Path) -> list[tuple[int, str, bool]]:
    """(line, text, introduced as a contributor's) of every shell block and inline command."""
    tokens = MarkdownIt("commonmark").enable("table").parse(page.read_text(encoding="utf-8"))
    found, said = [], False
    for token in tokens:
        if token.type == "inline":
            said = FROM_A_CLONE.lower() in " ".join(token.content.split()).lower()
            for child in token.children or []:
                if child.type == "code_inline" and COMMAND.match(child.content):
                    found.append((token.map[0] + 1 if token.map else 0, child.content, said))
        elif token.type == "fence" and token.info.split()[:1] in (["bash"], ["sh"], ["console"], ["shell"]):
            found.append((token.map[0] + 1, token.content, said))
    return found


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_user_page_sends_pip_users_only_where_a_wheel_goes(page):
    problems = [f"{page.name}:{line}: {text.strip()[:100]!r}" for line, text, said in commands(page)
                if CHECKOUT_ONLY.search(text) and not said]
    assert problems == [], "checkout-only commands not introduced with " + repr(FROM_A_CLONE)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_user_page_never_points_outside_the_repository(page):
    lines = [n for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert lines == [], f"{page.name}: ../shared on lines {lines}"


def test_the_checker_sees_what_it_must():
    """A command the checker missed would pass anything."""
    page = USER_PAGES[0].parent / "x.md"
    samples = {"```bash\n.venv/bin/python tools/x.py\n```\n": 1, "Run `python tests/probe_fleet.py out.jsonl`.\n": 1,
               f"{FROM_A_CLONE}:\n\n```bash\n./dev.sh test\n```\n": 0, "See `tests/fleet.py` for the mix.\n": 0,
               "```bash\npython -m turnguard._boards.build --config t.toml\n```\n": 1,
               "Run `python -m turnguard._boards.rules`.\n": 1, "Run `python -m turnguard.boards.build`.\n": 1,
               "Run `python -m turnguard hook claude-code`.\n": 0,
               "A site: `pip install -e \".[docs]\"`, then `mkdocs serve`.\n": 2,
               "```bash\npip install --editable '.[dev]'\nmkdocs build --strict\n```\n": 1,
               "```bash\npip install .\n```\n": 1, "Run `pip install \".[otlp]\"`.\n": 1,
               "Run `mkdocs gh-deploy`.\n": 1,
               f"{FROM_A_CLONE}, `pip install -e \".[docs]\"`, then `mkdocs serve`.\n": 0,
               "Run `pip install \"turnguard[docs]\"` or `pip install ./dist/turnguard.whl`.\n": 0,
               "Then `turnguard assets deploy/` and `pip install -U turnguard`.\n": 0}
    for text, flagged in samples.items():
        try:
            page.write_text(text, encoding="utf-8")
            assert sum(1 for _, t, said in commands(page) if CHECKOUT_ONLY.search(t) and not said) == flagged, text
        finally:
            page.unlink()


MODULE_COMMAND = re.compile(r"python -m (turnguard[\w.]*)")


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_a_page_runs_exists(page):
    """A page that names ``python -m turnguard.x`` names a module there is (modules were renamed)."""
    named = set(MODULE_COMMAND.findall(page.read_text(encoding="utf-8")))
    assert not {name for name in named if importlib.util.find_spec(name.rstrip(".")) is None}


# -- the extras ------------------------------------------------------------------------------------


PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
FRAMEWORKS = {"pydantic-ai", "openai-agents", "langchain", "llm", "google-adk"}
"""Adapter extras: each installs the framework its adapter (``turnguard.integrations``) drives."""
COMBINATIONS = {"all", "dev", "docs"}


def _requirement(spec: str) -> str:
    return re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0]


def _imports_in(root: Path) -> set[str]:
    found: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    by_name = re.compile(r"(?:import_module|find_spec)\(\s*[\"']([\w.]+)[\"']")  # importlib.import_module("x")
    for path in root.rglob("*.py"):
        found.update(by_name.findall(path.read_text(encoding="utf-8")))
    return found


SHIPPED_IMPORTS = _imports_in(ROOT / "src" / "turnguard")


def _modules_of(distribution: str) -> set[str]:
    """The importable packages a distribution installs (from its RECORD), dotted."""
    files = importlib.metadata.files(distribution) or []
    return {".".join(f.parts[:-1]) for f in files if f.name == "__init__.py" and f.parts[0] != ".."} | {
        f.parts[0].removesuffix(".py") for f in files if len(f.parts) == 1 and f.suffix == ".py"}


@pytest.mark.parametrize("extra", sorted(set(EXTRAS) - COMBINATIONS - FRAMEWORKS))
def test_every_library_an_extra_installs_is_imported_by_a_shipped_module(extra):
    """An extra is named after what it adds, and adds only what a shipped module uses."""
    for spec in EXTRAS[extra]:
        name = _requirement(spec)
        if name == "turnguard":
            continue  # another extra of ours, checked on its own
        modules = _modules_of(name)
        assert modules, f"{name} is not installed here"
        used = {m for m in modules if any(i == m or i.startswith(m + ".") for i in SHIPPED_IMPORTS)}
        assert used, f"[{extra}] installs {name}, which no module of turnguard imports"


def test_the_dashboards_extra_is_what_the_board_generator_needs():
    generator = _imports_in(ROOT / "src" / "turnguard" / "_boards")
    third_party = {i.partition(".")[0] for i in generator} - {"turnguard", "__future__"} - set(
        __import__("sys").stdlib_module_names)
    provided = {m.partition(".")[0] for spec in EXTRAS["dashboards"] for m in _modules_of(_requirement(spec))}
    assert third_party and third_party <= provided


def test_otlp_is_its_own_extra_and_cli_keeps_it_for_existing_installs():
    assert {_requirement(s) for s in EXTRAS["otlp"]} == {
        "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-grpc"}
    assert "turnguard[otlp]" in EXTRAS["cli"]
    assert PYPROJECT["project"]["dependencies"] == ["pluggy>=1.5", "opentelemetry-api>=1.40"]
