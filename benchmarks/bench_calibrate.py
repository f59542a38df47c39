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
import random
import subprocess
import sys
import tempfile
import time

GRID_FLAGS = ["--soft-caps", "20,50,100,200", "--multipliers", "2,3,5,10,20", "--stuck-repeats", "3,6,10"]
TARGET = 200_000

SHELL_TOOLS = ("cat", "grep", "ls", "python", "sed", "find", "mvn", "git")
JSON_TOOLS = ("read_file", "search", "get_user_details", "list_dir", "edit_file", "run_tests")


def _args(rng: random.Random, tool: str, i: int) -> str:
    if tool in SHELL_TOOLS:
        return f"{tool} src/pkg{rng.randrange(50)}/module_{i}.py -n {rng.randrange(1000)}\n"
    return json.dumps({"path": f"src/pkg{rng.randrange(50)}/module_{i}.py", "offset": rng.randrange(0, 4000, 100),
                       "options": {"limit": 200, "follow": bool(i & 1)}})


def _tool(rng: random.Random, shell: bool) -> str:
    return rng.choice(SHELL_TOOLS if shell else JSON_TOOLS)


def generate_turn(rng: random.Random, n: int) -> dict:
    """One generated turn of the kind drawn for ``n`` (its index)."""
    shell = rng.random() < 0.5
    kind = rng.random()
    calls = []
    test_cmd = ("python", "python -m pytest tests/test_x.py -q\n") if shell else ("run_tests", '{"target": "all"}')
    if kind < 0.80:  # healthy: a short turn, re-running its tests between edits (never back to back)
        length = max(1, min(400, int(rng.lognormvariate(2.5, 0.9))))
        resolved = rng.random() < 0.5
        for i in range(length):
            if i % 7 == 6:
                calls.append((*test_cmd, "error" if rng.random() < 0.5 else "ok"))
            else:
                tool = _tool(rng, shell)
                calls.append((tool, _args(rng, tool, i), "error" if rng.random() < 0.1 else "ok"))
    elif kind < 0.90:  # long productive: past the soft caps, almost no repeats
        length = rng.randint(100, 1500)
        resolved = rng.random() < 0.6
        for i in range(length):
            tool = _tool(rng, shell)
            calls.append((tool, _args(rng, tool, i), "error" if rng.random() < 0.1 else "ok"))
    elif kind < 0.99:  # stuck: a healthy start, then one failing call repeated
        resolved = rng.random() < 0.05
        for i in range(rng.randint(3, 40)):
            tool = _tool(rng, shell)
            calls.append((tool, _args(rng, tool, i), "ok"))
        tool = _tool(rng, shell)
        stuck = (tool, _args(rng, tool, 9999))
        calls.extend((*stuck, "error") for _ in range(rng.randint(5, 80)))
    else:  # runaway: varies its arguments forever
        resolved = False
        for i in range(rng.randint(500, 3000)):
            tool = _tool(rng, shell)
            calls.append((tool, _args(rng, tool, i), "ok"))
    return {
        "source": "generated",
        "id": f"gen-{n}",
        "calls": [{"tool": t, "args": a, "outcome": o} for t, a, o in calls],
        "cycles": len(calls) + 1,
        "resolved": resolved,
        "ended_by": "generated",
    }


def generate(path: str, total_calls: int, seed: int = 7) -> tuple[int, int]:
    """Write turns until ``total_calls`` calls; returns (turns, calls)."""
    rng = random.Random(seed)
    turns = calls = 0
    with open(path, "w", encoding="utf-8") as f:
        while calls < total_calls:
            turn = generate_turn(rng, turns)
            turn["calls"] = turn["calls"][: total_calls - calls]
            if not turn["calls"]:
                break
            f.write(json.dumps(turn) + "\n")
            turns += 1
            calls += len(turn["calls"])
    return turns, calls


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
            turns, calls = generate(path, args.calls)
            print(f"generated {turns:,} turns, {calls:,} calls in {time.perf_counter() - t:.1f}s -> {path}")
        calls = sum(len(json.loads(line)["calls"]) for line in open(path, encoding="utf-8"))
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
