"""Plain data: ordering of actions, contract strings, immutability, host-error messages."""

from __future__ import annotations

import dataclasses

import pytest

import turnguard as tg


def test_actions_are_ordered_by_severity_and_max_combines_them():
    assert tg.Action.ALLOW < tg.Action.REMIND < tg.Action.ASK < tg.Action.HALT
    assert max(tg.Action.ASK, tg.Action.HALT, tg.Action.ALLOW) is tg.Action.HALT
    assert [a.label for a in tg.Action] == ["allow", "remind", "ask", "halt"]


def test_threshold_values_are_the_telemetry_contract():
    assert [t.value for t in tg.Threshold] == [
        "explicit", "soft_stuck", "hard_backstop", "streak", "cycle_cap", "cycle_repeat",
    ]
    assert str(tg.Threshold.SOFT_STUCK) == "soft_stuck" and tg.Threshold.STREAK == "streak"
    assert [str(level) for level in tg.Level] == ["warn", "stop"]
    assert [str(a) for a in tg.Answer] == ["continue", "stop", "redirect"]


@pytest.mark.parametrize(("text", "outcome"), [("ok", tg.Outcome.OK), ("ERROR", tg.Outcome.ERROR),
                                               ("denied", tg.Outcome.DENIED), (tg.Outcome.UNKNOWN, tg.Outcome.UNKNOWN)])
def test_outcomes_parse_from_their_values(text, outcome):
    assert tg.Outcome.parse(text) is outcome


def test_verdicts_and_events_are_frozen():
    verdict = tg.Verdict(tg.Action.ALLOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.action = tg.Action.HALT  # type: ignore[misc]
    assert verdict.threshold is None and verdict.event is None and not verdict.halted
    assert tg.Verdict(tg.Action.HALT).halted


def test_tool_calls_accept_any_arguments_and_are_frozen():
    assert tg.ToolCall("t").args is None
    assert tg.ToolCall("t", {"unhashable": []}).args == {"unhashable": []}
    with pytest.raises(dataclasses.FrozenInstanceError):
        tg.ToolCall("t").name = "u"  # type: ignore[misc]


def test_a_tool_call_equals_and_hashes_as_itself_only():
    call, twin = tg.ToolCall("t", {"a": []}, call_id="x"), tg.ToolCall("t", {"a": []}, call_id="x")
    assert call == call and hash(call) == hash(call)
    assert call != twin and len({call, twin}) == 2
    assert {call: 1, twin: 2}[call] == 1



def test_loop_detected_carries_its_verdict():
    verdict = tg.Verdict(tg.Action.HALT, tg.Threshold.EXPLICIT, "turnguard: cap reached")
    error = tg.LoopDetected(verdict)
    assert error.verdict is verdict and str(error) == "turnguard: cap reached"
    assert str(tg.LoopDetected(tg.Verdict(tg.Action.HALT, tg.Threshold.STREAK))) == "turnguard: streak (halt)"


def test_the_event_has_every_field_the_design_names():
    names = {f.name for f in dataclasses.fields(tg.LoopDetectedEvent)}
    assert {"threshold", "action", "level", "limit", "tool_calls", "cycles", "max_key_repeat", "streak_length",
            "failing_streak_length", "soft_cap", "hard_cap", "tool_name", "key_digest", "promptable", "turn_id",
            "conversation_id", "agent_name", "event_id"} <= names


@pytest.mark.parametrize("action", list(tg.Action))
def test_an_action_prints_its_name_as_thresholds_and_levels_do(action):
    assert str(action) == f"{action}" == action.label == action.name.lower()
    assert f"{action:>8}" == f"{action.label:>8}"
    assert str(tg.Threshold.STREAK) == "streak" and str(tg.Level.STOP) == "stop"
    assert action == int(action)  # still ordered by severity
