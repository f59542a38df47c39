"""``Streaks`` (``turnguard._ledger._streaks``) on its own: a checked call joins its streak, and
outcomes settle there in check order, whatever order they arrive in."""

from __future__ import annotations

import random

import pytest

import turnguard as tg
from turnguard._ledger._calls import CallCounts
from turnguard._ledger._streaks import EndedStreak, Streaks

ERROR, OK, DENIED = tg.Outcome.ERROR, tg.Outcome.OK, tg.Outcome.DENIED


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def streaks(**settings) -> Streaks:
    return Streaks(tg.GuardConfig(**settings))


def test_identical_calls_make_a_streak_and_a_different_one_ends_it():
    s = streaks()
    for k in (1, 1, 1, 2):
        s.count_call(key(k), "t")
    assert s.streak_length == 1 and s.streak_digest == key(2) and s.checks == 4 and s.tool_calls == 4
    assert s.max_key_repeat == 3


def test_errors_count_denials_keep_and_successes_reset_the_failing_count():
    s = streaks()
    lengths = []
    for outcome in (ERROR, ERROR, DENIED, ERROR, OK):
        s.record_outcome(s.count_call(key(1), "t"), outcome)
        lengths.append(s.failing_streak_length)
    assert lengths == [1, 2, 2, 3, 0] and s.stop_count == 3


def test_an_outcome_before_an_earlier_calls_waits_and_settles_in_check_order():
    s = streaks()
    first, second = s.count_call(key(1), "t"), s.count_call(key(1), "t")
    s.record_outcome(second, ERROR)
    assert s.failing_streak_length == 0 and s.awaiting_in_streak == 1
    s.record_outcome(first, ERROR)
    assert s.failing_streak_length == 2 and s.awaiting_in_streak == 0


def test_waiting_calls_count_as_failures_in_the_provisional_stop_count_up_to_the_threshold():
    s = streaks(streak_warn_at=3, streak_stop_at=3)
    for _ in range(5):
        s.count_call(key(1), "t")
    assert s.provisional_stop_count() == 3


def test_a_streak_another_key_ended_still_settles_and_reports_its_stop():
    s = streaks(streak_warn_at=2, streak_stop_at=2)
    first, second = s.count_call(key(1), "t"), s.count_call(key(1), "t")
    s.count_call(key(2), "t")
    assert not s.record_outcome(first, ERROR)
    assert s.record_outcome(second, ERROR) and s.ended_stop is not None and s.ended_stop.failing == 2


def test_a_detection_fires_once_per_streak_and_an_answer_starts_afresh():
    s = streaks()
    s.count_call(key(1), "t")
    s.note_detection(_event(tg.Threshold.STREAK, tg.Level.WARN))
    assert s.fired_in_streak("streak", "warn") and s.detections == 1
    assert not s.fired_in_streak("streak", "stop")
    s.reset_streak()
    assert not s.fired_in_streak("streak", "warn") and s.streak_length == 0
    s.count_call(key(1), "t")
    assert s.streak_length == 1


def test_an_abandoned_call_neither_fails_nor_resets():
    s = streaks()
    seqs = [s.count_call(key(1), "t") for _ in range(3)]
    s.record_outcome(seqs[0], ERROR)
    s.abandon(seqs[1])
    s.record_outcome(seqs[2], ERROR)
    assert s.failing_streak_length == 2


def _event(threshold: tg.Threshold, level: tg.Level) -> tg.LoopDetectedEvent:
    return tg.LoopDetectedEvent(threshold=threshold, action=tg.Action.ALLOW, level=level, limit=1, tool_calls=1,
                                cycles=0, max_key_repeat=1, streak_length=1, failing_streak_length=0, soft_cap=None,
                                hard_cap=None, tool_name="t", key_digest=None, promptable=False, turn_id="t1",
                                conversation_id=None, agent_name=None, event_id="e1")


COUNTS = [name for name in CallCounts.__slots__ if name not in ("__weakref__", "_retries", "_ok", "_outcomes")]


@pytest.mark.parametrize("signal", ["repeat", "stale_repeat"])
@pytest.mark.parametrize("seed", range(20))
def test_count_calls_inlined_counting_is_count_key(seed, signal):
    """``count_call`` keeps an inlined copy of ``count_key`` for the hot path: the two count alike."""
    rng = random.Random(seed)
    config = tg.GuardConfig(stuck_signal=signal, stuck_repeat_threshold=rng.randint(1, 6),
                            max_tracked_keys=rng.randint(1, 8))
    checked, keyed = Streaks(config), Streaks(config)
    for at in range(1, 60):
        digest = key(rng.randrange(10))
        checked.count_call(digest, "t")
        keyed.tool_calls = at
        keyed.count_key(digest, at)
    assert {n: getattr(checked, n) for n in COUNTS} == {n: getattr(keyed, n) for n in COUNTS}


def _slots(obj: object) -> dict[str, object]:
    """Every slot's value, an ended streak's (no ``__eq__`` of its own) by its slots in turn."""
    names = {n for cls in type(obj).__mro__ for n in getattr(cls, "__slots__", ()) if n != "__weakref__"}
    return {n: _value(getattr(obj, n, None)) for n in sorted(names)}


def _value(value: object) -> object:
    if isinstance(value, EndedStreak):
        return _slots(value)
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def _counted_by_the_originals(s: Streaks, digest: bytes, tool_name: str) -> int:
    """``count_call`` through the originals of its inlined copies, ``count_key`` and ``_join``
    (its cycle-runs step is left out: a ``Streaks`` of its own has none)."""
    s.tool_calls += 1
    seq = s.checks = s.checks + 1
    s.count_key(digest, s.tool_calls)
    s._join(digest, tool_name, seq)
    return seq


@pytest.mark.parametrize("stop_on", ["error", "any"])
@pytest.mark.parametrize("seed", range(30))
def test_count_calls_inlined_streak_start_is_join(seed, stop_on):
    """``count_call`` keeps an inlined copy of ``_join`` (and its ``_new_streak``) for the hot path:
    with outcomes settling, waiting and arriving out of order, and the streak's levels firing,
    every fact stays the same as the originals keep it."""
    rng = random.Random(seed)
    config = tg.GuardConfig(streak_stop_at=rng.choice([0, 2, 3, 5]), streak_warn_at=rng.choice([0, 2]),
                            streak_stop_on=stop_on, stuck_signal=rng.choice(["repeat", "stale_repeat"]))
    checked, plain = Streaks(config), Streaks(config)
    assert checked._cyc is None
    pending: list[int] = []
    for _ in range(200):
        step = rng.random()
        if step < 0.05:
            event = _event(tg.Threshold.STREAK, rng.choice(list(tg.Level)))
            checked.note_detection(event)
            plain.note_detection(event)
        elif step < 0.55 or not pending:
            digest, tool = key(1 if rng.random() < 0.7 else rng.randrange(2, 5)), rng.choice(["t", "u"])
            seq = checked.count_call(digest, tool)
            assert _counted_by_the_originals(plain, digest, tool) == seq
            pending.append(seq)
        else:
            seq = pending.pop(rng.randrange(len(pending)) if rng.random() < 0.3 else -1)
            outcome = rng.choice([ERROR, ERROR, OK, DENIED])
            assert checked.record_outcome(seq, outcome) == plain.record_outcome(seq, outcome)
        assert _slots(checked) == _slots(plain)


def _plain_worst_stop(s: Streaks, reported: dict[int, tg.Outcome], stop_any: bool) -> int:
    """The provisional stop count walked call by call, from the outcomes as reported."""
    count = 0
    for seq in range(s.checks - 1, s.next_to_settle - 1, -1):
        outcome = reported.get(seq)
        if outcome is None or outcome is ERROR or (stop_any and outcome is not DENIED):
            count += 1
            if count >= s.stop_at:
                return count
        elif outcome is not DENIED:
            return count
    return min(s.stop_at, count + (s.settled_streak_length if stop_any else s.failing_streak_length))


@pytest.mark.parametrize("stop_on", ["error", "any"])
@pytest.mark.parametrize("seed", range(40))
def test_the_provisional_stop_count_is_the_plain_count_over_any_waiting_outcomes(seed, stop_on):
    rng = random.Random(seed)
    stop_at = rng.choice([2, 3, 5, 8])
    s = streaks(streak_stop_at=stop_at, streak_warn_at=0, streak_stop_on=stop_on)
    reported: dict[int, tg.Outcome] = {}
    pending: list[int] = []
    outcomes = [DENIED] * 6 + [ERROR, ERROR, OK, tg.Outcome.UNKNOWN]
    for _ in range(400):
        step = rng.random()
        if step < 0.45 or not pending:
            pending.append(s.count_call(key(1 if rng.random() < 0.93 else rng.randrange(2, 4)), "t"))
        elif step < 0.97:  # mostly the latest calls: long runs wait behind a lost one
            seq = pending.pop(rng.randrange(max(0, len(pending) - 3), len(pending)))
            reported[seq] = rng.choice(outcomes)
            s.record_outcome(seq, reported[seq])
        else:
            seq = pending.pop(rng.randrange(len(pending)))
            reported[seq] = DENIED  # (how an abandoned call settles)
            s.abandon(seq)
        assert s.provisional_stop_count() == _plain_worst_stop(s, reported, stop_on == "any")


class _CountedReads(dict):
    reads = 0

    def get(self, *args):
        _CountedReads.reads += 1
        return super().get(*args)


def test_each_early_denial_behind_a_lost_outcome_is_walked_once_not_at_every_check():
    s = streaks()
    s._early = _CountedReads()
    s.count_call(key(1), "t")  # its outcome never comes
    calls = 3000
    for _ in range(calls):
        s.record_outcome(s.count_call(key(1), "t"), DENIED)
        assert s.provisional_stop_count() == 1
    assert _CountedReads.reads <= 3 * calls  # walking the whole run at each check reads ~calls**2 / 2
