"""``Ledger.count_settled`` (calibrate's one-pass count of a turn's prefix) leaves every fact as
``begin_cycle``, ``count_call`` and ``record_outcome`` call by call do, or refuses and leaves
the ledger untouched where its state needs the general path."""

from __future__ import annotations

import random

import pytest

import turnguard as tg
from turnguard._ledger import Ledger

OUTCOMES = (tg.Outcome.OK, tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.DENIED, tg.Outcome.UNKNOWN)
COMPARED = [name for cls in Ledger.__mro__ for name in getattr(cls, "__slots__", ())
            if name not in ("__weakref__", "_started_at", "_opened_ns")]


def facts(ledger: Ledger) -> dict[str, object]:
    out = {}
    for name in COMPARED:
        value = getattr(ledger, name)
        out[name] = [e.state() for e in value] if name == "_ended" else value
    return out


def calls(rng: random.Random, n: int) -> tuple[list[bytes], list[str], list[tg.Outcome], list[int]]:
    keys = rng.randint(1, 8)
    digests = [bytes([rng.randrange(keys)]) * rng.choice((1, 1, 2)) for _ in range(n)]
    tools = [f"t{d[0] % 3}" for d in digests]
    return digests, tools, [rng.choice(OUTCOMES) for _ in range(n)], [rng.choice((0, 0, 1, 2)) for _ in range(n)]


def one_by_one(ledger: Ledger, digests, tools, outcomes, cycles) -> None:
    for digest, tool, outcome, begun in zip(digests, tools, outcomes, cycles, strict=True):
        for _ in range(begun):
            ledger.begin_cycle()
        ledger.record_outcome(ledger.count_call(digest, tool), outcome)


def config(rng: random.Random) -> tg.GuardConfig:
    return tg.GuardConfig(streak_stop_on=rng.choice(("error", "any")), stuck_repeat_threshold=rng.randint(1, 6),
                          max_tracked_keys=rng.choice((1, 3, 65536)), streak_warn_at=rng.choice((0, 2, 3)),
                          streak_stop_at=rng.choice((0, 3, 4)))


def prepared(rng: random.Random, cfg: tg.GuardConfig, head) -> Ledger:
    """A ledger with a history counted call by call: detections noted, a streak reset, a fork."""
    ledger = Ledger(cfg, turn_id="t")
    one_by_one(ledger, *head)
    if rng.random() < 0.3:
        ledger.note_detection(ledger.detect(tg.Threshold.STREAK, tg.Action.REMIND, tg.Level.WARN, 3).event)
    if rng.random() < 0.2:
        ledger.reset_streak()
    if rng.random() < 0.2:
        ledger = ledger.fork(cfg)
    return ledger


@pytest.mark.parametrize("seed", range(300))
def test_count_settled_leaves_the_facts_of_counting_call_by_call(seed):
    rng = random.Random(seed)
    cfg = config(rng)
    head, tail = calls(rng, rng.randint(0, 12)), calls(rng, rng.randint(0, 40))
    general = prepared(random.Random(seed), cfg, head)
    fast = prepared(random.Random(seed), cfg, head)
    one_by_one(general, *tail)
    assert fast.count_settled(*tail)
    assert facts(fast) == facts(general)


def test_count_settled_refuses_where_an_outcome_waits_or_the_signal_or_tools_differ():
    digests, tools, outcomes, cycles = calls(random.Random(1), 10)
    waiting = Ledger(tg.GuardConfig())
    waiting.count_call(b"a", "t")  # its outcome has not come
    stale = Ledger(tg.GuardConfig(stuck_signal="stale_repeat"))
    named = Ledger(tg.GuardConfig(stateful_tools=("t0",)))
    for ledger in (waiting, stale, named):
        before = facts(ledger)
        assert not ledger.count_settled(digests, tools, outcomes, cycles)
        assert facts(ledger) == before


def test_count_settled_wants_one_tool_outcome_and_cycle_count_per_call():
    with pytest.raises(ValueError):
        Ledger(tg.GuardConfig()).count_settled([b"a", b"b"], ["t"], [tg.Outcome.OK], [0])
