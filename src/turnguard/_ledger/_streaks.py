"""Identical-call streaks: the current streak's length, its failing and settled counts in
check order (``count_outcome``, the one settling rule), the streaks another key ended while their
calls still waited (``EndedStreak``), and a stateful tool's streak restarting at a changed result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turnguard._keys import DIGEST_SIZE
from turnguard._ledger._calls import CallCounts
from turnguard._ledger._state import early_outcomes, early_state, fact, hex_or_none, result_digests, results_state
from turnguard._model import ALL_TOOLS, MAX_RESTART_TOOLS, OTHER_TOOLS, Level, LoopDetectedEvent, Outcome, Threshold
from turnguard._state import Fields

if TYPE_CHECKING:
    from turnguard._config import GuardConfig
    from turnguard._ledger._cycles import CycleRuns


def count_outcome(outcome: Outcome, failing: int, settled: int, peak: int, stop_any: bool) -> tuple[int, int, int]:
    """The streak's settling rule, in one place: how the next call of a streak, in check order,
    moves the stop level's counts (``failing``, ``settled`` and the stop count's ``peak``).
    ``ERROR`` extends the failing count, ``DENIED`` leaves it as it is, ``OK``/``UNKNOWN`` reset
    it; with ``streak_stop_on="any"`` (``stop_any``) the settled count counts every outcome but
    ``DENIED`` and is the stop count. Every settling goes through here: the ledger's current
    streak (``Streaks._settle``), an ended one (``EndedStreak``), a replay's prefix
    (``Ledger.count_settled``) and calibrate's turn facts (``equivalence.turn_facts``). The hot
    path keeps inlined copies, for ``OK`` in ``Streaks.record_outcome`` and for ``ERROR`` (under
    ``streak_stop_on="error"``) in ``Streaks._settle`` (``tests/test_streak_settling.py`` holds
    them equal)."""
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
"""How a call whose outcome will never come (``abandon``) settles: neither a failure nor a reset."""


MAX_FIRED = 64
"""Detections one streak can note (a threshold and a level each) that a snapshot may hold."""


MAX_SKIPS = 64
"""Runs of early denials ``_worst_stop`` remembers before it forgets them all and finds them again."""


MAX_ENDED_STREAKS = 1024
"""Ended streaks still settling that a ledger keeps (``EndedStreak``): past it, the oldest is given
up (its late outcomes then change no streak). A batch holds more only when it alternates keys, whose
streaks of one or two calls cannot reach the stop level anyway."""


class Streaks(CallCounts):
    """The streak facts of a turn, over its counts (``CallCounts``): ``count_call`` counts a
    checked call and joins it to its streak, ``record_outcome`` settles its outcome there."""

    __slots__ = (
        "_all_stateful",
        "_baseline",
        "_cyc",
        "_detections",
        "_early",
        "_ended",
        "_failing",
        "_fired",
        "_last_key",
        "_last_tool",
        "_late",
        "_longest",
        "_restarts",
        "_results",
        "_settled",
        "_skips",
        "_stateful",
        "_stop_any",
        "_stop_knew",
        "checks",
        "next_to_settle",
        "stop_at",
        "stop_count",
        "streak_length",
        "warn_at",
    )

    def __init__(self, config: GuardConfig, checks: int = 0) -> None:
        super().__init__(config)
        self.checks = checks  # checks counted elsewhere before (a shadow started afresh in a resumed turn)
        self._cyc: CycleRuns | None = None
        """The cycle runs (``ledger._cycles``), where ``cycle_repeat`` is on: they ride on this
        class's count and outcome paths, which are every call's, so that when off they cost one test."""
        self.next_to_settle = checks + 1
        self._last_key: bytes | None = None
        self._last_tool: str | None = None
        self.streak_length = 0
        self._failing = 0
        self._settled = 0
        self.stop_count = 0
        self._longest = 0
        """The largest stop count a streak of the turn reached before it ended (``longest_stop_count``)."""
        self._early: dict[int, Outcome] = {}
        self._skips: dict[int, int] = {}
        """Runs of the streak's waiting calls denied early, found by ``_worst_stop``: the highest
        check of each run to its lowest, so that the next count jumps over them."""
        self._fired: set[tuple[str, str]] = set()
        self._stop_knew: frozenset[int] | None = None
        """The waiting calls whose results the streak's stop counted with when it fired (at a
        check; none at an outcome, which counts only settled calls); ``None``: not known
        (``provisional_stop_fired``)."""
        self._ended: list[EndedStreak] = []  # streaks ended with calls still waiting (EndedStreak)
        self._late: EndedStreak | None = None  # ended_stop
        self._stop_any = config.streak_stop_on == "any"
        self.warn_at = config.streak_warn_at
        self.stop_at = config.streak_stop_at
        self._results: dict[int, bytes] = {}
        """Result digests of the current streak's calls whose outcome waits for an earlier one's."""
        self._baseline: bytes | None = None
        """The latest result settled in the current streak (a stateful tool's)."""
        self._restarts: dict[str, int] = {}
        self._stateful = frozenset(config.stateful_tools)
        self._all_stateful = ALL_TOOLS in self._stateful
        self._detections = 0

    failing_streak_length: int = fact(
        "_failing", "Consecutive identical calls of the current streak whose outcome was ``ERROR``."
    )

    settled_streak_length: int = fact(
        "_settled",
        """Consecutive identical calls of the current streak whose outcome was anything but
        ``DENIED`` (kept when ``streak_stop_on="any"``; 0 otherwise).""",
    )

    @property
    def awaiting_in_streak(self) -> int:
        """Calls of the current streak, before the latest, whose outcome has not come yet (0 in
        a sequential run: each outcome came before the next call)."""
        if self._last_key is None:
            return 0
        early = self._early
        return sum(1 for seq in range(self.next_to_settle, self.checks) if seq not in early)

    def provisional_stop_count(self) -> int:
        """The stop level's count for the current streak if every earlier call of it still
        waiting for its outcome failed (counted up to ``streak_stop_at``): identical calls of one
        model response are all checked before any outcome, and past this many, had they run one
        at a time, the stop level would have fired before them."""
        return self._worst_stop(self.checks - 1)

    def fired_in_streak(self, threshold: Threshold | str, level: Level | str) -> bool:
        """Whether a detection of ``threshold`` at ``level`` was noted in the current streak."""
        return (str(threshold), str(level)) in self._fired

    def provisional_stop_fired(self) -> bool:
        """Whether the stop level fired in the part of the current streak that
        ``provisional_stop_count`` counts: a call whose result changed restarts the streak there
        even while it waits for an earlier call's outcome, and a stop that did not count with that
        result was the earlier part's, as it is once the restart settles (so one lost outcome does
        not keep the stop from firing again)."""
        if _STREAK_STOP not in self._fired:
            return False
        knew = self._stop_knew
        return knew is None or not any(seq not in knew and self._restarts_at(seq) for seq in self._results)

    @property
    def longest_stop_count(self) -> int:
        """The largest stop-level count any streak of the turn reached: its longest failing
        identical-call streak (under ``streak_stop_on="any"``, its longest settled one), the value
        a streak stop must not exceed to halt it (``TurnSummary.max_failing_streak``)."""
        return self._longest if self._longest > self.stop_count else self.stop_count

    def _keep_longest(self, count: int) -> None:
        if count > self._longest:
            self._longest = count

    streak_digest: bytes | None = fact("_last_key")

    last_tool_name: str | None = fact("_last_tool")

    detections: int = fact("_detections")

    def count_call(self, digest: bytes, tool_name: str) -> int:
        """Count a checked call; returns its sequence number (``checks``), which its outcome is
        recorded under (``record_outcome``)."""
        self.tool_calls += 1
        seq = self.checks = self.checks + 1
        counts = self._counts
        seen = counts.get(digest)
        if seen is not None:
            seen += 1
            counts[digest] = seen
        elif len(counts) < self._max_keys:
            counts[digest] = seen = 1
        else:
            self._overflowed = True  # the documented degradation: this key's repeats go uncounted
            seen = 0  # (nor is it news: tracked keys count on as if it were not there)
        if seen > self.max_key_repeat:
            self.max_key_repeat = seen
            if seen == self.stuck_at and not self._first_stuck and not self._stale:
                self._first_stuck = self.tool_calls
        cyc = self._cyc
        if cyc is not None and seq != cyc.next:  # (the common call leaves the cycle runs alone: ``CycleRuns.next``)
            cyc.behind(seq, digest, self._last_key)
        if self._stale:
            if seen == 1:  # news (most calls), inlined: a key first seen now starts the window afresh
                since = self._since_new
                news = self._news  # (a key of since here, so not None: hence the ignores)
                if len(since) == 1 and since.get(news) == 1:  # type: ignore[arg-type]  # its news call alone
                    self._past.append(news)  # type: ignore[arg-type]
                    since.clear()
                else:
                    since = self._shelve()
                since[digest] = 1
                self._looped = False
                self._news = digest
                if not self._max_stale:
                    self._raise_stale(1)
            else:
                self._count_stale(digest, seen)
        if digest == self._last_key:
            self.streak_length += 1
        else:
            if self.next_to_settle != seq:  # calls of the streak this one ends still wait for their outcome
                self._end_streak(seq)
            self._last_key = digest
            self._last_tool = tool_name
            self.streak_length = 1
            self.next_to_settle = seq  # _new_streak, inlined: most calls start a streak
            if self.stop_count:  # the stop count's peak bounds both counts: 0 means nothing to reset
                if self.stop_count > self._longest:
                    self._longest = self.stop_count
                self._failing = 0
                self._settled = 0
                self.stop_count = 0
            if self._early:
                self._early.clear()
            if self._fired:
                self._fired.clear()
        return seq

    def count_key(self, key: bytes, at: int, *, placed: bool = True) -> None:
        """Count one more sighting of ``key`` (a call's digest, or a stateful call's and its
        result's) for call number ``at`` in the counts (``CallCounts``): its repeat, within
        ``max_tracked_keys``, and the stuck signals' counts. ``count_call`` keeps an inlined copy
        for the hot path (here, beside it: ``tests/test_ledger_streaks.py`` holds the two equal).
        ``placed`` false: the ``repeat`` signal's first stuck call is taken in check order
        elsewhere (``PolledCalls._place``)."""
        counts = self._counts
        seen = counts.get(key)
        if seen is not None:
            seen += 1
            counts[key] = seen
        elif len(counts) < self._max_keys:
            counts[key] = seen = 1
        else:
            self._overflowed = True  # the documented degradation: this key's repeats go uncounted
            seen = 0  # (nor is it news: tracked keys count on as if it were not there)
        if seen > self.max_key_repeat:
            self.max_key_repeat = seen
            if seen == self.stuck_at and not self._first_stuck and not self._stale and placed:
                self._first_stuck = at
        if self._stale:
            if seen == 1:  # news: a key first seen now starts the window afresh
                since = self._since_new
                news = self._news  # (a key of since here, so not None: hence the ignores)
                if len(since) == 1 and since.get(news) == 1:  # type: ignore[arg-type]  # its news call alone
                    self._past.append(news)  # type: ignore[arg-type]
                    since.clear()
                else:
                    since = self._shelve()
                since[key] = 1
                self._looped = False
                self._news = key
                if not self._max_stale:
                    self._raise_stale(1, at)
            else:
                self._count_stale(key, seen, at)

    def _join(self, digest: bytes, tool_name: str, seq: int) -> bool:
        """Check ``seq`` joins the current streak, or starts one (true); ``count_call`` keeps an
        inlined copy for the hot path (``tests/test_ledger_streaks.py`` holds the two equal)."""
        if digest == self._last_key:
            self.streak_length += 1
            return False
        if self.next_to_settle != seq:  # calls of the streak this one ends still wait for their outcome
            self._end_streak(seq)
        self._last_key = digest
        self._last_tool = tool_name
        self.streak_length = 1
        self._new_streak(seq)
        return True

    def _end_streak(self, seq: int) -> None:
        """The current streak ends at check ``seq`` with calls still waiting for their outcome:
        kept (``EndedStreak``) so that they settle in it and its stop level can still fire, as
        it would have had the calls run one at a time. Not when its stop level cannot fire (off,
        or fired already, but for a stateful tool's)."""
        results, self._results = self._results, {}
        stopped = _STREAK_STOP in self._fired
        if not self.stop_at or (stopped and not self.polls(self._last_tool)):
            return  # (a stateful tool's may restart at a changed result: its stop can fire again)
        ended = EndedStreak(self.next_to_settle, seq - 1, self.streak_length, self._failing, self._settled,
                            self.stop_count, self._early, self._last_key, self._last_tool, self._baseline, results,
                            stopped)
        if len(self._ended) >= MAX_ENDED_STREAKS:
            del self._ended[0]
        self._ended.append(ended)
        self._early = {}

    def _new_streak(self, first: int) -> None:
        """The current streak starts at check ``first``: earlier calls' outcomes are not its own."""
        self.next_to_settle = first
        self._keep_longest(self.stop_count)
        self._failing = 0
        self._settled = 0
        self.stop_count = 0
        if self._early:
            self._early.clear()
        if self._fired:
            self._fired.clear()

    def polls(self, tool_name: str | None) -> bool:
        """Whether ``tool_name`` is one of the configuration's ``stateful_tools``."""
        return self._all_stateful or tool_name in self._stateful

    @property
    def polls_any(self) -> bool:
        """Whether the configuration names ``stateful_tools`` (if not, ``polls`` is false for every tool)."""
        return bool(self._stateful)

    def _apply_result(self, seq: int, result: bytes) -> bool:
        """Check ``seq``'s result settles in the current streak: one that differs from the
        streak's latest restarts the streak there. True when the streak it ends had reached its
        stop count unreported (in this report): it is kept as ``ended_stop`` for the streak policy."""
        baseline, self._baseline = self._baseline, result
        if baseline is None or result == baseline:
            return False
        kept = self.checks - seq + 1
        due = bool(self.stop_at) and self.stop_count >= self.stop_at and _STREAK_STOP not in self._fired
        if due:
            self._late = EndedStreak(seq, seq - 1, self.streak_length - kept, self._failing, self._settled,
                                     self.stop_count, {}, self._last_key, self._last_tool, stopped=True)
        self.streak_length = kept
        self._keep_longest(self.stop_count)
        self._failing = self._settled = self.stop_count = 0
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
        current streak is quiet. A call of a streak ended by ``retry``/``resolve`` changes no streak.

        Under ``cycle_repeat`` the call settles in the cycle runs too (``CycleRuns.settle``); true
        also when that brought a cycle to a level (``CycleRuns.due``)."""
        due = None
        cyc = self._cyc
        if cyc is not None:
            cyc.reported_at = self.checks
            if seq == cyc.next and cyc.calm:
                # CycleRuns.settle, inlined for the common call: the next in check order, none
                # waiting behind it, no level due (a test holds the two equal)
                cyc.next = seq + 1
                key = self._last_key  # (nothing waits but this check, the latest: its digest is the streak's)
                if key is not None and outcome is not _DENIED:  # (CycleRuns.see, inlined)
                    if key not in cyc.ring:
                        cyc.ring.append(key)
                        cyc.hot = False
                    else:
                        due = cyc.repeated(key)
                elif outcome is not _DENIED:  # (no key: an exempt tool's call)
                    cyc.cut()
            else:
                due = self._settle_cycle(seq, outcome) or None
        if outcome is _OK:
            self._ok += 1
            if seq == self.next_to_settle:  # the common case (the next call succeeded): count_outcome(OK), inlined
                self.next_to_settle = seq + 1
                self._failing = 0
                if self._stop_any:
                    self._settled += 1
                    self.stop_count = self._settled
                if self._early:
                    settled = self._settle_waiting()
                    return due or settled
                return due
        else:
            self._outcomes[outcome._value_] += 1
        if seq != self.next_to_settle:
            if seq > self.next_to_settle:  # an earlier call of the streak has no outcome yet: this one waits
                self._early[seq] = outcome
            elif self._ended:  # a call of a streak another key ended
                settled = self._settle_ended(seq, outcome)
                return due or settled
            return due
        self._settle(outcome)
        if self._early:
            settled = self._settle_waiting()
            return due or settled
        return due

    def _cycle_pending(self) -> bool:
        """Whether the latest check waits for its outcome in the cycle runs but is not in their
        ``waiting``: the common call's (``CycleRuns.next``), whose digest is the streak's key."""
        cyc = self._cyc
        return cyc is not None and not cyc.waiting and cyc.next == self.checks

    def _cycle_wait_latest(self) -> None:
        """Put the latest check in the cycle runs' ``waiting`` if it waits but is not there (before
        the streak's key changes, or an outcome settles there)."""
        cyc = self._cyc
        if cyc is not None and not cyc.waiting and cyc.next == self.checks:  # (_cycle_pending)
            cyc.waiting.append(self._last_key)
            cyc.calm = False

    def _settle_cycle(self, seq: int, outcome: Outcome, result: bytes | None = None) -> bool:
        """``CycleRuns.settle``, the latest check first put in the runs' ``waiting``."""
        self._cycle_wait_latest()
        assert self._cyc is not None
        return self._cyc.settle(seq, outcome, result)

    def abandon(self, seq: int) -> None:
        """The outcome of check ``seq`` will never come (the guard stopped waiting for it): it
        settles as neither a failure nor a reset, so its streak's later outcomes can count (a
        stateful tool's call counts its repeat without a result: ``PolledCalls.abandon``)."""
        if seq == self.next_to_settle:
            self._settle(_ABANDONED)
            if self._early:
                self._settle_waiting()
        elif seq > self.next_to_settle:
            self._early[seq] = _ABANDONED
        elif self._ended:
            self._settle_ended(seq, _ABANDONED)

    def settle_lost(self) -> None:
        """As the turn ends, the calls still without an outcome will never get one: each settles as
        given up (``abandon``), so the outcomes that came behind it count as they went, in check
        order, in the summary too (the result restarts, the longest failing streak), as they did at
        the checks."""
        for ended in self._ended:
            while ended.early:
                self._settle_ended(ended.next, _ABANDONED)
        while self._early:
            self._settle(_ABANDONED)
            self._settle_waiting()

    def _settle_ended(self, seq: int, outcome: Outcome) -> bool:
        """Settle check ``seq`` in the ended streak that holds it (if one does)."""
        self._late = None
        for ended in self._ended:
            if ended.next <= seq <= ended.last:
                break
        else:
            return False
        restarts = ended.restarts
        reached = ended.settle(seq, outcome, self._stop_any, self.stop_at)
        self._keep_longest(ended.top if ended.top > ended.peak else ended.peak)
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
        self.next_to_settle += 1
        if outcome is _ERROR and not self._stop_any:  # count_outcome(ERROR), inlined: every failing call's
            failing = self._failing = self._failing + 1
            if failing > self.stop_count:
                self.stop_count = failing
            return
        self._failing, self._settled, self.stop_count = count_outcome(
            outcome, self._failing, self._settled, self.stop_count, self._stop_any)

    def _settle_waiting(self) -> bool | None:
        """Settle the outcomes that waited for the one just settled. True when a stateful tool's
        streak reached its stop count and then restarted at a changed result, all in this report
        (its stop is due now: ``ended_stop``)."""
        early, results = self._early, self._results
        due = None
        while self.next_to_settle in early:
            if results and self.next_to_settle in results:
                due = self._apply_result(self.next_to_settle, results.pop(self.next_to_settle)) or due
            self._settle(early.pop(self.next_to_settle))
        return due

    def _worst_stop(self, last: int) -> int:
        """The stop count after check ``last`` if the calls of the streak waiting for an outcome
        up to it all failed, and the calls whose outcome is known counted as they went, with their
        results (a stateful tool's changed result restarts the count there): counted backwards
        from ``last``, stopping at a known reset, a restart or ``streak_stop_at``. Calls denied
        early neither count nor stop it, so each run of them is walked once (``_skips``): the cost
        is bounded by the threshold, not the streak."""
        limit = self.stop_at
        if not limit:
            return 0
        skips = self._skips
        if len(skips) > MAX_SKIPS:  # (most are of settled checks or ended streaks: a count finds the rest again)
            skips.clear()
        early, results = self._early, self._results
        any_outcome = self._stop_any
        floor = self.next_to_settle
        count = 0
        seq = last
        top = None  # the highest check of the run of early denials being walked
        while seq >= floor:
            outcome = early.get(seq)
            if outcome is _DENIED and not (results and seq in results):
                if top is None:
                    top = seq
                seq = skips.pop(seq, seq) - 1  # (an entry an earlier count found: the run goes on below it)
                continue
            if top is not None:
                skips[top] = seq + 1
                top = None
            if outcome is None or outcome is _ERROR or (any_outcome and outcome is not _DENIED):
                count += 1
                if count >= limit:
                    return count
            elif outcome is not _DENIED:  # a known OK/UNKNOWN: the error count restarts after it
                return count
            if results and seq in results and self._restarts_at(seq):
                return count
            seq -= 1
        if top is not None:
            skips[top] = seq + 1
        return min(limit, count + (self._settled if any_outcome else self._failing))

    def provisional_streak_length(self) -> int:
        """``streak_length`` with the results of the streak's calls that wait for an earlier
        call's outcome counted where they stand (check order): the streak restarts at the latest
        call whose result changed, as it would have had the calls run one at a time."""
        results = self._results
        if not results:
            return self.streak_length
        before, restart = self._baseline, 0
        for seq in sorted(results):
            result = results[seq]
            if before is not None and result != before:
                restart = seq
            before = result
        return self.checks - restart + 1 if restart else self.streak_length

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
        self.streak_length = 0
        self._new_streak(self.checks + 1)
        if answered is not None and self._ended:
            self._ended = [ended for ended in self._ended if ended.digest != answered]
        self._late = None
        if self._results:
            self._results = {}
        self._baseline = None

    def note_detection(self, event: LoopDetectedEvent | None = None) -> None:
        """A detection was made (``event``: which, so that each level fires once per streak)."""
        self._detections += 1
        if event is not None:
            fired = (str(event.threshold), str(event.level))
            if fired == _STREAK_STOP:
                if self._late is not None:
                    self._late = None  # an ended streak's stop, or a restarted one's
                    if not (self.stop_at and self.stop_count >= self.stop_at):
                        return  # (the current streak's own is due too, in the same report: noted with it)
                # at an outcome the settled count reached it; at a check, the count with the calls waiting
                self._stop_knew = frozenset() if self.stop_count >= self.stop_at else frozenset(self._results)
            self._fired.add(fired)


class EndedStreak:
    """A streak another key ended while calls of it still waited for their outcome (identical
    calls of one model response, then a different one): its checks ``next`` to ``last`` settle
    here, in check order, as the ledger's current streak settles its own, so its stop level fires
    at the outcome that completes ``streak_stop_at`` failures, as had the calls run one at a time.
    A stateful tool's streak restarts here too at a changed result (``results``, ``baseline``)."""

    __slots__ = ("baseline", "digest", "early", "failing", "last", "length", "next", "peak", "restarts", "results",
                 "settled", "stopped", "tool", "top")

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
        self.top = peak
        """The largest stop count it reached, restarts or not (the ledger's ``longest_stop_count``)."""

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
                self.top = max(self.top, self.peak)
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
        twin.top = self.top
        return twin

    def state(self) -> dict[str, Any]:
        data = {"next": self.next, "last": self.last, "length": self.length, "failing": self.failing,
                "settled": self.settled, "peak": self.peak, "early": early_state(self.early),
                "digest": hex_or_none(self.digest), "tool": self.tool}
        if self.baseline is not None:
            data["baseline"] = self.baseline.hex()
        if self.results:
            data["results"] = results_state(self.results)
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
                    f.integer("peak", 0, length), early_outcomes(f, "early", first + 1, last),
                    f.digest("digest", DIGEST_SIZE), f.text("tool", nonempty=True),
                    f.digest("baseline", DIGEST_SIZE, optional=True) if "baseline" in f else None,
                    result_digests(f, "results", first, last), f.boolean("stopped", default=False))
        f.done()
        return ended

