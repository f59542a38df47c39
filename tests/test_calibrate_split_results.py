"""The documented recipe for more input than one machine handles (docs/calibration.md): split the
recorder's file by lines, calibrate each part with every late result (``result_for`` lines; the
Collector's ``turnguard.turn.result`` log lines), merge. A late result in another part than its
turn still counts: the merged figures are those of one run over the whole input."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines, log_lines
from turnguard._calibrate import cli
from turnguard.telemetry._testing import InMemoryTelemetry

GRID = ["--soft-caps", "3,6", "--multipliers", "2", "--stuck-repeats", "3", "--no-peers"]


def run(*arguments: str | Path) -> dict | None:
    """``calibrate ... --json -`` (or ``calibrate merge``), ``None`` when no turn was read."""
    out, err = io.StringIO(), io.StringIO()
    args = [*map(str, arguments), "--json", "-"]
    code = cli.merge_main(args[1:], stdout=out, stderr=err) if args[0] == "merge" else cli.main(
        [*args, "--progress", "never", *GRID], stdout=out, stderr=err)
    if not out.getvalue():
        assert "no turn could be read" in err.getvalue(), err.getvalue()
        return None
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def figures(data: dict | None) -> dict | None:
    """What one run and a merge must agree on (not the inputs named, not the replays counted)."""
    if data is not None:
        for key in ("replays", "inputs"):
            data.pop(key, None)
    return data


def guarded_turns(guard: tg.Guard, count: int, seed: int) -> None:
    """``count`` turns; each one's result is reported a few turns later (some never)."""
    rng = random.Random(seed)
    for i in range(count):
        with guard.turn(turn_id=f"t{i}", promptable=False) as turn:
            for _ in range(rng.randint(1, 9)):
                call = tg.ToolCall("bash", rng.choice(["pytest -q", "make"]))
                if turn.check_call(call).halted or turn.record_outcome(call, tg.Outcome.ERROR).halted:
                    break
        late = i - rng.randint(1, 6)
        if late >= 0 and rng.random() < 0.8:
            guard.report_result(f"t{late}", rng.random() < 0.6)


def parts(lines: list[str], size: int, folder: Path) -> list[Path]:
    """``split -l size``."""
    out = []
    for n, at in enumerate(range(0, len(lines), size)):
        path = folder / f"part-{n:02d}"
        path.write_text("".join(lines[at:at + size]))
        out.append(path)
    return out


def recipe(turn_files: list[Path], results: Path, folder: Path) -> dict | None:
    merged = []
    for i, part in enumerate(turn_files):
        data = run(results, part)
        if data is not None:
            path = folder / f"part-{i:02d}.json"
            path.write_text(json.dumps(data))
            merged.append(path)
    return figures(run("merge", *merged))


@pytest.mark.parametrize("seed", range(3))
def test_split_recorder_file_with_every_late_result_merges_to_the_whole(tmp_path: Path, seed: int) -> None:
    recorder = tmp_path / "turns.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(recorder), load_entrypoints=False, soft_cap=4,
                                    disable_plugins=("otel",)), environ={})
    guarded_turns(guard, 40, seed)
    lines = recorder.read_text().splitlines(keepends=True)
    results = tmp_path / "results.jsonl"
    results.write_text("".join(line for line in lines if '"result_for"' in line))  # grep '"result_for"'
    whole = figures(run(recorder))
    assert whole is not None and whole["resolved"] + whole["unresolved"] > 10
    without = tmp_path / "none.jsonl"
    without.write_text("")
    lost = 0
    for size in (1, 2, 3, 5, 7, 11, 20, 33):
        folder = tmp_path / f"by-{size}"
        folder.mkdir()
        split = parts(lines, size, folder)
        assert recipe(split, results, folder) == whole, size
        lost += recipe(split, without, folder) != whole
    assert lost, "some split puts a late result in another part than its turn"


def test_collector_files_by_day_with_every_result_log_merge_to_the_whole(tmp_path: Path) -> None:
    telemetry = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, soft_cap=4), environ={}, **telemetry.providers())
    guarded_turns(guard, 30, seed=5)
    telemetry.tracer_provider.force_flush()
    telemetry.logger_provider.force_flush()
    spans, logs = telemetry.spans(), telemetry.log_exporter.get_finished_logs()
    assert logs
    days = [tmp_path / "otlp-day1.jsonl", tmp_path / "otlp-day2.jsonl"]
    half = next(i for i, s in enumerate(spans) if i >= len(spans) // 2 and dict(s.attributes).get("turnguard.turn.id"))
    days[0].write_text("\n".join(collector_lines([spans[:half + 1]]) + log_lines([logs[:len(logs) // 2]])) + "\n")
    days[1].write_text("\n".join(collector_lines([spans[half + 1:]]) + log_lines([logs[len(logs) // 2:]])) + "\n")
    results = tmp_path / "results.jsonl"  # grep -h '"resourceLogs"' otlp-*.jsonl
    results.write_text("".join(line for day in days for line in day.read_text().splitlines(keepends=True)
                               if '"resourceLogs"' in line))
    whole = figures(run(*days))
    assert whole is not None and whole["resolved"] + whole["unresolved"] > 5
    assert recipe(days, results, tmp_path) == whole
