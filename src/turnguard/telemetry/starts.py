"""Cumulative points whose start falls in their sample's millisecond: the start moved a millisecond back.

Prometheus 3 with created-timestamp zero ingestion stores a point's start (OTLP
``StartTimeUnixNano``) as a 0 sample only when it is strictly older than the sample at its
millisecond resolution. The SDK starts a series at its first measurement, so a series first
exported within that millisecond loses its 0. That happens to a one-shot process's flush right
after its only turn or result, to a host that flushes after each call, and to a periodic export
just after a new label set's first call. The start-times rules would then count that series'
first sample as nothing. The series was also 0 a millisecond before its first measurement, so
moving the start there keeps the 0 and states nothing false.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Histogram,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    Sum,
)

MS = 1_000_000
"""Nanoseconds per millisecond, the store's resolution."""
_CUMULATIVE = (Sum, Histogram, ExponentialHistogram)


def _point(point: Any) -> Any:
    start, sample = point.start_time_unix_nano, point.time_unix_nano
    if start and start // MS >= sample // MS:
        return dataclasses.replace(point, start_time_unix_nano=(sample // MS - 1) * MS)
    return point


def _each(items: Any, field: str, change: Callable[[Any], Any]) -> Any:
    """``items`` with ``change`` applied to each one's ``field``; ``items`` itself when nothing changed."""
    out = []
    for item in items:
        old = getattr(item, field)
        new = change(old)
        out.append(item if new is old else dataclasses.replace(item, **{field: new}))
    return items if all(new is old for new, old in zip(out, items, strict=True)) else out


def _data(data: Any) -> Any:
    cumulative = isinstance(data, _CUMULATIVE) and data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    if not cumulative:
        return data
    points = [_point(p) for p in data.data_points]
    if all(new is old for new, old in zip(points, data.data_points, strict=True)):
        return data
    return dataclasses.replace(data, data_points=points)


def separate_starts(data: MetricsData) -> MetricsData:
    """``data`` with each cumulative point's start at least a millisecond before its sample (the
    same object when none needed moving)."""
    resources = _each(data.resource_metrics, "scope_metrics",
                      lambda scopes: _each(scopes, "metrics", lambda metrics: _each(metrics, "data", _data)))
    return data if resources is data.resource_metrics else dataclasses.replace(data, resource_metrics=resources)


class SeparateStartsExporter(MetricExporter):
    """A metric exporter that passes ``separate_starts(data)`` to the one it wraps."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        return self.inner.export(separate_starts(metrics_data), timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
