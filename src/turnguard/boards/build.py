"""turnguard's Grafana dashboards, as code (grafana-foundation-sdk, Grafana 11 schema).

    python -m turnguard.boards.build             # regenerate the committed JSON (dashboards/)
    python -m turnguard.boards.build --check     # exit 1 if the committed JSON is stale
    python -m turnguard.boards.build --soft-cap 200 --hard-multiplier 8 --out /tmp/boards

Two boards: **Halts** (what fired, where, how often, what users answered) and **Threshold
validation** (is the 10x backstop right: how turns spread against S and S x m, what a lower
backstop would cut, what the backstop catches that the stuck signal does not).

Metric and label names come from ``turnguard.telemetry.names`` through the OpenTelemetry ->
Prometheus translation (dots to underscores, ``{unit}`` dropped, ``_total`` on counters,
``_bucket/_sum/_count`` on histograms). The soft cap S and the backstop multiplier are build
parameters (they pick the ``le`` buckets of the what-if panels, which PromQL cannot compute from
a variable); the defaults are ``GuardConfig``'s. ``le`` is matched as ``200`` or ``200.0`` because
the Python pull exporter and the Collector's remote write format bucket edges differently.

Panel ids are stable: Halts uses 1-99; Threshold validation uses 1-99 and reserves 100-199 for
the shadow-policies row (``shadow_policy_panels``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, timeseries
from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig, ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.heatmap import RowsHeatmapOptions, YAxisConfig
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode,
    BigValueColorMode,
    BigValueGraphMode,
    GraphThresholdsStyleMode,
    HeatmapCellLayout,
    LegendDisplayMode,
    LegendPlacement,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from turnguard import assets
from turnguard.config import GuardConfig
from turnguard.model import Threshold as LoopThreshold
from turnguard.telemetry import buckets
from turnguard.telemetry import names as n

HERE = Path(__file__).resolve().parent
OUT = assets.root() / "dashboards"
"""Where the JSON lives: the assets' ``dashboards/`` (``turnguard assets DIR`` writes it out)."""
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
HALTS_UID = "turnguard-halts"
THRESHOLDS_UID = "turnguard-threshold-validation"
FILES = {HALTS_UID: "turnguard-halts.json", THRESHOLDS_UID: "turnguard-threshold-validation.json"}
SHADOW_PANEL_IDS = range(100, 200)
"""Panel ids reserved on the threshold-validation board for the shadow-policies row."""
BACKSTOP_MULTIPLES = (2, 3, 5, 10, 20)
"""The what-if backstops, as multiples of S (each is a bucket edge of the tool-calls histogram)."""


# -- names: OpenTelemetry -> Prometheus --------------------------------------------------------


def label(attribute: str) -> str:
    """``turnguard.loop.threshold`` -> ``turnguard_loop_threshold``."""
    return attribute.replace(".", "_")


def counter(metric: tuple[str, str]) -> str:
    return label(metric[0]) + "_total"


def histogram(metric: tuple[str, str]) -> str:
    return label(metric[0])


TOOL_CALLS = histogram(n.METRIC_TURN_TOOL_CALLS)
TURNS = f"{TOOL_CALLS}_count"
CALLS = f"{TOOL_CALLS}_sum"
"""Every ended turn records one tool-calls observation: the histogram's count counts turns."""
MAX_REPEAT = histogram(n.METRIC_TURN_MAX_KEY_REPEAT)
FIRST_STUCK = histogram(n.METRIC_TURN_FIRST_STUCK_CALL)
DETECTIONS = counter(n.METRIC_DETECTIONS)
ANSWERS = counter(n.METRIC_ESCALATION_ANSWERS)
PLUGIN_ERRORS = counter(n.METRIC_PLUGIN_ERRORS)
SHADOW_DETECTIONS = counter(n.METRIC_SHADOW_DETECTIONS)
SHADOW_TOOL_CALLS = histogram(n.METRIC_SHADOW_TURN_TOOL_CALLS)
SHADOW_TURNS = f"{SHADOW_TOOL_CALLS}_count"
SHADOW_CALLS = f"{SHADOW_TOOL_CALLS}_sum"
OTELCOL_ACCEPTED = "otelcol_receiver_accepted_metric_points_total"
OTELCOL_REFUSED = "otelcol_receiver_refused_metric_points_total"
OTELCOL_SEND_FAILED = {signal: f"otelcol_exporter_send_failed_{signal}_total"
                       for signal in ("metric_points", "spans", "log_records")}
OTELCOL_QUEUE_SIZE, OTELCOL_QUEUE_CAPACITY = "otelcol_exporter_queue_size", "otelcol_exporter_queue_capacity"
"""The Collector's own metrics (collector-config.yaml exports them for Prometheus to scrape)."""
"""Every shadow policy records one observation per live turn: the count counts turns per policy."""

OUTCOME = label(n.TURN_OUTCOME)
THRESHOLD = label(n.LOOP_THRESHOLD)
LEVEL = label(n.LOOP_LEVEL)
ACTION = label(n.LOOP_ACTION)
CAP_MODE = label(n.CAP_MODE)
STUCK = label(n.TURN_STUCK)
PAST_SOFT_CAP = label(n.TURN_PAST_SOFT_CAP)
PROMPTABLE = label(n.TURN_PROMPTABLE)
AGENT = label(n.GEN_AI_AGENT_NAME)
TOOL = label(n.GEN_AI_TOOL_NAME)
ANSWER = label(n.ESCALATION_ANSWER)
SHADOW_POLICY = label(n.SHADOW_POLICY)
POLICY = label(n.POLICY)
"""The policy's name on every metric point (DESIGN section 8): the config-change annotations and the
``policy`` variable follow it."""
COHORT = label(n.TURN_COHORT)
RESOLVED = label(n.TURN_RESOLVED)
RESULT_STATUS = label(n.RESULT_STATUS)
CALLS_BUCKET = label(n.TURN_CALLS_BUCKET)
RESULTS = counter(n.METRIC_TURN_RESULTS)
MAIN_THRESHOLD = label(n.PROBE_MAIN_THRESHOLD)
CALLS_PAST_MAIN = counter(n.METRIC_PROBE_CALLS_PAST_MAIN)
FALSE_HALT_THRESHOLDS = (LoopThreshold.SOFT_STUCK, LoopThreshold.HARD_BACKSTOP)
"""The live thresholds whose would-be halts on probe turns the false-halt panels count (refs A, B)."""
AGENT_VARIABLE = "agent"
POLICY_VARIABLE = "policy"
POLICY_SCOPED = frozenset(label(metric) for metric, keys in n.METRIC_ATTRIBUTES.items() if n.POLICY in keys)
"""Metrics carrying the policy's name: the boards' ``policy`` variable picks one policy's series (a
threshold change under a new ``GuardConfig.name`` is a series of its own, not a mix)."""
PROBE_POLICY = f"~(${POLICY_VARIABLE})(-probe)?"
"""The probe panels' policy matcher: the picked policies and their probes (a probe configuration that kept
the main one's name reports as ``<name>-probe``)."""
AGENT_SCOPED = frozenset(label(metric) for metric, keys in n.METRIC_ATTRIBUTES.items() if n.GEN_AI_AGENT_NAME in keys)
"""Metrics carrying the agent name: the boards' ``agent`` variable filters them (a metric without the
label, such as plugin errors, is not filtered)."""

EXPORT_INTERVAL_S = 60
"""The SDK's metric export interval (OTEL_METRIC_EXPORT_INTERVAL's default), one sample per series per
interval: the provisioned ``timeInterval``, so Grafana's ``$__rate_interval`` holds at least four."""
COLLECTOR_JOB = "otelcol"
"""The scrape job of the Collector's own metrics (the shipped prometheus.yml's)."""


# -- the thresholds the what-if panels are built for --------------------------------------------


@dataclass(frozen=True)
class CapSettings:
    """S, the backstop multiplier m and the stuck threshold D the boards mark and slice by."""

    soft_cap: int
    hard_multiplier: float
    stuck_repeat_threshold: int

    @classmethod
    def from_config(cls, config: GuardConfig) -> CapSettings:
        return cls(config.soft_cap, config.hard_multiplier, config.stuck_repeat_threshold)

    @property
    def hard_cap(self) -> int:
        """The guard's own H (``100 x 1.15`` is 115, not 114): the bucket edge the what-if panels query."""
        return GuardConfig(soft_cap=self.soft_cap, hard_multiplier=self.hard_multiplier).hard_cap or 0

    def bands(self) -> list[tuple[int, int | None]]:
        """Tool-call bands (low, high]: 0-S, S-2S, 2S-3S, 3S-5S, ...-H, and past H (high None)."""
        h = self.hard_cap
        edges = [self.soft_cap * k for k in (1, 2, 3, 5) if self.soft_cap * k < h] + [h]
        lows = [0, *edges]
        return [*zip(lows, edges, strict=False), (h, None)]


DEFAULTS = CapSettings.from_config(GuardConfig())


# -- PromQL helpers --------------------------------------------------------------------------


def sel(**labels: str) -> str:
    """A label selector; a value starting with ``!`` means "not equal", with ``~`` "matches the regex"."""

    def matcher(k: str, v: str) -> str:
        if v.startswith("!"):
            return f'{k}!="{v[1:]}"'
        return f'{k}=~"{v[1:]}"' if v.startswith("~") else f'{k}="{v}"'

    return "{" + ",".join(matcher(k, v) for k, v in labels.items()) + "}" if labels else ""


def agent_scoped(metric: str, selector: str) -> str:
    """``selector`` with the variables' matchers added: the agent's when ``metric`` carries the agent
    name, the policy's when it carries the policy's (unless ``selector`` matches the policy itself)."""
    base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
    matchers = [selector[1:-1]] if selector else []
    if base in POLICY_SCOPED and f"{POLICY}=" not in selector and f"{POLICY}!" not in selector:
        matchers.append(f'{POLICY}=~"${POLICY_VARIABLE}"')
    if base in AGENT_SCOPED:
        matchers.append(f'{AGENT}=~"${AGENT_VARIABLE}"')
    return "{" + ",".join(matchers) + "}" if matchers else ""


def le_sel(edge: float, **labels: str) -> str:
    """A selector for the bucket ``le == edge`` however the exporter formatted the number."""
    number = str(int(edge)) if float(edge).is_integer() else re.escape(repr(float(edge)))
    base = sel(**labels)
    le = f"le=~`{number}(\\.0)?`"
    return "{" + (base[1:-1] + "," if base else "") + le + "}"


def counted(metric: str, selector: str = "", window: str = "$__range") -> str:
    """Per series, the events counted in ``window``, a series born inside it counted from zero.

    ``increase()`` starts at a series' first sample and needs two: a series created in the window
    (an agent's first backstop halt is a new series, born at 1) would count 0, or nothing. A series
    with no sample before the window (none at ``offset window``) counts its whole value, since a
    cumulative series starts at zero; the others count their ``increase()``, resets handled as
    Prometheus does."""
    m = f"{metric}{agent_scoped(metric, selector)}"
    return (f"(increase({m}[{window}]) and {m} offset {window}) "
            f"or (last_over_time({m}[{window}]) unless {m} offset {window})")


def total(metric: str, selector: str = "", by: Sequence[str] = (), window: str = "$__range") -> str:
    """Events counted over the dashboard's time range (or ``window``), from zero for new series."""
    group = f" by ({', '.join(by)})" if by else ""
    return f"sum{group} ({counted(metric, selector, window)})"


def per_second(metric: str, selector: str = "", by: Sequence[str] = ()) -> str:
    """Events per second over ``$__rate_interval``, counted as ``total`` counts them (a new series'
    first sample included, which ``rate()`` would drop)."""
    return f"{total(metric, selector, by, window='$__rate_interval')} / ($__rate_interval_ms / 1000)"


RECORD_TILE = "5m"
"""The recording rules' tile (rules/turnguard.rules.yaml): each record counts one 5-minute stretch."""
RECORDED = {
    TURNS: "turnguard:turns:increase5m",
    f"{TOOL_CALLS}_bucket": "turnguard:turn_tool_calls_bucket:increase5m",
    CALLS: "turnguard:turn_tool_calls_sum:increase5m",
    f"{MAX_REPEAT}_bucket": "turnguard:turn_max_key_repeat_bucket:increase5m",
    f"{MAX_REPEAT}_count": "turnguard:turn_max_key_repeat_count:increase5m",
    f"{FIRST_STUCK}_sum": "turnguard:turn_first_stuck_call_sum:increase5m",
    f"{FIRST_STUCK}_count": "turnguard:turn_first_stuck_call_count:increase5m",
    RESULTS: "turnguard:turn_results:increase5m",
    CALLS_PAST_MAIN: "turnguard:probe_calls_past_main_threshold:increase5m",
    DETECTIONS: "turnguard:loop_detections:increase5m",
    ANSWERS: "turnguard:escalation_answers:increase5m",
    SHADOW_TURNS: "turnguard:shadow_turns:increase5m",
    SHADOW_CALLS: "turnguard:shadow_turn_tool_calls_sum:increase5m",
    SHADOW_DETECTIONS: "turnguard:shadow_detections:increase5m",
}
"""Raw series -> the recording rule that tiles it (the rules file defines each, by the labels the
threshold-validation board reads)."""


def recorded(metric: str, selector: str = "", by: Sequence[str] = (), window: str = "$__range") -> str:
    """``total``'s count read from ``metric``'s recorded tiles: one sample per 5 minutes per label set
    instead of every raw sample of every series, exact where the range is a multiple of the tile."""
    group = f" by ({', '.join(by)})" if by else ""
    return f"sum{group} (sum_over_time({RECORDED[metric]}{agent_scoped(metric, selector)}[{window}]))"


def recorded_per_second(metric: str, selector: str = "", by: Sequence[str] = ()) -> str:
    """Events per second over each step's own ``$__interval`` (a panel reading records sets its min
    interval to the tile, so the interval is a multiple of it and no tile is counted twice)."""
    return f"{recorded(metric, selector, by, window='$__interval')} / ($__interval_ms / 1000)"


def legend(*labels: str, sep: str = " ") -> str:
    """A legend format naming each label's value: ``{{a}} {{b}}``."""
    return sep.join("{{" + name + "}}" for name in labels)


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = True, exemplar: bool = False) -> Dataquery:
    """A Prometheus target; ``exemplar`` asks for the points' exemplars (links to the halted turn's trace)."""
    q = Dataquery().datasource(DATASOURCE).expr(expr).ref_id(ref).legend_format(legend or "__auto")
    if exemplar:
        q = q.exemplar(True)
    return q.instant() if instant else q.range()


# -- panel helpers -----------------------------------------------------------------------------


def _steps(*marks: tuple[float, str]) -> ThresholdsConfig:
    steps = [Threshold(value=None, color="green"), *(Threshold(value=float(v), color=c) for v, c in marks)]
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)


def stat_panel(pid: int, title: str, description: str, expr: str, unit: str = "short", width: int = 4) -> stat.Panel:
    panel = (
        stat.Panel().id(pid).title(title).description(description).datasource(DATASOURCE).unit(unit)
        .height(4).span(width).graph_mode(BigValueGraphMode.NONE).color_mode(BigValueColorMode.VALUE)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(_steps()).with_target(query(expr))
    )
    # a count with no series yet (e.g. no backstop halt in the range) is 0, not "No data"
    return panel.no_value("0") if unit == "short" else panel


def bars(pid: int, title: str, description: str, targets: Sequence[Dataquery], unit: str = "short",
         width: int = 12, height: int = 8) -> bargauge.Panel:
    panel = (
        bargauge.Panel().id(pid).title(title).description(description).datasource(DATASOURCE).unit(unit)
        .height(height).span(width).orientation(VizOrientation.HORIZONTAL)
        .display_mode(BarGaugeDisplayMode.BASIC).min(0)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(_steps())
    )
    if unit == "percentunit":
        panel = panel.max(1)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def over_time(pid: int, title: str, description: str, targets: Sequence[Dataquery], unit: str = "cps",
              width: int = 12, marks: Sequence[tuple[float, str]] = ()) -> timeseries.Panel:
    panel = (
        timeseries.Panel().id(pid).title(title).description(description).datasource(DATASOURCE).unit(unit)
        .height(8).span(width).fill_opacity(10).min(0)
        .legend(VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                .placement(LegendPlacement.BOTTOM).calcs([]))
    )
    if marks:
        panel = panel.thresholds(_steps(*marks)).thresholds_style(
            GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED)
        )
    for target in targets:
        panel = panel.with_target(target)
    return panel


def _with_panels(board: Dashboard, panels: Sequence[object]) -> Dashboard:
    for panel in panels:
        board = board.with_panel(panel)
    return board


def _base(uid: str, title: str, description: str, tags: Sequence[str]) -> Dashboard:
    agents = (
        QueryVariable(AGENT_VARIABLE).label("Agent").datasource(DATASOURCE)
        .query(f"label_values({TURNS}, {AGENT})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True).include_all(True).all_value(".*").sort(VariableSort.ALPHABETICAL_ASC)
    )
    policies = (
        QueryVariable(POLICY_VARIABLE).label("Policy").datasource(DATASOURCE)
        .query(f"label_values({TURNS}, {POLICY})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True).include_all(True).all_value(".*").sort(VariableSort.ALPHABETICAL_ASC)
    )
    return (
        Dashboard(title).uid(uid).description(description).tags(list(tags)).readonly()
        .time("now-24h", "now").refresh("1m").timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(policies)
        .with_variable(agents)
        .annotation(policy_changes())
    )


def policy_changes() -> AnnotationQuery:
    """A mark where a policy name first reports (a new or renamed GuardConfig went live)."""
    named = f'{TURNS}{{{POLICY}!=""}}'
    return (
        AnnotationQuery().name("Policy changes").datasource(DATASOURCE).enable(True).icon_color("purple")
        .expr(f"group by ({POLICY}) ({named}) unless group by ({POLICY}) ({named} offset 10m)")
    )


# -- Halts ---------------------------------------------------------------------------------------


def overview_panels() -> list[object]:
    """Panels of the halts board's overview row: the time range's counts and shares."""
    halted = sel(**{OUTCOME: "halted"})
    answered_continue = sel(**{ANSWER: "continue"})
    return [
        stat_panel(2, "Turns", "Agent turns that ended in the time range.", total(TURNS)),
        stat_panel(3, "Turns halted",
                   "Turns that ended because turnguard halted them (any threshold, or a user's stop).",
                   total(TURNS, halted)),
        stat_panel(4, "Halted share", "Turns halted / turns ended.",
                   f"{total(TURNS, halted)} / {total(TURNS)}", "percentunit"),
        stat_panel(5, "Detections", "Every time a threshold fired, acted on or only observed.",
                   total(DETECTIONS)),
        stat_panel(6, "Asks answered \"continue\"",
                   "Share of turnguard's questions the user answered \"continue\": the false-positive "
                   "rate.", f"{total(ANSWERS, answered_continue)} / {total(ANSWERS)}", "percentunit"),
        stat_panel(7, "Plugin errors",
                   "turnguard plugins that raised; the guard isolated them (fail_mode).",
                   f"{total(PLUGIN_ERRORS)} or vector(0)"),
    ]


def halts_dashboard(cap: CapSettings = DEFAULTS) -> Dashboard:
    """What fired, where, how often, and what users answered."""
    halt_action = sel(**{ACTION: "halt"})
    answered_continue = sel(**{ANSWER: "continue"})
    action_attendance = (
        'sum by (action, attendance) (label_replace(label_replace(label_replace(label_replace('
        f'{counted(DETECTIONS)}, '
        f'"action", "observed", "{ACTION}", "allow"), '
        f'"action", "$1", "{ACTION}", "(remind|ask|halt)"), '
        f'"attendance", "attended", "{PROMPTABLE}", "true"), '
        f'"attendance", "unattended", "{PROMPTABLE}", "false"))'
    )
    fp_rate = f"{total(ANSWERS, answered_continue, by=(THRESHOLD,))} / {total(ANSWERS, by=(THRESHOLD,))}"
    board = _with_panels(
        _base(HALTS_UID, "turnguard: halts",
              "What turnguard detected and did to agent turns, where, and what users answered when asked.",
              ["turnguard", "agents"]).with_row(Row("Overview").id(1)), overview_panels())
    board = (
        board
        .with_row(Row("Detections").id(10))
        .with_panel(over_time(11, "Detections by threshold and level", "Detections per second.",
                              [query(per_second(DETECTIONS, by=(THRESHOLD, LEVEL)), legend(THRESHOLD, LEVEL),
                                     instant=False, exemplar=True)]))
        .with_panel(over_time(12, "Halts by threshold", "Detections whose action was halt, per second.",
                              [query(per_second(DETECTIONS, halt_action, by=(THRESHOLD,)), legend(THRESHOLD),
                                     instant=False, exemplar=True)]))
        .with_panel(bars(13, "What turnguard did, attended vs unattended",
                         "Detections by action (observed = recorded, not acted on) and by whether a person was "
                         "watching the turn (promptable).",
                         [query(action_attendance, "{{action}} · {{attendance}}")], width=24, height=7))
        .with_row(Row("Where").id(20))
        .with_panel(bars(21, "Top agents by halts", "Halting detections per agent (top 10).",
                         [query(f"topk(10, {total(DETECTIONS, halt_action, by=(AGENT,))})", legend(AGENT))]))
        .with_panel(bars(22, "Top tools by halts",
                         "Halting detections per tool: the call that tripped the threshold (top 10).",
                         [query(f"topk(10, {total(DETECTIONS, halt_action, by=(TOOL,))})", legend(TOOL))]))
        .with_row(Row("Escalations").id(30))
        .with_panel(bars(31, "Answers by threshold",
                         "Users' answers to turnguard's questions (ASK), by the threshold that asked.",
                         [query(total(ANSWERS, by=(THRESHOLD, ANSWER)), legend(THRESHOLD, ANSWER, sep=": "))],
                         width=8))
        .with_panel(bars(32, "False-positive rate by threshold",
                         "Share of asks answered \"continue\": the user judged the turn fine.",
                         [query(fp_rate, legend(THRESHOLD))], unit="percentunit", width=8))
        .with_panel(over_time(33, "Answers over time", "Answers per second.",
                              [query(per_second(ANSWERS, by=(ANSWER,)), legend(ANSWER), instant=False)], width=8))
        .with_row(Row("Turns").id(40))
        .with_panel(bars(41, "Turns by how they ended",
                         "Turns by outcome and the threshold that ended them (none: it ended on its own).",
                         [query(total(TURNS, by=(OUTCOME, THRESHOLD)), legend(OUTCOME, THRESHOLD))]))
        .with_panel(over_time(42, "Turns ending, by outcome", "Turns ended per second.",
                              [query(per_second(TURNS, by=(OUTCOME,)), legend(OUTCOME), instant=False)]))
        .with_row(Row("Collector: is the telemetry arriving?").id(50))
    )
    return _with_panels(board, collector_panels())


def collector_panels() -> list[object]:
    """The Collector's own metrics, so "no data" (a broken pipeline) and "no halts" look different."""
    failed = [query(per_second(metric, by=("exporter",)), f"{{{{exporter}}}} {signal.replace('_', ' ')}",
                    chr(ord("A") + i), instant=False) for i, (signal, metric) in enumerate(OTELCOL_SEND_FAILED.items())]
    return [
        stat_panel(51, "Metric points the Collector failed to export",
                   "Over the time range, every exporter: remote-write failures show here, not as fewer halts.",
                   f"{total(OTELCOL_SEND_FAILED['metric_points'])} or vector(0)"),
        over_time(52, "Metric points received: accepted vs refused",
                  "Per second, by receiver. Refused points were turned away (memory limiter, bad data) and are lost.",
                  [query(per_second(OTELCOL_ACCEPTED, by=("receiver",)), "{{receiver}} accepted", "A", instant=False),
                   query(per_second(OTELCOL_REFUSED, by=("receiver",)), "{{receiver}} refused", "B", instant=False)],
                  width=7),
        over_time(53, "Failed exports, by exporter",
                  "Items per second an exporter could not send (after its retries): the backend is down or refusing.",
                  failed, width=7),
        over_time(54, "Export queue fill, by exporter",
                  "Queue size over capacity: near 1, new data is dropped.",
                  [query(f"max by (exporter) ({OTELCOL_QUEUE_SIZE} / {OTELCOL_QUEUE_CAPACITY})", "{{exporter}}",
                         instant=False)], unit="percentunit", width=6),
    ]


# -- Threshold validation ---------------------------------------------------------------------------


def _band_targets(cap: CapSettings, **labels: str) -> list[Dataquery]:
    def cumulative(edge: int) -> str:
        return recorded(f"{TOOL_CALLS}_bucket", le_sel(edge, **labels))

    targets = []
    for i, (low, high) in enumerate(cap.bands()):
        ref = chr(ord("A") + i)
        if high is None:
            expr = f"{recorded(TURNS, sel(**labels))} - {cumulative(low)}"
            legend = f"> {low} (past the backstop)"
        elif low == 0:
            expr = cumulative(high)
            legend = f"≤ {high} (within S)"
        else:
            expr = f"{cumulative(high)} - {cumulative(low)}"
            legend = f"{low + 1}–{high} (up to {high / cap.soft_cap:g}×S)"
        targets.append(query(expr, legend, ref))
    return targets


def _cut_targets(cap: CapSettings, **labels: str) -> list[Dataquery]:
    count = recorded(TURNS, sel(**labels))
    return [
        query(f"1 - {recorded(f'{TOOL_CALLS}_bucket', le_sel(k * cap.soft_cap, **labels))} / {count}",
              f"{k}×S ({k * cap.soft_cap} calls)", chr(ord("A") + i))
        for i, k in enumerate(BACKSTOP_MULTIPLES)
    ]


def _repeat_targets(cap: CapSettings) -> list[Dataquery]:
    """Long turns only (past S: the ones the stuck signal judges), by how they ended."""
    d = cap.stuck_repeat_threshold
    long = {PAST_SOFT_CAP: "true"}
    targets = []
    for i, (name, labels) in enumerate((("ended on its own", {THRESHOLD: n.NO_THRESHOLD, **long}),
                                        ("halted: stuck past S", {THRESHOLD: LoopThreshold.SOFT_STUCK, **long}),
                                        ("halted: backstop", {THRESHOLD: LoopThreshold.HARD_BACKSTOP, **long}))):
        below = recorded(f"{MAX_REPEAT}_bucket", le_sel(d - 2, **labels))
        near = recorded(f"{MAX_REPEAT}_bucket", le_sel(d - 1, **labels))
        count = recorded(f"{MAX_REPEAT}_count", sel(**labels))
        targets += [
            query(below, f"{name}: max repeat < {d - 1}", chr(ord("A") + 3 * i)),
            query(f"{near} - {below}", f"{name}: max repeat = {d - 1} (one short of D)", chr(ord("B") + 3 * i)),
            query(f"{count} - {near}", f"{name}: max repeat ≥ {d} (stuck)", chr(ord("C") + 3 * i)),
        ]
    return targets


def _late_buckets(cap: CapSettings, above: int) -> str:
    """A regex of the results counter's call buckets (``turnguard.turn.tool_calls_bucket``) past ``above``."""
    edges = buckets.tool_call_edges(GuardConfig(soft_cap=cap.soft_cap, hard_multiplier=cap.hard_multiplier,
                                                stuck_repeat_threshold=cap.stuck_repeat_threshold))
    return "~(" + "|".join([*(f"{e:g}" for e in edges if e > above), "\\\\+Inf"]) + ")"


def _passed_targets(cap: CapSettings, *, resolved: bool) -> list[Dataquery]:
    """Per k: probe turns that made more than k×S calls, or those of them whose task was resolved
    (reported before the turn ended, on the turn's histogram, or after it, on the results counter)."""
    probe = {COHORT: "probe", POLICY: PROBE_POLICY}
    targets = []
    for i, k in enumerate(BACKSTOP_MULTIPLES):
        edge = k * cap.soft_cap
        if not resolved:
            expr = f"{recorded(TURNS, sel(**probe))} - {recorded(f'{TOOL_CALLS}_bucket', le_sel(edge, **probe))}"
        else:
            done = {**probe, RESOLVED: "true"}
            late = {**done, RESULT_STATUS: "accepted", CALLS_BUCKET: _late_buckets(cap, edge)}
            expr = (f"({recorded(TURNS, sel(**done))} - {recorded(f'{TOOL_CALLS}_bucket', le_sel(edge, **done))} "
                    f"or vector(0)) + ({recorded(RESULTS, sel(**late))} or vector(0))")
        targets.append(query(expr, f"past {k}×S ({edge} calls)", chr(ord("A") + i)))
    return targets


def _would_halt_targets(*, resolved: bool) -> list[Dataquery]:
    """Per live threshold (``FALSE_HALT_THRESHOLDS``): probe turns the main configuration would have
    halted there, or those of them whose task was resolved (before the turn ended, on the turn's
    histogram, or after, on the results counter): the live thresholds' false halts."""
    targets = []
    for i, threshold in enumerate(FALSE_HALT_THRESHOLDS):
        probe = {COHORT: "probe", POLICY: PROBE_POLICY, MAIN_THRESHOLD: threshold.value}
        if not resolved:
            expr = recorded(TURNS, sel(**probe))
        else:
            done = {**probe, RESOLVED: "true"}
            late = {**done, RESULT_STATUS: "accepted"}
            expr = f"({recorded(TURNS, sel(**done))} or vector(0)) + ({recorded(RESULTS, sel(**late))} or vector(0))"
        targets.append(query(expr, threshold.value, chr(ord("A") + i)))
    return targets


def _calls_past_targets() -> list[Dataquery]:
    """Per live threshold: the calls probe turns made past the main configuration's would-be halt."""
    return [query(recorded(CALLS_PAST_MAIN, sel(**{POLICY: PROBE_POLICY, MAIN_THRESHOLD: threshold.value})),
                  threshold.value, chr(ord("A") + i)) for i, threshold in enumerate(FALSE_HALT_THRESHOLDS)]


def probe_panels(cap: CapSettings) -> list[object]:
    """The probe cohort (``tg.Probe``): turns guarded by a more lenient configuration, so what happens
    past the live thresholds is seen. Counts, never a bare share."""
    continued = sel(**{ANSWER: "continue"})
    return [
        bars(41, "Probe turns past k×S",
             f"Probe-cohort turns that made more than k×S calls (S = {cap.soft_cap}); the live backstop "
             f"(S×{cap.hard_multiplier:g}) would have halted every turn past it.",
             _passed_targets(cap, resolved=False), width=9),
        bars(42, "Probe turns past k×S that were resolved",
             "Of the probe turns past k×S, those whose task succeeded (turn.report_result / "
             "guard.report_result): productive turns a backstop at k×S would have killed.",
             _passed_targets(cap, resolved=True), width=9),
        bars(43, "Attended \"continue\" answers, by threshold",
             "Users who were asked (ASK) and said the turn was fine, per threshold: the live false positives "
             "people saw.", [query(recorded(ANSWERS, continued, by=(THRESHOLD,)), legend(THRESHOLD))], width=6),
        bars(44, "Probe turns the live thresholds would have halted",
             "Probe turns the main configuration (running beside them as a shadow) would have halted, by "
             "threshold (turnguard.probe.main_threshold).", _would_halt_targets(resolved=False), width=8),
        bars(45, "...of them resolved (the live thresholds' false halts)",
             "Of the probe turns the live thresholds would have halted, those whose task went on to succeed: "
             "each one a productive turn the live policy kills.", _would_halt_targets(resolved=True), width=8),
        bars(46, "Calls past the live thresholds (the cost of raising them)",
             "Tool calls the probe turns made after the call the main configuration would have halted at, by "
             "threshold: what raising that threshold would cost in calls.", _calls_past_targets(), width=8),
    ]


def shadow_policy_panels(cap: CapSettings) -> list[object]:
    """Panels of the shadow-policies row (ids from ``SHADOW_PANEL_IDS``): what each shadow policy
    (``GuardConfig.shadow``, evaluated on live traffic without acting) would have done, next to
    what the live policy did. A shadow's turn "halted" is its would-be halt."""
    halted = sel(**{OUTCOME: "halted"})
    live = "live"
    halt_action = sel(**{ACTION: "halt"})
    return [
        bars(101, "Halts by threshold: live policy vs each shadow policy",
             "Turns the live policy halted, and turns each shadow policy would have halted, by the threshold "
             "that fired. A shadow with fewer resolved-looking halts and as many stuck ones is a candidate.",
             [query(recorded(TURNS, halted, by=(THRESHOLD,)), f"{live}: {{{{{THRESHOLD}}}}}", "A"),
              query(recorded(SHADOW_TURNS, halted, by=(SHADOW_POLICY, THRESHOLD)),
                    legend(SHADOW_POLICY, THRESHOLD, sep=": "), "B")], width=12, height=9),
        bars(102, "Halted share: live vs each shadow policy",
             "Share of turns halted by the live policy, and the share each shadow policy would have halted.",
             [query(f"{recorded(TURNS, halted)} / {recorded(TURNS)}", live, "A"),
              query(f"{recorded(SHADOW_TURNS, halted, by=(SHADOW_POLICY,))} / "
                    f"{recorded(SHADOW_TURNS, by=(SHADOW_POLICY,))}", legend(SHADOW_POLICY), "B")],
             unit="percentunit", width=6, height=9),
        bars(103, "Tool calls run: live vs allowed by each shadow",
             "Tool calls the live turns made, and how many each shadow policy would have let run before its "
             "would-be halts (the difference is what it would have saved, or cut).",
             [query(recorded(CALLS), live, "A"),
              query(recorded(SHADOW_CALLS, by=(SHADOW_POLICY,)), legend(SHADOW_POLICY), "B")], width=6, height=9),
        bars(104, "Detections by threshold and level: live vs each shadow policy",
             "Every time a threshold fired (acted on or observed) live, and would have fired under each shadow.",
             [query(recorded(DETECTIONS, by=(THRESHOLD, LEVEL)), f"{live}: {legend(THRESHOLD, LEVEL)}", "A"),
              query(recorded(SHADOW_DETECTIONS, by=(SHADOW_POLICY, THRESHOLD, LEVEL)),
                    f"{{{{{SHADOW_POLICY}}}}}: {legend(THRESHOLD, LEVEL)}", "B")], width=12, height=9),
        over_time(105, "Would-be halts over time, by shadow policy",
                  "Halting detections per second each shadow policy would have made (nothing was acted on).",
                  [query(recorded_per_second(SHADOW_DETECTIONS, halt_action, by=(SHADOW_POLICY,)),
                         legend(SHADOW_POLICY), instant=False)], width=12).interval(RECORD_TILE),
    ]


def tool_calls_heatmap(cap: CapSettings) -> heatmap.Panel:
    """The threshold-validation board's first panel: adaptive-cap turns per bucket of tool calls."""
    s, h = cap.soft_cap, cap.hard_cap
    return (
        heatmap.Panel().id(2).title(f"Tool calls per turn (soft cap {s}, backstop {h})")
        .description(f"Turns per bucket of tool calls. Rows at {s} (S) and {h} (the backstop) are the cap's "
                     "edges: turns above S continued only while not stuck; the row above the backstop holds the "
                     "turns it ended.")
        .datasource(DATASOURCE).unit("short").height(9).span(12).calculate(False).interval(RECORD_TILE)
        .rows_frame(RowsHeatmapOptions().layout(HeatmapCellLayout.LE))
        .y_axis(YAxisConfig().unit("short").axis_label(f"tool calls per turn (S = {s}, backstop = {h})"))
        .with_target(query(recorded(f"{TOOL_CALLS}_bucket", sel(**{CAP_MODE: "adaptive"}), by=("le",),
                                    window="$__interval"), "{{le}}", instant=False).format(PromQueryFormat.HEATMAP))
    )


def backstop_panels(cap: CapSettings) -> list[object]:
    """Panels of the threshold-validation row on the turns the backstop ended: what they cost, and
    whether the stuck signal had flagged them first."""
    s, h = cap.soft_cap, cap.hard_cap
    backstop = sel(**{THRESHOLD: LoopThreshold.HARD_BACKSTOP})
    first_stuck_mean = (
        f"{recorded(f'{FIRST_STUCK}_sum', by=(THRESHOLD,))} / {recorded(f'{FIRST_STUCK}_count', by=(THRESHOLD,))}"
    )
    return [
        stat_panel(21, "Turns the backstop ended", f"Turns halted at call {h + 1}.",
                   recorded(TURNS, backstop)),
        stat_panel(22, "Calls they burned", "Tool calls checked in those turns.",
                   recorded(CALLS, backstop)),
        stat_panel(23, "…of which past the soft cap", f"Calls beyond S = {s} in those turns.",
                   f"{recorded(CALLS, backstop)} - {s} * {recorded(TURNS, backstop)}"),
        stat_panel(24, "Flagged stuck earlier", "Of those turns, how many met the stuck signal before the "
                   "backstop (the repeat signal halts them at S, so normally 0).",
                   f"{recorded(f'{FIRST_STUCK}_count', backstop)} or vector(0)"),
        stat_panel(25, "Calls the stuck signal would have saved",
                   "For those flagged turns: calls made after the stuck signal first held.",
                   f"({recorded(CALLS, backstop)} / {recorded(TURNS, backstop)}) * "
                   f"{recorded(f'{FIRST_STUCK}_count', backstop)} - "
                   f"{recorded(f'{FIRST_STUCK}_sum', backstop)} or vector(0)"),
        bars(26, "When stuck turns were first flagged",
             f"Mean call at which the stuck signal first held, by how the turn ended (S = {s}).",
             [query(first_stuck_mean, legend(THRESHOLD))], width=4, height=4),
    ]


def threshold_validation_dashboard(cap: CapSettings = DEFAULTS) -> Dashboard:
    """Is the backstop multiplier right? Turns against S and S x m, and what other caps would do."""
    s, h, d = cap.soft_cap, cap.hard_cap, cap.stuck_repeat_threshold
    adaptive = {CAP_MODE: "adaptive"}
    not_stuck = {CAP_MODE: "adaptive", STUCK: "false"}
    ended = {**adaptive, OUTCOME: "!halted"}
    quantiles = [
        query(f"histogram_quantile({q}, {recorded(f'{TOOL_CALLS}_bucket', sel(**ended), ('le',), '$__interval')})",
              f"p{round(q * 100)}", chr(ord("A") + i), instant=False)
        for i, q in enumerate((0.5, 0.9, 0.99))
    ]
    board = (
        _base(THRESHOLDS_UID, "turnguard: threshold validation",
              f"Production turns against the adaptive cap (soft cap S = {s}, backstop S×{cap.hard_multiplier:g} = "
              f"{h}, stuck at {d} repeats). Rebuild with python -m turnguard.boards.build if your GuardConfig differs.",
              ["turnguard", "agents", "calibration"])
        .with_row(Row(f"Tool calls per turn against the cap (S = {s}, backstop = {h})").id(1))
        .with_panel(tool_calls_heatmap(cap))
        .with_panel(over_time(3, "Tool calls per turn: percentiles vs S and the backstop",
                              "Turns that were not halted (a halted turn ends at its threshold, so a few runaways "
                              f"would put p99 on the backstop). Dashed lines: the soft cap S = {s} (orange) and the "
                              f"backstop {h} (red).",
                              quantiles, unit="short", marks=((s, "orange"), (h, "red")))
                    .max(h * 1.1).interval(RECORD_TILE))
        .with_panel(bars(4, "Turns by tool-call band", "Turns ended, by how many tool calls they made, in bands of S.",
                         _band_targets(cap, **adaptive), width=24, height=7))
        .with_row(Row("What a lower backstop would cut").id(10))
        .with_panel(stat_panel(11, "Turns not stuck", "Adaptive-cap turns in which no call repeated D times.",
                               recorded(TURNS, sel(**not_stuck)), width=4))
        .with_panel(bars(12, "Not-stuck turns a backstop at k×S would cut",
                         "Share of not-stuck turns that made more than k×S calls (runaways the real backstop "
                         "ended are in every k up to the multiplier).",
                         _cut_targets(cap, **not_stuck), unit="percentunit", width=10))
        .with_panel(bars(13, "…of those that ended on their own (false kills)",
                         "The same, for not-stuck turns that were not halted: productive long turns a lower "
                         "backstop would have killed.",
                         _cut_targets(cap, **not_stuck, **{OUTCOME: "!halted"}), unit="percentunit", width=10))
        .with_row(Row("Turns the backstop ended").id(20))
    )
    board = _with_panels(board, backstop_panels(cap))
    board = (
        board
        .with_row(Row(f"Repeats against the stuck threshold (D = {d})").id(30))
        .with_panel(bars(31, f"Long turns (past S = {s}): max key repeat vs D = {d}, by how the turn ended",
                         f"Turns that made more than S = {s} calls only (turnguard.turn.past_soft_cap). Productive "
                         "long turns stay below D (one short of D = a near miss); turns halted stuck past S are at "
                         "or above it; runaways the backstop ended never repeat enough to be flagged.",
                         _repeat_targets(cap), width=24, height=10))
    )
    board = _with_panels(board.with_row(Row("Probe cohort: what happens past the live thresholds").id(40)),
                         probe_panels(cap))
    return _with_panels(board.with_row(Row("Shadow policies").id(SHADOW_PANEL_IDS[0])), shadow_policy_panels(cap))


# -- output --------------------------------------------------------------------------------------


BOARDS: dict[str, Callable[[CapSettings], Dashboard]] = {
    HALTS_UID: halts_dashboard,
    THRESHOLDS_UID: threshold_validation_dashboard,
}


SCHEMA_VERSION = 42
"""Grafana's last schema version of the v1 dashboard JSON (its DashboardMigrator stops at 42)."""
DATASOURCE_VARIABLE_NOISE = ("auto", "auto_count", "auto_min")
"""Interval-variable fields the SDK writes on every variable; meaningless on a datasource variable."""


def render(board: Dashboard) -> str:
    """Stable JSON text (sorted keys, two-space indent, trailing newline)."""
    data = json.loads(JSONEncoder().encode(board.build()))
    data["schemaVersion"] = SCHEMA_VERSION
    for variable in data["templating"]["list"]:
        if variable["type"] != "interval":
            for key in DATASOURCE_VARIABLE_NOISE:
                variable.pop(key, None)
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def build_all(cap: CapSettings = DEFAULTS) -> dict[str, str]:
    """File name -> JSON text, for every board."""
    return {FILES[uid]: render(make(cap)) for uid, make in BOARDS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT,
                        help="directory for the JSON files (default: dashboards/)")
    parser.add_argument("--soft-cap", type=int, default=DEFAULTS.soft_cap)
    parser.add_argument("--hard-multiplier", type=float, default=DEFAULTS.hard_multiplier)
    parser.add_argument("--stuck-repeat-threshold", type=int, default=DEFAULTS.stuck_repeat_threshold)
    parser.add_argument("--check", action="store_true", help="fail if the files in --out differ from a fresh build")
    args = parser.parse_args(argv)
    try:
        config = GuardConfig(soft_cap=args.soft_cap, hard_multiplier=args.hard_multiplier,
                             stuck_repeat_threshold=args.stuck_repeat_threshold)
    except ValueError as exc:
        parser.error(str(exc))
    if config.cap_mode != "adaptive":
        parser.error(f"--soft-cap must be > 0 (got {args.soft_cap}): the boards chart the adaptive cap")
    built = build_all(CapSettings.from_config(config))
    if args.check:
        stale = [name for name, text in built.items()
                 if not (args.out / name).exists() or (args.out / name).read_text() != text]
        for name in stale:
            print(f"{args.out / name} is stale: run python -m turnguard.boards.build", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in built.items():
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
