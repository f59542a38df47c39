"""What a plugin can reach and what its failures do: the read-only view, ``BaseException``s,
``fail_mode="closed"`` for every hook, and what the logs say."""

from __future__ import annotations

import contextlib
import logging

import pytest

import turnguard as tg
from conftest import core_guard, distinct_call
from turnguard.ledger import VIEW_FACTS, Ledger, LedgerView

CHECK_HOOKS = ("turnguard_check_cycle", "turnguard_check_call", "turnguard_check_outcome")
OBSERVER_HOOKS = ("turnguard_turn_started", "turnguard_cycle_checked", "turnguard_call_checked",
                  "turnguard_outcome_recorded", "turnguard_loop_detected", "turnguard_retry")


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
    from turnguard import ledger as module

    return module._ledger_of(view)


@pytest.mark.parametrize("name", ["rollback_cycle", "reset_streak", "count_call", "record_outcome", "begin_cycle",
                                  "note_detection", "abandon", "fork", "_ledger", "_anything",
                                  *Ledger.__slots__])
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


def test_a_plugin_cannot_disable_the_caps_through_what_it_receives():
    class Saboteur:
        @tg.hookimpl
        def turnguard_check_call(self, turn, call):
            for attempt in (lambda: turn.rollback_cycle(), lambda: turn.reset_streak(),
                            lambda: turn._counts.clear(), lambda: setattr(turn, "_tool_calls", 0),
                            lambda: call._key[2].reset_streak()):
                with contextlib.suppress(AttributeError, TypeError):
                    attempt()

    guard = core_guard(max_tool_calls_per_turn=3)
    guard.register(Saboteur(), name="saboteur")
    turn = guard.turn()
    verdicts = [turn.check_call(tg.ToolCall("bash", "make")) for _ in range(4)]
    assert [v.action for v in verdicts][-1] is tg.Action.HALT and turn.ledger.tool_calls == 4


# -- failures -------------------------------------------------------------------------------------


class Raising:
    """Raises ``error`` in ``hook``."""

    def __init__(self, hook: str, error: BaseException) -> None:
        def impl():
            raise error

        setattr(self, hook, tg.hookimpl(impl))


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    @tg.hookimpl
    def turnguard_plugin_error(self, plugin, hook, error):
        self.seen.append((plugin, hook, type(error).__name__))


def drive_all_hooks(turn: tg.Turn) -> list[tg.Verdict]:
    """One of each host call, in order; the verdicts of those that return one."""
    verdicts = [turn.begin_cycle()]
    call = tg.ToolCall("bash", "make", call_id="t1")
    verdicts.append(turn.check_call(call))
    verdicts.append(turn.record_outcome(call, tg.Outcome.OK))
    turn.retry()
    verdicts.append(turn.check_call(tg.ToolCall("bash", "make test")))
    return verdicts


class Custom(BaseException):
    """Not an ``Exception``: a plugin raising it must not escape the guard either."""


@pytest.mark.parametrize("hook", [*CHECK_HOOKS, *OBSERVER_HOOKS])
@pytest.mark.parametrize("error", [RuntimeError("bug"), Custom("odd"), GeneratorExit()])
def test_any_exception_from_a_plugin_is_isolated_and_reported(hook, error):
    errors = Errors()
    guard = core_guard(streak_warn_at=1)  # every call is detected: loop_detected runs too
    guard.register(Raising(hook, error), name="raising")
    guard.register(errors, name="errors")
    verdicts = drive_all_hooks(guard.turn())
    assert all(v.action is not tg.Action.HALT for v in verdicts)
    assert errors.seen and all(seen == ("raising", hook, type(error).__name__) for seen in errors.seen)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(2)])
@pytest.mark.parametrize("hook", ["turnguard_check_call", "turnguard_call_checked", "turnguard_retry"])
def test_keyboard_interrupt_and_system_exit_propagate(hook, error):
    guard = core_guard()
    guard.register(Raising(hook, error), name="raising")
    with pytest.raises(type(error)):
        drive_all_hooks(guard.turn())


HALTING_CALL = {
    "turnguard_turn_started": 0, "turnguard_cycle_checked": 0, "turnguard_check_cycle": 0,
    "turnguard_check_call": 1, "turnguard_call_checked": 1, "turnguard_loop_detected": 1,
    "turnguard_check_outcome": 2, "turnguard_outcome_recorded": 2, "turnguard_retry": 3,
}
"""For each hook, the first of ``drive_all_hooks``'s verdicts that a failure there halts."""


@pytest.mark.parametrize("hook", [*CHECK_HOOKS, *OBSERVER_HOOKS])
def test_failing_closed_a_failing_plugin_halts_the_call_it_failed_on(hook):
    guard = core_guard(fail_mode="closed", streak_warn_at=1)
    guard.register(Raising(hook, RuntimeError("bug")), name="raising")
    turn = guard.turn()
    verdicts = drive_all_hooks(turn)
    first = HALTING_CALL[hook]
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * first + [tg.Action.HALT] * (len(verdicts) - first)
    assert turn.halted is not None and "bug" not in turn.halted.message  # no exception text without capture_content


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
