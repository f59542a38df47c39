"""The tool-call cap (first seed; docs/usage.md "What fires"): every rule and its boundaries."""

from __future__ import annotations

import pytest

import turnguard as tg
from conftest import distinct_call, drive, first_detection, productive_calls, with_repeats
from turnguard._plugins import NON_POLICY_PLUGINS

REPEATED = tg.ToolCall("bash", "npm run build")


def seed_turn(calls: int, distinct: int) -> list[tg.ToolCall]:
    """A turn shaped like the seed's table: ``calls`` calls, ``distinct`` keys, repeats <= 2."""
    extra = calls - distinct
    out = [distinct_call(i) for i in range(distinct)]
    for k in range(extra):  # repeat some earlier calls once each, not back to back
        out.insert(2 * k + 10, distinct_call(2 * k))
    return out


@pytest.mark.parametrize(("calls", "distinct", "max_repeat"), [(96, 96, 1), (100, 99, 2), (95, 95, 1)])
def test_the_seeds_productive_turns_complete_under_the_default_cap(guard, calls, distinct, max_repeat):
    with guard.turn() as turn:
        verdicts = drive(turn, seed_turn(calls, distinct))
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * calls
    assert first_detection(verdicts) is None
    assert (turn.ledger.tool_calls, turn.ledger.distinct_keys, turn.ledger.max_key_repeat) == (
        calls, distinct, max_repeat)
    assert turn.summary.reason == "completed"


def test_a_400_call_productive_turn_completes_under_the_default_cap(guard):
    with guard.turn() as turn:
        verdicts = drive(turn, productive_calls(400))
    assert len(verdicts) == 400
    assert all(v.action is tg.Action.ALLOW and v.event is None for v in verdicts)
    assert turn.ledger.max_key_repeat == 2
    assert not turn.summary.halted


def test_the_same_400_call_turn_halts_at_call_101_under_an_explicit_cap_of_100(make_guard):
    with make_guard(max_tool_calls_per_turn=100).turn() as turn:
        verdicts = drive(turn, productive_calls(400))
    assert len(verdicts) == 101
    assert all(v.action is tg.Action.ALLOW for v in verdicts[:100])
    halt = verdicts[100]
    assert (halt.action, halt.threshold) == (tg.Action.HALT, tg.Threshold.EXPLICIT)
    assert halt.threshold == "explicit"
    assert halt.event.limit == 100 and halt.event.tool_calls == 101 and halt.event.cap_mode == "explicit"
    assert turn.summary.threshold is tg.Threshold.EXPLICIT


@pytest.mark.parametrize("n", [1, 5, 100, 250])
def test_an_explicit_cap_allows_call_n_and_halts_call_n_plus_1(make_guard, n):
    turn = make_guard(max_tool_calls_per_turn=n).turn()
    verdicts = drive(turn, (distinct_call(i) for i in range(n + 10)))
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * n + [tg.Action.HALT]
    assert verdicts[-1].threshold is tg.Threshold.EXPLICIT


def test_an_explicit_cap_has_no_adaptive_extension_and_no_stuck_halt(make_guard):
    # 6 repeats (stuck by the adaptive rule) before the soft cap, then past it: explicit 200 allows.
    calls = with_repeats(200, REPEATED, at=range(10, 70, 10))
    verdicts = drive(make_guard(max_tool_calls_per_turn=200).turn(), [*calls, distinct_call(999)])
    assert [v.action for v in verdicts[:200]] == [tg.Action.ALLOW] * 200
    assert verdicts[200].threshold is tg.Threshold.EXPLICIT


def test_up_to_the_soft_cap_every_call_is_allowed_even_when_stuck(guard):
    calls = with_repeats(100, REPEATED, at=range(2, 100, 3))  # 33 repeats, never consecutive
    verdicts = drive(guard.turn(), calls)
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * 100


def test_past_the_soft_cap_a_stuck_turn_halts_on_call_101(guard):
    calls = with_repeats(300, REPEATED, at=(10, 25, 40, 55, 70, 85))
    verdicts = drive(guard.turn(), calls)
    assert len(verdicts) == 101
    assert all(v.action is tg.Action.ALLOW for v in verdicts[:100])
    halt = verdicts[100]
    assert (halt.action, halt.threshold, halt.event.level) == (tg.Action.HALT, tg.Threshold.SOFT_STUCK, tg.Level.STOP)
    assert halt.event.max_key_repeat == 6 and halt.event.limit == 100
    assert halt.event.soft_cap == 100 and halt.event.hard_cap == 1000


def test_five_repeats_are_not_stuck_the_turn_runs_to_the_backstop(guard):
    calls = with_repeats(1100, REPEATED, at=(10, 25, 40, 55, 70))
    verdicts = drive(guard.turn(), calls)
    assert len(verdicts) == 1001
    assert verdicts[-1].threshold is tg.Threshold.HARD_BACKSTOP


def test_a_sixth_repeat_at_call_240_halts_exactly_there(guard):
    calls = with_repeats(400, REPEATED, at=(40, 80, 120, 160, 200, 240))
    turn = guard.turn()
    verdicts = drive(turn, calls)
    assert len(verdicts) == 240
    assert all(v.action is tg.Action.ALLOW for v in verdicts[:239])
    assert verdicts[239].threshold is tg.Threshold.SOFT_STUCK
    assert turn.ledger.first_stuck_call == 240


def test_a_runaway_of_distinct_calls_halts_at_call_1001(guard):
    turn = guard.turn()
    verdicts = drive(turn, (distinct_call(i) for i in range(5000)))
    assert len(verdicts) == 1001
    assert all(v.action is tg.Action.ALLOW for v in verdicts[:1000])
    halt = verdicts[1000]
    assert (halt.action, halt.threshold) == (tg.Action.HALT, tg.Threshold.HARD_BACKSTOP)
    assert halt.event.limit == 1000 and halt.event.max_key_repeat == 1
    turn.end()
    assert turn.summary.threshold is tg.Threshold.HARD_BACKSTOP and not turn.summary.stuck


@pytest.mark.parametrize(("soft_cap", "multiplier", "halts_at"), [(10, 2, 21), (50, 3, 151), (7, 1.5, 11), (1, 1, 2),
                                                                  (200, 10, 2001)])
def test_the_hard_backstop_halts_at_s_times_m_plus_1(make_guard, soft_cap, multiplier, halts_at):
    verdicts = drive(make_guard(soft_cap=soft_cap, hard_multiplier=multiplier).turn(),
                     (distinct_call(i) for i in range(halts_at + 50)))
    assert len(verdicts) == halts_at
    assert verdicts[-1].threshold is tg.Threshold.HARD_BACKSTOP
    assert all(v.action is tg.Action.ALLOW for v in verdicts[:-1])


@pytest.mark.parametrize("options", [{"max_tool_calls_per_turn": 0}, {"max_tool_calls_per_turn": -5}, {"soft_cap": 0},
                                     {"soft_cap": -1}])
def test_a_cap_of_zero_or_less_disables_the_cap(make_guard, options):
    # a runaway past every default limit, and a stuck pattern past the soft cap: nothing halts
    calls = with_repeats(2500, REPEATED, at=range(3, 2500, 50))
    turn = make_guard(**options).turn()
    verdicts = drive(turn, calls)
    assert len(verdicts) == 2500
    assert all(v.action is tg.Action.ALLOW and v.event is None for v in verdicts)
    assert turn.ledger.cap_mode == "disabled" and turn.ledger.hard_cap is None


def test_the_cap_is_always_on_whatever_other_detectors_are_disabled(make_guard):
    guard = make_guard(streak_warn_at=0, streak_stop_at=0, disable_plugins=(*NON_POLICY_PLUGINS, "streak",
                                                                             "cycles"))
    verdicts = drive(guard.turn(), (distinct_call(i) for i in range(1100)))
    assert verdicts[-1].threshold is tg.Threshold.HARD_BACKSTOP and len(verdicts) == 1001


def test_repeat_is_the_default_stuck_signal_and_listed_first():
    assert tg.STUCK_SIGNALS[0] == "repeat" == tg.GuardConfig().stuck_signal


def test_the_stuck_threshold_is_configurable(make_guard):
    calls = with_repeats(200, REPEATED, at=(10, 20, 30))
    verdicts = drive(make_guard(stuck_repeat_threshold=3).turn(), calls)
    assert len(verdicts) == 101 and verdicts[-1].threshold is tg.Threshold.SOFT_STUCK


def test_the_cap_event_names_the_call_but_not_its_arguments(make_guard):
    secret = tg.ToolCall("write_file", {"path": "notes.txt", "content": "the password is hunter2"})
    verdicts = drive(make_guard(max_tool_calls_per_turn=1).turn(), [distinct_call(1), secret])
    event = verdicts[-1].event
    assert event.tool_name == "write_file" and len(event.key_digest) == 16
    assert "hunter2" not in repr(event) and "hunter2" not in verdicts[-1].message
