"""A snapshot's cycle runs wait for every check from their ``next`` to the turn's last: one whose
``waiting`` stops short of ``facts.seq`` (an entry dropped, all of them, ``next`` moved back) is
refused at the resume, naming ``cycle_runs``. Resumed, such runs would wait for ever for a check
whose outcome never comes there: no ``cycle_repeat`` level for the rest of the turn, and the
turn's own next snapshot refused."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import turnguard as tg
from random_snapshots import KEYS, guard

CYCLES = {"cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 4}
GUARDS: dict[str, dict[str, Any]] = {
    "cycles": CYCLES,
    "cycles, polling": {**CYCLES, "stateful_tools": ("run",)},
    "cycles, exempt": {**CYCLES, "streak_exempt_tools": ("ls",)},
    "shadow's cycles": {"shadow": {"cy": CYCLES}},
}


def snapshots(options: dict[str, Any], seed: int) -> Iterator[dict[str, Any]]:
    """The snapshot after each check of a random turn: batches whose outcomes come in any order
    (a polling tool's with a result), some left waiting, retries and answers."""
    rng = random.Random(seed)
    turn = guard(options).turn(durable=True, promptable=bool(seed % 2))
    waiting: list[tg.ToolCall] = []
    asks: list[tg.Verdict] = []
    for i in range(rng.randint(2, 16)):
        if rng.random() < 0.2:
            turn.begin_cycle()
        if rng.random() < 0.05:
            turn.retry()
        call = tg.ToolCall(*rng.choice(KEYS), call_id=f"c{i}")
        asks += [v for v in (turn.check_call(call),) if v.action is tg.Action.ASK]
        waiting.append(call)
        while waiting and rng.random() < 0.5:
            done = waiting.pop(rng.randrange(len(waiting)))
            result = rng.choice(("a", "b")) if done.name == "run" else None
            asks += [v for v in (turn.record_outcome(done, rng.choice(list(tg.Outcome)), result=result),)
                     if v.action is tg.Action.ASK]
        if asks and rng.random() < 0.3:
            turn.resolve(asks.pop(), rng.choice(("continue", "redirect")))
        yield json.loads(json.dumps(turn.snapshot()))
    turn.end()


def runs_of(state: dict[str, Any]) -> tuple[dict[str, Any], int, str]:
    """The cycle runs in ``state`` (the main ledger's, else the shadow's), their ledger's check
    count and the path of their field."""
    if "cycle_runs" in state["facts"]:
        return state["facts"]["cycle_runs"], state["facts"]["seq"], "facts.cycle_runs"
    facts = state["plugins"]["shadow"]["runs"]["cy"]["facts"]
    return facts["cycle_runs"], facts["seq"], "plugins.shadow.runs.cy.facts.cycle_runs"


def last_dropped(runs: dict[str, Any], seq: int) -> bool:
    return runs["waiting"].pop(str(seq), None) is not None


def all_dropped(runs: dict[str, Any], seq: int) -> bool:
    had = bool(runs["waiting"])
    runs["waiting"], runs["early"] = {}, {}
    runs.pop("restarts", None)
    return had


def next_moved_back(runs: dict[str, Any], seq: int) -> bool:
    if runs["waiting"] or seq < 1:
        return False
    runs["next"] = seq
    return True


GAPS: dict[str, Callable[[dict[str, Any], int], bool]] = {
    "the last waiting check dropped": last_dropped,
    "every waiting check dropped": all_dropped,
    "next moved back with none waiting": next_moved_back,
}


@pytest.mark.parametrize("kind", list(GUARDS))
@pytest.mark.parametrize("gap", list(GAPS))
def test_cycle_runs_that_stop_short_of_the_turns_last_check_are_refused_by_name(kind, gap):
    resumer = guard(GUARDS[kind])
    damaged = 0
    for seed in range(40):
        for state in snapshots(GUARDS[kind], seed):
            mutant = copy.deepcopy(state)
            runs, seq, field = runs_of(mutant)
            if not GAPS[gap](runs, seq):
                continue
            damaged += 1
            with pytest.raises(tg.SnapshotError) as refused:
                resumer.resume(mutant)
            assert refused.value.field.startswith(field), str(refused.value)
            resumer.resume(state).suspend()  # the intact snapshot resumes
    assert damaged >= 20


def test_a_real_snapshots_cycle_runs_wait_for_each_check_up_to_the_turns_last():
    """What the refusal rests on: every snapshot a turn writes has its cycle runs waiting for the
    checks from ``next`` to ``facts.seq``, none when ``next`` is the check after it."""
    seen = 0
    for kind, options in GUARDS.items():
        for seed in range(60):
            for state in snapshots(options, seed):
                runs, seq, _ = runs_of(state)
                assert sorted(map(int, runs["waiting"])) == list(range(runs["next"], seq + 1)), (kind, seed)
                seen += bool(runs["waiting"])
    assert seen > 100


def test_a_turn_resumed_from_runs_with_a_gap_would_have_missed_a_loop():
    """Why it matters: with the last waiting check dropped, a loop of two calls after the resume
    is never stopped; the intact snapshot stops it."""
    options = {**CYCLES, "streak_stop_at": 0, "streak_warn_at": 0}
    turn = guard(options).turn(durable=True)
    first, second = tg.ToolCall("ls", "a", call_id="a"), tg.ToolCall("run", {"t": 1}, call_id="b")
    turn.check_call(first)
    turn.check_call(second)
    intact = json.loads(json.dumps(turn.snapshot()))
    mutant = copy.deepcopy(intact)
    del mutant["facts"]["cycle_runs"]["waiting"][str(intact["facts"]["seq"])]
    with pytest.raises(tg.SnapshotError) as refused:
        guard(options).resume(mutant)
    assert refused.value.field == "facts.cycle_runs.waiting"
    resumed = guard(options).resume(intact)
    resumed.record_outcome(second, tg.Outcome.OK)
    resumed.record_outcome(first, tg.Outcome.OK)
    actions = []
    for i in range(8):
        call = tg.ToolCall(*KEYS[i % 2], call_id=f"n{i}")
        resumed.check_call(call)
        actions.append(resumed.record_outcome(call, tg.Outcome.OK).action)
    assert tg.Action.HALT in actions
