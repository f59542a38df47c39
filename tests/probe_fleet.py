"""A simulated fleet with a probe cohort and known truth: is 10x right, is D=6 right?

Some productive turns need more than 1,000 calls (S=100 x10): the live guard halts them at call
1,001 and their task fails; the probe (``hard_multiplier=20``, ``stuck_signal="stale_repeat"``)
lets the ones it samples finish. Edit-and-rerun turns re-run their test past the soft cap: the
seed's ``repeat`` signal halts them as stuck at call S+1, the probe's ``stale_repeat`` does not.
Runaways never finish. Every turn reports whether its task succeeded, as a host would: when it
finished its work, in the turn (``turn.report_result``), or, for every other turn, an hour later
(``guard.report_result``): a result is only a result if the task completed.

``run_probe_fleet`` returns the ``ProbeTruth``: the counts an operator must see in ``turnguard
calibrate``'s probe evidence on the recorder's output (``tests/test_probe_fleet.py`` checks them
exactly), and that the threshold-validation panels will count.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import turnguard as tg

SOFT_CAP = 100
PROBE = {"rate": 0.1, "hard_multiplier": 20, "stuck_signal": "stale_repeat"}
"""The probe: one turn in ten, a 20x backstop and the stale signal (more lenient on both)."""


class Work(enum.Enum):
    """What a turn needs to do its task."""

    SHORT = "short"  # 10-80 distinct calls
    LONG = "long"  # 1,100-1,900 distinct calls: needs more than 10x S, less than 20x S
    EDIT_RERUN = "edit_rerun"  # 150-300 calls: edit, re-run the test, past S
    RUNAWAY = "runaway"  # distinct calls forever: the task is never done


@dataclass(frozen=True)
class ProbeMix:
    short: int = 700
    long: int = 40
    edit_rerun: int = 40
    runaway: int = 20


@dataclass
class ProbeTruth:
    """What happened, by cohort and kind of work: turns, and turns whose task was done."""

    turns: Counter[tuple[str, Work]] = field(default_factory=Counter)
    resolved: Counter[tuple[str, Work]] = field(default_factory=Counter)
    calls: Counter[tuple[str, Work]] = field(default_factory=Counter)
    summaries: list[tuple[Work, tg.TurnSummary]] = field(default_factory=list)
    reported: dict[str, bool] = field(default_factory=dict)
    """Per turn (its id): the result the host reported, in the turn or later."""
    main_halts: dict[str, tg.TurnSummary] = field(default_factory=dict)
    """Per probe turn the main configuration would have halted (its id): that turn run alone under
    the main configuration, so its ``threshold`` and ``tool_calls`` are where the live policy would
    have stopped it (the oracle for the false-halt panels)."""


def _calls(work: Work, rng: random.Random, tag: int) -> list[tg.ToolCall]:
    if work is Work.SHORT:
        return [tg.ToolCall("read_file", {"path": f"t{tag}/f{i}"}) for i in range(rng.randint(10, 80))]
    if work is Work.LONG:
        return [tg.ToolCall("read_file", {"path": f"t{tag}/f{i}"}) for i in range(rng.randint(1100, 1900))]
    if work is Work.EDIT_RERUN:
        calls = []
        for i in range(rng.randint(75, 150)):
            calls.append(tg.ToolCall("edit_file", {"path": "src/parser.py", "patch": f"t{tag}-fix-{i}"}))
            calls.append(tg.ToolCall("run_tests", {"cmd": "pytest tests/test_parser.py"}))
        return calls
    return [tg.ToolCall("http_get", {"url": f"https://x/{tag}/{i}"}) for i in range(5000)]


def run_probe_fleet(guard: tg.Guard, mix: ProbeMix = ProbeMix(), seed: int = 3, *,
                    sample: Callable[[], object] | None = None, sample_every: int = 250) -> ProbeTruth:
    """Run the mix through ``guard`` (its configuration's probe samples the turns); ``sample`` is
    called every ``sample_every`` turns and before the late results (a test lands the metrics)."""
    rng = random.Random(seed)
    work = [Work.SHORT] * mix.short + [Work.LONG] * mix.long + [Work.EDIT_RERUN] * mix.edit_rerun
    work += [Work.RUNAWAY] * mix.runaway
    rng.shuffle(work)
    truth = ProbeTruth()
    main = tg.Guard(guard.config.replace(probe=None, recorder_path=None, disable_plugins=("otel", "recorder")),
                    environ={})
    late: list[tuple[str, bool]] = []
    for i, kind in enumerate(work):
        if sample is not None and i and i % sample_every == 0:
            sample()
        calls = _calls(kind, rng, i)
        turn = guard.turn(turn_id=f"probe-fleet-{seed}-{i}", agent_name="coder")
        done = _drive(turn, calls) and kind is not Work.RUNAWAY
        if done and i % 2:
            turn.report_result(True)  # the host knows at once
        turn.end()
        if not (done and i % 2):
            late.append((turn.turn_id, done))  # a CI run reports later
        key = (turn.summary.cohort, kind)
        truth.turns[key] += 1
        truth.resolved[key] += done
        truth.calls[key] += turn.summary.tool_calls
        truth.summaries.append((kind, turn.summary))
        truth.reported[turn.turn_id] = done
        if turn.summary.cohort == "probe":
            alone = main.turn(turn_id=turn.turn_id, agent_name="coder")
            _drive(alone, calls)
            if alone.end().halted:
                truth.main_halts[turn.turn_id] = alone.summary
    if sample is not None:
        sample()
    for turn_id, done in late:
        guard.report_result(turn_id, done)
    return truth


def _drive(turn: tg.Turn, calls: list[tg.ToolCall]) -> bool:
    """Run the calls until a halt; whether all of them ran (the task was done)."""
    for call in calls:
        if turn.check_call(call).halted:
            return False
        turn.record_outcome(call, tg.Outcome.ERROR if call.name == "run_tests" else tg.Outcome.OK)
    return True


def probe_config(**options: Any) -> tg.GuardConfig:
    """The fleet's main configuration (the seed's, S=100) with its probe."""
    return tg.GuardConfig(load_entrypoints=False, soft_cap=SOFT_CAP, probe=dict(PROBE), **options)


def main(argv: list[str] | None = None) -> int:
    """``python tests/probe_fleet.py TURNS.jsonl``: run the fleet, recording its turns."""
    import argparse

    parser = argparse.ArgumentParser(description="Run the probe fleet, recording its turns for turnguard calibrate.")
    parser.add_argument("path", help="where the recorder writes (JSONL, appended)")
    args = parser.parse_args(argv)
    truth = run_probe_fleet(tg.Guard(probe_config(disable_plugins=("otel",), recorder_path=args.path), environ={}))
    for (cohort, work), turns in sorted(truth.turns.items(), key=lambda item: (item[0][0], item[0][1].value)):
        print(f"{cohort:5} {work.value:10} {turns:4} turns, {truth.resolved[(cohort, work)]:4} resolved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
