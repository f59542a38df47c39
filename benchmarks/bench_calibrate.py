"""Benchmark: ``turnguard calibrate`` on a generated corpus of 1,000,000 tool calls.

    .venv/bin/python benchmarks/bench_calibrate.py [--calls 1000000] [--jobs 2] [--keep FILE]
    .venv/bin/python benchmarks/bench_calibrate.py --otlp DIR [--repeat 3]   # the OTLP row only
    .venv/bin/python benchmarks/bench_calibrate.py --otlp DIR --workers      # where workers' time goes
    .venv/bin/python benchmarks/run.py calibrate [--quick]

Writes a corpus-format JSONL file of generated turns (``tools/synthetic.py``: short
healthy turns, long productive turns past the soft caps, stuck turns with runs of identical
failing calls, runaway turns that vary their arguments for thousands of calls), runs the real
command on it in a subprocess with a grid of at least 50 policies, and reports tool calls of input
per second of wall time, all policies replayed, with the CPU seconds beside (the machine is
shared: wall time depends on what else runs). The target is 200,000 calls/s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from synthetic import write_corpus, write_otlp

GRID_FLAGS = ["--soft-caps", "20,50,100,200", "--multipliers", "2,3,5,10,20", "--stuck-repeats", "3,6,10"]
TARGET = 200_000
OTLP_TARGET = 160_000
"""The Collector's OTLP JSON with ``--jobs 2`` on a 2-core machine, file in the page cache."""


def measure(path: str, jobs: int) -> dict:
    """Run the command on ``path``; wall and CPU seconds, and what the run reports."""
    out = path + ".result.json"
    command = [sys.executable, "-m", "turnguard._cli", "calibrate", path, *GRID_FLAGS, "--jobs", str(jobs),
               "--progress", "never", "--json", out]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
    finally:
        os.unlink(out)
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "calls": result["calls"], "turns": result["turns"], "policies": len(result["policies"]),
            "replays": result["replays"]}


def run(quick: bool = False) -> list[dict]:
    """Rows for ``benchmarks/run.py``."""
    calls = 100_000 if quick else 1_000_000
    jobs = os.cpu_count() or 1
    fd, path = tempfile.mkstemp(suffix=".jsonl", prefix="turnguard-bench-")
    os.close(fd)
    try:
        write_corpus(path, max_calls=calls)
        m = measure(path, jobs)
    finally:
        os.unlink(path)
    rate = m["calls"] / m["wall"]
    return [otlp_row(quick), {
        "benchmark": "calibrate",
        "case": f"{m['calls']:,} calls, {m['policies']} policies, --jobs {jobs}",
        "value": rate, "unit": "calls/s", "target": f">= {TARGET:,} calls/s", "met": rate >= TARGET,
        "note": (f"{m['wall']:.1f} s wall, {m['cpu']:.1f} s CPU ({m['calls'] / m['cpu']:,.0f} calls per CPU "
                 f"second), {m['replays']:,} replays after grouping; command: turnguard calibrate FILE "
                 f"{' '.join(GRID_FLAGS)} --jobs {jobs}"),
    }]


def otlp_row(quick: bool = False, folder: str | None = None) -> dict:
    """The same grid over the Collector's file exporter output of generated turns: a rotated set
    (100 MB backups and the live file; ``--quick``: one small file) read as one
    stream from its directory, after a first read puts it in the page cache; ``folder``: keep the
    set there (made when absent)."""
    calls = 50_000 if quick else 500_000
    with tempfile.TemporaryDirectory(prefix="turnguard-bench-otlp-") as scratch:
        where = folder or scratch
        files = sorted(str(p) for p in Path(where).glob("otlp*.jsonl"))
        if not files:
            files = write_otlp(where, max_calls=calls)[2]
        return _otlp_measured(where, files)


def _otlp_measured(folder: str, files: list[str], jobs: int = 2) -> dict:
    size = sum(os.path.getsize(f) for f in files)
    for f in files:  # into the page cache
        with open(f, "rb") as handle:
            while handle.read(1 << 24):
                pass
    load = os.getloadavg()[0]
    m = measure(folder, jobs)
    floor_wall = decode_only(files, jobs)
    rate = m["calls"] / m["wall"]
    floor = m["calls"] / floor_wall
    return {
        "benchmark": "calibrate", "case": f"OTLP JSON, {len(files)} files, {size / 1e6:,.0f} MB, {m['calls']:,} calls, "
                                          f"--jobs {jobs}",
        "value": rate, "unit": "calls/s", "floor": floor, "ratio": rate / floor,
        "target": f">= {OTLP_TARGET:,} calls/s", "met": rate >= OTLP_TARGET,
        "note": (f"OTLP: {m['wall']:.1f} s wall, {m['cpu']:.1f} s CPU ({m['calls'] / m['cpu']:,.0f} calls per CPU "
                 f"second), load average before {load:.2f}, after {os.getloadavg()[0]:.2f}; floor: the files' lines "
                 f"only decoded (msgspec, the fields calibrate reads), {jobs} processes, {floor_wall:.1f} s wall; "
                 f"command: turnguard calibrate DIR {' '.join(GRID_FLAGS)} --jobs {jobs}"),
    }


def _decode_lines(task: tuple[str, int, int]) -> int:
    """Decode the lines that start in bytes ``start..end-1`` of a file; their count."""
    from turnguard._calibrate import collector

    path, start, end = task
    decode = collector.decode
    n = 0
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            f.readline()
        while f.tell() < end and (line := f.readline()):
            decode(line)
            n += 1
    return n


def decode_only(files: list[str], jobs: int, range_bytes: int = 8 << 20) -> float:
    """The floor of the OTLP row: wall seconds for ``jobs`` processes to only decode the files'
    span lines as calibrate does (the least any reading of them costs here), no assembly or
    replay, so the row's ratio says how much of the rest is calibrate's own work."""
    import multiprocessing

    tasks = [(f, start, start + range_bytes) for f in files for start in range(0, os.path.getsize(f), range_bytes)]
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        pool.map(_decode_lines, tasks, chunksize=1)
    return time.perf_counter() - started


PHASES = ("scan_range", "read_range", "_replayed")
"""What a worker does (``_calibrate/parallel.py``): pass 1 on a range, pass 2's reading, a replay."""


def worker_times(folder: str, jobs: int = 2) -> dict[str, Any]:
    """Where each worker's time goes in one run of the OTLP row's command on ``folder``: the seconds
    in each phase (``PHASES``), waiting, and when it ended, from wrappers of the phase functions in
    this process (the workers are forked from it, so they run the wrappers)."""
    import contextlib
    import io

    from turnguard._calibrate import parallel
    from turnguard._cli import main as cli

    with tempfile.TemporaryDirectory(prefix="turnguard-bench-workers-") as logs:
        started = time.perf_counter()
        originals = {name: getattr(parallel, name) for name in PHASES}

        def timed(name: str, f: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                t = time.perf_counter()
                try:
                    return f(*args, **kwargs)
                finally:
                    with open(os.path.join(logs, str(os.getpid())), "a", encoding="utf-8") as log:
                        log.write(f"{name} {t - started} {time.perf_counter() - started}\n")
            return run

        for name, f in originals.items():
            setattr(parallel, name, timed(name, f))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                cli(["calibrate", folder, *GRID_FLAGS, "--jobs", str(jobs), "--progress", "never"])
        finally:
            for name, f in originals.items():
                setattr(parallel, name, f)
        wall = time.perf_counter() - started
        workers = []
        for log in sorted(os.listdir(logs)):
            with open(os.path.join(logs, log), encoding="utf-8") as f:
                rows = sorted((float(a), float(b), n) for n, a, b in (line.split() for line in f))
            phases = {name: sum(b - a for a, b, n in rows if n == name) for name in PHASES}
            workers.append({**phases, "waiting": rows[-1][1] - rows[0][0] - sum(phases.values()),
                            "first": rows[0][0], "last": rows[-1][1]})
    return {"wall": wall, "workers": workers}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=1, help="measure this many times; report the median and range")
    p.add_argument("--keep", metavar="FILE", help="write the generated corpus here (and reuse it if present)")
    p.add_argument("--otlp", metavar="DIR", help="measure the OTLP row instead, on the Collector set kept in DIR "
                                                 "(written there when DIR holds none)")
    p.add_argument("--workers", action="store_true", help="with --otlp: where each worker's time goes instead")
    args = p.parse_args()
    if args.otlp and args.workers:
        for _ in range(args.repeat):
            found = worker_times(args.otlp)
            print(f"{found['wall']:.2f} s in all (imports before it not counted); per worker: " + "; ".join(
                f"start {w['first']:.2f} s, " + ", ".join(f"{n.strip('_')} {w[n]:.2f} s" for n in PHASES)
                + f", waiting {w['waiting']:.2f} s, end {w['last']:.2f} s" for w in found["workers"]))
        return 0
    if args.otlp:
        os.makedirs(args.otlp, exist_ok=True)
        for _ in range(args.repeat):
            row = otlp_row(folder=args.otlp)
            print(f"{row['case']}: {row['value']:,.0f} calls/s, floor {row['floor']:,.0f} calls/s "
                  f"({row['ratio']:.2f}x); {row['note']}")
        return 0
    if args.keep:
        path = args.keep
    else:
        fd, path = tempfile.mkstemp(suffix=".jsonl", prefix="turnguard-bench-")
        os.close(fd)
    try:
        if not (args.keep and os.path.exists(path)):
            started = time.perf_counter()
            turns, calls = write_corpus(path, max_calls=args.calls)
            print(f"generated {turns:,} turns, {calls:,} calls in {time.perf_counter() - started:.1f}s -> {path}")
        print(f"command: turnguard calibrate {os.path.basename(path)} {' '.join(GRID_FLAGS)} --jobs {args.jobs}")
        rates = []
        for _ in range(args.repeat):
            load = os.getloadavg()[0]
            m = measure(path, args.jobs)
            rate = m["calls"] / m["wall"]
            rates.append(rate)
            print(f"{m['calls']:,} calls, {m['turns']:,} turns, {m['policies']} policies, {m['replays']:,} replays "
                  f"after grouping: {m['wall']:.2f} s wall = {rate:,.0f} calls/s "
                  f"({'meets' if rate >= TARGET else 'below'} the {TARGET:,} target); {m['cpu']:.2f} s CPU = "
                  f"{m['calls'] / m['cpu']:,.0f} calls per CPU second; load average before: {load:.2f}")
        if args.repeat > 1:
            print(f"median {statistics.median(rates):,.0f} calls/s, range {min(rates):,.0f}-{max(rates):,.0f} "
                  f"over {len(rates)} runs")
        return 0
    finally:
        if not args.keep:
            os.unlink(path)


if __name__ == "__main__":
    raise SystemExit(main())
