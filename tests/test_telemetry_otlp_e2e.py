"""End to end: the real OTLP/HTTP exporters (via ``configure()``) against a receiver on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry import configure
from turnguard.telemetry._receiver import OtlpReceiver, attributes, received_items

SOFT_CAP = 4


@pytest.fixture
def receiver():
    with OtlpReceiver() as rx:
        yield rx


def drive_turns(guard: tg.Guard) -> list[list[tg.Action]]:
    """Three turns: a clean one, one halted by the hard backstop, one with a streak warning."""
    actions = []
    for agent, calls in (
        ("clean", [tg.ToolCall(f"t{i}", {"i": i}) for i in range(3)]),
        ("runaway", [tg.ToolCall(f"t{i}", {"i": i}) for i in range(3 * SOFT_CAP)]),
        ("stuck", [tg.ToolCall("poll", {"job": 1}, call_id=f"c{i}") for i in range(3)]),
    ):
        seen = []
        with guard.turn(agent_name=agent, conversation_id=f"conv-{agent}") as turn:
            seen.append(turn.begin_cycle().action)
            for c in calls:
                v = turn.check_call(c)
                seen.append(v.action)
                if v.halted:
                    break
                seen.append(turn.record_outcome(c, tg.Outcome.ERROR if agent == "stuck" else tg.Outcome.OK).action)
        actions.append(seen)
    return actions


def config() -> tg.GuardConfig:
    return tg.GuardConfig(load_entrypoints=False, soft_cap=SOFT_CAP, hard_multiplier=2, streak_warn_at=3,
                          streak_stop_at=0)


def test_spans_logs_and_metrics_arrive_over_otlp_http(receiver):
    telemetry = configure(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-turnguard-token=s3cret",
            "OTEL_SERVICE_NAME": "turnguard-e2e",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        }
    )
    try:
        guard = tg.Guard(config(), **telemetry.providers())
        drive_turns(guard)
        assert telemetry.force_flush(10_000)
    finally:
        telemetry.shutdown()

    # -- spans: three turn spans, each call a child in the turn's trace
    spans = receiver.spans()
    assert {res["service.name"] for res, _ in spans} == {"turnguard-e2e"}
    by_name: dict[str, list] = {}
    for _, span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert {"invoke_agent clean", "invoke_agent runaway", "invoke_agent stuck"} <= set(by_name)
    runaway = by_name["invoke_agent runaway"][0]
    runaway_calls = [s for _, s in spans if s.trace_id == runaway.trace_id and s.name.startswith("execute_tool")]
    assert len(runaway_calls) == 2 * SOFT_CAP + 1  # calls 1..H and the halted H+1
    assert all(s.parent_span_id == runaway.span_id for s in runaway_calls)
    turn_attrs = attributes(runaway.attributes)
    assert turn_attrs[n.TURN_OUTCOME] == "halted"
    assert turn_attrs[n.LOOP_THRESHOLD] == "hard_backstop"
    assert turn_attrs[n.GEN_AI_CONVERSATION_ID] == "conv-runaway"
    stuck_calls = [attributes(s.attributes) for s in by_name["execute_tool poll"]]
    assert sorted(a[n.GEN_AI_TOOL_CALL_ID] for a in stuck_calls) == ["c0", "c1", "c2"]
    assert all(s.status.code == 2 for s in by_name["execute_tool poll"])  # STATUS_CODE_ERROR
    assert {a[n.ERROR_TYPE] for a in stuck_calls} == {n.ERROR_TYPE_OTHER}

    # -- log records: one per detection, in the offending span's context
    logs = [record for _, record in receiver.logs() if record.event_name == n.LOOP_DETECTED_EVENT]
    assert len(logs) == 2
    spans_by_id = {s.span_id: s for _, s in spans}
    for record in logs:
        attrs = attributes(record.attributes)
        assert record.severity_number == 13  # WARN
        offending = spans_by_id[record.span_id]
        assert record.trace_id == offending.trace_id
        if attrs[n.LOOP_THRESHOLD] == "hard_backstop":
            assert offending.name == f"execute_tool t{2 * SOFT_CAP}"
            assert (attrs[n.LOOP_LEVEL], attrs[n.LOOP_ACTION], attrs[n.LOOP_LIMIT]) == ("stop", "halt", 2 * SOFT_CAP)
        else:
            assert attrs[n.LOOP_THRESHOLD] == "streak"
            assert offending.name == "execute_tool poll"
            assert attributes(offending.attributes)[n.GEN_AI_TOOL_CALL_ID] == "c2"
            assert (attrs[n.LOOP_LEVEL], attrs[n.LOOP_ACTION], attrs[n.LOOP_STREAK_LENGTH]) == ("warn", "allow", 3)
        assert [e.name for e in offending.events] == [n.LOOP_DETECTED_EVENT]

    # -- metrics: the last export holds the cumulative state
    metrics = {}
    for _, metric in receiver.metrics():
        metrics[metric.name] = metric
    tool_calls = metrics[n.METRIC_TURN_TOOL_CALLS[0]]
    assert tool_calls.unit == "{tool_call}"
    points = list(tool_calls.histogram.data_points)
    assert sum(p.count for p in points) == 3
    assert sum(p.sum for p in points) == 3 + (2 * SOFT_CAP + 1) + 3
    bounds = list(points[0].explicit_bounds)
    assert all(float(SOFT_CAP * k) in bounds for k in range(1, 21))
    by_agent = {attributes(p.attributes)[n.GEN_AI_AGENT_NAME]: attributes(p.attributes) for p in points}
    assert by_agent["runaway"][n.LOOP_THRESHOLD] == "hard_backstop"
    assert by_agent["clean"][n.TURN_OUTCOME] == "completed"
    assert (by_agent["runaway"][n.TURN_PAST_SOFT_CAP], by_agent["clean"][n.TURN_PAST_SOFT_CAP]) == (True, False)
    detections = metrics[n.METRIC_DETECTIONS[0]]
    assert detections.sum.is_monotonic
    assert sum(p.as_int for p in detections.sum.data_points) == 2
    for metric in metrics.values():
        kind = metric.WhichOneof("data")
        for point in getattr(metric, kind).data_points:
            keys = set(attributes(point.attributes))
            assert not keys & n.FORBIDDEN_METRIC_ATTRIBUTES, (metric.name, keys)

    # -- the configured header reached the receiver on every request
    assert receiver.headers and all(h.get("x-turnguard-token") == "s3cret" for h in receiver.headers)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_collector_never_slows_or_changes_the_guard(caplog):
    expected = drive_turns(tg.Guard(config().replace(disable_plugins=("otel",))))
    telemetry = configure(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "300",
            "OTEL_BSP_SCHEDULE_DELAY": "10",
            "OTEL_BLRP_SCHEDULE_DELAY": "10",
            "OTEL_METRIC_EXPORT_INTERVAL": "50",
        }
    )
    guard = tg.Guard(config(), **telemetry.providers())
    rounds = []
    try:
        started = time.monotonic()
        while time.monotonic() - started < 0.6:  # long enough for exports to fail meanwhile
            round_start = time.perf_counter()
            actions = drive_turns(guard)
            rounds.append(time.perf_counter() - round_start)
            assert actions == expected
            time.sleep(0.02)
    finally:
        shutdown_start = time.perf_counter()
        telemetry.shutdown()
        shutdown_s = time.perf_counter() - shutdown_start
    failures = [
        r for r in caplog.records if r.name.startswith("opentelemetry.exporter") and "Failed to export" in r.message
    ]
    assert failures, "the exporters never tried (and failed) to export: the test did not test a dead collector"
    assert max(rounds) < 0.5, rounds  # ~35 guard calls per round, each only touching memory
    assert shutdown_s < 15


@pytest.fixture
def grpc_receiver():
    """A gRPC OTLP receiver on loopback (the proto package's generated servicers)."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got: dict[str, list] = {"traces": [], "metrics": [], "logs": []}

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            got["traces"].append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):
            got["metrics"].append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request, context):
            got["logs"].append(request)
            return logs_service_pb2.ExportLogsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", got
    finally:
        server.stop(grace=None).wait(5)


def test_grpc_protocol_exports_to_a_grpc_receiver(grpc_receiver):
    endpoint, got = grpc_receiver
    telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    try:
        drive_turns(tg.Guard(config(), **telemetry.providers()))
        assert telemetry.force_flush(10_000)
    finally:
        telemetry.shutdown()
    span_names = {span.name for _, span in received_items("traces", got["traces"])}
    assert {"invoke_agent clean", "execute_tool poll"} <= span_names
    events = [record.event_name for _, record in received_items("logs", got["logs"])]
    assert events.count(n.LOOP_DETECTED_EVENT) == 2
    metric_names = {metric.name for _, metric in received_items("metrics", got["metrics"])}
    assert n.METRIC_TURN_TOOL_CALLS[0] in metric_names


def test_demo_records_turns_and_exports_otlp_when_the_endpoint_is_set(receiver, tmp_path):
    """``turnguard demo`` (in its own process: it installs global providers) with the endpoint set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TURNGUARD_"))}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    done = subprocess.run(
        [sys.executable, "-m", "turnguard._cli", "demo", "soft-stuck"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / ".turnguard" / "turns.jsonl").read_text().splitlines()
    assert json.loads(line)["ended_by"] == "soft_stuck"
    assert {res["service.name"] for res, _ in receiver.spans()} == {"turnguard-demo"}
    events = [
        attributes(r.attributes)[n.LOOP_THRESHOLD] for _, r in receiver.logs() if r.event_name == n.LOOP_DETECTED_EVENT
    ]
    assert events == ["soft_stuck"]
    assert n.METRIC_TURN_TOOL_CALLS[0] in {m.name for _, m in receiver.metrics()}


def test_model_text_with_lone_surrogates_exports_whole_over_otlp_http(receiver):
    """The audit's case over the wire: 40 turns whose tool and agent names, conversation and call
    ids and end reasons hold lone surrogates (as ``json.loads`` gives them) all arrive, with their
    detections, late results and metrics; the clean batch after them too (no breaker opened)."""
    telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                                   "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                   "OTEL_METRIC_EXPORT_INTERVAL": "600000"})
    lone = [json.loads(f'"\\u{0xDC80 + i:04x}"') for i in range(40)]
    try:
        guard = tg.Guard(config(), **telemetry.providers())
        for i, bad in enumerate(lone):
            with guard.turn(agent_name=f"agent{bad}", conversation_id=f"conv{bad}") as turn:
                for k in range(3):  # one identical call three times: a streak warning
                    call = tg.ToolCall(f"tool{bad}", {"i": i}, call_id=f"call{bad}{k}")
                    turn.check_call(call)
                    turn.record_outcome(call, tg.Outcome.ERROR)
                turn.end(f"reason{bad}")
            assert guard.report_result(turn.result_token, True)
        assert telemetry.force_flush(10_000)
        with guard.turn(agent_name="clean") as turn:
            turn.check_call(tg.ToolCall("read", {}))
        assert telemetry.force_flush(10_000)
    finally:
        telemetry.shutdown()
    spans = [span for _, span in receiver.spans()]
    assert len([s for s in spans if s.name.startswith("invoke_agent agent")]) == 40
    assert len([s for s in spans if s.name.startswith("execute_tool tool")]) == 120
    assert {s.name for s in spans} >= {"invoke_agent agent\ufffd", "execute_tool tool\ufffd", "invoke_agent clean"}
    logs = [record for _, record in receiver.logs()]
    assert len([r for r in logs if r.event_name == n.LOOP_DETECTED_EVENT]) == 40
    results = [attributes(r.attributes) for r in logs if r.event_name == n.TURN_RESULT_EVENT]
    assert len(results) == 40 and {a[n.TURN_OUTCOME] for a in results} == {"reason\ufffd"}
    tool_calls = [m for _, m in receiver.metrics() if m.name == n.METRIC_TURN_TOOL_CALLS[0]][-1]
    assert sum(p.count for p in tool_calls.histogram.data_points) == 41
