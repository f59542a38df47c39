"""A turn put aside is not a turn ended: ``Turn.suspend()`` (or ``end(reason="suspended")``)
reports no turn where it was put aside (no turn metric point, no recorder line, no slot for a late
result, no shadow summary); the guard that resumes and finishes it reports it once. Checked with
the real telemetry plugin (in-memory SDK readers) and the real recorder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import turnguard as tg
from turnguard.telemetry import _names as n

SHADOW = {"lenient": {"streak_stop_at": 12}}


class Heard:
    """What the hooks said about turns."""

    def __init__(self) -> None:
        self.ended: list[tg.TurnSummary] = []
        self.suspended: list[tg.TurnSummary] = []
        self.shadow_ended: list[tuple[str, tg.TurnSummary]] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, summary):
        self.ended.append(summary)

    @tg.hookimpl
    def turnguard_turn_suspended(self, summary):
        self.suspended.append(summary)

    @tg.hookimpl
    def turnguard_shadow_turn_ended(self, policy, summary):
        self.shadow_ended.append((policy, summary))


def make_guard(otel, path: Path, **options) -> tuple[tg.Guard, Heard]:
    heard = Heard()
    config = tg.GuardConfig(recorder_path=str(path), load_entrypoints=False, shadow=SHADOW, **options)
    return tg.Guard(config, plugins={"heard": heard}, environ={}, **otel.providers()), heard


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def turn_points(otel) -> int:
    """How many turns the turn histograms recorded (every point's count)."""
    return sum(p.count for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0]))


def shadow_turn_points(otel) -> int:
    return sum(p.count for p in otel.points(n.METRIC_SHADOW_TURN_TOOL_CALLS[0]))


def failing(turn: tg.Turn, count: int, start: int = 0) -> list[tg.Verdict]:
    verdicts = []
    for i in range(start, start + count):
        call = tg.ToolCall("run_tests", {"target": "all"}, call_id=f"c{i}")
        verdicts.append(turn.check_call(call))
        verdicts.append(turn.record_outcome(call, tg.Outcome.ERROR))
    return verdicts


@pytest.mark.parametrize("how", ["suspend", "end"])
def test_a_suspended_turn_is_reported_nowhere_and_the_guard_that_finishes_it_reports_it_once(otel, tmp_path, how):
    first_path, second_path = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first, first_heard = make_guard(otel, first_path)
    turn = first.turn(durable=True, conversation_id="c1", agent_name="coder")
    failing(turn, 5)
    if how == "suspend":
        state = turn.suspend()
    else:
        state = turn.snapshot()
        turn.end(reason="suspended")
    assert turn.summary.reason == "suspended" and turn.end().reason == "suspended"  # idempotent
    assert turn_points(otel) == 0 and shadow_turn_points(otel) == 0
    assert lines(first_path) == [] and first_heard.ended == [] and first_heard.shadow_ended == []
    assert [s.reason for s in first_heard.suspended] == ["suspended"]
    assert first.report_result(turn.turn_id, True) is False  # no slot for a late result
    assert first.results.counts[tg.ResultStatus.UNKNOWN] == 1
    span = otel.span("invoke_agent coder")
    assert span.attributes[n.TURN_OUTCOME] == "suspended"

    second, second_heard = make_guard(otel, second_path)
    resumed = second.resume(json.loads(json.dumps(state)))
    verdicts = failing(resumed, 3, start=5)
    assert verdicts[-1].action is tg.Action.HALT  # the 8th failure, counted across the suspension
    summary = resumed.end()
    assert (summary.turn_id, summary.tool_calls, summary.reason) == (turn.turn_id, 8, "halted")
    assert turn_points(otel) == 1 and shadow_turn_points(otel) == 1
    _flush(second)
    recorded = lines(second_path)
    assert [(line["id"], line["tool_calls"]) for line in recorded] == [(turn.turn_id, 8)]
    assert [s.turn_id for s in second_heard.ended] == [turn.turn_id]
    assert [(p, s.tool_calls) for p, s in second_heard.shadow_ended] == [("lenient", 8)]
    assert second.report_result(turn.turn_id, True) is True
    assert second.report_result(turn.turn_id, False) is False  # the first result wins
    _flush(first)
    assert lines(first_path) == []


def _flush(guard: tg.Guard) -> None:
    recorder = guard.pm.get_plugin("recorder")
    assert recorder is not None and recorder.flush()


def test_a_turn_suspended_and_resumed_in_the_same_guard_keeps_its_id_and_is_reported_once(otel, tmp_path):
    path = tmp_path / "turns.jsonl"
    guard, heard = make_guard(otel, path)
    turn = guard.turn(durable=True)
    failing(turn, 4)
    resumed = guard.resume(turn.suspend())
    assert resumed.turn_id == turn.turn_id and resumed.view.resumed_from is None
    failing(resumed, 2, start=4)
    resumed.end()
    _flush(guard)
    assert [line["tool_calls"] for line in lines(path)] == [6]
    assert [s.tool_calls for s in heard.ended] == [6] and turn_points(otel) == 1


def test_a_turn_resumed_while_the_first_goes_on_is_a_fork_with_an_id_of_its_own(otel, tmp_path):
    """A snapshot taken, the turn going on (not suspended), the snapshot resumed in the same guard:
    two turns, each reported once under its own id; the fork says where it came from."""
    path = tmp_path / "turns.jsonl"
    guard, heard = make_guard(otel, path)
    turn = guard.turn(durable=True, agent_name="coder")
    failing(turn, 3)
    fork = guard.resume(turn.snapshot())
    assert fork.turn_id != turn.turn_id and fork.view.resumed_from == turn.turn_id
    failing(turn, 1, start=3)
    turn.end()
    fork.end()
    _flush(guard)
    recorded = {line["id"]: line for line in lines(path)}
    assert set(recorded) == {turn.turn_id, fork.turn_id}
    assert recorded[fork.turn_id]["resumed_from"] == turn.turn_id and "resumed_from" not in recorded[turn.turn_id]
    assert [s.resumed_from for s in heard.ended] == [None, turn.turn_id]
    spans = [s for s in otel.spans() if s.name == "invoke_agent coder"]
    assert [s.attributes.get(n.TURN_RESUMED_FROM) for s in spans] == [None, turn.turn_id]
    assert turn_points(otel) == 2


def test_a_turn_that_ended_cannot_be_suspended():
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={})
    turn = guard.turn()
    turn.end()
    with pytest.raises(ValueError, match="ended"):
        turn.suspend()


def test_leaving_the_block_after_suspend_reports_nothing(otel, tmp_path):
    path = tmp_path / "turns.jsonl"
    guard, heard = make_guard(otel, path)
    with guard.turn(durable=True) as turn:
        failing(turn, 2)
        turn.suspend()
    _flush(guard)
    assert heard.ended == [] and lines(path) == [] and turn_points(otel) == 0


def test_a_result_reported_before_the_suspension_travels_with_the_turn(otel, tmp_path):
    guard, _ = make_guard(otel, tmp_path / "turns.jsonl")
    turn = guard.turn(durable=True)
    assert turn.report_result(True) is True
    other, _ = make_guard(otel, tmp_path / "other.jsonl")
    resumed = other.resume(json.loads(json.dumps(turn.suspend())))
    assert resumed.end().resolved is True
    assert resumed.report_result(False) is False  # it has its result
