"""Probe evidence in ``turnguard calibrate``: the Wilson interval against published values, and
the counts per threshold on probe turns whose truth is known by construction, through the real
command (table, ``--json``, ``--html``, merge)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import turnguard as tg
from conftest import CORE_ONLY, drive
from turnguard._calibrate import cli
from turnguard._calibrate.advice import Context
from turnguard._calibrate.advice import recommendation as advise
from turnguard._calibrate.evidence import MULTIPLES, Passed, ProbeEvidence, wilson_interval
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.recording import Recording
from turnguard._calibrate.stats import RunStats


def recommendation(e: ProbeEvidence, tolerance: float = 0.10) -> list[str]:
    return advise(e, Context(tolerance, Recording()))


@pytest.mark.parametrize(("successes", "trials", "low", "high"), [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3.
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize(("successes", "trials"), [(0, 1), (3, 7), (7, 7), (500, 1000), (1, 100_000)])
def test_wilson_interval_is_inside_0_1_holds_the_share_and_mirrors(successes, trials):
    low, high = wilson_interval(successes, trials)
    assert 0.0 <= low <= successes / trials <= high <= 1.0
    mirror_low, mirror_high = wilson_interval(trials - successes, trials)
    assert (low, high) == pytest.approx((1 - mirror_high, 1 - mirror_low), abs=1e-12)


def test_wilson_interval_narrows_with_more_trials_and_knows_nothing_of_none():
    widths = [high - low for low, high in (wilson_interval(n // 4, n) for n in (8, 80, 800, 8000))]
    assert widths == sorted(widths, reverse=True)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(("successes", "trials"), [(-1, 3), (4, 3), (0, -1)])
def test_wilson_interval_rejects_impossible_counts(successes, trials):
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(successes, trials)


# -- probe turns with known truth ---------------------------------------------------------------

S = 100


def distinct(n: int, tag: str) -> list[dict[str, str]]:
    return [{"tool": "read", "args": f"read {tag}/{i}", "outcome": "ok"} for i in range(n)]


def stuck_after_soft_cap(n: int) -> list[dict[str, str]]:
    """S distinct calls, then one call every other call (stuck at D=6 past S), to ``n`` calls."""
    calls = distinct(S, "head")
    i = 0
    while len(calls) < n:
        calls.append({"tool": "mvn", "args": "mvn test", "outcome": "error"} if i % 2 == 0 else
                     {"tool": "read", "args": f"read tail/{i}", "outcome": "ok"})
        i += 1
    return calls


def live_halt_call(calls: list[dict[str, str]]) -> tuple[int, str]:
    """Where the live guard with the default configuration halts these calls, and why."""
    turn = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).turn(promptable=False)
    verdicts = drive(turn, [tg.ToolCall(c["tool"], c["args"]) for c in calls], tg.Outcome.ERROR)
    assert verdicts[-1].halted
    return len(verdicts), str(verdicts[-1].threshold)


PROBE_TURNS = [  # (id, calls, resolved)
    ("p-1800-yes", distinct(1800, "a"), True),
    ("p-2500-no", distinct(2500, "b"), False),
    ("p-2500-unknown", distinct(2500, "c"), None),
    ("p-1200-yes-1", distinct(1200, "d"), True),
    ("p-1200-yes-2", distinct(1200, "e"), True),
    ("p-250-no", distinct(250, "f"), False),
    ("p-stuck-yes", stuck_after_soft_cap(150), True),
    ("p-short", distinct(40, "g"), True),
]
LIVE_TURNS = [("l-1", distinct(30, "h"), True), ("l-2", distinct(1500, "i"), None)]


def line(turn_id: str, calls: list[dict[str, str]], resolved: bool | None, cohort: str | None) -> str:
    record = {"source": "test", "id": turn_id, "calls": calls, "resolved": resolved}
    if cohort is not None:
        record["cohort"] = cohort
    return json.dumps(record)


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "turns.jsonl"
    lines = [line(i, c, r, "probe") for i, c, r in PROBE_TURNS] + [line(i, c, r, "live") for i, c, r in LIVE_TURNS]
    lines.append(line("no-cohort", distinct(3000, "j"), True, None))
    path.write_text("\n".join(lines) + "\n")
    return path


GRID = ["--soft-caps", "100", "--multipliers", "10", "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers",
        "--explicit-caps", "100", "--key-modes", "canonical"]


def calibrate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def result(probe_file: Path) -> dict:
    code, out, err = calibrate(str(probe_file), *GRID, "--json", "-")
    assert code == 0, err
    return json.loads(out)["probe"]


def expected_passed(k: int) -> dict[str, int]:
    past = [(c, r) for _, c, r in PROBE_TURNS if len(c) > k * S]
    return {"turns": len(past), "resolved": sum(r is True for _, r in past),
            "unresolved": sum(r is False for _, r in past), "unknown": sum(r is None for _, r in past),
            "calls_past": sum(len(c) - k * S for c, _ in past)}


def test_the_json_counts_the_probe_turns_past_each_multiple_of_s(result):
    assert (result["soft_cap"], result["multiplier"], result["stuck_repeat"]) == (100, 10, 6)
    assert (result["turns"], result["resolved"], result["unresolved"], result["unknown"]) == (8, 5, 2, 1)
    assert result["live_turns"] == 2
    for k in MULTIPLES:
        got = {key: result["passed_multiple"][str(k)][key] for key in expected_passed(k)}
        assert got == expected_passed(k), k
    # By hand, for the backstop: 5 passed 10x (1000 calls), 3 of the 4 with a result resolved.
    assert expected_passed(10) == {"turns": 5, "resolved": 3, "unresolved": 1, "unknown": 1, "calls_past": 4200}
    assert result["passed_multiple"]["10"]["resolved_interval"] == pytest.approx(list(wilson_interval(3, 4)), abs=1e-6)


def test_the_stuck_row_counts_turns_the_main_config_would_halt_as_stuck_where_the_live_guard_would(result):
    (_, calls, _), = [t for t in PROBE_TURNS if t[0] == "p-stuck-yes"]
    halt_call, threshold = live_halt_call(calls)
    assert threshold == "soft_stuck"
    stuck = result["passed_stuck"]
    assert (stuck["turns"], stuck["resolved"], stuck["unresolved"]) == (1, 1, 0)
    assert stuck["calls_past"] == len(calls) - halt_call + 1


def test_the_recommendation_names_the_counts_the_interval_and_the_decision(result):
    backstop, stuck = result["recommendation"][:2]
    low, high = wilson_interval(3, 4)
    assert backstop.startswith("On 8 probe turns, 5 passed 10x (3 resolved, 1 unresolved, 1 without a result")
    assert f"{low:.0%}-{high:.0%}" in backstop and "it is wide" in backstop
    assert "above the tolerance of 10%" in backstop
    assert stuck.startswith("1 probe turn would have been halted as stuck (D=6)")
    ten = result["passed_multiple"]["10"]
    assert (ten["decision"], ten["why"], ten["tolerance"]) == ("above", "decided", 0.1)


def test_the_table_and_html_show_the_same_figures(probe_file: Path, tmp_path: Path, result):
    page = tmp_path / "report.html"
    code, out, err = calibrate(str(probe_file), *GRID, "--html", str(page), "--wide")
    assert code == 0, err
    text = out[out.index("Probe evidence"):]
    assert "8 probe turns (5 resolved, 2 unresolved, 1 unknown; 0 ended at a halt of the probe's own; 2 live" in text
    row = next(r for r in text.splitlines() if r.strip().startswith("10x S")).split()
    low, high = wilson_interval(3, 4)
    assert row[3:] == ["5", "3", "1", "1", f"{low:.0%}-{high:.0%}", "above", "10%", "4,200"]
    assert result["recommendation"][0] in " ".join(line.strip() for line in text.splitlines())
    html = page.read_text()
    assert "id='probe-evidence'" in html and "4,200" in html
    assert result["recommendation"][0].replace("'", "&#x27;") in html


def test_split_runs_merge_into_the_evidence_of_one_run(probe_file: Path, tmp_path: Path, result):
    lines = probe_file.read_text().splitlines()
    parts = []
    for i, chunk in enumerate((lines[:4], lines[4:])):
        part = tmp_path / f"part{i}.jsonl"
        part.write_text("\n".join(chunk) + "\n")
        out = tmp_path / f"part{i}.json"
        assert calibrate(str(part), *GRID, "--json", str(out))[0] == 0
        parts.append(str(out))
    code, merged, err = calibrate("merge", *parts, "--json", "-")
    assert code == 0, err
    assert json.loads(merged)["probe"] == result


def test_parallel_workers_count_the_same_evidence(probe_file: Path, result):
    code, out, err = calibrate(str(probe_file), *GRID, "--jobs", "2", "--json", "-")
    assert code == 0, err
    assert json.loads(out)["probe"] == result


def test_without_probe_turns_the_report_says_nothing_about_them(tmp_path: Path):
    path = tmp_path / "live.jsonl"
    path.write_text(line("l", distinct(20, "x"), True, "live") + "\n")
    code, out, _ = calibrate(str(path), *GRID)
    assert code == 0 and "Probe evidence" not in out


def test_a_bad_cohort_is_reported_with_its_line(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text(line("ok", distinct(3, "x"), True, "probe") + "\n" + line("bad", distinct(3, "y"), True, "beta")
                    + "\n")
    problems = []
    turns = list(read_turns([path], problems.append))
    assert [t.id for t in turns] == ["ok"] and turns[0].cohort == "probe"
    assert [(p.line, "'cohort' must be one of live, probe" in p.message) for p in problems] == [(2, True)]


def test_no_probe_turn_past_the_backstop_says_there_is_no_evidence_yet():
    e = ProbeEvidence(100, 10, 6)
    e.add(50, True, None)
    assert recommendation(e)[0].startswith("On 1 probe turn, none passed 10x (S=100, 1,000 calls): no evidence")
    assert "keep" not in recommendation(e)[0]


def test_none_resolved_past_the_backstop_says_keep_it_once_the_interval_is_below_the_tolerance():
    e = ProbeEvidence(100, 10, 6)
    for _ in range(40):
        e.add(1500, False, None)
    advice = recommendation(e)[0]
    low, high = wilson_interval(0, 40)
    assert high < 0.10
    assert "40 passed 10x (0 resolved, 40 unresolved" in advice
    assert f"{low:.0%}-{high:.0%}" in advice and "keep 10x" in advice and "20,000 calls" in advice
    assert "wide" not in advice


def test_too_few_turns_to_decide_say_how_many_more():
    """12 turns, none resolved: 0%-24%, not below 10% yet; at a share of 0 the Wilson interval
    excludes 10% from 35 turns on (score test: 1.96^2 x 0.1 x 0.9 / 0.1^2 = 34.6)."""
    e = ProbeEvidence(100, 10, 6)
    for _ in range(12):
        e.add(1500, False, None)
    advice = recommendation(e)[0]
    assert "not decided against the tolerance of 10%: about 23 more probe turns past 10x" in advice
    assert "keep" not in advice
    assert wilson_interval(0, 34)[1] > 0.1 > wilson_interval(0, 35)[1]


def test_evidence_json_round_trips_and_rejects_inconsistent_counts():
    e = ProbeEvidence(100, 10, 6)
    e.add(2100, True, None)
    assert ProbeEvidence.from_json(e.to_json()).to_json() == e.to_json()
    with pytest.raises(ValueError, match="inconsistent"):
        Passed.from_json({"turns": 1, "resolved": 2, "unresolved": 0, "censored": 0, "calls_past": 0})


def test_evidence_measured_against_different_configurations_does_not_merge():
    with pytest.raises(ValueError, match="different main configurations"):
        ProbeEvidence(100, 10, 6).merge(ProbeEvidence(50, 10, 6))


def test_results_of_the_first_format_are_refused(probe_file: Path):
    code, out, _ = calibrate(str(probe_file), *GRID, "--json", "-")
    assert code == 0
    data = json.loads(out)
    data["format"] = "turnguard-_calibrate/1"
    with pytest.raises(ValueError, match="expected format 'turnguard-_calibrate/2'"):
        RunStats.from_json(data)


def otlp_turn_line(turn_id: str, calls: int, attrs: dict) -> str:
    """A Collector-file-exporter line: one turn span and its tool spans (OTLP JSON)."""
    def value(v):
        return {"boolValue": v} if isinstance(v, bool) else {"intValue": str(v)} if isinstance(v, int) else \
            {"stringValue": v}

    def span(name, span_id, parent, a):
        out = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": span_id, "name": name,
               "attributes": [{"key": k, "value": value(v)} for k, v in a.items()]}
        return {**out, "parentSpanId": parent} if parent else out

    root = f"{abs(hash(turn_id)) % 10**12:012x}"
    spans = [span("execute_tool read", f"{i:016x}", root, {"gen_ai.tool.name": "read", "turnguard.call.index": i,
                                                           "turnguard.call.key_digest": f"d{i}",
                                                           "turnguard.call.outcome": "ok"})
             for i in range(1, calls + 1)]
    spans.append(span("invoke_agent coder", root, None, {"turnguard.turn.id": turn_id, **attrs}))
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"scope": {"name": "turnguard"}, "spans": spans}]}]})


def test_otlp_turn_spans_carry_the_cohort_and_the_result(tmp_path: Path):
    path = tmp_path / "otlp.json"
    path.write_text("\n".join([
        otlp_turn_line("a", 1200, {"turnguard.turn.cohort": "probe", "turnguard.turn.resolved": "true"}),
        otlp_turn_line("b", 1200, {"turnguard.turn.cohort": "probe", "turnguard.turn.resolved": False}),
        otlp_turn_line("c", 1200, {"turnguard.turn.cohort": "probe", "turnguard.turn.resolved": "unknown"}),
        otlp_turn_line("d", 5, {"turnguard.turn.cohort": "live", "turnguard.turn.resolved": True}),
        otlp_turn_line("e", 5, {"turnguard.turn.cohort": "beta", "turnguard.turn.resolved": 1}),
    ]) + "\n")
    problems = []
    turns = {t.id: t for t in read_turns([path], problems.append)}
    assert [(p.line, "turnguard.turn.resolved must be a boolean" in p.message) for p in problems] == [(5, True)]
    assert [(turns[i].cohort, turns[i].resolved) for i in "abcde"] == [
        ("probe", True), ("probe", False), ("probe", None), ("live", True), (None, None)]
    code, out, err = calibrate(str(path), *GRID, "--json", "-")
    assert code == 0, err
    passed = json.loads(out)["probe"]["passed_multiple"]["10"]
    assert (passed["turns"], passed["resolved"], passed["unresolved"], passed["calls_past"]) == (3, 1, 1, 600)
