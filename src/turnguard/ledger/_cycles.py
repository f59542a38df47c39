"""Cycles: the ``cycle_repeat`` policy's facts (``CycleRuns``), kept only when the policy is on."""

from __future__ import annotations

from typing import Any

from turnguard import state as st
from turnguard.keys import DIGEST_SIZE
from turnguard.ledger._polled import MAX_POLLED
from turnguard.ledger._state import OUTCOME_VALUES, check_number, hex_or_none, key_size
from turnguard.model import Level, Outcome
from turnguard.state import Fields

_DENIED = Outcome.DENIED


class CycleRuns:
    """The ``cycle_repeat`` facts: how long the turn's latest calls have repeated a cycle of each
    period ``k`` (1 to ``period``): ``runs[k]`` consecutive calls each identical to the call ``k``
    before it, so a cycle of ``k`` calls seen ``r`` times has ``runs[k] == (r - 1) * k``.

    Calls settle here in check order, at their outcome (``settle``; one that comes before an
    earlier call's waits for it), so a batch and late outcomes give the counts of the same calls run
    one at a time. A ``DENIED`` call (it did not run) is not seen at all: it neither counts nor
    resets. A stateful tool's call is compared with its result (a changed result is progress, so
    it breaks the cycle). O(``period``) per call, memory bounded by ``period`` and the calls waiting.

    ``due``: the level the latest settling reached, ``(level, k, runs)``, for the policy to read."""

    __slots__ = ("_levels", "due", "early", "filled", "keys", "next", "period", "pos", "ring", "runs", "stop", "warn")

    def __init__(self, period: int, warn_at: int, stop_at: int, first: int) -> None:
        self.period = period
        self.set_levels(warn_at, stop_at)
        self.ring: list[bytes] = [b""] * period
        self.pos = self.filled = 0
        self.runs = [0] * (period + 1)
        self.next = first
        self.keys: dict[int, tuple[bytes | None, bool]] = {}
        """Checked calls waiting to settle: (digest, stateful); a ``None`` digest takes no part."""
        self.early: dict[int, tuple[Outcome, bytes | None]] = {}
        self.due: tuple[Level, int, int] | None = None

    def set_levels(self, warn_at: int, stop_at: int) -> None:
        """The levels as matches per call of the period (``warn``, ``stop``; -1: off) and, by period
        ``k``, the run lengths at which one is reached (``warn * k``, ``stop * k``)."""
        self.warn, self.stop = warn_at - 1, stop_at - 1
        self._levels = tuple(frozenset(n * k for n in (self.warn, self.stop) if n > 0) for k in range(self.period + 1))

    def checked(self, seq: int, digest: bytes | None, stateful: bool) -> None:
        if not self.keys and not self.early:
            self.next = seq  # (nothing waits: a check skipped by a rollback leaves no gap)
        self.keys[seq] = (digest, stateful)

    def settle(self, seq: int, outcome: Outcome, result: bytes | None = None) -> bool:
        """Check ``seq``'s outcome; true when it brought a cycle to a level (``due``)."""
        self.due = None
        if seq not in self.keys:
            return False
        if seq != self.next:
            self.early[seq] = (outcome, result)
            return False
        self._count(seq, outcome, result)
        early = self.early
        while self.next in early:
            outcome, result = early.pop(self.next)
            self._count(self.next, outcome, result)
        return self.due is not None

    def _count(self, seq: int, outcome: Outcome, result: bytes | None) -> None:
        digest, stateful = self.keys.pop(seq)
        self.next = seq + 1
        if outcome is _DENIED or digest is None:
            return
        key = digest + result if stateful and result is not None else digest
        ring, period, pos, runs = self.ring, self.period, self.pos, self.runs
        filled = self.filled
        self.pos = pos + 1 if pos + 1 < period else 0
        if filled < period:
            self.filled = filled + 1
        if key not in ring:  # (most calls: none of the last ``period`` is this one; a scan in C says so)
            ring[pos] = key
            if any(runs):
                runs[:] = [0] * len(runs)
            return
        reached = False
        levels = self._levels
        for k in range(1, filled + 1):
            if ring[pos - k] == key:
                r = runs[k] = runs[k] + 1
                reached = reached or r in levels[k]
            else:
                runs[k] = 0
        ring[pos] = key
        if reached:
            self._reach()

    def _reach(self) -> None:
        """Name the level a cycle just reached: the shortest period whose run is not a shorter
        period's (a period-4 run of A,B,A,B is the period-2 cycle's), a stop over a warning."""
        runs, levels, stop = self.runs, self._levels, self.stop
        for k in range(2, self.period + 1):
            r = runs[k]
            if r in levels[k] and not any(runs[d] >= r for d in range(1, k) if not k % d):
                level = Level.STOP if r == stop * k else Level.WARN
                if self.due is None or level is Level.STOP:
                    self.due = (level, k, r)

    def reset(self) -> None:
        """Forget the runs (an answer, a rollback): the calls since count afresh."""
        self.runs = [0] * (self.period + 1)
        self.filled = self.pos = 0
        self.due = None

    def copy(self) -> CycleRuns:
        twin = CycleRuns(self.period, self.warn + 1, self.stop + 1, self.next)
        twin.ring, twin.pos, twin.filled, twin.runs = list(self.ring), self.pos, self.filled, list(self.runs)
        twin.keys, twin.early = dict(self.keys), dict(self.early)
        return twin

    def state(self) -> dict[str, Any]:
        ordered = [self.ring[(self.pos - self.filled + i) % self.period] for i in range(self.filled)]
        return {"next": self.next, "ring": [key.hex() for key in ordered], "runs": self.runs[1:],
                "waiting": {str(seq): [hex_or_none(d), s] for seq, (d, s) in self.keys.items()},
                "early": {str(seq): [o.value, hex_or_none(r)] for seq, (o, r) in self.early.items()}}

    def restore(self, f: Fields, seq: int) -> None:
        """Read back from ``state()`` (each field checked), for checks up to ``seq``."""
        self.next = f.integer("next", 1, seq + 1)
        ring = f.items("ring", self.period)
        path = f.at("ring")
        keys = [st.digest(f"{path}[{i}]", key, key_size(key)) for i, key in enumerate(ring)]
        self.reset()
        self.filled, self.pos = len(keys), len(keys) % self.period
        self.ring[:len(keys)] = keys
        runs = f.items("runs", self.period)
        if len(runs) != self.period:
            st.refuse(f.at("runs"), f"{self.period} run lengths (cycle_repeat_max_period)", runs)
        self.runs = [0, *(st.integer(f"{f.at('runs')}[{i}]", n, 0, seq) for i, n in enumerate(runs))]
        path = f.at("waiting")
        self.keys = {}
        for key, value in f.mapping("waiting", MAX_POLLED).items():
            check = check_number(f"{path}.{key}", key, self.next, seq)
            if not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a [digest or null, stateful] pair", value)
            self.keys[check] = (st.digest(f"{path}.{key}[0]", value[0], DIGEST_SIZE, optional=True),
                                st.boolean(f"{path}.{key}[1]", value[1]))
        self.keys = dict(sorted(self.keys.items()))
        path = f.at("early")
        self.early = {}
        for key, value in f.mapping("early", MAX_POLLED).items():
            check = check_number(f"{path}.{key}", key, self.next + 1, seq)
            if check not in self.keys or not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a waiting check's [outcome, result digest or null] pair", value)
            self.early[check] = (Outcome(st.choice(f"{path}.{key}[0]", value[0], OUTCOME_VALUES)),
                                 st.digest(f"{path}.{key}[1]", value[1], DIGEST_SIZE, optional=True))
        f.done()


