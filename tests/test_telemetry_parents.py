"""Which span a turn and its calls hang under: a span the host records that is current when the turn
opens is the turn's (enriched); anything else current then (a remote parent from a W3C
``traceparent``, a span not recorded here) is the parent of turnguard's own turn span. The span a
turn was opened under is never taken for one of its calls' spans: an agent run as a tool (the host's
``execute_tool delegate`` current around the sub-agent's turn) gets one span per call under it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331


@contextmanager
def attached(ctx: Any) -> Iterator[None]:
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def remote_traceparent() -> Any:
    """What a host that continues an incoming request's trace attaches: a remote, sampled parent."""
    return TraceContextTextMapPropagator().extract({"traceparent": f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"})


def local_not_recorded() -> Any:
    """A valid span context the host does not record in this process (no remote flag)."""
    span = NonRecordingSpan(SpanContext(TRACE_ID, PARENT_ID, is_remote=False, trace_flags=TraceFlags(1)))
    return trace.set_span_in_context(span)


def drive(turn: tg.Turn, calls: int = 4) -> None:
    """Failing identical calls (a streak warning on a call span), then a cycle cap (on the turn's)."""
    for i in range(calls):
        call = tg.ToolCall("bash", {"cmd": "make"}, call_id=f"c{i}")
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.ERROR)
    for _ in range(3):
        turn.begin_cycle()


@pytest.mark.parametrize("parent", [remote_traceparent, local_not_recorded], ids=["remote", "not-recorded"])
def test_a_parent_the_host_does_not_record_gets_turnguards_turn_span_and_call_spans_under_it(otel, parent):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, max_cycles_per_turn=2, streak_warn_at=2,
                                    streak_stop_at=0), **otel.providers())
    with attached(parent()), guard.turn(agent_name="coder") as turn:
        drive(turn)
    spans = otel.spans()
    turn_span = otel.span("invoke_agent coder")
    assert turn_span.parent.span_id == PARENT_ID and turn_span.context.trace_id == TRACE_ID
    assert turn_span.attributes[n.TURN_ID] == turn.turn_id
    calls = [s for s in spans if s.name == "execute_tool bash"]
    assert len(calls) == turn.summary.tool_calls == 4
    assert {s.parent.span_id for s in calls} == {turn_span.context.span_id}
    assert sorted(s.attributes[n.CALL_INDEX] for s in calls) == [1, 2, 3, 4]
    ours = {s.context.span_id for s in spans}
    logs = otel.logs(n.LOOP_DETECTED_EVENT)
    assert {r.attributes[n.LOOP_THRESHOLD] for r in logs} == {"cycle_cap", "streak"}
    assert all(r.span_id in ours and r.trace_id == TRACE_ID for r in logs)  # never the parent's own id
    cycle = next(r for r in logs if r.attributes[n.LOOP_THRESHOLD] == "cycle_cap")
    assert cycle.span_id == turn_span.context.span_id


def test_an_unsampled_remote_parent_keeps_the_turn_unsampled(otel):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **otel.providers())
    unsampled = TraceContextTextMapPropagator().extract({"traceparent": f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-00"})
    with attached(unsampled), guard.turn(agent_name="coder") as turn:
        drive(turn, calls=2)
    assert otel.spans() == []  # the host's sampling decision stands (parent-based)
    assert len(otel.points(n.METRIC_TURN_TOOL_CALLS[0])) == 1


HOST_TOOL_SPANS = {
    "by-name": ("execute_tool delegate", {}),
    "by-operation": ("delegate to sub-agent", {n.GEN_AI_OPERATION_NAME: n.OP_EXECUTE_TOOL}),
}


@pytest.mark.parametrize("kind", HOST_TOOL_SPANS)
@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
def test_a_sub_agent_under_the_hosts_tool_span_gets_one_span_per_call(otel, kind, parallel):
    name, attributes = HOST_TOOL_SPANS[kind]
    tracer = otel.tracer_provider.get_tracer("host")
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **otel.providers())
    tools = ["read_file", "grep", "write_file", "grep"]
    with tracer.start_as_current_span(name, attributes=attributes) as delegate, guard.turn(agent_name="sub") as turn:
        calls = [tg.ToolCall(tool, {"i": i}, call_id=f"sub{i}") for i, tool in enumerate(tools)]
        if parallel:
            for c in calls:
                turn.check_call(c)
        for i, c in enumerate(calls):
            if not parallel:
                turn.check_call(c)
            turn.record_outcome(c, tg.Outcome.ERROR if i == 1 else tg.Outcome.OK)
    host = next(s for s in otel.spans() if s.context.span_id == delegate.get_span_context().span_id)
    assert host.attributes[n.TURN_ID] == turn.turn_id and host.attributes[n.TURN_TOOL_CALLS] == 4
    assert n.CALL_INDEX not in host.attributes and n.CALL_OUTCOME not in host.attributes
    children = [s for s in otel.spans() if s.parent is not None and s.parent.span_id == host.context.span_id]
    assert sorted((s.attributes[n.GEN_AI_TOOL_CALL_ID], s.name, s.attributes[n.CALL_INDEX],
                   s.attributes[n.CALL_OUTCOME]) for s in children) == [
        ("sub0", "execute_tool read_file", 1, "ok"), ("sub1", "execute_tool grep", 2, "error"),
        ("sub2", "execute_tool write_file", 3, "ok"), ("sub3", "execute_tool grep", 4, "ok")]


def test_a_sub_agents_own_tool_spans_are_still_enriched_not_duplicated(otel):
    tracer = otel.tracer_provider.get_tracer("host")
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **otel.providers())
    with tracer.start_as_current_span("execute_tool delegate"), guard.turn(agent_name="sub") as turn:
        for i in range(2):
            c = tg.ToolCall("grep", {"i": i})
            with tracer.start_as_current_span("execute_tool grep"):
                turn.check_call(c)
                turn.record_outcome(c, tg.Outcome.OK)
    grep = [s for s in otel.spans() if s.name == "execute_tool grep"]
    assert len(grep) == 2 and sorted(s.attributes[n.CALL_INDEX] for s in grep) == [1, 2]


def test_a_call_checked_under_another_span_than_the_turns_still_nests_there(otel):
    """The turn's own level is singled out by its span id only: a host step opened within the turn
    is still the parent of the calls checked under it."""
    tracer = otel.tracer_provider.get_tracer("host")
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **otel.providers())
    with (attached(remote_traceparent()), guard.turn(agent_name="coder") as turn,
          tracer.start_as_current_span("agent step") as step):
        c = tg.ToolCall("read", {})
        turn.check_call(c)
        turn.record_outcome(c, tg.Outcome.OK)
    assert otel.span("execute_tool read").parent.span_id == step.get_span_context().span_id


def test_without_any_span_current_the_turn_span_is_a_root(otel: InMemoryTelemetry):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **otel.providers())
    with guard.turn(agent_name="coder") as turn:
        drive(turn, calls=1)
    assert otel.span("invoke_agent coder").parent is None
    assert otel.span("execute_tool bash").parent.span_id == otel.span("invoke_agent coder").context.span_id
