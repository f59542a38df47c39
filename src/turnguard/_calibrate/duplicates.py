"""The same turn read twice is one turn: two copies of a file, the recorder's file beside the
Collector's of the same fleet, a turn written twice.

A run notes each turn's id hash (``TurnPrints``, 8 bytes); only when an id was counted twice is
the input read again, serially: once to find the ids whose readings differ (``differing``), then
replayed through ``Admission``: a later reading of the same turn is dropped, and an id whose
readings are different turns is a problem at each reading, none counted, whatever the order.
Same turn: what both formats carry agrees (``content_hash``); a reading recorded in part (a
resumed turn's span lists only the calls since the resume) agrees on what it carries, and the
complete reading is the one counted (``Readings``)."""

from __future__ import annotations

import hashlib
import itertools
import json
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from turnguard._calibrate.records import InputProblem, ProblemSink, RecordedTurn, Unreported
from turnguard._guard import SUSPENDED
from turnguard._model import Outcome
from turnguard.telemetry._recorder import MAX_RECORDED_CALLS

SKETCH = 64
"""How many of the smallest id hashes a ``--json`` result keeps (``sketch``): two results whose
sketches share an id hash counted some turn twice (``calibrate merge`` refuses them). A sample, not
an exact check: an overlap is caught with a chance of about ``1 - (1 - f) ** SKETCH``, ``f`` the
shared turns' share of the larger result's turns (docs/calibration.md)."""


def id_hash(turn_id: str) -> int:
    """What a turn id is counted and its late result kept under: an 8-byte BLAKE2b (ids are up to
    256 characters; two of a million ids share one with a chance of about 3 in 100 million)."""
    return int.from_bytes(hashlib.blake2b(turn_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


_OUTCOMES: dict[Outcome | Unreported, str] = {Outcome.OK: "ok", Outcome.ERROR: "error"}
"""A call a halt refused (``denied``, in the recorder's line and read so from its span) is "did
not run" here, and so is a call whose turn ended before its outcome."""
COMPARED_CALLS = MAX_RECORDED_CALLS
"""The calls two readings are compared on: the recorder lists a turn's first 10,000 and counts
the rest; its spans list them all."""

Window = tuple[int, int]
"""Where a reading's listed calls sit in its turn: ``(first, count)``, calls from 0; a reading
recorded in part (a resumed turn's span, a line of calls since a resume) lists its turn's tail."""


def _hash(value: object) -> int:
    return id_hash(json.dumps(value, sort_keys=True, default=repr))


def _calls(turn: RecordedTurn) -> list[list[Any]]:
    outcome = _OUTCOMES.get
    return [[c[0], outcome(c[3], "?"), c[2] if c[2] is not None else c[1]] for c in turn.calls]


def window(turn: RecordedTurn) -> Window:
    """The positions of ``turn``'s listed calls among its turn's first ``COMPARED_CALLS``."""
    first = turn.calls_unrecorded if turn.in_part else 0
    return min(first, COMPARED_CALLS), max(0, min(len(turn.calls), COMPARED_CALLS - first))


def content_hash(turn: RecordedTurn) -> int:
    """What two readings of one turn agree on whichever format they come from: its call count,
    task result and cohort, and per call its tool, outcome and identity (the key digest both the
    recorder's line and the span carry, else a corpus line's arguments as canonical JSON)."""
    return _hash([turn.needed_calls, turn.resolved, turn.cohort, _calls(turn)[:COMPARED_CALLS]])


def _head(turn: RecordedTurn) -> int:
    """What every reading of a turn carries whole: its call count, task result and cohort."""
    return _hash([turn.needed_calls, turn.resolved, turn.cohort])


@dataclass(slots=True)
class TurnPrints:
    """The id hash of every turn counted, flat in one array (8 bytes a turn)."""

    ids: array = field(default_factory=lambda: array("Q"))
    parts: bool = False
    """Whether some turn counted is recorded in part (``differing`` then reads the input once more)."""

    def add(self, turn: RecordedTurn) -> None:
        self.ids.append(id_hash(turn.id))
        self.parts = self.parts or turn.in_part

    def merge(self, other: TurnPrints) -> None:
        self.ids.extend(other.ids)
        self.parts = self.parts or other.parts

    def repeated(self) -> set[int]:
        """Each id hash counted more than once."""
        ids = sorted(self.ids)
        return {a for a, b in itertools.pairwise(ids) if a == b}

    def sketch(self) -> list[str]:
        """The ``SKETCH`` smallest distinct id hashes, as hex."""
        return [f"{h:016x}" for h in sorted(set(self.ids))[:SKETCH]]


def suspended(turn: RecordedTurn) -> bool:
    """A turn span ending a part of a turn: not a turn, not a reading of one (the engine skips it)."""
    return turn.ended_by == SUSPENDED


@dataclass(slots=True)
class Readings:
    """What the readings of the repeated ids say: the windows the readings recorded in part list
    (``windows``, a first read), then whether they agree (``differ``) and which reading of each
    id is counted (``chosen``)."""

    repeated: set[int]
    windows: dict[int, set[Window]] = field(default_factory=dict)
    differ: dict[int, str] = field(default_factory=dict)
    chosen: dict[int, tuple[bool, int, int]] = field(default_factory=dict)
    """By id with a reading recorded in part: the rank of the reading counted (``rank``): a
    complete one if any, else the one listing the most calls, then the earliest in the turn."""

    def note_parts(self, turns: Iterable[RecordedTurn]) -> None:
        """Each window a reading of a repeated id recorded in part lists."""
        for turn in turns:
            key = id_hash(turn.id)
            if key in self.repeated and not suspended(turn) and turn.in_part:
                self.windows.setdefault(key, set()).add(window(turn))

    def compare(self, turns: Iterable[RecordedTurn]) -> None:
        """The ids whose readings are not all one turn, each with where its first reading and the
        first that differs from it are: found before any is counted, so that what is counted never
        depends on the input's order. A reading recorded in part is compared on what it carries:
        the counts, result and cohort, and its calls against the same calls of every reading that
        lists them."""
        first: dict[tuple[int, object], tuple[int, str]] = {}
        for turn in turns:
            key = id_hash(turn.id)
            if key not in self.repeated or suspended(turn):
                continue
            for view, content in self._views(turn, self.windows.get(key, set())):
                kept = first.setdefault((key, view), (content, turn.origin))
                if kept[0] != content and key not in self.differ:
                    self.differ[key] = f"{kept[1]} and {turn.origin}"
            if key in self.windows:
                self.chosen[key] = max(self.chosen.get(key, rank(turn)), rank(turn))

    @staticmethod
    def _views(turn: RecordedTurn, parts: set[Window]) -> list[tuple[object, int]]:
        """What ``turn`` says that another reading of its id must say alike: its counts, result and
        cohort; when complete, all of it; its calls in each window of ``parts`` it lists whole."""
        views: list[tuple[object, int]] = [("head", _head(turn))]
        if not turn.in_part:
            views.append(("whole", content_hash(turn)))
        start, count = window(turn)
        calls = _calls(turn) if parts else []
        for part in sorted(parts):
            at = part[0] - start
            if at >= 0 and part[0] + part[1] <= start + count:
                views.append((part, _hash(calls[at:at + part[1]])))
        return views


def rank(turn: RecordedTurn) -> tuple[bool, int, int]:
    """Which of one turn's readings is counted, the highest: a complete one, else the one listing
    the most calls, then the earliest in the turn."""
    start, count = window(turn)
    return not turn.in_part, count, -start


def differing(read: Callable[[], Iterable[RecordedTurn]], repeated: set[int], parts: bool) -> Readings:
    """The readings of the repeated ids (``Readings``) from ``read()``: once, or twice when
    ``parts`` (some reading is recorded in part: the windows it lists come first)."""
    readings = Readings(repeated)
    if parts:
        readings.note_parts(read())
    readings.compare(read())
    return readings


@dataclass(slots=True)
class Admission:
    """Which readings of the repeated ids (``TurnPrints.repeated``) a second pass counts: the first
    of one turn's readings (of the highest ``rank`` where some is recorded in part); none of an id
    whose readings differ (``differing``), each reported."""

    readings: Readings
    on_problem: ProblemSink
    seen: set[int] = field(default_factory=set)
    dropped: int = 0

    def __call__(self, turn: RecordedTurn) -> bool:
        key = id_hash(turn.id)
        if key not in self.readings.repeated or suspended(turn):
            return True
        places = self.readings.differ.get(key)
        if places is not None:
            path, _, line = turn.origin.rpartition(":")
            self.on_problem(InputProblem(path or turn.origin, int(line) if line.isdigit() else 0,
                                         f"turn {turn.id!r}: different turns under one id (at {places}); "
                                         "none of them is read (one id, one turn)"))
            return False
        best = self.readings.chosen.get(key)
        if key in self.seen or (best is not None and rank(turn) != best):
            self.dropped += 1
            return False
        self.seen.add(key)
        return True
