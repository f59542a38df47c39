"""The evidence behind the ``stateful_tools`` default (docs/polling.md, "Measure before widening"):
listing the tools that poll removes the polling false halts and keeps every stuck turn caught;
taking every tool's changed result as progress ("*") misses degenerate runs whose output varies."""

from __future__ import annotations

import pytest

import polling_evidence as ev
from conftest import corpus_files
from turnguard._calibrate.inputs import read_turns


@pytest.fixture(scope="module")
def data_sets(tmp_path_factory: pytest.TempPathFactory) -> list[ev.DataSet]:
    generated = tmp_path_factory.mktemp("polling") / "polling-turns.jsonl"
    ev.write_polling_turns(str(generated))
    recorded = list(read_turns(corpus_files(), lambda p: None))
    return ev.data_sets(recorded, list(read_turns([generated], lambda p: None)))


def figures(data: ev.DataSet, profile: str, lists: str) -> ev.Figures:
    return next(f for f in data.figures if f.name == f"{profile}, {lists}")


NONE, LISTED, ALL = (label for label, _ in ev.LISTS)


@pytest.mark.parametrize("profile", ["seed", "recommended"])
def test_listing_the_polling_tools_removes_the_false_halts_and_keeps_the_stuck_turns_caught(data_sets, profile):
    generated = data_sets[-1]
    assert generated.turns == {"progressing": 15, "constant": 6, "noisy": 6}
    none, listed = figures(generated, profile, NONE), figures(generated, profile, LISTED)
    assert none.caught("progressing") >= 10 and listed.caught("progressing") == 0
    for kind in ("constant", "noisy"):
        assert listed.caught(kind) == none.caught(kind) > 0
        assert listed.mean_halt(kind) <= none.mean_halt(kind) + 1  # at most one call later (at the outcome)
    assert figures(generated, profile, LISTED).caught("constant") == (6 if profile == "recommended" else 4)


@pytest.mark.parametrize("profile", ["seed", "recommended"])
def test_every_tool_stateful_misses_the_degenerate_runs_whose_output_varies(data_sets, profile):
    generated = data_sets[-1]
    assert figures(generated, profile, ALL).caught("noisy") == 0 < figures(generated, profile, LISTED).caught("noisy")
    for recorded in data_sets[:2]:
        assert recorded.turns["stuck"] > 30
        none, everything = figures(recorded, profile, NONE), figures(recorded, profile, ALL)
        assert everything.caught("stuck") < none.caught("stuck") * 0.6  # about half the stuck runs lost
        assert figures(recorded, profile, LISTED).halted == none.halted  # the corpus has no polling tool


def test_the_table_has_a_row_per_data_set_and_variant(data_sets):
    lines = ev.table(data_sets).splitlines()
    assert len(lines) == 2 + sum(len(d.figures) for d in data_sets) == 2 + 3 * 6
    assert lines[2].startswith("| recorded corpus (S=100) | seed, none listed |")
