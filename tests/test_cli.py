"""The ``turnguard`` command: ``demo`` through the real guard, ``plugins``, ``config``, dispatch."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from turnguard import cli
from turnguard.demo import SCENARIOS


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def rows(out: str) -> dict[str, list[list[str]]]:
    """The demo table, by scenario: each row split on runs of two or more spaces."""
    import re

    table: dict[str, list[list[str]]] = {}
    for line in out.splitlines()[2:]:
        if not line.strip() or line.startswith("turns recorded"):
            continue
        cells = re.split(r"\s{2,}", line.strip())
        table.setdefault(cells[0], []).append(cells)
    return table


def test_demo_shows_what_fired_where_and_why(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = run(capsys, "demo", "--no-record")
    assert status == 0
    table = rows(out)
    assert list(table) == list(SCENARIOS)
    assert table["productive-long"][0][1:5] == ["400", "-", "-", "none (completed)"]
    assert table["explicit-cap"][0][1:5] == ["101", "explicit (stop)", "call 101", "halt"]
    assert table["soft-stuck"][0][1:5] == ["101", "soft_stuck (stop)", "call 101", "halt"]
    assert table["runaway"][0][1:5] == ["1001", "hard_backstop (stop)", "call 1001", "halt"]
    assert [r[2:5] for r in table["failing-streak-unattended"]] == [
        ["streak (warn)", "call 8", "allow (observed)"], ["streak (stop)", "call 11", "halt"]]
    assert [r[4] for r in table["failing-streak-attended"]] == ["ask -> user: continue", "ask -> user: stop"]
    assert table["cycle-capped"][0][2:5] == ["cycle_cap (stop)", "request 51", "halt"]
    assert "max_tool_calls_per_turn=100" in table["explicit-cap"][0][5]
    assert not (tmp_path / ".turnguard").exists()


def test_demo_writes_the_turns_file_by_default(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = run(capsys, "demo", "soft-stuck", "runaway")
    assert status == 0 and ".turnguard/turns.jsonl" in out
    lines = (tmp_path / ".turnguard" / "turns.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert [len(json.loads(line)["calls"]) for line in lines] == [101, 1001]


def test_demo_rejects_an_unknown_scenario(capsys):
    status, _, err = run(capsys, "demo", "nope", "--no-record")
    assert status == 2 and "nope" in err and "soft-stuck" in err


def test_plugins_lists_the_loaded_plugins(capsys, monkeypatch):
    monkeypatch.setenv("TURNGUARD_DISABLE_PLUGINS", "otel,recorder,shadow")
    monkeypatch.setenv("TURNGUARD_LOAD_PLUGINS", "0")
    status, out, _ = run(capsys, "plugins")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["plugin", "source", "hooks"]
    assert any(line.split()[:2] == ["cap", "built-in"] and "turnguard_check_call" in line for line in lines)
    status, out, _ = run(capsys, "plugins", "--json")
    names = {row["name"]: row for row in json.loads(out)}
    assert set(names) == {"cap", "streak", "cycles"}
    assert names["cycles"]["hooks"] == ["turnguard_check_cycle"]


def test_plugins_reports_a_bad_configuration(capsys, monkeypatch):
    monkeypatch.setenv("TURNGUARD_SOFT_CAP", "lots")
    status, _, err = run(capsys, "plugins")
    assert status == 2 and "TURNGUARD_SOFT_CAP" in err


def test_config_shows_the_loaded_configuration(capsys, monkeypatch, tmp_path):
    (tmp_path / "turnguard.toml").write_text("max_tool_calls_per_turn = 250\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNGUARD_STREAK_WARN_AT", "4")
    status, out, _ = run(capsys, "config")
    assert status == 0
    values = dict(line.split(None, 1) for line in out.splitlines()[2:])
    assert values["max_tool_calls_per_turn"] == "250" and values["streak_warn_at"] == "4"
    assert values["cap_mode"] == "explicit (derived)"


def test_new_subcommands_plug_into_the_dispatch_table(capsys, monkeypatch):
    def arguments(parser):
        parser.add_argument("--times", type=int, default=1)

    def hello(args):
        print("hello " * args.times)
        return 3

    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", cli.Subcommand("hello", "say hello", arguments, hello))
    status, out, _ = run(capsys, "hello", "--times", "2")
    assert (status, out.split()) == (3, ["hello", "hello"])


def test_no_subcommand_prints_help_and_fails(capsys):
    status, out, _ = run(capsys)
    assert status == 2 and "demo" in out and "plugins" in out


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert "turnguard 0.1.0" in capsys.readouterr().out


def test_the_console_script_is_declared():
    scripts = importlib.metadata.entry_points(group="console_scripts", name="turnguard")
    assert [ep.value for ep in scripts] == ["turnguard.cli:main"]
