"""A probe differs from its main policy only where the operator said so, in every form it can be
given (a whole ``GuardConfig``, ``replace``, a mapping, TOML, the environment); it is named
``<main>-probe`` unless named; and probe sampling takes every id a turn accepts."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from turnguard._probe import sample_point, selects

MAIN: dict[str, Any] = {
    "name": "prod", "max_tool_calls_per_turn": 400, "soft_cap": 50, "hard_multiplier": 4,
    "stuck_repeat_threshold": 9, "stuck_signal": "stale_repeat", "streak_warn_at": 3, "streak_stop_at": 7,
    "streak_stop_on": "any", "max_cycles_per_turn": 30, "key_mode": "bytes", "remind_model": True,
    "fail_mode": "closed", "max_tracked_keys": 1000, "digest_key": "main-secret", "capture_content": True,
    "disable_plugins": ("recorder",), "load_entrypoints": False, "recorder_path": "/var/tmp/tg/main.jsonl",
    "stateful_tools": ("ci_status", "job_status"), "streak_exempt_tools": ("wait_for",), "recorder_results": True,
    "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 6, "cycle_repeat_max_period": 3,
}
"""A main configuration with every option away from its default."""
PROBE_VALUE: dict[str, Any] = {
    "name": "lenient", "max_tool_calls_per_turn": 300, "soft_cap": 70, "hard_multiplier": 20,
    "stuck_repeat_threshold": 4, "stuck_signal": "repeat", "streak_warn_at": 4, "streak_stop_at": 12,
    "streak_stop_on": "error", "max_cycles_per_turn": 60, "key_mode": "canonical", "remind_model": False,
    "fail_mode": "open", "max_tracked_keys": 2000, "digest_key": "probe-secret", "capture_content": False,
    "disable_plugins": ("otel",), "load_entrypoints": True, "recorder_path": "/var/tmp/tg/probe.jsonl",
    "stateful_tools": ("*",), "streak_exempt_tools": ("sleep",), "recorder_results": False,
    "cycle_repeat_warn_at": 4, "cycle_repeat_stop_at": 9, "cycle_repeat_max_period": 5,
}
"""What a probe sets each option to, one at a time (each differs from MAIN's)."""
NOT_IN_A_PROBE = ("shadow", "probe")


def test_every_option_has_a_case():
    options = {f.name for f in dataclasses.fields(tg.GuardConfig)} - set(NOT_IN_A_PROBE)
    assert set(MAIN) == set(PROBE_VALUE) == options
    default = tg.GuardConfig()
    for key in options:
        assert getattr(default, key) != MAIN[key] != PROBE_VALUE[key], key


def expected(option: str | None) -> tg.GuardConfig:
    values = dict(MAIN, name="prod-probe")
    if option is not None:
        values[option] = PROBE_VALUE[option]
    return tg.GuardConfig(**values)


def env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def toml_text(options: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, tuple):
            return json.dumps(list(v))
        return json.dumps(v) if isinstance(v, str) else repr(v)
    return "".join(f"{key} = {value(v)}\n" for key, v in options.items())


def env_of(options: dict[str, Any]) -> dict[str, str]:
    return {f"TURNGUARD_{key.upper()}": env_text(v) for key, v in options.items()}


def resolved(config: tg.GuardConfig) -> tg.GuardConfig:
    probe = config.probe_settings()
    assert probe is not None and probe.rate == 0.5
    return probe.config


FORMS = {
    "a whole GuardConfig": lambda change, tmp: tg.GuardConfig(**MAIN, probe=tg.Probe(0.5, tg.GuardConfig(**change))),
    "GuardConfig.replace": lambda change, tmp: tg.GuardConfig(**MAIN).replace(
        probe=tg.Probe(0.5, tg.PROFILES["seed"].replace(**change))),
    "a profile, replaced": lambda change, tmp: tg.GuardConfig(**MAIN, probe=tg.Probe(
        0.5, tg.GuardConfig(name="x").replace(**change).replace(name=change.get("name", "prod")))),
    "a mapping": lambda change, tmp: tg.GuardConfig(**MAIN, probe={"rate": 0.5, **change}),
    "TOML": lambda change, tmp: tg.GuardConfig.load(
        _write(tmp / "turnguard.toml", toml_text(MAIN) + "[probe]\nrate = 0.5\n" + toml_text(change)), environ={}),
    "pyproject.toml": lambda change, tmp: tg.GuardConfig.load(
        _write(tmp / "pyproject.toml", "[tool.turnguard]\n" + toml_text(MAIN) + "[tool.turnguard.probe]\n"
               "rate = 0.5\n" + toml_text(change)), environ={}),
    "the environment, probe in TOML": lambda change, tmp: tg.GuardConfig.load(
        _write(tmp / "turnguard.toml", "[probe]\nrate = 0.5\n" + toml_text(change)), environ=env_of(MAIN)),
    "GuardConfig.from_env": lambda change, tmp: tg.GuardConfig.from_env(env_of(MAIN)).replace(
        probe=tg.Probe(0.5, tg.GuardConfig.from_env(env_of(change)))),
    "GuardConfig.load with arguments": lambda change, tmp: tg.GuardConfig.load(
        search=None, environ={}, **MAIN, probe=tg.Probe(0.5, tg.GuardConfig.load(search=None, environ={}, **change))),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("option", [None, *PROBE_VALUE])
def test_a_probe_differs_from_its_main_policy_only_where_it_was_told(tmp_path, form, option):
    change = {} if option is None else {option: PROBE_VALUE[option]}
    config = FORMS[form](change, tmp_path)
    got = resolved(config)
    assert got == expected(option)
    differs = {f.name for f in dataclasses.fields(got) if getattr(got, f.name) != getattr(expected(None), f.name)}
    assert differs == (set() if option is None else {option})
    assert got.name == ("lenient" if option == "name" else "prod-probe")


def test_a_probe_that_names_itself_after_the_main_policy_is_still_told_apart():
    config = tg.GuardConfig(name="prod", probe=tg.Probe(0.5, tg.GuardConfig(name="prod", soft_cap=7)))
    assert (resolved(config).name, resolved(config).soft_cap) == ("prod-probe", 7)
    long = tg.GuardConfig(name="p" * 64, probe={"rate": 0.5})
    assert long.probe_settings().config.name == "p" * 58 + "-probe"


def test_a_probe_guard_runs_the_merged_limits():
    """Main S=50, m=4 (backstop 200) with a probe that only raises m to 20: probe turns halt at
    50 x 20 = 1000, not at the defaults' 100 x 20; the main configuration beside it at 200."""
    main = tg.GuardConfig(name="prod", soft_cap=50, hard_multiplier=4, load_entrypoints=False,
                          disable_plugins=("otel", "recorder"))
    guard = tg.Guard(main.replace(probe=tg.Probe(1.0, tg.GuardConfig(hard_multiplier=20))), environ={})
    with guard.turn() as turn:
        calls = 0
        while not turn.check_call(tg.ToolCall("read", {"i": calls})).halted:
            calls += 1
    assert turn.summary.cohort == "probe" and turn.summary.tool_calls == 1001
    assert guard._probe_guard.config.name == "prod-probe"
    assert dict(guard._probe_guard.config.shadow)["prod"].hard_cap == 200


def test_a_probe_config_remembers_what_its_caller_set():
    assert tg.GuardConfig().given == frozenset()
    assert tg.GuardConfig(soft_cap=5).replace(name="x").given == {"soft_cap", "name"}
    assert tg.GuardConfig("n", None, 30).given == {"name", "max_tool_calls_per_turn", "soft_cap"}
    assert tg.GuardConfig.from_mapping({"soft-cap": 3}).given == {"soft_cap"}
    assert tg.GuardConfig.from_env({"TURNGUARD_STREAK_STOP_AT": "9"}).given == {"streak_stop_at"}
    assert tg.GuardConfig(soft_cap=5) == tg.GuardConfig().replace(soft_cap=5)  # equality ignores it
    assert hash(tg.GuardConfig(soft_cap=5)) == hash(tg.GuardConfig().replace(soft_cap=5))
    every = {f.name for f in dataclasses.fields(tg.GuardConfig)}
    assert dataclasses.replace(tg.GuardConfig(), soft_cap=5).given == every  # not through replace: all given


# -- sampling: the ids hosts use ---------------------------------------------------------------

def test_integer_and_string_ids_sample_on_their_text():
    for i in range(2000):
        assert selects(0.3, i, "t") == selects(0.3, str(i), "t")
        assert selects(0.3, None, i) == selects(0.3, None, str(i))
    assert selects(0.5, 10**5000, "t") in (True, False)  # too many digits to print: the turn id decides


class Odd:
    """An id of no type turnguard knows, whose methods all raise."""

    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __format__ = __hash__ = __eq__ = __str__  # type: ignore[assignment]


class Text(str):
    def __str__(self) -> str:
        raise RuntimeError("no text")

    def encode(self, *args: Any) -> bytes:
        raise RuntimeError("no bytes")


@pytest.mark.parametrize("conversation", [None, True, 1.5, uuid.UUID(int=7), b"bytes", ("a", 1), Odd()],
                         ids=["none", "bool", "float", "uuid", "bytes", "tuple", "odd"])
def test_any_other_conversation_id_samples_by_the_turn_id(conversation):
    for i in range(300):
        assert selects(0.4, conversation, f"t{i}") == selects(0.4, None, f"t{i}")


def test_a_str_subclass_samples_on_its_text_without_calling_its_methods():
    assert selects(0.5, Text("conv-9"), "t") == selects(0.5, "conv-9", "t")
    assert sample_point(str.__str__(Text("x"))) == sample_point("x")


@pytest.mark.parametrize("conversation", [12345, "12345", uuid.UUID(int=3), Odd(), Text("c"), "\udc80", 10**5000],
                         ids=["int", "str", "uuid", "odd", "str-subclass", "surrogate", "huge-int"])
def test_a_guard_with_a_probe_opens_turns_for_every_id_a_turn_accepts(conversation):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, probe={"rate": 0.5, "hard_multiplier": 20}), environ={})
    cohorts = set()
    for _ in range(40):
        with guard.turn(conversation_id=conversation) as turn:
            turn.check_call(tg.ToolCall("read", {}))
        cohorts.add(turn.summary.cohort)
    if isinstance(conversation, (str, int)) and conversation != 10**5000:
        assert len(cohorts) == 1  # one conversation, one cohort
    else:
        assert cohorts == {"live", "probe"}  # by turn id: both, at rate 0.5 over 40 turns


def test_12345_and_its_text_land_in_one_cohort_through_a_guard():
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, probe={"rate": 0.5}), environ={})
    for i in range(100):
        with guard.turn(conversation_id=i) as a, guard.turn(conversation_id=str(i)) as b:
            pass
        assert a.summary.cohort == b.summary.cohort


@pytest.mark.parametrize("name", ["tab\tname", "line\nbreak", "nul\x00", "del\x7f", "c1\x85", "lone\udc80",
                                  "\ud800", "x" * 65, "", "   ", 7, None])
def test_a_policy_or_shadow_name_that_no_backend_can_show_is_refused(name):
    with pytest.raises(tg.ConfigError, match="control characters or surrogates") as raised:
        tg.GuardConfig(name=name)
    assert raised.value.key == "name"
    with pytest.raises(tg.ConfigError, match="control characters or surrogates"):
        tg.GuardConfig(shadow={name: {"soft_cap": 5}} if isinstance(name, str) else ((name, {"soft_cap": 5}),))


@pytest.mark.parametrize("escaped", ["\\t", "\\u0000", "\\u001b[31m"])
def test_a_name_with_a_control_character_is_refused_from_toml_and_the_environment(tmp_path, escaped):
    path = tmp_path / "turnguard.toml"
    path.write_text(f'name = "a{escaped}b"\n', encoding="utf-8")
    with pytest.raises(tg.ConfigError, match="control characters") as raised:
        tg.GuardConfig.load(path, environ={})
    assert str(path) in str(raised.value)
    with pytest.raises(tg.ConfigError, match="TURNGUARD_NAME"):
        tg.GuardConfig.from_env({"TURNGUARD_NAME": "a\x1bb"})


@pytest.mark.parametrize("name", ["prod", "équipe-α", "team 7", "emoji👍", "p" * 64])
def test_printable_names_in_any_script_are_kept(name):
    assert tg.GuardConfig(name=name).name == name
    assert dict(tg.GuardConfig(shadow={name: {"soft_cap": 5}}).shadow_configs())[name].soft_cap == 5


def test_a_str_subclass_name_is_kept_as_its_text():
    config = tg.GuardConfig(name=Text("prod"))
    assert type(config.name) is str and config.name == "prod"
