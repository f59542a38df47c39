"""Every label of every metric takes its values from a closed or a bounded set, whoever sends them:
a plugin's detections, an event changed before ``Turn.resolve``, a host's names and reasons, result
tokens (keyed or not), shadows and probes. turnguard's own values (the built-in thresholds, end
reasons, plugins, hooks, the default policy, this provider's call buckets) always pass, whatever
number of third-party values came first. Run against the real SDK (in-memory reader)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

import turnguard as tg
from turnguard._probe import COHORTS
from turnguard._task_results import ResultLabels, result_token
from turnguard.telemetry import _names as n
from turnguard.telemetry._buckets import COUNT_BUCKETS
from turnguard.telemetry._cardinality import BoundedValues
from turnguard.telemetry._metrics import Instruments, instruments_for
from turnguard.telemetry._testing import InMemoryTelemetry

LIMIT = 3
"""Every bound, lowered for the test (the real ones are 100 to 10,000: the same code)."""
HOSTILE = 30
"""Distinct values sent through each path: ten times the bound."""
KEY = "fleet-secret"
SPECIAL = frozenset({n.OVERFLOW_VALUE, n.TOKEN_VALUE})

BOOL = frozenset({True, False})
CLOSED: dict[str, frozenset[Any]] = {
    n.TURN_COHORT: frozenset(COHORTS) | {n.OVERFLOW_VALUE},
    n.TURN_RESOLVED: frozenset(n.RESOLVED_LABELS.values()),
    n.CAP_MODE: frozenset(n.CAP_MODES) | {n.OVERFLOW_VALUE},
    n.TURN_STUCK: BOOL,
    n.TURN_PROMPTABLE: BOOL,
    n.TURN_PAST_SOFT_CAP: BOOL,
    n.LOOP_LEVEL: frozenset({"warn", "stop", n.OVERFLOW_VALUE}),
    n.LOOP_ACTION: frozenset(n.ACTION_LABELS.values()) | {n.OVERFLOW_VALUE},
    n.ESCALATION_ANSWER: frozenset(n.ANSWERS) | {n.OVERFLOW_VALUE},
    n.HOST_ERROR: frozenset(n.HOST_ERRORS) | {n.OVERFLOW_VALUE},
    n.RESULT_STATUS: frozenset(n.RESULT_STATUSES) | {n.OVERFLOW_VALUE},
    n.TURN_MAX_KEY_REPEAT_BUCKET: COUNT_BUCKETS,
    n.TURN_MAX_FAILING_STREAK_BUCKET: COUNT_BUCKETS,
}
"""Labels whose every value turnguard names."""
BOUNDED: dict[str, tuple[str, frozenset[str]]] = {
    n.POLICY: ("policies", frozenset()),
    n.GEN_AI_AGENT_NAME: ("agents", frozenset()),
    n.GEN_AI_TOOL_NAME: ("tools", frozenset({n.NO_TOOL})),
    n.TURN_OUTCOME: ("reasons", frozenset()),
    n.LOOP_THRESHOLD: ("thresholds", frozenset({n.NO_THRESHOLD})),
    n.PROBE_MAIN_THRESHOLD: ("thresholds", frozenset({n.NO_THRESHOLD})),
    n.PLUGIN_NAME: ("plugins", frozenset()),
    n.PLUGIN_HOOK: ("hooks", frozenset()),
    n.ERROR_TYPE: ("error_types", frozenset()),
    n.SHADOW_POLICY: ("shadows", frozenset()),
    n.TURN_CALLS_BUCKET: ("call_buckets", frozenset()),
}
"""Labels from a host, a plugin or a token: the ``Instruments`` set bounding them and the values of
turnguard's beside that set's built-ins."""


def bounded_sets(instruments: Instruments) -> dict[str, BoundedValues]:
    return {name: values for name, values in vars(instruments).items() if isinstance(values, BoundedValues)}


def lowered(otel: InMemoryTelemetry, config: tg.GuardConfig) -> Instruments:
    instruments = instruments_for(otel.meter_provider, config)
    for values in bounded_sets(instruments).values():
        values.limit = LIMIT
    return instruments


class Hostile:
    """A third-party policy whose detections carry data: thresholds and levels made from the tool's
    name, and (for ``forge`` calls) an event it changed itself, with any cap mode, promptable,
    action and agent."""

    @tg.hookimpl
    def turnguard_check_call(self, turn: Any, call: tg.ToolCall) -> tg.Verdict | None:
        name = call.name
        if name.startswith("det"):
            return turn.detect(f"thr-{name}", tg.Action.REMIND, f"lvl-{name}", 1, call=call)
        if name.startswith("forge"):
            verdict = turn.detect(f"f-{name}", tg.Action.ALLOW, "warn", 1, call=call)
            event = dataclasses.replace(verdict.event, level=f"lvl-{name}", cap_mode=f"mode-{name}",
                                        promptable=f"p-{name}", action=len(name) + 7, agent_name=f"a-{name}")
            return tg.Verdict(tg.Action.ALLOW, verdict.threshold, "", event)
        return None


def raising_plugin(i: int) -> object:
    error = type(f"Error{i}", (Exception,), {})

    class Raising:
        @tg.hookimpl
        def turnguard_check_call(self, turn: Any, call: tg.ToolCall) -> None:
            raise error("boom")

    return Raising()


def drive_hostile_paths(otel: InMemoryTelemetry) -> Instruments:
    """Send ``HOSTILE`` distinct values through every path that sets a metric label."""
    rng = random.Random(3)
    base = {"load_entrypoints": False, "digest_key": KEY, "stateful_tools": ("*",)}
    plugins = {"hostile": Hostile(), **{f"raising-{i}": raising_plugin(i) for i in range(HOSTILE)}}
    guard = tg.Guard(tg.GuardConfig(**base, streak_warn_at=2, streak_stop_at=0), plugins=plugins,
                     **otel.providers())
    instruments = lowered(otel, guard.config)
    asked: list[tg.LoopDetectedEvent] = []
    for i in range(HOSTILE):
        turn = guard.turn(agent_name=f"agent-{i}", promptable=True)
        for name in (f"det{i}", f"forge{i}", f"tool{i}", "bash", "bash"):
            call = tg.ToolCall(name, {"i": i})
            verdict = turn.check_call(call)
            if verdict.action is tg.Action.ASK:
                asked.append(verdict.event)
            if not verdict.halted:
                turn.record_outcome(call, tg.Outcome.ERROR if name == "bash" else tg.Outcome.OK, result=rng.random())
        turn.record_outcome(tg.ToolCall(f"unknown{i}", {}, call_id=f"u{i}"), tg.Outcome.OK)  # a host error
        for event in asked[-1:]:
            forged = dataclasses.replace(event, level=f"lvl-{i}", threshold=f"thr-ask-{i}", agent_name=f"x{i}")
            turn.resolve(forged, rng.choice(["continue", "redirect"]))
        turn.end(reason=f"reason-{i}")
        labels = ResultLabels(turn_id=f"t{i}", cohort=rng.choice(["live", "probe", f"c{i}"]), policy=f"policy-{i}",
                              tool_calls=rng.randrange(10**6), threshold=f"token-{i}", reason=f"r-{i}",
                              agent_name=f"ta-{i}", main_threshold=f"main-{i}", edge_soft_cap=3 + i,
                              edge_hard_cap=None, max_key_repeat=i, max_failing_streak=2 * i)
        for key in (KEY, None):  # a keyed token (trusted) and anyone's
            token = result_token(dataclasses.replace(labels, turn_id=f"{labels.turn_id}-{key}"), key)
            assert token is not None
            guard.report_result(token, bool(i % 2))
    for i in range(HOSTILE):  # policy and shadow names from the host, probe turns
        config = tg.GuardConfig(**base, name=f"policy-{i}", max_tool_calls_per_turn=2,
                                shadow={f"shadow-{i}": {"soft_cap": 1, "stuck_repeat_threshold": 1}},
                                probe=tg.Probe(1.0, tg.GuardConfig(max_tool_calls_per_turn=4, name="lenient")))
        other = tg.Guard(config, plugins={"hostile": Hostile()}, **otel.providers())
        with other.turn(agent_name=f"agent-{i}") as turn:
            for name in (f"det{i}", f"tool{i}", f"tool{i}", "x", "y"):
                if turn.check_call(tg.ToolCall(name, {})).halted:
                    break
    return instruments


def test_every_metric_label_is_closed_or_bounded():
    """A label added without a bound fails here first."""
    labels = set().union(*n.METRIC_ATTRIBUTES.values())
    assert labels == CLOSED.keys() | BOUNDED.keys()


def test_hostile_values_on_every_path_stay_within_each_labels_bound(otel):
    instruments = drive_hostile_paths(otel)
    sets = bounded_sets(instruments)
    seen: dict[str, set[Any]] = {}
    for metric, point in otel.all_points():
        assert set(point.attributes) <= set(n.METRIC_ATTRIBUTES[metric]), metric
        for key, value in point.attributes.items():
            seen.setdefault(key, set()).add(value)
    assert {n.LOOP_LEVEL, n.LOOP_THRESHOLD, n.PLUGIN_NAME, n.HOST_ERROR, n.SHADOW_POLICY, n.PROBE_MAIN_THRESHOLD,
            n.TURN_CALLS_BUCKET, n.ESCALATION_ANSWER, n.TURN_MAX_KEY_REPEAT_BUCKET} <= seen.keys()  # every path ran
    for key, values in seen.items():
        if key in CLOSED:
            assert values <= CLOSED[key], (key, values - CLOSED[key])
        else:
            attr, ours = BOUNDED[key]
            third_party = values - sets[attr].builtins - ours - SPECIAL
            assert len(third_party) <= LIMIT, (key, sorted(third_party))
    assert n.OVERFLOW_VALUE in seen[n.LOOP_LEVEL] and n.OVERFLOW_VALUE in seen[n.LOOP_THRESHOLD]


BUILTINS: dict[str, frozenset[str]] = {
    "thresholds": frozenset({*(t.value for t in tg.Threshold), "plugin_error"}),
    "reasons": frozenset({"completed", "halted", "error", "live_halted"}),
    "plugins": frozenset({"otel", "recorder", "shadow", "cap", "streak", "cycles", "cycle_repeat"}),
    "hooks": frozenset({"turnguard_check_call", "turnguard_turn_ended", "turnguard_check_outcome"}),
    "policies": frozenset({"default"}),
}


@pytest.mark.parametrize("attr", [*BUILTINS, "call_buckets"])
def test_builtin_label_values_survive_any_number_of_third_party_values(otel, attr):
    instruments = lowered(otel, tg.GuardConfig(load_entrypoints=False))
    values = getattr(instruments, attr)
    expected = BUILTINS.get(attr, instruments.edge_buckets)
    assert expected <= values.builtins
    for i in range(10 * LIMIT):
        values.fold(f"third-party-{i}")
    assert len(values) == LIMIT
    assert {values.fold(value) for value in expected} == expected
    assert {values.known(value) for value in expected} == expected


def test_builtin_threshold_end_reason_and_policy_survive_a_plugins_and_a_hosts_names(otel):
    """The auditor's case: a plugin's own threshold names, then the built-in streak."""

    class Policy:
        @tg.hookimpl
        def turnguard_check_call(self, turn: Any, call: tg.ToolCall) -> tg.Verdict | None:
            if call.name.startswith("probe"):
                return turn.detect(f"custom-{call.name}", tg.Action.ALLOW, "warn", 1, call=call)
            return None

    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), plugins={"mine": Policy()}, **otel.providers())
    lowered(otel, guard.config)
    for i in range(10 * LIMIT):
        with guard.turn() as turn:
            call = tg.ToolCall(f"probe{i}", {})
            turn.check_call(call)
            turn.record_outcome(call, tg.Outcome.OK)
        guard.turn().end(reason=f"host-{i}")
    for name in (f"policy-{i}" for i in range(10 * LIMIT)):
        tg.Guard(tg.GuardConfig(load_entrypoints=False, name=name), **otel.providers()).turn().end()
    with guard.turn() as turn:
        for _ in range(10):
            call = tg.ToolCall("bash", {"cmd": "make"})
            if turn.check_call(call).halted or turn.record_outcome(call, tg.Outcome.ERROR).halted:
                break
    assert turn.summary.threshold == "streak"
    detections = {p.attributes[n.LOOP_THRESHOLD] for p in otel.points(n.METRIC_DETECTIONS[0])}
    assert "streak" in detections and n.OVERFLOW_VALUE in detections
    ends = {(p.attributes[n.POLICY], p.attributes[n.TURN_OUTCOME], p.attributes[n.LOOP_THRESHOLD])
            for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0])}
    assert ("default", "halted", "streak") in ends and ("default", "completed", "none") in ends
