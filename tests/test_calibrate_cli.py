"""``turnguard calibrate`` end to end, through the ``turnguard`` command: the table, --json,
--strict, the merge command, bad flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED_CORPUS, corpus_files
from turnguard.calibrate.synthetic import SMALL, write_corpus
from turnguard.cli import main

CORPUS = SHARED_CORPUS
SMALL_GRID = ["--soft-caps", "5,20", "--multipliers", "2,10", "--stuck-repeats", "3"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "turns.jsonl"
    write_corpus(str(path), count=80, seed=3, mix=SMALL)
    return path


def test_table_marks_the_default_and_shows_each_policy(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(corpus), *SMALL_GRID]) == 0
    out = capsys.readouterr().out
    assert out.startswith("80 turns, ")
    rows = [line for line in out.splitlines() if line.startswith(("* ", "  S=", "  peer", "  explicit"))]
    assert rows[0].startswith("* default ")
    assert any(r.startswith("  peer: halt at 5 identical calls") for r in rows)
    assert any(r.startswith("  S=5 x2 D=3") for r in rows)


def test_json_result_and_the_merge_command_agree_with_one_run(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = corpus.read_text().splitlines(keepends=True)
    part1, part2 = tmp_path / "p1.jsonl", tmp_path / "p2.jsonl"
    part1.write_text("".join(lines[:30]))
    part2.write_text("".join(lines[30:]))
    for src, out in ((corpus, "whole.json"), (part1, "r1.json"), (part2, "r2.json")):
        assert main(["calibrate", str(src), *SMALL_GRID, "--json", str(tmp_path / out)]) == 0
    assert main(["calibrate", "merge", str(tmp_path / "r1.json"), str(tmp_path / "r2.json"),
                 "--json", str(tmp_path / "merged.json")]) == 0
    capsys.readouterr()
    assert main(["calibrate-merge", str(tmp_path / "r1.json"), str(tmp_path / "r2.json"), "--json", "-"]) == 0
    printed = json.loads(capsys.readouterr().out)
    whole = json.loads((tmp_path / "whole.json").read_text())
    merged = json.loads((tmp_path / "merged.json").read_text())
    for data in (whole, merged, printed):
        data.pop("replays"), data.pop("inputs")
    assert merged == whole == printed


def test_strict_exits_1_on_a_bad_line_and_lenient_counts_it(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(corpus.read_text() + '{"calls": "nope"}\n')
    assert main(["calibrate", str(bad), *SMALL_GRID, "--strict"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:81: 'calls' is missing or not a list" in err
    assert main(["calibrate", str(bad), *SMALL_GRID]) == 0
    captured = capsys.readouterr()
    assert "1 input problems" in captured.out and f"{bad}:81:" in captured.err


@pytest.mark.parametrize("argv", [["--soft-caps", "x"], ["--streaks", "9:3"], ["--key-modes", "sha1"]])
def test_bad_grid_flags_exit_2(corpus: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", str(corpus), *argv])
    assert exc.value.code == 2


def test_missing_file_and_bad_merge_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "nope.jsonl")]) == 2
    (tmp_path / "x.json").write_text('{"format": "something else"}')
    assert main(["calibrate", "merge", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "not a turnguard calibrate --json result" in err
    assert f"{tmp_path / 'nope.jsonl'}: cannot open: " in err  # the file named, not a bare OSError


def test_console_script_on_the_shared_corpus_without_a_terminal_draws_no_progress(tmp_path: Path) -> None:
    files = corpus_files()
    done = subprocess.run([sys.executable, "-m", "turnguard.cli", "calibrate", *map(str, files)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "648 turns, 10,449 tool calls" in done.stdout
    assert "calibrate [" not in done.stderr and done.stderr == ""
