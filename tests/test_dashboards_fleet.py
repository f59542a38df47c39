"""tests/fleet.py: the simulated fleet really has the mix the dashboard proof relies on."""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter

import pytest

import fleet
import turnguard as tg

Kind = fleet.Kind


@pytest.fixture(scope="module")
def quiet():
    """The fleet's flaky plugin raises on purpose; the guard logs each one."""
    logger = logging.getLogger("turnguard")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.fixture(scope="module")
def tally(quiet):
    return fleet.run_fleet(fleet.make_fleet(tg.GuardConfig(load_entrypoints=False)))


def _by_kind(tally, kind):
    return [t.summary for t in tally.turns if t.kind is kind]


def test_fleet_runs_every_planned_turn(tally):
    mix = fleet.FleetMix()
    assert mix.turns >= 1000
    assert Counter(t.kind for t in tally.turns) == Counter(mix.counts())


def test_short_and_long_productive_turns_complete(tally):
    config = tg.GuardConfig()
    short, long = _by_kind(tally, Kind.SHORT), _by_kind(tally, Kind.LONG)
    assert all(s.reason == "completed" and s.tool_calls <= 41 for s in short)
    assert all(s.reason == "completed" and not s.stuck for s in long)
    assert all(config.soft_cap < s.tool_calls <= config.hard_cap for s in long)
    assert {s.max_key_repeat for s in long} == set(range(2, config.stuck_repeat_threshold))  # near misses at D - 1
    bands = Counter(next(i for i, (lo, hi) in enumerate(fleet.LONG_LENGTHS) if lo <= s.tool_calls <= hi) for s in long)
    assert len(bands) == len(fleet.LONG_LENGTHS)


def test_stuck_turns_halt_past_the_soft_cap_and_runaways_at_the_backstop(tally):
    config = tg.GuardConfig()
    stuck = _by_kind(tally, Kind.SOFT_STUCK)
    assert all(s.threshold == tg.Threshold.SOFT_STUCK and s.stuck and s.tool_calls > config.soft_cap for s in stuck)
    assert any(s.first_stuck_call < config.soft_cap for s in stuck)  # stuck early, held until S
    assert any(s.first_stuck_call > config.soft_cap for s in stuck)  # stuck late, halted at once
    runaways = _by_kind(tally, Kind.RUNAWAY)
    assert all(s.threshold == tg.Threshold.HARD_BACKSTOP and s.tool_calls == config.hard_cap + 1 for s in runaways)
    assert all(not s.stuck and s.first_stuck_call == 0 for s in runaways)


def test_halted_stuck_and_runaway_turns_end_on_every_exit_path(tally):
    """Hosts leave a halted turn by breaking out, by raise_for, by an exception of their own or by
    end(reason): the fleet's halted turns carry each outcome, so the boards' "not halted" is
    proven against halted turns whose outcome is not ``halted``."""
    for kind in (Kind.SOFT_STUCK, Kind.RUNAWAY):
        summaries = _by_kind(tally, kind)
        assert all(s.halted and s.threshold is not None for s in summaries)
        assert {s.reason for s in summaries} == {"halted", "error", "cancelled", fleet.HOST_REASON}


def test_failing_streaks_attended_and_unattended(tally):
    unattended = _by_kind(tally, Kind.FAILING_UNATTENDED)
    assert all(s.threshold == tg.Threshold.STREAK and s.reason == "halted" and not s.promptable for s in unattended)
    assert all(s.reason == "halted" and s.promptable for s in _by_kind(tally, Kind.ASK_STOP))
    assert all(s.reason == "completed" for s in _by_kind(tally, Kind.ASK_CONTINUE))
    assert all(s.reason == "completed" for s in _by_kind(tally, Kind.ASK_LATE_CONTINUE))
    levels = Counter((str(e.level), e.action.label, e.promptable) for e in tally.detections
                     if e.threshold == tg.Threshold.STREAK)
    mix = fleet.FleetMix()
    assert levels[("warn", "allow", False)] == mix.failing_unattended  # observed, nobody to ask
    assert levels[("stop", "halt", False)] == mix.failing_unattended
    assert levels[("warn", "ask", True)] == mix.ask_continue + mix.ask_stop + mix.ask_late_continue
    assert levels[("stop", "ask", True)] == mix.ask_late_continue


def test_asks_are_answered_continue_and_stop(tally):
    mix = fleet.FleetMix()
    answers = Counter(answer for _, answer in tally.answers)
    assert answers == {"continue": mix.ask_continue + mix.ask_late_continue, "stop": mix.ask_stop}


def test_explicit_cap_and_a_raising_plugin(tally):
    explicit = _by_kind(tally, Kind.EXPLICIT)
    assert {s.cap_mode for s in explicit} == {"explicit"}
    halted = [s for s in explicit if s.reason == "halted"]
    assert halted and all(s.tool_calls == fleet.EXPLICIT_CAP + 1 for s in halted)
    assert any(s.reason == "completed" for s in explicit)
    ((plugin, hook, error), count), = tally.plugin_errors.items()
    assert (plugin, hook, error) == ("flaky", "turnguard_check_call", "RuntimeError") and count > 0


def test_cycle_cap_turns_are_halted_on_a_model_request_no_tool_tripped(tally):
    capped = _by_kind(tally, Kind.CYCLE_CAP)
    assert capped and all(s.reason == "halted" and str(s.threshold) == "cycle_cap" for s in capped)
    halts = [e for e in tally.detections if str(e.threshold) == "cycle_cap" and e.action is tg.Action.HALT]
    assert len(halts) == len(capped) and all(e.tool_name is None for e in halts)


def test_fleet_is_deterministic_for_a_seed(quiet):
    small = fleet.FleetMix(short=30, long=3, soft_stuck=3, runaway=0, failing_unattended=3, ask_continue=3,
                           ask_stop=3, ask_late_continue=3, explicit=3)

    def signature(seed):
        run = fleet.run_fleet(fleet.make_fleet(tg.GuardConfig(load_entrypoints=False)), small, seed=seed)
        return [(t.kind, t.summary.tool_calls, t.summary.reason) for t in run.turns]

    assert signature(7) == signature(7)
    assert signature(7) != signature(8)


def test_polling_turns_restart_their_streak_at_each_new_answer(tally):
    """Each polling turn's restarts are its status call's changes of answer (the guard's own count,
    checked against the answers the driver planned), and nothing else in the fleet restarts."""
    polling = _by_kind(tally, Kind.POLLING)
    assert polling and all(s.reason == "completed" for s in polling)
    assert all(len(s.result_restarts) == 1 and s.result_restarts[0][0] in fleet.POLL_TOOLS for s in polling)
    assert {s.result_restarts[0][0] for s in polling} == set(fleet.POLL_TOOLS)
    others = [t.summary for t in tally.turns if t.kind is not Kind.POLLING]
    assert not any(s.result_restarts for s in others)
    rng = random.Random(5)
    tool, _ = rng.choice(fleet.POLL_TOOLS), rng.randint(1, 10**6)  # the driver's draws before the answers
    answers = fleet.poll_answers(rng)
    changes = sum(1 for a, b in itertools.pairwise(answers) if a != b)
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, stateful_tools=fleet.POLL_TOOLS))
    with guard.turn() as turn:
        fleet._polling(turn, random.Random(5), guard.config)
    assert turn.summary.result_restarts == ((tool, changes),) and changes >= 3
