"""docs/architecture.md stays true to the code, and the project explains itself: no file points at
a design document outside the repository."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import turnguard as tg
from test_layering import LAYERS
from turnguard import _plugins as plugins

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
TEXT = PAGE.read_text(encoding="utf-8")
OUTSIDE_DESIGN = re.compile(r"\bDESIGN(?:\.md|\s*§|\s+section)|§\s*\d|\bthe design (?:says|card|doc)", re.I)
SCANNED = ("src", "tests", "docs", "benchmarks", "tools", "dashboards", "rules", "prometheus", "examples")


def table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under ``## heading``."""
    section = TEXT.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def code_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def scanned_files() -> list[Path]:
    files = [p for p in ROOT.iterdir() if p.is_file() and p.suffix in (".md", ".toml", ".yaml", ".yml", ".sh")]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return [p for p in files if p != Path(__file__).resolve()]


def test_no_file_refers_to_a_design_document_outside_the_repository():
    found = []
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
                  for m in OUTSIDE_DESIGN.finditer(text)]
    assert found == []


def test_the_pattern_catches_the_ways_the_outside_document_was_cited():
    for cited in ("DESIGN §3.2", "DESIGN.md section 7", "DESIGN section 8", "(§4)", "where the design says"):
        assert OUTSIDE_DESIGN.search(cited), cited
    assert not OUTSIDE_DESIGN.search("the designated board; a DESIGNER's note")


def test_every_module_of_the_layering_test_is_on_the_layers_table():
    named = {name for row in table("Layers") for name in code_names(row[1])}
    for layer in LAYERS:
        for module in layer:
            short = module.removeprefix("turnguard.").removeprefix("turnguard")
            if short in ("", "__main__"):
                continue
            assert short in named or f"{short}/" in named, module


def test_every_module_the_layers_table_names_exists():
    for row in table("Layers"):
        for name in code_names(row[1]):
            module = "turnguard" if name == "turnguard" else f"turnguard.{name.rstrip('/')}"
            importlib.import_module(module)


def test_every_seed_rule_is_placed_in_a_built_in_policy_function_that_exists():
    rows = table("Where each seed rule lives")
    placed = set()
    for row in rows:
        threshold, file, functions = code_names(row[1])[0], code_names(row[2])[0], code_names(row[3])
        placed.add(threshold)
        module = importlib.import_module("turnguard." + file.removesuffix(".py").replace("/", "."))
        assert module.__name__ in plugins.DEFAULT_PLUGINS.values()
        for name in functions:
            assert callable(getattr(module, name, None)), f"{file} has no {name}"
    assert placed == {str(t) for t in tg.Threshold}


@pytest.mark.parametrize("module", sorted(plugins.DEFAULT_PLUGINS.values()))
def test_every_built_in_policy_module_is_on_the_page(module: str):
    assert f"`{module.removeprefix('turnguard.').replace('.', '/')}.py`" in TEXT
