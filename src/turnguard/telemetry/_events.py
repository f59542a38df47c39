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

from turnguard._probe import COHORTS
from turnguard.telemetry import _names as n
from turnguard.telemetry._text import export_text

if TYPE_CHECKING:
    from turnguard._model import LoopDetectedEvent
    from turnguard._task_results import ResultLabels


def event_attributes(event: LoopDetectedEvent) -> dict[str, Any]:
    """The attributes of a ``turnguard.loop_detected`` record: what fired, the counts, no user data."""
    attrs: dict[str, Any] = {
        n.LOOP_THRESHOLD: export_text(event.threshold),
        n.LOOP_LEVEL: export_text(event.level),
        n.LOOP_ACTION: n.ACTION_LABELS[event.action],
        n.LOOP_LIMIT: event.limit,
        n.LOOP_TOOL_CALLS: event.tool_calls,
        n.LOOP_CYCLES: event.cycles,
        n.LOOP_MAX_KEY_REPEAT: event.max_key_repeat,
        n.LOOP_STREAK_LENGTH: event.streak_length,
        n.LOOP_FAILING_STREAK_LENGTH: event.failing_streak_length,
        n.LOOP_EVENT_ID: export_text(event.event_id),
        n.TURN_ID: export_text(event.turn_id),
        n.TURN_PROMPTABLE: event.promptable,
        n.CAP_MODE: event.cap_mode,
    }
    caps = ((n.LOOP_SOFT_CAP, event.soft_cap), (n.LOOP_HARD_CAP, event.hard_cap))
    attrs.update((key, value) for key, value in caps if value is not None)
    texts = ((n.GEN_AI_TOOL_NAME, event.tool_name), (n.CALL_KEY_DIGEST, event.key_digest),
             (n.GEN_AI_AGENT_NAME, event.agent_name))
    attrs.update((key, export_text(value)) for key, value in texts if value is not None)
    return attrs


class EventLog:
    """Emits turnguard's events through one OpenTelemetry logger."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def loop_detected(self, event: LoopDetectedEvent, span: Any) -> None:
        attrs = event_attributes(event)
        self._emit(
            n.LOOP_DETECTED_EVENT, SeverityNumber.WARN,
            f"turnguard: {attrs[n.LOOP_THRESHOLD]} {attrs[n.LOOP_LEVEL]}: {attrs[n.LOOP_ACTION]}", attrs, span,
            mirror=True,
        )

    def escalation_resolved(self, event: LoopDetectedEvent, answer: str, span: Any) -> None:
        attrs = {
            n.LOOP_THRESHOLD: export_text(event.threshold),
            n.LOOP_LEVEL: export_text(event.level),
            n.LOOP_ACTION: event.action.label,
            n.ESCALATION_ANSWER: export_text(answer),
            n.LOOP_EVENT_ID: export_text(event.event_id),
            n.TURN_ID: export_text(event.turn_id),
        }
        self._emit(
            n.ESCALATION_RESOLVED_EVENT, SeverityNumber.INFO,
            f"turnguard: user answered {attrs[n.ESCALATION_ANSWER]} to {attrs[n.LOOP_THRESHOLD]} "
            f"{attrs[n.LOOP_LEVEL]}", attrs, span, mirror=True,
        )

    def turn_result(self, labels: ResultLabels, resolved: bool) -> None:
        """A result reported after the turn ended (here or, with its token, in another process):
        its own record (the turn's span is long closed). A label the token had no room for, or a
        cohort that is none of turnguard's, is the overflow value."""
        dropped = labels.dropped

        def text(name: str, value: str | None, absent: str | None) -> str | None:
            return n.OVERFLOW_VALUE if name in dropped else absent if value is None else export_text(value)

        cohort = labels.cohort if labels.cohort in COHORTS else n.OVERFLOW_VALUE
        attrs: dict[str, Any] = {
            n.TURN_ID: export_text(labels.turn_id),
            n.TURN_RESOLVED: resolved,
            n.TURN_COHORT: cohort,
            n.POLICY: text("policy", labels.policy, n.OVERFLOW_VALUE),
            n.TURN_TOOL_CALLS: labels.tool_calls,
            n.LOOP_THRESHOLD: text("threshold", labels.threshold, n.NO_THRESHOLD),
            n.TURN_OUTCOME: text("reason", labels.reason, n.OVERFLOW_VALUE),
        }
        if cohort == "probe":
            attrs[n.PROBE_MAIN_THRESHOLD] = text("main_threshold", labels.main_threshold, n.NO_THRESHOLD)
        if labels.max_key_repeat is not None:
            attrs[n.TURN_MAX_KEY_REPEAT] = labels.max_key_repeat
        if labels.max_failing_streak is not None:
            attrs[n.TURN_MAX_FAILING_STREAK] = labels.max_failing_streak
        agent = text("agent_name", labels.agent_name, None)
        if agent is not None:
            attrs[n.GEN_AI_AGENT_NAME] = agent
        self._emit(n.TURN_RESULT_EVENT, SeverityNumber.INFO,
                   f"turnguard: turn {attrs[n.TURN_ID]} {'resolved' if resolved else 'not resolved'}", attrs, None,
                   timestamp=labels.reported_ns)

    def shadow_detected(self, policy: str, event: LoopDetectedEvent, span: Any) -> None:
        attrs = {**event_attributes(event), n.SHADOW_POLICY: export_text(policy)}
        self._emit(
            n.SHADOW_DETECTED_EVENT, SeverityNumber.INFO,
            f"turnguard shadow {attrs[n.SHADOW_POLICY]}: would {event.action.label} ({attrs[n.LOOP_THRESHOLD]} "
            f"{attrs[n.LOOP_LEVEL]})", attrs, span,
        )

    def _emit(
        self, name: str, severity: SeverityNumber, body: str, attrs: dict[str, Any], span: Any, *, mirror: bool = False,
        timestamp: int | None = None,
    ) -> None:
        """An event as a log record in ``span``'s context, at ``timestamp`` (Unix nanoseconds) when
        the event names its own instant; ``mirror`` also adds it as a span event."""
        self.logger.emit(
            timestamp=timestamp,
            event_name=name,
            severity_number=severity,
            severity_text=severity.name,
            body=export_text(body),
            attributes=attrs,
            context=trace.set_span_in_context(span) if span is not None else None,
        )
        if mirror and span is not None and span.is_recording():
            span.add_event(name, attrs)
