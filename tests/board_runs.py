"""Plumbing of the boards' Prometheus tests: a fleet's metrics sent to a real Prometheus the ways a
deployment sends them (``ROUTES``), the recording rules evaluated on a shortened tile, and every
panel query read back as Grafana would send it (macros and variables resolved).

Routes: scraped from the Python pull exporter (Debian's Prometheus 2.42); over OTLP to the Collector
built from the shipped manifest, running the shipped config, remote-writing to Prometheus 2.42 and
to Prometheus 3; and over OTLP straight into Prometheus 3's native receiver.

No series is created in advance. Exact counts need both window edges on samples (no
extrapolation): the queries are evaluated at the last sample of the fleet, with ``$__range`` (and
``$__rate_interval``) reaching back to the last sample before it. Prometheus 3's range selectors
are left-open, so a sample on the window's start is outside it and increase() would extrapolate:
the Prometheus 3 routes run without a warm-up (every series born inside the window, counted
exactly from zero).

The threshold-validation board reads the recording rules' series, so each Prometheus loads the
shipped rules file with its tiling shortened (``_shortened_rules``): the 5-minute tile becomes 1 s
and the 1-minute lag 10 s, and nothing else changes. Its queries are evaluated at a record's
timestamp once the rules have evaluated past the fleet's last sample, over a range of whole tiles
(``_records``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import chain
from conftest import optional_dependency

sdk_metrics = optional_dependency("opentelemetry.sdk.metrics")
sdk_export = optional_dependency("opentelemetry.sdk.metrics.export")
sdk_resources = optional_dependency("opentelemetry.sdk.resources")
otlp_metrics = optional_dependency("opentelemetry.exporter.otlp.proto.http.metric_exporter")
prometheus_exporter = optional_dependency("opentelemetry.exporter.prometheus")
prometheus_client = optional_dependency("prometheus_client")

import turnguard as tg  # noqa: E402
from turnguard._boards import build, queries, rules  # noqa: E402
from turnguard._boards import promql as q  # noqa: E402

SCRAPE_INTERVAL_S = 10
"""The pull route's scrape interval, and so its scrape timeout (Prometheus allows no longer): the
exporter renders the fleet's thousands of samples in a thread of the test process, which at load 13
on 2 cores took over 2 s (every scrape failed at the 2 s this was)."""
JOB = "turnguard-fleet"


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
    """The records holding the fleet (``_records``): from half a tile before the first after an
    evaluation whose state holds everything before ``window.start``, to the first evaluation whose
    tile ends at or after ``window.end`` and that ran after every sample landed (record timestamps)."""
    config: tg.GuardConfig
    draw_interval_s: float
    """The $__rate_interval a range query is drawn with (samples in each window)."""
    workdir: Path | None = None
    """Where the run's servers (and the fleet's recorder, if it records) keep their files."""
    outages: Sequence[Outage] = ()
    """The telemetry gaps the fleet made."""


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
        self.endpoint = endpoint
        self.exporter = CountingExporter(endpoint)
        self.reader = sdk_export.PeriodicExportingMetricReader(self.exporter, export_interval_millis=10**9)
        self.provider = sdk_metrics.MeterProvider(metric_readers=[self.reader])

    def shutdown(self) -> None:
        self.provider.shutdown()

    def export(self) -> float:
        """Export now; the points' timestamp (Prometheus keeps milliseconds)."""
        assert self.reader.force_flush(30_000)
        (nanos,) = self.exporter.times
        return nanos // 1_000_000 / 1000

    def flush(self, prometheus: chain.Prometheus, late: bool = False) -> float:
        """Export now; the points' timestamp once Prometheus holds every series of the export."""
        at = self.export()
        wait_landed(prometheus, at, self.exporter.series, late=late)
        return at


def wait_landed(prometheus: chain.Prometheus, at: float, expected: int, *, late: bool = False) -> None:
    """Waits until Prometheus holds every series of an export whose points are at ``at`` (``late``:
    it may come behind what the Collector's disk queue retries after a telemetry gap). However long
    it took (a loaded machine delays the Collector's delivery), nothing is lost: a sample that lands
    later than the rules' lag is counted by the first record evaluated after it lands
    (``rules.where``), and ``_records`` ends the window's records after every landing."""
    # Every series has this export's sample: the series with a sample at exactly that millisecond
    # (a range selector keeps the metric names; counting series alone, an older sample would do,
    # and timestamp() of anything but a bare selector is the evaluation time, not the sample's).
    fresh = '{__name__=~"turnguard_.+"}[1ms]'

    def landed() -> bool:
        found = prometheus.api("query", query=fresh, time=f"{at:.3f}")["result"]
        return len(found) == expected

    chain.wait_until(f"{expected} series at {at}", landed, prometheus.exited, timeout=(2 if late else 1) * chain.WAIT_S)


def evaluated_past(prometheus: chain.Prometheus, at: float) -> float:
    """Waits for an evaluation of the rules whose records end at or after ``at`` and that ran after
    everything landed so far (now): its state holds every sample up to ``at``. Its timestamp."""
    due = max(at + LAG_S, time.time())

    def past_it() -> float | None:
        found = prometheus.api("query", query=f"timestamp({rules.HEARTBEAT})")["result"]
        stamp = float(found[0]["value"][1]) if found else None
        return stamp if stamp is not None and stamp >= due else None

    return chain.wait_until(f"the rules to evaluate past {due}", past_it, prometheus.exited)


@dataclass(frozen=True)
class Elsewhere:
    """Another OS process's way to this Prometheus: the OTLP endpoint it exports to (``None``: no
    route for it, as with the pull exporter, which nothing would scrape in a short-lived process),
    the service instance it exports as, and ``exported``, to call with what it exported
    (``late_results``' answer: ``series``, ``at``), which waits until that landed."""

    endpoint: str | None
    instance: str
    exported: Callable[[Mapping[str, Any]], object]



TILE_S, LAG_S = 1, 10
"""The recording rules' tile and lag here: the shipped 5 minutes and 1 minute, shortened."""
RULES_FILE = "turnguard.rules.yaml"


def _shortened_rules() -> str:
    """The shipped rules with only their tiling shortened (the group interval and the lag)."""
    return rules.render(rules.Tiling(tile=TILE_S, lag=LAG_S))


def _prometheus(binary: str, workdir: Path, config: str, flags: list[str]) -> chain.Prometheus:
    """A Prometheus running ``config`` and the shortened rules."""
    (workdir / RULES_FILE).write_text(_shortened_rules())
    return chain.Prometheus(binary, workdir, f"{config}rule_files: [{RULES_FILE}]\n", flags)


def _records(prometheus: chain.Prometheus, window: Window, landed: Iterable[float], after: float) -> Window:
    """The records that hold the fleet: those after the evaluation at ``after`` (``evaluated_past``
    the window's start: its state holds everything before the fleet), up to the first evaluation
    whose tile ends at or after ``window.end`` and that ran after every sample landed (one that
    landed late is counted by the first record after it lands: the window must reach that record).
    Checks that every sample the fleet ``landed`` falls after the records' start (a sample in the
    evaluation they chain from would be left out of them, an undercount the panels could not
    explain). An evaluation Prometheus skipped under load is no loss: the next record counts from
    the state before it. Evaluations are told by the group's last rule (``rules.HEARTBEAT``):
    Prometheus writes each rule of an evaluation on its own, so a record's sample says nothing of
    the records after it; the last rule's says every record of that evaluation is written."""
    record, lag_ms = rules.HEARTBEAT, LAG_S * 1000
    end_ms, after_ms, landed_ms = round(window.end * 1000), round(after * 1000), round(time.time() * 1000)

    def stamps(at: float, reach: str) -> list[int]:
        matrix = prometheus.api("query", query=f"{record}[{reach}]", time=f"{at:.3f}")["result"]
        return sorted({round(float(ts) * 1000) for s in matrix for ts, _ in s["values"]})

    def evaluated() -> int | None:
        done = [ts for ts in stamps(time.time(), "1m") if ts - lag_ms >= end_ms and ts >= landed_ms]
        return done[0] if done else None

    last = chain.wait_until("the rules to evaluate past the fleet", evaluated, prometheus.exited)
    stamped = stamps(last / 1000, f"{last - after_ms + 60_000}ms")
    first = min(ts for ts in stamped if ts > after_ms)
    outside = [at for at in landed if not (after_ms - lag_ms) / 1000 < at <= (last - lag_ms) / 1000]
    assert not outside, f"samples at {outside} landed outside the records' tiles {(after_ms - lag_ms, last - lag_ms)}"
    return Window((first - TILE_S * 500) / 1000, last / 1000)


OUTAGE_S, LOOKBACK_S = 35, 15
"""A telemetry gap (``Samples.gap``): Prometheus down this long, its lookback delta shortened to that
(5 minutes by default), so that after the gap no series has a sample within the lookback of the
records' tile, as after a 10-minute outage in production."""


@dataclass(frozen=True)
class Outage:
    """A telemetry gap: Prometheus down from ``down`` to ``up``; ``exported`` the points' times of
    the exports made meanwhile (the Collector queued them)."""

    down: float
    up: float
    exported: tuple[float, ...] = ()

    @property
    def quiet(self) -> float:
        """The middle of the gap's longest stretch without a sample (a time no series has a sample
        within the lookback of: the stretch is at least twice ``LOOKBACK_S``, ``Samples.up``)."""
        edges = sorted((self.down, *self.exported, self.up))
        start, end = max(itertools.pairwise(edges), key=lambda pair: pair[1] - pair[0])
        return (start + end) / 2


class Samples:
    """Lands the fleet's samples: called, it exports now and waits until Prometheus holds them (then
    a tile passes, so the next sample is in another). ``gap()`` makes a telemetry gap: Prometheus
    goes down for at least ``OUTAGE_S`` (its rules miss their evaluations); the first sample after
    it only exports (the Collector's disk queue holds it and retries it, with no time limit: the
    remote write behind the queue tries each request once); the next sample, or another process's
    export, restarts Prometheus on its port and store and waits for what lands then, however late
    the queue's next try delivers it. (A process that exports once and exits while the store is
    down reaches the board the same way: its export is queued.)"""

    def __init__(self, prometheus: chain.Prometheus, land: Callable[[chain.Prometheus, bool], float], *,
                 export: Callable[[], float] | None = None,
                 restart: Callable[[int], chain.Prometheus] | None = None) -> None:
        """``land``: export and wait until it landed (the points' time; ``True``: it may land late);
        ``export``: export only (the points' time); ``restart``: a Prometheus like the first on that
        port (none: the route has no gaps)."""
        self.prometheus, self._land, self._export, self._restart = prometheus, land, export, restart
        self.landed: list[float] = []
        self.outages: list[Outage] = []
        self._down: float | None = None
        self._missed = False
        self._exported: list[float] = []
        self.late = False
        """A gap just ended: the next landing may come behind the Collector's retries."""

    def __call__(self) -> None:
        if self._down is not None and not self._missed:
            self._missed = True
            if self._export is not None:
                self._exported.append(self._export())  # to a store that is down: not waited for
            return
        self.up()
        self.landed.append(self._land(self.prometheus, self.late))
        self.late = False
        time.sleep(TILE_S)

    def gap(self) -> None:
        """Prometheus down, once its rules have evaluated past the last sample that landed (a gap
        before the window's first record would leave its records no state to chain from; a fleet
        runs to its middle faster than the rules' lag on a quiet machine)."""
        assert self._restart is not None, "this route has no telemetry gap"
        evaluated_past(self.prometheus, (self.landed[-1] if self.landed else time.time()) + TILE_S)
        self.prometheus.stop()
        self._down, self._missed, self._exported = time.time(), False, []

    def up(self) -> None:
        """Ends a gap after ``OUTAGE_S``, and after a stretch of twice the lookback with no sample
        (however late in the gap a loaded machine made its export): Prometheus restarted on the same
        port and store."""
        if self._down is None or self._restart is None:
            return
        quiet = max([self._down, *self._exported]) + 2 * LOOKBACK_S + 2 * TILE_S
        time.sleep(max(0.0, self._down + OUTAGE_S - time.time(), quiet - time.time()))
        self.prometheus = self._restart(self.prometheus.port)
        self.outages.append(Outage(self._down, time.time(), tuple(self._exported)))
        self._down, self.late = None, True


Run = Callable[[Any, Samples, Callable[[], Elsewhere]], Any]
"""Runs a fleet on a meter provider, calling the second argument now and then to land a sample (and,
where the route has one, its ``gap()`` for a telemetry gap); the third gives another OS process its
way to the same Prometheus (``Elsewhere``)."""
WarmUp = Callable[[Any], object] | None
"""Traffic run on the meter provider before the window (the Prometheus 2 routes), or none."""


def _pull(stack: contextlib.ExitStack, workdir: Path, run: Run, config: tg.GuardConfig, warm_up: WarmUp) -> FleetRun:
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
                                prometheus.exited)

    scrape_after(0)
    if warm_up is not None:
        warm_up(provider)
    start = scrape_after(time.time())
    after = evaluated_past(prometheus, start)
    samples = Samples(prometheus, lambda _, late: scrape_after(time.time()))
    others = iter(range(1, 1000))
    tally = run(provider, samples, lambda: Elsewhere(None, f"another-process-{next(others)}", lambda exported: None))
    end = scrape_after(time.time())
    window = Window(start, end)
    return FleetRun("pull-prometheus2", prometheus, tally, window,
                    _records(prometheus, window, [*samples.landed, end], after), config, 4 * SCRAPE_INTERVAL_S)


def _push(stack: contextlib.ExitStack, workdir: Path, run: Run, config: tg.GuardConfig, warm_up: WarmUp, *,
          prometheus3: bool, collector: bool, gaps: bool = False) -> FleetRun:
    """``gaps``: the fleet may make a telemetry gap (``Samples.gap``; Prometheus's lookback shortened
    to ``LOOKBACK_S`` for the whole run, so that the gap is a real one)."""
    binary = chain.prometheus3() if prometheus3 else chain.prometheus2()
    flags = ["--web.enable-otlp-receiver"] if prometheus3 and not collector else []
    flags += [f"--query.lookback-delta={LOOKBACK_S}s"] if gaps else []
    global_config = "global: {evaluation_interval: 1s}\n"
    prometheus = _prometheus(binary, workdir, global_config, flags)
    stack.callback(prometheus.stop)
    if collector:
        otelcol = chain.Collector(chain.collector(), workdir, prometheus_remote_write=prometheus.remote_write_url)
        stack.callback(otelcol.stop)
        endpoint = f"{otelcol.otlp_http}/v1/metrics"
    else:
        endpoint = prometheus.otlp_metrics_url
    push = Push(endpoint)
    stack.callback(push.shutdown)
    if prometheus3 or warm_up is None:  # left-open ranges: every series is born inside the window;
        # a new store's first record counts each series from its first sample, so one turn of an agent
        # the fleet never uses lands first (its series stay flat through the window)
        with tg.Guard(tg.GuardConfig(load_entrypoints=False), meter_provider=push.provider).turn(agent_name="warm-up"):
            pass
    else:
        warm_up(push.provider)
    start = push.flush(prometheus)
    after = evaluated_past(prometheus, start)  # the fleet's first sample in a record after the warm-up's

    def restart(port: int) -> chain.Prometheus:
        return chain.Prometheus(binary, workdir, f"{global_config}rule_files: [{RULES_FILE}]\n", flags, port=port)

    samples = Samples(prometheus, push.flush, export=push.export, restart=restart if gaps else None)
    stack.callback(lambda: samples.prometheus.stop())

    def exported(answer: Mapping[str, Any]) -> None:
        samples.up()
        wait_landed(samples.prometheus, answer["at"], answer["series"], late=samples.late)
        samples.landed.append(answer["at"])

    others = iter(range(1, 1000))
    tally = run(push.provider, samples, lambda: Elsewhere(endpoint, f"another-process-{next(others)}", exported))
    samples.up()
    prometheus = samples.prometheus
    end = push.flush(prometheus, samples.late)
    route = ("collector" if collector else "otlp") + ("-prometheus3" if prometheus3 else "-prometheus2")
    window = Window(start, end)
    records = _records(prometheus, window, [*samples.landed, end], after)
    return FleetRun(route, prometheus, tally, window, records, config, end - start, workdir, samples.outages)


def _scrape_config(target: str) -> str:
    return (f"global: {{scrape_interval: {SCRAPE_INTERVAL_S}s, evaluation_interval: {SCRAPE_INTERVAL_S}s}}\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs: [{{targets: ['{target}']}}]\n")


ROUTES: dict[str, Callable[..., FleetRun]] = {
    "pull-prometheus2": _pull,
    "collector-prometheus2": lambda *a, **k: _push(*a, prometheus3=False, collector=True, **k),
    "collector-prometheus3": lambda *a, **k: _push(*a, prometheus3=True, collector=True, **k),
    "otlp-prometheus3": lambda *a, **k: _push(*a, prometheus3=True, collector=False, **k),
}
"""How the fleet's metrics reach Prometheus: pull exporter, the Collector's remote write, native OTLP.
Each is called ``(stack, workdir, run, config, warm_up)``; the push routes take ``gaps=True`` too."""


# -- reading the panels back ------------------------------------------------------------------------


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


def by_row(label: str, values: Mapping[str, float]) -> Expected:
    """One series per row of a table (``label="value"``)."""
    return {key(**{label: row}): value for row, value in values.items()}


def query_id(panel_query: queries.PanelQuery) -> str:
    return f"{panel_query.board_uid}:{panel_query.panel_id}:{panel_query.ref_id}"


def result(data: dict[str, Any]) -> dict[Key, float]:
    if data["resultType"] == "scalar":
        return {key(): float(data["result"][1])}
    out = {}
    for row in data["result"]:
        labels = {k: (float(v) if k == "le" else v) for k, v in row["metric"].items() if k != "__name__"}
        out[frozenset(labels.items())] = float(row["value"][1])
    return out


def assert_matches(got: dict[Key, float], expected: Expected, *, counts: bool, scale: float, what: str) -> None:
    """Exact for counts, to float precision otherwise; NaN (not estimable, nothing to divide) must be
    NaN, a missing series is 0."""
    for k in set(got) | set(expected):
        value, want = got.get(k, 0.0) * scale, expected.get(k, 0)
        label = f"{what} {dict(k) or ''}: got {value!r}, the fleet implies {want!r}"
        if isinstance(want, float) and math.isnan(want):
            assert k in got and math.isnan(value), label
        elif counts and scale == 1:
            assert value == want, label
        else:
            assert value == pytest.approx(want, rel=1e-9, abs=1e-9), label


TOLERANCE = "0.10"
"""The tolerance variable's default (the threshold board's)."""


def grafana_values(window: Window, rate_interval_ms: int | None = None) -> dict[str, str]:
    """What Grafana would substitute, for a dashboard time range equal to ``window`` (and, by
    default, rate and heatmap windows as long as it), with the variables at their saved defaults."""
    ms = window.ms if rate_interval_ms is None else rate_interval_ms
    return {"__range": f"{window.ms}ms", "__range_s": repr(window.seconds), "__rate_interval": f"{ms}ms",
            "__rate_interval_ms": str(ms), "__interval": f"{ms}ms", "__interval_ms": str(ms),
            "datasource": "prometheus", q.AGENT_VARIABLE: ".*", q.POLICY_VARIABLE: ".*", q.COHORT_VARIABLE: q.LIVE,
            q.TOLERANCE_VARIABLE: TOLERANCE}


MACROS = {"__range", "__range_s", "__rate_interval", "__rate_interval_ms", "__interval", "__interval_ms",
          q.AGENT_VARIABLE, q.POLICY_VARIABLE, q.COHORT_VARIABLE, q.TOLERANCE_VARIABLE}
"""Every macro and variable a panel query may use (each has a value in ``grafana_values``)."""
RECORDED = re.compile(r"\bturnguard:\w+:increase5m\b")
RATE = re.compile(r"\$__(rate_)?interval_ms\b")


def window_of(run: FleetRun, expr: str) -> Window:
    """The records' window for a query of recorded series, the raw samples' for the others."""
    return run.records if RECORDED.search(expr) else run.window


def instant(run: FleetRun, expr: str, **values: str) -> dict[Key, float]:
    """``expr`` as Grafana would send it, at the end of its window."""
    window = window_of(run, expr)
    data = run.prometheus.api("query", query=queries.resolve(expr, {**grafana_values(window), **values}),
                              time=f"{window.end:.3f}")
    return result(data)


def fleet_queries(*uids: str) -> list[queries.PanelQuery]:
    """Every query of the committed boards (``uids``: only theirs)."""
    boards = queries.boards(build.OUT)
    return [pq for uid, board in boards.items() if not uids or uid in uids for pq in queries.panel_queries(board)]
