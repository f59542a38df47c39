"""The HTML report's axes: ticks at round numbers (1, 2 or 5 times a power of ten), whole numbers on
an axis of counts, and each tick where its label says (the marks are scaled to the last tick).
Labels like ``0.8`` on an axis of turns, or a grid line at 3.25 labelled ``3``, were drawn."""

from __future__ import annotations

import random
import re
from decimal import Decimal
from itertools import pairwise

import pytest

from turnguard._calibrate.corpus import corpus_turn
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.html import MAX_STEPS, axis_ticks, render

ROUND_STEPS = {Decimal(m) for m in (1, 2, 5)}


def assert_round_axis(top: float, ticks: list[tuple[float, str]], *, whole: bool) -> None:
    values = [Decimal(label.replace(",", "")) for _, label in ticks]
    assert [float(v) for v in values] == [value for value, _ in ticks], ticks  # each label is its value
    assert values[0] == 0 and 2 <= len(values) <= MAX_STEPS + 1, ticks
    step = values[1]
    assert all(b - a == step for a, b in pairwise(values)), ticks
    assert step.scaleb(-step.adjusted()).normalize() in ROUND_STEPS, ticks  # 1, 2 or 5 x 10^k
    assert values[-1] >= Decimal(repr(float(top))) > values[-2] or top <= 0 or (whole and top <= 1), (top, ticks)
    if whole:
        assert step >= 1 and all(v == v.to_integral_value() for v in values), ticks
        assert all(re.fullmatch(r"\d{1,3}(,\d{3})*", label) for _, label in ticks), ticks


def test_every_count_up_to_three_thousand_gets_a_round_whole_axis():
    for top in range(3001):
        assert_round_axis(top, axis_ticks(top), whole=True)


def test_random_counts_and_fractions_get_round_axes():
    rng = random.Random(5)
    for _ in range(3000):
        top = 10 ** rng.uniform(-6, 12)
        assert_round_axis(top, axis_ticks(top, whole=False), whole=False)
        count = int(10 ** rng.uniform(0, 12))
        assert_round_axis(count, axis_ticks(count), whole=True)
    for top in (0.1 + 0.2, 0.3, 0.7, 1 / 3, 2 / 3, 0.999999, 1.000001):
        ticks = axis_ticks(top, whole=False)
        assert_round_axis(top, ticks, whole=False)
        assert all(len(label) <= 8 for _, label in ticks), ticks  # never 0.30000000000000004


def _page(turns: int, calls: int) -> str:
    """The report of ``turns`` turns of ``calls`` identical failing calls (each halted by the streak)."""
    line = {"calls": [{"tool": "t", "args": {"a": 1}, "outcome": "error"}] * calls, "cycles": 1}
    policies = build_grid(GridSpec(soft_caps=(5, 20), stuck_repeats=(3,), explicit_caps=(15,)))
    recorded = [corpus_turn({**line, "id": f"t{i}"}, "gen", i, print) for i in range(turns)]
    return render(Calibrator(policies).add_all(t for t in recorded if t is not None))


CHART = re.compile(r'<svg id="(?P<id>chart-[a-z]+)".*?</svg>', re.S)
TICK = re.compile(r'<text class="tick" x="(?P<x>[\d.]+)" y="(?P<y>[\d.]+)"[^>]*>(?P<label>[^<]*)</text>')
GRID = re.compile(r'<line class="grid" x1="(?P<x1>[\d.]+)" y1="(?P<y1>[\d.]+)" x2="[\d.]+" y2="(?P<y2>[\d.]+)"/>')


@pytest.mark.parametrize(("turns", "calls"), [(1, 9), (2, 9), (3, 9), (3, 30), (7, 12), (13, 9), (61, 9)])
def test_count_axes_of_the_report_have_whole_round_ticks_evenly_placed(turns, calls):
    page = _page(turns, calls)
    charts = {m["id"]: m.group(0) for m in CHART.finditer(page)}
    for chart in ("chart-halts", "chart-saved", "chart-asks", "chart-distribution"):
        svg = charts[chart]
        ticks = [m["label"] for m in TICK.finditer(svg)]
        if chart == "chart-distribution":  # its count axis is the vertical one (x: call-count bins)
            ticks = [m["label"] for m in TICK.finditer(svg) if 'text-anchor="end"' in m.group(0)]
            grid = [float(m["y1"]) for m in GRID.finditer(svg)]
        else:
            grid = [float(m["x1"]) for m in GRID.finditer(svg)]
        assert ticks and all(re.fullmatch(r"\d{1,3}(,\d{3})*", t) for t in ticks), (chart, ticks)
        values = [int(t.replace(",", "")) for t in ticks]
        assert values[0] == 0 and len({b - a for a, b in pairwise(values)}) <= 1, values
        gaps = {round(b - a, 1) for a, b in pairwise(grid)}
        assert max(gaps) - min(gaps) <= 0.2, (chart, grid)  # grid lines evenly spaced, as their values
