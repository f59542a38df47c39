"""Tool spans exported in a later OTLP JSON line (or file) than their turn span join their turn:
every way of cutting a turn's spans into lines gives the turn one line gives, never a second turn
of the late spans. A turn span whose spans leave a number missing is held for them until none is
(``collector.awaited``), the stream ends, or the waiting bound gives it up; any other turn is
given at once, as before."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli
from turnguard._calibrate import collector as collector_module
from turnguard._calibrate.collector import OtlpAssembler
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import InputProblem
from turnguard.telemetry import _names as names
from turnguard.telemetry._testing import InMemoryTelemetry

TURN_ID = "turnguard.turn.id"


def spans_of(config: dict[str, Any], plan: list[tuple[str, str, tg.Outcome | None]]) -> list[Any]:
    """One turn's finished spans: each planned call checked, its outcome recorded (``None``: never,
    it is ``unfinished``); a halt ends the turn."""
    telemetry = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, **config), environ={}, **telemetry.providers())
    with guard.turn(turn_id="T", promptable=False) as turn:
        for tool, args, outcome in plan:
            call = tg.ToolCall(tool, args)
            if turn.check_call(call).halted:
                break
            if outcome is not None and turn.record_outcome(call, outcome).halted:
                break
    telemetry.tracer_provider.force_flush()
    return list(telemetry.spans())


PLANS = {
    "ok and error": ({}, [("bash", "a", tg.Outcome.OK), ("bash", "b", tg.Outcome.ERROR), ("read", "a", tg.Outcome.OK),
                          ("bash", "a", tg.Outcome.OK)]),
    "halted at a check": ({"streak_warn_at": 0, "streak_stop_at": 3, "streak_stop_on": "error"},
                          [("bash", "a", tg.Outcome.ERROR)] * 5),
    "unfinished": ({}, [("bash", "a", tg.Outcome.OK), ("read", "b", None), ("bash", "c", tg.Outcome.OK)]),
}


def read(path: Path) -> tuple[list[Any], list[InputProblem]]:
    """The turns read (their origin left out: the files differ), and the problems."""
    problems: list[InputProblem] = []
    return [dataclasses.replace(t, origin="") for t in read_turns([path], problems.append)], problems


def write(path: Path, batches: list[list[Any]]) -> Path:
    path.write_text("".join(line + "\n" for line in collector_lines(batches)))
    return path


def is_turn_span(span: Any) -> bool:
    return TURN_ID in dict(span.attributes or {})


@pytest.fixture(params=["msgspec", "json"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "json":
        monkeypatch.setattr(collector_module, "_usable", lambda: False)
    return str(request.param)


@pytest.mark.parametrize("plan", PLANS)
def test_every_cut_of_a_turns_spans_into_lines_gives_the_one_turn(tmp_path: Path, plan: str, reading: str) -> None:
    """Each span in any of three lines, the turn span too (before, among or after its tool spans)."""
    spans = spans_of(*PLANS[plan])
    tools = [s for s in spans if not is_turn_span(s)]
    turn_span = next(s for s in spans if is_turn_span(s))
    whole, problems = read(write(tmp_path / "whole.jsonl", [[*tools, turn_span]]))
    assert len(whole) == 1 and problems == [] and whole[0].calls_dropped == whole[0].calls_unrecorded == 0
    tried = 0
    for places in itertools.product(range(3), repeat=len(tools) + 1):
        batches: list[list[Any]] = [[], [], []]
        for span, line in zip([*tools, turn_span], places, strict=True):
            batches[line].append(span)
        turns, problems = read(write(tmp_path / "cut.jsonl", batches))
        assert (turns, problems) == (whole, []), places
        tried += 1
    assert tried == 3 ** (len(tools) + 1)


def test_late_spans_join_their_turn_across_rotated_files(tmp_path: Path) -> None:
    spans = spans_of(*PLANS["ok and error"])
    tools = [s for s in spans if not is_turn_span(s)]
    turn_span = next(s for s in spans if is_turn_span(s))
    whole, _ = read(write(tmp_path / "whole.jsonl", [[*tools, turn_span]]))
    folder = tmp_path / "set"
    folder.mkdir()
    write(folder / "otlp-2026-12-01T00-00-00.000.jsonl", [[tools[0], turn_span]])
    write(folder / "otlp.jsonl", [tools[1:]])
    data = calibrate(folder)
    assert (data["turns"], data["problems"]) == (1, 0)
    assert data == calibrate(tmp_path / "whole.jsonl") | {"inputs": data["inputs"]}
    assert whole[0].needed_calls == len(tools)


def calibrate(*paths: Path, jobs: int = 1) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, paths), "--json", "-", "--progress", "never", "--jobs", str(jobs), "--soft-caps", "3",
                     "--multipliers", "2", "--stuck-repeats", "3", "--no-peers"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    data = json.loads(out.getvalue())
    data.pop("replays", None)
    return data


def value(v: Any) -> dict[str, Any]:
    return {"intValue": str(v)} if type(v) is int else {"stringValue": v}


def span(span_id: str, parent: str | None, attrs: dict[str, Any]) -> dict[str, Any]:
    out = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": span_id, "name": "s",
           "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    if parent is not None:
        out["parentSpanId"] = parent
    return out


def tool(parent: str, index: int) -> dict[str, Any]:
    return span(f"{parent}-{index}", parent, {names.CALL_INDEX: index, names.CALL_KEY_DIGEST: f"d{index}",
                                              names.GEN_AI_TOOL_NAME: "read", names.CALL_OUTCOME: "ok"})


def turn(span_id: str, turn_id: str, tool_calls: int | None = None, *, ended: bool = True,
         resumed: bool = False) -> dict[str, Any]:
    attrs: dict[str, Any] = {TURN_ID: turn_id}
    if ended:
        attrs[names.TURN_OUTCOME] = "completed"
    if tool_calls is not None:
        attrs[names.TURN_TOOL_CALLS] = tool_calls
    if resumed:
        attrs[names.TURN_RESUMED_FROM] = "earlier"
    return span(span_id, None, attrs)


def lines_of(*batches: list[dict[str, Any]]) -> str:
    return "".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": b}]}]}) + "\n" for b in batches)


def listing(turns: list[Any]) -> list[tuple[str, list[str], int, int]]:
    return [(t.id, [c.digest for c in t.calls], t.calls_dropped, t.calls_unrecorded) for t in turns]


@pytest.mark.parametrize(("text", "expected"), [
    # a host's turn span that ended before its turn (no turnguard.turn.outcome): any number may come
    (lines_of([turn("h", "H", ended=False), tool("h", 1)], [tool("h", 2)], [turn("a", "A", 1), tool("a", 1)]),
     [("A", ["d1"], 0, 0), ("H", ["d1", "d2"], 0, 0)]),
    # a span lost for good: the turn is given once, at the end, its missing call counted
    (lines_of([tool("a", 1), tool("a", 3), turn("a", "A", 3)], [turn("b", "B", 1), tool("b", 1)]),
     [("B", ["d1"], 0, 0), ("A", ["d1"], 2, 0)]),
    # a resumed turn lists its calls from the resume on: nothing awaited, given at once
    (lines_of([tool("r", 3), tool("r", 4), turn("r", "R", 4, resumed=True)], [turn("b", "B", 1), tool("b", 1)]),
     [("R", ["d3", "d4"], 0, 2), ("B", ["d1"], 0, 0)]),
    # a number the turn has already starts a new wait under the key, which takes the key's spans on
    (lines_of([turn("a", "A", 2), tool("a", 1)], [tool("a", 1), tool("a", 2)]),
     [("A", ["d1"], 1, 0), ("a", ["d1", "d2"], 0, 0)]),
    # without a count, an ended turn awaits only the numbers below its last
    (lines_of([turn("a", "A"), tool("a", 1), tool("a", 3)], [tool("a", 2), tool("a", 4)]),
     [("A", ["d1", "d2", "d3"], 0, 0), ("a", ["d4"], 0, 3)]),
])
def test_a_turn_is_held_only_for_the_numbers_it_misses(tmp_path: Path, reading: str, text: str,
                                                         expected: list[Any]) -> None:
    path = tmp_path / "otlp.jsonl"
    path.write_text(text)
    turns, problems = read(path)
    assert listing(turns) == expected
    assert len(problems) == sum(1 for t in expected if t[0] == "a")  # spans without their turn span: said


def test_a_copy_of_the_file_does_not_feed_the_turn_held_open(tmp_path: Path) -> None:
    """A turn held open (a span lost for good) and the same file again: each reading is its own,
    the copy's turn a duplicate of the first, not calls added to it."""
    path = tmp_path / "otlp.jsonl"
    path.write_text(lines_of([turn("a", "A", 3), tool("a", 1)], [tool("a", 3)]))
    copy = tmp_path / "copy.jsonl"
    copy.write_text(path.read_text())
    problems: list[InputProblem] = []
    turns = list(read_turns([path, copy], problems.append))
    assert listing(turns) == [("A", ["d1"], 2, 0), ("A", ["d1"], 2, 0)] and problems == []
    data = calibrate(path, copy)
    assert (data["turns"], data["problems"], data["duplicates"]) == (1, 0, 1)


@pytest.mark.parametrize("waiting", [1, 2, 5])
def test_the_waiting_bound_gives_up_the_oldest_open_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        waiting: int) -> None:
    """Open turns count against the waiting bound (each one, and its calls): past it the oldest
    is given as it is, and its spans that come later are a turn of their own (said)."""
    monkeypatch.setattr("turnguard._calibrate.collector.waiting_calls_limit", lambda max_line_bytes: waiting)
    path = tmp_path / "otlp.jsonl"
    path.write_text(lines_of([turn("a", "A", 2), tool("a", 1)], [turn("b", "B", 2), tool("b", 1)],
                             [tool("a", 2), tool("b", 2)]))
    turns, problems = read(path)
    ids = [t.id for t in turns]
    assert sorted(ids) == (["A", "B"] if waiting == 5 else ["A", "B", "a", "b"])
    assert sum(len(t.calls) for t in turns) == 4
    assert len(problems) == ids.count("a") + ids.count("b")
    assert all("waited longest" in p.message or "without their turn span" in p.message for p in problems)


def late_stream(seed: int, turns: int = 60) -> str:
    """Turns whose tool spans come before, with and after their turn span, some of them in later
    lines, some lost, among other turns' lines."""
    rng = random.Random(seed)
    pending: list[dict[str, Any]] = []
    lines: list[list[dict[str, Any]]] = []
    for t in range(turns):
        n = rng.randint(1, 6)
        spans = [tool(f"s{t}", i) for i in range(1, n + 1) if rng.random() > 0.05]
        cut = rng.randint(0, len(spans))
        pending += spans[:cut]
        pending.append(turn(f"s{t}", f"T{t}", n, ended=rng.random() > 0.1))
        pending += spans[cut:]
        while len(pending) > rng.randint(0, 8):
            take = rng.randint(1, len(pending))
            lines.append(pending[:take])
            del pending[:take]
    if pending:
        lines.append(pending)
    return lines_of(*lines)


@pytest.mark.parametrize("seed", range(3))
def test_one_reader_and_workers_reading_ranges_give_the_same_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    seed: int) -> None:
    """Ranges whose turns are held open, or that bring spans to turns held open, are read again by
    the parent; the others joined: one figure either way."""
    path = tmp_path / "otlp.jsonl"
    path.write_text(late_stream(seed))
    monkeypatch.setattr("turnguard._calibrate.run.range_bytes", lambda max_line_bytes: 1500)
    joins: list[bool] = []
    take_range = OtlpAssembler.take_range

    def joined(self: OtlpAssembler, *args: Any) -> Any:
        stitched = take_range(self, *args)
        joins.append(stitched is not None)
        return stitched

    monkeypatch.setattr(OtlpAssembler, "take_range", joined)
    one = calibrate(path)
    assert one["turns"] == 60
    assert calibrate(path, jobs=2) == one
    assert True in joins and False in joins
