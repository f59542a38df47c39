"""Benchmark: what task results by result token cost, per call and per turn.

    .venv/bin/python benchmarks/bench_results.py [--quick]      (or via benchmarks/run.py results)

Per call: CPU time of ``check_call`` + ``record_outcome`` (median over interleaved batches, each
20 turns of 50 distinct small calls; telemetry off) in turns whose ``result_token`` is read after
they end, against the same turns whose token is never read, in the same run. A token is made only
when read, once per turn, from the summary: nothing per call. Target: within 5% (no measurable
cost).

Per turn and per report: making a token (``turn.result_token``, once per ended turn) against
opening and ending the turn, and ``report_result`` with a token on another guard (checking and
reading the token, remembering its turn) against ``report_result`` with a plain turn id on the
turn's own guard.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import turnguard as tg
from bench_core import _small
from run import format_rows
from turnguard._plugins import NON_POLICY_PLUGINS

TARGET_RATIO = 1.05
CALLS_PER_TURN = 50
TURNS_PER_BATCH = 20


def _guard() -> tg.Guard:
    return tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, load_entrypoints=False), environ={})


def _batch(guard: tg.Guard, turns: list[list[tg.ToolCall]], read_token: bool) -> float:
    """CPU per call of the calls alone (the token, when read, is read after the turn, untimed:
    its cost per turn is ``per_turn``'s)."""
    ok, spent = tg.Outcome.OK, 0.0
    for calls in turns:
        turn = guard.turn()
        check, record = turn.check_call, turn.record_outcome
        start = time.process_time()
        for call in calls:
            check(call)
            record(call, ok)
        spent += time.process_time() - start
        turn.end()
        if read_token:
            assert turn.result_token is not None
    return spent / (len(turns) * CALLS_PER_TURN)


def per_call(batches: int) -> dict[bool, float]:
    guard = _guard()
    samples: dict[bool, list[float]] = {False: [], True: []}
    for b in range(batches):
        base = b * TURNS_PER_BATCH * CALLS_PER_TURN
        for read_token in ((False, True) if b % 2 else (True, False)):
            turns = [[tg.ToolCall("read_file", _small(base + t * CALLS_PER_TURN + i)) for i in range(CALLS_PER_TURN)]
                     for t in range(TURNS_PER_BATCH)]
            samples[read_token].append(_batch(guard, turns, read_token))
    return {read: statistics.median(s) for read, s in samples.items()}


def per_turn(chunks: int, per_chunk: int = 100) -> dict[str, float]:
    """µs (median over chunks of ``per_chunk`` turns) to open and end a turn, to make its token, to
    report the token on another guard, and to report a turn id at home."""
    origin, elsewhere = _guard(), _guard()
    samples: dict[str, list[float]] = {"turn": [], "token": [], "by_token": [], "by_id": []}

    def timed(name: str, work: Any) -> Any:
        start = time.process_time()
        done = work()
        samples[name].append((time.process_time() - start) / per_chunk * 1e6)
        return done

    for _ in range(chunks):
        ended = timed("turn", lambda: [_ended(origin) for _ in range(per_chunk)])
        tokens = timed("token", lambda: [t.result_token for t in ended])  # noqa: B023 - called at once
        taken = timed("by_token", lambda: sum(elsewhere.report_result(token, True) for token in tokens))  # noqa: B023
        at_home = timed("by_id", lambda: sum(origin.report_result(t.turn_id, True) for t in ended))  # noqa: B023
        assert taken == at_home == per_chunk
    return {name: statistics.median(values) for name, values in samples.items()}


def _ended(guard: tg.Guard) -> tg.Turn:
    with guard.turn(agent_name="coder") as turn:
        pass
    return turn


def run(quick: bool = False) -> list[dict[str, Any]]:
    medians = per_call(6 if quick else 40)
    base, value = medians[False] * 1e6, medians[True] * 1e6
    rows: list[dict[str, Any]] = [
        {"benchmark": "results", "case": "check_call + record_outcome, 50-call turns, no token read",
         "value": base, "unit": "us/call"},
        {"benchmark": "results", "case": "check_call + record_outcome, 50-call turns, each turn's token read",
         "value": value, "unit": "us/call", "floor": base, "ratio": value / base,
         "target": f"< {TARGET_RATIO:g}x without (no per-call cost)", "met": value / base < TARGET_RATIO},
    ]
    costs = per_turn(20 if quick else 100)
    rows.append({"benchmark": "results", "case": "turn.result_token, once per ended turn (when read)",
                 "value": costs["token"], "unit": "us/turn", "floor": costs["turn"],
                 "ratio": costs["token"] / costs["turn"],
                 "note": f"floor: opening and ending the turn; {costs['token'] / CALLS_PER_TURN:.3f} us per call "
                         f"of a {CALLS_PER_TURN}-call turn"})
    rows.append({"benchmark": "results", "case": "report_result(token) on another guard",
                 "value": costs["by_token"], "unit": "us/report", "floor": costs["by_id"],
                 "ratio": costs["by_token"] / costs["by_id"],
                 "note": "floor: report_result(turn id) on the turn's own guard"})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick)
    print(format_rows(rows))
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
