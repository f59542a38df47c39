"""Answers under ``cycle_repeat`` (docs/usage.md "Parallel batches", docs/stuck-signals.md): an
answer restarts the cycle count at its place in check order, so a batch whose outcomes come in
any order, its questions answered, gets the questions of the same calls run one at a time; a turn
suspended before an answer and resumed gets them too; and ``turnguard calibrate``'s replay of a
recorded batch turn asks where the live turn asked.

The comparison is between two live turns (one call at a time, and in batches with outcomes
shuffled), over random turns of alternating loops, denials, a polling tool's results and an
exempt tool's calls, with and without questions asked at checks (``AskAtChecks``: an answer at a
check restarts the count at that call, even while earlier calls still wait); a shadow with the
live levels is compared with the live turn."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import turnguard as tg
from test_cycle_repeat_reference import EXEMPT, STATEFUL, Call, period_of, random_turn
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.replay import CompiledPolicy, call_keys, cycle_starts, replay_turn, unfinished_calls
from turnguard._keys import Keyer

Seen = tuple[str, str, str, int | None]
"""A detection as the host sees it: (action, threshold, level, period or ``None``)."""


@dataclass(frozen=True)
class Run:
    questions: list[Seen]
    """The ASKs, in order (each answered "continue")."""
    observed: collections.Counter[Seen]
    """The other detections (observed, reminders, the halt)."""
    detections: int
    """``TurnSummary.detections``."""


def settings(rng: random.Random) -> tg.GuardConfig:
    warn = rng.choice((0, 2, 3, 4, 5))
    stop = rng.choice([s for s in (0, 3, 4, 5, 8) if not warn or not s or s > warn])
    if not warn and not stop:
        warn = 3
    return tg.GuardConfig(cycle_repeat_warn_at=warn, cycle_repeat_stop_at=stop,
                          cycle_repeat_max_period=rng.randint(2, 4), remind_model=rng.random() < 0.3,
                          streak_warn_at=0, streak_stop_at=0, stateful_tools=STATEFUL, streak_exempt_tools=EXEMPT,
                          load_entrypoints=False, disable_plugins=("otel",))


class AskAtChecks:
    """A plugin that asks at the check of every ``edit`` call with argument 1: a question at a
    check (as the streak warning's), whose answer restarts the cycle count at that call, though
    calls before it may still wait for their outcome. (The streak's own questions would not do:
    one at a time, a cycle's answer restarts the streak between checks a batch makes at once.)"""

    @tg.hookimpl
    def turnguard_check_call(self, turn: tg.LedgerView, call: tg.ToolCall) -> tg.Verdict | None:
        if call.name == "edit" and call.args == {"arg": 1}:
            return turn.detect("asked", tg.Action.ASK, tg.Level.WARN, 1, call=call, message="asked")
        return None


def seen(verdict: tg.Verdict) -> Seen | None:
    if verdict.event is None:
        return None
    period = period_of(verdict) if verdict.threshold is tg.Threshold.CYCLE_REPEAT else None
    return (verdict.action.name, str(verdict.threshold), verdict.event.level.value, period)


class Host:
    """Drives a live turn: every ASK answered "continue" at once; ``pause`` says whether to put
    the turn aside (a snapshot resumed on a new guard) before an answer."""

    def __init__(self, config: tg.GuardConfig, pause: Callable[[], bool] = lambda: False,
                 plugins: dict[str, object] | None = None) -> None:
        self.config, self.pause, self.plugins = config, pause, plugins
        self.turn = self.guard().turn(promptable=True, durable=True)
        self.questions: list[Seen] = []
        self.observed: collections.Counter[Seen] = collections.Counter()

    def hear(self, verdict: tg.Verdict) -> bool:
        """True when the turn halted."""
        found = seen(verdict)
        if verdict.action is tg.Action.ASK:
            assert found is not None
            self.questions.append(found)
            if self.pause():
                self.turn = self.guard().resume(self.turn.snapshot(verdict))
            self.turn.resolve(verdict, "continue")
        elif found is not None:
            self.observed[found] += 1
        return verdict.action is tg.Action.HALT

    def guard(self) -> tg.Guard:
        return tg.Guard(self.config, plugins=self.plugins)

    def end(self) -> Run:
        return Run(self.questions, self.observed, self.turn.end().detections)


def tool_calls(calls: list[Call]) -> list[tg.ToolCall]:
    return [tg.ToolCall(c.name, {"arg": c.arg}, call_id=f"c{i}") for i, c in enumerate(calls)]


def one_at_a_time(calls: list[Call], config: tg.GuardConfig, plugins: dict[str, object] | None = None) -> Run:
    host = Host(config, plugins=plugins)
    for call, tool_call in zip(calls, tool_calls(calls), strict=True):
        if host.hear(host.turn.check_call(tool_call)):
            break
        if host.hear(host.turn.record_outcome(tool_call, call.outcome, call.result)):
            break
    return host.end()


def in_batches(calls: list[Call], config: tg.GuardConfig, rng: random.Random, pause: float = 0.0,
               plugins: dict[str, object] | None = None) -> Run:
    """Batches of 1 to 6 calls: all checked, then their outcomes in a random order."""
    host = Host(config, lambda: rng.random() < pause, plugins)
    pending = list(zip(calls, tool_calls(calls), strict=True))
    halted = False
    while pending and not halted:
        size = rng.randint(1, 6)
        batch, pending = pending[:size], pending[size:]
        for _, tool_call in batch:
            halted = halted or host.hear(host.turn.check_call(tool_call))
        rng.shuffle(batch)
        for call, tool_call in batch:
            if halted:
                break
            halted = host.hear(host.turn.record_outcome(tool_call, call.outcome, call.result))
    return host.end()


def answered_turn(seed: int) -> tuple[list[Call], tg.GuardConfig, dict[str, object] | None]:
    """A random turn whose outcomes all come; every other one with questions at checks too."""
    rng = random.Random(seed)
    config = settings(rng)
    calls = [Call(c.name, c.arg, c.outcome or tg.Outcome.OK, c.result) for c in random_turn(rng)]
    return calls, config, {"asker": AskAtChecks()} if seed % 2 else None


def assert_same_questions(batched: Run, sequential: Run) -> None:
    """The same questions, the cycles' in the same order (a batch asks its checks' before its
    outcomes'); the same detections in all; what a batch observed (reminders) is what one at
    a time observed, but for those the turn ended before a report could carry them (its
    observers hear them as it ends, ``test_cycle_levels_heard.py``)."""
    assert [q for q in batched.questions if q[1] == "cycle_repeat"] == [
        q for q in sequential.questions if q[1] == "cycle_repeat"]
    assert sorted(batched.questions) == sorted(sequential.questions)
    assert batched.detections == sequential.detections
    assert not batched.observed - sequential.observed


@pytest.mark.parametrize("seed", range(300))
def test_a_batch_answered_gets_the_questions_of_its_calls_run_one_at_a_time(seed):
    calls, config, plugins = answered_turn(seed)
    rng = random.Random(10_000 + seed)
    assert_same_questions(in_batches(calls, config, rng, plugins=plugins), one_at_a_time(calls, config, plugins))


@pytest.mark.parametrize("seed", range(60))
def test_a_batch_suspended_before_its_answers_gets_the_same_questions(seed):
    """Before each answer, now and then, the turn is put aside and resumed on another guard: the
    answer's place (a check, a level's call, the calls settled after it) travels in the snapshot."""
    calls, config, plugins = answered_turn(500 + seed)
    rng = random.Random(20_000 + seed)
    assert_same_questions(in_batches(calls, config, rng, 0.5, plugins), one_at_a_time(calls, config, plugins))


def alternating(n: int) -> list[Call]:
    return [Call("read" if i % 2 == 0 else "list", 0, tg.Outcome.OK, None) for i in range(n)]


@pytest.mark.parametrize("profile", ["warn 5", "recommended"])
@pytest.mark.parametrize(("first", "expected"), [(15, [None, 20, 30, 40]), (18, [None, 20, 30, 40]),
                                                 (30, [None, 31, 32, 40])])
def test_an_answer_to_a_batchs_level_counts_the_calls_settled_after_it_afresh(profile, first, expected):
    """read, list alternating 40 times, attended, the first ``first`` calls one batch whose
    outcomes come in reverse (``None``: asked at their report): the warning asks at call 10, 20,
    30, 40 one at a time, and as often here: the answer restarts the count after call 10, not
    after the last call that report settled. Where the calls settled after it reach the level
    again (20, 30 within the batch), the next outcome asks about it."""
    base = tg.PROFILES["recommended"] if profile == "recommended" else tg.GuardConfig(
        streak_warn_at=0, streak_stop_at=0, cycle_repeat_warn_at=5, cycle_repeat_stop_at=0)
    config = base.replace(load_entrypoints=False, disable_plugins=("otel",))
    calls = alternating(40)
    host = Host(config)
    batch = tool_calls(calls)
    asked_at = []
    for tool_call in batch[:first]:
        host.turn.check_call(tool_call)
    for tool_call in reversed(batch[:first]):
        before = len(host.questions)
        host.hear(host.turn.record_outcome(tool_call, tg.Outcome.OK))
        if len(host.questions) > before:
            asked_at.append(None)  # (the report of call 1 settles them all)
    for i, tool_call in enumerate(batch[first:], first + 1):
        host.turn.check_call(tool_call)
        before = len(host.questions)
        host.hear(host.turn.record_outcome(tool_call, tg.Outcome.OK))
        if len(host.questions) > before:
            asked_at.append(i)
    assert asked_at == expected
    assert host.end() == one_at_a_time(calls, config)


def test_calls_checked_before_an_answer_at_a_check_count_in_the_old_count():
    """A, A, B six times, attended, the streak warning at 2 (asked at each second A's check): one
    batch whose outcomes come after every check gets no cycle question, as one at a time."""
    config = tg.GuardConfig(streak_warn_at=2, streak_stop_at=0, cycle_repeat_warn_at=3, cycle_repeat_stop_at=5,
                            load_entrypoints=False, disable_plugins=("otel",))
    calls = [Call(name, 0, tg.Outcome.OK, None) for name in "aab" * 6]
    host = Host(config)
    batch = tool_calls(calls)
    for tool_call in batch:
        host.hear(host.turn.check_call(tool_call))
    for call, tool_call in zip(calls, batch, strict=True):
        host.hear(host.turn.record_outcome(tool_call, call.outcome))
    batched = host.end()
    assert [q[1] for q in batched.questions] == ["streak"] * 6
    assert batched == one_at_a_time(calls, config)


def detected(config: tg.GuardConfig, names: str, batch: bool) -> tuple[list[tuple[str, str]], int]:
    heard: list[tuple[str, str]] = []

    class Listener:
        @tg.hookimpl
        def turnguard_loop_detected(self, event: tg.LoopDetectedEvent) -> None:
            heard.append((str(event.threshold), event.level.value))

    turn = tg.Guard(config, plugins={"listener": Listener()}).turn()
    calls = [tg.ToolCall(n, {}, call_id=str(i)) for i, n in enumerate(names)]
    if batch:
        for call in calls:
            turn.check_call(call)
        for call in reversed(calls):
            turn.record_outcome(call, "ok")
    else:
        for call in calls:
            turn.check_call(call)
            turn.record_outcome(call, "ok")
    return heard, turn.end().detections


def test_a_settling_that_reaches_two_levels_reports_one_and_owes_the_other():
    """Unattended, warn at 2: A,B,A,B then C,D,E,D,E reach two warnings. One report settling both
    (outcomes in reverse) observes the first; the second is owed: the next report carries it, and
    a turn that ends first tells it to its observers as it ends, as one at a time does."""
    config = tg.GuardConfig(streak_warn_at=0, streak_stop_at=0, cycle_repeat_warn_at=2, cycle_repeat_stop_at=0,
                            load_entrypoints=False, disable_plugins=("otel",))
    assert detected(config, "ABABCDEDE", batch=False) == ([("cycle_repeat", "warn")] * 2, 2)
    assert detected(config, "ABABCDEDE", batch=True) == ([("cycle_repeat", "warn")] * 2, 2)
    turn = tg.Guard(config).turn()
    calls = [tg.ToolCall(n, {}, call_id=str(i)) for i, n in enumerate("ABABCDEDE")]
    for call in calls:
        turn.check_call(call)
    verdicts = [turn.record_outcome(call, "ok") for call in reversed(calls)]
    later = tg.ToolCall("F", {}, call_id="f")
    turn.check_call(later)
    owed = turn.record_outcome(later, "ok")
    assert [v.event.level for v in verdicts if v.event is not None] == [tg.Level.WARN]
    assert owed.event is not None and owed.threshold is tg.Threshold.CYCLE_REPEAT and period_of(owed) == 2


@pytest.mark.parametrize("seed", range(40))
def test_calibrates_replay_of_a_recorded_batch_turn_asks_where_it_asked(seed, tmp_path):
    """A batch turn, its questions answered, recorded; ``turnguard calibrate``'s replay (one call
    at a time, in check order) asks the same questions: as many, at the same levels."""
    calls, config, _ = answered_turn(900 + 2 * seed)
    path = tmp_path / "turns.jsonl"
    live = in_batches(calls, config.replace(recorder_path=str(path), digest_key="k" * 32), random.Random(seed))
    recorded = next(iter(read_turns([str(path)], print)))
    policy = CompiledPolicy(Policy("p", config.replace(recorder_path=None)), Keyer("canonical"), {})
    trace: list = []
    result = replay_turn(policy, recorded, [None] * len(recorded.calls), call_keys(recorded.calls, "canonical"),
                         cycle_starts(recorded), promptable=True, trace=trace,
                         lost=unfinished_calls([c.outcome for c in recorded.calls]))
    assert len(result.asks) == len(live.questions)
    assert [step.threshold for step in trace if step.action is tg.Action.ASK] == [q[1] for q in live.questions]


class ShadowListener:
    """Hears a shadow's would-be cycle detections."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    @tg.hookimpl
    def turnguard_shadow_detected(self, turn: tg.LedgerView, policy: str, event: tg.LoopDetectedEvent) -> None:
        if str(event.threshold) == "cycle_repeat":
            self.heard.append((event.action.name, event.level.value))


@pytest.mark.parametrize("seed", range(60))
def test_a_shadow_with_the_live_cycle_levels_restarts_where_the_live_turn_does(seed):
    """A shadow that differs from the live configuration elsewhere only (``soft_cap``) hears the
    live answers (queued, applied before its next count): its would-be cycle questions are the
    live turn's, in batches as one at a time."""
    calls, config, plugins = answered_turn(700 + seed)
    config = config.replace(shadow={"twin": {"soft_cap": 500}})
    shadows = []
    for batched in (False, True):
        listener = ShadowListener()
        with_listener = {**(plugins or {}), "listener": listener}
        live = (in_batches(calls, config, random.Random(seed), 0.0, with_listener) if batched
                else one_at_a_time(calls, config, with_listener))
        asked = [(action, level) for action, level in listener.heard if action == "ASK"]
        assert asked == [(q[0], q[2]) for q in live.questions if q[1] == "cycle_repeat"]
        shadows.append(asked)
    assert shadows[0] == shadows[1]
