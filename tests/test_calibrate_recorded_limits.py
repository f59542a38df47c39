"""A recorded turn's ``limits`` carry every ``GuardConfig`` setting that changes what a replay of
it decides, alike from the recorder's lines and the Collector's turn spans, and calibrate says
the default row is not the live policy exactly when one of them differs from ``--config``'s.
Every field of ``GuardConfig`` is either such a setting (``REPLAYED``, with another value) or
said not to change a replay (``NOT_REPLAYED``, with why, checked by replaying): a new field is
neither until someone decides, and this module fails until then."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import collector
from turnguard._calibrate.advice import SWITCHED_BY, limits_notes, tool_list_warning
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.evidence import ProbeEvidence
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.recording import Recording
from turnguard._calibrate.records import (
    InputProblem,
    Limits,
    RecordedCall,
    RecordedTurn,
)
from turnguard._calibrate.stats import default_limits
from turnguard._model import Outcome
from turnguard.telemetry import _names as names
from turnguard.telemetry._otel import policy_attributes
from turnguard.telemetry._recorder import turn_limits
from turnguard.telemetry._testing import InMemoryTelemetry

REPLAYED: dict[str, Any] = {
    "max_tool_calls_per_turn": 50,
    "soft_cap": 50,
    "hard_multiplier": 20,
    "stuck_repeat_threshold": 9,
    "stuck_signal": "stale_repeat",
    "streak_warn_at": 3,
    "streak_stop_at": 12,
    "streak_stop_on": "any",
    "max_cycles_per_turn": 40,
    "cycle_repeat_warn_at": 5,
    "cycle_repeat_stop_at": 8,
    "cycle_repeat_max_period": 6,
    "remind_model": True,
    "max_tracked_keys": 1000,
    "disable_plugins": ("cycle_repeat",),
    "stateful_tools": ("poll",),
    "streak_exempt_tools": ("fetch",),
}
"""The settings a replay decides by, each with a value other than the default."""

TOOL_LISTS = ("stateful_tools", "streak_exempt_tools")
"""Replayed settings whose difference ``tool_list_warning`` tells (not the default-row note)."""

NOT_REPLAYED: dict[str, tuple[Any, str]] = {
    "name": ("other", "names the series; the grid names its own rows"),
    "key_mode": ("bytes", "recorded calls carry the live guard's key digests, read as they are"),
    "digest_key": ("another secret", "the recorded digests are keyed already"),
    "fail_mode": ("closed", "decides only when a plugin raises; a replay runs the built-in policies"),
    "capture_content": (True, "what telemetry exports"),
    "recorder_path": ("/nonexistent/turns.jsonl", "where turns are recorded"),
    "recorder_results": (True, "what the recorder keeps"),
    "load_entrypoints": (False, "a replay loads no third-party plugin"),
    "shadow": ({"other": {"soft_cap": 5}}, "shadows never act"),
    "probe": ({"rate": 0.5, "soft_cap": 5}, "a probe turn records the probe's own limits"),
}
"""The other settings, each with another value and why a replay does not depend on it."""


def test_every_guard_config_field_is_either_replayed_or_said_not_to_be():
    fields = {f.name for f in dataclasses.fields(tg.GuardConfig)}
    assert not REPLAYED.keys() & NOT_REPLAYED.keys()
    assert fields == REPLAYED.keys() | NOT_REPLAYED.keys(), (
        "classify each new GuardConfig field: a setting that changes what a replay decides must be recorded "
        "(turn_limits, the turn span's policy_attributes, records.Limits)")


def loop_turns() -> list[RecordedTurn]:
    """Recorded turns that reach every threshold of a small configuration: an identical failing
    call, an A,B cycle, many distinct calls over many requests."""
    identical = tuple(RecordedCall("run", digest="d0", outcome=Outcome.ERROR, cycle=1 + i // 3) for i in range(60))
    cycle = tuple(RecordedCall("ab", digest=f"d{i % 2}", outcome=Outcome.OK, cycle=1 + i) for i in range(60))
    distinct = tuple(RecordedCall("read", digest=f"x{i}", outcome=Outcome.OK, cycle=1 + i // 2) for i in range(90))
    return [RecordedTurn(name, calls, source="turnguard") for name, calls in
            (("identical", identical), ("cycle", cycle), ("distinct", distinct))]


SMALL = tg.GuardConfig(soft_cap=10, hard_multiplier=3, stuck_repeat_threshold=3, streak_warn_at=2, streak_stop_at=4,
                       max_cycles_per_turn=20, cycle_repeat_warn_at=3, cycle_repeat_stop_at=5)


def replayed(config: tg.GuardConfig) -> list[list[dict[str, Any]]]:
    calibrator = Calibrator([Policy("default", config, is_default=True)], group=False)
    return [calibrator.results(turn) for turn in loop_turns()]


@pytest.mark.parametrize("field", sorted(NOT_REPLAYED))
def test_a_setting_said_not_to_change_a_replay_changes_none(field):
    value, _why = NOT_REPLAYED[field]
    before = replayed(SMALL)
    assert any(r for turn in before for r in turn), "the turns reach the small configuration's thresholds"
    assert replayed(SMALL.replace(**{field: value})) == before


def switched(setting: str, on: str | None) -> tg.GuardConfig:
    """``SMALL`` (its soft cap past the turns' loops) with the levels ``setting`` is in force under
    all unset but ``on``."""
    return SMALL.replace(soft_cap=100, **{level: 0 for level in SWITCHED_BY[setting] if level != on})


def switch_turns() -> list[RecordedTurn]:
    """``loop_turns`` and turns the switched settings decide: a cycle of 5 calls (seen by a
    longest period of 6, not 4), an identical call that succeeds (stopped on ``any`` outcome only)."""
    cycle = tuple(RecordedCall("abcde", digest=f"d{i % 5}", outcome=Outcome.OK, cycle=1 + i // 5) for i in range(60))
    same = tuple(RecordedCall("run", digest="d0", outcome=Outcome.OK, cycle=1 + i) for i in range(60))
    return [*loop_turns(), RecordedTurn("cycle5", cycle, source="turnguard"),
            RecordedTurn("same", same, source="turnguard")]


def replayed_switched(config: tg.GuardConfig) -> list[list[dict[str, Any]]]:
    calibrator = Calibrator([Policy("default", config, is_default=True)], group=False)
    return [calibrator.results(turn) for turn in switch_turns()]


@pytest.mark.parametrize("setting", sorted(SWITCHED_BY))
def test_a_switched_setting_changes_a_replay_only_while_a_level_is_set(setting):
    other = {setting: REPLAYED[setting]}
    for on in SWITCHED_BY[setting]:
        config = switched(setting, on)
        assert replayed_switched(config.replace(**other)) != replayed_switched(config), on
    off = switched(setting, None)
    assert replayed_switched(off.replace(**other)) == replayed_switched(off)


@pytest.mark.parametrize("setting", sorted(SWITCHED_BY))
def test_the_default_row_warning_names_a_switched_setting_only_where_either_side_has_it_on(setting):
    ways = (None, *SWITCHED_BY[setting])
    for live_on in ways:
        for default_on in ways:
            live = switched(setting, live_on).replace(**{setting: REPLAYED[setting]})
            said = " ".join(notes(Limits(**limits_of(live)), switched(setting, default_on)))
            assert (f"{setting}=" in said) == (live_on is not None or default_on is not None), (live_on, default_on)


def recorded_under(folder: Path, configs: dict[str, tg.GuardConfig]) -> tuple[Path, Path]:
    """One turn under each configuration (its key the turn id), through the recorder and the
    OpenTelemetry plugin: the recorder's lines and the Collector's OTLP JSON of the same turns."""
    telemetry = InMemoryTelemetry()
    lines = folder / "turns.jsonl"
    for turn_id, config in configs.items():
        guard = tg.Guard(config.replace(recorder_path=str(lines), load_entrypoints=False), environ={},
                         **telemetry.providers())
        turn = guard.turn(turn_id=turn_id, promptable=False)
        call = tg.ToolCall("run", {"i": 0})
        turn.check_call(call)
        turn.record_outcome(call, "ok")
        turn.end("completed")
    telemetry.tracer_provider.force_flush()
    otlp = folder / "otlp.jsonl"
    otlp.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    return lines, otlp


def read(path: Path) -> tuple[dict[str, RecordedTurn], list[str]]:
    problems: list[InputProblem] = []
    turns = {t.id: t for t in read_turns([path], problems.append)}
    return turns, [str(p) for p in problems]


BASE = tg.GuardConfig(cycle_repeat_warn_at=3)
"""The default configuration with ``cycle_repeat`` on: every setting in ``REPLAYED`` in force."""
CONFIGS = {"default": BASE, **{field: BASE.replace(**{field: value}) for field, value in REPLAYED.items()}}


@pytest.fixture(scope="module")
def both_formats(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, RecordedTurn], dict[str, RecordedTurn]]:
    lines, otlp = recorded_under(tmp_path_factory.mktemp("limits"), CONFIGS)
    from_lines, problems_lines = read(lines)
    from_spans, problems_spans = read(otlp)
    assert problems_lines == problems_spans == []
    assert set(from_lines) == set(from_spans) == set(CONFIGS)
    return from_lines, from_spans


def limits_of(config: tg.GuardConfig) -> dict[str, Any]:
    """``Limits``' fields as the recorder writes them for ``config``."""
    data = turn_limits(config)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


def notes(limits: Limits, config: tg.GuardConfig) -> list[str]:
    """What calibrate says of live turns recorded under ``limits`` with ``config`` as ``--config``."""
    recording = Recording()
    recording.add(RecordedTurn("t", (), cohort="live", limits=limits), "live")
    params = Policy("default", config, is_default=True).describe()
    return limits_notes(ProbeEvidence.for_policy(params), recording, default_limits(params))


def tool_warning(limits: Limits, config: tg.GuardConfig) -> str | None:
    recording = Recording()
    recording.add(RecordedTurn("t", (), cohort="live", limits=limits), "live")
    return tool_list_warning(recording, Policy("default", config, is_default=True).describe())


@pytest.mark.parametrize("field", sorted(REPLAYED))
def test_each_replayed_setting_is_recorded_alike_in_lines_and_spans(both_formats, field):
    from_lines, from_spans = both_formats
    limits = from_lines[field].limits
    assert limits is not None and limits == from_spans[field].limits
    assert limits != from_lines["default"].limits
    assert None not in dataclasses.astuple(limits)[3:], "every limit but the caps is always recorded"


@pytest.mark.parametrize("field", sorted(REPLAYED))
def test_the_default_row_warning_comes_exactly_when_a_recorded_setting_differs(both_formats, field):
    from_lines, _ = both_formats
    changed, default = CONFIGS[field], CONFIGS["default"]
    limits, default_limits_ = from_lines[field].limits, from_lines["default"].limits
    assert limits is not None and default_limits_ is not None
    assert notes(limits, changed) == [] and notes(default_limits_, default) == []
    assert tool_warning(limits, changed) is None and tool_warning(default_limits_, default) is None
    if field in TOOL_LISTS:
        assert notes(limits, default) == [] and field in (tool_warning(limits, default) or "")
        return
    said = notes(limits, default)
    assert len(said) == 1 and "The default row is not the live policy" in said[0]
    assert notes(default_limits_, changed)
    assert tool_warning(limits, default) is None


@pytest.mark.parametrize("field", sorted(REPLAYED))
def test_the_recorder_and_the_turn_span_carry_the_same_setting(field):
    """What the recorder writes (``turn_limits``) and the span's attributes read back alike."""
    config = CONFIGS[field]
    attrs = {names.CAP_MODE: config.cap_mode, names.LOOP_SOFT_CAP: turn_limits(config)["soft_cap"],
             names.LOOP_HARD_CAP: config.hard_cap, **policy_attributes(config)}
    from_span = collector.span_facts(attrs, None)["limits"]
    line = json.dumps({"id": "x", "calls": [], "limits": turn_limits(config)})
    assert from_span.to_json() == json.loads(line)["limits"]


OLD_LIMITS = {"cap_mode": "adaptive", "soft_cap": 100, "hard_cap": 1000, "stuck_repeat_threshold": 6,
              "streak_warn_at": 5, "streak_stop_at": 8, "max_cycles": 0}
"""A recorder line's ``limits`` before the other settings were recorded."""


def test_an_old_line_reads_with_the_later_settings_not_recorded(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"source": "turnguard", "id": "old", "calls": [], "limits": OLD_LIMITS}) + "\n")
    turns, problems = read(path)
    assert problems == []
    limits = turns["old"].limits
    assert limits == Limits(**OLD_LIMITS)
    assert all(getattr(limits, k) is None for k in limits.to_json() if k not in OLD_LIMITS)


def test_an_old_turn_span_reads_with_the_later_settings_not_recorded():
    config = tg.GuardConfig()
    old = {names.POLICY_STUCK_REPEAT, names.POLICY_STREAK_WARN_AT, names.POLICY_STREAK_STOP_AT,
           names.POLICY_MAX_CYCLES}
    attrs = {k: v for k, v in policy_attributes(config).items() if k in old}
    attrs |= {names.CAP_MODE: "adaptive", names.LOOP_SOFT_CAP: 100, names.LOOP_HARD_CAP: 1000}
    assert collector.span_facts(attrs, None)["limits"] == Limits(**OLD_LIMITS)


@pytest.mark.parametrize("field", sorted(set(REPLAYED) - set(TOOL_LISTS)))
def test_an_old_recording_is_compared_only_on_what_it_says(field):
    old = Limits(**OLD_LIMITS)
    config = CONFIGS[field]
    differs_in_old_keys = any(turn_limits(config)[k] != v for k, v in OLD_LIMITS.items())
    assert bool(notes(old, config)) == differs_in_old_keys


def test_an_old_result_describes_fewer_limits_and_only_those_are_compared():
    """A ``--json`` result of an older turnguard: its default row's params have no ``limits``."""
    params = Policy("default", tg.GuardConfig(), is_default=True).describe()
    del params["limits"]
    old = default_limits(params)
    assert old == {k: v for k, v in OLD_LIMITS.items() if k not in ("streak_warn_at", "max_cycles")}
    recording = Recording()
    changed = Limits(**limits_of(tg.GuardConfig(streak_stop_on="any")))
    recording.add(RecordedTurn("t", (), cohort="live", limits=changed), "live")
    assert limits_notes(ProbeEvidence.for_policy(params), recording, old) == []


def test_the_cap_settings_are_compared_only_under_an_adaptive_cap():
    explicit = tg.GuardConfig(max_tool_calls_per_turn=200)
    for other in (explicit.replace(stuck_repeat_threshold=9), explicit.replace(stuck_signal="stale_repeat"),
                  explicit.replace(soft_cap=7)):
        assert notes(Limits(**limits_of(other)), explicit) == []
    assert notes(Limits(**limits_of(explicit.replace(max_tool_calls_per_turn=300))), explicit)


@pytest.mark.parametrize(("key", "value"), [
    ("stuck_signal", "sometimes"), ("streak_stop_on", True), ("cycle_repeat_warn_at", -1),
    ("cycle_repeat_max_period", 2.5), ("remind_model", 1), ("max_tracked_keys", "many"),
    ("disabled_policies", "cycles"), ("disabled_policies", [""]),
])
def test_a_malformed_later_setting_is_reported_and_the_limits_left_out(tmp_path, key, value):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"source": "turnguard", "id": "bad", "calls": [],
                                "limits": {**OLD_LIMITS, key: value}}) + "\n")
    turns, problems = read(path)
    assert turns["bad"].limits is None
    assert len(problems) == 1 and f"'limits': {key!r} must be" in problems[0]


@pytest.mark.parametrize(("attr", "value"), [
    ("turnguard.loop.stuck_signal", "sometimes"), ("turnguard.streak.stop_on", 3),
    ("turnguard.cycle_repeat.stop_at", -2), ("turnguard.loop.remind_model", "true"),
    ("turnguard.loop.max_tracked_keys", True), ("turnguard.loop.disabled_policies", "cycles"),
])
def test_a_malformed_span_setting_reads_as_not_recorded(attr, value):
    attrs = {names.CAP_MODE: "adaptive", names.LOOP_SOFT_CAP: 100, names.LOOP_HARD_CAP: 1000,
             **policy_attributes(tg.GuardConfig()), attr: value}
    limits = collector.span_facts(attrs, None)["limits"]
    key = next(k for k, a in collector.SPAN_LIMITS if a == attr)
    assert getattr(limits, key) is None
    assert limits == Limits(**limits_of(tg.GuardConfig()) | {key: None})


def test_a_results_recording_keeps_the_later_settings_and_reads_an_older_one():
    """``--json`` / ``merge``: a recording's limits read back whole; an older result's, without
    the later keys, still reads."""
    recording = Recording()
    full = Limits(**limits_of(tg.GuardConfig(streak_stop_on="any", disable_plugins=("cycles",))))
    recording.add(RecordedTurn("t", (), cohort="live", limits=full), "live")
    assert Recording.from_json(json.loads(json.dumps(recording.to_json()))).limits_of("live") == [(full, 1)]
    old = json.loads(json.dumps(recording.to_json()))
    old["policies"] = [dict(e, limits=dict(OLD_LIMITS)) for e in old["policies"]]
    assert Recording.from_json(old).limits_of("live") == [(Limits(**OLD_LIMITS), 1)]
