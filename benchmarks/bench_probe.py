"""Benchmark: what a probe cohort costs live turns per call, and what it costs in calls.

    .venv/bin/python benchmarks/bench_probe.py [--quick]      (or via benchmarks/run.py)

Per call: CPU time of ``check_call`` + ``record_outcome`` (median over interleaved batches, each
a new *live* turn of 1,000 distinct small calls; telemetry off) on a guard with
``probe=Probe(0.01, hard_multiplier=20)`` against the same guard without a probe, in the same
run. Sampling is one hash per turn, nothing per call. Target: within 5% (no measurable cost).
Per turn: opening and ending a turn, both guards (the hash, and for a probe turn nothing more).

In calls: a fleet of 10,000 turns of which 1% are runaways (distinct calls until a backstop),
the rest 40 calls, under S=100 x10 and a probe at x20: the probe lets each runaway it samples
run 1,000 calls further (to 2,000), so the extra calls are rate x runaways x 1,000.
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
from turnguard._probe import selects

TELEMETRY_OFF = tuple(p for p in NON_POLICY_PLUGINS if p != "shadow")
RATE = 0.01
TARGET_RATIO = 1.05


def _guard(probe: bool) -> tg.Guard:
    options: dict[str, Any] = {"disable_plugins": TELEMETRY_OFF, "load_entrypoints": False}
    if probe:
        options["probe"] = {"rate": RATE, "hard_multiplier": 20}
    return tg.Guard(tg.GuardConfig(**options), environ={})


def _live_ids(count: int) -> list[str]:
    """Turn ids the probe does not sample (the live turns whose cost is measured)."""
    ids = (f"bench-{i}" for i in range(10 * count))
    return [i for i in ids if not selects(RATE, None, i)][:count]


def _batch(guard: tg.Guard, turn_id: str, calls: list[tg.ToolCall]) -> float:
    turn = guard.turn(turn_id=turn_id)
    check, record, ok = turn.check_call, turn.record_outcome, tg.Outcome.OK
    start = time.process_time()
    for call in calls:
        check(call)
        record(call, ok)
    elapsed = time.process_time() - start
    turn.end()
    assert turn.summary.cohort == "live" and turn.halted is None
    return elapsed / len(calls)


def per_call(batches: int, per_batch: int = 1000) -> dict[bool, float]:
    guards = {False: _guard(False), True: _guard(True)}
    ids = _live_ids(batches)
    samples: dict[bool, list[float]] = {False: [], True: []}
    for b, turn_id in enumerate(ids):
        args = [_small(b * per_batch + i) for i in range(per_batch)]
        for probe, guard in guards.items():
            samples[probe].append(_batch(guard, turn_id, [tg.ToolCall("read_file", a) for a in args]))
    return {probe: statistics.median(s) for probe, s in samples.items()}


def per_turn(turns: int) -> dict[bool, float]:
    out = {}
    for probe in (False, True):
        guard = _guard(probe)
        start = time.process_time()
        for _ in range(turns):
            guard.turn().end()
        out[probe] = (time.process_time() - start) / turns
    return out


def fleet_calls(turns: int, probe: bool) -> tuple[int, int]:
    """(tool calls run, probe turns) for ``turns`` turns, 1% runaways, under the probe or not."""
    guard = _guard(probe)
    total = probed = 0
    for i in range(turns):
        turn = guard.turn(turn_id=f"fleet-{i}")
        n = 10_000 if i % 100 == 7 else 40
        for j in range(n):
            call = tg.ToolCall("read", {"i": j})
            if turn.check_call(call).halted:
                break
            turn.record_outcome(call, tg.Outcome.OK)
            total += 1
        turn.end()
        probed += turn.summary.cohort == "probe"
    return total, probed


def run(quick: bool = False) -> list[dict[str, Any]]:
    medians = per_call(10 if quick else 60)
    base, value = medians[False] * 1e6, medians[True] * 1e6
    rows: list[dict[str, Any]] = [
        {"benchmark": "probe", "case": "live turn, check_call + record_outcome, no probe", "value": base,
         "unit": "us/call"},
        {"benchmark": "probe", "case": f"live turn, check_call + record_outcome, probe at rate {RATE:g}",
         "value": value, "unit": "us/call", "floor": base, "ratio": value / base,
         "target": f"< {TARGET_RATIO:g}x without a probe", "met": value / base < TARGET_RATIO},
    ]
    turn_costs = per_turn(2000 if quick else 20000)
    rows.append({"benchmark": "probe", "case": f"open + end a turn, probe at rate {RATE:g}",
                 "value": turn_costs[True] * 1e6, "unit": "us/turn", "floor": turn_costs[False] * 1e6,
                 "ratio": turn_costs[True] / turn_costs[False]})
    turns = 2000 if quick else 10000
    without, _ = fleet_calls(turns, False)
    with_probe, probed = fleet_calls(turns, True)
    rows.append({"benchmark": "probe", "case": f"tool calls of {turns:,} turns (1% runaways), probe at rate {RATE:g}",
                 "value": with_probe, "unit": "calls", "floor": without, "ratio": with_probe / without,
                 "note": f"{probed} probe turns; {with_probe - without:,} extra calls"})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches")
    print(format_rows(run(quick=parser.parse_args().quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
