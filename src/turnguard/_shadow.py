"""Shadow policies: other configurations evaluated side by side on live traffic, without acting.

``GuardConfig(shadow={"stale": {"stuck_signal": "stale_repeat"}})`` makes the guard run, next to
its own policies, the same built-in policy functions under each shadow configuration, each on
its own ``Ledger`` per live turn, fed from the observer hooks (the calls, outcomes, model
requests, retries and the user's answers the live turn saw). What a shadow would have done is
reported through ``turnguard_shadow_detected`` (every would-be detection) and
``turnguard_shadow_turn_ended`` (a ``TurnSummary`` per shadow per turn); the telemetry plugin
turns them into ``turnguard.shadow.*`` metrics. A shadow never changes a verdict. The reporting
hooks are observer hooks like any other, called through a ``Dispatcher`` over the live manager:
one that raises is logged and reported through ``turnguard_plugin_error``, and under the live
``fail_mode="closed"`` a failing ``turnguard_shadow_detected`` halts the live call it was heard on.

How it runs: the per-call work is done in the check hooks (``turnguard_check_call`` and the
others), which the guard calls positionally under the turn's lock, and which return ``None``
(a HALT only when a report failed under ``fail_mode="closed"``, above); so the shadows see every
call in the order the live ledger counted it (parallel calls included) and cost no observer
dispatch. Would-be detections are reported from there (they are
rare; the turn's lock is re-entrant). A retry or a user's answer arrives through the observer
hooks, outside the lock: it is queued and applied by the next check, before it counts anything.

Rules, chosen so that a shadow configured exactly like the live guard reports exactly the live
guard's detections (``tests/test_shadow.py`` checks it):

- A would-be HALT latches for that shadow: it stops evaluating (the calls after it would not
  have happened) and its summary counts the calls up to it.
- A would-be ASK is not answered by anyone; the shadow's streak resets when the live user answers
  ``continue``/``redirect`` (the live facts reset), as the live ledger's does.
- The live call's key (``call.key``, computed once in ``check_call``) is reused when the shadow
  has the live key mode and digest secret; otherwise the shadow keys the call itself.
- Outcomes are credited in check order, as the live ledger credits them (``Ledger.record_outcome``
  with the live call's sequence number): a shadow sees a parallel batch as the live guard does.
  A shadow's ``stateful_tools`` get the result digest the live turn kept on the call
  (``keys.cached_result``; the live guard keys the results its shadows' stateful tools need).
- Each shadow configuration's policies run through their own ``Dispatcher`` (a policies-only
  plugin manager, ``plugins.policies_only``), combined by its rule: a policy that raises is
  logged and ignored, or, under the shadow's own ``fail_mode="closed"``, is that shadow's
  would-be HALT; it never reaches the live verdict.

Cost: per shadow, a ledger update and its policy functions per call (through its dispatcher's
loop, where its quiet region lets them fire); no keying, no pluggy dispatch
(``benchmarks/bench_shadow.py`` measures it). This module sits above the guard: the guard knows
nothing of shadows; the package registers ``plugin_for`` as the ``shadow`` built-in plugin
(``plugins.register_factory``, from ``turnguard/__init__.py``).
"""

from __future__ import annotations

import logging
import operator
import time
import weakref
from collections.abc import Callable
from typing import Any

import pluggy

from turnguard import _state as st
from turnguard._config import GuardConfig
from turnguard._dispatch import PASSTHROUGH, Dispatcher, Found
from turnguard._driver import CHECK_CALL, CHECK_CYCLE, CHECK_OUTCOME, Driver, summarize
from turnguard._keys import KEY_CHECK, KEY_DIGEST, KEY_KEYER, CallKey, Keyer, cached_result, turn_keyer
from turnguard._ledger import Ledger, LedgerView, answered_digest
from turnguard._model import Action, Answer, LoopDetectedEvent, Outcome, ToolCall, TurnSummary, Verdict
from turnguard._plugins import plugin_manager as policy_manager
from turnguard._plugins import policies_only
from turnguard._snapshot import deciding_settings, read_verdict, verdict_data
from turnguard._state import Fields
from turnguard.hookspecs import hookimpl

log = logging.getLogger("turnguard")
_HALT = Action.HALT
_RESETTING_ANSWERS = frozenset({Answer.CONTINUE.value, Answer.REDIRECT.value})


class ShadowPolicy:
    """One shadow configuration: its dispatcher over a policies-only manager (built once per guard)."""

    __slots__ = ("config", "dispatcher", "name", "own_digest")

    def __init__(self, name: str, config: GuardConfig, live: GuardConfig) -> None:
        self.name = name
        self.config = config
        same_keys = config.key_mode == live.key_mode and config.digest_key == live.digest_key
        self.own_digest: Callable[[ToolCall], bytes] | None = None if same_keys else _own_digest(config)
        """``None``: the live call's digest is this shadow's; else how this shadow keys a call."""
        pm = policy_manager(policies_only(config), environ={})
        self.dispatcher = Dispatcher(pm, fail_mode=config.fail_mode, capture_content=live.capture_content,
                                     label=f"shadow {name!r}")


def _digest_with(keyer: Keyer) -> Callable[[ToolCall], bytes]:
    """A call's digest under ``keyer``, computed afresh (the call's cached key is another keyer's)."""
    return lambda call: keyer.digest(call.name, call.args)


_TURN_KEYERS_KEPT = 64


def _own_digest(config: GuardConfig) -> Callable[[ToolCall], bytes]:
    """How a shadow with a key mode or secret of its own keys a call: under its ``digest_key``,
    else, on a durable turn, under that turn's own key (in the shadow's key mode: its digests then
    mean the same in the process that resumes the turn), else under its process's own secret."""
    fixed = Keyer(config.key_mode, config.digest_key)
    if config.digest_key:
        return _digest_with(fixed)
    keyers: dict[bytes, Keyer] = {}

    def digest(call: ToolCall) -> bytes:
        key: CallKey | None = call.key
        turn_key = getattr(key[KEY_KEYER], "turn_key", None) if key is not None else None
        if turn_key is None:
            return fixed.digest(call.name, call.args)
        keyer = keyers.get(turn_key)
        if keyer is None:
            if len(keyers) >= _TURN_KEYERS_KEPT:
                keyers.clear()
            keyer = keyers[turn_key] = turn_keyer(config.key_mode, turn_key)
        return keyer.digest(call.name, call.args)

    return digest


class ShadowRun:
    """One shadow policy on one live turn: its ledger, its driver, its latched would-be halt."""

    __slots__ = ("driver", "halt", "ledger", "policy")

    def __init__(self, policy: ShadowPolicy, turn: LedgerView) -> None:
        self.policy = policy
        self.restore(Ledger(policy.config, **_identity(turn)), None)

    def restore(self, ledger: Ledger, halt: Verdict | None) -> None:
        """Evaluate the shadow on ``ledger`` from now on (a new turn's, or one read back from a snapshot)."""
        self.ledger = ledger
        self.driver = Driver(self.policy.dispatcher, ledger)
        """Counts, tests the quiet region and collects, as the live turn's driver does."""
        self.halt = halt

    def state(self) -> dict[str, Any]:
        return {"config": deciding_settings(self.policy.config), "facts": self.ledger.state(),
                "halt": verdict_data(self.halt)}


def _restore_run(run: ShadowRun, f: Fields, turn: LedgerView, stopped: bool) -> None:
    """``run`` goes on from its state in a snapshot (``ShadowRun.state``)."""
    ledger = Ledger.from_state(run.policy.config, f.get("facts"), path=f.at("facts"),
                               elapsed_s=time.monotonic() - turn.started_at, **_identity(turn))
    halt = read_verdict(f.get("halt"), f.at("halt"))
    f.done()
    if halt is None and not stopped and ledger.checks != turn.checks:
        st.refuse(f.at("facts.seq"), f"the live turn's check count, {turn.checks} (a shadow sees every check "
                  "until its would-be halt)", ledger.checks)
    run.restore(ledger, halt)


def _identity(turn: LedgerView, **extra: Any) -> dict[str, Any]:
    """A shadow ledger's identity: the live turn's."""
    return {"turn_id": turn.turn_id, "conversation_id": turn.conversation_id, "agent_name": turn.agent_name,
            "promptable": turn.promptable, **extra}


class TurnShadows:
    """Every shadow's run on one live turn, and the live manager's dispatcher as it was when the
    turn opened (``reporter``: the reporting hooks go through it). ``active`` holds the runs
    without a would-be halt (the only ones still evaluated) with their ledgers; ``calls`` and
    ``outcomes`` the same runs with what each per-call loop reads from their drivers, unpacked in
    one step (the loops inline ``Driver.call`` and ``Driver.outcome``: one method call less per
    shadow per call; ``tests/test_driver.py`` holds them equal);
    ``results``: whether one of them records a stateful tool's result (``keys.cached_result``)."""

    __slots__ = ("active", "calls", "found", "outcomes", "pending", "reporter", "results", "runs", "stopped")

    def __init__(self, runs: list[ShadowRun], reporter: Dispatcher | None) -> None:
        self.runs = runs
        self.found: list[tuple[str, LoopDetectedEvent]] = []
        self.pending: list[Callable[[Ledger], None]] = []
        self.reporter = reporter
        self.stopped = False
        self.drop_halted()

    def drop_halted(self) -> None:
        active = [run for run in self.runs if run.halt is None]
        self.active = tuple((run, run.ledger) for run in active)
        drivers = [(run, run.driver) for run in active]
        self.calls = tuple((run, d.ledger, run.policy.own_digest, d.count, d.checks.call, d.quiet, d.collect1)
                           for run, d in drivers)
        self.outcomes = tuple((run, d.ledger, d.polls, d.ledger.record_outcome, d.checks.outcome, d.quiet,
                               d.collect2) for run, d in drivers)
        self.results = any(d.polls is not None for _, d in drivers)

    def stop(self) -> None:
        """Evaluate no shadow any more on this turn."""
        self.stopped = True
        self.active = self.calls = self.outcomes = ()

    def apply_pending(self) -> None:
        """Apply queued retries and answers to every run still evaluated."""
        pending, self.pending = self.pending, []
        for op in pending:
            for active in self.active:
                op(active[1])


class ShadowPlugin:
    """The ``shadow`` built-in: evaluates ``GuardConfig.shadow`` on live traffic."""

    def __init__(self, config: GuardConfig, pm: pluggy.PluginManager | None = None) -> None:
        self.policies = tuple(ShadowPolicy(name, c, config) for name, c in config.shadow_configs())
        self._digest = _digest_with(Keyer(config.key_mode, config.digest_key))
        """The live guard's digest of a call that reaches the hooks unkeyed (driven by a host's
        own plugin manager rather than a ``Turn``, which keys every call first)."""
        self._pm = pm
        """The live manager: its ``turnguard_shadow_*`` observers hear about would-be detections."""
        self._live = config
        self._reporter: tuple[tuple[object, ...], Dispatcher] | None = None
        """The live manager's plugins (compared by identity: a plugin need not be hashable) and
        the dispatcher built over them."""
        self._turns: dict[int, TurnShadows] = {}

    # -- per-turn state -------------------------------------------------------------------------

    def _reporting(self) -> Dispatcher | None:
        """A dispatcher over the live manager, under the live ``fail_mode``: the reporting hooks
        go through it as every observer hook goes through the guard's (isolated, logged, reported
        through ``turnguard_plugin_error``). Rebuilt when the manager's plugins changed (a plugin
        ``Guard.register``-ed later hears about the turns opened after it)."""
        if self._pm is None:
            return None
        plugins = tuple(plugin for _, plugin in self._pm.list_name_plugin())
        cached = self._reporter
        if cached is None or len(cached[0]) != len(plugins) or any(
                a is not b for a, b in zip(cached[0], plugins, strict=True)):
            live = self._live
            cached = self._reporter = (plugins, Dispatcher(self._pm, fail_mode=live.fail_mode,
                                                           capture_content=live.capture_content))
        return cached[1]

    @hookimpl
    def turnguard_turn_started(self, turn: LedgerView) -> None:
        runs = [ShadowRun(p, turn) for p in self.policies]
        state = TurnShadows(runs, self._reporting())
        key = id(turn)
        self._turns[key] = state
        weakref.finalize(turn, self._turns.pop, key, None)  # a turn never ended must not leak its shadows

    # -- live traffic ------------------------------------------------------------------------------

    # The per-call work runs in the check hooks, which the guard calls positionally under the
    # turn's lock: the shadows see each call in the order the live ledger counted it (parallel
    # calls included) at no observer-dispatch cost. They return None (a shadow never acts), but
    # for a reporting observer that failed under the live fail_mode="closed": that halts the call.
    # Each shadow's policies are called through its dispatcher's loops (``collect0``..``collect2``,
    # bound once per turn in ``TurnShadows``). Would-be detections are reported from there too
    # (rare; the lock is re-entrant).

    @hookimpl
    def turnguard_check_cycle(self, turn: LedgerView) -> Verdict | None:
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        try:
            for run, _ in state.active:
                found = run.driver.cycle()
                if found:
                    _decided(run, CHECK_CYCLE, found, state)
        except PASSTHROUGH:
            raise
        except BaseException as exc:  # a bug here must not reach the live verdict (fail_mode="closed")
            _give_up(state, exc)
        return self._flush(turn) if state.found else None

    @hookimpl
    def turnguard_check_call(self, turn: LedgerView, call: ToolCall) -> Verdict | None:
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        key: CallKey | None = call.key  # keys.cached_digest, inlined: this runs on every call
        digest = key[KEY_DIGEST] if key is not None else self._digest(call)
        name = call.name
        try:
            for run, ledger, own_digest, count, every, quiet, collect in state.calls:
                count(digest if own_digest is None else own_digest(call), name)
                # Driver.call, inlined (tests/test_driver.py holds the two equal)
                if (ledger.tool_calls <= quiet.calls and ledger.streak_length < quiet.streak
                        and ledger.max_key_repeat < quiet.repeat) or quiet.reasked():
                    impls = quiet.call
                    if not impls:
                        continue
                else:
                    impls = every
                found = collect(CHECK_CALL, impls, None, call)
                if found:  # a shadow never acts, even failing
                    _decided(run, CHECK_CALL, found, state)
        except PASSTHROUGH:
            raise
        except BaseException as exc:  # a bug here must not reach the live verdict (fail_mode="closed")
            _give_up(state, exc)
        return self._flush(turn) if state.found else None

    @hookimpl
    def turnguard_check_outcome(self, turn: LedgerView, call: ToolCall, outcome: Outcome) -> Verdict | None:
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        key: CallKey | None = call.key
        # the live check it belongs to; none (a host's own plugin manager, a call keyed outside a
        # turn: keys.unchecked_key): the latest check
        seq = key[KEY_CHECK] if key is not None and key[KEY_CHECK] else turn.checks
        result = cached_result(call) if state.results else None  # (for the shadows' stateful tools)
        name = call.name
        try:
            for run, ledger, polls, record, every, quiet, collect in state.outcomes:
                # Driver.outcome, inlined (as above)
                if polls is not None and polls(name):
                    due = ledger.record_polled(seq, outcome, result)
                else:
                    due = record(seq, outcome)
                if ledger.stop_count < quiet.stop_count and not due:
                    impls = quiet.outcome
                    if not impls:
                        continue
                else:
                    impls = every
                found = collect(CHECK_OUTCOME, impls, None, call, outcome)
                if found:
                    _decided(run, CHECK_OUTCOME, found, state)
        except PASSTHROUGH:
            raise
        except BaseException as exc:  # a bug here must not reach the live verdict (fail_mode="closed")
            _give_up(state, exc)
        return self._flush(turn) if state.found else None

    # A retry or an answer reaches the plugin outside the turn's lock: it is queued and applied
    # by the next check (under the lock), before that check counts anything.

    @hookimpl
    def turnguard_retry(self, turn: LedgerView) -> None:
        state = self._turns.get(id(turn))
        if state is not None:
            state.pending.append(operator.methodcaller("rollback_cycle"))  # (the ledger's own: a cycling one's too)

    @hookimpl
    def turnguard_escalation_resolved(self, turn: LedgerView, event: LoopDetectedEvent, response: str) -> None:
        if response not in _RESETTING_ANSWERS:
            return
        state = self._turns.get(id(turn))
        if state is not None:
            # (a shadow keying calls its own way has other digests: its ended streaks all go on)
            state.pending.append(operator.methodcaller("reset_streak", answered=answered_digest(event)))

    # -- durable turns: the shadows' state travels in the turn's snapshot ------------------------

    @hookimpl
    def turnguard_turn_snapshot(self, turn: LedgerView) -> dict[str, Any] | None:
        """Each shadow's facts and would-be halt (by shadow name), with its deciding settings:
        under the turn's lock, after the queued retries and answers are applied."""
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        return {"stopped": state.stopped, "runs": {run.policy.name: run.state() for run in state.runs}}

    @hookimpl
    def turnguard_turn_resumed(self, turn: LedgerView, state: Any) -> None:
        """Each shadow goes on from the state the snapshot holds for it, checked field by field
        (``plugins.shadow.*``). A shadow the snapshot has no state for, or one whose settings
        changed since, starts afresh: its summary's ``fresh_state`` says so."""
        shadows = self._turns.get(id(turn))
        if shadows is None:
            return
        f = Fields(state if state is not None else {"stopped": False, "runs": {}}, "plugins.shadow")
        stopped = f.boolean("stopped")
        runs = f.mapping("runs", len(shadows.runs) + 1024)
        f.done()
        for run in shadows.runs:
            name = run.policy.name
            g = Fields(runs[name], f"plugins.shadow.runs.{name}") if name in runs else None
            if g is None or g.get("config") != deciding_settings(run.policy.config):
                fresh = Ledger(run.policy.config, **_identity(turn, fresh_state=("shadow",), checks=turn.checks))
                run.restore(fresh, None)  # numbered as the live checks: their outcomes come by those numbers
            else:
                _restore_run(run, g, turn, stopped)
        if stopped:
            shadows.stop()
        else:
            shadows.drop_halted()

    @hookimpl
    def turnguard_turn_suspended(self, turn: LedgerView) -> None:
        """Put aside: the shadows' state is in the snapshot, their summaries come when the turn ends."""
        self._flush(turn)
        self._turns.pop(id(turn), None)

    @hookimpl(tryfirst=True)
    def turnguard_turn_ended(self, turn: LedgerView, summary: TurnSummary) -> None:
        """First of the turn-end observers, so a reporter has the shadows' summaries (a probe
        turn's main-policy would-be halt) when it reports the live turn."""
        self._flush(turn)
        state = self._turns.get(id(turn))
        if state is None:
            return
        if state.pending:
            state.apply_pending()
        state.found.extend((run.policy.name, event) for run in state.runs for event in run.driver.unreported())
        self._flush(turn)  # (the levels no report carried: heard once, as the live turn's are)
        self._turns.pop(id(turn), None)
        summaries = [(run.policy.name, summarize(run.ledger, _reason(run, summary), run.halt))
                     for run in state.runs]
        if state.reporter is not None:
            for name, shadow_summary in summaries:
                state.reporter.notify("turnguard_shadow_turn_ended", turn, turn=turn, policy=name,
                                      summary=shadow_summary)

    def _flush(self, turn: LedgerView) -> Verdict | None:
        """Report the would-be detections noted since the last report (in the order they came):
        the stand-in of the first reporter that failed (``Dispatcher.failed``: under the live
        ``fail_mode="closed"`` a HALT, the live call's answer: it halts), else ``None``."""
        state = self._turns.get(id(turn))
        if state is None or not state.found:
            return None
        found, state.found = state.found, []
        reporter = state.reporter
        if reporter is None:
            return None
        failure = None
        for name, event in found:
            observed = reporter.notify("turnguard_shadow_detected", turn, turn=turn, policy=name, event=event)
            failure = observed if failure is None else failure
        return failure


def _decided(run: ShadowRun, hook: str, found: Found, state: TurnShadows) -> None:
    """A shadow's policies answered: combined by the shadow's dispatcher (as the live guard
    combines), each detection noted in ``state.found``; a HALT latches and takes the run out of
    ``state.active`` for the calls after this."""
    best, events = run.driver.combine(hook, found)
    name = run.policy.name
    state.found.extend((name, event) for event in events)
    if best is not None and best.action is _HALT and run.halt is None:
        run.halt = best
        state.drop_halted()


def _give_up(state: TurnShadows, exc: BaseException) -> None:
    """Something outside the policies failed: stop evaluating shadows for this turn (logged)."""
    log.error("turnguard shadow plugin failed (%s); shadows stop for this turn", type(exc).__qualname__)
    state.stop()


def _reason(run: ShadowRun, live: TurnSummary) -> str:
    """The shadow turn's end: ``halted``, its own would-be halt; else ``live_halted`` when the live
    turn was halted (``TurnSummary.halted``: a threshold fired, whatever reason the host ended it
    with) or its reason reads ``halted`` (that label is the shadow's own halt); else the live reason."""
    if run.halt is not None:
        return "halted"
    return "live_halted" if live.halted or live.reason == "halted" else live.reason


def plugin_for(config: GuardConfig, *, plugin_manager: pluggy.PluginManager | None = None,
               **_providers: Any) -> ShadowPlugin | None:
    """The shadow plugin for ``config``, or ``None`` when it has no shadow policies."""
    if not config.shadow:
        return None
    return ShadowPlugin(config, plugin_manager)
