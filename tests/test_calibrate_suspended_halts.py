"""A turn halted, then put aside (``suspend``) and resumed, is one turn in the Collector's file as in
the recorder's. The span of a suspended part carries the halt the turn had latched, and calibrate
read that part as a turn ended by the halt: with the resumed part's span, two different readings of
one id, so neither was read ("different turns under one id"), and the turn was lost."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli
from turnguard._calibrate.collector import span_ended_by
from turnguard._calibrate.inputs import read_turns
from turnguard.telemetry import _names as names
from turnguard.telemetry._testing import InMemoryTelemetry

Drive = Callable[[tg.Turn], None]


def _calls(turn: tg.Turn, calls: list[tg.ToolCall], outcome: str = "ok") -> None:
    """Run ``calls`` until one is halted (at its check or its outcome)."""
    for call in calls:
        if turn.check_call(call).halted or turn.record_outcome(call, outcome).halted:
            return


def _requests(turn: tg.Turn) -> None:
    for i in range(10):
        if turn.begin_cycle().halted:
            return
        _calls(turn, [tg.ToolCall("read", {"p": i})])


HALTS: dict[str, tuple[dict[str, object], Drive]] = {
    "hard_backstop": ({"soft_cap": 5, "hard_multiplier": 2},
                      lambda t: _calls(t, [tg.ToolCall("read", {"p": i}) for i in range(30)])),
    "explicit": ({"max_tool_calls_per_turn": 7},
                 lambda t: _calls(t, [tg.ToolCall("read", {"p": i}) for i in range(30)])),
    "soft_stuck": ({"soft_cap": 5, "stuck_repeat_threshold": 3},
                   lambda t: _calls(t, [tg.ToolCall("read", {"p": i % 2}) for i in range(30)])),
    "streak": ({"streak_warn_at": 2, "streak_stop_at": 3}, lambda t: _calls(t, [tg.ToolCall("get", {})] * 10, "error")),
    "cycle_cap": ({"max_cycles_per_turn": 3}, _requests),
    "cycle_repeat": ({"cycle_repeat_warn_at": 2, "cycle_repeat_stop_at": 3},
                     lambda t: _calls(t, [tg.ToolCall("tool", {"k": i % 2}) for i in range(40)])),
}


def _record(folder: Path, threshold: str, parts: int) -> tuple[Path, list[str]]:
    """One unattended turn halted at ``threshold``, then suspended and resumed ``parts - 1`` times
    before it ends: the recorder's file, and the Collector's lines of its spans."""
    telemetry = InMemoryTelemetry()
    options, drive = HALTS[threshold]
    config = tg.GuardConfig(load_entrypoints=False, recorder_path=str(folder / "lines.jsonl"), **options)
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    turn = guard.turn(turn_id="x", durable=True, promptable=False, agent_name="coder")
    drive(turn)
    assert turn.halted is not None and turn.halted.threshold == threshold
    for _ in range(parts - 1):
        turn = guard.resume(json.loads(json.dumps(turn.suspend())))
    turn.report_result(False)
    turn.end()
    telemetry.tracer_provider.force_flush()
    return folder / "lines.jsonl", [collector_lines([[span]])[0] for span in telemetry.spans()]


def _calibrate(*paths: Path) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, paths), "--no-peers", "--progress", "never", "--json", "-"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("threshold", HALTS)
def test_a_halted_turn_put_aside_and_resumed_is_one_turn_in_the_collectors_file(tmp_path, threshold, parts):
    lines, spans = _record(tmp_path, threshold, parts)
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(spans) + "\n")
    problems: list[object] = []
    read = [(t.ended_by, t.needed_calls) for t in read_turns([path], problems.append)]
    recorded = [(t.ended_by, t.needed_calls) for t in read_turns([lines], problems.append)]
    assert problems == []
    assert read == [("suspended", recorded[0][1])] * (parts - 1) + recorded
    from_spans, err = _calibrate(path)
    from_lines, _ = _calibrate(lines)
    assert "different turns" not in err
    assert (from_spans["turns"], from_spans["suspended_parts"], from_spans["duplicates"]) == (1, parts - 1, 0)
    for key in ("turns", "calls", "unresolved"):
        assert from_spans[key] == from_lines[key], key
    assert from_spans["survival"]["censored_by"] == from_lines["survival"]["censored_by"]


@pytest.mark.parametrize("threshold", ["hard_backstop", "streak"])
def test_parts_in_files_of_their_own_are_one_turn_in_any_order(tmp_path, threshold):
    """The suspended parts' spans in one Collector's file, the ending part's in another's: one turn,
    whichever file is named first."""
    _, spans = _record(tmp_path, threshold, 3)
    ending = next(i for i, line in enumerate(spans) if '"suspended"' not in line and "invoke_agent" in line)
    first, second = tmp_path / "a" / "otlp.jsonl", tmp_path / "b" / "otlp.jsonl"
    for path, lines in ((first, spans[:ending] + spans[ending + 1:]), (second, [spans[ending]])):
        path.parent.mkdir()
        path.write_text("\n".join(lines) + "\n")
    for order in ((first, second), (second, first)):
        result, err = _calibrate(*order)
        assert (result["turns"], result["suspended_parts"], result["problems"]) == (1, 2, 0), err


@pytest.mark.parametrize("threshold", [*HALTS, "halted", "plugin_error", None])
def test_a_suspended_spans_end_is_its_suspension_whatever_halt_it_carries(threshold):
    carried = {} if threshold is None else {names.LOOP_THRESHOLD: threshold}
    assert span_ended_by({names.TURN_OUTCOME: "suspended", **carried}) == "suspended"
    ended = span_ended_by({names.TURN_OUTCOME: "halted", **carried})
    assert ended == (threshold or "halted")
