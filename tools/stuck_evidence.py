"""Evidence for the stuck signals and the streak variant: the seed's rules against the
alternatives, on recorded turns and on generated long turns, through ``turnguard calibrate``'s
own engine (``engine.Calibrator``: the live ledger and policy hooks).

    python tools/stuck_evidence.py --write-long-turns long-turns.jsonl
    python tools/stuck_evidence.py ../shared/corpus/*.jsonl long-turns.jsonl
    python tools/stuck_evidence.py --profiles ../shared/corpus/*.jsonl long-turns.jsonl

The recorded corpus has no turn past 59 calls, so the adaptive cap is compared there with the
calibration grid's smallest soft cap (``S=20``); generated turns (``long_turns``) run 100 to
1,500 calls and use the default ``S=100``. Every figure is for unattended turns (halts).

Turn classes: a *stuck* turn is an unresolved one with 8 or more consecutive identical calls
(recorded or generated) or a generated loop of 2 or 3 calls in rotation; *resolved* turns are
the false-positive proxy; a generated *edit-and-rerun* turn is resolved by construction.
"""

from __future__ import annotations

import argparse
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
"""Consecutive identical calls that make a turn degenerate (the issue's definition)."""
CORPUS_SOFT_CAP = 20
LONG_SOFT_CAP = 100

VARIANTS: tuple[tuple[str, dict[str, object]], ...] = (
    ("seed (repeat, stop on error)", {}),
    ("stale_repeat", {"stuck_signal": "stale_repeat"}),
    ("stop on any", {"streak_stop_on": "any"}),
    ("stale_repeat + stop on any", {"stuck_signal": "stale_repeat", "streak_stop_on": "any"}),
)
"""The seed's configuration and each alternative (the first is the reference)."""


DEGENERATE_RESOLVED = frozenset({"deepseek-chat-v2/googlecontainertools__jib-4035"})
"""Resolved runs a stuck rule may halt: solved at call 3, then the same failing ``javac`` 20
times in a row (degenerate after the fact: the task result cannot tell)."""


def _profile_candidates() -> tuple[tuple[str, GuardConfig], ...]:
    recommended = PROFILES["recommended"]
    return (
        ("seed", PROFILES["seed"]),
        ("recommended", recommended),
        ("repeat + stop on any", PROFILES["seed"].replace(streak_stop_on="any")),
        ("recommended, streak stop at 6", recommended.replace(streak_stop_at=6)),
        ("recommended, D=4", recommended.replace(stuck_repeat_threshold=4)),
        ("recommended, D=8", recommended.replace(stuck_repeat_threshold=8)),
        ("recommended, x5", recommended.replace(hard_multiplier=5)),
    )


PROFILE_CANDIDATES = _profile_candidates()
"""``PROFILES`` and the neighbours of ``"recommended"`` it was chosen from."""


def policies(soft_cap: int, variants: Sequence[tuple[str, GuardConfig]] | None = None) -> list[Policy]:
    """The variants at ``soft_cap`` (default: ``VARIANTS`` over the seed's configuration)."""
    if variants is None:
        variants = [(name, GuardConfig().replace(**changes)) for name, changes in VARIANTS]
    return [Policy(name, config.replace(soft_cap=soft_cap, load_entrypoints=False), is_default=not i)
            for i, (name, config) in enumerate(variants)]


# -- generated long turns ------------------------------------------------------------------------


def _call(tool: str, args: str, outcome: str) -> dict[str, str]:
    return {"tool": tool, "args": args, "outcome": outcome}


def _productive(rng: random.Random, n: int, tag: str) -> list[dict[str, str]]:
    """``n`` distinct exploration calls (reads and searches of different places)."""
    tools = ("cat", "grep", "find", "ls")
    return [_call(t, f"{t} src/{tag}/part_{i}_{rng.randrange(10**6)}.java", "unknown")
            for i, t in enumerate(rng.choice(tools) for _ in range(n))]


def edit_and_rerun(rng: random.Random, n: int) -> dict[str, object]:
    """A healthy long turn: edit, re-run the same test command, now and then read something; the
    test fails until the last cycle. Re-running twice in a row (a flaky test) happens too."""
    test = "mvn -q test -Dtest=ParserTest"
    calls: list[dict[str, str]] = []
    i = 0
    while len(calls) < n:
        calls.append(_call("edit", f"edit src/Parser.java {i * 7}:{i * 7 + 3} <<fix {i}>>", "ok"))
        calls.append(_call("mvn", test, "error"))
        if rng.random() < 0.1:
            calls.append(_call("mvn", test, "error"))
        if rng.random() < 0.3:
            calls.append(_call("cat", f"cat src/Parser.java -n {rng.randrange(400)}", "unknown"))
        i += 1
    calls = calls[:n]
    calls.append(_call("mvn", test, "ok"))
    return {"id": f"gen/edit-and-rerun-{n}", "calls": calls, "resolved": True}


def rotation(rng: random.Random, prefix: int, period: int, rotations: int) -> dict[str, object]:
    """A stuck turn: ``prefix`` productive calls, then the same ``period`` calls over and over."""
    loop = [_call("open", "open src/Parser.java 120", "unknown"), _call("mvn", "mvn -q test", "error"),
            _call("grep", "grep -n parseValue src/Parser.java", "unknown")][:period]
    calls = _productive(rng, prefix, "rot") + loop * rotations
    return {"id": f"gen/rotation{period}-{prefix}+{rotations}", "calls": calls, "resolved": False}


def useless_success(rng: random.Random, prefix: int, repeats: int) -> dict[str, object]:
    """A stuck turn whose repeated call "succeeds" with the same useless result every time."""
    calls = _productive(rng, prefix, "ok") + [_call("search", "search_dir parseValue src", "ok")] * repeats
    return {"id": f"gen/same-ok-{prefix}+{repeats}", "calls": calls, "resolved": False}


def runaway(rng: random.Random, n: int) -> dict[str, object]:
    """Distinct calls forever: only the hard backstop ends it."""
    return {"id": f"gen/runaway-{n}", "calls": _productive(rng, n, "run"), "resolved": None}


def long_turns(seed: int = 7) -> Iterator[dict[str, object]]:
    """The generated set (corpus-format records): edit-and-rerun turns of 100 to 500 calls,
    rotations of 2 and 3 calls that begin before and after the soft cap, identical calls that
    succeed, and runaways of distinct calls."""
    rng = random.Random(seed)
    for n in range(100, 501, 20):
        yield edit_and_rerun(rng, n)
    for period in (2, 3):
        for prefix in (10, 40, 80, 99, 100, 130, 200, 400):  # the loop begins before / after S=100
            yield rotation(rng, prefix, period, max(30, (200 - prefix) // period))
    for prefix in (5, 60, 150):
        yield useless_success(rng, prefix, 12)
    for n in (1200, 1500):
        yield runaway(rng, n)


def write_long_turns(path: str, seed: int = 7) -> int:
    """Write ``long_turns`` as JSONL (the corpus format); returns how many turns."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in long_turns(seed):
            record = {"source": "generated", **record, "cycles": len(record["calls"]), "ended_by": "generated"}
            f.write(json.dumps(record) + "\n")
            count += 1
    return count


# -- the evidence --------------------------------------------------------------------------------


def longest_identical_run(turn: RecordedTurn) -> int:
    best = run = 0
    last = None
    for call in turn.calls:
        ident = (call.tool, call.args, call.digest)
        run = run + 1 if ident == last else 1
        last = ident
        best = max(best, run)
    return best


def is_stuck(turn: RecordedTurn, identical: bool | None = None) -> bool:
    """Unresolved, and a run of ``STUCK_RUN`` identical calls (``identical``, when the caller
    already knows) or a rotation."""
    if identical is None:
        identical = longest_identical_run(turn) >= STUCK_RUN
    return turn.resolved is False and (identical or "/rotation" in turn.id)


@dataclass
class VariantFigures:
    """One variant on one data set."""

    name: str
    resolved_halted: list[str] = field(default_factory=list)
    identical_caught: int = 0
    stuck_caught: dict[str, int] = field(default_factory=dict)
    """Stuck turn id -> the call its halt prevented."""
    other_unresolved_halted: int = 0

    def mean_halt(self, ids: Iterable[str]) -> float | None:
        calls = [self.stuck_caught[i] for i in ids if i in self.stuck_caught]
        return statistics.fmean(calls) if calls else None


@dataclass
class DataSet:
    name: str
    soft_cap: int
    turns: int = 0
    resolved: int = 0
    identical: int = 0
    stuck: int = 0
    variants: list[VariantFigures] = field(default_factory=list)

    def seed_caught_still_caught(self, variant: VariantFigures) -> tuple[int, int, float | None, float | None]:
        """(stuck turns the seed catches, how many of them ``variant`` catches, the seed's mean
        halt call on them, the variant's mean halt call on them)."""
        seed = self.variants[0]
        ids = list(seed.stuck_caught)
        caught = [i for i in ids if i in variant.stuck_caught]
        return len(ids), len(caught), seed.mean_halt(ids), variant.mean_halt(ids)


def evaluate(name: str, turns: Iterable[RecordedTurn], soft_cap: int,
             variants: Sequence[tuple[str, GuardConfig]] | None = None) -> DataSet:
    """Every variant (default: ``VARIANTS``) on ``turns`` at ``soft_cap``, unattended."""
    grid = policies(soft_cap, variants)
    calibrator = Calibrator(grid, group=False)
    data = DataSet(name, soft_cap, variants=[VariantFigures(p.name) for p in grid])
    for turn in turns:
        data.turns += 1
        data.resolved += turn.resolved is True
        identical = longest_identical_run(turn) >= STUCK_RUN
        stuck = is_stuck(turn, identical)
        data.identical += identical
        data.stuck += stuck
        for figures, per_mode in zip(data.variants, calibrator.results(turn), strict=True):
            result = per_mode.get("unattended")
            if result is None or not result.halted:
                continue
            if turn.resolved is True:
                figures.resolved_halted.append(turn.id)
            if identical:
                figures.identical_caught += 1
            if stuck:
                figures.stuck_caught[turn.id] = result.halt_call
            elif turn.resolved is False:
                figures.other_unresolved_halted += 1
    return data


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(data_sets: Sequence[DataSet]) -> str:
    """The evidence as a Markdown table."""
    head = ("data (soft cap)", "variant", "resolved halted", "≥8 identical caught", "stuck caught",
            "mean halt call (stuck)", "seed's stuck catches still caught", "mean halt call there: seed → variant",
            "other unresolved halted")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in data_sets:
        for v in d.variants:
            total, kept, seed_mean, mean = d.seed_caught_still_caught(v)
            resolved = f"{len(v.resolved_halted)}/{d.resolved}"
            if v.resolved_halted and len(v.resolved_halted) <= 2:
                resolved += " (" + ", ".join(f"`{i}`" for i in v.resolved_halted) + ")"
            lines.append("| " + " | ".join((
                f"{d.name} (S={d.soft_cap})", v.name, resolved, f"{v.identical_caught}/{d.identical}",
                f"{len(v.stuck_caught)}/{d.stuck}", _num(v.mean_halt(v.stuck_caught)), f"{kept}/{total}",
                f"{_num(seed_mean)} → {_num(mean)}", str(v.other_unresolved_halted),
            )) + " |")
    return "\n".join(lines)


def meets_profile_targets(data: DataSet, variant: VariantFigures) -> bool:
    """The recommended profile's targets: no resolved run halted but ``DEGENERATE_RESOLVED``,
    every run of ``STUCK_RUN`` or more identical calls caught."""
    return set(variant.resolved_halted) <= DEGENERATE_RESOLVED and variant.identical_caught == data.identical


def profile_table(data_sets: Sequence[DataSet]) -> str:
    """``PROFILE_CANDIDATES`` against the targets, as a Markdown table."""
    head = ("data (soft cap)", "profile", "resolved halted", "≥8 identical caught", "stuck caught",
            "mean halt call (stuck)", "other unresolved halted", "meets both targets")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in data_sets:
        for v in d.variants:
            extra = [i for i in v.resolved_halted if i not in DEGENERATE_RESOLVED]
            resolved = f"{len(v.resolved_halted)}/{d.resolved}"
            if extra:
                resolved += " (" + ", ".join(f"`{i.rsplit('/', 1)[-1]}`" for i in extra[:2])
                resolved += ", ...)" if len(extra) > 2 else ")"
            lines.append("| " + " | ".join((
                f"{d.name} (S={d.soft_cap})", v.name, resolved, f"{v.identical_caught}/{d.identical}",
                f"{len(v.stuck_caught)}/{d.stuck}", _num(v.mean_halt(v.stuck_caught)),
                str(v.other_unresolved_halted), "yes" if meets_profile_targets(d, v) else "no",
            )) + " |")
    return "\n".join(lines)


def profile_data_sets(recorded: Sequence[RecordedTurn], generated: Sequence[RecordedTurn]) -> list[DataSet]:
    """The candidates as configured (S=100) on both sets, and on the recorded corpus at S=20 too
    (its turns never reach 100 calls: there only the streak can fire)."""
    sets = []
    if recorded:
        sets.append(evaluate("recorded corpus", recorded, LONG_SOFT_CAP, PROFILE_CANDIDATES))
        sets.append(evaluate("recorded corpus", recorded, CORPUS_SOFT_CAP, PROFILE_CANDIDATES))
    if generated:
        sets.append(evaluate("generated long turns", generated, LONG_SOFT_CAP, PROFILE_CANDIDATES))
    return sets


def _read(paths: Sequence[str]) -> list[RecordedTurn]:
    def problem(p: object) -> None:
        print(f"stuck_evidence: skipped {p}", file=sys.stderr)

    return list(read_turns(paths, problem))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/stuck_evidence.py",
                                     description="The stuck-signal evidence table (README, stuck-signals section).")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="corpus-format JSONL; files named *long-turns* are the generated set")
    parser.add_argument("--write-long-turns", metavar="FILE", help="write the generated long turns and exit")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profiles", action="store_true",
                        help="compare tg.PROFILES and the recommended profile's neighbours instead")
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except (InputError, OSError) as exc:  # a bad path is one line, not a traceback
        print(f"stuck_evidence: {_reason(exc)}", file=sys.stderr)
        return 2


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.write_long_turns:
        print(f"wrote {write_long_turns(args.write_long_turns, args.seed)} turns to {args.write_long_turns}")
        return 0
    recorded = [f for f in args.files if "long-turns" not in f]
    generated = [f for f in args.files if "long-turns" in f]
    if args.profiles:
        if not args.files:
            parser.error("give corpus files and/or a long-turns file")
        print(profile_table(profile_data_sets(_read(recorded) if recorded else [],
                                              _read(generated) if generated else [])))
        return 0
    data_sets = []
    if recorded:
        data_sets.append(evaluate("recorded corpus", _read(recorded), CORPUS_SOFT_CAP))
    if generated:
        data_sets.append(evaluate("generated long turns", _read(generated), LONG_SOFT_CAP))
    if not data_sets:
        parser.error("give corpus files and/or a long-turns file")
    print(table(data_sets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
