"""The replay gives the live guard's verdicts at the same calls: both run the same turns, the
live ``Guard``/``Turn`` as a host drives it (answering every ASK with "continue"), the replay
through ``replay_turn``."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any

import pytest

import turnguard as tg
from alternating_turns import alternating_turn
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.equivalence import as_failing, earliest_call, turn_facts
from turnguard._calibrate.grid import IdenticalCallsRule, Policy
from turnguard._calibrate.records import UNFINISHED, RecordedCall, RecordedTurn
from turnguard._calibrate.replay import (
    UNREACHED,
    CompiledPolicy,
    Managers,
    SharedPrefix,
    Step,
    TurnResult,
    call_keys,
    cycle_starts,
    policy_manager,
    replay_turn,
    unfinished_calls,
)
from turnguard._dispatch import Impl
from turnguard._keys import Keyer
from turnguard._ledger import GIVE_UP_AFTER, GIVE_UP_EVERY, Ledger
from turnguard._plugins import NON_POLICY_PLUGINS
from turnguard.hookspecs import hookimpl

CONFIGS = {
    "default": {},
    "small adaptive": {"soft_cap": 6, "hard_multiplier": 2, "stuck_repeat_threshold": 3},
    "adaptive, backstop only": {"soft_cap": 4, "hard_multiplier": 3, "stuck_repeat_threshold": 50},
    "explicit": {"max_tool_calls_per_turn": 9, "streak_warn_at": 2, "streak_stop_at": 3},
    "streak tight": {"streak_warn_at": 2, "streak_stop_at": 2},
    "warn only": {"streak_warn_at": 3, "streak_stop_at": 0},
    "cycle cap": {"max_cycles_per_turn": 5},
    "bytes, remind": {"key_mode": "bytes", "remind_model": True, "streak_warn_at": 3, "streak_stop_at": 4},
    "cap off, streaks on": {"soft_cap": 0, "streak_warn_at": 2, "streak_stop_at": 3},
    "stale repeat signal": {"soft_cap": 6, "hard_multiplier": 4, "stuck_repeat_threshold": 3,
                            "stuck_signal": "stale_repeat"},
    "stop on any outcome": {"streak_warn_at": 3, "streak_stop_at": 4, "streak_stop_on": "any"},
    "stateful tools": {"stateful_tools": ("read", "run"), "soft_cap": 6, "hard_multiplier": 3,
                       "stuck_repeat_threshold": 3, "streak_warn_at": 3, "streak_stop_at": 4},
    "stateful, stale, stop on any": {"stateful_tools": ("read",), "soft_cap": 6, "hard_multiplier": 4,
                                     "stuck_repeat_threshold": 3, "stuck_signal": "stale_repeat",
                                     "streak_warn_at": 3, "streak_stop_at": 3, "streak_stop_on": "any"},
    "every tool stateful": {"stateful_tools": ("*",), "soft_cap": 5, "stuck_repeat_threshold": 2,
                            "streak_warn_at": 2, "streak_stop_at": 3},
    "exempt, stateful": {"streak_exempt_tools": ("grep", "run"), "stateful_tools": ("run",), "soft_cap": 6,
                         "stuck_repeat_threshold": 3, "streak_warn_at": 2, "streak_stop_at": 3},
    "streak plugin off": {"disable_plugins": ("streak",), "soft_cap": 6, "stuck_repeat_threshold": 3,
                          "streak_warn_at": 2, "streak_stop_at": 3},
    "cap plugin off": {"disable_plugins": ("cap",), "soft_cap": 4, "hard_multiplier": 2,
                       "streak_warn_at": 2, "streak_stop_at": 3},
    "cap and cycles off": {"disable_plugins": ("cycles", "cap"), "max_cycles_per_turn": 3, "soft_cap": 4,
                           "streak_warn_at": 3, "streak_stop_at": 4},
}
SHARED: Managers = {}
"""The plugin managers every replayed policy of this module shares (as a ``Calibrator``'s do), so
the comparisons with the live guard check the sharing too."""
RESULTS = (None, "r1", "r1", "r2", "done")
"""Recorded result digests (text that is not JSON: the live guard keys it as itself)."""


OUTCOMES = [*tg.Outcome, UNFINISHED]
"""Every recorded outcome: ``UNFINISHED``, a call whose turn ended before its outcome came, is one
the live guard was never told."""


def random_turn(rng: random.Random, n: int) -> RecordedTurn:
    """Short turns full of runs, repeats, respaced JSON text and every outcome, lost ones too."""
    calls = []
    pool = [("read", '{"a": 1, "b": 2}'), ("read", '{"b":2,"a":1}'), ("read", {"a": 1, "b": 2}),
            ("grep", "grep x\n"), ("grep", "grep y\n"), ("run", {"t": [1, 2]}), ("edit", "e")]
    for _ in range(rng.randint(0, 30)):
        tool, args = rng.choice(pool)
        result = rng.choice(RESULTS)
        for _ in range(rng.choice((1, 1, 1, 2, 4, 7))):
            outcome = rng.choices(OUTCOMES, (0.3, 0.5, 0.1, 0.1, 0.05))[0]
            if rng.random() < 0.3:
                result = rng.choice(RESULTS)
            calls.append(RecordedCall(tool, args, None, outcome, None, result))
    cycles = rng.choice((None, 0, len(calls), len(calls) + 2, max(1, len(calls) // 3)))
    return RecordedTurn(f"r{n}", tuple(calls), cycles, rng.choice((True, False, None)))


def live_steps(config: tg.GuardConfig, policy: Policy, turn: RecordedTurn, promptable: bool) -> list[Step]:
    """Drive a real Guard through the turn as a host would; every verdict that says something."""
    guard = tg.Guard(config, plugin_manager=policy_manager(policy))
    starts = cycle_starts(turn)
    steps: list[Step] = []

    def note(k: int, stage: str, v: tg.Verdict, t: tg.Turn) -> bool:
        if v.action is not tg.Action.ALLOW or v.threshold is not None:
            steps.append(Step(k, stage, v.action, None if v.threshold is None else str(v.threshold)))
        if v.action is tg.Action.ASK:
            t.resolve(v.event, "continue")
        return v.action is tg.Action.HALT

    with guard.turn(turn_id=turn.id, promptable=promptable) as t:
        for i in range(len(turn.calls) + 1):
            for _ in range(starts[i]):
                if note(i + 1, "cycle", t.begin_cycle(), t):
                    return steps
            if i == len(turn.calls):
                break
            rc = turn.calls[i]
            call = tg.ToolCall(rc.tool, rc.args)
            if note(i + 1, "call", t.check_call(call), t):
                return steps
            if rc.outcome is not UNFINISHED and note(i + 1, "outcome", t.record_outcome(call, rc.outcome,
                                                                                       result=rc.result), t):
                return steps
    return steps


def replay_policy(config: tg.GuardConfig, extras=()) -> tuple[Policy, CompiledPolicy]:
    policy = Policy("p", config, tuple(extras))
    return policy, CompiledPolicy(policy, Keyer(config.key_mode), SHARED)


def replayed_steps(compiled: CompiledPolicy, turn: RecordedTurn, promptable: bool) -> tuple[TurnResult, list[Step]]:
    """The replay of ``turn`` checked from its first call, with every verdict that says something."""
    steps: list[Step] = []
    digests = call_keys(turn.calls, compiled.config.key_mode)
    result = replay_turn(compiled, turn, [None] * len(turn.calls), digests, cycle_starts(turn),
                         promptable=promptable, trace=steps, lost=unfinished_calls([c.outcome for c in turn.calls]))
    return result, steps


def test_policy_manager_is_the_live_guards_plugin_set() -> None:
    live = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=NON_POLICY_PLUGINS),
                    environ={})
    replay = policy_manager(Policy("p", tg.GuardConfig()))
    assert [n for n, _ in replay.list_name_plugin()] == [n for n, _ in live.pm.list_name_plugin()]


def test_policies_share_a_manager_only_where_they_block_the_same_plugins() -> None:
    policies = [Policy(name, tg.GuardConfig(load_entrypoints=False, **options)) for name, options in CONFIGS.items()]
    policies += [Policy("extra", tg.GuardConfig(), (IdenticalCallsRule(5),)),
                 Policy("extra too", tg.GuardConfig(), (IdenticalCallsRule(5),))]
    calibrator = Calibrator(policies)
    managers = {}
    for policy, compiled in zip(policies, calibrator.compiled, strict=True):
        alone = CompiledPolicy(policy, Keyer(policy.config.key_mode))
        assert [n for n, _ in compiled.dispatcher.pm.list_name_plugin()] == [
            n for n, _ in alone.dispatcher.pm.list_name_plugin()]
        for hook in ("check_cycle", "check_call", "check_outcome"):
            assert list(map(_impl, getattr(compiled, hook))) == list(map(_impl, getattr(alone, hook)))
        managers.setdefault(compiled.dispatcher.pm, []).append(policy.name)
    blocked_sets = {frozenset(p.config.disable_plugins) for p in policies if not p.extras}
    assert len(managers) == len(blocked_sets) + 2  # each policy with extra rules has its own
    assert [names for names in managers.values() if "extra" in names or "extra too" in names] == [["extra"],
                                                                                                 ["extra too"]]


def _impl(impl: Impl) -> tuple[object, ...]:
    """What a compiled hook implementation is, whichever instance of an extra rule it is bound to."""
    return impl.plugin, getattr(impl.fn, "__func__", impl.fn), impl.trusted, impl.quiet_rule


@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_replay_gives_the_live_verdicts_at_the_same_calls(name: str, promptable: bool) -> None:
    steps = replayed_like_live(tg.GuardConfig(load_entrypoints=False, **CONFIGS[name]), name, random_turn, promptable)
    assert any(steps), "the random turns never made this policy fire: the comparison proves nothing"


def replayed_like_live(config: tg.GuardConfig, name: str, make_turn: Callable[[random.Random, int], RecordedTurn],
                       promptable: bool) -> list[list[Any]]:
    """Sixty turns of ``make_turn``, each replayed as the live guard ran it: the same verdicts at the
    same calls, the same halt and asks. The live steps, by turn."""
    policy, compiled = replay_policy(config)
    rng = random.Random(zlib.crc32(name.encode()))
    seen = []
    for n in range(60):
        turn = make_turn(rng, n)
        expected = live_steps(config, policy, turn, promptable)
        result, got = replayed_steps(compiled, turn, promptable)
        assert got == expected, (name, turn)
        halts = [s for s in expected if s.action is tg.Action.HALT]
        assert result.halt_call == ((halts[0].call + (halts[0].stage == "outcome")) if halts else 0)
        assert result.asks == tuple(s.call for s in expected if s.action is tg.Action.ASK)
        seen.append(expected)
    return seen


def test_peer_rule_halts_live_and_in_replay_at_the_fifth_identical_call() -> None:
    config = tg.GuardConfig(load_entrypoints=False, max_tool_calls_per_turn=0, streak_warn_at=0, streak_stop_at=0)
    policy, compiled = replay_policy(config, [IdenticalCallsRule(5)])
    turn = RecordedTurn("p", tuple(RecordedCall("read", {"a": 1}, None, tg.Outcome.OK) for _ in range(9)), 1)
    expected = live_steps(config, policy, turn, False)
    assert expected == [Step(5, "call", tg.Action.HALT, "streak")]
    digests = call_keys(turn.calls, config.key_mode)
    assert replay_turn(compiled, turn, [None] * 9, digests, cycle_starts(turn), promptable=False) == TurnResult(
        5, "streak", ())


class _FlakyPlugin:
    """A third-party check that raises at every 3rd call and answers a string at every 5th."""

    @hookimpl
    def turnguard_check_call(self, turn: Ledger, call: tg.ToolCall) -> tg.Verdict | None:
        if turn.tool_calls % 3 == 0:
            raise RuntimeError("flaky")
        return "not a verdict" if turn.tool_calls % 5 == 0 else None  # type: ignore[return-value]


class _FlakyRule:
    n = 10**9  # an extra rule's trigger, for ``Traits``: never
    label = "flaky plugin"

    def plugin(self) -> _FlakyPlugin:
        return _FlakyPlugin()


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_a_failing_plugin_is_isolated_as_the_live_guard_does(fail_mode: str) -> None:
    """Bad plugins tried: one that raises, one that returns a string instead of a ``Verdict``."""
    config = tg.GuardConfig(load_entrypoints=False, fail_mode=fail_mode, streak_warn_at=2, streak_stop_at=3)
    policy, compiled = replay_policy(config, [_FlakyRule()])
    rng = random.Random(2)
    halted = 0
    for n in range(40):
        turn = random_turn(rng, n)
        expected = live_steps(config, policy, turn, True)
        _, got = replayed_steps(compiled, turn, True)
        assert got == expected, (fail_mode, turn)
        halted += any(s.action is tg.Action.HALT and s.threshold == "plugin_error" for s in expected)
    assert bool(halted) == (fail_mode == "closed")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_starting_checks_late_from_a_shared_prefix_changes_nothing(name: str) -> None:
    """``earliest_call`` + ``SharedPrefix`` (the fast path) against checking every call."""
    config = tg.GuardConfig(load_entrypoints=False, **CONFIGS[name])
    base_policy, _ = replay_policy(tg.GuardConfig(load_entrypoints=False))
    started_late(config, base_policy.config, random_turn, random.Random(5), name)


def started_late(config: tg.GuardConfig, prefix_config: tg.GuardConfig,
                 make_turn: Callable[[random.Random, int], RecordedTurn], rng: random.Random, name: str) -> int:
    """Eighty turns of ``make_turn``, each replayed from its first call and from ``earliest_call`` on
    a ledger forked from a ``SharedPrefix`` counted under ``prefix_config``: the same result. How
    many started late."""
    policy, compiled = replay_policy(config)
    late_starts = 0
    for n in range(80):
        turn = make_turn(rng, n)
        digests = call_keys(turn.calls, config.key_mode)
        starts = cycle_starts(turn)
        outcomes = [c.outcome for c in turn.calls]
        lost = unfinished_calls(outcomes)
        facts = turn_facts(digests, as_failing(outcomes, lost), starts)
        for promptable in (False, True):
            full = replay_turn(compiled, turn, [None] * len(turn.calls), digests, starts, promptable=promptable,
                               lost=lost)
            first = earliest_call(policy, facts, promptable)
            ledger = SharedPrefix(prefix_config, turn, digests, starts, lost).fork_at(first, config, promptable)
            late = replay_turn(compiled, turn, [None] * len(turn.calls), digests, starts, promptable=promptable,
                               first_check=first, ledger=ledger, lost=lost)
            assert late == full, (name, promptable, turn)
            late_starts += ledger is not None and 1 < first <= len(turn.calls)
    return late_starts


CYCLE_REPEAT = {
    "cycle repeat 5/8": {"cycle_repeat_warn_at": 5, "cycle_repeat_stop_at": 8},
    "cycle repeat tight, streak too": {"cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 3, "streak_warn_at": 3,
                                       "streak_stop_at": 4, "streak_stop_on": "any"},
    "cycle repeat stop only, period 3": {"cycle_repeat_stop_at": 3, "cycle_repeat_max_period": 3},
    "cycle repeat reminding": {"cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 4, "remind_model": True},
    "cycle repeat, stateful, bytes": {"cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 4, "key_mode": "bytes",
                                      "stateful_tools": ("read", "run"), "streak_exempt_tools": ("grep",)},
    "cycle repeat under a small cap": {"cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 5, "soft_cap": 8,
                                       "hard_multiplier": 3, "stuck_repeat_threshold": 4},
}


@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("name", list(CYCLE_REPEAT))
def test_replay_gives_the_live_cycle_repeat_verdicts_on_alternating_loops(name: str, promptable: bool) -> None:
    config = tg.GuardConfig(load_entrypoints=False, **CYCLE_REPEAT[name])
    steps = replayed_like_live(config, name, alternating_turn, promptable)
    fired = sum(any(s.threshold == "cycle_repeat" for s in expected) for expected in steps)
    assert fired > 5, "the alternating turns seldom made cycle_repeat fire: the comparison proves little"


@pytest.mark.parametrize("name", list(CYCLE_REPEAT))
def test_starting_cycle_repeat_checks_late_from_a_shared_prefix_changes_nothing(name: str) -> None:
    """The prefix is counted under other levels (its runs do not depend on them) and forked."""
    config = tg.GuardConfig(load_entrypoints=False, **CYCLE_REPEAT[name])
    other = config.replace(cycle_repeat_warn_at=7, cycle_repeat_stop_at=9, stuck_repeat_threshold=UNREACHED)
    assert started_late(config, other, alternating_turn, random.Random(6), name) > 20


def test_fork_carries_the_cycle_runs_or_refuses() -> None:
    on = tg.GuardConfig(cycle_repeat_warn_at=5, cycle_repeat_stop_at=8)
    plain, cycling = Ledger(tg.GuardConfig(), turn_id="p"), Ledger(on, turn_id="c")
    for ledger in (plain, cycling):
        for name in "ab" * 6:
            seq = ledger.count_call(name.encode() * 16, name)
            ledger.record_outcome(seq, tg.Outcome.OK)
    with pytest.raises(ValueError, match="cycle_repeat"):
        plain.fork(on)  # its calls' cycle runs were never kept
    with pytest.raises(ValueError, match="cycle_repeat_max_period"):
        cycling.fork(on.replace(cycle_repeat_max_period=3))
    twin = cycling.fork(on.replace(cycle_repeat_stop_at=7))
    assert cycling.fork(tg.GuardConfig())._cyc is None  # off: nothing to carry
    assert twin._cyc is not None and twin._cyc.runs == cycling._cyc.runs and twin._cyc.stop == 6
    for name in "ab":
        seq = twin.count_call(name.encode() * 16, name)
        due = twin.record_outcome(seq, tg.Outcome.OK)
    assert due and twin._cyc.due == (tg.Level.STOP, 2, 12)  # the 7th repetition, at call 14


def test_cycle_starts_spread_calls_over_the_recorded_requests() -> None:
    def turn(n_calls: int, cycles: int | None, per_call: list[int] | None = None) -> RecordedTurn:
        calls = tuple(RecordedCall("t", i, None, tg.Outcome.OK, per_call[i] if per_call else None)
                      for i in range(n_calls))
        return RecordedTurn("c", calls, cycles)

    assert cycle_starts(turn(4, 2)) == [1, 0, 1, 0, 0]
    assert cycle_starts(turn(2, 4)) == [2, 1, 1]  # the last request (the final answer) after the last call
    assert cycle_starts(turn(3, None)) == [1, 0, 0, 0]
    assert cycle_starts(turn(0, 3)) == [3]
    assert cycle_starts(turn(3, 5, [1, 1, 3])) == [1, 0, 2, 2]


LONG_LOST = {
    "streak, cap off": {"soft_cap": 0},
    "streak tight, cap off": {"soft_cap": 0, "streak_warn_at": 2, "streak_stop_at": 3},
    "stateful, cycle repeat, cap off": {"soft_cap": 0, "stateful_tools": ("status",), "cycle_repeat_warn_at": 0,
                                        "cycle_repeat_stop_at": 40},
}


def long_turn_with_a_lost_outcome(rng: random.Random, n: int) -> RecordedTurn:
    """A few stateful polls, then a streak of one call whose first outcomes are lost, then denied
    (a denial leaves the failing count as it is) to about the live guard's wait for the lost ones
    (``GIVE_UP_AFTER`` checks), then failing: until the guard gives a lost call up it counts as a
    failure, after that it does not, so where it gives up decides the halt."""
    polls = [RecordedCall("status", {}, None, UNFINISHED if rng.random() < 0.3 else tg.Outcome.OK, None,
                          rng.choice(("r1", "r2"))) for _ in range(rng.randint(0, 6))]
    lost = {rng.randint(1, 3), *rng.sample(range(4, 40), rng.randint(0, 2))}
    length = GIVE_UP_AFTER + rng.randint(0, 3) * GIVE_UP_EVERY + rng.randint(-40, 40)
    streak = [RecordedCall("run", "make test", None, UNFINISHED if k in lost else tg.Outcome.DENIED)
              for k in range(1, length)]
    failing = [RecordedCall("run", "make test", None, tg.Outcome.ERROR)] * 30
    return RecordedTurn(f"long{n}", (*polls, *streak, *failing), None, False)


@pytest.mark.parametrize("name", list(LONG_LOST))
def test_replay_gives_up_a_lost_outcome_where_the_live_guard_does(name: str) -> None:
    """A call whose outcome never came is waited for, then given up, at the same checks live and
    in the replay, from the first call or from a shared prefix."""
    config = tg.GuardConfig(load_entrypoints=False, **LONG_LOST[name])
    policy, compiled = replay_policy(config)
    rng = random.Random(zlib.crc32(name.encode()))
    for n in range(2):
        turn = long_turn_with_a_lost_outcome(rng, n)
        expected = live_steps(config, policy, turn, False)
        result, got = replayed_steps(compiled, turn, False)
        assert got == expected, (name, n)
        digests, starts = call_keys(turn.calls, config.key_mode), cycle_starts(turn)
        lost = unfinished_calls([c.outcome for c in turn.calls])
        assert result.halt_call, "the turn's failures never halted it: the test checks nothing"
        for first in (f for f in (2, GIVE_UP_AFTER - 5, result.halt_call - 3) if f < result.halt_call):
            ledger = SharedPrefix(config, turn, digests, starts, lost).fork_at(first, config, False)
            assert replay_turn(compiled, turn, [None] * len(turn.calls), digests, starts, promptable=False,
                               first_check=first, ledger=ledger, lost=lost) == result
