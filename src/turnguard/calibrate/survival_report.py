"""The survival estimate (``survival.py``) in words for the terminal and as an SVG chart: the curve
``S(n)`` on a logarithmic call axis with its 95% log-log band, drawn up to the highest cap turns ran
under and never past it, with the live and the probe caps marked."""

from __future__ import annotations

import html
import itertools
import math
import textwrap
from dataclasses import dataclass
from typing import Any

from turnguard.calibrate.survival import Survival, loglog_interval
from turnguard.calibrate.svg import LANE_H, lanes, spaced

CURVE = "#2f7ebd"
BAND = "rgba(47,126,189,0.18)"
LIVE_CAP, PROBE_CAP = "#c23b3b", "#7b4fa0"


def _ended(est: dict[str, Any]) -> str:
    by = est["censored_by"]
    names = {"cap": "at a cap", "stuck": "stuck", "streak": "by the streak stop", "cancelled": "cancelled",
             "error": "by an error", "other": "otherwise"}
    parts = ", ".join(f"{by[k]:,} {names[k]}" for k in names if by.get(k))
    return f"{est['events']:,} finished, {est['censored']:,} censored" + (f" ({parts})" if parts else "")


def survival_lines(est: dict[str, Any]) -> list[str]:
    """The estimate in sentences (empty without turns)."""
    if not est["turns"]:
        return []
    left_out = f"; {est['unknown_end']:,} recorded without their end are left out" if est["unknown_end"] else ""
    head = f"How many calls turns need (Kaplan-Meier, both cohorts: {est['turns']:,} turns, {_ended(est)}{left_out})."
    out = [head]
    reach, base = est["reach"], est["from_calls"]
    if reach is None:
        return [*out, "The default configuration has no adaptive backstop: no threshold question to answer."]
    interval = "" if reach["interval"] is None else f", 95% {reach['interval'][0]:.1%}-{reach['interval'][1]:.1%}"
    out.append(f"{reach['survival']:.1%} of the turns need more than the backstop's {base:,} calls{interval} "
               f"({reach['at_risk']:,} were seen past it). Of the turns that reach it:")
    cap = est["horizon"]
    for f in est["finish_by"]:
        label = f"by {f['multiple']:g}x ({f['calls']:,} calls)"
        if not f["estimable"]:
            why = (f"not estimable: past the highest cap turns ran under ({cap:,} calls); raise the probe's cap to see "
                   "there" if f["why"] == "past_cap" else "not estimable: no turn was seen past the backstop")
            out.append(f"  {label}: {why}.")
            continue
        band = "" if f["interval"] is None else f" (95% {f['interval'][0]:.0%}-{f['interval'][1]:.0%})"
        out.append(f"  {label}: {f['share']:.0%} finish{band}, {f['at_risk']:,} still running there; a backstop "
                   f"there costs {f['extra_calls_per_turn_reaching']:,.0f} more calls per turn that reaches "
                   f"{base:,} ({f['extra_calls_per_turn']:,.1f} per turn).")
    source = "the caps the turns ran under" if est["horizon_from"] == "limits" else (
        "the longest turn recorded: the recording does not say its caps")
    out.append(f"The estimate reaches {cap:,} calls ({source}) and never past. {est['informative_censoring']}")
    return out


def survival_text(est: dict[str, Any], width: int) -> list[str]:
    lines = survival_lines(est)
    if not lines:
        return []
    out = [""]
    for i, line in enumerate(lines):
        indent = "  " if i else ""
        out += textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=indent + "  ")
    return out


def _curve_points(survival: Survival, top: int) -> list[tuple[int, float, float, float]]:
    """``(n, S, low, high)`` at every event count up to ``top`` (and at 0 and ``top``)."""
    points = [(0, 1.0, 1.0, 1.0)]
    for step in survival.steps():
        if step.t > top:
            break
        band = loglog_interval(step.survival, step.greenwood) or (step.survival, step.survival)
        points.append((step.t, step.survival, band[0], band[1]))
    last = points[-1]
    points.append((top, last[1], last[2], last[3]))
    return points


@dataclass(frozen=True, slots=True)
class _Frame:
    """The chart's plot area: a logarithmic call axis up to ``xmax`` and shares from 0 to 1."""

    top: float
    xmax: float
    width: int = 900
    left: int = 60
    right: int = 20
    plot_h: int = 240

    def x(self, v: float) -> float:
        return self.left + (self.width - self.left - self.right) * math.log10(1 + v) / math.log10(1 + self.xmax)

    def y(self, v: float) -> float:
        return self.top + self.plot_h * (1 - v)


def _curve(f: _Frame, points: list[tuple[int, float, float, float]]) -> list[str]:
    """The band (a polygon along the step curves of its ends) and the step curve itself."""
    pairs = list(itertools.pairwise(points))
    upper = " ".join(f"{f.x(a):.1f},{f.y(hi):.1f} {f.x(b):.1f},{f.y(hi):.1f}" for (a, _, _, hi), (b, *_) in pairs)
    lower = " ".join(f"{f.x(b):.1f},{f.y(lo):.1f} {f.x(a):.1f},{f.y(lo):.1f}"
                     for (a, _, lo, _), (b, *_) in reversed(pairs))
    steps = " ".join(f"{f.x(a):.1f},{f.y(s):.1f} {f.x(b):.1f},{f.y(s):.1f}" for (a, s, _, _), (b, *_) in pairs)
    return [f'<polygon class="band" points="{upper} {lower}" fill="{BAND}" stroke="none"><title>95% log-log '
            'interval</title></polygon>',
            f'<polyline class="curve" points="{steps}" fill="none" stroke="{CURVE}" stroke-width="2">'
            '<title>S(n): the share of turns that need more than n calls</title></polyline>']


def _axes(f: _Frame) -> list[str]:
    parts = []
    for i in range(5):
        y = f.y(i / 4)
        parts.append(f'<line class="grid" x1="{f.left}" y1="{y:.1f}" x2="{f.width - f.right}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end">{i * 25}%</text>')
    ticks = [v for v in (1, 10, 100, 1000, 10_000, 100_000, 1_000_000) if v <= f.xmax]
    for x, label in spaced([(f.x(v), f"{v:,}") for v in ticks], 0, f.width):
        parts.append(f'<text class="tick" x="{x:.1f}" y="{f.top + f.plot_h + 14}" text-anchor="middle">{label}</text>')
    bottom = f.top + f.plot_h
    parts.append(f'<line class="axis" x1="{f.left}" y1="{bottom}" x2="{f.width - f.right}" y2="{bottom}"/>')
    return parts


def _caps(f: _Frame, placed: list[tuple[float, str, str, int]], colors: dict[str, str]) -> list[str]:
    """A dashed line per cap, from its label's lane down to the axis."""
    parts = []
    for x, label, anchor, lane in placed:
        y, color, text = 8 + LANE_H * lane, colors[label], html.escape(label)
        parts.append(f'<line class="cap" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{f.top + f.plot_h}" stroke="{color}" '
                     f'stroke-width="1.5" stroke-dasharray="4 3"><title>{text}</title></line>')
        tx = x + 2 if anchor == "start" else x - 2
        parts.append(f'<text class="cap-label" x="{tx:.1f}" y="{y + 9}" text-anchor="{anchor}" fill="{color}">'
                     f'{text}</text>')
    return parts


def survival_chart(survival: Survival, est: dict[str, Any], caps: dict[str, int | None]) -> str:
    """The SVG chart with its heading, caption and figures (empty without turns or a horizon)."""
    if not est["turns"] or not est["horizon"]:
        return ""
    horizon = est["horizon"]
    xmax = max(horizon, *(c for c in caps.values() if c)) * 1.15
    probe = _Frame(0, xmax)
    marks = [(probe.x(c), f"{name} cap {c:,}", color) for name, c, color in
             (("live", caps.get("live"), LIVE_CAP), ("probe", caps.get("probe"), PROBE_CAP)) if c]
    placed = lanes([(x, label) for x, label, _ in marks], 0, probe.width)
    frame = _Frame(8 + LANE_H * (max((lane for *_, lane in placed), default=-1) + 1) + 6, xmax)
    height = frame.top + frame.plot_h + 50
    parts = [f'<svg id="chart-survival" class="chart" role="img" aria-label="share of turns needing more calls" '
             f'width="{frame.width}" height="{height}" viewBox="0 0 {frame.width} {height}" '
             'xmlns="http://www.w3.org/2000/svg">',
             *_axes(frame), *_curve(frame, _curve_points(survival, horizon)),
             *_caps(frame, placed, {label: color for _, label, color in marks}),
             f'<text x="{(frame.left + frame.width - frame.right) / 2}" y="{height - 12}" text-anchor="middle">'
             "tool calls (log scale)</text></svg>"]
    text = "".join(f"<li>{html.escape(line)}</li>" for line in survival_lines(est)[1:])
    return ("<h2 id='survival'>How many calls turns need</h2><figure>" + "".join(parts) +
            "<figcaption>The share of turns that need more than n calls (Kaplan-Meier, live and probe turns "
            "together), with its 95% log-log band, drawn up to the highest cap turns ran under and not past it; the "
            f"dashed lines are the live and the probe caps. {html.escape(_ended(est))}.</figcaption></figure>"
            f"<ul id='survival-figures'>{text}</ul>")
