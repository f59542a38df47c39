"""Events: detections and escalation answers as log records, in the context of their span.

A ``turnguard.loop_detected`` or ``turnguard.escalation_resolved`` record is mirrored as an event
on its span; a shadow policy's ``turnguard.shadow.loop_detected`` is a log record only (INFO:
nothing was acted on). Records carry counts, limits, the tool name and the key digest, never
arguments or results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber

from turnguard.telemetry import names as n

if TYPE_CHECKING:
    from turnguard.model import LoopDetectedEvent, TurnSummary


def event_attributes(event: LoopDetectedEvent) -> dict[str, Any]:
    """The attributes of a ``turnguard.loop_detected`` record: what fired, the counts, no user data."""
    attrs: dict[str, Any] = {
        n.LOOP_THRESHOLD: str(event.threshold),
        n.LOOP_LEVEL: str(event.level),
        n.LOOP_ACTION: n.ACTION_LABELS[event.action],
        n.LOOP_LIMIT: event.limit,
        n.LOOP_TOOL_CALLS: event.tool_calls,
        n.LOOP_CYCLES: event.cycles,
        n.LOOP_MAX_KEY_REPEAT: event.max_key_repeat,
        n.LOOP_STREAK_LENGTH: event.streak_length,
        n.LOOP_FAILING_STREAK_LENGTH: event.failing_streak_length,
        n.LOOP_EVENT_ID: event.event_id,
        n.TURN_ID: event.turn_id,
        n.TURN_PROMPTABLE: event.promptable,
        n.CAP_MODE: event.cap_mode,
    }
    optional = (
        (n.LOOP_SOFT_CAP, event.soft_cap),
        (n.LOOP_HARD_CAP, event.hard_cap),
        (n.GEN_AI_TOOL_NAME, event.tool_name),
        (n.CALL_KEY_DIGEST, event.key_digest),
        (n.GEN_AI_AGENT_NAME, event.agent_name),
    )
    attrs.update((key, value) for key, value in optional if value is not None)
    return attrs


class EventLog:
    """Emits turnguard's events through one OpenTelemetry logger."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def loop_detected(self, event: LoopDetectedEvent, span: Any) -> None:
        attrs = event_attributes(event)
        self._emit(
            n.LOOP_DETECTED_EVENT, SeverityNumber.WARN,
            f"turnguard: {event.threshold} {event.level}: {attrs[n.LOOP_ACTION]}", attrs, span, mirror=True,
        )

    def escalation_resolved(self, event: LoopDetectedEvent, answer: str, span: Any) -> None:
        attrs = {
            n.LOOP_THRESHOLD: str(event.threshold),
            n.LOOP_LEVEL: str(event.level),
            n.LOOP_ACTION: event.action.label,
            n.ESCALATION_ANSWER: answer,
            n.LOOP_EVENT_ID: event.event_id,
            n.TURN_ID: event.turn_id,
        }
        self._emit(
            n.ESCALATION_RESOLVED_EVENT, SeverityNumber.INFO,
            f"turnguard: user answered {answer} to {event.threshold} {event.level}", attrs, span, mirror=True,
        )

    def turn_result(self, turn_id: str, summary: TurnSummary, resolved: bool, policy: str) -> None:
        """A result reported after the turn ended: its own record (the turn's span is long closed)."""
        attrs: dict[str, Any] = {
            n.TURN_ID: turn_id,
            n.TURN_RESOLVED: resolved,
            n.TURN_COHORT: str(summary.cohort),
            n.POLICY: policy,
            n.TURN_TOOL_CALLS: summary.tool_calls,
            n.LOOP_THRESHOLD: str(summary.threshold) if summary.threshold is not None else n.NO_THRESHOLD,
            n.TURN_OUTCOME: summary.reason,
        }
        if summary.agent_name is not None:
            attrs[n.GEN_AI_AGENT_NAME] = summary.agent_name
        self._emit(n.TURN_RESULT_EVENT, SeverityNumber.INFO,
                   f"turnguard: turn {turn_id} {'resolved' if resolved else 'not resolved'}", attrs, None)

    def shadow_detected(self, policy: str, event: LoopDetectedEvent, span: Any) -> None:
        attrs = {**event_attributes(event), n.SHADOW_POLICY: policy}
        self._emit(
            n.SHADOW_DETECTED_EVENT, SeverityNumber.INFO,
            f"turnguard shadow {policy}: would {event.action.label} ({event.threshold} {event.level})", attrs, span,
        )

    def _emit(
        self, name: str, severity: SeverityNumber, body: str, attrs: dict[str, Any], span: Any, *, mirror: bool = False
    ) -> None:
        """An event as a log record in ``span``'s context; ``mirror`` also adds it as a span event."""
        self.logger.emit(
            event_name=name,
            severity_number=severity,
            severity_text=severity.name,
            body=body,
            attributes=attrs,
            context=trace.set_span_in_context(span) if span is not None else None,
        )
        if mirror and span is not None and span.is_recording():
            span.add_event(name, attrs)
