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
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from board_runs import (
    LOOKBACK_S,
    OUTAGE_S,
    ROUTES,
    Elsewhere,
    Expected,
    FleetRun,
    Samples,
    Window,
    assert_matches,
    by_row,
    fleet_queries,
    grafana_values,
    instant,
    key,
    query_id,
    result,
    scalar,
)
from conftest import optional_dependency

optional_dependency("grafana_foundation_sdk")

import evidence_oracle as oracle  # noqa: E402
import probe_fleet as pf  # noqa: E402
import turnguard as tg  # noqa: E402
from turnguard._boards import (  # noqa: E402
    build,
    queries,
    rules,
    series,
)
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.evidence import km_multiples  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._boards.thresholds import BACKSTOP_MULTIPLES  # noqa: E402
from turnguard._calibrate.advice import decide  # noqa: E402
from turnguard._calibrate.evidence import Passed  # noqa: E402
from turnguard._calibrate.recording import SECONDS_PER_DAY  # noqa: E402
from turnguard.telemetry import _buckets as buckets  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

T = build.THRESHOLDS_UID
QUERIES = fleet_queries(T)
PROBE_TABLE, PAST_TABLE, BESIDE_BACKSTOP, SURVIVAL = 44, 41, 27, 47
BOTH_COHORTS = {SURVIVAL}
"""Panels that read both cohorts on purpose (the product-limit estimate)."""
PROBE_PANELS = {PROBE_TABLE, PAST_TABLE, BESIDE_BACKSTOP}
"""Panels that read the probe cohort whatever the cohort variable says."""


PROBE_ROUTES = ("collector-prometheus2", "collector-prometheus3")
RECORDED = ("turns.jsonl", "elsewhere.jsonl")
"""The recorder's files: the fleet's guard's, and the other process's (its late results)."""
"""The shipped Collector into Debian's Prometheus 2.42 and into Prometheus 3."""


REFUSED = {"tg1.not-a-token": "invalid_token", "a-turn-nobody-ran": "unknown"}
"""Reports the fleet's guard gets before its turns (report -> its status): they reach no turn."""


@pytest.fixture(scope="module", params=PROBE_ROUTES)
def probe_run(request, tmp_path_factory) -> Iterable[FleetRun]:
    """The probe fleet over OTLP through the shipped Collector into Prometheus; the results from
    another process come from another OS process (``tests/late_results.py``), whose guard never saw
    the turns, exporting as a service instance of its own and recording to a file of its own. The
    two share the fleet's ``digest_key``: the tokens' labels are trusted, as a fleet's should be."""
    workdir = tmp_path_factory.mktemp(f"probe-fleet-{request.param}")
    config = pf.probe_config(recorder_path=str(workdir / RECORDED[0]), digest_key=pf.FLEET_KEY)
    with contextlib.ExitStack() as stack:
        def run(provider: Any, samples: Samples, another: Callable[[], Elsewhere]) -> pf.ProbeTruth:
            other = another()
            elsewhere = pf.in_another_process(str(workdir / RECORDED[1]), otlp_endpoint=other.endpoint,
                                              instance=other.instance, exported=other.exported,
                                              digest_key=config.digest_key)
            guard = tg.Guard(config, environ={}, meter_provider=provider)
            for bogus in REFUSED:  # results that reach no turn: the results panel's third channel
                guard.report_result(bogus, True)
            return pf.run_probe_fleet(guard, sample=samples, gap=samples.gap, report_elsewhere=elsewhere)

        yield ROUTES[request.param](stack, workdir, run, config, None, gaps=True)


def _settings(run: FleetRun) -> CapSettings:
    return CapSettings.from_config(run.config)


def _expected(run: FleetRun, panel_query: queries.PanelQuery, tolerance: float = 0.10) -> Expected:
    truth: pf.ProbeTruth = run.tally
    cap, probed = _settings(run), oracle.probe_facts(run.tally, _cut_by(run, panel_query))
    if panel_query.panel_id in (PROBE_TABLE, BESIDE_BACKSTOP):
        rows = [t.value for t in cap.thresholds]
        table = oracle.threshold_table(probed, rows, tolerance, run.records.seconds)[panel_query.legend]
        if panel_query.panel_id == BESIDE_BACKSTOP:
            table = {"hard_backstop": table["hard_backstop"]}
        return by_row(series.MAIN_THRESHOLD, table)
    if panel_query.panel_id == PAST_TABLE:
        hard = cap.probe.hard_cap if cap.probe is not None and panel_query.board_uid == CONFIGURED_UID else None
        table = oracle.past_table(probed, BACKSTOP_MULTIPLES, cap.soft_cap, probe_hard_cap=hard)
        return by_row("multiple", table[panel_query.legend])
    edges = buckets.tool_call_edges(tg.GuardConfig(soft_cap=cap.soft_cap, hard_multiplier=cap.hard_multiplier))
    turns = [(s.tool_calls, oracle.finished(s)) for _, s in truth.summaries if s.cap_mode == "adaptive"]
    ends = {str(k): float(k * cap.soft_cap) for k in km_multiples(cap)}  # the committed board has no probe cap
    return by_row("multiple", oracle.survival_table(turns, edges, cap.hard_cap, ends)[panel_query.legend])


CONFIGURED_UID = f"{T}@fleet"
CONFIGURED = [dataclasses.replace(pq, board_uid=CONFIGURED_UID) for pq in queries.panel_queries(
    json.loads(build.for_config(pf.probe_config())[build.FILES[T]])) if pq.panel_id in PROBE_PANELS]
"""The probe panels of the board ``turnguard assets --config`` renders for the fleet's configuration:
it knows the probe's D (12) and streak stop (16), twice the main's, so its loop halts are failures
there, as calibrate counts them from the recorded limits. The committed board, rendered with no
probe, cannot know them: it counts every probe loop halt as censored (``evidence.ProbeHalts``)."""
EVIDENCE = [pq for pq in QUERIES if pq.panel_id in PROBE_PANELS | BOTH_COHORTS] + CONFIGURED


def _cut_by(run: FleetRun, panel_query: queries.PanelQuery | None = None) -> frozenset[str]:
    """The probe's loop halts the board that ``panel_query`` is from counts as censored (none given:
    the configured one's, calibrate's)."""
    known = panel_query is None or panel_query.board_uid == CONFIGURED_UID
    return oracle.cut_halts(run.config if known else run.config.replace(probe=None))


def _probe_table(legend: str, board: list[queries.PanelQuery] = CONFIGURED) -> queries.PanelQuery:
    return next(pq for pq in board if pq.panel_id == PROBE_TABLE and pq.legend == legend)
COUNTS = ("turns", "resolved", "unresolved", "censored", "unknown", "calls past it", "at risk past the backstop",
          "seen past k×S")


def test_the_fleet_went_through_a_telemetry_gap(probe_run):
    """Halfway through the turns Prometheus was down longer than its lookback: no evaluation of the
    rules in between, the turns of the gap exported to the Collector meanwhile, and the board's
    figures (every other test here) are still the fleet's, and calibrate's."""
    (outage,) = probe_run.outages
    down, up = outage.down, outage.up
    assert up - down >= OUTAGE_S and outage.exported  # the turns of the gap went to the Collector
    assert probe_run.window.start < down < up < probe_run.window.end
    heartbeat = f"count_over_time({rules.HEARTBEAT}[{round((up - down) * 1000) - 2000}ms])"
    assert not probe_run.prometheus.query(heartbeat, up - 1), "the rules were evaluated during the gap"


def test_the_halts_boards_counts_split_inside_the_gap_add_up_to_the_fleet(probe_run):
    """The Halts board's count (``promql.total``, raw series) over the run, and over its two halves
    split inside the gap where no series has a sample within the lookback delta (the exports made
    during the gap have samples in it): the second half counts from each series' last sample before
    the gap, so the halves add up to every turn once (an instant ``offset`` there saw no sample and
    counted every series' history again)."""
    (outage,) = probe_run.outages
    middle, window = outage.quiet, probe_run.window
    assert all(abs(middle - at) > LOOKBACK_S for at in (outage.down, *outage.exported, outage.up))
    fresh = f"count_over_time({series.TURNS}[{LOOKBACK_S}s])"
    assert not probe_run.prometheus.query(fresh, middle), "a sample within the lookback of the split"

    def counted(start: float, end: float) -> float:
        values = {**grafana_values(Window(start, end)), q.COHORT_VARIABLE: "live|probe"}
        data = probe_run.prometheus.api("query", query=queries.resolve(q.total(series.TURNS), values),
                                        time=f"{end:.3f}")
        return sum(_values(result(data)))

    truth: pf.ProbeTruth = probe_run.tally
    every = sum(truth.turns.values())
    assert counted(window.start, window.end) == every
    second = counted(middle, window.end)
    assert counted(window.start, middle) + second == every
    # the instant lookback form, over the second half: it re-counts what came before the gap
    m, w = series.TURNS, f"{round((window.end - middle) * 1000)}ms"
    instant_lookback = (f"sum((increase({m}[{w}]) and {m} offset {w}) "
                        f"or (last_over_time({m}[{w}]) unless {m} offset {w}))")
    (old,) = probe_run.prometheus.query(instant_lookback, window.end)
    assert float(old["value"][1]) >= every > second, (old, second)


def test_the_probe_fleet_has_turns_past_every_k_and_every_threshold(probe_run):
    truth: pf.ProbeTruth = probe_run.tally
    assert _settings(probe_run).soft_cap == pf.SOFT_CAP
    probed = oracle.probe_facts(truth, _cut_by(probe_run))
    assert all(any(f.calls > k * pf.SOFT_CAP for f in probed) for k in BACKSTOP_MULTIPLES)
    for threshold in _settings(probe_run).thresholds:
        if threshold.value != "streak":
            assert any(f.main_threshold == threshold.value for f in probed), threshold


@pytest.mark.parametrize("panel_query", EVIDENCE, ids=query_id)
def test_probe_evidence_is_what_the_fleet_did(probe_run, panel_query):
    """Counts exact (late results included), shares, intervals, decisions and the evidence still
    needed to float precision, from plain Python over the fleet's own record of each turn."""
    got = instant(probe_run, panel_query.expr)
    counts = panel_query.legend in COUNTS or (panel_query.panel_id == PAST_TABLE and "95%" not in panel_query.legend)
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


def test_the_turns_still_needed_are_the_first_count_whose_interval_decides(probe_run):
    """The closed form the board and calibrate share, against a search over the interval itself."""
    thresholds = [t.value for t in _settings(probe_run).thresholds]
    probed = oracle.probe_facts(probe_run.tally, _cut_by(probe_run))
    rows = oracle.threshold_table(probed, thresholds, 0.5, probe_run.records.seconds)
    checked = 0
    for tolerance in (0.02, 0.3, 0.6, 0.95):
        for threshold in rows["turns"]:
            row = oracle.passed(f for f in probed if f.main_threshold == threshold)
            _, more, _ = oracle.decided(row, tolerance, 1.0)
            if row.censored == 0 and row.known and math.isfinite(more) and more > 0:
                assert more == oracle.more_turns(row.resolved, row.known, tolerance), (threshold, tolerance)
                checked += 1
    assert checked


TOLERANCES = (0.05, 0.1, 0.3, 0.5, 0.7, 0.9)
def _decisions(run: FleetRun, tolerance: float, board: list[queries.PanelQuery] = CONFIGURED) -> dict[str, float]:
    got = instant(run, _probe_table("decision", board).expr, **{q.TOLERANCE_VARIABLE: repr(tolerance)})
    return {dict(k)[series.MAIN_THRESHOLD]: v for k, v in got.items()}


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_each_thresholds_decision_on_the_board_agrees_with_the_planted_truth(probe_run, tolerance):
    """Never the wrong way: above (1) only where more than the tolerance of the turns the threshold
    halts would have succeeded, within (-1) only where fewer would (the truth: ``probe_fleet.TRUTH``)."""
    for threshold, decision in _decisions(probe_run, tolerance).items():
        right = 1 if pf.TRUTH[threshold] > tolerance else -1
        assert decision in (right, 0), (threshold, tolerance, decision, pf.TRUTH[threshold])


def test_the_planted_evidence_decides_10x_d_and_the_streak_stop(probe_run):
    """At the default tolerance the board says raise all three (80%, 33% and 25% of their halts would
    have succeeded); at 50% the streak stop is within, at 70% D is; the backstop is never within, even
    at 90% where the truth is (80%): the very long productive turns and the runaways were both halted
    at the probe's own 20x, so the evidence cannot tell them apart."""
    assert _decisions(probe_run, 0.1) == {"hard_backstop": 1, "soft_stuck": 1, "streak": 1}
    assert _decisions(probe_run, 0.5)["streak"] == -1
    assert _decisions(probe_run, 0.7)["soft_stuck"] == -1
    assert _decisions(probe_run, 0.9)["hard_backstop"] == 0
    more = _probe_table("more probe turns")
    at_90 = instant(probe_run, more.expr, **{q.TOLERANCE_VARIABLE: "0.9"})
    assert at_90[key(**{series.MAIN_THRESHOLD: "hard_backstop"})] == math.inf  # more turns never decide it


def test_the_committed_board_counts_no_probe_loop_halt_as_a_failure(probe_run):
    """Rendered with no probe, the board cannot know the probe's D or streak stop (the metrics do not
    carry them per turn): a turn the probe halted as stuck or streaking is censored there, as
    calibrate counts it where the recorded limits do not say the probe ran that detector at twice
    the main value, so the rows of D and the streak stop are never within; the board rendered for
    the fleet's configuration (a probe D of 12, a stop of 16) counts those halts as failures."""
    unresolved = instant(probe_run, _probe_table("unresolved", QUERIES).expr)
    configured = instant(probe_run, _probe_table("unresolved").expr)
    for threshold in ("soft_stuck", "streak"):
        row = key(**{series.MAIN_THRESHOLD: threshold})
        assert unresolved[row] == 0 < configured[row], threshold
    for tolerance in (0.5, 0.7, 0.9):
        assert -1 not in (_decisions(probe_run, tolerance, QUERIES)[t] for t in ("soft_stuck", "streak")), tolerance
    assert _decisions(probe_run, 0.7)["soft_stuck"] == _decisions(probe_run, 0.5)["streak"] == -1


def test_the_results_from_another_process_reach_the_board(probe_run):
    """A third of the results came by token from a guard that never saw the turns: the probe rows
    count them (no turn is left unknown), and so does the results record, exactly."""
    truth: pf.ProbeTruth = probe_run.tally
    unknown = _probe_table("unknown")
    assert all(v == 0 for v in instant(probe_run, unknown.expr).values())
    probed = {s.turn_id for _, s in truth.summaries if s.cohort == "probe"}
    from_elsewhere = sum(1 for turn_id in truth.elsewhere if turn_id in probed)
    assert from_elsewhere > 0
    # the other process's own series (its service instance), raw: its counter's last value
    elsewhere = (f'sum(last_over_time({series.RESULTS}{{{series.COHORT}="{q.PROBE}",{series.RESULT_STATUS}="accepted",'
                 f'instance=~"another-process-.*"}}[$__range]))')
    assert instant(probe_run, elsewhere) == scalar(from_elsewhere)


def _values(result: dict) -> list[float]:
    return [v for v in result.values() if not math.isnan(v)]


def test_the_results_panels_show_each_channel_and_status_and_the_turns_left_without_one(probe_run):
    """The halts board's results row on the live cohort: results given with the turn by value, late
    ones (this guard's and the other process's, by token) accepted, the refused reports that reached
    no turn by status, and per agent the share of ended turns no result reached."""
    truth: pf.ProbeTruth = probe_run.tally
    live = [s for _, s in truth.summaries if s.cohort == "live"]
    late = [s for s in live if s.resolved is None and s.turn_id in truth.reported]
    panels = {(pq.panel_id, pq.ref_id): pq.expr for pq in fleet_queries(build.HALTS_UID) if pq.panel_id in (61, 62)}
    in_turn = Counter("true" if s.resolved else "false" for s in live if s.resolved is not None)
    assert instant(probe_run, panels[(61, "A")]) == {key(**{series.RESOLVED: v}): n for v, n in in_turn.items()}
    assert late and instant(probe_run, panels[(61, "B")]) == {key(**{series.RESULT_STATUS: "accepted"}): len(late)}
    assert instant(probe_run, panels[(61, "C")]) == {key(**{series.RESULT_STATUS: v}): 1 for v in REFUSED.values()}
    agents = Counter(s.agent_name for s in live)
    without = Counter(s.agent_name for s in live if s.resolved is None and s.turn_id not in truth.reported)
    assert instant(probe_run, panels[(62, "A")]) == pytest.approx(
        {key(**{series.AGENT: a}): without[a] / n for a, n in agents.items()})


@pytest.mark.parametrize("panel_query", [pq for pq in fleet_queries() if pq.panel_id not in PROBE_PANELS | BOTH_COHORTS
                                         or pq.board_uid != T], ids=query_id)
def test_a_live_panel_never_shows_a_probe_turn(probe_run, panel_query):
    """Every panel that does not name its cohort reads the cohort variable: pointed at a cohort no turn
    has, it shows nothing of the fleet (a panel that mixed the cohorts would still count probe turns)."""
    got = instant(probe_run, panel_query.expr, **{q.COHORT_VARIABLE: "nobody"})
    if f'{series.COHORT}=""' in panel_query.expr:  # results that reached no turn have no cohort: never a probe turn
        got = {k: v for k, v in got.items() if dict(k).get(series.RESULT_STATUS) not in REFUSED.values()}
    assert not any(v != 0 for v in _values(got)), f"{query_id(panel_query)} {panel_query.title!r}: {got}"


def test_the_cohort_variable_switches_the_live_panels_to_the_probe_cohort(probe_run):
    truth: pf.ProbeTruth = probe_run.tally
    turns = {cohort: sum(v for (c, _), v in truth.turns.items() if c == cohort) for cohort in ("live", "probe")}
    assert instant(probe_run, q.total(series.TURNS)) == scalar(turns["live"])
    assert instant(probe_run, q.total(series.TURNS), **{q.COHORT_VARIABLE: q.PROBE}) == scalar(turns["probe"])


def test_the_policy_variable_picks_a_policy_and_its_probe(probe_run):
    """The fleet's policy picked: its probe turns (``<name>-probe``) stay on the probe panels; another
    policy's name shows none of them."""
    truth: pf.ProbeTruth = probe_run.tally
    turns = _probe_table("turns")
    policy = probe_run.config.name
    want = _expected(probe_run, turns)
    assert sum(want.values()) > 0
    assert instant(probe_run, turns.expr, **{q.POLICY_VARIABLE: policy}) == want
    assert all(v == 0 for v in instant(probe_run, turns.expr, **{q.POLICY_VARIABLE: "renamed"}).values())
    live = sum(v for (cohort, _), v in truth.turns.items() if cohort == "live")
    assert instant(probe_run, q.total(series.TURNS), **{q.POLICY_VARIABLE: policy}) == {key(): live}


# -- the board and calibrate, on the same turns -------------------------------------------------------


CALIBRATE_ROWS = {"hard_backstop": "10", "soft_stuck": "stuck", "streak": "streak"}
"""Calibrate's probe row for each of the board's (its backstop row: the probe turns past 10x S)."""
VERDICTS = {"above": 1, "within": -1, "undecided": 0}


def _calibrate(run: FleetRun, tolerance: float) -> dict:
    return pf.calibrate([run.workdir / name for name in RECORDED], tolerance)


def _column(run: FleetRun, legend: str, tolerance: float) -> dict[str, float]:
    target = _probe_table(legend)
    got = instant(run, target.expr, **{q.TOLERANCE_VARIABLE: repr(tolerance)})
    return {dict(k)[series.MAIN_THRESHOLD]: v for k, v in got.items()}


def _calibrate_row(probe: dict, threshold: str) -> dict:
    key_ = CALIBRATE_ROWS[threshold]
    return probe["passed_multiple"][key_] if key_ == "10" else probe[f"passed_{key_}"]


@pytest.mark.parametrize("tolerance", (0.1, 0.5, 0.9))
def test_the_board_decides_each_threshold_as_calibrate_does_on_the_same_turns(probe_run, tolerance):
    """The recorder wrote the same turns the board counts (the other process's results in a file of
    its own): calibrate's counts, interval, decision and probe turns still needed are the board's,
    and both say how long those turns take at the same rate, the turns with a known fate over the
    time observed (the board's: the dashboard's range; calibrate's: the recording's span)."""
    report = _calibrate(probe_run, tolerance)
    probe, days = report["probe"], report["recording"]["days"]
    columns = {legend: _column(probe_run, legend, tolerance)
               for legend in ("resolved", "unresolved", "censored", "unknown", "95% low", "95% high", "decision",
                              "more probe turns", "time at this rate")}
    needing = 0
    for threshold in CALIBRATE_ROWS:
        row = _calibrate_row(probe, threshold)
        got = {legend: values[threshold] for legend, values in columns.items()}
        assert [got[c] for c in ("resolved", "unresolved", "censored", "unknown")] == [
            row["resolved"], row["unresolved"], row["censored"], row["unknown"]], (
            threshold, row, f"recorded in {probe_run.workdir}")
        assert [got["95% low"], got["95% high"]] == pytest.approx(row["resolved_interval"], abs=1e-6)
        assert got["decision"] == VERDICTS[row["decision"]], (threshold, tolerance, row["decision"])
        if row["decision"] == "undecided":
            assert got["more probe turns"] == (row["more_turns"] or math.inf), (threshold, tolerance, row)
        if row["why"] == "needs_turns":
            needing += 1
            known = row["resolved"] + row["unresolved"] + row["censored"]
            assert got["time at this rate"] == pytest.approx(
                row["more_turns"] * probe_run.records.seconds / known, rel=1e-9), (threshold, tolerance)
            assert row["more_days"] == round(row["more_turns"] * days / known, 3), (threshold, tolerance, row)
            # calibrate's own decision on the board's counts, over the board's range: the board's time
            passed = Passed(turns=round(sum(got[c] for c in ("resolved", "unresolved", "censored", "unknown"))),
                            resolved=round(got["resolved"]), unresolved=round(got["unresolved"]),
                            censored=round(got["censored"]))
            theirs = decide(passed, tolerance, probe_run.records.seconds / SECONDS_PER_DAY)
            assert theirs.more_turns == got["more probe turns"], (threshold, tolerance, theirs)
            assert theirs.more_days * SECONDS_PER_DAY == pytest.approx(got["time at this rate"], rel=1e-9)
    if tolerance == 0.5:
        assert needing, "no row needs more turns at 50%: the time columns went unchecked"


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_calibrate_on_the_same_turns_decides_as_the_planted_truth(probe_run, tolerance):
    """calibrate's decision for 10x, D and the streak stop, on the turns the board counted, never
    contradicts the planted share (``probe_fleet.TRUTH``), and at 10% it says raise all three."""
    probe = _calibrate(probe_run, tolerance)["probe"]
    for threshold in CALIBRATE_ROWS:
        verdict = _calibrate_row(probe, threshold)["decision"]
        right = "above" if pf.TRUTH[threshold] > tolerance else "within"
        assert verdict in (right, "undecided"), (threshold, tolerance, verdict, pf.TRUTH[threshold])
        if tolerance == 0.1:
            assert verdict == "above", threshold


PLANTED_DECISIONS = {
    0.05: ("above", "above", "above"),
    0.1: ("above", "above", "above"),
    0.3: ("needs turns", "needs turns", "needs turns"),
    0.5: ("censored", "needs turns", "within"),
    0.7: ("censored", "within", "within"),
    0.9: ("censored", "within", "within"),
}
"""Per tolerance, the answer for 10x, D and the streak stop (planted: 80%, 33%, 25% of their halts
would have succeeded): a direction where the interval excludes the tolerance, the right one; else
undecided, either for want of turns (near a share: more turns would decide it) or because the
censored turns could go either way (the backstop past 50%: the very long productive turns and the
runaways were both halted at the probe's own 20x)."""


def _answer(decision: float | str, more: float | None, why: str | None = None) -> str:
    if decision in (1, "above"):
        return "above"
    if decision in (-1, "within"):
        return "within"
    return "needs turns" if why == "needs_turns" or (why is None and math.isfinite(more or math.inf)) else "censored"


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_each_intervals_decision_on_the_board_and_in_calibrate_is_the_planted_truths(probe_run, tolerance):
    """The board (through the telemetry gap, the other process's results included) and calibrate on
    the same turns give each threshold the same answer at each tolerance, and it is the planted
    truth's: a decided row points the way the planted share does, and the rows left undecided are
    the ones whose interval still holds the tolerance."""
    board, more = _decisions(probe_run, tolerance), _column(probe_run, "more probe turns", tolerance)
    probe = _calibrate(probe_run, tolerance)["probe"]
    on_board = tuple(_answer(board[t], more[t]) for t in CALIBRATE_ROWS)
    rows = [_calibrate_row(probe, t) for t in CALIBRATE_ROWS]
    in_calibrate = tuple(_answer(row["decision"], row["more_turns"], row["why"]) for row in rows)
    assert on_board == in_calibrate == PLANTED_DECISIONS[tolerance], (tolerance, on_board, in_calibrate)
    for threshold, answer in zip(CALIBRATE_ROWS, on_board, strict=True):
        if answer in ("above", "within"):
            assert (answer == "above") == (pf.TRUTH[threshold] > tolerance), (threshold, tolerance)


def _survival(run: FleetRun, board_queries: list[queries.PanelQuery]) -> dict[str, dict[str, float]]:
    """The survival table as Prometheus answers it: column -> row (k) -> value."""
    return {pq.legend: {dict(k)["multiple"]: v for k, v in instant(run, pq.expr).items()}
            for pq in board_queries if pq.panel_id == SURVIVAL}


def test_the_boards_product_limit_estimate_is_calibrates(probe_run):
    """Past the backstop nobody is censored inside a bucket here (the live turns at 1,001 calls, the
    probe's at its cap of 2,001: each at the start of one), so the bucketed estimate and its interval
    are calibrate's exact ones; both say 30x is past the probe's cap. No share shows without its
    interval: a row with none finishing has the exact bound over the turns seen past it, calibrate's."""
    finish_by = {row["multiple"]: row for row in _calibrate(probe_run, 0.1)["survival"]["finish_by"]}
    table = _survival(probe_run, QUERIES)
    cap = _settings(probe_run)
    for k in km_multiples(cap):
        row, got = finish_by[k], {column: values[str(k)] for column, values in table.items()}
        if row["estimable"]:
            assert got["finish by k×S"] == pytest.approx(row["share"], abs=1e-6), (k, row)
            assert [got["95% low"], got["95% high"]] == pytest.approx(row["interval"], abs=1e-6), (k, row)
            assert got["95% low"] <= got["finish by k×S"] <= got["95% high"] and got["95% low"] < got["95% high"]
        else:
            assert math.isnan(got["finish by k×S"]) and row["why"] == "past_cap", (k, row)
        assert got["95% low"] <= got["95% high"] or math.isnan(got["finish by k×S"])
    assert not finish_by[30]["estimable"] and finish_by[20]["estimable"]


def test_the_board_rendered_for_the_fleets_configuration_stops_at_the_probes_cap(probe_run):
    """``turnguard assets --config`` knows the probe's cap (20x here): its product-limit row at 30x
    is named as past it and reads nothing (NaN, "not estimable"); the rows below it are the committed
    board's, which reads the buckets whatever the cap (and finds nobody past it)."""
    cap = CapSettings.from_config(probe_run.config)
    assert cap.probe is not None and cap.probe.hard_cap == 20 * pf.SOFT_CAP
    board = json.loads(build.for_config(probe_run.config)[build.FILES[T]])
    panel = next(p for p in queries.panels(board) if p["id"] == SURVIVAL)
    names = {o["matcher"]["options"]: o for o in panel["fieldConfig"]["overrides"]}["row"]["properties"][0]["value"]
    row_names = names[0]["options"]
    mine, theirs = _survival(probe_run, queries.panel_queries(board)), _survival(probe_run, QUERIES)
    ks = km_multiples(cap)
    assert ks == [15, 20, 30] and set(mine) == set(theirs) and len(mine) == 5
    for k in ks:
        name = row_names[str(k)]["text"]
        if k * cap.soft_cap > cap.probe.hard_cap:
            assert "past the probe's cap" in name, (k, name)
            assert all(math.isnan(mine[c][str(k)]) for c in mine if c != "at risk past the backstop"), mine
        else:
            assert "past the probe's cap" not in name
            for column in mine:
                assert mine[column][str(k)] == pytest.approx(theirs[column][str(k)], rel=1e-12), (k, column)
