"""A live value at its ladder's first step (a backstop of 1x: hard cap = soft cap; D = 1; a streak
stop, soft, explicit or cycle cap of 1) is kept when it is within the tolerance: the first step is
never *moved to*, but the operator runs it, and calibrate said "set ... = 2" and a cost for a value
the evidence already spared every productive turn at."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from turnguard._calibrate import cli
from turnguard._calibrate.evidence import LADDERS, Ladder, Scale, frontier

TOLERANCE = 0.1
OK, ERROR = tg.Outcome.OK, tg.Outcome.ERROR


def ladder(*turns: tuple[int, str]) -> Ladder:
    """Turns as ``(reach, fate)``; a value ``v`` halts one after ``10 v`` calls."""
    out = Ladder()
    for reach, fate in turns:
        out.add(reach, fate, [10 * v for v in range(1, reach + 1)], 10 * reach + 5)
    return out


# -- the rule, on every ladder ----------------------------------------------------------------------


@pytest.mark.parametrize("threshold", LADDERS)
def test_a_live_first_step_within_the_tolerance_is_kept(threshold):
    f = frontier(threshold, ladder(*[(3, "unresolved")] * 40), 1, TOLERANCE, Scale(40, 400, 8000))
    assert f.recommended == 1 and f.to_json()["keep"] is True
    assert f.sentence.startswith(f"keep {f.setting} = 1: it spares every productive turn the probe saw (0 of 40")
    assert "burn" not in f.sentence and "saves" not in f.sentence


@pytest.mark.parametrize("threshold", LADDERS)
def test_turns_only_a_live_first_step_halts_are_judged_there(threshold):
    """Every turn at risk reaches only the live first step: it is kept when within, and when not the
    sentence quotes it rather than saying no value would halt a turn."""
    kept = frontier(threshold, ladder(*[(1, "unresolved")] * 40), 1, TOLERANCE, Scale(40, 400, 8000))
    assert kept.recommended == 1 and kept.sentence.startswith(f"keep {kept.setting} = 1")
    mixed = frontier(threshold, ladder(*[(1, "resolved")] * 20, *[(1, "unresolved")] * 20), 1, TOLERANCE,
                     Scale(40, 400, 8000))
    assert mixed.recommended is None and "(20 of 40" in mixed.sentence
    assert "no probe turn with a known fate would be halted" not in mixed.sentence


@pytest.mark.parametrize("threshold", LADDERS)
def test_a_live_first_step_above_the_tolerance_is_raised_to_the_smallest_within(threshold):
    turns = [(1, "resolved")] * 20 + [(3, "unresolved")] * 40
    f = frontier(threshold, ladder(*turns), 1, TOLERANCE, Scale(60, 600, 8000))
    assert f.recommended == 2 and f.sentence.startswith(f"set {f.setting} = 2")
    assert f.rung(1).decision == "above"


@pytest.mark.parametrize("threshold", LADDERS)
def test_the_first_step_is_still_never_recommended_below_a_higher_live_value(threshold):
    f = frontier(threshold, ladder(*[(1, "unresolved")] * 400, *[(8, "resolved")] * 5), 6, TOLERANCE,
                 Scale(405, 4000, 80_000))
    assert f.rung(1).decision == "within" and f.recommended is None
    assert 1 not in [r["value"] for r in f.to_json()["rows"]]


@pytest.mark.parametrize("seed", range(60))
def test_the_recommended_value_is_the_smallest_within_that_is_settable_or_live(seed):
    """Random ladders and live values (the first step among them): a reference for the rule."""
    rng = random.Random(seed)
    threshold = rng.choice(LADDERS)
    live = rng.choice([1, 1, 2, rng.randint(3, 12)])
    productive = rng.choice([0.0, 0.02, 0.2])
    turns = [(rng.randint(1, 14), "resolved" if rng.random() < productive else rng.choice(
        ["unresolved", "censored", "unknown"])) for _ in range(rng.randint(0, 120))]
    f = frontier(threshold, ladder(*turns), live, TOLERANCE, Scale(len(turns) or 1, 500, 50_000))
    within = [r.value for r in f.rungs if r.decision == "within" and (r.value > 1 or r.value == live)]
    assert f.recommended == (within[0] if within else None)
    assert f.to_json()["keep"] is (f.recommended == live)
    if f.recommended is not None:
        verb = "keep" if f.recommended == live else "set"
        assert f.sentence.startswith(f"{verb} {f.setting} = {f.recommended:,}")


# -- through a real guard and calibrate ---------------------------------------------------------------

S = 20
LIVE = {"soft_cap": S, "hard_multiplier": 1, "stuck_repeat_threshold": 1, "streak_warn_at": 1, "streak_stop_at": 1}
PROBE = {"rate": 1.0, "hard_multiplier": 40, "stuck_repeat_threshold": 40, "streak_warn_at": 30,
         "streak_stop_at": 30}
GRID = ("--soft-caps", str(S), "--multipliers", "1", "--stuck-repeats", "1", "--stuck-signals", "repeat",
        "--streaks", "1:1", "--explicit-caps", "100", "--key-modes", "canonical", "--no-peers")


def _distinct(tag: str, n: int) -> list[tuple[tg.ToolCall, tg.Outcome]]:
    return [(tg.ToolCall("read_file", {"path": f"{tag}/{i}"}), OK) for i in range(n)]


def _fleet(raise_them: bool) -> list[tuple[str, list[tuple[tg.ToolCall, tg.Outcome]], bool]]:
    """Short productive turns, runaways and calls failing forever; with ``raise_them``, also
    productive turns past S that retry one failed call once (reach 1 on the backstop and the streak
    stop, 2 on D)."""
    turns = [(f"short-{i}", _distinct(f"s{i}", 5 + i % 14), True) for i in range(40)]
    turns += [(f"runaway-{i}", _distinct(f"r{i}", 10**4), False) for i in range(40)]
    turns += [(f"failing-{i}", [(tg.ToolCall("http_get", {"url": i}), ERROR)] * 200, False) for i in range(40)]
    if raise_them:
        flaky = [(tg.ToolCall("http_get", {"url": "flaky"}), ERROR), (tg.ToolCall("http_get", {"url": "flaky"}), OK)]
        turns += [(f"retry-{i}", _distinct(f"p{i}", 25) + flaky + _distinct(f"q{i}", 3), True) for i in range(20)]
    return turns


def _calibrate(tmp_path: Path, raise_them: bool) -> dict:
    path = tmp_path / "turns.jsonl"
    config = tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",), recorder_path=str(path), probe=PROBE,
                            **LIVE)
    guard = tg.Guard(config, environ={})
    for turn_id, steps, productive in _fleet(raise_them):
        turn = guard.turn(turn_id=turn_id, agent_name="coder")
        done = True
        for call, outcome in steps:
            if turn.check_call(call).halted:
                done = False
                break
            turn.record_outcome(call, outcome)
        turn.report_result(done and productive)
        turn.end()
    args = cli.build_parser().parse_args([str(path), *GRID, "--json", "-"])
    args.guard_config = tg.GuardConfig(load_entrypoints=False, **LIVE)
    out, err = io.StringIO(), io.StringIO()
    assert cli.run(args, stdout=out, stderr=err) == 0, err.getvalue()
    return json.loads(out.getvalue())["probe"]["frontier"]


def test_a_fleet_where_the_first_step_is_right_keeps_it(tmp_path):
    found = _calibrate(tmp_path, raise_them=False)
    for threshold in ("backstop", "stuck", "streak"):
        f = found[threshold]
        assert (f["live"], f["recommended"], f["keep"]) == (1, 1, True), f["sentence"]
        assert f["sentence"].startswith(f"keep {f['setting']} = 1: it spares every productive turn")
        assert f["rows"][0]["value"] == 1 and f["rows"][0]["productive"] == 0


def test_a_fleet_where_the_first_step_halts_productive_turns_raises_it(tmp_path):
    found = _calibrate(tmp_path, raise_them=True)
    assert {t: (found[t]["recommended"], found[t]["keep"]) for t in ("backstop", "stuck", "streak")} == {
        "backstop": (2, False), "stuck": (3, False), "streak": (2, False)}
    assert all(found[t]["rows"][0]["decision"] == "above" for t in ("backstop", "stuck", "streak"))
