"""Benchmark: ``turnguard calibrate`` on a generated corpus of 1,000,000 tool calls.

    .venv/bin/python benchmarks/bench_calibrate.py [--calls 1000000] [--jobs 2] [--keep FILE]

Writes a corpus-format JSONL file of generated turns (a seeded mix: short healthy turns, long
productive turns past the soft caps, stuck turns with runs of identical failing calls, and
runaway turns that vary their arguments forever), runs the real command on it with a grid of at
least 50 policies, and prints the figure: tool calls of input per second, all policies replayed.
The target is 200,000 calls/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from turnguard.calibrate.synthetic import write_corpus

GRID_FLAGS = ["--soft-caps", "20,50,100,200", "--multipliers", "2,3,5,10,20", "--stuck-repeats", "3,6,10"]
TARGET = 200_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--keep", metavar="FILE", help="write the generated corpus here (and reuse it if present)")
    args = p.parse_args()
    path = args.keep or tempfile.mkstemp(suffix=".jsonl", prefix="turnguard-bench-")[1]
    try:
        if not (args.keep and os.path.exists(path)):
            t = time.perf_counter()
            turns, calls = write_corpus(path, max_calls=args.calls)
            print(f"generated {turns:,} turns, {calls:,} calls in {time.perf_counter() - t:.1f}s -> {path}")
        with open(path, encoding="utf-8") as f:
            calls = sum(len(json.loads(line)["calls"]) for line in f)
        out = path + ".json"
        command = [sys.executable, "-m", "turnguard.cli", "calibrate", path, *GRID_FLAGS, "--jobs", str(args.jobs),
                   "--progress", "never", "--json", out]
        t = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        elapsed = time.perf_counter() - t
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
        os.unlink(out)
        policies = len(result["policies"])
        rate = calls / elapsed
        print(f"command: turnguard calibrate {os.path.basename(path)} {' '.join(GRID_FLAGS)} --jobs {args.jobs}")
        print(f"{calls:,} calls, {result['turns']:,} turns, {policies} policies, {result['replays']:,} replays run "
              f"after grouping: {elapsed:.2f}s wall = {rate:,.0f} calls/s "
              f"({'meets' if rate >= TARGET else 'below'} the {TARGET:,} target)")
        return 0
    finally:
        if not args.keep:
            os.unlink(path)


if __name__ == "__main__":
    raise SystemExit(main())
