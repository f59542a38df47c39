"""``CycleRuns`` (``turnguard._ledger._cycles``) on its own: calls settle in check order at their
outcome, and a cycle repeated to a level is reported once at its shortest period."""

from __future__ import annotations

import random

import pytest

import turnguard as tg
from turnguard._ledger import Ledger
from turnguard._ledger._cycles import CycleRuns

OK, ERROR, DENIED = tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.DENIED
A, B = b"a" * 8, b"b" * 8


def run(keys, outcomes=None, *, warn_at=3, stop_at=4) -> list:
    """Check and settle ``keys`` one at a time: the level due after each (``None``: none)."""
    runs = CycleRuns(4, warn_at, stop_at, 1)
    due = []
    for seq, k in enumerate(keys, 1):
        runs.checked(seq, k, False)
        runs.settle(seq, outcomes[seq - 1] if outcomes else OK)
        due.append(runs.due)
    return due


def test_a_two_call_cycle_reaches_the_warn_then_the_stop_level():
    due = run([A, B] * 4)
    levels = [(i, d[0]) for i, d in enumerate(due, 1) if d is not None]
    assert levels == [(6, tg.Level.WARN), (8, tg.Level.STOP)]


def test_a_denied_call_is_not_seen_and_does_not_break_the_cycle():
    due = run([A, B, A, A, B, A, B], [OK, OK, DENIED, OK, OK, OK, OK])
    assert [d for d in due if d is not None] == [(tg.Level.WARN, 2, 4)]


def test_outcomes_out_of_order_settle_in_check_order():
    runs = CycleRuns(4, 3, 0, 1)
    keys = [A, B] * 3
    for seq, k in enumerate(keys, 1):
        runs.checked(seq, k, False)
    assert not runs.settle(6, OK)  # waits for the five before it
    hits = [runs.settle(seq, OK) for seq in range(1, 6)]
    assert hits == [False, False, False, False, True] and runs.due == (tg.Level.WARN, 2, 4)


def test_state_and_restore_give_back_the_same_runs():
    runs = CycleRuns(4, 3, 4, 1)
    for seq, k in enumerate([A, B, A], 1):
        runs.checked(seq, k, False)
        runs.settle(seq, OK)
    twin = runs.copy()
    assert twin.state() == runs.state() and twin.runs == runs.runs


def _batches(rng: random.Random) -> list[list[bytes]]:
    """Model responses of 1 to 4 calls over a few keys, so cycles, streaks and news all come."""
    keys = [bytes([i]) * 8 for i in range(rng.choice((2, 3, 5)))]
    return [[rng.choice(keys) for _ in range(rng.choice((1, 1, 1, 2, 4)))] for _ in range(40)]


@pytest.mark.parametrize("seed", range(200))
def test_the_ledgers_inlined_settling_counts_as_cycle_runs_settle_does(seed):
    """The ledger settles the common call inline on its outcome path (``Streaks.record_outcome``):
    fed the same checks and outcomes, in any order, it holds what ``CycleRuns`` alone holds."""
    rng = random.Random(seed)
    config = tg.GuardConfig(cycle_repeat_warn_at=3, cycle_repeat_stop_at=4)
    ledger = Ledger(config)
    alone = CycleRuns(config.cycle_repeat_max_period, 3, 4, 1)
    for batch in _batches(rng):
        seqs = [ledger.count_call(key, "tool") for key in batch]
        for seq, key in zip(seqs, batch, strict=True):
            alone.checked(seq, key)
        order = list(zip(seqs, [rng.choice((OK, OK, ERROR, DENIED)) for _ in seqs], strict=True))
        rng.shuffle(order)
        for seq, outcome in order:
            due = ledger.record_outcome(seq, outcome)
            alone.settle(seq, outcome)
            assert ledger.cycle_due == alone.due and bool(due) >= (alone.due is not None)
            assert ledger._cyc.state() == alone.state() and ledger._cyc.hot == any(alone.runs)
            assert ledger._cyc.calm == alone.calm == (not alone.early and not alone.stateful)
