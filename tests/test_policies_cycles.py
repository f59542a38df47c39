"""The cycle cap (second seed; docs/usage.md "What fires"): model requests per turn; 0 is unbounded."""

from __future__ import annotations

import pytest

import turnguard as tg
from conftest import distinct_call


def test_cycles_are_unbounded_by_default(guard):
    turn = guard.turn()
    assert all(turn.begin_cycle().action is tg.Action.ALLOW for _ in range(5000))
    assert turn.ledger.cycles == 5000


@pytest.mark.parametrize("limit", [1, 3, 50])
def test_the_cycle_cap_allows_request_n_and_halts_request_n_plus_1(make_guard, limit):
    turn = make_guard(max_cycles_per_turn=limit).turn()
    verdicts = [turn.begin_cycle() for _ in range(limit + 1)]
    assert all(v.action is tg.Action.ALLOW and v.event is None for v in verdicts[:limit])
    halt = verdicts[limit]
    assert (halt.action, halt.threshold) == (tg.Action.HALT, tg.Threshold.CYCLE_CAP)
    assert halt.event.limit == limit and halt.event.cycles == limit + 1 and halt.event.level is tg.Level.STOP
    assert halt.event.tool_name is None and halt.event.key_digest is None


def test_a_cycle_cap_halt_latches_for_calls_and_later_requests(make_guard):
    turn = make_guard(max_cycles_per_turn=1).turn()
    turn.begin_cycle()
    turn.check_call(distinct_call(1))
    halt = turn.begin_cycle()
    assert turn.check_call(distinct_call(2)) is halt
    assert turn.begin_cycle() is halt and turn.ledger.cycles == 2


def test_a_re_sent_request_counts_again(make_guard):
    turn = make_guard(max_cycles_per_turn=2).turn()
    turn.begin_cycle()
    turn.begin_cycle()
    turn.retry()
    assert turn.begin_cycle().threshold is tg.Threshold.CYCLE_CAP
