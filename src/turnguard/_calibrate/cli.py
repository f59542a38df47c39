"""``turnguard calibrate FILES...`` and ``turnguard calibrate merge RESULTS...``: ``main`` and
``merge_main`` return 0, 1 (``--strict`` met a bad input, or no turn was read) or 2 (a usage
error, checked before the replay)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from turnguard import _terminal as terminal
from turnguard._calibrate import grid as g
from turnguard._calibrate.advice import DEFAULT_TOLERANCE, valid_tolerance
from turnguard._calibrate.bounds import count
from turnguard._calibrate.inputs import expand_inputs, missing_backups
from turnguard._calibrate.records import MAX_LINE_BYTES, InputError, InputProblem
from turnguard._calibrate.report import table, to_json_text
from turnguard._calibrate.run import Progress, StrictError, calibrate, input_sizes
from turnguard._calibrate.stats import RunStats
from turnguard._config import STREAK_STOP_ON, STUCK_SIGNALS, ConfigError, GuardConfig, read_head

MAX_SHOWN_PROBLEMS = 100
AUTO_PARALLEL_BYTES = 32 * 1024 * 1024


def _csv(parse):
    def parser(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parser


DESCRIPTION = (
    "Replay recorded turns (corpus JSONL, the recorder's output, the Collector's OTLP JSON; gzip too) through "
    "turnguard's policies under a grid of thresholds, and report what each policy would have done. "
    "'calibrate merge RESULT.json...' merges --json results of runs over parts of the input."
)


MAX_JOBS = 64


def _bounded_int(least: int, most: int, expected: str):
    """An argparse type: an integer from ``least`` to ``most``, else ``expected``, got the text."""
    def parser(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
        return value
    return parser


MAX_LINE_LIMIT = 1 << 30
MAX_RESULT_BYTES = 256 * 1024 * 1024
"""The largest ``--json`` result ``calibrate merge`` reads (a real one is a few MB: its figures are
bounded by the grid, never by the turns)."""


def _tolerance(text: str) -> float:
    try:
        return valid_tolerance(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share strictly between 0 and 1, got {text!r}") from None


def build_parser(prog: str = "turnguard calibrate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, allow_abbrev=False)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The calibrate flags, on ``p`` (the ``turnguard`` command's subparser, or our own)."""
    terminal.add_path_argument(
        p, "files", nargs="+", metavar="FILE",
        help="input files, any mix of formats; a directory or a quoted glob stands for its files, and a "
             "rotated Collector file with its backups is read as one stream, oldest first")
    grid = p.add_argument_group("grid (comma-separated values)")
    grid.add_argument("--soft-caps", type=_csv(g.parse_ints), default=g.DEFAULT_SOFT_CAPS,
                      help="soft caps S (default: %(default)s)")
    grid.add_argument("--multipliers", type=_csv(g.parse_floats), default=g.DEFAULT_MULTIPLIERS,
                      help="hard multipliers m, backstop S*m (default: %(default)s)")
    grid.add_argument("--stuck-repeats", type=_csv(lambda t: g.parse_ints(t, minimum=1)),
                      default=g.DEFAULT_STUCK_REPEATS, help="stuck-repeat thresholds D (default: %(default)s)")
    grid.add_argument("--streaks", type=_csv(g.parse_streaks), default=g.DEFAULT_STREAKS,
                      help="streak levels warn:stop, 0 disables a level (default: 5:8 and others)")
    grid.add_argument("--explicit-caps", type=_csv(g.parse_ints), default=g.DEFAULT_EXPLICIT_CAPS,
                      help="explicit max_tool_calls_per_turn values (default: %(default)s)")
    grid.add_argument("--cycle-caps", type=_csv(g.parse_ints), default=g.DEFAULT_CYCLE_CAPS,
                      help="max_cycles_per_turn values, 0 = unbounded (default: %(default)s)")
    grid.add_argument("--cycle-repeats", type=_csv(g.parse_streaks), default=g.DEFAULT_CYCLE_REPEATS,
                      help="cycle_repeat levels warn:stop (repetitions of a cycle of 2 to 4 calls), 0 disables "
                           "a level (default: 5:6, 5:8, 5:10 and off)")
    grid.add_argument("--key-modes", type=_csv(g.parse_key_modes), default=g.DEFAULT_KEY_MODES,
                      help="call identities: canonical, bytes (default: both)")
    grid.add_argument("--stuck-signals", type=_csv(lambda t: g.parse_choices(t, STUCK_SIGNALS, "stuck signals")),
                      default=g.DEFAULT_STUCK_SIGNALS,
                      help=f"stuck signals past the soft cap, among {', '.join(STUCK_SIGNALS)} (default: all)")
    grid.add_argument("--streak-stop-on", type=_csv(lambda t: g.parse_choices(t, STREAK_STOP_ON, "stop-on values")),
                      default=g.DEFAULT_STOP_ON,
                      help="what the streak stop level counts: error (failures), any (default: both)")
    grid.add_argument("--stateful-tools", type=_csv(g.parse_tool_sets), default=g.DEFAULT_STATEFUL_TOOLS,
                      metavar="LISTS", help="stateful_tools values to try, separated by ';' (tools by ','; 'none': "
                      "no tool, '*': every tool); the calls' recorded result digests are replayed (default: the "
                      "base configuration's only)")
    grid.add_argument("--no-peers", action="store_true", help="leave out the peers' rules")
    grid.add_argument("--cross", action="store_true",
                      help="the full cross product of every axis (default: the cap axes crossed, "
                           "each other axis varied alone around the default)")
    terminal.add_path_argument(
        p, "--config", group=grid, metavar="TOML",
        help="base configuration, the default row (default: as 'turnguard config' loads it: "
             "$TURNGUARD_CONFIG, else the nearest turnguard.toml or pyproject.toml with [tool.turnguard] "
             "from the current folder up, then TURNGUARD_* variables)")
    grid.add_argument("--tolerance", type=_tolerance, default=None, metavar="Q",
                      help="the share of the turns past a threshold that would have succeeded which you accept "
                           "losing to it: each probe row says whether the evidence decides against it "
                           f"(default: {DEFAULT_TOLERANCE})")
    _output_arguments(p)


def _output_arguments(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    terminal.add_path_argument(p, "--json", group=out, metavar="FILE",
                               help=f"write the results as JSON ({terminal.STDOUT_HELP})")
    terminal.add_path_argument(p, "--html", group=out, metavar="FILE",
                               help=f"write a self-contained HTML report with charts ({terminal.STDOUT_HELP})")
    terminal.add_wide_argument(out)
    out.add_argument("--fold", action="store_true",
                     help="list policies whose figures equal an earlier row's under the table, not as rows")
    out.add_argument("--strict", action="store_true", help="stop at the first malformed line or span")
    out.add_argument("--jobs", default=0,
                     type=_bounded_int(0, MAX_JOBS, f"expected 0 (automatic) to {MAX_JOBS} worker processes"),
                     help=f"worker processes, at most {MAX_JOBS} (default: 1 for small inputs, every core for "
                          "large ones)")
    out.add_argument("--max-line-bytes", default=MAX_LINE_BYTES, metavar="N",
                     type=_bounded_int(1, MAX_LINE_LIMIT, f"expected a number of bytes from 1 to {MAX_LINE_LIMIT:,}"),
                     help="skip (and report) input lines longer than this (default: %(default)s, 32 MiB)")
    out.add_argument("--no-grouping", action="store_true", help=argparse.SUPPRESS)
    out.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                     help="progress bar on stderr (auto: only on a terminal)")


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:  # (a file named merge: ./merge)
        return merge_main(argv[1:], stdout=stdout, stderr=stderr)
    return _parsed_run(build_parser(), argv, run, stdout, stderr)


def _parsed_run(parser: argparse.ArgumentParser, argv: Sequence[str] | None, run_args: Callable[..., int],
                stdout: TextIO, stderr: TextIO) -> int:
    """``run_args`` on the flags ``parser`` reads from ``argv``; 2 when a path given is empty."""
    try:
        args = parser.parse_args(argv)
    except terminal.EmptyPath as exc:
        say(str(exc), stderr)
        return 2
    return run_args(args, stdout=stdout, stderr=stderr)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``turnguard calibrate`` with parsed flags (``turnguard calibrate merge`` is ``run_merge``)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        base = getattr(args, "guard_config", None) or GuardConfig.load(args.config)
    except ConfigError as exc:
        say(f"turnguard calibrate: {exc}", stderr)
        return 2
    spec = g.GridSpec(
        soft_caps=args.soft_caps, multipliers=args.multipliers, stuck_repeats=args.stuck_repeats,
        streaks=args.streaks, explicit_caps=args.explicit_caps, cycle_caps=args.cycle_caps,
        cycle_repeats=args.cycle_repeats,
        key_modes=args.key_modes, stuck_signals=args.stuck_signals, stop_on=args.streak_stop_on,
        stateful_tools=args.stateful_tools, peers=not args.no_peers, cross=args.cross, base=base,
    )
    try:
        policies = g.build_grid(spec)
    except ConfigError as exc:
        say(f"turnguard calibrate: grid: {exc}", stderr)
        return 2
    unwritable = outputs_problem(json=args.json, html=args.html)
    if unwritable:
        say(f"turnguard calibrate: {unwritable}", stderr)
        return 2
    problems = [0]

    def on_problem(problem: InputProblem) -> None:
        problems[0] += 1
        if problems[0] <= MAX_SHOWN_PROBLEMS:
            say(f"turnguard calibrate: {problem}", stderr)

    enabled = {"auto": None, "always": True, "never": False}[args.progress]
    try:
        files = expand_inputs(args.files)
        _say_missing_backups(files, stderr)
        size = sum(input_sizes(files))
        jobs = args.jobs or _auto_jobs(size)
        progress = Progress(size, stderr, enabled=enabled)
        probe = base.probe_settings()
        stats = calibrate(files, policies, on_problem=on_problem, strict=args.strict, jobs=jobs,
                          group=not args.no_grouping, progress=progress, max_line_bytes=args.max_line_bytes,
                          tolerance=args.tolerance or DEFAULT_TOLERANCE,
                          probe_rate=None if probe is None else probe.rate)
    except StrictError as exc:
        say(f"turnguard calibrate: stopped: {exc}", stderr)
        return 1
    except (InputError, OSError) as exc:
        say(f"turnguard calibrate: {exc}", stderr)
        return 2
    _say_counted(problems[0], stats.duplicates, stderr)
    if not stats.turns:
        say(f"turnguard calibrate: no turn could be read from {', '.join(map(str, args.files))} "
            f"({stats.problems:,} input problems); nothing to report", stderr)
        return 1
    return _emit(stats, args.json, args.html, stdout, stderr, fold=args.fold, width=terminal.output_width(args.wide))


def _say_counted(problems: int, duplicates: int, stderr: TextIO) -> None:
    """The input problems not shown one by one, and the turns read more than once."""
    if problems > MAX_SHOWN_PROBLEMS:
        say(f"turnguard calibrate: ... and {problems - MAX_SHOWN_PROBLEMS:,} more input problems "
            f"({problems:,} in all)", stderr)
    if duplicates:
        say(f"turnguard calibrate: note: {duplicates:,} reading(s) of turns already read (same id, same "
            "turn: the same file twice, or the recorder's and the Collector's file of one fleet) counted once",
            stderr)


def say(message: str, stderr: TextIO) -> None:
    """A message on one line of ``stderr``, the file names in it printable (``terminal.shown``)."""
    print(terminal.shown(message), file=stderr)


def _say_missing_backups(files: Sequence[Path], stderr: TextIO) -> None:
    """A file given without the rotated backups beside it: the report would leave them out."""
    for live, backups in missing_backups(files).items():
        names = ", ".join(p.name for p in backups[:3]) + (f" and {len(backups) - 3:,} more" if len(backups) > 3 else "")
        say(f"turnguard calibrate: note: {live} has {len(backups):,} rotated backup(s) beside it that are not read "
            f"({names}); give its directory, or a glob such as '{live.parent / (live.stem + '*')}', to read "
            "them all as one stream", stderr)


def outputs_problem(**outputs: str | None) -> str | None:
    """Why one of the ``outputs`` (by flag) cannot be written, or ``None``: each opened for appending
    before the replay (a new file removed again); at most one may be ``-``, standard output."""
    to_stdout = [f"--{flag}" for flag, path in outputs.items() if path == terminal.STDOUT]
    if len(to_stdout) > 1:
        return f"only one of {' and '.join(to_stdout)} can be '-': there is one standard output"
    for path in outputs.values():
        if path is None or path == terminal.STDOUT:
            continue
        existed = os.path.lexists(path)
        try:
            if os.path.isdir(path):
                raise IsADirectoryError(21, "Is a directory")
            with open(path, "ab"):
                pass
        except OSError as exc:
            return f"cannot write {path}: {exc.strerror or exc}"
        if not existed:
            os.unlink(path)
    return None


def _auto_jobs(size: int) -> int:
    """Every core (at most 8) for inputs of ``AUTO_PARALLEL_BYTES`` or more, else one process."""
    return max(1, min(os.cpu_count() or 1, 8)) if size >= AUTO_PARALLEL_BYTES else 1


def _emit(stats: RunStats, json_path: str | None, html_path: str | None, stdout: TextIO, stderr: TextIO, *,
          fold: bool = False, width: int = terminal.DEFAULT_WIDTH) -> int:
    """The table on ``stdout``, unless an output is ``-`` and takes its place; the outputs."""
    for warning in stats.warnings():
        say(f"turnguard calibrate: warning: {warning}", stderr)
    if terminal.STDOUT not in (json_path, html_path):
        stdout.write(table(stats, color=terminal.color_allowed(stdout), fold=fold, width=width))
    if json_path is not None:
        _write(json_path, to_json_text(stats), stdout)
    if html_path is not None:
        from turnguard._calibrate.html import render  # (only for --html: its import is start-up cost)

        _write(html_path, render(stats), stdout)
        if html_path != terminal.STDOUT:
            say(f"turnguard calibrate: wrote {html_path}", stderr)
    return 0


def _write(path: str, text: str, stdout: TextIO) -> None:
    if path == terminal.STDOUT:
        stdout.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8", errors="backslashreplace")


def merge_main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None,
               stderr: TextIO | None = None) -> int:
    """Merge ``--json`` results of runs over parts of the input (same flags) into one."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    p = argparse.ArgumentParser(prog="turnguard calibrate merge", description=MERGE_DESCRIPTION, allow_abbrev=False)
    add_merge_arguments(p)
    return _parsed_run(p, argv, run_merge, stdout, stderr)


MERGE_DESCRIPTION = ("Merge the --json results of calibrate runs over parts of the input (run with the same grid "
                     "flags) and report them as one run.")


def add_merge_arguments(p: argparse.ArgumentParser) -> None:
    terminal.add_path_argument(p, "results", nargs="+", metavar="RESULT.json")
    terminal.add_path_argument(p, "--json", metavar="FILE",
                               help=f"write the merged results as JSON ({terminal.STDOUT_HELP})")
    terminal.add_path_argument(p, "--html", metavar="FILE",
                               help=f"write the merged HTML report ({terminal.STDOUT_HELP})")
    p.add_argument("--tolerance", type=_tolerance, default=None, metavar="Q",
                   help="decide the probe rows against this tolerance (default: the first result's)")
    terminal.add_wide_argument(p)


def run_merge(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    return merge_results(args.results, args.json, args.html, stdout or sys.stdout, stderr or sys.stderr,
                         width=terminal.output_width(args.wide), tolerance=args.tolerance)


def _refuse_overlap(part: RunStats, path: str, counted: dict[str, str]) -> None:
    """``ValueError`` when ``part`` counted a turn a result already merged counted: their sketches
    (``duplicates.SKETCH``, the smallest id hashes) share an id. Merging them would count it twice."""
    shared = next((h for h in part.sketch if h in counted), None)
    if shared is not None:
        raise ValueError(f"overlaps {counted[shared]}: both counted the same turns (merge results of disjoint "
                         "parts of the input; calibrate the files together to count each turn once)")
    counted.update(dict.fromkeys(part.sketch, path))


def merge_results(paths: Sequence[str], json_path: str | None, html_path: str | None, stdout: TextIO,
                  stderr: TextIO, *, width: int = terminal.DEFAULT_WIDTH, tolerance: float | None = None) -> int:
    if not paths:
        say("turnguard calibrate merge: give the --json results to merge", stderr)
        return 2
    unwritable = outputs_problem(json=json_path, html=html_path)
    if unwritable:
        say(f"turnguard calibrate merge: {unwritable}", stderr)
        return 2
    merged: RunStats | None = None
    counted: dict[str, str] = {}
    for path in paths:
        try:
            text = read_head(path, MAX_RESULT_BYTES)
            if len(text) > MAX_RESULT_BYTES:
                raise ValueError(f"larger than {MAX_RESULT_BYTES:,} bytes: not a calibrate --json result")
            part = RunStats.from_json(json.loads(text.decode("utf-8")))
            _refuse_overlap(part, path, counted)
            if merged is None:
                merged = part
            else:
                merged.merge(part)
                for what in ("turns", "calls"):
                    count(getattr(merged, what), f"merged with the results before it, its {what}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            say(f"turnguard calibrate merge: {path}: {exc}", stderr)
            return 2
    assert merged is not None
    if tolerance is not None:
        merged.tolerance = tolerance
    return _emit(merged, json_path, html_path, stdout, stderr, width=width)
