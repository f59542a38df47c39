"""tools/similar_code.py, the duplicates gate of ``./dev.sh lint``: it counts the pairs of places pylint's
symilar reports and fails when there are more than allowed, naming each pair."""

from __future__ import annotations

import pytest

import similar_code

REPORT = """
7 similar lines in 2 files
==src/a.py:[72:79]
==src/b.py:[65:72]
       def answer(self):
           return 1

5 similar lines in 3 files
==src/a.py:[94:99]
==src/c.py:[10:15]
==src/d.py:[0:5]
           return 2
TOTAL lines=300 duplicates=22 percent=7.33
"""

BLOCK = "".join(f"    total += values[{i}] * {i}\n" for i in range(6))


def test_a_block_in_m_files_is_m_choose_2_pairs_with_one_based_lines():
    assert [str(p) for p in similar_code.pairs_in(REPORT)] == [
        "src/a.py:73-79 ~ src/b.py:66-72 (7 lines)",
        "src/a.py:95-99 ~ src/c.py:11-15 (5 lines)",
        "src/a.py:95-99 ~ src/d.py:1-5 (5 lines)",
        "src/c.py:11-15 ~ src/d.py:1-5 (5 lines)",
    ]
    assert similar_code.pairs_in("TOTAL lines=3 duplicates=0 percent=0.00\n") == []


def test_the_gate_fails_past_its_number_and_names_the_pair(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pylint")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.py").write_text(f"def one(values):\n    total = 0\n{BLOCK}    return total\n")
    (tmp_path / "two.py").write_text(f"def two(values, scale):\n    total = scale\n{BLOCK}    return -total\n")
    (tmp_path / "three.py").write_text("def three():\n    return 3\n")
    assert similar_code.main(["--max", "0", "."]) == 1
    out = capsys.readouterr().out
    assert "one.py:3-8 ~ two.py:3-8 (6 lines)" in out and "1 pairs" in out and "more than the 0 allowed" in out
    assert similar_code.main(["--max", "1", "."]) == 0
    assert similar_code.main(["--max", "2", "."]) == 0
    assert "lower MAX_PAIRS to 1" in capsys.readouterr().out


def test_a_missing_path_is_one_line_and_exit_status_2(tmp_path, capsys):
    assert similar_code.main([str(tmp_path / "nosuch")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_lint_runs_the_gate_before_the_type_check():
    script = (similar_code.ROOT / "dev.sh").read_text().splitlines()
    lint = [line for line in script if line.strip().startswith("lint)")]
    assert len(lint) == 1 and lint[0].index("tools/similar_code.py") < lint[0].index("tools/typecheck.py")
