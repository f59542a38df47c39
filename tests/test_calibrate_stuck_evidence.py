"""The README's stuck-signal claims, asserted on the recorded corpus and the generated long turns
(so that a change in a policy or in the ledger cannot silently falsify the table)."""

from __future__ import annotations

import pytest

import stuck_evidence as ev
from conftest import SHARED_CORPUS, corpus_files
from turnguard._calibrate.inputs import read_turns

CORPUS = SHARED_CORPUS
DEGENERATE = "deepseek-chat-v2/googlecontainertools__jib-4035"
"""Solved early, then 20 identical failing calls: the one resolved run a stuck rule may halt."""


def by_name(data: ev.DataSet) -> dict[str, ev.VariantFigures]:
    return {v.name: v for v in data.variants}


@pytest.fixture(scope="module")
def recorded() -> ev.DataSet:
    files = corpus_files()
    return ev.evaluate("recorded", read_turns(files, lambda p: None), ev.CORPUS_SOFT_CAP)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> ev.DataSet:
    path = tmp_path_factory.mktemp("long") / "long-turns.jsonl"
    assert ev.write_long_turns(str(path)) == len(list(ev.long_turns()))
    return ev.evaluate("generated", read_turns([path], lambda p: None), ev.LONG_SOFT_CAP)


SEED, STALE, ANY, BOTH = (name for name, _ in ev.VARIANTS)


def test_the_generated_set_has_the_shapes_the_issue_asks_for():
    turns = list(ev.long_turns())
    edits = [t for t in turns if "/edit-and-rerun" in t["id"]]
    assert edits and all(100 <= len(t["calls"]) <= 501 and t["resolved"] is True for t in edits)
    assert {2, 3} == {int(t["id"].split("rotation")[1][0]) for t in turns if "/rotation" in t["id"]}
    assert any(len(t["calls"]) > 1000 for t in turns if "/runaway" in t["id"])
    assert turns == list(ev.long_turns())  # seeded: reproducible (the ids alone do not depend on the seed)


def test_the_corpus_is_what_the_lead_measured(recorded):
    assert (recorded.turns, recorded.resolved, recorded.identical, recorded.stuck) == (648, 108, 34, 33)


def test_the_seed_signal_halts_every_edit_and_rerun_turn_and_the_stale_signal_none(generated):
    v = by_name(generated)
    assert len(v[SEED].resolved_halted) == generated.resolved == 21
    assert v[STALE].resolved_halted == [] and v[BOTH].resolved_halted == []


@pytest.mark.parametrize("variant", [STALE, ANY, BOTH])
def test_no_alternative_halts_a_resolved_recorded_run_but_the_degenerate_one(recorded, variant):
    assert by_name(recorded)[variant].resolved_halted == [DEGENERATE]


@pytest.mark.parametrize("variant", [ANY, BOTH])
def test_stop_on_any_catches_every_run_with_8_identical_calls(recorded, generated, variant):
    for data in (recorded, generated):
        assert by_name(data)[variant].identical_caught == data.identical > 0
    assert by_name(recorded)[SEED].identical_caught < recorded.identical  # the seed's rule misses some


def test_every_stuck_run_the_seed_catches_is_still_caught_and_no_later_on_average(recorded, generated):
    for data in (recorded, generated):
        total, kept, seed_mean, both_mean = data.seed_caught_still_caught(by_name(data)[BOTH])
        assert total > 0 and kept == total
        assert both_mean <= seed_mean
    # On the recorded runs the combination is earlier outright (the any-outcome stop).
    _, _, seed_mean, both_mean = recorded.seed_caught_still_caught(by_name(recorded)[BOTH])
    assert both_mean < seed_mean


def test_the_stale_signal_halts_a_rotation_at_the_same_call_as_the_seed(generated):
    seed, stale = by_name(generated)[SEED], by_name(generated)[STALE]
    rotations = [i for i in seed.stuck_caught if "/rotation" in i]
    assert len(rotations) == 16
    assert {i: stale.stuck_caught.get(i) for i in rotations} == {i: seed.stuck_caught[i] for i in rotations}


def test_the_table_has_a_row_per_variant_and_data_set(recorded, generated):
    text = ev.table([recorded, generated])
    assert text.count("\n") == 1 + 2 * len(ev.VARIANTS)
    assert f"`{DEGENERATE}`" in text
