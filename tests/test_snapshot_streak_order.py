"""A snapshot's current streak comes after its ended streaks: one whose ``facts.next`` (the
current streak's first check still to settle) is at or before an ended streak's last check is
refused at the resume, naming it, in the live turn's facts and in a shadow's alike. Resumed, such
a streak ended later behind the others, and the turn's own next snapshot was refused."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

import turnguard as tg
from random_snapshots import KEYS, facts_of, guard

STALE = {"stuck_signal": "stale_repeat", "stuck_repeat_threshold": 3}
GUARDS: dict[str, dict[str, Any]] = {
    "live": {},
    "live, polling": {"stateful_tools": ("run",)},
    "live, any failure": {"streak_stop_on": "any"},
    "shadow": {"shadow": {"sh": STALE}},
    "shadow, bytes": {"shadow": {"sh": {"key_mode": "bytes", "streak_warn_at": 2, "streak_stop_at": 3}}},
}


def snapshots(options: dict[str, Any], seed: int) -> Iterator[dict[str, Any]]:
    """The snapshot after each check of a random turn whose outcomes come in any order, some late."""
    rng = random.Random(seed)
    turn = guard(options).turn(durable=True, promptable=bool(seed % 2))
    waiting: list[tg.ToolCall] = []
    for i in range(rng.randint(2, 20)):
        if rng.random() < 0.2:
            turn.begin_cycle()
        call = tg.ToolCall(*rng.choice(KEYS), call_id=f"c{i}" if rng.random() < 0.7 else None)
        turn.check_call(call)
        waiting.append(call)
        while waiting and rng.random() < 0.4:
            done = waiting.pop(rng.randrange(len(waiting)))
            result = rng.choice(("a", "b")) if done.name == "run" else None
            turn.record_outcome(done, rng.choice(list(tg.Outcome)), result=result)
        yield json.loads(json.dumps(turn.snapshot()))
    turn.end()


@pytest.mark.parametrize("kind", list(GUARDS))
def test_a_current_streak_behind_an_ended_one_is_refused_naming_facts_next(kind):
    resumer = guard(GUARDS[kind])
    damaged = 0
    for seed in range(60):
        for state in snapshots(GUARDS[kind], seed):
            facts, path = facts_of(state)
            if not facts.get("ended") or (path != "facts" and state["plugins"]["shadow"]["runs"]["sh"]["halt"]):
                continue
            last = facts["ended"][-1]["last"]
            for behind in sorted({1, facts["ended"][-1]["next"], last}):
                mutant = copy.deepcopy(state)
                facts_of(mutant)[0]["next"] = behind
                facts_of(mutant)[0]["early"] = {}
                damaged += 1
                with pytest.raises(tg.SnapshotError) as refused:
                    resumer.resume(mutant)
                assert refused.value.field == f"{path}.next", str(refused.value)
            resumer.resume(state).suspend()  # the intact snapshot resumes
    assert damaged >= 30


def test_every_snapshot_a_turn_writes_has_its_current_streak_after_the_ended_ones():
    """What the refusal rests on, over the same turns."""
    seen = 0
    for kind, options in GUARDS.items():
        for seed in range(60):
            for state in snapshots(options, seed):
                facts, _ = facts_of(state)
                if facts.get("ended"):
                    assert facts["next"] > facts["ended"][-1]["last"], (kind, seed)
                    seen += 1
    assert seen > 100
