"""What a third-party check hook may answer, and what its answer can do: anything but a
well-formed ``Verdict`` is a plugin error (reported, ALLOW under ``fail_mode="open"``, the
stand-in HALT under ``"closed"``), never an exception in the host; and a plugin's detection never
keeps a built-in policy from firing, whatever threshold and level it names."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import turnguard as tg
from conftest import CORE_ONLY
from turnguard import Action, Level, LoopDetectedEvent, Threshold, Verdict


class Custom(BaseException):
    """Not an ``Exception``."""


def event(**fields: Any) -> LoopDetectedEvent:
    """A well-formed event, with ``fields`` in place of its own."""
    plain = LoopDetectedEvent(threshold="mine", action=Action.REMIND, level=Level.WARN, limit=1, tool_calls=1,
                              cycles=0, max_key_repeat=1, streak_length=1, failing_streak_length=0, soft_cap=100,
                              hard_cap=1000, tool_name="bash", key_digest=None, promptable=False, turn_id="t",
                              conversation_id=None, agent_name=None, event_id="e", message="mine")
    return dataclasses.replace(plain, **fields)


def raising(cls: type, name: str, error: BaseException) -> Any:
    """A subclass of ``cls`` whose field ``name`` raises ``error`` when read."""

    def read(self: object) -> Any:
        raise error

    return type(f"Raising{cls.__name__}", (cls,), {"__slots__": (), name: property(read)})


class Hostile(str):
    """Text whose every method a guard could call raises."""

    def __str__(self) -> str:
        raise Custom("str")

    def __hash__(self) -> int:
        raise Custom("hash")

    def __eq__(self, other: object) -> bool:
        raise Custom("eq")

    def __format__(self, spec: str) -> str:
        raise Custom("format")


class Counts(int):
    def __index__(self) -> int:
        raise Custom("index")

    def __int__(self) -> int:
        raise Custom("int")


MALFORMED: dict[str, Callable[[], object]] = {
    "a string": lambda: "halt",
    "an int": lambda: 3,
    "an Action": lambda: Action.HALT,
    "an object": object,
    "a dict": lambda: {"action": Action.HALT},
    "an int action": lambda: Verdict(3),  # type: ignore[arg-type]
    "a string action": lambda: Verdict("halt"),  # type: ignore[arg-type]
    "no action": lambda: Verdict(None),  # type: ignore[arg-type]
    "an object threshold": lambda: Verdict(Action.REMIND, object()),  # type: ignore[arg-type]
    "an int threshold": lambda: Verdict(Action.REMIND, 3),  # type: ignore[arg-type]
    "no message": lambda: Verdict(Action.REMIND, "mine", None),  # type: ignore[arg-type]
    "an int message": lambda: Verdict(Action.REMIND, "mine", 3),  # type: ignore[arg-type]
    "a string event": lambda: Verdict(Action.REMIND, "mine", "m", "not an event"),  # type: ignore[arg-type]
    "an object event": lambda: Verdict(Action.ASK, "mine", "m", object()),  # type: ignore[arg-type]
    "a dict event": lambda: Verdict(Action.ASK, "mine", "m", {"threshold": "mine"}),  # type: ignore[arg-type]
    "an ALLOW with a string event": lambda: Verdict(Action.ALLOW, "mine", "m", "e"),  # type: ignore[arg-type]
    "an action that raises": lambda: raising(Verdict, "action", RuntimeError("action"))(Action.ALLOW),
    "an action that raises a BaseException": lambda: raising(Verdict, "action", Custom("action"))(Action.HALT),
    "an event that raises": lambda: raising(Verdict, "event", GeneratorExit("event"))(Action.REMIND),
    "a threshold that raises": lambda: raising(Verdict, "threshold", Custom("threshold"))(Action.REMIND),
    **{f"an event with {name} {label}": (lambda name=name, value=value: Verdict(
        Action.REMIND, "mine", "m", event(**{name: value()})))
       for name, label, value in [
           ("threshold", "an object", object), ("threshold", "None", lambda: None), ("level", "an int", lambda: 3),
           ("action", "an int", lambda: 1), ("action", "None", lambda: None), ("limit", "a string", lambda: "1"),
           ("tool_calls", "None", lambda: None), ("streak_length", "a float", lambda: 1.5),
           ("promptable", "a string", lambda: "yes"), ("turn_id", "None", lambda: None),
           ("message", "an int", lambda: 3), ("tool_name", "an object", object),
           ("soft_cap", "a string", lambda: "100"),
       ]},
    "an event whose field raises": lambda: Verdict(
        Action.REMIND, "mine", "m", raising(LoopDetectedEvent, "level", Custom("level"))(**vars_of(event()))),
}
"""Answers that are not a well-formed ``Verdict``, whatever the hook."""


def vars_of(e: LoopDetectedEvent) -> dict[str, Any]:
    return {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}


HOOKS = {"turnguard_check_cycle": "begin_cycle", "turnguard_check_call": "check_call",
         "turnguard_check_outcome": "record_outcome"}


def answering(hook: str, make: Callable[[], object]) -> object:
    """A plugin whose ``hook`` answers ``make()``."""

    class Answering:
        pass

    def impl(turn: Any) -> object:
        return make()

    setattr(Answering, hook, staticmethod(tg.hookimpl(specname=hook)(impl)))
    return Answering()


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @tg.hookimpl
    def turnguard_plugin_error(self, plugin, hook, error):
        self.seen.append((plugin, hook))


def host_calls(plugins: dict[str, object], fail_mode: str) -> list[tg.Verdict]:
    """Each host call once (a model request, a call, its outcome) with ``plugins``."""
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY, fail_mode=fail_mode), plugins=plugins, environ={})
    turn = guard.turn()
    call = tg.ToolCall("bash", "make")
    return [turn.begin_cycle(), turn.check_call(call), turn.record_outcome(call, tg.Outcome.OK)]


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("answer", MALFORMED)
def test_failing_open_a_malformed_answer_is_reported_and_allows(hook, answer):
    errors = Errors()
    verdicts = host_calls({"answering": answering(hook, MALFORMED[answer]), "errors": errors}, "open")
    assert [v.action for v in verdicts] == [Action.ALLOW] * 3
    assert errors.seen == [("answering", hook)]


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("answer", MALFORMED)
def test_failing_closed_a_malformed_answer_halts_the_call_it_came_in(hook, answer):
    verdicts = host_calls({"answering": answering(hook, MALFORMED[answer])}, "closed")
    at = list(HOOKS).index(hook)
    assert [v.action for v in verdicts] == [Action.ALLOW] * at + [Action.HALT] * (3 - at)
    assert verdicts[at].message == f"turnguard: plugin 'answering' failed in {hook} (fail_mode=closed)"


HOSTILE_TEXT: dict[str, Callable[[], Verdict]] = {
    "threshold": lambda: Verdict(Action.HALT, Hostile("mine"), "m"),
    "message": lambda: Verdict(Action.HALT, "mine", Hostile("m")),
    "event threshold": lambda: Verdict(Action.HALT, "mine", "m", event(threshold=Hostile("mine"))),
    "event level": lambda: Verdict(Action.HALT, "mine", "m", event(level=Hostile("warn"))),
    "event turn id": lambda: Verdict(Action.HALT, "mine", "m", event(turn_id=Hostile("t"))),
    "event count": lambda: Verdict(Action.HALT, "mine", "m", event(limit=Counts(1))),
}


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
@pytest.mark.parametrize("field", HOSTILE_TEXT)
def test_a_subclass_value_in_an_answer_stands_as_its_plain_value(field, fail_mode):
    """A ``str`` or ``int`` subclass is a text or a count: it stands, copied, so no method of the
    plugin's runs when the guard, the host or telemetry reads it."""
    guard = tg.Guard(tg.GuardConfig(fail_mode=fail_mode, disable_plugins=("otel",)),
                     plugins={"answering": answering("turnguard_check_call", HOSTILE_TEXT[field])}, environ={})
    with guard.turn() as turn:
        verdict = turn.check_call(tg.ToolCall("bash", "make"))
    assert verdict.action is Action.HALT and turn.summary.halted
    assert type(verdict.threshold) is str and type(verdict.message) is str and verdict.threshold == "mine"
    if verdict.event is not None:
        e = verdict.event
        assert all(type(getattr(e, name)) in (str, int, Level) for name in ("threshold", "level", "turn_id", "limit"))
    assert str(verdict.threshold) == "mine" and f"{verdict.message}" == "m"


# -- a plugin's detection named like a built-in threshold ------------------------------------------

SCENARIOS: dict[str, tuple[dict[str, Any], str, tuple[tg.Outcome, ...]]] = {
    "streak": ({}, "A", (tg.Outcome.ERROR,)),
    "streak, any outcome": ({"streak_stop_on": "any"}, "A", (tg.Outcome.OK,)),
    "soft_stuck": ({"soft_cap": 6, "stuck_repeat_threshold": 3, "streak_warn_at": 0}, "ABC", (tg.Outcome.OK,)),
    "hard_backstop": ({"soft_cap": 4, "hard_multiplier": 2}, "ABCDEFGHIJKLMNOP", (tg.Outcome.OK,)),
    "explicit": ({"max_tool_calls_per_turn": 5}, "ABCDEFGH", (tg.Outcome.OK,)),
    "cycle_cap": ({"max_cycles_per_turn": 4}, "ABCDEFGH", (tg.Outcome.OK,)),
    "cycle_repeat": ({"cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 4, "streak_warn_at": 0}, "AB",
                     (tg.Outcome.OK,)),
}
"""Turns in which each built-in threshold fires: configuration, the calls' keys (repeated),
their outcomes (repeated)."""


class Mimic:
    """Detects, on every check, ``threshold`` at ``level`` with ``action``."""

    def __init__(self, threshold: str, level: str, action: Action) -> None:
        self.args = (threshold, action, level, 1)

    @tg.hookimpl
    def turnguard_check_cycle(self, turn):
        return turn.detect(*self.args, message="mine")

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        return turn.detect(*self.args, call=call, message="mine")

    @tg.hookimpl
    def turnguard_check_outcome(self, turn, call, outcome):
        return turn.detect(*self.args, call=call, message="mine")


class BuiltIns:
    """The built-in policies' detections, as ``turnguard_loop_detected`` hears them."""

    def __init__(self) -> None:
        self.heard: list[tuple[object, ...]] = []

    @tg.hookimpl
    def turnguard_loop_detected(self, event):
        if event.message != "mine":
            self.heard.append((str(event.threshold), str(event.level), event.action, event.tool_calls, event.cycles))


def built_in_detections(scenario: str, plugins: dict[str, object], promptable: bool) -> list[tuple[object, ...]]:
    options, keys, outcomes = SCENARIOS[scenario]
    heard = BuiltIns()
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY, **options), plugins={**plugins, "heard": heard}, environ={})
    with guard.turn(promptable=promptable) as turn:
        for i in range(40):
            turn.begin_cycle()
            call = tg.ToolCall("bash", keys[i % len(keys)])
            verdict = turn.check_call(call)
            turn.record_outcome(call, outcomes[i % len(outcomes)])
            if verdict.action is Action.ASK and verdict.event is not None and verdict.event.message != "mine":
                turn.resolve(verdict.event, "continue")
            if turn.halted is not None:
                break
    s = turn.summary
    return [*heard.heard, (s.halted, str(s.threshold), s.tool_calls, s.max_failing_streak)]


@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("action", [Action.ALLOW, Action.REMIND], ids=lambda a: a.label)
@pytest.mark.parametrize("level", list(Level), ids=str)
@pytest.mark.parametrize("threshold", list(Threshold), ids=str)
def test_a_plugins_detection_named_like_a_built_in_threshold_never_keeps_a_built_in_from_firing(
        threshold, level, action, promptable):
    for scenario in SCENARIOS:
        alone = built_in_detections(scenario, {}, promptable)
        assert len(alone) > 1, scenario  # the built-in fires in the scenario
        for name in (threshold, threshold.value):
            mimic = Mimic(name, level, action)
            assert built_in_detections(scenario, {"mimic": mimic}, promptable) == alone, (scenario, name)


def test_a_plugins_own_threshold_is_still_noted_as_fired_in_the_streak():
    seen: list[bool] = []

    class Once:
        @tg.hookimpl
        def turnguard_check_call(self, turn, call):
            seen.append(turn.fired_in_streak("mine", "warn"))
            if turn.streak_length == 2:
                return turn.detect("mine", Action.REMIND, Level.WARN, 2, call=call)
            return None

    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), plugins={"once": Once()}, environ={})
    turn = guard.turn()
    for _ in range(4):
        turn.check_call(tg.ToolCall("bash", "make"))
    assert seen == [False, False, True, True]
