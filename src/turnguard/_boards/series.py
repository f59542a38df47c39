"""turnguard's metric and label names as Prometheus stores them, for the rules and the boards.

The OpenTelemetry -> Prometheus translation of ``turnguard.telemetry._names``: dots to underscores,
``{unit}`` dropped, ``_total`` on counters, ``_bucket/_sum/_count`` on histograms. The recording
rules (``rules``), the PromQL forms (``promql``) and the panels (``halts``, ``thresholds``,
``evidence``, ``panels``) all read them here.
"""

from __future__ import annotations

from turnguard.telemetry import _names as n


def label(attribute: str) -> str:
    """``turnguard.loop.threshold`` -> ``turnguard_loop_threshold``."""
    return attribute.replace(".", "_")


def counter(metric: tuple[str, str]) -> str:
    return label(metric[0]) + "_total"


def histogram(metric: tuple[str, str]) -> str:
    return label(metric[0])


def count_and_sum(histogram_name: str) -> tuple[str, str]:
    """A histogram's ``_count`` series (its observations) and ``_sum`` series (their total)."""
    return f"{histogram_name}_count", f"{histogram_name}_sum"


TOOL_CALLS = histogram(n.METRIC_TURN_TOOL_CALLS)
TURNS, CALLS = count_and_sum(TOOL_CALLS)
"""Every ended turn records one tool-calls observation: the histogram's count counts turns."""
CYCLES = histogram(n.METRIC_TURN_CYCLES)
"""Model requests per turn (the cycle cap's count): its buckets place a probe turn against each cycle cap."""
MAX_REPEAT = histogram(n.METRIC_TURN_MAX_KEY_REPEAT)
MAX_FAILING = histogram(n.METRIC_TURN_MAX_FAILING_STREAK)
"""The longest failing identical-call streak per turn: its buckets place a probe turn against each streak stop."""
FIRST_STUCK = histogram(n.METRIC_TURN_FIRST_STUCK_CALL)
DETECTIONS = counter(n.METRIC_DETECTIONS)
ANSWERS = counter(n.METRIC_ESCALATION_ANSWERS)
PLUGIN_ERRORS = counter(n.METRIC_PLUGIN_ERRORS)
SHADOW_DETECTIONS = counter(n.METRIC_SHADOW_DETECTIONS)
SHADOW_TOOL_CALLS = histogram(n.METRIC_SHADOW_TURN_TOOL_CALLS)
SHADOW_TURNS, SHADOW_CALLS = count_and_sum(SHADOW_TOOL_CALLS)
"""Every shadow policy records one observation per live turn: the count counts turns per policy."""
RESULTS = counter(n.METRIC_TURN_RESULTS)
CALLS_PAST_MAIN = counter(n.METRIC_PROBE_CALLS_PAST_MAIN)
RESULT_RESTARTS = counter(n.METRIC_STREAK_RESULT_RESTARTS)
"""Streaks of ``stateful_tools`` a changed result restarted, by tool (counted when the turn ends)."""
OTELCOL_ACCEPTED = "otelcol_receiver_accepted_metric_points_total"
OTELCOL_REFUSED = "otelcol_receiver_refused_metric_points_total"
OTELCOL_SEND_FAILED = {signal: f"otelcol_exporter_send_failed_{signal}_total"
                       for signal in ("metric_points", "spans", "log_records")}
OTELCOL_QUEUE_SIZE, OTELCOL_QUEUE_CAPACITY = "otelcol_exporter_queue_size", "otelcol_exporter_queue_capacity"
"""The Collector's own metrics (collector-config.yaml exports them for Prometheus to scrape)."""

OUTCOME = label(n.TURN_OUTCOME)
THRESHOLD = label(n.LOOP_THRESHOLD)
LEVEL = label(n.LOOP_LEVEL)
ACTION = label(n.LOOP_ACTION)
CAP_MODE = label(n.CAP_MODE)
STUCK = label(n.TURN_STUCK)
PAST_SOFT_CAP = label(n.TURN_PAST_SOFT_CAP)
PROMPTABLE = label(n.TURN_PROMPTABLE)
AGENT = label(n.GEN_AI_AGENT_NAME)
TOOL = label(n.GEN_AI_TOOL_NAME)
ANSWER = label(n.ESCALATION_ANSWER)
SHADOW_POLICY = label(n.SHADOW_POLICY)
POLICY = label(n.POLICY)
"""The policy's name (``GuardConfig.name``) on every metric point: the config-change annotations and
the ``policy`` variable follow it."""
COHORT = label(n.TURN_COHORT)
RESOLVED = label(n.TURN_RESOLVED)
RESULT_STATUS = label(n.RESULT_STATUS)
CALLS_BUCKET = label(n.TURN_CALLS_BUCKET)
MAIN_THRESHOLD = label(n.PROBE_MAIN_THRESHOLD)
REPEAT_BUCKET = label(n.TURN_MAX_KEY_REPEAT_BUCKET)
FAILING_BUCKET = label(n.TURN_MAX_FAILING_STREAK_BUCKET)

NOT_HALTED = {THRESHOLD: n.NO_THRESHOLD}
HALTED = {THRESHOLD: f"!{n.NO_THRESHOLD}"}
"""Turns with no halt and with one, by the threshold label (``promql.sel`` form): a halted turn the
host ended its own way (its own exception, ``end("cancelled")``, a reason of its own) has that
outcome, not ``halted``, but keeps its threshold. Every panel, record and alert that means "halted"
selects by these, never by ``turnguard_turn_outcome="halted"``."""
