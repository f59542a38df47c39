"""``NO_COLOR`` (https://no-color.org): set to any non-empty value, no ``turnguard`` command writes
an ANSI escape, on a terminal too (calibrate's bold default row was written all the same)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from conftest import kept_result_token
from turnguard import _cli as cli

LINE = json.dumps({"id": "t1", "calls": [{"tool": "read", "args": {"p": 1}, "outcome": "error"}] * 9, "cycles": 1})
ESC = "\x1b"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def files(tmp_path, monkeypatch) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)  # (install and uninstall read the project's settings: none here)
    corpus = tmp_path / "turns.jsonl"
    corpus.write_text(LINE + "\n")
    result = tmp_path / "result.json"
    assert cli.main(["calibrate", str(corpus), "--json", str(result), "--jobs", "1"]) == 0
    return {"corpus": str(corpus), "result": str(result), "fresh": str(tmp_path / "assets"),
            "state": str(kept_result_token(tmp_path / "state"))}


COMMANDS = {
    "demo": ["demo", "--no-record"],
    "plugins": ["plugins"],
    "config": ["config"],
    "calibrate": ["calibrate", "{corpus}", "--jobs", "1", "--progress", "always"],
    "calibrate-merge": ["calibrate", "merge", "{result}"],
    "assets": ["assets", "{fresh}"],
    "install": ["install", "claude-code", "--dry-run"],
    "uninstall": ["uninstall", "claude-code", "--dry-run"],
    "result": ["result", "claude-code", "resolved", "--state-dir", "{state}"],
}


def on_a_terminal(monkeypatch, argv: list[str]) -> tuple[int, str, str]:
    out, err = Terminal(), Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def test_every_command_is_covered():
    assert set(COMMANDS) == set(cli.SUBCOMMANDS)


@pytest.mark.parametrize("value", ["1", "true", "0", "anything"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_writes_an_escape_under_no_color_even_on_a_terminal(command, value, files, monkeypatch):
    monkeypatch.setenv("NO_COLOR", value)
    status, out, err = on_a_terminal(monkeypatch, [a.format(**files) for a in COMMANDS[command]])
    assert status == 0, err
    assert ESC not in out and ESC not in err


@pytest.mark.parametrize("value", [None, ""])
def test_without_no_color_a_terminal_gets_the_default_row_in_bold(value, files, monkeypatch):
    """An empty ``NO_COLOR`` is as unset (no-color.org); a pipe never gets bold."""
    if value is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", value)
    _, out, _ = on_a_terminal(monkeypatch, ["calibrate", files["corpus"], "--jobs", "1"])
    assert "\x1b[1m" in out
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    assert cli.main(["calibrate", files["corpus"], "--jobs", "1"]) == 0
    assert ESC not in piped.getvalue()
