"""Polled results: the tools the configuration names. A ``stateful_tools`` tool's call has its
repeat counted at its outcome, keyed with its result (a changed result is progress); a
``streak_exempt_tools`` tool's call is counted but joins no streak. Repeats are counted in check
order under ``stale_repeat``, whose count depends on that order, whatever order a batch's
outcomes come in: every call's repeat waits behind an earlier stateful call whose outcome has not
come (``held``), as the same calls run one at a time. Under ``repeat`` the count is the number of
sightings, whatever their order, so a repeat is counted at its outcome (the cap decides then, as
it does one call at a time), but the call it names for the stuck signal (``first_stuck_call``) is
placed in check order: a repeat counted before an earlier stateful check's is held for that
(``held``, already counted) until the earlier one is, then placed (``_place``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnguard._ledger._state import WAIT_BEHIND, fact
from turnguard._ledger._streaks import Streaks
from turnguard._model import Outcome

if TYPE_CHECKING:
    from turnguard._config import GuardConfig

_DENIED = Outcome.DENIED


class PolledCalls(Streaks):
    """The facts of the tools a configuration names, over the streaks (``Streaks``)."""

    __slots__ = ("_exempt", "_held", "_named", "_polled", "_raised")

    def __init__(self, config: GuardConfig, checks: int = 0) -> None:
        super().__init__(config, checks)
        self._exempt = frozenset(config.streak_exempt_tools)
        self._named = bool(self._stateful or self._exempt)
        """Whether the configuration names tools: the guard counts calls with ``count_named``."""
        self._polled: dict[int, tuple[bytes, int]] = {}
        """Stateful tools' calls whose repeat waits for their outcome: check -> (digest, call number)."""
        self._held: dict[int, tuple[bytes, int]] = {}
        """Repeats ready to count behind an earlier stateful check still in ``_polled``: check ->
        (key, call number), counted in check order once that check is (``_count_held``); under
        ``repeat``, counted already, and placed in check order then (``_place``)."""
        self._raised = False
        """The latest ``record_polled`` brought the stuck signal to ``stuck_repeat_threshold``."""

    names_tools: bool = fact(
        "_named", "Whether the configuration names tools (``stateful_tools``, ``streak_exempt_tools``).")

    def count_named(self, digest: bytes, tool_name: str) -> int:
        """``count_call`` in a turn whose configuration names tools. A stateful tool's call joins
        its streak now and has its repeat counted when its outcome comes (``record_polled``: the
        (call, result) pair is the key); an exempt tool's call is counted but joins no streak, and
        ends the one it interrupts, as any other call does."""
        polled = self._polled
        if self._all_stateful or tool_name in self._stateful:
            seq = self._count_polled_call(digest, tool_name)
        elif polled and self._stale:  # the stale count depends on the order: behind the call waiting
            seq = self._count_held_call(digest, tool_name)
        else:
            seq = self.count_call(digest, tool_name)
        if polled and next(iter(polled)) <= seq - WAIT_BEHIND:  # (tested here: no call on most checks)
            self._count_stale_polls(seq - WAIT_BEHIND)
        if tool_name in self._exempt:
            if self._cyc is not None and self._cyc.waiting:
                self._cyc.waiting[-1] = None  # (nor in a cycle; else the streak's key, ``None`` below, is its digest)
            self._last_key = None
            self._last_tool = None
            self.streak_length = 0
            self._new_streak(seq + 1)
            self._results = {}
        return seq

    def _count_polled_call(self, digest: bytes, tool_name: str) -> int:
        """``count_call`` for a stateful tool, but for its repeat (counted with its result)."""
        self.tool_calls += 1
        seq = self.checks = self.checks + 1
        self._polled[seq] = (digest, self.tool_calls)
        if self._join(digest, tool_name, seq):
            self._baseline = None
        return seq

    def _count_held_call(self, digest: bytes, tool_name: str) -> int:
        """``count_call``, its repeat held (``_held``) behind the stateful check still waiting."""
        self.tool_calls += 1
        seq = self.checks = self.checks + 1
        self._held[seq] = (digest, self.tool_calls)
        cyc = self._cyc
        if cyc is not None and seq != cyc.next:  # (as count_call: the cycle runs see every check)
            cyc.behind(seq, digest, self._last_key)
        self._join(digest, tool_name, seq)
        return seq

    def _count_stale_polls(self, last: int) -> None:
        """The repeats of stateful checks up to ``last`` still without an outcome, counted without
        a result (``WAIT_BEHIND``), so a lost outcome never keeps a call from the stuck signal."""
        polled = self._polled
        while polled and (first := next(iter(polled))) <= last:
            self._count_polled(first, None)  # (at a check: the cap's check hook reads the counts)

    def record_polled(self, seq: int, outcome: Outcome, result: bytes | None) -> bool | None:
        """``record_outcome`` for a stateful tool's call, with its result's digest (``None``: not
        given). Its repeat is counted now, keyed by (call, result), or by the call alone when no
        result was given or the outcome is ``DENIED`` (the tool did not run). In its streak, in
        check order, a result that differs from the latest one there is progress: the streak
        restarts at this call, both counts with it (``result_restarts``). True when the outcome
        hooks must be asked wherever the counts are: an ended streak's stop (``record_outcome``),
        or the stuck signal reached now (the cap decides at the outcome, ``stuck_raised``)."""
        if outcome is _DENIED:
            result = None
        self._raised = self._count_polled(seq, result)
        due = False
        if result is not None:
            if seq == self.next_to_settle:
                due = self._apply_result(seq, result)
            elif seq > self.next_to_settle:
                self._results[seq] = result
            else:
                for ended in self._ended:
                    if ended.next <= seq <= ended.last:
                        ended.results[seq] = result
                        break
        return self.record_outcome(seq, outcome) or due or self._raised

    def _count_polled(self, seq: int, result: bytes | None) -> bool:
        """Count the repeat of stateful check ``seq`` (``count_call``'s table, bound and stuck
        signal); true when the stuck signal's count reached ``stuck_repeat_threshold`` now."""
        polled = self._polled
        pending = polled.pop(seq, None)
        if pending is None:  # rolled back, or counted already
            return False
        digest, at = pending
        key = digest if result is None else digest + result
        behind = bool(polled) and next(iter(polled)) < seq  # an earlier stateful check still waits
        if self._stale and behind:
            self._held[seq] = (key, at)
            return False
        before = self._max_stale if self._stale else self.max_key_repeat
        self.count_key(key, at, placed=self._stale)
        if not self._stale:
            if behind:
                self._held[seq] = (key, at)
                return before < self.stuck_at <= self.max_key_repeat
            self._place(key, at)
        if self._held:
            self._count_held(next(iter(polled)) if polled else self.checks + 1)
        return before < self.stuck_at <= (self._max_stale if self._stale else self.max_key_repeat)

    def _count_held(self, until: int) -> None:
        """Count the held repeats of the checks before ``until`` (the stateful check still
        waiting, if any), in check order."""
        held = self._held
        for seq in sorted(held):
            if seq >= until:
                break
            key, at = held.pop(seq)
            if self._stale:
                self.count_key(key, at)
            else:
                self._place(key, at)

    def _place(self, key: bytes, at: int) -> None:
        """Under ``repeat``: a stateful call's repeat, counted already, takes its place in check
        order: when its key's count in check order (``held`` ones not yet placed left out)
        reaches ``stuck_repeat_threshold`` there, the stuck signal first held at the earliest
        such call of any key, as one call at a time."""
        placed = self._counts.get(key, 0) - sum(held == key for held, _ in self._held.values())
        if placed == self.stuck_at and (not self._first_stuck or at < self._first_stuck):
            self._first_stuck = at

    stuck_raised: bool = fact(
        "_raised",
        """Whether the outcome just recorded brought the stuck signal to ``stuck_repeat_threshold``
        (a stateful tool's call, whose repeat is counted with its result).""",
    )

    def settle_polled(self) -> None:
        """Calls of stateful tools still without an outcome (halted at their check, or never
        reported) count their repeat now, without a result, as they would have at their check had
        the tool not been listed (before a summary)."""
        self._count_stale_polls(self.checks)

    def abandon(self, seq: int) -> None:
        if self._polled:
            self._count_polled(seq, None)
        super().abandon(seq)
