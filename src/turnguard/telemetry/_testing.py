"""In-memory OpenTelemetry SDK providers, for tests of turnguard's telemetry (ours and a host's).

``InMemoryTelemetry()`` holds a tracer, meter and logger provider whose spans, metric points and
log records stay in memory; ``Guard(config, **telemetry.providers())`` reports into them. Needs
``opentelemetry-sdk`` (the ``cli`` extra).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnguard.telemetry._setup import provider_keywords


class InMemoryTelemetry:
    """SDK providers with in-memory exporters and readers, and accessors for what they got."""

    def __init__(self, *, cardinality_limit: int | None = None) -> None:
        self.span_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.log_exporter = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.log_exporter))
        if cardinality_limit:
            # Any keys: the SDK's key type is a union of its instrument classes since 1.45, absent before.
            limits: dict[Any, int] = {Counter: cardinality_limit, Histogram: cardinality_limit}
            try:
                # SDK >= 1.45 has the keyword; mypy reads the installed SDK's signature, which may be older.
                self.metric_reader = InMemoryMetricReader(cardinality_limits=limits)  # type: ignore[call-arg,unused-ignore]
            except TypeError:  # SDK < 1.45 (the [otlp] extra allows 1.40) has no cardinality limit to raise
                self.metric_reader = InMemoryMetricReader()
        else:
            self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])

    def providers(self) -> dict[str, Any]:
        """Keyword arguments for ``Guard(...)``."""
        return provider_keywords(self)

    def spans(self) -> list[Any]:
        """Finished spans (``ReadableSpan``), in the order they ended."""
        return list(self.span_exporter.get_finished_spans())

    def span(self, name: str) -> Any:
        """The one finished span called ``name`` (fails loudly if there are none or several)."""
        found = [s for s in self.spans() if s.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one span {name!r}, got {len(found)}: {[s.name for s in self.spans()]}")
        return found[0]

    def logs(self, event_name: str | None = None) -> list[Any]:
        """Emitted log records (the SDK ``LogRecord``s), optionally only those with ``event_name``."""
        records = [r.log_record for r in self.log_exporter.get_finished_logs()]
        return [r for r in records if event_name is None or r.event_name == event_name]

    def metrics(self) -> dict[str, Any]:
        """The current metrics by name (each has ``unit``, ``description`` and ``data.data_points``)."""
        data = self.metric_reader.get_metrics_data()
        found: dict[str, Any] = {}
        if data is None:
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found[metric.name] = metric
        return found

    def points(self, metric: str) -> list[Any]:
        """The data points of one metric (empty when it has none yet)."""
        found = self.metrics().get(metric)
        return list(found.data.data_points) if found is not None else []

    def all_points(self) -> Iterator[tuple[str, Any]]:
        """Every (metric name, data point) pair."""
        for name, metric in self.metrics().items():
            for point in metric.data.data_points:
                yield name, point

    def clear(self) -> None:
        """Forget finished spans and log records (metrics are cumulative and stay)."""
        self.span_exporter.clear()
        self.log_exporter.clear()

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()
