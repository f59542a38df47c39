"""Calibrate's memory is bounded by ``--max-line-bytes`` on every input field: each structure that
could grow with the input (a line's parsed form, a turn, waiting tool spans, late results, halt-call
histograms, ids, recorded policies) has a bound derived from it, checked here structurally (the
peak memory itself is measured by ``benchmarks/bench_calibrate_memory.py``). And merged results
are input like any other: tampered counts are refused."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from pathlib import Path

import pytest

from turnguard._calibrate import bounds, cli, records
from turnguard._calibrate.bounds import Bounds, halt_bucket, parsed_size
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.recording import MAX_POLICIES, Recording
from turnguard._calibrate.records import InputProblem, Limits, RecordedTurn
from turnguard._calibrate.replay import TurnResult
from turnguard._calibrate.results import late_results
from turnguard._calibrate.stats import ModeStats, add_halt_call

SHAPES = {
    "calls": '{"calls":[' + ",".join(['{"tool":"a","args":"","outcome":"ok"}'] * 20000) + "]}",
    "raw args": json.dumps({"calls": [{"tool": "t", "args": {"p": f"f{i}", "k": [1, 2]}, "outcome": "ok"}
                                      for i in range(5000)]}),
    "short strings": "[" + ",".join(['"ab"'] * 50000) + "]",
    "empty dicts": "[" + ",".join(["{}"] * 50000) + "]",
    "one-key dicts": "[" + ",".join(['{"a":1}'] * 50000) + "]",
    "empty lists": "[" + ",".join(["[]"] * 50000) + "]",
    "numbers": "[" + ",".join(str(10**9 + i) for i in range(50000)) + "]",
    "floats": "[" + ",".join(["1.5"] * 50000) + "]",
    "nested": "[" + ",".join(["[" * 60 + "1" + "]" * 60] * 1000) + "]",
    "many keys": "{" + ",".join(f'"k{i}":1' for i in range(50000)) + "}",
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_parsed_size_estimate_is_never_below_what_json_takes(shape):
    line = SHAPES[shape].encode()
    tracemalloc.start()
    value = json.loads(line)
    taken, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del value
    assert taken <= parsed_size(line), shape


@pytest.mark.parametrize("shape", ["deep", "wide"])
def test_a_line_too_costly_to_parse_is_refused_without_parsing_it(tmp_path, monkeypatch, shape):
    limit = 1 << 20
    call = '{"tool":"t","args":%s,"outcome":"ok"}' % ("[" * 200 + "1" + "]" * 200 if shape == "deep" else '""')
    line = '{"id":"x","calls":[' + ",".join([call] * ((limit - 100) // (len(call) + 1))) + "]}"
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n" + json.dumps({"id": "ok", "calls": [{"tool": "a", "args": "b", "outcome": "ok"}]})
                    + "\n")
    parsed = []
    real = json.loads
    monkeypatch.setattr(records.json, "loads", lambda text: parsed.append(len(text)) or real(text))
    problems: list[InputProblem] = []
    turns = list(read_turns([path], problems.append, max_line_bytes=limit))
    assert [t.id for t in turns] == ["ok"]
    assert len(problems) == 1 and "too many JSON values to read within the memory bound" in problems[0].message
    assert max(parsed) < 1000  # the long line was never handed to the parser


def test_every_bound_scales_with_the_line_limit():
    small, default = Bounds(4 << 20), Bounds()
    assert default.turn_calls == 131_072 and default.waiting_calls == 65_536 and default.late_results == 524_288
    assert default.parse_bytes == 4 * (32 << 20)
    assert small.turn_calls == default.turn_calls // 8 and small.late_results == default.late_results // 8
    assert Bounds(1000).turn_calls == 1000  # a floor, so that a tiny limit still reads turns


def test_a_turn_with_more_calls_than_the_line_limit_allows_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    calls = [{"tool": "a", "args": str(i % 3), "outcome": "ok"} for i in range(1100)]
    path.write_text(json.dumps({"id": "big", "calls": calls}) + "\n")
    problems: list[InputProblem] = []
    assert list(read_turns([path], problems.append, max_line_bytes=1000 * 256)) == []
    assert "1,100 calls: more than the limit of 1,000 per turn" in problems[0].message
    assert len(list(read_turns([path], print, max_line_bytes=2000 * 256))) == 1


def test_waiting_tool_spans_are_bounded_by_the_line_limit(tmp_path):
    def attr(k, v):
        return {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}

    spans = [{"spanId": f"s{i}", "parentSpanId": f"p{i}", "name": "execute_tool t",
              "attributes": [attr("gen_ai.tool.name", "t"), attr("turnguard.call.index", 1),
                             attr("turnguard.call.key_digest", "d"), attr("turnguard.call.outcome", "ok")]}
             for i in range(1500)]
    path = tmp_path / "o.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans[i:i + 100]}]}]}) + "\n"
                            for i in range(0, len(spans), 100)))
    problems: list[InputProblem] = []
    turns = list(read_turns([path], problems.append, max_line_bytes=1000 * 512))
    early = [p for p in problems if "waited longest while more than 1,000 waited" in p.message]
    assert len(turns) == 1500 and len(early) == 500


def test_late_results_are_bounded_and_hold_no_id_text(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join('{"result_for":"%s","resolved":true}\n' % (f"{i:08d}" * 32) for i in range(1200)))
    problems: list[InputProblem] = []
    results = late_results([path], problems.append, max_line_bytes=1000 * 64)
    assert len(results) == 1000 and all(type(k) is int and k < 2**64 for k in results)
    assert len(problems) == 1 and "more than 1,000 late results" in str(problems[0])


def test_halt_call_histograms_have_a_bounded_number_of_keys_and_stay_exact_where_they_can():
    hist: dict[int, list[int]] = {}
    for call in range(1, 1_000_001):
        add_halt_call(hist, call)
    assert len(hist) < 200
    assert all(k == halt_bucket(lo) == halt_bucket(hi) and n == hi - lo + 1 for k, (n, lo, hi) in hist.items())
    one: dict[int, list[int]] = {}
    for _ in range(30):
        add_halt_call(one, 1001)
    assert one == {960: [30, 1001, 1001]}  # the backstop's halts: one bucket that says its call exactly


def test_halt_histograms_merge_as_one_run():
    rng = random.Random(4)
    calls = [rng.randint(1, 50_000) for _ in range(3000)]
    whole, a, b = ModeStats(), ModeStats(), ModeStats()
    for i, call in enumerate(calls):
        for stats in (whole, a if i % 2 else b):
            stats.add(f"t{i}", call + 5, None, TurnResult(call, "streak"))
    a.merge(b)
    assert a.halt_calls == whole.halt_calls


def test_recorded_policies_are_bounded():
    r = Recording()
    for i in range(MAX_POLICIES + 50):
        r.add(RecordedTurn(f"t{i}", (), policy=f"p{i}", limits=Limits("explicit", None, 10 + i)), "live")
    assert len(r.seen) == MAX_POLICIES and r.left_out == 50


# -- tampered merges ------------------------------------------------------------------------------------


def _calibrated(tmp_path_factory: pytest.TempPathFactory, first: int) -> dict:
    """A result of 40 turns with ids from ``t{first}``: two firsts 40 apart share no turn."""
    path = tmp_path_factory.mktemp("merge") / "t.jsonl"
    lines = [{"id": f"t{first + i}", "calls": [{"tool": "a", "args": "x" if i % 2 else f"x{j}", "outcome": "error"}
                                               for j in range(30)], "resolved": i % 3 == 0,
              "cohort": "probe" if i % 4 else "live", "ended_by": "completed"} for i in range(40)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = io.StringIO()
    assert cli.main([str(path), "--json", "-"], stdout=out, stderr=io.StringIO()) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _calibrated(tmp_path_factory, 0)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Another fleet's result (no turn in common with ``result``): merges with it, tampered or not,
    say only what the tampering changed."""
    return _calibrated(tmp_path_factory, 1000)


def merge(tmp_path: Path, *parts: dict) -> tuple[int, str]:
    names = []
    for i, part in enumerate(parts):
        names.append(str(tmp_path / f"part{i}.json"))
        Path(names[-1]).write_text(json.dumps(part))
    err = io.StringIO()
    code = cli.main(["merge", *names, "--json", "-"], stdout=io.StringIO(), stderr=err)
    return code, err.getvalue()


def test_an_untampered_result_merges(result, other, tmp_path):
    assert merge(tmp_path, result, other)[0] == 0


def _tamper(result: dict, where: str, value: object) -> dict:
    data = json.loads(json.dumps(result))
    node, *path = where.split(".")
    target = data
    keys = [node, *path]
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


@pytest.mark.parametrize(("where", "value"), [
    ("turns", -1), ("turns", 10**30), ("calls", 2.5), ("resolved", True), ("problems", "3"),
    ("policies.0.unattended.halted", -5), ("policies.0.unattended.halted", 10**30),
    ("policies.0.unattended.by_threshold", {"streak": -1}),
    ("policies.0.unattended.halt_deciles", [0] * 10),
    ("policies.0.unattended.halted_censored_by_cohort", {"live": -1}),
    ("policies.0.unattended.halted_censored_by_cohort", {"beta": 1}),
    ("policies.0.unattended.evidence_by_source", {"x" * 300: 1}),
    ("policies.0.unattended.resolved_ids", ["i" * 300]),
    ("policies.0.unattended.halt_calls", {"5": [1, 900, 900]}),
    ("calls_per_turn", {"-3": 1}), ("calls_per_turn", {"30": 10**30}),
    ("halt_ended", {"live": -1}), ("probe.turns", -1), ("probe.passed_multiple.10.resolved", 10**30),
    ("survival.events_at", {"30": -2}), ("recording.turns_with_times", -1), ("tolerance", 2),
    ("recording.first_started", -5.0),
])
def test_tampered_counts_are_refused_with_what_is_wrong(result, other, tmp_path, where, value):
    code, err = merge(tmp_path, result, _tamper(other, where, value))
    assert code == 2, err
    assert "overlaps" not in err  # refused for what the tampering changed
    assert "part1.json" in err and "Traceback" not in err
    assert len(err) < 600


def test_counts_that_do_not_add_up_are_refused(result, tmp_path):
    more = _tamper(result, "turns", result["turns"] + 5)
    code, err = merge(tmp_path, more)
    assert code == 2 and "do not add up" in err


def test_a_result_file_too_large_to_be_one_is_refused(result, tmp_path, monkeypatch):
    monkeypatch.setattr("turnguard._calibrate.cli.MAX_RESULT_BYTES", 1000)
    code, err = merge(tmp_path, result)
    assert code == 2 and "larger than" in err


def test_every_figure_is_bounded_at_the_default_limit():
    assert bounds.MEMORY_FACTOR * bounds.MAX_LINE_BYTES == 256 << 20
