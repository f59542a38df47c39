"""Benchmark: ``turnguard calibrate``'s peak memory on hostile inputs, against ``--max-line-bytes``.

    .venv/bin/python benchmarks/bench_calibrate_memory.py [--max-line-bytes N] [--keep DIR]
    .venv/bin/python benchmarks/run.py calibrate_memory [--quick]

Each input attacks one bound (``turnguard._calibrate.bounds``); each runs the real command in a
fresh process (``--jobs 1``, the default grid) and its peak resident memory (``wait4``'s
``ru_maxrss``) is compared with the same command's on a one-line input, the floor. The target:
at most 8 x ``--max-line-bytes`` above it on every input (``bounds.MEMORY_FACTOR``). With
``--jobs N`` each worker is a process of its own holding what one process holds here. ``--quick``
uses a 4 MiB limit (every input scales with it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MIB = 1 << 20
DEFAULT_LIMIT = 32 * MIB
FACTOR = 8
LINE = {"id": "x", "calls": [{"tool": "a", "args": "b", "outcome": "ok"}]}


def _small(path: Path, limit: int) -> None:
    path.write_text(json.dumps(LINE) + "\n")


def _deep(path: Path, limit: int) -> None:
    """One line just under the limit of calls whose arguments nest 200 deep (the audit's case:
    70,000 of them in 29.5 MB parsed to 1.46 GB)."""
    call = '{"tool":"t","args":' + "[" * 200 + "1" + "]" * 200 + ',"outcome":"ok"}'
    n = (limit - 100) // (len(call) + 1)
    path.write_text('{"id":"deep","calls":[' + ",".join([call] * n) + "]}\n")


def _wide(path: Path, limit: int) -> None:
    """One turn of as many calls as the limit allows (``Bounds.turn_calls``), parsed and replayed."""
    n = limit // 256
    calls = ",".join(f'{{"tool":"a","args":"{i % 7}","outcome":"ok"}}' for i in range(n))
    path.write_text('{"id":"wide","calls":[' + calls + "]}\n")


def _long_ids(path: Path, limit: int) -> None:
    """Late results whose ids are half the limit long, gzipped (the audit's case: 16 MB ids, a
    1.25 MB gzip that grew to 1.34 GB)."""
    with gzip.open(path, "wt", compresslevel=6) as f:
        big = "r" * (limit // 2)
        for i in range(40):
            f.write(json.dumps({"result_for": f"{big}{i}", "resolved": True}) + "\n")
        f.write(json.dumps(LINE) + "\n")


def _many_results(path: Path, limit: int) -> None:
    """More late results than are kept (``Bounds.late_results``), each id 256 characters."""
    with path.open("w") as f:
        for i in range(limit // 64 + 1000):
            f.write(f'{{"result_for":"{f"{i:08d}" * 32}","resolved":true}}\n')
        f.write(json.dumps(LINE) + "\n")


def _orphans(path: Path, limit: int) -> None:
    """Tool spans whose turn spans never come, past the waiting bound, with 256-character tool
    names and digests."""
    def attr(k: str, v: object) -> dict:
        return {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}

    with path.open("w") as f:
        for start in range(0, limit // 512 + 4000, 2000):
            spans = [{"spanId": f"{start + i:016x}", "parentSpanId": f"p{start + i:015x}", "name": "execute_tool t",
                      "attributes": [attr("gen_ai.tool.name", f"t{start + i:07d}" * 32),
                                     attr("turnguard.call.index", 1),
                                     attr("turnguard.call.key_digest", f"d{start + i:07d}" * 32),
                                     attr("turnguard.call.outcome", "ok")]} for i in range(2000)]
            f.write(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")


def _distinct_halts(path: Path, limit: int) -> None:
    """Turns of 500 lengths up to 1,500, each stuck at its end with a 256-character id: every
    policy halts each at a call of its own (the halt-call histograms, the ids kept)."""
    with path.open("w") as f:
        for n in range(1, 1501, 3):
            calls = [{"tool": "r", "args": f"f{i}", "outcome": "ok"} for i in range(n)]
            calls += [{"tool": "mvn", "args": "mvn test", "outcome": "error"}] * 12
            f.write(json.dumps({"id": f"{n:08d}" * 32, "calls": calls, "resolved": n % 2 == 0,
                                "ended_by": "completed"}) + "\n")


CASES: dict[str, tuple[str, Callable[[Path, int], None]]] = {
    "deep": ("a line of calls with 200-deep arguments, just under the limit", _deep),
    "wide": ("a turn of limit/256 calls (the per-turn bound)", _wide),
    "long_ids": ("gzipped late results with ids of half the limit", _long_ids),
    "many_results": ("limit/64 + 1,000 late results, 256-character ids", _many_results),
    "orphans": ("limit/512 + 4,000 tool spans without turn spans, 256-character names", _orphans),
    "distinct_halts": ("turns of 500 lengths to 1,500, halted, 256-character ids", _distinct_halts),
}


def peak_rss(path: Path, limit: int) -> tuple[int, float]:
    """Peak resident bytes of ``turnguard calibrate PATH`` in a process of its own, and its seconds."""
    command = [sys.executable, "-m", "turnguard._cli", "calibrate", str(path), "--jobs", "1", "--progress", "never",
               "--max-line-bytes", str(limit), "--json", os.devnull]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss * 1024, time.perf_counter() - started


def measure(folder: Path, limit: int, names: list[str] | None = None) -> list[dict]:
    small = folder / "small.jsonl"
    _small(small, limit)
    floor, _ = peak_rss(small, limit)
    rows = []
    for name in names or list(CASES):
        what, make = CASES[name]
        path = folder / (name + (".jsonl.gz" if name == "long_ids" else ".jsonl"))
        if not path.exists():
            make(path, limit)
        peak, seconds = peak_rss(path, limit)
        above = max(0, peak - floor)
        rows.append({"benchmark": "calibrate_memory", "case": f"{name}: {what}", "value": above / MIB, "unit": "MiB",
                     "floor": floor / MIB, "ratio": above / limit, "target": f"<= {FACTOR} x --max-line-bytes above "
                     "the floor", "met": above <= FACTOR * limit,
                     "note": f"{name}: peak {peak / MIB:,.0f} MiB, floor {floor / MIB:,.0f} MiB, input "
                             f"{path.stat().st_size / MIB:,.1f} MiB, {seconds:.1f} s, --max-line-bytes "
                             f"{limit / MIB:g} MiB; ratio = MiB above the floor / --max-line-bytes"})
    return rows


def run(quick: bool = False) -> list[dict]:
    """Rows for ``benchmarks/run.py``."""
    limit = 4 * MIB if quick else DEFAULT_LIMIT
    with tempfile.TemporaryDirectory(prefix="turnguard-memory-") as folder:
        return measure(Path(folder), limit)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-line-bytes", type=int, default=DEFAULT_LIMIT)
    p.add_argument("--keep", metavar="DIR", help="write the inputs here (and reuse them if present)")
    p.add_argument("cases", nargs="*", choices=[*CASES, []], help="cases to run (default: all)")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        rows = measure(Path(args.keep), args.max_line_bytes, args.cases or None)
    else:
        with tempfile.TemporaryDirectory(prefix="turnguard-memory-") as folder:
            rows = measure(Path(folder), args.max_line_bytes, args.cases or None)
    for r in rows:
        print(f"{r['case']}: {r['value']:,.1f} MiB above the floor ({r['ratio']:.2f} x the limit; "
              f"{'meets' if r['met'] else 'BREAKS'} <= {FACTOR}x); {r['note']}")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
