"""The worked example with known truth: a fleet whose long productive turns need more than 10x S,
run with a probe cohort; what ``turnguard calibrate`` and the telemetry count must be what the
fleet did (its ``ProbeTruth``), exactly."""

from __future__ import annotations

import io
import json

import pytest

import probe_fleet as pf
import turnguard as tg
from turnguard.calibrate import cli
from turnguard.calibrate.evidence import wilson_interval
from turnguard.telemetry import names as n

W = pf.Work


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[pf.ProbeTruth, dict]:
    path = tmp_path_factory.mktemp("probe-fleet") / "turns.jsonl"
    guard = tg.Guard(pf.probe_config(disable_plugins=("otel",), recorder_path=str(path)), environ={})
    truth = pf.run_probe_fleet(guard)
    out = io.StringIO()
    code = cli.main([str(path), "--soft-caps", "100", "--multipliers", "10", "--stuck-repeats", "6", "--streaks",
                     "5:8", "--no-peers", "--explicit-caps", "100", "--key-modes", "canonical", "--json", "-"],
                    stdout=out, stderr=io.StringIO())
    assert code == 0
    return truth, json.loads(out.getvalue())["probe"]


def probe(truth: pf.ProbeTruth, *kinds: pf.Work) -> list[tg.TurnSummary]:
    return [s for kind, s in truth.summaries if s.cohort == "probe" and kind in kinds]


def test_the_fleet_has_what_the_question_needs(recorded):
    truth, _ = recorded
    for kind in (W.LONG, W.EDIT_RERUN, W.RUNAWAY):
        assert truth.turns[("probe", kind)] > 0 and truth.turns[("live", kind)] > 0
        assert truth.resolved[("live", kind)] == 0  # live, 10x and the seed's D stop them all
    assert truth.resolved[("probe", W.LONG)] == truth.turns[("probe", W.LONG)]  # 20x lets them finish
    assert truth.resolved[("probe", W.EDIT_RERUN)] == truth.turns[("probe", W.EDIT_RERUN)]


def test_calibrate_counts_the_probe_turns_past_10x_and_their_results_exactly(recorded):
    truth, evidence = recorded
    long, runaways = probe(truth, W.LONG), probe(truth, W.RUNAWAY)
    assert evidence["turns"] == sum(v for (c, _), v in truth.turns.items() if c == "probe")
    ten = evidence["passed_multiple"]["10"]
    # The runaways were halted by the probe's own 20x: censored there, neither resolved nor unresolved.
    assert (ten["turns"], ten["resolved"], ten["unresolved"], ten["censored"], ten["unknown"]) == (
        len(long) + len(runaways), len(long), 0, len(runaways), 0)
    # The recorder lists the call a halt refused as well (a runaway: 2,001 calls at 20x).
    assert ten["calls_past"] == sum(s.tool_calls - 1000 for s in long + runaways)
    twenty = evidence["passed_multiple"]["20"]
    assert (twenty["turns"], twenty["resolved"], twenty["censored"]) == (len(runaways), 0, len(runaways))
    assert twenty["censored_at_cap"] == {"threshold": "hard_backstop", "cap": 2000}
    n = len(long) + len(runaways)
    assert ten["resolved_interval"] == pytest.approx([wilson_interval(len(long), n)[0], 1.0], abs=1e-6)


def test_calibrate_counts_the_probe_turns_the_seeds_d_would_have_halted(recorded):
    truth, evidence = recorded
    edits = probe(truth, W.EDIT_RERUN)
    stuck = evidence["passed_stuck"]
    assert (stuck["turns"], stuck["resolved"], stuck["unresolved"]) == (len(edits), len(edits), 0)
    assert stuck["calls_past"] == sum(s.tool_calls - pf.SOFT_CAP for s in edits)


def test_the_recommendation_says_raise_10x_and_d(recorded):
    _, evidence = recorded
    backstop, stuck = evidence["recommendation"][:2]
    assert "above the tolerance of 10%" in backstop
    assert "raise the probe's cap to see past 20x" in backstop  # never "20x would have let them finish"
    assert "20x would" not in backstop
    assert "raise D or try stuck_signal='stale_repeat'" in stuck


def test_the_telemetry_counts_the_same_probe_turns_and_results(otel):
    guard = tg.Guard(pf.probe_config(disable_plugins=("recorder",)), environ={}, **otel.providers())
    truth = pf.run_probe_fleet(guard)
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
    long = [s for s in probe(truth, W.LONG, W.RUNAWAY)]
    assert past == len([s for s in long if s.tool_calls > 1000])
    assert resolved_past == truth.resolved[("probe", W.LONG)]
