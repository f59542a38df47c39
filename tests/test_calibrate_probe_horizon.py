"""A probe whose own limit is too low to tell productive turns from runaways gets no value, only
"raise the probe's own limit": turns it censored count as not productive below it, so productive
turns it cut off would otherwise read as runaways and pull the recommended value down (issue 31,
audit a31: a 15x probe advised hard_multiplier = 3 on a fleet whose productive turns need up to 55x)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import frontier_fleet as ff
from ladders import ladder_of
from turnguard._calibrate import cli
from turnguard._calibrate.evidence import Scale, frontier, horizon_too_low

TOLERANCE = 0.1
SPREAD = ff.Design("spread", (11 * ff.S + 1, 55 * ff.S), (8, 12), (9, 12), right=False)
"""Long productive turns need 11x to 55x S: past any probe cap up to 55x, some are cut off."""


@pytest.mark.parametrize("gap", [0, 1, 2, 3])
@pytest.mark.parametrize("cap", [15, 20, 30, 40])
def test_sparse_productive_turns_ending_near_the_probes_limit_recommend_no_value(cap, gap):
    """One productive turn ends per rung up to ``gap`` rungs below the limit among 70 the limit
    censors: the success hazard there is too low for the empty rungs to show it fell."""
    last = cap - 1
    turns = [(k, "resolved", 1) for k in range(cap // 2, last - gap + 1)] + [(cap, "censored", 70)]
    lad = ladder_of(*turns, (1, "resolved", 20), (4, "unresolved", 40))
    assert horizon_too_low(lad, last)
    f = frontier("backstop", lad, 10, TOLERANCE, Scale(200, 200, 20_000), horizon=cap)
    assert f.recommended is None and f.limit_too_low
    assert not any(r.decision == "within" for r in f.rungs)
    assert f"passed {last - gap}x and 70 of the 70 probe turns past it were halted at the probe's own limit" in \
        f.sentence
    assert f.sentence.endswith(f"raise the probe's own limit to see past {cap}x.")


@pytest.mark.parametrize("gap", [3, 4, 6])
def test_productive_turns_that_stopped_ending_before_the_limit_leave_a_value(gap):
    """Many productive turns end per rung, then none for ``gap`` rungs among 40 censored: the
    hazard fell, the censored turns are runaways, and the first value past the last one is set."""
    cap = 25
    longest = cap - 1 - gap
    turns = [(k, "resolved", 4) for k in range(11, longest + 1)] + [(cap, "censored", 40)]
    lad = ladder_of(*turns, (4, "unresolved", 40))
    assert not horizon_too_low(lad, cap - 1)
    f = frontier("backstop", lad, 10, TOLERANCE, Scale(200, 200, 20_000), horizon=cap)
    assert f.recommended == longest + 1 and not f.limit_too_low


@pytest.mark.parametrize("fate", ["unresolved", "cut"])
def test_without_turns_censored_past_the_longest_productive_one_the_limit_cut_nothing(fate):
    lad = ladder_of((13, "resolved", 1), (14, "resolved", 1), (15, fate, 70))
    assert not horizon_too_low(lad, 14)


def test_with_no_productive_turn_the_rule_keeps_the_frontiers_answer():
    lad = ladder_of((15, "censored", 70))
    assert not horizon_too_low(lad, 14)
    assert frontier("backstop", lad, 10, TOLERANCE, Scale(70, 70, 7000), horizon=15).recommended == 2


def _calibrate(design: ff.Design, cap: int, seed: int, folder: Path) -> tuple[list[ff.Planted], dict]:
    probe = {**ff.PROBE, "hard_multiplier": cap}
    turns = ff.run(folder / "turns.jsonl", design, seed=seed, probe=probe)
    args = [str(folder / "turns.jsonl"), "--config", str(ff.config_file(folder, probe=probe)), "--soft-caps",
            str(ff.S), "--multipliers", "10", "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers",
            "--explicit-caps", "100", "--key-modes", "canonical", "--json", "-"]
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(args, stdout=out, stderr=err) == 0, err.getvalue()
    return turns, json.loads(out.getvalue())["probe"]["frontier"]["backstop"]


@pytest.mark.parametrize("seed", [0, 1, 5])
@pytest.mark.parametrize("cap", [15, 20, 30, 40])
def test_a_probe_capped_below_the_productive_turns_never_gets_a_value_that_halts_them(cap, seed, tmp_path):
    """The planted truth: a value recommended halts at most the tolerance's share of productive
    turns, every turn run with no limit; else the advice is to raise the probe's own limit."""
    turns, got = _calibrate(SPREAD, cap, seed, tmp_path)
    rec = got["recommended"]
    if rec is not None:
        halted = [t for t in turns if t.reach["backstop"] >= rec]
        assert sum(t.work.productive for t in halted) / len(halted) < TOLERANCE, got["sentence"]
    else:
        assert got["sentence"].endswith(f"raise the probe's own limit to see past {cap}x.")
    assert rec is None or rec >= ff.truth_safe(turns, "backstop", TOLERANCE)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize(("design", "cap", "want"), [(ff.KEEP, 25, 10), (ff.KEEP, 40, 10), (ff.RAISE, 25, 22),
                                                     (ff.RAISE, 40, 22)], ids=["keep-25x", "keep-40x",
                                                                               "raise-25x", "raise-40x"])
def test_a_probe_limit_past_the_productive_turns_keeps_its_value(design, cap, want, seed, tmp_path):
    assert _calibrate(design, cap, seed, tmp_path)[1]["recommended"] == want
