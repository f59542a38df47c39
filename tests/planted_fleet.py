"""A small fleet with planted truth, run through a real guard with a probe and the recorder.

Every turn's task needs a known number of calls (or never finishes), so what each threshold does
to it is known by construction: productive turns that need more than the live backstop (some more
than the probe's own), edit-and-rerun turns past S, retry streaks that succeed after 9 to 12
identical failures, runaways and stuck turns that never finish. The host reports a turn resolved
when its task finished, unresolved when it did not (a halted task failed), half of them later
(``guard.report_result``). S is 20 so that the fleet runs in seconds: the live backstop is 200
calls (x10), the probe's 400 (x20).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import turnguard as tg

S = 20
LIVE = {"soft_cap": S, "hard_multiplier": 10, "stuck_repeat_threshold": 6, "streak_warn_at": 5, "streak_stop_at": 8}
PROBE = {"rate": 0.3, "hard_multiplier": 20, "stuck_signal": "stale_repeat", "streak_stop_at": 13}


class Work(enum.Enum):
    SHORT = "short"
    LONG = "long"  # needs 11x to 19x S: past the live backstop, within the probe's
    BEYOND = "beyond"  # needs 22x to 28x S: past the probe's backstop too
    EDIT_RERUN = "edit_rerun"  # edit, re-run the test, past S
    RETRY = "retry"  # 9 to 12 identical failures, then success
    RUNAWAY = "runaway"  # distinct calls until halted: never done
    STUCK = "stuck"  # S distinct calls, then one failing call repeated: never done


MIX = {Work.SHORT: 120, Work.LONG: 40, Work.BEYOND: 20, Work.EDIT_RERUN: 20, Work.RETRY: 20, Work.RUNAWAY: 15,
       Work.STUCK: 15}


@dataclass
class PlantedTurn:
    work: Work
    needs: int | None
    """Calls the task needs (``None``: it never finishes)."""
    summary: tg.TurnSummary
    done: bool
    """Whether the task finished (what the host reported, in the turn or later)."""


@dataclass
class Fleet:
    path: Path
    turns: dict[str, PlantedTurn] = field(default_factory=dict)

    def of(self, cohort: str | None = None, work: Work | None = None) -> list[PlantedTurn]:
        return [t for t in self.turns.values()
                if (cohort is None or t.summary.cohort == cohort) and (work is None or t.work is work)]


def _calls(work: Work, rng: random.Random, tag: int) -> tuple[list[tuple[tg.ToolCall, str]], bool]:
    """The calls the task makes, each with its outcome, and whether the last one finishes it."""
    def distinct(n: int, prefix: str = "f") -> list[tuple[tg.ToolCall, str]]:
        return [(tg.ToolCall("read_file", {"path": f"t{tag}/{prefix}{i}"}), "ok") for i in range(n)]

    if work is Work.SHORT:
        return distinct(rng.randint(3, 40)), True
    if work is Work.LONG:
        return distinct(rng.randint(11 * S + 1, 19 * S)), True
    if work is Work.BEYOND:
        return distinct(rng.randint(22 * S, 28 * S)), True
    if work is Work.EDIT_RERUN:
        calls = []
        for i in range(rng.randint(S - 4, S + 4)):
            calls.append((tg.ToolCall("edit_file", {"path": "src/p.py", "patch": f"t{tag}-{i}"}), "ok"))
            calls.append((tg.ToolCall("run_tests", {"cmd": "pytest"}), "error"))
        return calls, True
    if work is Work.RETRY:
        failing = tg.ToolCall("deploy", {"service": f"s{tag}"})
        return distinct(1) + [(failing, "error")] * rng.randint(9, 12) + [(failing, "ok")], True
    if work is Work.RUNAWAY:
        return [(tg.ToolCall("http_get", {"url": f"https://x/{tag}/{i}"}), "ok") for i in range(30 * S)], False
    stuck = tg.ToolCall("mvn", {"goal": "test"})
    return distinct(S) + [(stuck, "error")] * (30 * S), False


def run_fleet(path: Path, seed: int = 11, mix: dict[Work, int] | None = None, **options: Any) -> Fleet:
    """Run the mix through a guard with the probe and the recorder writing ``path``."""
    rng = random.Random(seed)
    work = [w for w, n in (mix or MIX).items() for _ in range(n)]
    rng.shuffle(work)
    config = tg.GuardConfig(name="prod", probe=dict(PROBE), recorder_path=str(path), load_entrypoints=False,
                            disable_plugins=("otel", "shadow"), **{**LIVE, **options})
    guard = tg.Guard(config, environ={})
    fleet = Fleet(path)
    late: list[tuple[str, bool]] = []
    for i, kind in enumerate(work):
        calls, finishes = _calls(kind, rng, i)
        turn = guard.turn(turn_id=f"fleet-{seed}-{i}", agent_name="coder")
        done = finishes
        for call, outcome in calls:
            if turn.check_call(call).halted or turn.record_outcome(call, outcome).halted:
                done = False
                break
        if i % 2:
            turn.report_result(done)
        summary = turn.end()
        if not i % 2:
            late.append((turn.turn_id, done))
        fleet.turns[turn.turn_id] = PlantedTurn(kind, len(calls) if finishes else None, summary, done)
    for turn_id, done in late:
        guard.report_result(turn_id, done)
    return fleet
