"""Benchmark: where a shell-command string's ``check_call`` + ``record_outcome`` time goes.

    .venv/bin/python benchmarks/bench_shell_parts.py [--quick]      (or via benchmarks/run.py)

The core benchmark's shell-string row (``bench_core``) against its floor, taken apart: the same
calls (fresh ``ToolCall`` objects with distinct ``grep`` commands, telemetry off, 1,000 calls a
batch in a new turn), each part timed alone. The minimum over batches (wall clock, GC off), not
the median: the parts are compared with each other, and the least noisy figure of each is the
one that adds up. No target: the parts say what a change to the hot path could still win.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import turnguard as tg
from bench_core import _guard, _shell

CALLS = 1000


Body = Callable[[], None]


def _least(prepare: Callable[[list[tg.ToolCall], tg.Turn], Body], batches: int) -> float:
    """Least seconds per call of what ``prepare`` returns, over batches of fresh calls in fresh turns
    (``prepare`` runs untimed)."""
    guard = _guard()
    best = float("inf")
    for b in range(batches):
        calls = [tg.ToolCall("bash", _shell(b * CALLS + i)) for i in range(CALLS)]
        body = prepare(calls, guard.turn())
        gc.disable()
        start = time.perf_counter()
        body()
        best = min(best, (time.perf_counter() - start) / CALLS)
        gc.enable()
    return best


def _both(calls: list[tg.ToolCall], turn: tg.Turn) -> Body:
    check, record, ok = turn.check_call, turn.record_outcome, tg.Outcome.OK

    def body() -> None:
        for call in calls:
            check(call)
            record(call, ok)

    return body


def _check(calls: list[tg.ToolCall], turn: tg.Turn) -> Body:
    check = turn.check_call

    def body() -> None:
        for call in calls:
            check(call)

    return body


def _digest(calls: list[tg.ToolCall], turn: tg.Turn) -> Body:
    digest = turn.guard.keyer.digest

    def body() -> None:
        for call in calls:
            digest(call.name, call.args)

    return body


def _ledger(calls: list[tg.ToolCall], turn: tg.Turn) -> Body:
    count, record, ok = turn.ledger.count_call, turn.ledger.record_outcome, tg.Outcome.OK
    digests = [turn.guard.keyer.digest(c.name, c.args) for c in calls]

    def body() -> None:
        for digest in digests:
            record(count(digest, "bash"), ok)

    return body


def _locks(calls: list[tg.ToolCall], turn: tg.Turn) -> Body:
    lock = threading.RLock()
    acquire, release = lock.acquire, lock.release

    def body() -> None:
        for _ in calls:
            acquire()
            release()
            acquire()
            release()

    return body


PARTS: list[tuple[str, Callable[[list[tg.ToolCall], tg.Turn], Body]]] = [
    ("check_call + record_outcome", _both),
    ("check_call alone", _check),
    ("keying (Keyer.digest)", _digest),
    ("the ledger's count_call + record_outcome", _ledger),
    ("two RLock acquire/release pairs", _locks),
]


def run(quick: bool = False) -> list[dict[str, Any]]:
    batches = 20 if quick else 100
    return [{"benchmark": "shell_parts", "case": f"shell string: {case}", "value": _least(part, batches) * 1e6,
             "unit": "us/call"} for case, part in PARTS]


if __name__ == "__main__":
    import run

    sys.exit(run.main(["shell_parts", *sys.argv[1:]]))
