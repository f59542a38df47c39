"""Cycles: the ``cycle_repeat`` policy's facts (``CycleRuns``), kept only when the policy is on."""

from __future__ import annotations

import operator
from collections import deque
from typing import Any

from turnguard import _state as st
from turnguard._keys import DIGEST_SIZE
from turnguard._ledger._state import MAX_POLLED, OUTCOME_VALUES, WAIT_BEHIND, check_number, hex_or_none, key_size
from turnguard._model import Level, Outcome
from turnguard._state import Fields

_DENIED = Outcome.DENIED
_UNREPORTED = (Outcome.UNKNOWN, None)
_plus = operator.add



class CycleRuns:
    """The ``cycle_repeat`` facts: how long the turn's latest calls have repeated a cycle of each
    period ``k`` (1 to ``period``): ``runs[k]`` consecutive calls each identical to the call ``k``
    before it, so a cycle of ``k`` calls seen ``r`` times has ``runs[k] == (r - 1) * k``.

    Calls settle here in check order, at their outcome (``settle``; one that comes before an
    earlier call's waits for it), so a batch and late outcomes give the counts of the same calls run
    one at a time (as far back as ``WAIT_BEHIND``). A ``DENIED`` call (it did not run) is not seen
    at all: it neither counts nor resets. A ``streak_exempt_tools`` tool's call is a call no other
    is: every run ends there (``cut``). A stateful tool's call is compared with its result (a
    changed result is progress, so it breaks the cycle; a result that comes back in step with the
    cycle repeats a longer one); one without a result has its call's latest result (``results``).
    O(``period``) per call; memory bounded by ``period``, ``WAIT_BEHIND`` and ``MAX_POLLED``.

    ``due``: the level the latest settling reached, ``(level, k, runs)``, for the policy to read."""

    __slots__ = ("_levels", "_ones", "_runs", "calm", "due", "early", "hot", "next", "period", "results", "ring",
                 "stateful", "stop", "waiting", "warn")

    def __init__(self, period: int, warn_at: int, stop_at: int, first: int) -> None:
        self.period = period
        self.set_levels(warn_at, stop_at)
        self._ones = (0,) + (1,) * period
        self.ring: deque[bytes] = deque(maxlen=period)
        """The latest ``period`` calls seen, oldest first."""
        self._runs = [0] * (period + 1)
        self.hot = False
        """Whether the latest call seen was a repeat, so that ``_runs`` holds the runs (else every
        run is 0: a call that none of the last ``period`` is only clears this, the cheapest store)."""
        self.next = first
        """The next check to settle. While nothing waits here (the common call: each outcome comes
        before the next check), the ledger keeps the latest check's digest, not ``waiting``: a
        check at ``next`` is the one the ledger's streak key is (``Streaks.record_outcome``); any
        other puts the one before it here (``behind``)."""
        self.waiting: deque[bytes | None] = deque()
        """The digests of checks ``next``, ``next + 1``... waiting to settle (``None``: takes no part)."""
        self.stateful: set[int] = set()
        """The checks waiting there that are a stateful tool's (compared with their result)."""
        self.early: dict[int, tuple[Outcome, bytes | None]] = {}
        self.results: dict[bytes, bytes] = {}
        """Each stateful call's latest result (digests; at most ``MAX_POLLED`` calls, the oldest
        forgotten first): a call reported without one is compared as having it."""
        self.calm = True
        """Whether nothing waits here (so no outcome waits for an earlier one's, no stateful check
        waits) and no level is ``due``: the next outcome, for the ledger's latest check, can settle
        inline (``Streaks.record_outcome``, which so leaves ``due`` as it finds it, ``None``)."""
        self.due: tuple[Level, int, int] | None = None

    @property
    def runs(self) -> list[int]:
        """The run length of each period ``k`` (``runs[k]``; ``runs[0]`` is 0)."""
        return self._runs if self.hot else [0] * (self.period + 1)

    def set_levels(self, warn_at: int, stop_at: int) -> None:
        """The levels as matches per call of the period (``warn``, ``stop``; -1: off) and, by period
        ``k``, the run lengths at which one is reached (``warn * k``, ``stop * k``)."""
        self.warn, self.stop = warn_at - 1, stop_at - 1
        self._levels = tuple(frozenset(n * k for n in (self.warn, self.stop) if n > 0) for k in range(self.period + 1))

    def checked(self, seq: int, digest: bytes | None, stateful: bool = False) -> None:
        """Check ``seq`` (the one after the last checked), to settle at its outcome."""
        if not self.waiting:
            self.next = seq  # (nothing waits: a check skipped by a rollback leaves no gap)
        self.waiting.append(digest)
        self.calm = False
        if stateful:
            self.stateful.add(seq)

    def behind(self, seq: int, digest: bytes, latest: bytes | None) -> None:
        """Check ``seq`` comes while nothing waits here but not at ``next`` (the ledger's
        ``count_call`` tells, see ``next``): the check before it still waits for its outcome
        (``latest``: its digest, or ``None``, from the ledger), both to wait here now; else a check
        skipped (a rollback) leaves no gap. Or a check comes while others wait here: it waits too."""
        if not self.waiting:
            if self.next != seq - 1:
                self.next = seq
                return
            self.waiting.append(latest)
        self.waiting.append(digest)
        self.calm = False

    def settle(self, seq: int, outcome: Outcome, result: bytes | None = None) -> bool:
        """Check ``seq``'s outcome; true when it brought a cycle to a level (``due``). An outcome
        for a check not waiting, or one already reported, changes nothing."""
        self.due = None
        ahead = seq - self.next
        if ahead < 0 or ahead >= len(self.waiting) or seq in self.early:
            return False
        if ahead >= WAIT_BEHIND:
            self._give_up(seq - WAIT_BEHIND)
            ahead = seq - self.next
        if ahead:
            self.early[seq] = (outcome, result)
            self.calm = False
            return self.due is not None  # (a level ``_give_up`` reached)
        self._settle_next(outcome, result)
        early = self.early
        while self.next in early:
            self._settle_next(*early.pop(self.next))
        self.calm = self.due is None and not self.waiting
        return self.due is not None

    def _give_up(self, last: int) -> None:
        """Settle the checks up to ``last`` (those without an outcome as having run), and the
        outcomes that waited behind them."""
        early = self.early
        while self.next <= last or self.next in early:
            self._settle_next(*early.pop(self.next, _UNREPORTED))

    def _settle_next(self, outcome: Outcome, result: bytes | None) -> None:
        seq = self.next
        self.next = seq + 1
        digest = self.waiting.popleft()
        if seq in self.stateful:
            self.stateful.discard(seq)
            if outcome is _DENIED:
                return
            if digest is None:
                self.cut()
                return
            if result is None:
                result = self.results.get(digest)
            else:
                self._keep_result(digest, result)
            self.see(digest if result is None else digest + result)
        elif outcome is _DENIED:
            return
        elif digest is None:
            self.cut()
        else:
            self.see(digest)

    def _keep_result(self, digest: bytes, result: bytes) -> None:
        results = self.results
        if digest in results:
            del results[digest]  # (the latest last, so the oldest goes first)
        elif len(results) >= MAX_POLLED:
            del results[next(iter(results))]
        results[digest] = result

    def cut(self) -> None:
        """A ``streak_exempt_tools`` tool's call: a call no other is, so every run ends there (as a
        different call ends the streak), and none reaches back past it."""
        self.ring.clear()
        self.hot = False

    def see(self, key: bytes) -> None:
        """One more call in the sequence the runs count (``key``: its digest, a stateful one's
        with its result's)."""
        ring = self.ring
        if key not in ring:  # (most calls: none of the last ``period`` is this one; a scan in C says so)
            ring.append(key)
            self.hot = False
        else:
            self.repeated(key)

    def repeated(self, key: bytes) -> bool | None:
        """``see`` a call that one of the last ``period`` is: each run whose call ``k`` back is this
        one goes on, the others end. True when a cycle reached a level (``due``; ``None``: none did)."""
        ring = self.ring
        matches = ring.count(key)
        if matches == 1:  # (most repeats: one call ``k`` back is this one, its run alone goes on)
            k = len(ring) - ring.index(key)
            r = self._runs[k] + 1 if self.hot else 1
            runs = self._runs = [0] * (self.period + 1)
            runs[k] = r
            ring.append(key)
            self.hot = True
            if r in self._levels[k]:
                self._reach()
            return True if self.due is not None else None
        return self._repeated_often(key, matches)

    def _repeated_often(self, key: bytes, matches: int) -> bool | None:
        """``repeated`` where more than one of the last ``period`` calls is this one."""
        ring, runs = self.ring, self.runs
        if matches == self.period:  # one call repeated (the streak's): all runs go on, none a cycle's
            self._runs = list(map(_plus, runs, self._ones))
            ring.append(key)
            self.hot = True
            return None
        levels = self._levels
        reached = False
        for k, old in enumerate(reversed(ring), 1):
            if old == key:
                r = runs[k] = runs[k] + 1
                reached = reached or r in levels[k]
            else:
                runs[k] = 0
        self._runs = runs
        ring.append(key)
        self.hot = True
        if reached:
            self._reach()
        return True if self.due is not None else None

    def _reach(self) -> None:
        """Name the level a cycle just reached: the shortest period whose run is not a shorter
        period's (a period-4 run of A,B,A,B is the period-2 cycle's), a stop over a warning, and
        over a later call's stop in the same settling the first (one at a time, it came first;
        unattended, the later one would never have come)."""
        runs, levels, stop = self._runs, self._levels, self.stop
        for k in range(2, self.period + 1):
            r = runs[k]
            if r in levels[k] and not any(runs[d] >= r for d in range(1, k) if not k % d):
                level = Level.STOP if r == stop * k else Level.WARN
                if self.due is None or (level is Level.STOP and self.due[0] is not Level.STOP):
                    self.due = (level, k, r)
        if self.due is not None:
            self.calm = False  # (the next outcome settles through ``settle``, which clears ``due``)

    def reset(self) -> None:
        """Forget the runs (an answer, a rollback): the calls since count afresh."""
        self.ring.clear()
        self.hot = False
        self.due = None

    def forget_waiting(self, first: int) -> None:
        """Drop the checks waiting (a rolled-back model request's): the next is ``first``."""
        self.waiting.clear()
        self.stateful.clear()
        self.early.clear()
        self.due = None
        self.calm = True
        self.next = first

    def copy(self) -> CycleRuns:
        twin = CycleRuns(self.period, self.warn + 1, self.stop + 1, self.next)
        twin.ring.extend(self.ring)
        twin._runs, twin.hot = list(self._runs), self.hot
        twin.waiting.extend(self.waiting)
        twin.stateful, twin.early, twin.calm = set(self.stateful), dict(self.early), self.calm
        twin.results = dict(self.results)
        return twin

    def state(self, latest: tuple[bytes | None, ...] = ()) -> dict[str, Any]:
        """The runs as JSON data (``latest``: the ledger's latest check's digest, when it waits
        but not here)."""
        state = {"next": self.next, "ring": [key.hex() for key in self.ring], "runs": self.runs[1:],
                 "waiting": {str(self.next + i): [hex_or_none(d), self.next + i in self.stateful]
                             for i, d in enumerate((*self.waiting, *latest))},
                 "early": {str(seq): [o.value, hex_or_none(r)] for seq, (o, r) in self.early.items()}}
        if self.results:  # (absent where no stateful call had a result: what earlier versions read)
            state["results"] = {digest.hex(): result.hex() for digest, result in self.results.items()}
        return state

    def restore(self, f: Fields, seq: int) -> None:
        """Read back from ``state()`` (each field checked), for checks up to ``seq``."""
        self.next = f.integer("next", 1, seq + 1)
        ring = f.items("ring", self.period)
        path = f.at("ring")
        keys = [st.digest(f"{path}[{i}]", key, key_size(key)) for i, key in enumerate(ring)]
        self.reset()
        self.ring.extend(keys)
        runs = f.items("runs", self.period)
        if len(runs) != self.period:
            st.refuse(f.at("runs"), f"{self.period} run lengths (cycle_repeat_max_period)", runs)
        self._runs = [0, *(st.integer(f"{f.at('runs')}[{i}]", n, 0, seq) for i, n in enumerate(runs))]
        self.hot = any(self._runs)
        path = f.at("waiting")
        waiting: dict[int, tuple[bytes | None, bool]] = {}
        for key, value in f.mapping("waiting", MAX_POLLED).items():
            check = check_number(f"{path}.{key}", key, self.next, seq)
            if not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a [digest or null, stateful] pair", value)
            waiting[check] = (st.digest(f"{path}.{key}[0]", value[0], DIGEST_SIZE, optional=True),
                              st.boolean(f"{path}.{key}[1]", value[1]))
        if sorted(waiting) != list(range(self.next, self.next + len(waiting))):
            st.refuse(path, f"the checks from {self.next} on, one after another", sorted(waiting))
        self.forget_waiting(self.next)
        for check in sorted(waiting):
            digest, stateful = waiting[check]
            self.checked(check, digest, stateful)
        path = f.at("early")
        for key, value in f.mapping("early", MAX_POLLED).items():
            check = check_number(f"{path}.{key}", key, self.next + 1, seq)
            if check not in waiting or not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a waiting check's [outcome, result digest or null] pair", value)
            self.early[check] = (Outcome(st.choice(f"{path}.{key}[0]", value[0], OUTCOME_VALUES)),
                                 st.digest(f"{path}.{key}[1]", value[1], DIGEST_SIZE, optional=True))
        path = f.at("results")
        for key, value in f.mapping("results", MAX_POLLED, {}).items():
            self.results[st.digest(f"{path}.{key}", key, DIGEST_SIZE)] = st.digest(f"{path}.{key}", value, DIGEST_SIZE)
        self.calm = not self.waiting
        f.done()
