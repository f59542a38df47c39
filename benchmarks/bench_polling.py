"""Benchmark: what results cost (``record_outcome(..., result=)``, ``stateful_tools``).

    .venv/bin/python benchmarks/bench_polling.py [--quick]      (or via benchmarks/run.py polling)

CPU time per call of ``check_call`` + ``record_outcome`` (telemetry off; median over interleaved
batches of 20 turns of 50 shell-command calls, so machine load affects every variant alike):

- a turn naming no stateful tools, each outcome reported with a 4 KB result, against the same
  turns reported without one: the result is not looked at (target: within 5%, no cost);
- a ``stateful_tools`` tool's calls, each with a 4 KB result (a log tail that changes), against
  the same calls without a result: the extra cost, against one keying of that result with the
  guard's own keyer (``Keyer.digest``), measured in the same run: the result is keyed once and only
  its digest kept (target: at most 1.5x one keying);
- for the record: the other tools' calls in a turn that names a stateful tool (every outcome there
  takes the slower path that looks for a result), against a turn naming none.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import turnguard as tg
from bench_core import _shell
from run import format_rows
from turnguard._plugins import NON_POLICY_PLUGINS

CALLS_PER_TURN = 50
TURNS_PER_BATCH = 20
RESULT_BYTES = 4096
TARGET_NO_COST = 1.05
TARGET_KEYINGS = 1.5


def _guard(**options: Any) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, load_entrypoints=False, streak_warn_at=0,
                                   streak_stop_at=0, soft_cap=0, **options), environ={})


def _result(i: int) -> str:
    """A 4 KB log tail, different every time (so no stuck signal and no streak)."""
    line = f"[{i:08d}] step {i}: compiling module_{i % 97}.py ... ok\n"
    return (line * (RESULT_BYTES // len(line) + 1))[:RESULT_BYTES]


def _turns(tool: str, batch: int) -> list[list[tuple[tg.ToolCall, str]]]:
    first = batch * TURNS_PER_BATCH * CALLS_PER_TURN
    return [[(tg.ToolCall(tool, _shell(first + t * CALLS_PER_TURN + i)), _result(first + t * CALLS_PER_TURN + i))
             for i in range(CALLS_PER_TURN)] for t in range(TURNS_PER_BATCH)]


def _batch(guard: tg.Guard, turns: list[list[tuple[tg.ToolCall, str]]], with_result: bool) -> float:
    ok, spent = tg.Outcome.OK, 0.0
    for calls in turns:
        turn = guard.turn()
        check, record = turn.check_call, turn.record_outcome
        start = time.process_time()
        if with_result:
            for call, result in calls:
                check(call)
                record(call, ok, result)
        else:
            for call, _ in calls:
                check(call)
                record(call, ok)
        spent += time.process_time() - start
        turn.end()
        assert turn.halted is None
    return spent / (len(turns) * CALLS_PER_TURN)


def _keying(guard: tg.Guard, turns: list[list[tuple[tg.ToolCall, str]]]) -> float:
    digest = guard.keyer.digest
    start = time.process_time()
    for calls in turns:
        for call, result in calls:
            digest(call.name, result)
    return (time.process_time() - start) / (len(turns) * CALLS_PER_TURN)


def measure(batches: int) -> dict[str, float]:
    plain, polling = _guard(), _guard(stateful_tools=("tail_log",))
    samples: dict[str, list[float]] = {name: [] for name in (
        "plain", "plain+result", "stateful", "stateful+result", "keying", "named-other")}
    for b in range(batches):
        other, polled = _turns("bash", b), _turns("tail_log", b)
        samples["plain"].append(_batch(plain, other, False))
        samples["plain+result"].append(_batch(plain, other, True))
        samples["stateful"].append(_batch(polling, polled, False))
        samples["stateful+result"].append(_batch(polling, polled, True))
        samples["keying"].append(_keying(polling, polled))
        samples["named-other"].append(_batch(polling, other, False))
    return {name: statistics.median(values) for name, values in samples.items()}


def run(quick: bool = False) -> list[dict[str, Any]]:
    m = measure(4 if quick else 15)
    us = 1e6
    no_cost = m["plain+result"] / m["plain"]
    extra = m["stateful+result"] - m["stateful"]
    return [
        {"benchmark": "polling", "case": "no stateful tools: record_outcome with a 4 KB result vs without",
         "value": m["plain+result"] * us, "unit": "us/call", "floor": m["plain"] * us, "ratio": no_cost,
         "target": f"<= {TARGET_NO_COST:g}x (no cost)", "met": no_cost <= TARGET_NO_COST},
        {"benchmark": "polling", "case": "a stateful tool's 4 KB result: extra cost vs one keying of it",
         "value": extra * us, "unit": "us/call", "floor": m["keying"] * us, "ratio": extra / m["keying"],
         "target": f"<= {TARGET_KEYINGS:g}x one keying", "met": extra <= TARGET_KEYINGS * m["keying"],
         "note": f"a stateful tool's call: {m['stateful'] * us:.3g} us without its result, "
                 f"{m['stateful+result'] * us:.3g} us with it"},
        {"benchmark": "polling", "case": "other tools' calls in a turn naming a stateful tool vs naming none",
         "value": m["named-other"] * us, "unit": "us/call", "floor": m["plain"] * us,
         "ratio": m["named-other"] / m["plain"]},
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick)
    print("\n".join(json.dumps(r) for r in rows) if args.json else format_rows(rows))
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
