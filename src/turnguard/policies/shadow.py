"""Shadow policies: other configurations evaluated side by side on live traffic, without acting.

``GuardConfig(shadow={"stale": {"stuck_signal": "stale_repeat"}})`` makes the guard run, next to
its own policies, the same built-in policy functions under each shadow configuration, each on
its own ``Ledger`` per live turn, fed from the observer hooks (the calls, outcomes, model
requests, retries and the user's answers the live turn saw). What a shadow would have done is
reported through ``turnguard_shadow_detected`` (every would-be detection) and
``turnguard_shadow_turn_ended`` (a ``TurnSummary`` per shadow per turn); the telemetry plugin
turns them into ``turnguard.shadow.*`` metrics. A shadow never changes a verdict.

How it runs: the per-call work is done in the check hooks (``turnguard_check_call`` and the
others), which the guard calls positionally under the turn's lock, and which always return
``None``; so the shadows see every call in the order the live ledger counted it (parallel calls
included) and cost no observer dispatch. Would-be detections are reported from there (they are
rare; the turn's lock is re-entrant). A retry or a user's answer arrives through the observer
hooks, outside the lock: it is queued and applied by the next check, before it counts anything.

Rules, chosen so that a shadow configured exactly like the live guard reports exactly the live
guard's detections (``tests/test_policies_shadow.py`` checks it):

- A would-be HALT latches for that shadow: it stops evaluating (the calls after it would not
  have happened) and its summary counts the calls up to it.
- A would-be ASK is not answered by anyone; the shadow's streak resets when the live user answers
  ``continue``/``redirect`` (the live facts reset), as the live ledger's does.
- The live call's key (``call._key``, computed once in ``check_call``) is reused when the shadow
  has the live key mode and digest secret; otherwise the shadow keys the call itself.
- A shadow's policy that raises is logged and ignored, or, under the shadow's own
  ``fail_mode="closed"``, is that shadow's would-be HALT; it never reaches the live verdict.

Cost: per shadow, a ledger update and its policy functions per call; no keying, no dispatch
(``benchmarks/bench_shadow.py`` measures it).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import pluggy

from turnguard.config import GuardConfig
from turnguard.hookspecs import hookimpl
from turnguard.keys import Keyer
from turnguard.ledger import Ledger
from turnguard.model import Action, Answer, LoopDetectedEvent, Outcome, ToolCall, TurnSummary, Verdict

log = logging.getLogger("turnguard")
Impls = tuple[Callable[..., Any], ...]
_HALT = Action.HALT
_RESETTING_ANSWERS = frozenset({Answer.CONTINUE.value, Answer.REDIRECT.value})
_NOT_POLICIES = ("otel", "recorder", "shadow")


class ShadowPolicy:
    """One shadow configuration's compiled policy functions (built once per guard)."""

    __slots__ = ("check_call", "check_cycle", "check_outcome", "config", "name", "own_digest")

    def __init__(self, name: str, config: GuardConfig, live: GuardConfig) -> None:
        # Imported here: guard.py imports plugins.py, which imports this module lazily.
        from turnguard.guard import compiled_checks
        from turnguard.plugins import plugin_manager

        self.name = name
        self.config = config
        same_keys = config.key_mode == live.key_mode and config.digest_key == live.digest_key
        self.own_digest: Callable[[ToolCall], bytes] | None = None if same_keys else _digest_with(
            Keyer(config.key_mode, config.digest_key))
        """``None``: the live call's digest is this shadow's; else how this shadow keys a call."""
        disabled = tuple(dict.fromkeys((*config.disable_plugins, *_NOT_POLICIES)))
        pm = plugin_manager(config.replace(disable_plugins=disabled, load_entrypoints=False), environ={})
        checks = compiled_checks(pm)
        self.check_cycle: Impls = tuple(fn for _, fn in checks["turnguard_check_cycle"])
        self.check_call: Impls = tuple(fn for _, fn in checks["turnguard_check_call"])
        self.check_outcome: Impls = tuple(fn for _, fn in checks["turnguard_check_outcome"])


def _digest_with(keyer: Keyer) -> Callable[[ToolCall], bytes]:
    """A call's digest under ``keyer``, computed afresh (the call's cached key is another keyer's)."""
    return lambda call: keyer.digest(call.name, call.args)


class ShadowRun:
    """One shadow policy on one live turn: its ledger and its latched would-be halt."""

    __slots__ = ("halt", "ledger", "policy")

    def __init__(self, policy: ShadowPolicy, turn: Ledger) -> None:
        self.policy = policy
        self.ledger = Ledger(policy.config, turn_id=turn.turn_id, conversation_id=turn.conversation_id,
                             agent_name=turn.agent_name, promptable=turn.promptable)
        self.halt: Verdict | None = None


class TurnShadows:
    """Every shadow's run on one live turn, and the reporting hooks as they were when it opened.
    ``active`` holds the runs without a would-be halt (the only ones still evaluated), each with
    what the per-call loop reads, unpacked in one step."""

    __slots__ = ("active", "detected", "ended", "found", "pending", "runs")

    def __init__(self, runs: list[ShadowRun], detected: tuple[Any, ...], ended: tuple[Any, ...]) -> None:
        self.runs = runs
        self.found: list[tuple[str, LoopDetectedEvent]] = []
        self.pending: list[Callable[[Ledger], None]] = []
        self.detected = detected
        self.ended = ended
        self.drop_halted()

    def drop_halted(self) -> None:
        self.active = tuple(
            (run, run.ledger, run.policy.own_digest, run.ledger.count_call, run.policy.check_call,
             run.ledger.record_outcome, run.policy.check_outcome)
            for run in self.runs if run.halt is None
        )

    def apply_pending(self) -> None:
        """Apply queued retries and answers to every run still evaluated."""
        pending, self.pending = self.pending, []
        for op in pending:
            for active in self.active:
                op(active[1])


class ShadowPlugin:
    """The ``shadow`` built-in: evaluates ``GuardConfig.shadow`` on live traffic."""

    def __init__(self, config: GuardConfig) -> None:
        self.policies = tuple(ShadowPolicy(name, c, config) for name, c in config.shadow_configs())
        self._digest = _digest_with(Keyer(config.key_mode, config.digest_key))
        """The live guard's digest of a call that reaches the hooks unkeyed (driven by a host's
        own plugin manager rather than a ``Turn``, which keys every call first)."""
        self._pm: pluggy.PluginManager | None = None
        self._turns: dict[int, TurnShadows] = {}

    def bind_manager(self, pm: pluggy.PluginManager) -> None:
        """The manager whose ``turnguard_shadow_*`` observers hear about would-be detections."""
        self._pm = pm

    # -- per-turn state -------------------------------------------------------------------------

    def _observers(self, hook: str) -> tuple[tuple[str, Callable[..., Any], tuple[str, ...]], ...]:
        if self._pm is None:
            return ()
        caller = getattr(self._pm.hook, hook)
        return tuple((i.plugin_name, i.function, tuple(i.argnames)) for i in reversed(caller.get_hookimpls()))

    @hookimpl
    def turnguard_turn_started(self, turn: Ledger) -> None:
        runs = [ShadowRun(p, turn) for p in self.policies]
        state = TurnShadows(runs, self._observers("turnguard_shadow_detected"),
                            self._observers("turnguard_shadow_turn_ended"))
        key = id(turn)
        self._turns[key] = state
        weakref.finalize(turn, self._turns.pop, key, None)  # a turn never ended must not leak its shadows

    # -- live traffic ------------------------------------------------------------------------------

    # The per-call work runs in the check hooks, which the guard calls positionally under the
    # turn's lock: the shadows see each call in the order the live ledger counted it (parallel
    # calls included) at no observer-dispatch cost. They always return None: a shadow never acts.
    # The call and outcome hooks inline ``_decide``'s loop: one more call per shadow per hook is
    # about 0.1 µs, which the shadows' budget (under twice the live guard's cost) does not have.
    # Would-be detections are reported from there too (rare; the turn's lock is re-entrant).

    @hookimpl
    def turnguard_check_cycle(self, turn: Ledger) -> None:
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        try:
            for run, ledger, *_ in state.active:
                ledger.begin_cycle()
                _decide(run, run.policy.check_cycle, (ledger,), state)
        except Exception as exc:  # a bug here must not reach the live verdict (fail_mode="closed")
            _give_up(state, exc)
        if state.found:
            self._flush(turn)
        return None

    @hookimpl
    def turnguard_check_call(self, turn: Ledger, call: ToolCall) -> None:
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        key = call._key  # keys.cached_digest, inlined: this runs on every call
        digest = key[0] if key is not None else self._digest(call)
        name = call.name
        try:
            for run, ledger, own_digest, count, checks, _, _ in state.active:
                count(digest if own_digest is None else own_digest(call), name)
                for fn in checks:
                    try:
                        verdict = fn(ledger, call)
                    except Exception as exc:  # a shadow never acts, not even by failing
                        verdict = _failed(run, exc)
                    if verdict is not None:
                        _decided(run, verdict, state)
        except Exception as exc:  # a bug here must not reach the live verdict (fail_mode="closed")
            _give_up(state, exc)
        if state.found:
            self._flush(turn)
        return None

    @hookimpl
    def turnguard_check_outcome(self, turn: Ledger, call: ToolCall, outcome: Outcome) -> None:
        state = self._turns.get(id(turn))
        if state is None:
            return None
        if state.pending:
            state.apply_pending()
        key = call._key
        digest = key[0] if key is not None else self._digest(call)
        try:
            for run, ledger, own_digest, _, _, record, checks in state.active:
                record(digest if own_digest is None else own_digest(call), outcome)
                for fn in checks:
                    try:
                        verdict = fn(ledger, call, outcome)
                    except Exception as exc:  # a shadow never acts, not even by failing
                        verdict = _failed(run, exc)
                    if verdict is not None:
                        _decided(run, verdict, state)
        except Exception as exc:  # a bug here must not reach the live verdict (fail_mode="closed")
            _give_up(state, exc)
        if state.found:
            self._flush(turn)
        return None

    # A retry or an answer reaches the plugin outside the turn's lock: it is queued and applied
    # by the next check (under the lock), before that check counts anything.

    @hookimpl
    def turnguard_retry(self, turn: Ledger) -> None:
        state = self._turns.get(id(turn))
        if state is not None:
            state.pending.append(Ledger.rollback_cycle)

    @hookimpl
    def turnguard_escalation_resolved(self, turn: Ledger, response: str) -> None:
        if response not in _RESETTING_ANSWERS:
            return
        state = self._turns.get(id(turn))
        if state is not None:
            state.pending.append(Ledger.reset_streak)

    @hookimpl
    def turnguard_turn_ended(self, turn: Ledger, summary: TurnSummary) -> None:
        self._flush(turn)
        state = self._turns.pop(id(turn), None)
        if state is None:
            return
        if state.pending:
            state.apply_pending()
        summaries = [(run.policy.name, run.ledger.summary(reason=_reason(run, summary), halt=run.halt))
                     for run in state.runs]
        for name, shadow_summary in summaries:
            _call_each(state.ended, turn=turn, policy=name, summary=shadow_summary)

    def _flush(self, turn: Ledger) -> None:
        """Report the would-be detections noted since the last report (in the order they came)."""
        state = self._turns.get(id(turn))
        if state is None or not state.found:
            return
        found, state.found = state.found, []
        for name, event in found:
            _call_each(state.detected, turn=turn, policy=name, event=event)


def _decide(run: ShadowRun, impls: Impls, args: tuple[Any, ...], state: TurnShadows) -> None:
    """A shadow's policies on a model request (the per-call hooks inline this loop)."""
    for fn in impls:
        try:
            verdict = fn(*args)
        except Exception as exc:  # a shadow never acts, not even by failing
            verdict = _failed(run, exc)
        if verdict is not None:
            _decided(run, verdict, state)


def _failed(run: ShadowRun, exc: Exception) -> Verdict | None:
    """A shadow's policy raised: logged; under the shadow's ``fail_mode="closed"`` it is the
    shadow's would-be HALT (what that configuration would have done live), else ignored."""
    log.error("turnguard shadow policy %r raised: %r", run.policy.name, exc, exc_info=exc)
    if run.policy.config.fail_mode == "closed":
        return Verdict(Action.HALT, None, f"turnguard: shadow {run.policy.name!r} failed (fail_mode=closed): {exc!r}")
    return None


def _decided(run: ShadowRun, verdict: Verdict, state: TurnShadows) -> None:
    """A shadow's policy returned a verdict: note the detection in ``state.found``; a HALT
    latches (the first one) and takes the run out of ``state.active`` for the calls after this."""
    if not isinstance(verdict, Verdict):
        return
    if verdict.event is not None:
        run.ledger.note_detection()
        state.found.append((run.policy.name, verdict.event))
    if verdict.action is _HALT and run.halt is None:
        run.halt = verdict
        state.drop_halted()


def _give_up(state: TurnShadows, exc: Exception) -> None:
    """Something outside the policies failed: stop evaluating shadows for this turn (logged)."""
    log.error("turnguard shadow plugin failed; shadows stop for this turn: %r", exc, exc_info=exc)
    state.active = ()


def _reason(run: ShadowRun, live: TurnSummary) -> str:
    if run.halt is not None:
        return "halted"
    return "live_halted" if live.reason == "halted" else live.reason


def _call_each(observers: tuple[Any, ...], **kwargs: Any) -> None:
    """Each reporting observer in isolation: a broken one must not stop the others or the host."""
    for plugin_name, fn, argnames in observers:
        try:
            fn(**{n: kwargs[n] for n in argnames})
        except Exception as exc:
            log.error("turnguard plugin %r raised in a shadow report: %r", plugin_name, exc, exc_info=exc)


def plugin_for(config: GuardConfig, **_providers: Any) -> ShadowPlugin | None:
    """The shadow plugin for ``config``, or ``None`` when it has no shadow policies."""
    if not config.shadow:
        return None
    return ShadowPlugin(config)
