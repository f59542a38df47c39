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
_SKIPPED = b""
"""A ``tail`` entry for a call that is not seen (``DENIED``)."""
_plus = operator.add
_LEVELS = {level.value: level for level in Level}


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

    ``due``: the level the latest settling reached, ``(level, k, runs)``, for the policy to read:
    one per settling, the first that asks or halts (``warn_asks``), else the first warning; the
    other levels it reached are ``owed``, each reported by a later settling that reaches none.

    An answer restarts the count at its place in check order (``restart``), whatever order the
    outcomes came in, as the same calls run one at a time: a check's question at that call, a
    level's after the call that reached it (the calls settled after it are counted afresh,
    ``tail``), any other at the calls settled so far."""

    __slots__ = ("_levels", "_ones", "_runs", "calm", "due", "early", "held", "hot", "later", "next", "owed",
                 "period", "reached_at", "reported_at", "restarts", "results", "ring", "stateful", "stop", "tail",
                 "waiting", "warn", "warn_asks")

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
        self.reached_at = 0
        """The check whose settling reached ``due`` (0: none)."""
        self.later: list[tuple[Level, int, int, int]] = []
        """The other levels the settling under way reached, with their checks."""
        self.owed: deque[tuple[Level, int, int, int]] = deque()
        """Levels reached but not reported yet (a settling reports one), oldest first."""
        self.tail: list[tuple[int, bytes | None, bool]] = []
        """The calls settled after ``reached_at`` in its settling: (check, key, whether an earlier
        answer restarted the count there; key ``None``: an exempt call, ``_SKIPPED``: a denied
        one), to count afresh if the level is answered."""
        self.held = False
        """Whether ``due`` is a level an answer's recount reached (``restart``), for the next
        outcome to report (with its ``reached_at`` and ``tail``)."""
        self.restarts: set[int] = set()
        """Checks still waiting at which an answer restarts the count (``restart``)."""
        self.reported_at = 0
        """The ledger's check count at its latest outcome (it sets it): where a check came since,
        an answer now is to that check's question."""
        self.warn_asks = False
        """Whether the warning asks (attended, no ``remind_model``): it then stops the turn's flow
        as a stop does, so a settling reports the first level reached (``_choose``)."""

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
        ahead = seq - self.next
        if ahead < 0 or ahead >= len(self.waiting) or seq in self.early:
            if not self.held:
                self.due = None
            return False
        if self.held:  # (a level an answer's recount reached: this outcome reports it)
            self.held = False
        else:
            self.due = None
            self.reached_at = 0
            self.tail.clear()
        if ahead >= WAIT_BEHIND:
            self._give_up(seq - WAIT_BEHIND)
            ahead = seq - self.next
        if ahead:
            self.early[seq] = (outcome, result)
            return self._choose()  # (a level ``_give_up`` reached, or one owed)
        self._settle_next(outcome, result)
        early = self.early
        while self.next in early:
            self._settle_next(*early.pop(self.next))
        return self._choose()

    def _choose(self) -> bool:
        """The level this settling reports (``due``): of those it reached, the first that asks or
        halts, else the first; the others are owed. None reached: the oldest owed. True when one is due."""
        later = self.later
        if later:
            assert self.due is not None
            found = [(*self.due, self.reached_at), *later]
            later.clear()
            pick = next((f for f in found if f[0] is Level.STOP or self.warn_asks), found[0])
            self.owed.extend(f for f in found if f is not pick)
            self.due, self.reached_at = pick[:3], pick[3]
        elif self.due is None and self.owed:
            level, k, r, _ = self.owed.popleft()
            self.due = (level, k, r)  # (no tail kept for it: an answer restarts at the calls settled)
        self.calm = self.due is None and not self.waiting and not self.owed
        return self.due is not None

    def unreported(self) -> list[tuple[Level, int, int]]:
        """The levels reached that no report carried yet, in the order later reports would carry
        them: a ``held`` one first, then the ``owed``, oldest first (for a turn that ends first)."""
        held = [self.due] if self.held and self.due is not None else []
        return held + [(level, k, r) for level, k, r, _ in self.owed]

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
        key: bytes | None = digest
        if outcome is _DENIED:
            key = _SKIPPED
            self.stateful.discard(seq)
        elif seq in self.stateful:
            self.stateful.discard(seq)
            if digest is not None:
                if result is None:
                    result = self.results.get(digest)
                else:
                    self._keep_result(digest, result)
                if result is not None:
                    key = digest + result
        fresh = bool(self.restarts) and seq in self.restarts
        if fresh:
            self.restarts.discard(seq)
            self.ring.clear()
            self.hot = False
        if self.due is not None:
            self.tail.append((seq, key, fresh))
        self._see_key(key)

    def _see_key(self, key: bytes | None) -> None:
        if key is None:
            self.cut()
        elif key is not _SKIPPED:
            self.see(key)

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
        """Name the level a cycle just reached at the call just seen (check ``next - 1``): the
        shortest period whose run is not a shorter period's (a period-4 run of A,B,A,B is the
        period-2 cycle's), a stop over a warning. The settling's first is ``due``, the others
        wait in ``later`` for ``_choose``."""
        runs, levels, stop = self._runs, self._levels, self.stop
        hit: tuple[Level, int, int] | None = None
        for k in range(2, self.period + 1):
            r = runs[k]
            if r in levels[k] and not any(runs[d] >= r for d in range(1, k) if not k % d):
                level = Level.STOP if r == stop * k else Level.WARN
                if hit is None or (level is Level.STOP and hit[0] is not Level.STOP):
                    hit = (level, k, r)
        if hit is None:
            return
        if self.due is None:
            self.due, self.reached_at = hit, self.next - 1
        else:
            self.later.append((*hit, self.next - 1))
        self.calm = False  # (the next outcome settles through ``settle``, which clears ``due``)

    def restart_at(self, checks: int) -> int:
        """Where an answer now restarts the count (``restart``), ``checks`` the ledger's: at the
        check it asked about (the latest, if no outcome came since), after the call that reached
        the level it reported, else after the calls settled so far."""
        if checks != self.reported_at:
            return checks
        return self.reached_at + 1 if self.reached_at else self.next

    def restart(self, place: int) -> None:
        """An answer: the calls from check ``place`` on count afresh, in check order. Those settled
        already (a level's ``tail``) are counted again, the level they reach ``held`` for the next
        outcome to report; at a check still waiting, the count restarts when it settles. Levels
        owed from calls at or after ``place`` are dropped (the count they were reached in is gone)."""
        tail = self.tail
        self.tail = []
        self.due = None
        self.held = False
        self.reached_at = 0
        self.later.clear()
        if self.owed:  # (those reached before the answer's place stand: one at a time they came first)
            self.owed = deque(level for level in self.owed if level[3] < place)
        if place > self.next:
            self.restarts.add(place)
            return
        self.ring.clear()
        self.hot = False
        after = self.next
        for seq, key, fresh in tail:
            if seq >= place:
                if fresh:
                    self.ring.clear()
                    self.hot = False
                if self.due is not None:
                    self.tail.append((seq, key, fresh))
                self.next = seq + 1  # (``_reach`` names the call just seen by ``next``)
                self._see_key(key)
        self.next = after
        if self.due is not None:
            self._choose()
            self.held = True
            self.calm = False

    def reset(self) -> None:
        """Forget the runs and what an answer would restart (a rollback, a restore)."""
        self.ring.clear()
        self.hot = False
        self.due = None
        self.held = False
        self.reached_at = 0
        self.tail.clear()
        self.later.clear()
        self.owed.clear()

    def forget_waiting(self, first: int) -> None:
        """Drop the checks waiting (a rolled-back model request's): the next is ``first``."""
        self.waiting.clear()
        self.stateful.clear()
        self.early.clear()
        self.restarts.clear()
        self.due = None
        self.held = False
        self.calm = not self.owed
        self.next = first

    def copy(self) -> CycleRuns:
        twin = CycleRuns(self.period, self.warn + 1, self.stop + 1, self.next)
        twin.ring.extend(self.ring)
        twin._runs, twin.hot = list(self._runs), self.hot
        twin.waiting.extend(self.waiting)
        twin.stateful, twin.early, twin.calm = set(self.stateful), dict(self.early), self.calm
        twin.results = dict(self.results)
        twin.due, twin.held, twin.reached_at, twin.reported_at = self.due, self.held, self.reached_at, self.reported_at
        twin.warn_asks = self.warn_asks
        twin.tail, twin.later, twin.owed = list(self.tail), list(self.later), deque(self.owed)
        twin.restarts = set(self.restarts)
        return twin

    def state(self, latest: tuple[bytes | None, ...] = (), checks: int = 0) -> dict[str, Any]:
        """The runs as JSON data (``latest``: the ledger's latest check's digest, when it waits
        but not here; ``checks``: the ledger's check count)."""
        state = {"next": self.next, "ring": [key.hex() for key in self.ring], "runs": self.runs[1:],
                 "waiting": {str(self.next + i): [hex_or_none(d), self.next + i in self.stateful]
                             for i, d in enumerate((*self.waiting, *latest))},
                 "early": {str(seq): [o.value, hex_or_none(r)] for seq, (o, r) in self.early.items()}}
        if self.results:  # (absent where no stateful call had a result: what earlier versions read)
            state["results"] = {digest.hex(): result.hex() for digest, result in self.results.items()}
        self._answer_state(state, checks)
        return state

    def _answer_state(self, state: dict[str, Any], checks: int) -> None:
        """What an answer would restart (``restart``) and the levels still to report, each only
        where there is one (absent: none; what earlier versions read)."""
        if checks != self.reported_at:
            state["at_check"] = checks
        if self.reached_at:
            state["reached_at"] = self.reached_at
        if self.tail:
            state["tail"] = [[seq, hex_or_none(key), fresh] for seq, key, fresh in self.tail]
        if self.restarts:
            state["restarts"] = sorted(self.restarts)
        if self.owed:
            state["owed"] = [[level.value, k, r, seq] for level, k, r, seq in self.owed]
        if self.held and self.due is not None:
            state["held"] = [self.due[0].value, self.due[1], self.due[2]]

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
        if sorted(waiting) != list(range(self.next, seq + 1)):  # (a gap would leave the runs waiting for ever)
            st.refuse(path, f"the checks from {self.next} (next) to {seq} (the turn's last), one after another",
                      sorted(waiting))
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
        self._restore_answer(f, seq)
        self.calm = not self.waiting and not self.owed and self.due is None
        f.done()

    def _restore_answer(self, f: Fields, seq: int) -> None:
        """Read back ``_answer_state``'s fields (each checked)."""
        asked = f.integer("at_check", 0, seq, 0)
        self.reported_at = -1 if asked and asked == seq else seq
        self.reached_at = f.integer("reached_at", 0, self.next - 1, 0)
        path = f.at("tail")
        for i, entry in enumerate(f.items("tail", MAX_POLLED, [])):
            at = f"{path}[{i}]"
            if not isinstance(entry, list) or len(entry) != 3:
                st.refuse(at, 'a [check, key digest, null or "", restarted] triple', entry)
            check = st.integer(f"{at}[0]", entry[0], self.reached_at + 1, self.next - 1)
            key = _SKIPPED if entry[1] == "" else st.digest(f"{at}[1]", entry[1], key_size(entry[1]), optional=True)
            self.tail.append((check, key, st.boolean(f"{at}[2]", entry[2])))
        path = f.at("restarts")
        for i, check in enumerate(f.items("restarts", MAX_POLLED, [])):
            self.restarts.add(st.integer(f"{path}[{i}]", check, self.next + 1, seq))
        path = f.at("owed")
        for i, entry in enumerate(f.items("owed", MAX_POLLED, [])):
            level, k, r = self._level_entry(f"{path}[{i}]", entry, 4, seq)
            self.owed.append((level, k, r, st.integer(f"{path}[{i}][3]", entry[3], 1, seq)))
        if "held" in f:
            self.due = self._level_entry(f.at("held"), f.get("held"), 3, seq)
            self.held = True

    def _level_entry(self, path: str, entry: Any, size: int, seq: int) -> tuple[Level, int, int]:
        """A ``[level, period, run, ...]`` entry of ``size`` items, checked."""
        if not isinstance(entry, list) or len(entry) != size:
            st.refuse(path, "a [level, period, run" + (", check]" if size == 4 else "]"), entry)
        return (_LEVELS[st.choice(f"{path}[0]", entry[0], _LEVELS)],
                st.integer(f"{path}[1]", entry[1], 2, self.period), st.integer(f"{path}[2]", entry[2], 1, seq))
