"""Replay recorded turns through the live guard's own ledger and policy hooks.

``replay_turn`` drives a ``Ledger`` through the ``Driver`` a ``Turn`` uses, over a real plugin
manager's ``Dispatcher``; a HALT latches. Attended replays answer every ASK ``continue`` (the
recorded turn did go on). No threshold logic here: which policies share a replay is
``equivalence.py``'s; the calls' keys are the live guard's identity bytes (``call_keys``)."""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import pluggy

from turnguard._calibrate.grid import Policy
from turnguard._calibrate.records import UNFINISHED, RecordedCall, RecordedTurn, Unreported
from turnguard._config import MAX_CALLS, GuardConfig
from turnguard._dispatch import BoundChecks, Dispatcher, Impl
from turnguard._driver import CHECK_CALL, CHECK_CYCLE, CHECK_OUTCOME, Driver
from turnguard._keys import Keyer, identity_bytes, name_bytes, store_key, unchecked_key
from turnguard._ledger import GIVE_UP_EVERY, Ledger, LedgerView, answered_digest, overdue
from turnguard._model import Action, Outcome, ToolCall, Verdict
from turnguard._plugins import FACTORY_PLUGINS, plugin_manager, policies_only
from turnguard._policies import cap

Impls = tuple[Impl, ...]
UNREACHED = MAX_CALLS
"""A stuck threshold no turn reaches."""
_CYCLE = operator.itemgetter(4)  # RecordedCall.cycle
_TOOL = operator.itemgetter(0)  # RecordedCall.tool
_OUTCOME = operator.itemgetter(3)  # RecordedCall.outcome
_RETRIES = operator.itemgetter(6)  # RecordedCall.retries


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What one policy did to one turn in one mode: ``halt_call`` the 1-based call the halt
    prevented (``calls + 1``: after the last; 0: none); ``asks`` the calls an ASK reached the user at."""

    halt_call: int = 0
    threshold: str | None = None
    asks: tuple[int, ...] = ()

    @property
    def halted(self) -> bool:
        return self.halt_call > 0


@dataclass(frozen=True, slots=True)
class Step:
    """One decision in a traced replay (for comparing with a live ``Turn``)."""

    call: int
    stage: str  # "cycle" | "call" | "outcome" | "end"
    action: Action
    threshold: str | None


class CompiledPolicy:
    """A policy's plugin manager compiled once into a ``Dispatcher`` (its check hooks in hook
    order, its fail mode, ``combine``), as the live guard compiles its own."""

    __slots__ = ("check_call", "check_cycle", "check_outcome", "config", "dispatcher", "keyer", "policy",
                 "prefix_config")

    def __init__(self, policy: Policy, keyer: Keyer, managers: Managers | None = None) -> None:
        self.policy = policy
        self.config = policies_only(policy.config)
        self.keyer = keyer
        self.dispatcher = Dispatcher(policy_manager(policy, managers), fail_mode=self.config.fail_mode,
                                     log_errors=False)
        self.check_cycle: Impls = self.dispatcher.check_cycle
        self.check_call: Impls = self.dispatcher.check_call
        self.check_outcome: Impls = tuple(
            impl for impl in self.dispatcher.check_outcome
            if self.config.stateful_tools or impl.fn is not cap.turnguard_check_outcome)
        """The outcome hooks; the cap's answers only at a stateful tool's outcome (``stuck_raised``):
        without stateful tools it is left out (one call per replayed call saved)."""
        self.prefix_config = self.config.replace(stuck_repeat_threshold=UNREACHED)
        """For a ``SharedPrefix`` that policies fork from before their stuck threshold is reached:
        a threshold no turn reaches shapes no fact, so it forks into any of them."""

    def bind(self, ledger: Ledger, view: LedgerView | None = None) -> BoundChecks:
        """The check hooks for one replay's ``ledger`` (``Dispatcher.bind``, the outcome hooks as above)."""
        view = view if view is not None else LedgerView(ledger)
        bound = self.dispatcher.bound
        return BoundChecks(bound(self.check_cycle, ledger, view), bound(self.check_call, ledger, view),
                           bound(self.check_outcome, ledger, view))

    def driver(self, ledger: Ledger) -> Driver:
        """The ``Driver`` of one replay on ``ledger``, with the hooks ``bind`` gives."""
        view = LedgerView(ledger)
        return Driver(self.dispatcher, ledger, view, checks=self.bind(ledger, view))


Managers = dict[frozenset[str], pluggy.PluginManager]
"""Plugin managers by the plugins a configuration blocks, shared by the policies they serve."""


def policy_manager(policy: Policy, managers: Managers | None = None) -> pluggy.PluginManager:
    """The live guard's plugin manager for ``policy`` (policies only), its extra rules registered as
    plugins. With ``managers``, policies without extra rules share one per set of blocked plugins
    (the modules read every setting from the ledger; a manager costs about a millisecond)."""
    config = policies_only(policy.config)
    if managers is not None and not policy.extras and set(FACTORY_PLUGINS) <= set(config.disable_plugins):
        key = frozenset(config.disable_plugins)
        if key not in managers:
            managers[key] = plugin_manager(config, environ={})
        return managers[key]
    pm = plugin_manager(config, environ={})
    for i, rule in enumerate(policy.extras):
        pm.register(rule.plugin(), name=f"calibrate-extra-{i}")
    return pm


def cycle_starts(turn: RecordedTurn) -> list[int]:
    """How many model requests begin before each call (index ``len(calls)``: after the last): the
    recorded ``cycle`` numbers, else the total spread evenly (more requests than calls: the last
    after the last call), else one. Past a turn's listed calls (``calls_dropped``) none are placed."""
    n = len(turn.calls)
    starts = [0] * (n + 1)
    if set(map(_CYCLE, turn.calls)) - {None}:
        current = 0
        for i, call in enumerate(turn.calls):
            cycle = call.cycle if call.cycle is not None else current
            if cycle > current:
                starts[i] += cycle - current
                current = cycle
        if turn.cycles is not None and turn.cycles > current and not turn.calls_dropped:
            starts[n] += turn.cycles - current
        return starts
    total = turn.cycles if turn.cycles is not None else 1
    if total <= 0:
        return starts
    calls = n + turn.calls_dropped  # spread over the whole turn, cut to the listed calls
    if calls == 0:
        starts[0] = total
        return starts
    spread = total - 1 if total > calls else total
    if spread == n == calls:  # the usual shape: one request per call, and maybe a final answer
        return [1] * n + [total - spread]
    for j in range(spread):
        at = (j * calls) // spread
        if at >= n:
            break
        starts[at] += 1
    if calls == n:
        starts[n] += total - spread
    return starts


def retry_points(turn: RecordedTurn) -> frozenset[int]:
    """The calls (0-based) before which the live turn rolled a model request back (``Turn.retry``):
    those whose recorded ``retries`` rose. Empty for most turns, and for recordings without it."""
    if not any(map(_RETRIES, turn.calls)):
        return frozenset()
    points, before = set(), 0
    for i, retries in enumerate(map(_RETRIES, turn.calls)):
        if retries > before:
            points.add(i)
        before = retries
    return frozenset(points)


def roll_back(ledger: Ledger) -> None:
    """``Turn.retry``'s rollback at a retry point: repeats and streaks cleared, as the live ledger
    cleared them. The rolled-back calls are not in the recording, so no call is counted since the
    request began; where one is (a recording without each call's ``cycle``, whose requests are
    spread evenly), the rollback would take recorded calls back too, and the retry is ignored."""
    if not ledger.calls_this_cycle:
        ledger.rollback_cycle()


def tool_call(call: RecordedCall, digest: bytes, keyer: Keyer) -> ToolCall:
    """The ``ToolCall`` the hooks receive, its key already set to the replay's digest."""
    tc = ToolCall(call.tool, call.args)
    store_key(tc, unchecked_key(digest, keyer))
    return tc


def unfinished_calls(outcomes: Sequence[Outcome | Unreported]) -> tuple[int, ...]:
    """The numbers (1-based) of the ``UNFINISHED`` calls among a turn's ``outcomes``: what a replay
    of the turn is given to wait for them as the live turn did (empty for most turns)."""
    if UNFINISHED not in outcomes:
        return ()
    return tuple(k for k, outcome in enumerate(outcomes, 1) if outcome is UNFINISHED)


def still_waiting(lost: Sequence[int], upto: int) -> list[int]:
    """The unfinished calls (``lost``) still waited for after the turn's first ``upto`` calls: the
    others were given up by then, where the live turn gives them up (``give_up``)."""
    waiting: list[int] = []
    if not lost:
        return waiting
    marks = range(GIVE_UP_EVERY, upto + 1, GIVE_UP_EVERY)
    for seq, is_call in sorted([*((m, False) for m in marks), *((k, True) for k in lost if k <= upto)]):
        if is_call:
            waiting.append(seq)
        elif waiting:
            del waiting[:min(overdue([*waiting, seq], seq), len(waiting))]
    return waiting


def give_up(ledger: Ledger, waiting: list[int], seq: int) -> None:
    """At check ``seq`` (one of each ``GIVE_UP_EVERY``), stop waiting for the unfinished calls the
    live turn gives up there (``overdue``; the call being checked waits there too)."""
    due = min(overdue([*waiting, seq], seq), len(waiting))
    for old in waiting[:due]:
        ledger.abandon(old)
    del waiting[:due]


def advance(ledger: Ledger, turn: RecordedTurn, digests: Sequence[bytes], starts: Sequence[int], begin: int,
            end: int, waiting: list[int] | None = None, retries: frozenset[int] = frozenset()) -> None:
    """Record calls ``begin..end-1`` (0-based) and the model requests before each, without checks.
    ``waiting``: the unfinished calls waited for so far (``still_waiting``), updated; ``None`` when
    the turn has none (``unfinished_calls``). ``retries``: the turn's ``retry_points``."""
    calls = turn.calls[begin:end]
    if waiting is None and not retries and ledger.count_settled(digests[begin:end], list(map(_TOOL, calls)),
                                                                list(map(_OUTCOME, calls)), starts[begin:end]):
        return
    count, outcome, cycle = ledger.count_call, ledger.record_outcome, ledger.begin_cycle
    if ledger.names_tools:
        count = ledger.count_named
    polled = ledger.polls if ledger.polls_any else None
    for i, (call, digest, cycles) in enumerate(zip(calls, digests[begin:end], starts[begin:end], strict=True), begin):
        for _ in range(cycles):
            cycle()
        if retries and i in retries:
            roll_back(ledger)
        if waiting and not (ledger.checks + 1) % GIVE_UP_EVERY:
            give_up(ledger, waiting, ledger.checks + 1)
        count(digest, call[0])  # call.tool
        reported = call[3]  # call.outcome, for the call just counted
        if reported is UNFINISHED:
            if waiting is not None:
                waiting.append(ledger.checks)
            continue
        if polled is None or not polled(call[0]):
            outcome(ledger.checks, reported)
        else:
            ledger.record_polled(ledger.checks, reported, result_digest(call))


def result_digest(call: RecordedCall) -> bytes | None:
    """The recorded result digest of ``call`` as a ledger takes it (``None``: not recorded)."""
    result = call.result
    return None if result is None else result.encode()


class SharedPrefix:
    """One ledger per turn and key mode, advanced once through the turn; replays that start
    checking later fork it (``Ledger.fork``) instead of recounting the calls before."""

    __slots__ = ("digests", "ledger", "position", "starts", "turn", "waiting")

    def __init__(self, config: GuardConfig, turn: RecordedTurn, digests: Sequence[bytes],
                 starts: Sequence[int], lost: Sequence[int] = ()) -> None:
        self.ledger = Ledger(config, turn_id=turn.id)
        self.turn, self.digests, self.starts = turn, digests, starts
        self.position = 0
        self.waiting: list[int] | None = [] if lost else None

    def fork_at(self, first_check: int, config: GuardConfig, promptable: bool) -> Ledger | None:
        """A ledger holding calls before ``first_check`` under ``config``, or ``None`` when the
        prefix has moved past it or the facts differ (the replay then counts for itself)."""
        skip = min(first_check - 1, len(self.turn.calls))
        if skip < self.position:
            return None
        advance(self.ledger, self.turn, self.digests, self.starts, self.position, skip, self.waiting)
        self.position = skip
        try:
            return self.ledger.fork(config, promptable=promptable)
        except ValueError:
            return None


def _answered(verdict: Verdict, call_no: int, stage: str, asks: list[int], ledger: Ledger,
              trace: list[Step] | None) -> bool:
    """Apply a call's or an outcome's verdict as the host does; ``True`` when it halts. An ASK is
    answered "continue", which resets the streak as ``Turn.resolve`` does (streaks another key
    ended go on settling, but those of the answered call's key): the recorded turn did go on."""
    if trace is not None:
        trace.append(Step(call_no, stage, verdict.action, _label(verdict)))
    action = verdict.action
    if action is Action.ASK:
        asks.append(call_no)
        ledger.reset_streak(None if verdict.event is None else answered_digest(verdict.event))
    return action is Action.HALT


def replay_turn(
    policy: CompiledPolicy,
    turn: RecordedTurn,
    calls: list[ToolCall | None],
    digests: Sequence[bytes],
    starts: Sequence[int],
    *,
    promptable: bool,
    trace: list[Step] | None = None,
    first_check: int = 1,
    ledger: Ledger | None = None,
    asks_before: tuple[int, ...] = (),
    snapshots: dict[int, list[Snapshot]] | None = None,
    lost: Sequence[int] = (),
    retries: frozenset[int] = frozenset(),
) -> TurnResult:
    """Replay one turn under one policy until it ends or halts.

    Before call ``first_check`` (``equivalence.earliest_call``) only the ledger runs: no check there
    can change the result; ``ledger`` may already hold those calls, ``asks_before`` their asks.
    ``snapshots`` asks for the state before given calls (0-based), forked into other policies'
    configurations, so a policy agreeing up to there continues from it (``Snapshot``). ``lost``:
    the turn's unfinished calls (``unfinished_calls``), waited for as the live turn waited.
    ``retries``: the turn's ``retry_points``, rolled back as the live turn rolled them back."""
    recorded = turn.calls
    skip = min(first_check - 1, n := len(recorded))
    ledger, waiting = _ledger_at(policy, turn, digests, starts, skip, ledger, promptable, lost, retries)
    stops = retries | frozenset(range(GIVE_UP_EVERY - 1, n, GIVE_UP_EVERY)) if lost else retries
    asks: list[int] = list(asks_before)
    driver = policy.driver(ledger)
    results = driver.polls is not None
    for i in range(skip, n + 1):
        if snapshots and i in snapshots:
            _take(snapshots.pop(i), ledger, asks)
        if starts[i]:
            halt = _cycles(driver, starts[i], i + 1, trace)
            if halt is not None:
                return _ended(driver, TurnResult(i + 1, _label(halt), tuple(asks)), n, trace)
        if i == n:
            break
        if stops and i in stops:
            _before_call(ledger, i, waiting, retries)
        call = calls[i]
        if call is None:
            call = calls[i] = tool_call(recorded[i], digests[i], policy.keyer)
        found = driver.call(digests[i], call)
        verdict = driver.combine(CHECK_CALL, found)[0] if found else None
        if verdict is not None and _answered(verdict, i + 1, "call", asks, ledger, trace):
            return _ended(driver, TurnResult(i + 1, _label(verdict), tuple(asks)), n, trace)
        outcome = recorded[i].outcome
        if outcome is UNFINISHED:  # its turn ended before it: the live guard got no outcome either
            waiting.append(i + 1)
            continue
        found = driver.outcome(ledger.checks, call, outcome, result_digest(recorded[i]) if results else None)
        verdict = driver.combine(CHECK_OUTCOME, found)[0] if found else None
        if verdict is not None and _answered(verdict, i + 1, "outcome", asks, ledger, trace):
            return _ended(driver, TurnResult(i + 2, _label(verdict), tuple(asks)), n, trace)
    return _ended(driver, TurnResult(0, None, tuple(asks)), n, trace)


def _ended(driver: Driver, result: TurnResult, calls: int, trace: list[Step] | None) -> TurnResult:
    """``result``, the turn's end traced as the live turn tells it: the levels no report carried
    (``Driver.unreported``), each an ``end`` step after the last call the turn reached."""
    if trace is not None:
        at = result.halt_call if result.halted else calls + 1
        trace.extend(Step(at, "end", event.action, str(event.threshold)) for event in driver.unreported())
    return result


def _ledger_at(policy: CompiledPolicy, turn: RecordedTurn, digests: Sequence[bytes], starts: Sequence[int],
               skip: int, ledger: Ledger | None, promptable: bool, lost: Sequence[int],
               retries: frozenset[int]) -> tuple[Ledger, list[int]]:
    """``replay_turn``'s ledger holding the first ``skip`` calls (``ledger`` when given: it holds
    them already) and the unfinished calls still waited for there."""
    if ledger is not None:
        return ledger, still_waiting(lost, skip)
    ledger = Ledger(policy.config, turn_id=turn.id, promptable=promptable)
    waiting: list[int] = []
    advance(ledger, turn, digests, starts, 0, skip, waiting if lost else None, retries)
    return ledger, waiting


def _before_call(ledger: Ledger, i: int, waiting: list[int], retries: frozenset[int]) -> None:
    """What comes before call ``i`` (0-based) but its requests: a retry's rollback, and the live
    turn giving up unfinished calls (at each ``GIVE_UP_EVERY``-th check)."""
    if i in retries:
        roll_back(ledger)
    if waiting and not (i + 1) % GIVE_UP_EVERY:
        give_up(ledger, waiting, i + 1)


def _take(snapshots: list[Snapshot], ledger: Ledger, asks: list[int]) -> None:
    """Hand the replay's state before this call to the snapshots asking for it."""
    for snap in snapshots:
        with contextlib.suppress(ValueError):  # facts that depend on the difference: it replays itself
            snap.taken = (ledger.fork(snap.config, promptable=snap.promptable), tuple(asks))


def _cycles(driver: Driver, count: int, call_no: int, trace: list[Step] | None) -> Verdict | None:
    """Begin ``count`` model requests before call ``call_no``, each checked; the halting verdict, if any."""
    for _ in range(count):
        found = driver.cycle()
        verdict = driver.combine(CHECK_CYCLE, found)[0] if found else None
        if verdict is not None:
            if trace is not None:
                trace.append(Step(call_no, "cycle", verdict.action, _label(verdict)))
            if verdict.action is Action.HALT:
                return verdict
    return None


class Snapshot:
    """A request for a replay's state before a given call, forked into ``config``: ``taken`` is
    then (ledger, asks so far), or ``None`` when the replay halted first or could not fork."""

    __slots__ = ("config", "promptable", "taken")

    def __init__(self, config: GuardConfig, promptable: bool) -> None:
        self.config, self.promptable = config, promptable
        self.taken: tuple[Ledger, tuple[int, ...]] | None = None


def _label(verdict: Verdict) -> str | None:
    t = verdict.threshold
    return None if t is None else str(t)


def relative_position(halt_call: int, calls: int) -> float:
    """Where a halt lands in its turn: 0.0 before the first call, 1.0 after the last."""
    if calls <= 0:
        return 1.0
    return min(1.0, (halt_call - 1) / calls)


def calls_saved(result: TurnResult, calls: int) -> int:
    """Recorded calls the halt would have prevented."""
    return max(0, calls - result.halt_call + 1) if result.halted else 0


def decile(fraction: float) -> int:
    """0..10: the tenth of the turn a halt lands in (10: after the last call)."""
    return min(10, math.floor(fraction * 10 + 1e-9))


# -- call keys --------------------------------------------------------------------------------------

_RECORDED = b"\xff"
"""The first byte of a recorded digest's key (``call_keys``), which no identity bytes start with."""


def call_keys(calls: Sequence[RecordedCall], mode: str) -> list[bytes]:
    """Each call's ledger key under ``mode``: the live guard's identity bytes without the hash
    (equal bytes, equal digests; and no 8-byte collision). A recorded digest's key is ``0xFF``, the
    name's bytes and the digest: no identity bytes start with ``0xFF``, so it never equals an
    argument's key. Tool parts are made once per turn; under ``canonical``, repeated JSON-object text
    is canonicalized once."""
    prefixes: dict[str, bytes] = {}
    memo: dict[tuple[str, str], bytes] = {}
    keys: list[bytes] = []
    append, get, canonical = keys.append, memo.get, mode == "canonical"
    for call in calls:
        tool, args, digest = call[0], call[1], call[2]
        if digest is not None:
            prefix = prefixes.get(tool)
            if prefix is None:
                prefix = prefixes[tool] = _RECORDED + name_bytes(tool)
            append(prefix + digest.encode("utf-8", "surrogatepass"))
        elif not canonical or type(args) is not str or args[:1] != "{":
            append(identity_bytes(tool, args, mode))
        else:
            pair = (tool, args)
            key = get(pair)
            if key is None:
                key = memo[pair] = identity_bytes(tool, args, mode)
            append(key)
    return keys

