"""A recorded id counts by its text, as the live guard counts it (``model.id_text``): ``""`` and
``0`` are ids like any other, only an absent one (``None``) is missing. Every reader of calibrate
keeps them: a recorder line and its late result, the Collector's turn span, its tool spans linked
by a turn id of their own, its result log; and a key that is given (``""``, ``0``) is never passed
over for a later spelling of it (``id``/``turn_id``, ``tool``/``name``, ``digest``/``key_digest``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from collector_lines import collector_lines, log_lines
from turnguard._calibrate import cli
from turnguard._calibrate.duplicates import id_hash
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import InputProblem
from turnguard._calibrate.results import late_results
from turnguard.telemetry import _names as names
from turnguard.telemetry._testing import InMemoryTelemetry

IDS = ["", "0", 0, " "]
"""Ids a ``bool()`` or ``strip()`` would take for missing; ``0`` is ``"0"`` live."""


def calibrate(*paths: Path) -> tuple[dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, paths), "--json", "-", "--progress", "never", "--soft-caps", "3", "--multipliers",
                     "2", "--stuck-repeats", "3", "--no-peers"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()


def guarded_turn(guard: tg.Guard, turn_id: Any) -> None:
    """A turn of two calls under ``turn_id``, its result reported after it ended (a late result)."""
    with guard.turn(turn_id=turn_id, promptable=False) as turn:
        for args in ("a", "b"):
            call = tg.ToolCall("bash", args)
            turn.check_call(call)
            turn.record_outcome(call, tg.Outcome.OK)
    guard.report_result(turn_id, True)


def read(path: Path) -> tuple[list[Any], list[InputProblem]]:
    problems: list[InputProblem] = []
    return list(read_turns([path], problems.append)), problems


@pytest.mark.parametrize("turn_id", IDS, ids=repr)
def test_recorder_turn_and_its_late_result_keep_the_id(tmp_path: Path, turn_id: Any) -> None:
    recorder = tmp_path / "turns.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(recorder), load_entrypoints=False,
                                    disable_plugins=("otel",)), environ={})
    guarded_turn(guard, turn_id)
    assert '"result_for"' in recorder.read_text()
    turns, problems = read(recorder)
    assert [(t.id, len(t.calls)) for t in turns] == [(str(turn_id), 2)]
    assert problems == []
    data, err = calibrate(recorder)
    assert (data["turns"], data["resolved"], data["problems"], err) == (1, 1, 0, "")


@pytest.mark.parametrize("turn_id", IDS, ids=repr)
def test_collector_turn_and_its_result_log_keep_the_id(tmp_path: Path, turn_id: Any) -> None:
    telemetry = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={}, **telemetry.providers())
    guarded_turn(guard, turn_id)
    telemetry.tracer_provider.force_flush()
    telemetry.logger_provider.force_flush()
    logs = telemetry.log_exporter.get_finished_logs()
    assert logs
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(collector_lines([telemetry.spans()]) + log_lines([logs])) + "\n")
    turns, problems = read(path)
    assert [(t.id, len(t.calls)) for t in turns] == [(str(turn_id), 2)] and problems == []
    data, err = calibrate(path)
    assert (data["turns"], data["resolved"], data["problems"], err) == (1, 1, 0, "")


def value(v: Any) -> dict[str, Any]:
    return {"intValue": str(v)} if type(v) is int else {"stringValue": v}


def span(name: str, span_id: str, parent: str | None, attrs: dict[str, Any]) -> dict[str, Any]:
    out = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": span_id, "name": name,
           "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    if parent is not None:
        out["parentSpanId"] = parent
    return out


def line(*spans: dict[str, Any]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "turnguard"}, "spans": list(spans)}]}]})


def tool_span(span_id: str, parent: str | None, index: int, **attrs: Any) -> dict[str, Any]:
    base = {names.CALL_INDEX: index, names.CALL_KEY_DIGEST: f"d{index}", names.GEN_AI_TOOL_NAME: "read",
            names.CALL_OUTCOME: "ok"}
    return span("execute_tool read", span_id, parent, {**base, **attrs})


@pytest.mark.parametrize("parent", [None, "", "cccc"], ids=["no parent", "empty parent", "a host step"])
@pytest.mark.parametrize("turn_id", IDS, ids=repr)
def test_tool_spans_join_their_turn_by_its_id_whatever_its_text(tmp_path: Path, turn_id: Any,
                                                                 parent: str | None) -> None:
    """Linked by a turn id of their own, tool spans join that turn, never their parent span's."""
    own = {names.TURN_ID: turn_id}
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join([line(tool_span("b1", parent, 1, **own), tool_span("b2", parent, 2, **own)),
                               line(span("invoke_agent coder", "aaaa", None, {names.TURN_ID: turn_id,
                                                                             names.TURN_TOOL_CALLS: 2}))]) + "\n")
    turns, problems = read(path)
    assert [(t.id, [c.digest for c in t.calls]) for t in turns] == [(str(turn_id), ["d1", "d2"])]
    assert problems == []


def test_a_given_tool_name_is_read_as_given(tmp_path: Path) -> None:
    """An empty ``gen_ai.tool.name`` is no tool name (the guard refuses one), not the span name's."""
    path = tmp_path / "otlp.jsonl"
    bare = span("execute_tool read", "b2", "aaaa", {names.CALL_INDEX: 2, names.CALL_KEY_DIGEST: "d2",
                                                     names.CALL_OUTCOME: "ok"})
    path.write_text("\n".join([line(tool_span("b1", "aaaa", 1, **{names.GEN_AI_TOOL_NAME: ""}), bare),
                               line(span("invoke_agent coder", "aaaa", None, {names.TURN_ID: "T"}))]) + "\n")
    turns, problems = read(path)
    assert [(c.tool, c.digest) for t in turns for c in t.calls] == [("read", "d2")]
    assert ["no tool name" in p.message for p in problems] == [True]


CALL = {"tool": "read", "args": "x", "outcome": "ok"}


@pytest.mark.parametrize(("keys", "expected"), [
    ({"id": "", "turn_id": "other"}, ""),
    ({"id": None, "turn_id": ""}, ""),
    ({"turn_id": 0}, "0"),
    ({"id": None, "turn_id": 0}, "0"),
    ({"id": 0, "turn_id": "other"}, "0"),
    ({"id": " ", "turn_id": "other"}, " "),
])
def test_corpus_turn_id_given_is_the_id(tmp_path: Path, keys: dict[str, Any], expected: str) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({**keys, "calls": [CALL]}) + "\n")
    turns, problems = read(path)
    assert [t.id for t in turns] == [expected] and problems == []


@pytest.mark.parametrize(("call", "expected"), [
    ({"tool": "", "name": "read", "args": "x", "outcome": "ok"}, "'tool' is missing or not a non-empty string"),
    ({"tool": None, "name": "read", "args": "x", "outcome": "ok"}, ("read", None)),
    ({"tool": "read", "digest": "", "key_digest": "ab", "outcome": "ok"}, ("read", "")),
    ({"tool": "read", "digest": None, "key_digest": "ab", "outcome": "ok"}, ("read", "ab")),
])
def test_corpus_call_keys_given_are_read_as_given(tmp_path: Path, call: dict[str, Any], expected: Any) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "T", "calls": [call]}) + "\n")
    turns, problems = read(path)
    if isinstance(expected, str):
        assert turns == [] and [expected in p.message for p in problems] == [True]
    else:
        assert [(c.tool, c.digest) for t in turns for c in t.calls] == [expected] and problems == []


def log_line(turn_id: Any) -> str:
    record = {"timeUnixNano": "1767225600000000000", "eventName": "turnguard.turn.result",
              "attributes": [{"key": "turnguard.turn.id", "value": value(turn_id)},
                             {"key": "turnguard.turn.resolved", "value": {"boolValue": True}}]}
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]})


@pytest.mark.parametrize("turn_id", IDS, ids=repr)
@pytest.mark.parametrize("form", ["record", "log"])
def test_late_result_for_any_id_text_is_kept(tmp_path: Path, turn_id: Any, form: str) -> None:
    path = tmp_path / "results.jsonl"
    text = json.dumps({"result_for": turn_id, "resolved": True}) if form == "record" else log_line(turn_id)
    path.write_text(text + "\n")
    problems: list[InputProblem] = []
    assert late_results([path], problems.append) == {id_hash(str(turn_id)): True}
    assert problems == []


@pytest.mark.parametrize("turn_id", [None, 1.5, True, [], "x" * 257], ids=repr)
def test_late_result_without_an_id_text_is_a_problem(tmp_path: Path, turn_id: Any) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"result_for": turn_id, "resolved": True}) + "\n")
    problems: list[InputProblem] = []
    assert late_results([path], problems.append) == {}
    assert len(problems) == 1
