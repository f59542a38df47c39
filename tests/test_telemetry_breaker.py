"""The exporter circuit breaker: a dead collector stops costing encodes, a live one is used again."""

from __future__ import annotations

import logging

from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from turnguard.telemetry._breaker import Breaker, BreakerLogRecordExporter, BreakerSpanExporter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Flaky(SpanExporter):
    """An exporter that fails while ``down`` and counts the batches it was asked to send."""

    def __init__(self) -> None:
        self.down = True
        self.batches = 0

    def export(self, spans):
        self.batches += 1
        return SpanExportResult.FAILURE if self.down else SpanExportResult.SUCCESS


def test_failures_open_the_breaker_with_a_doubling_backoff(caplog):
    clock, inner = Clock(), Flaky()
    exporter = BreakerSpanExporter(inner, Breaker("span", clock=clock))
    with caplog.at_level(logging.WARNING, "turnguard.telemetry"):
        assert exporter.export([1, 2]) is SpanExportResult.FAILURE
    assert inner.batches == 1 and "dropping span for 1 s" in caplog.text
    for _ in range(5):  # open: dropped without reaching the exporter (no encoding)
        assert exporter.export([1, 2, 3]) is SpanExportResult.FAILURE
    assert inner.batches == 1 and exporter.breaker.dropped == 15
    clock.now += 1.01  # half-open: one probe, fails again, next backoff is 2 s
    assert exporter.export([1]) is SpanExportResult.FAILURE
    assert inner.batches == 2
    clock.now += 1.5
    exporter.export([1])
    assert inner.batches == 2
    clock.now += 0.6
    exporter.export([1])
    assert inner.batches == 3


def test_a_success_closes_the_breaker_and_resets_the_backoff():
    clock, inner = Clock(), Flaky()
    exporter = BreakerSpanExporter(inner, Breaker("span", clock=clock))
    exporter.export([1])
    clock.now += 1.01
    inner.down = False
    assert exporter.export([1]) is SpanExportResult.SUCCESS
    assert not exporter.breaker.is_open
    for _ in range(3):
        assert exporter.export([1]) is SpanExportResult.SUCCESS
    inner.down = True
    exporter.export([1])
    assert exporter.breaker._backoff == 2.0  # back to 1 s (then doubled for the next one)


def test_backoff_is_capped():
    clock = Clock()
    breaker = Breaker("span", clock=clock, max_open_s=4)
    for _ in range(6):
        breaker.record(False)
        clock.now += 100
    assert breaker._backoff == 4


def test_log_exporter_is_wrapped_the_same_way():
    class Logs:
        calls = 0

        def export(self, batch):
            Logs.calls += 1
            return LogRecordExportResult.FAILURE

    exporter = BreakerLogRecordExporter(Logs(), Breaker("log", clock=Clock()))
    assert exporter.export([1]) is LogRecordExportResult.FAILURE
    assert exporter.export([1]) is LogRecordExportResult.FAILURE
    assert Logs.calls == 1 and exporter.breaker.dropped == 1
