"""Task results: whether a turn's task succeeded, reported by the host during or after the turn.

``turn.report_result(resolved)`` before the turn ends, ``guard.report_result(turn_id, resolved)``
afterwards (a thumbs-up, a CI run an hour later). A late result needs the turn it is about, so
the guard remembers its recently ended turns here (``ResultBook``): at most ``MAX_RECENT_TURNS`` (then the oldest
is forgotten, as *expired*), and the ids of at most as many expired ones (then they are
*unknown*). Every report gets a ``ResultStatus``; only ``ACCEPTED`` changes anything, the others
are counted and ignored, never raised.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnguard.model import TurnSummary

MAX_RECENT_TURNS = 10_000
"""Ended turns a late result can still reach (a summary each: a few hundred bytes)."""


class ResultStatus(enum.StrEnum):
    """What became of a reported result (``turnguard.result.status`` on the results counter)."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    """The turn already has a result (the first one stands)."""
    UNKNOWN = "unknown"
    """No such turn among the recent ones (never seen, or forgotten long ago)."""
    EXPIRED = "expired"
    """The turn ended too long ago (more than ``MAX_RECENT_TURNS`` turns since)."""
    AFTER_SHUTDOWN = "after_shutdown"
    INVALID = "invalid"
    """``resolved`` was not a bool."""


@dataclass(slots=True)
class Ended:
    """A recently ended turn: its summary, the guard whose plugins saw it, its result so far."""

    summary: TurnSummary
    guard: Any
    resolved: bool | None


class ResultBook:
    """The recently ended turns, for late results, and how many results got each status;
    thread-safe, bounded (``limit`` turns, and as many expired ids)."""

    def __init__(self, limit: int = MAX_RECENT_TURNS) -> None:
        self.limit = limit
        self.counts: dict[ResultStatus, int] = dict.fromkeys(ResultStatus, 0)
        """Results reported, by status (in the turn and later)."""
        self._ended: OrderedDict[str, Ended] = OrderedDict()
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ended)

    def count(self, status: ResultStatus) -> None:
        with self._lock:
            self.counts[status] += 1

    def ended(self, summary: TurnSummary, guard: Any) -> None:
        """Remember a turn that just ended (with the result it got before ending, if any)."""
        with self._lock:
            if summary.resolved is not None:
                self.counts[ResultStatus.ACCEPTED] += 1
            turn_id = summary.turn_id
            self._expired.pop(turn_id, None)
            self._ended[turn_id] = Ended(summary, guard, summary.resolved)
            self._ended.move_to_end(turn_id)
            while len(self._ended) > self.limit:
                old, _ = self._ended.popitem(last=False)
                self._expired[old] = None
                if len(self._expired) > self.limit:
                    self._expired.popitem(last=False)

    def report(self, turn_id: Any, resolved: Any, *, closed: bool = False) -> tuple[ResultStatus, Ended | None]:
        """Take a late result: its status, and the turn's entry when it is known."""
        with self._lock:
            entry = self._ended.get(turn_id) if isinstance(turn_id, str) else None
            if closed:
                status = ResultStatus.AFTER_SHUTDOWN
            elif not isinstance(resolved, bool):
                status = ResultStatus.INVALID
            elif entry is None:
                status = ResultStatus.EXPIRED if turn_id in self._expired else ResultStatus.UNKNOWN
            elif entry.resolved is not None:
                status = ResultStatus.DUPLICATE
            else:
                entry.resolved = resolved
                status = ResultStatus.ACCEPTED
            self.counts[status] += 1
            return status, entry
