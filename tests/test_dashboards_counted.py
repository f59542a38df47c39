"""The Halts board's counting form (``promql.counted``, summed by ``promql.total``) on a real
Prometheus's PromQL: ``promtool test rules`` (Debian's 2.42, whose ranges are closed, and Prometheus
3's, left-open) evaluates it on counters with gaps of every length (shorter and longer than the
5-minute lookback delta), series born at any time and counter resets, and compares it with the
events that became visible in each window.

A gap longer than the lookback at a window's start is where the instant ``offset`` form counted a
series' whole history again (a series with no sample 5 minutes before the window looked new).
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import optional_dependency

yaml = optional_dependency("yaml")

from turnguard._boards import promql  # noqa: E402

METRIC = "tg_events_total"
"""A counter no board variable scopes (``counted`` adds no matcher to it)."""
MINUTES = 420
"""The streams' length, one possible sample per minute."""
WINDOWS = (5, 15, 60, 180)
"""Window lengths (minutes): ``$__rate_interval``-like and ``$__range``-like."""


@dataclass(frozen=True)
class Stream:
    """One series: its samples (minute, value); values only grow, except at a reset."""

    name: str
    samples: tuple[tuple[int, int], ...]

    def notation(self) -> str:
        """promtool's series notation, one slot per minute, ``_`` where there is no sample."""
        by_minute = dict(self.samples)
        return " ".join(str(by_minute[m]) if m in by_minute else "_" for m in range(MINUTES))

    def visible(self, at: float, window: int) -> int | None:
        """The events that became visible in ``(at - window, at]``: the growth from the last sample
        before the window (up to a day before it) to the last one in it; from zero for a series
        with none before, and for the run after a reset. None: no sample in the window."""
        inside = [v for m, v in self.samples if at - window < m <= at]
        if not inside:
            return None
        before = [v for m, v in self.samples if at - window - 1440 < m <= at - window]
        count, last = 0, before[-1] if before else 0
        for value in inside:
            count += value - last if value >= last else value
            last = value
        return count


def _random_stream(rng: random.Random, name: str, resets: bool) -> Stream:
    """A stream that resets starts high (its run after the reset stays below the peak before it:
    what the form can tell from one window's samples)."""
    born = rng.choice([0, 0, rng.randrange(MINUTES)])
    gaps = [(a, a + rng.choice([2, 4, 6, 10, 30, 120])) for a in rng.sample(range(MINUTES), rng.randrange(4))]
    reset_at = rng.randrange(born, MINUTES) if resets else -1
    value, samples = 5000 if resets else rng.choice([0, 0, 7]), []
    for minute in range(born, MINUTES):
        value = (0 if minute == reset_at else value) + rng.choice([0, 0, 1, 3])
        if not any(a <= minute < b for a, b in gaps) and rng.random() < 0.9:
            samples.append((minute, value))
    return Stream(name, tuple(samples))


def _planted() -> list[Stream]:
    """The gaps that catch an instant lookback (across a window's start, 10 minutes and 2 hours), a
    series born late, a reset at a window's start and one inside a gap."""
    def steady(name: str, minutes: Iterable[int], value=lambda m: m) -> Stream:
        return Stream(name, tuple((m, value(m)) for m in minutes))

    return [
        steady("gap-10m-at-the-start", [*range(0, 55), *range(65, MINUTES)]),
        steady("gap-2h-at-the-start", [*range(0, 100), *range(220, MINUTES)]),
        steady("born-in-the-window", range(200, MINUTES), lambda m: m - 199),
        steady("reset-at-the-start", range(MINUTES), lambda m: m + 1000 if m < 240 else m - 239),
        steady("reset-in-a-gap", [*range(0, 100), *range(130, MINUTES)], lambda m: m + 1000 if m < 110 else m - 109),
    ]


def _test_file(streams: Sequence[Stream], evaluations: Sequence[tuple[float, int]]) -> dict:
    tests = []
    for at, window in evaluations:
        expected = [(s.name, s.visible(at, window)) for s in streams]
        tests.append({"expr": promql.total(METRIC, by=("series",), window=f"{window}m"),
                      "eval_time": f"{round(at * 60)}s",
                      "exp_samples": [{"labels": f'{{series="{name}"}}', "value": count}
                                      for name, count in expected if count is not None]})
    series = [{"series": f'{METRIC}{{series="{s.name}"}}', "values": s.notation()} for s in streams]
    return {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}


def _run(promtool: str, tmp_path: Path, test_file: dict) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "counted.test.yaml"
    path.write_text(yaml.safe_dump(test_file, width=10**6))
    return subprocess.run([promtool, "test", "rules", path.name], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)


def _evaluations(rng: random.Random, count: int) -> list[tuple[float, int]]:
    """Evaluation times half a minute off the samples (no sample on a window's edge, where 2.x and
    3.x ranges differ), for every window length."""
    return [(rng.randrange(window + 1, MINUTES) + 0.5, window) for window in WINDOWS for _ in range(count)]


def test_the_planted_gaps_resets_and_births_count_every_event_once(promtool, tmp_path):
    streams = _planted()
    evaluations = [(at + 0.5, window) for window in WINDOWS for at in (60, 64, 120, 230, 240, 250, 419)
                   if at > window]
    result = _run(promtool, tmp_path, _test_file(streams, evaluations))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_count_what_became_visible_in_each_window(promtool, tmp_path, seed):
    """Gaps of 2 minutes to 2 hours anywhere, series born at any time, at most one reset each:
    exactly the events that became visible in each window (a window holds at most one reset)."""
    rng = random.Random(seed)
    streams = [_random_stream(rng, f"s{i}", resets=i % 3 == 0) for i in range(24)]
    result = _run(promtool, tmp_path, _test_file(streams, _evaluations(rng, 6)))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


def test_the_planted_gaps_catch_the_instant_lookback_form(promtool, tmp_path):
    """The same cases fail the form the board had (``increase`` where a sample is within the 5-minute
    lookback of the window's start, else the series' whole value): these cases can fail."""
    old = (f"sum by (series) ((increase({METRIC}[60m]) and {METRIC} offset 60m) "
           f"or (last_over_time({METRIC}[60m]) unless {METRIC} offset 60m))")
    test_file = _test_file(_planted()[:2], [(120.5, 60)])
    test_file["tests"][0]["promql_expr_test"][0]["expr"] = old
    result = _run(promtool, tmp_path, test_file)
    assert result.returncode != 0 and "gap-10m-at-the-start" in result.stdout + result.stderr
