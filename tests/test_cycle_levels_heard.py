"""Every ``cycle_repeat`` level a turn reaches is heard by its observers exactly once: one report
gives one verdict, and the levels it reached besides come with the next reports; those the turn
ends before (owed, or held after an answer's recount) are heard as it ends, observed, in the order
the next reports would have carried them. Live observers (``turnguard_loop_detected``, the
detections metric), a shadow's (``turnguard_shadow_detected``) and calibrate's traced replay hear
as many as the turn's summary counts."""

from __future__ import annotations

import collections
import random

import pytest

import turnguard as tg
from test_cycle_answers import answered_turn, in_batches, one_at_a_time, settings
from test_cycle_repeat_reference import Call, random_turn
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.replay import CompiledPolicy, call_keys, cycle_starts, replay_turn, unfinished_calls
from turnguard._keys import Keyer

Heard = tuple[str, str, int]
"""A cycle detection heard: (action, level, period)."""


def period(event: tg.LoopDetectedEvent) -> int:
    """The period the detection's message names ("a cycle of K" / "the same K calls")."""
    words = event.message.split()
    return int(words[words.index("of") + 1] if "cycle" in words else words[words.index("same") + 1])


class Ear:
    """Hears every detection of the live turn and of its shadows."""

    def __init__(self) -> None:
        self.count = 0
        self.cycles: list[Heard] = []
        self.shadow: list[Heard] = []
        self.shadow_count = 0

    @tg.hookimpl
    def turnguard_loop_detected(self, event: tg.LoopDetectedEvent) -> None:
        self.count += 1
        if event.threshold is tg.Threshold.CYCLE_REPEAT:
            self.cycles.append((event.action.name, event.level.value, period(event)))

    @tg.hookimpl
    def turnguard_shadow_detected(self, event: tg.LoopDetectedEvent) -> None:
        self.shadow_count += 1
        if event.threshold is tg.Threshold.CYCLE_REPEAT:
            self.shadow.append((event.action.name, event.level.value, period(event)))


def levels(heard: list[Heard]) -> collections.Counter[tuple[str, int]]:
    return collections.Counter((level, k) for _, level, k in heard)


def unattended(warn: int, stop: int, k: int = 2, **more: object) -> tg.GuardConfig:
    return tg.GuardConfig(streak_warn_at=0, streak_stop_at=0, cycle_repeat_warn_at=warn, cycle_repeat_stop_at=stop,
                          cycle_repeat_max_period=max(k, 2), load_entrypoints=False, disable_plugins=("otel",),
                          **more)


def loop(k: int, times: int) -> list[tg.ToolCall]:
    return [tg.ToolCall(f"t{j}", {}, call_id=f"c{i}-{j}") for i in range(times) for j in range(k)]


WAYS = {"reversed": lambda calls, rng: calls[::-1], "first_last": lambda calls, rng: [*calls[1:], calls[0]],
        "shuffled": lambda calls, rng: rng.sample(calls, len(calls)), "in_order": lambda calls, rng: calls}


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize(("promptable", "remind"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_last_report_that_reaches_the_warning_and_the_stop_is_heard_for_both(k, way, promptable, remind):
    """A cycle repeated to its stop, all checked, then reported so that the last report settles
    the warning's call and the stop's: the report's verdict is the level that stops the flow
    first (the warning where it asks, else the stop); the other, owed, is heard observed as the
    turn ends, after it; as many heard as the summary counts."""
    ear = Ear()
    turn = tg.Guard(unattended(2, 3, k, remind_model=remind), plugins={"ear": ear}).turn(promptable=promptable)
    calls = loop(k, 3)
    for call in calls:
        turn.check_call(call)
    verdicts = [turn.record_outcome(call, "ok") for call in WAYS[way](calls, random.Random(k))]
    summary = turn.end()
    warn = "REMIND" if remind else "ASK" if promptable else "ALLOW"
    stop = "ASK" if promptable else "HALT"
    reported = [v.action.name for v in verdicts if v.event is not None]
    if len(reported) == 2:  # (the outcomes came so that an earlier report reached the warning)
        assert ear.cycles == [(warn, "warn", k), (stop, "stop", k)]
    elif warn == "ASK":
        assert reported == ["ASK"] and ear.cycles == [("ASK", "warn", k), ("ALLOW", "stop", k)]
    else:
        assert reported == [stop] and ear.cycles == [(stop, "stop", k), ("ALLOW", "warn", k)]
    assert ear.count == summary.detections == 2


@pytest.mark.parametrize("stops", [1, 2])
def test_levels_of_several_cycles_settled_by_one_last_report_are_each_heard_in_check_order(stops):
    """Two cycles reach their warning (and, with ``stops`` 2, a second cycle its stop) in one
    settling: one is the report's, the others are heard as the turn ends, oldest first."""
    ear = Ear()
    turn = tg.Guard(unattended(2, 3 if stops == 2 else 0), plugins={"ear": ear}).turn()
    names = "ABABCDEDE" if stops == 1 else "ABABCDCDCD"
    calls = [tg.ToolCall(n, {}, call_id=str(i)) for i, n in enumerate(names)]
    for call in calls:
        turn.check_call(call)
    for call in reversed(calls):
        turn.record_outcome(call, "ok")
    summary = turn.end()
    if stops == 1:
        assert ear.cycles == [("ALLOW", "warn", 2), ("ALLOW", "warn", 2)]
    else:
        assert ear.cycles == [("HALT", "stop", 2), ("ALLOW", "warn", 2), ("ALLOW", "warn", 2)]
    assert ear.count == summary.detections


def test_a_suspended_turn_leaves_its_owed_levels_to_the_turn_that_resumes_it():
    """Put aside, a turn says nothing of the levels it owes; the resumed turn hears them, once."""
    ears = Ear(), Ear()
    config = unattended(2, 0)
    turn = tg.Guard(config, plugins={"ear": ears[0]}).turn(durable=True)
    calls = [tg.ToolCall(n, {}, call_id=str(i)) for i, n in enumerate("ABABCDEDE")]
    for call in calls:
        turn.check_call(call)
    for call in reversed(calls):
        turn.record_outcome(call, "ok")
    state = turn.suspend()
    assert ears[0].cycles == [("ALLOW", "warn", 2)]
    resumed = tg.Guard(config, plugins={"ear": ears[1]}).resume(state)
    summary = resumed.end()
    assert ears[1].cycles == [("ALLOW", "warn", 2)] and summary.detections == 2


@pytest.mark.parametrize("seed", range(150))
def test_a_batch_turn_hears_the_levels_one_at_a_time_hears(seed):
    """Random turns (loops, denials, a polling tool, exempt calls, questions at checks, ASKs
    answered, snapshots resumed), in batches whose outcomes come in any order and one call at a
    time: each hears as many detections as its summary counts, and the same cycle levels."""
    calls, config, plugins = answered_turn(3_000 + seed)
    heard = []
    for batched in (False, True):
        ear = Ear()
        both = {**(plugins or {}), "ear": ear}
        run = (in_batches(calls, config, random.Random(seed), 0.2, both) if batched
               else one_at_a_time(calls, config, both))
        assert ear.count == run.detections
        heard.append(levels(ear.cycles))
    assert heard[0] == heard[1]


def _fresh(i: int) -> tg.ToolCall:
    return tg.ToolCall(f"fresh{i}", {}, call_id=f"fresh{i}")


def test_levels_heard_as_the_turn_ends_are_those_the_next_reports_would_carry_in_their_order():
    """Random batch turns: the levels heard as one ends are, in order, those the same turn would
    have heard from its next reports (of calls that reach no level), had it gone on."""
    compared = 0
    for seed in range(400):
        rng = random.Random(seed)
        config = settings(rng).replace(cycle_repeat_stop_at=0) if seed % 3 else settings(rng)
        calls = [Call(c.name, c.arg, c.outcome or tg.Outcome.OK, c.result) for c in random_turn(rng, 40)]
        promptable = bool(seed % 2)
        order = sorted(range(len(calls)), key=lambda _: rng.random())
        tails = []
        for go_on in (False, True):
            ear = Ear()
            turn = tg.Guard(config, plugins={"ear": ear}).turn(promptable=promptable)
            batch = [tg.ToolCall(c.name, {"arg": c.arg}, call_id=f"c{i}") for i, c in enumerate(calls)]
            halted = any([turn.check_call(call).action is tg.Action.HALT for call in batch])
            for i in order:
                turn.record_outcome(batch[i], calls[i].outcome, calls[i].result)
            before = len(ear.cycles)
            if go_on:
                for i in range(12):
                    halted = halted or turn.check_call(_fresh(i)).action is tg.Action.HALT
                    turn.record_outcome(_fresh(i), "ok")
            summary = turn.end()
            assert ear.count == summary.detections
            tails.append([(level, k) for _, level, k in ear.cycles[before:]])
        if not halted and tails[0]:
            compared += 1
            assert tails[0] == tails[1], seed
    assert compared >= 10


@pytest.mark.parametrize("seed", range(40))
def test_a_shadow_with_the_live_levels_hears_what_the_live_turn_hears(seed):
    """A shadow differing elsewhere only (``soft_cap``) hears the live turn's cycle levels, and
    as many detections as it counts, the levels its turn ends owing included (attended, its
    questions unanswered: no halt stops the reports of the batch)."""
    calls, config, _ = answered_turn(5_000 + seed)
    config = config.replace(shadow={"twin": {"soft_cap": 500}})
    ear = Ear()
    summaries = []

    class Summaries:
        @tg.hookimpl
        def turnguard_shadow_turn_ended(self, summary: tg.TurnSummary) -> None:
            summaries.append(summary)

    rng = random.Random(seed)
    turn = tg.Guard(config, plugins={"ear": ear, "summaries": Summaries()}).turn(promptable=True)
    batch = [tg.ToolCall(c.name, {"arg": c.arg}, call_id=f"c{i}") for i, c in enumerate(calls)]
    for call in batch:
        turn.check_call(call)
    for call, tool_call in sorted(zip(calls, batch, strict=True), key=lambda _: rng.random()):
        turn.record_outcome(tool_call, call.outcome, call.result)
    summary = turn.end()
    assert ear.count == summary.detections
    assert [s.detections for s in summaries] == [ear.shadow_count]
    assert levels(ear.shadow) == levels(ear.cycles)


@pytest.mark.parametrize("seed", range(40))
def test_calibrates_replay_traces_the_levels_the_live_turn_ends_owing(seed, tmp_path):
    """Outcomes that never come hold the cycles back, then a later report settles many calls at
    once: the live turn (one call at a time, unattended) and calibrate's traced replay of its
    recording hear the same cycle levels, those heard as the turn ends alike."""
    rng = random.Random(seed)
    config = unattended(rng.choice((2, 3)), rng.choice((0, 4, 5)), rng.randint(2, 4))
    calls = random_turn(rng, 120, lost=0.05)
    path = tmp_path / "turns.jsonl"
    ear = Ear()
    turn = tg.Guard(config.replace(recorder_path=str(path), digest_key="k" * 32), plugins={"ear": ear}).turn()
    for i, call in enumerate(calls):
        tool_call = tg.ToolCall(call.name, {"arg": call.arg}, call_id=f"c{i}")
        if turn.check_call(tool_call).action is tg.Action.HALT:
            break
        if call.outcome is not None and turn.record_outcome(tool_call, call.outcome,
                                                            call.result).action is tg.Action.HALT:
            break
    heard_at_end = len(ear.cycles)
    assert turn.end().detections == ear.count
    at_end = ear.cycles[heard_at_end:]
    recorded = next(iter(read_turns([str(path)], print)))
    policy = CompiledPolicy(Policy("p", config), Keyer("canonical"), {})
    trace: list = []
    replay_turn(policy, recorded, [None] * len(recorded.calls), call_keys(recorded.calls, "canonical"),
                cycle_starts(recorded), promptable=False, trace=trace,
                lost=unfinished_calls([c.outcome for c in recorded.calls]))
    cycles = [step for step in trace if step.threshold == "cycle_repeat"]
    assert len(cycles) == len(ear.cycles)
    assert [step.action.name for step in cycles if step.stage == "end"] == [a for a, _, _ in at_end]


@pytest.mark.parametrize("promptable", [False, True])
def test_the_detections_metric_counts_the_levels_heard_as_the_turn_ends(otel, promptable):
    """Through the OpenTelemetry plugin: the detections metric and the detection log count each
    level once, the one heard as the turn ends (no call of its own) included."""
    from turnguard.telemetry import _names as n

    config = unattended(2, 3).replace(disable_plugins=())
    turn = tg.Guard(config, **otel.providers()).turn(promptable=promptable)
    calls = loop(2, 3)
    for call in calls:
        turn.check_call(call)
    for call in reversed(calls):
        turn.record_outcome(call, "ok")
    turn.end()
    points = otel.points(n.METRIC_DETECTIONS[0])
    counted = collections.Counter({(p.attributes[n.LOOP_LEVEL], p.attributes[n.LOOP_ACTION]): p.value
                                   for p in points})
    first, last = ("warn", "stop") if promptable else ("stop", "warn")
    assert counted == {(first, "ask" if promptable else "halt"): 1, (last, "allow"): 1}
    assert len(otel.logs(n.LOOP_DETECTED_EVENT)) == 2
