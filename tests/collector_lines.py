"""OTLP JSON lines as the Collector's file exporter writes them, from real turnguard spans.

``spans_of(specs)`` runs turns through a real ``Guard`` with the OpenTelemetry plugin into
in-memory SDK providers; ``collector_lines(batches)`` encodes each batch with the SDK's own OTLP
encoder and writes it as protojson does (ids in hex, as the OTLP JSON mapping says; the protobuf
library's ``MessageToDict`` would give base64), one ``{"resourceSpans": [...]}`` object per line.
Log records (late results) the same way: ``log_lines``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

import turnguard as tg
from turnguard.telemetry._testing import InMemoryTelemetry

ID_FIELDS = ("traceId", "spanId", "parentSpanId")

Call = tuple[str, Any, str]
"""A tool call of a spec: (tool, arguments, outcome)."""


def _hex_ids(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in ID_FIELDS and isinstance(v, str) else _hex_ids(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_ids(v) for v in node]
    return node


def collector_lines(batches: Iterable[Sequence[Any]]) -> list[str]:
    """One file-exporter line per export batch of ``ReadableSpan``s."""
    return [json.dumps(_hex_ids(MessageToDict(encode_spans(list(batch)))), separators=(",", ":"))
            for batch in batches if batch]


def log_lines(batches: Iterable[Sequence[Any]]) -> list[str]:
    """One file-exporter line per export batch of log records (``ReadableLogRecord``s)."""
    return [json.dumps(_hex_ids(MessageToDict(encode_logs(list(batch)))), separators=(",", ":"))
            for batch in batches if batch]


def run_turns(specs: Iterable[tuple[str, Sequence[Call]]], telemetry: InMemoryTelemetry | None = None,
              **config: Any) -> InMemoryTelemetry:
    """Run each ``(turn id, calls)`` through a real guard reporting into ``telemetry``; a call the
    guard halts ends its turn."""
    telemetry = telemetry or InMemoryTelemetry()
    options = {"disable_plugins": ("recorder", "shadow"), "load_entrypoints": False, **config}
    guard = tg.Guard(tg.GuardConfig(**options), environ={}, **telemetry.providers())
    for turn_id, calls in specs:
        with guard.turn(turn_id=turn_id, agent_name="coder", promptable=False) as turn:
            for name, args, outcome in calls:
                turn.begin_cycle()
                call = tg.ToolCall(name, args)
                if turn.check_call(call).action is tg.Action.HALT:
                    break
                if turn.record_outcome(call, outcome).action is tg.Action.HALT:
                    break
    return telemetry
