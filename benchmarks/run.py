"""Run turnguard's benchmarks and print their figures: ``./dev.sh bench`` (= this script).

    python benchmarks/run.py [NAME ...] [--quick] [--json]

How to add a benchmark: put a module ``benchmarks/bench_<name>.py`` next to this file with a
function ``run(quick: bool = False) -> list[dict]``. This script imports every ``bench_*.py``
(or only the NAMEs given, e.g. ``core``), calls ``run`` and prints the rows together. A row is a
dict with these keys (the last five optional):

    benchmark  str    the module's short name, e.g. "core"
    case       str    what was measured, e.g. "check_call + record_outcome, small dict"
    value      float  the figure
    unit       str    e.g. "us/call", "MiB"
    floor      float  a reference measured in the same run, in the same unit
    ratio      float  value / floor
    target     str    the target, in words
    met        bool   whether the target was met
    note       str    anything else

A module without ``run`` is listed as skipped (run it directly). ``--quick`` asks every module
for a shorter run. The exit status is 1 when a row's target is not met, or a module failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def discover(names: list[str]) -> list[str]:
    found = sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    if not names:
        return found
    unknown = [n for n in names if n not in found]
    if unknown:
        raise SystemExit(f"run.py: no benchmark module for {unknown}; found {found}")
    return names


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = ("benchmark", "case", "value", "floor", "ratio", "target", "met")
    table = [header]
    for r in rows:
        unit = r.get("unit", "")
        floor = f"{r['floor']:.3g} {unit}" if "floor" in r else ""
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
        met = "" if "met" not in r else ("yes" if r["met"] else "NO")
        table.append((r["benchmark"], r["case"], f"{r['value']:.3g} {unit}", floor, ratio, r.get("target", ""), met))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r['benchmark']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run turnguard's benchmarks.")
    parser.add_argument("names", nargs="*", metavar="NAME", help="bench_NAME.py modules to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    rows: list[dict[str, Any]] = []
    failed = False
    for name in discover(args.names):
        module = importlib.import_module(f"bench_{name}")
        if not callable(getattr(module, "run", None)):
            print(f"run.py: bench_{name}.py has no run(); skipped (run it directly)", file=sys.stderr)
            continue
        started = time.perf_counter()
        try:
            produced = module.run(quick=args.quick)
        except Exception:  # one broken module must not hide the others' figures
            traceback.print_exc()
            failed = True
            continue
        print(f"run.py: bench_{name} took {time.perf_counter() - started:.1f} s", file=sys.stderr)
        rows.extend(produced)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(format_rows(rows))
    return 1 if failed or any(r.get("met") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
