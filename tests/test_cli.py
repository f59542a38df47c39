"""The ``turnguard`` command: ``demo`` through the real guard, ``plugins``, ``config``, dispatch."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from conftest import kept_result_token
from test_config import NOT_A_TABLE, TABLE_PATHS
from turnguard import _cli as cli
from turnguard._demo import SCENARIOS
from turnguard._plugins import NON_POLICY_PLUGINS


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def rows(out: str) -> dict[str, list[list[str]]]:
    """The demo table, by scenario: each row split on runs of two or more spaces."""
    import re

    table: dict[str, list[list[str]]] = {}
    last: list[str] = []
    lines = out.splitlines()
    for line in lines[next(i for i, text in enumerate(lines) if text.startswith("---")) + 1:]:
        if not line.strip() or line.startswith("turns appended"):
            continue
        if line.startswith("    "):  # the row's "why", under it when it does not fit beside
            last[5:] = [" ".join([*last[5:], line.strip()])]
            continue
        last = re.split(r"\s{2,}", line.strip())
        table.setdefault(last[0], []).append(last)
    return table


def test_demo_shows_what_fired_where_and_why(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = run(capsys, "demo", "--no-record", "--wide")  # (one line per row: fitting is tested apart)
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
    monkeypatch.setenv("TURNGUARD_DISABLE_PLUGINS", ",".join(NON_POLICY_PLUGINS))
    monkeypatch.setenv("TURNGUARD_LOAD_PLUGINS", "0")
    status, out, _ = run(capsys, "plugins")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["plugin", "source", "status", "hooks"]
    assert any(line.split()[:3] == ["cap", "built-in", "loaded"] and "turnguard_check_call" in line for line in lines)
    assert any(line.split() == ["otel", "built-in", "disabled", "-"] for line in lines)
    status, out, _ = run(capsys, "plugins", "--json")
    names = {row["name"]: row for row in json.loads(out)}
    assert {n for n, row in names.items() if row["status"] == "loaded"} == {"cap", "streak", "cycles", "cycle_repeat"}
    assert {n for n, row in names.items() if row["status"] == "disabled"} == set(NON_POLICY_PLUGINS)
    assert names["cycles"]["hooks"] == ["turnguard_check_cycle"]


def config_rows(out: str) -> dict[str, list[str]]:
    """``turnguard config``'s table: option -> [value, where it came from]."""
    import re

    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[2:])}


def test_config_shows_each_value_and_where_it_came_from(capsys, monkeypatch, tmp_path):
    (tmp_path / "turnguard.toml").write_text("max_tool_calls_per_turn = 250\nstreak-stop-at = 9\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNGUARD_STREAK_WARN_AT", "4")
    monkeypatch.setenv("TURNGUARD_STREAK_STOP_AT", "7")
    status, out, _ = run(capsys, "config")
    assert status == 0
    rows = config_rows(out)
    assert rows["max_tool_calls_per_turn"] == ["250", "turnguard.toml"]
    assert rows["streak_warn_at"] == ["4", "TURNGUARD_STREAK_WARN_AT"]
    assert rows["streak_stop_at"] == ["7", "TURNGUARD_STREAK_STOP_AT"]  # the variable wins over the file
    assert rows["soft_cap"] == ["100", "default"]
    assert rows["cap_mode"] == ["'explicit'", "derived"]
    other = tmp_path / "other.toml"
    other.write_text("[turnguard]\nsoft_cap = 30\n")
    monkeypatch.setenv("TURNGUARD_CONFIG", str(other))
    assert config_rows(run(capsys, "config", "--wide")[1])["soft_cap"] == ["30", str(other)]
    assert config_rows(run(capsys, "config", "--config", "turnguard.toml")[1])["soft_cap"] == ["100", "default"]


MINIMAL_ARGS = {
    "demo": ["soft-stuck", "--no-record"],
    "calibrate": ["{corpus}"],
    "calibrate-merge": ["{result}"],
    "assets": ["{result}.assets"],
    "install": ["claude-code", "--dry-run"],
    "uninstall": ["claude-code", "--dry-run"],
    "result": ["claude-code", "resolved"],
}
"""Arguments with which each subcommand runs successfully (the others need none)."""


@pytest.fixture
def command_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TURNGUARD_STATE_DIR", str(kept_result_token(tmp_path / "state")))  # for `result`
    corpus = tmp_path / "turns.jsonl"
    corpus.write_text(json.dumps({"id": "t", "calls": [{"tool": "a", "args": 1, "outcome": "ok"}]}) + "\n")
    result = tmp_path / "result.json"
    assert cli.main(["calibrate", str(corpus), "--json", str(result)]) == 0
    capsys.readouterr()
    return {"corpus": str(corpus), "result": str(result)}


def argv_for(name: str, inputs: dict[str, str]) -> list[str]:
    return [name, *(a.format(**inputs) for a in MINIMAL_ARGS.get(name, []))]


BAD_CONFIGURATIONS = [
    ({"TURNGUARD_SOFT_CAP": "abc"}, None, "TURNGUARD_SOFT_CAP"),
    ({"TURNGUARD_SOFT_CAP": "1" + "0" * 30}, None, "TURNGUARD_SOFT_CAP"),
    ({"TURNGUARD_STUCK_REPEAT_THRESHOLD": "0"}, None, "TURNGUARD_STUCK_REPEAT_THRESHOLD"),
    ({"TURNGUARD_SOFTCAP": "5"}, None, "did you mean 'TURNGUARD_SOFT_CAP'?"),
    ({}, "soft_cap = 'many'\n", "turnguard.toml: 'soft_cap'"),
    ({}, "sof_cap = 5\n", "turnguard.toml: unknown option 'sof_cap': did you mean 'soft_cap'?"),
    ({}, "soft_cap = \n", "turnguard.toml"),
    ({"TURNGUARD_LOAD_PLUGINS": "bogus"}, None, "'TURNGUARD_LOAD_PLUGINS': got 'bogus'"),
    ({"TURNGUARD_REMIND_MODEL": "maybe"}, None, "'TURNGUARD_REMIND_MODEL': got 'maybe'; expected a boolean"),
    ({}, "soft_cap = 4\n\n[turnguard]\nstreak_warn_at = 2\n",
     "turnguard.toml: 'soft_cap': got 4; expected options all at top level or all under [turnguard], not both"),
    ({}, "[turnguard]\nsoft_cap = 4\n\n[other]\nx = 1\n", "turnguard.toml: unknown option 'other'"),
    ({}, "soft-cap = 4\nsoft_cap = 5\n", "turnguard.toml: 'soft_cap': got 5; expected one spelling of 'soft_cap'"),
    *(({"TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT": value}, None, f"TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT={value!r}: "
       "expected a number of milliseconds") for value in ("abc", "-1", "inf", "1e400")),
]


@pytest.mark.parametrize(("env", "toml", "expected"), BAD_CONFIGURATIONS)
def test_every_command_rejects_a_bad_configuration_with_the_same_message(
    capsys, monkeypatch, tmp_path, command_inputs, env, toml, expected
):
    monkeypatch.chdir(tmp_path)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    if toml is not None:
        (tmp_path / "turnguard.toml").write_text(toml)
    messages = {}
    for name in cli.SUBCOMMANDS:
        status, out, err = run(capsys, *argv_for(name, command_inputs))
        assert status == 2 and out == "", name
        prefix = f"turnguard {cli.SUBCOMMANDS[name].called}: "
        assert err.startswith(prefix) and err.count("\n") == 1, err
        messages[name] = err.removeprefix(prefix)
    assert len(set(messages.values())) == 1, messages
    message = next(iter(messages.values()))
    assert expected in message and "turnguard config" not in message  # named once, by the prefix


@pytest.mark.parametrize("kind", list(NOT_A_TABLE))
@pytest.mark.parametrize("level", list(TABLE_PATHS))
def test_every_command_stops_on_a_table_path_holding_anything_but_a_table(capsys, monkeypatch, tmp_path,
                                                                          command_inputs, level, kind):
    name, text = TABLE_PATHS[level]
    (tmp_path / name).write_text(text.format(value=NOT_A_TABLE[kind]))
    monkeypatch.chdir(tmp_path)
    for command in cli.SUBCOMMANDS:
        status, out, err = run(capsys, *argv_for(command, command_inputs))
        said = f"turnguard {cli.SUBCOMMANDS[command].called}: {name}: {level!r}: got "
        assert (status, out, err.count("\n")) == (2, "", 1) and err.startswith(said), (command, err)


def test_every_command_runs_with_a_good_configuration(capsys, monkeypatch, tmp_path, command_inputs):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "turnguard.toml").write_text("soft_cap = 120\n")
    for name in cli.SUBCOMMANDS:
        assert run(capsys, *argv_for(name, command_inputs))[0] == 0, name


def long_options(name: str) -> list[str]:
    sub = cli._subparser(cli.parser(), name)
    return [o for a in sub._actions for o in a.option_strings if o.startswith("--") and len(o) > 4]


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_no_flag_of_any_command_may_be_abbreviated(capsys, command_inputs, name):
    for option in long_options(name):
        with pytest.raises(SystemExit) as exit_:
            cli.main([*argv_for(name, command_inputs), option[:-1], "1"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"turnguard {cli.SUBCOMMANDS[name].called}: error: unrecognized arguments: {option[:-1]}" in err, option


def test_soft_cap_is_not_taken_for_soft_caps(capsys, command_inputs):
    with pytest.raises(SystemExit):
        cli.main(["calibrate", command_inputs["corpus"], "--soft-cap", "50"])
    assert "unrecognized arguments: --soft-cap 50" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_an_unknown_flag_is_reported_by_the_commands_own_parser(capsys, command_inputs, name):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv_for(name, command_inputs), "--no-such-flag"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    called = cli.SUBCOMMANDS[name].called
    assert err.startswith(f"usage: turnguard {called} ")
    assert err.rstrip().endswith(f"turnguard {called}: error: unrecognized arguments: --no-such-flag")


def test_an_unknown_flag_before_any_command_is_the_root_parsers(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--no-such-flag", "demo"])
    assert "turnguard: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_python_dash_m_turnguard_is_the_command(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "turnguard", "config"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "soft_cap" in done.stdout
    done = subprocess.run([sys.executable, "-m", "turnguard", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == f"turnguard {importlib.metadata.version('turnguard')}"


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
    assert [ep.value for ep in scripts] == ["turnguard._cli:main"]


EXPORTING = ("demo", "result")
"""The commands that export over OTLP when an ``OTEL_EXPORTER_OTLP_*`` variable is set."""


@pytest.mark.parametrize(("var", "value"), [
    *(("OTEL_EXPORTER_OTLP_TIMEOUT", value) for value in ("inf", "1e400", "nan", "-1", "0")),
    ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
    ("OTEL_BSP_SCHEDULE_DELAY", "0"), ("OTEL_BLRP_SCHEDULE_DELAY", "0.5"), ("OTEL_BSP_MAX_QUEUE_SIZE", str(10**30)),
    ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-1"), ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip"),
    ("OTEL_METRICS_EXEMPLAR_FILTER", "x"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
    ("OTEL_TRACES_EXPORTER", "zipkin"), ("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
])
def test_every_command_that_exports_refuses_an_unusable_otel_setting_in_the_same_line(
    capsys, monkeypatch, command_inputs, var, value
):
    """``result`` ended in a traceback (exit 1) where ``demo`` said one line (exit 2); the other
    commands export nothing and do not read ``OTEL_*``."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(var, value)
    messages = {}
    for name in cli.SUBCOMMANDS:
        status, out, err = run(capsys, *argv_for(name, command_inputs))
        if name not in EXPORTING:
            assert status == 0, (name, err)
            continue
        prefix = f"turnguard {name}: "
        assert (status, out, err.count("\n")) == (2, "", 1) and err.startswith(prefix + var), (name, err)
        messages[name] = err.removeprefix(prefix)
    assert len(set(messages.values())) == 1, messages
    monkeypatch.delenv(var)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert run(capsys, *argv_for("result", command_inputs))[0] == 0  # refused before its work: still reportable


def test_result_without_the_sdk_says_which_extra_in_one_line(capsys, monkeypatch, command_inputs):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name.startswith("opentelemetry.sdk") else find_spec(name, *args))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    status, out, err = run(capsys, *argv_for("result", command_inputs))
    assert (status, out, err.count("\n")) == (2, "", 1), err
    assert err.startswith("turnguard result: ") and 'pip install "turnguard[otlp]"' in err
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert run(capsys, *argv_for("result", command_inputs))[0] == 0  # the turn's result is still to report


def test_demo_record_appends_to_the_turns_file_as_its_help_says(capsys, tmp_path):
    """Run after run, the turns file keeps every run's turns (calibrate reads them all): the help and
    the closing line say "append", never "write"."""
    record = tmp_path / "turns.jsonl"
    record.write_text('{"id": "earlier"}\n')
    for _ in range(2):
        status, out, _ = run(capsys, "demo", "soft-stuck", "runaway", "--record", str(record))
        assert status == 0 and out.rstrip().endswith(f"turns appended to {record}")
    lines = record.read_text().splitlines()
    assert lines[0] == '{"id": "earlier"}' and len(lines) == 5
    assert len({json.loads(line)["id"] for line in lines}) == 5
    option = next(a for a in cli._subparser(cli.parser(), "demo")._actions if "--record" in a.option_strings)
    assert option.help.startswith("append one JSON line per turn") and "write" not in option.help
