"""A turn's times are read once (``turnguard.telemetry._clock``): its span and its recorder line say
the same start and end, to the float ``turnguard calibrate`` reads, so calibrate tells the same
recording (first start, last end, days) from the Collector's file as from the recorder's. The
times are the wall clock's, the span lasts the turn's ``duration_s``, and its call spans lie
within it (an unfinished one ends with it), however the turn ends, and across a suspend and resume."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry

STEP_NS = 50_000_000
"""How far the wall clock may be stepped during a test (a VM's time sync steps it by milliseconds):
the span's start is the wall clock's, its length the monotonic clock's (the turn's ``duration_s``)."""


def recording_guard(path: Path, telemetry: InMemoryTelemetry) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(load_entrypoints=False, recorder_path=str(path), soft_cap=5, hard_multiplier=2,
                                   disable_plugins=("shadow",)), environ={}, **telemetry.providers())


def lines(path: Path) -> dict[str, dict[str, Any]]:
    return {line["id"]: line for line in map(json.loads, path.read_text().splitlines())}


def turn_spans(telemetry: InMemoryTelemetry, turn_id: str) -> list[Any]:
    return [s for s in telemetry.spans() if s.name.startswith(n.OP_INVOKE_AGENT)
            and s.attributes.get(n.TURN_ID) == turn_id]


def _completed(turn: tg.Turn) -> None:
    for i in range(3):
        call = tg.ToolCall("read", {"i": i})
        turn.check_call(call)
        time.sleep(0.002)  # the clock moves between the hooks, as in production
        turn.record_outcome(call, "ok")


def _halted(turn: tg.Turn) -> None:
    for _ in range(40):  # the same call: past the soft cap, stuck
        call = tg.ToolCall("read", {"i": 0})
        if turn.check_call(call).halted:
            return
        turn.record_outcome(call, "ok")
    pytest.fail("the turn was not halted")


def _unfinished_call(turn: tg.Turn) -> None:
    _completed(turn)
    turn.check_call(tg.ToolCall("write", {"i": 9}))  # no outcome: its span ends with the turn


def _raised(turn: tg.Turn) -> None:
    _completed(turn)
    raise RuntimeError("the host's loop failed")


ENDINGS: dict[str, Callable[[tg.Turn], None]] = {"completed": _completed, "halted": _halted,
                                                  "unfinished call": _unfinished_call, "raised": _raised}


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_turn_span_and_the_recorder_line_say_the_same_start_and_end(tmp_path, ending):
    telemetry, path = InMemoryTelemetry(), tmp_path / "turns.jsonl"
    guard = recording_guard(path, telemetry)
    before = time.time_ns()
    try:
        with guard.turn(turn_id="t", agent_name="coder") as turn:
            time.sleep(0.002)
            ENDINGS[ending](turn)
    except RuntimeError:
        assert ending == "raised"
    after = time.time_ns()
    telemetry.tracer_provider.force_flush()
    (span,) = turn_spans(telemetry, "t")
    line = lines(path)["t"]
    assert (line["started_at"], line["ended_at"]) == (span.start_time / 1e9, span.end_time / 1e9)
    assert before - STEP_NS <= span.start_time < span.end_time <= after + STEP_NS
    assert turn.summary is not None
    assert span.end_time - span.start_time == round(turn.summary.duration_s * 1e9)
    calls = [s for s in telemetry.spans() if s.parent is not None and s.parent.span_id == span.context.span_id]
    assert calls and all(span.start_time - STEP_NS <= c.start_time <= c.end_time <= span.end_time + STEP_NS
                         for c in calls)
    if ending == "unfinished call":
        assert max(c.end_time for c in calls) == span.end_time  # it ends with its turn


def test_a_resumed_turns_line_spans_its_first_opening_and_its_last_span_end(tmp_path):
    telemetry = InMemoryTelemetry()
    first = recording_guard(tmp_path / "a.jsonl", telemetry).turn(turn_id="t", durable=True)
    _completed(first)
    state = json.loads(json.dumps(first.suspend()))
    time.sleep(0.01)  # the pause
    resumed = recording_guard(tmp_path / "b.jsonl", telemetry).resume(state)
    _completed(resumed)
    summary = resumed.end()
    telemetry.tracer_provider.force_flush()
    opened, finished = turn_spans(telemetry, "t")
    line = lines(tmp_path / "b.jsonl")["t"]
    assert line["started_at"] == opened.start_time / 1e9 and line["ended_at"] == finished.end_time / 1e9
    assert finished.end_time - finished.start_time == round(summary.duration_s * 1e9)  # the time it ran
    assert opened.end_time <= finished.end_time
