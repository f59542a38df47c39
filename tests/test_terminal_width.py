"""Every command's output fits 80 columns by default, the terminal's width when it is wider, and
is not fitted with ``--wide``; so do every command's ``--help`` and calibrate's progress bar. The
inputs are chosen to be wide: the shared corpus (long turn ids, 46 policies), probe turns (the
evidence section), a recorded fleet with a probe (censored turns, late results, probe evidence),
a configuration with long values."""

from __future__ import annotations

import fcntl
import io
import json
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

import planted_fleet
from conftest import corpus_files, kept_result_token
from turnguard import _cli as cli
from turnguard._calibrate.run import Progress
from turnguard._terminal import DEFAULT_WIDTH, fit_table

PROBE = [{"id": f"probe-{i}-" + "x" * 40, "cohort": "probe", "resolved": i % 2 == 0,
          "calls": [{"tool": "read", "args": {"p": j}, "outcome": "ok"} for j in range(30 + 40 * i)]}
         for i in range(8)]


@pytest.fixture
def wide_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)  # (install and uninstall edit the project's and HOME's agent settings)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / ".codex-home"))
    probe = tmp_path / "probe.jsonl"
    probe.write_text("".join(json.dumps(t) + "\n" for t in PROBE))
    config = tmp_path / "turnguard.toml"
    config.write_text('disable_plugins = ["' + '", "'.join(f"some-third-party-plugin-{i}" for i in range(8)) + '"]\n'
                      "[shadow.stale]\nstuck_signal = 'stale_repeat'\nstreak_stop_on = 'any'\n"
                      "[shadow.wider]\nsoft_cap = 200\nhard_multiplier = 20\n")
    result = tmp_path / "result.json"
    assert cli.main(["calibrate", *map(str, corpus_files()), "--json", str(result)]) == 0
    fleet = tmp_path / "fleet.jsonl"
    planted_fleet.run_fleet(fleet)
    capsys.readouterr()
    return {"probe": str(probe), "config": str(config), "result": str(result), "assets": str(tmp_path / "deploy"),
            "fleet": str(fleet), "state": str(tmp_path / "state")}


def commands(inputs: dict[str, str]) -> dict[str, list[str]]:
    """Each command with its widest output; a subcommand not named here runs without arguments."""
    corpus = list(map(str, corpus_files()))
    return {name: [name] for name in cli.SUBCOMMANDS} | {
        "demo": ["demo", "--no-record"],
        "plugins": ["plugins"],
        "config": ["config", "--config", inputs["config"]],
        "calibrate": ["calibrate", *corpus, inputs["probe"]],
        "calibrate --fold": ["calibrate", *corpus, "--fold", "--cross", "--soft-caps", "20,100"],
        "calibrate a fleet": ["calibrate", inputs["fleet"], "--config", inputs["config"]],
        "calibrate-merge": ["calibrate-merge", inputs["result"]],
        "calibrate merge": ["calibrate", "merge", inputs["result"]],
        "assets": ["assets", "--force", inputs["assets"]],
        "install": ["install", "codex"],  # (in the fixture's folder: the longest notes of the three)
        "uninstall": ["uninstall", "codex"],
        "result": ["result", "claude-code", "resolved", "--state-dir", str(kept_result_token(Path(inputs["state"])))],
    }


def output(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines() + captured.err.splitlines()


def widest(lines: list[str]) -> int:
    return max(map(len, lines))


@pytest.mark.parametrize("terminal", ["40", "80"])
def test_every_command_fits_80_columns_by_default(capsys, monkeypatch, wide_inputs, terminal) -> None:
    monkeypatch.setenv("COLUMNS", terminal)  # a terminal this wide, or narrower: 80 all the same
    assert DEFAULT_WIDTH == 80
    for name, argv in commands(wide_inputs).items():
        lines = output(capsys, argv)
        assert widest(lines) <= DEFAULT_WIDTH, (name, max(lines, key=len))


def test_every_commands_help_fits_the_default_width(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", str(DEFAULT_WIDTH))
    for argv in ([], *([name] for name in cli.SUBCOMMANDS), ["calibrate", "merge"]):
        with pytest.raises(SystemExit):
            cli.main([*argv, "--help"])
        lines = capsys.readouterr().out.splitlines()
        called = cli.SUBCOMMANDS[argv[0]].called if len(argv) == 1 else " ".join(argv)
        assert lines[0].startswith(f"usage: turnguard {called}".rstrip()), lines[0]
        assert widest(lines) <= DEFAULT_WIDTH, (argv, max(lines, key=len))


def test_calibrate_merge_has_its_own_help_and_flags(capsys) -> None:
    for argv in (["calibrate", "merge"], ["calibrate-merge"]):
        with pytest.raises(SystemExit):
            cli.main([*argv, "--help"])
        help_text = capsys.readouterr().out
        assert help_text.startswith("usage: turnguard calibrate merge ") and "RESULT.json" in help_text
        assert "--soft-caps" not in help_text  # calibrate's grid is not the merge's
        with pytest.raises(SystemExit):
            cli.main([*argv, "r.json", "--soft-caps", "20"])
        assert "turnguard calibrate merge: error: unrecognized arguments: --soft-caps" in capsys.readouterr().err


def test_the_progress_bar_fits_the_terminal_it_is_drawn_on(tmp_path) -> None:
    """On a real pseudo-terminal of 80 columns (and of 60), every redraw of the bar fits it."""
    for columns in (80, 60):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        try:
            with os.fdopen(slave, "w", closefd=False) as stream:
                progress = Progress(10**9, stream, delay=0, interval=0)
                for step in range(1, 11):
                    progress.update(step * 10**8, step * 12_345_678, step * 123_456)
                progress.update(10**9, 10**9, 10**7, force=True)
                progress.close()
            drawn = read_all(master)
        finally:
            os.close(master)
            os.close(slave)
        lines = [line for line in drawn.replace("\n", "\r").split("\r") if line.strip()]
        assert lines and "100%" in lines[-1], drawn
        assert widest(lines) <= columns, max(lines, key=len)
        if columns == 80:
            assert "10.0M turns, 1.00G calls" in lines[-1]


def read_all(fd: int) -> str:
    """What is waiting on ``fd`` (a pty's master side), without blocking."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_without_tqdm_calibrate_draws_no_bar_and_runs(monkeypatch, tmp_path) -> None:
    import turnguard._calibrate.run as run

    monkeypatch.setattr(run, "available", lambda: False)
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    progress = Progress(100, terminal, delay=0, interval=0)
    progress.update(50, 1, 1)
    progress.close()
    assert not progress.enabled and terminal.getvalue() == ""


def test_a_wider_terminal_gets_wider_output(capsys, monkeypatch, wide_inputs) -> None:
    monkeypatch.setenv("COLUMNS", "170")
    for name, argv in commands(wide_inputs).items():
        lines = output(capsys, argv)
        assert widest(lines) <= 170, name
        if name in ("demo", "calibrate", "plugins"):
            assert widest(lines) > DEFAULT_WIDTH, name  # the room is used


def test_wide_does_not_fit_and_loses_nothing(capsys, monkeypatch, wide_inputs) -> None:
    monkeypatch.setenv("COLUMNS", str(DEFAULT_WIDTH))
    for name, argv in commands(wide_inputs).items():
        fitted = output(capsys, argv)
        undo = {"install": "uninstall", "uninstall": "install"}.get(name)
        if undo:  # it changed the agent's settings: undone, so that the wide run does the same
            output(capsys, [undo, *argv[1:]])
        if name == "result":  # a turn takes one result: another turn for the wide run
            kept_result_token(Path(wide_inputs["state"]))
        wide = output(capsys, [*argv, "--wide"])
        if name in ("demo", "calibrate", "plugins"):
            assert widest(wide) > 170, name
        words = set(" ".join(wide).split())
        if name.startswith("calibrate"):  # the cap and streak columns and their note are the difference
            note = {"left", "out", "to", "fit", "the", "terminal:", "shows", "them.", "The", "cap", "cap,", "and",
                    "streak", "columns", "are", "--wide"}
            assert set(" ".join(fitted).split()) - {"-" * n for n in range(200)} <= words | note
        elif name == "config":  # long values and paths break inside words: the same characters
            def chars(lines: list[str]) -> list[str]:
                return sorted("".join(lines[2:]).replace(" ", ""))

            assert chars(fitted) == chars(wide)
        else:  # the same words (rules aside); the under-row column ("why") has no header of its own
            def named(lines: list[str]) -> set[str]:
                return {w for w in " ".join(lines).split() if w.strip("-")} | {"why"}

            assert named(fitted) == named(wide), name


def test_the_default_without_a_terminal_is_80_columns(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([sys.executable, "-m", "turnguard", "demo", "--no-record"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0
    assert 70 < widest(done.stdout.splitlines()) <= DEFAULT_WIDTH


@pytest.mark.parametrize("width", [20, 40, 60, 100])
def test_a_fitted_table_wraps_at_spaces_and_loses_no_word(width) -> None:
    header = ["name", "count", "what"]
    rows = [["a long policy name here", "12", "words " * 30], ["short", "1234567", "x"]]
    lines = fit_table(header, rows, width, right=[1], wrap=[0], free_last=True)
    assert widest(lines) <= max(width, len("1234567") + 12)
    shown = sorted(" ".join(lines).replace("-", " ").split())
    everything = sorted(" ".join(header + [cell for row in rows for cell in row]).split())
    without_last_header = list(everything)
    without_last_header.remove("what")  # printed under its rows, the last column has no header
    assert shown in (everything, without_last_header)
