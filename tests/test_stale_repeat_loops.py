"""The ``stale_repeat`` stuck signal against its documented promise (docs/stuck-signals.md): a key's
count runs since the latest call whose key is seen only once in the turn, so every loop shape
reaches D at the seed's ``repeat`` call once each of its calls has come round, edit-and-rerun never
counts, the signal never halts before the seed's, and calls past ``max_tracked_keys`` change no
tracked call's count under either signal."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

import turnguard as tg
from conftest import core_guard, distinct_call, drive, first_detection
from turnguard._config import STUCK_SIGNALS
from turnguard._ledger import Ledger

S = 4
"""The soft cap: small, so every loop below starts past it (its prefix is ``S + 1`` distinct calls)."""


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def loop_shapes(most_calls: int = 4, longest: int = 6) -> list[tuple[int, ...]]:
    """Every loop body up to ``longest`` calls over up to ``most_calls`` distinct calls, each once
    (calls numbered in order of first appearance: any other naming is the same loop)."""
    shapes: list[tuple[int, ...]] = []
    grow: list[tuple[int, ...]] = [()]
    for _ in range(longest):
        grow = [(*body, c) for body in grow for c in range(min(max(body, default=-1) + 2, most_calls))]
        shapes += grow
    return shapes


def halt_call(guard: tg.Guard, calls: list[tg.ToolCall]) -> int | None:
    with guard.turn() as turn:
        found = first_detection(drive(turn, calls, tg.Outcome.ERROR))
    assert found is None or found[1].threshold is tg.Threshold.SOFT_STUCK
    return None if found is None else found[0]


def all_come_round(calls: list[tg.ToolCall], start: int) -> int:
    """The call (1-based) at which every call of the loop beginning after ``start`` calls has been
    made twice: from there the stale count holds every call of the loop's."""
    seen: Counter[tg.ToolCall] = Counter()
    loop = set(calls[start:])
    for n, call in enumerate(calls[start:], start + 1):
        seen[call] += 1
        if all(seen[c] >= 2 for c in loop):
            return n
    raise AssertionError("the loop never came round")


def stuck_guards(d: int) -> dict[str, tg.Guard]:
    return {signal: core_guard(stuck_signal=signal, soft_cap=S, hard_multiplier=1000, stuck_repeat_threshold=d,
                               streak_warn_at=0, streak_stop_at=0) for signal in STUCK_SIGNALS}


def test_the_shapes_are_every_loop_of_up_to_four_calls_and_six_long():
    shapes = loop_shapes()
    assert len(shapes) == len(set(shapes)) == 1 + 2 + 5 + 15 + 51 + 187 and (0, 1, 0, 2, 3, 3) in shapes


@pytest.mark.parametrize("d", range(2, 9))
def test_every_loop_reaches_d_at_the_seeds_call_once_its_calls_have_come_round(d):
    """Every loop shape, nothing of it made before: the stale signal halts where the seed's does,
    unless the seed's reaches D before every call of the loop has been made twice (D=2, or a call
    repeated within a round); then no earlier than the seed's and no later than that call."""
    guards = stuck_guards(d)
    early = 0
    for shape in loop_shapes():
        body = [distinct_call(100 + c, "loop") for c in shape]
        calls = [distinct_call(i) for i in range(S + 1)] + body * (2 * d + 2)
        seed, stale = (halt_call(guards[signal], calls) for signal in STUCK_SIGNALS)
        assert seed is not None and stale is not None, shape
        come_round = all_come_round(calls, S + 1)
        if seed >= come_round:
            assert stale == seed, (shape, seed, stale)
        else:
            early += 1
            assert seed <= stale <= come_round, (shape, seed, stale, come_round)
    assert early or d > 6  # (the exception is real: D=2 always, A,A,B at D=3 ...)


@pytest.mark.parametrize("d", range(3, 9))
@pytest.mark.parametrize("period", range(2, 7))
def test_a_rotation_of_distinct_calls_halts_at_the_seeds_call_from_d_3(d, period):
    guards = stuck_guards(d)
    calls = [distinct_call(i) for i in range(S + 1)] + [distinct_call(100 + c, "loop") for c in range(period)] * d
    reach = S + 1 + (d - 1) * period + 1  # the first call's D-th time
    assert halt_call(guards["stale_repeat"], calls) == halt_call(guards["repeat"], calls) == reach


def reference_counts(keys: list[int]) -> list[int]:
    """The signal as documented, computed from scratch after every call: the largest count of one
    key since the latest call whose key has been seen once so far, as a running maximum."""
    made: Counter[int] = Counter()
    out, top = [], 0
    for n, k in enumerate(keys):
        made[k] += 1
        start = max((i for i in range(n + 1) if made[keys[i]] == 1), default=0)
        top = max(top, *Counter(keys[start:n + 1]).values())
        out.append(top)
    return out


def traffic(rng: random.Random, length: int) -> list[int]:
    """Edits (never made again), re-runs of a few tests, and loops of a few calls, mixed."""
    keys: list[int] = []
    while len(keys) < length:
        step = rng.random()
        if step < 0.3:
            keys.append(10_000 + len(keys))  # an edit
        elif step < 0.6:
            keys += [rng.randrange(4)] * rng.randint(1, 2)  # a test re-run (a flaky one twice)
        else:
            keys += [rng.randrange(12) for _ in range(rng.randint(1, 4))] * rng.randint(1, 4)  # a loop
    return keys[:length]


def stale_counts(keys: list[int], **options: object) -> list[int]:
    ledger = Ledger(tg.GuardConfig(stuck_signal="stale_repeat", **options))
    out = []
    for k in keys:
        ledger.count_call(key(k), "t")
        out.append(ledger.max_stale_repeat)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_the_stale_count_runs_since_the_latest_call_made_once(seed):
    rng = random.Random(seed)
    keys = traffic(rng, rng.randint(1, 120)) if seed % 2 else [rng.randrange(rng.randint(1, 30)) for _ in range(90)]
    assert stale_counts(keys) == reference_counts(keys)


@pytest.mark.parametrize("seed", range(40))
def test_stale_repeat_never_halts_before_the_seed(seed):
    rng = random.Random(seed)
    d = rng.randint(2, 8)
    guards = stuck_guards(d)
    names = {k: distinct_call(k, "tool") for k in range(10_200)}
    calls = [names[k] for k in traffic(rng, 200)]
    seed_halt, stale_halt = (halt_call(guards[signal], calls) for signal in STUCK_SIGNALS)
    assert stale_halt is None or (seed_halt is not None and stale_halt >= seed_halt), (seed_halt, stale_halt)


@pytest.mark.parametrize("d", range(3, 9))
def test_edit_and_rerun_never_counts_past_two(d):
    """Every re-run follows a new edit (a flaky one re-run at once): the count stays at 2."""
    keys = []
    for i in range(200):
        keys += [10_000 + i] + [1] * (1 + i % 2)
    assert stale_counts(keys)[-1] == 2
    calls = [tg.ToolCall("edit", {"patch": k}) if k >= 10_000 else tg.ToolCall("bash", "pytest -q") for k in keys]
    assert halt_call(stuck_guards(d)["stale_repeat"], calls) is None


def test_a_snapshot_in_the_middle_of_a_loop_resumes_its_stale_count():
    config = tg.GuardConfig(stuck_signal="stale_repeat", max_tracked_keys=64)
    for seed in range(100):
        rng = random.Random(seed)
        keys = traffic(rng, rng.randint(1, 60))
        more = traffic(rng, 40)
        whole, cut = Ledger(config), rng.randint(0, len(keys))
        for k in keys[:cut]:
            whole.count_call(key(k % 60), "t")
        back = Ledger.from_state(config, json.loads(json.dumps(whole.state())))
        twin = whole.fork(config.replace(soft_cap=20))
        assert back.state() == whole.state()
        for k in keys[cut:] + more:
            for ledger in (whole, back, twin):
                ledger.count_call(key(k % 60), "t")
            assert back.max_stale_repeat == twin.max_stale_repeat == whole.max_stale_repeat, seed


@pytest.mark.parametrize("past", [["xyz"], [{"news": None}], [{"news": "00" * 8, "counts": {"00" * 8: 0}}],
                                  [{"news": None, "counts": {}, "more": 1}], [7]])
def test_a_bad_stretch_is_a_snapshot_error_naming_it(past):
    ledger = Ledger(tg.GuardConfig(stuck_signal="stale_repeat"))
    for k in (1, 2, 3, 3, 4):  # 3 came round: the count reaches back to 2, the latest call made once
        ledger.count_call(key(k), "t")
    counts = {key(3).hex(): 2, key(2).hex(): 1}
    assert ledger.state()["past"] == [key(1).hex(), {"news": key(2).hex(), "counts": counts}]
    with pytest.raises(tg.SnapshotError) as refused:
        Ledger.from_state(ledger.config, {**ledger.state(), "past": past})
    assert refused.value.field.startswith("facts.past"), refused.value.field


def test_stretches_past_the_bound_are_refused():
    config = tg.GuardConfig(stuck_signal="stale_repeat", max_tracked_keys=10)
    ledger = Ledger(config)
    for k in (1, 2, 3, 3, 4):
        ledger.count_call(key(k), "t")
    state = ledger.state()
    stretch = state["past"][-1]  # two keys counted: a cost of 5 (stretch_cost)
    Ledger.from_state(config, {**state, "past": [stretch] * 2})
    with pytest.raises(tg.SnapshotError, match=r"facts\.past\[2\]"):
        Ledger.from_state(config, {**state, "past": [stretch] * 3})


# -- the table full: tracked calls count on --------------------------------------------------------


def counts_by_call(keys: list[int], signal: str, tracked_keys: int) -> list[tuple[int, int]]:
    ledger = Ledger(tg.GuardConfig(stuck_signal=signal, max_tracked_keys=tracked_keys))
    out = []
    for k in keys:
        ledger.count_call(key(k), "t")
        out.append((ledger.stuck_count, ledger.max_key_repeat))
    return out


@pytest.mark.parametrize("signal", STUCK_SIGNALS)
@pytest.mark.parametrize("seed", range(40))
def test_with_the_table_full_tracked_calls_count_as_if_the_others_were_not_made(signal, seed):
    """Calls first seen after ``max_tracked_keys`` keys change no count: every tracked call's
    counts are those of the same turn without them, whose table holds every call it makes."""
    rng = random.Random(seed)
    bound = rng.randint(1, 16)
    keys = traffic(rng, rng.randint(1, 150))
    tracked = list(dict.fromkeys(keys))[:bound]
    full = counts_by_call(keys, signal, bound)
    alone = counts_by_call([k for k in keys if k in tracked], signal, bound)
    assert [n for k, n in zip(keys, full, strict=True) if k in tracked] == alone
    assert all(n == before for k, n, before in zip(keys, full, [(0, 0), *full[:-1]], strict=True) if k not in tracked)
    if signal == "repeat":  # (the stale count keeps what it reaches back over within the same bound)
        assert alone == counts_by_call([k for k in keys if k in tracked], signal, 65536)


@pytest.mark.parametrize("signal", STUCK_SIGNALS)
def test_a_loop_of_a_tracked_and_an_untracked_call_halts_at_the_tracked_calls_own_count(signal):
    """The table is full: a test command made once before, then alternating with a call the table
    cannot hold. The turn halts at the same test run as the turn without the untracked call: the
    6th counted (the seed's: its 5th in the loop; the stale signal's: the loop's own 6th)."""
    test = tg.ToolCall("bash", "pytest -x tests/test_a.py")
    prefix = [test] + [distinct_call(i) for i in range(15)]  # 16 keys: the table is full
    guard = core_guard(stuck_signal=signal, soft_cap=20, max_tracked_keys=16, streak_warn_at=0, streak_stop_at=0)
    runs = halt_call(guard, prefix + [test] * 100) - 16
    assert runs == {"repeat": 5, "stale_repeat": 6}[signal]
    assert halt_call(guard, prefix + [tg.ToolCall("bash", "cat log.txt"), test] * 100) == 16 + 2 * runs


def test_untracked_calls_add_nothing_the_turn_keeps():
    """Past the table, a never-seen call is no news: it starts no stretch, so what the stale count
    keeps stays within ``max_tracked_keys`` however many such calls come (and a snapshot holds it)."""
    config = tg.GuardConfig(stuck_signal="stale_repeat", max_tracked_keys=8)
    ledger = Ledger(config)
    for i in range(10_000):
        ledger.count_call(key(i if i < 8 or i % 2 else 1), "t")
    state = ledger.state()
    assert len(state.get("past", [])) <= 8 and len(state["since_new"]) <= 8
    assert Ledger.from_state(config, json.loads(json.dumps(state))).state() == state
