"""One plugin manager's hooks, compiled once: the only place that calls turnguard's plugins.

A ``Dispatcher`` holds, for one ``pluggy.PluginManager``, each check hook's implementations in
call order (adapted to positional arguments), the hot-path observers, the keyword observers
(looked up once), the fail mode, and the ``combine`` rule. ``Turn``, the shadow
policies (``turnguard.shadow``) and ``turnguard calibrate``'s replay all call plugins through
it, so a plugin that raises gets one treatment everywhere:

- it is logged (the exception type and the plugin name; its text, which can hold tool
  arguments, only with ``capture_content``) and reported through ``turnguard_plugin_error``;
- under ``fail_mode="open"`` it is ignored, under ``"closed"`` it stands for a HALT
  (``Dispatcher.failed``);
- any ``BaseException`` but ``KeyboardInterrupt``/``SystemExit`` (which propagate) counts.

Which ``turn`` a plugin receives: the built-in policy modules (``plugins.DEFAULT_PLUGINS``) get
the ``Ledger`` itself (they read its fields on the hot path); every other plugin gets its
read-only ``LedgerView``. ``Dispatcher.bind`` makes the per-turn tuples of (plugin name,
function, turn argument) that the callers loop over.

Where a plugin says its hooks cannot fire (``quiet_rule``, ``turnguard.firing.Quiet``),
``Dispatcher.quiet`` gives the ``QuietRegion`` that ``Turn`` and the shadows test on every call
before calling anything: most calls of most turns call no policy at all.

Typical use (this is what ``calibrate.replay`` does)::

    dispatcher = Dispatcher(pm, fail_mode=config.fail_mode, log_errors=False)
    checks = dispatcher.bind(ledger)              # BoundChecks: .cycle, .call, .outcome
    ledger.count_call(digest, call.name)
    verdict, events = dispatcher.decide("turnguard_check_call", checks.call, (call,), ledger)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, NamedTuple

import pluggy

from turnguard.firing import NEVER, Quiet
from turnguard.ledger import Ledger, LedgerView
from turnguard.model import ALLOW, Action, LoopDetectedEvent, Verdict
from turnguard.plugins import DEFAULT_PLUGINS

log = logging.getLogger("turnguard")

CHECK_HOOKS: Mapping[str, tuple[str, ...]] = {
    "turnguard_check_cycle": ("turn",),
    "turnguard_check_call": ("turn", "call"),
    "turnguard_check_outcome": ("turn", "call", "outcome"),
}
"""The decision hooks and the positional order their implementations are called with."""
HOT_OBSERVERS: Mapping[str, tuple[str, ...]] = {
    "turnguard_call_checked": ("turn", "call", "verdict"),
    "turnguard_outcome_recorded": ("turn", "call", "outcome", "verdict"),
}
"""Observer hooks of the hot path, called positionally like the check hooks (no keyword dicts)."""
PASSTHROUGH = (KeyboardInterrupt, SystemExit)
"""What a plugin may raise through the guard; any other ``BaseException`` is a plugin error."""

QuietRule = Callable[[Ledger], Quiet]
"""A plugin's ``quiet_rule`` (``turnguard.firing.Quiet``)."""
Impl = tuple[str, Callable[..., Any], bool, QuietRule | None]
"""(plugin name, function taking the hook's positional arguments, gets the ledger itself, the
plugin's ``quiet_rule`` or ``None``)."""
Bound = tuple[tuple[str, Callable[..., Any], Any], ...]
"""A hook's implementations for one turn: (plugin name, function, the ``turn`` it receives)."""
Observer = tuple[str, Callable[..., Any], tuple[str, ...]]
"""(plugin name, function, the keyword arguments it accepts)."""
_POLICY_MODULES = frozenset(DEFAULT_PLUGINS.values())


class QuietRegion:
    """Where one turn's check hooks may be skipped (``turnguard.firing.Quiet``): while the
    ledger's ``tool_calls <= calls``, ``streak_length < streak`` and ``max_key_repeat < repeat``, a
    check calls only ``call`` (the hooks without a rule); while ``stop_count < stop_count``, an
    outcome calls only ``outcome``. The callers test the counts inline (they run on every call)
    and call ``asked_again`` when the first test fails."""

    __slots__ = ("_dispatcher", "_ledger", "_reask", "_view", "call", "calls", "outcome", "repeat", "stop_count",
                 "streak")

    def __init__(self, dispatcher: Dispatcher, ledger: Ledger, view: LedgerView) -> None:
        self._dispatcher, self._ledger, self._view = dispatcher, ledger, view
        self.ask()

    def ask(self) -> None:
        """Each plugin's ``quiet_rule(ledger)``, combined (the least of each count); a rule that
        fails or answers something else than a ``Quiet`` counts as none (its plugin is called on
        every check)."""
        d, ledger = self._dispatcher, self._ledger
        said: dict[QuietRule | None, Quiet | None] = {
            rule: _quiet_of(rule, ledger) for *_, rule in (*d.check_call, *d.check_outcome) if rule is not None
        }
        on_call = [said.get(impl[3]) for impl in d.check_call]
        on_outcome = [said.get(impl[3]) for impl in d.check_outcome]
        quiet_call = [q for q in on_call if q is not None]
        self.calls = min((q.calls for q in quiet_call), default=NEVER)
        self.streak = min((q.streak for q in quiet_call), default=NEVER)
        self.repeat = min((q.repeat for q in quiet_call), default=NEVER)
        self.stop_count = min((q.stop_count for q in on_outcome if q is not None), default=NEVER)
        awake_call = tuple(impl for impl, q in zip(d.check_call, on_call, strict=True) if q is None)
        awake_outcome = tuple(impl for impl, q in zip(d.check_outcome, on_outcome, strict=True) if q is None)
        self.call = d.bound(awake_call, ledger, self._view)
        self.outcome = d.bound(awake_outcome, ledger, self._view)
        self._reask = self.calls >= ledger._tool_calls
        """Ask again once ``tool_calls`` passes ``calls``; not when the region just named lies
        behind the turn already (it would be asked on every call)."""

    def holds(self) -> bool:
        """Whether the ledger's counts are inside the region for a check (the callers inline this)."""
        ledger = self._ledger
        return ledger._tool_calls <= self.calls and ledger._streak < self.streak and ledger._max_repeat < self.repeat

    def asked_again(self) -> bool:
        """A check outside the region: past its ``calls``, ask again (once per region). Whether
        the check is inside the region named now."""
        if self._ledger._tool_calls <= self.calls or not self._reask:
            return False
        self.ask()
        return self.holds()


class BoundChecks(NamedTuple):
    """One turn's check hooks: (plugin name, function, turn argument) in call order."""

    cycle: Bound
    call: Bound
    outcome: Bound


def is_policy_module(plugin: object) -> bool:
    """Whether ``plugin`` is one of turnguard's built-in policy modules (given the ledger itself)."""
    return isinstance(plugin, ModuleType) and plugin.__name__ in _POLICY_MODULES


def compile_hook(pm: pluggy.PluginManager, hook: str, order: tuple[str, ...], *, check: bool) -> tuple[Impl, ...]:
    """The hook's implementations in call order, each adapted to positional ``order`` arguments.
    A wrapper on a check hook is refused (``pluggy.PluginValidationError``): its verdicts are
    combined by turnguard, not by pluggy."""
    impls = []
    for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
        if check and (impl.hookwrapper or impl.wrapper):
            raise pluggy.PluginValidationError(
                impl.plugin, f"{impl.plugin_name}: wrappers are not supported on the check hook {hook}"
            )
        names = tuple(impl.argnames)
        fn = impl.function
        if names != order:
            fn = _adapter(fn, tuple(order.index(n) for n in names))
        rule = getattr(impl.plugin, "quiet_rule", None)
        impls.append((impl.plugin_name, fn, is_policy_module(impl.plugin), rule if callable(rule) else None))
    return tuple(impls)


def _adapter(fn: Callable[..., Any], index: tuple[int, ...]) -> Callable[..., Any]:
    return lambda *args: fn(*(args[i] for i in index))


def observer_impls(pm: pluggy.PluginManager, hook: str) -> tuple[Observer, ...]:
    """A keyword-called hook's implementations in call order."""
    impls = reversed(getattr(pm.hook, hook).get_hookimpls())
    return tuple((impl.plugin_name, impl.function, tuple(impl.argnames)) for impl in impls)


def describe_error(plugin: str, hook: str, exc: BaseException, capture_content: bool) -> str:
    """What the logs say about a plugin that raised: its text only with ``capture_content`` (it
    can hold tool arguments)."""
    if capture_content:
        return f"turnguard plugin {plugin!r} raised in {hook}: {exc!r}"
    return f"turnguard plugin {plugin!r} raised {type(exc).__qualname__} in {hook}"


class Dispatcher:
    """A plugin manager's hooks compiled once (see the module docstring).

    ``label`` names the caller in logs (e.g. a shadow policy); ``log_errors=False`` keeps
    replays quiet (they report through ``failed``'s stand-in only)."""

    __slots__ = ("_observers", "call_observers", "capture_content", "check_call", "check_cycle",
                 "check_outcome", "fail_closed", "label", "log_errors", "outcome_observers", "pm")

    def __init__(self, pm: pluggy.PluginManager, *, fail_mode: str = "open", capture_content: bool = False,
                 label: str = "", log_errors: bool = True) -> None:
        self.pm = pm
        self.check_cycle = compile_hook(pm, "turnguard_check_cycle", CHECK_HOOKS["turnguard_check_cycle"], check=True)
        self.check_call = compile_hook(pm, "turnguard_check_call", CHECK_HOOKS["turnguard_check_call"], check=True)
        self.check_outcome = compile_hook(
            pm, "turnguard_check_outcome", CHECK_HOOKS["turnguard_check_outcome"], check=True
        )
        self.call_observers = compile_hook(
            pm, "turnguard_call_checked", HOT_OBSERVERS["turnguard_call_checked"], check=False
        )
        self.outcome_observers = compile_hook(
            pm, "turnguard_outcome_recorded", HOT_OBSERVERS["turnguard_outcome_recorded"], check=False
        )
        self.fail_closed = fail_mode == "closed"
        self.capture_content = capture_content
        self.label = label
        self.log_errors = log_errors
        self._observers: dict[str, tuple[Observer, ...]] = {}

    # -- per turn -----------------------------------------------------------------------------

    def bind(self, ledger: Ledger, view: LedgerView | None = None) -> BoundChecks:
        """The check hooks for ``ledger``'s turn: policies get the ledger, others ``view`` (a new
        ``LedgerView`` of ``ledger`` when not given)."""
        view = view if view is not None else LedgerView(ledger)
        return BoundChecks(self.bound(self.check_cycle, ledger, view), self.bound(self.check_call, ledger, view),
                           self.bound(self.check_outcome, ledger, view))

    @staticmethod
    def bound(impls: tuple[Impl, ...], ledger: Ledger, view: LedgerView) -> Bound:
        """``impls`` for one turn: (plugin name, function, the ledger or ``view``)."""
        return tuple((name, fn, ledger if trusted else view) for name, fn, trusted, _ in impls)

    def quiet(self, ledger: Ledger, view: LedgerView | None = None) -> QuietRegion:
        """Where ``ledger``'s turn may skip hooks (``QuietRegion``)."""
        return QuietRegion(self, ledger, view if view is not None else LedgerView(ledger))

    def observers(self, hook: str) -> tuple[Observer, ...]:
        """A keyword-called hook's implementations, looked up once."""
        impls = self._observers.get(hook)
        if impls is None:
            impls = self._observers[hook] = observer_impls(self.pm, hook)
        return impls

    # -- deciding -----------------------------------------------------------------------------

    def decide(self, hook: str, impls: Bound, args: tuple[Any, ...], ledger: Ledger,
               report: LedgerView | None = None) -> tuple[Verdict | None, list[LoopDetectedEvent]]:
        """Call each implementation as ``fn(turn, *args)`` in isolation and ``combine`` what they
        returned: (the winner or ``None``, every event). ``report``: the turn to name in
        ``turnguard_plugin_error`` (``None``: failures are only logged). Callers on the hot path
        (``Turn.check_call``) inline ``collect`` and call ``combine`` themselves."""
        found = self.collect(hook, impls, args, report)
        if found is None:
            return None, []
        return self.combine(hook, found, ledger, report)

    def collect(self, hook: str, impls: Bound, args: tuple[Any, ...],
                report: LedgerView | None = None) -> list[tuple[str, Any]] | None:
        """Call each implementation as ``fn(turn, *args)`` in isolation: the (plugin name, answer)
        pairs that were not ``None``, in hook order, or ``None`` when every one was."""
        found = None
        for name, fn, turn in impls:
            try:
                verdict = fn(turn, *args)
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # isolate every plugin
                verdict = self.failed(name, hook, exc, report)
            if verdict is not None:
                found = [(name, verdict)] if found is None else [*found, (name, verdict)]
        return found

    def combine(self, hook: str, found: list[tuple[str, Any]], ledger: Ledger,
                report: LedgerView | None = None) -> tuple[Verdict | None, list[LoopDetectedEvent]]:
        """The combining rule over the (plugin name, answer) pairs of one check, in hook order: the most
        severe verdict wins; ties go to the first, except that a detection beats a bare verdict
        (its threshold and event must show). An answer that is not a ``Verdict`` with an
        ``Action`` is a plugin error. Each detection is noted in the ledger; returns the winner
        (``None`` when nothing stands) and every event, in hook order."""
        best: Verdict | None = None
        events: list[LoopDetectedEvent] = []
        for name, answer in found:
            verdict = answer
            if not isinstance(verdict, Verdict) or type(verdict.action) is not Action:
                got = type(verdict.action if isinstance(verdict, Verdict) else verdict).__name__
                bad = TypeError(f"a check hook must return a turnguard.Verdict with a turnguard.Action, or None; "
                                f"got {got}")
                verdict = self.failed(name, hook, bad, report)
                if verdict is None:
                    continue
            if verdict.event is not None:
                events.append(verdict.event)
                ledger.note_detection(verdict.event)
            if (
                best is None
                or verdict.action > best.action
                or (verdict.action == best.action and best.event is None and verdict.event is not None)
            ):
                best = verdict
        return best, events

    # -- failures -----------------------------------------------------------------------------

    def failed(self, name: str, hook: str, exc: BaseException, report: LedgerView | None = None) -> Verdict | None:
        """A plugin raised (or answered something else than a verdict) in ``hook``: logged,
        reported, and replaced by what ``fail_mode`` says: ``None`` (open) or a HALT (closed)."""
        self.report_error(name, hook, exc, report)
        if self.fail_closed:
            return Verdict(Action.HALT, None, f"turnguard: plugin {name!r} failed in {hook} (fail_mode=closed)")
        return None

    def report_error(self, name: str, hook: str, exc: BaseException, report: LedgerView | None = None) -> None:
        """Log a plugin's failure and tell the ``turnguard_plugin_error`` observers (each isolated;
        a failing reporter is only logged)."""
        if self.log_errors:
            text = describe_error(name, hook, exc, self.capture_content)
            if self.label:
                text = f"{text} ({self.label})"
            log.error(text, exc_info=exc if self.capture_content else None)
        for plugin_name, fn, argnames in self.observers("turnguard_plugin_error"):
            kwargs = {"turn": report, "plugin": name, "hook": hook, "error": exc}
            try:
                fn(**{n: kwargs[n] for n in argnames})
            except PASSTHROUGH:
                raise
            except BaseException as bad:  # the error reporter itself must not break the host
                log.error(describe_error(plugin_name, "turnguard_plugin_error", bad, self.capture_content))

    def notify(self, hook: str, report: LedgerView | None = None, **kwargs: Any) -> bool:
        """Call a keyword observer hook, each implementation isolated; ``True`` when one failed."""
        return self.notify_each(hook, self.observers(hook), report, kwargs)

    def notify_each(self, hook: str, observers: tuple[Observer, ...], report: LedgerView | None,
                    kwargs: Mapping[str, Any]) -> bool:
        """``notify`` for the given implementations of ``hook`` (a subset, or the ones of another
        moment): each isolated, a failure logged and reported; ``True`` when one failed. What a
        failure does beyond that (``fail_mode="closed"``: halt the call) is the caller's."""
        failed = False
        for plugin_name, fn, argnames in observers:
            try:
                fn(**{n: kwargs[n] for n in argnames})
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # observers never break the host
                self.report_error(plugin_name, hook, exc, report)
                failed = True
        return failed


def _quiet_of(rule: Callable[[Ledger], Quiet], ledger: Ledger) -> Quiet | None:
    try:
        said = rule(ledger)
    except Exception:  # a broken rule only costs speed: its plugin is called every time
        log.warning("turnguard: a quiet_rule raised; its plugin is called on every check", exc_info=True)
        return None
    return said if isinstance(said, Quiet) else None


NOTHING: tuple[Verdict, tuple[()]] = (ALLOW, ())
"""What a check returns when no plugin had anything to say (shared, allocation-free)."""
