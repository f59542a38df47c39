"""Late task results in ``turnguard calibrate``: result records and ``turnguard.turn.result`` log
records reach the turns recorded without a result, in any file, in any order, under workers."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from collector_lines import collector_lines, run_turns
from turnguard._calibrate import cli
from turnguard._calibrate import results as r
from turnguard._calibrate.duplicates import id_hash
from turnguard._calibrate.records import InputProblem


def turn(turn_id: str, calls: int, resolved: bool | None = None, cohort: str = "probe") -> str:
    return json.dumps({"source": "turnguard", "id": turn_id, "cohort": cohort, "resolved": resolved,
                       "calls": [{"tool": "read", "args": f"{turn_id}/{i}", "outcome": "ok"} for i in range(calls)]})


def result(turn_id: object, resolved: object) -> str:
    return json.dumps({"source": "turnguard", "result_for": turn_id, "resolved": resolved})


def logs_line(records: list[tuple[str, dict]]) -> str:
    """An OTLP JSON logs document as the Collector's file exporter writes one."""
    def value(v):
        return {"boolValue": v} if isinstance(v, bool) else {"stringValue": str(v)}

    return json.dumps({"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{
        "scope": {"name": "turnguard"},
        "logRecords": [{"eventName": name, "severityText": "INFO", "body": {"stringValue": name},
                        "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
                       for name, attrs in records]}]}]})


GRID = ["--soft-caps", "100", "--multipliers", "10", "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers",
        "--explicit-caps", "100", "--key-modes", "canonical"]


def calibrate(*args: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*args, *GRID, "--json", "-"], stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if code == 0 else {}, err.getvalue()


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def default_row(data: dict) -> dict:
    return next(p for p in data["policies"] if p["default"])["unattended"]


def test_a_late_result_reaches_a_turn_recorded_without_one(tmp_path: Path):
    path = write(tmp_path / "turns.jsonl", [turn("a", 1200), turn("b", 1200), result("a", True), result("b", False)])
    code, data, err = calibrate(str(path))
    assert code == 0 and err == ""
    assert (data["turns"], data["resolved"], data["unresolved"]) == (2, 1, 1)
    row = default_row(data)
    assert (row["halted_resolved"], row["resolved_ids"], row["halted_unresolved"]) == (1, ["a"], 1)
    passed = data["probe"]["passed_multiple"]["10"]
    assert (passed["turns"], passed["resolved"], passed["unresolved"]) == (2, 1, 1)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_results_in_another_file_before_or_after_their_turns_count_alike(tmp_path: Path, jobs: str):
    turns = write(tmp_path / "turns.jsonl", [turn(f"t{i}", 1100) for i in range(6)])
    early = write(tmp_path / "early.jsonl", [result("t0", True), result("t1", True)])
    late = tmp_path / "late.jsonl.gz"
    late.write_bytes(gzip.compress((logs_line([(r.RESULT_EVENT, {"turnguard.turn.id": "t2",
                                                                 "turnguard.turn.resolved": False})]) + "\n").encode()))
    code, data, err = calibrate(str(early), str(turns), str(late), "--jobs", jobs)
    assert code == 0 and err == ""
    assert (data["resolved"], data["unresolved"], data["turns"]) == (2, 1, 6)


def test_the_result_given_with_the_turn_wins_and_then_the_first_late_one(tmp_path: Path):
    path = write(tmp_path / "turns.jsonl", [
        turn("given", 1200, resolved=False), result("given", True),
        turn("twice", 1200), result("twice", True), result("twice", False),
    ])
    code, data, _ = calibrate(str(path))
    assert code == 0
    assert default_row(data)["resolved_ids"] == ["twice"] and default_row(data)["unresolved_ids"] == ["given"]


@pytest.mark.parametrize(("turn_id", "resolved"), [("", True), (None, True), ("x", "yes"), ("x", None), (7, False)])
def test_a_bad_result_record_is_a_problem_with_its_line(tmp_path: Path, turn_id, resolved):
    path = write(tmp_path / "turns.jsonl", [turn("x", 3), result(turn_id, resolved)])
    problems: list[InputProblem] = []
    assert r.late_results([path], problems.append) == {}
    assert [(p.line, "a result record needs 'result_for'" in p.message) for p in problems] == [(2, True)]
    code, data, err = calibrate(str(path))
    assert code == 0 and data["turns"] == 1 and data["problems"] == 1 and ":2: a result record needs" in err


def test_other_log_records_are_not_results_and_logs_lines_are_not_turns(tmp_path: Path):
    path = write(tmp_path / "turns.jsonl", [
        turn("x", 1200),
        logs_line([("turnguard.loop_detected", {"turnguard.turn.id": "x", "turnguard.turn.resolved": True}),
                   (r.RESULT_EVENT, {"turnguard.turn.id": "x"}),  # no result: unknown, not a result
                   (r.RESULT_EVENT, {"turnguard.turn.resolved": True})]),  # no turn
    ])
    code, data, err = calibrate(str(path))
    assert code == 0 and err == "" and data["problems"] == 0
    assert (data["turns"], data["resolved"], data["unresolved"]) == (1, 0, 0)


def test_a_marker_split_across_scan_blocks_is_found(tmp_path: Path):
    record = result("edge", True)
    padding = r.BLOCK - record.index('"result_for"') - 4  # the marker straddles the first block's end
    path = write(tmp_path / "turns.jsonl", ["x" * (padding - 1), record])
    assert r.late_results([path], lambda p: None) == {id_hash("edge"): True}


def test_a_file_without_markers_is_not_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = write(tmp_path / "turns.jsonl", [turn(f"t{i}", 5) for i in range(100)])
    monkeypatch.setattr(r, "parse_line", lambda *a: pytest.fail("parsed a file without markers"))
    assert r.late_results([path], lambda p: None) == {}


def test_results_are_bounded_and_the_overflow_is_one_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(r, "MAX_LATE_RESULTS", 3)
    path = write(tmp_path / "results.jsonl", [result(f"t{i}", True) for i in range(10)])
    problems: list[InputProblem] = []
    assert r.late_results([path], problems.append) == {id_hash(f"t{i}"): True for i in range(3)}
    assert len(problems) == 1 and "more than 3 late results" in problems[0].message


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_collectors_file_of_spans_and_log_records_reads_as_its_spans_and_their_results(tmp_path: Path,
                                                                                            jobs: str):
    """The Collector's file exporter writes span lines and log lines into one file (the shipped
    config's traces and logs pipelines): a log line, first or between span lines, is neither a
    turn nor a problem, and the file gives the figures of its spans with the same results apart."""
    specs = [(f"t{i}", [("read", {"k": k % (3 + i)}, "ok") for k in range(40 + 30 * i)]) for i in range(4)]
    spans = run_turns(specs).spans()
    span_lines = collector_lines(spans[i:i + 25] for i in range(0, len(spans), 25))
    assert len(span_lines) > 3
    first = logs_line([(r.RESULT_EVENT, {"turnguard.turn.id": "t0", "turnguard.turn.resolved": True}),
                       ("turnguard.loop_detected", {"turnguard.turn.id": "t1"})])
    between = logs_line([(r.RESULT_EVENT, {"turnguard.turn.id": "t2", "turnguard.turn.resolved": False})])
    mixed = write(tmp_path / "otlp.jsonl", [first, *span_lines[:2], between, *span_lines[2:]])
    code, together, err = calibrate(str(mixed), "--jobs", jobs)
    assert code == 0 and err == "" and together["problems"] == 0
    assert (together["turns"], together["resolved"], together["unresolved"]) == (4, 1, 1)
    spans_only = write(tmp_path / "spans.jsonl", span_lines)
    results = write(tmp_path / "results.jsonl", [result("t0", True), result("t2", False)])
    code, apart, _ = calibrate(str(spans_only), str(results), "--jobs", jobs)
    assert code == 0
    together.pop("inputs")
    apart.pop("inputs")
    assert together == apart
