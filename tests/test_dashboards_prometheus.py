"""The proof: every query of every panel, run against a real Prometheus fed by a simulated fleet.

A fleet of 1,047 turns with a known mix (``tests/fleet.py``) runs through the real guard and its
OpenTelemetry plugin, and its metrics reach Prometheus the four ways a deployment sends them
(``board_runs.ROUTES``: the pull exporter into Debian's Prometheus 2.42; OTLP to the Collector built
from the shipped manifest, running the shipped config, remote-writing to Prometheus 2.42 and to
Prometheus 3; OTLP straight into Prometheus 3). Then each panel query of the committed dashboards,
with Grafana's macros resolved and the variables at their saved defaults, goes through Prometheus's
HTTP API and must return what the fleet implies: exact counts, and ratios and quantiles to float
precision. The probe cohort's panels have their own fleet with a planted truth:
``test_dashboards_probe.py``.

No series is created in advance: on the Prometheus 2 routes a smaller warm-up fleet runs before the
window, so the window holds series from before it and series born inside it (the backstop halts,
the "stop" answers, the cycle cap's halts), which the boards count from zero.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from board_runs import (
    MACROS,
    RATE,
    ROUTES,
    SCRAPE_INTERVAL_S,
    TOLERANCE,
    Expected,
    FleetRun,
    Key,
    assert_matches,
    by_row,
    fleet_queries,
    grafana_values,
    group,
    instant,
    key,
    query_id,
    ratio,
    scalar,
    window_of,
)
from conftest import optional_dependency

optional_dependency("grafana_foundation_sdk")

import evidence_oracle as oracle  # noqa: E402
import fleet  # noqa: E402
import turnguard as tg  # noqa: E402
from turnguard._boards import build, halts, queries, series  # noqa: E402
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.evidence import estimable, km_multiples  # noqa: E402
from turnguard._boards.settings import DEFAULTS, CapSettings  # noqa: E402
from turnguard._boards.thresholds import BACKSTOP_MULTIPLES, lower_multiples  # noqa: E402
from turnguard.telemetry import _buckets as buckets  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

H, T = build.HALTS_UID, build.THRESHOLDS_UID
WARM_UP = fleet.FleetMix(short=60, long=10, soft_stuck=5, runaway=0, failing_unattended=5, ask_continue=5,
                         ask_stop=0, ask_late_continue=5, explicit=5, cycle_cap=0)
"""Traffic before the window: no runaways, no "stop" answers and no cycle cap, so those series are
born inside it."""
WARM_UP_SEED = 3


def _config() -> tg.GuardConfig:
    return tg.GuardConfig(load_entrypoints=False, shadow=fleet.SHADOWS)


@pytest.fixture(scope="module", params=sorted(ROUTES))
def fleet_run(request, tmp_path_factory) -> Iterable[FleetRun]:
    workdir = tmp_path_factory.mktemp(request.param)
    with contextlib.ExitStack() as stack:
        quiet = logging.getLogger("turnguard")
        stack.callback(quiet.setLevel, quiet.level)
        quiet.setLevel(logging.CRITICAL)  # the fleet's flaky plugin raises on purpose

        def run(provider: Any, sample: Callable[[], object], another: Callable[[], Any]) -> fleet.Tally:
            return fleet.run_fleet(fleet.make_fleet(_config(), meter_provider=provider), sample=sample)

        def warm_up(provider: Any) -> object:
            return fleet.run_fleet(fleet.make_fleet(_config(), meter_provider=provider), WARM_UP, WARM_UP_SEED)

        yield ROUTES[request.param](stack, workdir, run, _config(), warm_up)


# -- what the fleet implies -------------------------------------------------------------------------


def _bool(value: bool) -> str:
    return "true" if value else "false"


def summary_labels(summary: tg.TurnSummary) -> dict[str, str]:
    return {
        series.OUTCOME: summary.reason,
        series.THRESHOLD: str(summary.threshold) if summary.threshold is not None else "none",
        series.CAP_MODE: summary.cap_mode,
        series.STUCK: _bool(summary.stuck),
        series.PROMPTABLE: _bool(summary.promptable),
        series.AGENT: summary.agent_name or "",
    }


def turn_labels(summary: tg.TurnSummary, soft_cap: int) -> dict[str, str]:
    """A live turn's labels; past the soft cap only with an adaptive cap (S = the fleet's configured one)."""
    past = summary.cap_mode == "adaptive" and summary.tool_calls > soft_cap
    return {**summary_labels(summary), series.PAST_SOFT_CAP: _bool(past)}


def shadow_turn_labels(policy: str, summary: tg.TurnSummary) -> dict[str, str]:
    return {series.SHADOW_POLICY: policy, **summary_labels(summary)}


def detection_labels(event: tg.LoopDetectedEvent) -> dict[str, str]:
    return {
        series.THRESHOLD: str(event.threshold),
        series.LEVEL: str(event.level),
        series.ACTION: event.action.label,
        series.CAP_MODE: event.cap_mode,
        series.PROMPTABLE: _bool(event.promptable),
        series.TOOL: event.tool_name or "",
        series.AGENT: event.agent_name or "",
    }


class Truth:
    """The fleet's ground truth (the guard's observer hooks), as the panels slice it."""

    def __init__(self, run: FleetRun) -> None:
        self.tally = run.tally
        self.config = run.config
        self.cap = CapSettings.from_config(run.config)
        self.turns = [(turn_labels(t.summary, run.config.soft_cap), t.summary) for t in run.tally.turns]
        self.detections = [detection_labels(e) for e in run.tally.detections]
        self.answers = [
            {series.THRESHOLD: str(e.threshold), series.LEVEL: str(e.level), series.ANSWER: answer}
            for e, answer in run.tally.answers
        ]
        self.shadow_turns = [(shadow_turn_labels(p, s), s) for p, s in run.tally.shadow_turns]
        self.shadow_detections = [{series.SHADOW_POLICY: p, **detection_labels(e)}
                                  for p, e in run.tally.shadow_detections]
        self.range_s = run.records.seconds

    def probe_facts(self) -> list[oracle.ProbeFact]:
        """This fleet has no probe cohort (``test_dashboards_probe.py`` has one): every probe row is 0."""
        assert all(s.cohort == "live" for _, s in self.turns)
        return []

    def shadow_calls(self) -> Expected:
        calls: Counter[Key] = Counter()
        for labels, s in self.shadow_turns:
            calls[key(**{series.SHADOW_POLICY: labels[series.SHADOW_POLICY]})] += s.tool_calls
        return dict(calls)

    def turn_rows(self, **where: str) -> list[tuple[dict[str, str], tg.TurnSummary]]:
        def keep(labels: dict[str, str]) -> bool:
            return all(labels[k] != v[1:] if v.startswith("!") else labels[k] == v for k, v in where.items())

        return [(labels, s) for labels, s in self.turns if keep(labels)]

    def count_turns(self, predicate: Callable[[tg.TurnSummary], bool] = lambda s: True, **where: str) -> int:
        return sum(1 for _, s in self.turn_rows(**where) if predicate(s))

    def answers_of(self, answer: str) -> list[dict[str, str]]:
        return [a for a in self.answers if a[series.ANSWER] == answer]

    def restarts(self) -> Expected:
        """Streak restarts by a changed result, by tool (the guard's own count per turn)."""
        restarts: Counter[Key] = Counter()
        for _, s in self.turns:
            for tool, count in s.result_restarts:
                restarts[key(**{series.TOOL: tool})] += count
        return dict(restarts)

    def halts(self, by: str) -> Expected:
        return group((d for d in self.detections if d[series.ACTION] == "halt"), (by,))

    def cut(self, k: int, keep: Callable[[tg.TurnSummary], bool] = lambda s: True, **where: str) -> float:
        return (self.count_turns(lambda s: keep(s) and s.tool_calls > k * self.cap.soft_cap, **where)
                / self.count_turns(keep, **where))

    def cumulative(self, edges: Iterable[float], value: Callable[[tg.TurnSummary], float],
                   keep: Callable[[tg.TurnSummary], bool] = lambda s: True, **where: str) -> Expected:
        values = [value(s) for _, s in self.turn_rows(**where) if keep(s)]
        return {key(le=edge): sum(1 for v in values if v <= edge) for edge in [*edges, math.inf]}


def histogram_quantile(q: float, cumulative: Expected) -> float:
    """Prometheus's bucketQuantile (2.x) over cumulative bucket counts keyed by ``le``."""
    edges = sorted((dict(k)["le"], v) for k, v in cumulative.items())
    rank = q * edges[-1][1]
    b = next(i for i, (_, count) in enumerate(edges) if count >= rank)
    if b == len(edges) - 1:
        return edges[-2][0]
    start, count = (0.0, edges[b][1]) if b == 0 else (edges[b - 1][0], edges[b][1] - edges[b - 1][1])
    if b > 0:
        rank -= edges[b - 1][1]
    return start + (edges[b][0] - start) * (rank / count)


ADAPTIVE = {series.CAP_MODE: "adaptive"}


def not_halted(summary: tg.TurnSummary) -> bool:
    """A turn no threshold halted, however the host ended it (the summary's own word, not a label)."""
    return not summary.halted

NOT_STUCK = {series.CAP_MODE: "adaptive", series.STUCK: "false"}
BACKSTOP = {series.THRESHOLD: "hard_backstop"}


def _expectations(cap: CapSettings, board_queries: list[queries.PanelQuery]
                  ) -> dict[tuple[str, int, str], Callable[[Truth], Expected]]:
    def ref(i: int) -> str:
        return chr(ord("A") + i)

    def band(low: int, high: int | None) -> Callable[[Truth], Expected]:
        return lambda t: scalar(t.count_turns(lambda s: s.tool_calls > low and (high is None or s.tool_calls <= high),
                                              **ADAPTIVE))

    def repeats(low: int, high: float, **where: str) -> Callable[[Truth], Expected]:
        return lambda t: scalar(t.count_turns(lambda s: low <= s.max_key_repeat <= high, **where))

    def cut(k: int, **where: str) -> Callable[[Truth], Expected]:
        return lambda t: scalar(t.cut(k, **where))

    def quantile(q: float) -> Callable[[Truth], Expected]:
        return lambda t: scalar(histogram_quantile(q, t.cumulative(buckets.tool_call_edges(t.config),
                                                                   lambda s: s.tool_calls, not_halted, **ADAPTIVE)))

    def table(pid: int, label: str, columns: Callable[[Truth], dict[str, dict[str, float]]],
              rows: Iterable[str] | None = None) -> dict[tuple[str, int, str], Callable[[Truth], Expected]]:
        """Each column of a table panel: one series per row (``rows``: only these)."""
        def column(name: str) -> Callable[[Truth], Expected]:
            return lambda t: {k: v for k, v in by_row(label, columns(t)[name]).items()
                              if rows is None or dict(k)[label] in rows}
        return {(T, pid, pq.ref_id): column(pq.legend) for pq in board_queries if pq.panel_id == pid}

    def thresholds_table(t: Truth) -> dict[str, dict[str, float]]:
        return oracle.threshold_table(t.probe_facts(), [th.value for th in cap.thresholds], float(TOLERANCE),
                                      t.range_s)

    def survival_table(t: Truth) -> dict[str, dict[str, float]]:
        edges = buckets.tool_call_edges(tg.GuardConfig(soft_cap=cap.soft_cap, hard_multiplier=cap.hard_multiplier))
        ends = {str(k): float(k * cap.soft_cap) if estimable(cap, k) else None for k in km_multiples(cap)}
        return oracle.survival_table(((s.tool_calls, oracle.finished(s)) for _, s in t.turn_rows(**ADAPTIVE)),
                                     edges, cap.hard_cap, ends)

    def first_stuck_mean(t: Truth) -> Expected:
        calls: Counter[Key] = Counter()
        turns: Counter[Key] = Counter()
        for labels, s in t.turns:
            if s.first_stuck_call:
                k = key(**{series.THRESHOLD: labels[series.THRESHOLD]})
                calls[k] += s.first_stuck_call
                turns[k] += 1
        return ratio(calls, turns)

    def backstop_flagged_savings(t: Truth) -> Expected:
        flagged = [s for _, s in t.turn_rows(**BACKSTOP) if s.first_stuck_call]
        return scalar(sum(s.tool_calls - s.first_stuck_call for s in flagged))

    def halted_rows(rows: Iterable[tuple[dict[str, str], tg.TurnSummary]]) -> list[dict[str, str]]:
        """The rows of halted turns, by the summary (a shadow's: its would-be halt), not by a label."""
        return [labels for labels, s in rows if s.halted]

    d = cap.stuck_repeat_threshold
    policy = (series.SHADOW_POLICY,)
    expected: dict[tuple[str, int, str], Callable[[Truth], Expected]] = {
        (H, 2, "A"): lambda t: scalar(len(t.turns)),
        (H, 3, "A"): lambda t: scalar(t.count_turns(lambda s: s.halted)),
        (H, 4, "A"): lambda t: scalar(t.count_turns(lambda s: s.halted) / len(t.turns)),
        (H, 5, "A"): lambda t: scalar(len(t.detections)),
        (H, 6, "A"): lambda t: scalar(sum(a[series.ANSWER] == "continue" for a in t.answers) / len(t.answers)),
        (H, 7, "A"): lambda t: scalar(sum(t.tally.plugin_errors.values())),
        (H, 11, "A"): lambda t: group(t.detections, (series.THRESHOLD, series.LEVEL)),
        (H, 12, "A"): lambda t: t.halts(series.THRESHOLD),
        (H, 13, "A"): lambda t: group(
            ({"action": "observed" if r[series.ACTION] == "allow" else r[series.ACTION],
              "attendance": "attended" if r[series.PROMPTABLE] == "true" else "unattended"} for r in t.detections),
            ("action", "attendance")),
        (H, 21, "A"): lambda t: t.halts(series.AGENT),
        (H, 22, "A"): lambda t: {key(**{series.TOOL: dict(k)[series.TOOL] or halts.NO_TOOL}): v
                                 for k, v in t.halts(series.TOOL).items()},
        (H, 23, "A"): lambda t: t.restarts(),
        (H, 23, "B"): lambda t: group((d for d in t.detections
                                       if d[series.ACTION] == "halt" and d[series.THRESHOLD] == "streak"),
                                      (series.TOOL,)),
        (H, 31, "A"): lambda t: group(t.answers, (series.THRESHOLD, series.ANSWER)),
        (H, 32, "A"): lambda t: ratio(group(t.answers_of("continue"), (series.THRESHOLD,)),
                                      group(t.answers, (series.THRESHOLD,))),
        (H, 33, "A"): lambda t: group(t.answers, (series.ANSWER,)),
        (H, 41, "A"): lambda t: group((labels for labels, _ in t.turns), (series.OUTCOME, series.THRESHOLD)),
        # this fleet reports no result after its turns: none after the turn, none reaching no turn
        (H, 61, "A"): lambda t: group(({series.RESOLVED: _bool(s.resolved)}
                                       for _, s in t.turns if s.resolved is not None),
                                      (series.RESOLVED,)),
        (H, 61, "B"): lambda t: {},
        (H, 61, "C"): lambda t: {},
        (H, 62, "A"): lambda t: ratio(group((labels for labels, s in t.turns if s.resolved is None), (series.AGENT,)),
                                      group((labels for labels, _ in t.turns), (series.AGENT,))),
        (H, 42, "A"): lambda t: group((labels for labels, _ in t.turns), (series.OUTCOME,)),
        (T, 2, "A"): lambda t: t.cumulative(buckets.tool_call_edges(t.config), lambda s: s.tool_calls, **ADAPTIVE),
        (T, 3, "A"): quantile(0.5),
        (T, 3, "B"): quantile(0.9),
        (T, 3, "C"): quantile(0.99),
        (T, 3, "D"): lambda t: scalar(t.count_turns(lambda s: s.halted, **ADAPTIVE) / t.count_turns(**ADAPTIVE)),
        **{(T, 4, ref(i)): band(low, high) for i, (low, high) in enumerate(cap.bands())},
        (T, 11, "A"): lambda t: scalar(t.count_turns(**NOT_STUCK)),
        **{(T, 12, ref(i)): cut(k, **NOT_STUCK) for i, k in enumerate(lower_multiples(cap))},
        **{(T, 13, ref(i)): lambda t, k=k: scalar(t.cut(k, not_halted, **NOT_STUCK))
           for i, k in enumerate(lower_multiples(cap))},
        (T, 21, "A"): lambda t: scalar(t.count_turns(**BACKSTOP)),
        (T, 22, "A"): lambda t: scalar(sum(s.tool_calls for _, s in t.turn_rows(**BACKSTOP))),
        (T, 23, "A"): lambda t: scalar(sum(s.tool_calls - cap.soft_cap for _, s in t.turn_rows(**BACKSTOP))),
        (T, 24, "A"): lambda t: scalar(t.count_turns(lambda s: s.first_stuck_call > 0, **BACKSTOP)),
        (T, 25, "A"): backstop_flagged_savings,
        (T, 26, "A"): first_stuck_mean,
        **table(27, series.MAIN_THRESHOLD, thresholds_table, rows=("hard_backstop",)),
        **table(41, "multiple", lambda t: oracle.past_table(t.probe_facts(), BACKSTOP_MULTIPLES, cap.soft_cap)),
        (T, 43, "A"): lambda t: group(t.answers_of("continue"), (series.THRESHOLD,)),
        **table(44, series.MAIN_THRESHOLD, thresholds_table),
        **table(47, "multiple", survival_table),
        # shadow policies: the live policy's figures (A) next to each shadow's (B), from the guard's own hooks
        (T, 101, "A"): lambda t: group(halted_rows(t.turns), (series.THRESHOLD,)),
        (T, 101, "B"): lambda t: group(halted_rows(t.shadow_turns), (*policy, series.THRESHOLD)),
        (T, 102, "A"): lambda t: scalar(t.count_turns(lambda s: s.halted) / len(t.turns)),
        (T, 102, "B"): lambda t: ratio(group(halted_rows(t.shadow_turns), policy),
                                       group((labels for labels, _ in t.shadow_turns), policy)),
        (T, 103, "A"): lambda t: scalar(sum(s.tool_calls for _, s in t.turns)),
        (T, 103, "B"): lambda t: t.shadow_calls(),
        (T, 104, "A"): lambda t: group(t.detections, (series.THRESHOLD, series.LEVEL)),
        (T, 104, "B"): lambda t: group(t.shadow_detections, (*policy, series.THRESHOLD, series.LEVEL)),
        (T, 105, "A"): lambda t: group((r for r in t.shadow_detections if r[series.ACTION] == "halt"), policy),
    }
    long = {series.PAST_SOFT_CAP: "true"}
    slices = (
        {series.THRESHOLD: "none", **long},
        {series.THRESHOLD: "soft_stuck", **long},
        {series.THRESHOLD: "hard_backstop", **long},
    )
    for i, where in enumerate(slices):
        expected[(T, 31, ref(3 * i))] = repeats(0, d - 2, **where)
        expected[(T, 31, ref(3 * i + 1))] = repeats(d - 1, d - 1, **where)
        expected[(T, 31, ref(3 * i + 2))] = repeats(d, math.inf, **where)
    return expected


COMMITTED = queries.boards(build.OUT)
ALL_QUERIES = fleet_queries()
EXPECTED = _expectations(DEFAULTS, ALL_QUERIES)
COLLECTOR_PANELS = {(H, p.build().id_val) for p in halts.collector_panels()}
"""The Collector's own metrics: proven in test_collector_chain.py, where a Collector is scraped."""
FLEET_QUERIES = [pq for pq in ALL_QUERIES if (pq.board_uid, pq.panel_id) not in COLLECTOR_PANELS]
RATIO_PANELS = {H: (4, 6, 32, 62), T: (3, 12, 13, 26, 27, 47, 102)}
"""Panels whose values are ratios, shares or quantiles (compared to float precision, not exactly)."""
RATIO_COLUMNS = ("resolved share", "95% low", "95% high", "time at this rate", "finish by k×S",
                 "productive seen, 95% high")
"""Columns of the probe tables that are ratios or durations."""


def is_ratio(panel_query: queries.PanelQuery) -> bool:
    return (panel_query.panel_id in RATIO_PANELS.get(panel_query.board_uid, ())
            or panel_query.legend in RATIO_COLUMNS)


# -- tests -------------------------------------------------------------------------------------------


def test_every_panel_query_has_an_expectation():
    assert {(pq.board_uid, pq.panel_id, pq.ref_id) for pq in FLEET_QUERIES} == set(EXPECTED)


def test_the_fleet_is_large_and_landed_in_prometheus(fleet_run):
    assert len(fleet_run.tally.turns) >= 1000
    names = fleet_run.prometheus.api("label/__name__/values")
    for metric in (f"{series.TOOL_CALLS}_bucket", f"{series.MAX_REPEAT}_count", f"{series.FIRST_STUCK}_sum",
                   series.DETECTIONS, series.ANSWERS, series.PLUGIN_ERRORS, series.SHADOW_DETECTIONS,
                   series.SHADOW_TURNS, series.RESULT_RESTARTS):
        assert metric in names, f"{metric} not in Prometheus: {sorted(n for n in names if 'turnguard' in n)}"


def test_the_fleets_shadow_policies_disagree_with_the_live_one(fleet_run):
    """The shadow row must have something to show: each shadow summarises every turn, and the
    shadows differ from the live policy where their settings say they should."""
    tally = fleet_run.tally
    per_policy = Counter(policy for policy, _ in tally.shadow_turns)
    assert per_policy == {name: len(tally.turns) for name in fleet.SHADOWS}
    halted = Counter((policy, str(s.threshold)) for policy, s in tally.shadow_turns if s.reason == "halted")
    live_backstop = sum(1 for t in tally.turns if str(t.summary.threshold) == "hard_backstop")
    assert halted[("backstop_5x", "hard_backstop")] > live_backstop  # long turns a 5x backstop would cut
    live_stuck = sum(1 for t in tally.turns if str(t.summary.threshold) == "soft_stuck")
    assert halted[("stop_on_any", "soft_stuck")] == live_stuck  # same stuck signal as the live policy
    assert halted[("stale_repeat", "soft_stuck")] == live_stuck  # a loop of new calls: at the same call


def test_the_max_repeat_panel_leaves_short_turns_out(fleet_run):
    """Panel 31 is about long turns: the fleet's short turns that ended on their own are in Prometheus
    (``turnguard_turn_past_soft_cap="false"``), some of them at or above D (a failing call repeated until
    the user said continue), yet none of them reach the panel."""
    truth, d = Truth(fleet_run), fleet_run.config.stuck_repeat_threshold
    short = {series.THRESHOLD: "none", series.CAP_MODE: "adaptive", series.PAST_SOFT_CAP: "false"}
    assert truth.count_turns(lambda s: s.max_key_repeat >= d, **short) > 0
    assert instant(fleet_run, q.total(f"{series.MAX_REPEAT}_count", q.sel(**short))) == scalar(
        truth.count_turns(**short))
    on_panel = [pq for pq in ALL_QUERIES if (pq.board_uid, pq.panel_id) == (T, 31)]
    assert on_panel and all(f'{series.PAST_SOFT_CAP}="true"' in pq.expr for pq in on_panel)
    assert EXPECTED[(T, 31, "C")](truth) == scalar(0)  # long turns that ended on their own never reached D


def test_an_unsubstituted_macro_or_a_bad_query_fails_loudly(fleet_run):
    """Bad inputs: Prometheus rejects Grafana's macros (hence ``queries.resolve``) and broken PromQL."""
    for bad in (f"sum(rate({series.DETECTIONS}[$__rate_interval]))", f"sum by (le (increase({series.TURNS}[1m]))"):
        with pytest.raises(AssertionError, match="HTTP 400"):
            fleet_run.prometheus.api("query", query=bad)


@pytest.mark.parametrize("panel_query", FLEET_QUERIES, ids=query_id)
def test_panel_query_returns_what_the_fleet_implies(fleet_run, panel_query):
    """Evaluated once over the whole fleet window (as a one-point panel would be): exact."""
    assert queries.macros(panel_query.expr) <= MACROS, panel_query.expr
    expected = EXPECTED[(panel_query.board_uid, panel_query.panel_id, panel_query.ref_id)](Truth(fleet_run))
    is_count = not is_ratio(panel_query)
    scale = window_of(fleet_run, panel_query.expr).seconds if RATE.search(panel_query.expr) else 1
    assert_matches(instant(fleet_run, panel_query.expr), expected, counts=is_count, scale=scale,
                   what=f"{query_id(panel_query)} {panel_query.title!r}")


COUNTS = [pq for pq in FLEET_QUERIES if pq.instant and not is_ratio(pq)]


@pytest.mark.parametrize("panel_query", COUNTS, ids=query_id)
def test_a_count_shows_0_where_nothing_happened(fleet_run, panel_query):
    """A count that is one figure shows 0 for an agent with no turn, not an empty result ("No data");
    a count by label has no rows then (the panel's ``noValue`` says 0). Figures without an agent label
    (plugin errors, the Collector's) are left as they are."""
    normal = instant(fleet_run, panel_query.expr)
    nobody = instant(fleet_run, panel_query.expr, **{q.AGENT_VARIABLE: "nobody"})
    if set(normal) == {key()} and '=~"$agent"' in panel_query.expr:
        assert nobody == {key(): 0.0}, f"{query_id(panel_query)} {panel_query.title!r}: {nobody}"
    else:
        assert all(v == 0 or math.isnan(v) for v in nobody.values()) or '=~"$agent"' not in panel_query.expr


def test_the_threshold_boards_records_hold_the_fleet_in_several_tiles(fleet_run):
    """The fleet's samples land a few times while it runs, so its events fall into several of the
    recording rules' tiles, which the threshold-validation board's exact counts add up."""
    record, records = q.RECORDED[series.TURNS], fleet_run.records
    matrix = fleet_run.prometheus.api("query", query=f"{record}[{records.ms}ms]", time=f"{records.end:.3f}")
    per_tile = Counter()
    for row in matrix["result"]:
        for ts, value in row["values"]:
            per_tile[ts] += float(value)
    assert sum(1 for v in per_tile.values() if v > 0) >= 3, per_tile
    assert sum(per_tile.values()) == len(Truth(fleet_run).turns)


def test_the_window_holds_series_from_before_it_and_series_born_inside_it(fleet_run):
    """No series is created in advance: the new ones are what increase() alone would miss."""
    at_start = fleet_run.prometheus.query(f"count({series.TURNS})", fleet_run.window.start)
    at_end = instant(fleet_run, f"count({series.TURNS})")
    before = int(at_start[0]["value"][1]) if at_start else 0
    assert at_end[key()] > before, "no series was born inside the window"
    if fleet_run.route.endswith("prometheus2"):
        assert before > 0, "the warm-up left no series before the window"


def test_the_first_backstop_halt_of_a_series_counts_where_increase_alone_misses_it(fleet_run):
    """The backstop's series are born inside the window (the warm-up has no runaway): the panel
    counts every one of those turns; a plain ``increase()`` undercounts them."""
    backstop = q.sel(**BACKSTOP)
    want = Truth(fleet_run).count_turns(**BACKSTOP)
    assert want > 0
    assert instant(fleet_run, q.total(series.TURNS, backstop)) == scalar(want)
    plain = instant(fleet_run, f"sum(increase({series.TURNS}{backstop}[$__range]))")
    assert plain.get(key(), 0.0) < want


def test_the_agent_variable_narrows_every_agent_labelled_panel(fleet_run):
    """One agent picked: its turns only; plugin errors (no agent label) are not filtered out."""
    truth = Truth(fleet_run)
    coder = {series.AGENT: "coder"}
    turns = instant(fleet_run, q.total(series.TURNS), **{q.AGENT_VARIABLE: "coder"})
    assert turns == scalar(truth.count_turns(**coder)) and 0 < truth.count_turns(**coder) < len(truth.turns)
    errors = instant(fleet_run, q.total(series.PLUGIN_ERRORS), **{q.AGENT_VARIABLE: "coder"})
    assert errors == scalar(sum(truth.tally.plugin_errors.values()))


def test_the_policy_change_annotation_marks_a_policy_new_to_prometheus(fleet_run):
    """Minutes after its first point, the fleet's policy is new: the annotation query names it."""
    (annotation,) = COMMITTED[H]["annotations"]["list"]
    assert instant(fleet_run, annotation["expr"]) == {key(**{series.POLICY: fleet_run.config.name}): 1.0}


RANGE_QUERIES = [pq for pq in FLEET_QUERIES if not pq.instant]


@pytest.mark.parametrize("panel_query", RANGE_QUERIES, ids=query_id)
def test_range_panel_draws_the_fleets_series(fleet_run, panel_query):
    """As Grafana draws it: a range query over the window, each step's window holding samples."""
    window, interval = window_of(fleet_run, panel_query.expr), fleet_run.draw_interval_s
    expr = queries.resolve(panel_query.expr, grafana_values(window, round(interval * 1000)))
    step = max(SCRAPE_INTERVAL_S, window.seconds / 20)
    # drawn up to a step past the last sample, as a dashboard ending "now" is
    data = fleet_run.prometheus.api("query_range", query=expr, start=f"{window.start:.3f}",
                                    end=f"{window.end + step:.3f}", step=f"{step:.3f}")
    assert data["result"], f"{query_id(panel_query)}: the range query returned no series"
    expected = EXPECTED[(panel_query.board_uid, panel_query.panel_id, panel_query.ref_id)](Truth(fleet_run))
    drawn = {frozenset((k, float(v) if k == "le" else v) for k, v in s["metric"].items()) for s in data["result"]}
    assert drawn <= set(expected), f"series the fleet does not imply: {drawn - set(expected)}"
    assert any(float(v) > 0 for s in data["result"] for _, v in s["values"] if v != "NaN")
