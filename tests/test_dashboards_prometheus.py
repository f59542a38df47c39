"""The proof: every query of every panel, run against a real Prometheus fed by a simulated fleet.

A fleet of 1,012 turns with a known mix runs through the real guard and its OpenTelemetry plugin;
the metrics are exported the way a deployment without a Collector does it (the Prometheus pull
exporter's HTTP server on loopback, scraped by Debian's Prometheus every second). Then each panel
query of the committed dashboards, with Grafana's macros resolved, goes through Prometheus's HTTP
API and must return what the fleet implies: exact counts, and ratios and quantiles to float
precision.

Exact counts from ``increase()`` need care: Prometheus does not count a series' first sample, and
it extrapolates to the window's edges. So the fleet runs twice with the same seed (the first run
creates every series), and the queries are evaluated at the timestamp of the first scrape after
the second run, with ``$__range`` (and, for rate panels, ``$__rate_interval``) equal to the time
since the last scrape before it: both window edges fall on samples and nothing is extrapolated.
Range panels are also run as Grafana would draw them (a range query, ``$__rate_interval`` = 4
scrape intervals).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import optional_dependency

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
optional_dependency("grafana_foundation_sdk")
sdk_metrics = optional_dependency("opentelemetry.sdk.metrics")
prometheus_exporter = optional_dependency("opentelemetry.exporter.prometheus")
prometheus_client = optional_dependency("prometheus_client")

from dashboards import build, fleet, queries  # noqa: E402

import turnguard as tg  # noqa: E402
from turnguard.telemetry import buckets  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SCRAPE_INTERVAL_S = 1
JOB = "turnguard-fleet"
H, T = build.HALTS_UID, build.THRESHOLDS_UID


# -- processes -------------------------------------------------------------------------------------


def _prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        message = "Debian's prometheus is not installed (./dev.sh test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " and CI=true")
        pytest.skip(message)
    return binary


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus on loopback with a temporary config and storage; ``stop`` ends it by pid."""

    def __init__(self, binary: str, workdir: Path, target: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {SCRAPE_INTERVAL_S}s, evaluation_interval: {SCRAPE_INTERVAL_S}s}}\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.log = (workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
        assert body["status"] == "success", body
        return body["data"]

    def wait_until(self, what: str, ready: Callable[[], Any], timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.process.returncode} waiting for {what}")
            try:
                value = ready()
            except (OSError, AssertionError):
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def last_scrape(self) -> float | None:
        """Timestamp (s) of the newest ingested scrape of the fleet's exporter."""
        # timestamp() of a bare selector is the sample's own time (of any other expression: "now")
        up = self.api("query", query=f'up{{job="{JOB}"}}')["result"]
        if not up or up[0]["value"][1] != "1":
            return None
        result = self.api("query", query=f'timestamp(up{{job="{JOB}"}})')["result"]
        return float(result[0]["value"][1]) if result else None

    def scrape_after(self, moment: float) -> float:
        """Wait for a scrape that started after ``moment``; its timestamp."""
        return self.wait_until(f"a scrape after {moment}", lambda: (ts := self.last_scrape()) and ts > moment and ts)


@dataclass(frozen=True)
class Window:
    """Both edges are scrape timestamps: increase() over it is exact."""

    start: float
    end: float

    @property
    def ms(self) -> int:
        return round((self.end - self.start) * 1000)

    @property
    def seconds(self) -> float:
        return self.ms / 1000


@dataclass
class FleetRun:
    prometheus: Prometheus
    tally: fleet.Tally
    window: Window
    config: tg.GuardConfig


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory) -> Iterable[FleetRun]:
    binary = _prometheus_binary()
    workdir = tmp_path_factory.mktemp("prometheus")
    with contextlib.ExitStack() as cleanup:
        registry = prometheus_client.CollectorRegistry()
        provider = sdk_metrics.MeterProvider(
            metric_readers=[prometheus_exporter.PrometheusMetricReader(registry=registry)]
        )
        cleanup.callback(provider.shutdown)
        exporter_port = _free_port()
        server, thread = prometheus_client.start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
        cleanup.callback(thread.join, timeout=5)
        cleanup.callback(server.server_close)
        cleanup.callback(server.shutdown)
        prometheus = Prometheus(binary, workdir, f"127.0.0.1:{exporter_port}")
        cleanup.callback(prometheus.stop)
        quiet = logging.getLogger("turnguard")
        cleanup.callback(quiet.setLevel, quiet.level)
        quiet.setLevel(logging.CRITICAL)  # the fleet's flaky plugin raises on purpose

        prometheus.wait_until("the exporter target to be up", prometheus.last_scrape)
        config = tg.GuardConfig(load_entrypoints=False, shadow=fleet.SHADOWS)
        fleet.run_fleet(fleet.make_fleet(config, meter_provider=provider))  # creates every series
        start = prometheus.scrape_after(time.time())
        tally = fleet.run_fleet(fleet.make_fleet(config, meter_provider=provider))
        end = prometheus.scrape_after(time.time())
        yield FleetRun(prometheus, tally, Window(start, end), config)


# -- what the fleet implies -------------------------------------------------------------------------


def _bool(value: bool) -> str:
    return "true" if value else "false"


def summary_labels(summary: tg.TurnSummary) -> dict[str, str]:
    return {
        build.OUTCOME: summary.reason,
        build.THRESHOLD: str(summary.threshold) if summary.threshold is not None else "none",
        build.CAP_MODE: summary.cap_mode,
        build.STUCK: _bool(summary.stuck),
        build.PROMPTABLE: _bool(summary.promptable),
        build.AGENT: summary.agent_name or "",
    }


def turn_labels(summary: tg.TurnSummary, soft_cap: int) -> dict[str, str]:
    """A live turn's labels; past the soft cap only with an adaptive cap (S = the fleet's configured one)."""
    past = summary.cap_mode == "adaptive" and summary.tool_calls > soft_cap
    return {**summary_labels(summary), build.PAST_SOFT_CAP: _bool(past)}


def shadow_turn_labels(policy: str, summary: tg.TurnSummary) -> dict[str, str]:
    return {build.SHADOW_POLICY: policy, **summary_labels(summary)}


def detection_labels(event: tg.LoopDetectedEvent) -> dict[str, str]:
    return {
        build.THRESHOLD: str(event.threshold),
        build.LEVEL: str(event.level),
        build.ACTION: event.action.label,
        build.CAP_MODE: event.cap_mode,
        build.PROMPTABLE: _bool(event.promptable),
        build.TOOL: event.tool_name or "",
        build.AGENT: event.agent_name or "",
    }


Key = frozenset[tuple[str, Any]]
Expected = dict[Key, float]


def key(**labels: Any) -> Key:
    return frozenset(labels.items())


def group(rows: Iterable[dict[str, str]], by: tuple[str, ...]) -> Expected:
    """Rows counted by the values of the ``by`` labels (a PromQL ``sum by``)."""
    return dict(Counter(frozenset((label, row[label]) for label in by) for row in rows))


def ratio(top: Expected, bottom: Expected) -> Expected:
    return {k: top.get(k, 0) / v for k, v in bottom.items() if v}


def scalar(value: float) -> Expected:
    return {key(): value}


class Truth:
    """The fleet's ground truth (the guard's observer hooks), as the panels slice it."""

    def __init__(self, run: FleetRun) -> None:
        self.tally = run.tally
        self.config = run.config
        self.cap = build.CapSettings.from_config(run.config)
        self.turns = [(turn_labels(t.summary, run.config.soft_cap), t.summary) for t in run.tally.turns]
        self.detections = [detection_labels(e) for e in run.tally.detections]
        self.answers = [
            {build.THRESHOLD: str(e.threshold), build.LEVEL: str(e.level), build.ANSWER: answer}
            for e, answer in run.tally.answers
        ]
        self.shadow_turns = [(shadow_turn_labels(p, s), s) for p, s in run.tally.shadow_turns]
        self.shadow_detections = [{build.SHADOW_POLICY: p, **detection_labels(e)}
                                  for p, e in run.tally.shadow_detections]

    def shadow_calls(self) -> Expected:
        calls: Counter[Key] = Counter()
        for labels, s in self.shadow_turns:
            calls[key(**{build.SHADOW_POLICY: labels[build.SHADOW_POLICY]})] += s.tool_calls
        return dict(calls)

    def turn_rows(self, **where: str) -> list[tuple[dict[str, str], tg.TurnSummary]]:
        def keep(labels: dict[str, str]) -> bool:
            return all(labels[k] != v[1:] if v.startswith("!") else labels[k] == v for k, v in where.items())

        return [(labels, s) for labels, s in self.turns if keep(labels)]

    def count_turns(self, predicate: Callable[[tg.TurnSummary], bool] = lambda s: True, **where: str) -> int:
        return sum(1 for _, s in self.turn_rows(**where) if predicate(s))

    def answers_of(self, answer: str) -> list[dict[str, str]]:
        return [a for a in self.answers if a[build.ANSWER] == answer]

    def halts(self, by: str) -> Expected:
        return group((d for d in self.detections if d[build.ACTION] == "halt"), (by,))

    def cut(self, k: int, **where: str) -> float:
        return self.count_turns(lambda s: s.tool_calls > k * self.cap.soft_cap, **where) / self.count_turns(**where)

    def cumulative(self, edges: Iterable[float], value: Callable[[tg.TurnSummary], float], **where: str) -> Expected:
        values = [value(s) for _, s in self.turn_rows(**where)]
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


ADAPTIVE = {build.CAP_MODE: "adaptive"}
NOT_STUCK = {build.CAP_MODE: "adaptive", build.STUCK: "false"}
BACKSTOP = {build.THRESHOLD: "hard_backstop"}


def _expectations(cap: build.CapSettings) -> dict[tuple[str, int, str], Callable[[Truth], Expected]]:
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
                                                                   lambda s: s.tool_calls, **ADAPTIVE)))

    def first_stuck_mean(t: Truth) -> Expected:
        calls: Counter[Key] = Counter()
        turns: Counter[Key] = Counter()
        for labels, s in t.turns:
            if s.first_stuck_call:
                k = key(**{build.THRESHOLD: labels[build.THRESHOLD]})
                calls[k] += s.first_stuck_call
                turns[k] += 1
        return ratio(calls, turns)

    def backstop_flagged_savings(t: Truth) -> Expected:
        flagged = [s for _, s in t.turn_rows(**BACKSTOP) if s.first_stuck_call]
        return scalar(sum(s.tool_calls - s.first_stuck_call for s in flagged))

    def halted_rows(rows: Iterable[tuple[dict[str, str], tg.TurnSummary]]) -> list[dict[str, str]]:
        return [labels for labels, _ in rows if labels[build.OUTCOME] == "halted"]

    d = cap.stuck_repeat_threshold
    policy = (build.SHADOW_POLICY,)
    expected: dict[tuple[str, int, str], Callable[[Truth], Expected]] = {
        (H, 2, "A"): lambda t: scalar(len(t.turns)),
        (H, 3, "A"): lambda t: scalar(t.count_turns(**{build.OUTCOME: "halted"})),
        (H, 4, "A"): lambda t: scalar(t.count_turns(**{build.OUTCOME: "halted"}) / len(t.turns)),
        (H, 5, "A"): lambda t: scalar(len(t.detections)),
        (H, 6, "A"): lambda t: scalar(sum(a[build.ANSWER] == "continue" for a in t.answers) / len(t.answers)),
        (H, 7, "A"): lambda t: scalar(sum(t.tally.plugin_errors.values())),
        (H, 11, "A"): lambda t: group(t.detections, (build.THRESHOLD, build.LEVEL)),
        (H, 12, "A"): lambda t: t.halts(build.THRESHOLD),
        (H, 13, "A"): lambda t: group(
            ({"action": "observed" if r[build.ACTION] == "allow" else r[build.ACTION],
              "attendance": "attended" if r[build.PROMPTABLE] == "true" else "unattended"} for r in t.detections),
            ("action", "attendance")),
        (H, 21, "A"): lambda t: t.halts(build.AGENT),
        (H, 22, "A"): lambda t: t.halts(build.TOOL),
        (H, 31, "A"): lambda t: group(t.answers, (build.THRESHOLD, build.ANSWER)),
        (H, 32, "A"): lambda t: ratio(group(t.answers_of("continue"), (build.THRESHOLD,)),
                                      group(t.answers, (build.THRESHOLD,))),
        (H, 33, "A"): lambda t: group(t.answers, (build.ANSWER,)),
        (H, 41, "A"): lambda t: group((labels for labels, _ in t.turns), (build.OUTCOME, build.THRESHOLD)),
        (H, 42, "A"): lambda t: group((labels for labels, _ in t.turns), (build.OUTCOME,)),
        (T, 2, "A"): lambda t: t.cumulative(buckets.tool_call_edges(t.config), lambda s: s.tool_calls, **ADAPTIVE),
        (T, 3, "A"): quantile(0.5),
        (T, 3, "B"): quantile(0.9),
        (T, 3, "C"): quantile(0.99),
        **{(T, 4, ref(i)): band(low, high) for i, (low, high) in enumerate(cap.bands())},
        (T, 11, "A"): lambda t: scalar(t.count_turns(**NOT_STUCK)),
        **{(T, 12, ref(i)): cut(k, **NOT_STUCK) for i, k in enumerate(build.BACKSTOP_MULTIPLES)},
        **{(T, 13, ref(i)): cut(k, **NOT_STUCK, **{build.OUTCOME: "!halted"})
           for i, k in enumerate(build.BACKSTOP_MULTIPLES)},
        (T, 21, "A"): lambda t: scalar(t.count_turns(**BACKSTOP)),
        (T, 22, "A"): lambda t: scalar(sum(s.tool_calls for _, s in t.turn_rows(**BACKSTOP))),
        (T, 23, "A"): lambda t: scalar(sum(s.tool_calls - cap.soft_cap for _, s in t.turn_rows(**BACKSTOP))),
        (T, 24, "A"): lambda t: scalar(t.count_turns(lambda s: s.first_stuck_call > 0, **BACKSTOP)),
        (T, 25, "A"): backstop_flagged_savings,
        (T, 26, "A"): first_stuck_mean,
        # shadow policies: the live policy's figures (A) next to each shadow's (B), from the guard's own hooks
        (T, 101, "A"): lambda t: group(halted_rows(t.turns), (build.THRESHOLD,)),
        (T, 101, "B"): lambda t: group(halted_rows(t.shadow_turns), (*policy, build.THRESHOLD)),
        (T, 102, "A"): lambda t: scalar(t.count_turns(**{build.OUTCOME: "halted"}) / len(t.turns)),
        (T, 102, "B"): lambda t: ratio(group(halted_rows(t.shadow_turns), policy),
                                       group((labels for labels, _ in t.shadow_turns), policy)),
        (T, 103, "A"): lambda t: scalar(sum(s.tool_calls for _, s in t.turns)),
        (T, 103, "B"): lambda t: t.shadow_calls(),
        (T, 104, "A"): lambda t: group(t.detections, (build.THRESHOLD, build.LEVEL)),
        (T, 104, "B"): lambda t: group(t.shadow_detections, (*policy, build.THRESHOLD, build.LEVEL)),
        (T, 105, "A"): lambda t: group((r for r in t.shadow_detections if r[build.ACTION] == "halt"), policy),
    }
    long = {build.PAST_SOFT_CAP: "true"}
    slices = (
        {build.THRESHOLD: "none", **long},
        {build.THRESHOLD: "soft_stuck", **long},
        {build.THRESHOLD: "hard_backstop", **long},
    )
    for i, where in enumerate(slices):
        expected[(T, 31, ref(3 * i))] = repeats(0, d - 2, **where)
        expected[(T, 31, ref(3 * i + 1))] = repeats(d - 1, d - 1, **where)
        expected[(T, 31, ref(3 * i + 2))] = repeats(d, math.inf, **where)
    return expected


EXPECTED = _expectations(build.DEFAULTS)
COMMITTED = queries.boards(build.HERE)
ALL_QUERIES = [q for board in COMMITTED.values() for q in queries.panel_queries(board)]


def _id(q: queries.PanelQuery) -> str:
    return f"{q.board_uid}:{q.panel_id}:{q.ref_id}"


def _result(data: dict[str, Any]) -> dict[Key, float]:
    if data["resultType"] == "scalar":
        return {key(): float(data["result"][1])}
    out = {}
    for series in data["result"]:
        labels = {k: (float(v) if k == "le" else v) for k, v in series["metric"].items() if k != "__name__"}
        out[frozenset(labels.items())] = float(series["value"][1])
    return out


def _assert_matches(got: dict[Key, float], expected: Expected, *, counts: bool, scale: float, what: str) -> None:
    for k in set(got) | set(expected):
        value, want = got.get(k, 0.0) * scale, expected.get(k, 0)
        label = f"{what} {dict(k) or ''}: got {value!r}, the fleet implies {want!r}"
        if counts and scale == 1:
            assert value == want, label
        else:
            assert value == pytest.approx(want, rel=1e-9, abs=1e-9), label


# -- tests -------------------------------------------------------------------------------------------


def test_every_panel_query_has_an_expectation():
    assert {(q.board_uid, q.panel_id, q.ref_id) for q in ALL_QUERIES} == set(EXPECTED)


def test_the_fleet_is_large_and_landed_in_prometheus(fleet_run):
    assert len(fleet_run.tally.turns) >= 1000
    names = fleet_run.prometheus.api("label/__name__/values")
    for metric in (f"{build.TOOL_CALLS}_bucket", f"{build.MAX_REPEAT}_count", f"{build.FIRST_STUCK}_sum",
                   build.DETECTIONS, build.ANSWERS, build.PLUGIN_ERRORS, build.SHADOW_DETECTIONS, build.SHADOW_TURNS):
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
    short = {build.THRESHOLD: "none", build.CAP_MODE: "adaptive", build.PAST_SOFT_CAP: "false"}
    assert truth.count_turns(lambda s: s.max_key_repeat >= d, **short) > 0
    window = fleet_run.window
    expr = queries.resolve(build.total(f"{build.MAX_REPEAT}_count", build.sel(**short)),
                           _grafana_values(window, f"{window.ms}ms"))
    data = fleet_run.prometheus.api("query", query=expr, time=f"{window.end:.3f}")
    assert _result(data) == scalar(truth.count_turns(**short))
    on_panel = [q for q in ALL_QUERIES if (q.board_uid, q.panel_id) == (T, 31)]
    assert on_panel and all(f'{build.PAST_SOFT_CAP}="true"' in q.expr for q in on_panel)
    assert EXPECTED[(T, 31, "C")](truth) == scalar(0)  # long turns that ended on their own never reached D


def test_an_unsubstituted_macro_or_a_bad_query_fails_loudly(fleet_run):
    """Bad inputs: Prometheus rejects Grafana's macros (hence ``queries.resolve``) and broken PromQL."""
    for bad in (f"sum(rate({build.DETECTIONS}[$__rate_interval]))", f"sum by (le (increase({build.TURNS}[1m]))"):
        with pytest.raises(AssertionError, match="HTTP 400"):
            fleet_run.prometheus.api("query", query=bad)


def _grafana_values(window: Window, rate_interval: str) -> dict[str, str]:
    """What Grafana would substitute, for a dashboard time range equal to ``window``."""
    return {"__range": f"{window.ms}ms", "__rate_interval": rate_interval, "__interval": rate_interval,
            "datasource": "prometheus"}


@pytest.mark.parametrize("panel_query", ALL_QUERIES, ids=_id)
def test_panel_query_returns_what_the_fleet_implies(fleet_run, panel_query):
    """Evaluated once over the whole fleet window (as a one-point panel would be): exact."""
    window = fleet_run.window
    assert queries.macros(panel_query.expr) <= {"__range", "__rate_interval"}, panel_query.expr
    expr = queries.resolve(panel_query.expr, _grafana_values(window, f"{window.ms}ms"))
    data = fleet_run.prometheus.api("query", query=expr, time=f"{window.end:.3f}")
    expected = EXPECTED[(panel_query.board_uid, panel_query.panel_id, panel_query.ref_id)](Truth(fleet_run))
    is_rate = "rate(" in panel_query.expr and "histogram_quantile" not in panel_query.expr
    is_count = panel_query.panel_id not in _RATIO_PANELS.get(panel_query.board_uid, ())
    _assert_matches(_result(data), expected, counts=is_count, scale=window.seconds if is_rate else 1,
                    what=f"{_id(panel_query)} {panel_query.title!r}")


RANGE_QUERIES = [q for q in ALL_QUERIES if not q.instant]


@pytest.mark.parametrize("panel_query", RANGE_QUERIES, ids=_id)
def test_range_panel_draws_the_fleets_series(fleet_run, panel_query):
    """As Grafana draws it: a range query, $__rate_interval = 4 scrape intervals."""
    window = fleet_run.window
    expr = queries.resolve(panel_query.expr, _grafana_values(window, f"{4 * SCRAPE_INTERVAL_S}s"))
    data = fleet_run.prometheus.api("query_range", query=expr, start=f"{window.start:.3f}", end=f"{window.end:.3f}",
                                    step=f"{SCRAPE_INTERVAL_S}s")
    assert data["result"], f"{_id(panel_query)}: the range query returned no series"
    expected = EXPECTED[(panel_query.board_uid, panel_query.panel_id, panel_query.ref_id)](Truth(fleet_run))
    drawn = {frozenset((k, float(v) if k == "le" else v) for k, v in s["metric"].items()) for s in data["result"]}
    assert drawn <= set(expected), f"series the fleet does not imply: {drawn - set(expected)}"
    assert any(float(v) > 0 for s in data["result"] for _, v in s["values"] if v != "NaN")


_RATIO_PANELS = {H: (4, 6, 32), T: (3, 12, 13, 26, 102)}
"""Panels whose values are ratios, shares or quantiles (compared to float precision, not exactly)."""
