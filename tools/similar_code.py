"""The duplicates gate of ``./dev.sh lint``: pylint's similarity checker (``symilar``) over ``src/``.

    python tools/similar_code.py [--max N] [PATH ...]     (default: src/, at most MAX_PAIRS)

A pair is two places that share at least ``MIN_LINES`` lines, the same to the letter once comments,
docstrings and imports are left out (pylint's ``duplicate-code`` check, run on its own). The exit
status is 1 when there are more pairs than allowed; each pair is listed, so a change that copied
code is told where. pylint (the dev extra) is the tool because it is kept, on PyPI, and its
``symilar`` reads source as lines: fast, and the same on every machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_LINES = 4
MAX_PAIRS = 0
"""Today's count (2026-12-06): 0 pairs, so every run of 4 identical lines a change copies fails the gate.
Issue 32's target is at most 8 pairs as its review counts them (runs of 6 or more identical or same-shape
lines: 8 pairs on 2026-12-07, down from 28, 4 of them the hot path's inlined copies that
docs/architecture.md names); symilar sees identical lines only. Never raise it."""

HEADER = re.compile(r"^(\d+) similar lines in (\d+) files$")
PLACE = re.compile(r"^==(.+):\[(\d+):(\d+)\]$")


@dataclass(frozen=True)
class Pair:
    lines: int
    first: str
    second: str

    def __str__(self) -> str:
        return f"{self.first} ~ {self.second} ({self.lines} lines)"


def pairs_in(report: str) -> list[Pair]:
    """The pairs in symilar's report: a block of ``N similar lines in M files`` names M places,
    which make M * (M - 1) / 2 pairs."""
    found: list[Pair] = []
    lines, places = 0, []
    for line in [*report.splitlines(), ""]:
        header, place = HEADER.match(line), PLACE.match(line)
        if header or (not place and places):
            found += [Pair(lines, a, b) for i, a in enumerate(places) for b in places[i + 1:]]
            places = []
        if header:
            lines = int(header.group(1))
        elif place:
            path, start, end = place.groups()
            places.append(f"{path}:{int(start) + 1}-{end}")
    return found


def symilar_report(paths: list[Path]) -> str:
    from pylint import run_symilar

    files = sorted(os.path.relpath(p) for path in paths for p in ([path] if path.is_file() else path.rglob("*.py")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        run_symilar(["-d", str(MIN_LINES), "-i", "--ignore-docstrings", "--ignore-imports", *files])
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fail when the source repeats itself more than it does today.")
    parser.add_argument("paths", nargs="*", type=Path, help="files or directories (default: src/)")
    parser.add_argument("--max", type=int, default=MAX_PAIRS, help=f"pairs allowed (default {MAX_PAIRS})")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"similar_code.py: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    found = pairs_in(symilar_report(args.paths or [ROOT / "src"]))
    for pair in found:
        print(pair)
    verdict = "more than" if len(found) > args.max else "within"
    print(f"duplicates: {len(found)} pairs sharing {MIN_LINES}+ lines (pylint symilar), {verdict} the {args.max} "
          "allowed (tools/similar_code.py MAX_PAIRS)")
    if len(found) < args.max:
        print(f"duplicates: fewer than allowed: lower MAX_PAIRS to {len(found)}")
    return 1 if len(found) > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
