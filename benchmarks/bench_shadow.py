"""Benchmark: what shadow policies add to the hot path (``check_call`` + ``record_outcome``).

    .venv/bin/python benchmarks/bench_shadow.py [--quick]      (or via benchmarks/run.py)

The per-call cost (CPU time, median over interleaved batches, each in a new turn of 1,000
distinct small calls) of the default guard with telemetry off (``otel`` and ``recorder``
disabled) and 0, 1 or 3 shadow policies (a tighter cap, the ``stale_repeat`` signal, the
``streak_stop_on="any"`` streak). The live guard reads each call's key once; a shadow with the
same key mode reuses it, so a shadow adds a ledger update and its policy functions, not keying.
Target: 3 shadow policies cost less than twice the guard without shadows (< 2x). Two more rows
show the same with the OpenTelemetry plugin on (the API's no-op providers: no SDK configured),
the cheapest telemetry a deployment has.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import turnguard as tg
from bench_core import _small, guard_batch
from turnguard._plugins import NON_POLICY_PLUGINS

TELEMETRY_OFF = tuple(p for p in NON_POLICY_PLUGINS if p != "shadow")
SHADOWS = (
    ("tight", {"soft_cap": 200, "hard_multiplier": 5}),
    ("stale", {"stuck_signal": "stale_repeat"}),
    ("any-streak", {"streak_stop_on": "any"}),
)
TARGET_RATIO = 2.0


def _guard(shadows: int, telemetry: bool = False) -> tg.Guard:
    disabled = ("recorder",) if telemetry else TELEMETRY_OFF
    config = tg.GuardConfig(disable_plugins=disabled, load_entrypoints=False, shadow=SHADOWS[:shadows])
    return tg.Guard(config, environ={})


def per_call(batches: int, per_batch: int = 1000, telemetry: bool = False) -> dict[int, float]:
    """Median seconds per call with 0, 1 and 3 shadows, batches interleaved on the same calls."""
    guards = {n: _guard(n, telemetry) for n in ((0, 3) if telemetry else (0, 1, 3))}
    samples: dict[int, list[float]] = {n: [] for n in guards}
    for b in range(batches):
        args = [_small(b * per_batch + i) for i in range(per_batch)]
        for n, guard in guards.items():
            calls = [tg.ToolCall("read_file", a) for a in args]  # fresh objects: no cached key
            samples[n].append(guard_batch(guard, calls))
    return {n: statistics.median(s) for n, s in samples.items()}


def run(quick: bool = False) -> list[dict[str, Any]]:
    medians = per_call(8 if quick else 40)
    base = medians[0] * 1e6
    rows: list[dict[str, Any]] = [{
        "benchmark": "shadow", "case": "check_call + record_outcome, 0 shadow policies", "value": base,
        "unit": "us/call",
    }]
    for n in (1, 3):
        value = medians[n] * 1e6
        rows.append({
            "benchmark": "shadow", "case": f"check_call + record_outcome, {n} shadow polic{'y' if n == 1 else 'ies'}",
            "value": value, "unit": "us/call", "floor": base, "ratio": value / base,
            "target": f"< {TARGET_RATIO:g}x without shadows" if n == 3 else "",
            **({"met": value / base < TARGET_RATIO} if n == 3 else {}),
        })
    with_otel = per_call(4 if quick else 20, telemetry=True)
    base = with_otel[0] * 1e6
    rows.append({"benchmark": "shadow", "case": "with the otel plugin (no-op providers), 0 shadow policies",
                 "value": base, "unit": "us/call"})
    value = with_otel[3] * 1e6
    rows.append({"benchmark": "shadow", "case": "with the otel plugin (no-op providers), 3 shadow policies",
                 "value": value, "unit": "us/call", "floor": base, "ratio": value / base})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches")
    args = parser.parse_args()
    for row in run(quick=args.quick):
        ratio = f"  ({row['ratio']:.2f}x)" if "ratio" in row else ""
        print(f"{row['case']}: {row['value']:.3g} {row['unit']}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
