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


@pytest.mark.parametrize(("turn_id", "resolved"), [(True, True), (None, True), ("x", "yes"), ("x", None), (7.0, False),
                                                    ("x" * 257, True)])
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


def timed_result(turn_id: str, resolved: bool, at: float | None) -> str:
    """A result record as the recorder writes one (``reported_at``: when it was taken; ``None``:
    an older recorder's, without it)."""
    return json.dumps({"source": "turnguard", "result_for": turn_id, "resolved": resolved,
                       **({} if at is None else {"reported_at": at})})


def timed_logs_line(turn_id: str, resolved: bool, at: float | None, field: str = "timeUnixNano") -> str:
    """A ``turnguard.turn.result`` log record timed at ``at`` in ``field`` (as the SDK's OTLP JSON:
    nanoseconds as text; ``None``: unset, ``"0"``)."""
    attrs = {"turnguard.turn.id": turn_id, "turnguard.turn.resolved": resolved}
    line = json.loads(logs_line([(r.RESULT_EVENT, attrs)]))
    line["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0][field] = "0" if at is None else str(round(at * 1e9))
    return json.dumps(line)


EVERY_TURN_HALTED = ["--soft-caps", "100", "--multipliers", "10", "--no-peers", "--explicit-caps", "2",
                     "--key-modes", "canonical"]
"""A grid whose ``explicit 2`` row halts every turn of 3 calls or more, so it lists each one's result."""


def _kept(paths: list[Path], jobs: str) -> tuple[list[str], list[str]]:
    """The turns the ``explicit 2`` row counts resolved and unresolved."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, paths), *EVERY_TURN_HALTED, "--jobs", jobs, "--json", "-"], stdout=out, stderr=err)
    assert code == 0 and err.getvalue() == "", err.getvalue()
    return _halted_ids(json.loads(out.getvalue()))


def _halted_ids(data: dict) -> tuple[list[str], list[str]]:
    row = next(p for p in data["policies"] if p["name"] == "explicit 2")["unattended"]
    return sorted(row["resolved_ids"]), sorted(row["unresolved_ids"])


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("form", ["record", "log", "observed", "mixed"])
def test_a_turns_earliest_result_wins_whatever_the_order_of_its_files(tmp_path: Path, form: str, jobs: str):
    """Two or three processes take a result for one turn; each file holds one of them. The result
    taken first is the turn's in every order of the files, from records and from log records."""
    import itertools
    import random

    rng = random.Random(f"{form}{jobs}")
    turns = write(tmp_path / "turns.jsonl", [turn(f"t{i}", 1200) for i in range(6)])
    # each file's result for each turn: a time and a value; the earliest time is the one expected
    files, expected = [], {}
    times = {f"t{i}": rng.sample(range(1, 1000), 3) for i in range(6)}
    values = {t: [rng.random() < .5 for _ in range(3)] for t in times}
    for t in times:
        expected[t] = values[t][times[t].index(min(times[t]))]
    for f in range(3):
        lines = []
        for t in times:
            at, value = 1.8e9 + times[t][f] / 1000, values[t][f]
            kind = form if form != "mixed" else ("record", "log", "observed")[(f + int(t[1:])) % 3]
            lines.append(timed_result(t, value, at) if kind == "record" else
                         timed_logs_line(t, value, at, "timeUnixNano" if kind == "log" else "observedTimeUnixNano"))
        files.append(write(tmp_path / f"results{f}.jsonl", lines))
    want = (sorted(t for t, v in expected.items() if v), sorted(t for t, v in expected.items() if not v))
    for order in itertools.permutations(files):
        paths = [*order[:1], turns, *order[1:]]
        assert _kept(paths, jobs) == want, [p.name for p in paths]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_results_without_a_time_come_after_timed_ones_and_the_first_read_of_them_stands(tmp_path: Path, jobs: str):
    """An older recorder's records have no time: a timed result wins over them in any order; among
    them (and among results taken at the same instant) the first read stands, as before."""
    turns = write(tmp_path / "turns.jsonl", [turn(t, 1200) for t in ("mixed", "untimed", "tie")])
    a = write(tmp_path / "a.jsonl", [timed_result("mixed", True, None), timed_result("untimed", True, None),
                                     timed_result("tie", True, 1.8e9)])
    b = write(tmp_path / "b.jsonl", [timed_result("mixed", False, 1.9e9), timed_result("untimed", False, None),
                                     timed_logs_line("tie", False, 1.8e9)])
    assert _kept([turns, a, b], jobs) == (["tie", "untimed"], ["mixed"])
    assert _kept([turns, b, a], jobs) == ([], ["mixed", "tie", "untimed"])


@pytest.mark.parametrize("line", [
    timed_result("t0", False, -1), timed_result("t0", False, 1e12), json.dumps(
        {"result_for": "t0", "resolved": False, "reported_at": "yesterday"}),
    timed_logs_line("t0", False, 1.8e9).replace('"timeUnixNano": "1800000000000000000"', '"timeUnixNano": "soon"'),
    timed_logs_line("t0", False, 1.8e9).replace('"timeUnixNano": "1800000000000000000"', '"timeUnixNano": true'),
])
def test_a_result_with_a_garbled_time_is_a_problem_and_counts_as_one_without_a_time(tmp_path: Path, line: str):
    turns = write(tmp_path / "turns.jsonl", [turn("t0", 1200)])
    garbled = write(tmp_path / "garbled.jsonl", [line])
    untimed = write(tmp_path / "untimed.jsonl", [timed_result("t0", True, None)])
    timed = write(tmp_path / "timed.jsonl", [timed_result("t0", True, 1.9e9)])
    code, data, err = calibrate(str(turns), str(garbled), str(untimed))
    assert code == 0 and data["problems"] == 1 and "garbled.jsonl:1:" in err and "without a time" in err
    assert default_row(data)["unresolved_ids"] == ["t0"]  # the garbled one, read first, of the untimed two
    code, data, err = calibrate(str(turns), str(garbled), str(timed))
    assert code == 0 and data["problems"] == 1 and default_row(data)["resolved_ids"] == ["t0"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_guards_taking_results_for_one_turn_agree_from_recorders_and_collectors_in_any_order(
        tmp_path: Path, jobs: str):
    """The turn's own guard and another one (by its token) each take a result for the same turn:
    the recorders' records and the log records say when, so calibrate keeps the first taken from
    either format, in every order of the files, and a merge of runs agrees with one run."""
    import itertools

    import turnguard as tg
    from collector_lines import log_lines
    from turnguard.telemetry._testing import InMemoryTelemetry

    owner_tel, other_tel = InMemoryTelemetry(), InMemoryTelemetry()
    owner = tg.Guard(tg.GuardConfig(recorder_path=str(tmp_path / "turns.jsonl"), load_entrypoints=False),
                     environ={}, **owner_tel.providers())
    other = tg.Guard(tg.GuardConfig(recorder_path=str(tmp_path / "elsewhere.jsonl"), load_entrypoints=False),
                     environ={}, **other_tel.providers())
    tokens = {}
    for i in range(6):
        t = owner.turn(turn_id=f"t{i}")
        for j in range(5):
            call = tg.ToolCall("read", {"p": j})
            t.check_call(call)
            t.record_outcome(call, "ok")
        t.end()
        tokens[i] = t.result_token
    first = {}
    for i in range(6):  # even turns: the owner takes the first result; odd ones: the other guard
        takers = [(owner, f"t{i}"), (other, tokens[i])][:: 1 if i % 2 == 0 else -1]
        first[f"t{i}"] = i % 3 != 0
        assert takers[0][0].report_result(takers[0][1], i % 3 != 0)
        assert takers[1][0].report_result(takers[1][1], i % 3 == 0)
    for tel in (owner_tel, other_tel):
        tel.tracer_provider.force_flush()
        tel.logger_provider.force_flush()
    records = [json.loads(line) for name in ("turns.jsonl", "elsewhere.jsonl")
               for line in (tmp_path / name).read_text().splitlines() if "result_for" in line]
    logs = [rec.log_record for tel in (owner_tel, other_tel) for rec in tel.log_exporter.get_finished_logs()
            if rec.log_record.event_name == r.RESULT_EVENT]
    assert sorted(rec["reported_at"] for rec in records) == sorted(log.timestamp / 1e9 for log in logs)
    write(tmp_path / "otlp.jsonl", [*collector_lines([owner_tel.spans()]),
                                    *log_lines([list(owner_tel.log_exporter.get_finished_logs())])])
    write(tmp_path / "otlp2.jsonl", log_lines([list(other_tel.log_exporter.get_finished_logs())]))
    want = (sorted(t for t, v in first.items() if v), sorted(t for t, v in first.items() if not v))
    for names in (("turns.jsonl", "elsewhere.jsonl"), ("otlp.jsonl", "otlp2.jsonl"),
                  ("turns.jsonl", "otlp2.jsonl"), ("otlp.jsonl", "elsewhere.jsonl")):
        for order in itertools.permutations(names):
            assert _kept([tmp_path / n for n in order], jobs) == want, order
    lines = (tmp_path / "turns.jsonl").read_text().splitlines()
    parts = [write(tmp_path / f"part{k}.jsonl", [x for x in lines if '"result_for"' not in x and
                                                  json.loads(x)["id"] in half]) for k, half in
             enumerate([("t0", "t1", "t2"), ("t3", "t4", "t5")])]
    write(tmp_path / "owner.jsonl", [x for x in lines if '"result_for"' in x])
    for order in itertools.permutations(("owner.jsonl", "elsewhere.jsonl")):  # the results apart from the turns
        runs = []
        for k, part in enumerate(parts):
            runs.append(tmp_path / f"run{k}.json")
            results = [tmp_path / n for n in (order if k == 0 else order[::-1])]
            assert cli.main([str(part), *map(str, results), *EVERY_TURN_HALTED, "--jobs", jobs, "--json",
                             str(runs[-1])], stdout=io.StringIO(), stderr=io.StringIO()) == 0
        merged = io.StringIO()
        err = io.StringIO()
        assert cli.merge_main([*map(str, runs), "--json", "-"], stdout=merged, stderr=err) == 0, err.getvalue()
        assert _halted_ids(json.loads(merged.getvalue())) == want
