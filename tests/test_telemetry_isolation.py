"""One failing signal never stops another: a metric the SDK refuses, a logger that raises or a span
that cannot be made still leaves every other signal of the same hook exported (the turn span ends,
the log record is emitted, the point is recorded), and the failure is still this plugin's error."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry

EVENTS = (n.LOOP_DETECTED_EVENT, n.ESCALATION_RESOLVED_EVENT, n.SHADOW_DETECTED_EVENT, n.TURN_RESULT_EVENT)


class Broken:
    """Any method of it raises, as an SDK that refuses what it is given."""

    def __getattr__(self, name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise ValueError(f"{name} refused")
        return refuse


def break_signal(plugin: Any, signal: str) -> None:
    if signal == "metrics":
        plugin.instruments = Broken()
    elif signal == "logs":
        plugin.events = Broken()
    else:  # spans: the detection's span and the turn span's end
        plugin.detection_span = Broken().detection_span
        plugin.end_turn = Broken().end_turn


def exported(signal: str | None) -> tuple[Counter[str], Counter[str], dict[str, int], int]:
    """Run a turn that reaches every hook reporting on several signals (a detection, an answer, a
    shadow's detection, the turn's end, a late result) with ``signal`` broken; what came out."""
    otel = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, streak_warn_at=2, streak_stop_at=0,
                                    shadow={"tight": {"soft_cap": 1, "stuck_repeat_threshold": 1}}),
                     **otel.providers())
    if signal is not None:
        break_signal(guard.pm.get_plugin("otel"), signal)
    with guard.turn(promptable=True, agent_name="coder") as turn:
        for _ in range(3):
            call = tg.ToolCall("bash", {"cmd": "make"})
            verdict = turn.check_call(call)
            turn.record_outcome(call, tg.Outcome.ERROR)
            if verdict.action is tg.Action.ASK:
                turn.resolve(verdict, "continue")
    assert guard.report_result(turn.turn_id, True)
    spans = Counter(f"{s.name}:{s.attributes.get(n.TURN_OUTCOME, s.attributes.get(n.CALL_OUTCOME))}"
                    for s in otel.spans())
    logs = Counter(r.event_name for r in otel.logs())
    points = {name: len(otel.points(name)) for name in n.METRIC_ATTRIBUTES if name != n.METRIC_PLUGIN_ERRORS[0]}
    errors = sum(p.value for p in otel.points(n.METRIC_PLUGIN_ERRORS[0]))
    otel.shutdown()
    return spans, logs, points, errors


def test_the_scenario_reaches_every_signal_of_every_hook():
    spans, logs, points, errors = exported(None)
    assert spans["invoke_agent coder:completed"] == 1 and spans["execute_tool bash:error"] == 3
    assert set(EVENTS) <= set(logs)
    for metric in (n.METRIC_DETECTIONS, n.METRIC_ESCALATION_ANSWERS, n.METRIC_SHADOW_DETECTIONS,
                   n.METRIC_TURN_TOOL_CALLS, n.METRIC_TURN_RESULTS):
        assert points[metric[0]] >= 1
    assert errors == 0


@pytest.mark.parametrize("signal", ["metrics", "logs", "spans"])
def test_a_failing_signal_leaves_every_other_signal_exported(signal):
    spans, logs, points, _ = exported(None)
    broken_spans, broken_logs, broken_points, broken_errors = exported(signal)
    if signal != "spans":
        assert broken_spans == spans  # the turn span ended with how the turn ended
    if signal != "logs":
        assert broken_logs == logs
    if signal != "metrics":
        assert broken_points == points
        assert broken_errors >= 1  # still reported as the plugin's failure
