"""The same turn read twice is one turn: two copies of a file, the recorder's file beside the
Collector's of the same fleet, a turn written twice.

A run notes each turn's id hash (``TurnPrints``, 8 bytes); only when an id was counted twice is
the input read again, serially: once to find the ids whose readings differ (``differing``), then
replayed through ``Admission``: a later reading of the same turn is dropped, and an id whose
readings are different turns is a problem at each reading, none counted, whatever the order.
Same turn: what both formats carry agrees (``content_hash``)."""

from __future__ import annotations

import hashlib
import itertools
import json
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

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


def content_hash(turn: RecordedTurn) -> int:
    """What two readings of one turn agree on whichever format they come from: its call count,
    task result and cohort, and per call its tool, outcome and identity (the key digest both the
    recorder's line and the span carry, else a corpus line's arguments as canonical JSON)."""
    outcome = _OUTCOMES.get
    calls = [[c[0], outcome(c[3], "?"), c[2] if c[2] is not None else c[1]] for c in turn.calls[:COMPARED_CALLS]]
    text = json.dumps([turn.needed_calls, turn.resolved, turn.cohort, calls], sort_keys=True, default=repr)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


@dataclass(slots=True)
class TurnPrints:
    """The id hash of every turn counted, flat in one array (8 bytes a turn)."""

    ids: array = field(default_factory=lambda: array("Q"))

    def add(self, turn: RecordedTurn) -> None:
        self.ids.append(id_hash(turn.id))

    def merge(self, other: TurnPrints) -> None:
        self.ids.extend(other.ids)

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


def differing(turns: Iterable[RecordedTurn], repeated: set[int]) -> dict[int, str]:
    """The repeated ids whose readings are not all one turn, each with where its first reading and
    the first that differs from it are: found before any is counted, so that what is counted never
    depends on the input's order."""
    first: dict[int, tuple[int, str]] = {}
    out: dict[int, str] = {}
    for turn in turns:
        key = id_hash(turn.id)
        if key not in repeated or suspended(turn):
            continue
        content = content_hash(turn)
        seen = first.setdefault(key, (content, turn.origin))
        if seen[0] != content and key not in out:
            out[key] = f"{seen[1]} and {turn.origin}"
    return out


@dataclass(slots=True)
class Admission:
    """Which readings of the repeated ids (``TurnPrints.repeated``) a second pass counts: the first
    of one turn's readings; none of an id whose readings differ (``differing``), each reported."""

    repeated: set[int]
    differ: dict[int, str]
    on_problem: ProblemSink
    seen: set[int] = field(default_factory=set)
    dropped: int = 0

    def __call__(self, turn: RecordedTurn) -> bool:
        key = id_hash(turn.id)
        if key not in self.repeated or suspended(turn):
            return True
        places = self.differ.get(key)
        if places is not None:
            path, _, line = turn.origin.rpartition(":")
            self.on_problem(InputProblem(path or turn.origin, int(line) if line.isdigit() else 0,
                                         f"turn {turn.id!r}: different turns under one id (at {places}); "
                                         "none of them is read (one id, one turn)"))
            return False
        if key in self.seen:
            self.dropped += 1
            return False
        self.seen.add(key)
        return True
