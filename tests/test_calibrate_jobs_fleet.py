"""``turnguard calibrate --jobs N`` on the Collector's files of a real fleet with every hard case
gives, byte for byte, what one process reading with the ``json`` module gives.

The fleet (``probe_fleet``, a smaller mix) runs through a real guard with the OpenTelemetry plugin:
turns halted by the backstop, the stuck threshold and the streak stop, probe turns (censored at the
probe's own caps), late results from the guard that ran the turn and from another guard by result
token (log records), all encoded as the Collector's file exporter writes them and rotated into a
set of three files cut in the middle of export batches and turns. The workers read byte ranges of
40 KB (a few export batches: turns straddle ranges and files everywhere) and of 1 MiB."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import probe_fleet as pf
import turnguard as tg
from collector_lines import collector_lines, log_lines
from turnguard._calibrate import cli, collector
from turnguard.telemetry._testing import InMemoryTelemetry

MIX = pf.ProbeMix(short=140, long=8, very_long=4, edit_rerun=12, stuck=16, retry=24, failing=40, runaway=4)
GRID = ["--soft-caps", "50,100", "--multipliers", "5,10,20", "--stuck-repeats", "3,6", "--streaks", "5:8,8:16",
        "--explicit-caps", "100"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's spans and late-result records, batched at random and rotated into three files."""
    telemetry = InMemoryTelemetry()
    config = pf.probe_config(disable_plugins=("recorder", "shadow"))
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    pf.run_probe_fleet(guard, MIX, report_elsewhere=pf.in_another_guard(config, **telemetry.providers()))
    telemetry.tracer_provider.force_flush()
    telemetry.logger_provider.force_flush()
    rng = random.Random(5)
    spans, logs = telemetry.spans(), telemetry.log_exporter.get_finished_logs()  # readable records
    lines: list[str] = []
    i = 0
    while i < len(spans):
        k = rng.choice((1, 3, 50, 200, 512))
        lines.extend(collector_lines([spans[i:i + k]]))
        i += k
    lines.extend(log_lines(logs[j:j + 40] for j in range(0, len(logs), 40)))
    folder = tmp_path_factory.mktemp("fleet") / "set"
    folder.mkdir()
    cuts = sorted(rng.sample(range(1, len(lines)), 2))
    parts = [lines[:cuts[0]], lines[cuts[0]:cuts[1]], lines[cuts[1]:]]
    for name, part in zip(("otlp-2026-12-01T00-00-00.000.jsonl", "otlp-2026-12-01T01-00-00.000.jsonl",
                           "otlp.jsonl"), parts, strict=True):
        (folder / name).write_text("".join(line + "\n" for line in part))
    return folder


def figures(arguments: list[str]) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*arguments, "--json", "-", "--progress", "never", *GRID], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def test_the_fleet_holds_every_hard_case(fleet: Path) -> None:
    """What the comparison below covers: halts by every threshold in both cohorts, rows censored by
    the live halt, and every turn's result joined to it (most of them late, some by token)."""
    result = json.loads(figures([str(fleet), "--jobs", "1"])[0])
    assert result["turns"] == len(MIX.work())
    assert result["resolved"] + result["unresolved"] == result["turns"]
    assert result["halt_ended"]["live"] > 0 and result["halt_ended"]["probe"] > 0
    default = next(p for p in result["policies"] if p["default"])["unattended"]
    assert set(default["by_threshold"]) == {"hard_backstop", "soft_stuck", "streak"}
    assert any(p["unattended"]["censored_by_cohort"]["live"] > 0 for p in result["policies"])
    assert result["probe"]


@pytest.mark.parametrize("range_bytes", [40_000, 1 << 20])
def test_workers_reading_byte_ranges_say_what_one_json_reader_says(
    fleet: Path, monkeypatch: pytest.MonkeyPatch, range_bytes: int
) -> None:
    monkeypatch.setattr(collector, "_usable", lambda: False)
    one = figures([str(fleet), "--jobs", "1"])
    monkeypatch.undo()
    monkeypatch.setattr("turnguard._calibrate.run.range_bytes", lambda limit: range_bytes)
    for jobs in (1, 2):
        assert figures([str(fleet), "--jobs", str(jobs)]) == one, jobs
    monkeypatch.setattr(collector, "_usable", lambda: False)
    assert figures([str(fleet), "--jobs", "2"]) == one
