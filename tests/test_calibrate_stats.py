"""Figures merge: runs over the parts of an input, merged, equal one run over the whole of it."""

from __future__ import annotations

import json

import pytest

from synthetic import SMALL, records
from turnguard._calibrate.bounds import ids_per_policy
from turnguard._calibrate.corpus import corpus_turn
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.replay import TurnResult
from turnguard._calibrate.stats import MAX_IDS, ModeStats, RunStats

GRID = GridSpec(soft_caps=(5, 20), stuck_repeats=(3,), explicit_caps=(15,))


def sample(count: int = 120) -> list:
    return [corpus_turn(r, "gen", i, print) for i, r in enumerate(records(count, seed=2, mix=SMALL))]


def run(turns: list) -> RunStats:
    return Calibrator(build_grid(GRID)).add_all(turns)


def test_merged_parts_equal_the_whole_and_survive_json() -> None:
    turns = sample()
    whole = run(turns).to_json()
    merged = RunStats.from_json(json.loads(json.dumps(run(turns[:50]).to_json())))
    merged.merge(RunStats.from_json(json.loads(json.dumps(run(turns[50:]).to_json()))))
    data = merged.to_json()
    data.pop("replays"), whole.pop("replays")
    assert data == whole
    assert whole["turns"] == 120 and any(p["unattended"]["halted"] for p in whole["policies"])


def test_merging_results_of_different_grids_is_refused() -> None:
    a = run(sample(5))
    b = Calibrator(build_grid(GridSpec(soft_caps=(7,)))).add_all(sample(5))
    with pytest.raises(ValueError, match="different grids"):
        a.merge(b)


@pytest.mark.parametrize("bad", [{}, {"format": "other/1"}, {"format": "turnguard-_calibrate/1"}])
def test_from_json_refuses_what_is_not_a_result(bad: dict) -> None:
    with pytest.raises((ValueError, KeyError)):
        RunStats.from_json(bad)


def test_resolved_ids_are_bounded_but_counted() -> None:
    stats = ModeStats(max_ids=MAX_IDS)
    for i in range(MAX_IDS + 30):
        stats.add(f"t{i}", 10, True, TurnResult(4, "streak"))
    assert stats.halted_resolved == MAX_IDS + 30 and len(stats.resolved_ids) == MAX_IDS


@pytest.mark.parametrize(("policies", "kept"), [(1, 50), (200, 50), (400, 25), (2000, 5)])
def test_a_large_grid_keeps_fewer_ids_per_policy(policies: int, kept: int) -> None:
    """Ids over the whole grid are bounded (at most 10,000, each at most 256 characters)."""
    assert ids_per_policy(policies) == kept


def test_saved_calls_and_positions() -> None:
    stats = ModeStats()
    stats.add("a", 10, False, TurnResult(4, "explicit"))  # calls 4..10 not made
    stats.add("b", 10, False, TurnResult(11, "streak"))  # halted after the last call: nothing saved
    stats.add("c", 10, None, TurnResult(1, "cycle_cap"))
    assert (stats.saved_unresolved, stats.halted_unresolved, stats.saved_unknown) == (7, 2, 10)
    assert stats.halt_deciles[3] == 1 and stats.halt_deciles[10] == 1 and stats.halt_deciles[0] == 1
