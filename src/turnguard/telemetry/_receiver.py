"""A small OTLP/HTTP receiver on loopback: decodes what real OTLP exporters send.

For end-to-end tests and benchmarks (and a quick look at what turnguard exports without a
Collector): ``with OtlpReceiver() as rx:`` listens on ``127.0.0.1`` at a free port, accepts
``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` in ``application/x-protobuf`` (optionally
gzip-compressed), decodes them with ``opentelemetry-proto``, and answers like a Collector. Set
``keep=False`` to count payloads without keeping them (a sink for benchmarks).
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_ROUTES: dict[str, tuple[str, Any, Any]] = {
    "/v1/traces": ("traces", ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": ("metrics", ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": ("logs", ExportLogsServiceRequest, ExportLogsServiceResponse),
}
_NESTING = {
    "traces": ("resource_spans", "scope_spans", "spans"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
    "logs": ("resource_logs", "scope_logs", "log_records"),
}
"""Where each signal's items sit in its export request: the three nest alike under different names."""


def any_value(value: AnyValue) -> Any:
    """A protobuf ``AnyValue`` as the Python value it holds."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    """Repeated ``KeyValue`` as a dict."""
    return {kv.key: any_value(kv.value) for kv in pairs}


def received_items(signal: str, requests: Iterable[Any]) -> list[tuple[dict[str, Any], Any]]:
    """The items (spans, metrics or log records) of ``signal``'s export ``requests``, flattened out
    of OTLP's resource / scope nesting, as (resource attributes, item message)."""
    resources, scopes, items = _NESTING[signal]
    return [
        (attributes(resource.resource.attributes), item)
        for request in requests
        for resource in getattr(request, resources)
        for scope in getattr(resource, scopes)
        for item in getattr(scope, items)
    ]


class OtlpReceiver:
    """OTLP/HTTP protobuf receiver on ``127.0.0.1``; thread-safe accessors for what arrived."""

    def __init__(self, *, port: int = 0, keep: bool = True) -> None:
        self.keep = keep
        self.requests: dict[str, list[Any]] = {"traces": [], "metrics": [], "logs": []}
        self.counts: dict[str, int] = {"traces": 0, "metrics": 0, "logs": 0}
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what arrived ------------------------------------------------------------------------------

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received, as (resource attributes, ``Span`` message)."""
        return self._received_items("traces")

    def logs(self) -> list[tuple[dict[str, Any], Any]]:
        """Every log record received, as (resource attributes, ``LogRecord`` message)."""
        return self._received_items("logs")

    def metrics(self) -> list[tuple[dict[str, Any], Any]]:
        """Every metric received (one per export), as (resource attributes, ``Metric`` message)."""
        return self._received_items("metrics")

    def _received_items(self, signal: str) -> list[tuple[dict[str, Any], Any]]:
        with self._lock:
            requests = list(self.requests[signal])
        return received_items(signal, requests)

    def wait_for(self, predicate: Callable[[OtlpReceiver], bool], timeout: float = 10.0) -> bool:
        """Block until ``predicate(self)`` holds (re-checked on each payload) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._changed:
                self._changed.wait(min(remaining, 0.2))
        return True

    # -- HTTP --------------------------------------------------------------------------------------

    def received(self, signal: str, message: Any, headers: dict[str, str]) -> None:
        """One request of ``signal`` came in (the HTTP handler's call): counted, kept if asked."""
        with self._changed:
            self.counts[signal] += 1
            if self.keep:
                self.requests[signal].append(message)
                self.headers.append(headers)
            self._changed.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                route = _ROUTES.get(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if route is None:
                    self._reply(404, b"")
                    return
                signal, request_type, response_type = route
                try:
                    encoding = (self.headers.get("Content-Encoding") or "").lower()
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    message = request_type.FromString(body)
                except Exception:
                    self._reply(400, b"")
                    return
                receiver.received(signal, message, {k.lower(): v for k, v in self.headers.items()})
                self._reply(200, response_type().SerializeToString())

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler
