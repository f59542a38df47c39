"""Running a calibration over files: serially, or over worker processes (``parallel.py``, with
the figures and problems of one process), with a progress bar."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from turnguard._calibrate.advice import DEFAULT_TOLERANCE
from turnguard._calibrate.collector import OtlpAssembler
from turnguard._calibrate.duplicates import Admission, differing
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_source, read_turns
from turnguard._calibrate.parallel import calibrate_in_workers
from turnguard._calibrate.records import (
    MAX_LINE_BYTES,
    InputError,
    InputProblem,
    LineSource,
    ProblemSink,
    RecordedTurn,
)
from turnguard._calibrate.results import late_results
from turnguard._calibrate.stats import RunStats
from turnguard._terminal import shown


class StrictError(InputError):
    """``--strict``: the first input problem stops the run."""


class Progress:
    """A ``tqdm`` progress bar on ``stream`` when it is a terminal and tqdm is installed, fitted to
    its width: bytes read, turns, calls, rate and time left."""

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
    """Replay every turn of ``paths`` under every policy; problems go to ``on_problem`` (and raise
    ``StrictError`` under ``strict``)."""
    counted = _Counter(on_problem, strict)
    sizes = input_sizes(paths)
    progress = progress or Progress(sum(sizes), enabled=False)
    try:
        with rare_collections():
            if jobs <= 1:
                stats = _serial(paths, sizes, policies, counted, group, progress, max_line_bytes)
            else:
                stats = calibrate_in_workers(
                    paths, sizes, policies, on_problem=counted, group=group, jobs=jobs, max_line_bytes=max_line_bytes,
                    range_bytes=range_bytes(max_line_bytes), gc_threshold=GC_THRESHOLD,
                    progress=lambda done, stats: progress.update(done, stats.calls, stats.turns))
    finally:
        progress.close()
    repeated = stats.prints.repeated()
    if repeated:
        stats = _without_repeats(paths, sizes, policies, counted, group, max_line_bytes, repeated,
                                 stats.prints.parts)
    stats.problems = counted.count
    stats.inputs = [shown(p) for p in paths]
    stats.tolerance, stats.probe_rate = tolerance, probe_rate
    return stats


def _without_repeats(paths, sizes, policies, counted, group, max_line_bytes, repeated, parts) -> RunStats:
    """The run again, serially, each repeated turn counted once (``duplicates.Admission``): its
    input problems were reported by the first run, only the repeats' are new."""
    quiet = _Counter(lambda problem: None, strict=False)
    admit = Admission(differing(lambda: read_turns(paths, quiet, max_line_bytes=max_line_bytes), repeated, parts),
                      counted)
    with rare_collections():
        stats = _serial(paths, sizes, policies, quiet, group, Progress(0, enabled=False), max_line_bytes, admit)
    stats.duplicates = admit.dropped
    return stats


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
"""The first bytes of a zstd frame: a backup compressed so (``.zst``) is named, not read."""


def input_sizes(paths: Sequence[str | Path]) -> list[int]:
    """Each input's size on disk; ``InputError`` naming the first that cannot be read (a zstd
    file among them: Python reads gzip, not zstd, and its lines would all read as not JSON)."""
    sizes = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                if f.read(4) == ZSTD_MAGIC:
                    raise InputError(f"{p}: compressed with zstd, which calibrate does not read: decompress it "
                                     f"first (zstd -d) and name the result")
            sizes.append(os.path.getsize(p))
        except OSError as exc:
            raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from exc
    return sizes


GC_THRESHOLD = (100_000, 50, 100)
"""Cyclic-GC thresholds during a run: a replay's millions of short-lived objects have no
cycles, and the default thresholds would scan them for nothing (about 6% of a run)."""


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


def _serial(paths, sizes, policies, on_problem, group, progress, max_line_bytes,
            admit: Callable[[RecordedTurn], bool] | None = None) -> RunStats:
    cal = Calibrator(policies, group=group, results=late_results(paths, on_problem, max_line_bytes=max_line_bytes))
    done = 0
    spans = OtlpAssembler(on_problem, max_line_bytes=max_line_bytes)  # one stream across a rotated set
    for path, size in zip(paths, sizes, strict=True):
        with LineSource(path, on_problem, max_line_bytes=max_line_bytes) as source:
            for i, turn in enumerate(read_source(source, on_problem, spans)):
                if admit is None or admit(turn):
                    cal.add(turn)
                if not i & 63:
                    progress.update(done + source.position(), cal.stats.calls, cal.stats.turns)
        done += size
    for turn in spans.finish():
        if admit is None or admit(turn):
            cal.add(turn)
    progress.update(done, cal.stats.calls, cal.stats.turns, force=True)
    return cal.stats


RANGE_BYTES = 8 << 20
"""With worker processes, plain files are cut into byte ranges of this size (at most a quarter
of ``--max-line-bytes``, at least 64 KiB: a worker holds a few ranges' turns at a time)."""


def range_bytes(max_line_bytes: int) -> int:
    return min(RANGE_BYTES, max(64 << 10, max_line_bytes // 4))
