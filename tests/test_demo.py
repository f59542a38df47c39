"""The simulated scenarios: the generators make the turns they promise, and the real guard
stops each where the rules say (docs/usage.md "What fires")."""

from __future__ import annotations

import collections

import pytest

import turnguard as tg
from conftest import CORE_ONLY
from turnguard import _demo as demo

CORE = tg.GuardConfig(**CORE_ONLY)


def calls(steps) -> list[demo.Step]:
    return [s for s in steps if s.kind is demo.StepKind.CALL]


def repeats(steps) -> collections.Counter:
    return collections.Counter((s.tool, repr(s.args)) for s in calls(steps))


@pytest.mark.parametrize("n", [96, 400, 1000])
def test_productive_turns_repeat_no_call_more_than_twice(n):
    steps = list(demo.productive_calls(n, seed=n))
    assert len(calls(steps)) == n and max(repeats(steps).values()) == 2
    assert sum(s.kind is demo.StepKind.CYCLE for s in steps) == n // 4


def test_soft_stuck_turns_place_the_last_repeat_where_asked():
    made = calls(demo.soft_stuck_calls(300, last_at=240))
    assert max(repeats(made).values()) == 6
    repeated = made[239]
    assert repeats(made)[repeated.tool, repr(repeated.args)] == 6  # call 240 is the repeated call...
    assert [i + 1 for i, s in enumerate(made) if s == repeated][-1] == 240  # ...and its last time


@pytest.mark.parametrize(("name", "threshold", "at"), [
    ("explicit-cap", "explicit", 101), ("soft-stuck", "soft_stuck", 101), ("runaway", "hard_backstop", 1001)])
def test_cap_scenarios_halt_where_the_design_says(name, threshold, at):
    result = demo.run_scenario(demo.SCENARIOS[name], base=CORE)
    last = result.detections[-1]
    assert (last.threshold, last.call, last.action) == (threshold, at, tg.Action.HALT)
    assert result.executed_calls == at - 1 and result.summary.halted


def test_a_sixth_repeat_at_call_240_halts_there_in_a_scenario():
    scenario = demo.Scenario("late", "late stuck", lambda: demo.soft_stuck_calls(400, last_at=240))
    result = demo.run_scenario(scenario, base=CORE)
    assert [(d.threshold, d.call) for d in result.detections] == [("soft_stuck", 240)]


def test_the_productive_scenario_completes():
    result = demo.run_scenario(demo.SCENARIOS["productive-long"], base=CORE)
    assert result.detections == () and result.summary.reason == "completed" and result.executed_calls == 400


def test_the_attended_streak_asks_and_the_users_answers_are_applied():
    result = demo.run_scenario(demo.SCENARIOS["failing-streak-attended"], base=CORE)
    assert [(d.level, d.action, d.answer) for d in result.detections] == [
        ("warn", tg.Action.ASK, tg.Answer.CONTINUE), ("warn", tg.Action.ASK, tg.Answer.STOP)]
    assert result.summary.reason == "halted"


def test_the_unattended_streak_is_observed_then_halted():
    result = demo.run_scenario(demo.SCENARIOS["failing-streak-unattended"], base=CORE)
    assert [(d.level, d.action) for d in result.detections] == [("warn", tg.Action.ALLOW), ("stop", tg.Action.HALT)]


def test_a_scenario_can_run_on_a_guard_the_caller_built():
    guard = tg.Guard(CORE.replace(max_cycles_per_turn=10))
    result = demo.run_scenario(demo.SCENARIOS["cycle-capped"], guard=guard)
    assert [(d.threshold, d.cycle) for d in result.detections] == [("cycle_cap", 11)]


def test_run_all_rejects_unknown_names():
    with pytest.raises(ValueError, match="runaway"):
        demo.run_all(["nope"])
