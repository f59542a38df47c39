"""The OpenTelemetry plugin's shadow-policy telemetry (``turnguard.shadow.*``) against the real SDK."""

from __future__ import annotations

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry

SECRET_ARG = "SECRET-ARGUMENT-41d0"
SHADOWS = {
    "stale": {"stuck_signal": "stale_repeat", "soft_cap": 10},
    "seed-tight": {"soft_cap": 10},
    "stop-on-any": {"streak_stop_on": "any", "streak_warn_at": 3, "streak_stop_at": 3},
}


def edit_and_rerun(turn: tg.Turn, cycles: int) -> None:
    test = tg.ToolCall("bash", {"cmd": "mvn test", "secret": SECRET_ARG})
    for i in range(cycles):
        for call in (tg.ToolCall("edit", {"line": i, "secret": SECRET_ARG}), test):
            if turn.check_call(call).halted:
                return
            turn.record_outcome(call, tg.Outcome.OK)


def points_by_policy(otel: InMemoryTelemetry, metric: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for point in otel.points(metric):
        out.setdefault(point.attributes[n.SHADOW_POLICY], []).append(point)
    return out


def test_would_be_detections_and_turns_are_metrics_named_by_policy(otel):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, shadow=SHADOWS), **otel.providers())
    with guard.turn(agent_name="coder", conversation_id="conv-secret") as turn:
        edit_and_rerun(turn, 20)
    assert turn.summary.halted is False  # the live guard (S=100) lets the 40 calls run

    detections = points_by_policy(otel, n.METRIC_SHADOW_DETECTIONS[0])
    [seed_halt] = detections["seed-tight"]
    assert seed_halt.value == 1 and seed_halt.attributes[n.LOOP_THRESHOLD] == "soft_stuck"
    assert seed_halt.attributes[n.LOOP_ACTION] == "halt" and seed_halt.attributes[n.GEN_AI_AGENT_NAME] == "coder"
    assert "stale" not in detections  # edit-and-rerun never goes stale
    # stop-on-any: the re-run is never 3 times in a row (an edit in between): no would-be stop either
    assert "stop-on-any" not in detections

    turns = points_by_policy(otel, n.METRIC_SHADOW_TURN_TOOL_CALLS[0])
    assert set(turns) == set(SHADOWS)
    [seed_turn], [stale_turn] = turns["seed-tight"], turns["stale"]
    assert (seed_turn.sum, seed_turn.attributes[n.TURN_OUTCOME], seed_turn.attributes[n.LOOP_THRESHOLD]) == (
        12, "halted", "soft_stuck")  # call 12: the 6th run of the test, past S = 10
    assert (stale_turn.sum, stale_turn.attributes[n.TURN_OUTCOME], stale_turn.attributes[n.LOOP_THRESHOLD]) == (
        40, "completed", n.NO_THRESHOLD)

    # the live metrics do not change: no live detection at all
    assert otel.points(n.METRIC_DETECTIONS[0]) == []
    [event] = otel.logs(n.SHADOW_DETECTED_EVENT)
    assert event.attributes[n.SHADOW_POLICY] == "seed-tight"
    assert event.attributes[n.LOOP_THRESHOLD] == "soft_stuck"


def test_shadow_metrics_carry_no_ids_or_arguments(otel):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, shadow=SHADOWS), **otel.providers())
    with guard.turn(agent_name="coder", conversation_id="conv-secret") as turn:
        edit_and_rerun(turn, 20)
        same = tg.ToolCall("search", {"q": SECRET_ARG})
        for _ in range(4):
            turn.check_call(same)
            turn.record_outcome(same, tg.Outcome.OK)
    for metric in (n.METRIC_SHADOW_DETECTIONS[0], n.METRIC_SHADOW_TURN_TOOL_CALLS[0]):
        points = otel.points(metric)
        assert points
        for point in points:
            assert set(point.attributes) <= set(n.METRIC_ATTRIBUTES[metric])
            assert not any(SECRET_ARG in str(v) or "conv-secret" in str(v) for v in point.attributes.values())


def test_policy_names_beyond_the_bound_fold_into_other(otel, monkeypatch):
    monkeypatch.setattr(n, "SHADOW_POLICY_LIMIT", 2)
    shadows = {f"p{i}": {"soft_cap": 1, "stuck_repeat_threshold": 1} for i in range(4)}
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, shadow=shadows), **otel.providers())
    with guard.turn() as turn:
        for i in range(3):
            turn.check_call(tg.ToolCall("t", {"i": i}))
    names = {p.attributes[n.SHADOW_POLICY] for p in otel.points(n.METRIC_SHADOW_DETECTIONS[0])}
    assert names == {"p0", "p1", n.OVERFLOW_VALUE}
