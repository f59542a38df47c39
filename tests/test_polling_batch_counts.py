"""The stuck signal of a turn that lists stateful tools counts its calls in check order, whatever
order a batch's outcomes come in.

A stateful tool's repeat is counted at its outcome, keyed with its result (docs/polling.md). Under
``stuck_signal="stale_repeat"`` the count depends on the order keys are counted in (a never-seen
key is news and starts the count afresh), so a batch whose outcomes came in another order than its
checks, or whose later calls of other tools were checked before a poll's result came, must count
as the same calls run one at a time: the live guard, a shadow and ``turnguard calibrate``'s replay
(one at a time, in check order) then agree. Random batches of stateful and other tools, results
that change, stay or are missing, outcomes shuffled, lost, or the turn suspended mid-batch.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from conftest import CORE_ONLY
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_turns

Call = tuple[str, str, str, str | None]
"""(tool, argument, outcome, result)."""
Batch = tuple[list[Call], list[int]]
"""The calls of one model response, and the order their outcomes are reported in (indexes; a
missing index: that outcome never comes)."""

SIGNALS = ("stale_repeat", "repeat")
"""Under ``repeat`` the count is the number of sightings, whatever their order (a reversed batch
may halt at an outcome before its last: the halt compared is the threshold); the call at which it
first held (``first_stuck_call``) is placed in check order under both."""


def config(signal: str, **options: object) -> tg.GuardConfig:
    return tg.GuardConfig(**{**CORE_ONLY, "stateful_tools": ("poll",), "streak_exempt_tools": ("sleep",),
                             "stuck_signal": signal, "soft_cap": 12, "stuck_repeat_threshold": 4,
                             "streak_warn_at": 0, "streak_stop_at": 0, **options})


def random_batches(rng: random.Random, *, lost: float = 0.0) -> list[Batch]:
    batches = []
    for _ in range(rng.randint(2, 14)):
        calls = [(rng.choice(("poll", "poll", "poll", "run", "run", "sleep")), rng.choice("aab"),
                  rng.choice(("ok", "ok", "error", "denied")), rng.choice(("r1", "r1", "r2", "r3", None)))
                 for _ in range(rng.choice((1, 2, 3, 4, 6)))]
        order = [i for i in range(len(calls)) if rng.random() >= lost]
        rng.shuffle(order)
        batches.append((calls, order))
    return batches


def one_at_a_time(batches: list[Batch]) -> list[Batch]:
    """The same calls, each reported before the next is checked (a lost outcome stays lost)."""
    return [([call], [0] if i in order else []) for calls, order in batches for i, call in enumerate(calls)]


def drive(guard: tg.Guard, batches: list[Batch], *,
          suspend_at: int | None = None) -> tuple[tuple[object, ...], str | None]:
    """Run the batches unattended to their end, going on past a HALT (a halted turn counts no
    more calls); the counts and the first HALT's threshold. ``suspend_at``: the turn is suspended and
    resumed (through JSON) after that many checks, mid-batch."""
    turn = guard.turn(promptable=False)
    halt, checks = None, 0
    for calls, order in batches:
        turn.begin_cycle()
        objects = []
        for tool, arg, _, _ in calls:
            call = tg.ToolCall(tool, {"arg": arg}, call_id=f"c{checks}")
            verdict = turn.check_call(call)
            halt = halt or (str(verdict.threshold) if verdict.action is tg.Action.HALT else None)
            objects.append(call)
            checks += 1
            if checks == suspend_at:
                turn = guard.resume(json.loads(json.dumps(turn.suspend())))
        for i in order:
            _, _, outcome, result = calls[i]
            verdict = turn.record_outcome(objects[i], outcome, result=result)
            halt = halt or (str(verdict.threshold) if verdict.action is tg.Action.HALT else None)
    summary = turn.end()
    return (summary.max_key_repeat, turn.ledger.max_stale_repeat, summary.stuck, summary.first_stuck_call), halt


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("lost", [0.0, 0.15], ids=["every-outcome", "some-lost"])
def test_a_batchs_stuck_signal_is_the_one_its_calls_get_one_at_a_time(signal, lost):
    rng = random.Random(f"{signal}{lost}")
    differed = 0
    for n in range(300):
        batches = random_batches(rng, lost=lost)
        unbounded = config(signal, soft_cap=1000)  # (no halt: every count is taken)
        whole, _ = drive(tg.Guard(unbounded, environ={}), one_at_a_time(batches))
        assert drive(tg.Guard(unbounded, environ={}), batches)[0] == whole, (n, batches)
        whole_halt = drive(tg.Guard(config(signal), environ={}), one_at_a_time(batches))[1]
        assert drive(tg.Guard(config(signal), environ={}), batches)[1] == whole_halt, (n, batches)
        differed += [c for c, _ in batches] != [c for c, _ in one_at_a_time(batches)]
    assert differed > 100, "few batches: the comparison proves little"


@pytest.mark.parametrize("signal", SIGNALS)
def test_a_turn_suspended_mid_batch_counts_as_the_whole_turn(signal):
    rng = random.Random(signal)
    for n in range(120):
        batches = random_batches(rng)
        total = sum(len(calls) for calls, _ in batches)
        unbounded = config(signal, soft_cap=1000)
        whole, _ = drive(tg.Guard(unbounded, environ={}), batches)
        for cut in range(1, total):
            resumed, _ = drive(tg.Guard(unbounded, environ={}), batches, suspend_at=cut)
            assert resumed == whole, (n, cut, batches)


def test_a_shadow_listing_the_polls_counts_a_batch_as_a_live_guard_under_its_configuration():
    shadow = {"soft_cap": 12, "stuck_repeat_threshold": 4, "stuck_signal": "stale_repeat",
              "stateful_tools": ["poll"], "streak_warn_at": 0, "streak_stop_at": 0}
    main = tg.GuardConfig(soft_cap=0, streak_warn_at=0, streak_stop_at=0, shadow={"s": shadow},
                          disable_plugins=("otel", "recorder"), load_entrypoints=False)
    heard: dict[str, tg.TurnSummary] = {}

    class Listen:
        @tg.hookimpl
        def turnguard_shadow_turn_ended(self, policy, summary):
            heard[policy] = summary

    rng = random.Random(7)
    stuck = 0
    for n in range(150):
        batches = random_batches(rng)
        alone, halt = drive(tg.Guard(config("stale_repeat"), environ={}), one_at_a_time(batches))
        guard = tg.Guard(main, environ={})
        guard.register(Listen())
        drive(guard, batches)
        assert heard["s"].stuck == alone[2], (n, batches)
        assert (heard["s"].threshold == tg.Threshold.SOFT_STUCK) == (halt == "soft_stuck"), (n, batches)
        stuck += alone[2]
    assert stuck > 20


@pytest.mark.parametrize("signal", SIGNALS)
def test_calibrate_replays_a_recorded_batched_polling_turn_to_the_live_threshold(tmp_path: Path, signal):
    """Recorded live (batches, shuffled outcomes), replayed by calibrate under the same
    configuration: the same halt threshold (the replay runs the calls one at a time)."""
    live = config(signal, recorder_path=str(tmp_path / "turns.jsonl"), disable_plugins=("shadow", "otel"))
    rng = random.Random(11)
    scripts = [random_batches(rng) for _ in range(200)]
    truths = []
    guard = tg.Guard(live, environ={})
    for i, batches in enumerate(scripts):
        turn = guard.turn(turn_id=f"t{i}", promptable=False)
        threshold = None
        for calls, order in batches:
            turn.begin_cycle()
            objects = [tg.ToolCall(tool, {"arg": arg}) for tool, arg, _, _ in calls]
            verdicts = [turn.check_call(call) for call in objects]
            verdicts += [turn.record_outcome(objects[k], calls[k][2], result=calls[k][3]) for k in order]
            halts = [v for v in verdicts if v.action is tg.Action.HALT]
            if halts:
                threshold = str(halts[0].threshold)
                break
        turn.end()
        truths.append(threshold)
    guard.shutdown()
    turns = {t.id: t for t in read_turns([tmp_path / "turns.jsonl"], print)}
    calibrator = Calibrator([Policy("live", config(signal), is_default=True)])
    replayed = []
    for i in range(len(scripts)):
        got = calibrator.results(turns[f"t{i}"])[0].get("unattended")
        replayed.append(got.threshold if got is not None and got.halt_call else None)
    assert replayed == truths
    assert truths.count("soft_stuck") > 20


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("threshold", [2, 3, 4])
def test_the_first_stuck_call_of_a_batch_is_the_one_at_a_time_one_in_every_outcome_order(signal, threshold):
    """Every order of a batch's outcomes (all permutations), batches of stateful polls whose results
    stay or change mixed with other tools' calls: the counts and ``first_stuck_call`` are those of
    the same calls one at a time, and the halt's threshold too."""
    rng = random.Random(f"{signal}{threshold}")
    named = 0
    for n in range(12):
        prefix = random_batches(rng)[:2]
        calls = [(rng.choice(("poll", "poll", "poll", "run")), rng.choice("aab"), rng.choice(("ok", "ok", "denied")),
                  rng.choice(("r1", "r1", "r1", "r2", None))) for _ in range(rng.choice((3, 4, 5)))]
        unbounded = config(signal, soft_cap=1000, stuck_repeat_threshold=threshold)
        bounded = config(signal, stuck_repeat_threshold=threshold, soft_cap=3)
        for order in itertools.permutations(range(len(calls))):
            batches = [*prefix, (calls, list(order)), (calls, list(order))]
            whole, _ = drive(tg.Guard(unbounded, environ={}), one_at_a_time(batches))
            assert drive(tg.Guard(unbounded, environ={}), batches)[0] == whole, (n, order, batches)
            whole_halt = drive(tg.Guard(bounded, environ={}), one_at_a_time(batches))[1]
            assert drive(tg.Guard(bounded, environ={}), batches)[1] == whole_halt, (n, order, batches)
            named += whole[3] > 0
    assert named > 150, "few turns reach the stuck signal: the comparison proves little"


@pytest.mark.parametrize("signal", SIGNALS)
def test_the_defects_case_six_identical_polls_name_the_sixth_in_any_order(signal):
    batch = [("poll", "a", "ok", "same")] * 6
    for order in itertools.permutations(range(6)):
        counts, _ = drive(tg.Guard(config(signal, soft_cap=1000, stuck_repeat_threshold=6), environ={}),
                          [(batch, list(order))])
        assert counts[3] == 6, order
