"""Policy identity: ``GuardConfig(name=...)`` on every metric point as ``turnguard.policy``
(bounded), and on turn spans with the thresholds in force, so a threshold change under a new
name is a new series."""

from __future__ import annotations

from typing import Any

import pytest

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry._metrics import instruments_for
from turnguard.telemetry._testing import InMemoryTelemetry


class Broken:
    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        raise KeyError("boom")


def guard(otel: InMemoryTelemetry, **config: Any) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), **config), environ={},
                    **otel.providers())


def every_kind_of_point(g: tg.Guard) -> None:
    """A turn that is warned (an escalation answered), stuck past S and halted, with a plugin
    error and a shadow beside it: every metric turnguard has gets a point."""
    g.register(Broken(), name="broken")
    with g.turn(agent_name="coder", promptable=True) as turn:
        same = tg.ToolCall("search", {"q": "x"})
        for _ in range(6):  # the stuck signal's D: past S the turn is stuck
            verdict = turn.check_call(same)
            if verdict.action is tg.Action.ASK:
                turn.resolve(verdict, tg.Answer.CONTINUE)
            turn.record_outcome(same, tg.Outcome.ERROR)
        for i in range(20):
            if turn.check_call(tg.ToolCall("read", {"i": i})).halted:
                break
            turn.record_outcome(tg.ToolCall("read", {"i": i}), tg.Outcome.OK)


def test_the_name_defaults_to_default_and_loads_like_any_option(tmp_path):
    assert tg.GuardConfig().name == "default"
    assert tg.GuardConfig.from_env({"TURNGUARD_NAME": "strict-v2"}).name == "strict-v2"
    (tmp_path / "turnguard.toml").write_text('name = "from-toml"\n')
    assert tg.GuardConfig.load(search=tmp_path, environ={}).name == "from-toml"


@pytest.mark.parametrize("bad", ["", "   ", "x" * 65, 7, None])
def test_a_name_that_cannot_label_a_series_is_a_config_error(bad):
    with pytest.raises(tg.ConfigError, match="'name'"):
        tg.GuardConfig(name=bad)


def test_every_metric_point_carries_the_policy_name(otel):
    g = guard(otel, name="strict-v2", soft_cap=5, shadow={"lenient": {"soft_cap": 50}})
    every_kind_of_point(g)
    seen = set()
    for metric, point in otel.all_points():
        assert point.attributes.get(n.POLICY) == "strict-v2", metric
        seen.add(metric)
    expected = {m for m, _ in (n.METRIC_TURN_TOOL_CALLS, n.METRIC_TURN_CYCLES, n.METRIC_TURN_MAX_KEY_REPEAT,
                               n.METRIC_TURN_FIRST_STUCK_CALL, n.METRIC_DETECTIONS, n.METRIC_ESCALATION_ANSWERS,
                               n.METRIC_PLUGIN_ERRORS, n.METRIC_SHADOW_DETECTIONS, n.METRIC_SHADOW_TURN_TOOL_CALLS)}
    assert seen >= expected, expected - seen
    for metric in seen:
        assert n.POLICY in n.METRIC_ATTRIBUTES[metric]


def test_two_policies_on_one_provider_are_two_series(otel):
    for name in ("before", "after"):
        with guard(otel, name=name).turn() as turn:
            turn.check_call(tg.ToolCall("read", {}))
    counts = {p.attributes[n.POLICY]: p.count for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0])}
    assert counts == {"before": 1, "after": 1}


def test_policy_names_are_bounded_like_tool_names(otel):
    first = guard(otel, name="p0")
    instruments_for(otel.providers()["meter_provider"], first.config).policies.limit = 2
    for i in range(4):
        with guard(otel, name=f"p{i}").turn() as turn:
            turn.check_call(tg.ToolCall("read", {}))
    names = sorted(p.attributes[n.POLICY] for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0]))
    assert names == sorted(["p0", "p1", n.OVERFLOW_VALUE])
    counts = {p.attributes[n.POLICY]: p.count for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0])}
    assert counts[n.OVERFLOW_VALUE] == 2


def test_the_turn_span_names_the_policy_and_the_thresholds_in_force(otel):
    g = guard(otel, name="strict-v2", soft_cap=50, hard_multiplier=4, stuck_repeat_threshold=5,
              stuck_signal="stale_repeat", streak_warn_at=3, streak_stop_at=6, streak_stop_on="any",
              max_cycles_per_turn=30)
    with g.turn(agent_name="coder") as turn:
        turn.check_call(tg.ToolCall("read", {}))
    attrs = otel.span("invoke_agent coder").attributes
    assert {k: attrs[k] for k in (n.POLICY, n.LOOP_SOFT_CAP, n.LOOP_HARD_CAP, n.POLICY_STUCK_REPEAT,
                                  n.POLICY_STUCK_SIGNAL, n.POLICY_STREAK_WARN_AT, n.POLICY_STREAK_STOP_AT,
                                  n.POLICY_STREAK_STOP_ON, n.POLICY_MAX_CYCLES)} == {
        n.POLICY: "strict-v2", n.LOOP_SOFT_CAP: 50, n.LOOP_HARD_CAP: 200, n.POLICY_STUCK_REPEAT: 5,
        n.POLICY_STUCK_SIGNAL: "stale_repeat", n.POLICY_STREAK_WARN_AT: 3, n.POLICY_STREAK_STOP_AT: 6,
        n.POLICY_STREAK_STOP_ON: "any", n.POLICY_MAX_CYCLES: 30,
    }


@pytest.mark.parametrize("options, expected", [
    ({"soft_cap": 40, "hard_multiplier": 2.5}, {n.CAP_MODE: "adaptive", n.LOOP_SOFT_CAP: 40, n.LOOP_HARD_CAP: 100}),
    ({"max_tool_calls_per_turn": 30}, {n.CAP_MODE: "explicit", n.LOOP_HARD_CAP: 30}),
    ({"soft_cap": 0}, {n.CAP_MODE: "disabled"}),
])
def test_the_turn_span_carries_every_limit_and_the_turns_times(otel, options, expected):
    """The facts a recorder line has (policy, limits, start and end), on the Collector's spans:
    caps absent where the mode has none, ``max_cycles`` 0 when unbounded."""
    g = guard(otel, name="p", **options)
    with g.turn(agent_name="a") as turn:
        turn.check_call(tg.ToolCall("read", {}))
    span = otel.span("invoke_agent a")
    attrs = span.attributes
    limits = {k: attrs[k] for k in (n.CAP_MODE, n.LOOP_SOFT_CAP, n.LOOP_HARD_CAP) if k in attrs}
    assert limits == expected
    assert (attrs[n.POLICY], attrs[n.POLICY_STUCK_REPEAT], attrs[n.POLICY_STREAK_WARN_AT],
            attrs[n.POLICY_STREAK_STOP_AT], attrs[n.POLICY_MAX_CYCLES]) == ("p", 6, 5, 8, 0)
    assert 0 < span.start_time < span.end_time


CYCLE_REPEAT_SPAN_ATTRIBUTES = ("turnguard.cycle_repeat.warn_at", "turnguard.cycle_repeat.stop_at",
                                "turnguard.cycle_repeat.max_period")
"""docs/telemetry.md's names for ``cycle_repeat``'s levels and period on the turn span."""
WARN_AT, STOP_AT, MAX_PERIOD = CYCLE_REPEAT_SPAN_ATTRIBUTES


@pytest.mark.parametrize("config", [
    tg.PROFILES["seed"], tg.PROFILES["recommended"],
    tg.GuardConfig(cycle_repeat_warn_at=3, cycle_repeat_stop_at=0, cycle_repeat_max_period=2),
    tg.GuardConfig(cycle_repeat_warn_at=0, cycle_repeat_stop_at=6, cycle_repeat_max_period=16),
    tg.GuardConfig(cycle_repeat_warn_at=4, cycle_repeat_stop_at=4, cycle_repeat_max_period=3),
], ids=["seed", "recommended", "warn only", "stop only", "warn at stop"])
def test_the_turn_span_carries_cycle_repeats_levels_and_period(otel, config):
    """``cycle_repeat`` is a threshold in force like the streak's (issue 34): its levels (0: off)
    and longest period are on the turn span, so turns run under different levels are told apart."""
    g = tg.Guard(config.replace(load_entrypoints=False, disable_plugins=("recorder",)), environ={},
                 **otel.providers())
    with g.turn(agent_name="a") as turn:
        turn.check_call(tg.ToolCall("read", {}))
    attrs = otel.span("invoke_agent a").attributes
    assert tuple(attrs.get(k) for k in CYCLE_REPEAT_SPAN_ATTRIBUTES) == (
        config.cycle_repeat_warn_at, config.cycle_repeat_stop_at, config.cycle_repeat_max_period)


@pytest.mark.parametrize("promptable", [False, True])
@pytest.mark.parametrize("names, warn, stop", [("ab", 2, 3), ("abc", 3, 5), ("abcd", 0, 2), ("ab", 4, 0)])
def test_a_cycle_repeat_detection_fires_at_a_level_its_turn_span_names(otel, promptable, names, warn, stop):
    """Every cycle_repeat detection's limit is one of the levels its turn span says were in force,
    the level it names: the span alone tells what a turn's alternating loop was held to."""
    g = guard(otel, cycle_repeat_warn_at=warn, cycle_repeat_stop_at=stop, streak_warn_at=0, streak_stop_at=0)
    with g.turn(agent_name="a", promptable=promptable) as turn:
        for name in names * (max(warn, stop) + 1):
            call = tg.ToolCall(name, {})
            if turn.check_call(call).action is tg.Action.HALT:
                break
            verdict = turn.record_outcome(call, "ok")
            if verdict.action is tg.Action.ASK:
                turn.resolve(verdict, "continue")
    attrs = otel.span("invoke_agent a").attributes
    detections = [r.attributes for r in otel.logs(n.LOOP_DETECTED_EVENT)
                  if r.attributes[n.LOOP_THRESHOLD] == tg.Threshold.CYCLE_REPEAT]
    assert detections
    in_force = {"warn": attrs.get(WARN_AT), "stop": attrs.get(STOP_AT)}
    assert all(d[n.LOOP_LIMIT] == in_force[d[n.LOOP_LEVEL]] for d in detections)
    assert attrs.get(MAX_PERIOD, 0) >= len(names)
