"""What a plugin can reach and what its failures do: the read-only view, ``BaseException``s,
``fail_mode="closed"`` for every hook, and what the logs say."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass

import pytest

import turnguard as tg
from conftest import core_guard, distinct_call
from turnguard import hookspecs
from turnguard._keys import KEY_TOKEN
from turnguard._ledger import VIEW_FACTS, Ledger, LedgerView
from turnguard._plugins import NON_POLICY_PLUGINS


class Grabber:
    """Keeps the ``turn`` every hook receives."""

    def __init__(self) -> None:
        self.turns: list[object] = []

    @tg.hookimpl
    def turnguard_turn_started(self, turn):
        self.turns.append(turn)

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        self.turns.append(turn)

    @tg.hookimpl
    def turnguard_check_outcome(self, turn):
        self.turns.append(turn)

    @tg.hookimpl
    def turnguard_call_checked(self, turn):
        self.turns.append(turn)


@pytest.fixture
def view() -> LedgerView:
    grabber = Grabber()
    guard = core_guard()
    guard.register(grabber, name="grabber")
    turn = guard.turn()
    call = distinct_call(1)
    turn.check_call(call)
    turn.record_outcome(call, tg.Outcome.ERROR)
    assert len({id(t) for t in grabber.turns}) == 1  # one view per turn, the same object for every hook
    return grabber.turns[0]


def test_hooks_receive_a_read_only_view_with_the_facts(view):
    assert isinstance(view, LedgerView) and not isinstance(view, Ledger)
    assert (view.tool_calls, view.streak_length, view.failing_streak_length, view.outcomes("error")) == (1, 1, 1, 1)
    ledger = view_ledger(view)
    for name in VIEW_FACTS:
        assert getattr(view, name) == getattr(ledger, name)


def view_ledger(view: LedgerView) -> Ledger:
    """The ledger behind a view, the way only the guard can reach it (for comparing facts)."""
    from turnguard import _ledger as module

    return module._ledger_of(view)


@pytest.mark.parametrize("name", ["rollback_cycle", "reset_streak", "count_call", "record_outcome", "begin_cycle",
                                  "note_detection", "abandon", "fork", "_ledger", "_anything",
                                  *(name for cls in Ledger.__mro__ for name in getattr(cls, "__slots__", ())
                                    if name not in VIEW_FACTS)])
def test_no_mutator_or_private_field_is_reachable_through_the_view(view, name):
    if name == "__weakref__":
        return
    with pytest.raises(AttributeError):
        getattr(view, name)


@pytest.mark.parametrize("name", ["tool_calls", "_tool_calls", "_counts", "config", "anything", "_ledger"])
def test_nothing_can_be_set_on_the_view(view, name):
    with pytest.raises(AttributeError):
        setattr(view, name, 0)
    with pytest.raises((AttributeError, TypeError)):
        object.__setattr__(view, name, 0)
    assert view.tool_calls == 1


def test_a_view_cannot_be_rebound_to_another_ledger(view):
    with pytest.raises(TypeError):
        LedgerView.__init__(view, Ledger(tg.GuardConfig()))
    assert view.tool_calls == 1


def test_the_view_is_no_sandbox_the_garbage_collector_reaches_the_ledger(view):
    """What ``LedgerView``'s docstring says a plugin in the same process can do."""
    import gc

    assert [r for r in gc.get_referents(view) if isinstance(r, Ledger)] == [view_ledger(view)]


def test_a_plugin_cannot_disable_the_caps_through_what_it_receives():
    class Saboteur:
        @tg.hookimpl
        def turnguard_check_call(self, turn, call):
            for attempt in (lambda: turn.rollback_cycle(), lambda: turn.reset_streak(),
                            lambda: turn._counts.clear(), lambda: setattr(turn, "_tool_calls", 0),
                            lambda: call.key[KEY_TOKEN].reset_streak()):
                with contextlib.suppress(AttributeError, TypeError):
                    attempt()

    guard = core_guard(max_tool_calls_per_turn=3)
    guard.register(Saboteur(), name="saboteur")
    turn = guard.turn()
    verdicts = [turn.check_call(tg.ToolCall("bash", "make")) for _ in range(4)]
    assert [v.action for v in verdicts][-1] is tg.Action.HALT and turn.ledger.tool_calls == 4


# -- failures: every hook of hookspecs.py ------------------------------------------------------------

HOOKS = tuple(name for name, spec in vars(hookspecs).items() if hasattr(spec, f"{hookspecs.PROJECT_NAME}_spec"))
"""Every hook turnguard declares: the cases below are generated from it, so a new hook has a case
or fails ``test_every_hook_of_the_contract_has_a_case``."""

STEPS = ("begin_cycle", "check_call", "record_outcome", "record_outcome_again", "resolve", "check_after_retry",
         "check_after_resume")
"""``drive_every_hook``'s host calls that return a verdict, in order."""

HALTS_FROM: dict[str, str | None] = {
    "turnguard_configure": "begin_cycle",  # no call under way: every turn of the guard starts halted
    "turnguard_turn_started": "begin_cycle",
    "turnguard_check_cycle": "begin_cycle",
    "turnguard_cycle_checked": "begin_cycle",
    "turnguard_check_call": "check_call",
    "turnguard_call_checked": "check_call",
    "turnguard_loop_detected": "check_call",
    "turnguard_shadow_detected": "check_call",
    "turnguard_check_outcome": "record_outcome",
    "turnguard_outcome_recorded": "record_outcome",
    "turnguard_outcome_ignored": "record_outcome_again",
    "turnguard_escalation_resolved": "resolve",
    "turnguard_retry": "check_after_retry",
    "turnguard_turn_resumed": "check_after_resume",  # the plugin could not take its state back
    "turnguard_turn_snapshot": None,  # the snapshot goes on without that plugin's state
    "turnguard_turn_suspended": None,
    "turnguard_turn_ended": None,
    "turnguard_shadow_turn_ended": None,
    "turnguard_turn_result": None,
    "turnguard_plugin_error": None,
}
"""For each hook, the first host call that a failure there halts under ``fail_mode="closed"``;
``None``: the hook has no call to halt (the turn is over, or the failure being reported decides)."""

EVERY_HOOK_FIRES = {"disable_plugins": tuple(p for p in NON_POLICY_PLUGINS if p != "shadow"),
                    "load_entrypoints": False, "streak_warn_at": 1, "shadow": {"eager": {"streak_warn_at": 1}}}
"""Core policies and a shadow, both detecting on the first call: every hook fires in ``drive_every_hook``."""


class Raising:
    """Raises ``error`` in ``hook``."""

    def __init__(self, hook: str, error: BaseException) -> None:
        def impl():
            raise error

        setattr(self, hook, tg.hookimpl(impl))


class Errors:
    """What ``turnguard_plugin_error`` reported, and which hooks were called at all."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    @tg.hookimpl
    def turnguard_plugin_error(self, plugin, hook, error):
        self.seen.append((plugin, hook, type(error).__name__))


class Custom(BaseException):
    """Not an ``Exception``: a plugin raising it must not escape the guard either."""


@dataclass
class Run:
    verdicts: dict[str, tg.Verdict]
    summary: tg.TurnSummary
    accepted: bool

    def actions(self) -> list[tg.Action]:
        return [self.verdicts[step].action for step in STEPS]

    def facts(self) -> tuple[object, ...]:
        """What the host saw, apart from ids and times."""
        s = self.summary
        return ([(v.action, v.threshold) for v in self.verdicts.values()], s.reason, s.tool_calls, s.cycles,
                s.halted, self.accepted)


def drive_every_hook(fail_mode: str, plugins: dict[str, object], **options: object) -> Run:
    """A guard built with ``plugins`` and one turn that makes every hook fire: each host call
    once, a duplicate outcome, an answer, a retry, a suspension and a resume, the end and a late
    result."""
    guard = tg.Guard(tg.GuardConfig(**EVERY_HOOK_FIRES, fail_mode=fail_mode, **options), plugins=plugins, environ={})
    turn = guard.turn()
    verdicts = {"begin_cycle": turn.begin_cycle()}
    call = tg.ToolCall("bash", "make", call_id="t1")
    verdicts["check_call"] = turn.check_call(call)
    verdicts["record_outcome"] = turn.record_outcome(call, tg.Outcome.OK)
    verdicts["record_outcome_again"] = turn.record_outcome(call, tg.Outcome.OK)
    event = verdicts["check_call"].event or turn.view.detect("test", tg.Action.ASK, tg.Level.WARN, 1).event
    verdicts["resolve"] = turn.resolve(event, "continue")
    turn.retry()
    verdicts["check_after_retry"] = turn.check_call(tg.ToolCall("bash", "make test"))
    turn = guard.resume(turn.suspend())
    verdicts["check_after_resume"] = turn.check_call(tg.ToolCall("bash", "make lint"))
    summary = turn.end()
    return Run(verdicts, summary, guard.report_result(turn.turn_id, True))


def failing_in(hook: str, error: BaseException) -> dict[str, object]:
    """Plugins for a failure in ``hook``: the raising plugin (and, for ``turnguard_plugin_error``,
    a plugin failing where no call halts, so that there is an error to report)."""
    plugins: dict[str, object] = {"errors": Errors(), "raising": Raising(hook, error)}
    if hook == "turnguard_plugin_error":
        plugins["trigger"] = Raising("turnguard_turn_ended", RuntimeError("trigger"))
    return plugins


@pytest.fixture(scope="module")
def undisturbed() -> dict[str, Run]:
    """What the host sees without a failing plugin, under each fail mode."""
    return {mode: drive_every_hook(mode, {}) for mode in ("open", "closed")}


def test_every_hook_of_the_contract_has_a_case():
    assert set(HALTS_FROM) == set(HOOKS) and len(HOOKS) == 20


def test_the_driver_makes_every_hook_fire():
    heard: list[str] = []

    class Everything:
        pass

    for hook in HOOKS:
        def impl(*, _hook=hook):
            heard.append(_hook)

        setattr(Everything, hook, staticmethod(tg.hookimpl(specname=hook)(impl)))
    drive_every_hook("open", {"everything": Everything(), "trigger": Raising("turnguard_turn_ended", RuntimeError())})
    assert set(heard) == set(HOOKS)


ERRORS = [RuntimeError("bug"), Custom("odd"), GeneratorExit()]


def _cycle() -> list[object]:
    loop: list[object] = []
    loop.append(loop)
    return loop


NOT_JSON = {"object": object, "set": lambda: {1, 2}, "tuple_keys": lambda: {(1, 2): 3}, "nan": lambda: float("nan"),
            "bytes": lambda: b"x", "cycle": _cycle, "nested_object": lambda: {"a": [1, {"b": object()}]}}


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
@pytest.mark.parametrize("kind", list(NOT_JSON))
def test_a_plugin_state_that_is_not_json_is_reported_and_left_out_of_the_snapshot(kind, fail_mode):
    class Keeper:
        @tg.hookimpl
        def turnguard_turn_snapshot(self, turn):
            return NOT_JSON[kind]()

    class Fine:
        @tg.hookimpl
        def turnguard_turn_snapshot(self, turn):
            return {"kept": [1, "two"]}

    errors = Errors()
    guard = tg.Guard(tg.GuardConfig(**EVERY_HOOK_FIRES, fail_mode=fail_mode),
                     plugins={"keeper": Keeper(), "fine": Fine(), "errors": errors}, environ={})
    turn = guard.turn(durable=True)
    call = tg.ToolCall("bash", "make")
    turn.check_call(call)
    turn.record_outcome(call, tg.Outcome.OK)
    snapshot = json.loads(json.dumps(turn.suspend(), allow_nan=False))
    assert "keeper" not in snapshot["plugins"] and snapshot["plugins"]["fine"] == {"kept": [1, "two"]}
    assert ("keeper", "turnguard_turn_snapshot", "TypeError") in errors.seen
    assert guard.resume(snapshot).halted is None


class Unprintable(Exception):
    """An exception whose text cannot be had: its ``repr`` and ``str`` raise (``raised``)."""

    def __init__(self, raised: type[BaseException] = RuntimeError) -> None:
        self.raised = raised

    def __repr__(self) -> str:
        raise self.raised("repr of the plugin's exception")

    def __str__(self) -> str:
        raise self.raised("str of the plugin's exception")


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("raised", [RuntimeError, Custom, GeneratorExit])
def test_an_exception_whose_text_cannot_be_had_is_reported_by_its_type_with_content_captured(hook, raised,
                                                                                           undisturbed, caplog):
    plugins = failing_in(hook, Unprintable(raised))
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        run = drive_every_hook("open", plugins, capture_content=True)
    assert run.facts() == undisturbed["open"].facts()
    assert f"'raising' raised Unprintable in {hook}" in caplog.text


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_failing_open_a_plugin_that_raises_in_any_hook_changes_nothing_but_is_reported(hook, error, undisturbed,
                                                                                      caplog):
    plugins = failing_in(hook, error)
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        run = drive_every_hook("open", plugins)
    assert run.facts() == undisturbed["open"].facts()
    assert f"'raising' raised {type(error).__qualname__} in {hook}" in caplog.text
    seen = plugins["errors"].seen
    if hook == "turnguard_plugin_error":  # a failing reporter is logged; the other reporters still hear
        assert seen == [("trigger", "turnguard_turn_ended", "RuntimeError")]
    else:
        assert seen and all(s == ("raising", hook, type(error).__name__) for s in seen)


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_failing_closed_a_plugin_that_raises_halts_the_call_it_failed_on(hook, error, undisturbed, caplog):
    plugins = failing_in(hook, error)
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        run = drive_every_hook("closed", plugins)
    assert f"'raising' raised {type(error).__qualname__} in {hook}" in caplog.text
    first = HALTS_FROM[hook]
    if first is None:  # nothing to halt: the turn and the result stand as they would have
        assert run.facts() == undisturbed["closed"].facts()
        return
    expected = undisturbed["closed"].actions()
    at = STEPS.index(first)
    assert run.actions() == expected[:at] + [tg.Action.HALT] * (len(STEPS) - at)
    halt = run.verdicts[first]
    assert halt.message.endswith(f"failed in {hook} (fail_mode=closed)") and "bug" not in halt.message
    assert run.summary.halted and run.summary.reason == "halted"
    assert plugins["errors"].seen[0] == ("raising", hook, type(error).__name__)


@pytest.mark.parametrize("hook", [hook for hook in HOOKS if HALTS_FROM[hook] is not None])
def test_failing_closed_the_halt_names_the_plugin_and_the_hook_for_checks_and_observers_alike(hook):
    """One treatment (``Dispatcher.failed``): the same stand-in HALT wherever the plugin failed."""
    run = drive_every_hook("closed", failing_in(hook, RuntimeError("bug")))
    halt = run.verdicts[HALTS_FROM[hook]]
    assert halt.message == f"turnguard: plugin 'raising' failed in {hook} (fail_mode=closed)"
    assert (halt.threshold, halt.event) == ("plugin_error", None)
    assert (run.summary.halted, run.summary.threshold) == (True, "plugin_error")


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_each_failure_is_logged_once_and_reported_once(hook, fail_mode, caplog):
    plugins = failing_in(hook, RuntimeError("bug"))
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        drive_every_hook(fail_mode, plugins)
    logged = [r for r in caplog.records if "'raising' raised" in r.getMessage()]
    reported = [s for s in plugins["errors"].seen if s[0] == "raising"]
    assert logged
    assert len(reported) == (0 if hook == "turnguard_plugin_error" else len(logged))


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(2)], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_keyboard_interrupt_and_system_exit_propagate_from_every_hook(hook, error, fail_mode):
    with pytest.raises(type(error)):
        drive_every_hook(fail_mode, failing_in(hook, error))


def test_a_plugin_registered_later_is_isolated_in_the_shadow_reports_too():
    errors = Errors()
    guard = tg.Guard(tg.GuardConfig(**EVERY_HOOK_FIRES, fail_mode="closed"), plugins={"errors": errors}, environ={})
    assert guard.turn().check_call(tg.ToolCall("bash", "make")).action is not tg.Action.HALT
    guard.register(Raising("turnguard_shadow_detected", RuntimeError("late")), name="late")
    assert guard.turn().check_call(tg.ToolCall("bash", "make")).action is tg.Action.HALT
    assert errors.seen == [("late", "turnguard_shadow_detected", "RuntimeError")]


def test_a_plugin_that_fails_to_configure_under_fail_closed_halts_the_turns_opened_after():
    guard = tg.Guard(tg.GuardConfig(**EVERY_HOOK_FIRES, fail_mode="closed"), environ={})
    before = guard.turn()
    guard.register(Raising("turnguard_configure", RuntimeError("set-up")), name="late")
    assert before.check_call(tg.ToolCall("bash", "make")).action is not tg.Action.HALT
    after = guard.turn()
    assert after.halted is not None and after.check_call(tg.ToolCall("bash", "make")).action is tg.Action.HALT


def test_a_plugins_exception_text_is_logged_only_with_capture_content(caplog):
    secret = "password=hunter2 in the tool arguments"
    for capture in (False, True):
        caplog.clear()
        guard = core_guard(capture_content=capture)
        guard.register(Raising("turnguard_check_call", ValueError(secret)), name="leaky")
        with caplog.at_level(logging.ERROR, logger="turnguard"):
            verdict = guard.turn().check_call(tg.ToolCall("login", {"password": "hunter2"}))
        assert "leaky" in caplog.text and "ValueError" in caplog.text
        assert (secret in caplog.text) is capture
        assert secret not in verdict.message


@pytest.mark.parametrize("hook", ["turnguard_configure", "turnguard_turn_started"])
def test_failing_closed_a_resumed_turn_keeps_the_halt_its_opening_caused(hook):
    config = tg.GuardConfig(**EVERY_HOOK_FIRES, fail_mode="closed")
    turn = tg.Guard(config, environ={}).turn()
    turn.check_call(tg.ToolCall("bash", "make"))
    resumed = tg.Guard(config, plugins={"raising": Raising(hook, RuntimeError("bug"))}, environ={}).resume(
        turn.snapshot())
    assert resumed.check_call(tg.ToolCall("bash", "make test")).action is tg.Action.HALT
