"""Counts and typed values calibrate reads from hostile input: every count of a turn's calls is
bounded so that the sums a run forms stay within what ``calibrate merge`` accepts, and an OTLP
value not of its declared type is never coerced; both are reported problems, never a crash."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from turnguard._calibrate import cli
from turnguard._calibrate.bounds import MAX_COUNT
from turnguard._calibrate.records import MAX_TURN_COUNT
from turnguard.telemetry import _names as names

TOO_LARGE = [MAX_TURN_COUNT + 1, 2**62, 2**63 - 1, 2**64, 10**30]
"""Counts past the bound: just past it, the largest limit, int64's largest, past int64."""
CORPUS_COUNTS = ("tool_calls", "calls_dropped", "calls_unrecorded")
SPAN_COUNTS = ("call index", "call index, one of several", names.TURN_TOOL_CALLS)


def run(*arguments: str | Path, jobs: int = 1) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, arguments), "--json", "-", "--jobs", str(jobs), "--soft-caps", "10", "--multipliers",
                     "2", "--stuck-repeats", "3", "--no-peers"], stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if code == 0 else {}, err.getvalue()


def merge(*paths: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.merge_main([*map(str, paths), "--json", "-"], stdout=out, stderr=err), err.getvalue()


def value(v: Any) -> dict:
    if isinstance(v, dict):
        return v
    return {"boolValue": v} if isinstance(v, bool) else {"intValue": str(v)} if isinstance(v, int) else {
        "stringValue": v}


def span(name: str, span_id: str, parent: str | None, attrs: dict) -> dict:
    out = {"spanId": span_id, "name": name, "startTimeUnixNano": "1700000000000000000",
           "endTimeUnixNano": "1700000001000000000",
           "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    if parent:
        out["parentSpanId"] = parent
    return out


def tool_span(parent: str, index: Any) -> dict:
    """As the plugin writes it (so that the template of the fast path reads it when it can)."""
    return span("execute_tool run", f"c{parent}{index}"[:16], parent, {
        names.CALL_INDEX: index, names.CALL_KEY_DIGEST: "d1", names.GEN_AI_TOOL_NAME: "run",
        names.GEN_AI_OPERATION_NAME: names.OP_EXECUTE_TOOL, names.CALL_OUTCOME: "ok"})


def line(spans: list[dict]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}, separators=(",", ":"))


def turns_with(field: str, count: int, turns: int = 3) -> list[str]:
    """``turns`` turns, each giving ``count`` as ``field`` (a corpus key or a span's)."""
    out = []
    for t in range(turns):
        if field in CORPUS_COUNTS:
            out.append(json.dumps({"id": f"t{t}", "calls": [{"tool": "run", "args": {"i": 1}, "outcome": "ok"}],
                                   field: count, "ended_by": "completed"}))
            continue
        parent = f"{t + 1:016x}"
        calls = [tool_span(parent, 1)]
        attrs: dict[str, Any] = {names.TURN_ID: f"t{t}", names.TURN_OUTCOME: "completed"}
        if field == names.TURN_TOOL_CALLS:
            attrs[field] = count
        else:
            calls.append(tool_span(parent, count))
            if field.endswith("several"):
                calls.insert(1, tool_span(parent, 2))
        out.append(line([*calls, span("invoke_agent a", parent, None, attrs)]))
    return out


@pytest.mark.parametrize("count", TOO_LARGE)
@pytest.mark.parametrize("field", CORPUS_COUNTS + SPAN_COUNTS)
def test_a_turn_count_past_the_bound_is_a_reported_problem_and_merge_accepts_the_result(
    tmp_path: Path, field: str, count: int
) -> None:
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(turns_with(field, count)) + "\n")
    for jobs in (1, 2):
        code, result, err = run(path, jobs=jobs)
        assert code == 0, err
        lowest = int(field.startswith("call index"))
        assert result["problems"] == 3 and f"from {lowest} to {MAX_TURN_COUNT:,}" in err, err
        assert result["turns"] == 3 and result["calls"] < 100
        saved = tmp_path / f"result{jobs}.json"
        saved.write_text(json.dumps(result))
        assert merge(saved) == (0, "")


@pytest.mark.parametrize("field", CORPUS_COUNTS + SPAN_COUNTS)
def test_the_largest_turn_count_is_read_and_its_sums_stay_mergeable(tmp_path: Path, field: str) -> None:
    """At the bound, a result of many turns still holds counts ``merge`` accepts."""
    turns = 64
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(turns_with(field, MAX_TURN_COUNT, turns)) + "\n")
    code, result, err = run(path)
    assert code == 0 and result["problems"] == 0, err
    assert turns * MAX_TURN_COUNT <= result["calls"] <= turns * 3 * MAX_TURN_COUNT < MAX_COUNT
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    assert merge(saved) == (0, "")


def test_merge_refuses_results_whose_sum_passes_what_a_result_may_hold(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(turns_with("tool_calls", MAX_TURN_COUNT, 1)) + "\n")
    code, result, err = run(path)
    assert code == 0, err
    parts = []
    for i in range(2):
        big = {**result, "calls": MAX_COUNT // 2 + 1, "calls_per_turn": {str(MAX_COUNT // 2 + 1): 1},
               "turn_sketch": [f"{i:016x}"]}
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_text(json.dumps(big))
    assert merge(parts[0])[0] == 0
    code, err = merge(*parts)
    assert code == 2 and "its calls must be a whole number from 0 to" in err, err


# -- OTLP values of the wrong type -----------------------------------------------------------------

MISTYPED_BOOLS = [{"boolValue": "false"}, {"boolValue": "true"}, {"boolValue": 0}, {"boolValue": 1},
                  {"boolValue": None}, {"boolValue": []}, {"intValue": "1"}, {"doubleValue": 1.0},
                  {"stringValue": "yes"}, {"stringValue": "False"}]
"""Not a boolean, nor one of the texts ``true``, ``false``, ``unknown``."""
MISTYPED_INTS = [{"intValue": 2.9}, {"intValue": 2.0}, {"intValue": True}, {"intValue": False},
                 {"intValue": None}, {"intValue": [2]}, {"intValue": {"v": 2}}, {"intValue": "2.0"},
                 {"intValue": "two"}, {"doubleValue": 2.0}, {"boolValue": True}, {"stringValue": "2"}]
"""Not an integer (OTLP JSON's int64: a decimal text, or a JSON integer)."""


def resolved_lines(raw: dict, late: bool) -> list[str]:
    parent = "00000000000000aa"
    attrs: dict[str, Any] = {names.TURN_ID: "t", names.TURN_OUTCOME: "completed"}
    if not late:
        attrs["turnguard.turn.resolved"] = raw
    out = [line([tool_span(parent, 1), span("invoke_agent a", parent, None, attrs)])]
    if late:
        out.append(json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{
            "eventName": "turnguard.turn.result", "attributes": [
                {"key": "turnguard.turn.id", "value": {"stringValue": "t"}},
                {"key": "turnguard.turn.resolved", "value": raw}]}]}]}]}))
    return out


@pytest.mark.parametrize("late", [False, True], ids=["turn span", "late result"])
@pytest.mark.parametrize("raw", MISTYPED_BOOLS, ids=json.dumps)
def test_a_resolved_value_not_of_its_type_is_a_reported_problem_read_as_unknown(
    tmp_path: Path, raw: dict, late: bool
) -> None:
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(resolved_lines(raw, late)) + "\n")
    code, result, err = run(path)
    assert code == 0, err
    assert (result["resolved"], result["unresolved"], result["problems"]) == (0, 0, 1), err
    assert "turnguard.turn.resolved" in err


@pytest.mark.parametrize("late", [False, True], ids=["turn span", "late result"])
@pytest.mark.parametrize(("raw", "resolved"), [({"boolValue": True}, True), ({"boolValue": False}, False),
                                               ({"stringValue": "true"}, True), ({"stringValue": "false"}, False),
                                               ({"stringValue": "unknown"}, None)])
def test_a_resolved_value_of_its_type_is_read(tmp_path: Path, raw: dict, resolved: bool | None, late: bool) -> None:
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(resolved_lines(raw, late)) + "\n")
    code, result, err = run(path)
    assert code == 0 and result["problems"] == 0, err
    assert (result["resolved"], result["unresolved"]) == (int(resolved is True), int(resolved is False))


@pytest.mark.parametrize("raw", MISTYPED_INTS, ids=json.dumps)
@pytest.mark.parametrize("key", [names.TURN_CYCLES, names.CALL_INDEX, names.TURN_TOOL_CALLS])
def test_a_count_not_of_its_type_is_a_reported_problem_never_coerced(tmp_path: Path, key: str, raw: dict) -> None:
    parent = "00000000000000aa"
    calls = [tool_span(parent, 1), tool_span(parent, 2)]
    attrs: dict[str, Any] = {names.TURN_ID: "t", names.TURN_OUTCOME: "completed"}
    if key == names.CALL_INDEX:
        calls.append(tool_span(parent, raw))
    else:
        attrs[key] = raw
    path = tmp_path / "otlp.jsonl"
    path.write_text(line([*calls, span("invoke_agent a", parent, None, attrs)]) + "\n")
    code, result, err = run(path)
    assert code == 0, err
    assert result["problems"] == 1 and key in err, err
    assert result["calls"] == 2  # the other calls read, the mistyped value counted nowhere


@pytest.mark.parametrize("seed", range(4))
def test_an_integer_of_its_type_reads_as_itself_whatever_its_spelling(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    parent = "00000000000000aa"
    cycles = rng.randint(1, 50)
    raw = rng.choice([{"intValue": str(cycles)}, {"intValue": cycles}])
    path = tmp_path / "otlp.jsonl"
    path.write_text(line([tool_span(parent, 1), span("invoke_agent a", parent, None, {
        names.TURN_ID: "t", names.TURN_OUTCOME: "completed", names.TURN_CYCLES: raw})]) + "\n")
    code, result, err = run(path)
    assert code == 0 and result["problems"] == 0, err
