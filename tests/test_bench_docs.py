"""``benchmarks/run.py --write-docs``: the figures live in docs/benchmarks.md, each benchmark's table
between its markers, rewritten by one command while the prose around it stays as written."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_run_py():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_run", module)
    spec.loader.exec_module(module)
    return module


run = load_run_py()
ROWS = [
    {"benchmark": "core", "case": "small | dict", "value": 2.583, "unit": "us/call", "floor": 2.451, "ratio": 1.0539,
     "target": "<= 3x floor", "met": True, "note": "json.dumps floor 3.24 us/call"},
    {"benchmark": "core", "case": "mix", "value": 4.8, "unit": "us/call", "floor": 3.2, "ratio": 1.5, "met": False},
    {"benchmark": "probe", "case": "sampling", "value": 3.53, "unit": "us/call"},
]
PAGE = f"""# Benchmarks

Prose before.

{run.begin_marker("core")}
an old table
{run.end_marker("core")}

Prose between, the authors' reading of the runs.

{run.NEW_TABLES}

Prose after.
"""


def test_a_benchmark_s_table_is_replaced_between_its_markers_and_the_prose_kept():
    page = run.write_docs(PAGE, ROWS[:2], "stamp:")
    assert "an old table" not in page
    before, rest = page.split(run.begin_marker("core"))
    table, after = rest.split(run.end_marker("core"))
    assert before == "# Benchmarks\n\nProse before.\n\n" and after == PAGE.split(run.end_marker("core"))[1]
    assert table.splitlines()[1:5] == ["stamp:", "", "| case | value | floor | ratio | target | met |",
                                       "|---|---|---|---|---|---|"]
    assert "| small \\| dict | 2.58 us/call | 2.45 us/call | 1.05x | <= 3x floor | yes |" in table
    assert "| mix | 4.8 us/call | 3.2 us/call | 1.50x |  | **no** |" in table
    assert "- json.dumps floor 3.24 us/call" in table
    assert run.write_docs(page, ROWS[:2], "stamp:") == page


def test_a_benchmark_without_markers_gets_its_own_section_before_the_new_tables_line():
    page = run.write_docs(PAGE, ROWS, "stamp:")
    section = page.index("### probe\n\n" + run.begin_marker("probe") + "\nstamp:\n")
    assert page.index(run.end_marker("core")) < section < page.index(run.end_marker("probe")) < page.index(
        run.NEW_TABLES)
    assert run.write_docs(page, ROWS, "stamp:") == page


@pytest.mark.parametrize("page", [f"{run.begin_marker('core')}\nno end\n{run.NEW_TABLES}\n", "no markers at all\n"],
                         ids=["no-end", "no-markers"])
def test_a_page_without_the_markers_is_refused(page):
    with pytest.raises(ValueError, match=r"is in the page|has no"):
        run.write_docs(page, ROWS[:1], "stamp:")


def test_from_json_writes_the_page_without_running_anything(tmp_path, monkeypatch, capsys):
    rows = tmp_path / "core.json"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    docs = tmp_path / "benchmarks.md"
    docs.write_text(PAGE)
    monkeypatch.setattr(run, "DOCS", docs)
    monkeypatch.setattr(run, "run_modules", lambda *a: pytest.fail("ran a benchmark"))
    assert run.main(["--from-json", str(rows), "--write-docs"]) == 1  # the mix row's target is not met
    assert "(read from `core.json`):" in docs.read_text() and "| mix | 4.8 us/call" in docs.read_text()
    assert "mix" in capsys.readouterr().out


def test_quick_figures_are_never_written_into_the_docs(capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["core", "--quick", "--write-docs"])
    assert exit_.value.code == 2 and "full runs only" in capsys.readouterr().err


def test_the_page_has_the_line_new_tables_go_above_and_paired_markers():
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page.count(run.NEW_TABLES) == 1
    for name in {p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py")}:
        assert page.count(run.begin_marker(name)) == page.count(run.end_marker(name)) <= 1
