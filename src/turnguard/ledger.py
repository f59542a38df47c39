"""Per-turn facts, recorded once for every plugin: counts, key repeats, streaks, cycles.

The ledger decides nothing. Policies read it (through the read-only properties below, which is
what hooks receive as ``turn``) and return verdicts. Memory is bounded: at most
``max_tracked_keys`` distinct keys are counted per turn; a key first seen after the table is
full is treated as seen once each time (its repeats are not counted, ``keys_overflowed`` turns
true, and the hard backstop still bounds the turn). Streaks compare consecutive keys and are
unaffected. Each tracked key costs about 80 bytes (an 8-byte digest and its count in a dict), so
the default bound of 65,536 keys holds a turn's ledger to about 5 MiB however long it runs
(``benchmarks/bench_core.py`` measures it over a 1,000,000-call turn).

Hooks receive a ``LedgerView`` (one per turn, made by the ``Turn``): the facts below, read-only, with no mutator
and no underscored field reachable by attribute. Only the built-in policy modules
(``turnguard.policies``) get the ledger itself, and read its underscored fields on the hot path.

Outcomes are tied to their call: each checked call gets a sequence number (``checks``, never
rolled back), and ``record_outcome(seq, outcome)`` credits the outcome to that call. Streaks are
defined on check order: a call belongs to the streak that was current when it was checked, and
the failing count of a streak is computed over its calls in check order, whatever order their
outcomes arrive in (an outcome that arrives before an earlier call's waits for it). An outcome
of a call from a streak ended by ``resolve`` or ``retry`` counts in ``outcomes()`` and nowhere else.

A streak that another key ends while calls of it still wait for their outcome (identical calls
then a different one, in one model response) is kept as an ``EndedStreak`` until they come: they
settle there, in check order, and its stop level fires at the outcome that completes it
(``ended_stop``), as it would have had the calls run one at a time. ``resolve`` and ``retry``
end every streak for good.

Two facts are kept only when the configuration asks for them, so the default path pays one
branch: the ``stale_repeat`` stuck signal's count (``max_stale_repeat``: a key's repeats since
the last call whose key had never been seen before in the turn) and the settled streak
(``settled_streak_length``, which ``streak_stop_on="any"`` stops on).
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turnguard import state as st
from turnguard.keys import DIGEST_SIZE, cached_digest
from turnguard.model import (
    ALL_TOOLS,
    MAX_RESTART_TOOLS,
    OTHER_TOOLS,
    Action,
    Level,
    LoopDetectedEvent,
    Outcome,
    Threshold,
    ToolCall,
    TurnSummary,
    Verdict,
)
from turnguard.state import Fields

if TYPE_CHECKING:
    from turnguard.config import GuardConfig

def _quiet_until(cap_mode: str, soft_cap: int | None, hard_cap: int | None) -> int | float:
    """Up to where the cap cannot fire: N (explicit), S (adaptive), everywhere when it is off (the
    mode's own limit is set in its mode)."""
    limit = hard_cap if cap_mode == "explicit" else soft_cap if cap_mode == "adaptive" else None
    return float("inf") if limit is None else limit


def _seed_event_ids() -> None:
    global _event_prefix, _event_numbers
    _event_prefix = os.urandom(8).hex()
    _event_numbers = itertools.count(1)


_event_prefix = ""
_event_numbers = itertools.count(1)
_seed_event_ids()
os.register_at_fork(after_in_child=_seed_event_ids)


def new_event_id() -> str:
    """A detection's id: 32 hex digits like a UUID's, a random half per process (drawn again in
    a forked child) and a counter, so that making one costs no system call (``uuid4`` does)."""
    return f"{_event_prefix}{next(_event_numbers):016x}"


def answered_digest(event: LoopDetectedEvent) -> bytes | None:
    """The digest of the call an answered detection was about (``None``: it names none)."""
    try:
        return bytes.fromhex(event.key_digest) if event.key_digest else None
    except (TypeError, ValueError):
        return None


def count_outcome(outcome: Outcome, failing: int, settled: int, peak: int, stop_any: bool) -> tuple[int, int, int]:
    """The streak's settling rule, in one place: how the next call of a streak, in check order,
    moves the stop level's counts (``failing``, ``settled`` and the stop count's ``peak``).
    ``ERROR`` extends the failing count, ``DENIED`` leaves it as it is, ``OK``/``UNKNOWN`` reset
    it; with ``streak_stop_on="any"`` (``stop_any``) the settled count counts every outcome but
    ``DENIED`` and is the stop count. Every settling goes through here: the ledger's current
    streak (``Ledger._settle``), an ended one (``EndedStreak``), a replay's prefix
    (``Ledger.count_settled``) and calibrate's turn facts (``equivalence.turn_facts``). The hot
    path keeps one inlined copy, for ``OK`` in ``Ledger.record_outcome``
    (``tests/test_streak_settling.py`` holds it equal)."""
    if outcome is _ERROR:
        failing += 1
        if not stop_any and failing > peak:
            peak = failing
    elif outcome is not _DENIED:
        failing = 0
    if stop_any and outcome is not _DENIED:
        settled += 1
        peak = settled
    return failing, settled, peak


_STREAK_STOP = (str(Threshold.STREAK), str(Level.STOP))
_OK = Outcome.OK  # enum members looked up once: class attribute access costs on the hot path
_ERROR = Outcome.ERROR
_DENIED = Outcome.DENIED
_ABANDONED = _DENIED
"""How a call whose outcome will never come (``Ledger.abandon``) settles: neither a failure nor a reset."""
_OTHER_OUTCOMES = tuple(o.value for o in Outcome if o is not _OK)
"""The outcomes a ledger counts by value (``OK``'s count is a field of its own)."""


_FACTS = (
    "_tool_calls", "_cycles", "_cycle_start", "_max_repeat", "_overflowed", "_last_key", "_last_tool", "_streak",
    "_failing", "_detections", "_retries", "_first_stuck", "_max_stale", "_looped", "_news", "_settled",
    "_seq", "_next", "_stop_peak", "_ok", "_baseline",
)
"""The scalar facts ``Ledger.fork`` copies (the dicts and the set are copied separately)."""


def _field(attr: str, doc: str | None = None) -> Any:
    """A read-only fact: a property whose getter is ``operator.attrgetter(attr)`` (C-level; the
    policies read these on every call)."""
    return property(operator.attrgetter(attr), doc=doc)


class Ledger:
    """What has happened in one turn. Mutated only by the guard, under the turn's lock."""

    __slots__ = (
        "__weakref__",
        "_agent_name",
        "_all_stateful",
        "_baseline",
        "_cap_mode",
        "_cap_quiet_until",
        "_cohort",
        "_config",
        "_conversation_id",
        "_counts",
        "_cyc",
        "_cycle_start",
        "_cycles",
        "_detections",
        "_early",
        "_ended",
        "_exempt",
        "_failing",
        "_fired",
        "_first_stuck",
        "_fresh_state",
        "_hard_cap",
        "_last_key",
        "_last_tool",
        "_late",
        "_looped",
        "_max_keys",
        "_max_repeat",
        "_max_stale",
        "_named",
        "_news",
        "_next",
        "_ok",
        "_opened_ns",
        "_outcomes",
        "_overflowed",
        "_polled",
        "_promptable",
        "_raised",
        "_restarts",
        "_results",
        "_resumed_from",
        "_retries",
        "_seq",
        "_settled",
        "_since_new",
        "_soft_cap",
        "_stale",
        "_started_at",
        "_stateful",
        "_stop_any",
        "_stop_at",
        "_stop_peak",
        "_streak",
        "_stuck_at",
        "_tool_calls",
        "_turn_id",
        "_warn_at",
    )

    def __new__(cls, config: GuardConfig, **identity: Any) -> Ledger:
        """A ``CyclingLedger`` where ``cycle_repeat`` is on: the plain ledger pays nothing for it."""
        if cls is Ledger and (config.cycle_repeat_warn_at or config.cycle_repeat_stop_at):
            cls = CyclingLedger
        return object.__new__(cls)

    def __init__(
        self,
        config: GuardConfig,
        *,
        turn_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        promptable: bool = False,
        cohort: str = "live",
        resumed_from: str | None = None,
        fresh_state: tuple[str, ...] = (),
        checks: int = 0,
    ) -> None:
        self._config = config
        self._cohort = str(cohort)
        self._resumed_from = resumed_from
        self._fresh_state = fresh_state
        self._turn_id = turn_id or uuid.uuid4().hex
        self._conversation_id = conversation_id
        self._agent_name = agent_name
        self._promptable = bool(promptable)
        self._cap_mode = cap_mode = config.cap_mode
        self._soft_cap = config.soft_cap if cap_mode == "adaptive" else None
        self._hard_cap = config.hard_cap
        self._started_at = time.monotonic()
        self._opened_ns = time.time_ns()
        self._tool_calls = 0
        self._cycles = 0
        self._cycle_start = 0
        self._counts: dict[bytes, int] = {}
        self._max_repeat = 0
        self._overflowed = False
        self._last_key: bytes | None = None
        self._last_tool: str | None = None
        self._streak = 0
        self._failing = 0
        self._ok = 0
        self._outcomes = dict.fromkeys(_OTHER_OUTCOMES, 0)
        """The other outcomes' counts, by value (``OK``'s is ``_ok``: most outcomes are)."""
        self._detections = 0
        self._retries = 0
        self._first_stuck = 0
        self._stale = config.stuck_signal == "stale_repeat"
        self._since_new: dict[bytes, int] = {}
        self._max_stale = 0
        self._looped = False
        self._news: bytes | None = None
        self._stop_any = config.streak_stop_on == "any"
        self._settled = 0
        self._seq = checks  # checks counted elsewhere before (a shadow started afresh in a resumed turn)
        self._next = checks + 1
        self._early: dict[int, Outcome] = {}
        self._stop_peak = 0
        self._fired: set[tuple[str, str]] = set()
        self._ended: list[EndedStreak] = []  # streaks ended with calls still waiting (EndedStreak)
        self._late: EndedStreak | None = None  # ended_stop
        self._cap_quiet_until = _quiet_until(cap_mode, self._soft_cap, self._hard_cap)
        self._cyc: CycleRuns | None = None
        """The ``cycle_repeat`` facts (a ``CyclingLedger``'s; ``None``: the policy is off)."""
        self._settings(config)

    def _settings(self, config: GuardConfig) -> None:
        """The thresholds the policies read on the hot path, and the facts kept for the tools the
        configuration names (``stateful_tools``, ``streak_exempt_tools``)."""
        self._stuck_at = config.stuck_repeat_threshold
        self._warn_at = config.streak_warn_at
        self._stop_at = config.streak_stop_at
        self._max_keys = config.max_tracked_keys
        self._stateful = frozenset(config.stateful_tools)
        self._all_stateful = ALL_TOOLS in self._stateful
        self._exempt = frozenset(config.streak_exempt_tools)
        self._named = bool(self._stateful or self._exempt)
        """Whether the configuration names tools: the guard counts calls with ``count_named``."""
        self._polled: dict[int, tuple[bytes, int]] = {}
        """Stateful tools' calls whose repeat waits for their outcome: check -> (digest, call number)."""
        self._results: dict[int, bytes] = {}
        """Result digests of the current streak's calls whose outcome waits for an earlier one's."""
        self._baseline: bytes | None = None
        """The latest result settled in the current streak (a stateful tool's)."""
        self._restarts: dict[str, int] = {}
        self._raised = False
        """The latest ``record_polled`` brought the stuck signal to ``stuck_repeat_threshold``."""

    # -- read-only facts -----------------------------------------------------------------------

    config: GuardConfig = _field("_config")

    turn_id: str = _field("_turn_id")

    cohort: str = _field(
        "_cohort", "``live``, or ``probe`` when the probe configuration guards the turn (``tg.Probe``)."
    )

    conversation_id: str | None = _field("_conversation_id")

    agent_name: str | None = _field("_agent_name")

    resumed_from: str | None = _field(
        "_resumed_from",
        "The turn id of the snapshot this turn was forked from (resumed twice in one guard), or ``None``.",
    )

    fresh_state: tuple[str, ...] = _field(
        "_fresh_state", "The plugins whose per-turn state started afresh at a resume (the snapshot had none for them)."
    )

    promptable: bool = _field(
        "_promptable", "Whether a person is watching (attended): detections reach the user rather than halt."
    )

    cap_mode: str = _field("_cap_mode", "``explicit``, ``adaptive`` or ``disabled``.")

    soft_cap: int | None = _field("_soft_cap", "S under the adaptive cap, else ``None``.")

    hard_cap: int | None = _field(
        "_hard_cap", "N (explicit) or S * m (adaptive): past it the turn halts whatever it does."
    )

    started_at: float = _field("_started_at")

    opened_ns: int = _field(
        "_opened_ns", "When the turn opened, Unix ns, read once (a resumed turn's: the resume less the time it ran)."
    )

    tool_calls: int = _field("_tool_calls", "Calls checked in the turn, including the current one.")

    cycles: int = _field("_cycles", "Model requests begun in the turn (a re-sent request counts again).")

    @property
    def calls_this_cycle(self) -> int:
        return self._tool_calls - self._cycle_start

    cap_quiet_until: int | float = _field(
        "_cap_quiet_until", "The cap cannot fire while ``tool_calls`` is at most this (N, S, or infinity if off)."
    )

    max_key_repeat: int = _field("_max_repeat", "The largest number of times any one key has been seen in the turn.")

    max_stale_repeat: int = _field(
        "_max_stale",
        """The ``stale_repeat`` signal's count (0 unless that signal is configured): the largest
        number of times one key was seen with no never-seen-before key in between, so a re-run
        after an edit (a new key) starts afresh while a loop of 1 to k calls keeps counting.""",
    )

    @property
    def distinct_keys(self) -> int:
        return len(self._counts)

    keys_overflowed: bool = _field(
        "_overflowed", "True once a key went uncounted because ``max_tracked_keys`` was reached."
    )

    streak_length: int = _field("_streak", "Consecutive checked calls with the current key.")

    failing_streak_length: int = _field(
        "_failing", "Consecutive identical calls of the current streak whose outcome was ``ERROR``."
    )

    settled_streak_length: int = _field(
        "_settled",
        """Consecutive identical calls of the current streak whose outcome was anything but
        ``DENIED`` (kept when ``streak_stop_on="any"``; 0 otherwise).""",
    )

    checks: int = _field("_seq", "Calls checked in the turn, rolled back or not: the sequence number of the latest.")

    @property
    def awaiting_in_streak(self) -> int:
        """Calls of the current streak, before the latest, whose outcome has not come yet (0 in
        a sequential run: each outcome came before the next call)."""
        if self._last_key is None:
            return 0
        early = self._early
        return sum(1 for seq in range(self._next, self._seq) if seq not in early)

    stop_count: int = _field(
        "_stop_peak",
        """The stop level's count for the current streak (``failing_streak_length``, or with
        ``streak_stop_on="any"`` ``settled_streak_length``), the largest it has been in the
        streak: it reaches ``streak_stop_at`` once per streak.""",
    )

    def provisional_stop_count(self) -> int:
        """The stop level's count for the current streak if every earlier call of it still
        waiting for its outcome failed (counted up to ``streak_stop_at``): identical calls of one
        model response are all checked before any outcome, and past this many, had they run one
        at a time, the stop level would have fired before them."""
        return self._worst_stop(self._seq - 1)

    def fired_in_streak(self, threshold: Threshold | str, level: Level | str) -> bool:
        """Whether a detection of ``threshold`` at ``level`` was noted in the current streak."""
        return (str(threshold), str(level)) in self._fired

    streak_digest: bytes | None = _field("_last_key")

    last_tool_name: str | None = _field("_last_tool")

    first_stuck_call: int = _field(
        "_first_stuck",
        """The call at which the configured stuck signal first reached ``stuck_repeat_threshold``
        (0: never).""",
    )

    detections: int = _field("_detections")

    retries: int = _field("_retries")

    @property
    def stuck_count(self) -> int:
        """The configured stuck signal's count (``stuck_signal``): ``max_stale_repeat`` under
        ``stale_repeat``, else ``max_key_repeat``. Whether it makes the turn stuck is the cap's
        rule (``turnguard.policies.cap.stuck``)."""
        return self._max_stale if self._stale else self._max_repeat

    def outcomes(self, outcome: Outcome) -> int:
        """How many outcomes of this kind were recorded."""
        outcome = Outcome.parse(outcome)
        return self._ok if outcome is _OK else self._outcomes[outcome.value]

    def outcome_counts(self) -> dict[str, int]:
        """How many outcomes of each kind were recorded, by value (``"ok"``, ``"error"``, ...)."""
        return {_OK.value: self._ok, **self._outcomes}

    def repeats_of(self, digest: bytes) -> int:
        """How many times the key with this digest has been counted in the turn."""
        return self._counts.get(digest, 0)

    # -- facts (the guard calls these under the turn's lock) -----------------------------------

    def begin_cycle(self) -> None:
        self._cycles += 1
        self._cycle_start = self._tool_calls

    def count_call(self, digest: bytes, tool_name: str) -> int:
        """Count a checked call; returns its sequence number (``checks``), which its outcome is
        recorded under (``record_outcome``)."""
        self._tool_calls += 1
        seq = self._seq = self._seq + 1
        counts = self._counts
        seen = counts.get(digest)
        if seen is not None:
            seen += 1
            counts[digest] = seen
        elif len(counts) < self._max_keys:
            counts[digest] = seen = 1
        else:
            self._overflowed = True  # the documented degradation: this key's repeats go uncounted
            seen = 1
        if seen > self._max_repeat:
            self._max_repeat = seen
            if seen == self._stuck_at and not self._first_stuck and not self._stale:
                self._first_stuck = self._tool_calls
        if self._stale:
            if seen == 1:  # news (most calls), inlined: a key first seen now restarts every count at 1
                since = self._since_new
                since.clear()
                since[digest] = 1
                self._looped = False
                self._news = digest
                if not self._max_stale:
                    self._raise_stale(1)
            else:
                self._count_stale(digest, seen)
        if digest == self._last_key:
            self._streak += 1
        else:
            if self._next != seq:  # calls of the streak this one ends still wait for their outcome
                self._end_streak(seq)
            self._last_key = digest
            self._last_tool = tool_name
            self._streak = 1
            self._next = seq  # _new_streak, inlined: most calls start a streak
            if self._stop_peak:  # the stop count's peak bounds both counts: 0 means nothing to reset
                self._failing = 0
                self._settled = 0
                self._stop_peak = 0
            if self._early:
                self._early.clear()
            if self._fired:
                self._fired.clear()
        return seq

    def count_settled(self, digests: Sequence[bytes], tools: Sequence[str], outcomes: Sequence[Outcome],
                      cycles: Sequence[int]) -> bool:
        """For replay tools (``turnguard calibrate``): ``begin_cycle`` ``cycles[i]`` times, then
        ``count_call`` and at once ``record_outcome`` for each call, in one pass with the facts
        held in locals (a replay counts most of a turn this way, without checks). Only where that
        is the plain case: no tools named, the ``repeat`` signal, no outcome waiting; ``False``
        (nothing done) otherwise, and the caller counts call by call."""
        if self._named or self._stale or self._early or self._ended or self._next != self._seq + 1 or self._cyc:
            return False
        after = _count_settled(self, digests, tools, outcomes, cycles)
        self._tool_calls, self._cycles, self._cycle_start = after.tool_calls, after.cycles, after.cycle_start
        self._max_repeat, self._first_stuck, self._overflowed = after.max_repeat, after.first_stuck, after.overflowed
        self._last_key, self._last_tool, self._streak = after.last_key, after.last_tool, after.streak
        self._failing, self._settled, self._stop_peak = after.failing, after.settled, after.stop_peak
        self._ok = after.ok
        self._seq += len(digests)
        self._next = self._seq + 1
        return True

    def _end_streak(self, seq: int) -> None:
        """The current streak ends at check ``seq`` with calls still waiting for their outcome:
        kept (``EndedStreak``) so that they settle in it and its stop level can still fire, as
        it would have had the calls run one at a time. Not when its stop level cannot fire (off,
        or fired already, but for a stateful tool's)."""
        results, self._results = self._results, {}
        stopped = _STREAK_STOP in self._fired
        if not self._stop_at or (stopped and not self.polls(self._last_tool)):
            return  # (a stateful tool's may restart at a changed result: its stop can fire again)
        ended = EndedStreak(self._next, seq - 1, self._streak, self._failing, self._settled, self._stop_peak,
                            self._early, self._last_key, self._last_tool, self._baseline, results, stopped)
        if len(self._ended) >= MAX_ENDED_STREAKS:
            del self._ended[0]
        self._ended.append(ended)
        self._early = {}

    def _new_streak(self, first: int) -> None:
        """The current streak starts at check ``first``: earlier calls' outcomes are not its own."""
        self._next = first
        self._failing = 0
        self._settled = 0
        self._stop_peak = 0
        if self._early:
            self._early.clear()
        if self._fired:
            self._fired.clear()

    def _count_stale(self, digest: bytes, seen: int, at: int = 0) -> None:
        """The ``stale_repeat`` count of a key seen before (``seen > 1``; a key first seen now is
        news, handled in ``count_call``): its occurrences since the last call whose key was never
        seen before ("news"), plus one, once the news call itself has come round again, for keys
        also seen before the news. A loop's first round is news, so the news call coming round
        shows the loop, and its first round then counts: a loop of k calls reaches each count at
        the same call as the seed's ``repeat`` count. A plain re-run (``edit, test, edit, test,
        test``) gets no such credit: the news (the edit) never recurs.

        The table holds only keys seen since the last news (cleared at each news: amortized O(1)
        per call). ``at``: the call it counts (0: the latest, ``tool_calls``)."""
        since = self._since_new
        raw = since.get(digest, 0) + 1
        since[digest] = raw
        if digest == self._news and not self._looped:  # the news call came round: a loop
            self._looped = True
            counts = self._counts
            credited = max((n + 1 for key, n in since.items() if counts.get(key, 0) > n), default=0)
            if credited > self._max_stale:
                self._raise_stale(credited, at)
        stale = raw + 1 if self._looped and seen > raw else raw
        if stale > self._max_stale:
            self._raise_stale(stale, at)

    def _raise_stale(self, stale: int, at: int = 0) -> None:
        self._max_stale = stale
        if stale >= self._stuck_at and not self._first_stuck:
            self._first_stuck = at or self._tool_calls

    # -- tools the configuration names (stateful_tools, streak_exempt_tools) -------------------

    def polls(self, tool_name: str | None) -> bool:
        """Whether ``tool_name`` is one of the configuration's ``stateful_tools``."""
        return self._all_stateful or tool_name in self._stateful

    def count_named(self, digest: bytes, tool_name: str) -> int:
        """``count_call`` in a turn whose configuration names tools. A stateful tool's call joins
        its streak now and has its repeat counted when its outcome comes (``record_polled``: the
        (call, result) pair is the key); an exempt tool's call is counted but joins no streak, and
        ends the one it interrupts, as any other call does."""
        if self._all_stateful or tool_name in self._stateful:
            seq = self._count_polled_call(digest, tool_name)
        else:
            seq = self.count_call(digest, tool_name)
        if tool_name in self._exempt:
            self._last_key = None
            self._last_tool = None
            self._streak = 0
            self._new_streak(seq + 1)
            self._results = {}
        return seq

    def _count_polled_call(self, digest: bytes, tool_name: str) -> int:
        """``count_call`` for a stateful tool, but for its repeat (counted with its result)."""
        self._tool_calls += 1
        seq = self._seq = self._seq + 1
        polled = self._polled
        polled[seq] = (digest, self._tool_calls)
        if len(polled) > MAX_POLLED:  # outcomes that never came: the oldest counts without a result
            self._count_polled(next(iter(polled)), None)
        if digest == self._last_key:
            self._streak += 1
        else:
            if self._next != seq:
                self._end_streak(seq)
            self._last_key = digest
            self._last_tool = tool_name
            self._streak = 1
            self._new_streak(seq)
            self._baseline = None
        return seq

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
            if seq == self._next:
                due = self._apply_result(seq, result)
            elif seq > self._next:
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
        pending = self._polled.pop(seq, None)
        if pending is None:  # rolled back, or counted already
            return False
        digest, at = pending
        key = digest if result is None else digest + result
        before = self._max_stale if self._stale else self._max_repeat
        counts = self._counts
        seen = counts.get(key)
        if seen is not None:
            seen += 1
            counts[key] = seen
        elif len(counts) < self._max_keys:
            counts[key] = seen = 1
        else:
            self._overflowed = True
            seen = 1
        if seen > self._max_repeat:
            self._max_repeat = seen
            if seen == self._stuck_at and not self._first_stuck and not self._stale:
                self._first_stuck = at
        if self._stale:
            if seen == 1:  # a new (call, result) is news
                since = self._since_new
                since.clear()
                since[key] = 1
                self._looped = False
                self._news = key
                if not self._max_stale:
                    self._raise_stale(1, at)
            else:
                self._count_stale(key, seen, at)
        return before < self._stuck_at <= (self._max_stale if self._stale else self._max_repeat)

    stuck_raised: bool = _field(
        "_raised",
        """Whether the outcome just recorded brought the stuck signal to ``stuck_repeat_threshold``
        (a stateful tool's call, whose repeat is counted with its result).""",
    )

    def _apply_result(self, seq: int, result: bytes) -> bool:
        """Check ``seq``'s result settles in the current streak: one that differs from the
        streak's latest restarts the streak there. True when the streak it ends had reached its
        stop count unreported (in this report): it is kept as ``ended_stop`` for the streak policy."""
        baseline, self._baseline = self._baseline, result
        if baseline is None or result == baseline:
            return False
        kept = self._seq - seq + 1
        due = bool(self._stop_at) and self._stop_peak >= self._stop_at and _STREAK_STOP not in self._fired
        if due:
            self._late = EndedStreak(seq, seq - 1, self._streak - kept, self._failing, self._settled, self._stop_peak,
                                     {}, self._last_key, self._last_tool, stopped=True)
        self._streak = kept
        self._failing = self._settled = self._stop_peak = 0
        if self._fired:
            self._fired.clear()
        self._restarted(self._last_tool)
        return due

    def _restarted(self, tool: str | None, times: int = 1) -> None:
        if tool is None:  # (a streak's calls have a tool: not reached)
            return
        restarts = self._restarts
        if tool not in restarts and len(restarts) >= MAX_RESTART_TOOLS:
            tool = OTHER_TOOLS
        restarts[tool] = restarts.get(tool, 0) + times

    @property
    def result_restarts(self) -> int:
        """Streak restarts by a changed result (stateful tools) in the turn."""
        return sum(self._restarts.values())

    def restarts_by_tool(self) -> dict[str, int]:
        """``result_restarts`` by tool name (at most ``MAX_RESTART_TOOLS`` names; ``_other``)."""
        return dict(self._restarts)

    def record_outcome(self, seq: int, outcome: Outcome) -> bool | None:
        """The outcome of check ``seq`` (each check's once: the guard ignores any other report).

        It settles that call in its streak, in check order: ``ERROR`` extends the failing count,
        ``DENIED`` leaves it as it is, ``OK``/``UNKNOWN`` reset it; with ``streak_stop_on="any"``
        the settled count counts every outcome but ``DENIED``. An outcome that arrives before an
        earlier call's waits for it. A call of a streak that another key ended settles in that
        streak (``EndedStreak``): true is returned when that brought its stop count to
        ``streak_stop_at`` (``ended_stop``), so that the outcome hooks are asked even where the
        current streak is quiet. A call of a streak ended by ``retry``/``resolve`` changes no streak."""
        if outcome is _OK:
            self._ok += 1
            if seq == self._next:  # the common case (the next call of the streak succeeded): count_outcome(OK), inlined
                self._next = seq + 1
                self._failing = 0
                if self._stop_any:
                    self._settled += 1
                    self._stop_peak = self._settled
                if self._early:
                    return self._settle_waiting()
                return None
        else:
            self._outcomes[outcome._value_] += 1
        if seq != self._next:
            if seq > self._next:  # an earlier call of the streak has no outcome yet: this one waits
                self._early[seq] = outcome
            elif self._ended:  # a call of a streak another key ended
                return self._settle_ended(seq, outcome)
            return None
        self._settle(outcome)
        if self._early:
            return self._settle_waiting()
        return None

    def abandon(self, seq: int) -> None:
        """The outcome of check ``seq`` will never come (the guard stopped waiting for it): it
        settles as neither a failure nor a reset, so its streak's later outcomes can count (a
        stateful tool's call counts its repeat without a result)."""
        if self._polled:
            self._count_polled(seq, None)
        if seq == self._next:
            self._settle(_ABANDONED)
            if self._early:
                self._settle_waiting()
        elif seq > self._next:
            self._early[seq] = _ABANDONED
        elif self._ended:
            self._settle_ended(seq, _ABANDONED)

    def _settle_ended(self, seq: int, outcome: Outcome) -> bool:
        """Settle check ``seq`` in the ended streak that holds it (if one does)."""
        self._late = None
        for ended in self._ended:
            if ended.next <= seq <= ended.last:
                break
        else:
            return False
        restarts = ended.restarts
        reached = ended.settle(seq, outcome, self._stop_any, self._stop_at)
        if ended.restarts != restarts:
            self._restarted(ended.tool, ended.restarts - restarts)
        if ended.next > ended.last:  # settled: done with it
            self._ended.remove(ended)
        if reached:
            self._late = ended
        return reached

    @property
    def ended_stop(self) -> EndedStreak | None:
        """The ended streak (another key was checked while calls of it still waited) whose stop
        count the latest outcome of it brought to ``streak_stop_at``, until that detection is noted."""
        return self._late

    def _settle(self, outcome: Outcome) -> None:
        """Settle the current streak's next call with ``outcome`` (``count_outcome``)."""
        self._next += 1
        self._failing, self._settled, self._stop_peak = count_outcome(
            outcome, self._failing, self._settled, self._stop_peak, self._stop_any)

    def _settle_waiting(self) -> bool | None:
        """Settle the outcomes that waited for the one just settled. True when a stateful tool's
        streak reached its stop count and then restarted at a changed result, all in this report
        (its stop is due now: ``ended_stop``)."""
        early, results = self._early, self._results
        due = None
        while self._next in early:
            if results and self._next in results:
                due = self._apply_result(self._next, results.pop(self._next)) or due
            self._settle(early.pop(self._next))
        return due

    def _worst_stop(self, last: int) -> int:
        """The stop count after check ``last`` if the calls of the streak waiting for an outcome
        up to it all failed, and the calls whose outcome is known counted as they went, with their
        results (a stateful tool's changed result restarts the count there): counted backwards
        from ``last``, stopping at a known reset, a restart or ``streak_stop_at`` (so the cost is
        bounded by the threshold, not the streak)."""
        limit = self._stop_at
        if not limit:
            return 0
        early, results = self._early, self._results
        any_outcome = self._stop_any
        count = 0
        seq = last
        while seq >= self._next:
            outcome = early.get(seq)
            if outcome is None or outcome is _ERROR or (any_outcome and outcome is not _DENIED):
                count += 1
                if count >= limit:
                    return count
            elif outcome is not _DENIED:  # a known OK/UNKNOWN: the error count restarts after it
                return count
            if results and seq in results and self._restarts_at(seq):
                return count
            seq -= 1
        return min(limit, count + (self._settled if any_outcome else self._failing))

    def provisional_streak_length(self) -> int:
        """``streak_length`` with the results of the streak's calls that wait for an earlier
        call's outcome counted where they stand (check order): the streak restarts at the latest
        call whose result changed, as it would have had the calls run one at a time."""
        results = self._results
        if not results:
            return self._streak
        before, restart = self._baseline, 0
        for seq in sorted(results):
            result = results[seq]
            if before is not None and result != before:
                restart = seq
            before = result
        return self._seq - restart + 1 if restart else self._streak

    def _restarts_at(self, seq: int) -> bool:
        """Whether waiting check ``seq``'s result differs from the latest result before it in the
        streak (a waiting call's, else the settled ``baseline``): the streak restarts there."""
        results = self._results
        earlier = [s for s in results if s < seq]
        before = results[max(earlier)] if earlier else self._baseline
        return before is not None and before != results[seq]

    def reset_streak(self, answered: bytes | None = None) -> None:
        """Forget the current streak (the user answered an ASK): the next call starts afresh, and
        outcomes still to come for its calls change no streak; so for the ended streaks of the
        key the answer was about (``answered``, a digest). Other streaks that another key ended
        while calls of theirs still wait go on settling those outcomes (``EndedStreak``)."""
        self._last_key = None
        self._last_tool = None
        self._streak = 0
        self._new_streak(self._seq + 1)
        if answered is not None and self._ended:
            self._ended = [ended for ended in self._ended if ended.digest != answered]
        self._late = None
        if self._results:
            self._results = {}
        self._baseline = None

    def rollback_cycle(self) -> None:
        """The current model request is re-sent: discard its calls, clear repeats and streaks."""
        self._retries += 1
        self._tool_calls = self._cycle_start
        self._counts.clear()
        self._max_repeat = 0
        self._overflowed = False
        self._first_stuck = 0
        self._since_new.clear()
        self._max_stale = 0
        self._looped = False
        self._news = None
        self._polled.clear()
        self._raised = False
        self.reset_streak()
        if self._ended:  # the re-sent request's calls are discarded, with every streak
            self._ended = []

    def note_detection(self, event: LoopDetectedEvent | None = None) -> None:
        """A detection was made (``event``: which, so that each level fires once per streak)."""
        self._detections += 1
        if event is not None:
            fired = (str(event.threshold), str(event.level))
            if fired == _STREAK_STOP and self._late is not None:
                self._late = None  # an ended streak's stop, or a restarted one's
                if not (self._stop_at and self._stop_peak >= self._stop_at):
                    return  # (the current streak's own is due too, in the same report: noted with it)
            self._fired.add(fired)

    def fork(self, config: GuardConfig, *, promptable: bool | None = None) -> Ledger:
        """A copy of these facts under another configuration, for replay tools (``turnguard
        calibrate``) that count a turn's common prefix once for many configurations.

        The facts must not depend on the difference: ``max_tracked_keys``, ``stuck_signal`` and
        ``streak_stop_on`` must be equal, and ``stuck_repeat_threshold`` equal or not yet reached
        under either value; a ledger without cycle runs (``cycle_repeat`` off) forks into one that
        keeps them only before its first call. Raises ``ValueError`` otherwise.
        """
        stuck = config.stuck_repeat_threshold
        reached = self._max_stale if self._stale else self._max_repeat
        if (
            config.max_tracked_keys != self._max_keys
            or (config.stuck_signal == "stale_repeat") != self._stale
            or (config.streak_stop_on == "any") != self._stop_any
            or (stuck != self._stuck_at and reached >= min(stuck, self._stuck_at))
            or frozenset(config.stateful_tools) != self._stateful
            or frozenset(config.streak_exempt_tools) != self._exempt
            or (self._cyc is None and self._seq and (config.cycle_repeat_warn_at or config.cycle_repeat_stop_at))
        ):
            raise ValueError(
                "fork(): the facts so far depend on stuck_repeat_threshold, stuck_signal, streak_stop_on, "
                "max_tracked_keys, stateful_tools, streak_exempt_tools or cycle_repeat (kept only where it is on)"
            )
        twin = Ledger(
            config,
            turn_id=self.turn_id,
            conversation_id=self.conversation_id,
            agent_name=self.agent_name,
            promptable=self.promptable if promptable is None else promptable,
        )
        twin._started_at = self._started_at
        twin._opened_ns = self._opened_ns
        for name in _FACTS:
            setattr(twin, name, getattr(self, name))
        twin._counts = dict(self._counts)
        twin._since_new = dict(self._since_new)
        twin._outcomes = dict(self._outcomes)
        twin._early = dict(self._early)
        twin._fired = set(self._fired)
        twin._ended = [ended.copy() for ended in self._ended]
        twin._polled = dict(self._polled)
        twin._results = dict(self._results)
        twin._restarts = dict(self._restarts)
        return twin

    # -- state (snapshots) ----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The facts as JSON data, for a turn's snapshot; ``from_state`` reads them back. Key
        repeats are digests (hex), never arguments."""
        facts: dict[str, Any] = {name: getattr(self, f"_{name}") for name in _STATE_COUNTS}
        facts.update({name: getattr(self, f"_{name}") for name in _STATE_FLAGS})
        facts.update({name: _hex(getattr(self, f"_{name}")) for name in _STATE_DIGESTS})
        facts["last_tool"] = self._last_tool
        facts["counts"] = {digest.hex(): n for digest, n in self._counts.items()}
        facts["since_new"] = {digest.hex(): n for digest, n in self._since_new.items()}
        facts["outcomes"] = self.outcome_counts()
        facts["early"] = _early_state(self._early)
        facts["fired"] = sorted([list(pair) for pair in self._fired])
        if self._ended:
            facts["ended"] = [ended.state() for ended in self._ended]
        self._polling_state(facts)
        return facts

    def _polling_state(self, facts: dict[str, Any]) -> None:
        """The stateful tools' facts, each only when it holds something (version 2's rule)."""
        if self._polled:
            facts["polled"] = {str(seq): [digest.hex(), at] for seq, (digest, at) in self._polled.items()}
        if self._results:
            facts["results"] = _results_state(self._results)
        if self._baseline is not None:
            facts["baseline"] = self._baseline.hex()
        if self._restarts:
            facts["restarts"] = dict(self._restarts)

    @classmethod
    def from_state(cls, config: GuardConfig, state: Any, *, path: str = "facts", elapsed_s: float = 0.0,
                   **identity: Any) -> Ledger:
        """A ledger holding the facts ``state()`` gave, under ``config`` and with ``identity``
        (this class's keywords: ``turn_id``, ...), its turn ``elapsed_s`` seconds old. Every field
        is checked (type, range, the bounds a live ledger keeps, such as ``max_tracked_keys``): a
        bad one is a ``SnapshotError`` naming it (``facts.counts``)."""
        ledger = cls(config, **identity)
        ledger._restore(Fields(state, path))
        ledger._started_at = time.monotonic() - elapsed_s
        ledger._opened_ns = time.time_ns() - round(elapsed_s * 1e9)
        return ledger

    def _restore(self, f: Fields) -> None:
        seq = self._seq = f.integer("seq")
        calls = self._tool_calls = f.integer("tool_calls", 0, seq)
        self._cycles = f.integer("cycles")
        self._cycle_start = f.integer("cycle_start", 0, calls)
        self._detections = f.integer("detections")
        self._retries = f.integer("retries")
        self._counts = _digest_counts(f, "counts", self._max_keys, calls, pairs=True)
        self._max_repeat = f.integer("max_repeat", max(self._counts.values(), default=0), calls)
        self._overflowed = f.boolean("overflowed")
        self._first_stuck = f.integer("first_stuck", 0, calls)
        self._since_new = _digest_counts(f, "since_new", self._max_keys + 1, calls, pairs=True)
        self._max_stale = f.integer("max_stale", 0, calls)
        self._looped = f.boolean("looped")
        news = f.get("news")
        self._news = st.digest(f.at("news"), news, _key_size(news), optional=True)
        self._restore_streak(f, seq, calls)
        self._restore_outcomes(f.object("outcomes"))
        self._restore_polling(f, seq, calls)
        self._restore_cycles(f, seq)
        f.done()

    def _restore_cycles(self, f: Fields, seq: int) -> None:
        """A plain ledger holds no cycle facts: a snapshot that has them needs ``cycle_repeat`` on."""

    def _restore_polling(self, f: Fields, seq: int, calls: int) -> None:
        path = f.at("polled")
        self._polled = {}
        for key, value in f.mapping("polled", MAX_POLLED, default={}).items():
            check = _check_number(f"{path}.{key}", key, 1, seq)
            if not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a [digest, call number] pair", value)
            self._polled[check] = (st.digest(f"{path}.{key}[0]", value[0], DIGEST_SIZE),
                                   st.integer(f"{path}.{key}[1]", value[1], 1, calls))
        self._polled = dict(sorted(self._polled.items()))
        self._results = _result_digests(f, "results", self._next + 1, seq)
        self._baseline = f.digest("baseline", DIGEST_SIZE, optional=True) if "baseline" in f else None
        path = f.at("restarts")
        self._restarts = {st.text(f"{path}.{tool}", tool, nonempty=True): st.integer(f"{path}.{tool}", n, 1)
                          for tool, n in f.mapping("restarts", MAX_RESTART_TOOLS + 1, default={}).items()}

    def _restore_streak(self, f: Fields, seq: int, calls: int) -> None:
        self._last_key = f.digest("last_key", DIGEST_SIZE, optional=True)
        self._last_tool = f.text("last_tool", optional=True, nonempty=True)
        streak = self._streak = f.integer("streak", 0, calls)
        if (self._last_key is None) != (streak == 0):
            st.refuse(f.at("streak"), "0 exactly when last_key is null (no current streak)", streak)
        if (self._last_key is None) != (self._last_tool is None):
            st.refuse(f.at("last_tool"), "null exactly when last_key is null", self._last_tool)
        self._next = f.integer("next", 1, seq + 1)
        self._failing = f.integer("failing", 0, streak)
        self._settled = f.integer("settled", 0, streak)
        self._stop_peak = f.integer("stop_peak", 0, streak)
        self._early = _early_outcomes(f, "early", self._next + 1, seq)
        fired = f.items("fired", MAX_FIRED)
        self._fired = {_fired_pair(f"{f.at('fired')}[{i}]", pair) for i, pair in enumerate(fired)}
        records = f.items("ended", MAX_ENDED_STREAKS, default=[])
        self._ended = []
        low = 1
        for i, data in enumerate(records):
            ended = EndedStreak.from_state(Fields(data, f"{f.at('ended')}[{i}]"), low, seq - 1, calls)
            self._ended.append(ended)
            low = ended.last + 1

    def _restore_outcomes(self, f: Fields) -> None:
        """The outcome totals: counters, which nothing else is derived from."""
        counts = {o.value: f.integer(o.value, default=0) for o in Outcome}
        f.done()
        self._ok = counts.pop(_OK.value)
        self._outcomes = counts

    # -- building verdicts ---------------------------------------------------------------------

    def detect(
        self,
        threshold: Threshold | str,
        action: Action,
        level: Level,
        limit: int,
        *,
        call: ToolCall | None = None,
        message: str = "",
        streak: EndedStreak | None = None,
    ) -> Verdict:
        """A verdict whose ``LoopDetectedEvent`` records this ledger's counts now (the streak's:
        ``streak``'s, an ended streak's, when given)."""
        digest = cached_digest(call) if call is not None else None
        length, failing = (self._streak, self._failing) if streak is None else (streak.length, streak.failing)
        event = LoopDetectedEvent(
            threshold=threshold,
            action=action,
            level=level,
            limit=int(limit),
            tool_calls=self._tool_calls,
            cycles=self._cycles,
            max_key_repeat=self._max_repeat,
            streak_length=length,
            failing_streak_length=failing,
            soft_cap=self.soft_cap,
            hard_cap=self.hard_cap,
            tool_name=call.name if call is not None else None,
            key_digest=digest.hex() if digest is not None else None,
            promptable=self.promptable,
            turn_id=self.turn_id,
            conversation_id=self.conversation_id,
            agent_name=self.agent_name,
            event_id=new_event_id(),
            cap_mode=self.cap_mode,
            message=message,
        )
        return Verdict(action, threshold, message, event)

    def settle_polled(self) -> None:
        """Calls of stateful tools still without an outcome (halted at their check, or never
        reported) count their repeat now, without a result, as they would have at their check had
        the tool not been listed (before a summary)."""
        while self._polled:
            self._count_polled(next(iter(self._polled)), None)

    def summary(self, *, reason: str, halt: Verdict | None, stuck: bool) -> TurnSummary:
        """How the turn ended (call ``settle_polled`` first). ``stuck``: the cap's answer
        (``turnguard.policies.cap.summary_stuck``), a decision the ledger does not make."""
        return TurnSummary(
            turn_id=self.turn_id,
            conversation_id=self.conversation_id,
            agent_name=self.agent_name,
            promptable=self.promptable,
            reason=reason,
            tool_calls=self._tool_calls,
            cycles=self._cycles,
            max_key_repeat=self._max_repeat,
            first_stuck_call=self._first_stuck,
            distinct_keys=len(self._counts),
            keys_overflowed=self._overflowed,
            halted=halt is not None,
            threshold=halt.threshold if halt is not None else None,
            cap_mode=self.cap_mode,
            stuck=stuck,
            detections=self._detections,
            duration_s=time.monotonic() - self.started_at,
            cohort=self._cohort,
            resumed_from=self._resumed_from,
            fresh_state=self._fresh_state,
            result_restarts=tuple(sorted(self._restarts.items())),
        )


_STATE_COUNTS = (
    "seq", "tool_calls", "cycles", "cycle_start", "detections", "retries", "max_repeat", "first_stuck",
    "max_stale", "streak", "next", "failing", "settled", "stop_peak",
)
_STATE_FLAGS = ("overflowed", "looped")
_STATE_DIGESTS = ("last_key", "news")
MAX_POLLED = 2 * 4096 + 1024
"""Stateful tools' calls a ledger keeps waiting for their outcome to count their repeat (the calls a
live turn waits for, ``guard.MAX_AWAITING``); past it the oldest counts without a result."""
MAX_FIRED = 64
"""Detections one streak can note (a threshold and a level each) that a snapshot may hold."""
MAX_ENDED_STREAKS = 1024
"""Ended streaks still settling that a ledger keeps (``EndedStreak``): past it, the oldest is given
up (its late outcomes then change no streak). A batch holds more only when it alternates keys, whose
streaks of one or two calls cannot reach the stop level anyway."""



@dataclass(frozen=True, slots=True)
class Settled:
    """The scalar facts ``_count_settled`` leaves, named as the ``Ledger`` fields they go to
    (without the underscore)."""

    tool_calls: int
    cycles: int
    cycle_start: int
    max_repeat: int
    first_stuck: int
    overflowed: bool
    last_key: bytes | None
    last_tool: str | None
    streak: int
    failing: int
    settled: int
    stop_peak: int
    ok: int


def _count_settled(ledger: Ledger, digests: Sequence[bytes], tools: Sequence[str], outcomes: Sequence[Outcome],
                   cycles: Sequence[int]) -> Settled:
    """``Ledger.count_settled``'s pass: ``begin_cycle`` and ``count_call`` (the ``repeat`` signal, no
    tool named) inlined, each outcome settled by ``count_outcome``; the scalar facts after it."""
    calls, cycle, cycle_start = ledger._tool_calls, ledger._cycles, ledger._cycle_start
    counts, max_keys, overflowed = ledger._counts, ledger._max_keys, ledger._overflowed
    max_repeat, first_stuck, stuck_at = ledger._max_repeat, ledger._first_stuck, ledger._stuck_at
    last_key, last_tool, streak = ledger._last_key, ledger._last_tool, ledger._streak
    failing, settled, stop_peak, ok = ledger._failing, ledger._settled, ledger._stop_peak, ledger._ok
    stop_any, other, fired, get, settle = ledger._stop_any, ledger._outcomes, ledger._fired, counts.get, count_outcome
    for digest, tool, outcome, begun in zip(digests, tools, outcomes, cycles, strict=True):
        if begun:
            cycle += begun
            cycle_start = calls
        calls += 1
        seen = get(digest)
        if seen is not None:
            seen += 1
            counts[digest] = seen
        elif len(counts) < max_keys:
            counts[digest] = seen = 1
        else:
            overflowed, seen = True, 1
        if seen > max_repeat:
            max_repeat = seen
            if seen == stuck_at and not first_stuck:
                first_stuck = calls
        if digest == last_key:
            streak += 1
        else:
            last_key, last_tool, streak = digest, tool, 1
            if stop_peak:
                failing = settled = stop_peak = 0
            if fired:
                fired.clear()
        if outcome is _OK:
            ok += 1
        else:
            other[outcome._value_] += 1
        failing, settled, stop_peak = settle(outcome, failing, settled, stop_peak, stop_any)
    return Settled(calls, cycle, cycle_start, max_repeat, first_stuck, overflowed, last_key, last_tool, streak,
                   failing, settled, stop_peak, ok)


def _hex(digest: bytes | None) -> str | None:
    return digest.hex() if digest is not None else None


def _early_state(early: dict[int, Outcome]) -> dict[str, str]:
    return {str(seq): outcome.value for seq, outcome in early.items()}


def _key_size(text: Any) -> int:
    """The size of a counted key written as hex: a call's digest, or a (call, result) pair's two."""
    return 2 * DIGEST_SIZE if isinstance(text, str) and len(text) == 4 * DIGEST_SIZE else DIGEST_SIZE


def _digest_counts(f: Fields, name: str, limit: int, most: int, *, pairs: bool = False) -> dict[bytes, int]:
    """A table of digests (hex) to counts from 1 to ``most``, at most ``limit`` of them (``pairs``:
    a key may be a (call, result) pair's two digests)."""
    path = f.at(name)
    return {st.digest(f"{path}.{key}", key, _key_size(key) if pairs else DIGEST_SIZE):
            st.integer(f"{path}.{key}", n, 1, most) for key, n in f.mapping(name, limit).items()}


def _check_number(path: str, key: str, low: int, high: int) -> int:
    seq = int(key) if key.isdigit() and key == str(int(key)) else -1
    if not low <= seq <= high:
        st.refuse(path, f"keyed by a check number from {low} to {high}", key)
    return seq


def _results_state(results: dict[int, bytes]) -> dict[str, str]:
    return {str(seq): digest.hex() for seq, digest in results.items()}


def _result_digests(f: Fields, name: str, low: int, high: int) -> dict[int, bytes]:
    """Result digests waiting to settle, by check number from ``low`` to ``high`` (absent: none)."""
    path = f.at(name)
    return {_check_number(f"{path}.{key}", key, low, high): st.digest(f"{path}.{key}", value, DIGEST_SIZE)
            for key, value in f.mapping(name, max(high - low + 1, 0), default={}).items()}


def _early_outcomes(f: Fields, name: str, low: int, high: int) -> dict[int, Outcome]:
    """Outcomes waiting for an earlier call's, by check number (written as decimal text) from
    ``low`` to ``high``."""
    path = f.at(name)
    early = {}
    for key, value in f.mapping(name, max(high - low + 1, 0)).items():
        seq = int(key) if key.isdigit() and key == str(int(key)) else -1
        if not low <= seq <= high:
            st.refuse(f"{path}.{key}", f"keyed by a check number from {low} to {high}", key)
        early[seq] = Outcome(st.choice(f"{path}.{key}", value, _OUTCOME_VALUES))
    return early


_OUTCOME_VALUES = tuple(o.value for o in Outcome)


def _fired_pair(path: str, pair: Any) -> tuple[str, str]:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        st.refuse(path, "a [threshold, level] pair", pair)
    return st.text(path, pair[0], nonempty=True), st.choice(path, pair[1], tuple(level.value for level in Level))


class EndedStreak:
    """A streak another key ended while calls of it still waited for their outcome (identical
    calls of one model response, then a different one): its checks ``next`` to ``last`` settle
    here, in check order, as the ledger's current streak settles its own, so its stop level fires
    at the outcome that completes ``streak_stop_at`` failures, as had the calls run one at a time.
    A stateful tool's streak restarts here too at a changed result (``results``, ``baseline``)."""

    __slots__ = ("baseline", "digest", "early", "failing", "last", "length", "next", "peak", "restarts", "results",
                 "settled", "stopped", "tool")

    def __init__(self, next: int, last: int, length: int, failing: int, settled: int, peak: int,
                 early: dict[int, Outcome], digest: bytes | None, tool: str | None, baseline: bytes | None = None,
                 results: dict[int, bytes] | None = None, stopped: bool = False) -> None:
        self.next, self.last, self.length = next, last, length
        self.failing, self.settled, self.peak = failing, settled, peak
        self.early, self.digest, self.tool = early, digest, tool
        self.baseline = baseline
        self.results: dict[int, bytes] = {} if results is None else results
        """Result digests of its calls not settled yet, by check."""
        self.stopped = stopped
        """Its stop level fired (since its latest restart)."""
        self.restarts = 0

    def settle(self, seq: int, outcome: Outcome, stop_any: bool, stop_at: int) -> bool:
        """Settle check ``seq``'s outcome; true when the stop count reached ``stop_at`` now."""
        if seq != self.next:
            self.early[seq] = outcome
            return False
        reached = self._settle_next(outcome, stop_any, stop_at)
        early = self.early
        while self.next in early:
            reached = self._settle_next(early.pop(self.next), stop_any, stop_at) or reached
        return reached

    def _settle_next(self, outcome: Outcome, stop_any: bool, stop_at: int) -> bool:
        result = self.results.pop(self.next, None) if self.results else None
        if result is not None:
            if self.baseline is not None and result != self.baseline:  # progress: restart here
                self.length = self.last - self.next + 1
                self.failing = self.settled = self.peak = 0
                self.stopped = False
                self.restarts += 1
            self.baseline = result
        self._count_next(outcome, stop_any)
        if self.stopped or not stop_at or self.peak < stop_at:
            return False
        self.stopped = True
        return True

    def _count_next(self, outcome: Outcome, stop_any: bool) -> None:
        self.next += 1
        self.failing, self.settled, self.peak = count_outcome(outcome, self.failing, self.settled, self.peak, stop_any)

    def copy(self) -> EndedStreak:
        twin = EndedStreak(self.next, self.last, self.length, self.failing, self.settled, self.peak,
                           dict(self.early), self.digest, self.tool, self.baseline, dict(self.results), self.stopped)
        twin.restarts = self.restarts
        return twin

    def state(self) -> dict[str, Any]:
        data = {"next": self.next, "last": self.last, "length": self.length, "failing": self.failing,
                "settled": self.settled, "peak": self.peak, "early": _early_state(self.early),
                "digest": _hex(self.digest), "tool": self.tool}
        if self.baseline is not None:
            data["baseline"] = self.baseline.hex()
        if self.results:
            data["results"] = _results_state(self.results)
        if self.stopped:
            data["stopped"] = True
        return data

    @classmethod
    def from_state(cls, f: Fields, low: int, high: int, calls: int) -> EndedStreak:
        """Read back from ``state()``: checks from ``low`` to ``high``, at most ``calls`` long."""
        first = f.integer("next", low, high)
        last = f.integer("last", first, high)
        length = f.integer("length", 1, calls)
        ended = cls(first, last, length, f.integer("failing", 0, length), f.integer("settled", 0, length),
                    f.integer("peak", 0, length), _early_outcomes(f, "early", first + 1, last),
                    f.digest("digest", DIGEST_SIZE), f.text("tool", nonempty=True),
                    f.digest("baseline", DIGEST_SIZE, optional=True) if "baseline" in f else None,
                    _result_digests(f, "results", first, last), f.boolean("stopped", default=False))
        f.done()
        return ended


VIEW_FACTS = (
    "config", "turn_id", "cohort", "conversation_id", "agent_name", "resumed_from", "fresh_state", "promptable",
    "cap_mode", "soft_cap", "hard_cap", "opened_ns",
    "started_at", "tool_calls", "checks", "cycles", "calls_this_cycle", "cap_quiet_until", "max_key_repeat",
    "max_stale_repeat", "distinct_keys", "keys_overflowed", "streak_length", "failing_streak_length",
    "settled_streak_length", "stop_count", "awaiting_in_streak", "streak_digest", "last_tool_name",
    "first_stuck_call", "detections", "retries", "stuck_count", "result_restarts", "stuck_raised",
)
"""The ledger's properties a ``LedgerView`` shows."""


class LedgerView:
    """What hooks receive as ``turn``: the ledger's facts, read-only.

    Facts only (``VIEW_FACTS`` and the query methods ``outcomes``, ``repeats_of``,
    ``fired_in_streak``, ``provisional_stop_count``, ``polls``, ``restarts_by_tool``), plus
    ``detect`` to build a verdict. No mutator, no underscored field, no attribute can be set, and
    the view cannot be rebound: a plugin that uses what it is given cannot reset the counts the caps
    read, by mistake or by design. It is not a sandbox: code in the same process can reach the
    ledger behind a view (``gc.get_referents(view)`` returns it, as the interpreter lets any code
    reach any object) and change it. Run only plugins you trust as much as the host's own code; the
    view makes the read-only contract explicit and an accidental write impossible.

    A ``Turn`` makes one view and passes it to every hook: hashable by identity, plugins key
    per-turn state by it. The view holds the ledger; the ledger does not hold the view.
    """

    __slots__ = ("__weakref__", "_ledger")

    def __init__(self, ledger: Ledger) -> None:
        try:
            _ledger_of(self)
        except AttributeError:
            _bind(self, ledger)
        else:
            raise TypeError("a LedgerView is bound to its ledger once")

    # -- the facts (``VIEW_FACTS``): the ledger's, read through -------------------------------

    @property
    def config(self) -> GuardConfig:
        """The configuration the turn is guarded by."""
        return _ledger_of(self).config

    @property
    def turn_id(self) -> str:
        """The turn's id."""
        return _ledger_of(self).turn_id

    @property
    def cohort(self) -> str:
        """``live``, or ``probe`` when the probe configuration guards the turn (``tg.Probe``)."""
        return _ledger_of(self).cohort

    @property
    def conversation_id(self) -> str | None:
        """The host's conversation id, if it gave one."""
        return _ledger_of(self).conversation_id

    @property
    def agent_name(self) -> str | None:
        """The host's agent name, if it gave one."""
        return _ledger_of(self).agent_name

    @property
    def resumed_from(self) -> str | None:
        """The turn id of the snapshot this turn was forked from (resumed twice in one guard), or ``None``."""
        return _ledger_of(self).resumed_from

    @property
    def fresh_state(self) -> tuple[str, ...]:
        """The plugins whose per-turn state started afresh at a resume (the snapshot had none for them)."""
        return _ledger_of(self).fresh_state

    @property
    def promptable(self) -> bool:
        """Whether a person is watching (attended): detections reach the user rather than halt."""
        return _ledger_of(self).promptable

    @property
    def cap_mode(self) -> str:
        """``explicit``, ``adaptive`` or ``disabled``."""
        return _ledger_of(self).cap_mode

    @property
    def soft_cap(self) -> int | None:
        """S under the adaptive cap, else ``None``."""
        return _ledger_of(self).soft_cap

    @property
    def hard_cap(self) -> int | None:
        """N (explicit) or S * m (adaptive): past it the turn halts whatever it does."""
        return _ledger_of(self).hard_cap

    @property
    def started_at(self) -> float:
        """When the turn opened (``time.monotonic()``)."""
        return _ledger_of(self).started_at

    @property
    def opened_ns(self) -> int:
        """When the turn opened, Unix ns, read once (a resumed turn's: the resume less the time it ran)."""
        return _ledger_of(self).opened_ns

    @property
    def tool_calls(self) -> int:
        """Calls checked in the turn, including the current one."""
        return _ledger_of(self).tool_calls

    @property
    def checks(self) -> int:
        """Calls checked in the turn, rolled back or not: the sequence number of the latest."""
        return _ledger_of(self).checks

    @property
    def cycles(self) -> int:
        """Model requests begun in the turn (a re-sent request counts again)."""
        return _ledger_of(self).cycles

    @property
    def calls_this_cycle(self) -> int:
        """Calls checked since the current model request began."""
        return _ledger_of(self).calls_this_cycle

    @property
    def cap_quiet_until(self) -> int | float:
        """The cap cannot fire while ``tool_calls`` is at most this (N, S, or infinity if off)."""
        return _ledger_of(self).cap_quiet_until

    @property
    def max_key_repeat(self) -> int:
        """The largest number of times any one key has been seen in the turn."""
        return _ledger_of(self).max_key_repeat

    @property
    def max_stale_repeat(self) -> int:
        """The ``stale_repeat`` signal's count (0 unless that signal is configured): the largest
        number of times one key was seen with no never-seen-before key in between, so a re-run
        after an edit (a new key) starts afresh while a loop of 1 to k calls keeps counting."""
        return _ledger_of(self).max_stale_repeat

    @property
    def distinct_keys(self) -> int:
        """Distinct call keys counted in the turn (at most ``max_tracked_keys``)."""
        return _ledger_of(self).distinct_keys

    @property
    def keys_overflowed(self) -> bool:
        """True once a key went uncounted because ``max_tracked_keys`` was reached."""
        return _ledger_of(self).keys_overflowed

    @property
    def streak_length(self) -> int:
        """Consecutive checked calls with the current key."""
        return _ledger_of(self).streak_length

    @property
    def failing_streak_length(self) -> int:
        """Consecutive identical calls of the current streak whose outcome was ``ERROR``."""
        return _ledger_of(self).failing_streak_length

    @property
    def settled_streak_length(self) -> int:
        """Consecutive identical calls of the current streak whose outcome was anything but
        ``DENIED`` (kept when ``streak_stop_on="any"``; 0 otherwise)."""
        return _ledger_of(self).settled_streak_length

    @property
    def stop_count(self) -> int:
        """The stop level's count for the current streak (``failing_streak_length``, or with
        ``streak_stop_on="any"`` ``settled_streak_length``), the largest it has been in the
        streak: it reaches ``streak_stop_at`` once per streak."""
        return _ledger_of(self).stop_count

    @property
    def awaiting_in_streak(self) -> int:
        """Calls of the current streak, before the latest, whose outcome has not come yet (0 in
        a sequential run: each outcome came before the next call)."""
        return _ledger_of(self).awaiting_in_streak

    @property
    def streak_digest(self) -> bytes | None:
        """The current streak's call key digest (``None`` before the first call)."""
        return _ledger_of(self).streak_digest

    @property
    def last_tool_name(self) -> str | None:
        """The tool name of the latest checked call (``None`` before the first call)."""
        return _ledger_of(self).last_tool_name

    @property
    def first_stuck_call(self) -> int:
        """The call at which the configured stuck signal first reached ``stuck_repeat_threshold``
        (0: never)."""
        return _ledger_of(self).first_stuck_call

    @property
    def detections(self) -> int:
        """Detections noted in the turn."""
        return _ledger_of(self).detections

    @property
    def retries(self) -> int:
        """``retry()`` calls in the turn."""
        return _ledger_of(self).retries

    @property
    def stuck_count(self) -> int:
        """The configured stuck signal's count (``stuck_signal``): ``max_stale_repeat`` under
        ``stale_repeat``, else ``max_key_repeat``. Whether it makes the turn stuck is the cap's
        rule (``turnguard.policies.cap.stuck``)."""
        return _ledger_of(self).stuck_count

    @property
    def result_restarts(self) -> int:
        """Streak restarts by a changed result (stateful tools) in the turn."""
        return _ledger_of(self).result_restarts

    @property
    def stuck_raised(self) -> bool:
        """Whether the outcome just recorded brought the stuck signal to ``stuck_repeat_threshold``
        (a stateful tool's call, whose repeat is counted with its result)."""
        return _ledger_of(self).stuck_raised

    # -- queries -------------------------------------------------------------------------------

    def polls(self, tool_name: str) -> bool:
        """Whether ``tool_name`` is one of the configuration's ``stateful_tools``."""
        return _ledger_of(self).polls(tool_name)

    def restarts_by_tool(self) -> dict[str, int]:
        """``result_restarts`` by tool name."""
        return _ledger_of(self).restarts_by_tool()

    def outcomes(self, outcome: Outcome) -> int:
        """How many outcomes of this kind were recorded."""
        return _ledger_of(self).outcomes(outcome)

    def repeats_of(self, digest: bytes) -> int:
        """How many times the key with this digest has been counted in the turn."""
        return _ledger_of(self).repeats_of(digest)

    def fired_in_streak(self, threshold: Threshold | str, level: Level | str) -> bool:
        """Whether a detection of ``threshold`` at ``level`` was noted in the current streak."""
        return _ledger_of(self).fired_in_streak(threshold, level)

    def provisional_stop_count(self) -> int:
        """See ``Ledger.provisional_stop_count``."""
        return _ledger_of(self).provisional_stop_count()

    @functools.wraps(Ledger.detect)
    def detect(
        self,
        threshold: Threshold | str,
        action: Action,
        level: Level,
        limit: int,
        *,
        call: ToolCall | None = None,
        message: str = "",
        streak: EndedStreak | None = None,
    ) -> Verdict:
        return _ledger_of(self).detect(threshold, action, level, limit, call=call, message=message, streak=streak)

    def __repr__(self) -> str:
        ledger = _ledger_of(self)
        return f"<turnguard turn {ledger.turn_id} (read-only): {ledger.tool_calls} calls, {ledger.cycles} cycles>"


_slot = LedgerView.__dict__["_ledger"]
_bind: Callable[[LedgerView, Ledger], None] = _slot.__set__
_ledger_of: Callable[[LedgerView], Ledger] = _slot.__get__
delattr(LedgerView, "_ledger")  # the slot's descriptor, kept above: no attribute of a view reaches the ledger


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

    __slots__ = ("_levels", "_stop", "_warn", "due", "early", "filled", "keys", "next", "period", "pos", "ring", "runs")

    def __init__(self, period: int, warn_at: int, stop_at: int, first: int) -> None:
        self.period = period
        self.warn, self.stop = warn_at - 1, stop_at - 1
        """The levels as matches per call of the period (-1: off)."""
        self.ring: list[bytes] = [b""] * period
        self.pos = self.filled = 0
        self.runs = [0] * (period + 1)
        self.next = first
        self.keys: dict[int, tuple[bytes | None, bool]] = {}
        """Checked calls waiting to settle: (digest, stateful); a ``None`` digest takes no part."""
        self.early: dict[int, tuple[Outcome, bytes | None]] = {}
        self.due: tuple[Level, int, int] | None = None

    @property
    def warn(self) -> int:
        return self._warn

    @warn.setter
    def warn(self, value: int) -> None:
        self._warn = value
        self._levels = self._level_runs()

    @property
    def stop(self) -> int:
        return self._stop

    @stop.setter
    def stop(self, value: int) -> None:
        self._stop = value
        self._levels = self._level_runs()

    def _level_runs(self) -> tuple[frozenset[int], ...]:
        """By period ``k``: the run lengths at which a level is reached (``warn * k``, ``stop * k``)."""
        warn, stop = getattr(self, "_warn", -1), getattr(self, "_stop", -1)
        return tuple(frozenset(n * k for n in (warn, stop) if n > 0) for k in range(self.period + 1))

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
                "waiting": {str(seq): [_hex(d), s] for seq, (d, s) in self.keys.items()},
                "early": {str(seq): [o.value, _hex(r)] for seq, (o, r) in self.early.items()}}

    def restore(self, f: Fields, seq: int) -> None:
        """Read back from ``state()`` (each field checked), for checks up to ``seq``."""
        self.next = f.integer("next", 1, seq + 1)
        ring = f.items("ring", self.period)
        path = f.at("ring")
        keys = [st.digest(f"{path}[{i}]", key, _key_size(key)) for i, key in enumerate(ring)]
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
            check = _check_number(f"{path}.{key}", key, self.next, seq)
            if not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a [digest or null, stateful] pair", value)
            self.keys[check] = (st.digest(f"{path}.{key}[0]", value[0], DIGEST_SIZE, optional=True),
                                st.boolean(f"{path}.{key}[1]", value[1]))
        self.keys = dict(sorted(self.keys.items()))
        path = f.at("early")
        self.early = {}
        for key, value in f.mapping("early", MAX_POLLED).items():
            check = _check_number(f"{path}.{key}", key, self.next + 1, seq)
            if check not in self.keys or not isinstance(value, list) or len(value) != 2:
                st.refuse(f"{path}.{key}", "a waiting check's [outcome, result digest or null] pair", value)
            self.early[check] = (Outcome(st.choice(f"{path}.{key}[0]", value[0], _OUTCOME_VALUES)),
                                 st.digest(f"{path}.{key}[1]", value[1], DIGEST_SIZE, optional=True))
        f.done()


class CyclingLedger(Ledger):
    """The ledger of a turn under ``cycle_repeat`` (``Ledger(config)`` makes one when the policy is
    on): the plain ledger's facts and ``CycleRuns``, fed at each check and outcome."""

    __slots__ = ()
    _cyc: CycleRuns

    def __init__(self, config: GuardConfig, **identity: Any) -> None:
        super().__init__(config, **identity)
        self._cyc = CycleRuns(config.cycle_repeat_max_period, config.cycle_repeat_warn_at,
                              config.cycle_repeat_stop_at, self._seq + 1)

    def count_call(self, digest: bytes, tool_name: str) -> int:
        seq = Ledger.count_call(self, digest, tool_name)
        keys = self._cyc.keys
        if not keys:
            self._cyc.next = seq  # (CycleRuns.checked, inlined: this is every call's path)
        keys[seq] = (None if tool_name in self._exempt else digest, False)
        return seq

    def _count_polled_call(self, digest: bytes, tool_name: str) -> int:
        seq = super()._count_polled_call(digest, tool_name)
        self._cyc.checked(seq, None if tool_name in self._exempt else digest, True)
        return seq

    def record_polled(self, seq: int, outcome: Outcome, result: bytes | None) -> bool | None:
        due = self._cyc.settle(seq, outcome, result)
        return super().record_polled(seq, outcome, result) or due

    def record_outcome(self, seq: int, outcome: Outcome) -> bool | None:
        cyc = self._cyc
        # (a stateful call's outcome is settled by record_polled, with its result, before it comes here)
        if seq == cyc.next and not cyc.early and seq in cyc.keys:  # in check order: settle, inlined
            cyc.due = None
            cyc._count(seq, outcome, None)
            due = cyc.due is not None
        else:
            due = cyc.settle(seq, outcome) if seq in cyc.keys and seq not in cyc.early else False
        return Ledger.record_outcome(self, seq, outcome) or due

    def abandon(self, seq: int) -> None:
        self._cyc.settle(seq, _ABANDONED)
        super().abandon(seq)

    def reset_streak(self, answered: bytes | None = None) -> None:
        super().reset_streak(answered)
        self._cyc.reset()

    def rollback_cycle(self) -> None:
        super().rollback_cycle()
        cyc = self._cyc
        cyc.keys.clear()
        cyc.early.clear()
        cyc.next = self._seq + 1

    def fork(self, config: GuardConfig, *, promptable: bool | None = None) -> Ledger:
        """``Ledger.fork``, the cycle runs carried (their levels those of ``config``); a ``ValueError``
        where ``config`` looks for other periods and calls were seen."""
        cyc = self._cyc
        on = config.cycle_repeat_warn_at or config.cycle_repeat_stop_at
        if on and config.cycle_repeat_max_period != cyc.period and (cyc.filled or cyc.keys or cyc.early):
            raise ValueError("fork(): the cycle runs so far depend on cycle_repeat_max_period")
        twin = super().fork(config, promptable=promptable)
        if twin._cyc is not None:
            if config.cycle_repeat_max_period == cyc.period:
                twin._cyc = cyc.copy()
                twin._cyc.warn, twin._cyc.stop = config.cycle_repeat_warn_at - 1, config.cycle_repeat_stop_at - 1
            else:
                twin._cyc.next = cyc.next  # (no call seen: nothing else to carry)
        return twin

    def state(self) -> dict[str, Any]:
        facts = super().state()
        facts["cycle_runs"] = self._cyc.state()
        return facts

    def _restore_cycles(self, f: Fields, seq: int) -> None:
        if "cycle_runs" in f:
            self._cyc.restore(Fields(f.get("cycle_runs"), f.at("cycle_runs")), seq)
        else:
            self._cyc.next = seq + 1
