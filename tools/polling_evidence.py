"""Evidence for ``stateful_tools``: which tools may take a changed result as progress. The profiles
with no tool listed, with the polling tools listed (the default: only what the host names), and
with every tool (``"*"``), on the recorded corpus (its ``result`` digests) and on generated turns,
through ``turnguard calibrate``'s own engine (``engine.Calibrator``: the live ledger and policy
hooks, the recorded results replayed). Every figure is for unattended turns (halts).

    python tools/polling_evidence.py --write-polling-turns polling-turns.jsonl
    python tools/polling_evidence.py ../shared/corpus/*.jsonl polling-turns.jsonl

The generated turns (``polling_turns``, seeded), in turns of 30 to 300 calls with other work
around the polls:

- *progressing*: a status tool (``ci_status``) polled 12 to 80 times while its run moves (queued,
  running N%, passed: at most four answers alike in a row), resolved: every halt is a false halt;
- *constant*: a log (``tail_log``) polled 30 to 300 times with the same "no new output", unresolved:
  stuck, to be halted early;
- *noisy*: a failing command (``mvn -q test``) re-run 20 to 60 times whose output differs every time
  (a timestamp, a pid) while nothing changes, unresolved: stuck, to be halted early.

The listed variant names ``ci_status`` and ``tail_log`` (the tools that poll); the corpus has
neither, so there it equals the variant with none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import InputError, RecordedTurn, read_turns
from turnguard._config import GuardConfig
from turnguard._profiles import PROFILES

STUCK_RUN = 8
"""Consecutive identical calls that make an unresolved recorded run degenerate (as in stuck_evidence)."""
POLLING_TOOLS = ("ci_status", "tail_log")
LISTS: tuple[tuple[str, tuple[str, ...]], ...] = (("none listed", ()), ("polling tools listed", POLLING_TOOLS),
                                                  ("all tools (*)", ("*",)))
CLASSES = ("progressing", "constant", "noisy")


def variants() -> list[tuple[str, GuardConfig]]:
    """Each profile with each ``stateful_tools`` value."""
    return [(f"{profile}, {label}", PROFILES[profile].replace(stateful_tools=tools))
            for profile in ("seed", "recommended") for label, tools in LISTS]


# -- generated polling turns ---------------------------------------------------------------------


def _digest(text: str) -> str:
    """A result digest as the corpus records it: the first 16 bytes of BLAKE2b of the text, hex."""
    return hashlib.blake2b(text.encode()).hexdigest()[:32]


def _call(tool: str, args: str, outcome: str, result: str) -> dict[str, str]:
    return {"tool": tool, "args": args, "outcome": outcome, "result": _digest(result)}


def _work(rng: random.Random, n: int, tag: str) -> list[dict[str, str]]:
    """``n`` distinct calls of other work (reads and searches of different places)."""
    return [_call(t, f"{t} src/{tag}/part_{i}_{rng.randrange(10**6)}.py", "ok", f"{t} output {rng.random()}")
            for i, t in enumerate(rng.choice(("cat", "grep", "find", "ls")) for _ in range(n))]


def progressing(rng: random.Random, before: int, polls: int, after: int) -> dict[str, object]:
    """A healthy wait: the CI run moves between polls."""
    statuses = ["queued"] * rng.randint(1, 4)
    while len(statuses) < polls - 1:
        statuses += [f"running {len(statuses) * 100 // polls}%"] * rng.randint(1, 4)
    statuses = [*statuses[: polls - 1], "passed"]
    calls = _work(rng, before, "pre") + [_call("ci_status", '{"run": 42}', "ok", s) for s in statuses]
    calls += _work(rng, after, "post")
    return {"id": f"gen/progressing-{before}+{polls}+{after}", "calls": calls, "resolved": True}


def constant(rng: random.Random, before: int, polls: int) -> dict[str, object]:
    """A stuck wait: the log never changes."""
    calls = _work(rng, before, "log") + [_call("tail_log", "tail -n 20 build.log", "ok", "no new output")] * polls
    return {"id": f"gen/constant-{before}+{polls}", "calls": calls, "resolved": False}


def noisy(rng: random.Random, before: int, repeats: int) -> dict[str, object]:
    """A stuck re-run whose failure output differs every time (nothing else does)."""
    outputs = [f"[12:{i // 60:02d}:{i % 60:02d}] BUILD FAILURE (pid {rng.randrange(10**5)})" for i in range(repeats)]
    calls = _work(rng, before, "mvn") + [_call("mvn", "mvn -q test", "error", text) for text in outputs]
    return {"id": f"gen/noisy-{before}+{repeats}", "calls": calls, "resolved": False}


def polling_turns(seed: int = 11) -> Iterator[dict[str, object]]:
    rng = random.Random(seed)
    for before in (5, 40, 90, 120, 200):  # the wait begins before and after the soft cap (S=100)
        for polls in (12, 30, 80):
            yield progressing(rng, before, polls, rng.randint(0, 20))
    for before in (5, 60, 150):
        for polls in (30, 300):
            yield constant(rng, before, polls)
    for before in (5, 60, 150):
        for repeats in (20, 60):
            yield noisy(rng, before, repeats)


def write_polling_turns(path: str, seed: int = 11) -> int:
    """Write ``polling_turns`` as JSONL (the corpus format, with ``result``); returns how many turns."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in polling_turns(seed):
            record = {"source": "generated", **record, "cycles": len(record["calls"]), "ended_by": "generated"}
            f.write(json.dumps(record) + "\n")
            count += 1
    return count


# -- the evidence --------------------------------------------------------------------------------


def turn_class(turn: RecordedTurn) -> str:
    """``progressing``, ``constant`` or ``noisy`` (generated); a recorded run is ``stuck`` when
    unresolved with ``STUCK_RUN`` identical calls in a row, ``resolved`` or ``other``."""
    for name in CLASSES:
        if turn.id.startswith(f"gen/{name}-"):
            return name
    if turn.resolved is True:
        return "resolved"
    best = run = 0
    last = None
    for call in turn.calls:
        ident = (call.tool, call.args, call.digest)
        run = run + 1 if ident == last else 1
        last, best = ident, max(best, run)
    return "stuck" if turn.resolved is False and best >= STUCK_RUN else "other"


@dataclass
class Figures:
    """One variant on one data set: by turn class, the turns and the calls their halts prevented."""

    name: str
    halted: dict[str, list[int]] = field(default_factory=dict)

    def caught(self, kind: str) -> int:
        return len(self.halted.get(kind, ()))

    def mean_halt(self, kind: str) -> float | None:
        calls = self.halted.get(kind)
        return statistics.fmean(calls) if calls else None


@dataclass
class DataSet:
    name: str
    soft_cap: int
    turns: dict[str, int] = field(default_factory=dict)
    figures: list[Figures] = field(default_factory=list)


def evaluate(name: str, turns: Iterable[RecordedTurn], soft_cap: int) -> DataSet:
    """Every variant on ``turns`` at ``soft_cap``, unattended."""
    grid = [Policy(n, c.replace(soft_cap=soft_cap, load_entrypoints=False), is_default=not i)
            for i, (n, c) in enumerate(variants())]
    calibrator = Calibrator(grid)
    data = DataSet(name, soft_cap, figures=[Figures(p.name) for p in grid])
    for turn in turns:
        kind = turn_class(turn)
        data.turns[kind] = data.turns.get(kind, 0) + 1
        for figures, per_mode in zip(data.figures, calibrator.results(turn), strict=True):
            result = per_mode.get("unattended")
            if result is not None and result.halted:
                figures.halted.setdefault(kind, []).append(result.halt_call)
    return data


def _cell(data: DataSet, f: Figures, kind: str) -> str:
    total = data.turns.get(kind, 0)
    mean = f.mean_halt(kind)
    return f"{f.caught(kind)}/{total}" + ("" if mean is None else f" (at {mean:.1f})")


def table(data_sets: Sequence[DataSet]) -> str:
    """The evidence as a Markdown table: halted turns per class (mean call the halt prevented)."""
    head = ("data (soft cap)", "variant", "resolved halted (false)", "stuck halted", "other unresolved halted",
            "progressing halted (false)", "constant halted", "noisy halted")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in data_sets:
        for f in d.figures:
            cells = [_cell(d, f, kind) if d.turns.get(kind) else "-"
                     for kind in ("resolved", "stuck", "other", *CLASSES)]
            lines.append("| " + " | ".join((f"{d.name} (S={d.soft_cap})", f.name, *cells)) + " |")
    return "\n".join(lines)


def data_sets(recorded: Sequence[RecordedTurn], generated: Sequence[RecordedTurn]) -> list[DataSet]:
    sets = []
    if recorded:
        sets += [evaluate("recorded corpus", recorded, 100), evaluate("recorded corpus", recorded, 20)]
    if generated:
        sets.append(evaluate("generated polling turns", generated, 100))
    return sets


def _read(paths: Sequence[str]) -> list[RecordedTurn]:
    def problem(p: object) -> None:
        print(f"polling_evidence: skipped {p}", file=sys.stderr)

    return list(read_turns(paths, problem))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/polling_evidence.py",
                                     description="The stateful_tools evidence table (docs/polling.md).")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="corpus-format JSONL; files named *polling-turns* are the generated set")
    parser.add_argument("--write-polling-turns", metavar="FILE", help="write the generated polling turns and exit")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    try:
        if args.write_polling_turns:
            count = write_polling_turns(args.write_polling_turns, args.seed)
            print(f"wrote {count} turns to {args.write_polling_turns}")
            return 0
        if not args.files:
            parser.error("give corpus files and/or a polling-turns file")
        recorded = [f for f in args.files if "polling-turns" not in f]
        generated = [f for f in args.files if "polling-turns" in f]
        print(table(data_sets(_read(recorded) if recorded else [], _read(generated) if generated else [])))
        return 0
    except (InputError, OSError) as exc:  # a bad path is one line, not a traceback
        where = f"{exc.filename}: {exc.strerror or exc}" if isinstance(exc, OSError) and exc.filename else str(exc)
        print(f"polling_evidence: {where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
