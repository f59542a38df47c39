"""The turn's longest failing identical-call streak (``TurnSummary.max_failing_streak``): the largest
stop-level count any of its streaks reached, which the threshold board's streak-stop frontier reads
from the turn's metrics and its late results."""

from __future__ import annotations

import turnguard as tg
from turnguard._ledger import Ledger

ERR, OK = tg.Outcome.ERROR, tg.Outcome.OK
UNATTENDED = tg.GuardConfig(streak_stop_at=0, streak_warn_at=0)
"""No streak level fires: the counts are observed, nothing halts."""


def _run(config: tg.GuardConfig, steps: list[tuple[str, tg.Outcome]]) -> tg.TurnSummary:
    guard = tg.Guard(config)
    with guard.turn() as turn:
        for name, outcome in steps:
            call = tg.ToolCall(name, {})
            turn.check_call(call)
            turn.record_outcome(call, outcome)
    return turn.end()


def test_a_failing_streak_another_call_ended_is_the_turns_longest():
    steps = [("a", ERR)] * 5 + [("b", ERR)] * 2 + [("c", OK)]
    assert _run(UNATTENDED, steps).max_failing_streak == 5


def test_a_success_inside_a_streak_restarts_its_failing_count():
    steps = [("a", ERR)] * 3 + [("a", OK)] + [("a", ERR)] * 2
    assert _run(UNATTENDED, steps).max_failing_streak == 3


def test_a_turn_without_failures_has_none():
    assert _run(UNATTENDED, [("a", OK)] * 4).max_failing_streak == 0


def test_the_streak_stop_halts_at_its_value_and_the_turn_records_it():
    summary = _run(tg.GuardConfig(streak_stop_at=4, streak_warn_at=0), [("a", ERR)] * 6)
    assert summary.halted and summary.max_failing_streak == 4


def test_outcomes_settling_after_another_call_count_in_their_streak():
    """A parallel batch: three identical calls, then a different one, all checked before any outcome."""
    guard = tg.Guard(tg.GuardConfig(streak_stop_at=8, streak_warn_at=0))
    with guard.turn() as turn:
        calls = [tg.ToolCall("a", {}, call_id=f"a{i}") for i in range(3)] + [tg.ToolCall("b", {}, call_id="b")]
        for call in calls:
            turn.check_call(call)
        for call in reversed(calls):
            turn.record_outcome(call, ERR)
    assert turn.end().max_failing_streak == 3


def test_a_snapshot_keeps_the_longest_streak_of_an_ended_one():
    guard = tg.Guard(tg.GuardConfig(streak_stop_at=0, streak_warn_at=0))
    turn = guard.turn(durable=True).__enter__()
    for name, outcome in [("a", ERR)] * 4 + [("b", ERR)]:
        call = tg.ToolCall(name, {})
        turn.check_call(call)
        turn.record_outcome(call, outcome)
    snapshot = turn.suspend()
    assert snapshot["facts"]["longest"] == 4
    resumed = tg.Guard(tg.GuardConfig(streak_stop_at=0, streak_warn_at=0)).resume(snapshot)
    assert resumed.end().max_failing_streak == 4


def test_a_snapshot_writes_no_longest_when_the_current_streak_holds_it():
    turn = tg.Guard(UNATTENDED).turn(durable=True).__enter__()
    call = tg.ToolCall("a", {})
    turn.check_call(call)
    turn.record_outcome(call, ERR)
    assert "longest" not in turn.suspend()["facts"]


def test_counting_a_replays_prefix_at_once_keeps_the_longest_streak():
    digests = [b"a" * 8] * 4 + [b"b" * 8] * 2
    outcomes = [ERR] * 4 + [ERR, OK]
    at_once = Ledger(UNATTENDED)
    assert at_once.count_settled(digests, ["t"] * 6, outcomes, [1] + [0] * 5)
    one_by_one = Ledger(UNATTENDED)
    one_by_one.begin_cycle()
    for digest, outcome in zip(digests, outcomes, strict=True):
        one_by_one.record_outcome(one_by_one.count_call(digest, "t"), outcome)
    assert at_once.longest_stop_count == one_by_one.longest_stop_count == 4
