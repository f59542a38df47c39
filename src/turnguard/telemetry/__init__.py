"""Reporting: OpenTelemetry spans, events and metrics, and the local JSONL recorder.

``configure()`` builds SDK providers from the standard ``OTEL_*`` environment variables for hosts
that have no OpenTelemetry setup of their own; it never installs globals unless asked.
"""

from turnguard.telemetry._setup import ExportSettings, Telemetry, TelemetryConfigError, configure, install_global

__all__ = ["ExportSettings", "Telemetry", "TelemetryConfigError", "configure", "install_global"]
