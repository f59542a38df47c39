"""One turn driver: ``Turn``'s hot path and the shadows' per-call loops keep inlined copies of
``Driver``'s quiet-region test, and each must call the same hooks at the same calls (and the turn
give the same verdicts) as the driver, on random turns (parallel batches, outcomes in any order)
under random thresholds."""

from __future__ import annotations

import random
from typing import Any

import pytest

import turnguard as tg
import turnguard._shadow
from test_quiet import OUTCOMES, random_config
from turnguard._driver import CHECK_CALL, CHECK_OUTCOME, Driver
from turnguard._firing import Quiet
from turnguard._ledger import Ledger
from turnguard._plugins import NON_POLICY_PLUGINS, plugin_manager
from turnguard.hookspecs import hookimpl


class Spy:
    """A third-party plugin with a quiet region of its own: notes where it was called."""

    def __init__(self, region: Quiet) -> None:
        self.region = region
        self.heard: list[tuple[str, int]] = []

    def quiet_rule(self, turn: Ledger) -> Quiet:
        return self.region

    @hookimpl
    def turnguard_check_call(self, turn: Any, call: tg.ToolCall) -> None:
        self.heard.append(("call", turn.tool_calls))

    @hookimpl
    def turnguard_check_outcome(self, turn: Any, call: tg.ToolCall, outcome: tg.Outcome) -> None:
        self.heard.append(("outcome", turn.tool_calls))


def random_turn(rng: random.Random) -> list[list[tuple[str, int, tg.Outcome]]]:
    """Batches of calls (one model response each): few distinct calls, so streaks and repeats form."""
    return [[(rng.choice("ab"), rng.randrange(3), rng.choice(OUTCOMES)) for _ in range(rng.choice([1, 1, 1, 2, 4]))]
            for _ in range(rng.randrange(5, 40))]


def random_case(rng: random.Random) -> tuple[dict[str, Any], Quiet, Any, int]:
    region = Quiet(calls=rng.choice([2, 6, 30]), streak=rng.choice([2, 3, 99]), repeat=rng.choice([2, 4, 99]),
                   stop_count=rng.choice([1, 2, 99]))
    return random_config(rng), region, random_turn(rng), rng.randrange(1 << 30)


def shown(verdict: tg.Verdict | None) -> tuple[Any, ...]:
    if verdict is None:
        return (tg.Action.ALLOW, None)
    return verdict.action, verdict.threshold


def live(guard: tg.Guard, batches: Any, order: random.Random, promptable: bool) -> list[tuple[Any, ...]]:
    """The turn through ``Turn`` (its inlined copy)."""
    seen = []
    with guard.turn(promptable=promptable) as turn:
        for batch in batches:
            calls = [tg.ToolCall(name, {"n": n}) for name, n, _ in batch]
            for call in calls:
                seen.append(shown(turn.check_call(call)))
            for i in order.sample(range(len(batch)), len(batch)):
                seen.append(shown(turn.record_outcome(calls[i], batch[i][2])))
            if turn.halted:
                break
    return seen


def driven(guard: tg.Guard, batches: Any, order: random.Random, promptable: bool,
           heard_after_halt: bool = True) -> list[tuple[Any, ...]]:
    """The same turn through a ``Driver`` on a ledger of its own, halting as a turn halts: its
    hooks hear the outcomes after the HALT (a turn's do; a shadow's own would-be halt stops it)."""
    ledger = Ledger(guard.config, turn_id="driven", promptable=promptable)
    driver, halt, seen = Driver(guard.dispatcher, ledger), None, []

    def decide(hook: str, found: Any) -> tg.Verdict | None:
        nonlocal halt
        if halt is not None:
            return halt
        verdict = driver.combine(hook, found)[0] if found else None
        if verdict is not None and verdict.action is tg.Action.HALT:
            halt = verdict
        return verdict

    for batch in batches:
        calls, seqs = [tg.ToolCall(name, {"n": n}) for name, n, _ in batch], []
        for call in calls:
            if halt is not None:
                seen.append(shown(halt))
                seqs.append(0)
                continue
            found = driver.call(guard.keyer.digest(call.name, call.args), call)
            seqs.append(ledger.checks)
            seen.append(shown(decide(CHECK_CALL, found)))
        for i in order.sample(range(len(batch)), len(batch)):
            if not seqs[i]:  # halted at its check: a turn ignores its outcome
                seen.append(shown(halt))
                continue
            if halt is not None:  # the answer is the HALT
                if heard_after_halt:
                    driver.outcome(seqs[i], calls[i], batch[i][2])
                else:
                    driver.record(seqs[i], calls[i].name, batch[i][2])
                seen.append(shown(halt))
                continue
            seen.append(shown(decide(CHECK_OUTCOME, driver.outcome(seqs[i], calls[i], batch[i][2]))))
        if halt is not None:
            break
    return seen


@pytest.mark.parametrize("promptable", [False, True])
def test_the_turns_inlined_quiet_test_calls_what_the_driver_calls(promptable):
    rng = random.Random(32)
    for case in range(150):
        options, region, batches, seed = random_case(rng)
        config = tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, **options)
        spies = Spy(region), Spy(region)
        guards = [tg.Guard(config, plugins={"spy": spy}, environ={}) for spy in spies]
        theirs = live(guards[0], batches, random.Random(seed), promptable)
        ours = driven(guards[1], batches, random.Random(seed), promptable)
        assert theirs == ours, (case, config, region)
        assert spies[0].heard == spies[1].heard, (case, config, region)


@pytest.mark.parametrize("promptable", [False, True])
def test_the_shadows_inlined_quiet_test_calls_what_the_driver_calls(promptable, monkeypatch):
    """A shadow configured as the live guard, with a spy among its policies, hears what a spy
    driven through a ``Driver`` hears (the shadow halts where the live turn does)."""
    rng = random.Random(33)
    shadowed: list[Spy] = []

    def with_spy(config: tg.GuardConfig, **kwargs: Any) -> Any:
        pm = plugin_manager(config, **kwargs)
        pm.register(shadowed[-1], "spy")
        return pm

    monkeypatch.setattr(turnguard._shadow, "policy_manager", with_spy)
    for case in range(150):
        options, region, batches, seed = random_case(rng)
        if rng.random() < 0.3:
            options["stateful_tools"] = ("a",)
        disabled = tuple(p for p in NON_POLICY_PLUGINS if p != "shadow")
        config = tg.GuardConfig(disable_plugins=disabled, **options)
        shadowed.append(Spy(region))
        live(tg.Guard(config.replace(shadow={"same": {}}), environ={}), batches, random.Random(seed), promptable)
        spy = Spy(region)
        driven(tg.Guard(config.replace(disable_plugins=NON_POLICY_PLUGINS), plugins={"spy": spy}, environ={}),
               batches, random.Random(seed), promptable, heard_after_halt=False)
        assert shadowed[-1].heard == spy.heard, (case, config, region)
