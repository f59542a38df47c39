"""Every exported cumulative point's start is at least a millisecond before its sample, and no
other point or field changes: a store at millisecond resolution keeps the start as a 0 only then."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from conftest import optional_dependency

optional_dependency("opentelemetry.sdk")

from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import (  # noqa: E402
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402

from turnguard.telemetry._starts import MS, SeparateStartsExporter, separate_starts  # noqa: E402

CUMULATIVE, DELTA = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA


class Captured(MetricExporter):
    """Keeps what it is given."""

    def __init__(self, temporality: AggregationTemporality = CUMULATIVE) -> None:
        super().__init__(preferred_temporality={Counter: temporality, Histogram: temporality})
        self.exports: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _points(data: MetricsData) -> list[tuple[Metric, Any]]:
    return [(m, p) for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
            for p in m.data.data_points]


def _number(start: int, at: int, value: int = 1) -> NumberDataPoint:
    return NumberDataPoint(attributes={"k": value}, start_time_unix_nano=start, time_unix_nano=at, value=value)


def _histogram(start: int, at: int) -> HistogramDataPoint:
    return HistogramDataPoint(attributes={}, start_time_unix_nano=start, time_unix_nano=at, count=1, sum=3.0,
                              bucket_counts=[0, 1], explicit_bounds=[1.0], min=3.0, max=3.0)


def _data(*metrics: Metric) -> MetricsData:
    scope = ScopeMetrics(scope=InstrumentationScope("turnguard"), metrics=list(metrics), schema_url="")
    return MetricsData([ResourceMetrics(resource=Resource.create({}), scope_metrics=[scope], schema_url="")])


def _sum(points: list[NumberDataPoint], temporality: AggregationTemporality = CUMULATIVE) -> Metric:
    return Metric("calls", "", "1", Sum(points, temporality, is_monotonic=True))


AT = 1_700_000_000_123 * MS + 456_789
"""A sample's time: 456,789 ns into its millisecond."""


@pytest.mark.parametrize("start", [AT - 456_789, AT - 1, AT, AT + 5 * MS], ids=["ms-start", "ns-before", "same",
                                                                                "after"])
def test_a_start_in_or_after_its_samples_millisecond_moves_to_the_millisecond_before(start):
    moved = _points(separate_starts(_data(_sum([_number(start, AT)]))))[0][1]
    assert moved == dataclasses.replace(_number(start, AT), start_time_unix_nano=(AT // MS - 1) * MS)


def test_histogram_starts_move_too():
    data = _data(Metric("turn", "", "1", HistogramData([_histogram(AT - 10, AT)], CUMULATIVE)))
    assert _points(separate_starts(data))[0][1].start_time_unix_nano == (AT // MS - 1) * MS


@pytest.mark.parametrize("metric", [
    _sum([_number(AT - MS + 1, AT), _number(AT - 3600 * 10**9, AT)]),  # an earlier millisecond
    _sum([_number(0, AT)]),  # no start known
    _sum([_number(AT, AT)], DELTA),
    Metric("level", "", "1", Gauge([_number(AT, AT)])),
], ids=["earlier", "unknown", "delta", "gauge"])
def test_points_that_need_nothing_are_exported_as_they_are(metric):
    data = _data(metric)
    assert separate_starts(data) is data


def test_only_the_points_that_need_it_change_and_every_other_field_is_kept():
    rng = random.Random(19)
    for _ in range(300):
        points = [_number(AT + rng.randint(-3 * MS, MS), AT + rng.randint(-MS, MS), value=i)
                  for i in range(rng.randint(1, 6))]
        metrics = [_sum(points[: len(points) // 2]), _sum(points[len(points) // 2:])]
        out = _points(separate_starts(_data(*metrics)))
        assert len(out) == len(points)
        for (metric, new), old in zip(out, points, strict=True):
            assert metric.name == "calls"
            assert dataclasses.replace(new, start_time_unix_nano=old.start_time_unix_nano) == old
            if old.start_time_unix_nano // MS < old.time_unix_nano // MS:
                assert new is old
            else:
                assert new.start_time_unix_nano // MS == old.time_unix_nano // MS - 1


def test_series_flushed_in_the_millisecond_they_start_reach_the_exporter_a_millisecond_older():
    """The SDK starts a series at its first measurement; a flush right after it shares its millisecond."""
    captured = Captured()
    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(SeparateStartsExporter(captured),
                                                                           export_interval_millis=3_600_000)],
                             shutdown_on_exit=False)
    counter = provider.get_meter("t").create_counter("calls")
    histogram = provider.get_meter("t").create_histogram("turn")
    try:
        for i in range(50):
            counter.add(1, {"series": i})
            histogram.record(3, {"series": i})
            assert provider.force_flush()
    finally:
        provider.shutdown()
    points = [p for data in captured.exports for _, p in _points(data)]
    assert len(points) >= 100
    assert all(p.start_time_unix_nano // MS < p.time_unix_nano // MS for p in points)


def test_the_wrapped_exporters_preferred_temporality_is_kept():
    captured = Captured(DELTA)
    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(SeparateStartsExporter(captured),
                                                                           export_interval_millis=3_600_000)],
                             shutdown_on_exit=False)
    provider.get_meter("t").create_counter("calls").add(1)
    provider.force_flush()
    provider.shutdown()
    assert [m.data.aggregation_temporality for data in captured.exports for m, _ in _points(data)] == [DELTA]


EDGES = [None, 0, 1, MS - 1, MS, MS + 1, 2 * MS - 1, 2 * MS, AT, AT + MS, -1, -MS, 1.5, float(AT), True, "123",
         2**63, 2**64 - 1]
"""Start and sample times at the edges: missing, unknown (0), in the epoch's first milliseconds,
ordinary, negative, not whole nanoseconds, not numbers, the top of OTLP's fixed64."""


def _encodable(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def _encode(data: MetricsData) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    return encode_metrics(data).SerializeToString()


@pytest.mark.parametrize("at", [1, MS // 2, MS - 1])
def test_a_sample_in_the_epochs_first_millisecond_keeps_its_start_and_its_batch_encodes(at):
    """The millisecond before would be negative: the whole batch failed to encode."""
    points = [_number(at, at), _number(AT, AT, value=2)]
    out = _points(separate_starts(_data(_sum(points))))
    assert out[0][1] is points[0]
    assert out[1][1].start_time_unix_nano == (AT // MS - 1) * MS
    _encode(separate_starts(_data(_sum(points))))


@pytest.mark.parametrize("field", ["time_unix_nano", "start_time_unix_nano"])
def test_a_point_missing_a_time_passes_through_unchanged(field):
    point = dataclasses.replace(_number(AT, AT), **{field: None})
    data = _data(_sum([point, _number(AT, AT, value=2)]))
    out = _points(separate_starts(data))
    assert out[0][1] is point and out[1][1].start_time_unix_nano == (AT // MS - 1) * MS


def test_any_start_and_sample_time_never_gives_a_negative_start_nor_breaks_the_batch():
    """Random points of cumulative sums and histograms with times from ``EDGES`` (and near them):
    a point is moved only when both times are whole nanoseconds, the start known and in or after
    its sample's millisecond, and the millisecond before is not before the epoch; every other point
    is the same object; and a batch whose times OTLP can carry still encodes."""
    rng = random.Random(33)
    near = [*EDGES, *(v + d for v in (MS, AT) for d in (-2, -1, 1, 2))]
    for _ in range(400):
        made = []
        for i in range(rng.randint(1, 5)):
            start, at = rng.choice(near), rng.choice(near)
            point = _number(AT, AT, value=i) if rng.random() < 0.6 else _histogram(AT, AT)
            made.append(dataclasses.replace(point, start_time_unix_nano=start, time_unix_nano=at))
        sums = [p for p in made if isinstance(p, NumberDataPoint)]
        histograms = [p for p in made if isinstance(p, HistogramDataPoint)]
        metrics = [_sum(sums)] if sums else []
        if histograms:
            metrics.append(Metric("turn", "", "1", HistogramData(histograms, CUMULATIVE)))
        data = _data(*metrics)
        out = [p for _, p in _points(separate_starts(data))]
        assert len(out) == len(made)
        for old, new in zip([*sums, *histograms], out, strict=True):
            start, at = old.start_time_unix_nano, old.time_unix_nano
            judged = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, at)) and start > 0
            if judged and at >= MS and start // MS >= at // MS:
                assert new.start_time_unix_nano == (at // MS - 1) * MS >= 0
                assert dataclasses.replace(new, start_time_unix_nano=start) == old
            else:
                assert new is old, (start, at)
        if all(_encodable(p.start_time_unix_nano) and _encodable(p.time_unix_nano) for p in made):
            _encode(separate_starts(data))
