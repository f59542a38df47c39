"""The per-turn facts: counts, repeats, streaks, rollback, and the bound on tracked keys."""

from __future__ import annotations

import dataclasses

import pytest

import turnguard as tg
from conftest import distinct_call, drive
from turnguard._keys import Keyer
from turnguard._ledger import VIEW_FACTS, Ledger, LedgerView
from turnguard._ledger._streaks import EndedStreak
from turnguard._plugins import NON_POLICY_PLUGINS
from turnguard._policies import cap


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(tg.GuardConfig(), conversation_id="c1", agent_name="coder")


def test_counts_repeats_and_streaks(ledger):
    for k in (1, 2, 2, 3, 2, 2, 2):
        ledger.count_call(key(k), "t")
    assert ledger.tool_calls == 7 and ledger.distinct_keys == 3
    assert ledger.max_key_repeat == 5 and ledger.repeats_of(key(2)) == 5 and ledger.repeats_of(key(9)) == 0
    assert ledger.streak_length == 3 and ledger.streak_digest == key(2) and ledger.last_tool_name == "t"


def test_first_stuck_call_is_where_a_key_first_reached_the_threshold(ledger):
    for n in range(1, 20):
        ledger.count_call(key(0) if n % 3 == 0 else key(n), "t")
    assert ledger.first_stuck_call == 18  # the 6th time key 0 was seen


def test_a_stuck_threshold_of_one_is_reached_by_the_first_call():
    ledger = Ledger(tg.GuardConfig(stuck_repeat_threshold=1))
    ledger.count_call(key(1), "t")
    assert ledger.first_stuck_call == 1


def test_failing_streak_follows_outcomes_of_the_streak_key(ledger):
    outcomes = [tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.DENIED, tg.Outcome.ERROR, tg.Outcome.OK]
    lengths = []
    for outcome in outcomes:
        ledger.count_call(key(1), "t")
        ledger.record_outcome(ledger.checks, outcome)
        lengths.append(ledger.failing_streak_length)
    assert lengths == [1, 2, 2, 3, 0]
    assert ledger.outcomes(tg.Outcome.ERROR) == 3 and ledger.outcomes("denied") == 1


def test_rollback_returns_to_the_cycle_start_and_clears_repeats_and_streaks(ledger):
    ledger.begin_cycle()
    for k in (1, 2, 3):
        ledger.count_call(key(k), "t")
    ledger.begin_cycle()
    for _ in range(4):
        ledger.count_call(key(7), "t")
        ledger.record_outcome(ledger.checks, tg.Outcome.ERROR)
    ledger.rollback_cycle()
    assert (ledger.tool_calls, ledger.max_key_repeat, ledger.distinct_keys) == (3, 0, 0)
    assert (ledger.streak_length, ledger.failing_streak_length, ledger.retries, ledger.cycles) == (0, 0, 1, 2)


def test_detect_records_the_counts_at_the_moment(ledger):
    call = tg.ToolCall("bash", "ls")
    digest = Keyer().key_of(call)
    ledger.count_call(digest, "bash")
    verdict = ledger.detect("custom", tg.Action.ASK, tg.Level.WARN, 3, call=call, message="why")
    event = verdict.event
    assert (verdict.action, verdict.threshold, verdict.message) == (tg.Action.ASK, "custom", "why")
    assert (event.tool_calls, event.max_key_repeat, event.streak_length, event.limit) == (1, 1, 1, 3)
    assert (event.tool_name, event.key_digest, event.conversation_id, event.agent_name) == (
        "bash", digest.hex(), "c1", "coder")
    assert event.event_id != ledger.detect("custom", tg.Action.ASK, tg.Level.WARN, 3).event.event_id


def _distinct_counts_ledger(cap_mode: str) -> Ledger:
    """A ledger whose counts all differ, so that an event field given another's value shows."""
    config = tg.GuardConfig(max_tool_calls_per_turn=900) if cap_mode == "explicit" else tg.GuardConfig()
    assert config.cap_mode == cap_mode
    ledger = Ledger(config, turn_id="turn-9", conversation_id="conv-9", agent_name="agent-9", promptable=True)
    for _ in range(5):
        ledger.begin_cycle()
    for k, outcome in ((1, tg.Outcome.OK), (1, tg.Outcome.OK), (1, tg.Outcome.OK), (1, tg.Outcome.OK),
                       (2, tg.Outcome.OK), (2, tg.Outcome.ERROR), (2, tg.Outcome.ERROR)):
        ledger.count_call(key(k), "t")
        ledger.record_outcome(ledger.checks, outcome)
    return ledger


@pytest.mark.parametrize("cap_mode", ["adaptive", "explicit"])
@pytest.mark.parametrize("with_call", [True, False])
@pytest.mark.parametrize("ended", [None, (11, 10)])
def test_detect_puts_each_fact_in_its_own_event_field(cap_mode, with_call, ended):
    ledger = _distinct_counts_ledger(cap_mode)
    call = tg.ToolCall("bash", "ls")
    digest = Keyer().key_of(call)
    streak = EndedStreak(1, 2, ended[0], ended[1], 0, 0, {}, None, "t") if ended else None
    verdict = ledger.detect("custom", tg.Action.ASK, tg.Level.STOP, 13, call=call if with_call else None,
                            message="why", streak=streak)
    length, failing = ended or (ledger.streak_length, ledger.failing_streak_length)
    counts = (13, ledger.tool_calls, ledger.cycles, ledger.max_key_repeat, length, failing, ledger.hard_cap)
    assert len(set(counts)) == len(counts), counts  # (a field swapped for another shows)
    expected = {
        "threshold": "custom", "action": tg.Action.ASK, "level": tg.Level.STOP, "limit": 13,
        "tool_calls": ledger.tool_calls, "cycles": ledger.cycles, "max_key_repeat": ledger.max_key_repeat,
        "streak_length": length, "failing_streak_length": failing, "soft_cap": ledger.soft_cap,
        "hard_cap": ledger.hard_cap, "tool_name": "bash" if with_call else None,
        "key_digest": digest.hex() if with_call else None, "promptable": True, "turn_id": "turn-9",
        "conversation_id": "conv-9", "agent_name": "agent-9", "cap_mode": cap_mode, "message": "why",
    }
    event = verdict.event
    assert {name: getattr(event, name) for name in expected} == expected
    assert {f.name for f in dataclasses.fields(event)} == {*expected, "event_id"}
    assert len(event.event_id) == 32 and int(event.event_id, 16) >= 0
    assert (verdict.action, verdict.threshold, verdict.message) == (tg.Action.ASK, "custom", "why")


def test_the_tracked_keys_are_bounded_and_later_keys_go_uncounted():
    ledger = Ledger(tg.GuardConfig(max_tracked_keys=100))
    for k in range(150):
        ledger.count_call(key(k), "t")
    for _ in range(10):  # a key first seen past the bound: its repeats are not counted
        ledger.count_call(key(149), "t")
        assert ledger.repeats_of(key(149)) == 0
        ledger.count_call(key(0), "t")  # a tracked key keeps counting
    assert ledger.distinct_keys == 100 and ledger.keys_overflowed
    assert ledger.repeats_of(key(149)) == 0 and ledger.repeats_of(key(0)) == 11
    assert ledger.max_key_repeat == 11 and ledger.tool_calls == 170


def test_streaks_still_work_for_untracked_keys():
    ledger = Ledger(tg.GuardConfig(max_tracked_keys=1))
    ledger.count_call(key(0), "t")
    for _ in range(5):
        ledger.count_call(key(1), "t")
        ledger.record_outcome(ledger.checks, tg.Outcome.ERROR)
    assert (ledger.streak_length, ledger.failing_streak_length, ledger.max_key_repeat) == (5, 5, 1)


def test_past_the_bound_the_backstop_still_bounds_the_turn():
    guard = tg.Guard(tg.GuardConfig(max_tracked_keys=10, disable_plugins=NON_POLICY_PLUGINS,
                                    load_entrypoints=False), environ={})
    turn = guard.turn()
    verdicts = drive(turn, (distinct_call(i) for i in range(2000)))
    assert len(verdicts) == 1001 and verdicts[-1].threshold is tg.Threshold.HARD_BACKSTOP
    assert turn.ledger.distinct_keys == 10 and turn.end().keys_overflowed


def test_summary_reports_how_the_turn_went(ledger):
    for k in (1, 1, 1, 1, 1, 1, 2):
        ledger.count_call(key(k), "t")
    summary = ledger.summary(reason="completed", halt=None, stuck=cap.summary_stuck(ledger))
    assert (summary.tool_calls, summary.max_key_repeat, summary.first_stuck_call, summary.distinct_keys) == (7, 6, 6, 2)
    assert summary.stuck and not summary.halted and summary.threshold is None and summary.cap_mode == "adaptive"
    assert (summary.conversation_id, summary.agent_name, summary.reason) == ("c1", "coder", "completed")


def test_a_turn_stops_growing_once_it_tracks_the_bound():
    import gc
    import tracemalloc

    guard = tg.Guard(tg.GuardConfig(max_tracked_keys=1_000, max_tool_calls_per_turn=0,
                                    disable_plugins=NON_POLICY_PLUGINS, load_entrypoints=False),
                     environ={})
    turn = guard.turn()
    held = {}
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(1, 12_001):
            call = tg.ToolCall("read_file", {"path": f"{i}.py"})
            turn.check_call(call)
            turn.record_outcome(call, tg.Outcome.OK)
            if i in (500, 3_000, 12_000):
                del call
                held[i] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held[3_000] - held[500] > 20_000  # growing while under the bound (500 more keys)...
    assert abs(held[12_000] - held[3_000]) < 4_000  # ...flat past it: 9,000 more calls, no more memory
    assert turn.ledger.distinct_keys == 1_000 and turn.ledger.tool_calls == 12_000


@pytest.mark.parametrize(
    "name",
    ["config", "turn_id", "conversation_id", "agent_name", "promptable", "cap_mode", "soft_cap", "hard_cap",
     "tool_calls", "max_key_repeat", "streak_length", "failing_streak_length", "cycles"],
)
def test_the_view_plugins_receive_cannot_be_rewritten(name):
    ledger = Ledger(tg.GuardConfig(max_tool_calls_per_turn=3))
    with pytest.raises(AttributeError):
        setattr(LedgerView(ledger), name, 10**9)
    assert ledger.hard_cap == 3


def test_parallel_identical_calls_each_settle_their_own_outcome_in_check_order():
    ledger = Ledger(tg.GuardConfig())
    for _ in range(3):
        ledger.count_call(b"k", "build")
    ledger.record_outcome(3, tg.Outcome.ERROR)  # the last one's outcome first: it waits for the others
    assert ledger.failing_streak_length == 0 and ledger.awaiting_in_streak == 2
    ledger.record_outcome(1, tg.Outcome.ERROR)
    assert ledger.failing_streak_length == 1
    ledger.record_outcome(2, tg.Outcome.ERROR)
    assert (ledger.streak_length, ledger.failing_streak_length, ledger.stop_count) == (3, 3, 3)


def test_an_outcome_of_an_earlier_streaks_call_changes_no_streak():
    ledger = Ledger(tg.GuardConfig())
    ledger.count_call(b"a", "build")
    ledger.count_call(b"b", "test")
    ledger.count_call(b"a", "build")  # a new streak of a
    ledger.record_outcome(1, tg.Outcome.ERROR)  # the first a's: its streak ended at b
    assert ledger.failing_streak_length == 0 and ledger.outcomes(tg.Outcome.ERROR) == 1
    ledger.record_outcome(3, tg.Outcome.ERROR)
    assert ledger.failing_streak_length == 1


def test_an_abandoned_call_neither_fails_nor_resets_and_lets_later_outcomes_count():
    ledger = Ledger(tg.GuardConfig())
    for _ in range(3):
        ledger.count_call(b"k", "build")
    ledger.record_outcome(1, tg.Outcome.ERROR)
    ledger.record_outcome(3, tg.Outcome.ERROR)
    ledger.abandon(2)
    assert ledger.failing_streak_length == 2 and ledger.outcomes(tg.Outcome.DENIED) == 0


def test_the_provisional_stop_count_counts_waiting_calls_as_failures_up_to_the_threshold():
    ledger = Ledger(tg.GuardConfig(streak_warn_at=2, streak_stop_at=4))
    for _ in range(6):
        ledger.count_call(b"k", "build")
    assert ledger.provisional_stop_count() == 4  # 5 earlier calls waiting, counted up to 4
    ledger.record_outcome(4, tg.Outcome.OK)  # a known success: only the call after it can fail
    assert ledger.provisional_stop_count() == 1


def test_a_fork_holds_every_fact_of_the_ledger_it_was_taken_from():
    ledger = Ledger(tg.GuardConfig())
    outcomes = [tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.DENIED, tg.Outcome.UNKNOWN]
    for i, k in enumerate((1, 2, 2, 3, 3, 3, 1, 4, 4)):
        ledger.record_outcome(ledger.count_call(key(k), f"t{k}"), outcomes[i % 4])
    ledger.count_call(key(5), "t5")  # still waiting
    fork = ledger.fork(tg.GuardConfig(soft_cap=50))
    for name in VIEW_FACTS:
        if name not in ("config", "soft_cap", "hard_cap", "cap_quiet_until"):  # what the fork's config sets
            assert getattr(fork, name) == getattr(ledger, name), name
    assert [fork.outcomes(o) for o in tg.Outcome] == [ledger.outcomes(o) for o in tg.Outcome] == [3, 2, 2, 2]


# -- state: a snapshot's facts in and out ------------------------------------------------------------


def ledger_history(seed: int, config: tg.GuardConfig) -> Ledger:
    """A ledger after a random history: batches whose outcomes arrive shuffled (some never),
    another key ending streaks whose calls still wait, rollbacks, answers, cycles."""
    import random

    rng = random.Random(seed)
    ledger = Ledger(config, turn_id=f"t{seed}")
    waiting: list[int] = []
    for _ in range(rng.randint(1, 40)):
        step = rng.random()
        if step < 0.1:
            ledger.begin_cycle()
        elif step < 0.14:
            ledger.rollback_cycle()
        elif step < 0.17:
            ledger.reset_streak()
        elif step < 0.65:
            waiting.append(ledger.count_call(key(rng.choice((1, 1, 1, 2, 3))), "build"))
        elif waiting:
            rng.shuffle(waiting)
            ledger.record_outcome(waiting.pop(), rng.choice(list(tg.Outcome)))
    return ledger


STATE_CONFIGS = [tg.GuardConfig(streak_stop_at=3, streak_warn_at=2),
                 tg.GuardConfig(stuck_signal="stale_repeat", streak_stop_on="any", max_tracked_keys=2)]


@pytest.mark.parametrize("config", STATE_CONFIGS, ids=["repeat", "stale, any, 2 keys"])
def test_state_and_from_state_give_back_every_fact_and_the_same_future(config):
    import json

    for seed in range(200):
        ledger = ledger_history(seed, config)
        state = json.loads(json.dumps(ledger.state()))
        back = Ledger.from_state(config, state, turn_id=ledger.turn_id)
        assert back.state() == ledger.state(), seed
        for name in VIEW_FACTS:
            if name not in ("started_at", "opened_ns"):  # its start: restored from elapsed_s, 0 here
                assert getattr(back, name) == getattr(ledger, name), (seed, name)
        for seq in range(1, ledger.checks + 3):  # the same outcomes settle both the same way
            one, two = ledger.record_outcome(seq, tg.Outcome.ERROR), back.record_outcome(seq, tg.Outcome.ERROR)
            assert one == two and ledger.state() == back.state(), (seed, seq)


def test_ended_streaks_are_part_of_the_state():
    config = tg.GuardConfig(streak_stop_at=3, streak_warn_at=2)
    ledger = Ledger(config)
    for _ in range(3):
        ledger.count_call(b"a" * 8, "build")
    ledger.count_call(b"b" * 8, "test")
    assert [e["last"] for e in ledger.state()["ended"]] == [3]
    back = Ledger.from_state(config, ledger.state())
    assert back.record_outcome(3, tg.Outcome.ERROR) is False and back.record_outcome(2, tg.Outcome.ERROR) is False
    assert back.record_outcome(1, tg.Outcome.ERROR) is True and back.ended_stop.failing == 3


@pytest.mark.parametrize(("field", "value"), [
    ("seq", 1.5), ("seq", "3"), ("seq", True), ("seq", -1), ("seq", 2**60), ("tool_calls", 99), ("streak", None),
    ("overflowed", 1), ("last_key", "xyz"), ("counts", [1]), ("counts", {"00" * 8: 0}), ("counts", {"00" * 8: True}),
    ("next", 0), ("failing", 7), ("early", {"1.5": "error"}), ("early", {"2": "broken"}), ("fired", [["x"]]),
    ("outcomes", {"ok": -1}), ("outcomes", {"maybe": 1}), ("ended", [{"next": 1}]), ("cycle_start", 5),
    ("stop_knew", [0]), ("stop_knew", [99]), ("stop_knew", {"1": 1}),
])
def test_a_bad_fact_is_a_snapshot_error_naming_it(field, value):
    ledger = Ledger(tg.GuardConfig())
    for k in (1, 2, 2):
        ledger.record_outcome(ledger.count_call(key(k), "t"), tg.Outcome.ERROR)
    state = {**ledger.state(), field: value}
    with pytest.raises(tg.SnapshotError) as refused:
        Ledger.from_state(tg.GuardConfig(), state)
    assert refused.value.field.startswith(f"facts.{field}"), refused.value.field
    missing = {k: v for k, v in ledger.state().items() if k != field}
    if field not in ("ended", "stop_knew"):  # (optional: absent, it has its default)
        with pytest.raises(tg.SnapshotError, match=f"facts.{field}"):
            Ledger.from_state(tg.GuardConfig(), missing)


def test_more_keys_than_the_live_bound_is_refused():
    big = Ledger(tg.GuardConfig(max_tracked_keys=10))
    for i in range(10):
        big.count_call(key(i), "t")
    with pytest.raises(tg.SnapshotError, match=r"facts\.counts"):
        Ledger.from_state(tg.GuardConfig(max_tracked_keys=9), big.state())
