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
from typing import TYPE_CHECKING, Any, TypeGuard

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Histogram,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    Sum,
)

if TYPE_CHECKING:
    from turnguard.telemetry._tally import ExportTally

MS = 1_000_000
"""Nanoseconds per millisecond, the store's resolution."""
_CUMULATIVE = (Sum, Histogram, ExponentialHistogram)


def _cumulative(metric: Any) -> bool:
    data = getattr(metric, "data", None)
    return (isinstance(data, _CUMULATIVE) and data.aggregation_temporality == AggregationTemporality.CUMULATIVE
            and dataclasses.is_dataclass(metric) and isinstance(data.data_points, (list, tuple)))


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _needs_moving(point: Any) -> bool:
    """Whether ``point``'s start is in or after its sample's millisecond and can move a millisecond
    back. A point this cannot judge is left as it is: a time that is missing or not a whole number
    of nanoseconds, a start of 0 (unknown), or a sample in the epoch's first millisecond, whose
    millisecond before would be a negative time (which no OTLP encoder writes)."""
    start = getattr(point, "start_time_unix_nano", None)
    at = getattr(point, "time_unix_nano", None)
    if not _whole(start) or not _whole(at) or start <= 0 or at < MS:
        return False
    return start // MS >= at // MS and dataclasses.is_dataclass(point) and not isinstance(point, type)


def _point(point: Any) -> Any:
    if not _needs_moving(point):
        return point
    return dataclasses.replace(point, start_time_unix_nano=(point.time_unix_nano // MS - 1) * MS)


def _metric(metric: Any) -> Any:
    if not _cumulative(metric):
        return metric
    return dataclasses.replace(metric, data=dataclasses.replace(
        metric.data, data_points=[_point(p) for p in metric.data.data_points]))


def separate_starts(data: MetricsData) -> MetricsData:
    """``data`` with each cumulative point's start at least a millisecond before its sample: the
    same object when none needs moving (nearly every export), else rebuilt around the moved points.
    Never a negative start; a point whose times it cannot judge passes through unchanged."""
    metrics = [m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics if _cumulative(m)]
    if not any(_needs_moving(p) for m in metrics for p in m.data.data_points):
        return data
    return dataclasses.replace(data, resource_metrics=[
        dataclasses.replace(r, scope_metrics=[dataclasses.replace(s, metrics=[_metric(m) for m in s.metrics])
                                              for s in r.scope_metrics])
        for r in data.resource_metrics])


class SeparateStartsExporter(MetricExporter):
    """A metric exporter that passes ``separate_starts(data)`` to the one it wraps (each result
    counted in ``tally`` when given)."""

    def __init__(self, inner: MetricExporter, tally: ExportTally | None = None) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self.tally = tally

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        result = MetricExportResult.FAILURE
        try:
            result = self.inner.export(separate_starts(metrics_data), timeout_millis=timeout_millis, **kwargs)
            return result
        finally:
            if self.tally is not None:
                self.tally.record(result is MetricExportResult.SUCCESS)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
