"""File names that are not plain text, wherever a ``turnguard`` command shows one: its messages,
its tables, its JSON and its HTML report.

A POSIX file name is bytes. Python hands one that is not UTF-8 over with those bytes as lone
surrogates (``os.fsdecode(b"\\xff.jsonl") == "\\udcff.jsonl"``, PEP 383), which no UTF-8 output
can encode; a name may also hold a newline (a message is one line) or an escape character (it
would reach the terminal). Each command must still finish, say the name with escapes
(``\\xff.jsonl``, ``a\\nb.jsonl``) and write outputs that decode as UTF-8.

pytest's captured standard output and error encode strictly, as a real UTF-8 stdout does: a lone
surrogate printed there fails the test.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnguard import _cli as cli
from turnguard._terminal import shown

SRC = Path(__file__).resolve().parent.parent / "src"
GOOD = json.dumps({"id": "t1", "calls": [{"tool": "read", "args": {"p": 1}, "outcome": "error"}] * 9, "cycles": 1})

NAMES: dict[str, bytes] = {
    "not UTF-8": b"\xff.jsonl",
    "Latin-1": b"caf\xe9.jsonl",
    "an encoded surrogate": b"\xed\xa0\x80.jsonl",
    "a newline": b"a\nb.jsonl",
    "an escape sequence": b"\x1b[1mbold\x1b[0m.jsonl",
    "a carriage return and a tab": b"x\r\ty.jsonl",
    "UTF-8 text": "\u00e9t\u00e9 \u2013 \u65e5\u672c.jsonl".encode(),
}


def make(folder: Path, name: bytes, content: bytes | None = None) -> str:
    """The file ``name`` in ``folder`` (a folder when ``content`` is None), as ``sys.argv`` would
    hold its path; skipped where the file system refuses such a name."""
    path = os.path.join(os.fsencode(folder), name)
    try:
        if content is None:
            os.mkdir(path)
        else:
            with open(path, "wb") as f:
                f.write(content)
    except (OSError, UnicodeError) as exc:
        pytest.skip(f"this file system refuses the name {name!r}: {exc}")
    return os.fsdecode(path)


def assert_clean(text: str) -> None:
    """Printable on any UTF-8 output: no lone surrogate, no control character but newlines."""
    text.encode("utf-8")
    assert not any((ord(c) < 32 and c != "\n") or ord(c) == 127 for c in text), repr(text)


def assert_said(err: str, path: str) -> None:
    """Every line of ``err`` is a message of its own, one of them naming ``path`` as ``shown`` has it."""
    assert_clean(err)
    lines = err.splitlines()
    assert lines and all(line.startswith("turnguard ") for line in lines), err
    assert any(shown(path) in line for line in lines), (shown(path), err)


@pytest.fixture(params=list(NAMES), ids=list(NAMES))
def name(request) -> bytes:
    return NAMES[request.param]


def test_calibrate_reads_the_file_and_shows_its_name_in_messages_json_and_html(name, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    path = make(inputs, name, (GOOD + "\nnot json\n").encode())
    report, result = tmp_path / "report.html", tmp_path / "result.json"
    status = cli.main(["calibrate", str(inputs), "--html", str(report), "--json", str(result), "--jobs", "1"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert_clean(out)
    assert_said(err, path)  # the bad line's message
    page = report.read_bytes().decode("utf-8")
    assert page.rstrip().endswith("</html>")
    assert shown(path) in html.unescape(page)
    data = json.loads(result.read_bytes().decode("utf-8"))
    assert data["inputs"] == [shown(path)]
    assert_clean(json.dumps(data, ensure_ascii=False))


def test_calibrate_names_its_output_files_and_unreadable_inputs_printably(name, tmp_path, capsys):
    corpus = tmp_path / "turns.jsonl"
    corpus.write_text(GOOD + "\n")
    outputs = tmp_path / "out"
    outputs.mkdir()
    report = os.fsdecode(os.path.join(os.fsencode(outputs), name + b".html"))
    make(outputs, name + b".probe", b"")  # (skips where such a name cannot exist)
    assert cli.main(["calibrate", str(corpus), "--html", report, "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    assert_clean(out)
    assert_said(err, report)
    missing = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"gone-" + name))
    assert cli.main(["calibrate", missing, "--jobs", "1"]) == 2
    assert_said(capsys.readouterr().err, missing)


def test_calibrate_merge_shows_its_inputs_and_a_bad_one_printably(name, tmp_path, capsys):
    corpus = tmp_path / "turns.jsonl"
    corpus.write_text(GOOD + "\n")
    results = tmp_path / "results"
    results.mkdir()
    result = make(results, name + b".json", b"")
    assert cli.main(["calibrate", str(corpus), "--json", result, "--jobs", "1"]) == 0
    capsys.readouterr()
    assert cli.main(["calibrate", "merge", result, "--json", "-"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out)["inputs"] == [str(corpus)]
    broken = make(results, b"broken-" + name, b"{")
    assert cli.main(["calibrate", "merge", broken]) == 2
    assert_said(capsys.readouterr().err, broken)


def test_config_shows_the_file_it_loaded_in_its_table_and_a_bad_one_in_its_message(name, tmp_path, capsys):
    toml = make(tmp_path, name + b".toml", b"soft_cap = 42\n")
    assert cli.main(["config", "--config", toml, "--wide"]) == 0
    out, _ = capsys.readouterr()
    assert_clean(out)
    assert shown(toml) in out
    bad = make(tmp_path, b"bad-" + name + b".toml", b"soft_cap = [\n")
    assert cli.main(["config", "--config", bad]) == 2
    assert_said(capsys.readouterr().err, bad)


def test_demo_names_its_turns_file(name, tmp_path, capsys):
    record = make(tmp_path, name, b"")
    assert cli.main(["demo", "soft-stuck", "--record", record]) == 0
    out, _ = capsys.readouterr()
    assert_clean(out)
    assert f"turns appended to {shown(record)}" in out
    assert Path(record).read_bytes().count(b"\n") == 1


def test_assets_lists_what_it_wrote_under_its_folder(name, tmp_path, capsys):
    folder = os.fsdecode(os.path.join(os.fsencode(tmp_path), name))
    assert cli.main(["assets", folder]) == 0
    out, _ = capsys.readouterr()
    assert_clean(out)
    assert out.splitlines()[0] == f"{shown(folder)}/"


def test_ids_holding_lone_surrogates_or_escapes_are_shown_in_the_table_and_the_html(tmp_path, capsys):
    """Not a file name, the same failure: an id a JSON line gives as ``"\\udcff"``."""
    corpus = tmp_path / "turns.jsonl"
    ident = "t\udcff\x1b"
    turn = {"id": ident, "calls": [{"tool": "read", "args": {"p": 1}, "outcome": "error"}] * 30, "cycles": 1,
            "resolved": True}
    corpus.write_text(json.dumps(turn) + "\n")
    report = tmp_path / "report.html"
    assert cli.main(["calibrate", str(corpus), "--html", str(report), "--jobs", "1"]) == 0
    out, _ = capsys.readouterr()
    assert_clean(out)
    assert f"  {shown(ident)}:" in out.splitlines()  # the resolved turns halted
    page = report.read_bytes().decode("utf-8")
    assert page.rstrip().endswith("</html>") and shown(ident) in page


def test_a_user_running_calibrate_html_on_a_folder_with_a_non_utf8_name_gets_the_report(tmp_path):
    """As issued: ``turnguard calibrate DIR --html`` in a fresh process, DIR holding ``\\xff.jsonl``."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    path = make(inputs, b"\xff.jsonl", (GOOD + "\nnot json\n").encode())
    report = tmp_path / "report.html"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNGUARD_", "OTEL_", "PYTHON"))}
    done = subprocess.run([sys.executable, "-m", "turnguard", "calibrate", str(inputs), "--html", str(report)],
                          env={**env, "PYTHONPATH": str(SRC), "PYTHONIOENCODING": "utf-8:strict"}, cwd=tmp_path,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert f"{shown(path)}:2: not JSON".encode() in done.stderr
    assert report.read_bytes().decode("utf-8").rstrip().endswith("</html>")
