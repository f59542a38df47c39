"""The OpenTelemetry plugin against the real SDK (in-memory exporters): spans, events, metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest
from opentelemetry import context
from opentelemetry._logs import NoOpLoggerProvider, SeverityNumber
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode, set_span_in_context

import turnguard as tg
from turnguard.telemetry import _buckets as buckets
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry

SECRET_ARG = "SECRET-ARGUMENT-7f3a"
CONVERSATION = "conversation-secret-91c2"


def make_guard(otel: InMemoryTelemetry, **config: Any) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(load_entrypoints=False, **config), **otel.providers())


def call(name: str = "read_file", value: str = SECRET_ARG, call_id: str | None = None) -> tg.ToolCall:
    return tg.ToolCall(name, {"path": value}, call_id=call_id)


def run_calls(turn: tg.Turn, calls: list[tuple[tg.ToolCall, tg.Outcome]]) -> list[tuple[tg.Verdict, tg.Verdict | None]]:
    verdicts = []
    for c, outcome in calls:
        v = turn.check_call(c)
        out = None if v.halted else turn.record_outcome(c, outcome)
        verdicts.append((v, out))
    return verdicts


# -- spans: a host that does not trace ---------------------------------------------------------


def test_untraced_host_gets_a_turn_span_with_one_child_per_call(otel):
    guard = make_guard(otel)
    with guard.turn(conversation_id=CONVERSATION, agent_name="coder") as turn:
        turn.begin_cycle()
        run_calls(turn, [(call("read_file", "a", "t1"), tg.Outcome.OK), (call("grep", "b", "t2"), tg.Outcome.ERROR)])
        turn_id = turn.turn_id
    agent = otel.span("invoke_agent coder")
    assert agent.kind is SpanKind.INTERNAL and agent.parent is None
    assert agent.attributes[n.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent.attributes[n.GEN_AI_AGENT_NAME] == "coder"
    assert agent.attributes[n.GEN_AI_CONVERSATION_ID] == CONVERSATION
    assert agent.attributes[n.TURN_ID] == turn_id
    assert agent.attributes[n.TURN_OUTCOME] == "completed"
    assert agent.attributes[n.TURN_TOOL_CALLS] == 2
    assert agent.attributes[n.TURN_CYCLES] == 1
    assert agent.attributes[n.LOOP_THRESHOLD] == n.NO_THRESHOLD

    read, grep = otel.span("execute_tool read_file"), otel.span("execute_tool grep")
    for span, index in ((read, 1), (grep, 2)):
        assert span.parent.span_id == agent.context.span_id
        assert span.context.trace_id == agent.context.trace_id
        assert span.attributes[n.GEN_AI_OPERATION_NAME] == "execute_tool"
        assert span.attributes[n.CALL_INDEX] == index
        # defaults are left out to keep spans small: repeat 1, streak 1, verdict allow
        assert n.CALL_REPEAT not in span.attributes
        assert n.STREAK_LENGTH not in span.attributes
        assert n.VERDICT_ACTION not in span.attributes
        assert len(span.attributes[n.CALL_KEY_DIGEST]) == 16
    assert read.attributes[n.GEN_AI_TOOL_NAME] == "read_file"
    assert read.attributes[n.GEN_AI_TOOL_CALL_ID] == "t1"
    assert read.attributes[n.CALL_OUTCOME] == "ok"
    assert read.status.status_code is StatusCode.UNSET
    assert n.ERROR_TYPE not in read.attributes
    assert grep.attributes[n.CALL_OUTCOME] == "error"
    assert grep.status.status_code is StatusCode.ERROR
    assert grep.attributes[n.ERROR_TYPE] == n.ERROR_TYPE_OTHER


def test_denied_outcome_is_not_an_error(otel):
    with make_guard(otel).turn() as turn:
        run_calls(turn, [(call(), tg.Outcome.DENIED)])
    span = otel.span("execute_tool read_file")
    assert span.attributes[n.CALL_OUTCOME] == "denied"
    assert span.status.status_code is StatusCode.UNSET
    assert otel.span("invoke_agent").attributes[n.GEN_AI_OPERATION_NAME] == "invoke_agent"


def test_repeats_and_streak_are_the_calls_own(otel):
    with make_guard(otel, streak_warn_at=0).turn() as turn:
        run_calls(turn, [(call(value="x"), tg.Outcome.ERROR) for _ in range(3)])
    spans = sorted(otel.spans()[:-1], key=lambda s: s.attributes[n.CALL_INDEX])
    assert [s.attributes.get(n.CALL_REPEAT, 1) for s in spans] == [1, 2, 3]
    assert [s.attributes.get(n.STREAK_LENGTH, 1) for s in spans] == [1, 2, 3]
    assert [s.attributes.get(n.FAILING_STREAK_LENGTH, 0) for s in spans] == [1, 2, 3]
    assert len({s.attributes[n.CALL_KEY_DIGEST] for s in spans}) == 1


def test_calls_without_a_detection_emit_spans_only_no_log_or_metric(otel):
    """The per-call path costs one span; logs and metrics come from detections and turn ends."""
    with make_guard(otel).turn() as turn:
        run_calls(turn, [(call(value=f"v{i}"), tg.Outcome.ERROR if i == 1 else tg.Outcome.OK) for i in range(3)])
        assert [s.name for s in otel.spans()] == ["execute_tool read_file"] * 3  # each ended at its outcome
        assert otel.logs() == []
        assert list(otel.all_points()) == []
    assert {name for name, _ in otel.all_points()} == {
        n.METRIC_TURN_TOOL_CALLS[0], n.METRIC_TURN_CYCLES[0], n.METRIC_TURN_MAX_KEY_REPEAT[0],
        n.METRIC_TURN_MAX_FAILING_STREAK[0],
    }


def test_turn_ended_by_an_exception_marks_the_turn_span_as_error(otel):
    with pytest.raises(RuntimeError), make_guard(otel).turn(agent_name="a"):
        raise RuntimeError("host failure")
    span = otel.span("invoke_agent a")
    assert span.attributes[n.TURN_OUTCOME] == "error"
    assert span.status.status_code is StatusCode.ERROR


def test_a_call_without_an_outcome_is_closed_when_the_turn_ends(otel):
    with make_guard(otel).turn() as turn:
        turn.check_call(call())
    span = otel.span("execute_tool read_file")
    assert span.attributes[n.CALL_OUTCOME] == n.CALL_UNFINISHED
    assert span.end_time is not None


def test_halted_call_span_ends_at_the_check_with_the_verdict(otel):
    with make_guard(otel, max_tool_calls_per_turn=1).turn() as turn:
        first, second = call("a"), call("b")
        run_calls(turn, [(first, tg.Outcome.OK)])
        assert turn.check_call(second).halted
        assert turn.record_outcome(second, tg.Outcome.DENIED).halted  # host reports anyway: ignored
    halted = otel.span("execute_tool b")
    assert halted.attributes[n.VERDICT_ACTION] == "halt"
    assert halted.attributes[n.VERDICT_THRESHOLD] == "explicit"
    assert halted.attributes[n.CALL_OUTCOME] == "denied"  # refused: it did not run, as the recorder lists it


def test_parallel_calls_each_get_their_own_span_and_facts(otel, frequent_thread_switches):
    guard = make_guard(otel, streak_warn_at=0)
    workers = 8
    barrier = threading.Barrier(workers)
    with guard.turn() as turn:

        def work(i: int) -> None:
            c = call(f"tool{i}", f"v{i}", call_id=f"id{i}")
            barrier.wait()
            turn.check_call(c)
            barrier.wait()
            turn.record_outcome(c, tg.Outcome.ERROR if i % 2 else tg.Outcome.OK)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    spans = [s for s in otel.spans() if s.name.startswith("execute_tool")]
    assert len(spans) == workers
    assert sorted(s.attributes[n.CALL_INDEX] for s in spans) == list(range(1, workers + 1))
    for s in spans:
        i = int(s.attributes[n.GEN_AI_TOOL_CALL_ID][2:])
        assert s.name == f"execute_tool tool{i}"
        assert s.attributes[n.CALL_OUTCOME] == ("error" if i % 2 else "ok")


@pytest.fixture
def frequent_thread_switches():
    """Make the interpreter switch threads every microsecond, so races actually happen."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_parallel_detections_land_on_the_offending_calls_span(otel, frequent_thread_switches):
    """Threads racing through one turn: every event sits on the span of the call that fired it."""
    guard = make_guard(otel, streak_warn_at=2, streak_stop_at=0, soft_cap=0)
    workers, per_worker = 6, 60
    barrier = threading.Barrier(workers)
    with guard.turn() as turn:

        def work(w: int) -> None:
            barrier.wait()
            for i in range(per_worker):
                c = call(f"tool{w}", f"v{i // 4}", call_id=f"{w}-{i}")  # each key 4 times in a row
                turn.check_call(c)
                turn.record_outcome(c, tg.Outcome.OK)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    records = otel.logs(n.LOOP_DETECTED_EVENT)
    assert records, "the racing calls produced no detection: the test tested nothing"
    spans = {s.context.span_id: s for s in otel.spans()}
    for record in records:
        span = spans[record.span_id]
        assert span.name == f"execute_tool {record.attributes[n.GEN_AI_TOOL_NAME]}"
        assert span.attributes[n.CALL_KEY_DIGEST] == record.attributes[n.CALL_KEY_DIGEST]
        assert n.LOOP_DETECTED_EVENT in [e.name for e in span.events]


# -- spans: a host that traces ----------------------------------------------------------------------


def test_traced_host_span_is_enriched_not_duplicated(otel):
    tracer = otel.tracer_provider.get_tracer("host")
    guard = make_guard(otel)
    with tracer.start_as_current_span("invoke_agent host-agent") as host, guard.turn(agent_name="host-agent") as turn:
        run_calls(turn, [(call(), tg.Outcome.OK)])
        turn_id = turn.turn_id
    names = [s.name for s in otel.spans()]
    assert names.count("invoke_agent host-agent") == 1
    assert "invoke_agent" not in names
    host_span = otel.span("invoke_agent host-agent")
    assert host_span.attributes[n.TURN_ID] == turn_id
    assert host_span.attributes[n.TURN_OUTCOME] == "completed"
    assert host_span.attributes[n.TURN_TOOL_CALLS] == 1
    ours = otel.span("execute_tool read_file")
    assert ours.parent.span_id == host.get_span_context().span_id


def test_a_host_span_whose_name_only_starts_like_execute_tool_is_a_parent_not_a_tool_span(otel):
    tracer = otel.tracer_provider.get_tracer("host")
    guard = make_guard(otel)
    with tracer.start_as_current_span("execute_toolbox step") as host, guard.turn() as turn:
        c = call("read_file", "a.py")
        turn.check_call(c)
        turn.record_outcome(c, tg.Outcome.OK)
    ours = otel.span("execute_tool read_file")  # our own span, under the host's
    assert ours.parent.span_id == host.get_span_context().span_id
    assert n.CALL_INDEX not in otel.span("execute_toolbox step").attributes


def test_host_execute_tool_span_is_enriched_not_duplicated(otel):
    tracer = otel.tracer_provider.get_tracer("host")
    guard = make_guard(otel, streak_stop_at=2, streak_warn_at=2)
    with tracer.start_as_current_span("invoke_agent host"), guard.turn() as turn:
        for i in range(2):
            c = call("fetch", "same", call_id=f"c{i}")
            with tracer.start_as_current_span("execute_tool fetch", attributes={n.GEN_AI_TOOL_NAME: "fetch"}) as tool:
                turn.check_call(c)
                turn.record_outcome(c, tg.Outcome.ERROR)
                tool_context = tool.get_span_context()
    fetch_spans = [s for s in otel.spans() if s.name == "execute_tool fetch"]
    assert len(fetch_spans) == 2  # the host's two spans, none of ours
    second = next(s for s in fetch_spans if s.context.span_id == tool_context.span_id)
    assert second.attributes[n.CALL_INDEX] == 2
    assert second.attributes[n.CALL_REPEAT] == 2
    assert second.attributes[n.CALL_OUTCOME] == "error"
    assert second.attributes[n.FAILING_STREAK_LENGTH] == 2
    assert second.attributes[n.VERDICT_ACTION] == "halt"
    assert n.GEN_AI_OPERATION_NAME not in second.attributes  # the host's own attributes are left alone
    assert second.status.status_code is StatusCode.UNSET  # the host decides its span's status
    stop = [r for r in otel.logs(n.LOOP_DETECTED_EVENT) if r.attributes[n.LOOP_LEVEL] == "stop"]
    assert [r.span_id for r in stop] == [tool_context.span_id]
    assert any(e.name == n.LOOP_DETECTED_EVENT for e in second.events)


# -- the loop-detected event: five thresholds, both levels ------------------------------------------

EVENT_KEYS = {
    n.LOOP_THRESHOLD, n.LOOP_LEVEL, n.LOOP_ACTION, n.LOOP_LIMIT, n.LOOP_TOOL_CALLS, n.LOOP_CYCLES,
    n.LOOP_MAX_KEY_REPEAT, n.LOOP_STREAK_LENGTH, n.LOOP_FAILING_STREAK_LENGTH, n.LOOP_EVENT_ID, n.TURN_ID,
    n.TURN_PROMPTABLE, n.CAP_MODE, n.GEN_AI_AGENT_NAME,
}
"""Always on the event (agent name because the scenarios name one)."""
CALL_EVENT_KEYS = {n.GEN_AI_TOOL_NAME, n.CALL_KEY_DIGEST}
CAP_KEYS = {n.LOOP_SOFT_CAP, n.LOOP_HARD_CAP}


def _explicit(turn):
    turn.begin_cycle()
    run_calls(turn, [(call(f"t{i}"), tg.Outcome.OK) for i in range(4)])


def repeated_then_distinct(turn: tg.Turn, repeated: int, distinct: int) -> None:
    """One call ``repeated`` times, then ``distinct`` different calls (t0, t1, ...), all OK."""
    turn.begin_cycle()
    calls = [call("poll") for _ in range(repeated)] + [call(f"t{i}") for i in range(distinct)]
    run_calls(turn, [(c, tg.Outcome.OK) for c in calls])


def _soft_stuck(turn):
    repeated_then_distinct(turn, 3, 3)


def _hard_backstop(turn):
    turn.begin_cycle()
    run_calls(turn, [(call(f"t{i}"), tg.Outcome.OK) for i in range(5)])


def _streak(turn):
    turn.begin_cycle()
    run_calls(turn, [(call("flaky"), tg.Outcome.ERROR) for _ in range(4)])


def _cycle_cap(turn):
    for _ in range(3):
        turn.begin_cycle()


SCENARIOS = {
    # id: (config, promptable, drive, expected [(threshold, level, action, limit, tool_calls, offending)])
    "explicit-stop": (dict(max_tool_calls_per_turn=3), False, _explicit, [("explicit", "stop", "halt", 3, 4, "t3")]),
    "soft_stuck-stop": (
        dict(soft_cap=5, stuck_repeat_threshold=3, streak_warn_at=0, streak_stop_at=0), False, _soft_stuck,
        [("soft_stuck", "stop", "halt", 5, 6, "t2")],
    ),
    "hard_backstop-stop": (
        dict(soft_cap=2, hard_multiplier=2), False, _hard_backstop, [("hard_backstop", "stop", "halt", 4, 5, "t4")],
    ),
    "streak-warn-unattended": (
        dict(streak_warn_at=2, streak_stop_at=0), False, _streak, [("streak", "warn", "allow", 2, 2, "flaky")],
    ),
    "streak-warn-attended": (
        dict(streak_warn_at=2, streak_stop_at=0), True, _streak, [("streak", "warn", "ask", 2, 2, "flaky")],
    ),
    "streak-warn-remind": (
        dict(streak_warn_at=2, streak_stop_at=0, remind_model=True), False, _streak,
        [("streak", "warn", "remind", 2, 2, "flaky")],
    ),
    "streak-stop-unattended": (
        dict(streak_warn_at=0, streak_stop_at=3), False, _streak, [("streak", "stop", "halt", 3, 3, "flaky")],
    ),
    "streak-stop-attended": (
        dict(streak_warn_at=0, streak_stop_at=3), True, _streak, [("streak", "stop", "ask", 3, 3, "flaky")],
    ),
    "cycle_cap-stop": (dict(max_cycles_per_turn=2), False, _cycle_cap, [("cycle_cap", "stop", "halt", 2, 0, None)]),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_loop_detected_event_per_threshold_and_level(otel, scenario):
    config, promptable, drive, expected = SCENARIOS[scenario]
    guard = make_guard(otel, **config)
    with guard.turn(conversation_id=CONVERSATION, agent_name="coder", promptable=promptable) as turn:
        drive(turn)
    records = otel.logs(n.LOOP_DETECTED_EVENT)
    assert len(records) == len(expected)
    spans = {s.context.span_id: s for s in otel.spans()}
    for record, (threshold, level, action, limit, tool_calls, tool) in zip(records, expected, strict=True):
        assert record.severity_number is SeverityNumber.WARN
        assert record.severity_text == "WARN"
        attrs = dict(record.attributes)
        assert attrs[n.LOOP_THRESHOLD] == threshold
        assert attrs[n.LOOP_LEVEL] == level
        assert attrs[n.LOOP_ACTION] == action
        assert attrs[n.LOOP_LIMIT] == limit
        assert attrs[n.LOOP_TOOL_CALLS] == tool_calls
        assert attrs[n.TURN_PROMPTABLE] is promptable
        keys = set(attrs)
        expected_keys = EVENT_KEYS | (CALL_EVENT_KEYS if tool else set())
        assert expected_keys <= keys <= expected_keys | CAP_KEYS
        assert not any(SECRET_ARG in str(v) or CONVERSATION in str(v) for v in attrs.values())
        assert SECRET_ARG not in str(record.body) and CONVERSATION not in str(record.body)
        # the record sits in the offending span's context, and that span mirrors it as a span event
        offending = spans[record.span_id]
        assert record.trace_id == offending.context.trace_id
        if tool is None:
            assert offending.name == "invoke_agent coder"
            assert attrs[n.LOOP_CYCLES] == 3
        else:
            assert offending.name == f"execute_tool {tool}"
            assert attrs[n.GEN_AI_TOOL_NAME] == tool
            assert attrs[n.CALL_KEY_DIGEST] == offending.attributes[n.CALL_KEY_DIGEST]
        mirrored = [e for e in offending.events if e.name == n.LOOP_DETECTED_EVENT]
        assert len(mirrored) == 1
        assert dict(mirrored[0].attributes) == attrs


def test_soft_stuck_event_counts_the_repeat_at_detection(otel):
    guard = make_guard(otel, soft_cap=5, stuck_repeat_threshold=3, streak_warn_at=0, streak_stop_at=0)
    with guard.turn(agent_name="coder") as turn:
        _soft_stuck(turn)
    (record,) = otel.logs(n.LOOP_DETECTED_EVENT)
    assert record.attributes[n.LOOP_MAX_KEY_REPEAT] == 3
    assert record.attributes[n.LOOP_SOFT_CAP] == 5
    assert record.attributes[n.LOOP_HARD_CAP] == 50
    assert record.attributes[n.CAP_MODE] == "adaptive"


def test_streak_stop_event_counts_the_failing_streak(otel):
    with make_guard(otel, streak_warn_at=0, streak_stop_at=3).turn(agent_name="coder") as turn:
        _streak(turn)
    (record,) = otel.logs(n.LOOP_DETECTED_EVENT)
    assert record.attributes[n.LOOP_FAILING_STREAK_LENGTH] == 3
    assert record.attributes[n.LOOP_STREAK_LENGTH] == 3


def test_content_is_exported_only_when_opted_in(otel):
    for capture in (False, True):
        otel.clear()
        with make_guard(otel, capture_content=capture, streak_warn_at=1, streak_stop_at=0).turn() as turn:
            run_calls(turn, [(call(), tg.Outcome.OK)])
        span = otel.span("execute_tool read_file")
        if capture:
            assert span.attributes[n.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"path":"' + SECRET_ARG + '"}'
        else:
            assert n.GEN_AI_TOOL_CALL_ARGUMENTS not in span.attributes
            assert all(SECRET_ARG not in str(v) for s in otel.spans() for v in s.attributes.values())
        # never in the event, opted in or not
        (record,) = otel.logs(n.LOOP_DETECTED_EVENT)
        assert all(SECRET_ARG not in str(v) for v in record.attributes.values())


SECRET_RESULT = "SECRET-RESULT-5b1d"


def test_a_stateful_tools_span_carries_the_recorders_result_digest_never_the_result(otel, tmp_path):
    """Both sources replay polling alike: the span's ``turnguard.call.result_digest`` is the recorder
    line's ``result`` for the same call; a tool whose result the guard does not key has neither."""
    path = tmp_path / "turns.jsonl"
    guard = make_guard(otel, stateful_tools=("ci_status",), recorder_path=str(path))
    with guard.turn() as turn:
        for tool, answer in (("ci_status", "running"), ("ci_status", SECRET_RESULT), ("read_file", "text")):
            c = tg.ToolCall(tool, {"job": 1})
            turn.check_call(c)
            turn.record_outcome(c, tg.Outcome.OK, result={"state": answer})
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    spans = sorted((s for s in otel.spans() if s.name.startswith("execute_tool")),
                   key=lambda s: s.attributes[n.CALL_INDEX])
    assert [s.attributes.get(n.CALL_RESULT_DIGEST) for s in spans] == [c.get("result") for c in line["calls"]]
    first, second, plain = (s.attributes.get(n.CALL_RESULT_DIGEST) for s in spans)
    assert first and second and first != second and plain is None
    assert all(SECRET_RESULT not in str(v) for s in otel.spans() for v in s.attributes.values())


def test_the_turn_span_names_the_tool_lists_in_force(otel):
    with make_guard(otel, stateful_tools=("ci_status", "poll"), streak_exempt_tools=("sleep",)).turn() as turn:
        turn.check_call(call())
    attrs = otel.span("invoke_agent").attributes
    assert (tuple(attrs[n.POLICY_STATEFUL_TOOLS]), tuple(attrs[n.POLICY_STREAK_EXEMPT_TOOLS])) == (
        ("ci_status", "poll"), ("sleep",))
    otel.clear()
    with make_guard(otel).turn() as turn:
        turn.check_call(call())
    attrs = otel.span("invoke_agent").attributes
    assert (tuple(attrs[n.POLICY_STATEFUL_TOOLS]), tuple(attrs[n.POLICY_STREAK_EXEMPT_TOOLS])) == ((), ())


# -- escalations and plugin errors ----------------------------------------------------------------------


def test_escalation_answer_is_counted_and_logged(otel):
    guard = make_guard(otel, streak_warn_at=2, streak_stop_at=0)
    with guard.turn(agent_name="coder", promptable=True) as turn:
        verdicts = run_calls(turn, [(call("flaky"), tg.Outcome.OK) for _ in range(2)])
        ask = verdicts[-1][0]
        assert ask.action is tg.Action.ASK
        turn.resolve(ask, "continue")
    (point,) = otel.points(n.METRIC_ESCALATION_ANSWERS[0])
    assert point.value == 1
    assert dict(point.attributes) == {
        n.LOOP_THRESHOLD: "streak", n.LOOP_LEVEL: "warn", n.ESCALATION_ANSWER: "continue", n.GEN_AI_AGENT_NAME: "coder",
        n.POLICY: "default", n.TURN_COHORT: "live",
    }
    (record,) = otel.logs(n.ESCALATION_RESOLVED_EVENT)
    assert record.attributes[n.LOOP_EVENT_ID] == ask.event.event_id
    assert record.attributes[n.ESCALATION_ANSWER] == "continue"
    assert record.span_id == otel.span("invoke_agent coder").context.span_id


class Broken:
    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        raise KeyError("boom")


def test_plugin_errors_are_counted_by_plugin_hook_and_type(otel):
    guard = make_guard(otel)
    guard.register(Broken(), name="broken")
    with guard.turn() as turn:
        verdicts = run_calls(turn, [(call(f"t{i}"), tg.Outcome.OK) for i in range(3)])
    assert all(v.action is tg.Action.ALLOW for v, _ in verdicts)
    (point,) = otel.points(n.METRIC_PLUGIN_ERRORS[0])
    assert point.value == 3
    assert dict(point.attributes) == {
        n.PLUGIN_NAME: "broken", n.PLUGIN_HOOK: "turnguard_check_call", n.ERROR_TYPE: "KeyError", n.POLICY: "default",
    }


def test_ignored_outcomes_are_counted_as_host_errors_by_kind_without_ids(otel):
    guard = make_guard(otel)
    with guard.turn() as turn:
        checked = call("t1")
        turn.check_call(checked)
        turn.record_outcome(checked, tg.Outcome.OK)
        turn.record_outcome(checked, tg.Outcome.OK)  # a duplicate
        turn.record_outcome(call("never"), tg.Outcome.ERROR)  # never checked
        late = call("t2")
        turn.check_call(late)
    turn.record_outcome(late, tg.Outcome.OK)  # its first outcome, after the turn ended
    points = {point.attributes[n.HOST_ERROR]: point for point in otel.points(n.METRIC_HOST_ERRORS[0])}
    assert {kind: p.value for kind, p in points.items()} == {"duplicate": 1, "unknown_call": 1, "after_end": 1}
    for point in points.values():
        assert set(point.attributes) <= set(n.HOST_ERROR_METRIC_ATTRIBUTES)


# -- metrics ----------------------------------------------------------------------------------------------


def _bounds(otel: InMemoryTelemetry, metric: str) -> tuple[float, ...]:
    (point, *_) = otel.points(metric)
    return tuple(point.explicit_bounds)


def test_metric_units_descriptions_and_soft_cap_multiples_as_bucket_edges(otel):
    soft_cap = 7
    guard = make_guard(otel, soft_cap=soft_cap, stuck_repeat_threshold=3, streak_warn_at=0, streak_stop_at=0)
    with guard.turn(agent_name="coder") as turn:
        repeated_then_distinct(turn, 3, 5)
    metrics = otel.metrics()
    for name, unit in (n.METRIC_TURN_TOOL_CALLS, n.METRIC_TURN_CYCLES, n.METRIC_TURN_MAX_KEY_REPEAT,
                       n.METRIC_TURN_FIRST_STUCK_CALL, n.METRIC_DETECTIONS):
        assert metrics[name].unit == unit
        assert metrics[name].description
    edges = _bounds(otel, n.METRIC_TURN_TOOL_CALLS[0])
    assert all(float(soft_cap * k) in edges for k in range(1, 21))
    assert any(e < soft_cap for e in edges) and any(e > 20 * soft_cap for e in edges)
    assert list(edges) == sorted(set(edges))
    assert edges == buckets.tool_call_edges(guard.config)
    assert 3.0 in _bounds(otel, n.METRIC_TURN_MAX_KEY_REPEAT[0]) and 2.0 in _bounds(
        otel, n.METRIC_TURN_MAX_KEY_REPEAT[0]
    )

    (calls,) = otel.points(n.METRIC_TURN_TOOL_CALLS[0])
    assert calls.count == 1 and calls.sum == 8
    assert dict(calls.attributes) == {
        n.GEN_AI_AGENT_NAME: "coder", n.TURN_OUTCOME: "halted", n.LOOP_THRESHOLD: "soft_stuck",
        n.CAP_MODE: "adaptive", n.TURN_STUCK: True, n.TURN_PROMPTABLE: False, n.TURN_PAST_SOFT_CAP: True,
        n.POLICY: "default", n.TURN_COHORT: "live", n.TURN_RESOLVED: "unknown",
    }
    # 8 calls lands in the bucket (7, 14]
    assert calls.bucket_counts[edges.index(14.0)] == 1
    (first_stuck,) = otel.points(n.METRIC_TURN_FIRST_STUCK_CALL[0])
    assert first_stuck.sum == 3
    (repeat,) = otel.points(n.METRIC_TURN_MAX_KEY_REPEAT[0])
    assert repeat.sum == 3
    (cycles,) = otel.points(n.METRIC_TURN_CYCLES[0])
    assert cycles.sum == 1
    (detection,) = otel.points(n.METRIC_DETECTIONS[0])
    assert detection.value == 1
    assert dict(detection.attributes) == {
        n.LOOP_THRESHOLD: "soft_stuck", n.LOOP_LEVEL: "stop", n.LOOP_ACTION: "halt", n.CAP_MODE: "adaptive",
        n.TURN_PROMPTABLE: False, n.GEN_AI_TOOL_NAME: "t4", n.GEN_AI_AGENT_NAME: "coder", n.POLICY: "default",
        n.TURN_COHORT: "live",
    }


@pytest.mark.parametrize(
    ("config", "calls", "past"),
    [
        ({"soft_cap": 5}, 5, False),  # exactly S: not past it
        ({"soft_cap": 5}, 6, True),  # S + 1
        ({"soft_cap": 5}, 0, False),  # no call at all
        ({"max_tool_calls_per_turn": 3}, 4, False),  # explicit cap: no S, halted past its cap, still false
        ({"max_tool_calls_per_turn": 0}, 12, False),  # disabled cap
        ({"soft_cap": 0}, 12, False),  # disabled adaptive cap (S = 0)
    ],
    ids=["at-S", "S+1", "empty", "explicit", "disabled-explicit", "disabled-adaptive"],
)
def test_turn_metrics_say_whether_the_turn_went_past_the_soft_cap(otel, config, calls, past):
    with make_guard(otel, streak_warn_at=0, streak_stop_at=0, **config).turn() as turn:
        run_calls(turn, [(call(f"t{i}", str(i)), tg.Outcome.OK) for i in range(calls)])
    for metric in (n.METRIC_TURN_TOOL_CALLS, n.METRIC_TURN_MAX_KEY_REPEAT, n.METRIC_TURN_CYCLES):
        (point,) = otel.points(metric[0])
        assert point.attributes[n.TURN_PAST_SOFT_CAP] is past, (metric, dict(point.attributes))


def test_turns_that_never_got_stuck_record_no_first_stuck_call(otel):
    with make_guard(otel).turn() as turn:
        run_calls(turn, [(call(f"t{i}"), tg.Outcome.OK) for i in range(3)])
    assert otel.points(n.METRIC_TURN_FIRST_STUCK_CALL[0]) == []
    (calls,) = otel.points(n.METRIC_TURN_TOOL_CALLS[0])
    assert calls.attributes[n.LOOP_THRESHOLD] == n.NO_THRESHOLD
    assert n.GEN_AI_AGENT_NAME not in calls.attributes  # no agent name given: no label, not "None"


def test_no_metric_point_carries_ids_arguments_or_results(otel):
    guard = make_guard(otel, streak_warn_at=2, streak_stop_at=3, max_cycles_per_turn=2, capture_content=True)
    guard.register(Broken(), name="broken")
    identifiers = set()
    for t in range(3):
        conversation = f"{CONVERSATION}-{t}"
        with guard.turn(conversation_id=conversation, agent_name="coder", promptable=bool(t % 2)) as turn:
            identifiers |= {conversation, turn.turn_id}
            turn.begin_cycle()
            for i in range(4):
                c = call("flaky", f"{SECRET_ARG}-{t}", call_id=f"call-id-{t}-{i}")
                identifiers.add(c.call_id)
                v = turn.check_call(c)
                if v.event is not None:
                    identifiers.add(v.event.event_id)
                if v.action is tg.Action.ASK:
                    turn.resolve(v, "redirect")
                if not v.halted:
                    turn.record_outcome(c, tg.Outcome.ERROR)
            turn.begin_cycle()
            turn.begin_cycle()
    points = list(otel.all_points())
    assert {name for name, _ in points} >= {
        n.METRIC_TURN_TOOL_CALLS[0], n.METRIC_DETECTIONS[0], n.METRIC_ESCALATION_ANSWERS[0], n.METRIC_PLUGIN_ERRORS[0],
    }
    for name, point in points:
        keys = set(point.attributes)
        assert keys <= set(n.METRIC_ATTRIBUTES[name]), (name, keys)
        assert not keys & n.FORBIDDEN_METRIC_ATTRIBUTES
        for value in point.attributes.values():
            assert SECRET_ARG not in str(value)
            assert str(value) not in identifiers
            assert not (isinstance(value, str) and len(value) == 16 and all(ch in "0123456789abcdef" for ch in value))


def test_the_10001st_distinct_tool_name_is_folded_into_the_overflow_value():
    otel = InMemoryTelemetry(cardinality_limit=20_000)  # above our bound, so the SDK's own never folds first
    try:
        guard = tg.Guard(
            tg.GuardConfig(load_entrypoints=False, soft_cap=0, streak_warn_at=1, streak_stop_at=0),
            tracer_provider=NoOpTracerProvider(),
            logger_provider=NoOpLoggerProvider(),
            meter_provider=otel.meter_provider,
        )
        with guard.turn() as turn:
            for i in range(n.TOOL_NAME_LIMIT + 1):
                assert turn.check_call(tg.ToolCall(f"tool-{i}", None)).event is not None
            turn.check_call(tg.ToolCall("tool-0", "again"))  # an admitted name stays admitted
        tools = {}
        for point in otel.points(n.METRIC_DETECTIONS[0]):
            tools[point.attributes[n.GEN_AI_TOOL_NAME]] = point.value
    finally:
        otel.shutdown()
    assert len(tools) == n.TOOL_NAME_LIMIT + 1  # 10,000 names and the overflow value
    assert tools[n.OVERFLOW_VALUE] == 1
    assert f"tool-{n.TOOL_NAME_LIMIT}" not in tools
    assert f"tool-{n.TOOL_NAME_LIMIT - 1}" in tools
    assert tools["tool-0"] == 2


def test_agent_names_and_host_end_reasons_are_bounded_too(otel):
    guard = make_guard(otel)
    plugin = guard.pm.get_plugin("otel")
    plugin.instruments.agents.limit = 2
    plugin.instruments.reasons.limit = 1
    for i in range(4):
        guard.turn(agent_name=f"agent-{i}").end(reason=f"host-reason-{i}")
    seen = {(p.attributes.get(n.GEN_AI_AGENT_NAME), p.attributes[n.TURN_OUTCOME])
            for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0])}
    assert seen == {("agent-0", "host-reason-0"), ("agent-1", n.OVERFLOW_VALUE), (n.OVERFLOW_VALUE, n.OVERFLOW_VALUE)}


# -- no SDK ---------------------------------------------------------------------------------------------


def test_without_an_sdk_the_plugin_is_registered_and_harmless():
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, max_tool_calls_per_turn=2))
    assert guard.pm.get_plugin("otel") is not None
    with guard.turn(agent_name="x") as turn:
        verdicts = run_calls(turn, [(call(f"t{i}"), tg.Outcome.ERROR) for i in range(3)])
    assert [v.action for v, _ in verdicts] == [tg.Action.ALLOW, tg.Action.ALLOW, tg.Action.HALT]


def test_spans_nest_under_an_explicit_host_context(otel):
    """A host span that is current in the caller's context is the parent of our call spans."""
    tracer = otel.tracer_provider.get_tracer("host")
    guard = make_guard(otel)
    with guard.turn() as turn:
        step = tracer.start_span("agent step")
        token = context.attach(set_span_in_context(step))
        try:
            run_calls(turn, [(call(), tg.Outcome.OK)])
        finally:
            context.detach(token)
            step.end()
    assert otel.span("execute_tool read_file").parent.span_id == step.get_span_context().span_id


def test_call_span_keeps_the_parent_current_at_the_check_even_if_the_outcome_comes_elsewhere(otel):
    tracer = otel.tracer_provider.get_tracer("host")
    guard = make_guard(otel)
    results = []
    with guard.turn() as turn:
        c = call()
        with tracer.start_as_current_span("agent step") as step:
            turn.check_call(c)
        worker = threading.Thread(target=lambda: results.append(turn.record_outcome(c, tg.Outcome.OK)))
        worker.start()
        worker.join()
    span = otel.span("execute_tool read_file")
    assert span.parent.span_id == step.get_span_context().span_id
    assert span.start_time < otel.span("agent step").end_time  # started at the check


def test_turns_never_ended_are_bounded_and_their_spans_closed(otel, monkeypatch):
    from turnguard.telemetry import _names as plugin_module

    monkeypatch.setattr(plugin_module, "MAX_OPEN_TURNS", 2)
    guard = make_guard(otel)
    first = guard.turn(agent_name="a0")
    first.check_call(call())
    others = [guard.turn(agent_name=f"a{i}") for i in (1, 2)]
    assert {s.name for s in otel.spans()} == {"invoke_agent a0", "execute_tool read_file"}  # a1, a2 still open
    abandoned = otel.span("invoke_agent a0")
    assert abandoned.attributes[n.TURN_OUTCOME] == n.TURN_ABANDONED
    assert otel.span("execute_tool read_file").attributes[n.CALL_OUTCOME] == n.CALL_UNFINISHED
    assert len(guard.pm.get_plugin("otel")._turns) == 2
    for turn in others:
        turn.end()
    assert otel.span("invoke_agent a2").attributes[n.TURN_OUTCOME] == "completed"


GLOBAL_SDK_HOST = """
import json
from opentelemetry import metrics, trace
from opentelemetry._logs import set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import turnguard as tg

early = tg.Guard(tg.GuardConfig(load_entrypoints=False, max_tool_calls_per_turn=1))  # before the SDK exists
spans, logs, reader = InMemorySpanExporter(), InMemoryLogRecordExporter(), InMemoryMetricReader()
tp = TracerProvider(); tp.add_span_processor(SimpleSpanProcessor(spans)); trace.set_tracer_provider(tp)
lp = LoggerProvider(); lp.add_log_record_processor(SimpleLogRecordProcessor(logs)); set_logger_provider(lp)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
late = tg.Guard(tg.GuardConfig(load_entrypoints=False, max_tool_calls_per_turn=1))
for name, guard in (("early", early), ("late", late)):
    with guard.turn(agent_name=name) as turn:
        for i in range(2):
            call = tg.ToolCall("t%d" % i, None)
            if not turn.check_call(call).halted:
                turn.record_outcome(call, "ok")
data = reader.get_metrics_data()
names = sorted({m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics})
print(json.dumps({"spans": sorted(s.name for s in spans.get_finished_spans()),
                  "events": [r.log_record.event_name for r in logs.get_finished_logs()], "metrics": names}))
"""


def test_a_host_with_global_sdk_providers_gets_telemetry_with_no_extra_code():
    """In its own process: OpenTelemetry lets a process set the global providers once."""
    done = subprocess.run([sys.executable, "-c", GLOBAL_SDK_HOST], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["spans"] == sorted(
        ["execute_tool t0", "execute_tool t1", "invoke_agent early", "execute_tool t0", "execute_tool t1",
         "invoke_agent late"]
    )
    assert got["events"] == [n.LOOP_DETECTED_EVENT, n.LOOP_DETECTED_EVENT]
    assert n.METRIC_TURN_TOOL_CALLS[0] in got["metrics"] and n.METRIC_DETECTIONS[0] in got["metrics"]
