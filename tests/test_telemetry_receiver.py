"""The loopback OTLP/HTTP receiver used by the end-to-end tests and the benchmark."""

from __future__ import annotations

import gzip
import http.client

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from turnguard.telemetry._receiver import OtlpReceiver


@pytest.fixture
def receiver():
    with OtlpReceiver() as rx:
        yield rx


def post(rx: OtlpReceiver, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", rx.port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/x-protobuf", **(headers or {})})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def request_with_span(name: str) -> bytes:
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.add(name=name, trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    return req.SerializeToString()


def test_decodes_plain_and_gzip_payloads(receiver):
    assert post(receiver, "/v1/traces", request_with_span("plain")) == 200
    assert post(receiver, "/v1/traces", gzip.compress(request_with_span("zipped")), {"Content-Encoding": "gzip"}) == 200
    assert [span.name for _, span in receiver.spans()] == ["plain", "zipped"]


def test_rejects_garbage_and_unknown_paths(receiver):
    assert post(receiver, "/v1/traces", b"\xff\xff not protobuf") == 400
    assert post(receiver, "/v1/traces", b"not gzip", {"Content-Encoding": "gzip"}) == 400
    assert post(receiver, "/v1/profiles", b"") == 404
    assert receiver.counts == {"traces": 0, "metrics": 0, "logs": 0}


def test_sink_mode_counts_without_keeping():
    with OtlpReceiver(keep=False) as rx:
        assert post(rx, "/v1/traces", request_with_span("x")) == 200
        assert rx.counts["traces"] == 1 and rx.spans() == []


def test_wait_for_times_out(receiver):
    assert not receiver.wait_for(lambda rx: rx.counts["logs"] > 0, timeout=0.05)
