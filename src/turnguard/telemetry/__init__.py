"""Reporting: OpenTelemetry spans, events and metrics, and the local JSONL recorder."""
