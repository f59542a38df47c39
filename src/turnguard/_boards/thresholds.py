"""The **Threshold validation** board: are the thresholds right for this traffic? How turns spread
against S and the backstop S×m, what a lower backstop would cut, what the turns halted at the
backstop were doing, and the probe cohort's evidence past every live threshold, with its interval,
its decision against the operator's tolerance and a product-limit estimate past the backstop.

It reads the recording rules' series only. A turn halted at a threshold is censored there: its
recording says it needed more calls than that, not how many. Every figure that depends on such
turns says so (``censored`` in its description), a percentile carries the halted share beside it,
and a figure past a cap no turn could pass is not shown (past the live backstop only probe turns
are seen, and none past the probe's own cap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from grafana_foundation_sdk.builders import heatmap, text
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.heatmap import RowsHeatmapOptions, YAxisConfig
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import HeatmapCellLayout
from grafana_foundation_sdk.models.dashboard import DynamicConfigValue
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from turnguard._boards import evidence, horizon
from turnguard._boards import promql as q
from turnguard._boards import series as ps
from turnguard._boards.panels import (
    DATASOURCE,
    PanelBuilder,
    bars,
    base,
    legend,
    mapped,
    over_time,
    query,
    ref,
    stat_panel,
    stats,
    table_panel,
    with_panels,
)
from turnguard._boards.settings import DEFAULTS, CapSettings
from turnguard._config import GuardConfig
from turnguard._model import Threshold
from turnguard._probe import CENSORING_HALTS, judged
from turnguard.telemetry import _buckets as buckets
from turnguard.telemetry import _names as n

UID = "turnguard-threshold-validation"
SHADOW_PANEL_IDS = range(100, 200)
"""Panel ids reserved on the threshold-validation board for the shadow-policies row."""
BACKSTOP_MULTIPLES = (2, 3, 5, 10, 20)
"""The what-if backstops, as multiples of S (each is a bucket edge of the tool-calls histogram)."""
ADAPTIVE = {ps.CAP_MODE: "adaptive"}
PROBE_TURNS = {ps.COHORT: q.PROBE, ps.POLICY: q.PROBE_POLICY}
CENSORED = "censored"
"""The word every figure that depends on censored turns says (the lint checks it)."""
NO_FATE = "no probe turn with a known fate yet"
NEVER = ("never at these shares: the censored turns could go either way (raise the probe's cap), or the share is "
         "the tolerance")


def lower_multiples(cap: CapSettings) -> list[int]:
    """The what-if backstops live turns can answer for: at or below the live backstop (past it
    every live turn was halted, so a share there would only be the censoring)."""
    return [k for k in BACKSTOP_MULTIPLES if k * cap.soft_cap <= cap.hard_cap]


def _edges(cap: CapSettings) -> tuple[float, ...]:
    """The tool-call histogram's edges as the main configuration's guard exports them (its explicit
    cap N among them when it has one)."""
    return buckets.tool_call_edges_for(cap.soft_cap, cap.explicit_cap or cap.hard_cap)


def _cumulative(edge: float, **labels: str) -> str:
    return q.zero_or(q.recorded(f"{ps.TOOL_CALLS}_bucket", q.le_sel(edge, **labels)))


def _turns(**labels: str) -> str:
    return q.zero_or(q.recorded(ps.TURNS, q.sel(**labels)))


# -- tool calls per turn ----------------------------------------------------------------------------


def tool_calls_heatmap(cap: CapSettings) -> heatmap.Panel:
    """Adaptive-cap turns per bucket of tool calls, over time."""
    s, h = cap.soft_cap, cap.hard_cap
    return (
        heatmap.Panel().id(2).title(f"Tool calls per turn (soft cap {s}, backstop {h})")
        .description(f"Turns per bucket of tool calls. Rows at {s} (S) and {h} (the backstop) are the cap's "
                     "edges: turns above S continued only while not stuck. A halted turn sits at its halt, "
                     f"{CENSORED} there: the row above the backstop holds the turns halted at it, whatever they "
                     "would have needed.")
        .datasource(DATASOURCE).unit("short").no_value("0").height(9).span(12).calculate(False)
        .interval(q.RECORD_TILE).rows_frame(RowsHeatmapOptions().layout(HeatmapCellLayout.LE))
        .y_axis(YAxisConfig().unit("short").axis_label(f"tool calls per turn (S = {s}, backstop = {h})"))
        .with_target(query(q.recorded(f"{ps.TOOL_CALLS}_bucket", q.sel(**ADAPTIVE), by=("le",), window="$__interval"),
                           "{{le}}", instant=False).format(PromQueryFormat.HEATMAP))
    )


def percentiles(cap: CapSettings) -> PanelBuilder:
    """p50/p90/p99 of the turns that ended on their own, with the halted share beside them."""
    s, h = cap.soft_cap, cap.hard_cap
    ended = {**ADAPTIVE, **ps.NOT_HALTED}
    buckets_per_step = q.recorded(f"{ps.TOOL_CALLS}_bucket", q.sel(**ended), ("le",), "$__interval")
    targets = [
        query(f"histogram_quantile({p}, {buckets_per_step})", f"p{round(p * 100)} (turns not halted)", ref(i),
              instant=False)
        for i, p in enumerate((0.5, 0.9, 0.99))
    ]
    halted = (f"{q.recorded(ps.TURNS, q.sel(**ADAPTIVE, **ps.HALTED), window='$__interval')} / "
              f"{q.recorded(ps.TURNS, q.sel(**ADAPTIVE), window='$__interval')}")
    targets.append(query(halted, "halted share (right axis): left out above, censored at their halt", "D",
                         instant=False))
    return (
        over_time(3, "Tool calls per turn: percentiles vs S and the backstop, beside the halted share",
                  "Percentiles of the turns that were not halted. A halted turn is censored at its halt (it needed "
                  "more calls than that, nobody knows how many), so it is left out of them and its share is drawn "
                  "beside them (right axis): a low p99 with a high halted share says nothing about the turns that "
                  f"were halted. Dashed lines: the soft cap S = {s} (orange) and the backstop {h} (red).",
                  targets, unit="short", marks=((s, "orange"), (h, "red")))
        .max(h * 1.1).interval(q.RECORD_TILE)
        .override_by_query("D", [DynamicConfigValue("unit", "percentunit"), DynamicConfigValue("min", 0),
                                 DynamicConfigValue("max", 1),
                                 DynamicConfigValue("custom.axisPlacement", "right")])
    )


def _band_targets(cap: CapSettings) -> list[Dataquery]:
    targets = []
    for i, (low, high) in enumerate(cap.bands()):
        if high is None:
            expr = f"{_turns(**ADAPTIVE)} - {_cumulative(low, **ADAPTIVE)}"
            name = f"> {low} (halted at the backstop: {CENSORED})"
        elif low == 0:
            expr, name = _cumulative(high, **ADAPTIVE), f"≤ {high} (within S)"
        else:
            expr = f"{_cumulative(high, **ADAPTIVE)} - {_cumulative(low, **ADAPTIVE)}"
            name = f"{low + 1}–{high} (up to {high / cap.soft_cap:g}×S)"
        targets.append(query(expr, name, ref(i)))
    return targets


def calls_row(cap: CapSettings) -> list[PanelBuilder]:
    return [
        tool_calls_heatmap(cap),
        percentiles(cap),
        bars(4, "Turns by tool-call band",
             "Turns ended, by how many tool calls they made, in bands of S. A halted turn counts in the band of "
             f"its halt, {CENSORED} there; the last band is the backstop's halts.", _band_targets(cap),
             width=24, height=7),
    ]


# -- what a lower backstop would cut ----------------------------------------------------------------


def _cut_targets(cap: CapSettings, **labels: str) -> list[Dataquery]:
    count = _turns(**labels)
    return [query(f"1 - {_cumulative(k * cap.soft_cap, **labels)} / {count}", f"{k}×S ({k * cap.soft_cap} calls)",
                  ref(i)) for i, k in enumerate(lower_multiples(cap))]


def lower_backstop_row(cap: CapSettings) -> list[PanelBuilder]:
    not_stuck = {**ADAPTIVE, ps.STUCK: "false"}
    return [
        stat_panel(11, "Turns not stuck", "Adaptive-cap turns in which no call repeated D times.",
                   q.recorded(ps.TURNS, q.sel(**not_stuck)), width=4),
        bars(12, "Not-stuck turns a backstop at k×S would cut",
             "Share of not-stuck turns that made more than k×S calls, for k up to the live backstop (the turns "
             f"halted at it are in every k, {CENSORED} there: past it the live cohort shows nothing; the probe "
             "row does).", _cut_targets(cap, **not_stuck), unit="percentunit", width=10),
        bars(13, "…of those that ended on their own (false kills)",
             "The same, for not-stuck turns that were not halted: productive long turns a lower backstop would "
             f"have killed. Halted turns are left out ({CENSORED}: what they would have done is unknown).",
             _cut_targets(cap, **not_stuck, **ps.NOT_HALTED), unit="percentunit", width=10),
    ]


# -- turns halted at the backstop ----------------------------------------------------------------------


def backstop_row(cap: CapSettings) -> list[PanelBuilder]:
    """The turns halted at the backstop: what they cost, whether the stuck signal had flagged them, and
    beside them what the probe cohort says such turns would have done."""
    s, h = cap.soft_cap, cap.hard_cap
    backstop = q.sel(**{ps.THRESHOLD: Threshold.HARD_BACKSTOP})
    calls, turns = q.zero_or(q.recorded(ps.CALLS, backstop)), q.zero_or(q.recorded(ps.TURNS, backstop))
    flagged = q.zero_or(q.recorded(f"{ps.FIRST_STUCK}_count", backstop))
    first_stuck_mean = (f"{q.recorded(f'{ps.FIRST_STUCK}_sum', by=(ps.THRESHOLD,))} / "
                        f"{q.recorded(f'{ps.FIRST_STUCK}_count', by=(ps.THRESHOLD,))}")
    panels = [
        stat_panel(21, "Turns halted at the backstop",
                   f"Turns halted at call {h + 1}. Halted at the backstop says what stopped them, not what they "
                   "were doing: the probe's resolved share beside says how many such turns would have succeeded.",
                   q.recorded(ps.TURNS, backstop)),
        stat_panel(22, "Calls they made", "Tool calls checked in those turns.", calls),
        stat_panel(23, "…of which past the soft cap", f"Calls beyond S = {s} in those turns.",
                   f"{calls} - {s} * {turns}"),
        stat_panel(24, "Flagged stuck earlier", "Of those turns, how many met the stuck signal before the "
                   "backstop (the repeat signal halts them at S, so normally 0).", flagged),
        stat_panel(25, "Calls the stuck signal would have saved",
                   "For those flagged turns: calls made after the stuck signal first held.",
                   f"{calls} * {flagged} / clamp_min({turns}, 1) - "
                   f"{q.zero_or(q.recorded(f'{ps.FIRST_STUCK}_sum', backstop))}"),
        bars(26, "When stuck turns were first flagged",
             f"Mean call at which the stuck signal first held, by how the turn ended (S = {s}).",
             [query(first_stuck_mean, legend(ps.THRESHOLD))], width=4, height=4),
    ]
    return [*panels, backstop_evidence(cap)]


BESIDE_THE_BACKSTOP = ("resolved share", "95% low", "95% high", "decision", "more probe turns", "time at this rate")
"""The probe evidence shown beside the backstop's halts (its row of the evidence table)."""


def backstop_evidence(cap: CapSettings) -> PanelBuilder:
    columns = evidence.probe_rows(cap, (Threshold.HARD_BACKSTOP,))
    panel = stats(27, "Probe: resolved share of the turns the backstop would have halted",
                  "Probe turns the live backstop would have halted, that went on under the probe: the share whose "
                  "task was resolved, its 95% Wilson interval, whether that decides against the Tolerance "
                  "variable, and if not the probe turns and time it still needs (the probe evidence table below "
                  "has the counts).",
                  [query(columns[name], name, ref(i)) for i, name in enumerate(BESIDE_THE_BACKSTOP)],
                  unit="percentunit", width=12)
    decision, more, time = (ref(BESIDE_THE_BACKSTOP.index(name)) for name in BESIDE_THE_BACKSTOP[3:])
    return (panel
            .override_by_query(decision, [DynamicConfigValue("unit", "none"), DynamicConfigValue(
                "mappings", mapped({int(k): v for k, v in evidence.DECISION_TEXT.items()}, nan=NO_FATE))])
            .override_by_query(more, [DynamicConfigValue("unit", "short"),
                                      DynamicConfigValue("mappings", mapped({}, nan=NO_FATE, infinite=NEVER))])
            .override_by_query(time, [DynamicConfigValue("unit", "s"),
                                      DynamicConfigValue("mappings", mapped({}, nan=NO_FATE, infinite=NEVER))]))


# -- repeats against D -----------------------------------------------------------------------------


def _repeat_targets(cap: CapSettings) -> list[Dataquery]:
    """Long turns only (past S: the ones the stuck signal judges), by how they ended."""
    d = cap.stuck_repeat_threshold
    long = {ps.PAST_SOFT_CAP: "true"}
    targets = []
    for i, (name, labels) in enumerate((("ended on its own", {ps.THRESHOLD: n.NO_THRESHOLD, **long}),
                                        ("halted: stuck past S", {ps.THRESHOLD: Threshold.SOFT_STUCK, **long}),
                                        ("halted at the backstop", {ps.THRESHOLD: Threshold.HARD_BACKSTOP, **long}))):
        below = q.zero_or(q.recorded(f"{ps.MAX_REPEAT}_bucket", q.le_sel(d - 2, **labels)))
        near = q.zero_or(q.recorded(f"{ps.MAX_REPEAT}_bucket", q.le_sel(d - 1, **labels)))
        count = q.zero_or(q.recorded(f"{ps.MAX_REPEAT}_count", q.sel(**labels)))
        targets += [
            query(below, f"{name}: max repeat < {d - 1}", ref(3 * i)),
            query(f"{near} - {below}", f"{name}: max repeat = {d - 1} (one short of D)", ref(3 * i + 1)),
            query(f"{count} - {near}", f"{name}: max repeat ≥ {d} (stuck)", ref(3 * i + 2)),
        ]
    return targets


def repeats_row(cap: CapSettings) -> list[PanelBuilder]:
    s, d = cap.soft_cap, cap.stuck_repeat_threshold
    return [bars(31, f"Long turns (past S = {s}): max key repeat vs D = {d}, by how the turn ended",
                 f"Turns that made more than S = {s} calls only (turnguard.turn.past_soft_cap). Productive long "
                 "turns stay below D (one short of D = a near miss); turns halted stuck past S are at or above it. "
                 f"A halted turn's repeats are {CENSORED} at its halt: it might have repeated more.",
                 _repeat_targets(cap), width=24, height=10)]


# -- the probe cohort --------------------------------------------------------------------------------


def _late_buckets(cap: CapSettings, above: int) -> str:
    """A regex of the results counter's call buckets (``turnguard.turn.tool_calls_bucket``) past ``above``."""
    return "~(" + "|".join([*(f"{e:g}" for e in _edges(cap) if e > above), "\\\\+Inf"]) + ")"


SEEN_HIGH, SET_HERE = "productive seen, 95% high", "backstop here spares them"
"""Panel 41's frontier columns (calibrate's recommended value: the first row that spares them)."""
PAST_COLUMNS = ("turns", "resolved", "unresolved", "censored", "cut", "unknown")
"""``censored``: halted at a length limit of the probe's, not productive at either bound's end;
``cut``: halted by a loop detector of the probe's own run below twice the main's value
(``evidence.ProbeHalts``), productive at the high end (calibrate's frontier rule)."""


def _past(cap: CapSettings, edge: int, short_of: str | None = None, **labels: str) -> dict[str, str]:
    """Probe turns that made more than ``edge`` calls (a bucket edge), by fate: a result reported in
    the turn, or later on the results counter (its call bucket places it); ``short_of``: as ``_fates``."""

    def past(**more: str) -> str:
        return f"({_turns(**PROBE_TURNS, **labels, **more)} - {_cumulative(edge, **PROBE_TURNS, **labels, **more)})"

    def late(**more: str) -> str:
        accepted = {**PROBE_TURNS, ps.RESULT_STATUS: "accepted", ps.CALLS_BUCKET: _late_buckets(cap, edge)}
        return q.zero_or(q.recorded(ps.RESULTS, q.sel(**accepted, **more)))

    return _fates(past, late, evidence.ProbeHalts.of(cap), short_of)


def _with_frontier(row: dict[str, str], spares: str) -> dict[str, str]:
    known = f"({row['resolved']} + {row['unresolved']} + {row['censored']} + {row['cut']})"
    productive = f"({row['resolved']} + {row['cut']})"
    return {**row, SEEN_HIGH: evidence.productive_high(productive, known),
            spares: evidence.within_seen(productive, known)}


def live_multiple(cap: CapSettings) -> int | None:
    """The live backstop's whole multiple of S (``None`` for a fractional one: calibrate's backstop
    frontier reads whole multiples only)."""
    return int(cap.hard_multiplier) if float(cap.hard_multiplier).is_integer() else None


def past_multiples(cap: CapSettings) -> list[int]:
    """Panel 41's multiples k: ``BACKSTOP_MULTIPLES``, and 1 (a backstop at S) where it is the live
    one: calibrate judges its ladder's first step only as the live value (``_probe.judged``)."""
    return [k for k in (1, *BACKSTOP_MULTIPLES) if judged(k, live_multiple(cap))]


def past_rows(cap: CapSettings) -> dict[str, str]:
    """Per column, a vector by ``multiple`` (one row per k of ``past_multiples``): probe turns that made
    more than k×S calls, and what became of them (a result reported in the turn, or later on the
    results counter); a backstop there spares them only where the probe's own cap is not too low
    (calibrate's horizon rule, as on panels 49 and 50), which a board that knows the probe says."""
    rows = {str(k): _with_frontier(_past(cap, k * cap.soft_cap, short_of=AT_THE_HARD_CAP), SET_HERE)
            for k in past_multiples(cap)}
    columns = {name: q.rows("multiple", {k: row[name] for k, row in rows.items()})
               for name in (*PAST_COLUMNS, SEEN_HIGH, SET_HERE)}
    if cap.probe is not None:
        columns[SET_HERE], columns[LIMIT_TOO_LOW] = _horizon_columns(cap, "backstop", "multiple", rows, SET_HERE)
    return columns


def past_row_names(cap: CapSettings) -> dict[str, str]:
    names = {}
    for k in past_multiples(cap):
        edge = k * cap.soft_cap
        name = f"past {k}×S ({edge} calls{', the live backstop' if k == live_multiple(cap) else ''})"
        if cap.probe_sees_past(edge) is False:
            name += f": at or past the probe's cap, {CENSORED} (raise the probe's cap to see past it)"
        names[str(k)] = name
    return names


# -- the other caps' frontiers (panel 49) and what the board cannot show (panel 48) -----------------

SPARES = "value here spares them"
"""Panel 49's decision column, beside ``SEEN_HIGH``: the bound is under the tolerance."""
FRONTIER_SPREAD = (1.5, 2, 3, 5, 10)
"""The explicit and cycle caps shown beside the live one: the bucket edges nearest these multiples of it."""


def _backstop_of(cap: CapSettings, soft: int) -> int:
    return GuardConfig(soft_cap=soft, hard_multiplier=cap.hard_multiplier).hard_cap or 0


def soft_values(cap: CapSettings) -> list[int]:
    """The soft caps s panel 49 judges, the multiple and D held: k×S (k = 1, 2, 3, 5, 10) where s
    and its backstop are bucket edges, below the probe's own soft cap and its backstop over m (no
    probe turn is seen past them). None unless the probe raises S with the main configuration's
    stuck signal and D: its turns' ``stuck`` label is then the signal a soft cap s would halt on."""
    p = cap.probe
    if (p is None or Threshold.HARD_BACKSTOP not in cap.thresholds or p.soft_cap is None
            or p.soft_cap <= cap.soft_cap or p.stuck_signal != cap.stuck_signal
            or p.stuck_repeat_threshold != cap.stuck_repeat_threshold):
        return []
    edges = set(_edges(cap))
    return [k * cap.soft_cap for k in (1, 2, 3, 5, 10)
            if k * cap.soft_cap < p.soft_cap and {k * cap.soft_cap, _backstop_of(cap, k * cap.soft_cap)} <= edges
            and cap.probe_sees_past(_backstop_of(cap, k * cap.soft_cap))]


def _spread(live: int, seen: list[int]) -> list[int]:
    """``live`` and the values of ``seen`` nearest ``FRONTIER_SPREAD`` times it."""

    def nearest(target: float) -> int:
        return min(seen, key=lambda e: (abs(e - target), e))

    return sorted({live, *(nearest(f * live) for f in FRONTIER_SPREAD)})


def explicit_values(cap: CapSettings) -> list[int]:
    """The explicit caps panel 49 judges: the live N and the bucket edges nearest ``FRONTIER_SPREAD``
    times it that the probe's turns are seen past. None unless the live cap is explicit and the
    probe's is higher (or it has none)."""
    n = cap.explicit_cap
    if n is None or cap.probe is None or not cap.probe_sees_past(n):
        return []
    return _spread(n, [int(e) for e in _edges(cap) if e >= n and cap.probe_sees_past(int(e))])


def _cycle_edges(cap: CapSettings) -> tuple[float, ...]:
    """The model-request histogram's edges as the main configuration's guard exports them (its cycle
    cap M among them)."""
    return buckets.cycle_edges(GuardConfig(max_cycles_per_turn=cap.cycle_cap or 0))


def cycle_values(cap: CapSettings) -> list[int]:
    """The cycle caps panel 49 judges: the live M and the request-histogram edges nearest
    ``FRONTIER_SPREAD`` times it that the probe's turns are seen past. None unless the live
    configuration has a cycle cap and the probe's is higher (or unbounded)."""
    m = cap.cycle_cap
    if m is None or not cap.probe_sees_past_cycles(m):
        return []
    return _spread(m, [int(e) for e in _cycle_edges(cap) if e >= m and cap.probe_sees_past_cycles(int(e))])


def _turns_past(cap: CapSettings, edge: int, **labels: str) -> str:
    return f"({_turns(**PROBE_TURNS, **labels)} - {_cumulative(edge, **PROBE_TURNS, **labels)})"


def _soft_row(cap: CapSettings, soft: int) -> dict[str, str]:
    """The probe turns a soft cap ``soft`` halts: past its backstop (every result, as in panel 41),
    and those its stuck signal halts below it, stuck and past ``soft`` (results in the turn only:
    the results counter has no stuck label, so one reported later leaves such a turn unknown)."""
    backstop = _backstop_of(cap, soft)
    past = _past(cap, backstop, short_of=Threshold.HARD_BACKSTOP.value)
    stuck = {ps.STUCK: "true"}

    def below(**labels: str) -> str:
        return f"({_turns_past(cap, soft, **stuck, **labels)} - {_turns_past(cap, backstop, **stuck, **labels)})"

    halts = evidence.ProbeHalts.of(cap)
    false = {ps.RESOLVED: "false"}
    return {"turns": f"({past['turns']} + {below()})",
            "resolved": f"({past['resolved']} + {below(**{ps.RESOLVED: 'true'})})",
            horizon.RESOLVED_SHORT: f"({past[horizon.RESOLVED_SHORT]} + {below(**{ps.RESOLVED: 'true'})})",
            "unresolved": f"({past['unresolved']} + {below(**halts.other, **false)})",
            "censored": f"({past['censored']} + {below(**halts.length, **false)})",
            "cut": f"({past['cut']} + {_cut(halts, lambda **more: below(**more, **false), below)})",
            "unknown": f"({past['unknown']} + {below(**{ps.RESOLVED: 'unknown'})})"}


AT_THE_HARD_CAP = f"{Threshold.EXPLICIT.value}|{Threshold.HARD_BACKSTOP.value}"
"""The halts of the probe's own hard cap (explicit, or its backstop): past every explicit cap judged."""
AT_THE_CYCLE_CAP = {ps.THRESHOLD: Threshold.CYCLE_CAP.value}
"""Probe turns the probe's own cycle cap halted: past every value panel 49 judges (each is below it)."""
OTHER_LENGTH_LIMITS = "~" + "|".join(h for h in CENSORING_HALTS if h != Threshold.CYCLE_CAP.value)
"""The probe's other halts that censor a turn (``_probe.CENSORING_HALTS``): below every value judged."""


def _cut(halts: evidence.ProbeHalts, turns: Callable[..., str], every: Callable[..., str]) -> str:
    """``turns`` halted by a loop detector of ``halts.cut``; 0 (``every``'s turns times 0) where none cuts."""
    return turns(**halts.cutting) if halts.cutting is not None else f"(0 * {every()})"


def _cycle_row(cap: CapSettings, value: int) -> dict[str, str]:
    """The probe turns a cycle cap ``value`` halts: those that made more than ``value`` model
    requests (the request histogram's buckets). A result reported after the turn carries no request
    count: it counts for the turns the probe halted at its own cycle cap (past every value; the
    results counter names the threshold that ended the turn), and leaves any other turn unknown."""

    def past(**labels: str) -> str:
        every = q.zero_or(q.recorded(f"{ps.CYCLES}_bucket", q.sel(**PROBE_TURNS, **labels, le="+Inf")))
        return f"({every} - {q.zero_or(q.recorded(f'{ps.CYCLES}_bucket', q.le_sel(value, **PROBE_TURNS, **labels)))})"

    def late(**labels: str) -> str:
        accepted = {**PROBE_TURNS, ps.RESULT_STATUS: "accepted", **AT_THE_CYCLE_CAP}
        return q.zero_or(q.recorded(ps.RESULTS, q.sel(**accepted, **labels)))

    true, false = {ps.RESOLVED: "true"}, {ps.RESOLVED: "false"}
    not_at_cap = {ps.THRESHOLD: "!" + Threshold.CYCLE_CAP.value}
    halts = evidence.ProbeHalts.of(cap)
    return {"turns": past(),
            "resolved": f"({past(**true)} + {late(**true)})",
            horizon.RESOLVED_SHORT: past(**not_at_cap, **true),
            "unresolved": past(**halts.other, **false),
            "cut": _cut(halts, lambda **more: past(**more, **false), past),
            "censored": (f"({past(**{ps.THRESHOLD: OTHER_LENGTH_LIMITS}, **false)} + "
                         f"{past(**AT_THE_CYCLE_CAP, **{ps.RESOLVED: '~false|unknown'})} - {late(**true)})"),
            "unknown": past(**not_at_cap, **{ps.RESOLVED: "unknown"})}


def cap_frontier_rows(cap: CapSettings) -> dict[str, dict[str, str]]:
    """Row key -> column -> expression: panel 49's rows (the soft caps of ``soft_values``, the
    explicit caps of ``explicit_values``, the cycle caps of ``cycle_values``), each with panel 41's
    frontier columns."""
    rows = {f"soft:{v}": _with_frontier(_soft_row(cap, v), SPARES) for v in soft_values(cap)}
    rows |= {f"explicit:{v}": _with_frontier(_past(cap, v, short_of=AT_THE_HARD_CAP), SPARES)
             for v in explicit_values(cap)}
    rows |= {f"cycles:{v}": _with_frontier(_cycle_row(cap, v), SPARES) for v in cycle_values(cap)}
    return rows


def _row_names(kind: str, values: list[int], live: int | None, name: Callable[[int, str], str]) -> dict[str, str]:
    """A frontier table's row names for one kind (``kind:v`` -> ``name(v, mark)``), the mark
    ``" (live)"`` on the main configuration's own value."""
    return {f"{kind}:{v}": name(v, " (live)" if v == live else "") for v in values}


def cap_frontier_names(cap: CapSettings) -> dict[str, str]:
    return (_row_names("soft", soft_values(cap), cap.soft_cap,
                       lambda v, live: f"soft cap {v}{live}: past {v} and stuck, or past {_backstop_of(cap, v)}")
            | _row_names("explicit", explicit_values(cap), cap.explicit_cap,
                         lambda v, live: f"explicit cap {v}{live}: past {v} calls")
            | _row_names("cycles", cycle_values(cap), cap.cycle_cap,
                         lambda v, live: f"cycle cap {v}{live}: past {v} model requests"))


FRONTIER_KINDS = {
    "soft": ("soft", "the soft cap (the multiple and D held)",
             "A soft cap s halts a turn past its backstop s×m, or past s and stuck: a result reported after the "
             "turn is placed by its call bucket, so it counts past the backstop only; a stuck turn below it whose "
             "result came later stays unknown here (`turnguard calibrate` places it)."),
    "explicit": ("explicit", "the explicit cap",
                 "An explicit cap N halts a turn past N calls: a result reported after the turn is placed by its "
                 "call bucket."),
    "cycles": ("cycle", "the cycle cap (max_cycles_per_turn, model requests per turn)",
               "A cycle cap c halts a turn that began model request c + 1 (the request histogram's buckets place "
               "it). A result reported after the turn carries no request count: it counts for the turns the "
               "probe halted at its own cycle cap (past every value here; the results counter names the "
               "threshold that ended the turn), and any other turn past c whose result came later stays "
               "unknown here, as does one halted at the probe's backstop or explicit cap with no result in the "
               "turn (`turnguard calibrate` places them)."),
}
"""Per kind of panel 49's rows: its name in the title, what a value of it is, how its turns are placed."""


def _listed(words: list[str], last: str) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def cap_frontier(cap: CapSettings) -> PanelBuilder | None:
    def texts(kinds: list[tuple[str, str, str]], named: str) -> tuple[str, str]:
        return (f"Probe frontier of the {named} cap{'s' if len(kinds) > 1 else ''}",
                f"{' '.join(k[2] for k in kinds)} Only values the probe's turns are seen past are rows.")

    return _frontier_table(cap, 49, FRONTIER_KINDS, cap_frontier_rows(cap), cap_frontier_names(cap), 7, texts,
                           rule="", first="its first step")


_Kind = TypeVar("_Kind", tuple[str, str], tuple[str, str, str])
HORIZON_RULE = (
    "Probe's own limit too low (calibrate's rule, `evidence.horizon_too_low`): yes where, for a kind of row, the "
    "longest productive probe turn may end at or past 3/4 of the highest value calibrate judges below the probe's "
    f"own limit and turns that limit halted ({CENSORED}) reach the highest row with a resolved turn: productive "
    "turns it cut off would read as turns that never resolve, so no value of that kind spares them (raise the "
    "probe's limit). The board has rows at some values only, so it does not run calibrate's test of the values "
    "between that turn and the limit: it can say yes where calibrate, whose test shows productive turns had "
    "stopped ending, gives a value.")


def _frontier_table(cap: CapSettings, panel: int, kinds_by_key: dict[str, _Kind],
                    rows: dict[str, dict[str, str]], row_names: dict[str, str], height: int,
                    texts: Callable[[list[_Kind], str], tuple[str, str]], *, rule: str,
                    first: str) -> PanelBuilder | None:
    """A frontier table (panels 49 and 50): a row per value, the fates, the bound, spares or not;
    ``None`` without rows. ``kinds_by_key`` (``FRONTIER_KINDS``, ``COUNT_KINDS``) names each kind
    of row present (its first word in the title ``texts`` makes, its second in the description);
    ``texts`` gives the title and the description's last sentences."""
    if not rows:
        return None
    kinds = [kind for key, kind in kinds_by_key.items() if any(row.startswith(f"{key}:") for row in rows)]
    title, more = texts(kinds, _listed([k[0] for k in kinds], "and"))
    description = (
        f"Per value of {_listed([k[1] for k in kinds], 'or')}: the probe turns it would halt, by fate{rule}, and "
        f"panel 41's frontier: the upper bound of the productive share among them (the {CENSORED} counted as not "
        "productive, the cut as productive; the exact binomial bound 1 - 0.025^(1/N) with neither) and whether it "
        f"is under the Tolerance variable (calibrate recommends the smallest such value above {first}, and keeps a "
        f"live value at {first} that is one). {HORIZON_RULE} {more}")
    columns = {name: q.rows("value", {key: row[name] for key, row in rows.items()})
               for name in (*PAST_COLUMNS, SEEN_HIGH)}
    columns |= _judged_below_the_limit(cap, rows)
    return table_panel(panel, title, description, "value", columns, {SEEN_HIGH: "percentunit"}, width=24,
                       height=height, row_names=row_names,
                       mappings={SPARES: mapped({1: "yes", 0: "no"}, nan=NO_FATE),
                                 LIMIT_TOO_LOW: mapped({1: LIMIT_TOO_LOW_TEXT, 0: "no"})})


LIMIT_TOO_LOW = "probe's own limit too low"
"""Panels 41's, 49's and 50's column of calibrate's horizon rule (``horizon.limit_too_low``), per kind of row."""
LIMIT_TOO_LOW_TEXT = "yes: raise the probe's own limit (no value is within)"


def _judged_below_the_limit(cap: CapSettings, rows: dict[str, dict[str, str]]) -> dict[str, str]:
    """The ``SPARES`` and ``LIMIT_TOO_LOW`` columns: each kind's rows spare the productive turns only
    where the probe's own limit is not too low to tell them from turns that never resolve (``horizon``)."""
    spares, too_low = [], []
    for kind in dict.fromkeys(key.split(":")[0] for key in rows):
        keyed = {key: row for key, row in rows.items() if key.startswith(f"{kind}:")}
        judged, flagged = _horizon_columns(cap, kind, "value", keyed, SPARES)
        spares.append(judged)
        too_low.append(flagged)
    return {SPARES: " or ".join(spares), LIMIT_TOO_LOW: " or ".join(too_low)}


def _horizon_columns(cap: CapSettings, kind: str, label: str, rows: dict[str, dict[str, str]],
                     spares: str) -> tuple[str, str]:
    """The ``spares`` column of ``kind``'s rows (row key, ``kind:value`` or the value alone, ->
    column -> expression) by ``label``, 0 where the probe's own limit is too low
    (``horizon.limit_too_low``), and that flag on every row."""
    flag = horizon.limit_too_low(cap, kind, {int(key.rsplit(":", 1)[-1]): row for key, row in rows.items()})
    return (f"(({q.rows(label, {key: row[spares] for key, row in rows.items()})}) * scalar(1 - {flag}))",
            f"(({q.zeros(label, list(rows))}) + scalar({flag}))")


# -- D's and the streak stop's frontiers (panel 50) --------------------------------------------------


def _repeat_edges(cap: CapSettings) -> set[int]:
    """The repeat histogram's edges the main configuration's guard exports at least (its streak
    warn level, not known here, may add one)."""
    return {int(e) for e in buckets.repeat_edges(GuardConfig(stuck_repeat_threshold=cap.stuck_repeat_threshold,
                                                            streak_stop_at=cap.streak_stop_at, streak_warn_at=0))}


def _counted(values: list[int], histogram_edges: set[int], least: int) -> list[int]:
    """The values v of ``values`` both the histogram and the late results' fixed buckets place a
    turn against: ``v - 1`` an edge of each (a turn reaches v when it is past that edge), or v at
    most ``least``, the count every turn counted has (v reaches them all; no edge is below 1, so
    ``_reach_row`` finds no bucket at ``v - 1`` and counts none below)."""
    return [v for v in values if v <= least or (v - 1 in histogram_edges and v - 1 in buckets.COUNT_EDGES)]


def _judged(top: int, live: int) -> list[int]:
    """The values from 1 to ``top`` a frontier judges against the live value ``live`` (``_probe.judged``:
    1 only where it is the live one)."""
    return [v for v in range(1, top + 1) if judged(v, live)]


def stuck_values(cap: CapSettings) -> list[int]:
    """The values of D panel 50 judges: from 2 (1 where it is the live D, as calibrate does) up to the
    probe's own D (calibrate's horizon: the recorded limits do not name the probe's stuck signal, so
    whatever it is, past its D no probe turn is counted as seen), each a repeat count both the repeat
    histogram and the late results' buckets place a turn against (D = 1 reaches every turn past S:
    each made a call). None unless the main configuration's cap is adaptive
    with the ``repeat`` stuck signal (the signal calibrate's D frontier counts) and the probe has
    the same soft cap (the turns' ``past_soft_cap`` is then past the main S)."""
    p = cap.probe
    if (p is None or Threshold.SOFT_STUCK not in cap.thresholds or cap.stuck_signal != "repeat"
            or p.soft_cap != cap.soft_cap):
        return []
    top = p.stuck_repeat_threshold or None
    return _counted(_judged(top or buckets.COUNT_EDGES[-1] + 1, cap.stuck_repeat_threshold), _repeat_edges(cap), 1)


def streak_values(cap: CapSettings) -> list[int]:
    """The streak stops panel 50 judges: from 2 up to the probe's own (past it no probe turn's
    failing streak is seen), each placed by the failing-streak histogram and the late results'
    buckets. A live stop of 1, which calibrate judges, is not among them: those buckets hold a turn
    with no failure and one with a single failure together (``_count_note`` says so). None unless
    the main configuration's streak stop is on and a probe is configured."""
    p = cap.probe
    if p is None or Threshold.STREAK not in cap.thresholds:
        return []
    top = p.limit(Threshold.STREAK) or buckets.COUNT_EDGES[-1] + 1
    return _counted(_judged(top, cap.streak_stop_at), set(buckets.COUNT_EDGES), 0)


def _at_least(value: int) -> str:
    """A regex of the late results' count buckets (``buckets.count_bucket``) of counts ``>= value``."""
    return "~(" + "|".join([*(str(e) for e in buckets.COUNT_EDGES if e >= value), "\\\\+Inf"]) + ")"


def _past_soft_buckets(cap: CapSettings) -> str:
    """A regex of the results counter's call buckets past S, under the main configuration's edges or
    the probe's (the same S: the same edges up to it)."""
    probe_cap = cap.probe.hard_cap if cap.probe is not None else None
    edges = set(_edges(cap)) | set(buckets.tool_call_edges_for(cap.soft_cap, probe_cap))
    return "~(" + "|".join([*(f"{e:g}" for e in sorted(edges) if e > cap.soft_cap), "\\\\+Inf"]) + ")"


def _reach_row(cap: CapSettings, histogram: str, value: int, turn_labels: dict[str, str],
               late_labels: dict[str, str]) -> dict[str, str]:
    """The probe turns whose count (``histogram``: the repeat or failing-streak histogram, whose
    ``value - 1`` is an edge) reached ``value``, by fate: a result reported in the turn, or later
    on the results counter (its count bucket places it; a version 1 token's ``unknown`` bucket
    leaves its turn unknown)."""

    def reached(**more: str) -> str:
        every = q.zero_or(q.recorded(f"{histogram}_bucket", q.sel(**PROBE_TURNS, **turn_labels, **more, le="+Inf")))
        below = q.zero_or(q.recorded(f"{histogram}_bucket", q.le_sel(value - 1, **PROBE_TURNS, **turn_labels, **more)))
        return f"({every} - {below})"

    def late(**more: str) -> str:
        accepted = {**PROBE_TURNS, ps.RESULT_STATUS: "accepted", **late_labels}
        return q.zero_or(q.recorded(ps.RESULTS, q.sel(**accepted, **more)))

    return _fates(reached, late, evidence.ProbeHalts.of(cap))


def _fates(turns: Callable[..., str], late: Callable[..., str], halts: evidence.ProbeHalts,
           short_of: str | None = None) -> dict[str, str]:
    """A frontier row's columns by fate, from the probe turns a value halts (``turns``, by label)
    and their results reported after the turn (``late``): a late result moves a turn out of
    ``unknown`` (or, resolved, out of ``censored`` or ``cut``). ``short_of``: the halts (a regex of
    thresholds) of the probe's own limit that defines the last value judged; with it, the row also
    has ``horizon.RESOLVED_SHORT``, the resolved turns no such halt ended."""
    true, false, not_true = {ps.RESOLVED: "true"}, {ps.RESOLVED: "false"}, {ps.RESOLVED: "~false|unknown"}
    limited, other = halts.length, halts.other

    def halted(**where: str) -> str:
        return f"({turns(**where, **not_true)} - {late(**where, **true)})"

    short = {} if short_of is None else {
        horizon.RESOLVED_SHORT: f"({turns(**true, **{ps.THRESHOLD: f'!~{short_of}'})} + "
                                f"{late(**true, **{ps.THRESHOLD: f'!~{short_of}'})})"}
    return {"turns": turns(),
            "resolved": f"({turns(**true)} + {late(**true)})",
            **short,
            "unresolved": f"({turns(**other, **false)} + {late(**other, **false)})",
            "censored": halted(**limited),
            "cut": _cut(halts, halted, turns),
            "unknown": f"({turns(**other, **{ps.RESOLVED: 'unknown'})} - {late(**other)})"}


def count_frontier_rows(cap: CapSettings) -> dict[str, dict[str, str]]:
    """Row key -> column -> expression: panel 50's rows (``stuck:v`` for D = v: probe turns past S
    whose largest repeat count of one call reached v; ``streak:v`` for a streak stop v: probe turns
    whose longest failing streak reached v), each with panel 41's frontier columns."""
    past_s = {ps.PAST_SOFT_CAP: "true"}
    rows = {f"stuck:{v}": _with_frontier(_reach_row(cap, ps.MAX_REPEAT, v, past_s, {
        ps.CALLS_BUCKET: _past_soft_buckets(cap), ps.REPEAT_BUCKET: _at_least(v)}), SPARES) for v in stuck_values(cap)}
    rows |= {f"streak:{v}": _with_frontier(_reach_row(cap, ps.MAX_FAILING, v, {}, {ps.FAILING_BUCKET: _at_least(v)}),
                                           SPARES) for v in streak_values(cap)}
    return rows


def count_frontier_names(cap: CapSettings) -> dict[str, str]:
    return (_row_names("stuck", stuck_values(cap), cap.stuck_repeat_threshold,
                       lambda v, live: f"D = {v}{live}: past S = {cap.soft_cap}, a call repeated {v} or more times")
            | _row_names("streak", streak_values(cap), cap.streak_stop_at,
                         lambda v, live: f"streak stop {v}{live}: {v} or more identical failures in a row"))


COUNT_KINDS = {
    "stuck": ("D", "D (stuck_repeat_threshold: a probe turn past S whose most repeated call reached D)"),
    "streak": ("the streak stop", "the streak stop (streak_stop_at: a probe turn whose longest failing identical-call "
                                  "streak reached it)"),
}


def count_frontier(cap: CapSettings) -> PanelBuilder | None:
    def texts(kinds: list[tuple[str, str]], named: str) -> tuple[str, str]:
        return (f"Probe frontier of {named}",
                "A result reported in the turn is placed by the turn's repeat and failing-streak histograms; one "
                "reported later by the buckets its late result carries (a result token of version 1, made before "
                "they were added, carries none: its turn stays unknown here, `turnguard calibrate` places it). Only "
                "values up to the probe's own D and streak stop are rows: past them no probe turn is seen.")

    return _frontier_table(cap, 50, COUNT_KINDS, count_frontier_rows(cap), count_frontier_names(cap), 8, texts,
                           rule=" (calibrate's rule, `probe.frontier.stuck` / `.streak`)", first="1")


def _count_note(cap: CapSettings) -> str:
    """What the board says about D's and the streak stop's frontiers: on panel 50, or why not."""
    notes = []
    if Threshold.SOFT_STUCK in cap.thresholds:
        if stuck_values(cap):
            notes.append("D (stuck_repeat_threshold): its frontier is panel 50's `D = v` rows.")
        elif cap.stuck_signal != "repeat":
            notes.append(f"D: not judged here under the {cap.stuck_signal} stuck signal (the repeat histogram "
                         "counts the repeat signal's count); `turnguard calibrate` says whether it is probed "
                         "(`probe.frontier.stuck`).")
        else:
            notes.append("D (stuck_repeat_threshold): not judged here unless the board is built with `--config` for a "
                         "probe with the same soft cap (its turns' past_soft_cap is then past this S); "
                         "`turnguard calibrate` gives its recommended value (`probe.frontier.stuck`).")
    if Threshold.STREAK in cap.thresholds:
        if streak_values(cap):
            notes.append("The streak stop: its frontier is panel 50's `streak stop v` rows.")
            if cap.streak_stop_at == 1:
                notes.append("The live streak stop of 1 is not a row: the failing-streak buckets hold a turn with "
                             "no failure and one with a single failure together; `turnguard calibrate` judges it "
                             "(`probe.frontier.streak`).")
        else:
            notes.append("The streak stop: not judged here unless the board is built with `--config` for a probe; "
                         "`turnguard calibrate` gives its recommended value (`probe.frontier.streak`).")
    if stuck_values(cap) or streak_values(cap):
        notes.append("A late result reported with a version 1 result token carries no repeat count or failing "
                     "streak: its turn stays unknown in panel 50 (`turnguard calibrate` places every turn).")
    return " ".join(notes)


def _cap_note(cap: CapSettings) -> str:
    """What the board says about the soft, explicit and cycle caps' frontiers when panel 49 has no row
    for them (and, where it has the cycle cap's, which turns it cannot place)."""
    notes = []
    if Threshold.HARD_BACKSTOP in cap.thresholds and not soft_values(cap):
        notes.append("The soft cap: not judged here unless the probe raises S with the same stuck signal and D "
                     "(this board's configuration does not say so); `turnguard calibrate` says whether it is "
                     "probed (`probe.frontier.soft`).")
    if cap.explicit_cap is not None and not explicit_values(cap):
        notes.append("The explicit cap: not judged here unless the probe's cap is higher than the live "
                     f"{cap.explicit_cap} calls; `turnguard calibrate` says whether it is probed "
                     "(`probe.frontier.explicit`).")
    if cap.cycle_cap is not None and not cycle_values(cap):
        notes.append("The cycle cap: not judged here unless the probe's max_cycles_per_turn is higher than the "
                     f"live {cap.cycle_cap} model requests (or unbounded); `turnguard calibrate` says whether it is "
                     "probed (`probe.frontier.cycles`).")
    elif cap.cycle_cap is not None:
        notes.append("The cycle cap's rows in panel 49 leave unknown a turn whose result came after it, unless the "
                     "probe halted it at its own cycle cap (no request count comes with a late result); "
                     "`turnguard calibrate` places every such turn (`probe.frontier.cycles`).")
    return " ".join(notes)


def calibrate_only(cap: CapSettings) -> PanelBuilder:
    notes = " ".join(note for note in (_count_note(cap), _cap_note(cap)) if note)
    return (text.Panel().id(48).title("Frontiers this board judges, and where to find the others")
            .datasource(DATASOURCE)
            .description("Which thresholds' recommended values the recorded series give (panels 41, 49, 50), and "
                         "which only `turnguard calibrate` gives.")
            .content(notes or "Every probed threshold's frontier is on this board (panels 41, 49, 50).")
            .height(4).span(24))


def threshold_row_names(cap: CapSettings) -> dict[str, str]:
    live = {Threshold.HARD_BACKSTOP: f"backstop ({cap.hard_multiplier:g}×S = {cap.hard_cap} calls)",
            Threshold.SOFT_STUCK: f"stuck (D = {cap.stuck_repeat_threshold} repeats past S)",
            Threshold.STREAK: f"streak stop ({cap.streak_stop_at} identical failures)",
            Threshold.CYCLE_REPEAT: f"cycle repeat stop ({cap.cycle_repeat_stop_at} repetitions of a cycle)",
            Threshold.CYCLE_CAP: "cycle cap", Threshold.EXPLICIT: "explicit cap"}
    names = {}
    for threshold in cap.thresholds:
        name = live[threshold]
        limit = cap.probe.limit(threshold) if cap.probe else None
        if cap.probe is not None:
            name += f"; the probe's: {limit}" if limit else "; the probe has none"
            if cap.probe_stops_at(threshold):
                name += " (not past it: never within)"
        names[threshold.value] = name
    return names


def probe_row(cap: CapSettings) -> list[PanelBuilder]:
    continued = q.sel(**{ps.ANSWER: "continue"})
    probe = (f"the probe ({cap.probe.name}, {cap.probe.rate:g} of turns)" if cap.probe else
             "the probe cohort (GuardConfig(probe=...))")
    evidence_columns = evidence.probe_rows(cap, cap.thresholds)
    return [
        table_panel(44, "Probe evidence by live threshold: would the turns it halts have succeeded?",
                    f"One row per threshold the main configuration has in force. Turns of {probe} that the main "
                    "configuration, running beside them, would have halted there, and what became of them under "
                    "the probe: resolved; unresolved; censored (halted at a length limit of the probe's own, its "
                    "backstop, explicit or cycle cap, cycle_repeat stop or a failing plugin, or by a loop "
                    "detector of its own, D or streak stop, set below "
                    f"twice the main value, and not resolved: {CENSORED} there, they might have succeeded); "
                    "unknown (no result yet). The share resolved, and its 95% Wilson interval with "
                    "the censored turns counted as failures for its low end and as successes for its high end; "
                    "whether that decides against the Tolerance variable (above: the threshold halts more turns "
                    "that would have succeeded than you accept; within; undecided; never within at the probe's own "
                    "limit, where the probe halts them first and none is seen past it); if undecided, how many more "
                    "probe turns with a known fate it needs and how long they take at the rate they came in "
                    "(never, when the censored turns could go either way: raise the probe's cap); and the calls "
                    "they made past the threshold (the cost of raising it).",
                    ps.MAIN_THRESHOLD, evidence_columns, evidence.PROBE_COLUMN_UNITS, height=9,
                    row_names=threshold_row_names(cap),
                    mappings={"decision": mapped({int(k): v for k, v in evidence.DECISION_TEXT.items()},
                                                 nan=NO_FATE),
                              "more probe turns": mapped({}, nan=NO_FATE, infinite=NEVER),
                              "time at this rate": mapped({}, nan=NO_FATE, infinite=NEVER)}),
        table_panel(41, "Probe turns past k×S",
                    f"Turns of {probe} that made more than k×S calls (S = {cap.soft_cap}; the live backstop is "
                    f"{cap.hard_multiplier:g}×S; k = 1 only where that is the live backstop, as calibrate judges "
                    "its first step) and what became of them, counts only: the resolved share, its "
                    "interval and the decision are per threshold in the evidence table (its backstop row is the "
                    "probe turns past the backstop the main configuration would have halted). A probe turn "
                    f"halted at a length limit of the probe's is {CENSORED} there: past it, nothing is seen. "
                    "Productive seen, 95% high: the upper bound of the share of them that succeeded, the censored "
                    "counted as not productive (the productive turns the probe saw), the cut (halted by a loop "
                    "detector of the probe's own set below twice the main value: not seen to fail) as productive: "
                    "with none resolved or cut, the exact "
                    "binomial bound 1 - 0.025^(1/N) over the N with a known fate; a backstop here spares them when "
                    "that bound is under the Tolerance variable. The first such row below the probe's cap is "
                    "calibrate's recommended multiple on these rows (calibrate reads every multiple; past the "
                    "probe's cap, raising it only lets turns that never resolve burn longer)."
                    f"{f' {HORIZON_RULE}' if cap.probe is not None else ''}",
                    "multiple", past_rows(cap), {SEEN_HIGH: "percentunit"}, width=16, height=8,
                    row_names=past_row_names(cap),
                    mappings={SET_HERE: mapped({1: "yes", 0: "no"}, nan=NO_FATE),
                              **({LIMIT_TOO_LOW: mapped({1: LIMIT_TOO_LOW_TEXT, 0: "no"})}
                                 if cap.probe is not None else {})}),
        bars(43, "Attended \"continue\" answers, by threshold",
             "Users who were asked (ASK) and said the turn was fine, per threshold: the live false positives "
             "people saw.", [query(q.recorded(ps.ANSWERS, continued, by=(ps.THRESHOLD,)), legend(ps.THRESHOLD))],
             width=8),
        survival_panel(cap),
        calibrate_only(cap),
        *((frontier,) if (frontier := cap_frontier(cap)) is not None else ()),
        *((counts,) if (counts := count_frontier(cap)) is not None else ()),
    ]


def survival_panel(cap: CapSettings) -> PanelBuilder:
    """Kaplan-Meier: of the turns that reach the backstop, the share that would finish by k×S, with
    its 95% interval and the turns it rests on (never a bare 0% or 100%)."""
    names = {}
    for k in evidence.km_multiples(cap):
        edge = k * cap.soft_cap
        names[str(k)] = f"by {k}×S ({edge} calls)"
        if cap.probe_sees_past(edge - 1) is False:
            names[str(k)] += ": past the probe's cap, not estimable"
    cap_note = (f"the probe's own cap ({cap.probe.hard_cap} calls)" if cap.probe and cap.probe.hard_cap
                else "the probe's own cap")
    not_estimable = mapped({}, nan="not estimable: no turn was seen that far")
    units = {name: unit for name, unit in evidence.KM_COLUMN_UNITS.items() if unit != "short"}
    return table_panel(
        47, f"Of the turns that reach the backstop ({cap.hard_cap} calls), the share that would finish by k×S",
        "A product-limit (Kaplan-Meier) estimate over both cohorts, 1 - S(k×S)/S(backstop), from the "
        "tool-call histogram's buckets as the recording rules keep them by fate: a turn that completed "
        f"finished in its bucket; a turn halted by any threshold, cancelled or failed is {CENSORED} there "
        "and leaves the turns at risk. Its 95% interval: on the log-log scale (Greenwood's variance), and "
        "exact where the estimate is 0 or 1 (no turn finished: at most 1 - 0.05^(1/N), about 3/N, over the N "
        "turns seen past k×S; every turn at risk finished: at least 0.05^(1/N) over the N that finished). "
        "The turns it rests on: those seen past the backstop, and those still running at k×S. What it can "
        f"see: live turns carry it to the live backstop, probe turns past it, up to {cap_note} and never "
        "beyond; past that cap, or where no turn was seen that far, it is not estimable (raise the probe's "
        "cap to see further). Censoring by the stuck and streak thresholds is informative (those turns were "
        "likelier to fail), not independent, so read it as an estimate for turns like the ones that went on.",
        "multiple", evidence.km_rows(cap), units, height=6, row_names=names,
        mappings={name: not_estimable for name in evidence.KM_COLUMN_UNITS if name != "at risk past the backstop"})


# -- shadow policies ------------------------------------------------------------------------------


def shadow_policy_panels(cap: CapSettings) -> list[PanelBuilder]:
    """Panels of the shadow-policies row (ids from ``SHADOW_PANEL_IDS``): what each shadow policy
    (``GuardConfig.shadow``, evaluated on live traffic without acting) would have done, next to
    what the live policy did. A shadow's turn "halted" is its would-be halt."""
    halted = q.sel(**ps.HALTED)
    halt_action = q.sel(**{ps.ACTION: "halt"})
    policy = q.recorded(ps.SHADOW_TURNS, by=(ps.SHADOW_POLICY,))
    return [
        bars(101, "Halts by threshold: live policy vs each shadow policy",
             "Turns the live policy halted, and turns each shadow policy would have halted, by the threshold "
             "that fired. A shadow with fewer resolved-looking halts and as many stuck ones is a candidate.",
             [query(q.recorded(ps.TURNS, halted, by=(ps.THRESHOLD,)), f"live: {{{{{ps.THRESHOLD}}}}}", "A"),
              query(q.recorded(ps.SHADOW_TURNS, halted, by=(ps.SHADOW_POLICY, ps.THRESHOLD)),
                    legend(ps.SHADOW_POLICY, ps.THRESHOLD, sep=": "), "B")], width=12, height=9),
        bars(102, "Halted share: live vs each shadow policy",
             "Share of turns halted by the live policy, and the share each shadow policy would have halted.",
             [query(f"{q.recorded(ps.TURNS, halted)} / {q.recorded(ps.TURNS)}", "live", "A"),
              query(f"{q.recorded(ps.SHADOW_TURNS, halted, by=(ps.SHADOW_POLICY,))} / {policy}",
                    legend(ps.SHADOW_POLICY), "B")], unit="percentunit", width=6, height=9),
        bars(103, "Tool calls run: live vs allowed by each shadow",
             "Tool calls the live turns made, and how many each shadow policy would have let run before its "
             "would-be halts (the difference is what it would have saved, or cut).",
             [query(q.zero_or(q.recorded(ps.CALLS)), "live", "A"),
              query(q.recorded(ps.SHADOW_CALLS, by=(ps.SHADOW_POLICY,)), legend(ps.SHADOW_POLICY), "B")],
             width=6, height=9),
        bars(104, "Detections by threshold and level: live vs each shadow policy",
             "Every time a threshold fired (acted on or observed) live, and would have fired under each shadow.",
             [query(q.recorded(ps.DETECTIONS, by=(ps.THRESHOLD, ps.LEVEL)), f"live: {legend(ps.THRESHOLD, ps.LEVEL)}",
                    "A"),
              query(q.recorded(ps.SHADOW_DETECTIONS, by=(ps.SHADOW_POLICY, ps.THRESHOLD, ps.LEVEL)),
                    f"{{{{{ps.SHADOW_POLICY}}}}}: {legend(ps.THRESHOLD, ps.LEVEL)}", "B")], width=12, height=9),
        over_time(105, "Would-be halts over time, by shadow policy",
                  "Halting detections per second each shadow policy would have made (nothing was acted on).",
                  [query(q.recorded_per_second(ps.SHADOW_DETECTIONS, halt_action, by=(ps.SHADOW_POLICY,)),
                         legend(ps.SHADOW_POLICY), instant=False)], width=12).interval(q.RECORD_TILE),
    ]


def threshold_validation_dashboard(cap: CapSettings = DEFAULTS) -> Dashboard:
    """Are the thresholds right? Turns against S and S×m, and the probe's evidence past each threshold."""
    s, h, d = cap.soft_cap, cap.hard_cap, cap.stuck_repeat_threshold
    board = base(UID, "turnguard: threshold validation",
                 f"Production turns against the adaptive cap (soft cap S = {s}, backstop S×{cap.hard_multiplier:g} = "
                 f"{h}, stuck at {d} repeats, streak stop at {cap.streak_stop_at}) and the probe cohort's evidence "
                 "past each threshold. Built for one configuration: turnguard assets DIR --config turnguard.toml "
                 "renders it for yours.", ["turnguard", "agents", "calibration"], tolerance=evidence.DEFAULT_TOLERANCE)
    for row, title, panels in (
            (1, f"Tool calls per turn against the cap (S = {s}, backstop = {h})", calls_row(cap)),
            (10, "What a lower backstop would cut", lower_backstop_row(cap)),
            (20, "Turns halted at the backstop", backstop_row(cap)),
            (30, f"Repeats against the stuck threshold (D = {d})", repeats_row(cap)),
            (40, "Probe cohort: what happens past the live thresholds", probe_row(cap)),
            (SHADOW_PANEL_IDS[0], "Shadow policies", shadow_policy_panels(cap))):
        board = with_panels(board.with_row(Row(title).id(row)), panels)
    return board
