"""The proof: every query of every panel, run against a real Prometheus fed by a simulated fleet.

A fleet of 1,012 turns with a known mix runs through the real guard and its OpenTelemetry plugin,
and its metrics reach Prometheus the ways a deployment sends them (``ROUTES``): scraped from the
Python pull exporter (Debian's Prometheus 2.42); over OTLP to the Collector built from the shipped
manifest, running the shipped config, remote-writing to Prometheus 2.42 and to Prometheus 3; and
over OTLP straight into Prometheus 3's native receiver. Then each panel query of the committed
dashboards, with Grafana's macros resolved, goes through Prometheus's HTTP API and must return
what the fleet implies: exact counts, and ratios and quantiles to float precision.

No series is created in advance: a smaller warm-up fleet runs before the window, so the window
holds series from before it and series born inside it (the backstop halts, the "stop" answers),
which the boards count from zero. Exact counts need both window edges on samples (no
extrapolation): the queries are evaluated at the last sample of the fleet, with ``$__range`` (and
``$__rate_interval``) reaching back to the last sample before it. Prometheus 3's range selectors
are left-open, so a sample on the window's start is outside it and increase() would extrapolate:
the Prometheus 3 routes run without the warm-up (every series born inside the window, counted
exactly from zero). Range panels are also run as Grafana would draw them (a range query).

The threshold-validation board reads the recording rules' series, so each Prometheus loads the
shipped rules file with its tiling shortened (``test_rules``): the 5-minute tile becomes 1 s and
the 1-minute lag 10 s, and nothing else changes (record names, labels, expressions, alerts). Its
queries are evaluated at a record's timestamp once the rules have evaluated past the fleet's last
sample, over a range of whole tiles starting between the warm-up and the fleet (``records``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import chain
from conftest import optional_dependency

optional_dependency("grafana_foundation_sdk")
sdk_metrics = optional_dependency("opentelemetry.sdk.metrics")
sdk_export = optional_dependency("opentelemetry.sdk.metrics.export")
otlp_metrics = optional_dependency("opentelemetry.exporter.otlp.proto.http.metric_exporter")
prometheus_exporter = optional_dependency("opentelemetry.exporter.prometheus")
prometheus_client = optional_dependency("prometheus_client")

import fleet  # noqa: E402
import probe_fleet as pf  # noqa: E402
import turnguard as tg  # noqa: E402
from turnguard.boards import build, queries  # noqa: E402
from turnguard.telemetry import buckets  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SCRAPE_INTERVAL_S = 2
JOB = "turnguard-fleet"
H, T = build.HALTS_UID, build.THRESHOLDS_UID
WARM_UP = fleet.FleetMix(short=60, long=10, soft_stuck=5, runaway=0, failing_unattended=5, ask_continue=5,
                         ask_stop=0, ask_late_continue=5, explicit=5)
"""Traffic before the window: no runaways and no "stop" answers, so those series are born inside it."""
WARM_UP_SEED = 3


@dataclass(frozen=True)
class Window:
    """Both edges are sample timestamps: increase() over it is exact."""

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
    route: str
    prometheus: chain.Prometheus
    tally: Any
    """The fleet's ``fleet.Tally`` (the probe fleet's ``ProbeTruth``)."""
    window: Window
    records: Window
    """The records holding the fleet: from half a tile before the first whose tile starts at or after
    ``window.start`` to the first whose tile ends at or after ``window.end`` (a record's timestamp)."""
    config: tg.GuardConfig
    draw_interval_s: float
    """The $__rate_interval a range query is drawn with (samples in each window)."""


class CountingExporter(sdk_export.MetricExporter):
    """The OTLP exporter, noting each export's Prometheus series and the points' timestamp."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(preferred_temporality=None, preferred_aggregation=None)
        self.otlp = otlp_metrics.OTLPMetricExporter(endpoint=endpoint)
        self.series = 0
        self.times: set[int] = set()

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> Any:
        self.series, self.times = 0, set()
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        self.times.add(point.time_unix_nano)
                        bounds = getattr(point, "explicit_bounds", None)
                        self.series += 1 if bounds is None else len(bounds) + 3  # buckets, +Inf, _sum, _count
        return self.otlp.export(metrics_data, timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.otlp.shutdown()


class Push:
    """An SDK pushing over OTLP when the test says (a reader whose own interval never comes)."""

    def __init__(self, endpoint: str) -> None:
        self.exporter = CountingExporter(endpoint)
        self.reader = sdk_export.PeriodicExportingMetricReader(self.exporter, export_interval_millis=10**9)
        self.provider = sdk_metrics.MeterProvider(metric_readers=[self.reader])

    def flush(self, prometheus: chain.Prometheus) -> float:
        """Export now; the points' timestamp once Prometheus holds every series of the export (within
        the rules' lag: a record evaluated before its samples landed would miss them for good)."""
        assert self.reader.force_flush(30_000)
        (nanos,) = self.exporter.times
        at, expected = nanos // 1_000_000 / 1000, self.exporter.series  # Prometheus keeps milliseconds

        # Every series has this export's sample (counting series alone, an older sample would do).
        # timestamp() drops the metric name: kept as a label, so _sum and _count stay apart.
        fresh = (f'count(timestamp(label_replace({{__name__=~"turnguard_.+"}}, "tg_name", "$1", "__name__", "(.+)"))'
                 f' >= {at - 0.0005:.4f})')

        def landed() -> bool:
            found = prometheus.query(fresh, at)
            return bool(found) and int(found[0]["value"][1]) == expected

        chain.wait_until(f"{expected} series at {at}", landed, prometheus.exited)
        assert time.time() - at < LAG_S, f"the export landed {time.time() - at:.1f} s late, past the rules' lag"
        return at


TILE_S, LAG_S = 1, 10
"""The recording rules' tile and lag here: the shipped 5 minutes and 1 minute, shortened."""
RULES_FILE = "turnguard.rules.yaml"


def _shortened_rules() -> str:
    """The shipped rules file with only its tiling changed: the group interval and the tile's
    offsets (``offset 1m`` is the lag, ``offset 6m`` the lag plus the tile)."""
    header, groups = chain.RULES.read_text().split("\ngroups:\n")
    shortened = re.sub(r"\binterval: 5m\b", f"interval: {TILE_S}s", groups)
    shortened = re.sub(r"\boffset 6m\b", f"offset {LAG_S + TILE_S}s", shortened)
    shortened = re.sub(r"\boffset 1m\b", f"offset {LAG_S}s", shortened)
    assert shortened.count(f"interval: {TILE_S}s") == 1
    assert shortened.count(f"offset {LAG_S}s") == 2 * len(build.RECORDED) == 2 * shortened.count("- record:")
    return f"{header}\ngroups:\n{shortened}"


def _prometheus(binary: str, workdir: Path, config: str, flags: list[str]) -> chain.Prometheus:
    """A Prometheus running ``config`` and the shortened rules."""
    (workdir / RULES_FILE).write_text(_shortened_rules())
    return chain.Prometheus(binary, workdir, f"{config}rule_files: [{RULES_FILE}]\n", flags)


def _records(prometheus: chain.Prometheus, window: Window, landed: Iterable[float]) -> Window:
    """Waits for the first evaluation whose tile ends at or after ``window.end``; returns the records
    from the first whose tile starts at or after ``window.start`` up to it, and checks that the group
    missed no evaluation in between (a missed tile would be lost, as in production) and that every
    sample the fleet ``landed`` after the window's start falls in one of those tiles (a sample in
    the tile before would be left out of the records, an undercount the panels could not explain)."""
    record, tile_ms, lag_ms = build.RECORDED[build.TURNS], TILE_S * 1000, LAG_S * 1000
    end_ms, start_ms = round(window.end * 1000), round(window.start * 1000)

    def stamps(at: float, reach: str) -> list[int]:
        matrix = prometheus.api("query", query=f"{record}[{reach}]", time=f"{at:.3f}")["result"]
        return sorted({round(float(ts) * 1000) for s in matrix for ts, _ in s["values"]})

    def evaluated() -> int | None:
        after = [ts for ts in stamps(time.time(), "1m") if ts - lag_ms >= end_ms]
        return after[0] if after else None

    last = chain.wait_until("the rules to evaluate past the fleet", evaluated, prometheus.exited)
    first = last - (last - lag_ms - tile_ms - start_ms) // tile_ms * tile_ms
    held = stamps(last / 1000, f"{last - first + tile_ms // 2}ms")
    assert held == list(range(held[0], last + 1, tile_ms)), (
        f"the recording group skipped evaluations: {held}")
    tiles = ((first - lag_ms - tile_ms) / 1000, (last - lag_ms) / 1000)
    outside = [at for at in landed if not tiles[0] < at <= tiles[1]]
    assert not outside, f"samples at {outside} landed outside the records' tiles {tiles}"
    return Window((first - tile_ms // 2) / 1000, last / 1000)


Run = Callable[[Any, Callable[[], object]], Any]
"""Runs a fleet on a meter provider, calling the second argument now and then to land a sample."""


def _pull(stack: contextlib.ExitStack, workdir: Path, run: Run) -> FleetRun:
    registry = prometheus_client.CollectorRegistry()
    provider = sdk_metrics.MeterProvider(metric_readers=[prometheus_exporter.PrometheusMetricReader(registry=registry)])
    stack.callback(provider.shutdown)
    port = chain.free_port()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    stack.callback(thread.join, timeout=5)
    stack.callback(server.server_close)
    stack.callback(server.shutdown)
    prometheus = _prometheus(chain.prometheus2(), workdir, _scrape_config(f"127.0.0.1:{port}"), [])
    stack.callback(prometheus.stop)

    def last_scrape() -> float | None:
        # timestamp() of a bare selector is the sample's own time (of any other expression: "now")
        up = prometheus.api("query", query=f'up{{job="{JOB}"}}')["result"]
        if not up or up[0]["value"][1] != "1":
            return None
        result = prometheus.api("query", query=f'timestamp(up{{job="{JOB}"}})')["result"]
        return float(result[0]["value"][1]) if result else None

    def scrape_after(moment: float) -> float:
        return chain.wait_until(f"a scrape after {moment}", lambda: (ts := last_scrape()) and ts > moment and ts,
                                prometheus.exited, timeout=60)

    scrape_after(0)
    fleet.run_fleet(fleet.make_fleet(_config(), meter_provider=provider), WARM_UP, WARM_UP_SEED)
    start = scrape_after(time.time())
    landed: list[float] = []
    tally = run(provider, lambda: landed.append(scrape_after(time.time())))
    end = scrape_after(time.time())
    window = Window(start, end)
    return FleetRun("pull-prometheus2", prometheus, tally, window, _records(prometheus, window, [*landed, end]),
                    _config(), 4 * SCRAPE_INTERVAL_S)


def _push(stack: contextlib.ExitStack, workdir: Path, run: Run, *, prometheus3: bool,
          collector: bool) -> FleetRun:
    binary = chain.prometheus3() if prometheus3 else chain.prometheus2()
    flags = ["--web.enable-otlp-receiver"] if prometheus3 and not collector else []
    prometheus = _prometheus(binary, workdir, "global: {evaluation_interval: 1s}\n", flags)
    stack.callback(prometheus.stop)
    if collector:
        otelcol = chain.Collector(chain.collector(), workdir, prometheus_remote_write=prometheus.remote_write_url)
        stack.callback(otelcol.stop)
        endpoint = f"{otelcol.otlp_http}/v1/metrics"
    else:
        endpoint = prometheus.otlp_metrics_url
    push = Push(endpoint)
    stack.callback(push.provider.shutdown)
    if prometheus3:  # left-open ranges: every series is born inside the window (see the module docstring)
        start = time.time() - 1
    else:
        fleet.run_fleet(fleet.make_fleet(_config(), meter_provider=push.provider), WARM_UP, WARM_UP_SEED)
        start = push.flush(prometheus)
        time.sleep(TILE_S)  # the fleet's first sample in a tile after the one holding the warm-up's
    landed: list[float] = []

    def sample() -> None:
        landed.append(push.flush(prometheus))
        time.sleep(TILE_S)  # the next sample in another tile

    tally = run(push.provider, sample)
    end = push.flush(prometheus)
    route = ("collector" if collector else "otlp") + ("-prometheus3" if prometheus3 else "-prometheus2")
    window = Window(start, end)
    return FleetRun(route, prometheus, tally, window, _records(prometheus, window, [*landed, end]), _config(),
                    end - start)


def _scrape_config(target: str) -> str:
    return (f"global: {{scrape_interval: {SCRAPE_INTERVAL_S}s, evaluation_interval: {SCRAPE_INTERVAL_S}s}}\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs: [{{targets: ['{target}']}}]\n")


def _config() -> tg.GuardConfig:
    return tg.GuardConfig(load_entrypoints=False, shadow=fleet.SHADOWS)


ROUTES: dict[str, Callable[..., FleetRun]] = {
    "pull-prometheus2": _pull,
    "collector-prometheus2": lambda *a: _push(*a, prometheus3=False, collector=True),
    "collector-prometheus3": lambda *a: _push(*a, prometheus3=True, collector=True),
    "otlp-prometheus3": lambda *a: _push(*a, prometheus3=True, collector=False),
}
"""How the fleet's metrics reach Prometheus: pull exporter, the Collector's remote write, native OTLP."""


@pytest.fixture(scope="module", params=sorted(ROUTES))
def fleet_run(request, tmp_path_factory) -> Iterable[FleetRun]:
    workdir = tmp_path_factory.mktemp(request.param)
    with contextlib.ExitStack() as stack:
        quiet = logging.getLogger("turnguard")
        stack.callback(quiet.setLevel, quiet.level)
        quiet.setLevel(logging.CRITICAL)  # the fleet's flaky plugin raises on purpose

        def run(provider: Any, sample: Callable[[], object]) -> fleet.Tally:
            return fleet.run_fleet(fleet.make_fleet(_config(), meter_provider=provider), sample=sample)

        yield ROUTES[request.param](stack, workdir, run)


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
NOT_HALTED = {**ADAPTIVE, build.OUTCOME: "!halted"}
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
                                                                   lambda s: s.tool_calls, **NOT_HALTED)))

    def passed(k: int, *, resolved: bool) -> Callable[[Truth], Expected]:
        def count(t: Truth) -> Expected:
            past = [s for _, s in t.turns if s.cohort == "probe" and s.tool_calls > k * cap.soft_cap]
            return scalar(sum(1 for s in past if s.resolved)) if resolved else ({key(): len(past)} if past else {})
        return count

    def without_probe_turns(empty: Expected) -> Callable[[Truth], Expected]:
        """The false-halt panels on a fleet with no probe cohort (their counts: probe_run's tests)."""
        def none_probed(t: Truth) -> Expected:
            assert not any(s.cohort == "probe" for _, s in t.turns)
            return empty
        return none_probed

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
        **{(T, 41, ref(i)): passed(k, resolved=False) for i, k in enumerate(build.BACKSTOP_MULTIPLES)},
        **{(T, 42, ref(i)): passed(k, resolved=True) for i, k in enumerate(build.BACKSTOP_MULTIPLES)},
        (T, 43, "A"): lambda t: group(t.answers_of("continue"), (build.THRESHOLD,)),
        **{(T, pid, ref(i)): without_probe_turns(scalar(0) if pid == 45 else {})
           for pid in (44, 45, 46) for i, _ in enumerate(build.FALSE_HALT_THRESHOLDS)},
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
COMMITTED = queries.boards(build.OUT)
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
    assert {(q.board_uid, q.panel_id, q.ref_id) for q in FLEET_QUERIES} == set(EXPECTED)


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
    assert _instant(fleet_run, build.total(f"{build.MAX_REPEAT}_count", build.sel(**short))) == scalar(
        truth.count_turns(**short))
    on_panel = [q for q in ALL_QUERIES if (q.board_uid, q.panel_id) == (T, 31)]
    assert on_panel and all(f'{build.PAST_SOFT_CAP}="true"' in q.expr for q in on_panel)
    assert EXPECTED[(T, 31, "C")](truth) == scalar(0)  # long turns that ended on their own never reached D


def test_an_unsubstituted_macro_or_a_bad_query_fails_loudly(fleet_run):
    """Bad inputs: Prometheus rejects Grafana's macros (hence ``queries.resolve``) and broken PromQL."""
    for bad in (f"sum(rate({build.DETECTIONS}[$__rate_interval]))", f"sum by (le (increase({build.TURNS}[1m]))"):
        with pytest.raises(AssertionError, match="HTTP 400"):
            fleet_run.prometheus.api("query", query=bad)


def _grafana_values(window: Window, rate_interval_ms: int | None = None) -> dict[str, str]:
    """What Grafana would substitute, for a dashboard time range equal to ``window`` (and, by
    default, rate and heatmap windows as long as it)."""
    ms = window.ms if rate_interval_ms is None else rate_interval_ms
    return {"__range": f"{window.ms}ms", "__rate_interval": f"{ms}ms", "__rate_interval_ms": str(ms),
            "__interval": f"{ms}ms", "__interval_ms": str(ms), "datasource": "prometheus",
            build.AGENT_VARIABLE: ".*", build.POLICY_VARIABLE: ".*"}


COLLECTOR_PANELS = {(H, p.build().id_val) for p in build.collector_panels()}
"""The Collector's own metrics: proven in test_collector_chain.py, where a Collector is scraped."""
FLEET_QUERIES = [q for q in ALL_QUERIES if (q.board_uid, q.panel_id) not in COLLECTOR_PANELS]


def _window(fleet_run: FleetRun, expr: str) -> Window:
    """The records' window for a query of recorded series, the raw samples' for the others."""
    return fleet_run.records if RECORDED.search(expr) else fleet_run.window


RECORDED = re.compile(r"\bturnguard:\w+:increase5m\b")
RATE = re.compile(r"\$__(rate_)?interval_ms\b")


def _instant(fleet_run: FleetRun, expr: str, **values: str) -> dict[Key, float]:
    window = _window(fleet_run, expr)
    data = fleet_run.prometheus.api("query", query=queries.resolve(expr, {**_grafana_values(window), **values}),
                                    time=f"{window.end:.3f}")
    return _result(data)


@pytest.mark.parametrize("panel_query", FLEET_QUERIES, ids=_id)
def test_panel_query_returns_what_the_fleet_implies(fleet_run, panel_query):
    """Evaluated once over the whole fleet window (as a one-point panel would be): exact."""
    allowed = {"__range", "__rate_interval", "__rate_interval_ms", "__interval", "__interval_ms",
               build.AGENT_VARIABLE, build.POLICY_VARIABLE}
    assert queries.macros(panel_query.expr) <= allowed, panel_query.expr
    expected = EXPECTED[(panel_query.board_uid, panel_query.panel_id, panel_query.ref_id)](Truth(fleet_run))
    is_count = panel_query.panel_id not in _RATIO_PANELS.get(panel_query.board_uid, ())
    scale = _window(fleet_run, panel_query.expr).seconds if RATE.search(panel_query.expr) else 1
    _assert_matches(_instant(fleet_run, panel_query.expr), expected, counts=is_count, scale=scale,
                    what=f"{_id(panel_query)} {panel_query.title!r}")


def test_the_threshold_boards_records_hold_the_fleet_in_several_tiles(fleet_run):
    """The fleet's samples land a few times while it runs, so its events fall into several of the
    recording rules' tiles, which the threshold-validation board's exact counts add up."""
    record, records = build.RECORDED[build.TURNS], fleet_run.records
    matrix = fleet_run.prometheus.api("query", query=f"{record}[{records.ms}ms]", time=f"{records.end:.3f}")
    per_tile = Counter()
    for series in matrix["result"]:
        for ts, value in series["values"]:
            per_tile[ts] += float(value)
    assert sum(1 for v in per_tile.values() if v > 0) >= 3, per_tile
    assert sum(per_tile.values()) == len(Truth(fleet_run).turns)


def test_the_window_holds_series_from_before_it_and_series_born_inside_it(fleet_run):
    """No series is created in advance: the new ones are what increase() alone would miss."""
    at_start = fleet_run.prometheus.query(f"count({build.TURNS})", fleet_run.window.start)
    at_end = _instant(fleet_run, f"count({build.TURNS})")
    before = int(at_start[0]["value"][1]) if at_start else 0
    assert at_end[key()] > before, "no series was born inside the window"
    if fleet_run.route.endswith("prometheus2"):
        assert before > 0, "the warm-up left no series before the window"


def test_the_first_backstop_halt_of_a_series_counts_where_increase_alone_misses_it(fleet_run):
    """The backstop's series are born inside the window (the warm-up has no runaway): the panel
    counts every one of those turns; a plain ``increase()`` undercounts them."""
    backstop = build.sel(**BACKSTOP)
    want = Truth(fleet_run).count_turns(**BACKSTOP)
    assert want > 0
    assert _instant(fleet_run, build.total(build.TURNS, backstop)) == scalar(want)
    plain = _instant(fleet_run, f"sum(increase({build.TURNS}{backstop}[$__range]))")
    assert plain.get(key(), 0.0) < want


def test_the_agent_variable_narrows_every_agent_labelled_panel(fleet_run):
    """One agent picked: its turns only; plugin errors (no agent label) are not filtered out."""
    truth = Truth(fleet_run)
    coder = {build.AGENT: "coder"}
    turns = _instant(fleet_run, build.total(build.TURNS), **{build.AGENT_VARIABLE: "coder"})
    assert turns == scalar(truth.count_turns(**coder)) and 0 < truth.count_turns(**coder) < len(truth.turns)
    errors = _instant(fleet_run, build.total(build.PLUGIN_ERRORS), **{build.AGENT_VARIABLE: "coder"})
    assert errors == scalar(sum(truth.tally.plugin_errors.values()))


def test_the_policy_change_annotation_marks_a_policy_new_to_prometheus(fleet_run):
    """Minutes after its first point, the fleet's policy is new: the annotation query names it."""
    (annotation,) = COMMITTED[H]["annotations"]["list"]
    assert _instant(fleet_run, annotation["expr"]) == {key(**{build.POLICY: fleet_run.config.name}): 1.0}


RANGE_QUERIES = [q for q in FLEET_QUERIES if not q.instant]


@pytest.mark.parametrize("panel_query", RANGE_QUERIES, ids=_id)
def test_range_panel_draws_the_fleets_series(fleet_run, panel_query):
    """As Grafana draws it: a range query over the window, each step's window holding samples."""
    window, interval = _window(fleet_run, panel_query.expr), fleet_run.draw_interval_s
    expr = queries.resolve(panel_query.expr, _grafana_values(window, round(interval * 1000)))
    step = max(SCRAPE_INTERVAL_S, window.seconds / 20)
    # drawn up to a step past the last sample, as a dashboard ending "now" is
    data = fleet_run.prometheus.api("query_range", query=expr, start=f"{window.start:.3f}",
                                    end=f"{window.end + step:.3f}", step=f"{step:.3f}")
    assert data["result"], f"{_id(panel_query)}: the range query returned no series"
    expected = EXPECTED[(panel_query.board_uid, panel_query.panel_id, panel_query.ref_id)](Truth(fleet_run))
    drawn = {frozenset((k, float(v) if k == "le" else v) for k, v in s["metric"].items()) for s in data["result"]}
    assert drawn <= set(expected), f"series the fleet does not imply: {drawn - set(expected)}"
    assert any(float(v) > 0 for s in data["result"] for _, v in s["values"] if v != "NaN")


_RATIO_PANELS = {H: (4, 6, 32), T: (3, 12, 13, 26, 102)}
"""Panels whose values are ratios, shares or quantiles (compared to float precision, not exactly)."""


# -- the probe cohort: the worked example with known truth (tests/probe_fleet.py) ------------------


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory) -> Iterable[FleetRun]:
    """The probe fleet over OTLP through the shipped Collector into Prometheus 3 (every series born in
    the window), its late results reported an hour later as a CI run would."""
    workdir = tmp_path_factory.mktemp("probe-fleet")
    with contextlib.ExitStack() as stack:
        def run(provider: Any, sample: Callable[[], object]) -> pf.ProbeTruth:
            return pf.run_probe_fleet(tg.Guard(pf.probe_config(disable_plugins=("recorder",)), environ={},
                                               meter_provider=provider))

        yield _push(stack, workdir, run, prometheus3=True, collector=True)


PROBE_PANELS = [q for q in FLEET_QUERIES if (q.board_uid, q.panel_id) in {(T, 41), (T, 42), (T, 43)}]
FALSE_HALT_PANELS = [q for q in FLEET_QUERIES if (q.board_uid, q.panel_id) in {(T, 44), (T, 45), (T, 46)}]


def _probe_truth(truth: pf.ProbeTruth, k: int, *, resolved: bool) -> int:
    """Probe turns past k×S (those whose task was done: every call ran, and it was not a runaway)."""
    past = [(kind, s) for kind, s in truth.summaries if s.cohort == "probe" and s.tool_calls > k * pf.SOFT_CAP]
    return sum(1 for kind, s in past if not resolved or (kind is not pf.Work.RUNAWAY and s.reason != "halted"))


def test_the_probe_fleet_has_turns_past_every_k_and_late_results(probe_run):
    truth: pf.ProbeTruth = probe_run.tally
    assert build.DEFAULTS.soft_cap == pf.SOFT_CAP
    assert all(_probe_truth(truth, k, resolved=False) > 0 for k in build.BACKSTOP_MULTIPLES)
    # 20x lets the long productive turns finish: resolved past 10x, none past 20x (runaways only)
    assert _probe_truth(truth, 10, resolved=True) == truth.resolved[("probe", pf.Work.LONG)] > 0
    assert _probe_truth(truth, 20, resolved=True) == 0
    late = [s for _, s in truth.summaries if s.cohort == "probe" and s.resolved is None and s.tool_calls > 1000]
    assert late, "no probe turn past 10x had its result reported after it ended"


@pytest.mark.parametrize("panel_query", PROBE_PANELS, ids=_id)
def test_probe_panel_counts_what_the_probe_fleet_did(probe_run, panel_query):
    """Exact counts against the fleet's ProbeTruth, late results (the results counter) included."""
    truth: pf.ProbeTruth = probe_run.tally
    got = _instant(probe_run, panel_query.expr)
    if panel_query.panel_id == 43:  # no probe-fleet turn is attended: nobody was asked
        assert got == {}
        return
    k = build.BACKSTOP_MULTIPLES[ord(panel_query.ref_id) - ord("A")]
    want = _probe_truth(truth, k, resolved=panel_query.panel_id == 42)
    assert got == scalar(want), f"{_id(panel_query)} {panel_query.title!r}: got {got}, the fleet did {want}"


def _would_halt_truth(truth: pf.ProbeTruth, threshold: str) -> list[tuple[pf.Work, tg.TurnSummary, tg.TurnSummary]]:
    """Probe turns the main configuration, run alone on the same calls, halted at ``threshold``:
    (work, the probe turn's summary, the main-only run's summary)."""
    return [(kind, s, truth.main_halts[s.turn_id]) for kind, s in truth.summaries
            if s.turn_id in truth.main_halts and truth.main_halts[s.turn_id].threshold == threshold]


def _done(kind: pf.Work, summary: tg.TurnSummary) -> bool:
    return kind is not pf.Work.RUNAWAY and summary.reason != "halted"


def test_the_probe_fleet_has_false_halts_of_both_live_thresholds(probe_run):
    """Edit-and-rerun turns the seed's stuck signal halts, long turns the 10x backstop halts: both
    resolved under the probe; runaways the backstop rightly halts."""
    truth: pf.ProbeTruth = probe_run.tally
    for threshold in build.FALSE_HALT_THRESHOLDS:
        halted = _would_halt_truth(truth, threshold)
        assert any(_done(kind, s) for kind, s, _ in halted), threshold
    kinds = {kind for kind, _, _ in _would_halt_truth(truth, "hard_backstop")}
    assert kinds == {pf.Work.LONG, pf.Work.RUNAWAY}
    assert {kind for kind, _, _ in _would_halt_truth(truth, "soft_stuck")} == {pf.Work.EDIT_RERUN}


@pytest.mark.parametrize("panel_query", FALSE_HALT_PANELS, ids=_id)
def test_false_halt_panel_counts_what_the_main_policy_would_have_halted(probe_run, panel_query):
    """Exact counts against the main configuration run alone on each probe turn's calls: turns it
    halts per threshold (44), those resolved under the probe, late results included (45), and the
    calls the probe turns made past that halt (46)."""
    truth: pf.ProbeTruth = probe_run.tally
    threshold = build.FALSE_HALT_THRESHOLDS[ord(panel_query.ref_id) - ord("A")]
    halted = _would_halt_truth(truth, threshold)
    want = {44: len(halted), 45: sum(_done(kind, s) for kind, s, _ in halted),
            46: sum(s.tool_calls - main.tool_calls for _, s, main in halted)}[panel_query.panel_id]
    assert want > 0
    got = _instant(probe_run, panel_query.expr)
    assert got == scalar(want), f"{_id(panel_query)} {panel_query.title!r}: got {got}, the fleet did {want}"


def test_the_policy_variable_picks_a_policy_and_its_probe(probe_run):
    """The fleet's policy picked: its probe turns (``default-probe``) stay on the probe panels and the
    live-only panels drop them; another policy's name shows nothing."""
    truth: pf.ProbeTruth = probe_run.tally
    ten = next(q for q in PROBE_PANELS if (q.panel_id, q.ref_id) == (41, "D"))
    policy = probe_run.config.name
    assert _instant(probe_run, ten.expr, **{build.POLICY_VARIABLE: policy}) == scalar(
        _probe_truth(truth, 10, resolved=False))
    assert _instant(probe_run, ten.expr, **{build.POLICY_VARIABLE: "renamed"}) == {}
    live = sum(v for (cohort, _), v in truth.turns.items() if cohort == "live")
    assert _instant(probe_run, build.total(build.TURNS), **{build.POLICY_VARIABLE: policy}) == scalar(live)
    assert _instant(probe_run, build.total(build.TURNS)) == scalar(sum(truth.turns.values()))
