"""Calibrate's replay of a recorded turn gives the live guard's verdicts at the live guard's calls,
whatever the turn did between its calls: model requests begun (``begin_cycle``) anywhere, requests
re-sent (``retry``). Each random script runs once, unbounded, through a live guard with both the
recorder and the OpenTelemetry plugin; then through live guards under each configuration of a
grid, which give the truth; calibrate reads the recorder line and the tool spans and must halt
each configuration's replay at the same call, for the same threshold."""

from __future__ import annotations

import dataclasses
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
    return _drive(guard, steps, turn_id)[:2]


def hidden(steps: list[Step], at: int) -> bool:
    """Whether a halt at step ``at`` is at a call of a request the script re-sends (``retry``
    before the next request): a recording drops such calls, as the live ledger does, so what
    another configuration would have done at them is not in it."""
    for kind, _ in steps[at + 1:]:
        if kind != "call":
            return kind == "retry"
    return False


def _drive(guard: tg.Guard, steps: list[Step], turn_id: str) -> tuple[int, str | None, bool]:
    kept = at_request = 0
    with guard.turn(turn_id=turn_id, promptable=False) as turn:
        for step, (kind, what) in enumerate(steps):
            if kind == "cycle":
                verdict = turn.begin_cycle()
                at_request = kept
                if verdict.halted:
                    return kept + 1, str(verdict.threshold), False
            elif kind == "retry":
                turn.retry()
                kept = at_request
            else:
                tool, args, outcome = what
                call = tg.ToolCall(tool, args)
                verdict = turn.check_call(call)
                if verdict.halted:
                    return kept + 1, str(verdict.threshold), hidden(steps, step)
                kept += 1
                verdict = turn.record_outcome(call, outcome)
                if verdict.halted:
                    return kept + 1, str(verdict.threshold), hidden(steps, step)
    return 0, None, False


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


def recorded(tmp_path: Path, scripts: list[list[Step]], config: tg.GuardConfig | None = None
             ) -> dict[str, dict[str, RecordedTurn]]:
    """The scripts run once under ``config`` (unbounded when not given), as both formats record
    them: by format, by turn id."""
    telemetry = InMemoryTelemetry()
    line_file = tmp_path / "turns.jsonl"
    config = (config or tg.GuardConfig()).replace(recorder_path=str(line_file), **BASE)
    guard = tg.Guard(config, environ={}, **telemetry.providers())
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
    live = [[_drive(guard, steps, f"t{i}") for guard in guards] for i, steps in enumerate(scripts)]
    assert any(halt for row in live for halt, _, _ in row)
    compared = 0
    for group in (True, False):
        calibrator = Calibrator(policies, group=group)
        for fmt, turns in formats.items():
            for i, steps in enumerate(scripts):
                results = calibrator.results(turns[f"t{i}"])
                for policy, result, (*truth, unseen) in zip(policies, results, live[i], strict=True):
                    got = result.get("unattended")
                    replayed = [got.halt_call, got.threshold] if got is not None else [0, None]
                    assert unseen or replayed == truth, (fmt, group, policy.name, i, steps)
                    compared += not unseen
    assert compared > len(scripts) * len(policies) * 3
    if retries:  # recorded under each row: its replay is the live guard's, whatever the requests re-sent
        for k, policy in enumerate(policies):
            folder = tmp_path / f"row{k}"
            folder.mkdir()
            mine = recorded(folder, scripts, policy.config)
            calibrator = Calibrator([dataclasses.replace(policy, is_default=True)])
            for fmt, turns in mine.items():
                for i, steps in enumerate(scripts):
                    got = calibrator.results(turns[f"t{i}"])[0].get("unattended")
                    replayed = [got.halt_call, got.threshold] if got is not None else [0, None]
                    assert replayed == list(live[i][k][:2]), (fmt, policy.name, i, steps)


@pytest.mark.parametrize("seed", range(3))
def test_cycle_cap_halts_in_replay_at_the_live_guards_call(tmp_path: Path, seed: int) -> None:
    check_replays_equal_live(tmp_path, seed, retries=False)


def calls_of(path: Path) -> list[list[dict]]:
    return [json.loads(line)["calls"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("retries", [False, True])
def test_a_turn_suspended_and_resumed_records_each_calls_model_request_as_one_run_does(tmp_path: Path,
                                                                                    retries: bool) -> None:
    rng = random.Random(7)
    scripts = [script(rng, retries=retries) for _ in range(30)]
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
            elif kind == "retry":
                turn.retry()
            else:
                call = tg.ToolCall(*what[:2])
                turn.check_call(call)
                turn.record_outcome(call, what[2])
            if k % 3 == 2:  # put aside and resumed from its snapshot's JSON
                turn = guard.resume(json.loads(json.dumps(turn.suspend())))
        turn.end()
    assert calls_of(parted) == calls_of(whole)
    assert any(len({c.get("cycle") for c in calls}) > 2 for calls in calls_of(whole))
    assert not retries or any(c.get("retries") for calls in calls_of(whole) for c in calls)


@pytest.mark.parametrize("seed", range(4))
def test_a_turn_with_retries_replays_to_the_live_guards_verdicts(tmp_path: Path, seed: int) -> None:
    check_replays_equal_live(tmp_path, 100 + seed, retries=True)
