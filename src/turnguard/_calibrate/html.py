"""The self-contained HTML report: inline SVG charts, no script, no network. Labels are placed
with a width per character so that none overlaps another or leaves its chart (a headless-Chromium
test measures them)."""

from __future__ import annotations

import html
import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from string import Template
from typing import Any

from turnguard._calibrate.advice import evidence_html
from turnguard._calibrate.report import (
    THRESHOLD_ORDER,
    censoring,
    censoring_text,
    default_unresolved,
    resolved_text,
    rows,
    thresholds_text,
)
from turnguard._calibrate.stats import RunStats, default_limits
from turnguard._calibrate.survival import Survival, ended, survival_interval, survival_lines
from turnguard._terminal import shown

COLORS = {"explicit": "#7b4fa0", "soft_stuck": "#d9822b", "hard_backstop": "#c23b3b", "streak": "#2f7ebd",
          "cycle_cap": "#3a9a5b", "cycle_repeat": "#1a9c9c", "plugin_error": "#777777", "censored": "#c8c8c8"}
CENSORED = "censored"
FP_COLOR = "#111111"
ROW_H = 16


def esc(value: Any) -> str:
    """``value`` as HTML text; an id or a file name that holds lone surrogates or control characters
    is shown with escapes (``terminal.shown``), so the page always encodes."""
    return html.escape(shown(str(value)), quote=True)


def _svg(chart_id: str, label: str, width: float, height: float) -> str:
    """An SVG chart's opening tag."""
    return (f'<svg id="{chart_id}" class="chart" role="img" aria-label="{label}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">')


def _name(r: dict[str, Any], label_w: float, y: int) -> str:
    """A policy's name left of its row of a chart, bold for the default."""
    weight = ' font-weight="bold"' if r["default"] else ""
    return f'<text class="name" x="{label_w - 6:.1f}" y="{y + 11}" text-anchor="end"{weight}>{esc(r["name"])}</text>'


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{c}"></i>{esc(t)}</span>' for t, c in items
    ) + "</div>"


def _hbars(chart_id: str, data: list[dict[str, Any]], segments: list[tuple[str, str]], marker_key: str | None,
           title: str, caption: str, texts: list[str] | None = None) -> str:
    """Horizontal bars, one per policy, stacked by ``segments`` (key, color), each labelled with
    ``texts`` (by default its total)."""
    values = [sum(r["_seg"].get(k, 0) for k, _ in segments) for r in data]
    if texts is None:
        texts = [f"{total:,}" + (f" ({r[marker_key]:,} resolved)" if marker_key and r.get(marker_key) else "")
                 for r, total in zip(data, values, strict=True)]
    label_w = label_width(data)
    plot_w = 500
    width = round(label_w + plot_w + max(map(text_width, [*texts, "0"])) + 12)
    axis = axis_ticks(max(values, default=0))
    top = axis[-1][0]
    height = ROW_H * len(data) + 30
    parts = [_svg(chart_id, esc(title), width, height)]
    ticks = [(label_w + plot_w * value / top, label) for value, label in axis]
    for x, _ in ticks:
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - 20}"/>')
    for x, label in spaced(ticks, 0, width):
        parts.append(f'<text class="tick" x="{x:.1f}" y="{height - 6}" text-anchor="middle">{label}</text>')
    for row, r in enumerate(data):
        y = row * ROW_H + 2
        parts.append(_name(r, label_w, y))
        x = label_w
        for key, color in segments:
            v = r["_seg"].get(key, 0)
            if not v:
                continue
            w = plot_w * v / top
            parts.append(f'<rect class="bar" x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{ROW_H - 4}" '
                         f'fill="{color}"><title>{esc(r["name"])}: {esc(key)} {v:,}</title></rect>')
            x += w
        if marker_key and r.get(marker_key):
            mx = label_w + plot_w * r[marker_key] / top
            parts.append(f'<rect x="{label_w:.1f}" y="{y + ROW_H - 6}" width="{max(mx - label_w, 1):.1f}" height="3" '
                         f'fill="{FP_COLOR}"><title>{esc(r["name"])}: {r[marker_key]:,} resolved turns halted'
                         f'</title></rect>')
        parts.append(f'<text class="value" x="{x + 4:.1f}" y="{y + 11}">{texts[row]}</text>')
    parts.append(f'<line class="axis" x1="{label_w:.1f}" y1="0" x2="{label_w:.1f}" y2="{height - 20}"/></svg>')
    return (f'<h2>{esc(title)}</h2><figure>{"".join(parts)}<figcaption>{esc(caption)}</figcaption></figure>')


def halts_chart(data: list[dict[str, Any]]) -> str:
    for r in data:
        r["_seg"] = {**r["by_threshold"], CENSORED: r["censored"]}
    order = tuple(dict.fromkeys((*THRESHOLD_ORDER, *COLORS)))  # every threshold with a color, censored last
    seen = [k for k in order if any(r["_seg"].get(k) for r in data)]
    legend = _legend([(k, COLORS[k]) for k in seen] + [("resolved turns among them", FP_COLOR)])
    return _hbars("chart-halts", data, [(k, COLORS[k]) for k in order], "halted_resolved",
                  "Turns halted (unattended), by threshold, and turns censored",
                  "Stacked by the threshold that fired; the black line under a bar is the resolved turns it "
                  "halts among those recorded to their own end (the false-positive proxy); grey: turns censored for "
                  "the row (their recording ends at a halt of their own, or their listed calls stop, before its "
                  "threshold, or they are recorded in part: not known either way).",
                  texts=[f"{r['halted']:,}" + (f" ({r['halted_resolved']:,} resolved)" if r["halted_resolved"] else "")
                         + (f" + {r['censored']:,} censored" if r["censored"] else "") for r in data]) + legend


def saved_chart(data: list[dict[str, Any]]) -> str:
    for r in data:
        r["_seg"] = {"saved": r["saved_unresolved"]}
    return _hbars("chart-saved", data, [("saved", "#3a9a5b")], None,
                  "Calls saved on unresolved turns",
                  "Recorded calls that halted unresolved turns would not have made.")


def asks_chart(data: list[dict[str, Any]]) -> str:
    for r in data:
        r["_seg"] = {"asks": r["asks"]}
    return _hbars("chart-asks", data, [("asks", "#2f7ebd")], None,
                  "Asks an attended session would have seen",
                  "Questions to the user (streak warnings and stops) with a person watching; each answered "
                  "'continue'.")


def position_chart(data: list[dict[str, Any]]) -> str:
    """Heat map: policies x tenths of the turn in which their halts land."""
    cell = 40
    label_w = label_width(data)
    width = round(label_w + cell * 11 + 20)
    height = ROW_H * len(data) + 40
    parts = [_svg("chart-positions", "where halts land", width, height)]
    labels = [f"{i * 10}%" for i in range(10)] + ["end"]
    for j, label in enumerate(labels):
        parts.append(f'<text class="tick" x="{label_w + j * cell + cell / 2:.1f}" y="{height - 8}" '
                     f'text-anchor="middle">{label}</text>')
    for row, r in enumerate(data):
        y = row * ROW_H + 2
        parts.append(_name(r, label_w, y))
        total = sum(r["halt_deciles"]) or 1
        for j, n in enumerate(r["halt_deciles"]):
            share = n / total
            shade = f"rgba(194,59,59,{0.08 + 0.92 * share:.2f})" if n else "#f6f6f6"
            parts.append(f'<rect class="cell" x="{label_w + j * cell:.1f}" y="{y}" width="{cell - 2}" '
                         f'height="{ROW_H - 3}" '
                         f'fill="{shade}"><title>{esc(r["name"])}: {n:,} halts in {labels[j]}</title></rect>')
    parts.append("</svg>")
    return ('<h2>Where in a turn halts land</h2><figure>' + "".join(parts) +
            '<figcaption>Share of each policy\'s halts by the tenth of the turn where the halt stops it '
            '("end": after the last recorded call, which saves nothing).</figcaption></figure>')


def distribution_chart(stats: RunStats, thresholds: list[tuple[str, float, str]]) -> str:
    """Tool calls per turn (all, resolved), log x axis, each cap of the grid marked, its label in
    the lanes above the plot."""
    hist, res = stats.calls_per_turn, stats.calls_per_turn_resolved
    width, left, right, bottom, plot_h = 900, 60, 20, 60, 240
    plot_w = width - left - right
    xmax = max([*hist.keys(), *(t for _, t, _ in thresholds), 10]) * 1.15
    lmax = math.log10(1 + xmax)

    def sx(v: float) -> float:
        return left + plot_w * math.log10(1 + v) / lmax

    at_value: dict[float, list[tuple[str, str]]] = {}
    for label, value, color in sorted(thresholds, key=lambda t: (t[1], t[0])):
        at_value.setdefault(value, []).append((label, color))
    placed = lanes([(sx(value), ", ".join(label for label, _ in group)) for value, group in at_value.items()], 0,
                   width)
    top = 8 + LANE_H * (max((lane for *_, lane in placed), default=-1) + 1) + 6
    height = top + plot_h + bottom
    edges, bins = _bins(hist, res, xmax)
    axis = axis_ticks(max((v[0] for v in bins.values()), default=0))
    ymax = axis[-1][0]
    parts = [_svg("chart-distribution", "tool calls per turn", width, height)]
    for value, label in axis:
        y = top + plot_h * (1 - value / ymax)
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for b, (n, nr) in sorted(bins.items()):
        x0, x1 = sx(edges[b]), sx(edges[b + 1])
        h = plot_h * n / ymax
        bw = max(x1 - x0 - 1, 1)
        parts.append(f'<rect class="bar" x="{x0 + 0.5:.1f}" y="{top + plot_h - h:.1f}" width="{bw:.1f}" '
                     f'height="{h:.1f}" fill="#9bbbd9"><title>{edges[b]}-{edges[b + 1] - 1} calls: {n:,} turns '
                     f'({nr:,} resolved)</title></rect>')
        hr = plot_h * nr / ymax
        if nr:
            parts.append(f'<rect x="{x0 + 0.5:.1f}" y="{top + plot_h - hr:.1f}" width="{bw:.1f}" '
                         f'height="{hr:.1f}" fill="#2f7ebd"/>')
    for x, label in spaced([(sx(e), f"{e:,}") for e in edges if e <= xmax], 0, width):
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{label}</text>')
    parts += _dashed("threshold", placed, list(at_value.values()), top + plot_h)
    parts.append(f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}"/>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 20}" text-anchor="middle">tool calls per turn '
                 '(log scale)</text></svg>')
    legend = _legend([("all turns", "#9bbbd9"), ("resolved turns", "#2f7ebd"), ("soft cap S", COLORS["soft_stuck"]),
                      ("backstop S x m", COLORS["hard_backstop"]), ("explicit cap", COLORS["explicit"])])
    return ('<h2>Tool calls per turn, with each threshold of the grid</h2><figure>' + "".join(parts) +
            '<figcaption>Turns by their number of tool calls; dashed lines are the caps of the grid.</figcaption>'
            '</figure>' + legend)


EDGES = (0, 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000, 1500, 2000, 3000, 5000,
         7000, 10000)


def _bins(hist: dict[int, int], res: dict[int, int], xmax: float) -> tuple[list[int], dict[int, list[int]]]:
    """The bin edges up to ``xmax`` (doubling past ``EDGES``) and [all turns, resolved turns] per bin."""
    edges = list(EDGES)
    while edges[-1] < xmax:
        edges.append(edges[-1] * 2)
    bins: dict[int, list[int]] = {}
    for column, counts in enumerate((hist, res)):
        for calls, n in counts.items():
            bins.setdefault(bisect_right(edges, calls) - 1, [0, 0])[column] += n
    return edges, bins


def _dashed(kind: str, placed: list[tuple[float, str, str, int]], groups: list[list[tuple[str, str]]],
            bottom: float) -> list[str]:
    """A dashed line per ``(name, color)`` of each group, from its label's lane (``lanes``) down to
    ``bottom``, and the group's label; ``kind``: the class (``threshold``, ``cap``)."""
    parts = []
    for (x, label, anchor, lane), group in zip(placed, groups, strict=True):
        y = 8 + LANE_H * lane
        parts += [f'<line class="{kind}" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{bottom}" stroke="{color}" '
                  f'stroke-width="1.5" stroke-dasharray="4 3"><title>{esc(name)}</title></line>'
                  for name, color in group]
        tx = x + 2 if anchor == "start" else x - 2
        parts.append(f'<text class="{kind}-label" x="{tx:.1f}" y="{y + 9}" text-anchor="{anchor}" '
                     f'fill="{group[0][1]}">{esc(label)}</text>')
    return parts


def grid_thresholds(stats: RunStats) -> list[tuple[str, float, str]]:
    """Every distinct cap of the grid, labelled (read back from the policies' parameters)."""
    out: dict[tuple[str, float], str] = {}
    for p in stats.policies:
        params = p["params"]
        if params.get("cap_mode") == "explicit":
            n = params["hard_cap"]
            out[(f"explicit {n}", n)] = COLORS["explicit"]
        elif params.get("cap_mode") == "adaptive":
            s, m, h = params["soft_cap"], params["multiplier"], params["hard_cap"]
            out[(f"S={s}", s)] = COLORS["soft_stuck"]
            out[(f"{s}x{m:g}={h}", h)] = COLORS["hard_backstop"]
    return [(label, value, color) for (label, value), color in out.items()]


def table_html(data: list[dict[str, Any]]) -> str:
    head = ("<tr><th class='l'>policy</th><th class='l'>cap</th><th class='l'>streak</th><th>halted</th>"
            "<th>censored</th><th class='l'>by threshold</th><th>halts with a recorded future</th>"
            "<th>resolved halted</th><th>unresolved halted</th><th>calls saved</th>"
            "<th>median halt call</th><th>median position</th><th>attended asks</th><th>turns asked</th></tr>")
    body = []
    for r in data:
        cls = "default" if r["default"] else r["family"]
        censored = ", ".join(f"{c} {n:,}" for c, n in sorted(r["censored_by_cohort"].items()) if n)
        sources = ", ".join(f"{c} {n:,}" for c, n in sorted(r["evidence_by_source"].items()) if n)
        body.append(
            f"<tr class='{cls}'><td class='l'>{esc(r['name'])}</td><td class='l'>{esc(r['cap'])}</td>"
            f"<td class='l'>{esc(r['streak'])}</td><td>{r['halted']:,}</td>"
            f"<td title='{esc(censored)}'>{r['censored']:,}</td>"
            f"<td class='l'>{esc(thresholds_text(r['by_threshold']))}</td>"
            f"<td title='{esc(sources)}'>{r['evidence_halts']:,}</td><td>{esc(resolved_text(r))}</td>"
            f"<td>{r['halted_unresolved']:,}</td><td>{r['saved_unresolved']:,}</td>"
            f"<td>{'-' if r['median_halt_call'] is None else r['median_halt_call']}</td>"
            f"<td>{esc(r['median_position'])}</td><td>{r['asks']:,}</td><td>{r['turns_with_asks']:,}</td>"
            "</tr>")
    return f"<table id='figures'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"


def fp_html(data: list[dict[str, Any]]) -> str:
    ids, more = default_unresolved(data)
    unresolved = ""
    if ids:
        unresolved = ("<h2>Unresolved turns the default halts</h2><p id='default-halts'>"
                      + esc(", ".join(ids)) + (f" ... ({more} more)" if more > 0 else "") + "</p>")
    return unresolved + _fp_list(data)


def _fp_list(data: list[dict[str, Any]]) -> str:
    items = [f"<li><b>{esc(r['name'])}</b> ({r['halted_resolved']:,}): {esc(', '.join(r['resolved_ids']))}"
             f"{' ...' if r['halted_resolved'] > len(r['resolved_ids']) else ''}</li>"
             for r in data if r["halted_resolved"]]
    if not items:
        return "<h2>Resolved turns halted</h2><p>None: no policy halts a resolved turn.</p>"
    return "<h2>Resolved turns halted (false-positive proxy)</h2><ul id='fp-ids'>" + "".join(items) + "</ul>"


def render(stats: RunStats) -> str:
    """The whole page."""
    data = rows(stats)
    summary = (f"{stats.turns:,} turns, {stats.calls:,} tool calls ({stats.resolved:,} resolved, "
               f"{stats.unresolved:,} unresolved, {stats.unknown:,} unknown), {len(data)} policies, "
               f"{stats.problems:,} input problems. Inputs: {', '.join(stats.inputs) or '-'}."
               + (f" {censoring_text(stats)}" if censoring(stats) else ""))
    charts = "\n".join([
        halts_chart(data), saved_chart(data), asks_chart(data), position_chart(data),
        distribution_chart(stats, grid_thresholds(stats)),
        survival_chart(stats.survival, stats.survival_json(), stats.caps()) if stats.survival.censored else "",
    ])
    template = Template(resources.files("turnguard._calibrate").joinpath("report.html").read_text(encoding="utf-8"))
    return template.substitute(summary=esc(summary), charts=charts, table=table_html(data),
                               fps=fp_html(data) + evidence_html(stats.probe, stats.context(), turns=stats.turns,
                                                                 calls=stats.calls,
                                                                 default_limits=default_limits(stats.default_params)))


# -- placing text in the charts ---------------------------------------------------------------------

CHAR_W = 7.0
"""Width of one character of the charts' 11 px sans-serif text, a little over its average: label
positions are planned with it so that no two labels overlap and none leaves its chart."""
LANE_H = 12
LABEL_GAP = 6


def text_width(text: str) -> float:
    return len(text) * CHAR_W


def label_width(data: list[dict[str, Any]]) -> float:
    """The room left of the bars for the longest policy name (bold for the default)."""
    return max([120.0, *(text_width(r["name"]) * (1.1 if r["default"] else 1) + 12 for r in data)])


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
    """Each ``(x, label)`` in the first lane where it overlaps no other label and below every label
    its line would cross: ``(x, label, text-anchor, lane)``; past ``hi``, drawn left of its x."""
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
    """Ticks ``(value, label)`` from 0 to at least ``top`` at 1, 2 or 5 times a power of ten, at most
    ``MAX_STEPS``, at least 1 for counts; the last tick is the axis' end. Computed in decimal, so a
    label is ``0.3``, never ``0.30000000000000004``."""
    span = Decimal(repr(float(top))) if top > 0 else Decimal(1)
    power = Decimal(10) ** math.floor(math.log10(span / MAX_STEPS))
    step = next(m * power for m in (1, 2, 5, 10) if m * power * MAX_STEPS >= span)
    if whole:
        step = max(step, Decimal(1))
    count = math.ceil(span / step)
    return [(float(k * step), f"{(k * step).normalize():,f}") for k in range(count + 1)]


# -- the survival chart ----------------------------------------------------------------------------

CURVE = "#2f7ebd"
BAND = "rgba(47,126,189,0.18)"
LIVE_CAP, PROBE_CAP = "#c23b3b", "#7b4fa0"


def curve_points(survival: Survival, top: int) -> list[tuple[int, float, float, float]]:
    """``(n, S, low, high)`` at 0, every event count up to ``top``, every censoring before the first
    event, and ``top``; the band is the table's (``survival_interval``)."""
    steps = survival.steps()
    first = steps[0].t if steps else top + 1
    seen = survival.turns
    points = []
    for t in sorted({0, *(c for c in survival.censored if c < first)}):
        if t > top:
            break
        seen -= survival.censored.get(t, 0)
        band = survival_interval(1.0, 0.0, seen, 0)
        points.append((t, 1.0, band.low, band.high))
    finished = 0
    for step in steps:
        if step.t > top:
            break
        finished += step.events
        past = step.at_risk - step.events - survival.censored.get(step.t, 0)
        band = survival_interval(step.survival, step.greenwood, past, finished)
        points.append((step.t, step.survival, band.low, band.high))
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
    return [f'<polygon class="band" points="{upper} {lower}" fill="{BAND}" stroke="none"><title>95% interval '
            '(log-log; exact where no turn finished, or every one)</title></polygon>',
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


def survival_chart(survival: Survival, est: dict[str, Any], caps: dict[str, int | None]) -> str:
    """The SVG chart with its heading, caption and figures (empty without turns or a horizon)."""
    if not est["turns"] or not est["horizon"]:
        return ""
    horizon = est["horizon"]
    xmax = max([horizon, *(c for c in caps.values() if c)]) * 1.15
    probe = _Frame(0, xmax)
    marks = [(probe.x(c), f"{name} cap {c:,}", color) for name, c, color in
             (("live", caps.get("live"), LIVE_CAP), ("probe", caps.get("probe"), PROBE_CAP)) if c]
    placed = lanes([(x, label) for x, label, _ in marks], 0, probe.width)
    colors = {label: color for _, label, color in marks}
    frame = _Frame(8 + LANE_H * (max((lane for *_, lane in placed), default=-1) + 1) + 6, xmax)
    height = frame.top + frame.plot_h + 50
    parts = [_svg("chart-survival", "share of turns needing more calls", frame.width, height),
             *_axes(frame), *_curve(frame, curve_points(survival, horizon)),
             *_dashed("cap", placed, [[(label, colors[label])] for _, label, *_ in placed], frame.top + frame.plot_h),
             f'<text x="{(frame.left + frame.width - frame.right) / 2}" y="{height - 12}" text-anchor="middle">'
             "tool calls (log scale)</text></svg>"]
    text = "".join(f"<li>{html.escape(line)}</li>" for line in survival_lines(est)[1:])
    return ("<h2 id='survival'>How many calls turns need</h2><figure>" + "".join(parts) +
            "<figcaption>The share of turns that need more than n calls (Kaplan-Meier, live and probe turns "
            "together), with its 95% band (log-log; the exact binomial bound where no turn finished yet, or every "
            "one did, as in the table), drawn up to the highest cap turns ran under and not past it; the "
            f"dashed lines are the live and the probe caps. {html.escape(ended(est))}.</figcaption></figure>"
            f"<ul id='survival-figures'>{text}</ul>")
