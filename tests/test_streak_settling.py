"""Issue 33's two streak-settling cases, as the docs state them (docs/usage.md, docs/polling.md):
a call whose outcome never comes counts as a failure, the calls behind it as they went, with
their results; an answer ends only the streak it answered, and streaks other calls ended go on
counting their outcomes. ``test_polling_reference.py`` checks every instance of both classes
against a reference on random turns (lost outcomes, answers while outcomes wait)."""

from __future__ import annotations

import random

import pytest

import turnguard as tg
from conftest import core_guard
from turnguard._ledger import Ledger, count_outcome


def lost_first_poll(config: tg.GuardConfig, outcome: str, polls: int = 40) -> tuple[int, tg.Turn]:
    """Poll 1's outcome never comes; polls 2.. are reported one at a time, each with a new
    result: the poll at which the turn halted (0: never), and the turn."""
    turn = tg.Guard(config, environ={}).turn()
    for n in range(1, polls + 1):
        call = tg.ToolCall("ci_status", {"run": 42})
        if turn.check_call(call).action is tg.Action.HALT:
            return n, turn
        if n > 1:
            turn.record_outcome(call, outcome, result={"run": 42, "poll": n})
    return 0, turn


@pytest.mark.parametrize(("profile", "outcome"), [("recommended", "ok"), ("seed", "error")])
def test_one_lost_outcome_leaves_polling_progress_on(profile, outcome):
    config = tg.PROFILES[profile].replace(stateful_tools=("ci_status",))
    halted_at, turn = lost_first_poll(config, outcome)
    assert halted_at == 0
    assert turn.ledger.provisional_streak_length() == 1  # each new result restarts the streak


def test_identical_polls_behind_a_lost_outcome_still_stop():
    config = tg.PROFILES["seed"].replace(stateful_tools=("ci_status",))
    turn = tg.Guard(config, environ={}).turn()
    verdicts = []
    for n in range(1, 12):
        call = tg.ToolCall("ci_status", {"run": 42})
        verdicts.append(turn.check_call(call).action)
        if n > 1:
            turn.record_outcome(call, "error", result="still failing")
    assert verdicts.index(tg.Action.HALT) == 8  # the 9th check: 8 failures before it, the lost one first


def test_lost_outcomes_in_an_attended_turn_do_not_warn_a_polling_streak():
    config = tg.PROFILES["recommended"].replace(stateful_tools=("ci_status",))
    turn = tg.Guard(config, environ={}).turn(promptable=True)
    asked = []
    for n in range(1, 20):
        call = tg.ToolCall("ci_status", {"run": 42})
        asked.append(turn.check_call(call).action is tg.Action.ASK)
        if n > 1:
            turn.record_outcome(call, "ok", result=n)
    assert not any(asked)


def answered_read_streak(answer: str | None) -> list[tg.Action]:
    """8 identical ``bash`` calls checked and left waiting, 8 ``read`` failures one at a time
    (the 8th asks), the answer, then the 8 ``bash`` failures: their verdicts."""
    turn = core_guard(remind_model=True).turn(promptable=True)
    bash = [tg.ToolCall("bash", {"cmd": "make"}) for _ in range(8)]
    for call in bash:
        turn.check_call(call)
    for _ in range(8):
        read = tg.ToolCall("read", {"path": "a.py"})
        turn.check_call(read)
        verdict = turn.record_outcome(read, "error")
    assert verdict.action is tg.Action.ASK
    if answer is not None:
        turn.resolve(verdict, answer)
    return [turn.record_outcome(call, "error").action for call in bash]


@pytest.mark.parametrize("answer", [None, "continue", "redirect"])
def test_an_answer_leaves_the_streaks_other_calls_ended_settling(answer):
    assert answered_read_streak(answer) == [tg.Action.ALLOW] * 7 + [tg.Action.ASK]


def test_the_streak_an_answer_ended_counts_no_later_outcome():
    turn = core_guard().turn(promptable=True)
    calls = [tg.ToolCall("bash", {"cmd": "make"}) for _ in range(9)]
    verdicts = [turn.check_call(call) for call in calls]
    assert verdicts[8].action is tg.Action.ASK  # the batch's stop level, at its 9th check
    turn.resolve(verdicts[8], "continue")
    assert {turn.record_outcome(call, "error").action for call in calls} == {tg.Action.ALLOW}


def test_a_retry_ends_every_streak_still_settling():
    turn = core_guard().turn(promptable=True)
    turn.begin_cycle()
    bash = [tg.ToolCall("bash", {"cmd": "make"}) for _ in range(8)]
    for call in bash:
        turn.check_call(call)
    turn.check_call(tg.ToolCall("read", {"path": "a.py"}))
    turn.retry()
    assert {turn.record_outcome(call, "error").action for call in bash} == {tg.Action.ALLOW}


@pytest.mark.parametrize("in_order", [False, True])
@pytest.mark.parametrize("stop_on", ["error", "any"])
def test_the_ledger_settles_a_streak_by_the_one_rule_in_any_report_order(stop_on, in_order):
    """``Ledger.record_outcome`` (its inlined ``OK`` case and ``_settle``'s inlined ``ERROR``
    included, which take the outcomes reported in check order) and ``count_settled`` leave the
    counts a fold of ``count_outcome`` over the outcomes in check order gives."""
    config = tg.GuardConfig(streak_stop_on=stop_on)
    rng = random.Random(33)
    for _ in range(400):
        outcomes = [rng.choice(list(tg.Outcome)) for _ in range(rng.randint(1, 12))]
        expected = (0, 0, 0)
        for outcome in outcomes:
            expected = count_outcome(outcome, *expected, stop_on == "any")
        ledger = Ledger(config)
        seqs = [ledger.count_call(b"k" * 8, "bash") for _ in outcomes]
        order = list(range(len(outcomes)))
        if not in_order:
            rng.shuffle(order)
        for i in order:
            ledger.record_outcome(seqs[i], outcomes[i])
        assert (ledger.failing_streak_length, ledger.settled_streak_length, ledger.stop_count) == expected
        replayed = Ledger(config)
        assert replayed.count_settled([b"k" * 8] * len(outcomes), ["bash"] * len(outcomes), outcomes,
                                      [0] * len(outcomes))
        assert (replayed.failing_streak_length, replayed.settled_streak_length, replayed.stop_count) == expected


# -- the summary: a lost outcome's polls behind it count their progress when the turn ends -------

LOST = [(1,), (5,), (40,), (1, 2), (3, 9, 15, 21, 27, 33)]
"""Polls (of 40) whose outcome never comes."""


def polled_turn(config: tg.GuardConfig, outcome: str, lost: tuple[int, ...], *, batch: bool, other: bool,
                seed: int, lost_is: str | None = None) -> tg.TurnSummary:
    """40 identical ``ci_status`` polls, each reported with a new result but those in ``lost``
    (never reported; with ``lost_is``, reported that way without a result instead): one at a time,
    or (``batch``) all checked first, then reported in a random order; ``other``: a different
    call checked after the batch, so the polls settle in a streak another key ended. Attended, so
    that a batch's checks ask (its waiting calls count as failures there) and go on."""
    turn = tg.Guard(config, environ={}).turn(promptable=True)
    calls = [tg.ToolCall("ci_status", {"run": 42}) for _ in range(40)]
    reports = [(n, call) for n, call in enumerate(calls, 1) if n not in lost or lost_is is not None]
    random.Random(seed).shuffle(reports)
    if not batch:
        reports.sort(key=lambda report: report[0])
    for n, call in enumerate(calls, 1):
        assert turn.check_call(call).action is not tg.Action.HALT
        if not batch and n not in lost:
            turn.record_outcome(call, outcome, result={"poll": n})
        elif not batch and lost_is is not None:
            turn.record_outcome(call, lost_is)
    if other:
        turn.check_call(tg.ToolCall("read", {"path": "log"}))
    for n, call in reports if batch else ():
        turn.record_outcome(call, lost_is if n in lost else outcome, result=None if n in lost else {"poll": n})
    return turn.end()


@pytest.mark.parametrize("lost", LOST)
@pytest.mark.parametrize(("batch", "other"), [(False, False), (True, False), (True, True)],
                         ids=["one-at-a-time", "batch", "batch-ended-by-another-call"])
@pytest.mark.parametrize(("profile", "outcome", "signal"), [("recommended", "ok", "repeat"),
                                                            ("seed", "error", "stale_repeat")])
def test_polls_behind_a_lost_outcome_count_their_restarts_in_the_summary(profile, outcome, signal, lost, batch,
                                                                          other):
    """docs/polling.md: the calls behind a lost outcome count as they went, with their results
    (the previous result skips a call without one). Once the turn ends no outcome can come, so its
    summary (``result_restarts``, the ``turnguard.streak.result_restarts`` counter) counts the
    restarts those polls made, as had the lost calls been reported without a result."""
    config = tg.PROFILES[profile].replace(stateful_tools=("ci_status",), stuck_signal=signal)
    for seed in range(3):
        summary = polled_turn(config, outcome, lost, batch=batch, other=other, seed=seed)
        without_result = polled_turn(config, outcome, lost, batch=batch, other=other, seed=seed, lost_is="ok")
        with_results = 40 - len(lost)
        assert dict(summary.result_restarts) == dict(without_result.result_restarts) == {
            "ci_status": with_results - 1}


def test_a_suspended_turn_keeps_its_waiting_polls_for_the_turn_that_resumes_it():
    """A turn put aside still waits: the outcomes may come after the resume, and count there."""
    config = tg.PROFILES["recommended"].replace(stateful_tools=("ci_status",))
    guard = tg.Guard(config, environ={})
    turn = guard.turn(durable=True)
    calls = [tg.ToolCall("ci_status", {"run": 42}, call_id=f"p{n}") for n in range(1, 7)]
    for call in calls:
        turn.check_call(call)
    for n, call in enumerate(calls[1:], 2):
        turn.record_outcome(call, "ok", result={"poll": n})
    resumed = guard.resume(turn.suspend())
    resumed.record_outcome(tg.ToolCall("ci_status", {"run": 42}, call_id="p1"), "ok", result={"poll": 1})
    assert dict(resumed.end().result_restarts) == {"ci_status": 5}
