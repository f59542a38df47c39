"""Per-turn facts, recorded once for every plugin: counts, key repeats, streaks, cycles.

The ledger decides nothing. Policies read its facts, declared once in ``ledger._facts``, and
return verdicts. Memory is bounded: at most
``max_tracked_keys`` distinct keys are counted per turn; a key first seen after the table is
full goes uncounted (nor is it news for ``stale_repeat``: tracked keys count on as if it were not
there; ``keys_overflowed`` turns true, and the hard backstop still bounds the turn). Streaks
compare consecutive keys and are unaffected. Each tracked key costs about 80 bytes (an 8-byte
digest and its count in a dict), so the default bound of 65,536 keys holds a turn's ledger to
about 5 MiB however long it runs (``benchmarks/bench_core.py`` measures it over a 1,000,000-call
turn); under ``stale_repeat`` the stretches its count can reach back over stay within the same
bound again (``ledger._calls.stretch_cost``).

Hooks receive a ``LedgerView`` (one per turn, made by the ``Turn``): the facts ``LedgerFacts``
declares, read-only, with no mutator and no underscored field reachable by attribute; the view is
made from that one declaration. Only the built-in policy modules (``turnguard._policies``) get the
ledger itself, and read it through ``PolicyFacts`` (``LedgerFacts`` and the thresholds and streak
positions their hot paths compare): the facts they read on every call are slots of the ledger
under those public names (``tool_calls``, ``streak_length``, ``stop_count``...), as fast as a
private field and named as the view names them.

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
the latest call whose key is seen only once in the turn) and the settled streak
(``settled_streak_length``, which ``streak_stop_on="any"`` stops on).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import operator
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from turnguard import _state as st
from turnguard._keys import DIGEST_SIZE, cached_digest
from turnguard._ledger._calls import stretch_cost
from turnguard._ledger._cycles import CycleRuns
from turnguard._ledger._facts import LedgerFacts, PolicyFacts
from turnguard._ledger._polled import PolledCalls
from turnguard._ledger._state import (
    GIVE_UP_AFTER,
    GIVE_UP_EVERY,
    MAX_AWAITING,
    MAX_POLLED,
    check_number,
    digest_counts,
    early_outcomes,
    early_state,
    fact,
    fired_pair,
    hex_or_none,
    key_size,
    overdue,
    result_digests,
    results_state,
)
from turnguard._ledger._streaks import _STREAK_STOP, MAX_ENDED_STREAKS, MAX_FIRED, EndedStreak, count_outcome
from turnguard._model import MAX_RESTART_TOOLS, LoopDetectedEvent, Outcome, TurnSummary, Verdict, halt_threshold
from turnguard._state import Fields

if TYPE_CHECKING:
    from turnguard._config import GuardConfig
    from turnguard._model import Action, Level, Threshold, ToolCall

_OK = Outcome.OK
_GIVEN_UP = Outcome.UNKNOWN
"""How a call whose outcome will never come (``abandon``) settles in the cycle runs: as one that
ran (the streak settles it as neither a failure nor a reset, ``Streaks.abandon``)."""


def _quiet_until(cap_mode: str, soft_cap: int | None, hard_cap: int | None) -> int | float:
    """Up to where the cap cannot fire: N (explicit), S (adaptive), everywhere when it is off (the
    mode's own limit is set in its mode)."""
    limit = hard_cap if cap_mode == "explicit" else soft_cap if cap_mode == "adaptive" else None
    return float("inf") if limit is None else limit


@dataclass(frozen=True, slots=True)
class WaitingChecks:
    """Checks ``first`` to ``last`` that facts wait for outcomes of (named by ``field``): each is a
    call waiting for its outcome, or one whose outcome came early (``early``); ``first``'s call
    has the digest ``digest`` (``None``: any)."""

    field: str
    first: int
    last: int
    early: frozenset[int]
    digest: bytes | None


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


_FACTS = (
    "tool_calls", "_cycles", "_cycle_start", "max_key_repeat", "_overflowed", "_last_key", "_last_tool",
    "streak_length", "_failing", "_detections", "_retries", "_first_stuck", "_max_stale", "_looped", "_news",
    "_settled", "checks", "next_to_settle", "stop_count", "_ok", "_baseline", "_longest", "_stop_knew",
)
"""The scalar facts ``Ledger.fork`` copies (the dicts and the set are copied separately)."""


class Ledger(PolledCalls):
    """What has happened in one turn. Mutated only by the guard, under the turn's lock.

    Its facts come in layers, one module each: call counts and repeats (``ledger._calls``), streaks
    (``ledger._streaks``), the tools the configuration names (``ledger._polled``) and, under
    ``cycle_repeat``, cycles (``ledger._cycles``, a ``CyclingLedger``); this class adds the turn's
    identity and caps, snapshots, forks and verdicts."""

    __slots__ = (
        "_agent_name",
        "_cap_mode",
        "_cohort",
        "_config",
        "_conversation_id",
        "_fresh_state",
        "_opened_ns",
        "_promptable",
        "_resumed_from",
        "_soft_cap",
        "_started_at",
        "_turn_id",
        "cap_quiet_until",
        "hard_cap",
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
        super().__init__(config, checks)
        self._config = config
        self._cohort = str(cohort)
        self._resumed_from = resumed_from
        self._fresh_state = fresh_state
        self._turn_id = uuid.uuid4().hex if turn_id is None else turn_id
        self._conversation_id = conversation_id
        self._agent_name = agent_name
        self._promptable = bool(promptable)
        self._cap_mode = cap_mode = config.cap_mode
        self._soft_cap = config.soft_cap if cap_mode == "adaptive" else None
        self.hard_cap = config.hard_cap
        self._started_at = time.monotonic()
        self._opened_ns = time.time_ns()
        self.cap_quiet_until = _quiet_until(cap_mode, self._soft_cap, self.hard_cap)

    config: GuardConfig = fact("_config")

    turn_id: str = fact("_turn_id")

    cohort: str = fact(
        "_cohort", "``live``, or ``probe`` when the probe configuration guards the turn (``tg.Probe``)."
    )

    conversation_id: str | None = fact("_conversation_id")

    agent_name: str | None = fact("_agent_name")

    resumed_from: str | None = fact(
        "_resumed_from",
        "The turn id of the snapshot this turn was forked from (resumed twice in one guard), or ``None``.",
    )

    fresh_state: tuple[str, ...] = fact(
        "_fresh_state", "The plugins whose per-turn state started afresh at a resume (the snapshot had none for them)."
    )

    promptable: bool = fact(
        "_promptable", "Whether a person is watching (attended): detections reach the user rather than halt."
    )

    cap_mode: str = fact("_cap_mode", "``explicit``, ``adaptive`` or ``disabled``.")

    soft_cap: int | None = fact("_soft_cap", "S under the adaptive cap, else ``None``.")

    started_at: float = fact("_started_at")

    opened_ns: int = fact(
        "_opened_ns", "When the turn opened, Unix ns, read once (a resumed turn's: the resume less the time it ran)."
    )

    @property
    def cycle_due(self) -> tuple[Level, int, int] | None:
        """The ``cycle_repeat`` level the latest outcome brought a cycle to (``CycleRuns.due``);
        ``None``: none, or the policy is off."""
        cyc = self._cyc
        return None if cyc is None else cyc.due

    @property
    def cycle_unreported(self) -> list[tuple[Level, int, int]]:
        """The ``cycle_repeat`` levels reached that no report carried yet, in the order later
        reports would carry them (``CycleRuns.unreported``); empty when the policy is off."""
        cyc = self._cyc
        return [] if cyc is None else cyc.unreported()

    def count_settled(self, digests: Sequence[bytes], tools: Sequence[str], outcomes: Sequence[Outcome],
                      cycles: Sequence[int]) -> bool:
        """For replay tools (``turnguard calibrate``): ``begin_cycle`` ``cycles[i]`` times, then
        ``count_call`` and at once ``record_outcome`` for each call, in one pass with the facts
        held in locals (a replay counts most of a turn this way, without checks). Only where that
        is the plain case: no tools named, the ``repeat`` signal, no outcome waiting; ``False``
        (nothing done) otherwise, and the caller counts call by call."""
        if (self._named or self._stale or self._early or self._ended or self.next_to_settle != self.checks + 1
                or self._cyc):
            return False
        after = _count_settled(self, digests, tools, outcomes, cycles)
        self.tool_calls, self._cycles, self._cycle_start = after.tool_calls, after.cycles, after.cycle_start
        self.max_key_repeat, self._first_stuck, self._overflowed = after.max_repeat, after.first_stuck, after.overflowed
        self._last_key, self._last_tool, self.streak_length = after.last_key, after.last_tool, after.streak
        self._failing, self._settled, self.stop_count = after.failing, after.settled, after.stop_peak
        self._longest, self._ok = after.longest, after.ok
        self.checks += len(digests)
        self.next_to_settle = self.checks + 1
        return True

    def rollback_cycle(self) -> None:
        """The current model request is re-sent: discard its calls, clear repeats and streaks."""
        self.forget_repeats()
        self._polled.clear()
        self._held.clear()
        self._raised = False
        self.reset_streak()
        if self._ended:  # the re-sent request's calls are discarded, with every streak
            self._ended = []

    def fork(self, config: GuardConfig, *, promptable: bool | None = None) -> Ledger:
        """A copy of these facts under another configuration, for replay tools (``turnguard
        calibrate``) that count a turn's common prefix once for many configurations.

        The facts must not depend on the difference: ``max_tracked_keys``, ``stuck_signal`` and
        ``streak_stop_on`` must be equal, and ``stuck_repeat_threshold`` equal or not yet reached
        under either value; a ledger without cycle runs (``cycle_repeat`` off) forks into one that
        keeps them only before its first call. Raises ``ValueError`` otherwise.
        """
        stuck = config.stuck_repeat_threshold
        reached = self._max_stale if self._stale else self.max_key_repeat
        if (
            config.max_tracked_keys != self._max_keys
            or (config.stuck_signal == "stale_repeat") != self._stale
            or (config.streak_stop_on == "any") != self._stop_any
            or (stuck != self.stuck_at and reached >= min(stuck, self.stuck_at))
            or frozenset(config.stateful_tools) != self._stateful
            or frozenset(config.streak_exempt_tools) != self._exempt
            or (self._cyc is None and self.checks and (config.cycle_repeat_warn_at or config.cycle_repeat_stop_at))
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
        twin._past = deque(s if isinstance(s, bytes) else (s[0], dict(s[1])) for s in self._past)
        twin._past_size = self._past_size
        twin._outcomes = dict(self._outcomes)
        twin._early = dict(self._early)
        twin._fired = set(self._fired)
        twin._ended = [ended.copy() for ended in self._ended]
        twin._polled = dict(self._polled)
        twin._held = dict(self._held)
        twin._results = dict(self._results)
        twin._restarts = dict(self._restarts)
        return twin

    def state(self) -> dict[str, Any]:
        """The facts as JSON data, for a turn's snapshot; ``from_state`` reads them back. Key
        repeats are digests (hex), never arguments."""
        facts: dict[str, Any] = {name: getattr(self, attr) for name, attr in _STATE_COUNTS.items()}
        facts.update({name: getattr(self, f"_{name}") for name in _STATE_FLAGS})
        facts.update({name: hex_or_none(getattr(self, f"_{name}")) for name in _STATE_DIGESTS})
        facts["last_tool"] = self._last_tool
        if self._longest > self.stop_count:  # (else it is the current streak's: the default)
            facts["longest"] = self._longest
        facts["counts"] = {digest.hex(): n for digest, n in self._counts.items()}
        facts["since_new"] = {digest.hex(): n for digest, n in self._since_new.items()}
        if self._past:
            facts["past"] = [s.hex() if isinstance(s, bytes) else {"news": hex_or_none(s[0]), "counts": {
                digest.hex(): n for digest, n in s[1].items()}} for s in self._past]
        facts["outcomes"] = self.outcome_counts()
        facts["early"] = early_state(self._early)
        facts["fired"] = sorted([list(pair) for pair in self._fired])
        if self._stop_knew is not None and _STREAK_STOP in self._fired:
            facts["stop_knew"] = sorted(self._stop_knew)
        if self._ended:
            facts["ended"] = [ended.state() for ended in self._ended]
        self._polling_state(facts)
        return facts

    def _polling_state(self, facts: dict[str, Any]) -> None:
        """The stateful tools' facts, each only when it holds something (version 2's rule)."""
        if self._polled:
            facts["polled"] = {str(seq): [digest.hex(), at] for seq, (digest, at) in self._polled.items()}
        if self._held:
            facts["held"] = {str(seq): [key.hex(), at] for seq, (key, at) in self._held.items()}
        if self._results:
            facts["results"] = results_state(self._results)
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
        seq = self.checks = f.integer("seq")
        calls = self.tool_calls = f.integer("tool_calls", 0, seq)
        self._cycles = f.integer("cycles")
        self._cycle_start = f.integer("cycle_start", 0, calls)
        self._detections = f.integer("detections")
        self._retries = f.integer("retries")
        self._counts = digest_counts(f, "counts", self._max_keys, calls, pairs=True)
        self.max_key_repeat = f.integer("max_repeat", max(self._counts.values(), default=0), calls)
        self._overflowed = f.boolean("overflowed")
        self._first_stuck = f.integer("first_stuck", 0, calls)
        self._since_new = digest_counts(f, "since_new", self._max_keys + 1, calls, pairs=True)
        self._max_stale = f.integer("max_stale", 0, calls)
        self._looped = f.boolean("looped")
        news = f.get("news")
        self._news = st.digest(f.at("news"), news, key_size(news), optional=True)
        self._restore_past(f, calls)
        self._restore_streak(f, seq, calls)
        self._restore_outcomes(f.object("outcomes"))
        self._restore_polling(f, seq, calls)
        self._restore_cycles(f, seq)
        self._check_references(f)
        f.done()

    def _check_references(self, f: Fields) -> None:
        """The facts that name an entry of another find it there: a damaged or altered snapshot would
        otherwise resume with its current streak, or the stale signal's run, silently lost."""
        last_key = self._last_key
        if last_key is not None and not self._overflowed and last_key not in self._counts and not (
                self.polls(self._last_tool) and self._counted_with_result(last_key)) and not any(
                key == last_key for key, _ in self._held.values()):
            st.refuse(f.at("last_key"), "a key of facts.counts (the current streak's call)", last_key.hex())
        self._check_stale_window(f)

    def _check_stale_window(self, f: Fields) -> None:
        """The ``stale_repeat`` count's window is made of counted keys: its first call (``news``) is
        a key of ``since_new``, whose keys are counted ones, and so are each earlier stretch's
        (``past``), whose first call is a key of its table; a key past ``max_tracked_keys`` is in
        none of them. A window a live turn could not hold would reach back, at that call's next
        repeat, over keys the counts lack, and the turn's own next snapshot would be refused. Under
        the ``repeat`` signal there is no window."""
        news, since, counts, past = self._news, self._since_new, self._counts, self._past
        if not self._stale and (news is not None or since or past):
            field = "news" if news is not None else "since_new" if since else "past"
            st.refuse(f.at(field), "empty under stuck_signal 'repeat' (no stale_repeat window)", f.get(field))
        if news is not None and news not in since:
            st.refuse(f.at("news"), "a key of facts.since_new", news.hex())
        if past and news is None:
            st.refuse(f.at("past"), "empty when facts.news is null (the window reaches back no further)", f.get("past"))
        _check_counted(f.at("since_new"), since, counts)
        for i, stretch in enumerate(past):
            at = f"{f.at('past')}[{i}]"
            if isinstance(stretch, bytes):
                if stretch not in counts:
                    st.refuse(at, "a key of facts.counts", stretch.hex())
                continue
            first, table = stretch
            if first is not None and first not in table:
                st.refuse(f"{at}.news", f"a key of {at}.counts", first.hex())
            _check_counted(f"{at}.counts", table, counts)

    def _counted_with_result(self, digest: bytes) -> bool:
        """Whether a stateful tool's call of this digest is counted (with a result, or without one) or
        waits for its outcome to be (``polled``)."""
        return (any(key.startswith(digest) for key in self._counts)
                or any(polled == digest for polled, _ in self._polled.values())
                or any(key.startswith(digest) for key, _ in self._held.values()))

    def waiting_checks(self) -> list[WaitingChecks]:
        """The checks these facts wait for outcomes of: the current streak's from ``next`` on, each
        ended streak's (``Guard.resume`` finds each a call the turn waits for)."""
        checks = [WaitingChecks(f"ended[{i}].next", ended.next, ended.last, frozenset(ended.early), ended.digest)
                  for i, ended in enumerate(self._ended)]
        if self.next_to_settle <= self.checks:
            checks.append(WaitingChecks("next", self.next_to_settle, self.checks, frozenset(self._early),
                                        self._last_key))
        return checks

    def _restore_past(self, f: Fields, calls: int) -> None:
        """The stretches the ``stale_repeat`` count can reach back over (absent: none), each a
        news call's key alone or ``{"news", "counts"}``, within ``max_tracked_keys`` as a live
        ledger keeps them (``stretch_cost``)."""
        path = f.at("past")
        self._past = deque()
        for i, item in enumerate(f.items("past", 2 * self._max_keys, default=[])):
            at = f"{path}[{i}]"
            if isinstance(item, str):
                self._past.append(st.digest(at, item, key_size(item)))
                continue
            stretch = Fields(item, at)
            news = stretch.get("news")
            older = digest_counts(stretch, "counts", self._max_keys, calls, pairs=True)
            stretch.done()
            self._past.append((st.digest(stretch.at("news"), news, key_size(news), optional=True), older))
            self._past_size += stretch_cost(older)
            if self._past_size > self._max_keys:
                st.refuse(at, f"stretches costing at most {self._max_keys} keys in all (max_tracked_keys)",
                          f"{self._past_size} in all")

    def _restore_cycles(self, f: Fields, seq: int) -> None:
        """A plain ledger holds no cycle facts: a snapshot that has them needs ``cycle_repeat`` on."""

    def _restore_polling(self, f: Fields, seq: int, calls: int) -> None:
        self._polled = _waiting_keys(f, "polled", 1, seq, calls, pairs=False)
        # a held repeat waits behind a stateful check still waiting: none without one
        self._held = _waiting_keys(f, "held", next(iter(self._polled), seq) + 1, seq, calls, pairs=True)
        self._results = result_digests(f, "results", self.next_to_settle + 1, seq)
        self._baseline = f.digest("baseline", DIGEST_SIZE, optional=True) if "baseline" in f else None
        path = f.at("restarts")
        self._restarts = {st.text(f"{path}.{tool}", tool, nonempty=True): st.integer(f"{path}.{tool}", n, 1)
                          for tool, n in f.mapping("restarts", MAX_RESTART_TOOLS + 1, default={}).items()}

    def _restore_streak(self, f: Fields, seq: int, calls: int) -> None:
        self._last_key = f.digest("last_key", DIGEST_SIZE, optional=True)
        self._last_tool = f.text("last_tool", optional=True, nonempty=True)
        streak = self.streak_length = f.integer("streak", 0, calls)
        if (self._last_key is None) != (streak == 0):
            st.refuse(f.at("streak"), "0 exactly when last_key is null (no current streak)", streak)
        if (self._last_key is None) != (self._last_tool is None):
            st.refuse(f.at("last_tool"), "null exactly when last_key is null", self._last_tool)
        self.next_to_settle = f.integer("next", 1, seq + 1)
        self._failing = f.integer("failing", 0, streak)
        self._settled = f.integer("settled", 0, streak)
        self.stop_count = f.integer("stop_peak", 0, streak)
        self._longest = f.integer("longest", self.stop_count + 1, seq, default=0)
        self._early = early_outcomes(f, "early", self.next_to_settle + 1, seq)
        fired = f.items("fired", MAX_FIRED)
        self._fired = {fired_pair(f"{f.at('fired')}[{i}]", pair) for i, pair in enumerate(fired)}
        self._stop_knew = None
        if "stop_knew" in f:
            knew = f.items("stop_knew", MAX_POLLED)
            self._stop_knew = frozenset(st.integer(f"{f.at('stop_knew')}[{i}]", n, 1, seq) for i, n in enumerate(knew))
        records = f.items("ended", MAX_ENDED_STREAKS, default=[])
        self._ended = []
        low = 1
        for i, data in enumerate(records):
            ended = EndedStreak.from_state(Fields(data, f"{f.at('ended')}[{i}]"), low, seq - 1, calls)
            self._ended.append(ended)
            low = ended.last + 1
        if self.next_to_settle < low:  # (the current streak's checks come after the ended ones')
            st.refuse(f.at("next"), f"a check after the ended streaks' last, from {low} to {seq + 1}",
                      self.next_to_settle)

    def _restore_outcomes(self, f: Fields) -> None:
        """The outcome totals: counters, which nothing else is derived from."""
        counts = {o.value: f.integer(o.value, default=0) for o in Outcome}
        f.done()
        self._ok = counts.pop(_OK.value)
        self._outcomes = counts

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
        length, failing = (self.streak_length, self._failing) if streak is None else (streak.length, streak.failing)
        # Positional, in field order: a class called with keywords gets them as a dict, 20 entries
        # here, built on every detection (tests/test_ledger.py holds each field to its fact).
        event = LoopDetectedEvent(
            threshold, action, level, int(limit),
            self.tool_calls, self._cycles, self.max_key_repeat, length, failing,
            self._soft_cap, self.hard_cap,  # (the slots behind the facts: a property read costs per detection)
            call.name if call is not None else None,
            digest.hex() if digest is not None else None,
            self._promptable, self._turn_id, self._conversation_id, self._agent_name,
            new_event_id(), self._cap_mode, message,
        )
        return Verdict(action, threshold, message, event)

    def summary(self, *, reason: str, halt: Verdict | None, stuck: bool) -> TurnSummary:
        """How the turn ended (call ``settle_polled`` first). ``stuck``: the cap's answer
        (``turnguard._policies.cap.summary_stuck``), a decision the ledger does not make."""
        return TurnSummary(
            turn_id=self.turn_id,
            conversation_id=self.conversation_id,
            agent_name=self.agent_name,
            promptable=self.promptable,
            reason=reason,
            tool_calls=self.tool_calls,
            cycles=self._cycles,
            max_key_repeat=self.max_key_repeat,
            max_failing_streak=self.longest_stop_count,
            first_stuck_call=self._first_stuck,
            distinct_keys=len(self._counts),
            keys_overflowed=self._overflowed,
            halted=halt is not None,
            threshold=halt_threshold(halt.threshold) if halt is not None else None,
            cap_mode=self.cap_mode,
            stuck=stuck,
            detections=self._detections,
            duration_s=time.monotonic() - self.started_at,
            cohort=self._cohort,
            resumed_from=self._resumed_from,
            fresh_state=self._fresh_state,
            result_restarts=tuple(sorted(self._restarts.items())),
        )


_STATE_COUNTS = {
    "seq": "checks", "tool_calls": "tool_calls", "cycles": "_cycles", "cycle_start": "_cycle_start",
    "detections": "_detections", "retries": "_retries", "max_repeat": "max_key_repeat", "first_stuck": "_first_stuck",
    "max_stale": "_max_stale", "streak": "streak_length", "next": "next_to_settle", "failing": "_failing",
    "settled": "_settled", "stop_peak": "stop_count",
}
"""The counts a snapshot holds: its field name -> the ledger's attribute."""
_STATE_FLAGS = ("overflowed", "looped")
_STATE_DIGESTS = ("last_key", "news")


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
    longest: int
    ok: int



def _check_counted(path: str, table: dict[bytes, int], counts: dict[bytes, int]) -> None:
    """Each key of the table at ``path`` is a key of ``counts``."""
    for key in table:
        if key not in counts:
            st.refuse(f"{path}.{key.hex()}", "a key of facts.counts", key.hex())


def _waiting_keys(f: Fields, name: str, low: int, seq: int, calls: int, *,
                  pairs: bool) -> dict[int, tuple[bytes, int]]:
    """A table of checks (from ``low`` to ``seq``) to the key their repeat is counted with and
    their call number (``polled``: a call's digest; ``held``: a digest or a (call, result) pair)."""
    path = f.at(name)
    table = {}
    for key, value in f.mapping(name, MAX_POLLED, default={}).items():
        check = check_number(f"{path}.{key}", key, low, seq)
        if not isinstance(value, list) or len(value) != 2:
            st.refuse(f"{path}.{key}", "a [digest, call number] pair", value)
        size = key_size(value[0]) if pairs else DIGEST_SIZE
        table[check] = (st.digest(f"{path}.{key}[0]", value[0], size),
                        st.integer(f"{path}.{key}[1]", value[1], 1, calls))
    return dict(sorted(table.items()))


def _count_settled(ledger: Ledger, digests: Sequence[bytes], tools: Sequence[str], outcomes: Sequence[Outcome],
                   cycles: Sequence[int]) -> Settled:
    """``Ledger.count_settled``'s pass: ``begin_cycle`` and ``count_call`` (the ``repeat`` signal, no
    tool named) inlined, each outcome settled by ``count_outcome``; the scalar facts after it."""
    calls, cycle, cycle_start = ledger.tool_calls, ledger._cycles, ledger._cycle_start
    counts, max_keys, overflowed = ledger._counts, ledger._max_keys, ledger._overflowed
    max_repeat, first_stuck, stuck_at = ledger.max_key_repeat, ledger._first_stuck, ledger.stuck_at
    last_key, last_tool, streak = ledger._last_key, ledger._last_tool, ledger.streak_length
    failing, settled, stop_peak, ok = ledger._failing, ledger._settled, ledger.stop_count, ledger._ok
    longest = ledger._longest
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
                if stop_peak > longest:
                    longest = stop_peak
                failing = settled = stop_peak = 0
            if fired:
                fired.clear()
        if outcome is _OK:
            ok += 1
        else:
            other[outcome._value_] += 1
        failing, settled, stop_peak = settle(outcome, failing, settled, stop_peak, stop_any)
    return Settled(calls, cycle, cycle_start, max_repeat, first_stuck, overflowed, last_key, last_tool, streak,
                   failing, settled, stop_peak, longest, ok)


VIEW_FACTS = tuple(name for name, value in vars(LedgerFacts).items() if isinstance(value, property))
"""The facts a ``LedgerView`` shows: ``LedgerFacts``'s properties, in their order there."""
VIEW_QUERIES = tuple(name for name, value in vars(LedgerFacts).items()
                     if inspect.isfunction(value) and not name.startswith("_"))
"""The queries a ``LedgerView`` answers (``detect`` among them): ``LedgerFacts``'s methods."""


class LedgerView(LedgerFacts):
    """What hooks receive as ``turn``: the ledger's facts, read-only.

    Exactly ``LedgerFacts``: its facts (``VIEW_FACTS``) and queries (``VIEW_QUERIES``: ``outcomes``,
    ``repeats_of``, ``fired_in_streak``, ``provisional_stop_fired``, ``provisional_stop_count``, ``polls``,
    ``restarts_by_tool``, and ``detect`` to build a verdict), each read through from the ledger,
    made below from the protocol's declarations. No mutator, no underscored field, no attribute
    can be set, and the view cannot be rebound: a plugin that uses what it is given cannot reset
    the counts the caps read, by mistake or by design. It is not a sandbox: code in the same process
    can reach the ledger behind a view (``gc.get_referents(view)`` returns it, as the interpreter
    lets any code reach any object) and change it. Run only plugins you trust as much as the host's
    own code; the view makes the read-only contract explicit and an accidental write impossible.

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

    def __repr__(self) -> str:
        ledger = _ledger_of(self)
        return f"<turnguard turn {ledger.turn_id} (read-only): {ledger.tool_calls} calls, {ledger.cycles} cycles>"


_slot = LedgerView.__dict__["_ledger"]
_bind: Callable[[LedgerView, Ledger], None] = _slot.__set__
_ledger_of: Callable[[LedgerView], Ledger] = _slot.__get__
delattr(LedgerView, "_ledger")  # the slot's descriptor, kept above: no attribute of a view reaches the ledger


def _read_through(name: str, declared: property) -> property:
    """The view's fact ``name``: the ledger's, read through, with the declaration's type and doc."""
    read = operator.attrgetter(name)

    def fact(view: LedgerView) -> Any:
        return read(_ledger_of(view))

    fact.__name__ = fact.__qualname__ = name
    fact.__annotations__ = dict(declared.fget.__annotations__) if declared.fget is not None else {}
    return property(fact, doc=declared.__doc__)


def _ask_through(name: str, declared: Callable[..., Any]) -> Callable[..., Any]:
    """The view's query ``name``: the ledger's, asked through, with the declaration's signature and doc."""

    @functools.wraps(declared)
    def query(view: LedgerView, *args: Any, **kwargs: Any) -> Any:
        return getattr(_ledger_of(view), name)(*args, **kwargs)

    query.__signature__ = inspect.signature(declared)  # type: ignore[attr-defined]
    del query.__wrapped__  # (the declaration's body raises: nothing reaches it through the view)
    return query


for _name in VIEW_FACTS:
    setattr(LedgerView, _name, _read_through(_name, vars(LedgerFacts)[_name]))
for _name in VIEW_QUERIES:
    setattr(LedgerView, _name, _ask_through(_name, vars(LedgerFacts)[_name]))
del _name


class CyclingLedger(Ledger):
    """The ledger of a turn under ``cycle_repeat`` (``Ledger(config)`` makes one when the policy is
    on): the plain ledger's facts and ``CycleRuns``, fed at each check and outcome."""

    __slots__ = ()
    _cyc: CycleRuns

    def __init__(self, config: GuardConfig, **identity: Any) -> None:
        super().__init__(config, **identity)
        self._cyc = CycleRuns(config.cycle_repeat_max_period, config.cycle_repeat_warn_at,
                              config.cycle_repeat_stop_at, self.checks + 1)
        self._cyc.warn_asks = self.promptable and not config.remind_model
        self._cyc.reported_at = self.checks

    def _count_polled_call(self, digest: bytes, tool_name: str) -> int:
        self._cycle_wait_latest()
        seq = super()._count_polled_call(digest, tool_name)
        self._cyc.checked(seq, None if tool_name in self._exempt else digest, True)
        return seq

    def record_polled(self, seq: int, outcome: Outcome, result: bytes | None) -> bool | None:
        cyc = self._cyc
        due = self._settle_cycle(seq, outcome, result)
        level = cyc.due
        settled = super().record_polled(seq, outcome, result)  # (its record_outcome finds seq settled)
        cyc.due = level
        return settled or due

    def abandon(self, seq: int) -> None:
        self._settle_cycle(seq, _GIVEN_UP)  # (seen as having run: a call that did not is DENIED)
        super().abandon(seq)

    def reset_streak(self, answered: bytes | None = None) -> None:
        """``Streaks.reset_streak``; the cycle runs restart at the answer's place in check order
        (``CycleRuns.restart``), as the same calls run one at a time."""
        self._cycle_wait_latest()  # (the streak's key, its digest, is forgotten now)
        super().reset_streak(answered)
        cyc = self._cyc
        cyc.restart(cyc.restart_at(self.checks))

    def rollback_cycle(self) -> None:
        super().rollback_cycle()
        self._cyc.forget_waiting(self.checks + 1)
        self._cyc.reset()

    def summary(self, *, reason: str, halt: Verdict | None, stuck: bool) -> TurnSummary:
        """``Ledger.summary``; its detections count the cycle levels no outcome reported
        (``cycle_unreported``: the turn ended, or halted, first; the turn's end reports them)."""
        summary = super().summary(reason=reason, halt=halt, stuck=stuck)
        owed = len(self._cyc.unreported())
        return replace(summary, detections=summary.detections + owed) if owed else summary

    def fork(self, config: GuardConfig, *, promptable: bool | None = None) -> Ledger:
        """``Ledger.fork``, the cycle runs carried (their levels those of ``config``); a ``ValueError``
        where ``config`` looks for other periods and calls were seen."""
        cyc = self._cyc
        on = config.cycle_repeat_warn_at or config.cycle_repeat_stop_at
        if on and config.cycle_repeat_max_period != cyc.period and (cyc.ring or cyc.waiting or self._cycle_pending()):
            raise ValueError("fork(): the cycle runs so far depend on cycle_repeat_max_period")
        twin = super().fork(config, promptable=promptable)
        if twin._cyc is not None:
            if config.cycle_repeat_max_period == cyc.period:
                twin._cyc = cyc.copy()
                twin._cyc.set_levels(config.cycle_repeat_warn_at, config.cycle_repeat_stop_at)
                twin._cyc.warn_asks = twin.promptable and not config.remind_model
            else:
                twin._cyc.next = cyc.next  # (no call seen: nothing else to carry)
        return twin

    def state(self) -> dict[str, Any]:
        facts = super().state()
        facts["cycle_runs"] = self._cyc.state((self._last_key,) if self._cycle_pending() else (), self.checks)
        return facts

    def waiting_checks(self) -> list[WaitingChecks]:
        checks = super().waiting_checks()
        cyc = self._cyc
        if cyc.waiting:
            checks.append(WaitingChecks("cycle_runs.next", cyc.next, cyc.next + len(cyc.waiting) - 1,
                                        frozenset(cyc.early), cyc.waiting[0]))
        return checks

    def _restore_cycles(self, f: Fields, seq: int) -> None:
        if "cycle_runs" in f:
            self._cyc.restore(Fields(f.get("cycle_runs"), f.at("cycle_runs")), seq)
        else:
            self._cyc.next = seq + 1


if TYPE_CHECKING:
    def _a_ledger_has_the_policies_facts(ledger: Ledger) -> PolicyFacts:
        return ledger  # (mypy checks that a Ledger satisfies the protocol)


__all__ = [
    "GIVE_UP_AFTER",
    "GIVE_UP_EVERY",
    "MAX_AWAITING",
    "MAX_ENDED_STREAKS",
    "MAX_FIRED",
    "MAX_POLLED",
    "VIEW_FACTS",
    "VIEW_QUERIES",
    "CycleRuns",
    "CyclingLedger",
    "EndedStreak",
    "Ledger",
    "LedgerFacts",
    "LedgerView",
    "PolicyFacts",
    "Settled",
    "answered_digest",
    "count_outcome",
    "new_event_id",
    "overdue",
]
