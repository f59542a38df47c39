"""A base configuration that disables built-in policy plugins (``disable_plugins``): calibrate's
default row is that configuration, so it halts every recorded turn where the live guard halted
it, and replays that group policies give the figures of replaying every policy alone."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

import turnguard as tg
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.inputs import read_turns
from turnguard._plugins import DEFAULT_PLUGINS, NON_POLICY_PLUGINS

SMALL_LIMITS = {"soft_cap": 4, "hard_multiplier": 2, "stuck_repeat_threshold": 3, "streak_warn_at": 2,
                "streak_stop_at": 3, "streak_stop_on": "any", "max_cycles_per_turn": 5, "cycle_repeat_warn_at": 2,
                "cycle_repeat_stop_at": 3}
SUBSETS = [names for k in range(len(DEFAULT_PLUGINS) + 1) for names in itertools.combinations(DEFAULT_PLUGINS, k)]
"""Every set of built-in policy plugins, alone and together (the empty set too)."""


def live_turns(config: tg.GuardConfig, path: Path, count: int, seed: int) -> dict[str, tuple[int, str | None]]:
    """``count`` random turns through a live guard recording to ``path``: by turn id, the call its
    halt refused (``calls + 1``: after the last) and the threshold, or ``(0, None)``."""
    rng = random.Random(seed)
    guard = tg.Guard(config.replace(recorder_path=str(path), load_entrypoints=False), environ={})
    halts: dict[str, tuple[int, str | None]] = {}
    for t in range(count):
        halt: tuple[int, str | None] = (0, None)
        with guard.turn(turn_id=f"t{t}", promptable=False) as turn:
            for k in range(1, rng.randint(1, 14) + 1):
                verdict = turn.begin_cycle()  # one model request per call: the replay places them alike
                if verdict.halted:
                    halt = (k, str(verdict.threshold))
                    break
                call = tg.ToolCall("bash", rng.choice(["make", "make", "test", "ls"]))
                verdict = turn.check_call(call)
                if verdict.halted:
                    halt = (k, str(verdict.threshold))
                    break
                verdict = turn.record_outcome(call, rng.choice([tg.Outcome.OK, tg.Outcome.ERROR]))
                if verdict.halted:
                    halt = (k + 1, str(verdict.threshold))
                    break
        halts[f"t{t}"] = halt
    return halts


@pytest.mark.parametrize("disabled", SUBSETS, ids=lambda names: "+".join(names) or "none")
def test_the_default_row_halts_where_the_live_guard_with_those_plugins_disabled_halted(
        tmp_path: Path, disabled: tuple[str, ...]) -> None:
    config = tg.GuardConfig(**SMALL_LIMITS, disable_plugins=(*disabled, "otel"))
    halts = live_turns(config, tmp_path / "turns.jsonl", 40, seed=len(disabled) * 7 + sum(map(len, disabled)))
    policies = build_grid(GridSpec(base=config, peers=False))
    assert policies[0].is_default and set(policies[0].config.disable_plugins) == set(disabled)
    calibrator = Calibrator(policies)
    turns = list(read_turns([tmp_path / "turns.jsonl"], lambda problem: pytest.fail(str(problem))))
    assert {t.id for t in turns} == set(halts)
    for turn in turns:
        result = calibrator.results(turn)[0].get("unattended")
        replayed = (result.halt_call, result.threshold) if result is not None else (0, None)
        assert replayed == halts[turn.id], turn


@pytest.mark.parametrize("disabled", SUBSETS[1:], ids=lambda names: "+".join(names))
def test_grouped_replays_equal_replaying_each_policy_with_plugins_disabled(tmp_path: Path,
                                                                         disabled: tuple[str, ...]) -> None:
    config = tg.GuardConfig(**SMALL_LIMITS, disable_plugins=("otel",))
    live_turns(config, tmp_path / "turns.jsonl", 60, seed=3)
    turns = list(read_turns([tmp_path / "turns.jsonl"], lambda problem: pytest.fail(str(problem))))
    spec = GridSpec(base=config.replace(disable_plugins=disabled), soft_caps=(2, 4, 8), multipliers=(2, 3),
                    stuck_repeats=(2, 3), streaks=((2, 3), (0, 2), (0, 0)), explicit_caps=(3, 6), cycle_caps=(0, 3),
                    cycle_repeats=((2, 3), (0, 0)))
    policies = build_grid(spec)
    assert all(set(p.config.disable_plugins) == set(disabled) for p in policies if not p.extras)
    figures = []
    for group in (True, False):
        data = Calibrator(policies, group=group).add_all(turns).to_json()
        data.pop("replays")
        figures.append(data)
    assert figures[0] == figures[1]


def test_only_policy_plugins_stay_disabled_in_the_grid() -> None:
    base = tg.GuardConfig(disable_plugins=("streak", *NON_POLICY_PLUGINS, "someone-elses"))
    assert all(p.config.disable_plugins == ("streak",) for p in build_grid(GridSpec(base=base)))
