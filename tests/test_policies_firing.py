"""Each policy's ``firing_rule`` (what calibrate may assume about it) against what its hooks do.

Every built-in policy module, and the calibration grid's extra rule, says when it can fire on a
turn known in advance. Here each one runs alone (the others switched off by configuration) through
the replay of the live hooks, on random turns, in both modes: a rule that says it cannot fire
must see no ask and no halt, its first call must come no later than the first ask or halt, a
halt it places exactly must land there, and a turn below its triggers must be one it cannot
fire on.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

import turnguard as tg
from alternating_turns import alternating_turn
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.equivalence import stale_reach, turn_facts
from turnguard._calibrate.grid import IdenticalCallsRule, Policy
from turnguard._calibrate.records import RecordedCall, RecordedTurn
from turnguard._calibrate.replay import TurnResult, cycle_starts
from turnguard._firing import Firing, FiringRule
from turnguard._policies import cap, cycle_repeat, cycles, streak

CAP_ONLY = {"streak_warn_at": 0, "streak_stop_at": 0, "max_cycles_per_turn": 0}
NO_CAP = {"max_tool_calls_per_turn": 0, "streak_warn_at": 0, "streak_stop_at": 0, "max_cycles_per_turn": 0}

CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "cap explicit": (cap, {**CAP_ONLY, "max_tool_calls_per_turn": 7}),
    "cap adaptive": (cap, {**CAP_ONLY, "soft_cap": 5, "hard_multiplier": 3, "stuck_repeat_threshold": 3}),
    "cap adaptive, D never reached": (cap, {**CAP_ONLY, "soft_cap": 4, "hard_multiplier": 2,
                                            "stuck_repeat_threshold": 40}),
    "cap stale_repeat": (cap, {**CAP_ONLY, "soft_cap": 4, "hard_multiplier": 4, "stuck_repeat_threshold": 2,
                               "stuck_signal": "stale_repeat"}),
    "cap with keys untracked": (cap, {**CAP_ONLY, "soft_cap": 3, "hard_multiplier": 5, "stuck_repeat_threshold": 2,
                                      "max_tracked_keys": 2}),
    "cap disabled": (cap, {**CAP_ONLY, "soft_cap": 0}),
    "streak warn 3 stop 5": (streak, {**NO_CAP, "streak_warn_at": 3, "streak_stop_at": 5}),
    "streak warn at stop": (streak, {**NO_CAP, "streak_warn_at": 3, "streak_stop_at": 3}),
    "streak stop on any": (streak, {**NO_CAP, "streak_warn_at": 3, "streak_stop_at": 4, "streak_stop_on": "any"}),
    "streak reminding": (streak, {**NO_CAP, "streak_warn_at": 2, "streak_stop_at": 4, "remind_model": True}),
    "streak stop only": (streak, {**NO_CAP, "streak_stop_at": 3}),
    "streak warn only": (streak, {**NO_CAP, "streak_warn_at": 3}),
    "cycles 3": (cycles, {**NO_CAP, "max_cycles_per_turn": 3}),
    "cycles 8": (cycles, {**NO_CAP, "max_cycles_per_turn": 8}),
    "cycle repeat 3/5": (cycle_repeat, {**NO_CAP, "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 5}),
    "cycle repeat warn at stop": (cycle_repeat, {**NO_CAP, "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 3}),
    "cycle repeat reminding": (cycle_repeat, {**NO_CAP, "cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 4,
                                              "remind_model": True}),
    "cycle repeat stop only": (cycle_repeat, {**NO_CAP, "cycle_repeat_stop_at": 3, "cycle_repeat_max_period": 3}),
    "cycle repeat warn only": (cycle_repeat, {**NO_CAP, "cycle_repeat_warn_at": 3}),
    "cycle repeat, stateful": (cycle_repeat, {**NO_CAP, "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 4,
                                              "stateful_tools": ("read",)}),
}


def random_turn(rng: random.Random, n: int) -> RecordedTurn:
    """Turns of runs over a few calls, every outcome, with and without per-call request numbers."""
    pool = [("read", '{"a": 1}'), ("read", '{"a": 2}'), ("grep", "grep x"), ("edit", "e"), ("run", "make")]
    calls = []
    cycle = 0
    per_call = rng.random() < 0.5
    for _ in range(rng.randint(0, 12)):
        tool, args = rng.choice(pool)
        for _ in range(rng.choice((1, 1, 2, 3, 6))):
            cycle += rng.random() < 0.6
            outcome = rng.choices(list(tg.Outcome), (0.4, 0.4, 0.1, 0.1))[0]
            calls.append(RecordedCall(tool, args, None, outcome, cycle if per_call else None))
    total = cycle + rng.choice((0, 1)) if per_call else rng.choice((None, len(calls), len(calls) // 2 + 1))
    return RecordedTurn(f"t{n}", tuple(calls), total, None)


def changed_at(result: TurnResult) -> int | None:
    """The first call at which the policy changed the turn: its first ask, or its halt."""
    found = [*result.asks, *([result.halt_call] if result.halted else [])]
    return min(found) if found else None


def check(rule: FiringRule, policy: Policy, turns: list[RecordedTurn]) -> dict[str, int]:
    """Compare the rule with the replayed hooks on every turn and mode; how often each branch ran."""
    cal = Calibrator([policy], group=False)
    seen = {"cannot fire": 0, "fires": 0, "exact halt": 0}
    for turn in turns:
        keys = cal.keys(turn, cal.keyers[policy.config.key_mode])
        facts = turn_facts(keys, [c.outcome for c in turn.calls], cycle_starts(turn))
        if policy.config.stuck_signal == "stale_repeat":
            facts = type(facts)(**{**{f: getattr(facts, f) for f in facts.__slots__},
                                   "reach_stale": stale_reach(policy.config, keys)})
        results = cal.results(turn)[0]
        for mode, promptable in (("unattended", False), ("attended", True)):
            firing: Firing | None = rule.firing(facts, promptable)
            result = results[mode]
            at = changed_at(result)
            if rule.triggers(promptable).quiet(facts):
                assert firing is None, (turn, mode)
            if firing is None:
                seen["cannot fire"] += 1
                assert at is None, (turn, mode, result)
                continue
            seen["fires"] += 1
            assert at is None or firing.first_call <= at, (turn, mode, firing, result)
            if firing.halt_call is not None:
                seen["exact halt"] += 1
                assert result.halt_call == firing.halt_call and not result.asks, (turn, mode, firing, result)
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_a_policys_firing_rule_agrees_with_its_hooks(case: str) -> None:
    module, options = CASES[case]
    config = tg.GuardConfig(load_entrypoints=False, **options)
    rng = random.Random(case)
    make = alternating_turn if module is cycle_repeat else random_turn
    seen = check(module.firing_rule(config), Policy(case, config), [make(rng, n) for n in range(250)])
    assert seen["cannot fire"], "no turn where the rule said it cannot fire: the test would check nothing"
    if case != "cap disabled":
        assert seen["fires"], "no turn where the rule said it can fire: the test would check nothing"


@pytest.mark.parametrize("n", [2, 4])
def test_the_identical_calls_rule_fires_where_its_plugin_halts(n: int) -> None:
    rule = IdenticalCallsRule(n)
    config = tg.GuardConfig(load_entrypoints=False, **NO_CAP)
    rng = random.Random(n)
    seen = check(rule, Policy(rule.label, config, (rule,)), [random_turn(rng, i) for i in range(250)])
    assert seen["cannot fire"] and seen["fires"]


def test_exact_cap_halts_are_placed_exactly() -> None:
    """The adaptive cap with every key counted names the call its halt lands on."""
    config = tg.GuardConfig(load_entrypoints=False, **CAP_ONLY, soft_cap=5, hard_multiplier=3,
                            stuck_repeat_threshold=3)
    rng = random.Random(7)
    seen = check(cap.firing_rule(config), Policy("exact", config), [random_turn(rng, n) for n in range(250)])
    assert seen["exact halt"] > 10
