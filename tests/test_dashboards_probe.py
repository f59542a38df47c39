"""The probe cohort on the threshold-validation board, against a fleet with planted truth.

The probe fleet (``tests/probe_fleet.py``) runs through the real guard with a probe cohort; its
metrics go over OTLP through the shipped Collector into Prometheus 3 (every series born in the
window), its late results reported after the turns as a CI run would. Every probe panel must show
what the fleet did (exact counts, intervals to float precision, from plain Python in
``evidence_oracle``), every live panel must leave the probe turns out, and each threshold's decision
against the tolerance must be the planted truth's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from board_runs import (
    ROUTES,
    Expected,
    FleetRun,
    assert_matches,
    by_row,
    fleet_queries,
    instant,
    key,
    query_id,
    scalar,
)
from conftest import optional_dependency

optional_dependency("grafana_foundation_sdk")

import evidence_oracle as oracle  # noqa: E402
import probe_fleet as pf  # noqa: E402
import turnguard as tg  # noqa: E402
from turnguard.boards import build, queries  # noqa: E402
from turnguard.boards import promql as q  # noqa: E402
from turnguard.boards.evidence import km_multiples  # noqa: E402
from turnguard.boards.settings import CapSettings  # noqa: E402
from turnguard.boards.thresholds import BACKSTOP_MULTIPLES  # noqa: E402
from turnguard.telemetry import buckets  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

T = build.THRESHOLDS_UID
QUERIES = fleet_queries(T)
PROBE_TABLE, PAST_TABLE, BESIDE_BACKSTOP, SURVIVAL = 44, 41, 27, 47
BOTH_COHORTS = {SURVIVAL}
"""Panels that read both cohorts on purpose (the product-limit estimate)."""
PROBE_PANELS = {PROBE_TABLE, PAST_TABLE, BESIDE_BACKSTOP}
"""Panels that read the probe cohort whatever the cohort variable says."""


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory) -> Iterable[FleetRun]:
    """The probe fleet over OTLP through the shipped Collector into Prometheus 3."""
    workdir = tmp_path_factory.mktemp("probe-fleet")
    config = pf.probe_config(disable_plugins=("recorder",))
    with contextlib.ExitStack() as stack:
        def run(provider: Any, sample: Callable[[], object]) -> pf.ProbeTruth:
            return pf.run_probe_fleet(tg.Guard(config, environ={}, meter_provider=provider), sample=sample)

        yield ROUTES["collector-prometheus3"](stack, workdir, run, config, None)


def facts(truth: pf.ProbeTruth) -> list[oracle.ProbeFact]:
    """Every probe turn as the probe tables see it: where the main configuration, run alone on the
    same calls, would have halted it, and the result the host reported."""
    out = []
    for _, s in truth.summaries:
        if s.cohort != "probe":
            continue
        main = truth.main_halts.get(s.turn_id)
        out.append(oracle.ProbeFact(calls=s.tool_calls, resolved=truth.reported[s.turn_id],
                                    halted_by_probe=s.reason == "halted",
                                    main_threshold=str(main.threshold) if main else "none",
                                    calls_past_main=s.tool_calls - main.tool_calls if main else 0))
    return out


def _settings(run: FleetRun) -> CapSettings:
    return CapSettings.from_config(run.config)


def _expected(run: FleetRun, panel_query: queries.PanelQuery, tolerance: float = 0.10) -> Expected:
    truth: pf.ProbeTruth = run.tally
    cap = _settings(run)
    if panel_query.panel_id in (PROBE_TABLE, BESIDE_BACKSTOP):
        rows = [t.value for t in cap.thresholds]
        table = oracle.threshold_table(facts(truth), rows, tolerance, run.records.seconds)[panel_query.legend]
        if panel_query.panel_id == BESIDE_BACKSTOP:
            table = {"hard_backstop": table["hard_backstop"]}
        return by_row(q.MAIN_THRESHOLD, table)
    if panel_query.panel_id == PAST_TABLE:
        return by_row("multiple", oracle.past_table(facts(truth), BACKSTOP_MULTIPLES, cap.soft_cap)[panel_query.legend])
    k = km_multiples(cap)[ord(panel_query.ref_id) - ord("A")]
    edges = buckets.tool_call_edges(tg.GuardConfig(soft_cap=cap.soft_cap, hard_multiplier=cap.hard_multiplier))
    turns = [(s.tool_calls, s.reason == "completed") for _, s in truth.summaries if s.cap_mode == "adaptive"]
    return scalar(oracle.finished_by(turns, edges, cap.hard_cap, k * cap.soft_cap))


EVIDENCE = [pq for pq in QUERIES if pq.panel_id in PROBE_PANELS | BOTH_COHORTS]
COUNTS = ("turns", "resolved", "unresolved", "unknown", "halted by the probe", "calls past it")


def test_the_probe_fleet_has_turns_past_every_k_and_every_threshold(probe_run):
    truth: pf.ProbeTruth = probe_run.tally
    assert _settings(probe_run).soft_cap == pf.SOFT_CAP
    probed = facts(truth)
    assert all(any(f.calls > k * pf.SOFT_CAP for f in probed) for k in BACKSTOP_MULTIPLES)
    for threshold in _settings(probe_run).thresholds:
        if threshold.value != "streak":
            assert any(f.main_threshold == threshold.value for f in probed), threshold


@pytest.mark.parametrize("panel_query", EVIDENCE, ids=query_id)
def test_probe_evidence_is_what_the_fleet_did(probe_run, panel_query):
    """Counts exact (late results included), shares, intervals, decisions and the evidence still
    needed to float precision, from plain Python over the fleet's own record of each turn."""
    got = instant(probe_run, panel_query.expr)
    counts = panel_query.legend in COUNTS or panel_query.panel_id == PAST_TABLE
    assert_matches(got, _expected(probe_run, panel_query), counts=counts, scale=1,
                   what=f"{query_id(panel_query)} {panel_query.legend!r}")


@pytest.mark.parametrize("tolerance", [0.02, 0.3, 0.6, 0.95])
def test_the_decision_and_the_evidence_still_needed_follow_the_tolerance(probe_run, tolerance):
    """The tolerance variable moves the decision, the probe turns still needed and the time they take."""
    for panel_query in (pq for pq in EVIDENCE if pq.panel_id == PROBE_TABLE
                        and pq.legend in ("decision", "more probe turns", "time at this rate")):
        got = instant(probe_run, panel_query.expr, **{q.TOLERANCE_VARIABLE: repr(tolerance)})
        assert_matches(got, _expected(probe_run, panel_query, tolerance), counts=False, scale=1,
                       what=f"{query_id(panel_query)} {panel_query.legend!r} at tolerance {tolerance}")


def _values(result: dict) -> list[float]:
    return [v for v in result.values() if not math.isnan(v)]


@pytest.mark.parametrize("panel_query", [pq for pq in fleet_queries() if pq.panel_id not in PROBE_PANELS | BOTH_COHORTS
                                         or pq.board_uid != T], ids=query_id)
def test_a_live_panel_never_shows_a_probe_turn(probe_run, panel_query):
    """Every panel that does not name its cohort reads the cohort variable: pointed at a cohort no turn
    has, it shows nothing of the fleet (a panel that mixed the cohorts would still count probe turns)."""
    got = instant(probe_run, panel_query.expr, **{q.COHORT_VARIABLE: "nobody"})
    assert not any(v != 0 for v in _values(got)), f"{query_id(panel_query)} {panel_query.title!r}: {got}"


def test_the_cohort_variable_switches_the_live_panels_to_the_probe_cohort(probe_run):
    truth: pf.ProbeTruth = probe_run.tally
    turns = {cohort: sum(v for (c, _), v in truth.turns.items() if c == cohort) for cohort in ("live", "probe")}
    assert instant(probe_run, q.total(q.TURNS)) == scalar(turns["live"])
    assert instant(probe_run, q.total(q.TURNS), **{q.COHORT_VARIABLE: q.PROBE}) == scalar(turns["probe"])


def test_the_policy_variable_picks_a_policy_and_its_probe(probe_run):
    """The fleet's policy picked: its probe turns (``<name>-probe``) stay on the probe panels; another
    policy's name shows none of them."""
    truth: pf.ProbeTruth = probe_run.tally
    turns = next(pq for pq in EVIDENCE if pq.panel_id == PROBE_TABLE and pq.legend == "turns")
    policy = probe_run.config.name
    want = _expected(probe_run, turns)
    assert sum(want.values()) > 0
    assert instant(probe_run, turns.expr, **{q.POLICY_VARIABLE: policy}) == want
    assert all(v == 0 for v in instant(probe_run, turns.expr, **{q.POLICY_VARIABLE: "renamed"}).values())
    live = sum(v for (cohort, _), v in truth.turns.items() if cohort == "live")
    assert instant(probe_run, q.total(q.TURNS), **{q.POLICY_VARIABLE: policy}) == {key(): live}
