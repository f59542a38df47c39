"""Late task results: a turn's ``resolved`` reported after the turn was recorded, as a result
record (``{"result_for": ...}``) or a ``turnguard.turn.result`` log (``resourceLogs`` lines).
``late_results`` collects them before the replay; a turn without a result of its own gets the
earliest one, by the time it was taken (the record's ``reported_at``, the log record's time), so
the order of the files does not matter; results without a time (older recorders) come after those
with one, the first read standing. A file without either marker is only scanned in blocks."""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from turnguard._calibrate.bounds import BYTES_PER_RESULT, Bounds
from turnguard._calibrate.collector import RESOLVED_VALUES, attributes, resolved_readable, span_resolved
from turnguard._calibrate.corpus import LOGS_KEY, RESULT_KEY
from turnguard._calibrate.duplicates import id_hash
from turnguard._calibrate.records import (
    MAX_LINE_BYTES,
    MAX_TIME,
    InputProblem,
    LineSource,
    ProblemSink,
    parse_line,
    shown,
    turn_id_text,
)
from turnguard._model import MAX_ID_LENGTH

RESULT_EVENT = "turnguard.turn.result"
"""The log record of a late result."""
REPORTED_AT = "reported_at"
"""A result record's time: when the result was taken, Unix seconds."""
MARKERS = (f'"{RESULT_KEY}"'.encode(), f'"{LOGS_KEY}"'.encode())
LONGEST_MARKER = max(map(len, MARKERS))
MAX_LATE_RESULTS = 1_000_000
"""Results kept at most (at a given ``--max-line-bytes``, ``Bounds.late_results``); past it a
problem is reported and the rest ignored."""

BLOCK = 1 << 16
"""The scan's read size: small, so the scan adds nothing to a run's peak memory."""


Event = tuple[int, int | None, bool | str, float | None]
"""What a line gives: ``(line, id_hash(turn id), resolved, when taken in Unix seconds or None)``
for a result, ``(line, None, message, None)`` for a problem."""


def late_results(paths: Iterable[str | Path], on_problem: ProblemSink, *,
                 max_line_bytes: int = MAX_LINE_BYTES) -> dict[int, bool]:
    """``id_hash(turn id)`` -> the earliest late result reported for it, from every input."""
    book = ResultBook(on_problem, max_line_bytes)
    for path in paths:
        if may_hold_results(path):
            book.add(str(path), file_results(path, max_line_bytes))
    return book.results


class ResultBook:
    """The results kept, up to the bound: a turn's earliest by the time it was taken (a tie: the
    first read), then, when none of its results has a time, the first read."""

    def __init__(self, on_problem: ProblemSink, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.on_problem = on_problem
        self.results: dict[int, bool] = {}
        self.times: dict[int, float] = {}
        """The time of each result kept that has one."""
        self.most = min(MAX_LATE_RESULTS, Bounds(max_line_bytes).late_results)
        self._full = False

    def add(self, path: str, events: Iterable[Event], first_line: int = 1) -> None:
        """Take a file's (or a part's) events; their lines count from ``first_line``."""
        results, times, shift = self.results, self.times, first_line - 1
        for lineno, key, what, at in events:
            if key is None:
                self.on_problem(InputProblem(path, lineno + shift, str(what)))
            elif key in results:
                if at is not None and at < times.get(key, math.inf):
                    results[key], times[key] = bool(what), at
            elif len(results) < self.most:
                results[key] = bool(what)
                if at is not None:
                    times[key] = at
            elif not self._full:
                self._full = True
                self.on_problem(InputProblem(path, lineno + shift, f"more than {self.most:,} late results "
                                                                   f"(--max-line-bytes / {BYTES_PER_RESULT}): "
                                                                   "the rest are ignored"))


def file_results(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Event]:
    """The events of every line of one file (gzip or not), as they are read."""
    events: list[Event] = []
    with LineSource(path, None, max_line_bytes=max_line_bytes) as source:  # the replay reports long lines
        for lineno, line in source:
            line_results(line, lineno, events, max_line_bytes)
            if events:
                yield from events
                events.clear()


def line_results(line: bytes, lineno: int, events: list[Event], max_line_bytes: int = MAX_LINE_BYTES) -> None:
    """Append the events of one line: a result record's, or those of an OTLP logs document's
    ``turnguard.turn.result`` records; lines without a marker are not parsed."""
    if not any(m in line for m in MARKERS):
        return
    obj = parse_line(line, "", lineno, lambda p: None, max_line_bytes)  # the replay reports it
    if not isinstance(obj, dict):
        return
    if RESULT_KEY in obj:
        _record(obj, lineno, events)
    elif LOGS_KEY in obj:
        _logs(obj, lineno, events)


def _record(obj: dict[str, Any], lineno: int, events: list[Event]) -> None:
    turn_id: Any = obj.get(RESULT_KEY)
    resolved = obj.get("resolved")
    text = turn_id_text(turn_id)
    if text is None or not isinstance(resolved, bool):
        events.append((lineno, None, f"a result record needs {RESULT_KEY!r} (a turn id of at most {MAX_ID_LENGTH} "
                                     f"characters) and 'resolved' (true or false), got {RESULT_KEY}={shown(turn_id)}, "
                                     f"resolved={shown(resolved)}", None))
        return
    at = obj.get(REPORTED_AT)
    if at is not None and not _time(at):
        events.append((lineno, None, f"a result record's {REPORTED_AT!r} is no Unix time in seconds: {shown(at)}; "
                                     "read as a result without a time", None))
        at = None
    events.append((lineno, id_hash(text), resolved, None if at is None else float(at)))


def _time(value: Any) -> bool:
    """A result's time: Unix seconds after 1970 and in range (``records.MAX_TIME``)."""
    return type(value) in (int, float) and 0 < value <= MAX_TIME


def _log_time(record: dict[str, Any]) -> float | str | None:
    """A log record's time in Unix seconds: its ``timeUnixNano``, else (unset: 0 or absent) its
    ``observedTimeUnixNano``, as OTLP reads it; ``None`` without either; a text when garbled."""
    for name in ("timeUnixNano", "observedTimeUnixNano"):
        raw = record.get(name)
        if raw in (None, 0, "0"):
            continue
        try:
            at = int(raw) / 1e9 if type(raw) in (int, str) else None
        except (ValueError, OverflowError):
            at = None
        return at if at is not None and _time(at) else f"its {name} is no time: {shown(raw)}"
    return None


def _logs(obj: dict[str, Any], lineno: int, events: list[Event]) -> None:
    """``turnguard.turn.result`` records of an OTLP logs document (other records are not ours)."""
    for resource in _list(obj.get(LOGS_KEY)):
        for scope in _list(resource.get("scopeLogs") if isinstance(resource, dict) else None):
            for record in _list(scope.get("logRecords") if isinstance(scope, dict) else None):
                if not isinstance(record, dict):
                    continue
                attrs = attributes(record.get("attributes"))
                if record.get("eventName", attrs.get("event.name")) != RESULT_EVENT:
                    continue
                turn_id, raw = attrs.get("turnguard.turn.id"), attrs.get("turnguard.turn.resolved")
                resolved = span_resolved(raw)
                if turn_id is None:
                    continue  # not about a turn
                text = turn_id_text(turn_id)  # bounded: no record can grow the results' memory
                if text is None:
                    events.append((lineno, None, f"a {RESULT_EVENT} record without a turn id of at most "
                                                 f"{MAX_ID_LENGTH} characters: {shown(turn_id)}; ignored", None))
                elif not resolved_readable(raw):
                    events.append((lineno, None, f"a {RESULT_EVENT} record whose turnguard.turn.resolved is not "
                                                 f"{RESOLVED_VALUES}: {shown(raw)}; ignored", None))
                elif resolved is not None:
                    at = _log_time(record)
                    if isinstance(at, str):
                        events.append((lineno, None, f"a {RESULT_EVENT} record: {at}; read as a result without a "
                                                     "time", None))
                        at = None
                    events.append((lineno, id_hash(text), resolved, at))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def may_hold_results(path: str | Path) -> bool:
    """Whether a marker occurs anywhere in the (decompressed) file: a block scan, no parsing."""
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            f: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
            tail = b""
            while block := f.read(BLOCK):
                if marked(tail, block):
                    return True
                tail = block[-LONGEST_MARKER:]
    except (OSError, EOFError, zlib.error):
        return False  # the replay's own reading reports the file
    return False


def marked(tail: bytes, block: bytes) -> bool:
    """Whether a marker occurs in ``block``, or across its seam with the ``tail`` read before it."""
    seam = tail + block[:LONGEST_MARKER]
    return any(m in block or m in seam for m in MARKERS)
