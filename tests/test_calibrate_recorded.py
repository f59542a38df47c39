"""What a recording says about how each turn ran: the policy and limits in force, when it ran, what
ended it, its true call count. Read alike from the recorder's lines and the Collector's spans of
the same turns (both written by a real guard), bounded on hostile input, and absent (``None``) in
older recordings, which stay readable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import collector
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import InputProblem, Limits
from turnguard._model import MAX_ID_LENGTH
from turnguard.telemetry._testing import InMemoryTelemetry

PROBE = {"rate": 0.5, "hard_multiplier": 4, "stuck_repeat_threshold": 9}


def read(path: Path) -> tuple[dict, list[str]]:
    problems: list[InputProblem] = []
    turns = {t.id: t for t in read_turns([path], problems.append)}
    return turns, [str(p) for p in problems]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, tg.TurnSummary]]:
    """The same 30 turns (some halted at the backstop, some by the streak stop, some cancelled)
    through a guard with a probe, the recorder and the OpenTelemetry plugin."""
    folder = tmp_path_factory.mktemp("recorded")
    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(name="prod", soft_cap=10, hard_multiplier=3, recorder_path=str(folder / "turns.jsonl"),
                            probe=PROBE, load_entrypoints=False, disable_plugins=("shadow",),
                            stateful_tools=("poll", "status"), streak_exempt_tools=("fetch",))
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    summaries = {}
    for t in range(30):
        turn = guard.turn(turn_id=f"t{t}", promptable=False)
        n = 5 + 3 * t
        for i in range(n):
            call = tg.ToolCall("run", {"i": 0 if t % 4 == 0 else i})
            if turn.check_call(call).halted or turn.record_outcome(call, "error").halted:
                break
        summaries[f"t{t}"] = turn.end("cancelled" if t % 7 == 3 else "completed")
    telemetry.tracer_provider.force_flush()
    otlp = folder / "otlp.jsonl"
    spans = telemetry.spans()
    otlp.write_text("\n".join(collector_lines(spans[i:i + 50] for i in range(0, len(spans), 50))) + "\n")
    return folder / "turns.jsonl", otlp, summaries


def test_lines_and_spans_say_the_same_policy_limits_end_and_times(recorded):
    lines, spans, summaries = recorded
    from_lines, problems_lines = read(lines)
    from_spans, problems_spans = read(spans)
    assert problems_lines == problems_spans == []
    assert set(from_lines) == set(from_spans) == set(summaries)
    cohorts = set()
    for turn_id, summary in summaries.items():
        a, b = from_lines[turn_id], from_spans[turn_id]
        cohorts.add(a.cohort)
        probe = a.cohort == "probe"
        limits = Limits("adaptive", 10, 40 if probe else 30, 9 if probe else 6, 5, 8, 0, ("poll", "status"), ("fetch",),
                        "repeat", "error", False, 65536, (), 0, 0, 4)
        assert (a.policy, a.limits) == (b.policy, b.limits) == ("prod-probe" if probe else "prod", limits)
        assert a.cohort == b.cohort == summary.cohort
        expected_end = str(summary.threshold) if summary.threshold else summary.reason
        assert a.ended_by == b.ended_by == expected_end
        assert a.tool_calls == b.tool_calls == summary.tool_calls == len(a.calls) == len(b.calls)
        assert a.needed_calls == summary.tool_calls
        assert a.started_at <= a.ended_at and b.started_at <= b.ended_at
        assert (a.started_at, a.ended_at) == (b.started_at, b.ended_at)  # one reading of the clock each
    assert cohorts == {"live", "probe"}
    ends = {t.ended_by for t in from_lines.values()}
    assert {"hard_backstop", "streak", "cancelled", "completed"} <= ends


def test_a_recording_without_these_facts_still_reads(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"id": "old", "calls": [{"tool": "a", "args": "x", "outcome": "ok"}]}) + "\n")
    turns, problems = read(path)
    t = turns["old"]
    assert problems == []
    assert (t.policy, t.limits, t.started_at, t.ended_at, t.tool_calls, t.continued) == (None,) * 5 + (False,)


LINE = {"id": "x", "calls": [{"tool": "a", "args": "x", "outcome": "ok"}]}
GOOD_LIMITS = {"cap_mode": "adaptive", "soft_cap": 100, "hard_cap": 1000, "stuck_repeat_threshold": 6,
               "streak_warn_at": 5, "streak_stop_at": 8, "max_cycles": 0}


@pytest.mark.parametrize(("extra", "message", "left_out"), [
    ({"limits": [1]}, "'limits': expected an object, got an array", "limits"),
    ({"limits": {**GOOD_LIMITS, "cap_mode": "soft"}}, "'cap_mode' must be one of", "limits"),
    ({"limits": {**GOOD_LIMITS, "hard_cap": -1}}, "'hard_cap' must be a whole number", "limits"),
    ({"limits": {**GOOD_LIMITS, "soft_cap": 10 ** 40}}, "'soft_cap' must be a whole number", "limits"),
    ({"limits": {**GOOD_LIMITS, "streak_stop_at": 2.5}}, "'streak_stop_at' must be a whole number", "limits"),
    ({"started_at": 10.0, "ended_at": 5.0}, "ends (5.0) before it starts", "started_at"),
    ({"started_at": "noon", "ended_at": 5.0}, "Unix seconds expected", "started_at"),
    ({"started_at": 1.0}, "Unix seconds expected", "started_at"),
    ({"ended_at": float("inf"), "started_at": 1.0}, "Unix seconds expected", "ended_at"),
    ({"policy": "p" * (MAX_ID_LENGTH + 1)}, "'policy' is longer than 256 characters", "policy"),
    ({"tool_calls": -3}, "'tool_calls' must be a whole number", "tool_calls"),
    ({"tool_calls": True}, "'tool_calls' must be a whole number", "tool_calls"),
])
def test_a_malformed_fact_is_reported_and_left_out_and_the_turn_kept(tmp_path, extra, message, left_out):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**LINE, **extra, "policy": extra.get("policy", "p")}, allow_nan=True) + "\n")
    turns, problems = read(path)
    assert len(problems) == 1 and message in problems[0], problems
    assert getattr(turns["x"], left_out) is None
    assert len(turns["x"].calls) == 1


@pytest.mark.parametrize("turn_id", ["i" * (MAX_ID_LENGTH + 1), "i" * 16_000_000, 10 ** 300, [1, 2], {"a": 1}])
def test_a_turn_id_past_the_limit_is_reported_and_replaced_by_the_turns_origin(tmp_path, turn_id):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**LINE, "id": turn_id}) + "\n")
    turns, problems = read(path)
    assert list(turns) == [f"{path}:1"]
    assert len(problems) == 1 and f"at most {MAX_ID_LENGTH} characters" in problems[0]
    assert len(problems[0]) < 400  # the message shows a bounded part of the value


def test_an_id_at_the_limit_is_kept(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**LINE, "id": "i" * MAX_ID_LENGTH}) + "\n"
                    + json.dumps({**LINE, "id": 10 ** 200}) + "\n")
    turns, problems = read(path)
    assert problems == [] and set(turns) == {"i" * MAX_ID_LENGTH, str(10 ** 200)}


def test_an_attended_continue_is_remembered(tmp_path):
    path = tmp_path / "t.jsonl"
    escalations = [{"threshold": "streak", "level": "warn", "answer": "stop", "at_call": 5},
                   {"threshold": "streak", "level": "stop", "answer": "continue", "at_call": 8}]
    path.write_text(json.dumps({**LINE, "escalations": escalations}) + "\n"
                    + json.dumps({**LINE, "id": "y", "escalations": escalations[:1]}) + "\n")
    turns, _ = read(path)
    assert turns["x"].continued and not turns["y"].continued


@pytest.mark.parametrize("reading", ["msgspec", "json"])
@pytest.mark.parametrize("answer", ["continue", "redirect", "stop", None])
def test_an_attended_answer_reads_alike_from_the_line_and_the_turn_span(tmp_path, monkeypatch, answer, reading):
    if reading == "json":  # the plain reading (without msgspec, or for a line it does not take)
        monkeypatch.setattr(collector, "_usable", lambda: False)
    else:
        assert collector.decode(b'{"resourceSpans": []}') is not None
    telemetry = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(tmp_path / "turns.jsonl"), load_entrypoints=False,
                                    disable_plugins=("shadow",)), environ={}, **telemetry.providers())
    with guard.turn(turn_id="t", promptable=True) as turn:
        asked = 0
        for _ in range(6):  # the same failing call: the streak asks at 5
            call = tg.ToolCall("run", {"cmd": "make"})
            verdict = turn.check_call(call)
            verdict = verdict if verdict.action is tg.Action.ASK else turn.record_outcome(call, "error")
            if verdict.action is tg.Action.ASK:
                asked += 1
                if answer is not None:
                    turn.resolve(verdict, answer)
                    break
    assert asked
    telemetry.tracer_provider.force_flush()
    otlp = tmp_path / "otlp.jsonl"
    otlp.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    (from_line, problems_line), (from_span, problems_span) = read(tmp_path / "turns.jsonl"), read(otlp)
    assert problems_line == problems_span == []
    assert from_line["t"].continued == from_span["t"].continued == (answer == "continue")


def test_late_results_with_ids_past_the_limit_are_reported_and_not_kept(tmp_path):
    from turnguard._calibrate.duplicates import id_hash
    from turnguard._calibrate.results import late_results
    path = tmp_path / "r.jsonl"
    long_id = "r" * (MAX_ID_LENGTH + 1)
    logs = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"eventName": "turnguard.turn.result", "attributes": [
            {"key": "turnguard.turn.id", "value": {"stringValue": "s" * 5_000_000}},
            {"key": "turnguard.turn.resolved", "value": {"boolValue": True}}]}]}]}]}
    path.write_text("\n".join([json.dumps({"result_for": long_id, "resolved": True}), json.dumps(logs),
                               json.dumps({"result_for": "ok-id", "resolved": False})]) + "\n")
    problems: list[InputProblem] = []
    assert late_results([path], problems.append) == {id_hash("ok-id"): False}
    assert len(problems) == 2 and all(f"at most {MAX_ID_LENGTH} characters" in str(p) for p in problems)
    assert all(len(str(p)) < 400 for p in problems)


@pytest.mark.parametrize("field", ["tool", "digest", "parent", "turn"])
def test_otlp_spans_with_ids_or_names_past_the_limit_are_reported_and_skipped(tmp_path, field):
    long = "z" * (MAX_ID_LENGTH + 1)

    def attr(key, value):
        return {"key": key, "value": {"intValue": str(value)} if isinstance(value, int) else {"stringValue": value}}

    call = {"spanId": "c1", "parentSpanId": long if field == "parent" else "t1", "name": "execute_tool run",
            "attributes": [attr("gen_ai.tool.name", long if field == "tool" else "run"),
                           attr("turnguard.call.index", 1), attr("turnguard.call.outcome", "ok"),
                           attr("turnguard.call.key_digest", long if field == "digest" else "d")]}
    turn = {"spanId": "t1", "name": "invoke_agent a",
            "attributes": [attr("turnguard.turn.id", long if field == "turn" else "t")]}
    path = tmp_path / "o.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [call, turn]}]}]}) + "\n")
    turns, problems = read(path)
    assert any(f"{MAX_ID_LENGTH} characters" in p for p in problems), problems
    assert all(len(p) < 600 for p in problems)
    assert all(len(t.id) <= MAX_ID_LENGTH and all(len(c.tool) <= MAX_ID_LENGTH for c in t.calls)
               for t in turns.values())


HALTS = {  # a configuration and the calls (tool, args of call i, outcome) that reach its halt
    "hard_backstop": ({"soft_cap": 3, "hard_multiplier": 2}, lambda i: ("run", {"i": i}, "ok")),
    "explicit": ({"max_tool_calls_per_turn": 5}, lambda i: ("run", {"i": i}, "ok")),
    "soft_stuck": ({"soft_cap": 3, "hard_multiplier": 10}, lambda i: ("run", {"i": 0}, "ok")),
    "streak": ({"soft_cap": 50}, lambda i: ("run", {"i": 0}, "error")),
    "cycle_cap": ({"max_cycles_per_turn": 4}, lambda i: ("run", {"i": i}, "error")),
}


@pytest.mark.parametrize("after", ["ok", "error", "denied", "unknown", None])
@pytest.mark.parametrize("threshold", sorted(HALTS))
def test_a_call_the_halt_refused_is_denied_in_lines_and_spans_whatever_the_host_reports_after(
        tmp_path: Path, threshold: str, after: str | None) -> None:
    """The halted call did not run: the recorder lists it ``denied`` and its tool span, ended at the
    check, says the same, though the host reports an outcome for it afterwards (or goes on calling);
    calibrate's figures from either file are then byte for byte the same."""
    import io

    from turnguard._calibrate import cli

    options, call_of = HALTS[threshold]
    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(recorder_path=str(tmp_path / "turns.jsonl"), load_entrypoints=False,
                            disable_plugins=("shadow",), **options)
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    halted_by = set()
    for t in range(4):
        turn = guard.turn(turn_id=f"t{t}", promptable=False)
        first: str | None = None  # where the halt came: a cycle, a check (a refused call) or an outcome
        for i in range(30):
            if turn.begin_cycle().halted:
                first = first or "cycle"
            tool, args, outcome = call_of(i)
            call = tg.ToolCall(tool, args)
            if turn.check_call(call).halted:
                first = first or "check"
                if after is not None:
                    turn.record_outcome(call, after)
            elif turn.record_outcome(call, outcome).halted:
                first = first or "outcome"
            if first and not t % 2:  # the others: a host that goes on calling after the halt
                break
        summary = turn.end()
        assert str(summary.threshold) == threshold
        halted_by.add(first)
    telemetry.tracer_provider.force_flush()
    spans = telemetry.spans()
    otlp = tmp_path / "otlp.jsonl"
    otlp.write_text("\n".join(collector_lines(spans[i:i + 20] for i in range(0, len(spans), 20))) + "\n")
    from_lines, problems_lines = read(tmp_path / "turns.jsonl")
    from_spans, problems_spans = read(otlp)
    assert problems_lines == problems_spans == []
    assert len(halted_by) == 1
    for turn_id, line in from_lines.items():
        outcomes = [c.outcome.value for c in line.calls]
        assert outcomes == [c.outcome.value for c in from_spans[turn_id].calls]
        assert outcomes[:-1].count("denied") == 0
        assert (outcomes[-1] == "denied") is (halted_by == {"check"})

    def figures(path: Path) -> str:
        out = io.StringIO()
        assert cli.main([str(path), "--soft-caps", "2,3,50", "--multipliers", "2,10", "--stuck-repeats", "3,6",
                         "--streaks", "2:3,5:8", "--explicit-caps", "4,5", "--no-peers", "--progress", "never",
                         "--json", "-"], stdout=out, stderr=io.StringIO()) == 0
        data = json.loads(out.getvalue())
        data.pop("inputs")
        return json.dumps(data, sort_keys=True)

    assert figures(tmp_path / "turns.jsonl") == figures(otlp)


@pytest.mark.parametrize("length", [256, 257, 300, 5000])
def test_a_long_turn_id_reads_alike_from_lines_and_spans_and_keeps_its_late_result(tmp_path: Path, length: int):
    """The recorder writes what the turn span exports (a turn id cut at ``MAX_ID_LENGTH``), so the
    turn is read under one id from either file, with no problem, and its late result joins it."""
    import io

    from collector_lines import log_lines
    from turnguard._calibrate import cli

    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(recorder_path=str(tmp_path / "turns.jsonl"), load_entrypoints=False,
                            disable_plugins=("shadow",))
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    ids = [str(t) * length for t in range(3)]
    for turn_id in ids:
        with guard.turn(turn_id=turn_id, promptable=False) as turn:
            for i in range(3):
                call = tg.ToolCall("run", {"i": i})
                turn.check_call(call)
                turn.record_outcome(call, "ok")
        assert guard.report_result(turn_id, True)
    telemetry.tracer_provider.force_flush()
    telemetry.logger_provider.force_flush()
    logs = list(telemetry.log_exporter.get_finished_logs())
    otlp = tmp_path / "otlp.jsonl"
    otlp.write_text("\n".join([*collector_lines([telemetry.spans()]), *log_lines([logs])]) + "\n")
    from_lines, problems_lines = read(tmp_path / "turns.jsonl")
    from_spans, problems_spans = read(otlp)
    assert problems_lines == problems_spans == []
    assert set(from_lines) == set(from_spans) and len(from_lines) == 3
    assert all(len(turn_id) == min(length, MAX_ID_LENGTH) for turn_id in from_lines)

    def figures(path: Path) -> dict:
        out = io.StringIO()
        assert cli.main([str(path), "--no-peers", "--progress", "never", "--json", "-"], stdout=out,
                        stderr=io.StringIO()) == 0
        data = json.loads(out.getvalue())
        data.pop("inputs")
        return data

    from_recorder = figures(tmp_path / "turns.jsonl")
    assert (from_recorder["turns"], from_recorder["resolved"], from_recorder["problems"]) == (3, 3, 0)
    assert from_recorder == figures(otlp)
