"""Censoring is explicit: a turn whose recording ends at a halt of its own (live or probe) before a
row's threshold is ``censored`` for that row, never "not halted" and never "saved"; a halt of such
a turn is no false-positive evidence. Checked on every kind of row and mode, on a fleet with
planted truth run through a real guard with a probe, and on hostile recordings (a halted turn
that claims to be resolved)."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest

from planted_fleet import LIVE, S, run_fleet
from turnguard._calibrate import cli
from turnguard._calibrate.bounds import COHORT_KEYS
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.report import table
from turnguard._calibrate.stats import RunStats, halt_ended
from turnguard._config import GuardConfig

GRID = ["--soft-caps", "10,20", "--multipliers", "5,10,15,20,30", "--stuck-repeats", "3,6,9", "--streaks",
        "5:8,5:13,3:0", "--explicit-caps", "100,300", "--cycle-caps", "0,150", "--streak-stop-on", "error,any",
        "--key-modes", "canonical,bytes"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("fleet")
    fleet = run_fleet(folder / "turns.jsonl")
    config = folder / "turnguard.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items()))
    return fleet, config


def run_json(path: Path, config: Path, *flags: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    assert cli.main([str(path), "--config", str(config), *GRID, *flags, "--json", "-"], stdout=out, stderr=err) == 0, \
        err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def result(fleet) -> dict:
    f, config = fleet
    return run_json(f.path, config)


def replays(path: Path, config: Path) -> tuple[list, list]:
    """Every turn, and each policy's replay of each turn alone (the oracle for where it halts)."""
    policies = build_grid(GridSpec(soft_caps=(10, 20), multipliers=(5, 10, 15, 20, 30), stuck_repeats=(3, 6, 9),
                                   streaks=((5, 8), (5, 13), (3, 0)), explicit_caps=(100, 300), cycle_caps=(0, 150),
                                   base=GuardConfig.load(str(config))))
    turns = list(read_turns([path], print))
    cal = Calibrator(policies, group=False)
    return turns, [cal.results(t) for t in turns]


def test_every_row_and_mode_splits_the_turns_into_known_and_censored(fleet, result):
    """For each row and mode: the turns whose recording ends at a halt of their own are either
    halted by the row within the recording (a halt without false-positive evidence) or censored;
    the halts with evidence are exactly those of turns recorded to their own end."""
    turns_by_cohort = result["halt_ended"]
    f, _ = fleet
    ended_at_halt = Counter((t.summary.cohort) for t in f.turns.values() if t.summary.halted)
    assert turns_by_cohort == dict(ended_at_halt)
    for p in result["policies"]:
        for mode in ("unattended", "attended"):
            m = p[mode]
            for cohort, n in turns_by_cohort.items():
                assert m["censored_by_cohort"][cohort] + m["halted_censored_by_cohort"].get(cohort, 0) == n, p["name"]
            assert m["censored"] == sum(m["censored_by_cohort"].values())
            assert m["halted"] == m["halted_censored"] + m["evidence_halts"], p["name"]
            assert m["evidence_halts"] == m["halted_resolved"] + m["halted_unresolved"] + m["halted_unknown"]
            assert sum(m["evidence_by_source"].values()) == m["evidence_halts"]
            assert result["turns"] >= m["halted"] + m["censored"]


def test_no_censored_turn_is_counted_as_anything_known(fleet, result):
    """Replaying each turn alone under each row: a turn that ended at a halt of its own is in no
    id list, no saved count and no resolved or unresolved count of any row."""
    f, config = fleet
    turns, results = replays(f.path, config)
    cut = {t.id for t in turns if halt_ended(t.ended_by)}
    assert len(cut) > 50
    by_name = {p["name"]: p for p in result["policies"]}
    names = [p["name"] for p in result["policies"]]
    for idx, name in enumerate(names):
        row = by_name[name]["unattended"]
        assert not cut & set(row["resolved_ids"]) and not cut & set(row["unresolved_ids"]), name
        halted_cut = sum(1 for t, r in zip(turns, results, strict=True)
                         if t.id in cut and r[idx].get("unattended") and r[idx]["unattended"].halted)
        assert row["halted_censored"] == halted_cut, name
        assert row["censored"] == len(cut) - halted_cut, name
        saved = sum(len(t.calls) - r[idx]["unattended"].halt_call + 1 for t, r in zip(turns, results, strict=True)
                    if t.id not in cut and t.resolved is False and r[idx].get("unattended")
                    and r[idx]["unattended"].halted)
        assert row["saved_unresolved"] == saved, name


def test_raising_the_backstop_past_the_live_one_censors_the_turns_it_halted(fleet, result):
    """The issue's case: live turns halted at the backstop (x10) are censored for x15, x20 and x30,
    not 'not halted'; x10's halts of them are no false-positive evidence."""
    f, _ = fleet
    backstopped = sum(1 for t in f.of("live") if str(t.summary.threshold) == "hard_backstop")
    assert backstopped >= 30
    rows = {p["name"]: p["unattended"] for p in result["policies"]}
    for name in ("x15", "x20", "x30"):
        assert rows[name]["censored_by_cohort"]["live"] >= backstopped, name
        assert rows[name]["by_threshold"].get("hard_backstop", 0) <= sum(
            1 for t in f.of("probe") if (t.summary.tool_calls > {"x15": 15, "x20": 20, "x30": 30}[name] * S)), name
    default = rows["default"]
    assert default["halted_censored_by_cohort"]["live"] == sum(1 for t in f.of("live") if t.summary.halted)
    assert default["censored_by_cohort"]["live"] == 0
    assert default["evidence_by_source"].get("live", 0) == 0  # live halts of the live policy are no evidence


def test_a_row_whose_halts_have_no_recorded_future_says_so(tmp_path):
    """Halted turns that claim to be resolved (a host that submits after a halt) are still no
    false-positive evidence: the row shows '?', not a count."""
    path = tmp_path / "turns.jsonl"
    lines = [{"id": f"h{i}", "calls": [{"tool": "t", "args": f"a{j}", "outcome": "ok"} for j in range(101)],
              "ended_by": "hard_backstop", "resolved": True, "cohort": "live"} for i in range(5)]
    lines += [{"id": f"s{i}", "calls": [{"tool": "t", "args": f"a{j}", "outcome": "ok"} for j in range(20)],
               "ended_by": "completed", "resolved": True, "cohort": "live"} for i in range(5)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    policies = build_grid(GridSpec(soft_caps=(10,), multipliers=(10, 20), stuck_repeats=(6,), streaks=((5, 8),),
                                   explicit_caps=(), cycle_caps=(0,), key_modes=("canonical",), peers=False,
                                   base=GuardConfig(soft_cap=10)))
    stats = Calibrator(policies).add_all(read_turns([path], print))
    data = stats.to_json()
    rows = {p["name"]: p["unattended"] for p in data["policies"]}
    assert rows["default"]["halted"] == 5 and rows["default"]["halted_resolved"] == 0
    assert rows["default"]["evidence_halts"] == 0 and rows["default"]["resolved_ids"] == []
    assert rows["x20"]["halted"] == 0 and rows["x20"]["censored"] == 5
    text = table(stats, width=200)
    default_line = next(line for line in text.splitlines() if line.startswith("* default"))
    assert " ? " in default_line
    assert " 5 (5) " in default_line  # the censored halts beside the halts, in every row
    x20_line = next(line for line in text.splitlines() if line.startswith("  x20"))
    assert " 0 (0) " in x20_line
    assert "5 turns end at a halt of their own in the recording (5 live)" in text


def test_censored_counts_survive_merges_and_workers(fleet, result, tmp_path):
    f, config = fleet
    lines = f.path.read_text().splitlines(keepends=True)
    parts = []
    for i in range(3):
        part = tmp_path / f"part{i}.jsonl"
        part.write_text("".join(lines[i::3]))
        parts.append(run_json(part, config))
        (tmp_path / f"part{i}.json").write_text(json.dumps(parts[-1]))
    out = io.StringIO()
    assert cli.main(["merge", *(str(tmp_path / f"part{i}.json") for i in range(3)), "--json", "-"],
                    stdout=out, stderr=io.StringIO()) == 0
    merged = json.loads(out.getvalue())
    with_jobs = run_json(f.path, config, "--jobs", "2")
    for other in (merged, with_jobs):
        for mine, theirs in zip(result["policies"], other["policies"], strict=True):
            for mode in ("unattended", "attended"):
                for key in ("censored_by_cohort", "halted_censored_by_cohort", "evidence_by_source", "saved_censored"):
                    assert mine[mode][key] == theirs[mode][key], (mine["name"], key)


def test_every_cohort_key_is_a_known_one(result):
    for p in result["policies"]:
        assert set(p["unattended"]["censored_by_cohort"]) <= set(COHORT_KEYS)
    assert RunStats.from_json(result).halt_ended == result["halt_ended"]


def test_late_results_are_joined_to_their_turns_exactly(fleet, result):
    """Half of the fleet's results come late (result records): every turn's result counts once."""
    f, _ = fleet
    late = sum(1 for line in f.path.read_text().splitlines() if '"result_for"' in line)
    assert late == len(f.turns) // 2
    assert (result["resolved"], result["unresolved"]) == (sum(t.done for t in f.of()),
                                                          sum(not t.done for t in f.of()))
