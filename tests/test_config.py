"""``GuardConfig``: defaults, loading from kwargs, mappings, TURNGUARD_* variables and TOML, and
a ConfigError naming the key for every bad input."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import random
from pathlib import Path

import pytest

import turnguard as tg
from turnguard import _config as config_module


def test_the_defaults_are_the_seeds_values():
    c = tg.GuardConfig()
    assert (c.max_tool_calls_per_turn, c.soft_cap, c.hard_multiplier, c.stuck_repeat_threshold) == (None, 100, 10, 6)
    assert (c.streak_warn_at, c.streak_stop_at, c.max_cycles_per_turn) == (5, 8, 0)
    assert (c.key_mode, c.remind_model, c.fail_mode, c.stuck_signal) == ("canonical", False, "open", "repeat")
    assert not c.capture_content and c.cap_mode == "adaptive" and c.hard_cap == 1000 and not c.explicit_cap


@pytest.mark.parametrize(("options", "mode", "hard_cap", "explicit"), [
    ({"max_tool_calls_per_turn": 100}, "explicit", 100, True),
    ({"max_tool_calls_per_turn": 0}, "disabled", None, True),
    ({"max_tool_calls_per_turn": -1}, "disabled", None, True),
    ({"soft_cap": 0}, "disabled", None, False),
    ({"soft_cap": 20, "hard_multiplier": 2.5}, "adaptive", 50, False),
])
def test_whether_the_cap_was_set_explicitly_is_tracked(options, mode, hard_cap, explicit):
    c = tg.GuardConfig(**options)
    assert (c.cap_mode, c.hard_cap, c.explicit_cap) == (mode, hard_cap, explicit)


def test_an_explicit_cap_equal_to_the_default_is_still_explicit():
    assert tg.GuardConfig(max_tool_calls_per_turn=100).cap_mode == "explicit"
    assert tg.GuardConfig.from_mapping({"max_tool_calls_per_turn": 100}).explicit_cap


def test_config_is_frozen_and_replace_validates():
    c = tg.GuardConfig()
    with pytest.raises(AttributeError):
        c.soft_cap = 5  # type: ignore[misc]
    assert c.replace(soft_cap=5).soft_cap == 5
    with pytest.raises(tg.ConfigError, match="soft_cap"):
        c.replace(soft_cap="5")


def test_lists_are_accepted_where_tuples_are_stored():
    c = tg.GuardConfig(disable_plugins=["otel", "streak"], shadow=[("wider", {"soft_cap": 200})])
    assert c.disable_plugins == ("otel", "streak") and c.shadow == (("wider", {"soft_cap": 200}),)
    assert tg.GuardConfig(shadow={"wider": {"soft_cap": 200}}).shadow == (("wider", {"soft_cap": 200}),)


def test_from_mapping_accepts_option_names_and_dashed_names():
    c = tg.GuardConfig.from_mapping({"soft-cap": 50, "stuck_repeat_threshold": 4, "disable_plugins": ["otel"]})
    assert (c.soft_cap, c.stuck_repeat_threshold, c.disable_plugins) == (50, 4, ("otel",))


def test_from_env_reads_turnguard_variables():
    env = {"TURNGUARD_SOFT_CAP": "200", "TURNGUARD_HARD_MULTIPLIER": "2.5", "TURNGUARD_REMIND_MODEL": "yes",
           "TURNGUARD_DISABLE_PLUGINS": "otel, streak", "TURNGUARD_MAX_TOOL_CALLS_PER_TURN": "50",
           "TURNGUARD_KEY_MODE": "bytes", "TURNGUARD_DIGEST_KEY": "s3cret", "PATH": "/bin",
           "TURNGUARD_LOAD_PLUGINS": "0"}
    c = tg.GuardConfig.from_env(env)
    assert (c.soft_cap, c.hard_multiplier, c.remind_model, c.disable_plugins) == (200, 2.5, True, ("otel", "streak"))
    assert (c.max_tool_calls_per_turn, c.key_mode, c.digest_key) == (50, "bytes", "s3cret")
    assert tg.GuardConfig.from_env({"TURNGUARD_MAX_TOOL_CALLS_PER_TURN": "none"}).max_tool_calls_per_turn is None


def test_an_unknown_turnguard_variable_is_refused_or_ignored_with_a_warning_when_not_strict(caplog):
    with pytest.raises(tg.ConfigError, match="TURNGUARD_SOFTCAP"):
        tg.GuardConfig.from_env({"TURNGUARD_SOFTCAP": "5"})
    env = {"TURNGUARD_VENV": ".venv", "TURNGUARD_SOFTCAP": "5"}
    with caplog.at_level(logging.WARNING, logger="turnguard"):
        assert tg.GuardConfig.from_env(env, strict=False) == tg.GuardConfig()
    assert "TURNGUARD_SOFTCAP" in caplog.text


def test_an_unknown_keyword_option_is_a_config_error_naming_it():
    with pytest.raises(tg.ConfigError, match="soft_cpa") as info:
        tg.GuardConfig(soft_cpa=5)
    assert info.value.key == "soft_cpa"
    with pytest.raises(tg.ConfigError, match="foo"):
        tg.GuardConfig().replace(foo=1)


@pytest.mark.parametrize(
    ("soft_cap", "multiplier", "hard_cap"), [(100, 1.15, 115), (100, 2.3, 230), (100, 10, 1000), (7, 1.5, 10)]
)
def test_the_backstop_is_the_exact_product_of_soft_cap_and_multiplier(soft_cap, multiplier, hard_cap):
    assert tg.GuardConfig(soft_cap=soft_cap, hard_multiplier=multiplier).hard_cap == hard_cap


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"soft_cap": 10**10, "hard_multiplier": 1e308}, "hard_multiplier"),
        ({"soft_cap": 10**400}, "soft_cap"),
        ({"max_tool_calls_per_turn": 10**30}, "max_tool_calls_per_turn"),
    ],
)
def test_caps_too_large_to_count_are_config_errors_not_overflows(options, key):
    with pytest.raises(tg.ConfigError) as info:
        tg.GuardConfig(**options)
    assert info.value.key == key


def test_from_toml_reads_pyproject_tool_turnguard(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "host"\n\n[tool.turnguard]\nsoft_cap = 150\nstreak_warn_at = 3\n'
                    'disable_plugins = ["otel"]\n')
    c = tg.GuardConfig.from_toml(path)
    assert (c.soft_cap, c.streak_warn_at, c.disable_plugins) == (150, 3, ("otel",))


@pytest.mark.parametrize("text", ["max_tool_calls_per_turn = 40\n", "[turnguard]\nmax_tool_calls_per_turn = 40\n"])
def test_from_toml_reads_a_turnguard_toml(tmp_path, text):
    path = tmp_path / "turnguard.toml"
    path.write_text(text)
    assert tg.GuardConfig.from_toml(path).cap_mode == "explicit"


def test_load_layers_defaults_toml_env_and_keywords(tmp_path):
    (tmp_path / "turnguard.toml").write_text("soft_cap = 150\nstreak_warn_at = 3\nstreak_stop_at = 6\n")
    env = {"TURNGUARD_STREAK_WARN_AT": "4"}
    c = tg.GuardConfig.load(search=tmp_path, environ=env, streak_stop_at=7)
    assert (c.soft_cap, c.streak_warn_at, c.streak_stop_at, c.hard_multiplier) == (150, 4, 7, 10)


def test_load_finds_pyproject_only_with_a_turnguard_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert tg.GuardConfig.load(search=tmp_path, environ={}) == tg.GuardConfig()
    (tmp_path / "pyproject.toml").write_text('[tool.turnguard]\nsoft_cap = 7\n')
    assert tg.GuardConfig.load(search=tmp_path, environ={}).soft_cap == 7


def test_load_reads_the_file_named_by_turnguard_config(tmp_path):
    path = tmp_path / "elsewhere.toml"
    path.write_text("max_cycles_per_turn = 12\n")
    c = tg.GuardConfig.load(search=None, environ={"TURNGUARD_CONFIG": str(path)})
    assert c.max_cycles_per_turn == 12


BAD = [
    ({"soft_cap": "100"}, "soft_cap"),
    ({"soft_cap": 1.5}, "soft_cap"),
    ({"soft_cap": True}, "soft_cap"),
    ({"hard_multiplier": 0.5}, "hard_multiplier"),
    ({"hard_multiplier": float("nan")}, "hard_multiplier"),
    ({"hard_multiplier": float("inf")}, "hard_multiplier"),
    ({"hard_multiplier": "10"}, "hard_multiplier"),
    ({"stuck_repeat_threshold": 0}, "stuck_repeat_threshold"),
    ({"streak_warn_at": -1}, "streak_warn_at"),
    ({"streak_stop_at": -2}, "streak_stop_at"),
    ({"streak_warn_at": 9, "streak_stop_at": 8}, "streak_warn_at"),
    ({"max_cycles_per_turn": -1}, "max_cycles_per_turn"),
    ({"max_tool_calls_per_turn": "100"}, "max_tool_calls_per_turn"),
    ({"max_tool_calls_per_turn": 2.5}, "max_tool_calls_per_turn"),
    ({"max_tool_calls_per_turn": False}, "max_tool_calls_per_turn"),
    ({"key_mode": "sha256"}, "key_mode"),
    ({"stuck_signal": "window"}, "stuck_signal"),
    ({"fail_mode": "maybe"}, "fail_mode"),
    ({"max_tracked_keys": 0}, "max_tracked_keys"),
    ({"remind_model": "yes"}, "remind_model"),
    ({"load_entrypoints": 1}, "load_entrypoints"),
    ({"disable_plugins": "otel"}, "disable_plugins"),
    ({"disable_plugins": ("otel", 3)}, "disable_plugins"),
    ({"digest_key": 5}, "digest_key"),
    ({"recorder_path": 5}, "recorder_path"),
    ({"shadow": "wider"}, "shadow"),
    ({"soft_limit": 5}, "soft_limit"),
]


@pytest.mark.parametrize(("options", "key"), BAD, ids=[f"{k}={next(iter(o.values()))!r}" for o, k in BAD])
def test_a_bad_configuration_is_a_config_error_naming_the_key(options, key):
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.from_mapping(options)
    error = caught.value
    assert error.key == key and repr(key) in str(error) and "expected" in str(error)
    assert isinstance(error, ValueError)


class OddInt(int):
    """An int whose own methods lie (``int(x)`` is 0, it equals nothing, it has no order)."""

    def __repr__(self) -> str:
        return "OddInt(?)"

    __str__ = __repr__

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = int.__hash__

    def __lt__(self, other: object) -> bool:
        raise TypeError("no order")

    __le__ = __gt__ = __ge__ = __lt__


class OddFloat(float):
    """A float whose own methods lie: numpy 2's ``float64`` reprs as ``np.float64(1.15)``."""

    def __repr__(self) -> str:
        return f"np.float64({float.__repr__(self)})"

    __str__ = __repr__

    def __float__(self) -> float:
        return 0.0

    def is_integer(self) -> bool:
        return not float.is_integer(self)

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = float.__hash__

    def __lt__(self, other: object) -> bool:
        raise TypeError("no order")

    __le__ = __gt__ = __ge__ = __lt__


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


NUMBER_VALUES = {"max_tool_calls_per_turn": 50, "soft_cap": 60, "hard_multiplier": 1.15,
                 "stuck_repeat_threshold": 4, "streak_warn_at": 3, "streak_stop_at": 9, "max_cycles_per_turn": 7,
                 "max_tracked_keys": 1000, "cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 5,
                 "cycle_repeat_max_period": 3}
"""A valid value, not the default, of each numeric option."""


def _odd_forms(value: float) -> dict[str, object]:
    forms: dict[str, object] = {"odd float": OddFloat(value)}
    if isinstance(value, int):
        forms.update({"odd int": OddInt(value), "IntEnum": enum.IntEnum("Cap", {"CHOSEN": value}).CHOSEN})
    elif float(value).is_integer():
        forms["odd int"] = OddInt(int(value))
    return forms


def _same_option_in_every_layer(key: str, value: object) -> dict[str, tg.GuardConfig]:
    return {"keyword": tg.GuardConfig(**{key: value}), "mapping": tg.GuardConfig.from_mapping({key: value}),
            "shadow": tg.GuardConfig(shadow={"s": {key: value}}).shadow_configs()[0][1],
            "probe": tg.GuardConfig(probe={"rate": 0.5, key: value}).probe_settings().config}


def test_every_numeric_option_has_a_value_here():
    assert set(NUMBER_VALUES) == set(config_module._NUMBER_FIELDS)
    numeric = {f.name for f in dataclasses.fields(tg.GuardConfig)
               if type(f.default) in (int, float) or "int" in str(f.type) or "float" in str(f.type)}
    assert numeric == set(NUMBER_VALUES)


@pytest.mark.parametrize("key", sorted(NUMBER_VALUES))
def test_a_number_given_as_an_int_or_float_subclass_is_that_plain_number(key):
    plain = NUMBER_VALUES[key]
    expected = _same_option_in_every_layer(key, plain)
    for label, odd in _odd_forms(plain).items():
        if isinstance(odd, float) and key != "hard_multiplier":
            continue  # (a float is no integer option: below)
        for layer, config in _same_option_in_every_layer(key, odd).items():
            value = getattr(config, key)
            assert type(value) is type(plain) and value == plain, (label, layer)
            assert config == expected[layer] and repr(config) == repr(expected[layer]), (label, layer)
            assert config.hard_cap == expected[layer].hard_cap, (label, layer)


@pytest.mark.parametrize("multiplier", [1.15, 2.0, 1.1, 3, 1.0000001, 7.3])
@pytest.mark.parametrize("soft_cap", [1, 7, 100, 999])
def test_the_backstop_of_a_multiplier_subclass_is_the_plain_multipliers(soft_cap, multiplier):
    plain = tg.GuardConfig(soft_cap=soft_cap, hard_multiplier=multiplier).hard_cap
    for odd in _odd_forms(multiplier).values():
        assert tg.GuardConfig(soft_cap=soft_cap, hard_multiplier=odd).hard_cap == plain


@pytest.mark.parametrize("rate", [OddFloat(0.25), OddFloat(1.0), OddInt(1), OddInt(0)])
def test_a_probe_rate_given_as_an_int_or_float_subclass_is_that_plain_rate(rate):
    plain = int.__int__(rate) if isinstance(rate, int) else float.__float__(rate)
    for probe in (tg.Probe(rate, tg.GuardConfig()), tg.GuardConfig(probe={"rate": rate}).probe_settings()):
        assert type(probe.rate) is type(plain) and probe.rate == plain


def _bad_numbers(key: str) -> list[object]:
    """Values no numeric option takes, of every kind: a value whose repr raises among them."""
    bad: list[object] = [BadRepr(), str(NUMBER_VALUES[key]), True, OddFloat(float("nan")), [1]]
    if key == "hard_multiplier":
        return [*bad, OddFloat(0.5), OddFloat(float("inf")), OddInt(0), None]
    return [*bad, OddFloat(NUMBER_VALUES[key])]


@pytest.mark.parametrize("key", sorted(NUMBER_VALUES))
def test_a_bad_number_in_any_form_is_a_config_error_naming_the_key(key):
    for value in _bad_numbers(key):
        for prefix, options in (("", {key: value}), ("probe.", {"probe": {"rate": 0.5, key: value}})):
            with pytest.raises(tg.ConfigError) as caught:
                tg.GuardConfig(**options)
            assert caught.value.key == prefix + key and repr(prefix + key) in str(caught.value), value


@pytest.mark.parametrize("rate", [BadRepr(), OddFloat(float("nan")), OddFloat(1.5), OddInt(2), "0.5", True])
def test_a_bad_probe_rate_in_any_form_is_a_config_error_naming_it(rate):
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig(probe={"rate": rate})
    assert caught.value.key == "probe.rate" and "'probe.rate'" in str(caught.value)


BAD_ENV = [
    ("TURNGUARD_SOFT_CAP", "abc"),
    ("TURNGUARD_HARD_MULTIPLIER", "ten"),
    ("TURNGUARD_REMIND_MODEL", "maybe"),
    ("TURNGUARD_STREAK_WARN_AT", "-3"),
    ("TURNGUARD_KEY_MODE", "md5"),
    ("TURNGUARD_SHADOW", "wider"),
]


@pytest.mark.parametrize(("var", "value"), BAD_ENV)
def test_a_bad_environment_variable_is_a_config_error_naming_it(var, value):
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.from_env({var: value})
    assert caught.value.key in (var, var.removeprefix("TURNGUARD_").lower())
    assert value in str(caught.value)


@pytest.mark.parametrize(("text", "key"), [("soft_kap = 5\n", "soft_kap"), ('soft_cap = "many"\n', "soft_cap"),
                                           ("soft_cap = \n", "turnguard.toml")])
def test_a_bad_toml_file_is_a_config_error(tmp_path, text, key):
    path = tmp_path / "turnguard.toml"
    path.write_text(text)
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.from_toml(path)
    assert key in caught.value.key


def test_a_mapping_is_required():
    with pytest.raises(tg.ConfigError, match="mapping"):
        tg.GuardConfig.from_mapping(["soft_cap", 5])  # type: ignore[arg-type]


# -- where a value came from, and what a typo meant --------------------------------------------------


@pytest.mark.parametrize("name", ["pyproject.toml", "turnguard.toml", "custom.toml"])
def test_a_bad_value_in_a_file_names_the_file(tmp_path, name):
    path = tmp_path / name
    table = "[tool.turnguard]\n" if name == "pyproject.toml" else ""
    path.write_text(f"{table}soft_cap = -1\nstuck_repeat_threshold = 0\n")
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(path, environ={})
    assert caught.value.source == str(path)
    assert str(caught.value).startswith(f"{path}: 'stuck_repeat_threshold': got 0; expected")


@pytest.mark.parametrize(("layer", "typo", "meant"), [
    ("keyword", "soft_cpa", "soft_cap"), ("keyword", "max_tool_calls", "max_tool_calls_per_turn"),
    ("mapping", "streak_warn", "streak_warn_at"), ("toml", "sof_cap", "soft_cap"), ("toml", "soft-kap", "soft_cap"),
    ("pyproject", "stuck_repeat_treshold", "stuck_repeat_threshold"),
    ("env", "TURNGUARD_SOFTCAP", "TURNGUARD_SOFT_CAP"), ("env", "TURNGUARD_KEYMODE", "TURNGUARD_KEY_MODE"),
    ("shadow", "streak_stop_a", "streak_stop_at"),
])
def test_an_unknown_option_suggests_the_closest_one(tmp_path, layer, typo, meant):
    with pytest.raises(tg.ConfigError) as caught:
        if layer == "keyword":
            tg.GuardConfig(**{typo: 5})
        elif layer == "mapping":
            tg.GuardConfig.from_mapping({typo: 5})
        elif layer == "env":
            tg.GuardConfig.load(environ={typo: "5"}, search=None)
        elif layer == "shadow":
            tg.GuardConfig(shadow={"wide": {typo: 5}})
        else:
            path = tmp_path / ("pyproject.toml" if layer == "pyproject" else "turnguard.toml")
            path.write_text(("[tool.turnguard]\n" if layer == "pyproject" else "") + f"{typo} = 5\n")
            tg.GuardConfig.load(environ={}, search=tmp_path)
    message = str(caught.value)
    assert f"did you mean {meant!r}?" in message
    assert message.count("turnguard config") == 0
    if layer in ("toml", "pyproject"):
        assert message.startswith(f"{tmp_path}/")


def test_an_unknown_option_with_no_close_name_lists_them_all():
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig(zzz=1)
    listed = "shadow, soft_cap, stateful_tools, streak_exempt_tools, streak_stop_at"
    assert "did you mean" not in str(caught.value) and listed in str(caught.value)


def test_a_value_a_variable_sets_that_fails_validation_names_the_variable():
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(environ={"TURNGUARD_STREAK_WARN_AT": "-2"}, search=None)
    assert str(caught.value).startswith("TURNGUARD_STREAK_WARN_AT: 'streak_warn_at': got -2")


def test_load_with_sources_names_the_layer_each_value_came_from(tmp_path):
    path = tmp_path / "turnguard.toml"
    path.write_text("soft_cap = 50\nkey-mode = 'bytes'\nstreak_warn_at = 2\n")
    config, sources = tg.GuardConfig.load_with_sources(
        environ={"TURNGUARD_STREAK_WARN_AT": "3", "PATH": "/bin"}, search=tmp_path, fail_mode="closed")
    assert (config.soft_cap, config.key_mode, config.streak_warn_at, config.fail_mode) == (50, "bytes", 3, "closed")
    assert sources["soft_cap"] == sources["key_mode"] == str(path)
    assert sources["streak_warn_at"] == "TURNGUARD_STREAK_WARN_AT"
    assert sources["fail_mode"] == "argument"
    assert {sources[k] for k in sources if k not in ("soft_cap", "key_mode", "streak_warn_at", "fail_mode")} == {
        "default"}
    assert set(sources) == {f.name for f in dataclasses.fields(tg.GuardConfig)}
    assert tg.GuardConfig.load(environ={"TURNGUARD_STREAK_WARN_AT": "3"}, search=tmp_path, fail_mode="closed") == config


@pytest.mark.parametrize(("text", "said"), [(None, "No such file or directory"), ("soft_cap = \n", "Invalid value")])
def test_a_file_that_cannot_be_read_or_parsed_is_named_once_with_why(tmp_path, text, said):
    path = tmp_path / "turnguard.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and message.count(str(path)) == 1 and said in message


NOT_UTF8 = "key\udcff"
"""An environment variable's value holding the byte 0xff: Python keeps it as a lone surrogate."""
ENV_OPTIONS = [f.name for f in dataclasses.fields(tg.GuardConfig) if f.name not in ("shadow", "probe")]


@pytest.mark.parametrize("option", ENV_OPTIONS)
def test_a_variable_holding_a_byte_that_is_not_utf8_is_refused_at_load_or_works_throughout(option, tmp_path):
    """Whatever ``TURNGUARD_<OPTION>`` a byte that is not UTF-8 reaches: a ``ConfigError`` at load
    naming the variable, or a guard that runs, records, snapshots, resumes and reports a turn with
    it (``TURNGUARD_DIGEST_KEY`` was accepted, then failed the first call keyed)."""
    from turnguard.telemetry._testing import InMemoryTelemetry

    var = f"TURNGUARD_{option.upper()}"
    value = os.path.join(str(tmp_path), NOT_UTF8) if option == "recorder_path" else NOT_UTF8
    try:
        config = tg.GuardConfig.load(environ={var: value}, search=None)
    except tg.ConfigError as exc:
        assert var in str(exc), str(exc)
        assert NOT_UTF8 not in str(exc) or option != "digest_key"  # a secret is never shown
        return
    config = config.replace(recorder_path=config.recorder_path or str(tmp_path / "turns.jsonl"),
                            stateful_tools=config.stateful_tools or (NOT_UTF8,))
    telemetry = InMemoryTelemetry()
    guard = tg.Guard(config, **telemetry.providers())
    turn = guard.turn(durable=True, conversation_id=NOT_UTF8, agent_name=NOT_UTF8)
    for i in range(3):
        call = tg.ToolCall(NOT_UTF8, {"a": NOT_UTF8}, call_id=f"c{i}")
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.ERROR, result=NOT_UTF8)
    state = json.loads(json.dumps(turn.suspend()))
    resumed = tg.Guard(config, **telemetry.providers()).resume(state)
    summary = resumed.end()
    assert summary.tool_calls == 3
    assert resumed.result_token is not None
    assert guard.report_result(resumed.turn_id, True) in (True, False)
    assert Path(config.recorder_path).read_bytes().count(b"\n") >= 1


def test_a_digest_key_that_is_not_text_is_a_config_error_from_code_too():
    for key in ("\ud800", "a\udcff"):
        with pytest.raises(tg.ConfigError, match="'digest_key': got a secret \\(not shown\\)"):
            tg.GuardConfig(digest_key=key)
    assert tg.GuardConfig(digest_key="caf\u00e9 \u65e5\u672c").digest_key == "caf\u00e9 \u65e5\u672c"


def _typo_distance(a: str, b: str) -> int:
    """Edits between ``a`` and ``b`` (insert, delete, substitute, swap neighbours), computed plainly."""
    a, b = a.lower().replace("-", "_"), b.lower().replace("-", "_")
    d = [[max(i, j) if min(i, j) == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def _typos(word: str) -> set[str]:
    """Every one-edit typo of ``word``: a letter left out, doubled, replaced, or two swapped."""
    out = set()
    for i in range(len(word)):
        out.add(word[:i] + word[i + 1:])
        out.add(word[:i] + word[i] + word[i:])
        out.add(word[:i] + ("x" if word[i] != "x" else "q") + word[i + 1:])
        if i + 1 < len(word):
            out.add(word[:i] + word[i + 1] + word[i] + word[i + 2:])
    return out - {word}


ENV_NAMES = sorted({f"TURNGUARD_{f.name.upper()}" for f in dataclasses.fields(tg.GuardConfig)}
                   | {"TURNGUARD_CONFIG", "TURNGUARD_LOAD_PLUGINS", "TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT"})
OPTION_NAMES = sorted(f.name for f in dataclasses.fields(tg.GuardConfig))


def _suggestion(load, typo: str) -> str | None:
    with pytest.raises(tg.ConfigError) as caught:
        load(typo)
    assert isinstance(caught.value, tg._config.UnknownOptionError), str(caught.value)
    return caught.value.suggestions[0] if caught.value.suggestions else None


@pytest.mark.parametrize("layer", ["env", "toml"])
def test_every_one_edit_typo_of_a_name_suggests_a_name_one_edit_away(layer, tmp_path):
    """``TURNGUARD_CONFIGG`` suggested ``TURNGUARD_NAME``: the shared ``TURNGUARD_`` made every name
    look alike to difflib. For every variable or option name and eight of its one-edit typos (that
    name nothing: a letter left out, doubled, replaced, two swapped), the suggestion is a name the
    fewest edits away: one."""
    if layer == "env":
        names, prefix = ENV_NAMES, "TURNGUARD_"

        def load(typo):
            tg.GuardConfig.load(environ={typo: "1"}, search=None)
    else:
        names, prefix = OPTION_NAMES, ""

        def load(typo):
            tg.GuardConfig.from_mapping({typo: 1})
    checked, rng = 0, random.Random(11)
    for name in names:
        typos = sorted(_typos(name.removeprefix(prefix)))
        for typo in rng.sample(typos, min(8, len(typos))):
            typo = prefix + typo.upper() if prefix else typo
            if typo.lower().replace("-", "_") in {n.lower() for n in names} or not typo.startswith(prefix):
                continue
            meant = _suggestion(load, typo)
            assert meant is not None, typo
            assert _typo_distance(typo, meant) == 1, (typo, meant)
            checked += 1
    assert checked > 150


@pytest.mark.parametrize(("typed", "meant"), [
    ("TURNGUARD_CONFIGG", "TURNGUARD_CONFIG"), ("TURNGUARD_CONFIGURATION", "TURNGUARD_CONFIG"),
    ("TURNGUARD_SOFTCAP", "TURNGUARD_SOFT_CAP"), ("TURNGUARD_LOAD_PLUGIN", "TURNGUARD_LOAD_PLUGINS"),
    ("TURNGUARD_MAX_TOOL_CALLS", "TURNGUARD_MAX_TOOL_CALLS_PER_TURN"),
    ("TURNGUARD_SHUTDOWN_TIMEOUT", "TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT"), ("TURNGUARD_FOO", None),
    ("TURNGUARD_PATH", None), ("TURNGUARD_XYZZY", None), ("TURNGUARD_", None),
])
def test_a_mistyped_variable_suggests_the_closest_one_or_none(typed, meant):
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(environ={typed: "1"}, search=None)
    message = str(caught.value)
    if meant is None:
        assert "did you mean" not in message, message
    else:
        assert message == f"unknown option {typed!r}: did you mean {meant!r}?", message


@pytest.mark.parametrize("word", ["fraction", "share", "ratio", "percent", "probability", "sample-rate"])
def test_a_probe_table_with_another_word_for_rate_names_the_key_and_suggests_rate(word, tmp_path):
    path = tmp_path / "turnguard.toml"
    path.write_text(f"[probe]\n{word} = 0.1\nhard_multiplier = 20\n")
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(environ={}, search=tmp_path)
    assert str(caught.value) == f"{path}: unknown option 'probe.{word}': did you mean 'rate'?"


@pytest.mark.parametrize(("probe", "said"), [
    ({"rate": 0.1, "hard_multipler": 20}, "unknown option 'probe.hard_multipler': did you mean 'hard_multiplier'?"),
    ({"rate": 0.1, "zzz": 1}, "unknown option 'probe.zzz'; expected one of "),
    ({"hard_multiplier": 20}, "'probe.rate': got nothing (the key is missing); expected a number from 0 to 1"),
    ({"fraction": 0.1, "rate": 0.1}, "unknown option 'probe.fraction': did you mean 'rate'?"),
])
def test_an_unknown_key_in_a_probe_table_is_named_before_a_missing_rate(probe, said):
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig(probe=probe)
    assert str(caught.value).startswith(said), str(caught.value)


def _tree(root: Path, files: dict[str, str]) -> Path:
    """``files`` (relative paths) under ``root``; the deepest folder ``a/b/c`` is made and returned."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    deepest = root / "a" / "b" / "c"
    deepest.mkdir(parents=True, exist_ok=True)
    return deepest


@pytest.mark.parametrize(("files", "found", "soft_cap"), [
    ({"a/turnguard.toml": "soft_cap = 1\n"}, "a/turnguard.toml", 1),
    ({"a/b/c/turnguard.toml": "soft_cap = 3\n", "a/turnguard.toml": "soft_cap = 1\n"}, "a/b/c/turnguard.toml", 3),
    ({"a/turnguard.toml": "soft_cap = 1\n", "a/b/pyproject.toml": "[tool.turnguard]\nsoft_cap = 2\n"},
     "a/b/pyproject.toml", 2),
    ({"a/turnguard.toml": "soft_cap = 1\n", "a/b/pyproject.toml": "[project]\nname = 'x'\n"}, "a/turnguard.toml", 1),
    ({"a/pyproject.toml": "[tool.turnguard]\nsoft_cap = 2\n", "a/turnguard.toml": "soft_cap = 1\n"},
     "a/turnguard.toml", 1),
    ({"a/pyproject.toml": "[tool.ruff]\nline-length = 1\n", "pyproject.toml": "[tool.turnguard]\nsoft_cap = 4\n"},
     "pyproject.toml", 4),
    ({"a/b/turnguard.toml/x": ""}, None, 100),  # a folder named turnguard.toml is no file
    ({"a/b/pyproject.toml": "[project\nname = 'broken, not ours'\n", "a/turnguard.toml": "soft_cap = 1\n"},
     "a/turnguard.toml", 1),
])
def test_load_looks_upward_from_the_folder_and_stops_at_the_first_configuration(files, found, soft_cap, tmp_path,
                                                                               monkeypatch):
    deepest = _tree(tmp_path, files)
    config, sources = tg.GuardConfig.load_with_sources(search=deepest, environ={})
    assert config.soft_cap == soft_cap
    assert sources["soft_cap"] == (str(tmp_path / found) if found else "default")
    monkeypatch.chdir(deepest)  # the default search: the current folder
    assert tg.GuardConfig.load(environ={}).soft_cap == soft_cap


def test_a_broken_pyproject_naming_turnguard_on_the_way_up_is_reported_not_passed_over(tmp_path):
    deepest = _tree(tmp_path, {"a/b/pyproject.toml": "[tool.turnguard]\nsoft_cap = \n",
                               "a/turnguard.toml": "soft_cap = 1\n"})
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(search=deepest, environ={})
    assert str(caught.value).startswith(str(tmp_path / "a" / "b" / "pyproject.toml"))


def test_turnguard_config_and_search_none_win_over_the_files_above(tmp_path):
    deepest = _tree(tmp_path, {"a/turnguard.toml": "soft_cap = 1\n", "elsewhere.toml": "soft_cap = 9\n"})
    assert tg.GuardConfig.load(search=deepest, environ={"TURNGUARD_CONFIG": str(tmp_path / "elsewhere.toml")}
                               ).soft_cap == 9
    assert tg.GuardConfig.load(search=None, environ={}).soft_cap == 100


def test_every_command_uses_the_configuration_above_its_folder(tmp_path, monkeypatch, capsys):
    from turnguard import _cli as cli

    deepest = _tree(tmp_path, {"a/pyproject.toml": "[tool.turnguard]\nsoft_cap = 42\n"})
    monkeypatch.chdir(deepest)
    assert cli.main(["config", "--wide"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("soft_cap"))
    assert row.split()[1:] == ["42", str(tmp_path / "a" / "pyproject.toml")]


# -- the tables a TOML file's options are read from ------------------------------------------------


NOT_A_TABLE = {
    "string": '"turnguard"', "integer": "5", "float": "1.5", "boolean": "true", "datetime": "1979-05-27T07:32:00Z",
    "local datetime": "1979-05-27T07:32:00", "date": "1979-05-27", "time": "07:32:00", "array": '["turnguard"]',
    "empty array": "[]", "array of tables": "[{turnguard = {}}]",
}
"""A TOML value of every type but a table (TOML literals)."""
TABLE_PATHS = {
    "tool": ("pyproject.toml", "tool = {value}\n"),
    "tool.turnguard": ("pyproject.toml", '[project]\nname = "x"\n\n[tool]\nturnguard = {value}\n'),
    "turnguard": ("turnguard.toml", "turnguard = {value}\n"),
}
"""Each level of the path to a file's options: (the file it is read from, a file holding ``value`` there)."""


@pytest.mark.parametrize("kind", list(NOT_A_TABLE))
@pytest.mark.parametrize("level", list(TABLE_PATHS))
def test_a_table_path_holding_anything_but_a_table_is_a_config_error_naming_the_file(tmp_path, level, kind):
    name, text = TABLE_PATHS[level]
    deepest = _tree(tmp_path, {f"a/{name}": text.format(value=NOT_A_TABLE[kind]), "turnguard.toml": "soft_cap = 1\n"})
    path = tmp_path / "a" / name
    loads = {"from_toml": lambda: tg.GuardConfig.from_toml(path),
             "load": lambda: tg.GuardConfig.load(path, environ={}),
             "discovered": lambda: tg.GuardConfig.load(search=deepest, environ={})}
    for how, load in loads.items():
        with pytest.raises(tg.ConfigError) as caught:
            load()
        message = str(caught.value)
        assert caught.value.key == level, how
        assert message.startswith(f"{path}: {level!r}: got ") and "expected a table" in message, (how, message)
        assert "\n" not in message


@pytest.mark.parametrize(("text", "soft_cap"), [
    ("[project]\nname = 'x'\n", 100), ("[tool]\nruff = {line-length = 1}\n", 100), ("[tool.turnguard]\n", 100),
    ("[tool.turnguard]\nsoft_cap = 7\n", 7), ("tool = {turnguard = {soft_cap = 8}}\n", 8),
    ("[tool]\nturnguard.soft_cap = 9\n", 9),
])
def test_a_pyproject_reads_its_tool_turnguard_table_however_it_is_written(tmp_path, text, soft_cap):
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    assert tg.GuardConfig.from_toml(path).soft_cap == soft_cap


OPTIONS = [f.name for f in dataclasses.fields(tg.GuardConfig)]
BESIDE_THE_TABLE = {
    "a key above [turnguard]": "{key} = 1\n\n[turnguard]\nstreak_warn_at = 2\n",
    "a key beside an inline turnguard table": "{key} = 1\nturnguard = {{streak_warn_at = 2}}\n",
    "a key above an empty [turnguard]": "{key} = 1\n\n[turnguard]\n",
    "a table after [turnguard]": "[turnguard]\nstreak_warn_at = 2\n\n[{key}]\nx = 1\n",
    "a table before [turnguard]": "[{key}]\nx = 1\n\n[turnguard]\nstreak_warn_at = 2\n",
}
"""Placements of ``key`` in a ``turnguard.toml`` beside its ``[turnguard]`` table."""


@pytest.mark.parametrize("placement", list(BESIDE_THE_TABLE))
@pytest.mark.parametrize("option", OPTIONS)
def test_an_option_beside_the_turnguard_table_is_a_config_error_naming_both_places(tmp_path, option, placement):
    path = tmp_path / "turnguard.toml"
    for key in {option, option.replace("_", "-")}:
        path.write_text(BESIDE_THE_TABLE[placement].format(key=key))
        for load in (lambda: tg.GuardConfig.from_toml(path), lambda: tg.GuardConfig.load(search=tmp_path, environ={})):
            with pytest.raises(tg.ConfigError) as caught:
                load()
            assert caught.value.key == key and "unknown option" not in str(caught.value)
            assert str(caught.value).startswith(f"{path}: {key!r}: got ")
            assert "top level" in str(caught.value) and "[turnguard]" in str(caught.value)


@pytest.mark.parametrize("placement", list(BESIDE_THE_TABLE))
@pytest.mark.parametrize("key", ["tool", "sof_cap", "other", "turnguard_", "project"])
def test_anything_else_beside_the_turnguard_table_is_an_unknown_option(tmp_path, key, placement):
    path = tmp_path / "turnguard.toml"
    path.write_text(BESIDE_THE_TABLE[placement].format(key=key))
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(search=tmp_path, environ={})
    assert caught.value.key == key and str(caught.value).startswith(f"{path}: unknown option {key!r}")


@pytest.mark.parametrize("table", ["", "[turnguard]\n"])
@pytest.mark.parametrize("option", OPTIONS)
def test_an_option_is_read_at_top_level_or_in_the_turnguard_table_alone(tmp_path, option, table):
    path = tmp_path / "turnguard.toml"
    path.write_text(f"{table}{option} = {_a_toml_value(option)}\n")
    config, sources = tg.GuardConfig.load_with_sources(search=tmp_path, environ={})
    assert sources[option] == str(path) and config.given >= {option}


def _a_toml_value(option: str) -> str:
    """A TOML value ``option`` accepts that is not its default (read, checked, as a file holds it)."""
    special = {"hard_multiplier": "2.5", "stuck_signal": '"stale_repeat"', "streak_stop_on": '"any"',
               "key_mode": '"bytes"', "fail_mode": '"closed"', "digest_key": '"secret"', "recorder_path": '"t.jsonl"',
               "disable_plugins": '["otel"]', "stateful_tools": '["ci"]', "streak_exempt_tools": '["ci"]',
               "shadow": "{wide = {soft_cap = 200}}", "probe": "{rate = 0.5, soft_cap = 200}",
               "streak_warn_at": "3", "cycle_repeat_warn_at": "3", "cycle_repeat_stop_at": "5", "name": '"other"'}
    if option in special:
        return special[option]
    default = getattr(tg.GuardConfig(), option)
    return str(not default).lower() if isinstance(default, bool) else "7"


def test_a_lone_tool_turnguard_table_in_a_turnguard_toml_is_an_unknown_option(tmp_path):
    (tmp_path / "turnguard.toml").write_text("[tool.turnguard]\nsoft_cap = 4\n")
    with pytest.raises(tg.ConfigError) as caught:
        tg.GuardConfig.load(search=tmp_path, environ={})
    assert caught.value.key == "tool" and "unknown option 'tool'" in str(caught.value)


SPELLED_TWO_WAYS = [o for o in OPTIONS if "_" in o]


@pytest.mark.parametrize("option", SPELLED_TWO_WAYS)
def test_an_option_set_in_both_spellings_is_a_config_error_naming_both(tmp_path, option):
    dashed = option.replace("_", "-")
    for first, second in ((option, dashed), (dashed, option)):
        with pytest.raises(tg.ConfigError) as caught:
            tg.GuardConfig.from_mapping({first: 1, second: 1})
        assert caught.value.key == second and repr(first) in str(caught.value)
        for table in ("", "[turnguard]\n", "[tool.turnguard]\n"):
            path = tmp_path / ("pyproject.toml" if table.startswith("[tool") else "turnguard.toml")
            path.write_text(f"{table}{first} = 1\n{second} = 1\n")
            with pytest.raises(tg.ConfigError) as caught:
                tg.GuardConfig.from_toml(path)
            assert str(caught.value).startswith(f"{path}: {second!r}: ") and repr(first) in str(caught.value)
