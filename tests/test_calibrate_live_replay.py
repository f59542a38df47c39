"""Calibrate's replay of a recorded turn gives the live guard's verdicts at the live guard's calls,
whatever the turn did between its calls: model requests begun (``begin_cycle``) anywhere, requests
re-sent (``retry``). Each random script runs once, unbounded, through a live guard with both the
recorder and the OpenTelemetry plugin; then through live guards under each configuration of a
grid, which give the truth; calibrate reads the recorder line and the tool spans and must halt
each configuration's replay at the same call, for the same threshold."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import RecordedTurn
from turnguard.telemetry._testing import InMemoryTelemetry

Step = tuple[str, Any]
"""``("cycle", None)``, ``("retry", None)`` or ``("call", (tool, args, outcome))``."""


def script(rng: random.Random, *, retries: bool) -> list[Step]:
    """A random turn: requests of 0-4 calls from a small pool (so repeats and streaks happen), a
    request sometimes begun twice, and with ``retries`` some requests re-sent."""
    steps: list[Step] = []
    pool = [("bash", "pytest -q"), ("read", {"path": "a"}), ("read", {"path": "b"}), ("status", {})]
    for _ in range(rng.randint(1, 12)):
        steps.append(("cycle", None))
        if rng.random() < 0.1:
            steps.append(("cycle", None))
        for _ in range(rng.choice((0, 1, 1, 2, 3, 4))):
            tool, args = rng.choice(pool) if rng.random() < 0.7 else ("read", {"i": rng.randint(0, 99)})
            steps.append(("call", (tool, args, rng.choice(("ok", "error", "error")))))
        if retries and rng.random() < 0.3:
            steps.append(("retry", None))
    return steps


def drive(guard: tg.Guard, steps: list[Step], turn_id: str) -> tuple[int, str | None]:
    """Run ``steps`` through ``guard``: (the call its halt prevented, as calibrate numbers the
    turn's kept calls, 0: none; the threshold)."""
    kept = at_request = 0
    with guard.turn(turn_id=turn_id, promptable=False) as turn:
        for kind, what in steps:
            if kind == "cycle":
                verdict = turn.begin_cycle()
                at_request = kept
                if verdict.halted:
                    return kept + 1, str(verdict.threshold)
            elif kind == "retry":
                turn.retry()
                kept = at_request
            else:
                tool, args, outcome = what
                call = tg.ToolCall(tool, args)
                verdict = turn.check_call(call)
                if verdict.halted:
                    return kept + 1, str(verdict.threshold)
                kept += 1
                verdict = turn.record_outcome(call, outcome)
                if verdict.halted:
                    return kept + 1, str(verdict.threshold)
    return 0, None


BASE = dict(load_entrypoints=False, disable_plugins=("shadow",))


def grid() -> list[Policy]:
    """The live default, and rows that halt often: cycle caps, tight caps and streaks."""
    default = tg.GuardConfig(load_entrypoints=False)
    rows = [Policy("default", default, is_default=True)]
    rows += [Policy(f"cycles {n}", default.replace(max_cycles_per_turn=n)) for n in (1, 2, 3, 5)]
    rows += [Policy("tight", default.replace(soft_cap=4, stuck_repeat_threshold=3, max_cycles_per_turn=4)),
             Policy("streak", default.replace(streak_warn_at=2, streak_stop_at=3)),
             Policy("explicit", default.replace(max_tool_calls_per_turn=6, max_cycles_per_turn=3))]
    return rows


def recorded(tmp_path: Path, scripts: list[list[Step]]) -> dict[str, dict[str, RecordedTurn]]:
    """The scripts run once, unbounded, as both formats record them: by format, by turn id."""
    telemetry = InMemoryTelemetry()
    line_file = tmp_path / "turns.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(line_file), **BASE), environ={}, **telemetry.providers())
    for i, steps in enumerate(scripts):
        drive(guard, steps, f"t{i}")
    spans_file = tmp_path / "spans.jsonl"
    spans_file.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    out = {}
    for name, path in (("recorder", line_file), ("otlp", spans_file)):
        problems: list = []
        out[name] = {t.id: t for t in read_turns([path], problems.append)}
        assert not problems, problems
        assert len(out[name]) == len(scripts)
    return out


def check_replays_equal_live(tmp_path: Path, seed: int, *, retries: bool, count: int = 40) -> None:
    rng = random.Random(seed)
    scripts = [script(rng, retries=retries) for _ in range(count)]
    formats = recorded(tmp_path, scripts)
    policies = grid()
    guards = [tg.Guard(p.config.replace(disable_plugins=("shadow", "recorder", "otel")), environ={}) for p in policies]
    live = [[drive(guard, steps, f"t{i}") for guard in guards] for i, steps in enumerate(scripts)]
    assert any(halt for row in live for halt, _ in row)
    for group in (True, False):
        calibrator = Calibrator(policies, group=group)
        for fmt, turns in formats.items():
            for i, steps in enumerate(scripts):
                results = calibrator.results(turns[f"t{i}"])
                for policy, result, truth in zip(policies, results, live[i], strict=True):
                    got = result.get("unattended")
                    replayed = (got.halt_call, got.threshold) if got is not None else (0, None)
                    assert replayed == truth, (fmt, group, policy.name, i, steps)


@pytest.mark.parametrize("seed", range(3))
def test_cycle_cap_halts_in_replay_at_the_live_guards_call(tmp_path: Path, seed: int) -> None:
    check_replays_equal_live(tmp_path, seed, retries=False)


def calls_of(path: Path) -> list[list[dict]]:
    return [json.loads(line)["calls"] for line in path.read_text().splitlines()]


def test_a_turn_suspended_and_resumed_records_each_calls_model_request_as_one_run_does(tmp_path: Path) -> None:
    rng = random.Random(7)
    scripts = [script(rng, retries=False) for _ in range(30)]
    whole, parted = tmp_path / "whole.jsonl", tmp_path / "parted.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(whole), **BASE), environ={})
    for i, steps in enumerate(scripts):
        drive(guard, steps, f"t{i}")
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(parted), **BASE), environ={})
    for i, steps in enumerate(scripts):
        turn = guard.turn(turn_id=f"t{i}", promptable=False)
        for k, (kind, what) in enumerate(steps):
            if kind == "cycle":
                turn.begin_cycle()
            else:
                call = tg.ToolCall(*what[:2])
                turn.check_call(call)
                turn.record_outcome(call, what[2])
            if k % 3 == 2:  # put aside and resumed from its snapshot's JSON
                turn = guard.resume(json.loads(json.dumps(turn.suspend())))
        turn.end()
    assert calls_of(parted) == calls_of(whole)
    assert any(len({c.get("cycle") for c in calls}) > 2 for calls in calls_of(whole))
