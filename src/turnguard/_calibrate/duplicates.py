"""The same turn read twice is one turn: two copies of a file, the recorder's file beside the
Collector's of the same fleet, a turn written twice.

A run notes each turn as ``(id hash, content hash)`` (``TurnPrints``, 16 bytes); only when an id
was counted twice is the input read again, serially, through ``Admission``: a later reading of the
same turn is dropped, a different turn under a known id is a problem. Same turn: the same tools
and outcomes in order and the same number of calls, on which both formats agree."""

from __future__ import annotations

import hashlib
import itertools
from array import array
from dataclasses import dataclass, field

from turnguard._calibrate.records import InputProblem, ProblemSink, RecordedTurn
from turnguard._model import Outcome

SKETCH = 64
"""How many of the smallest id hashes a ``--json`` result keeps (``sketch``): two results whose
sketches share an id hash counted some turn twice (``calibrate merge`` refuses them)."""


def id_hash(turn_id: str) -> int:
    """What a turn id is counted and its late result kept under: an 8-byte BLAKE2b (ids are up to
    256 characters; two of a million ids share one with a chance of about 3 in 100 million)."""
    return int.from_bytes(hashlib.blake2b(turn_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


_OUTCOME_BYTES = {Outcome.OK: "\x00ok\x00", Outcome.ERROR: "\x00error\x00"}
"""A halted call is ``denied`` in the recorder's line and of unknown outcome on its span: both
are "did not run" here."""


def content_hash(turn: RecordedTurn) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(turn.needed_calls.to_bytes(8, "big"))
    outcome = _OUTCOME_BYTES.get
    h.update("".join([c[0] + outcome(c[3], "\x00?\x00") for c in turn.calls]).encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "big")


@dataclass(slots=True)
class TurnPrints:
    """The ``(id hash, content hash)`` of every turn counted, flat in one array."""

    pairs: array = field(default_factory=lambda: array("Q"))

    def add(self, turn: RecordedTurn) -> None:
        self.pairs.append(id_hash(turn.id))
        self.pairs.append(content_hash(turn))

    def merge(self, other: TurnPrints) -> None:
        self.pairs.extend(other.pairs)

    def repeated(self) -> dict[int, bool]:
        """Each id hash counted more than once: whether its readings are all one turn."""
        pairs = sorted(zip(self.pairs[::2], self.pairs[1::2], strict=True))
        out: dict[int, bool] = {}
        for (a, x), (b, y) in itertools.pairwise(pairs):
            if a == b:
                out[a] = out.get(a, True) and x == y
        return out

    def sketch(self) -> list[str]:
        """The ``SKETCH`` smallest distinct id hashes, as hex."""
        return [f"{h:016x}" for h in sorted(set(self.pairs[::2]))[:SKETCH]]


@dataclass(slots=True)
class Admission:
    """Which readings of the repeated ids (``TurnPrints.repeated``) a second pass counts."""

    repeated: dict[int, bool]
    on_problem: ProblemSink
    first: dict[int, tuple[int, str]] = field(default_factory=dict)
    dropped: int = 0

    def __call__(self, turn: RecordedTurn) -> bool:
        key = id_hash(turn.id)
        if key not in self.repeated:
            return True
        seen = self.first.get(key)
        if seen is None:
            self.first[key] = (content_hash(turn), turn.origin)
            return True
        if seen[0] == content_hash(turn):
            self.dropped += 1
            return False
        path, _, line = turn.origin.rpartition(":")
        self.on_problem(InputProblem(path or turn.origin, int(line) if line.isdigit() else 0,
                                     f"turn {turn.id!r}: a different turn under the id of the one at {seen[1]}; "
                                     "not read (one id, one turn)"))
        return False
