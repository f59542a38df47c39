"""A call the live guard refused at its check: the recorder lists it ``denied``, its tool span
ends without an outcome (``turnguard.verdict.action`` ``halt``). Both read alike, so calibrate
gives the same figures from either file; and the call never ran, so no row's replay halts after
it (the recording says nothing past the recorded halt)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import RecordedTurn
from turnguard._calibrate.stats import halt_ended
from turnguard._model import Outcome
from turnguard.telemetry._testing import InMemoryTelemetry

DENIED = Outcome.DENIED

LIVE = {
    "explicit": {"max_tool_calls_per_turn": 4},
    "soft_stuck": {"soft_cap": 3, "stuck_repeat_threshold": 3, "hard_multiplier": 4},
    "hard_backstop": {"soft_cap": 2, "stuck_repeat_threshold": 50, "hard_multiplier": 2},
    "streak": {"streak_warn_at": 0, "streak_stop_at": 3, "streak_stop_on": "error"},
    "cycle_cap": {"max_cycles_per_turn": 3},
}
"""Live configurations whose halts come at a check (a call's or a model request's)."""
ROWS = ('streak_warn_at = 2\nstreak_stop_at = 3\nstreak_stop_on = "any"\ncycle_repeat_warn_at = 2\n'
        'cycle_repeat_stop_at = 3\nsoft_cap = 3\nhard_multiplier = 3\nstuck_repeat_threshold = 2\n')
"""The base of the rows: a streak stop on any outcome, ``cycle_repeat``, a low cap (rows that read
a ``denied`` call otherwise than an ``unknown`` one)."""


def halted_turns(kind: str, folder: Path, count: int, seed: int) -> tuple[Path, Path]:
    """``count`` random turns under ``LIVE[kind]``, recorded by the recorder and as Collector lines."""
    rng = random.Random(seed)
    telemetry = InMemoryTelemetry()
    recorder = folder / f"{kind}.jsonl"
    config = tg.GuardConfig(**LIVE[kind], recorder_path=str(recorder), load_entrypoints=False)
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    for t in range(count):
        with guard.turn(turn_id=f"{kind}-{t}", promptable=False) as turn:
            halted = False
            for _ in range(rng.randint(1, 8)):
                if halted or turn.begin_cycle().halted:
                    break
                tool, args = rng.choice(["bash", "read"]), rng.choice(["a", "b", "a"])
                batch = [tg.ToolCall(tool, args) for _ in range(rng.randint(1, 3))]
                checked = []
                for call in batch:  # one response's calls: all checked before any runs
                    halted = turn.check_call(call).halted
                    if halted:
                        break
                    checked.append(call)
                for call in [] if halted else checked:
                    outcome = tg.Outcome.ERROR if rng.random() < 0.7 else tg.Outcome.OK
                    halted = turn.record_outcome(call, outcome).halted
                    if halted:
                        break
    telemetry.tracer_provider.force_flush()
    spans = folder / f"{kind}-otlp.jsonl"
    spans.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    return recorder, spans


def calibrate_json(path: Path, config: Path) -> dict:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([str(path), "--config", str(config), "--json", "-", "--progress", "never"], stdout=out,
                    stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module", params=list(LIVE))
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("refused")
    config = folder / "rows.toml"
    config.write_text(ROWS)
    return (*halted_turns(request.param, folder, 30, seed=len(request.param)), config)


def refused(turns: dict[str, RecordedTurn]) -> set[str]:
    """The turns whose recording ends at a halt that refused their last call (listed ``denied``)."""
    return {t.id for t in turns.values() if halt_ended(t.ended_by) and t.calls and t.calls[-1].outcome is DENIED}


def readings(recorded) -> tuple[dict[str, RecordedTurn], dict[str, RecordedTurn]]:
    recorder, spans, _ = recorded
    return ({t.id: t for t in read_turns([recorder], lambda p: pytest.fail(str(p)))},
            {t.id: t for t in read_turns([spans], lambda p: pytest.fail(str(p)))})


def test_a_refused_call_reads_as_denied_from_the_recorder_and_from_its_span(recorded) -> None:
    lines, from_spans = readings(recorded)
    assert lines.keys() == from_spans.keys()
    assert refused(lines) or recorded[0].name.startswith("cycle_cap")
    for turn_id, turn in lines.items():
        assert [c.outcome for c in from_spans[turn_id].calls] == [c.outcome for c in turn.calls], turn_id


def test_calibrate_gives_the_same_figures_from_the_recorder_and_the_collector(recorded) -> None:
    recorder, spans, config = recorded
    one, other = calibrate_json(recorder, config), calibrate_json(spans, config)
    for data in (one, other):
        data.pop("inputs", None)
    assert json.dumps(one, sort_keys=True) == json.dumps(other, sort_keys=True)


def test_no_row_halts_a_turn_after_the_call_its_recorded_halt_refused(recorded) -> None:
    """Streak and ``cycle_repeat`` stops at every length: a refused call's outcome, read as one
    that ran, would reach some of them."""
    lines, from_spans = readings(recorded)
    base = tg.GuardConfig.from_toml(str(recorded[2])).replace(soft_cap=100)
    policies = build_grid(GridSpec(base=base, streaks=tuple((0, stop) for stop in range(2, 13)), stop_on=("any",),
                                   cycle_repeats=tuple((0, stop) for stop in range(2, 7))))
    calibrator = Calibrator(policies)
    for turn_id in refused(lines):
        for turn in (lines[turn_id], from_spans[turn_id]):
            for by_mode in calibrator.results(turn):
                for result in by_mode.values():
                    assert result.halt_call <= len(turn.calls), (turn_id, result)
