"""Random recorded turns full of alternating loops (A,B,A,B...; periods 1 to 4), for comparing
what calibrate assumes and replays about ``cycle_repeat`` with what the live guard does."""

from __future__ import annotations

import random

import turnguard as tg
from turnguard._calibrate.records import RecordedCall, RecordedTurn

POOL = [("read", '{"a": 1}'), ("read", {"a": 1}), ("list", "ls src\n"), ("grep", "grep x\n"), ("run", {"t": 1}),
        ("edit", "e1"), ("edit", "e2")]
"""Calls, two of them one call under canonical identity and two under byte identity."""
RESULTS = (None, "r1", "r1", "r2")


def alternating_turn(rng: random.Random, n: int) -> RecordedTurn:
    """Loops of 1 to 4 calls repeated 1 to 12 times, between stray calls; every outcome (denials
    rare), results that sometimes change, with and without per-call request numbers."""
    calls = []
    per_call = rng.random() < 0.5
    cycle = 0
    for _ in range(rng.randint(1, 5)):
        loop = [rng.choice(POOL) for _ in range(rng.choice((1, 2, 2, 2, 3, 4)))]
        results = {i: rng.choice(RESULTS) for i in range(len(loop))}
        for _ in range(rng.randint(1, 12)):
            for i, (tool, args) in enumerate(loop):
                if rng.random() < 0.1:
                    results[i] = rng.choice(RESULTS)
                outcome = rng.choices(list(tg.Outcome), (0.6, 0.3, 0.05, 0.05))[0]
                cycle += rng.random() < 0.7
                calls.append(RecordedCall(tool, args, None, outcome, cycle if per_call else None, results[i]))
        for _ in range(rng.choice((0, 0, 1, 2))):
            tool, args = rng.choice(POOL)
            calls.append(RecordedCall(tool, args, None, tg.Outcome.OK, cycle if per_call else None, None))
    total = cycle + rng.choice((0, 1)) if per_call else rng.choice((None, len(calls), len(calls) // 2 + 1))
    return RecordedTurn(f"alt{n}", tuple(calls), total, rng.choice((True, False, None)))
