"""``PolledCalls`` (``turnguard._ledger._polled``) on its own: a stateful tool's repeat counts at
its outcome with its result, a changed result restarts the streak, an exempt tool joins none."""

from __future__ import annotations

import turnguard as tg
from turnguard._ledger._polled import PolledCalls

OK = tg.Outcome.OK
CALL, DONE, RUNNING = b"c" * 8, b"d" * 8, b"r" * 8


def polled(**settings) -> PolledCalls:
    return PolledCalls(tg.GuardConfig(stateful_tools=("status",), **settings))


def test_identical_results_count_as_repeats_and_a_changed_one_restarts_the_streak():
    p = polled()
    for result in (RUNNING, RUNNING, RUNNING):
        p.record_polled(p.count_named(CALL, "status"), OK, result)
    assert p.streak_length == 3 and p.max_key_repeat == 3
    p.record_polled(p.count_named(CALL, "status"), OK, DONE)
    assert p.streak_length == 1 and p.result_restarts == 1 and p.restarts_by_tool() == {"status": 1}


def test_a_stateful_calls_repeat_waits_for_its_outcome():
    p = polled()
    seq = p.count_named(CALL, "status")
    assert p.distinct_keys == 0
    p.record_polled(seq, OK, RUNNING)
    assert p.distinct_keys == 1 and p.repeats_of(CALL + RUNNING) == 1


def test_reaching_the_stuck_threshold_at_an_outcome_is_raised_once():
    p = polled(stuck_repeat_threshold=2)
    p.record_polled(p.count_named(CALL, "status"), OK, RUNNING)
    assert not p.stuck_raised
    p.record_polled(p.count_named(CALL, "status"), OK, RUNNING)
    assert p.stuck_raised and p.first_stuck_call == 2


def test_calls_without_an_outcome_count_without_a_result_when_settled():
    p = polled()
    p.count_named(CALL, "status")
    p.settle_polled()
    assert p.repeats_of(CALL) == 1


def test_an_exempt_tools_call_is_counted_but_joins_no_streak():
    p = PolledCalls(tg.GuardConfig(streak_exempt_tools=("sleep",)))
    for _ in range(3):
        p.count_named(CALL, "sleep")
    assert p.tool_calls == 3 and p.max_key_repeat == 3 and p.streak_length == 0
