"""A halted turn names what halted it on every path, however the host ends it.

The boards and alerts select halted turns by ``turnguard_loop_threshold`` (``series.HALTED``),
calibrate by the recorder's ``ended_by``, observers by ``TurnSummary.halted``/``threshold``: each
halt (a threshold's, a failing plugin's under ``fail_mode="closed"``, a plugin's bare HALT) ended
each way a host ends a turn must read as halted, by the same threshold, on all of them, and a
shadow must see the live turn as ``live_halted`` whatever outcome label the host gave it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import turnguard as tg
from turnguard._boards import series
from turnguard._plugins import NON_POLICY_PLUGINS
from turnguard.telemetry import _names as n

pytest.importorskip("opentelemetry.sdk")

ENDS = ("completed", "loop_detected", "own_error", "cancelled", "budget", "error")
"""How a host ends a turn: leaving the block, raising ``LoopDetected``, raising its own error,
``end(reason)`` with a reason of its own or a built-in one."""
EXPECTED_REASON = {"completed": "halted", "loop_detected": "halted", "own_error": "error", "cancelled": "cancelled",
                   "budget": "budget", "error": "error"}

TURN_METRICS = (n.METRIC_TURN_TOOL_CALLS[0], n.METRIC_TURN_CYCLES[0], n.METRIC_TURN_MAX_KEY_REPEAT[0],
                n.METRIC_TURN_MAX_FAILING_STREAK[0])


class RaisingIn:
    """Raises in one hook (a plugin bug)."""

    def __init__(self, hook: str) -> None:
        def impl():
            raise RuntimeError("bug")

        setattr(self, hook, tg.hookimpl(impl))


class BareHalt:
    """Halts every call without naming a threshold."""

    @tg.hookimpl
    def turnguard_check_call(self):
        return tg.Verdict(tg.Action.HALT, message="no")


FAILING_HOOKS = ("turnguard_configure", "turnguard_turn_started", "turnguard_check_cycle", "turnguard_check_call",
                 "turnguard_call_checked", "turnguard_check_outcome", "turnguard_outcome_recorded")
"""Check hooks and observers whose failure halts a call of the turn under ``fail_mode="closed"``."""

HALTS: dict[str, tuple[dict[str, object], dict[str, object], str]] = {
    **{f"failing {hook}": ({"fail_mode": "closed"}, {"raising": RaisingIn(hook)}, "plugin_error")
       for hook in FAILING_HOOKS},
    "bare plugin halt": ({}, {"halter": BareHalt()}, "plugin_error"),
    "explicit cap": ({"max_tool_calls_per_turn": 2}, {}, "explicit"),
    "streak stop": ({"streak_stop_at": 2, "streak_warn_at": 0}, {}, "streak"),
    "cycle cap": ({"max_cycles_per_turn": 1}, {}, "cycle_cap"),
}
"""A way to halt a turn: (config options, plugins, the threshold the halted turn must name)."""


def drive_until_halted(turn: tg.Turn) -> tg.Verdict:
    """Model requests and the same failing call, as a stuck agent makes them, until a HALT."""
    call = tg.ToolCall("bash", "make")
    for _ in range(10):
        for verdict in (turn.begin_cycle(), turn.check_call(call)):
            if verdict.halted:
                return verdict
        verdict = turn.record_outcome(call, tg.Outcome.ERROR)
        if verdict.halted:
            return verdict
    raise AssertionError("the turn never halted")


def run_turn(guard: tg.Guard, end: str, drive: Callable[[tg.Turn], object] = drive_until_halted) -> tg.TurnSummary:
    turn = guard.turn(agent_name="coder")
    try:
        with turn:
            verdict = drive(turn)
            if end == "loop_detected":
                raise tg.LoopDetected(verdict)  # type: ignore[arg-type]
            if end == "own_error":
                raise RuntimeError("the host's own")
            if end != "completed":
                turn.end(end)
    except (tg.LoopDetected, RuntimeError):
        pass
    assert turn.summary is not None
    return turn.summary


@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("halt", list(HALTS))
def test_a_halted_turn_names_its_threshold_on_every_path_however_the_host_ends_it(halt, end, otel, tmp_path: Path):
    options, plugins, threshold = HALTS[halt]
    recorder = tmp_path / "turns.jsonl"
    config = tg.GuardConfig(**options, recorder_path=str(recorder), load_entrypoints=False,
                            disable_plugins=tuple(p for p in NON_POLICY_PLUGINS if p not in ("otel", "recorder")))
    guard = tg.Guard(config, plugins=plugins, environ={}, **otel.providers())
    summary = run_turn(guard, end)
    assert (summary.halted, summary.threshold, summary.reason) == (True, threshold, EXPECTED_REASON[end])
    labels = [dict(p.attributes) for name in TURN_METRICS for p in otel.points(name)]
    assert labels and all(a[n.LOOP_THRESHOLD] == threshold for a in labels)
    assert all(a[n.TURN_OUTCOME] == EXPECTED_REASON[end] for a in labels)
    selected = series.HALTED[series.THRESHOLD]
    assert selected == f"!{n.NO_THRESHOLD}" and all(a[n.LOOP_THRESHOLD] != n.NO_THRESHOLD for a in labels)
    assert otel.span("invoke_agent coder").attributes[n.LOOP_THRESHOLD] == threshold
    line = json.loads(recorder.read_text().splitlines()[-1])
    assert line["ended_by"] == threshold
    assert guard.report_result(summary.turn_id, True)
    late, = otel.points(n.METRIC_TURN_RESULTS[0])
    assert late.attributes[n.LOOP_THRESHOLD] == threshold


@pytest.mark.parametrize("end", ENDS)
def test_a_turn_nothing_halted_names_no_threshold_on_any_path(end, otel, tmp_path: Path):
    recorder = tmp_path / "turns.jsonl"
    config = tg.GuardConfig(fail_mode="closed", recorder_path=str(recorder), load_entrypoints=False,
                            disable_plugins=("shadow",))
    guard = tg.Guard(config, environ={}, **otel.providers())
    summary = run_turn(guard, end, lambda turn: turn.check_call(tg.ToolCall("bash", "make")))
    expected_reason = {"loop_detected": "halted", "own_error": "error", "completed": "completed"}.get(end, end)
    assert (summary.halted, summary.threshold, summary.reason) == (False, None, expected_reason)
    labels = [dict(p.attributes) for name in TURN_METRICS for p in otel.points(name)]
    assert labels and all(a[n.LOOP_THRESHOLD] == n.NO_THRESHOLD for a in labels)
    assert json.loads(recorder.read_text().splitlines()[-1])["ended_by"] == expected_reason


class ShadowEnds:
    """What each shadow reported at the turn's end."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []

    @tg.hookimpl
    def turnguard_shadow_turn_ended(self, policy, summary):
        self.seen.append((policy, summary.reason, summary.halted))


LOOSE = {"max_tool_calls_per_turn": 0, "streak_stop_at": 0, "streak_warn_at": 0, "max_cycles_per_turn": 0,
         "fail_mode": "open"}
"""A shadow that never halts where the live turns below halt."""


@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("halt", list(HALTS))
def test_a_shadow_sees_the_live_turn_halted_by_its_threshold_whatever_the_hosts_reason(halt, end):
    options, plugins, _ = HALTS[halt]
    ends = ShadowEnds()
    config = tg.GuardConfig(**options, shadow={"loose": LOOSE}, load_entrypoints=False,
                            disable_plugins=tuple(p for p in NON_POLICY_PLUGINS if p != "shadow"))
    guard = tg.Guard(config, plugins={**plugins, "ends": ends}, environ={})
    summary = run_turn(guard, end)
    assert summary.halted
    assert ends.seen == [("loose", "live_halted", False)]


@pytest.mark.parametrize("end", ENDS)
def test_a_shadow_reports_the_hosts_reason_for_a_live_turn_nothing_halted(end):
    ends = ShadowEnds()
    config = tg.GuardConfig(shadow={"loose": LOOSE}, load_entrypoints=False,
                            disable_plugins=tuple(p for p in NON_POLICY_PLUGINS if p != "shadow"))
    guard = tg.Guard(config, plugins={"ends": ends}, environ={})
    summary = run_turn(guard, end, lambda turn: turn.check_call(tg.ToolCall("bash", "make")))
    assert not summary.halted
    shown = "live_halted" if summary.reason == "halted" else summary.reason  # "halted" is a shadow's own halt
    assert ends.seen == [("loose", shown, False)]
