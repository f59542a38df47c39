"""The exports that failed, counted across the signals: no SDK import, so the set-up module
holds one before it builds any exporter."""

from __future__ import annotations

import threading


class ExportTally:
    """How many exports failed so far, across the signals (the circuit breaker's drops count as
    failures): what a process that must know its data left asks after ``Telemetry.shutdown()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failed = 0

    def record(self, ok: bool) -> None:
        if not ok:
            with self._lock:
                self.failed += 1
