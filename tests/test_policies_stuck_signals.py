"""The alternative stuck signal (``stale_repeat``) and the streak variant (``streak_stop_on="any"``):
the ledger facts, the policies' verdicts at every boundary, configuration and ``Ledger.fork``."""

from __future__ import annotations

import pytest

import turnguard as tg
from conftest import distinct_call, drive, first_detection
from turnguard._config import STREAK_STOP_ON, STUCK_SIGNALS
from turnguard._ledger import Ledger
from turnguard._policies import cap


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def stale_ledger(**options: object) -> Ledger:
    return Ledger(tg.GuardConfig(stuck_signal="stale_repeat", **options))


def count(ledger: Ledger, keys: list[int]) -> None:
    for k in keys:
        ledger.count_call(key(k), "t")


def edit_and_rerun(cycles: int) -> list[tg.ToolCall]:
    """Edit a file (a new edit every time), then re-run the same test: the healthy long turn."""
    test = tg.ToolCall("bash", "python -m pytest tests/test_x.py -q")
    calls = []
    for i in range(cycles):
        calls += [tg.ToolCall("edit", {"path": "src/x.py", "patch": f"fix {i}"}), test]
    return calls


def rotation(period: int, times: int) -> list[tg.ToolCall]:
    """``times`` rotations through the same ``period`` calls (a stuck loop of a few calls)."""
    loop = [distinct_call(10_000 + j, "loop") for j in range(period)]
    return [loop[j] for _ in range(times) for j in range(period)]


# -- the fact ---------------------------------------------------------------------------------


def test_signals_list_keeps_the_seed_default_first():
    assert STUCK_SIGNALS[0] == "repeat" == tg.GuardConfig().stuck_signal and "stale_repeat" in STUCK_SIGNALS
    assert STREAK_STOP_ON == ("error", "any") and tg.GuardConfig().streak_stop_on == "error"


def test_a_new_key_in_between_restarts_the_stale_count():
    ledger = stale_ledger()
    count(ledger, [1, 2, 1, 3, 1, 4, 1])  # 1 re-run after each new key: never stale
    assert ledger.max_key_repeat == 4 and ledger.max_stale_repeat == 1


def test_back_to_back_repeats_count_like_the_seed():
    ledger = stale_ledger()
    count(ledger, [1, 2, 2, 2, 2])
    assert ledger.max_stale_repeat == 4 == ledger.max_key_repeat


def test_a_rotation_counts_one_per_rotation_after_the_first():
    ledger = stale_ledger()
    count(ledger, [1, 2, 3] * 4)  # 1,2,3 new; then every call of the loop repeats with nothing new
    assert ledger.max_key_repeat == 4 and ledger.max_stale_repeat == 4  # 3's count: 1,2,3,4
    count(ledger, [9])  # news: every count restarts, but the running max stays
    count(ledger, [1])
    assert ledger.max_stale_repeat == 4


def test_the_news_call_coming_round_credits_the_loops_first_round():
    ledger = stale_ledger()
    count(ledger, [5, 1, 2, 3, 1, 2])  # 1 and 2 were news in their first round; nothing shows a loop yet
    assert ledger.max_stale_repeat == 1
    count(ledger, [3])  # 3, the last news, comes round: 1 2 3 is a loop, its first round counts
    assert ledger.max_stale_repeat == 2 == ledger.max_key_repeat
    count(ledger, [1])
    assert ledger.max_stale_repeat == 3 == ledger.max_key_repeat


def test_a_double_rerun_after_an_edit_gets_no_credit():
    ledger = stale_ledger()
    count(ledger, [1, 100, 1, 101, 1, 102, 1, 1])  # edit (news), re-run; then a flaky test re-run twice
    assert ledger.max_key_repeat == 5 and ledger.max_stale_repeat == 2


def test_the_stale_count_is_a_running_max_and_first_stuck_follows_it():
    ledger = stale_ledger(stuck_repeat_threshold=3)
    count(ledger, [1, 1, 2, 1, 3, 1, 1])  # 1 x2; news; 1; news; 1 x2 -> stale 2 at most
    assert ledger.max_stale_repeat == 2 and ledger.first_stuck_call == 0 and not cap.stuck(ledger)
    count(ledger, [1])
    assert ledger.max_stale_repeat == 3 and ledger.first_stuck_call == 8 and cap.stuck(ledger)


def test_the_seed_signal_ledger_keeps_no_stale_facts():
    ledger = Ledger(tg.GuardConfig())
    count(ledger, [1, 1, 1])
    assert ledger.max_stale_repeat == 0 and ledger.max_key_repeat == 3 and ledger.settled_streak_length == 0


def test_retry_clears_the_stale_count():
    ledger = stale_ledger()
    ledger.begin_cycle()
    count(ledger, [1, 1, 1])
    ledger.rollback_cycle()
    assert ledger.max_stale_repeat == 0 and ledger.first_stuck_call == 0
    count(ledger, [1])  # 1 is news again after the rollback cleared the counts
    assert ledger.max_stale_repeat == 1


def test_keys_past_the_table_bound_are_neither_counted_nor_news():
    ledger = stale_ledger(max_tracked_keys=2)
    count(ledger, [1, 2, 3, 3, 3])
    assert ledger.keys_overflowed and ledger.max_stale_repeat == 1
    count(ledger, [2, 4, 2])  # 2 counts on across the untracked 4: 3 times since 1, the latest made once
    assert ledger.max_stale_repeat == 3 == ledger.max_key_repeat


def test_settled_streak_counts_every_outcome_but_denied():
    ledger = Ledger(tg.GuardConfig(streak_stop_on="any"))
    for outcome in (tg.Outcome.OK, tg.Outcome.UNKNOWN, tg.Outcome.DENIED, tg.Outcome.ERROR, tg.Outcome.OK):
        ledger.count_call(key(1), "t")
        ledger.record_outcome(ledger.checks, outcome)
    assert ledger.streak_length == 5 and ledger.settled_streak_length == 4 and ledger.failing_streak_length == 0
    ledger.count_call(key(2), "t")
    assert ledger.settled_streak_length == 0
    ledger.record_outcome(ledger.checks - 1, tg.Outcome.OK)  # a late outcome of another key is not this streak's
    assert ledger.settled_streak_length == 0


# -- the cap with the stale signal ---------------------------------------------------------------


def test_stale_signal_lets_a_long_edit_and_rerun_turn_run_to_the_backstop(make_guard):
    calls = edit_and_rerun(150)  # 300 calls, the test re-run 150 times
    for signal, expected in (("repeat", (101, tg.Threshold.SOFT_STUCK)), ("stale_repeat", None)):
        guard = make_guard(stuck_signal=signal, streak_warn_at=0, streak_stop_at=0)
        with guard.turn() as turn:
            found = first_detection(drive(turn, calls))
        assert (None if found is None else (found[0], found[1].threshold)) == expected


@pytest.mark.parametrize("period", [1, 2, 3])
def test_a_loop_that_began_before_the_soft_cap_halts_at_call_s_plus_1_under_both_signals(make_guard, period):
    calls = [distinct_call(i) for i in range(60)] + rotation(period, 90 // period)
    for signal in STUCK_SIGNALS:
        guard = make_guard(stuck_signal=signal, soft_cap=100, streak_warn_at=0, streak_stop_at=0)
        with guard.turn() as turn:
            n, verdict = first_detection(drive(turn, calls))
        assert (n, verdict.action, verdict.threshold) == (101, tg.Action.HALT, tg.Threshold.SOFT_STUCK)
        assert ("nothing new" in verdict.message) == (signal == "stale_repeat")


@pytest.mark.parametrize("period", [1, 2, 3])
@pytest.mark.parametrize("seen_before", [False, True])
def test_past_the_soft_cap_the_stale_signal_fires_at_the_loops_own_dth_round(make_guard, period, seen_before):
    loop = rotation(period, 10)
    prefix = [distinct_call(i) for i in range(120)]
    if seen_before:  # the loop's calls were made once before, long ago
        prefix[10:10 + period] = loop[:period]
    first = {}
    for signal in STUCK_SIGNALS:
        guard = make_guard(stuck_signal=signal, soft_cap=100, stuck_repeat_threshold=6, streak_warn_at=0,
                           streak_stop_at=0)
        with guard.turn() as turn:
            first[signal] = first_detection(drive(turn, prefix + loop))[0]
    # the seed counts a visit long ago too; the stale signal counts the loop's own calls: its 6th round
    assert first["repeat"] == 120 + (4 if seen_before else 5) * period + 1
    assert first["stale_repeat"] == 120 + 5 * period + 1


def test_stale_signal_at_the_boundary_d_minus_1_allows(make_guard):
    calls = [distinct_call(i) for i in range(101)] + [distinct_call(999)] * 5
    for d, halts in ((6, False), (5, True)):
        guard = make_guard(stuck_signal="stale_repeat", stuck_repeat_threshold=d, streak_warn_at=0,
                           streak_stop_at=0)
        with guard.turn() as turn:
            verdicts = drive(turn, calls)
        assert (verdicts[-1].action is tg.Action.HALT) is halts


def test_summary_says_stuck_by_the_configured_signal(make_guard):
    calls = edit_and_rerun(10)
    for signal, stuck in (("repeat", True), ("stale_repeat", False)):
        with make_guard(stuck_signal=signal, streak_warn_at=0, streak_stop_at=0).turn() as turn:
            drive(turn, calls)
        assert turn.summary.stuck is stuck and (turn.summary.first_stuck_call > 0) is stuck


# -- the streak variant ---------------------------------------------------------------------------


@pytest.mark.parametrize("promptable, action", [(False, tg.Action.HALT), (True, tg.Action.ASK)])
def test_stop_on_any_fires_on_identical_calls_that_succeed(make_guard, promptable, action):
    call = tg.ToolCall("search", {"q": "same"})
    for stop_on, fires in (("error", False), ("any", True)):
        guard = make_guard(streak_stop_on=stop_on)
        with guard.turn(promptable=promptable) as turn:
            verdicts = []
            for _ in range(10):
                if turn.check_call(call).action is tg.Action.HALT:
                    break
                verdicts.append(turn.record_outcome(call, tg.Outcome.OK))
        stops = [(n, v.action) for n, v in enumerate(verdicts, 1) if v.event and v.event.level is tg.Level.STOP]
        assert stops == ([(8, action)] if fires else [])


def test_stop_on_any_counts_unknown_and_error_alike_and_ignores_denials(make_guard):
    call = tg.ToolCall("bash", "mvn test")
    outcomes = [tg.Outcome.UNKNOWN, tg.Outcome.ERROR, tg.Outcome.DENIED, tg.Outcome.OK] * 3
    guard = make_guard(streak_stop_on="any", streak_warn_at=0, streak_stop_at=8)
    with guard.turn() as turn:
        for n, outcome in enumerate(outcomes, 1):  # noqa: B007 (n is read after the loop)
            turn.check_call(call)
            verdict = turn.record_outcome(call, outcome)
            if verdict.action is tg.Action.HALT:
                break
    settled = [i for i, o in enumerate(outcomes, 1) if o is not tg.Outcome.DENIED]
    assert n == settled[7] and verdict.threshold is tg.Threshold.STREAK and verdict.event.limit == 8


def test_stop_on_any_boundary_seven_then_a_different_call_resets(make_guard):
    a, b = tg.ToolCall("ls", "ls"), tg.ToolCall("ls", "ls -la")
    guard = make_guard(streak_stop_on="any", streak_warn_at=0)
    with guard.turn() as turn:
        verdicts = drive(turn, [a] * 7 + [b] + [a] * 7)
    assert all(v.action is tg.Action.ALLOW for v in verdicts) and turn.halted is None
    with guard.turn() as turn:
        drive(turn, [a] * 8)
    assert turn.halted is not None


def test_stop_on_any_resolve_continue_resets_the_count(make_guard):
    call = tg.ToolCall("ls", "ls")
    guard = make_guard(streak_stop_on="any", streak_warn_at=0, streak_stop_at=3)
    with guard.turn(promptable=True) as turn:
        asks = []
        for n in range(1, 8):
            turn.check_call(call)
            verdict = turn.record_outcome(call, tg.Outcome.OK)
            if verdict.action is tg.Action.ASK:
                asks.append(n)
                turn.resolve(verdict, "continue")
    assert asks == [3, 6]


# -- configuration ---------------------------------------------------------------------------------


def test_new_options_load_from_env_and_toml(tmp_path):
    env = {"TURNGUARD_STUCK_SIGNAL": "stale_repeat", "TURNGUARD_STREAK_STOP_ON": "any"}
    config = tg.GuardConfig.from_env(env)
    assert (config.stuck_signal, config.streak_stop_on) == ("stale_repeat", "any")
    path = tmp_path / "turnguard.toml"
    path.write_text('stuck-signal = "stale_repeat"\nstreak_stop_on = "any"\n')
    config = tg.GuardConfig.from_toml(path)
    assert (config.stuck_signal, config.streak_stop_on) == ("stale_repeat", "any")


@pytest.mark.parametrize("options, key", [
    ({"stuck_signal": "stale"}, "stuck_signal"),
    ({"stuck_signal": "windowed"}, "stuck_signal"),
    ({"stuck_signal": None}, "stuck_signal"),
    ({"streak_stop_on": "ok"}, "streak_stop_on"),
    ({"streak_stop_on": "ERROR"}, "streak_stop_on"),
    ({"streak_stop_on": True}, "streak_stop_on"),
])
def test_bad_values_are_config_errors(options, key):
    with pytest.raises(tg.ConfigError) as info:
        tg.GuardConfig(**options)
    assert info.value.key == key


def test_bad_env_value_is_a_config_error():
    with pytest.raises(tg.ConfigError, match="streak_stop_on"):
        tg.GuardConfig.from_env({"TURNGUARD_STREAK_STOP_ON": "never"})


# -- fork (calibration counts a shared prefix once) ------------------------------------------------


def test_fork_carries_the_stale_and_settled_facts():
    config = tg.GuardConfig(stuck_signal="stale_repeat", streak_stop_on="any")
    ledger = Ledger(config)
    for k in (1, 2, 3, 2, 3, 3):
        ledger.count_call(key(k), "t")
        ledger.record_outcome(ledger.checks, tg.Outcome.OK)
    twin = ledger.fork(config.replace(soft_cap=20))
    assert (twin.max_stale_repeat, twin.settled_streak_length) == (ledger.max_stale_repeat, 2)
    for fact in (ledger, twin):
        fact.count_call(key(2), "t")
    assert twin.max_stale_repeat == ledger.max_stale_repeat == 3  # 2: twice before plus now, nothing new
    twin.count_call(key(9), "t")
    assert ledger.distinct_keys == 3  # the twin's tables are its own


def test_a_fork_in_the_middle_of_a_loop_counts_on_exactly_like_the_original():
    config = tg.GuardConfig(stuck_signal="stale_repeat")
    ledger = Ledger(config)
    count(ledger, [7, 1, 2, 3, 1, 2, 3])  # the loop has shown (3 came round)
    twin = ledger.fork(config.replace(soft_cap=20))
    for fact in (ledger, twin):
        count(fact, [1, 2, 3, 1])
    assert twin.max_stale_repeat == ledger.max_stale_repeat == ledger.max_key_repeat == 4
    for fact in (ledger, twin):
        count(fact, [8, 1])  # news: the count starts afresh until 8 comes round
    assert twin.max_stale_repeat == ledger.max_stale_repeat == 4


@pytest.mark.parametrize("change", [{"stuck_signal": "repeat"}, {"streak_stop_on": "error"}])
def test_fork_refuses_a_different_signal_or_stop_rule(change):
    ledger = Ledger(tg.GuardConfig(stuck_signal="stale_repeat", streak_stop_on="any"))
    ledger.count_call(key(1), "t")
    with pytest.raises(ValueError, match="stuck_signal"):
        ledger.fork(ledger.config.replace(**change))


def test_fork_refuses_a_threshold_the_stale_count_already_reached():
    ledger = stale_ledger()
    count(ledger, [1, 1, 1])
    ledger.fork(ledger.config.replace(stuck_repeat_threshold=4))  # 3 < 4 and 3 < 6: same facts
    with pytest.raises(ValueError):
        ledger.fork(ledger.config.replace(stuck_repeat_threshold=3))
