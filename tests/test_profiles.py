"""``tg.PROFILES``: read-only, the seed's defaults, and a recommended profile whose targets hold on
the recorded corpus and the generated long turns (the table in docs/stuck-signals.md)."""

from __future__ import annotations

import dataclasses

import pytest

import stuck_evidence as ev
import turnguard as tg
from conftest import CORE_ONLY, corpus_files, drive
from turnguard._calibrate.inputs import read_turns


@pytest.fixture(scope="module")
def data_sets(tmp_path_factory: pytest.TempPathFactory) -> list[ev.DataSet]:
    long_turns = tmp_path_factory.mktemp("long") / "long-turns.jsonl"
    ev.write_long_turns(str(long_turns))
    recorded = list(read_turns(corpus_files(), lambda p: None))
    generated = list(read_turns([long_turns], lambda p: None))
    return ev.profile_data_sets(recorded, generated)


def figures(data: ev.DataSet, profile: str) -> ev.VariantFigures:
    return next(v for v in data.variants if v.name == profile)


def test_profiles_name_the_seed_defaults_and_a_recommended_configuration():
    assert set(tg.PROFILES) >= {"seed", "recommended"}
    assert tg.PROFILES["seed"] == tg.GuardConfig()
    assert all(isinstance(c, tg.GuardConfig) for c in tg.PROFILES.values())
    assert tg.GuardConfig() == tg.PROFILES["seed"]  # the defaults stay the seed's
    assert tg.PROFILES["recommended"].name == "recommended"  # its own series (turnguard.policy)


def test_profiles_cannot_be_changed_in_place():
    with pytest.raises(TypeError):
        tg.PROFILES["seed"] = tg.GuardConfig(soft_cap=5)  # type: ignore[index]
    with pytest.raises(TypeError):
        del tg.PROFILES["recommended"]  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tg.PROFILES["recommended"].soft_cap = 5  # type: ignore[misc]


def test_the_evidence_table_compares_the_profiles_as_shipped():
    names = [name for name, _ in ev.PROFILE_CANDIDATES]
    configs = dict(ev.PROFILE_CANDIDATES)
    assert names[:2] == ["seed", "recommended"]
    assert configs["seed"] is tg.PROFILES["seed"] and configs["recommended"] is tg.PROFILES["recommended"]


def test_the_data_sets_hold_runs_the_targets_are_about(data_sets):
    recorded_100, recorded_20, generated = data_sets
    assert (recorded_100.soft_cap, recorded_20.soft_cap, generated.soft_cap) == (100, 20, 100)
    for data in data_sets:
        assert data.identical > 0 and data.resolved > 0
    assert {t for v in recorded_100.variants for t in v.resolved_halted} >= ev.DEGENERATE_RESOLVED


def test_the_recommended_profile_halts_no_resolved_run_but_the_degenerate_one(data_sets):
    for data in data_sets:
        assert set(figures(data, "recommended").resolved_halted) <= ev.DEGENERATE_RESOLVED, data.name


def test_the_recommended_profile_catches_every_run_of_8_identical_calls(data_sets):
    for data in data_sets:
        assert figures(data, "recommended").identical_caught == data.identical, data.name


def test_the_seed_profile_misses_the_targets_the_recommended_one_meets(data_sets):
    """The targets discriminate: the seed's failing-only streak misses identical runs whose calls
    are ``unknown``, and its stuck signal halts every generated edit-and-rerun turn."""
    assert not any(ev.meets_profile_targets(d, figures(d, "seed")) for d in data_sets)
    assert all(ev.meets_profile_targets(d, figures(d, "recommended")) for d in data_sets)


def test_a_live_guard_with_the_recommended_profile_halts_identical_successful_calls():
    config = tg.PROFILES["recommended"].replace(**CORE_ONLY)
    turn = tg.Guard(config, environ={}).turn(promptable=False)
    verdicts = drive(turn, [tg.ToolCall("search", {"q": "parseValue"})] * 20, tg.Outcome.OK)
    # The 8 identical calls ran; the 9th is refused (the streak counts calls that completed).
    assert len(verdicts) == ev.STUCK_RUN + 1 and verdicts[-1].halted
    assert verdicts[-1].threshold == tg.Threshold.STREAK
