"""Placing text in the reports' SVG charts: labels planned with a width per character so that none
overlaps another or leaves its chart (a headless-Chromium test measures them)."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

CHAR_W = 7.0
"""Width of one character of the charts' 11 px sans-serif text, a little over its average: label
positions are planned with it so that no two labels overlap and none leaves its chart."""
LANE_H = 12
LABEL_GAP = 6


def text_width(text: str) -> float:
    return len(text) * CHAR_W


def label_width(data: list[dict[str, Any]]) -> float:
    """The room left of the bars for the longest policy name (bold for the default)."""
    return max(120.0, *(text_width(r["name"]) * (1.1 if r["default"] else 1) + 12 for r in data)) if data else 120.0


def spaced(items: list[tuple[float, str]], lo: float, hi: float, gap: float = LABEL_GAP) -> list[tuple[float, str]]:
    """The ``(x, label)`` items (sorted by x), centred labels, that fit between ``lo`` and ``hi``
    without touching the one before: an axis' tick labels."""
    shown: list[tuple[float, str]] = []
    end = lo - gap
    for x, label in sorted(items):
        half = text_width(label) / 2
        if x - half >= end + gap and x + half <= hi:
            shown.append((x, label))
            end = x + half
    return shown


def lanes(items: list[tuple[float, str]], lo: float, hi: float) -> list[tuple[float, str, str, int]]:
    """Each ``(x, label)`` placed in the first lane (row) where it overlaps no other label and
    below every label its line would cross on its way up: ``(x, label, text-anchor, lane)``. A
    label that would leave ``hi`` is drawn to the left of its x."""
    ends: list[float] = []
    spans: list[tuple[float, float, int]] = []  # (start, end, lane) of the labels placed so far
    placed: list[tuple[float, str, str, int]] = []
    for x, label in sorted(items):
        w = text_width(label)
        start, anchor = (x + 2, "start") if x + 2 + w <= hi else (max(lo, x - 2 - w), "end")
        below = max((lane for a, b, lane in spans if a - 1 <= x <= b + 1), default=-1)
        # drawn leftwards, the label must also stay above the earlier lines it spans
        above = min((lane for px, _, _, lane in placed if start - 1 <= px <= x), default=1 << 30)
        free = [i for i, e in enumerate(ends) if i > below and start >= e + LABEL_GAP]
        lane = next((i for i in free if i < above), free[0] if free else max(len(ends), below + 1))
        while len(ends) <= lane:
            ends.append(float("-inf"))
        ends[lane] = start + w
        spans.append((start, start + w, lane))
        placed.append((x, label, anchor, lane))
    return placed




MAX_STEPS = 5
"""The most intervals an axis is cut into (an axis of whole numbers up to 3 has fewer)."""


def axis_ticks(top: float, *, whole: bool = True) -> list[tuple[float, str]]:
    """An axis from 0 to at least ``top`` as ``(value, label)`` ticks at round steps: 1, 2 or 5
    times a power of ten, at most ``MAX_STEPS`` of them; at least 1 on an axis of whole numbers
    (counts), so that it has no tick between two integers. The last tick is the axis' end: a
    chart scales its marks to it, so each tick stands where its label says. Values are computed
    in decimal, so a label is ``0.3``, never ``0.30000000000000004``."""
    span = Decimal(repr(float(top))) if top > 0 else Decimal(1)
    power = Decimal(10) ** math.floor(math.log10(span / MAX_STEPS))
    step = next(m * power for m in (1, 2, 5, 10) if m * power * MAX_STEPS >= span)
    if whole:
        step = max(step, Decimal(1))
    count = math.ceil(span / step)
    return [(float(k * step), f"{(k * step).normalize():,f}") for k in range(count + 1)]
