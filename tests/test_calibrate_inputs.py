"""Readers: corpus JSONL (raw args, digests), the recorder's real output, OTLP JSON from the real
OpenTelemetry plugin encoded as the Collector's file exporter writes it, gzip, and bad input."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

import turnguard as tg
from turnguard.calibrate.inputs import InputProblem, RecordedCall, read_turns
from turnguard.telemetry import names
from turnguard.telemetry.testing import InMemoryTelemetry

CORPUS_LINE = {
    "source": "test", "id": "t1",
    "calls": [
        {"tool": "read", "args": '{"b": 1, "a": 2}', "outcome": "ok"},
        {"tool": "read", "args": {"a": 2, "b": 1}, "outcome": "error"},
        {"tool": "cd", "args": "cd x\n", "outcome": "denied"},
        {"tool": "cd", "digest": "ab12", "outcome": "unknown"},
    ],
    "cycles": 3, "resolved": False, "ended_by": "exit_cost",
}


def read(paths: list[Path]) -> tuple[list, list[InputProblem]]:
    problems: list[InputProblem] = []
    return list(read_turns(paths, problems.append)), problems


def test_corpus_line_with_raw_args_and_digests_becomes_a_turn(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(CORPUS_LINE) + "\n\n")
    (turn,), problems = read([path])
    assert problems == []
    assert (turn.id, turn.cycles, turn.resolved, turn.ended_by, turn.source) == ("t1", 3, False, "exit_cost", "test")
    assert [c.outcome for c in turn.calls] == [tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.DENIED, tg.Outcome.UNKNOWN]
    assert turn.calls[3] == RecordedCall("cd", None, "ab12", tg.Outcome.UNKNOWN)
    assert turn.origin == f"{path}:1"


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "turns.data"
    path.write_bytes(gzip.compress((json.dumps(CORPUS_LINE) + "\n").encode() * 3))
    turns, problems = read([path])
    assert len(turns) == 3 and problems == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"id": "x"}', "'calls' is missing"),
        ('{"calls": [{"args": "x"}]}', "call 1: 'tool' is missing"),
        ('{"calls": [{"tool": ["t"], "args": 1, "outcome": "ok"}]}', "call 1: 'tool' is missing or not a non-empty"),
        ('{"calls": [{"tool": "", "args": 1, "outcome": "ok"}]}', "call 1: 'tool' is missing or not a non-empty"),
        ('{"calls": [{"tool": "t"}]}', "call 1: neither 'args' nor 'digest'"),
        ('{"calls": [{"tool": "t", "args": 1, "outcome": "exploded"}]}', "unknown outcome 'exploded'"),
        ('{"calls": [], "cycles": -1}', "'cycles' must be a non-negative integer"),
        ('{"calls": [], "resolved": "yes"}', "'resolved' must be true, false or null"),
        ('{"calls": [{"tool": "t", "args": 1, "cycle": 0}]}', "'cycle' must be a positive integer"),
    ],
)
def test_malformed_line_is_reported_with_file_and_line_and_the_rest_is_read(
    tmp_path: Path, line: str, expected: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(CORPUS_LINE) + "\n" + line + "\n" + json.dumps(CORPUS_LINE) + "\n")
    turns, problems = read([path])
    assert len(turns) == 2
    assert len(problems) == 1
    assert (problems[0].path, problems[0].line) == (str(path), 2)
    assert expected in problems[0].message


def test_truncated_gzip_is_reported_not_silently_cut(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    rng = random.Random(0)
    lines = [json.dumps({**CORPUS_LINE, "id": f"{i}-{rng.getrandbits(512):x}"}) + "\n" for i in range(2000)]
    data = gzip.compress("".join(lines).encode())
    path.write_bytes(data[: len(data) // 2])
    turns, problems = read([path])
    assert problems and "file ends badly" in problems[-1].message
    assert 0 < len(turns) < 2000  # the whole lines before the cut are kept


def test_recorder_output_reads_back_with_the_same_identity(tmp_path: Path) -> None:
    """The telemetry recorder's own lines (digests in place of args) replay the same repeats."""
    path = tmp_path / "rec.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(path), disable_plugins=("otel",), load_entrypoints=False),
                     environ={})
    with guard.turn(turn_id="rec-1") as turn:
        turn.begin_cycle()
        for args in ({"p": 1}, {"p": 1}, {"p": 2}):
            call = tg.ToolCall("read", args)
            turn.check_call(call)
            turn.record_outcome(call, tg.Outcome.ERROR)
    (recorded,), problems = read([path])
    assert problems == []
    assert recorded.id == "rec-1" and recorded.cycles == 1
    assert [c.tool for c in recorded.calls] == ["read"] * 3
    args = [c.args for c in recorded.calls]
    assert args[0] == args[1] != args[2]
    assert "p" not in json.dumps(args)  # digests, not the arguments
    assert all(c.outcome is tg.Outcome.ERROR for c in recorded.calls)


def otlp_lines(spans) -> list[str]:
    """One Collector-file-exporter line per export batch: OTLP JSON of the real encoder."""
    return [json.dumps(MessageToDict(encode_spans(batch))) for batch in spans]


def traced_turns(telemetry: InMemoryTelemetry, specs: list[tuple[str, list[tuple[str, dict, str]]]]) -> None:
    guard = tg.Guard(tg.GuardConfig(disable_plugins=("recorder", "shadow"), load_entrypoints=False), environ={},
                     **telemetry.providers())
    for turn_id, calls in specs:
        with guard.turn(turn_id=turn_id, agent_name="coder") as turn:
            turn.begin_cycle()
            turn.begin_cycle()
            for name, args, outcome in calls:
                call = tg.ToolCall(name, args)
                if turn.check_call(call).action is tg.Action.HALT:
                    break
                turn.record_outcome(call, outcome)


def test_otlp_json_turns_are_rebuilt_from_turnguards_spans(tmp_path: Path) -> None:
    telemetry = InMemoryTelemetry()
    traced_turns(telemetry, [
        ("turn-a", [("read", {"p": 1}, "ok"), ("read", {"p": 1}, "error"), ("grep", {"q": "x"}, "denied")]),
        ("turn-b", [("ls", {}, "ok")]),
    ])
    spans = telemetry.span_exporter.get_finished_spans()
    path = tmp_path / "otlp.json"
    # Split mid-turn across lines, as batches are: calls wait for their turn span.
    path.write_text("\n".join(otlp_lines([spans[:2], spans[2:]])) + "\n")
    turns, problems = read([path])
    assert problems == []
    by_id = {t.id: t for t in turns}
    a = by_id["turn-a"]
    assert [c.tool for c in a.calls] == ["read", "read", "grep"]
    assert [c.outcome for c in a.calls] == [tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.DENIED]
    assert a.calls[0].digest == a.calls[1].digest != a.calls[2].digest
    assert a.cycles == 2 and a.ended_by == "completed" and a.resolved is None
    assert [c.tool for c in by_id["turn-b"].calls] == ["ls"]


def span(name: str, span_id: str, parent: str | None, attrs: dict) -> dict:
    def value(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        return {"stringValue": v}
    out = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": span_id, "name": name,
           "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    if parent:
        out["parentSpanId"] = parent
    return out


def collector_line(spans: list[dict]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"scope": {"name": "turnguard"}, "spans": spans}]}]})


def tool_span(span_id: str, parent: str | None, index, digest="d1", outcome="ok") -> dict:
    attrs = {names.GEN_AI_TOOL_NAME: "read", names.CALL_INDEX: index, names.CALL_OUTCOME: outcome}
    if digest is not None:
        attrs[names.CALL_KEY_DIGEST] = digest
    return span("execute_tool read", span_id, parent, attrs)


def test_malformed_spans_are_reported_and_orphan_calls_still_replayed(tmp_path: Path) -> None:
    turn = span("invoke_agent coder", "aaaa", None, {names.TURN_ID: "T", names.TURN_CYCLES: 4,
                                                     names.TURN_OUTCOME: "halted"})
    lines = [
        collector_line([tool_span("b1", "aaaa", 2, outcome="error"), tool_span("b2", "aaaa", 1)]),
        collector_line([tool_span("b3", "aaaa", "x"), tool_span("b4", "aaaa", 3, digest=None),
                        tool_span("b5", "aaaa", 4, outcome="exploded"), {"no": "name"}]),
        collector_line([turn, span("GET /api", "cccc", None, {"http.method": "GET"})]),
        collector_line([tool_span("b6", "ffff", 1)]),  # its turn span never comes
        '{"resourceSpans": 5}',
    ]
    path = tmp_path / "collector.json"
    path.write_text("\n".join(lines) + "\n")
    turns, problems = read([path])
    assert [(t.id, [c.outcome for c in t.calls]) for t in turns] == [
        ("T", [tg.Outcome.OK, tg.Outcome.ERROR]),
        ("ffff", [tg.Outcome.OK]),
    ]
    assert turns[0].cycles == 4 and turns[0].ended_by == "halted"
    messages = [(p.line, p.message) for p in problems]
    assert [line for line, _ in messages] == [2, 2, 2, 2, 5, 4]
    text = " | ".join(m for _, m in messages)
    for expected in ("turnguard.call.index is not a positive integer", "turnguard.call.key_digest missing",
                     "unknown turnguard.call.outcome 'exploded'", "span without a name",
                     "'resourceSpans' is not a list", "without their turn span"):
        assert expected in text


def test_formats_mix_freely_in_one_run(tmp_path: Path) -> None:
    corpus = tmp_path / "a.jsonl"
    corpus.write_text(json.dumps(CORPUS_LINE) + "\n")
    otlp = tmp_path / "b.json.gz"
    turn = span("invoke_agent coder", "aaaa", None, {names.TURN_ID: "T"})
    otlp.write_bytes(gzip.compress((collector_line([tool_span("b1", "aaaa", 1), turn]) + "\n").encode()))
    turns, problems = read([corpus, otlp])
    assert [t.id for t in turns] == ["t1", "T"] and problems == []
