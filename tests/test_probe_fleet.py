"""The worked example with known truth, through ``turnguard calibrate``: a fleet with a probe cohort
and the hard cases (productive turns that need more than the probe's cap, retry streaks that
succeed after 9 to 12 identical failures, stuck turns, results reported after the turn by its own
guard and, by result token, from another process); what calibrate counts must be what the fleet
did, exactly, and what it decides against each tolerance must agree with the planted truth
(``probe_fleet.TRUTH``) and with the board's arithmetic (``evidence_oracle``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import evidence_oracle as oracle
import probe_fleet as pf
import turnguard as tg
from turnguard.telemetry import _names as n

W = pf.Work
TOLERANCES = (0.05, 0.1, 0.3, 0.5, 0.7, 0.9)
ROWS = {"hard_backstop": "10", "soft_stuck": "stuck", "streak": "streak"}
"""Calibrate's probe row for each live threshold (its backstop row is the probe turns past 10x S)."""
ELSEWHERE = """
import json, sys
import turnguard as tg

pairs, recorded = json.load(open(sys.argv[1])), sys.argv[2]
guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, recorder_path=recorded, disable_plugins=["otel"]), environ={})
taken = [guard.report_result(token, done) for token, done in pairs]
print(sum(taken), len(taken))
"""
"""Another process: a guard that never saw the turns reports their results by token, recording them."""


def another_process(workdir: Path) -> Callable[[list[tuple[str, bool]]], None]:
    def report(pairs: list[tuple[str, bool]]) -> None:
        (workdir / "pairs.json").write_text(json.dumps(pairs))
        done = subprocess.run([sys.executable, "-c", ELSEWHERE, str(workdir / "pairs.json"),
                               str(workdir / "elsewhere.jsonl")], capture_output=True, text=True, timeout=600,
                              check=True)
        assert done.stdout.split() == [str(len(pairs))] * 2, done.stdout + done.stderr  # every one taken
    return report


def calibrate(paths: list[Path], tolerance: float) -> dict:
    return pf.calibrate(paths, tolerance)["probe"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[pf.ProbeTruth, dict[float, dict]]:
    workdir = tmp_path_factory.mktemp("probe-fleet")
    guard = tg.Guard(pf.probe_config(disable_plugins=("otel",), recorder_path=str(workdir / "turns.jsonl")),
                     environ={})
    truth = pf.run_probe_fleet(guard, report_elsewhere=another_process(workdir))
    truth.recorded_in = str(workdir)
    paths = [workdir / "turns.jsonl", workdir / "elsewhere.jsonl"]
    return truth, {q: calibrate(paths, q) for q in TOLERANCES}


def test_calibrate_counts_against_the_fleets_configuration_whatever_the_machine_says(recorded, monkeypatch,
                                                                                     tmp_path):
    """A stuck signal and a cycle stop in the environment, and a configuration file where calibrate
    would look for one, change nothing: the rows are measured against the fleet's main configuration."""
    truth, runs = recorded
    monkeypatch.setenv("TURNGUARD_STUCK_SIGNAL", "stale_repeat")
    monkeypatch.setenv("TURNGUARD_CYCLE_REPEAT_STOP_AT", "8")
    (tmp_path / "turnguard.toml").write_text('streak_stop_on = "any"\nstreak_exempt_tools = ["http_get"]\n')
    monkeypatch.chdir(tmp_path)
    folder = Path(truth.recorded_in)
    assert calibrate([folder / "turns.jsonl", folder / "elsewhere.jsonl"], 0.1) == runs[0.1]


COUNTED = ("turns", "resolved", "unresolved", "censored", "unknown", "calls_past", "resolved_interval")


def _counts(probe: dict) -> dict[str, dict]:
    """Each probe row's counts and interval (what a clock must not move; the time to decide may)."""
    named = {**{f"x{k}": row for k, row in probe["passed_multiple"].items()}, "stuck": probe["passed_stuck"],
             "streak": probe["passed_streak"]}
    return {name: {c: row[c] for c in COUNTED} for name, row in named.items()}


def test_the_clock_never_moves_a_probe_row(recorded, tmp_path):
    """The recorder's lines differ from run to run only in their clock readings (a loaded machine
    stretches every turn): with every turn's start and end scrambled, hours long, out of order and
    some ending before they start, calibrate counts each row as it did."""
    truth, runs = recorded
    folder = Path(truth.recorded_in)
    stretched = []
    for i, line in enumerate((folder / "turns.jsonl").read_text().splitlines()):
        turn = json.loads(line)
        if "started_at" in turn:
            start = 1.8e9 + (i * 7919 % 4001) * 3.7
            turn["started_at"], turn["ended_at"] = start, start + (3600.0 * (i % 5) if i % 7 else -1.0)
        stretched.append(json.dumps(turn))
    (tmp_path / "turns.jsonl").write_text("\n".join(stretched) + "\n")
    got = calibrate([tmp_path / "turns.jsonl", folder / "elsewhere.jsonl"], 0.1)
    assert _counts(got) == _counts(runs[0.1])


def rows(truth: pf.ProbeTruth) -> dict[str, list[oracle.ProbeFact]]:
    """Calibrate's rows, from the fleet: past 10x S, and where the main configuration halts as stuck
    or at the streak stop."""
    probed = oracle.probe_facts(truth, oracle.cut_halts(pf.probe_config()))
    return {"10": [f for f in probed if f.calls > 10 * pf.SOFT_CAP],
            "stuck": [f for f in probed if f.main_threshold == "soft_stuck"],
            "streak": [f for f in probed if f.main_threshold == "streak"]}


def probe(truth: pf.ProbeTruth, *kinds: pf.Work) -> list[tg.TurnSummary]:
    return [s for kind, s in truth.summaries if s.cohort == "probe" and kind in kinds]


def test_the_fleet_has_every_hard_case_in_both_cohorts(recorded):
    truth, _ = recorded
    for kind in pf.MAIN_HALTS:
        assert truth.turns[("probe", kind)] > 0 and truth.turns[("live", kind)] > 0, kind
        assert truth.resolved[("live", kind)] == 0  # the live thresholds halt every one of them
    for kind in (W.LONG, W.EDIT_RERUN, W.RETRY):  # the probe lets them finish
        assert truth.resolved[("probe", kind)] == truth.turns[("probe", kind)], kind
    assert {(s.reason, str(s.threshold)) for s in probe(truth, W.VERY_LONG, W.RUNAWAY)} == {("halted", "hard_backstop")}
    assert {str(s.threshold) for s in probe(truth, W.FAILING)} == {"streak"}
    assert {str(s.threshold) for s in probe(truth, W.STUCK)} == {"soft_stuck"}
    elsewhere = set(truth.elsewhere)
    assert any(s.turn_id in elsewhere for s in probe(truth, W.LONG, W.VERY_LONG, W.RUNAWAY, W.RETRY))


@pytest.mark.parametrize("row", sorted(ROWS.values()))
def test_calibrate_counts_each_row_as_the_fleet_did(recorded, row):
    """Exact, the late results from another process joined by turn id (none left unknown)."""
    truth, runs = recorded
    want = oracle.passed(rows(truth)[row])
    got = runs[0.1]["passed_multiple"][row] if row == "10" else runs[0.1][f"passed_{row}"]
    assert (got["turns"], got["resolved"], got["unresolved"], got["censored"], got["unknown"]) == (
        want.turns, want.resolved, want.unresolved, want.censored, want.unknown), f"recorded in {truth.recorded_in}"
    assert got["unknown"] == 0 and got["turns"] > 0
    assert got["resolved_interval"] == pytest.approx(list(want.interval()), abs=1e-6)


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_calibrates_decisions_are_the_boards_arithmetic(recorded, tolerance):
    """The board's decision and evidence still needed (``evidence_oracle.decided``) are calibrate's."""
    truth, runs = recorded
    for row, facts_of_row in rows(truth).items():
        got = runs[tolerance]["passed_multiple"][row] if row == "10" else runs[tolerance][f"passed_{row}"]
        verdict, more, _ = oracle.decided(oracle.passed(facts_of_row), tolerance, 86_400)
        want = oracle.DECISIONS[got["decision"]]
        assert want == verdict or (math.isnan(want) and math.isnan(verdict)), (row, tolerance, got["decision"])
        if got["decision"] == "undecided":
            assert (got["more_turns"] or float("inf")) == more, (row, tolerance, got)


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_each_rows_decision_agrees_with_the_planted_truth(recorded, tolerance):
    """Never the wrong way: above only where more than the tolerance of the halted turns would have
    succeeded, within only where fewer would."""
    _, runs = recorded
    for threshold, row in ROWS.items():
        got = (runs[tolerance]["passed_multiple"][row] if row == "10" else runs[tolerance][f"passed_{row}"])["decision"]
        right = "above" if pf.TRUTH[threshold] > tolerance else "within"
        assert got in (right, "undecided"), (threshold, tolerance, got, pf.TRUTH[threshold])


def test_the_planted_evidence_decides_every_threshold_at_the_default_tolerance(recorded):
    _, runs = recorded
    at = runs[0.1]
    assert [at["passed_multiple"]["10"]["decision"], at["passed_stuck"]["decision"],
            at["passed_streak"]["decision"]] == ["above"] * 3
    assert at["passed_streak"] and runs[0.5]["passed_streak"]["decision"] == "within"  # 25% < 50%
    assert runs[0.7]["passed_stuck"]["decision"] == "within"  # 33% < 70%


def test_the_backstop_is_never_called_enough_past_the_probes_cap(recorded):
    """At 90% the truth (80%) is within, but the very long productive turns and the runaways were
    both halted at the probe's own 20x: the evidence cannot tell them apart, so it does not decide."""
    _, runs = recorded
    ten = runs[0.9]["passed_multiple"]["10"]
    assert ten["decision"] == "undecided" and ten["why"] == "censored" and ten["censored"] > 0
    twenty = runs[0.1]["passed_multiple"]["20"]
    assert twenty["censored_at_cap"] == {"threshold": "hard_backstop", "cap": 2000}
    backstop = runs[0.1]["recommendation"][0]
    assert "above the tolerance of 10%" in backstop and "raise the probe's cap to see past 20x" in backstop
    assert "20x would" not in backstop


def test_the_telemetry_counts_the_probe_turns_and_results_from_both_processes(otel):
    config = pf.probe_config(disable_plugins=("recorder",))
    truth = pf.run_probe_fleet(tg.Guard(config, environ={}, **otel.providers()),
                               report_elsewhere=pf.in_another_guard(config, **otel.providers()))
    past = resolved_past = 0
    for point in otel.points(n.METRIC_TURN_TOOL_CALLS[0]):
        if point.attributes[n.TURN_COHORT] != "probe":
            continue
        edges = list(point.explicit_bounds)
        beyond = sum(point.bucket_counts[edges.index(1000) + 1:])  # turns with more than 1,000 calls
        past += beyond
        resolved_past += beyond if point.attributes[n.TURN_RESOLVED] == "true" else 0
    for point in otel.points(n.METRIC_TURN_RESULTS[0]):
        a = point.attributes
        if (a[n.RESULT_STATUS], a.get(n.TURN_COHORT), a[n.TURN_RESOLVED]) == ("accepted", "probe", "true") and (
                a[n.TURN_CALLS_BUCKET] == "+Inf" or float(a[n.TURN_CALLS_BUCKET]) > 1000):
            resolved_past += point.value
    assert past == len(probe(truth, W.LONG, W.VERY_LONG, W.RUNAWAY))
    assert resolved_past == truth.resolved[("probe", W.LONG)] > 0


def planted_share(threshold: str, value: int) -> float:
    """The planted design's share, among the turns a value would halt with no other limit, of those
    that would have succeeded (``probe_fleet.ProbeMix``: the uniform ranges' expected counts; stuck,
    failing and runaway turns run forever, and past S)."""
    mix = pf.ProbeMix()
    forever = mix.stuck + mix.failing + mix.runaway
    if threshold == "backstop":
        calls = value * pf.SOFT_CAP
        productive = (mix.long * min(1, max(0, (1900 - calls) / 800))
                      + mix.very_long * min(1, max(0, (2600 - calls) / 500)))
    elif threshold == "stuck":
        productive = mix.edit_rerun * min(1, max(0, (151 - value) / 76))
        forever -= mix.runaway
    else:
        productive = mix.retry * min(1, max(0, (13 - value) / 4))
        forever = mix.failing
    return productive / (productive + forever)


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_a_recommended_value_is_one_the_planted_truth_calls_safe(recorded, tolerance):
    """Never a value that halts more productive turns than the tolerance (at most, none: the probe
    saw too few turns past the backstop and the streak stop at 10%, and no D: its resolved turns
    repeat up to 150 times, past every stuck turn it let run)."""
    _, runs = recorded
    frontier = runs[tolerance]["frontier"]
    for threshold, got in frontier.items():
        if got["recommended"] is not None:
            assert planted_share(threshold, got["recommended"]) < tolerance, (threshold, tolerance, got["sentence"])
    if tolerance == 0.1:
        assert [frontier[t]["recommended"] for t in ("backstop", "stuck", "streak")] == [None] * 3
        assert "let the probe run" in frontier["streak"]["sentence"]
        assert "the longest failing streak of a productive turn: 12" in frontier["streak"]["sentence"]
