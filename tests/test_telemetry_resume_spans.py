"""Calls checked before a snapshot whose outcomes come after the resume: each outcome gets a span
with that call's own facts (its id, key digest, outcome, what the guard decided at the outcome) and
none of the check's facts, which the resuming process does not have (never another call's index,
repeat count or streak). Calls checked after the resume get every fact as usual."""

from __future__ import annotations

import json

import pytest
from opentelemetry.trace import StatusCode

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry

CHECK_FACTS = (n.CALL_INDEX, n.CALL_REPEAT, n.STREAK_LENGTH)


def guard(otel: InMemoryTelemetry) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(load_entrypoints=False), **otel.providers())


@pytest.mark.parametrize("outcome", list(tg.Outcome))
@pytest.mark.parametrize("same_guard", [False, True], ids=["another-process", "same-guard"])
def test_outcomes_after_a_resume_get_a_span_with_their_own_facts_only(otel, outcome, same_guard):
    first = guard(otel)
    turn = first.turn(durable=True, agent_name="coder")
    waiting = [tg.ToolCall("bash", {"cmd": "make"}, call_id=f"a{i}") for i in range(6)]
    waiting.append(tg.ToolCall("read", {"path": "x"}, call_id="b"))
    for call in waiting:
        assert not turn.check_call(call).halted
    state = json.loads(json.dumps(turn.suspend()))
    before = {s.attributes[n.GEN_AI_TOOL_CALL_ID]: s for s in otel.spans() if s.name.startswith("execute_tool")}
    assert {s.attributes[n.CALL_OUTCOME] for s in before.values()} == {n.CALL_UNFINISHED}
    otel.clear()
    resumed = (first if same_guard else guard(otel)).resume(state)
    for call in reversed(waiting):  # any order: each call is found by its id
        resumed.record_outcome(tg.ToolCall(call.name, call.args, call_id=call.call_id), outcome)
    after = tg.ToolCall("grep", {"q": 1}, call_id="c")
    resumed.check_call(after)
    resumed.record_outcome(after, tg.Outcome.OK)
    resumed.end()
    spans = {s.attributes[n.GEN_AI_TOOL_CALL_ID]: s for s in otel.spans() if s.name.startswith("execute_tool")}
    assert sorted(spans) == sorted([c.call_id for c in waiting] + ["c"])  # one span per outcome, none merged
    for call in waiting:
        span = spans[call.call_id]
        assert span.name == f"execute_tool {call.name}"
        assert span.attributes[n.CALL_OUTCOME] == outcome.value
        assert span.attributes[n.CALL_KEY_DIGEST] == before[call.call_id].attributes[n.CALL_KEY_DIGEST]
        assert not set(CHECK_FACTS) & set(span.attributes), span.attributes
        assert (span.status.status_code is StatusCode.ERROR) == (outcome is tg.Outcome.ERROR)
        assert span.parent.span_id == otel.span("invoke_agent coder").context.span_id
    assert spans["c"].attributes[n.CALL_INDEX] == len(waiting) + 1  # checked here: every fact


def test_a_detection_on_an_outcome_after_a_resume_lands_on_that_calls_span(otel):
    first = guard(otel)
    turn = first.turn(durable=True)
    calls = [tg.ToolCall("bash", {"cmd": "make"}, call_id=f"a{i}") for i in range(8)]
    for call in calls:
        turn.check_call(call)
    state = json.loads(json.dumps(turn.suspend()))
    otel.clear()
    resumed = guard(otel).resume(state)
    verdicts = [resumed.record_outcome(tg.ToolCall("bash", {"cmd": "make"}, call_id=c.call_id), tg.Outcome.ERROR)
                for c in calls]
    resumed.end()
    assert verdicts[-1].threshold == "streak"
    last = next(s for s in otel.spans() if s.attributes.get(n.GEN_AI_TOOL_CALL_ID) == "a7")
    assert last.attributes[n.VERDICT_ACTION] == "halt" and last.attributes[n.FAILING_STREAK_LENGTH] == 8
    assert not set(CHECK_FACTS) & set(last.attributes)
    stop = [r for r in otel.logs(n.LOOP_DETECTED_EVENT) if r.attributes[n.LOOP_LEVEL] == "stop"]
    assert [r.span_id for r in stop] == [last.context.span_id]
