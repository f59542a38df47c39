"""Identical-call streaks (second seed; docs/usage.md "What fires"): warn and stop levels, attended and not."""

from __future__ import annotations

import pytest

import turnguard as tg
from conftest import distinct_call

TEST_RUN = tg.ToolCall("bash", "mvn -q test")
OK, ERROR, DENIED, UNKNOWN = tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.DENIED, tg.Outcome.UNKNOWN


def same(call: tg.ToolCall = TEST_RUN) -> tg.ToolCall:
    """A new ToolCall object with the same identity (hosts build a new one per call)."""
    return tg.ToolCall(call.name, call.args)


def step(turn: tg.Turn, outcome: tg.Outcome, call: tg.ToolCall = TEST_RUN) -> tuple[tg.Verdict, tg.Verdict]:
    """One identical call: its check verdict and its outcome verdict."""
    c = same(call)
    return turn.check_call(c), turn.record_outcome(c, outcome)


@pytest.mark.parametrize(("promptable", "action"), [(True, tg.Action.ASK), (False, tg.Action.ALLOW)])
def test_the_fifth_identical_call_asks_when_attended_and_is_observed_when_not(guard, promptable, action):
    turn = guard.turn(promptable=promptable)
    checks = [step(turn, OK)[0] for _ in range(6)]
    assert all(v.event is None and v.action is tg.Action.ALLOW for v in checks[:4])
    warn = checks[4]
    assert warn.action is action
    assert (warn.threshold, warn.event.level, warn.event.limit) == (tg.Threshold.STREAK, tg.Level.WARN, 5)
    assert warn.event.streak_length == 5 and warn.event.promptable is promptable
    assert "5 times in a row" in warn.message
    assert checks[5].event is None  # the level fires once, when the count reaches it


@pytest.mark.parametrize(("promptable", "action"), [(False, tg.Action.HALT), (True, tg.Action.ASK)])
def test_the_eighth_identical_failure_halts_when_unattended_and_asks_when_attended(guard, promptable, action):
    turn = guard.turn(promptable=promptable)
    outcomes = [step(turn, ERROR)[1] for _ in range(8)]
    assert all(v.event is None for v in outcomes[:7])
    stop = outcomes[7]
    assert stop.action is action
    assert (stop.threshold, stop.event.level, stop.event.limit) == (tg.Threshold.STREAK, tg.Level.STOP, 8)
    assert stop.event.failing_streak_length == 8
    if action is tg.Action.HALT:
        assert turn.check_call(same()) is stop  # latched
    else:
        assert turn.check_call(same()).action is not tg.Action.HALT


def test_a_denial_in_the_middle_neither_counts_nor_resets(guard):
    turn = guard.turn()
    outcomes = [step(turn, o)[1] for o in [ERROR] * 4 + [DENIED] + [ERROR] * 3]
    assert all(v.action is not tg.Action.HALT for v in outcomes)  # 7 failures so far, not 8
    assert turn.ledger.failing_streak_length == 7 and turn.ledger.streak_length == 8
    assert step(turn, ERROR)[1].threshold is tg.Threshold.STREAK  # the 8th failure, 9th call


@pytest.mark.parametrize("reset", [OK, UNKNOWN])
def test_a_success_or_unknown_outcome_resets_the_failing_count(guard, reset):
    turn = guard.turn()
    outcomes = [step(turn, o)[1] for o in [ERROR] * 7 + [reset] + [ERROR] * 7]
    assert all(v.action is tg.Action.ALLOW for v in outcomes)
    assert turn.ledger.failing_streak_length == 7
    assert step(turn, ERROR)[1].action is tg.Action.HALT


def test_a_paginated_read_never_fires(guard):
    turn = guard.turn()
    for offset in range(0, 50_000, 100):
        call = tg.ToolCall("read_file", {"path": "big.log", "offset": offset, "limit": 100})
        assert turn.check_call(call).event is None
        assert turn.record_outcome(call, ERROR).event is None
        assert turn.ledger.streak_length == 1


def test_a_different_call_ends_the_streak(guard):
    turn = guard.turn()
    for outcome in [ERROR] * 4:
        step(turn, outcome)
    step(turn, OK, distinct_call(1))
    checks = [step(turn, ERROR)[0] for _ in range(4)]
    assert all(v.event is None for v in checks) and turn.ledger.streak_length == 4


@pytest.mark.parametrize("answer", ["continue", "redirect", tg.Answer.CONTINUE])
def test_continue_and_redirect_reset_the_streak_so_it_does_not_fire_again_at_once(guard, answer):
    turn = guard.turn(promptable=True)
    checks = [step(turn, ERROR)[0] for _ in range(5)]
    assert checks[4].action is tg.Action.ASK
    assert turn.resolve(checks[4].event, answer).action is tg.Action.ALLOW
    assert turn.ledger.streak_length == 0 and turn.ledger.failing_streak_length == 0
    again = [step(turn, ERROR) for _ in range(5)]
    assert all(c.event is None and o.event is None for c, o in again[:4])
    assert again[4][0].action is tg.Action.ASK  # a full new streak fires again


def test_stop_latches_a_halt_with_the_streak_threshold(guard):
    turn = guard.turn(promptable=True)
    warn = [step(turn, ERROR)[0] for _ in range(5)][4]
    halt = turn.resolve(warn, "stop")  # a Verdict is accepted in place of its event
    assert (halt.action, halt.threshold, halt.event) == (tg.Action.HALT, tg.Threshold.STREAK, warn.event)
    assert turn.check_call(distinct_call(1)) is halt
    assert turn.begin_cycle() is halt
    assert turn.end().reason == "halted"


def test_every_answer_is_reported_to_observers(make_guard):
    answers = []

    class Audit:
        @tg.hookimpl
        def turnguard_escalation_resolved(self, event, response):
            answers.append((event.event_id, response))

    guard = make_guard()
    guard.register(Audit(), name="audit")
    turn = guard.turn(promptable=True)
    events = []
    for answer in ("continue", "redirect", "stop"):
        warn = [step(turn, ERROR)[0] for _ in range(5)][4]
        events.append(warn.event.event_id)
        turn.resolve(warn.event, answer)
    assert answers == list(zip(events, ["continue", "redirect", "stop"], strict=True))


@pytest.mark.parametrize("bad", ["maybe", "", None, 3, "halt"])
def test_an_unknown_answer_is_a_value_error_naming_the_accepted_ones(guard, bad):
    turn = guard.turn(promptable=True)
    warn = [step(turn, ERROR)[0] for _ in range(5)][4]
    with pytest.raises(ValueError, match=r"continue.*stop.*redirect"):
        turn.resolve(warn.event, bad)


@pytest.mark.parametrize("bad", [None, "event", tg.Verdict(tg.Action.ALLOW)])
def test_resolving_something_that_is_not_an_event_is_a_type_error(guard, bad):
    with pytest.raises(TypeError, match="LoopDetectedEvent"):
        guard.turn().resolve(bad, "continue")


@pytest.mark.parametrize("promptable", [True, False])
def test_remind_model_gives_a_remind_with_a_message_for_the_model(make_guard, promptable):
    turn = make_guard(remind_model=True).turn(promptable=promptable)
    warn = [step(turn, OK)[0] for _ in range(5)][4]
    assert warn.action is tg.Action.REMIND and warn.event.level is tg.Level.WARN
    assert "bash" in warn.message and "5 times in a row" in warn.message


def test_the_models_input_is_never_changed_by_default(guard):
    turn = guard.turn()
    assert all(step(turn, OK)[0].action is not tg.Action.REMIND for _ in range(20))


def test_zero_disables_each_level(make_guard):
    turn = make_guard(streak_warn_at=0, streak_stop_at=0).turn()
    assert all(c.event is None and o.event is None for c, o in (step(turn, ERROR) for _ in range(30)))
    turn = make_guard(streak_warn_at=0).turn()
    assert [o.action for _, o in (step(turn, ERROR) for _ in range(8))][-1] is tg.Action.HALT


def test_thresholds_are_configurable(make_guard):
    turn = make_guard(streak_warn_at=2, streak_stop_at=3).turn(promptable=True)
    results = [step(turn, ERROR) for _ in range(3)]
    assert results[1][0].action is tg.Action.ASK and results[1][0].event.limit == 2
    assert results[2][1].action is tg.Action.ASK and results[2][1].event.level is tg.Level.STOP


def test_an_outcome_for_another_call_does_not_touch_the_streak(guard):
    turn = guard.turn()
    other = distinct_call(1)
    turn.check_call(other)
    for _ in range(3):
        step(turn, ERROR)
    turn.record_outcome(other, ERROR)  # a parallel call finishing late
    assert turn.ledger.failing_streak_length == 3


def test_a_streak_warning_does_not_stop_an_unattended_turn(guard):
    turn = guard.turn()
    assert all(step(turn, OK)[0].action is tg.Action.ALLOW for _ in range(50))
    assert turn.halted is None
