"""Spans: the turn span ``invoke_agent {agent}`` and one child ``execute_tool {tool}`` per call.

A host that traces is enriched instead of duplicated: if a span the host records is current when
the turn opens, that span gets the turn's ``turnguard.*`` attributes (any other current span, e.g.
a remote parent from a ``traceparent``, is the parent of our turn span); if the current span at a
call is the host's own ``execute_tool`` span, that span gets the call's, unless it is the span the
turn was opened under (an agent run as a tool: its calls get their own spans). Spans are never made current by turnguard
(the hooks do not wrap the host's code), so per-call state is keyed by the ``ToolCall`` object
and parallel calls each get their own span.
"""

from __future__ import annotations

import threading
from time import time_ns
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import get_current
from opentelemetry.trace import SpanKind, Status, StatusCode

from turnguard._keys import cached_digest, cached_result, canonical_text
from turnguard._model import MAX_ID_LENGTH, Action, Outcome
from turnguard.hookspecs import hookimpl
from turnguard.telemetry import _names as n
from turnguard.telemetry._clock import turn_end_ns, turn_start_ns
from turnguard.telemetry._names import (  # the per-call names, bound once (no module lookup per call)
    ACTION_LABELS,
    CALL_CYCLE,
    CALL_INDEX,
    CALL_KEY_DIGEST,
    CALL_OUTCOME,
    CALL_REPEAT,
    CALL_RESULT_DIGEST,
    CALL_RETRIES,
    ERROR_TYPE,
    ERROR_TYPE_OTHER,
    FAILING_STREAK_LENGTH,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    OP_EXECUTE_TOOL,
    OUTCOME_VALUES,
    STREAK_LENGTH,
    VERDICT_ACTION,
    VERDICT_THRESHOLD,
)
from turnguard.telemetry._text import export_text

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from turnguard._ledger import Ledger
    from turnguard._model import LoopDetectedEvent, ToolCall, TurnSummary, Verdict

_ALLOW, _HALT, _ERROR = Action.ALLOW, Action.HALT, Outcome.ERROR
_DENIED_VALUE = OUTCOME_VALUES[Outcome.DENIED]
"""A halted call's outcome: the policy refused it, so it did not run (the recorder's ``denied``)."""
_INTERNAL = SpanKind.INTERNAL
_TOOL_SPAN_PREFIX = f"{OP_EXECUTE_TOOL} "
_ERROR_STATUS = Status(StatusCode.ERROR)
_PLAIN_TOOL_NAME = MAX_ID_LENGTH - len(_TOOL_SPAN_PREFIX)
"""The longest tool name that makes a span name within the bound as it is (ASCII ones)."""


class _CallSpan:
    """The span of one tool call: ours (``owned``, we end it) or the host's (enriched only).

    Created at the check, under the turn's lock, with the call's facts already in ``attributes``.
    Ours is started lazily: its start time and attributes are kept and the span is created when
    the outcome arrives, with everything in one go (one attribute pass instead of two, one dict
    per call), or earlier when something needs it to exist (a detection's event, a halt).
    ``failing`` is the failing-streak length captured when the outcome was decided (``None``
    until then, or when the guard did not decide it: a halted turn).
    """

    __slots__ = ("action", "attributes", "failing", "name", "owned", "parent", "span", "start_ns")

    def __init__(self, span: trace.Span | None, owned: bool, name: str, attributes: dict[str, Any] | None,
                 parent: Any, start_ns: int) -> None:
        self.span = span
        self.owned = owned
        self.action = _ALLOW
        self.name = name
        self.attributes = attributes
        self.parent = parent
        self.start_ns = start_ns
        self.failing: int | None = None


class _TurnState:
    """Per-turn span state: the turn-level span (ours or the host's) and the open call spans.

    ``tracing`` is false when the turn-level span does not record (no SDK, or sampled out): the
    per-call work is then skipped entirely, which is what makes the plugin nearly free without an
    SDK, and consistent with parent-based sampling (children of an unsampled turn are unsampled).
    """

    __slots__ = ("calls", "context", "cycle", "owned", "span", "tracing", "under")

    def __init__(self, span: trace.Span | None, owned: bool, under: int = 0) -> None:
        self.span = span
        self.cycle = 0
        """The model request the latest checked call's span named (``turnguard.call.cycle``)."""
        self.owned = owned
        self.under = under
        """The span id of the span current when the turn opened (0: none): the turn's own level, so
        never taken for a call's span or parent."""
        self.tracing = span is not None and span.is_recording()
        self.context = trace.set_span_in_context(span) if span is not None else None
        self.calls: dict[ToolCall, _CallSpan] = {}
        """Open call spans. Single dict operations are atomic, so no lock is needed: each key is
        touched by the thread deciding that call only."""


_ENDED = _CallSpan(None, False, "", None, None, 0)
"""In a turn's ``calls`` for a call whose span ended at its check (halted): a later outcome of it
has its span already, and is not one whose check ran elsewhere."""


def _is_tool_span(span: trace.Span) -> bool:
    """Whether the host's current span is its own ``execute_tool`` span (then we enrich it)."""
    name = getattr(span, "name", None)
    if isinstance(name, str) and (name == n.OP_EXECUTE_TOOL or name.startswith(_TOOL_SPAN_PREFIX)):
        return True
    attributes = getattr(span, "attributes", None)
    if not attributes:
        return False
    return attributes.get(n.GEN_AI_OPERATION_NAME) == n.OP_EXECUTE_TOOL


def _request_facts(state: _TurnState, turn: Ledger, attrs: dict[str, Any]) -> None:
    """The checked call's model request (on the first call of each) and retries (when any), for
    calibrate to place the requests and rollbacks where the live guard counted them."""
    if turn.cycles != state.cycle:
        attrs[CALL_CYCLE] = state.cycle = turn.cycles
    if turn.retries:
        attrs[CALL_RETRIES] = turn.retries


class _Deciding(threading.local):
    """Per thread: the ``(turn, call)`` whose check hooks ran last and whose observers have not
    yet (a detection fired in between belongs to that call's span)."""

    deciding: tuple[Ledger, ToolCall] | None = None


def content_text(args: Any) -> str:
    """Tool arguments as exported with ``capture_content``: text as given, anything else as JSON
    (cut to ``MAX_ID_LENGTH`` characters, like every exported string)."""
    if isinstance(args, str):
        return export_text(args)
    if isinstance(args, (bytes, bytearray, memoryview)):
        return export_text(bytes(args[: 4 * MAX_ID_LENGTH]).decode("utf-8", "replace"))
    return export_text(canonical_text(args))


def summary_attributes(summary: TurnSummary) -> dict[str, Any]:
    """The turn span's attributes at its end: how the turn ended and its counts."""
    attrs: dict[str, Any] = {
        n.TURN_OUTCOME: export_text(summary.reason),
        n.TURN_TOOL_CALLS: summary.tool_calls,
        n.TURN_CYCLES: summary.cycles,
        n.TURN_MAX_KEY_REPEAT: summary.max_key_repeat,
        n.TURN_MAX_FAILING_STREAK: summary.max_failing_streak,
        n.TURN_STUCK: summary.stuck,
        n.TURN_DETECTIONS: summary.detections,
        n.LOOP_THRESHOLD: export_text(summary.threshold) if summary.threshold is not None else n.NO_THRESHOLD,
        n.TURN_RESOLVED: n.RESOLVED_LABELS[summary.resolved],
    }
    if summary.first_stuck_call:
        attrs[n.TURN_FIRST_STUCK_CALL] = summary.first_stuck_call
    return attrs


def turn_attributes(turn: Ledger, *, host: bool, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """The turn span's attributes at its start (with ``policy``: the name and thresholds in force);
    a ``host`` span already has its GenAI names."""
    attrs: dict[str, Any] = {
        **(policy or {}),
        n.TURN_ID: export_text(turn.turn_id),
        n.TURN_COHORT: turn.cohort,
        n.TURN_PROMPTABLE: turn.promptable,
        n.CAP_MODE: turn.cap_mode,
    }
    if turn.resumed_from is not None:
        attrs[n.TURN_RESUMED_FROM] = turn.resumed_from
    if turn.fresh_state:
        attrs[n.TURN_FRESH_STATE] = list(turn.fresh_state)
    if turn.soft_cap is not None:
        attrs[n.LOOP_SOFT_CAP] = turn.soft_cap
    if turn.hard_cap is not None:
        attrs[n.LOOP_HARD_CAP] = turn.hard_cap
    if not host:
        attrs[n.GEN_AI_OPERATION_NAME] = n.OP_INVOKE_AGENT
        optional = ((n.GEN_AI_AGENT_NAME, turn.agent_name), (n.GEN_AI_CONVERSATION_ID, turn.conversation_id))
        attrs.update((key, text) for key, value in optional if value is not None and (text := export_text(value)))
    return attrs


class SpanReporter:
    """The span side of the OpenTelemetry plugin: the per-turn span state and the span-only hooks.

    Thread-safe: per-turn state is created under a lock, per-call state is keyed by the
    ``ToolCall`` object, and the facts of the call being decided are captured in the check hooks
    (which the guard runs under the turn's lock) into a thread-local, so parallel calls report
    their own index, repeat count and streak rather than whatever the ledger says later.
    """

    def __init__(self, tracer: trace.Tracer, *, capture_content: bool, policy: dict[str, Any] | None = None) -> None:
        self.tracer = tracer
        self.capture_content = capture_content
        self.policy = policy or {}
        """The policy's name and thresholds, on every turn span."""
        self._turns: dict[Ledger, _TurnState] = {}
        self._lock = threading.Lock()
        self._local = _Deciding()

    # -- turn state --------------------------------------------------------------------------

    def _state(self, turn: Ledger) -> _TurnState:
        state = self._turns.get(turn)
        if state is None:  # registered after the turn opened: report it without a turn span
            with self._lock:
                state = self._turns.setdefault(turn, _TurnState(None, owned=False))
        return state

    @hookimpl
    def turnguard_turn_started(self, turn: Ledger) -> None:
        current = trace.get_current_span()
        under = current.get_span_context()
        if under.is_valid and current.is_recording():
            current.set_attributes(turn_attributes(turn, host=True, policy=self.policy))
            state = _TurnState(current, owned=False, under=under.span_id)
        else:  # no span, or one the host does not record here (a remote parent): ours, its child
            agent = export_text(turn.agent_name) if turn.agent_name is not None else ""
            span = self.tracer.start_span(
                export_text(f"{n.OP_INVOKE_AGENT} {agent}") if agent else n.OP_INVOKE_AGENT,
                kind=SpanKind.INTERNAL,
                attributes=turn_attributes(turn, host=False, policy=self.policy),
                start_time=turn_start_ns(turn),
            )
            state = _TurnState(span, owned=True, under=under.span_id if under.is_valid else 0)
        turns = self._turns
        turns[turn] = state
        if len(turns) > n.MAX_OPEN_TURNS:
            self._abandon_oldest()

    def _abandon_oldest(self) -> None:
        with self._lock:
            try:
                oldest = next(iter(self._turns))
            except (StopIteration, RuntimeError):  # emptied, or changed size meanwhile: nothing to do now
                return
            state = self._turns.pop(oldest, None)
        if state is not None:
            self._close(state, {n.TURN_OUTCOME: n.TURN_ABANDONED})

    # -- per-call spans: the facts are captured in the check hooks, under the turn's lock ------
    #
    # The hot path. A call costs one ``_CallSpan`` and one attribute dict, built at the check;
    # ``call_checked`` adds nothing for an allowed call, and the span is started and ended at the
    # outcome with every attribute in a single pass.

    @hookimpl
    def turnguard_check_call(self, turn: Ledger, call: ToolCall) -> None:
        state = self._turns.get(turn)
        if state is not None and state.tracing:
            self._local.deciding = (turn, call)
            calls = state.calls
            if call not in calls:  # a call object checked again keeps the span of its first check
                calls[call] = self._new_call_span(state, turn, call)

    @hookimpl
    def turnguard_check_outcome(self, turn: Ledger, call: ToolCall, outcome: Outcome) -> None:
        state = self._turns.get(turn)
        if state is not None and state.tracing:
            self._local.deciding = (turn, call)
            entry = state.calls.get(call)
            if entry is None:  # checked elsewhere (before a resume): its outcome's facts are known here
                entry = state.calls[call] = self._new_call_span(state, turn, call, checked=False)
            if entry is not _ENDED:
                entry.failing = turn.failing_streak_length

    def _decided_call(self, turn: Ledger) -> ToolCall | None:
        """The call this thread is deciding for ``turn`` right now (for an event's span)."""
        deciding = self._local.deciding
        return deciding[1] if deciding is not None and deciding[0] is turn else None

    def _new_call_span(self, state: _TurnState, turn: Ledger, call: ToolCall, *, checked: bool = True) -> _CallSpan:
        """The call's span with its facts read from the ledger now: ours (deferred) or, for a host
        that traces its tool calls, the host's current ``execute_tool`` span, enriched.

        Facts at their default value are left out (repeat 1, streak 1): an absent attribute means
        the default, which keeps the common call's span small. Not ``checked`` (its check ran
        before a resume, in another process, or before this plugin was registered), the ledger's
        facts now are another call's: the span has the call's own key only, no index, repeat or
        streak."""
        attrs: dict[str, Any] = {CALL_INDEX: turn.tool_calls} if checked else {}
        digest = cached_digest(call)
        if digest is not None:
            attrs[CALL_KEY_DIGEST] = digest.hex()
            repeat = turn.repeats_of(digest) if checked else 1
            if repeat > 1:
                attrs[CALL_REPEAT] = repeat
        streak = turn.streak_length if checked else 1
        if streak > 1:
            attrs[STREAK_LENGTH] = streak
        if checked:
            _request_facts(state, turn, attrs)
        context = get_current()
        current = trace.get_current_span(context) if context else None  # an empty context holds no span
        parent: Context | None = state.context
        if current is not None:
            span_context = current.get_span_context()
            if span_context.is_valid and span_context.span_id != state.under:  # not the turn's own level
                if _is_tool_span(current):
                    if current.is_recording():
                        current.set_attributes(attrs)
                    return _CallSpan(current, False, "", None, None, 0)
                parent = context  # the host's current span (an agent step) is the parent
        name = call.name
        if type(name) is str and name.isascii() and len(name) <= _PLAIN_TOOL_NAME:
            attrs[GEN_AI_TOOL_NAME] = name
            span_name = _TOOL_SPAN_PREFIX + name
        else:  # model text: made encodable and bounded (``telemetry.text``)
            attrs[GEN_AI_TOOL_NAME] = export_text(name)
            span_name = export_text(_TOOL_SPAN_PREFIX + str.__str__(name))
        attrs[GEN_AI_OPERATION_NAME] = OP_EXECUTE_TOOL
        call_id = call.call_id
        if call_id is not None:
            attrs[GEN_AI_TOOL_CALL_ID] = export_text(call_id)
        if self.capture_content:
            attrs[GEN_AI_TOOL_CALL_ARGUMENTS] = content_text(call.args)
        return _CallSpan(None, True, span_name, attrs, parent, time_ns())

    def _call_span(self, state: _TurnState, turn: Ledger, call: ToolCall) -> _CallSpan:
        """The call's span; made now, without the check's facts, if the check hook did not run for
        it here (checked before a resume, or before the plugin was registered)."""
        entry = state.calls.get(call)
        if entry is None:
            entry = state.calls[call] = self._new_call_span(state, turn, call, checked=False)
        return entry

    def _started(self, entry: _CallSpan, extra: dict[str, Any] | None = None) -> trace.Span:
        """The entry's span, created now (with ``extra`` attributes) if it was deferred."""
        span = entry.span
        if span is None:
            attrs = entry.attributes
            assert attrs is not None  # kept until the span starts
            if extra:
                attrs.update(extra)
            span = entry.span = self.tracer.start_span(
                entry.name, context=entry.parent, kind=_INTERNAL, attributes=attrs, start_time=entry.start_ns
            )
            entry.attributes = entry.parent = None
        elif extra and span.is_recording():
            span.set_attributes(extra)
        return span

    @hookimpl
    def turnguard_call_checked(self, turn: Ledger, call: ToolCall, verdict: Verdict) -> None:
        state = self._turns.get(turn)
        if state is None or not state.tracing:
            return
        self._local.deciding = None
        entry = self._call_span(state, turn, call)
        if entry is _ENDED:
            return
        action, threshold = verdict.action, verdict.threshold
        if action is entry.action and threshold is None and action is not _HALT:
            return  # the common case, an allowed call: nothing to add before its outcome
        extra: dict[str, Any] = {}
        if action is not entry.action:  # its span was started by a detection with the event's action
            extra[VERDICT_ACTION] = ACTION_LABELS[action]
            entry.action = action
        if threshold is not None:
            extra[VERDICT_THRESHOLD] = export_text(threshold)
        if action is _HALT:  # the host will not execute it: the span ends here, refused
            extra[CALL_OUTCOME] = _DENIED_VALUE
            state.calls[call] = _ENDED
            span = self._started(entry, extra)
            if entry.owned:
                span.end()
        elif entry.span is None:
            assert entry.attributes is not None  # kept until the span starts
            entry.attributes.update(extra)
        elif entry.span.is_recording():
            entry.span.set_attributes(extra)

    @hookimpl
    def turnguard_outcome_recorded(self, turn: Ledger, call: ToolCall, outcome: Outcome, verdict: Verdict) -> None:
        state = self._turns.get(turn)
        if state is None or not state.tracing:
            return
        self._local.deciding = None
        entry = state.calls.pop(call, None)
        if entry is None:  # its check ran elsewhere and no check-outcome hook saw it here
            entry = self._new_call_span(state, turn, call, checked=False)
        elif entry is _ENDED:
            return
        span = entry.span
        if span is None:  # deferred: the outcome joins the check's dict
            attrs = entry.attributes
            assert attrs is not None  # kept until the span starts
        else:
            attrs = {}
        attrs[CALL_OUTCOME] = OUTCOME_VALUES[outcome]
        result = cached_result(call)
        if result is not None:  # the recorder line's ``result``: the digest, never the result
            attrs[CALL_RESULT_DIGEST] = result.hex()
        failing = entry.failing
        if failing is not None:  # the guard decided this outcome: what it found
            if failing:
                attrs[FAILING_STREAK_LENGTH] = failing
            action = verdict.action
            if verdict.event is not None or action > entry.action:
                attrs[VERDICT_ACTION] = ACTION_LABELS[max(action, entry.action)]
                if verdict.threshold is not None:
                    attrs[VERDICT_THRESHOLD] = export_text(verdict.threshold)
        error = outcome is _ERROR and entry.owned
        if error:
            attrs[ERROR_TYPE] = ERROR_TYPE_OTHER
        if span is None:  # the common case: started and ended here, with every attribute in one pass
            span = self.tracer.start_span(
                entry.name, context=entry.parent, kind=_INTERNAL, attributes=attrs, start_time=entry.start_ns
            )
        elif span.is_recording():
            span.set_attributes(attrs)
        if error:
            span.set_status(_ERROR_STATUS)
        if entry.owned:
            span.end()

    @hookimpl
    def turnguard_retry(self, turn: Ledger) -> None:
        """The request's calls are rolled back, the first of them may have named its request: the
        next call names it again (its span replaces theirs in calibrate's reading)."""
        state = self._turns.get(turn)
        if state is not None:
            state.cycle = -1

    @hookimpl
    def turnguard_cycle_checked(self, turn: Ledger, verdict: Verdict) -> None:
        state = self._turns.get(turn)
        if state is not None and state.tracing and state.span is not None:  # tracing: a span records
            state.span.set_attribute(n.TURN_CYCLES, turn.cycles)

    # -- the spans other signals are reported in -------------------------------------------------

    def detection_span(self, turn: Ledger, event: LoopDetectedEvent) -> Any:
        """The span a detection belongs to: the call being decided (started now, with the event's
        action), else the host's current span, else the turn span."""
        state = self._state(turn)
        span: trace.Span | None = None
        call = self._decided_call(turn) if state.tracing and event.tool_name is not None else None
        entry = self._call_span(state, turn, call) if call is not None and call.name == event.tool_name else _ENDED
        if entry is not _ENDED:
            extra = None
            if event.action > entry.action:
                entry.action = event.action
                extra = {VERDICT_ACTION: ACTION_LABELS[event.action]}
            span = self._started(entry, extra)
        if span is None:
            current = trace.get_current_span()
            span_context = current.get_span_context()
            span = current if span_context.is_valid and span_context.span_id != state.under else state.span
        return span

    def turn_span(self, turn: Ledger) -> Any:
        """The turn-level span (ours or the host's), ``None`` when the turn is not tracked."""
        state = self._turns.get(turn)
        return state.span if state is not None else None

    # -- the end of a turn ---------------------------------------------------------------------

    def end_turn(self, turn: Ledger, summary: TurnSummary) -> None:
        """Close the turn's spans with how it ended."""
        with self._lock:
            state = self._turns.pop(turn, None)
        if state is not None:
            self._close(state, summary_attributes(summary), error=summary.reason == "error",
                        end_ns=turn_end_ns(turn, summary))

    def _close(self, state: _TurnState, attrs: dict[str, Any], *, error: bool = False,
               end_ns: int | None = None) -> None:
        """End the turn's open call spans (``unfinished``) and, if it is ours, the turn span, at
        ``end_ns`` (the recorder line's end too; ``None``: now)."""
        leftovers, state.calls = state.calls, {}
        for entry in leftovers.values():
            if entry.owned:
                self._started(entry, {n.CALL_OUTCOME: n.CALL_UNFINISHED}).end(end_time=end_ns)
        span = state.span
        if span is None:
            return
        if span.is_recording():
            if state.owned and error:
                attrs[n.ERROR_TYPE] = n.ERROR_TYPE_OTHER
                span.set_status(_ERROR_STATUS)
            span.set_attributes(attrs)
        if state.owned:
            span.end(end_time=end_ns)
