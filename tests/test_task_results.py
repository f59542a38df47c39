"""Task results: ``turn.report_result`` before the end, ``guard.report_result`` after it, with
bounded memory; every other report ignored and counted, never raised; and where results go
(summary, recorder, turn metrics and spans, the late-result counter and event, calibrate)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import turnguard as tg
from conftest import CORE_ONLY, distinct_call, drive
from turnguard.calibrate import cli
from turnguard.task_results import ResultBook
from turnguard.telemetry import names as n

S = tg.ResultStatus


def guard(**config) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(**{**CORE_ONLY, **config}), environ={})


def ended_turn(g: tg.Guard, calls: int = 3, **kwargs) -> tg.Turn:
    with g.turn(**kwargs) as turn:
        drive(turn, [distinct_call(i) for i in range(calls)])
    return turn


def test_a_result_before_the_end_is_on_the_summary():
    g = guard()
    with g.turn() as turn:
        assert turn.report_result(True) is True
    assert turn.summary.resolved is True
    assert ended_turn(g).summary.resolved is None


def test_a_result_after_the_end_reaches_the_recent_turn_once():
    g = guard()
    turn = ended_turn(g)
    assert g.report_result(turn.turn_id, False) is True
    assert g.report_result(turn.turn_id, True) is False  # the first one stands
    assert turn.report_result(True) is False  # an ended turn's report_result is the guard's
    assert g.results.counts[S.ACCEPTED] == 1 and g.results.counts[S.DUPLICATE] == 2


@pytest.mark.parametrize(("report", "status"), [
    (lambda g, t: t.report_result(True), S.DUPLICATE),
    (lambda g, t: g.report_result(t.turn_id, True), S.DUPLICATE),
    (lambda g, t: g.report_result("no-such-turn", True), S.UNKNOWN),
    (lambda g, t: g.report_result(t.turn_id, "yes"), S.INVALID),
    (lambda g, t: g.report_result(None, True), S.INVALID_ID),
])
def test_every_other_report_is_ignored_counted_and_never_raises(report, status):
    g = guard()
    with g.turn() as turn:
        turn.report_result(False)
    before = dict(g.results.counts)
    assert report(g, turn) is False
    assert g.results.counts[status] == before[status] + 1
    assert turn.summary.resolved is False


def test_a_non_bool_before_the_end_is_ignored_too():
    g = guard()
    with g.turn() as turn:
        assert turn.report_result(1) is False
        assert turn.report_result(None) is False
    assert turn.summary.resolved is None and g.results.counts[S.INVALID] == 2


def test_memory_of_ended_turns_is_bounded_and_forgotten_turns_are_expired_then_unknown():
    g = guard()
    g.results = book = ResultBook(limit=3)
    turns = [ended_turn(g, 1) for _ in range(8)]
    assert len(book) == 3
    assert [g.report_result(t.turn_id, True) for t in turns[-3:]] == [True] * 3
    assert g.report_result(turns[3].turn_id, True) is False and book.counts[S.EXPIRED] == 1
    assert g.report_result(turns[0].turn_id, True) is False and book.counts[S.UNKNOWN] == 1


def test_after_shutdown_results_are_counted_and_ignored():
    g = guard()
    turn = ended_turn(g)
    g.shutdown()
    assert g.report_result(turn.turn_id, True) is False
    assert g.results.counts[S.AFTER_SHUTDOWN] == 1


def test_turn_metrics_and_spans_carry_the_result(otel):
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",)), environ={},
                 **otel.providers())
    for resolved in (True, False, None):
        with g.turn(agent_name="coder") as turn:
            turn.check_call(tg.ToolCall("read", {}))
            if resolved is not None:
                turn.report_result(resolved)
    labels = sorted(p.attributes[n.TURN_RESOLVED] for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0]))
    assert labels == ["false", "true", "unknown"]
    spans = [s for s in otel.spans() if s.name == "invoke_agent coder"]
    assert sorted(s.attributes[n.TURN_RESOLVED] for s in spans) == ["false", "true", "unknown"]


def test_a_late_result_is_an_event_and_a_counter_with_the_turns_bucket_and_threshold(otel):
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), name="p1",
                                max_tool_calls_per_turn=150), environ={}, **otel.providers())
    with g.turn(agent_name="coder") as turn:
        drive(turn, [distinct_call(i) for i in range(200)])
    assert turn.summary.threshold == "explicit" and turn.summary.tool_calls == 151
    assert g.report_result(turn.turn_id, True) is True
    assert g.report_result("nope", False) is False
    points = {p.attributes[n.RESULT_STATUS]: p for p in otel.points(n.METRIC_TURN_RESULTS[0])}
    assert dict(points["accepted"].attributes) == {
        n.POLICY: "p1", n.RESULT_STATUS: "accepted", n.TURN_RESOLVED: "true", n.TURN_COHORT: "live",
        n.TURN_CALLS_BUCKET: "200", n.LOOP_THRESHOLD: "explicit", n.GEN_AI_AGENT_NAME: "coder",
    }
    assert dict(points["unknown"].attributes) == {n.POLICY: "p1", n.RESULT_STATUS: "unknown",
                                                  n.TURN_RESOLVED: "false"}
    (record,) = otel.logs(n.TURN_RESULT_EVENT)
    attrs = record.attributes
    assert (attrs[n.TURN_ID], attrs[n.TURN_RESOLVED], attrs[n.TURN_TOOL_CALLS], attrs[n.LOOP_THRESHOLD]) == (
        turn.turn_id, True, 151, "explicit")


def test_the_recorder_writes_results_and_calibrate_reads_them_back(tmp_path: Path):
    path = tmp_path / "turns.jsonl"
    g = guard(disable_plugins=("otel", "shadow"), recorder_path=str(path), max_tool_calls_per_turn=20)
    with g.turn() as early:
        drive(early, [distinct_call(i) for i in range(30)])
        early.report_result(True)
    late = ended_turn(g, 30)
    never = ended_turn(g, 30)
    assert g.report_result(late.turn_id, False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line.get("id"), line.get("result_for"), line["resolved"]) for line in lines] == [
        (early.turn_id, None, True), (late.turn_id, None, None), (never.turn_id, None, None),
        (None, late.turn_id, False)]
    out = io.StringIO()
    assert cli.main([str(path), "--json", "-"], stdout=out, stderr=io.StringIO()) == 0
    data = json.loads(out.getvalue())
    assert (data["turns"], data["resolved"], data["unresolved"]) == (3, 1, 1)
    assert data["problems"] == 0
