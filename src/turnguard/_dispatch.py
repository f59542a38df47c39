"""One plugin manager's hooks, compiled once: the only place that calls turnguard's plugins.

A ``Dispatcher`` holds, for one ``pluggy.PluginManager``, each check hook's implementations in
call order (adapted to positional arguments), the hot-path observers, the keyword observers
(looked up once), the fail mode, and the ``combine`` rule. ``Turn``, the shadow policies
(``turnguard._shadow``), durable turns' snapshots (``turnguard._snapshot``) and ``turnguard
calibrate``'s replay all call plugins through its loops, one per way of calling (the hooks' arity,
and whether their answers count): ``collect0``/``collect1``/``collect2`` for the check hooks,
``notify2``/``notify3`` for the hot-path observers, ``call_each`` for every hook called by keyword
(``notify``). No other module loops over plugins (``tests/test_plugin_loops.py``). So a plugin
that raises gets one treatment everywhere (``Dispatcher.failed``):

- it is logged (the exception type and the plugin name; its text, which can hold tool
  arguments, only with ``capture_content``) and reported through ``turnguard_plugin_error``
  (a reporter that raises is only logged: the failure it reported decides);
- under ``fail_mode="open"`` nothing else happens; under ``"closed"`` it stands for a HALT
  naming the plugin and the hook, threshold ``plugin_error``: among a check's answers, or, from
  an observer, the HALT the caller latches (the host call it failed on halts);
- any ``BaseException`` but ``KeyboardInterrupt``/``SystemExit`` (which propagate) counts.

Which ``turn`` a plugin receives: the built-in policy modules (``plugins.DEFAULT_PLUGINS``) get
the ``Ledger`` itself (they read its fields on the hot path); every other plugin gets its
read-only ``LedgerView``, in its hooks and its ``quiet_rule`` alike. ``Dispatcher.bind`` makes
the per-turn ``BoundImpl`` tuples (plugin name, function, turn argument) that the loops take.

Where a plugin says its hooks cannot fire (``quiet_rule``, ``turnguard._firing.Quiet``),
``Dispatcher.quiet`` gives the ``QuietRegion`` that the turn driver (``turnguard._driver``) tests on
every call before calling anything: most calls of most turns call no policy at all.

Typical use::

    dispatcher = Dispatcher(pm, fail_mode=config.fail_mode, log_errors=False)
    checks = dispatcher.bind(ledger)              # BoundChecks: .cycle, .call, .outcome
    ledger.count_call(digest, call.name)
    verdict, events = dispatcher.decide("turnguard_check_call", checks.call, (call,), ledger)

``Turn``, the shadows and calibrate's replay take these steps through a ``turnguard._driver.Driver``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import pluggy

from turnguard._firing import NEVER, Quiet
from turnguard._ledger import Ledger, LedgerView
from turnguard._model import ALLOW, PLUGIN_ERROR_THRESHOLD, Action, Level, LoopDetectedEvent, Threshold, Verdict
from turnguard._plugins import DEFAULT_PLUGINS, PASSTHROUGH

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
PLUGIN_ERROR = "turnguard_plugin_error"
"""The hook that hears of every failure (but its own)."""

QUIET_RULE = "quiet_rule"
"""What ``turnguard_plugin_error`` names as the hook when a plugin's ``quiet_rule`` failed."""

QuietRule = Callable[[Any], Quiet]
"""A plugin's ``quiet_rule`` (``turnguard._firing.Quiet``): given the ``Ledger`` (a built-in
policy module) or the turn's ``LedgerView`` (any other plugin)."""


class Impl(NamedTuple):
    """One implementation of a positionally called hook, compiled once per dispatcher."""

    plugin: str
    fn: Callable[..., Any]
    """Takes the hook's arguments positionally, in ``CHECK_HOOKS``/``HOT_OBSERVERS`` order."""
    trusted: bool
    """Whether it gets the ledger itself (a built-in policy module) rather than the turn's view."""
    quiet_rule: QuietRule | None
    """The plugin's ``quiet_rule``, or ``None``."""


class BoundImpl(NamedTuple):
    """An ``Impl`` for one turn: what the loops call, as ``fn(turn, ...)``."""

    plugin: str
    fn: Callable[..., Any]
    turn: Any
    """The ``Ledger`` (trusted) or its ``LedgerView``."""


Bound = tuple[BoundImpl, ...]
"""A hook's implementations for one turn, in call order."""


class Observer(NamedTuple):
    """One implementation of a hook called by keyword."""

    plugin: str
    fn: Callable[..., Any]
    argnames: tuple[str, ...]
    """The hook's arguments it accepts (pluggy matches them by name)."""


Found = tuple[tuple[str, Any], ...]
"""A check's answers that were not ``None``: (plugin name, answer), in hook order."""
_POLICY_MODULES = frozenset(DEFAULT_PLUGINS.values())


class QuietRegion:
    """Where one turn's check hooks may be skipped (``turnguard._firing.Quiet``): while the
    ledger's ``tool_calls <= calls``, ``streak_length < streak`` and ``max_key_repeat < repeat``, a
    check calls only ``call`` (the hooks without a rule); while ``stop_count < stop_count``, an
    outcome calls only ``outcome``. The turn driver tests the counts (``Driver.call``,
    ``Driver.outcome``) and calls ``reasked`` when a check lies outside the region."""

    __slots__ = ("_dispatcher", "_ledger", "_reask", "_report", "_view", "call", "calls", "outcome", "repeat",
                 "stop_count", "streak")

    def __init__(self, dispatcher: Dispatcher, ledger: Ledger, view: LedgerView,
                 report: LedgerView | None = None) -> None:
        self._dispatcher, self._ledger, self._view, self._report = dispatcher, ledger, view, report
        self.ask()

    def ask(self) -> None:
        """Each plugin's ``quiet_rule(turn)``, asked once however many check hooks it has (by
        plugin name: a manager's names are unique), with the turn its hooks get, and combined
        (the least of each count); a rule that fails or answers something else than a ``Quiet``
        counts as none (its plugin is called on every check: ``Dispatcher.quiet_of``)."""
        d, ledger, view = self._dispatcher, self._ledger, self._view
        said: dict[str, Quiet | None] = {}
        for impl in (*d.check_call, *d.check_outcome):
            if impl.quiet_rule is not None and impl.plugin not in said:
                said[impl.plugin] = d.quiet_of(impl, ledger if impl.trusted else view, self._report)
        on_call = [said.get(impl.plugin) for impl in d.check_call]
        on_outcome = [said.get(impl.plugin) for impl in d.check_outcome]
        quiet_call = [q for q in on_call if q is not None]
        self.calls = min((q.calls for q in quiet_call), default=NEVER)
        self.streak = min((q.streak for q in quiet_call), default=NEVER)
        self.repeat = min((q.repeat for q in quiet_call), default=NEVER)
        self.stop_count = min((q.stop_count for q in on_outcome if q is not None), default=NEVER)
        awake_call = tuple(impl for impl, q in zip(d.check_call, on_call, strict=True) if q is None)
        awake_outcome = tuple(impl for impl, q in zip(d.check_outcome, on_outcome, strict=True) if q is None)
        self.call = d.bound(awake_call, ledger, self._view)
        self.outcome = d.bound(awake_outcome, ledger, self._view)
        self._reask = self.calls >= ledger.tool_calls
        """Ask again once ``tool_calls`` passes ``calls``; not when the region just named lies
        behind the turn already (it would be asked on every call)."""

    def reasked(self) -> bool:
        """A check outside the region: past its ``calls``, the rules are asked again (once per
        region they name). Whether the region they name holds the check's counts: the check then
        calls only ``call``, else every hook. The first test is the driver's (``Driver.call``)."""
        ledger = self._ledger
        if ledger.tool_calls <= self.calls or not self._reask:
            return False
        self.ask()
        return (ledger.tool_calls <= self.calls and ledger.streak_length < self.streak
                and ledger.max_key_repeat < self.repeat)


class BoundChecks(NamedTuple):
    """One turn's check hooks, in call order."""

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
        impls.append(Impl(impl.plugin_name, fn, is_policy_module(impl.plugin), _rule_of(impl.plugin_name, impl.plugin)))
    return tuple(impls)


def _rule_of(name: str, plugin: object) -> QuietRule | None:
    """``plugin``'s ``quiet_rule``, or ``None``: none, or one that cannot be looked up (a
    ``__getattr__`` that raises: logged, and the plugin called on every check)."""
    try:
        rule = getattr(plugin, QUIET_RULE, None)
    except PASSTHROUGH:
        raise
    except BaseException as exc:  # a plugin's own attribute lookup
        log.error(describe_error(name, QUIET_RULE, exc, capture_content=False))
        return None
    return rule if callable(rule) else None


def _adapter(fn: Callable[..., Any], index: tuple[int, ...]) -> Callable[..., Any]:
    return lambda *args: fn(*(args[i] for i in index))


def observer_impls(pm: pluggy.PluginManager, hook: str, plugin: object | None = None) -> tuple[Observer, ...]:
    """A keyword-called hook's implementations in call order (only ``plugin``'s, when given)."""
    impls = reversed(getattr(pm.hook, hook).get_hookimpls())
    return tuple(Observer(impl.plugin_name, impl.function, tuple(impl.argnames)) for impl in impls
                 if plugin is None or impl.plugin is plugin)


def describe_error(plugin: str, hook: str, exc: BaseException, capture_content: bool) -> str:
    """What the logs say about a plugin that raised: its text only with ``capture_content`` (it
    can hold tool arguments)."""
    if capture_content:
        try:
            return f"turnguard plugin {plugin!r} raised in {hook}: {exc!r}"
        except PASSTHROUGH:
            raise
        except BaseException:  # (an exception whose repr raises: its type is what can be said)
            pass
    return f"turnguard plugin {plugin!r} raised {type(exc).__qualname__} in {hook}"


class Dispatcher:
    """A plugin manager's hooks compiled once (see the module docstring).

    ``label`` names the caller in logs (e.g. a shadow policy); ``log_errors=False`` keeps
    replays quiet (they report through ``failed``'s stand-in only)."""

    __slots__ = ("_observers", "call_observers", "capture_content", "check_call", "check_cycle",
                 "check_outcome", "fail_closed", "label", "log_errors", "outcome_observers", "pm", "policies")

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
        self.policies = frozenset(impl.plugin for impls in (self.check_cycle, self.check_call, self.check_outcome)
                                  for impl in impls if impl.trusted)
        """The names of the built-in policy modules among the check hooks (a manager's names are
        unique): their answers are turnguard's own, taken as they are (``combine``)."""
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
        """``impls`` for one turn: each with the ledger (trusted) or ``view``."""
        return tuple(BoundImpl(impl.plugin, impl.fn, ledger if impl.trusted else view) for impl in impls)

    def quiet(self, ledger: Ledger, view: LedgerView | None = None, report: LedgerView | None = None) -> QuietRegion:
        """Where ``ledger``'s turn may skip hooks (``QuietRegion``); ``report``: the turn a failing
        rule is reported with (as the loops' ``report``)."""
        return QuietRegion(self, ledger, view if view is not None else LedgerView(ledger), report)

    def quiet_of(self, impl: Impl, turn: Ledger | LedgerView, report: LedgerView | None) -> Quiet | None:
        """``impl``'s plugin's ``quiet_rule(turn)``: the region it names, or ``None`` (its plugin is
        then called on every check). A rule that raises or answers something else than ``None``
        or a ``Quiet`` of numbers is a plugin error (``failed``, hook ``quiet_rule``) that never
        halts: it only costs speed. A third-party rule's region is copied into plain numbers, so
        that no comparison of the quiet test runs a plugin's code."""
        rule = impl.quiet_rule
        assert rule is not None
        try:
            said = rule(turn)
            if impl.trusted or said is None:
                return said if isinstance(said, Quiet) else None
            return plain_quiet(said)
        except PASSTHROUGH:
            raise
        except BaseException as exc:  # a broken rule only costs speed: its plugin is called every time
            self.failed(impl.plugin, QUIET_RULE, exc, report)
            return None

    def observers(self, hook: str) -> tuple[Observer, ...]:
        """A keyword-called hook's implementations, looked up once."""
        impls = self._observers.get(hook)
        if impls is None:
            impls = self._observers[hook] = observer_impls(self.pm, hook)
        return impls

    # -- the plugin loops -----------------------------------------------------------------------
    # One per arity: a fixed number of arguments costs no tuple per call (the hot path runs
    # these on every call a plugin is awake for). ``report``: the turn to name in
    # ``turnguard_plugin_error`` (``None``: none, e.g. a shadow's own policies).

    def collect0(self, hook: str, impls: Bound, report: LedgerView | None) -> Found:
        """Call each check implementation as ``fn(turn)`` in isolation: the answers that were not
        ``None`` (a failure's stand-in included, ``failed``), in hook order."""
        found: Found = ()
        for plugin, fn, turn in impls:
            try:
                answer = fn(turn)
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # isolate every plugin
                answer = self.failed(plugin, hook, exc, report)
            if answer is not None:
                found += ((plugin, answer),)
        return found

    def collect1(self, hook: str, impls: Bound, report: LedgerView | None, a: Any) -> Found:
        """``collect0`` for a check hook of one more argument: ``fn(turn, a)``."""
        found: Found = ()
        for plugin, fn, turn in impls:
            try:
                answer = fn(turn, a)
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # isolate every plugin
                answer = self.failed(plugin, hook, exc, report)
            if answer is not None:
                found += ((plugin, answer),)
        return found

    def collect2(self, hook: str, impls: Bound, report: LedgerView | None, a: Any, b: Any) -> Found:
        """``collect0`` for a check hook of two more arguments: ``fn(turn, a, b)``."""
        found: Found = ()
        for plugin, fn, turn in impls:
            try:
                answer = fn(turn, a, b)
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # isolate every plugin
                answer = self.failed(plugin, hook, exc, report)
            if answer is not None:
                found += ((plugin, answer),)
        return found

    def notify2(self, hook: str, impls: Bound, report: LedgerView | None, a: Any, b: Any) -> Verdict | None:
        """Call each observer as ``fn(turn, a, b)`` in isolation (what it returns is ignored): the
        first failure's stand-in (``failed``: a HALT under ``fail_mode="closed"``), else ``None``."""
        failure = None
        for plugin, fn, turn in impls:
            try:
                fn(turn, a, b)
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # observers never break the host
                stand_in = self.failed(plugin, hook, exc, report)
                failure = stand_in if failure is None else failure
        return failure

    def notify3(self, hook: str, impls: Bound, report: LedgerView | None, a: Any, b: Any, c: Any) -> Verdict | None:
        """``notify2`` for an observer of one more argument: ``fn(turn, a, b, c)``."""
        failure = None
        for plugin, fn, turn in impls:
            try:
                fn(turn, a, b, c)
            except PASSTHROUGH:
                raise
            except BaseException as exc:  # observers never break the host
                stand_in = self.failed(plugin, hook, exc, report)
                failure = stand_in if failure is None else failure
        return failure

    def call_each(self, hook: str, observers: Sequence[Observer], report: LedgerView | None,
                  kwargs: Mapping[str, Any], *, own: Mapping[str, Mapping[str, Any]] | None = None,
                  refusals: tuple[type[BaseException], ...] = ()) -> tuple[dict[str, Any], Verdict | None]:
        """Call each implementation of a keyword hook in isolation, with the ``kwargs`` it accepts:
        (the answers that were not ``None``, by plugin name; the first failure's stand-in, as
        ``notify2``). ``own``: arguments whose value is each plugin's own (argument name -> plugin
        name -> value; ``None`` for a plugin it does not name). ``refusals``: exceptions a plugin
        raises to refuse (``turnguard.SnapshotError`` at a resume): they propagate."""
        passthrough: tuple[type[BaseException], ...] = (*PASSTHROUGH, *refusals) if refusals else PASSTHROUGH
        answers: dict[str, Any] = {}
        failure = None
        for observer in observers:
            values = kwargs if own is None else {**kwargs, **{n: v.get(observer.plugin) for n, v in own.items()}}
            try:
                answer = observer.fn(**{n: values[n] for n in observer.argnames})
            except passthrough:
                raise
            except BaseException as exc:  # observers never break the host
                stand_in = self.failed(observer.plugin, hook, exc, report)
                failure = stand_in if failure is None else failure
                continue
            if answer is not None:
                answers[observer.plugin] = answer
        return answers, failure

    def notify(self, hook: str, report: LedgerView | None = None, **kwargs: Any) -> Verdict | None:
        """Call a keyword observer hook, each implementation isolated: the first failure's
        stand-in (a HALT under ``fail_mode="closed"``), else ``None``. What the stand-in does
        (halt the call it failed on) is the caller's."""
        observers = self.observers(hook)
        return self.call_each(hook, observers, report, kwargs)[1] if observers else None

    # -- deciding -----------------------------------------------------------------------------

    def decide(self, hook: str, impls: Bound, args: tuple[Any, ...], ledger: Ledger,
               report: LedgerView | None = None) -> tuple[Verdict | None, list[LoopDetectedEvent]]:
        """Call each implementation as ``fn(turn, *args)`` (``collect0``..``collect2``) and
        ``combine`` what they returned: (the winner or ``None``, every event). ``report``: the
        turn to name in ``turnguard_plugin_error`` (``None``: failures are only logged). Callers
        on the hot path (``Turn.check_call``) call ``collect1`` and ``combine`` themselves."""
        if not args:
            found = self.collect0(hook, impls, report)
        elif len(args) == 1:
            found = self.collect1(hook, impls, report, args[0])
        else:
            found = self.collect2(hook, impls, report, *args)
        if not found:
            return None, []
        return self.combine(hook, found, ledger, report)

    def combine(self, hook: str, found: Found, ledger: Ledger,
                report: LedgerView | None = None) -> tuple[Verdict | None, list[LoopDetectedEvent]]:
        """The combining rule over the (plugin name, answer) pairs of one check, in hook order: the most
        severe verdict wins; ties go to the first, except that a detection beats a bare verdict
        (its threshold and event must show). A built-in policy's answer is taken as it is; any
        other plugin's is read once into a plain ``Verdict`` (``plain_verdict``), and one that is
        not a well-formed ``Verdict`` is a plugin error. Each detection is noted in the ledger,
        but only a built-in policy's marks a built-in threshold's level as fired in the streak (a
        plugin's detection named like one must not keep the built-in from firing). Returns the
        winner (``None`` when nothing stands) and every event, in hook order."""
        best: Verdict | None = None
        events: list[LoopDetectedEvent] = []
        policies = self.policies
        for name, answer in found:
            if name in policies:
                verdict, noted = answer, answer.event
            else:
                try:
                    verdict = answer if answer is ALLOW else plain_verdict(answer)
                except PASSTHROUGH:
                    raise
                except BaseException as exc:  # a malformed answer, or one whose reading raised
                    verdict = self.failed(name, hook, exc, report)
                    if verdict is None:
                        continue
                noted = verdict.event
                if noted is not None and noted.threshold in BUILT_IN_THRESHOLDS:
                    noted = None
            if verdict.event is not None:
                events.append(verdict.event)
                ledger.note_detection(noted)
            if (
                best is None
                or verdict.action > best.action
                or (verdict.action == best.action and best.event is None and verdict.event is not None)
            ):
                best = verdict
        return best, events

    # -- failures -----------------------------------------------------------------------------

    def failed(self, name: str, hook: str, exc: BaseException, report: LedgerView | None = None) -> Verdict | None:
        """The one treatment of a plugin that raised (or answered something else than a verdict)
        in ``hook``: logged, reported through ``turnguard_plugin_error``, and replaced by what
        ``fail_mode`` says: ``None`` (open) or a HALT naming the plugin and the hook, with the
        threshold ``PLUGIN_ERROR_THRESHOLD`` (closed).
        A ``turnguard_plugin_error`` implementation that raises is only logged (``None``): the
        failure it was told of decides."""
        if self.log_errors:
            text = describe_error(name, hook, exc, self.capture_content)
            if self.label:
                text = f"{text} ({self.label})"
            log.error(text, exc_info=exc if self.capture_content else None)
        if hook == PLUGIN_ERROR:
            return None
        self.call_each(PLUGIN_ERROR, self.observers(PLUGIN_ERROR), report,
                       {"turn": report, "plugin": name, "hook": hook, "error": exc})
        if self.fail_closed:
            return Verdict(Action.HALT, PLUGIN_ERROR_THRESHOLD,
                           f"turnguard: plugin {name!r} failed in {hook} (fail_mode=closed)")
        return None


BUILT_IN_THRESHOLDS = frozenset(t.value for t in Threshold)
"""The built-in policies' thresholds (a ``StrEnum``: equal to their names as plain text)."""
_TEXT_FIELDS = ("threshold", "level", "turn_id", "event_id", "cap_mode", "message")
_OPTIONAL_TEXT_FIELDS = ("tool_name", "key_digest", "conversation_id", "agent_name")
_COUNT_FIELDS = ("limit", "tool_calls", "cycles", "max_key_repeat", "streak_length", "failing_streak_length")
_OPTIONAL_COUNT_FIELDS = ("soft_cap", "hard_cap")
_PLAIN: dict[type, tuple[type, ...]] = {str: (str, Threshold, Level), int: (int,)}


def plain_verdict(answer: object) -> Verdict:
    """A plugin's check answer, each field read once, as a ``Verdict`` of plain values: the
    answer itself when it is one, else a copy (a subclass's text or count copied as ``str`` or
    ``int``: no plugin code runs when the guard, the host or telemetry reads it later).
    ``TypeError`` for anything but a ``Verdict`` with an ``Action``, a text or no threshold, a
    text message, and no event or a ``LoopDetectedEvent`` of plain fields."""
    if not isinstance(answer, Verdict):
        raise TypeError(f"a check hook must return a turnguard.Verdict or None; got {type(answer).__name__}")
    action, threshold, message, event = answer.action, answer.threshold, answer.message, answer.event
    if type(action) is not Action:
        raise TypeError(f"a check hook's Verdict must hold a turnguard.Action; got {type(action).__name__}")
    plain = (_plain(threshold, "threshold", str, optional=True), _plain(message, "message", str),
             None if event is None else plain_event(event))
    if type(answer) is Verdict and all(a is b for a, b in zip(plain, (threshold, message, event), strict=True)):
        return answer
    return Verdict(action, *plain)


def plain_event(event: object) -> LoopDetectedEvent:
    """A plugin's ``LoopDetectedEvent`` of plain values (``plain_verdict``)."""
    if not isinstance(event, LoopDetectedEvent):
        raise TypeError(f"a Verdict's event must be a turnguard.LoopDetectedEvent or None; got {type(event).__name__}")
    values = {name: getattr(event, name) for name in LoopDetectedEvent.__slots__}
    if type(values["action"]) is not Action or type(values["promptable"]) is not bool:
        raise TypeError("a LoopDetectedEvent must hold a turnguard.Action and a bool promptable")
    plain = {name: _plain(values[name], name, kind, optional=optional)
             for names, kind, optional in ((_TEXT_FIELDS, str, False), (_OPTIONAL_TEXT_FIELDS, str, True),
                                           (_COUNT_FIELDS, int, False), (_OPTIONAL_COUNT_FIELDS, int, True))
             for name in names}
    if type(event) is LoopDetectedEvent and all(plain[name] is values[name] for name in plain):
        return event
    return LoopDetectedEvent(**{**values, **plain})


def _plain(value: Any, name: str, kind: type, *, optional: bool = False) -> Any:
    """``value`` as it is (a ``str``, ``Threshold`` or ``Level``; an ``int``), or a subclass's
    value copied as ``kind``; ``TypeError`` for anything else (``None`` where ``optional``)."""
    if (value is None and optional) or type(value) in _PLAIN[kind]:
        return value
    if kind is str and isinstance(value, str):
        return str.__str__(value)
    if kind is int and isinstance(value, int):
        return int.__int__(value)
    raise TypeError(f"{name} must be {'an int' if kind is int else 'a str'}; got {type(value).__name__}")


def plain_quiet(said: object) -> Quiet:
    """A plugin's ``Quiet`` with each count an exact ``int`` or ``float`` (a subclass's value
    copied: its comparisons are not turnguard's); ``TypeError`` for anything else."""
    if not isinstance(said, Quiet):
        raise TypeError(f"a quiet_rule must return a turnguard._firing.Quiet or None; got {type(said).__name__}")
    counts: list[float] = []
    for name in ("calls", "streak", "repeat", "stop_count"):
        value = getattr(said, name)
        if isinstance(value, int):
            counts.append(int.__int__(value))
        elif isinstance(value, float):
            counts.append(float.__float__(value))
        else:
            raise TypeError(f"Quiet.{name} must be a number; got {type(value).__name__}")
    return Quiet(*counts)


NOTHING: tuple[Verdict, tuple[()]] = (ALLOW, ())
"""What a check returns when no plugin had anything to say (shared, allocation-free)."""
