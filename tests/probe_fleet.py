"""A simulated fleet with a probe cohort and known truth, with the hard cases an operator meets.

Is 10x right, is D=6 right, is the streak stop at 8 right? Each live threshold halts two kinds of
turn, one that would have succeeded with room and one that never would:

- **the backstop (10x S = 1,000 calls)**: long productive turns that need 1,100 to 1,900 calls (the
  probe, at 20x, lets them finish), very long ones that need 2,100 to 2,600 (more than the probe's
  own cap: it halts them too, so whether they would have succeeded is censored there), and
  runaways (distinct calls forever: censored at the probe's cap as well, never done);
- **the stuck threshold (D = 6 repeats past S)**: edit-and-rerun turns re-running their test past S
  (the seed's ``repeat`` signal halts them, the probe's ``stale_repeat`` does not), and turns stuck
  alternating two calls (both signals halt them, the probe's at its D of 12: they fail under the
  probe too);
- **the streak stop (8 identical failures)**: retry streaks that succeed after 9 to 12 identical
  failures (the probe stops at 16), and calls that fail forever (the probe halts them at 16).

The probe (``PROBE``: one turn in ten, 20x, ``stale_repeat`` at D = 12, streak stop 16) runs beside the main
configuration (the seed's, S = 100). Every turn reports whether its task succeeded, as a host
would: when the turn finished its work, at once in the turn (``turn.report_result``), otherwise
after the turn, half by the guard that ran it (``guard.report_result(turn_id, ...)``) and half from
another process (a CI verdict), with the turn's ``result_token`` on a guard that never saw the turn
(``report_elsewhere``: ``in_another_process`` runs one, ``tests/late_results.py``). A result is only
a result if the task completed.

``TRUTH`` is the planted share, per threshold, of the turns it halts that would have succeeded with
no limit at all; ``run_probe_fleet`` returns the ``ProbeTruth``: what each turn did, the counts an
operator must see in ``turnguard calibrate``'s probe evidence and on the threshold-validation board.
"""

from __future__ import annotations

import enum
import io
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import turnguard as tg

SOFT_CAP = 100
FLEET_KEY = "probe-fleet-key"
"""The ``digest_key`` the fleet and its other process share where that process's metrics must carry
the turns' own labels: a keyless token is anyone's, and its policy and agent count as ``_token``
in a process that never showed them."""
PROBE = {"rate": 0.1, "hard_multiplier": 20, "stuck_signal": "stale_repeat", "stuck_repeat_threshold": 12,
         "streak_stop_at": 16}
"""The probe: one turn in ten, a 20x backstop, the stale signal at D = 12 and a streak stop at 16 (more
lenient on every threshold). Its D and stop are twice the main's: a turn it halts as stuck or
streaking was seen looping that far past the main value, so it failed (calibrate's
``evidence.SEEN_LOOPING``); at the main's own D its stuck halts would say nothing (censored), and D
would never be decided within."""


class Work(enum.Enum):
    """What a turn needs to do its task."""

    SHORT = "short"  # 10-80 distinct calls
    LONG = "long"  # 1,100-1,900 distinct calls: more than 10x S, less than 20x S
    VERY_LONG = "very_long"  # 2,100-2,600 distinct calls: more than the probe's 20x S too
    EDIT_RERUN = "edit_rerun"  # 150-300 calls: edit, re-run the test, past S
    STUCK = "stuck"  # a short prefix, then two calls alternating forever
    RETRY = "retry"  # the same call failing 9-12 times, then succeeding
    FAILING = "failing"  # the same call failing forever
    RUNAWAY = "runaway"  # distinct calls forever: the task is never done

    @property
    def productive(self) -> bool:
        """Whether the task gets done given room enough."""
        return self not in (Work.STUCK, Work.FAILING, Work.RUNAWAY)


MAIN_HALTS = {Work.LONG: "hard_backstop", Work.VERY_LONG: "hard_backstop", Work.RUNAWAY: "hard_backstop",
              Work.EDIT_RERUN: "soft_stuck", Work.STUCK: "soft_stuck", Work.RETRY: "streak", Work.FAILING: "streak"}
"""Where the main configuration halts each kind of work (the others it lets finish)."""


@dataclass(frozen=True)
class ProbeMix:
    short: int = 700
    long: int = 60
    very_long: int = 20
    edit_rerun: int = 40
    stuck: int = 80
    retry: int = 100
    failing: int = 300
    runaway: int = 20

    def work(self) -> list[Work]:
        return [kind for kind in Work for _ in range(getattr(self, kind.value))]

    def truth(self) -> dict[str, float]:
        """Per live threshold: the share of the turns it halts that would have succeeded with room."""
        halted: dict[str, list[bool]] = {}
        for kind in self.work():
            if kind in MAIN_HALTS:
                halted.setdefault(MAIN_HALTS[kind], []).append(kind.productive)
        return {threshold: sum(kinds) / len(kinds) for threshold, kinds in halted.items()}


SEED = 7
"""The fleet's seed: its shuffle puts every kind of work in the probe's sample (4 to 32 turns each)."""
TRUTH = ProbeMix().truth()
"""The planted truth: hard_backstop 0.8, soft_stuck 1/3, streak 0.25."""


@dataclass
class ProbeTruth:
    """What happened, by cohort and kind of work: turns, and turns whose task was done."""

    turns: Counter[tuple[str, Work]] = field(default_factory=Counter)
    resolved: Counter[tuple[str, Work]] = field(default_factory=Counter)
    calls: Counter[tuple[str, Work]] = field(default_factory=Counter)
    summaries: list[tuple[Work, tg.TurnSummary]] = field(default_factory=list)
    reported: dict[str, bool] = field(default_factory=dict)
    """Per turn (its id): the result the host reported, in the turn or later."""
    elsewhere: list[str] = field(default_factory=list)
    """Ids of the turns whose result came from another process, by result token."""
    main_halts: dict[str, tg.TurnSummary] = field(default_factory=dict)
    """Per probe turn the main configuration would have halted (its id): that turn run alone under
    the main configuration, so its ``threshold`` and ``tool_calls`` are where the live policy would
    have stopped it (the oracle for the probe rows)."""
    recorded_in: str = ""
    """Where the fleet's recording is (pytest keeps the last runs' folders): a failing count names it,
    so calibrate can be run again on the very files."""


def _distinct(tool: str, tag: int, n: int) -> list[tg.ToolCall]:
    return [tg.ToolCall(tool, {"path": f"t{tag}/f{i}"}) for i in range(n)]


Step = tuple[tg.ToolCall, tg.Outcome]


def _steps(work: Work, rng: random.Random, tag: int) -> list[Step]:
    ok, error = tg.Outcome.OK, tg.Outcome.ERROR
    if work is Work.SHORT:
        return [(c, ok) for c in _distinct("read_file", tag, rng.randint(10, 80))]
    if work in (Work.LONG, Work.VERY_LONG):
        low, high = (1100, 1900) if work is Work.LONG else (2100, 2600)
        return [(c, ok) for c in _distinct("read_file", tag, rng.randint(low, high))]
    if work is Work.EDIT_RERUN:
        steps: list[Step] = []
        for i in range(rng.randint(75, 150)):
            steps.append((tg.ToolCall("edit_file", {"path": "src/parser.py", "patch": f"t{tag}-fix-{i}"}), ok))
            steps.append((tg.ToolCall("run_tests", {"cmd": "pytest tests/test_parser.py"}), error))
        return steps
    if work is Work.STUCK:
        loop = [(tg.ToolCall("run_tests", {"cmd": "pytest"}), error), (tg.ToolCall("edit_file", {"patch": "same"}), ok)]
        return [(c, ok) for c in _distinct("grep", tag, rng.randint(5, 30))] + loop * 2500
    if work in (Work.RETRY, Work.FAILING):
        flaky = tg.ToolCall("http_get", {"url": f"https://ci.example/{tag}/status"})
        failures = rng.randint(9, 12) if work is Work.RETRY else 5000
        after = [(flaky, ok), *((c, ok) for c in _distinct("read_file", tag, rng.randint(2, 6)))]
        return [(flaky, error)] * failures + (after if work is Work.RETRY else [])
    return [(c, ok) for c in _distinct("http_get", tag, 5000)]


def _drive(turn: tg.Turn, steps: Sequence[Step]) -> bool:
    """Run the calls until a halt; whether all of them ran (the task was done)."""
    for call, outcome in steps:
        if turn.check_call(call).halted:
            return False
        turn.record_outcome(call, outcome)
    return True


ReportElsewhere = Callable[[list[tuple[str, bool]]], object]
"""Reports ``(result token, resolved)`` pairs from another process (or a guard standing for one)."""


def in_another_guard(config: tg.GuardConfig, **options: Any) -> ReportElsewhere:
    """A guard that never saw the fleet's turns (``options``: its providers), taking their results by token."""
    def report(pairs: list[tuple[str, bool]]) -> None:
        other = tg.Guard(config.replace(probe=None), environ={}, **options)
        for token, done in pairs:
            assert other.report_result(token, done), f"the other guard refused {token!r}"
    return report


def in_another_process(recorder_path: str | None = None, *, otlp_endpoint: str | None = None, instance: str = "",
                       exported: Callable[[dict[str, Any]], object] | None = None,
                       digest_key: str | None = None) -> ReportElsewhere:
    """A process of its own (``tests/late_results.py``) taking the results by token on a guard of the
    fleet's configuration (with ``digest_key``), recording them to ``recorder_path`` and exporting its
    metrics once to ``otlp_endpoint`` as the service instance ``instance``; ``exported`` gets what it
    exported."""
    def report(pairs: list[tuple[str, bool]]) -> None:
        import late_results

        answer = late_results.in_another_process({"results": pairs, "recorder_path": recorder_path,
                                                  "otlp_endpoint": otlp_endpoint, "instance": instance,
                                                  "digest_key": digest_key})
        assert answer["taken"] == len(pairs), answer
        if exported is not None:
            exported(answer)
    return report


def run_probe_fleet(guard: tg.Guard, mix: ProbeMix = ProbeMix(), seed: int = SEED, *,
                    report_elsewhere: ReportElsewhere | None = None, sample: Callable[[], object] | None = None,
                    sample_every: int = 250, gap: Callable[[], object] | None = None) -> ProbeTruth:
    """Run the mix through ``guard`` (its configuration's probe samples the turns); ``sample`` is
    called every ``sample_every`` turns and before and after the late results (a test lands the
    metrics); ``gap`` halfway through the turns, just after a sample (a test makes a telemetry gap
    there: the turns after it are exported while the store is down); ``report_elsewhere`` takes
    the results from another process (default: a guard of the same configuration in this process,
    that never saw the turns)."""
    rng = random.Random(seed)
    work = mix.work()
    rng.shuffle(work)
    truth = ProbeTruth()
    main = tg.Guard(guard.config.replace(probe=None, recorder_path=None, disable_plugins=("otel", "recorder")),
                    environ={})
    late: list[tuple[str, bool]] = []
    elsewhere: list[tuple[str, bool]] = []
    for i, kind in enumerate(work):
        if sample is not None and i and i % sample_every == 0:
            sample()
        if gap is not None and i == len(work) // 2:
            if sample is not None:
                sample()
            gap()
        steps = _steps(kind, rng, i)
        turn = guard.turn(turn_id=f"probe-fleet-{seed}-{i}", agent_name="coder")
        done = _drive(turn, steps) and kind is not Work.RUNAWAY
        if done and i % 2:
            turn.report_result(True)  # the host knows at once
        turn.end()
        if not (done and i % 2) and i % 4 >= 2:  # a CI run reports later, from another process
            elsewhere.append((turn.result_token, done))
            truth.elsewhere.append(turn.turn_id)
        elif not (done and i % 2):  # or by the guard that ran the turn
            late.append((turn.turn_id, done))
        _tally(truth, kind, turn, done)
        if turn.summary.cohort == "probe":
            alone = main.turn(turn_id=turn.turn_id, agent_name="coder")
            _drive(alone, steps)
            if alone.end().halted:
                truth.main_halts[turn.turn_id] = alone.summary
    if sample is not None:
        sample()
    for turn_id, done in late:
        guard.report_result(turn_id, done)
    (report_elsewhere or in_another_guard(guard.config))(elsewhere)
    if sample is not None:
        sample()
    return truth


def _tally(truth: ProbeTruth, kind: Work, turn: tg.Turn, done: bool) -> None:
    key = (turn.summary.cohort, kind)
    truth.turns[key] += 1
    truth.resolved[key] += done
    truth.calls[key] += turn.summary.tool_calls
    truth.summaries.append((kind, turn.summary))
    truth.reported[turn.turn_id] = done


def probe_config(**options: Any) -> tg.GuardConfig:
    """The fleet's main configuration (the seed's, S=100) with its probe."""
    return tg.GuardConfig(load_entrypoints=False, soft_cap=SOFT_CAP, probe=dict(PROBE), **options)


CALIBRATE_GRID = ("--soft-caps", "100", "--multipliers", "10", "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers",
                  "--explicit-caps", "100", "--key-modes", "canonical")
"""The grid the fleet's recordings are calibrated on: the main configuration's own values."""


def calibrate(paths: Iterable[str | os.PathLike[str]], tolerance: float) -> dict[str, Any]:
    """``turnguard calibrate --json`` on the fleet's recording, its default row the fleet's main
    configuration: never the one the machine's ``TURNGUARD_*`` variables or a ``turnguard.toml``
    above the checkout would give (a stuck signal of its own moves the stuck row, so the counts
    would be the machine's, not the fleet's)."""
    from turnguard._calibrate import cli

    args = cli.build_parser().parse_args([*map(str, paths), *CALIBRATE_GRID, "--tolerance", repr(tolerance),
                                          "--json", "-"])
    args.guard_config = probe_config().replace(probe=None)
    out, err = io.StringIO(), io.StringIO()
    assert cli.run(args, stdout=out, stderr=err) == 0, err.getvalue()
    return json.loads(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    """``python tests/probe_fleet.py TURNS.jsonl``: run the fleet, recording its turns (the results
    from another process are recorded by that process's guard, to ``TURNS.jsonl.elsewhere``)."""
    import argparse

    parser = argparse.ArgumentParser(description="Run the probe fleet, recording its turns for turnguard calibrate.")
    parser.add_argument("path", help="where the recorder writes (JSONL, appended)")
    args = parser.parse_args(argv)
    config = probe_config(disable_plugins=("otel",), recorder_path=args.path)
    elsewhere = in_another_process(args.path + ".elsewhere")
    truth = run_probe_fleet(tg.Guard(config, environ={}), report_elsewhere=elsewhere)
    for (cohort, work), turns in sorted(truth.turns.items(), key=lambda item: (item[0][0], item[0][1].value)):
        print(f"{cohort:5} {work.value:10} {turns:4} turns, {truth.resolved[(cohort, work)]:4} resolved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
