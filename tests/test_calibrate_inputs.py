"""Readers: corpus JSONL (raw args, digests), the recorder's real output, OTLP JSON from the real
OpenTelemetry plugin encoded as the Collector's file exporter writes it, gzip, and bad input."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

import turnguard as tg
from turnguard._calibrate import records
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import InputProblem, RecordedCall
from turnguard.telemetry import _names as names
from turnguard.telemetry._testing import InMemoryTelemetry

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
        ('{"calls": [], "cycles": -1}', "'cycles' must be an integer from 0"),
        ('{"calls": [], "resolved": "yes"}', "'resolved' must be true, false or null"),
        ('{"calls": [{"tool": "t", "args": 1, "cycle": 0}]}', "'cycle' must be an integer from 1"),
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
    digests = [c.digest for c in recorded.calls]
    assert digests[0] == digests[1] != digests[2] and all(digests)
    assert [c.args for c in recorded.calls] == [None] * 3  # read as digests, as a tool span's are
    assert "p" not in json.dumps(digests)  # digests, not the arguments
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
    for expected in ("turnguard.call.index must be a whole number from 1 to 4,294,967,296, got 'x'",
                     "turnguard.call.key_digest missing",
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


# -- hostile input: every field that sizes work is bounded, every skipped line is counted -------

GOOD_CALL = {"tool": "read", "args": {"p": 1}, "outcome": "ok"}
TOO_BIG = records.MAX_TURN_CYCLES + 1


def corpus_with(tmp_path: Path, *bad: str) -> Path:
    """A good line, then each of ``bad``, then a good line."""
    good = json.dumps({"id": "good", "calls": [GOOD_CALL], "cycles": 1})
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join([good, *bad, good]) + "\n")
    return path


@pytest.mark.parametrize("value", ["1" + "0" * 30, str(TOO_BIG), "-1", "3.5", "1e400", "true", "false", '"3"',
                                   "[3]", "{}"])
@pytest.mark.parametrize("field", ["cycles", "cycle"])
def test_a_work_sizing_count_out_of_range_or_of_the_wrong_type_is_a_reported_problem(
    tmp_path: Path, field: str, value: str
) -> None:
    call = json.dumps(GOOD_CALL)[:-1] + (f', "cycle": {value}' if field == "cycle" else "") + "}"
    line = '{"id": "bad", "calls": [' + call + "]" + (f', "cycles": {value}' if field == "cycles" else "") + "}"
    turns, problems = read([corpus_with(tmp_path, line)])
    assert [t.id for t in turns] == ["good", "good"]
    assert [(p.line, f"'{field}' must be an integer from") for p in problems] == [
        (2, p.message[p.message.index("'"):p.message.index("from") + 4]) for p in problems]
    assert len(problems[0].message) < 200  # a 10**30 or a huge repr is not pasted whole


@pytest.mark.parametrize("field", ["cycles", "cycle"])
def test_the_largest_accepted_count_is_the_documented_limit(tmp_path: Path, field: str) -> None:
    top = records.MAX_TURN_CYCLES
    call = {**GOOD_CALL, "cycle": top} if field == "cycle" else GOOD_CALL
    (_, turn, _), problems = read([corpus_with(tmp_path, json.dumps({"id": "top", "calls": [call], "cycles": top}))])
    assert problems == [] and turn.id == "top" and turn.cycles == top


def test_a_turn_with_more_calls_than_the_limit_is_a_reported_problem(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "MAX_TURN_CALLS", 3)
    at_limit = json.dumps({"id": "three", "calls": [GOOD_CALL] * 3})
    over = json.dumps({"id": "four", "calls": [GOOD_CALL] * 4})
    turns, problems = read([corpus_with(tmp_path, at_limit, over)])
    assert [t.id for t in turns] == ["good", "three", "good"]
    assert [(p.line, "more than the limit of 3" in p.message) for p in problems] == [(3, True)]


@pytest.mark.parametrize("cycles", [{"intValue": "1" + "0" * 30}, {"intValue": str(TOO_BIG)}, {"intValue": "-2"},
                                    {"doubleValue": 3.0}, {"boolValue": True}, {"stringValue": "3"}])
def test_an_otlp_turn_cycles_attribute_out_of_range_is_reported_and_the_turn_kept(tmp_path: Path, cycles) -> None:
    turn = span("invoke_agent coder", "aaaa", None, {names.TURN_ID: "T"})
    turn["attributes"].append({"key": names.TURN_CYCLES, "value": cycles})
    path = tmp_path / "collector.json"
    path.write_text(collector_line([tool_span("b1", "aaaa", 1), turn]) + "\n")
    (replayed,), problems = read([path])
    assert replayed.cycles is None and len(replayed.calls) == 1
    assert [(p.line, names.TURN_CYCLES in p.message) for p in problems] == [(1, True)]


def test_otlp_calls_past_the_per_turn_limit_are_reported_not_accumulated(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "MAX_TURN_CALLS", 2)
    lines = [collector_line([tool_span(f"b{i}", "aaaa", i)]) for i in range(1, 5)]
    lines.append(collector_line([span("invoke_agent coder", "aaaa", None, {names.TURN_ID: "T"})]))
    path = tmp_path / "collector.json"
    path.write_text("\n".join(lines) + "\n")
    (turn,), problems = read([path])
    assert len(turn.calls) == 2
    assert [p.line for p in problems] == [3, 4]


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("depth", [10_000, 100_000])
@pytest.mark.parametrize("where", ["args", "cycles", "line", "id", "otlp"])
def test_nesting_too_deep_to_parse_is_a_reported_problem(tmp_path: Path, depth: int, where: str) -> None:
    deep = nested(depth)
    line = {
        "args": '{"calls": [{"tool": "t", "args": ' + deep + ', "outcome": "ok"}]}',
        "cycles": '{"calls": [], "cycles": ' + deep + "}",
        "line": deep,
        "id": '{"id": ' + deep + ', "calls": []}',
        "otlp": '{"resourceSpans": ' + deep + "}",
    }[where]
    turns, problems = read([corpus_with(tmp_path, line)])
    assert [t.id for t in turns] == ["good", "good"]
    assert [(p.line, p.message) for p in problems] == [(2, "not readable: JSON nested too deeply")]


@pytest.mark.parametrize("depth", [100, 900, 980, 990, 995, 1000, 1010, 2000])
def test_nesting_near_the_parsers_limit_is_either_read_or_reported(tmp_path: Path, depth: int) -> None:
    line = '{"id": "deep", "calls": [{"tool": "t", "args": ' + nested(depth) + ', "outcome": "ok"}]}'
    turns, problems = read([corpus_with(tmp_path, line)])
    assert len(turns) + len(problems) == 3
    assert [t.id for t in turns if t.id != "deep"] == ["good", "good"]


@pytest.mark.parametrize("line", ["null", "1", "-2.5", '"a turn"', "true", "[]", '[{"calls": []}]',
                                  '"resourceSpans"', '["resourceSpans"]', "null   "])
def test_a_json_line_that_is_not_an_object_is_counted_as_skipped(tmp_path: Path, line: str) -> None:
    turns, problems = read([corpus_with(tmp_path, line, line)])
    assert [t.id for t in turns] == ["good", "good"]
    assert [p.line for p in problems] == [2, 3]
    assert all("expected a JSON object" in p.message and p.message.endswith("skipped") for p in problems)


@pytest.mark.parametrize("limit", [1, 100, 4096])
def test_a_line_longer_than_the_limit_is_skipped_and_one_at_the_limit_is_read(tmp_path: Path, limit: int) -> None:
    def line_of(size: int, turn_id: str) -> bytes:
        head = b'{"id": "' + turn_id.encode() + b'", "calls": []'
        return head + b" " * max(size - len(head) - 1, 0) + b"}"

    at, over = line_of(limit, "at"), line_of(limit + 1, "over")
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"\n".join([at, over, over + b" " * 3 * records.SKIP_BLOCK, at]) + (b"\n" if limit > 1 else b""))
    problems: list[InputProblem] = []
    turns = list(read_turns([path], problems.append, max_line_bytes=max(limit, len(at))))
    if len(at) > limit:  # a limit below the smallest turn: nothing fits
        return
    assert [t.id for t in turns] == ["at", "at"]
    assert [(p.line, "longer than the limit" in p.message) for p in problems] == [(2, True), (3, True)]
    assert f": {limit + 1 + 3 * records.SKIP_BLOCK + 1:,} bytes with its newline" in problems[1].message


def test_the_default_limit_reads_a_line_at_it_and_skips_one_past_it(tmp_path: Path) -> None:
    limit = records.MAX_LINE_BYTES
    head = b'{"id": "big", "calls": ['
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        f.write(head + b" " * (limit - len(head) - 2) + b"]}\n")  # exactly the limit: read
        f.write(head + b" " * (limit - len(head) - 1) + b"]}\n")  # one byte more: skipped
    problems: list[InputProblem] = []
    assert [t.id for t in read_turns([path], problems.append)] == ["big"]
    assert [p.line for p in problems] == [2]


def test_a_line_far_past_the_limit_is_skipped_holding_at_most_the_limit_of_it(tmp_path: Path) -> None:
    limit = records.MAX_LINE_BYTES
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.write(b'{"id": "huge", "calls": [' + b" " * (4 * limit) + b"]}\n")
        f.write(json.dumps({"id": "after", "calls": []}).encode() + b"\n")
    problems: list[InputProblem] = []
    tracemalloc.start()
    try:
        turns = [t.id for t in read_turns([path], problems.append)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert turns == ["after"] and [p.line for p in problems] == [1]
    assert peak < 2.5 * limit  # readline joins its pieces (2x); reading it whole (as before) holds 4x


def test_otlp_calls_waiting_for_their_turn_spans_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "MAX_WAITING_CALLS", 3)
    lines = [collector_line([tool_span(f"c{t}{i}", f"p{t}", i) for i in (1, 2)]) for t in range(3)]
    lines.append(collector_line([span("invoke_agent coder", "p2", None, {names.TURN_ID: "T2"})]))
    path = tmp_path / "collector.json"
    path.write_text("\n".join(lines) + "\n")
    turns, problems = read([path])
    assert [(t.id, len(t.calls)) for t in turns] == [("p0", 2), ("p1", 2), ("T2", 2)]
    assert [p.line for p in problems] == [1, 2]  # the fourth waiting call releases the oldest turn
    assert all("waited longest" in p.message for p in problems)
