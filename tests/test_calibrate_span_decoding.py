"""The fast reading of Collector lines (msgspec, ``collector.decode``) gives what the plain reading
(the ``json`` module) gives, on every line: the same turns, problems and waiting calls, whether a
line is well formed, odd or hostile; and so the same figures, byte for byte, with one process or
worker processes reading byte ranges, with or without msgspec installed."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from synthetic import SMALL, records, turn_spans
from turnguard._calibrate import cli, collector, parallel
from turnguard._calibrate import records as record_types
from turnguard._calibrate.collector import OtlpAssembler
from turnguard._calibrate.inputs import read_source
from turnguard._calibrate.records import LineSource
from turnguard.telemetry import _names as names

pytestmark = pytest.mark.skipif(not collector.AVAILABLE, reason="msgspec (the cli extra) is not installed")

GRID = ["--soft-caps", "5,20", "--multipliers", "2,4", "--stuck-repeats", "3,6", "--explicit-caps", "15"]


# -- generated Collector streams ------------------------------------------------------------------


def stream_lines(seed: int, turns: int = 60, *, logs: bool = True, corpus: bool = True) -> list[str]:
    """Collector lines of generated turns as the file exporter writes them, the hard way: several
    turns in flight at once (their tool spans interleaved), batches cut anywhere (a turn's spans
    over many lines), host spans beside ours, late results as log records, and a few corpus lines,
    blank lines and broken ones among them."""
    rng = random.Random(seed)
    clock = [1_764_633_600_000_000_000]
    queues = [turn_spans({**r, "resolved": None if rng.random() < 0.3 else r["resolved"]}, rng, clock)
              for r in records(turns, seed=seed, mix=SMALL)]
    spans: list[dict] = []
    in_flight: list[list[dict]] = []
    while queues or in_flight:
        while queues and (len(in_flight) < rng.randint(1, 4)):
            in_flight.append(queues.pop(0))
        current = rng.choice(in_flight)
        spans.append(current.pop(0))
        if not current:
            in_flight.remove(current)
        if rng.random() < 0.05:
            spans.append(host_span(rng))
    lines, i = [], 0
    while i < len(spans):
        k = rng.choice((1, 2, 7, 30, 120))
        lines.append(span_line(spans[i:i + k]))
        i += k
        if logs and rng.random() < 0.1:
            lines.append(result_line(f"gen-{rng.randrange(turns)}", rng.random() < 0.5))
        if corpus and rng.random() < 0.03:
            lines.append(json.dumps(next(records(1, seed=rng.randrange(1000), mix=SMALL)) | {"id": f"c{i}"}))
        if rng.random() < 0.02:
            lines.append(rng.choice(["", "   ", "{broken", '{"resourceSpans": 5}', "[1, 2]"]))
    return lines


def host_span(rng: random.Random) -> dict:
    """A span of the host's own, with attribute kinds turnguard never writes."""
    return {"traceId": "ab" * 16, "spanId": f"{rng.getrandbits(64):016x}", "name": "POST /v1/chat",
            "attributes": [{"key": "http.status_code", "value": {"intValue": "200"}},
                           {"key": "gen_ai.response.finish_reasons",
                            "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}}},
                           {"key": "blob", "value": {"bytesValue": "AAEC"}},
                           {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "a", "value": {}}]}}},
                           {"key": "ratio", "value": {"doubleValue": 0.5}}],
            "events": [{"name": "x", "attributes": []}], "status": {"code": 1}}


def span_line(spans: list[dict]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [
        {"scope": {"name": "turnguard"}, "spans": spans}]}]}, separators=(",", ":"))


def result_line(turn_id: str, resolved: bool) -> str:
    attrs = [{"key": "event.name", "value": {"stringValue": "turnguard.turn.result"}},
             {"key": names.TURN_ID, "value": {"stringValue": turn_id}},
             {"key": "turnguard.turn.resolved", "value": {"boolValue": resolved}}]
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{"attributes": attrs}]}]}]})


# -- hostile changes to one line ------------------------------------------------------------------


def _attr(span: dict, key: str) -> dict | None:
    attrs = span.get("attributes")
    return next((a for a in attrs if isinstance(a, dict) and a.get("key") == key), None) if isinstance(
        attrs, list) else None


def _set_value(key: str, value: Any) -> Callable[[dict, random.Random], None]:
    def change(span: dict, rng: random.Random) -> None:
        found = _attr(span, key)
        if found is not None:
            found["value"] = value
    return change


def _set_field(field: str, value: Any) -> Callable[[dict, random.Random], None]:
    def change(span: dict, rng: random.Random) -> None:
        span[field] = value
    return change


def _drop_field(field: str) -> Callable[[dict, random.Random], None]:
    def change(span: dict, rng: random.Random) -> None:
        span.pop(field, None)
    return change


def _duplicate_attribute(span: dict, rng: random.Random) -> None:
    attrs = span.get("attributes")
    if isinstance(attrs, list) and attrs and isinstance(attrs[0], dict):
        attrs.append({"key": attrs[rng.randrange(len(attrs))].get("key"), "value": {"stringValue": "again"}})


SPAN_CHANGES: list[Callable[[dict, random.Random], None]] = [
    _set_value(names.CALL_INDEX, {"intValue": "0"}),
    _set_value(names.CALL_INDEX, {"intValue": "-3"}),
    _set_value(names.CALL_INDEX, {"intValue": "abc"}),
    _set_value(names.CALL_INDEX, {"intValue": " 7 "}),
    _set_value(names.CALL_INDEX, {"intValue": "1_0"}),
    _set_value(names.CALL_INDEX, {"intValue": 4}),
    _set_value(names.CALL_INDEX, {"intValue": 4.7}),
    _set_value(names.CALL_INDEX, {"intValue": True}),
    _set_value(names.CALL_INDEX, {"intValue": None}),
    _set_value(names.CALL_INDEX, {"intValue": "9" * 5000}),
    _set_value(names.CALL_INDEX, {"boolValue": True}),
    _set_value(names.CALL_INDEX, {"stringValue": "3", "intValue": "3"}),
    _set_value(names.CALL_INDEX, {"doubleValue": 3}),
    _set_value(names.CALL_INDEX, {}),
    _set_value(names.CALL_INDEX, None),
    _set_value(names.CALL_KEY_DIGEST, {"stringValue": ""}),
    _set_value(names.CALL_KEY_DIGEST, {"stringValue": "d" * 300}),
    _set_value(names.CALL_KEY_DIGEST, {"intValue": "12"}),
    _set_value(names.GEN_AI_TOOL_NAME, {"stringValue": ""}),
    _set_value(names.GEN_AI_TOOL_NAME, {"stringValue": None}),
    _set_value(names.GEN_AI_TOOL_NAME, {"arrayValue": {"values": [{"stringValue": "a"}, None]}}),
    _set_value(names.GEN_AI_TOOL_NAME, {"arrayValue": None}),
    _set_value(names.GEN_AI_TOOL_NAME, {"arrayValue": {"values": None}}),
    _set_value(names.GEN_AI_TOOL_NAME, {"arrayValue": [1]}),
    _set_value(names.GEN_AI_TOOL_NAME, {"arrayValue": {"values": [1, "x", {"arrayValue": {"values": [[]]}}]}}),
    _set_value(names.TURN_ID, {"arrayValue": {"values": [{"arrayValue": {"values": [{"stringValue": "x"}]}}] * 3}}),
    _set_value(names.CALL_OUTCOME, {"stringValue": "OK"}),
    _set_value(names.CALL_OUTCOME, {"stringValue": "unfinished"}),
    _set_value(names.CALL_OUTCOME, {"stringValue": "exploded"}),
    _set_value(names.CALL_OUTCOME, {"boolValue": False}),
    _set_value(names.TURN_ID, {"stringValue": "x" * 300}),
    _set_value(names.TURN_ID, {"intValue": "77"}),
    _set_value(names.TURN_CYCLES, {"intValue": "-1"}),
    _set_value(names.TURN_CYCLES, {"stringValue": "5"}),
    _set_value(names.TURN_CYCLES, {"doubleValue": 5}),
    _set_value(names.TURN_CYCLES, {"doubleValue": 5.5}),
    _set_value("turnguard.turn.resolved", {"boolValue": True}),
    _set_value("turnguard.turn.resolved", {"stringValue": "maybe"}),
    _set_value(names.CAP_MODE, {"stringValue": "sideways"}),
    _set_value(names.LOOP_SOFT_CAP, {"intValue": str(2**70)}),
    _set_field("parentSpanId", ""),
    _set_field("parentSpanId", "p" * 300),
    _set_field("parentSpanId", None),
    _set_field("spanId", ""),
    _set_field("startTimeUnixNano", "9" * 400),
    _set_field("startTimeUnixNano", "-5"),
    _set_field("endTimeUnixNano", 17),
    _set_field("endTimeUnixNano", "soon"),
    _set_field("events", [{"name": names.ESCALATION_RESOLVED_EVENT,
                          "attributes": [{"key": names.ESCALATION_ANSWER, "value": {"stringValue": "continue"}}]}]),
    _set_field("events", [{"name": names.ESCALATION_RESOLVED_EVENT, "attributes": None}, 3, None]),
    _set_field("events", {"name": names.ESCALATION_RESOLVED_EVENT}),
    _set_field("events", None),
    _drop_field("events"),
    _set_field("attributes", None),
    _set_field("attributes", []),
    _drop_field("parentSpanId"),
    _drop_field("startTimeUnixNano"),
    _drop_field("spanId"),
    _duplicate_attribute,
    _set_field("attributes", {"key": "x"}),
    _set_value(names.GEN_AI_TOOL_NAME, {"stringValue": 5}),
    _set_value(names.GEN_AI_TOOL_NAME, "plain"),
    _set_value(names.CALL_INDEX, {"intValue": [1]}),
    _set_value(names.CALL_INDEX, {"boolValue": "yes"}),
]
"""Changes the fast path reads itself: each must agree with the plain reading."""
FALLBACK_CHANGES: list[Callable[[dict, random.Random], None]] = [
    _set_field("name", 5),
    _drop_field("name"),
    _set_field("spanId", 12),
    _set_field("parentSpanId", ["p"]),
    _set_field("startTimeUnixNano", 1.5),
]
"""Changes of a field's JSON type: the fast path gives the line to the plain reading."""
TEXT_CHANGES: list[Callable[[str, random.Random], str]] = [
    lambda line, rng: line.replace('"stringValue":"', '"stringValue":"\\ud800', 1),
    lambda line, rng: line.replace('"stringValue":"', '"stringValue":"\\udc00\\ud83d', 1),
    lambda line, rng: line.replace('"traceId":"', '"traceId":"\\u00e9\\uD83D\\uDE00', 1),
    lambda line, rng: line.replace('"flags":', '"flags":NaN,"x":', 1),
    lambda line, rng: line.replace('"flags":', '"flags":-Infinity,"x":', 1),
    lambda line, rng: line.replace('"flags":', '"flags":1e999,"x":', 1),
    lambda line, rng: line.replace('"flags":', '"flags":123456789012345678901234567890,"x":', 1),
    lambda line, rng: line.replace('"name":"', '"name":"x","name":"', 1),
    lambda line, rng: line.replace('"spans":[', '"spans":[],"spans":[', 1),
    lambda line, rng: line.replace('"scope":{', '"scope":{"deep":' + "[" * 300 + "]" * 300 + ",", 1),
    lambda line, rng: "\ufeff" + line,
    lambda line, rng: " \t" + line + " \r",
    lambda line, rng: line + " x",
    lambda line, rng: line[: rng.randrange(1, len(line))],
    lambda line, rng: line.replace(",", " , ", 3),
    lambda line, rng: line.replace('"kind":1', '"kind":1.0e0', 1),
]
"""Changes to a line's text: JSON that the json module reads otherwise than msgspec would, or not
at all."""
BYTE_CHANGES: list[Callable[[bytes, random.Random], bytes]] = [
    lambda line, rng: line.replace(b'"traceId":"', b'"traceId":"\xff', 1),
    lambda line, rng: line.replace(b'"traceId":"', b'"traceId":"\xf0\x9f\x98', 1),
    lambda line, rng: line.replace(b'"traceId":"', b'"traceId":"\xed\xa0\x80', 1),
    lambda line, rng: line.replace(b'"stringValue":"', b'"stringValue":"\xc3\xa9\xe2\x82\xac', 1),
    lambda line, rng: line.replace(b'"stringValue":"', b'"stringValue":"\x01', 1),
]
"""Changes to a line's bytes: text that is not UTF-8, a raw control character."""


def changed_lines(lines: list[str], seed: int) -> Iterator[bytes]:
    """Each line of ``lines``, most of them changed by one or a few of the changes above."""
    rng = random.Random(seed)
    for line in lines:
        obj = json.loads(line) if line.startswith('{"resourceSpans":[') else None
        if obj is not None and rng.random() < 0.7:
            spans = obj["resourceSpans"][0]["scopeSpans"][0]["spans"]
            for _ in range(rng.randint(1, 3)):
                rng.choice(SPAN_CHANGES + FALLBACK_CHANGES)(rng.choice(spans), rng)
            line = json.dumps(obj, separators=(",", ":"))
        if obj is not None and rng.random() < 0.15:
            line = rng.choice(TEXT_CHANGES)(line, rng)
        data = line.encode("utf-8", "surrogatepass")
        if obj is not None and rng.random() < 0.1:
            data = rng.choice(BYTE_CHANGES)(data, rng)
        yield data


# -- readings compared ----------------------------------------------------------------------------


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call to read every line with the json module (as without msgspec) from then on."""
    return lambda: monkeypatch.setattr(collector, "_usable", lambda: False)


def assembled(path: Path, *, max_line_bytes: int = record_types.MAX_LINE_BYTES) -> tuple[list, list[str], int]:
    """What one reader gives for a file: its turns, its problems, and how often msgspec read a line."""
    problems: list[str] = []
    decoded = [0]
    real = collector.decode

    def counting(line: bytes) -> Any:
        found = real(line)
        decoded[0] += found is not None
        return found

    collector.decode = counting  # type: ignore[assignment]
    try:
        spans = OtlpAssembler(lambda p: problems.append(str(p)), max_line_bytes=max_line_bytes)
        with LineSource(path, lambda p: problems.append(str(p)), max_line_bytes=max_line_bytes) as source:
            turns = [*read_source(source, lambda p: problems.append(str(p)), spans), *spans.finish()]
    finally:
        collector.decode = real  # type: ignore[assignment]
    return turns, problems, decoded[0]


@pytest.mark.parametrize("seed", range(8))
def test_every_line_reads_alike_whatever_was_done_to_it(tmp_path: Path, plain: Callable[[], None],
                                                        seed: int) -> None:
    path = tmp_path / "otlp.jsonl"
    path.write_bytes(b"\n".join(changed_lines(stream_lines(seed), seed)) + b"\n")
    fast_turns, fast_problems, decoded = assembled(path)
    plain()
    plain_turns, plain_problems, none = assembled(path)
    assert none == 0 and decoded > 10  # both readings were exercised
    assert fast_problems == plain_problems
    assert fast_turns == plain_turns


@pytest.mark.parametrize("change", range(len(SPAN_CHANGES)))
def test_each_change_the_fast_path_reads_itself_gives_the_plain_readings_turns(
    tmp_path: Path, plain: Callable[[], None], change: int
) -> None:
    lines = stream_lines(1, turns=12, logs=False, corpus=False)
    rng = random.Random(change)
    out = []
    for line in lines:
        obj = json.loads(line)
        for span in obj["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            if rng.random() < 0.5:
                SPAN_CHANGES[change](span, rng)
        out.append(json.dumps(obj))
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(out) + "\n")
    *fast, decoded = assembled(path)
    plain()
    assert decoded == len(out)  # every line took the fast path
    assert fast == list(assembled(path)[:2])


@pytest.mark.parametrize("change", range(len(FALLBACK_CHANGES)))
def test_a_field_of_another_json_type_sends_the_line_to_the_plain_reading(change: int) -> None:
    obj = json.loads(stream_lines(2, turns=3, logs=False, corpus=False)[0])
    for span in obj["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        FALLBACK_CHANGES[change](span, random.Random(0))
    assert collector.decode(json.dumps(obj).encode()) is None


@pytest.mark.parametrize("change", range(len(TEXT_CHANGES) + len(BYTE_CHANGES)))
def test_json_the_json_module_reads_otherwise_or_refuses_is_never_read_fast(change: int) -> None:
    line = stream_lines(2, turns=3, logs=False, corpus=False)[0]
    rng = random.Random(change)
    if change < len(TEXT_CHANGES):
        data = TEXT_CHANGES[change](line, rng).encode("utf-8", "surrogatepass")
    else:
        data = BYTE_CHANGES[change - len(TEXT_CHANGES)](line.encode(), rng)
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError):
        assert collector.decode(data) is None
        return
    document = collector.decode(data)
    if document is not None:  # read fast: then exactly the spans json reads
        spans = [s for rs in expected["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        assert [s["name"] for s in spans] == [s.name for s, _, _ in document]
        assert [collector.attributes(s.get("attributes")) for s in spans] == [
            collector.attributes(collector.plain(s)["attributes"]) for s in document]


@pytest.mark.parametrize("shape", ["skipped", "arrays"])
def test_nesting_msgspec_reads_the_json_module_reads_too(shape: str) -> None:
    """Near the interpreter's limit the two parsers give up at different depths: the fast path
    is called deeper, so that it gives up first (a line json refuses is never read fast)."""
    make = collector._nested_skipped if shape == "skipped" else collector._nested_arrays
    deepest = collector._deepest(lambda line: collector.decode(line) is not None, make)
    for depth in range(deepest - 5, deepest + 40):
        line = make(depth)
        try:
            json.loads(line)
        except RecursionError:
            assert collector.decode(line) is None, depth
    assert deepest > 100


def test_the_fast_path_reads_the_turns_the_collector_writes(tmp_path: Path, plain: Callable[[], None]) -> None:
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(stream_lines(3)) + "\n")
    fast_turns, fast_problems, decoded = assembled(path)
    assert decoded > 0 and len(fast_turns) > 60
    plain()
    assert assembled(path)[:2] == (fast_turns, fast_problems)


# -- the figures, with one process and with workers ------------------------------------------------


def figures(arguments: list[str]) -> tuple[str, str]:
    """``turnguard calibrate --json -`` output (as text) and what it said on stderr."""
    import io

    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*arguments, "--json", "-", "--progress", "never", *GRID], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def rotated(folder: Path, lines: list[bytes], cuts: list[int]) -> Path:
    folder.mkdir()
    parts = [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]
    names_ = [f"otlp-2026-12-01T0{i}-00-00.000.jsonl" for i in range(len(parts) - 1)] + ["otlp.jsonl"]
    for name, part in zip(names_, parts, strict=True):
        (folder / name).write_bytes(b"".join(line + b"\n" for line in part))
    return folder


@pytest.mark.parametrize("seed", range(4))
def test_the_figures_are_byte_for_byte_the_same_by_every_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plain: Callable[[], None], seed: int
) -> None:
    """A rotated set cut anywhere (turns straddle lines, ranges and files), with late results,
    log records, corpus lines and hostile lines among the spans: one process or two workers
    reading ranges of a few hundred bytes, msgspec or json: one output."""
    rng = random.Random(seed)
    lines = list(changed_lines(stream_lines(seed + 20), seed)) if seed % 2 else [
        line.encode() for line in stream_lines(seed + 20)]
    folder = rotated(tmp_path / "set", lines, sorted(rng.sample(range(1, len(lines)), 3)))
    monkeypatch.setattr("turnguard._calibrate.run.RANGE_BYTES", rng.choice((333, 4096)))
    monkeypatch.setattr("turnguard._calibrate.run.range_bytes", lambda limit: rng.choice((333, 4096)))
    seen = {}
    for library in ("msgspec", "json"):
        if library == "json":
            plain()
        for jobs in (1, 2):
            seen[library, jobs] = figures([str(folder), "--jobs", str(jobs)])
    first = seen["msgspec", 1]
    assert json.loads(first[0])["turns"] > 30
    for key, found in seen.items():
        assert found == first, key


@pytest.mark.parametrize(("waiting", "calls"), [(40, 25), (90, 60)])
def test_ranges_the_parent_must_read_again_give_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, waiting: int, calls: int
) -> None:
    """Tight bounds: calls waiting across ranges pass the waiting bound, turns pass their call
    limit; the parent reads those ranges itself, exactly as one reader does."""
    lines = [line.encode() for line in stream_lines(7, turns=80, logs=True, corpus=False)]
    path = tmp_path / "otlp.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    monkeypatch.setattr("turnguard._calibrate.run.range_bytes", lambda max_line_bytes: 1500)
    monkeypatch.setattr("turnguard._calibrate.collector.waiting_calls_limit", lambda max_line_bytes: waiting)
    monkeypatch.setattr("turnguard._calibrate.collector.turn_calls_limit", lambda max_line_bytes: calls)
    monkeypatch.setattr("turnguard._calibrate.cli.MAX_SHOWN_PROBLEMS", 10_000)  # (both kinds below are said)
    joins: list[bool] = []
    take_range, read_here = OtlpAssembler.take_range, parallel.Stream._read_here

    def joined(self: OtlpAssembler, *args: Any) -> Any:
        stitched = take_range(self, *args)
        joins.append(stitched is not None)
        return stitched

    def read_again(self: parallel.Stream, path: str, span: Any, slot: Any) -> None:
        joins.append(span is None)
        read_here(self, path, span, slot)

    monkeypatch.setattr(OtlpAssembler, "take_range", joined)
    monkeypatch.setattr(parallel.Stream, "_read_here", read_again)
    one = figures([str(path), "--jobs", "1"])
    two = figures([str(path), "--jobs", "2"])
    assert one == two
    assert True in joins and False in joins  # some ranges joined, some read again
    assert "waited longest" in one[1] and "(the limit); skipped" in one[1]


def test_without_msgspec_the_command_reads_with_json_and_says_the_same(tmp_path: Path) -> None:
    """The library and the command work without the cli extra: the same output, byte for byte."""
    folder = rotated(tmp_path / "set", [line.encode() for line in stream_lines(11)], [40, 90])
    command = [*GRID, "--jobs", "2", "--json", "-", "--progress", "never", str(folder)]
    script = ("import sys; sys.modules['msgspec'] = None; from turnguard._calibrate import collector as d; "
              "assert not d.AVAILABLE; from turnguard._cli import main; sys.exit(main(['calibrate', *sys.argv[1:]]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    without = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, env=env, check=True)
    with_it = subprocess.run([sys.executable, "-m", "turnguard._cli", "calibrate", *command], capture_output=True,
                             env=env, check=True)
    assert without.stdout == with_it.stdout and without.stderr == with_it.stderr
    assert json.loads(with_it.stdout)["turns"] > 60


HUGE = ["1e999", "-1e999", "NaN", "9" * 400, '"' + "9" * 400 + '"', '"1e999"', "1.5", "true", "[1]", "{}", "null"]
"""JSON texts for a number field: out of a float's range, too many digits, of another type."""


@pytest.mark.parametrize("text", HUGE)
@pytest.mark.parametrize("where", ["index", "cycles", "start", "end", "array", "values"])
def test_no_number_or_array_in_a_span_crashes_either_reading(tmp_path: Path, plain: Callable[[], None], text: str,
                                                             where: str) -> None:
    """Any JSON value where a span has a number or an array: read or reported, never a crash (the
    plain reading used to raise OverflowError on 1e999 and 400-digit times, AttributeError on an
    arrayValue that is no object)."""
    value = {"index": '{"intValue":N}', "cycles": '{"intValue":N}', "array": '{"arrayValue":N}',
             "values": '{"arrayValue":{"values":N}}'}.get(where, '{"stringValue":"x"}').replace("N", text)
    start, end = {"start": (text, '"2"'), "end": ('"1"', text)}.get(where, ('"1"', '"2"'))
    call_key = names.CALL_INDEX if where in ("index", "array", "values") else "x"
    turn_key = names.TURN_CYCLES if where == "cycles" else "y"
    line = ('{"resourceSpans":[{"scopeSpans":[{"spans":['
            '{"name":"execute_tool t","parentSpanId":"s1","attributes":[{"key":"CALL","value":VALUE},'
            '{"key":"turnguard.call.index","value":{"intValue":"1"}},{"key":"turnguard.call.key_digest",'
            '"value":{"stringValue":"d"}},{"key":"turnguard.call.outcome","value":{"stringValue":"ok"}}]},'
            '{"name":"invoke_agent a","spanId":"s1","startTimeUnixNano":START,"endTimeUnixNano":END,"attributes":['
            '{"key":"turnguard.turn.id","value":{"stringValue":"t1"}},{"key":"TURN","value":VALUE}]}]}]}]}')
    for name, part in (("CALL", call_key), ("TURN", turn_key), ("VALUE", value), ("START", start), ("END", end)):
        line = line.replace(name, part)
    path = tmp_path / "otlp.jsonl"
    path.write_text(line + "\n")
    fast = assembled(path)[:2]
    plain()
    assert assembled(path)[:2] == fast
    assert [t.id for t in fast[0]] == ["t1"]


# -- the tool-span template (attributes read by one match) ------------------------------------------

TEMPLATE_KEYS = (names.CALL_INDEX, names.CALL_KEY_DIGEST, names.GEN_AI_TOOL_NAME, names.GEN_AI_OPERATION_NAME,
                 names.CALL_OUTCOME)
TEXTS = ["a536c1fded42c1e9", "find", "x", "d" * 256, "d" * 257, "", "a b", "a/b", "A~{}[]#!", "caf\u00e9",
         "\u20ac", "\U0001f600", "ok", "OK", "error", "unfinished", "exploded", "ok ", "-1", "007"]
"""Texts for a value: plain, at and past the length bound, empty, non-ASCII, outcome texts."""


def _json_text(text: str, rng: random.Random) -> str:
    """``text`` as a JSON string, often spelled with escapes that read as the same text."""
    if rng.random() < 0.9:
        return json.dumps(text, ensure_ascii=rng.random() < 0.5)
    spelled = "".join(rng.choice((c, f"\\u{ord(c):04x}", f"\\u{ord(c):04X}")) if ord(c) < 0x10000
                      and c not in '"\\' else json.dumps(c)[1:-1] for c in text)
    return '"' + spelled.replace("/", rng.choice(("/", "\\/"))) + '"'


def _value_text(kind: str, value: str, rng: random.Random) -> str:
    return "{" + json.dumps(kind) + ":" + _json_text(value, rng) + "}"


UNREAD_KEYS = (names.CALL_REPEAT, names.STREAK_LENGTH, names.FAILING_STREAK_LENGTH, names.ERROR_TYPE)
"""What the plugin writes on a tool span only when it says something (a count past 1, a failure),
and calibrate does not read."""
PLUGIN_ORDER = (names.CALL_INDEX, names.CALL_KEY_DIGEST, names.CALL_REPEAT, names.STREAK_LENGTH, names.CALL_CYCLE,
                names.CALL_RETRIES, names.GEN_AI_TOOL_NAME, names.GEN_AI_OPERATION_NAME, names.CALL_OUTCOME,
                names.CALL_RESULT_DIGEST, names.FAILING_STREAK_LENGTH, names.ERROR_TYPE)
"""Every attribute the plugin writes on its own tool span, in its order."""
COUNTS = ["2", "17", "0", "007", "9" * 18, "9" * 19, "-2", "1.0", "x", ""]


def _plugin_pairs(rng: random.Random, side: random.Random) -> list[list[str]]:
    """The plugin's attributes as ``[key, value]`` JSON texts, values drawn from ``TEXTS``: its
    five, with the counts and the failure's attributes it adds when they say something (the model
    request's drawn from ``side``, leaving the others' draws as they were)."""
    def pick(usual: str) -> str:
        return usual if rng.random() < 0.85 else rng.choice(TEXTS)

    def count() -> tuple[str, str]:
        return "intValue", str(rng.randint(2, 300)) if rng.random() < 0.85 else rng.choice(COUNTS)

    index = str(rng.randint(1, 300)) if rng.random() < 0.85 else rng.choice(
        ["0", "007", "9" * 18, "9" * 19, "-2", "+3", "\u0663", "1.0", " 4", "x", ""])
    outcome = pick(rng.choice(("ok", "error", "unfinished")))
    values = {names.CALL_INDEX: ("intValue", index),
              names.CALL_KEY_DIGEST: ("stringValue", pick(f"{rng.getrandbits(64):016x}")),
              names.GEN_AI_TOOL_NAME: ("stringValue", pick(rng.choice(("find", "cat", "python")))),
              names.GEN_AI_OPERATION_NAME: ("stringValue", pick("execute_tool")),
              names.CALL_OUTCOME: ("stringValue", outcome)}
    if rng.random() < 0.3:
        values[names.CALL_RESULT_DIGEST] = "stringValue", pick(f"{rng.getrandbits(64):016x}")
    if rng.random() < 0.3:
        values[names.CALL_REPEAT] = count()
    if rng.random() < 0.3:
        values[names.STREAK_LENGTH] = count()
    if side.random() < 0.15:
        cycle = str(side.randint(1, 300)) if side.random() < 0.95 else side.choice(COUNTS)
        values[names.CALL_CYCLE] = "intValue", cycle
    if side.random() < 0.1:
        retries = str(side.randint(1, 5)) if side.random() < 0.95 else side.choice(COUNTS)
        values[names.CALL_RETRIES] = "intValue", retries
    if (outcome == "error" and rng.random() < 0.7) or rng.random() < 0.05:
        values[names.FAILING_STREAK_LENGTH] = count()
        values[names.ERROR_TYPE] = "stringValue", "_OTHER" if rng.random() < 0.85 else rng.choice(TEXTS)
    draw = {key: side if key in (names.CALL_CYCLE, names.CALL_RETRIES) else rng for key in values}
    return [[_json_text(key, draw[key]) if draw[key].random() < 0.1 else json.dumps(key),
             _value_text(*values[key], draw[key])] for key in PLUGIN_ORDER if key in values]


def _other_value(rng: random.Random) -> str:
    return rng.choice(['{"intValue":3}', '{"intValue":"3","stringValue":"3"}', '{"stringValue":5}',
                       '{"stringValue":null}', '{}', 'null', '{"boolValue":true}', '{"doubleValue":2.5}',
                       '{"arrayValue":{"values":[{"stringValue":"a"}]}}', '{"stringValue":"a","stringValue":"b"}',
                       '{"intValue":"1","intValue":"2"}', '{"stringValue":"ok","extra":[1,{"a":2}]}'])


ATTRIBUTE_CHANGES: list[Callable[[list[list[str]], random.Random], None]] = [
    lambda pairs, rng: None,
    lambda pairs, rng: pairs.reverse(),
    lambda pairs, rng: rng.shuffle(pairs),
    lambda pairs, rng: pairs.pop(rng.randrange(len(pairs))),
    lambda pairs, rng: pairs.append(rng.choice(pairs)[:]),
    lambda pairs, rng: pairs.append([json.dumps(rng.choice(TEMPLATE_KEYS)), _other_value(rng)]),
    lambda pairs, rng: pairs.insert(rng.randrange(len(pairs) + 1), [json.dumps(rng.choice(UNREAD_KEYS)), rng.choice(
        ('{"intValue":"2"}', '{"stringValue":"_OTHER"}'))]),
    lambda pairs, rng: pairs.insert(rng.randrange(len(pairs)), ['"x"', _other_value(rng)]),
    lambda pairs, rng: pairs[rng.randrange(len(pairs))].__setitem__(1, _other_value(rng)),
    lambda pairs, rng: pairs[rng.randrange(len(pairs))].__setitem__(0, json.dumps(rng.choice(TEMPLATE_KEYS))),
    lambda pairs, rng: pairs[rng.randrange(len(pairs))].__setitem__(0, '"' + names.TURN_ID + '"'),
    lambda pairs, rng: pairs[rng.randrange(len(pairs))].__setitem__(0, '"turnguard.call.index "'),
    lambda pairs, rng: pairs.__setitem__(slice(None), []),
]
"""Changes to the plugin's attributes: orders, missing, duplicate, extra and unknown attributes,
values of other kinds or types, keys spelled otherwise."""


def _attributes_text(pairs: list[list[str]], rng: random.Random) -> str:
    """The attributes as JSON text: compact (as the Collector writes them) or not, with the
    object's fields in their usual order or another, with extra fields or doubled ones."""
    space = (lambda: rng.choice((" ", "\t", "\n ", ""))) if rng.random() < 0.2 else (lambda: "")
    items = []
    for key, value in pairs:
        fields = [f'"key"{space()}:{space()}{key}', f'"value":{space()}{value}']
        if rng.random() < 0.05:
            fields.reverse()
        if rng.random() < 0.05:
            fields.append(rng.choice(['"key":"other"', '"value":{"stringValue":"again"}', '"more":[1,[2]]']))
        items.append("{" + f",{space()}".join(fields) + "}")
    return "[" + space() + f",{space()}".join(items) + space() + "]"


def attribute_texts(seed: int, n: int) -> Iterator[str]:
    """Generated attribute arrays of every shape: most in the plugin's layout, changed in one or
    two ways, spelled compactly or not."""
    rng, side = random.Random(seed), random.Random(-1 - seed)
    for _ in range(n):
        pairs = _plugin_pairs(rng, side)
        for _ in range(rng.choice((0, 0, 1, 2))):
            if pairs:
                rng.choice(ATTRIBUTE_CHANGES)(pairs, rng)
        yield _attributes_text(pairs, rng)


def _template_reading(found: Any) -> list[dict]:
    index, digest, cycle, retries, tool, outcome, result = (g and g.decode() for g in found.groups())
    values = [("intValue", index), ("stringValue", digest), ("stringValue", tool),
              ("stringValue", names.OP_EXECUTE_TOOL), ("stringValue", outcome)]
    read = [{"key": key, "value": {kind: value}} for key, (kind, value) in zip(TEMPLATE_KEYS, values, strict=True)]
    if retries is not None:
        read.insert(2, {"key": names.CALL_RETRIES, "value": {"intValue": retries}})
    if cycle is not None:
        read.insert(2, {"key": names.CALL_CYCLE, "value": {"intValue": cycle}})
    if result is not None:
        read.append({"key": names.CALL_RESULT_DIGEST, "value": {"stringValue": result}})
    return read


@pytest.mark.parametrize("seed", range(4))
def test_attributes_the_template_matches_read_as_the_json_module_reads_them(seed: int) -> None:
    """What a match's groups say is exactly the parsed JSON's read attributes, the others are
    those the plugin adds, in its order, and the span's plain form gives the parsed JSON."""
    matched = unread = digests = 0
    for text in attribute_texts(seed, 4000):
        data = text.encode("utf-8", "surrogatepass")
        found = collector.TOOL_ATTRIBUTES.fullmatch(data)
        if found is None:
            continue
        matched += 1
        parsed = json.loads(data)
        assert [a for a in parsed if a["key"] not in UNREAD_KEYS] == _template_reading(found), text
        assert [a["key"] for a in parsed] == [k for k in PLUGIN_ORDER if k in {a["key"] for a in parsed}], text
        unread += sum(a["key"] in UNREAD_KEYS for a in parsed)
        digests += found.group(7) is not None
        line = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"n","attributes":' + data + b"}]}]}]}"
        [decoded] = collector.decode(line)
        assert decoded[2] is not None
        assert collector.plain(decoded)["attributes"] == json.loads(data)
    assert 100 < matched < 2900 and unread > 100 and digests > 50  # both sides, unread attributes, result digests


def _template_stream(seed: int) -> list[str]:
    """Collector lines whose tool spans carry generated attributes, with their turn spans."""
    rng = random.Random(seed)
    lines, texts = [], attribute_texts(seed, 600)
    for turn in range(40):
        parent = rng.choice([f"{turn:016x}"] * 6 + ["", "p" * 257])
        spans = ['{"name":"execute_tool t","parentSpanId":' + json.dumps(parent) + ',"attributes":' + next(texts) + "}"
                 for _ in range(15)]
        spans.append('{"name":"invoke_agent a","spanId":"' + f"{turn:016x}" + '","attributes":[{"key":"'
                      + names.TURN_ID + f'","value":{{"stringValue":"t{turn}"}}}}]}}')
        for i in range(0, len(spans), 4):
            lines.append('{"resourceSpans":[{"scopeSpans":[{"spans":[' + ",".join(spans[i:i + 4]) + "]}]}]}")
    return lines


@pytest.mark.parametrize("seed", range(6))
def test_tool_spans_of_every_attribute_shape_give_the_plain_readings_turns(
    tmp_path: Path, plain: Callable[[], None], seed: int
) -> None:
    """The template, and the plain reading of the spans it refuses: the turns, problems and
    waiting calls the json module's reading gives."""
    lines = _template_stream(seed)
    path = tmp_path / "otlp.jsonl"
    path.write_bytes(b"".join(line.encode("utf-8", "surrogatepass") + b"\n" for line in lines))
    fast_turns, fast_problems, decoded = assembled(path)
    plain()
    plain_turns, plain_problems, none = assembled(path)
    assert decoded > len(lines) // 3 and none == 0  # (a value of another JSON type sends its line to json)
    assert sum(len(t.calls) for t in fast_turns) > 80 and fast_problems
    assert (fast_turns, fast_problems) == (plain_turns, plain_problems)


def _tool_span(parent: str, index: int, tool: str = "find") -> str:
    return ('{"name":"execute_tool ' + tool + '","parentSpanId":"' + parent + '","attributes":[{"key":"'
            + names.CALL_INDEX + f'","value":{{"intValue":"{index}"}}}},{{"key":"{names.CALL_KEY_DIGEST}",'
            f'"value":{{"stringValue":"d{index % 3}"}}}},{{"key":"{names.GEN_AI_TOOL_NAME}","value":'
            f'{{"stringValue":"{tool}"}}}},{{"key":"{names.GEN_AI_OPERATION_NAME}","value":{{"stringValue":'
            f'"execute_tool"}}}},{{"key":"{names.CALL_OUTCOME}","value":{{"stringValue":"ok"}}}}]}}')


def _turn_span(span_id: str, turn_id: str) -> str:
    return ('{"name":"invoke_agent a","spanId":"' + span_id + '","attributes":[{"key":"' + names.TURN_ID
            + f'","value":{{"stringValue":"{turn_id}"}}}}]}}')


@pytest.mark.parametrize(("waiting", "calls"), [(3, 1000), (1000, 1000), (1000, 2)])
def test_sibling_spans_after_their_turn_span_wait_anew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       plain: Callable[[], None], waiting: int, calls: int) -> None:
    """Tool spans of a parent whose turn span has come in an earlier line (or whose calls were
    released past the waiting bound) start a new wait: never added to the calls already given away;
    a turn's call limit holds in a run of siblings. (A line's turn spans close at its end.)"""
    monkeypatch.setattr("turnguard._calibrate.collector.waiting_calls_limit", lambda max_line_bytes: waiting)
    monkeypatch.setattr("turnguard._calibrate.collector.turn_calls_limit", lambda max_line_bytes: calls)
    spans = [_tool_span("p1", 1), _tool_span("p1", 2), _tool_span("p2", 1), _tool_span("p1", 3), _turn_span("p1", "t1"),
             _tool_span("p1", 1, "cat"), _tool_span("p1", 2, "cat"), _tool_span("p1", 3), _tool_span("p1", 4),
             _turn_span("p1", "t2"), _tool_span("p1", 1), _tool_span("p2", 2), _turn_span("p2", "t3")]
    path = tmp_path / "otlp.jsonl"
    ends = [i + 1 for i, span in enumerate(spans) if '"turnguard.turn.id"' in span]
    lines = ['{"resourceSpans":[{"scopeSpans":[{"spans":[' + ",".join(spans[a:b]) + "]}]}]}"
             for a, b in zip([0, *ends], ends, strict=False)]
    path.write_text("\n".join(lines) + "\n")
    fast = assembled(path)
    plain()
    assert fast[:2] == assembled(path)[:2]
    assert fast[2] == len(lines)
    if waiting == 3:
        assert any("waited longest" in p for p in fast[1])
    elif calls == 2:
        assert [len(t.calls) for t in fast[0]] == [2, 2, 2, 1] and any("(the limit)" in p for p in fast[1])
    else:
        assert [len(t.calls) for t in fast[0]] == [3, 4, 2, 1] and len(fast[1]) == 1
