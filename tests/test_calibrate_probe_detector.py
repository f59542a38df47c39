"""A probe turn its own loop detector halted (``_calibrate/evidence.py``, ``ProbeEvidence.fate_of``): its
fate past the halt is unknown unless the probe ran that detector well past the main one, so the D and
streak rows and their recommended values never call a value enough on such turns (issue 19)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from turnguard._calibrate import cli
from turnguard._calibrate.advice import decide
from turnguard._calibrate.evidence import Ladder, Passed, ProbeEvidence, Scale, frontier
from turnguard._calibrate.records import Limits

DETECTORS = {"soft_stuck": "stuck_repeat_threshold", "streak": "streak_stop_at"}


@pytest.mark.parametrize("halted_by", sorted(DETECTORS))
def test_a_probe_detector_halt_is_a_failure_only_at_twice_the_main_value(halted_by):
    for main in range(1, 11):
        e = ProbeEvidence(100, 10.0, main, main)
        for own in [*range(1, 31), None]:
            limits = None if own is None else Limits("adaptive", **{DETECTORS[halted_by]: own})
            for resolved in (True, False, None):
                fate = e.fate_of(resolved, halted_by, limits)
                if resolved is True:
                    assert fate == "resolved"
                elif own is None or own < 2 * main:
                    assert fate == "cut", (main, own, resolved)
                else:
                    assert fate == ("unresolved" if resolved is False else "unknown")


def test_a_length_limit_halt_stays_censored_and_no_halt_keeps_the_result():
    e = ProbeEvidence(100, 10.0, 6, 8)
    for halted_by in ("hard_backstop", "explicit", "cycle_cap"):
        assert e.fate_of(False, halted_by, None) == e.fate_of(None, halted_by, None) == "censored"
    assert [e.fate_of(r, None, None) for r in (True, False, None)] == ["resolved", "unresolved", "unknown"]


def test_no_value_is_within_where_the_turns_at_risk_were_cut_by_the_probes_detector():
    rng = random.Random(19)
    for _ in range(300):
        ladder = Ladder()
        cut, reach = rng.randint(1, 200), rng.randint(2, 20)
        for _ in range(cut):
            ladder.add(reach, "cut", [0] * reach, 10)
        for _ in range(rng.randint(0, 5)):
            r = rng.randint(1, reach)
            ladder.add(r, rng.choice(["unresolved", "resolved"]), [0] * r, 10)
        f = frontier("streak", ladder, 8, 0.1, Scale(1, 1, 1), horizon=reach + 1)
        assert f.recommended is None
        assert all(r.decision != "within" for r in f.rungs if r.cut >= 0.1 * r.at_risk)
        assert "halted by the probe's own loop detector" in f.sentence and "raise the probe's own" in f.sentence


def test_a_row_at_the_probes_own_cap_is_never_within():
    rng = random.Random(7)
    for _ in range(500):
        p = Passed()
        for _ in range(rng.randint(1, 80)):
            p.add(rng.choice([True, False, None]), 1, rng.random() < 0.3)
        d = decide(p, rng.choice([0.05, 0.1, 0.5, 0.9]), None, ("streak", 8))
        assert d.verdict != "within"


def _run(folder: Path, probe: dict, live: dict, steps: list[tuple[tg.ToolCall, str]]) -> dict:
    rec = folder / "turns.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(rec), load_entrypoints=False, probe={"rate": 1.0, **probe},
                                    **live), environ={})
    for t in range(60):
        turn = guard.turn(turn_id=f"t{t}")
        done = True
        for call, outcome in steps:
            call = tg.ToolCall(call.name, {**call.args, "t": t} if call.name == "deploy" else call.args)
            if turn.check_call(call).halted or turn.record_outcome(call, outcome).halted:
                done = False
                break
        turn.end()
        guard.report_result(f"t{t}", done)
    toml = "".join(f"{k} = {v}\n" for k, v in live.items()) + "[probe]\nrate = 1.0\n" + "".join(
        f"{k} = {v}\n" for k, v in probe.items())
    (folder / "turnguard.toml").write_text(toml)
    out = io.StringIO()
    assert cli.main([str(rec), "--config", str(folder / "turnguard.toml"), "--progress", "never", "--no-peers",
                     "--soft-caps", str(live["soft_cap"]), "--multipliers", "3", "--json", "-"],
                    stdout=out, stderr=io.StringIO()) == 0
    return json.loads(out.getvalue())["probe"]


def _edit_rerun(rounds: int) -> list[tuple[tg.ToolCall, str]]:
    calls = [(tg.ToolCall("read", {"p": i}), "ok") for i in range(12)]
    for r in range(rounds):
        calls += [(tg.ToolCall("edit", {"patch": r}), "ok"), (tg.ToolCall("run_tests", {"cmd": "pytest"}), "ok")]
    return calls


def _retry(failures: int) -> list[tuple[tg.ToolCall, str]]:
    flaky = tg.ToolCall("deploy", {})
    return [(tg.ToolCall("read", {"p": 0}), "ok"), *[(flaky, "error")] * failures, (flaky, "ok")]


CASES = {
    "stuck, the probe's D the live one": ("stuck", {"hard_multiplier": 6}, 10, _edit_rerun(20)),
    "stuck, the probe's D above the live one, below where turns need": (
        "stuck", {"hard_multiplier": 6, "stuck_repeat_threshold": 9}, 10, _edit_rerun(20)),
    "streak, the probe's stop the live one": ("streak", {"hard_multiplier": 6}, 50, _retry(10)),
    "streak, the probe's stop past the live one, below where turns need": (
        "streak", {"hard_multiplier": 6, "streak_stop_at": 13}, 50, _retry(15)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_productive_turns_the_probes_detector_halted_are_never_called_failures(tmp_path, case):
    """Every turn would have succeeded; the probe's own detector halted each (planted truth: 100%)."""
    row, probe, soft_cap, steps = CASES[case]
    got = _run(tmp_path, probe, {"soft_cap": soft_cap, "hard_multiplier": 3}, steps)
    passed = got[f"passed_{row}"]
    assert passed["turns"] == 60 and passed["unresolved"] == 0 and passed["censored"] == 60
    assert passed["decision"] == "undecided" and passed["why"] == "censored"
    same = "live one" in case.split(",")[1] and "above" not in case and "past" not in case
    assert (passed["censored_at_cap"] is not None) is same
    f = got["frontier"][row]
    assert f["recommended"] is None and not f["keep"]
    assert all(r["decision"] != "within" for r in f["rows"])
    assert "60 of them halted by the probe's own loop detector" in f["sentence"]
    text = " ".join(got["recommendation"])
    assert "within the tolerance of 10%: keep" not in text and "set " + f["setting"] not in text
