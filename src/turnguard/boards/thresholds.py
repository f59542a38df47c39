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

from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.heatmap import RowsHeatmapOptions, YAxisConfig
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import HeatmapCellLayout
from grafana_foundation_sdk.models.dashboard import DynamicConfigValue
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from turnguard.boards import evidence
from turnguard.boards import promql as q
from turnguard.boards.panels import (
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
from turnguard.boards.settings import DEFAULTS, CapSettings
from turnguard.config import GuardConfig
from turnguard.model import Threshold
from turnguard.telemetry import buckets
from turnguard.telemetry import names as n

UID = "turnguard-threshold-validation"
SHADOW_PANEL_IDS = range(100, 200)
"""Panel ids reserved on the threshold-validation board for the shadow-policies row."""
BACKSTOP_MULTIPLES = (2, 3, 5, 10, 20)
"""The what-if backstops, as multiples of S (each is a bucket edge of the tool-calls histogram)."""
ADAPTIVE = {q.CAP_MODE: "adaptive"}
PROBE_TURNS = {q.COHORT: q.PROBE, q.POLICY: q.PROBE_POLICY}
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
    return buckets.tool_call_edges(GuardConfig(soft_cap=cap.soft_cap, hard_multiplier=cap.hard_multiplier,
                                               stuck_repeat_threshold=cap.stuck_repeat_threshold))


def _cumulative(edge: float, **labels: str) -> str:
    return q.zero_or(q.recorded(f"{q.TOOL_CALLS}_bucket", q.le_sel(edge, **labels)))


def _turns(**labels: str) -> str:
    return q.zero_or(q.recorded(q.TURNS, q.sel(**labels)))


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
        .with_target(query(q.recorded(f"{q.TOOL_CALLS}_bucket", q.sel(**ADAPTIVE), by=("le",), window="$__interval"),
                           "{{le}}", instant=False).format(PromQueryFormat.HEATMAP))
    )


def percentiles(cap: CapSettings) -> PanelBuilder:
    """p50/p90/p99 of the turns that ended on their own, with the halted share beside them."""
    s, h = cap.soft_cap, cap.hard_cap
    ended = {**ADAPTIVE, q.OUTCOME: "!halted"}
    buckets_per_step = q.recorded(f"{q.TOOL_CALLS}_bucket", q.sel(**ended), ("le",), "$__interval")
    targets = [
        query(f"histogram_quantile({p}, {buckets_per_step})", f"p{round(p * 100)} (turns not halted)", ref(i),
              instant=False)
        for i, p in enumerate((0.5, 0.9, 0.99))
    ]
    halted = (f"{q.recorded(q.TURNS, q.sel(**ADAPTIVE, **{q.OUTCOME: 'halted'}), window='$__interval')} / "
              f"{q.recorded(q.TURNS, q.sel(**ADAPTIVE), window='$__interval')}")
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
    not_stuck = {**ADAPTIVE, q.STUCK: "false"}
    return [
        stat_panel(11, "Turns not stuck", "Adaptive-cap turns in which no call repeated D times.",
                   q.recorded(q.TURNS, q.sel(**not_stuck)), width=4),
        bars(12, "Not-stuck turns a backstop at k×S would cut",
             "Share of not-stuck turns that made more than k×S calls, for k up to the live backstop (the turns "
             f"halted at it are in every k, {CENSORED} there: past it the live cohort shows nothing; the probe "
             "row does).", _cut_targets(cap, **not_stuck), unit="percentunit", width=10),
        bars(13, "…of those that ended on their own (false kills)",
             "The same, for not-stuck turns that were not halted: productive long turns a lower backstop would "
             f"have killed. Halted turns are left out ({CENSORED}: what they would have done is unknown).",
             _cut_targets(cap, **not_stuck, **{q.OUTCOME: "!halted"}), unit="percentunit", width=10),
    ]


# -- turns halted at the backstop ----------------------------------------------------------------------


def backstop_row(cap: CapSettings) -> list[PanelBuilder]:
    """The turns halted at the backstop: what they cost, whether the stuck signal had flagged them, and
    beside them what the probe cohort says such turns would have done."""
    s, h = cap.soft_cap, cap.hard_cap
    backstop = q.sel(**{q.THRESHOLD: Threshold.HARD_BACKSTOP})
    calls, turns = q.zero_or(q.recorded(q.CALLS, backstop)), q.zero_or(q.recorded(q.TURNS, backstop))
    flagged = q.zero_or(q.recorded(f"{q.FIRST_STUCK}_count", backstop))
    first_stuck_mean = (f"{q.recorded(f'{q.FIRST_STUCK}_sum', by=(q.THRESHOLD,))} / "
                        f"{q.recorded(f'{q.FIRST_STUCK}_count', by=(q.THRESHOLD,))}")
    panels = [
        stat_panel(21, "Turns halted at the backstop",
                   f"Turns halted at call {h + 1}. Halted at the backstop says what stopped them, not what they "
                   "were doing: the probe's resolved share beside says how many such turns would have succeeded.",
                   q.recorded(q.TURNS, backstop)),
        stat_panel(22, "Calls they made", "Tool calls checked in those turns.", calls),
        stat_panel(23, "…of which past the soft cap", f"Calls beyond S = {s} in those turns.",
                   f"{calls} - {s} * {turns}"),
        stat_panel(24, "Flagged stuck earlier", "Of those turns, how many met the stuck signal before the "
                   "backstop (the repeat signal halts them at S, so normally 0).", flagged),
        stat_panel(25, "Calls the stuck signal would have saved",
                   "For those flagged turns: calls made after the stuck signal first held.",
                   f"{calls} * {flagged} / clamp_min({turns}, 1) - "
                   f"{q.zero_or(q.recorded(f'{q.FIRST_STUCK}_sum', backstop))}"),
        bars(26, "When stuck turns were first flagged",
             f"Mean call at which the stuck signal first held, by how the turn ended (S = {s}).",
             [query(first_stuck_mean, legend(q.THRESHOLD))], width=4, height=4),
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
    long = {q.PAST_SOFT_CAP: "true"}
    targets = []
    for i, (name, labels) in enumerate((("ended on its own", {q.THRESHOLD: n.NO_THRESHOLD, **long}),
                                        ("halted: stuck past S", {q.THRESHOLD: Threshold.SOFT_STUCK, **long}),
                                        ("halted at the backstop", {q.THRESHOLD: Threshold.HARD_BACKSTOP, **long}))):
        below = q.zero_or(q.recorded(f"{q.MAX_REPEAT}_bucket", q.le_sel(d - 2, **labels)))
        near = q.zero_or(q.recorded(f"{q.MAX_REPEAT}_bucket", q.le_sel(d - 1, **labels)))
        count = q.zero_or(q.recorded(f"{q.MAX_REPEAT}_count", q.sel(**labels)))
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


def past_rows(cap: CapSettings) -> dict[str, str]:
    """Per column, a vector by ``multiple`` (one row per k): probe turns that made more than k×S calls,
    and what became of them (a result reported in the turn, or later on the results counter)."""
    columns: dict[str, dict[str, str]] = {name: {} for name in ("turns", "resolved", "unresolved", "censored",
                                                                 "unknown", SEEN_HIGH, SET_HERE)}
    true, limited, other = {q.RESOLVED: "true"}, {q.THRESHOLD: evidence.LENGTH_LIMITED}, {
        q.THRESHOLD: evidence.NOT_LENGTH_LIMITED}
    for k in BACKSTOP_MULTIPLES:
        edge, row = k * cap.soft_cap, str(k)

        def past(edge: int = edge, /, **labels: str) -> str:
            return f"({_turns(**PROBE_TURNS, **labels)} - {_cumulative(edge, **PROBE_TURNS, **labels)})"

        def late(edge: int = edge, /, **labels: str) -> str:
            accepted = {**PROBE_TURNS, q.RESULT_STATUS: "accepted", q.CALLS_BUCKET: _late_buckets(cap, edge)}
            return q.zero_or(q.recorded(q.RESULTS, q.sel(**accepted, **labels)))

        columns["turns"][row] = past()
        columns["resolved"][row] = f"({past(**true)} + {late(**true)})"
        false, not_true = {q.RESOLVED: "false"}, {q.RESOLVED: "~false|unknown"}
        columns["unresolved"][row] = f"({past(**other, **false)} + {late(**other, **false)})"
        columns["censored"][row] = f"({past(**limited, **not_true)} - {late(**limited, **true)})"
        columns["unknown"][row] = f"({past(**other, **{q.RESOLVED: 'unknown'})} - {late(**other)})"
        known = f"({columns['resolved'][row]} + {columns['unresolved'][row]} + {columns['censored'][row]})"
        columns[SEEN_HIGH][row] = evidence.productive_high(columns["resolved"][row], known)
        columns[SET_HERE][row] = evidence.within_seen(columns["resolved"][row], known)
    return {name: q.rows("multiple", per_row) for name, per_row in columns.items()}


SEEN_HIGH, SET_HERE = "productive seen, 95% high", "backstop here spares them"
"""Panel 41's frontier columns (calibrate's recommended value: the first row that spares them)."""


def past_row_names(cap: CapSettings) -> dict[str, str]:
    names = {}
    for k in BACKSTOP_MULTIPLES:
        edge = k * cap.soft_cap
        name = f"past {k}×S ({edge} calls)"
        if cap.probe_sees_past(edge) is False:
            name += f": at or past the probe's cap, {CENSORED} (raise the probe's cap to see past it)"
        names[str(k)] = name
    return names


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
        names[threshold.value] = name
    return names


def probe_row(cap: CapSettings) -> list[PanelBuilder]:
    continued = q.sel(**{q.ANSWER: "continue"})
    probe = (f"the probe ({cap.probe.name}, {cap.probe.rate:g} of turns)" if cap.probe else
             "the probe cohort (GuardConfig(probe=...))")
    evidence_columns = evidence.probe_rows(cap, cap.thresholds)
    return [
        table_panel(44, "Probe evidence by live threshold: would the turns it halts have succeeded?",
                    f"One row per threshold the main configuration has in force. Turns of {probe} that the main "
                    "configuration, running beside them, would have halted there, and what became of them under "
                    "the probe: resolved; unresolved; censored (halted at a length limit of the probe's own, its "
                    f"backstop, explicit or cycle cap, and not resolved: {CENSORED} there, they might have "
                    "succeeded); unknown (no result yet). The share resolved, and its 95% Wilson interval with "
                    "the censored turns counted as failures for its low end and as successes for its high end; "
                    "whether that decides against the Tolerance variable (above: the threshold halts more turns "
                    "that would have succeeded than you accept; within; undecided); if undecided, how many more "
                    "probe turns with a known fate it needs and how long they take at the rate they came in "
                    "(never, when the censored turns could go either way: raise the probe's cap); and the calls "
                    "they made past the threshold (the cost of raising it).",
                    q.MAIN_THRESHOLD, evidence_columns, evidence.PROBE_COLUMN_UNITS, height=9,
                    row_names=threshold_row_names(cap),
                    mappings={"decision": mapped({int(k): v for k, v in evidence.DECISION_TEXT.items()},
                                                 nan=NO_FATE),
                              "more probe turns": mapped({}, nan=NO_FATE, infinite=NEVER),
                              "time at this rate": mapped({}, nan=NO_FATE, infinite=NEVER)}),
        table_panel(41, "Probe turns past k×S",
                    f"Turns of {probe} that made more than k×S calls (S = {cap.soft_cap}; the live backstop is "
                    f"{cap.hard_multiplier:g}×S) and what became of them, counts only: the resolved share, its "
                    "interval and the decision are per threshold in the evidence table (its backstop row is the "
                    "probe turns past the backstop the main configuration would have halted). A probe turn "
                    f"halted at a length limit of the probe's is {CENSORED} there: past it, nothing is seen. "
                    "Productive seen, 95% high: the upper bound of the share of them that succeeded, the censored "
                    "counted as not productive (the productive turns the probe saw): with none resolved, the exact "
                    "binomial bound 1 - 0.025^(1/N) over the N with a known fate; a backstop here spares them when "
                    "that bound is under the Tolerance variable. The first such row below the probe's cap is "
                    "calibrate's recommended multiple on these rows (calibrate reads every multiple; past the "
                    "probe's cap, raising it only lets turns that never resolve burn longer).",
                    "multiple", past_rows(cap), {SEEN_HIGH: "percentunit"}, width=16, height=8,
                    row_names=past_row_names(cap),
                    mappings={SET_HERE: mapped({1: "yes", 0: "no"}, nan=NO_FATE)}),
        bars(43, "Attended \"continue\" answers, by threshold",
             "Users who were asked (ASK) and said the turn was fine, per threshold: the live false positives "
             "people saw.", [query(q.recorded(q.ANSWERS, continued, by=(q.THRESHOLD,)), legend(q.THRESHOLD))],
             width=8),
        survival_panel(cap),
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
    halted = q.sel(**{q.OUTCOME: "halted"})
    halt_action = q.sel(**{q.ACTION: "halt"})
    policy = q.recorded(q.SHADOW_TURNS, by=(q.SHADOW_POLICY,))
    return [
        bars(101, "Halts by threshold: live policy vs each shadow policy",
             "Turns the live policy halted, and turns each shadow policy would have halted, by the threshold "
             "that fired. A shadow with fewer resolved-looking halts and as many stuck ones is a candidate.",
             [query(q.recorded(q.TURNS, halted, by=(q.THRESHOLD,)), f"live: {{{{{q.THRESHOLD}}}}}", "A"),
              query(q.recorded(q.SHADOW_TURNS, halted, by=(q.SHADOW_POLICY, q.THRESHOLD)),
                    legend(q.SHADOW_POLICY, q.THRESHOLD, sep=": "), "B")], width=12, height=9),
        bars(102, "Halted share: live vs each shadow policy",
             "Share of turns halted by the live policy, and the share each shadow policy would have halted.",
             [query(f"{q.recorded(q.TURNS, halted)} / {q.recorded(q.TURNS)}", "live", "A"),
              query(f"{q.recorded(q.SHADOW_TURNS, halted, by=(q.SHADOW_POLICY,))} / {policy}",
                    legend(q.SHADOW_POLICY), "B")], unit="percentunit", width=6, height=9),
        bars(103, "Tool calls run: live vs allowed by each shadow",
             "Tool calls the live turns made, and how many each shadow policy would have let run before its "
             "would-be halts (the difference is what it would have saved, or cut).",
             [query(q.zero_or(q.recorded(q.CALLS)), "live", "A"),
              query(q.recorded(q.SHADOW_CALLS, by=(q.SHADOW_POLICY,)), legend(q.SHADOW_POLICY), "B")],
             width=6, height=9),
        bars(104, "Detections by threshold and level: live vs each shadow policy",
             "Every time a threshold fired (acted on or observed) live, and would have fired under each shadow.",
             [query(q.recorded(q.DETECTIONS, by=(q.THRESHOLD, q.LEVEL)), f"live: {legend(q.THRESHOLD, q.LEVEL)}", "A"),
              query(q.recorded(q.SHADOW_DETECTIONS, by=(q.SHADOW_POLICY, q.THRESHOLD, q.LEVEL)),
                    f"{{{{{q.SHADOW_POLICY}}}}}: {legend(q.THRESHOLD, q.LEVEL)}", "B")], width=12, height=9),
        over_time(105, "Would-be halts over time, by shadow policy",
                  "Halting detections per second each shadow policy would have made (nothing was acted on).",
                  [query(q.recorded_per_second(q.SHADOW_DETECTIONS, halt_action, by=(q.SHADOW_POLICY,)),
                         legend(q.SHADOW_POLICY), instant=False)], width=12).interval(q.RECORD_TILE),
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
