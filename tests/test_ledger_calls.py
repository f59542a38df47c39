"""``CallCounts`` (``turnguard._ledger._calls``): calls, model requests, key repeats, the stuck
signals' counts and the bound on tracked keys, each key counted by ``count_key`` (defined beside
``count_call``, which inlines it, in ``ledger._streaks``), with no streak in sight."""

from __future__ import annotations

import pytest

import turnguard as tg
from turnguard._ledger._calls import CallCounts
from turnguard._ledger._streaks import Streaks


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def counted(keys, **settings) -> CallCounts:
    counts = Streaks(tg.GuardConfig(**settings))
    for at, k in enumerate(keys, 1):
        counts.count_key(key(k), at)
    return counts


def test_repeats_are_counted_per_key_and_the_largest_kept():
    counts = counted([1, 2, 2, 3, 2])
    assert counts.repeats_of(key(2)) == 3 and counts.repeats_of(key(9)) == 0
    assert counts.max_key_repeat == 3 and counts.distinct_keys == 3


def test_the_first_stuck_call_is_the_call_number_the_repeat_reached_the_threshold_at():
    counts = counted([1, 1, 2, 1], stuck_repeat_threshold=3)
    assert counts.first_stuck_call == 4 and counts.stuck_count == 3


def test_past_max_tracked_keys_a_new_key_counts_once_and_marks_the_overflow():
    counts = counted([1, 2, 3, 3, 3], max_tracked_keys=2)
    assert counts.distinct_keys == 2 and counts.keys_overflowed and counts.max_key_repeat == 1


def test_the_stale_signal_restarts_at_a_never_seen_key_and_the_repeat_signal_does_not():
    keys = [1, 1, 1, 2, 1]  # key 2 is news: key 1's stale count starts afresh after it
    assert counted(keys, stuck_signal="stale_repeat").stuck_count == 3
    assert counted(keys, stuck_signal="stale_repeat").max_stale_repeat == 3
    assert counted(keys).stuck_count == 4 and counted(keys).max_stale_repeat == 0


def test_a_loop_coming_round_credits_the_stale_count_as_the_repeat_count_would():
    loop = [1, 2, 3] * 4
    assert counted(loop, stuck_signal="stale_repeat").stuck_count == counted(loop).stuck_count == 4


def test_calls_this_cycle_count_from_the_latest_model_request():
    counts = CallCounts(tg.GuardConfig())
    counts.begin_cycle()
    counts.tool_calls = 3  # (a check counts the call; CallCounts keeps the number)
    counts.begin_cycle()
    counts.tool_calls = 5
    assert counts.cycles == 2 and counts.calls_this_cycle == 2


def test_forgetting_the_repeats_rolls_the_calls_back_to_the_cycle_start():
    counts: CallCounts = counted([1, 1, 1], stuck_repeat_threshold=2)
    counts.tool_calls = 3
    counts.forget_repeats()
    assert (counts.tool_calls, counts.max_key_repeat, counts.distinct_keys, counts.first_stuck_call) == (0, 0, 0, 0)
    assert counts.retries == 1


@pytest.mark.parametrize("outcome", list(tg.Outcome))
def test_every_outcome_kind_is_counted_from_zero(outcome):
    counts = CallCounts(tg.GuardConfig())
    assert counts.outcomes(outcome) == 0
    assert counts.outcome_counts() == {o.value: 0 for o in tg.Outcome}
