"""Running a calibration over files: serially, or over worker processes, with a progress bar.

With ``jobs > 1`` the parent reads the files and hands chunks of corpus lines (parsed in the
workers) and of turns rebuilt from OTLP spans (the assembler needs one reader) to worker
processes, at most ``2 * jobs`` chunks in flight, so memory stays bounded; each worker returns
the ``RunStats`` of its chunk and the parent merges them (the same merge as ``calibrate merge``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from turnguard.calibrate.decision import DEFAULT_TOLERANCE
from turnguard.calibrate.engine import Calibrator, policy_info
from turnguard.calibrate.grid import Policy
from turnguard.calibrate.inputs import (
    MAX_LINE_BYTES,
    OTLP_MARKER,
    SKIP_BLOCK,
    UNREADABLE,
    InputError,
    InputProblem,
    LineSource,
    OtlpAssembler,
    ProblemSink,
    bounded_lines,
    corpus_line,
    is_otlp_line,
    parse_line,
    read_source,
    too_long,
)
from turnguard.calibrate.results import late_results
from turnguard.calibrate.stats import RunStats

CHUNK_LINES = 2000
CHUNK_BYTES = 1 << 20
"""A chunk for a worker ends at this many lines or bytes, whichever comes first."""


class StrictError(InputError):
    """``--strict``: the first input problem stops the run."""


class Progress:
    """Calibrate's progress on ``stream``, drawn only when it is a terminal: a ``tqdm`` bar (the
    ``cli`` extra) fitted to the terminal's width and redrawn when it changes, with the bytes read,
    the turns and calls so far, the rate and the time left. Without tqdm installed none is drawn
    (``available``)."""

    def __init__(self, total_bytes: int, stream: TextIO | None = None, *, enabled: bool | None = None,
                 delay: float = 0.5, interval: float = 0.2) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (self.stream.isatty() if enabled is None else enabled) and available()
        self.total = max(total_bytes, 1)
        self._bar: Any = None
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, file=self.stream, desc="calibrate", unit="B", unit_scale=True,
                             unit_divisor=1024, dynamic_ncols=True, delay=delay, mininterval=interval)

    def update(self, done_bytes: int, calls: int, turns: int, *, force: bool = False) -> None:
        bar = self._bar
        if bar is None:
            return
        bar.set_postfix_str(f"{bar.format_sizeof(turns)} turns, {bar.format_sizeof(calls)} calls", refresh=False)
        bar.update(min(done_bytes, self.total) - bar.n)
        if force:
            bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def available() -> bool:
    """Whether a progress bar can be drawn (tqdm, from the ``cli`` extra, is installed)."""
    return importlib.util.find_spec("tqdm") is not None


def calibrate(
    paths: Sequence[str | Path],
    policies: list[Policy],
    *,
    on_problem: ProblemSink,
    strict: bool = False,
    jobs: int = 1,
    group: bool = True,
    progress: Progress | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    tolerance: float = DEFAULT_TOLERANCE,
    probe_rate: float | None = None,
) -> RunStats:
    """Replay every turn of ``paths`` under every policy; problems go to ``on_problem`` (and
    raise ``StrictError`` under ``strict``); lines longer than ``max_line_bytes`` are problems.
    ``tolerance`` and ``probe_rate`` (the configured probe's) are what the probe evidence is read
    against."""
    counted = _Counter(on_problem, strict)
    sizes = input_sizes(paths)
    progress = progress or Progress(sum(sizes), enabled=False)
    results = late_results(paths, counted, max_line_bytes=max_line_bytes)
    try:
        with rare_collections():
            if jobs <= 1:
                stats = _serial(paths, sizes, policies, counted, group, progress, max_line_bytes, results)
            else:
                stats = _parallel(paths, sizes, policies, counted, group, progress, jobs, max_line_bytes, results)
    finally:
        progress.close()
    stats.problems = counted.count
    stats.inputs = [str(p) for p in paths]
    stats.tolerance, stats.probe_rate = tolerance, probe_rate
    return stats


def input_sizes(paths: Sequence[str | Path]) -> list[int]:
    """Each input's size on disk; ``InputError`` naming the first that cannot be read."""
    sizes = []
    for p in paths:
        try:
            sizes.append(os.path.getsize(p))
        except OSError as exc:
            raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from exc
    return sizes


GC_THRESHOLD = (100_000, 50, 100)
"""Cyclic-GC thresholds during a run. A replay allocates millions of short-lived tuples and
ledgers that reference counting frees (no cycles); the default thresholds (700, 10, 10) would
scan the young objects every 700 of them, for nothing: about 6% of a run's time."""


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """Raise the cyclic GC's thresholds for the duration (restored after)."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(before, GC_THRESHOLD, strict=True)))
    try:
        yield
    finally:
        gc.set_threshold(*before)


class _Counter:
    def __init__(self, sink: ProblemSink, strict: bool) -> None:
        self.sink, self.strict, self.count = sink, strict, 0

    def __call__(self, problem: InputProblem) -> None:
        self.count += 1
        self.sink(problem)
        if self.strict:
            raise StrictError(f"{problem} (--strict)")


def _serial(paths, sizes, policies, on_problem, group, progress, max_line_bytes, results) -> RunStats:
    cal = Calibrator(policies, group=group, results=results)
    done = 0
    spans = OtlpAssembler(on_problem, max_line_bytes=max_line_bytes)  # one stream across a rotated set
    for path, size in zip(paths, sizes, strict=True):
        with LineSource(path, on_problem, max_line_bytes=max_line_bytes) as source:
            for i, turn in enumerate(read_source(source, on_problem, spans)):
                cal.add(turn)
                if not i & 63:
                    progress.update(done + source.position(), cal.stats.calls, cal.stats.turns)
        done += size
    for turn in spans.finish():
        cal.add(turn)
    progress.update(done, cal.stats.calls, cal.stats.turns, force=True)
    return cal.stats


# -- worker processes -------------------------------------------------------------------------------

_worker: Calibrator | None = None
_max_line_bytes = MAX_LINE_BYTES


def _init(policies: list[Policy], group: bool, max_line_bytes: int, results: dict[int, bool]) -> None:
    global _worker, _max_line_bytes
    gc.set_threshold(*GC_THRESHOLD)
    _worker = Calibrator(policies, group=group, results=results)
    _max_line_bytes = max_line_bytes


def _work(chunk: list[Any]) -> tuple[RunStats, list[InputProblem]]:
    """Replay one chunk: ``("line", path, lineno, bytes)`` or ``("turn", RecordedTurn)`` items,
    or a single ``("range", path, start, end, first_lineno)``: the lines starting in that byte
    range of a plain corpus file, read by the worker itself."""
    assert _worker is not None
    cal = _worker
    cal.stats = RunStats.empty(cal.stats.policies)
    problems: list[InputProblem] = []
    for item in chunk:
        if item[0] == "turn":
            cal.add(item[1])
        elif item[0] == "range":
            _read_range(cal, problems, *item[1:])
        else:
            _, path, lineno, line = item
            turn = corpus_line(line, path, lineno, problems.append, _max_line_bytes)
            if turn is not None:
                cal.add(turn)
    return cal.stats, problems


def _read_range(cal: Calibrator, problems: list[InputProblem], path: str, start: int, end: int,
                lineno: int) -> None:
    with open(path, "rb") as f:
        position = 0
        if start:  # the line that began before this range belongs to the previous one
            f.seek(start - 1)
            position = start - 1
            while position < end:  # a line longer than the range: nothing starts in it, stop at its end
                block = f.readline(min(SKIP_BLOCK, end - position))
                if not block:
                    break
                position += len(block)
                if block.endswith(b"\n"):
                    break
            if position >= end:
                return
        add = cal.add
        sink = problems.append
        limit = _max_line_bytes
        for line, size in bounded_lines(f.readline, limit):
            if position >= end:
                break
            position += size
            if line is None:
                sink(too_long(path, lineno, size, limit))
            else:
                turn = corpus_line(line, path, lineno, sink, limit)
                if turn is not None:
                    add(turn)
            lineno += 1


RANGE_BYTES = 2 << 20
"""Plain corpus files are cut into byte ranges of this size, each read by a worker itself."""


def _ranges(path: str, size: int) -> Iterator[tuple[str, str, int, int, int]] | None:
    """Byte-range tasks for a plain corpus file (with each range's first line number), or
    ``None`` for a file the parent must read (gzip, or holding OTLP lines). The file is first
    searched for OTLP lines; the tasks are then made as the workers take them (counting lines
    as they go), so the workers start after one quick pass, not two."""
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b" or _holds(f, OTLP_MARKER):
            return None
    return _range_tasks(path, size)


def _holds(f: Any, marker: bytes) -> bool:
    f.seek(0)
    tail = b""
    while block := f.read(RANGE_BYTES):
        if marker in block or marker in tail + block[: len(marker)]:
            return True
        tail = block[-len(marker):]
    return False


def _range_tasks(path: str, size: int) -> Iterator[tuple[str, str, int, int, int]]:
    newlines = 0
    with open(path, "rb") as f:
        start, ended_line = 0, False
        while start < size:
            block = f.read(RANGE_BYTES)
            if not block:
                break
            # First line of this range: after the first newline at or past start - 1.
            before = newlines - (1 if start and ended_line else 0)
            yield ("range", path, start, start + len(block), before + (2 if start else 1))
            newlines += block.count(b"\n")
            ended_line = block.endswith(b"\n")
            start += len(block)


def _chunks(paths, sizes, on_problem, position: list[int], max_line_bytes: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    size_of_chunk = 0
    done = 0
    spans = OtlpAssembler(on_problem, max_line_bytes=max_line_bytes)  # one stream across the files
    for path, size in zip(paths, sizes, strict=True):
        label = str(path)
        ranges = _ranges(label, size)
        if ranges is not None:
            for task in ranges:
                position[0] = done + task[2]
                yield [task]
            done += size
            position[0] = done
            continue
        with LineSource(path, on_problem, max_line_bytes=max_line_bytes) as source:
            spans.path = label
            for lineno, line in source:
                if is_otlp_line(line):
                    obj = parse_line(line, label, lineno, on_problem, max_line_bytes)
                    if isinstance(obj, dict) and "resourceSpans" in obj:
                        chunk.extend(("turn", t) for t in spans.add(obj, lineno))
                    elif obj is not UNREADABLE:
                        chunk.append(("line", label, lineno, line))
                else:
                    chunk.append(("line", label, lineno, line))
                size_of_chunk += len(line)
                if len(chunk) >= CHUNK_LINES or size_of_chunk >= CHUNK_BYTES:
                    position[0] = done + source.position()
                    yield chunk
                    chunk = []
                    size_of_chunk = 0
        done += size
        position[0] = done
    chunk.extend(("turn", t) for t in spans.finish())
    if chunk:
        yield chunk


def _parallel(paths, sizes, policies, on_problem, group, progress, jobs, max_line_bytes, results) -> RunStats:
    stats = RunStats.empty([policy_info(p) for p in policies])
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    position = [0]
    pending: deque[Any] = deque()

    def collect(result: Any) -> None:
        part, problems = result.get()
        for problem in problems:
            on_problem(problem)
        stats.merge(part)
        progress.update(position[0], stats.calls, stats.turns)

    with ctx.Pool(jobs, initializer=_init, initargs=(policies, group, max_line_bytes, results)) as pool:
        for chunk in _chunks(paths, sizes, on_problem, position, max_line_bytes):
            pending.append(pool.apply_async(_work, (chunk,)))
            while len(pending) >= 2 * jobs:
                collect(pending.popleft())
        while pending:
            collect(pending.popleft())
    progress.update(position[0], stats.calls, stats.turns, force=True)
    return stats

