"""A circuit breaker for OTLP exporters: a dead collector must cost the host next to nothing.

An OTLP exporter whose collector is down still encodes every batch (the expensive part, in pure
Python) before failing to send it, again and again, on the SDK's worker thread, which competes
with the host's threads for the GIL. After a failed export the breaker drops batches unencoded
for a while (1 s, doubling up to 30 s while failures continue), then lets one through to probe;
the first success closes it. What is dropped would have been lost anyway: the exporter only
fails after retrying for its whole timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from turnguard.telemetry._tally import ExportTally

log = logging.getLogger("turnguard.telemetry")

MIN_OPEN_S = 1.0
MAX_OPEN_S = 30.0


class Breaker:
    """Open after a failure, for a back-off that doubles while failures continue."""

    def __init__(self, name: str, *, min_open_s: float = MIN_OPEN_S, max_open_s: float = MAX_OPEN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.min_open_s = min_open_s
        self.max_open_s = max_open_s
        self._clock = clock
        self._open_until = 0.0
        self._backoff = min_open_s
        self._lock = threading.Lock()
        self.dropped = 0
        """Items dropped unencoded while open."""

    @property
    def is_open(self) -> bool:
        return self._clock() < self._open_until

    def allow(self, items: int) -> bool:
        """Whether to try an export of ``items`` now (counted as dropped when not)."""
        if self._clock() < self._open_until:
            with self._lock:
                self.dropped += items
            return False
        return True

    def record(self, ok: bool) -> None:
        with self._lock:
            if ok:
                if self._backoff > self.min_open_s:
                    log.info("turnguard: %s export works again", self.name)
                self._backoff = self.min_open_s
                self._open_until = 0.0
                return
            self._open_until = self._clock() + self._backoff
            log.warning("turnguard: %s export failed; dropping %s for %.0f s", self.name, self.name, self._backoff)
            self._backoff = min(self._backoff * 2, self.max_open_s)


class _BreakerExporter:
    """An exporter behind a ``Breaker``; the span and log versions differ only in their result type."""

    _NAME: str
    _SUCCESS: Any
    _FAILURE: Any

    def __init__(self, inner: Any, breaker: Breaker | None = None, *, tally: ExportTally | None = None) -> None:
        self.inner = inner
        self.breaker = breaker or Breaker(self._NAME)
        self.tally = tally

    def export(self, batch: Sequence[Any]) -> Any:
        result = self._FAILURE
        try:
            if self.breaker.allow(len(batch)):
                result = self.inner.export(batch)
                self.breaker.record(result is self._SUCCESS)
            return result
        finally:
            if self.tally is not None:
                self.tally.record(result is self._SUCCESS)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


class BreakerSpanExporter(_BreakerExporter, SpanExporter):
    """A span exporter behind a ``Breaker``."""

    _NAME, _SUCCESS, _FAILURE = "span", SpanExportResult.SUCCESS, SpanExportResult.FAILURE


class BreakerLogRecordExporter(_BreakerExporter, LogRecordExporter):
    """A log record exporter behind a ``Breaker``."""

    _NAME, _SUCCESS, _FAILURE = "log", LogRecordExportResult.SUCCESS, LogRecordExportResult.FAILURE
