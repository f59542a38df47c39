"""``Guard`` and ``Turn``: the lifecycle a host drives, and how plugin verdicts are combined.

A ``Turn`` records facts in its ledger and asks the check hooks under one lock, so parallel tool
calls get exactly the verdicts a sequential run of the same sequence gets. Each plugin is called
in isolation: one that raises is reported (log + ``turnguard_plugin_error``) and ignored, or, with
``fail_mode="closed"``, halts the turn. The most severe verdict wins; ties go to the first
detection in hook order; a HALT latches until the turn ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pluggy

from turnguard.config import GuardConfig
from turnguard.keys import Keyer, store_key
from turnguard.ledger import Ledger
from turnguard.model import (
    ALLOW,
    Action,
    Answer,
    LoopDetected,
    LoopDetectedEvent,
    Outcome,
    ToolCall,
    TurnSummary,
    Verdict,
)
from turnguard.plugins import plugin_manager

log = logging.getLogger("turnguard")

Impl = tuple[str, Callable[..., Any]]
Observer = tuple[str, Callable[..., Any], tuple[str, ...]]
_HALT = Action.HALT
_NOTHING: tuple[Verdict, tuple[()]] = (ALLOW, ())
"""What ``_decide`` returns when no plugin had anything to say (shared, allocation-free)."""
_CHECK_HOOKS = {
    "turnguard_check_cycle": ("turn",),
    "turnguard_check_call": ("turn", "call"),
    "turnguard_check_outcome": ("turn", "call", "outcome"),
}


_HOT_OBSERVERS = {
    "turnguard_call_checked": ("turn", "call", "verdict"),
    "turnguard_outcome_recorded": ("turn", "call", "outcome", "verdict"),
}
"""Observer hooks of the hot path, called positionally like the check hooks (no keyword dicts)."""


def _compile(pm: pluggy.PluginManager, hook: str, order: tuple[str, ...], *, check: bool = True) -> tuple[Impl, ...]:
    """The hook's implementations in call order, each adapted to positional ``order`` args."""
    caller = getattr(pm.hook, hook)
    impls = []
    for impl in reversed(caller.get_hookimpls()):
        if check and (impl.hookwrapper or impl.wrapper):
            raise pluggy.PluginValidationError(
                impl.plugin, f"{impl.plugin_name}: wrappers are not supported on the check hook {hook}"
            )
        names = tuple(impl.argnames)
        fn = impl.function
        if names != order:
            index = tuple(order.index(n) for n in names)
            fn = _adapter(impl.function, index)
        impls.append((impl.plugin_name, fn))
    return tuple(impls)


def _adapter(fn: Callable[..., Any], index: tuple[int, ...]) -> Callable[..., Any]:
    return lambda *args: fn(*(args[i] for i in index))


def compiled_checks(pm: pluggy.PluginManager) -> dict[str, tuple[Impl, ...]]:
    """Each check hook's (plugin name, function) pairs in call order, taking positional
    arguments exactly as a ``Turn`` calls them; for tools that drive a ``Ledger`` and the
    policies directly (``turnguard calibrate`` replays recorded turns this way)."""
    return {hook: _compile(pm, hook, order) for hook, order in _CHECK_HOOKS.items()}


class Guard:
    """Holds the configuration, the key function and the plugin manager; opens turns.

    ``tracer_provider``/``meter_provider``/``logger_provider`` go to the OpenTelemetry plugin
    (the globals are used when omitted). Pass ``plugin_manager`` to use a manager you built
    (``turnguard.plugins.plugin_manager`` makes one); ``plugins`` are registered on top.
    """

    def __init__(
        self,
        config: GuardConfig | None = None,
        *,
        plugins: Mapping[str, object] | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        logger_provider: Any = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config if config is not None else GuardConfig()
        if not isinstance(self.config, GuardConfig):
            raise TypeError(f"config must be a turnguard.GuardConfig, got {type(self.config).__name__}")
        self.keyer = Keyer(self.config.key_mode, self.config.digest_key)
        providers = {
            "tracer_provider": tracer_provider,
            "meter_provider": meter_provider,
            "logger_provider": logger_provider,
        }
        self.pm = plugin_manager or _default_manager(self.config, providers, environ)
        for name, plugin in (plugins or {}).items():
            self.pm.register(plugin, name=name)
        if plugins:
            self.pm.check_pending()  # a plugin given in code with an unknown hook is a host error
        compiled_checks(self.pm)  # a wrapper on a check hook is refused here, not when a turn opens
        self._configure(self.pm.hook.turnguard_configure.get_hookimpls())

    def _configure(self, impls: Any) -> None:
        """``turnguard_configure`` for each implementation, isolated: a plugin that raises here is
        logged and reported, never fatal to ``Guard()`` (the hook is historic in spirit: plugins
        registered later through ``Guard.register`` get it too)."""
        for impl in reversed(impls):
            try:
                impl.function(**_pick(tuple(impl.argnames), config=self.config))
            except Exception as exc:  # a plugin's set-up must not break the host
                log.error("turnguard plugin %r raised in turnguard_configure: %r", impl.plugin_name, exc, exc_info=exc)
                reporters = _observer_impls(self.pm, "turnguard_plugin_error")
                _report_plugin_error(reporters, None, impl.plugin_name, "turnguard_configure", exc)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register a plugin (takes effect for turns opened afterwards); a plugin implementing a
        hook turnguard does not have, or wrapping a check hook, is refused with
        ``pluggy.PluginValidationError``."""
        registered = self.pm.register(plugin, name=name)
        try:
            self.pm.check_pending()
            compiled_checks(self.pm)
        except pluggy.PluginValidationError:
            self.pm.unregister(plugin)
            raise
        self._configure([i for i in self.pm.hook.turnguard_configure.get_hookimpls() if i.plugin is plugin])
        return registered

    def turn(
        self,
        *,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        promptable: bool = False,
        turn_id: str | None = None,
    ) -> Turn:
        """Open a turn; use it as a context manager (leaving the block ends it)."""
        return Turn(
            self, conversation_id=conversation_id, agent_name=agent_name, promptable=promptable, turn_id=turn_id
        )


def _default_manager(config: GuardConfig, providers: dict[str, Any], environ: Mapping[str, str] | None):
    return plugin_manager(config, providers=providers, environ=environ)


class Turn:
    """One agent turn. All methods are thread-safe and never raise because of tool arguments."""

    def __init__(
        self,
        guard: Guard,
        *,
        conversation_id: str | None,
        agent_name: str | None,
        promptable: bool,
        turn_id: str | None,
    ) -> None:
        self.guard = guard
        self.config = guard.config
        self.ledger = Ledger(
            guard.config, turn_id=turn_id, conversation_id=conversation_id, agent_name=agent_name, promptable=promptable
        )
        self._keyer = guard.keyer
        self._digest = guard.keyer.digest
        self._lock = threading.RLock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        self._halt: Verdict | None = None
        self._ended: TurnSummary | None = None
        self._fail_closed = guard.config.fail_mode == "closed"
        pm = guard.pm
        self._check_cycle = _compile(pm, "turnguard_check_cycle", _CHECK_HOOKS["turnguard_check_cycle"])
        self._check_call = _compile(pm, "turnguard_check_call", _CHECK_HOOKS["turnguard_check_call"])
        self._check_outcome = _compile(pm, "turnguard_check_outcome", _CHECK_HOOKS["turnguard_check_outcome"])
        self._observer_cache: dict[str, tuple[Observer, ...]] = {}
        self._observe_cycle = bool(self._observers("turnguard_cycle_checked"))
        self._call_observers = _compile(pm, "turnguard_call_checked", _HOT_OBSERVERS["turnguard_call_checked"],
                                        check=False)
        self._outcome_observers = _compile(
            pm, "turnguard_outcome_recorded", _HOT_OBSERVERS["turnguard_outcome_recorded"], check=False
        )
        self._observe_call = bool(self._call_observers)
        self._observe_outcome = bool(self._outcome_observers)
        self._count_call = self.ledger.count_call
        self._record_outcome = self.ledger.record_outcome
        self._notify("turnguard_turn_started", turn=self.ledger)

    # -- identity --------------------------------------------------------------------------

    @property
    def turn_id(self) -> str:
        return self.ledger.turn_id

    @property
    def promptable(self) -> bool:
        return self.ledger.promptable

    @property
    def halted(self) -> Verdict | None:
        """The latched HALT verdict, or ``None`` while the turn may go on."""
        return self._halt

    @property
    def summary(self) -> TurnSummary | None:
        """How the turn ended, once it has."""
        return self._ended

    # -- the host's calls --------------------------------------------------------------------

    def begin_cycle(self) -> Verdict:
        """Before each model request (a re-sent request counts again)."""
        with self._lock:
            if self._halt is not None:
                return self._halt
            self.ledger.begin_cycle()
            verdict, events = self._decide("turnguard_check_cycle", self._check_cycle, (self.ledger,))
        if events:
            self._after(events)
        if self._observe_cycle:
            self._notify("turnguard_cycle_checked", turn=self.ledger, verdict=verdict)
        return verdict

    # check_call and record_outcome are the hot path: the plugin loop is inlined (no per-call
    # argument tuple, no extra frame); anything but "every plugin returned None" goes to _combine.

    def check_call(self, call: ToolCall) -> Verdict:
        """Before executing ``call``: count it and decide. Do not execute it on HALT."""
        if type(call) is not ToolCall:
            _require_call(call)
        key = call._key
        if key is None or key[1] is not self._keyer:  # computed here, once; record_outcome reuses it
            key = (self._digest(call.name, call.args), self._keyer)
            store_key(call, key)
        ledger = self.ledger
        self._acquire()  # acquire/release bound once: cheaper than `with` on the hot path
        try:
            if self._halt is not None:
                return self._halt
            self._count_call(key[0], call.name)
            found = None
            for name, fn in self._check_call:
                try:
                    verdict = fn(ledger, call)
                except Exception as exc:  # isolate every plugin
                    verdict = self._plugin_failed(name, "turnguard_check_call", exc)
                if verdict is not None:
                    found = [(name, verdict)] if found is None else [*found, (name, verdict)]
            verdict, events = _NOTHING if found is None else self._combine("turnguard_check_call", found)
        finally:
            self._release()
        if events:
            self._after(events)
        if self._observe_call:
            for impl in self._call_observers:
                try:
                    impl[1](ledger, call, verdict)
                except Exception as exc:  # observers never break the host
                    self._observer_failed(impl[0], "turnguard_call_checked", exc)
        return verdict

    def record_outcome(self, call: ToolCall, outcome: Outcome | str) -> Verdict:
        """After executing ``call``: record how it went (``ok``/``error``/``denied``/``unknown``)."""
        if type(call) is not ToolCall:
            _require_call(call)
        if type(outcome) is not Outcome:
            outcome = Outcome.parse(outcome)
        key = call._key
        digest = key[0] if key is not None and key[1] is self._keyer else self._keyer.key_of(call)
        ledger = self.ledger
        self._acquire()
        try:
            self._record_outcome(digest, outcome)
            if self._halt is not None:
                verdict, events = self._halt, ()
            else:
                found = None
                for name, fn in self._check_outcome:
                    try:
                        verdict = fn(ledger, call, outcome)
                    except Exception as exc:  # isolate every plugin
                        verdict = self._plugin_failed(name, "turnguard_check_outcome", exc)
                    if verdict is not None:
                        found = [(name, verdict)] if found is None else [*found, (name, verdict)]
                verdict, events = _NOTHING if found is None else self._combine("turnguard_check_outcome", found)
        finally:
            self._release()
        if events:
            self._after(events)
        if self._observe_outcome:
            for impl in self._outcome_observers:
                try:
                    impl[1](ledger, call, outcome, verdict)
                except Exception as exc:  # observers never break the host
                    self._observer_failed(impl[0], "turnguard_outcome_recorded", exc)
        return verdict

    def retry(self) -> None:
        """The current model request is being re-sent: roll its calls back, clear repeats and streaks.

        Call ``begin_cycle()`` again before re-sending (the re-sent request counts as a cycle).
        """
        with self._lock:
            self.ledger.rollback_cycle()
        self._notify("turnguard_retry", turn=self.ledger)

    def resolve(self, event: LoopDetectedEvent | Verdict, answer: Answer | str) -> Verdict:
        """The user's answer to an ASK: ``continue`` or ``redirect`` reset the streak so it does
        not fire again on the next call; ``stop`` latches HALT. Every answer is reported."""
        if isinstance(event, Verdict):
            event = event.event
        if not isinstance(event, LoopDetectedEvent):
            raise TypeError("resolve() takes the LoopDetectedEvent (verdict.event) of the ASK being answered")
        try:
            answer = Answer(str(answer).lower())
        except ValueError:
            raise ValueError(f"unknown answer {answer!r}; pass one of 'continue', 'stop', 'redirect'") from None
        with self._lock:
            if answer is Answer.STOP:
                if self._halt is None:
                    self._halt = Verdict(Action.HALT, event.threshold, "turnguard: stopped by the user", event)
            else:
                self.ledger.reset_streak()
            verdict = self._halt or ALLOW
        self._notify("turnguard_escalation_resolved", turn=self.ledger, event=event, response=answer.value)
        return verdict

    def halt(self, verdict: Verdict, message: str | None = None) -> Verdict:
        """The host halts the turn itself on a detection (e.g. an ASK with nobody to ask):
        latch a HALT with the verdict's threshold and event, so later checks and the summary agree."""
        if not isinstance(verdict, Verdict):
            raise TypeError("halt() takes the turnguard.Verdict the host is acting on")
        with self._lock:
            if self._halt is None:
                self._halt = Verdict(Action.HALT, verdict.threshold, message or verdict.message, verdict.event)
            return self._halt

    def end(self, reason: str = "completed") -> TurnSummary:
        """Close the turn (idempotent); observers get a ``TurnSummary``."""
        with self._lock:
            if self._ended is not None:
                return self._ended
            if self._halt is not None and reason == "completed":
                reason = "halted"
            self._ended = summary = self.ledger.summary(reason=reason, halt=self._halt)
        self._notify("turnguard_turn_ended", turn=self.ledger, summary=summary)
        return summary

    def raise_for(self, verdict: Verdict) -> Verdict:
        """Raise ``LoopDetected`` on HALT; return the verdict otherwise (for hosts that abort by raising)."""
        if verdict.action is Action.HALT:
            raise LoopDetected(verdict)
        return verdict

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.end()
        elif isinstance(exc, LoopDetected):
            self.end("halted")
        else:
            self.end("error")

    # -- internals ---------------------------------------------------------------------------

    def _decide(
        self, hook: str, impls: tuple[Impl, ...], args: tuple[Any, ...]
    ) -> tuple[Verdict, tuple[LoopDetectedEvent, ...] | list[LoopDetectedEvent]]:
        """Call every implementation (under the lock) and combine what they returned."""
        found = None
        for name, fn in impls:
            try:
                verdict = fn(*args)
            except Exception as exc:  # isolate every plugin
                verdict = self._plugin_failed(name, hook, exc)
            if verdict is not None:
                found = [(name, verdict)] if found is None else [*found, (name, verdict)]
        return _NOTHING if found is None else self._combine(hook, found)

    def _combine(
        self, hook: str, found: list[tuple[str, Any]]
    ) -> tuple[Verdict, tuple[LoopDetectedEvent, ...] | list[LoopDetectedEvent]]:
        """``combine`` with this turn's error reporting; a HALT latches."""
        best, events = combine(found, self.ledger, lambda name, bad: self._plugin_failed(name, hook, bad))
        if best is None:
            return ALLOW, events
        if best.action is _HALT:
            self._halt = best
        return best, events

    def _plugin_failed(self, name: str, hook: str, exc: Exception) -> Verdict | None:
        log.error("turnguard plugin %r raised in %s: %r", name, hook, exc, exc_info=exc)
        self._report_error(name, hook, exc)
        if self._fail_closed:
            message = f"turnguard: plugin {name!r} failed in {hook} (fail_mode=closed): {exc!r}"
            return Verdict(Action.HALT, None, message)
        return None

    def _report_error(self, name: str, hook: str, exc: BaseException) -> None:
        _report_plugin_error(self._observers("turnguard_plugin_error"), self.ledger, name, hook, exc)

    def _after(self, events: Any) -> None:
        for event in events:
            self._notify("turnguard_loop_detected", turn=self.ledger, event=event)

    def _observers(self, hook: str) -> tuple[Observer, ...]:
        """An observer hook's implementations in call order, looked up once per turn."""
        impls = self._observer_cache.get(hook)
        if impls is None:
            impls = self._observer_cache[hook] = _observer_impls(self.guard.pm, hook)
        return impls

    def _notify(self, hook: str, **kwargs: Any) -> None:
        """Call an observer hook, each implementation isolated."""
        for plugin_name, fn, argnames in self._observers(hook):
            try:
                fn(**_pick(argnames, **kwargs))
            except Exception as exc:  # observers never break the host
                self._observer_failed(plugin_name, hook, exc)

    def _observer_failed(self, plugin_name: str, hook: str, exc: Exception) -> None:
        log.error("turnguard plugin %r raised in %s: %r", plugin_name, hook, exc, exc_info=exc)
        self._report_error(plugin_name, hook, exc)
        if self._fail_closed and hook != "turnguard_turn_ended":
            with self._lock:
                if self._halt is None:
                    message = f"turnguard: plugin {plugin_name!r} failed in {hook} (fail_mode=closed)"
                    self._halt = Verdict(Action.HALT, None, message)


def combine(
    found: list[tuple[str, Any]],
    ledger: Ledger,
    on_bad: Callable[[str, TypeError], Verdict | None],
) -> tuple[Verdict | None, list[LoopDetectedEvent]]:
    """DESIGN §3.5's rule over the (plugin name, answer) pairs of one check, in hook order: the
    most severe verdict wins; ties go to the first, except that a detection beats a bare verdict
    (its threshold and event must show). An answer that is not a ``Verdict`` with an ``Action``
    goes to ``on_bad``, which returns what stands in its place. Each detection is noted in the
    ledger; returns the winner (``None`` when nothing stands) and every event, in hook order.
    ``Turn`` and ``turnguard calibrate``'s replay both decide through it."""
    best: Verdict | None = None
    events: list[LoopDetectedEvent] = []
    for name, verdict in found:
        if not isinstance(verdict, Verdict) or type(verdict.action) is not Action:
            got = type(verdict.action if isinstance(verdict, Verdict) else verdict).__name__
            verdict = on_bad(name, TypeError(f"a check hook must return a turnguard.Verdict with a turnguard.Action, "
                                             f"or None; got {got}"))
            if verdict is None:
                continue
        if verdict.event is not None:
            events.append(verdict.event)
            ledger.note_detection()
        if (
            best is None
            or verdict.action > best.action
            or (verdict.action == best.action and best.event is None and verdict.event is not None)
        ):
            best = verdict
    return best, events


def _report_plugin_error(
    reporters: tuple[Observer, ...], turn: Ledger | None, plugin: str, hook: str, error: BaseException
) -> None:
    """``turnguard_plugin_error`` to each reporter, isolated (a failing reporter is only logged)."""
    for plugin_name, fn, argnames in reporters:
        try:
            fn(**_pick(argnames, turn=turn, plugin=plugin, hook=hook, error=error))
        except Exception:  # the error reporter itself must not break the host
            log.exception("turnguard plugin %r raised while reporting an error", plugin_name)


def _observer_impls(pm: pluggy.PluginManager, hook: str) -> tuple[Observer, ...]:
    impls = reversed(getattr(pm.hook, hook).get_hookimpls())
    return tuple((impl.plugin_name, impl.function, tuple(impl.argnames)) for impl in impls)


def _pick(names: tuple[str, ...], **kwargs: Any) -> dict[str, Any]:
    return {n: kwargs[n] for n in names}


def _require_call(call: Any) -> None:
    if not isinstance(call, ToolCall):
        raise TypeError(f"pass a turnguard.ToolCall(name, args), not {type(call).__name__}")
