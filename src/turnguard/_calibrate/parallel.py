"""Running a calibration over worker processes: workers read the files in byte ranges, the parent
joins the ranges in stream order exactly as one reader would have read them (gzip files are one
task each, read by the parent).

Pass 1: workers read each range's late results and count its lines; the parent keeps the results
in stream order. Pass 2: workers read their ranges with an assembler of their own
(``OtlpAssembler(hold=True)``); the parent joins each to the stream (``take_range``), and the
worker replays the range's turns; the parent merges their figures in stream order. A range that
cannot be joined exactly is read again by the parent. Problems are reported in stream order, and
each worker holds at most ``AHEAD`` ranges read and not yet replayed."""

from __future__ import annotations

import gc
import multiprocessing
import queue
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from turnguard._calibrate.collector import Emitted, HeldTurn, OtlpAssembler
from turnguard._calibrate.engine import Calibrator, policy_info
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_line, read_source
from turnguard._calibrate.records import (
    READ_BUFFER,
    SKIP_BLOCK,
    InputError,
    InputProblem,
    LineSource,
    ProblemSink,
    RecordedTurn,
    bounded_lines,
    too_long,
)
from turnguard._calibrate.results import LONGEST_MARKER, Event, ResultBook, file_results, line_results, marked
from turnguard._calibrate.stats import RunStats

AHEAD = 3
"""Ranges a worker holds at most: being read, read and waiting for their join, or replaying."""
CHUNK_TURNS = 500
"""Turns the parent reads itself (gzip files, ranges it reads again) go to the workers in chunks
of this many."""
SCAN_BLOCK = 1 << 20
WAIT_S = 0.5
"""How often the parent, waiting for a worker, checks that every worker is still running."""

Task = tuple[str, str, int, int]
"""``("range", path, start, end)``, or ``("file", path, 0, size)`` for a file read whole."""


class WorkerFailed(RuntimeError):
    """A worker process raised, or stopped without saying why."""


TAIL_SPLIT = 4
"""The stream's last ranges are cut this many times finer, so that the workers finish together."""


def plan(paths: Sequence[str | Path], sizes: Sequence[int], range_bytes: int, jobs: int = 1) -> list[Task]:
    """The tasks of a run in stream order: byte ranges of the plain files (finer at the end,
    ``TAIL_SPLIT``), gzip files whole."""
    tasks = _whole_ranges(paths, sizes, range_bytes)
    if jobs <= 1:
        return tasks
    tail: list[Task] = []
    left, piece = jobs * range_bytes, max(1, range_bytes // TAIL_SPLIT)
    while tasks and tasks[-1][0] == "range" and left > 0:
        _, label, start, end = tasks.pop()
        left -= end - start
        tail[:0] = [("range", label, a, min(end, a + piece)) for a in range(start, end, piece)]
    return tasks + tail


def _whole_ranges(paths: Sequence[str | Path], sizes: Sequence[int], range_bytes: int) -> list[Task]:
    tasks: list[Task] = []
    for path, size in zip(paths, sizes, strict=True):
        label = str(path)
        try:
            with open(label, "rb") as f:
                gzipped = f.read(2) == b"\x1f\x8b"
        except OSError as exc:
            raise InputError(f"{label}: cannot open: {exc.strerror or exc}") from exc
        if gzipped:
            tasks.append(("file", label, 0, size))
            continue
        tasks.extend(("range", label, start, min(size, start + range_bytes)) for start in range(0, size, range_bytes))
    return tasks


def range_lines(f: BinaryIO, start: int, end: int, lineno: int, path: str, on_problem: ProblemSink | None,
                limit: int) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` for the lines that start in bytes ``start..end-1`` of ``f`` (the line
    begun before ``start`` is the previous range's); a line past ``limit`` is reported and skipped."""
    position = 0
    f.seek(max(0, start - 1))
    if start:
        position = start - 1
        while position < end:
            block = f.readline(min(SKIP_BLOCK, end - position))
            if not block:
                break
            position += len(block)
            if block.endswith(b"\n"):
                break
        if position >= end:
            return
    for line, size in bounded_lines(f.readline, limit):
        if position >= end:
            break
        position += size
        if line is not None:
            yield lineno, line
        elif on_problem is not None:
            on_problem(too_long(path, lineno, size, limit))
        lineno += 1


# -- what a worker does -----------------------------------------------------------------------------


def scan_range(path: str, start: int, end: int, max_line_bytes: int) -> tuple[int, bool, list[Event]]:
    """Pass 1 on a range: its newlines, whether its last byte is one, and its late results (lines
    numbered from 1); only a range holding a marker has its lines read."""
    newlines, found, last, tail = 0, False, b"", b""
    with open(path, "rb") as f:
        f.seek(start)
        position = start
        while position < end and (block := f.read(min(SCAN_BLOCK, end - position))):
            newlines += _count_newlines(block)
            found = found or marked(tail, block)
            tail, last = block[-LONGEST_MARKER:], block[-1:]
            position += len(block)
        while not found and last != b"\n" and (block := f.readline(SKIP_BLOCK)):  # the rest of its last line
            found = marked(tail, block)
            tail, last = block[-LONGEST_MARKER:], block[-1:]
    events: list[Event] = []
    if found:
        with open(path, "rb", buffering=READ_BUFFER) as f:
            for lineno, line in range_lines(f, start, end, 1, path, None, max_line_bytes):
                line_results(line, lineno, events, max_line_bytes)
    with open(path, "rb") as f:
        f.seek(end - 1)
        ends_line = f.read(1) == b"\n"
    return newlines, ends_line, events


def _count_newlines(block: bytes) -> int:
    """``block.count(b"\\n")``, by ``find`` (a memchr): several times faster on long lines."""
    n, i = 0, block.find(b"\n")
    while i >= 0:
        n += 1
        i = block.find(b"\n", i + 1)
    return n


Summary = tuple[list[Emitted], list[Any], int, bool]
"""What the parent needs to join a range: its assembler's ``emitted``, ``leftovers()``,
``most_waiting`` and ``released``."""


def read_range(path: str, start: int, end: int, lineno: int, max_line_bytes: int
               ) -> tuple[list[RecordedTurn | HeldTurn], Summary | None, list[InputProblem]]:
    """Pass 2 on a range: its turns (``HeldTurn`` for those of turn spans), what joining it needs
    (``None``: it holds no span, nothing to join), and its problems in line order."""
    problems: list[InputProblem] = []
    spans = OtlpAssembler(problems.append, path, max_line_bytes=max_line_bytes, hold=True)
    items: list[RecordedTurn | HeldTurn] = []
    try:
        with open(path, "rb", buffering=READ_BUFFER) as f:
            for number, line in range_lines(f, start, end, lineno, path, problems.append, max_line_bytes):
                items.extend(read_line(line, path, number, problems.append, max_line_bytes, spans))
    except OSError as exc:
        problems.append(InputProblem(path, 0, f"file ends badly: {exc}"))
    if not spans.emitted and not spans.released and not spans.leftovers():
        return items, None, problems
    return items, (spans.emitted, spans.leftovers(), spans.most_waiting, spans.released), problems


def _replayed(calibrator: Calibrator, turns: Iterable[RecordedTurn]) -> RunStats:
    calibrator.stats = RunStats.empty(calibrator.stats.policies)
    return calibrator.add_all(turns)


def _joined(items: list[RecordedTurn | HeldTurn], stitched: dict[int, tuple[list[Any], list[Any]]]
            ) -> Iterator[RecordedTurn]:
    held = 0
    for item in items:
        if isinstance(item, HeldTurn):
            yield item.build(*stitched.get(held, ((), ())))
            held += 1
        else:
            yield item


@dataclass(frozen=True, slots=True)
class Setup:
    """What every worker is started with."""

    policies: list[Policy]
    group: bool
    max_line_bytes: int
    gc_threshold: tuple[int, int, int]


def serve(inbox: Any, outbox: Any, setup: Setup) -> None:
    """A worker's loop: one command at a time from ``inbox`` (reads first, ``next_command``), its
    answer to ``outbox``; ``None`` ends it."""
    gc.set_threshold(*setup.gc_threshold)
    limit = setup.max_line_bytes
    calibrator: Calibrator | None = None
    held: dict[int, list[RecordedTurn | HeldTurn]] = {}
    try:
        backlog: deque[Any] = deque()
        while (command := next_command(inbox, backlog)) is not None:
            kind, ident = command[0], command[1]
            if kind == "scan":
                _, _, path, start, end = command
                outbox.put(("scanned", ident, scan_range(path, start, end, limit)))
            elif kind == "scan_file":
                outbox.put(("scanned", ident, (0, True, list(file_results(command[2], limit)))))
            elif kind == "results":
                calibrator = Calibrator(setup.policies, group=setup.group, results=command[2])
            elif kind == "read":
                assert calibrator is not None
                _, _, path, start, end, lineno = command
                items, summary, problems = read_range(path, start, end, lineno, limit)
                if summary is None:
                    outbox.put(("read", ident, None, problems, _replayed(calibrator, items)))  # type: ignore[arg-type]
                else:
                    held[ident] = items
                    outbox.put(("read", ident, summary, problems, None))
            elif kind == "join":
                assert calibrator is not None
                outbox.put(("replayed", command[2], _replayed(calibrator, _joined(held.pop(ident), command[3]))))
            elif kind == "drop":
                held.pop(ident, None)
            elif kind == "turns":
                assert calibrator is not None
                outbox.put(("replayed", ident, _replayed(calibrator, command[2])))
    except BaseException:  # whatever it is, the parent reports it and stops the run
        outbox.put(("failed", None, traceback.format_exc()))


REPLAYS = frozenset(("join", "turns", "drop"))


def next_command(inbox: Any, backlog: deque[Any]) -> Any:
    """The worker's next command: in order, except that a read goes before the replays waiting
    ahead of it (the parent waits for reads, not for replays)."""
    while True:
        try:
            backlog.append(inbox.get_nowait())
        except queue.Empty:
            break
    if not backlog:
        return inbox.get()
    for i, command in enumerate(backlog):
        if command is None or command[0] not in REPLAYS:
            if i and command is not None and command[0] == "read":
                del backlog[i]
                return command
            break
    return backlog.popleft()


# -- what the parent does ---------------------------------------------------------------------------


class Workers:
    """The worker processes, each with its own inbox, and one outbox for all their answers."""

    def __init__(self, jobs: int, setup: Setup) -> None:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        ctx: Any = multiprocessing.get_context(method)
        self.outbox: Any = ctx.Queue()
        self.inboxes: list[Any] = [ctx.Queue() for _ in range(jobs)]
        self.processes = [ctx.Process(target=serve, args=(inbox, self.outbox, setup), daemon=True)
                          for inbox in self.inboxes]
        for process in self.processes:
            process.start()
        self.load = [0] * jobs
        """Tasks each worker holds (``AHEAD`` at most for ranges)."""

    def send(self, worker: int, command: tuple[Any, ...]) -> None:
        self.inboxes[worker].put(command)

    def idlest(self) -> int:
        return min(range(len(self.load)), key=self.load.__getitem__)

    def answer(self) -> tuple[Any, ...]:
        """The next answer; ``WorkerFailed`` when a worker raised or died."""
        while True:
            try:
                message = self.outbox.get(timeout=WAIT_S)
            except queue.Empty:
                dead = [p for p in self.processes if p.exitcode is not None]
                if dead:
                    raise WorkerFailed(f"a calibrate worker process stopped (exit code {dead[0].exitcode})") from None
                continue
            if message[0] == "failed":
                raise WorkerFailed(f"a calibrate worker failed:\n{message[2]}")
            return message

    def close(self, *, wait: bool) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            if wait:
                process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for q in (*self.inboxes, self.outbox):
            q.cancel_join_thread()
            q.close()


def late_results(workers: Workers, tasks: Sequence[Task], on_problem: ProblemSink, max_line_bytes: int
                 ) -> tuple[dict[int, bool], list[int]]:
    """Pass 1: the late results of every task kept in stream order, and each task's first line."""
    for i, (kind, path, start, end) in enumerate(tasks):
        command = ("scan", i, path, start, end) if kind == "range" else ("scan_file", i, path)
        workers.send(i % len(workers.inboxes), command)
    scans: dict[int, tuple[int, bool, list[Event]]] = {}
    while len(scans) < len(tasks):
        _, ident, scan = workers.answer()
        scans[ident] = scan
    book = ResultBook(on_problem, max_line_bytes)
    first_lines: list[int] = []
    newlines, ended, current = 0, True, None
    for i, (_, path, start, _) in enumerate(tasks):
        if path != current or not start:
            newlines, ended, current = 0, True, path
        first = 1 if not start else newlines + (1 if ended else 2)
        first_lines.append(first)
        count, ended, events = scans.pop(i)
        newlines += count
        book.add(path, events, first)
    return book.results, first_lines


@dataclass
class _Slot:
    """A part of the stream to merge, in order: its problems, then its figures (``pending``: a
    worker is replaying it); ``position``: the bytes read once it is merged."""

    index: int
    position: int
    problems: list[InputProblem] = field(default_factory=list)
    stats: RunStats | None = None
    pending: bool = False


class Stream:
    """Pass 2, in the parent: tasks handed out, ranges joined, figures merged, all in stream order."""

    def __init__(self, workers: Workers, tasks: Sequence[Task], first_lines: Sequence[int], on_problem: ProblemSink,
                 stats: RunStats, max_line_bytes: int, progress: Callable[[int], None]) -> None:
        self.workers, self.tasks, self.first_lines = workers, tasks, first_lines
        self.on_problem, self.stats, self.progress = on_problem, stats, progress
        self.max_line_bytes = max_line_bytes
        self.spans = OtlpAssembler(self._problem, max_line_bytes=max_line_bytes)
        """The stream's assembler: what one reader's would hold (calls waiting across ranges)."""
        self.slots: dict[int, _Slot] = {}
        self.slot_count = self.merged = 0
        self.reads: dict[int, tuple[Summary | None, list[InputProblem], RunStats | None]] = {}
        self.owner: dict[int, int] = {}
        """By task: the worker reading it, until it is joined."""
        self.replaying: dict[int, int] = {}
        """By slot: the worker replaying a range it read, until the figures are back."""
        self.next_task = self.frontier = 0
        self.after = _positions(tasks)
        self._current: _Slot | None = None

    def run(self) -> None:
        while self.frontier < len(self.tasks):
            self._hand_out()
            while self.frontier < len(self.tasks) and self._join(self.frontier):
                self.frontier += 1
                self._hand_out()
                self._merge()
            if self.frontier < len(self.tasks):
                self._take(self.workers.answer())
                self._merge()
        self._current = self._new_slot(self.after[-1] if self.after else 0)
        self._send_turns(self._current, list(self.spans.finish()))
        self._current = None
        while self.merged < self.slot_count:
            self._merge()
            if self.merged < self.slot_count:
                self._take(self.workers.answer())

    def _hand_out(self) -> None:
        while self.next_task < len(self.tasks):
            kind, path, start, end = self.tasks[self.next_task]
            if kind == "range":
                worker = self.workers.idlest()
                if self.workers.load[worker] >= AHEAD:
                    return
                self.workers.load[worker] += 1
                self.owner[self.next_task] = worker
                self.workers.send(worker, ("read", self.next_task, path, start, end, self.first_lines[self.next_task]))
            self.next_task += 1

    def _take(self, message: tuple[Any, ...]) -> None:
        if message[0] == "read":
            _, ident, summary, problems, stats = message
            self.reads[ident] = (summary, problems, stats)
            if summary is None:
                self.workers.load[self.owner[ident]] -= 1
        else:
            _, index, stats = message
            slot = self.slots[index]
            slot.stats, slot.pending = stats, False
            worker = self.replaying.pop(index, None)
            if worker is not None:
                self.workers.load[worker] -= 1

    def _join(self, i: int) -> bool:
        """Join task ``i`` to the stream (``False``: its reading is not back yet)."""
        kind, path, start, end = self.tasks[i]
        if kind == "file":
            self._read_here(path, None, self._new_slot(self.after[i]))
            return True
        if i not in self.reads:
            return False
        summary, problems, stats = self.reads.pop(i)
        worker = self.owner.pop(i)
        slot = self._new_slot(self.after[i])
        if summary is None:
            slot.problems, slot.stats = problems, stats
            return True
        stitched = None if summary[3] else self.spans.take_range(summary[0], summary[1], summary[2])
        if stitched is None:  # one reader could have read it otherwise: read it here
            self.workers.load[worker] -= 1
            self.workers.send(worker, ("drop", i))
            self._read_here(path, (start, end, self.first_lines[i]), slot)
            return True
        slot.problems, slot.pending = problems, True
        self.replaying[slot.index] = worker
        self.workers.send(worker, ("join", i, slot.index, stitched))
        return True

    def _read_here(self, path: str, span: tuple[int, int, int] | None, slot: _Slot) -> None:
        """Read a whole file (``span`` ``None``) or a range of one with the stream's assembler;
        its turns go to the workers in chunks, its problems to the slots in order."""
        self._current = slot
        turns: list[RecordedTurn] = []
        self.spans.path = path
        limit = self.max_line_bytes
        if span is None:
            with LineSource(path, self._problem, max_line_bytes=limit) as source:
                self._chunked(read_source(source, self._problem, self.spans), turns, slot.position)
        else:
            with open(path, "rb", buffering=READ_BUFFER) as f:
                for number, line in range_lines(f, *span, path, self._problem, limit):
                    self._chunked(read_line(line, path, number, self._problem, limit, self.spans), turns,
                                  slot.position)
        self._send_turns(self._current, turns)
        self._current = None

    def _chunked(self, found: Iterable[RecordedTurn], turns: list[RecordedTurn], position: int) -> None:
        for turn in found:
            turns.append(turn)
            if len(turns) >= CHUNK_TURNS:
                assert self._current is not None
                self._send_turns(self._current, turns[:])
                turns.clear()
                self._current = self._new_slot(position)

    def _send_turns(self, slot: _Slot, turns: list[RecordedTurn]) -> None:
        if turns:
            slot.pending = True
            self.workers.send(self.workers.idlest(), ("turns", slot.index, turns))

    def _problem(self, problem: InputProblem) -> None:
        if self._current is None:  # (every reading here has its slot; a problem outside one gets one)
            self._current = self._new_slot(self.after[self.frontier] if self.frontier < len(self.after) else 0)
        self._current.problems.append(problem)

    def _new_slot(self, position: int) -> _Slot:
        slot = self.slots[self.slot_count] = _Slot(self.slot_count, position)
        self.slot_count += 1
        return slot

    def _merge(self) -> None:
        while self.merged < self.slot_count and not self.slots[self.merged].pending:
            slot = self.slots.pop(self.merged)
            self.merged += 1
            for problem in slot.problems:
                self.on_problem(problem)
            if slot.stats is not None:
                self.stats.merge(slot.stats)
            self.progress(slot.position)


def _positions(tasks: Sequence[Task]) -> list[int]:
    """The bytes read once each task is: the files before it, and its end within its own."""
    after: list[int] = []
    base, current, size = 0, None, 0
    for _, path, _, end in tasks:
        if path != current:
            base, current = base + size, path
        size = end
        after.append(base + end)
    return after


def calibrate_in_workers(paths: Sequence[str | Path], sizes: Sequence[int], policies: list[Policy], *,
                         on_problem: ProblemSink, group: bool, jobs: int, max_line_bytes: int, range_bytes: int,
                         gc_threshold: tuple[int, int, int], progress: Callable[[int, RunStats], None]) -> RunStats:
    """``run.calibrate`` with ``jobs`` worker processes (see the module's docstring)."""
    tasks = plan(paths, sizes, range_bytes, jobs)
    stats = RunStats.empty([policy_info(p) for p in policies])
    workers = Workers(jobs, Setup(policies, group, max_line_bytes, gc_threshold))
    finished = False
    try:
        results, first_lines = late_results(workers, tasks, on_problem, max_line_bytes)
        for worker in range(jobs):
            workers.send(worker, ("results", worker, results))
        Stream(workers, tasks, first_lines, on_problem, stats, max_line_bytes,
               lambda position: progress(position, stats)).run()
        finished = True
    finally:
        workers.close(wait=finished)
    return stats
