"""The research tools in ``tools/``, run as their docs run them: a path they cannot read or write
is one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def run_tool(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOLS / name), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


@pytest.mark.parametrize("args, path", [
    (["nosuch.jsonl"], "nosuch.jsonl"),
    (["--profiles", "nosuch.jsonl"], "nosuch.jsonl"),
    (["nosuch-long-turns.jsonl"], "nosuch-long-turns.jsonl"),
    (["a-directory"], "a-directory"),
    (["--write-long-turns", "no-such-dir/long-turns.jsonl"], "no-such-dir/long-turns.jsonl"),
    (["--write-long-turns", "a-directory"], "a-directory"),
], ids=["missing", "missing-profiles", "missing-long-turns", "directory", "unwritable", "write-onto-directory"])
def test_stuck_evidence_names_a_bad_path_in_one_line_and_exits_2(tmp_path, args, path):
    (tmp_path / "a-directory").mkdir()
    result = run_tool("stuck_evidence.py", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"stuck_evidence: {path}: ") and "Traceback" not in line


def test_stuck_evidence_still_reads_what_it_can(tmp_path):
    """A readable file with bad lines is not a bad path: the lines are skipped and named."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('not json\n{"id": "t", "calls": [{"tool": "ls", "args": "-l", "ok": true}], "resolved": true}\n')
    result = run_tool("stuck_evidence.py", str(corpus), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"stuck_evidence: skipped {corpus}:1: not JSON: Expecting value: line 1 "
                                          "column 1 (char 0)"]
    assert "| recorded corpus (S=20) |" in result.stdout


def test_the_research_tools_are_not_in_the_installed_package():
    src = Path(__file__).resolve().parents[1] / "src" / "turnguard"
    tools = {p.name for p in TOOLS.glob("*.py")}
    assert {"stuck_evidence.py", "synthetic.py"} <= tools
    assert not [p for p in src.rglob("*.py") if p.name in tools]


@pytest.mark.parametrize("args, path", [
    (["nosuch.jsonl"], "nosuch.jsonl"),
    (["nosuch-polling-turns.jsonl"], "nosuch-polling-turns.jsonl"),
    (["--write-polling-turns", "no-such-dir/polling-turns.jsonl"], "no-such-dir/polling-turns.jsonl"),
    (["--write-polling-turns", "a-directory"], "a-directory"),
], ids=["missing", "missing-polling-turns", "unwritable", "write-onto-directory"])
def test_polling_evidence_names_a_bad_path_in_one_line_and_exits_2(tmp_path, args, path):
    (tmp_path / "a-directory").mkdir()
    result = run_tool("polling_evidence.py", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"polling_evidence: {path}: ") and "Traceback" not in line
