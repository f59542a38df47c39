"""Hooks are not called where their policy cannot fire (``turnguard._firing.Quiet``), and that
changes no verdict: a guard whose policies say where they are quiet and one whose policies say
nothing (every hook called on every check) agree on every turn, shadows included."""

from __future__ import annotations

import random
from typing import Any

import pytest

import turnguard as tg
from test_plugin_isolation import Errors
from turnguard._firing import Quiet
from turnguard._ledger import Ledger, LedgerView
from turnguard._plugins import NON_POLICY_PLUGINS
from turnguard._policies import cap, streak

OUTCOMES = (tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.OK, tg.Outcome.DENIED, tg.Outcome.UNKNOWN)


def random_config(rng: random.Random) -> dict[str, Any]:
    """Thresholds small enough that random turns cross every one of them."""
    config: dict[str, Any] = {
        "soft_cap": rng.choice([3, 8, 20]),
        "hard_multiplier": rng.choice([2, 3]),
        "stuck_repeat_threshold": rng.choice([2, 3, 6]),
        "streak_warn_at": rng.choice([0, 2, 3, 5]),
        "streak_stop_at": rng.choice([0, 2, 4, 8]),
        "streak_stop_on": rng.choice(["error", "any"]),
        "stuck_signal": rng.choice(["repeat", "stale_repeat"]),
        "remind_model": rng.random() < 0.3,
    }
    if config["streak_warn_at"] and config["streak_stop_at"]:
        config["streak_warn_at"] = min(config["streak_warn_at"], config["streak_stop_at"])
    if rng.random() < 0.25:
        config["max_tool_calls_per_turn"] = rng.choice([0, 5, 15])
    return config


def observed(verdict: tg.Verdict) -> tuple[Any, ...]:
    """What a verdict says, without the ids that differ between two guards."""
    event = verdict.event
    facts = None if event is None else (event.level, event.limit, event.tool_calls, event.cycles,
                                        event.max_key_repeat, event.streak_length, event.failing_streak_length)
    return verdict.action, verdict.threshold, verdict.message, facts


def play(guard: tg.Guard, seed: int, promptable: bool) -> list[Any]:
    """One random turn (repeats, streaks, parallel batches, retries, answers, outcomes out of
    order); what the host saw, and the summary."""
    rng = random.Random(seed)
    seen: list[Any] = []
    with guard.turn(promptable=promptable) as turn:
        for _ in range(rng.randrange(5, 60)):
            seen.append(observed(turn.begin_cycle()))
            keys = [rng.choice("AAB" if rng.random() < 0.6 else "ABCDEFGH") for _ in range(rng.choice([1, 1, 1, 3]))]
            calls = [tg.ToolCall("bash", f"run {k}") for k in keys]
            for c in calls:
                verdict = turn.check_call(c)
                seen.append(observed(verdict))
                if verdict.action is tg.Action.ASK and verdict.event is not None and rng.random() < 0.7:
                    seen.append(observed(turn.resolve(verdict.event, rng.choice(["continue", "redirect"]))))
            order = list(calls)
            rng.shuffle(order)
            for c in order:
                verdict = turn.record_outcome(c, rng.choice(OUTCOMES))
                seen.append(observed(verdict))
                if verdict.action is tg.Action.ASK and verdict.event is not None:
                    seen.append(observed(turn.resolve(verdict.event, rng.choice(["continue", "redirect", "stop"]))))
            if rng.random() < 0.05:
                turn.retry()
            if turn.halted is not None:
                break
    summary = turn.summary
    return [*seen, summary.tool_calls, summary.halted, summary.threshold, summary.max_key_repeat]


def without_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (cap, streak):
        monkeypatch.delattr(module, "quiet_rule")


@pytest.mark.parametrize("promptable", [True, False])
def test_skipping_quiet_policies_changes_no_verdict_on_random_turns(monkeypatch, promptable):
    rng = random.Random(11)
    configs = [random_config(rng) for _ in range(60)]
    quiet = [tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, **c), environ={}) for c in configs]
    with monkeypatch.context() as m:
        without_rules(m)
        every = [tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, **c), environ={}) for c in configs]
    assert all(g.turn()._quiet.call == () for g in quiet)  # the built-ins all say where they are quiet
    assert all(len(g.turn()._quiet.call) == 2 for g in every)  # cap and streak: called every time
    for i, (a, b) in enumerate(zip(quiet, every, strict=True)):
        for seed in range(12):
            assert play(a, 100 * i + seed, promptable) == play(b, 100 * i + seed, promptable), (configs[i], seed)


def test_skipping_quiet_policies_changes_no_shadow_verdict(monkeypatch):
    rng = random.Random(5)
    shadows = {f"s{i}": random_config(rng) for i in range(3)}
    live = {"soft_cap": 10, "streak_warn_at": 0, "streak_stop_at": 0, "stuck_repeat_threshold": 50}

    def guard() -> tuple[tg.Guard, list[Any]]:
        ended: list[Any] = []

        class Heard:
            @tg.hookimpl
            def turnguard_shadow_detected(self, policy, event):
                ended.append((policy, event.threshold, event.level, event.action, event.tool_calls))

            @tg.hookimpl
            def turnguard_shadow_turn_ended(self, policy, summary):
                ended.append((policy, summary.tool_calls, summary.halted, summary.threshold))

        config = tg.GuardConfig(disable_plugins=("otel", "recorder"), shadow=shadows, **live)
        return tg.Guard(config, plugins={"heard": Heard()}, environ={}), ended

    quiet, quiet_heard = guard()
    with monkeypatch.context() as m:
        without_rules(m)
        every, every_heard = guard()
    for seed in range(40):
        play(quiet, seed, seed % 2 == 0)
        play(every, seed, seed % 2 == 0)
    assert quiet_heard == every_heard
    assert any(len(h) == 4 and h[2] for h in quiet_heard) and any(len(h) == 5 for h in quiet_heard)


class Counting:
    """A third-party policy that counts how often each of its hooks is called."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.outcomes: list[int] = []

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        self.calls.append(turn.tool_calls)

    @tg.hookimpl
    def turnguard_check_outcome(self, turn, call, outcome):
        self.outcomes.append(turn.tool_calls)


def drive(plugin: object, paths: tuple[str, ...] = tuple(f"f{i}" for i in range(8))) -> None:
    """One turn of ``read_file`` calls, one a path, each ok, with ``plugin`` registered."""
    guard = tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS), plugins={"counting": plugin}, environ={})
    with guard.turn() as turn:
        for path in paths:
            call = tg.ToolCall("read_file", {"path": path})
            turn.check_call(call)
            turn.record_outcome(call, "ok")


def test_a_plugin_that_says_nothing_is_called_on_every_check():
    plugin = Counting()
    drive(plugin)
    assert plugin.calls == list(range(1, 9)) and plugin.outcomes == list(range(1, 9))


def test_a_plugin_is_called_only_outside_the_region_its_rule_names():
    class Ruled(Counting):
        def quiet_rule(self, turn):
            return Quiet(calls=3, stop_count=1)  # quiet on the first 3 checks; its outcome hook always

    plugin = Ruled()
    drive(plugin)
    assert plugin.calls == [4, 5, 6, 7, 8] and plugin.outcomes == []


def test_past_its_region_a_rule_is_asked_again_until_it_names_one_behind_the_turn():
    asked: list[int] = []

    class Moving(Counting):
        def quiet_rule(self, turn):
            asked.append(turn.tool_calls)
            return Quiet(calls={0: 2, 3: 5}.get(turn.tool_calls, 1))  # then a region the turn has passed

    plugin = Moving()
    drive(plugin)
    assert asked == [0, 3, 6]  # at the start, past call 2, past call 5; never again after that
    assert plugin.calls == [6, 7, 8]


def test_a_check_past_the_calls_but_outside_the_new_region_calls_every_hook():
    class Streaky(Counting):
        def quiet_rule(self, turn):
            return Quiet(calls=2 if turn.tool_calls < 2 else 100, streak=2)  # one call of a streak only

    plugin = Streaky()
    drive(plugin, ("a", "b", "b", "c", "c"))
    assert plugin.calls == [3, 5]  # 3: past 2 calls, asked again, its streak outside; 4 inside; 5 a streak


@pytest.mark.parametrize("rule", [lambda turn: 1 / 0, lambda turn: "quiet", lambda turn: None])
def test_a_rule_that_fails_or_answers_no_quiet_leaves_its_plugin_called_every_time(rule):
    class Broken(Counting):
        quiet_rule = staticmethod(rule)

    plugin = Broken()
    drive(plugin)
    assert plugin.calls == list(range(1, 9)) and plugin.outcomes == list(range(1, 9))


def test_the_cap_names_a_new_region_past_the_soft_cap_so_long_turns_stay_quiet():
    guard = tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS), environ={})
    turn = guard.turn()
    assert turn._quiet.calls == 100
    for i in range(150):
        call = tg.ToolCall("bash", f"ls {i}")
        turn.check_call(call)
        turn.record_outcome(call, "ok")
    region = turn._quiet
    assert (region.calls, region.repeat, region.streak, region.call) == (1000, 6, 5, ())


# -- a third-party rule: what it gets, how it fails, what its answer can do ---------------------


class Custom(BaseException):
    """Not an ``Exception``: a rule raising it must not escape the guard either."""


def failing_turn(plugins: dict[str, object], fail_mode: str = "open", calls: int = 30) -> tuple[list[str], Any]:
    """One turn of ``calls`` identical failing calls (the streak stops it at the 8th): the
    actions the host saw, and the summary's counts."""
    guard = tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, max_tool_calls_per_turn=None,
                                    fail_mode=fail_mode), plugins=plugins, environ={})
    actions = []
    with guard.turn() as turn:
        for _ in range(calls):
            call = tg.ToolCall("bash", "make test")
            actions.append(turn.check_call(call).action.label)
            actions.append(turn.record_outcome(call, tg.Outcome.ERROR).action.label)
    summary = turn.summary
    return actions, (summary.tool_calls, summary.halted, summary.threshold, summary.max_failing_streak)


def test_a_plugins_rule_gets_the_read_only_view_its_hooks_get():
    got: list[object] = []

    class Keeping(Counting):
        def quiet_rule(self, turn):
            got.append(turn)
            return Quiet(calls=2)

        @tg.hookimpl
        def turnguard_check_call(self, turn, call):
            got.append(turn)

    drive(Keeping())
    assert len(got) > 2 and all(t is got[0] for t in got)
    assert isinstance(got[0], LedgerView) and not isinstance(got[0], Ledger)


def test_no_mutator_of_the_ledger_is_reachable_through_what_a_rule_gets():
    got: list[object] = []

    class Keeping(Counting):
        def quiet_rule(self, turn):
            got.append(turn)

    drive(Keeping())
    mutators = [name for name in dir(Ledger) if not name.startswith("__") and not hasattr(LedgerView, name)]
    assert "reset_streak" in mutators and "forget_repeats" in mutators
    assert [name for name in mutators if hasattr(got[0], name)] == []


def test_a_plugin_keeping_its_rules_turn_cannot_turn_the_streak_off():
    class Sneaky:
        kept: Any = None

        def quiet_rule(self, turn):
            self.kept = turn

        @tg.hookimpl
        def turnguard_check_call(self, turn, call):
            pass

        @tg.hookimpl
        def turnguard_call_checked(self, turn, call, verdict):
            for name in ("reset_streak", "forget_repeats"):
                getattr(self.kept, name, lambda: None)()

    assert failing_turn({"sneaky": Sneaky()}) == failing_turn({})


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
@pytest.mark.parametrize("error", [RuntimeError("rule"), Custom("rule"), GeneratorExit()],
                         ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("when", ["at the start", "when asked again"])
def test_a_rule_that_raises_anything_is_reported_and_its_plugin_called_every_time(error, fail_mode, when):
    class Raising(Counting):
        def quiet_rule(self, turn):
            if when == "at the start" or turn.tool_calls:
                raise error
            return Quiet(calls=2)

    plugin, errors = Raising(), Errors()
    actions, summary = failing_turn({"raising": plugin, "errors": errors}, fail_mode)
    assert (actions, summary) == failing_turn({}, fail_mode)
    assert errors.seen and set(errors.seen) == {("raising", "quiet_rule", type(error).__name__)}
    assert plugin.calls[-3:] == [6, 7, 8]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(2)], ids=lambda e: type(e).__name__)
def test_keyboard_interrupt_and_system_exit_propagate_from_a_rule(error):
    class Raising(Counting):
        def quiet_rule(self, turn):
            raise error

    with pytest.raises(type(error)):
        drive(Raising())


class Always(float):
    """A number that compares as inside any region (and as the least of any counts)."""

    def __lt__(self, other):
        return True

    __le__ = __gt__ = __ge__ = __lt__


class Everywhere(Quiet):
    """A ``Quiet`` whose counts cannot be read."""

    @property
    def calls(self):  # type: ignore[override]
        raise RuntimeError("calls")


MALFORMED_QUIET = {
    "a string": lambda: "quiet",
    "a string count": lambda: Quiet(calls="1000"),  # type: ignore[arg-type]
    "an object count": lambda: Quiet(streak=object()),  # type: ignore[arg-type]
    "counts that compare as always inside": lambda: Quiet(*(Always("inf"),) * 4),
    "an int subclass that compares as always inside": lambda: Quiet(
        calls=type("Big", (int,), {"__ge__": lambda s, o: True, "__lt__": lambda s, o: True})(10**9)),
    "counts that raise when read": lambda: Everywhere(),
}


@pytest.mark.parametrize("answer", MALFORMED_QUIET)
def test_no_answer_of_a_plugins_rule_silences_the_built_in_policies(answer):
    class Silencer:
        """Called after the built-in policies (an entry point's place): its counts are compared last."""

        def quiet_rule(self, turn):
            return MALFORMED_QUIET[answer]()

        @tg.hookimpl(trylast=True)
        def turnguard_check_call(self, turn, call):
            pass

        @tg.hookimpl(trylast=True)
        def turnguard_check_outcome(self, turn, call, outcome):
            pass

    assert failing_turn({"silencer": Silencer()}, calls=2000) == failing_turn({}, calls=2000)


@pytest.mark.parametrize("error", [RuntimeError, Custom, GeneratorExit])
def test_a_plugin_whose_rule_cannot_be_looked_up_is_called_on_every_check(error):
    class Proxy(Counting):
        def __getattr__(self, name):
            raise error(name)

    plugin = Proxy()
    drive(plugin)
    assert plugin.calls == list(range(1, 9)) and plugin.outcomes == list(range(1, 9))
