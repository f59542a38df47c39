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


class Naive:
    """The runs from their definition, on the whole sequence of calls seen (``CycleRuns`` keeps
    none of it): ``runs[k]`` counts the latest calls each identical to the call ``k`` before it;
    a level is due at a call whose run of a period ``k >= 2`` equals ``warn * k`` or ``stop * k``
    (``cycle_repeat_*_at - 1`` matches per call) and no run of a divisor of ``k`` is as long; a
    stop wins over a warning, the shortest period among warnings. Outcomes settle in check order;
    one settling reports one level (unattended: its first stop, else its first warning), the
    others it reached are reported, oldest first, by the next settlings that reach none. An
    exempt tool's call (key ``None``) ends every run: the calls after it are counted afresh. A
    stateful tool's call (``polls``) is seen with its result, or without one with the latest
    result its call had. An answer to a check's question restarts the count at that check."""

    def __init__(self, period: int, warn_at: int, stop_at: int) -> None:
        self.period, self.warn, self.stop = period, warn_at - 1, stop_at - 1
        self.seen: list[bytes] = []
        self.keys: dict[int, bytes | None] = {}
        self.polls: set[int] = set()
        self.results: dict[bytes, bytes] = {}
        self.outcomes: dict[int, tuple] = {}
        self.fresh: set[int] = set()
        self.owed: list[tuple] = []
        self.next = 1
        self.due = None

    def runs(self) -> list[int]:
        seen = self.seen
        def run(k):
            n = 0
            while n + k < len(seen) and seen[-1 - n] == seen[-1 - n - k]:
                n += 1
            return n
        return [0, *(run(k) for k in range(1, self.period + 1))]

    def _level(self):
        runs, due = self.runs(), None
        for k in range(2, self.period + 1):
            r = runs[k]
            levels = {n * k for n in (self.warn, self.stop) if n > 0}
            if r in levels and not any(runs[d] >= r for d in range(1, k) if k % d == 0):
                level = tg.Level.STOP if r == self.stop * k else tg.Level.WARN
                if due is None or (level is tg.Level.STOP and due[0] is not tg.Level.STOP):
                    due = (level, k, r)
        return due

    def settle(self, seq: int, outcome, result: bytes | None = None) -> None:
        self.due = None
        hits = []
        if seq < self.next or seq in self.outcomes or seq not in self.keys:
            return
        self.outcomes[seq] = (outcome, result)
        while self.next in self.outcomes:
            outcome, result = self.outcomes.pop(self.next)
            key = self.keys.pop(self.next)
            poll = self.next in self.polls
            if self.next in self.fresh:
                self.seen = []
            self.next += 1
            if outcome is DENIED:
                continue
            if key is None:
                self.seen = []
                continue
            if poll and result is None:
                result = self.results.get(key)
            elif poll:
                self.results[key] = result
            self.seen.append(key + result if result is not None else key)
            level = self._level()
            if level is not None:
                hits.append(level)
        self._report(hits)

    def _report(self, hits: list) -> None:
        if hits:
            self.due = next((h for h in hits if h[0] is tg.Level.STOP), hits[0])
            self.owed.extend(h for h in hits if h is not self.due)
        elif self.owed:
            self.due = self.owed.pop(0)

    def reset(self, at: int) -> None:
        """An answer to check ``at``'s question (``at`` not settled yet): the count restarts there."""
        self.owed = []
        if at == self.next:
            self.seen = []
        else:
            self.fresh.add(at)

    def state(self) -> tuple:
        return self.runs()[1:], [key.hex() for key in self.seen[-self.period:]]


def _batches(rng: random.Random) -> list[list[bytes]]:
    """Model responses of 1 to 4 calls over a few keys, so cycles, streaks and news all come."""
    keys = [bytes([i]) * 8 for i in range(rng.choice((2, 3, 5)))]
    return [[rng.choice(keys) for _ in range(rng.choice((1, 1, 1, 2, 4)))] for _ in range(40)]


def _reference_agrees(ledger: Ledger, naive: Naive, due) -> None:
    facts = ledger.state()["cycle_runs"]
    assert ledger.cycle_due == naive.due and bool(due) >= (naive.due is not None)
    assert (facts["runs"], facts["ring"]) == naive.state()
    assert ledger._cyc.calm <= (naive.due is None)


@pytest.mark.parametrize("seed", range(200))
def test_the_ledgers_inlined_settling_counts_as_the_runs_definition_does(seed):
    """The ledger settles the common call inline on its outcome path (``Streaks.record_outcome``)
    and the others through ``CycleRuns.settle``: fed the same checks and outcomes, in any order,
    with calls of an exempt and of a stateful tool and answers among them, it holds and reports
    what the runs' definition gives (``Naive``), after every outcome."""
    rng = random.Random(seed)
    config = tg.GuardConfig(cycle_repeat_warn_at=3, cycle_repeat_stop_at=4, streak_exempt_tools=("skip",),
                            stateful_tools=("poll",))
    ledger = Ledger(config)
    naive = Naive(config.cycle_repeat_max_period, 3, 4)
    for batch in _batches(rng):
        tools = [rng.choice(("tool",) * 8 + ("skip", "poll")) for _ in batch]
        seqs = [ledger.count_named(key, tool) for key, tool in zip(batch, tools, strict=True)]
        for seq, key, tool in zip(seqs, batch, tools, strict=True):
            naive.keys[seq] = None if tool == "skip" else key
            if tool == "poll":
                naive.polls.add(seq)
        if rng.random() < 0.05:  # an answer to the last check's question: the runs count afresh from it
            ledger.reset_streak()
            naive.reset(seqs[-1])
        order = list(zip(seqs, tools, [rng.choice((OK, OK, ERROR, DENIED)) for _ in seqs], strict=True))
        rng.shuffle(order)
        for seq, tool, outcome in order:
            if tool == "poll":
                result = rng.choice((None, b"r" * 8, b"s" * 8))
                due = ledger.record_polled(seq, outcome, result)
                naive.settle(seq, outcome, None if outcome is DENIED else result)
            else:
                due = ledger.record_outcome(seq, outcome)
                naive.settle(seq, outcome)
            _reference_agrees(ledger, naive, due)


@pytest.mark.parametrize("seed", range(50))
def test_cycle_runs_on_their_own_count_as_the_runs_definition_does(seed):
    """``CycleRuns.checked``/``settle`` alone (every call through ``settle``) give the same."""
    rng = random.Random(seed)
    runs, naive = CycleRuns(4, 3, 4, 1), Naive(4, 3, 4)
    seq = 0
    for batch in _batches(rng):
        seqs = []
        for key in batch:
            seq += 1
            runs.checked(seq, key)
            naive.keys[seq] = key
            seqs.append(seq)
        rng.shuffle(seqs)
        for s in seqs:
            outcome = rng.choice((OK, ERROR, DENIED))
            runs.settle(s, outcome)
            naive.settle(s, outcome)
            assert runs.due == naive.due and (runs.state()["runs"], runs.state()["ring"]) == naive.state()
