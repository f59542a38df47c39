"""Panel and variable builders shared by both boards (grafana-foundation-sdk).

Every panel uses the templated data source, has a unit and a description, and says what it shows
when nothing happened (``noValue``: 0 for a count, a sentence for a share) instead of "No data".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig, ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    CustomVariable,
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    TextBoxVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode,
    BigValueColorMode,
    BigValueGraphMode,
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import DashboardRangeMapOptions as RangeOptions
from grafana_foundation_sdk.models.dashboard import DashboardSpecialValueMapOptions as SpecialOptions
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Panel,
    RangeMap,
    SpecialValueMap,
    SpecialValueMatch,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMapping,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from turnguard._boards import promql as q
from turnguard._boards.series import (
    AGENT,
    COHORT,
    POLICY,
    TURNS,
)

PanelBuilder = Builder[Panel]
"""What the panel functions return (any kind of panel), for ``with_panels``."""
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NO_COUNT = "0"
"""What a count shows when nothing happened."""
NO_SHARE = "no turns in range"
"""What a share, a mean or a percentile shows when nothing was there to divide."""


def _no_value(unit: str) -> str:
    return NO_COUNT if unit == "short" else NO_SHARE


def legend(*labels: str, sep: str = " ") -> str:
    """A legend format naming each label's value: ``{{a}} {{b}}``."""
    return sep.join("{{" + name + "}}" for name in labels)


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = True, exemplar: bool = False) -> Dataquery:
    """A Prometheus target; ``exemplar`` asks for the points' exemplars (links to the halted turn's trace)."""
    target = Dataquery().datasource(DATASOURCE).expr(expr).ref_id(ref).legend_format(legend or "__auto")
    if exemplar:
        target = target.exemplar(True)
    return target.instant() if instant else target.range()


def ref(i: int) -> str:
    return chr(ord("A") + i)


def steps(*marks: tuple[float, str]) -> ThresholdsConfig:
    points = [Threshold(value=None, color="green"), *(Threshold(value=float(v), color=c) for v, c in marks)]
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(points)


def stat_panel(pid: int, title: str, description: str, expr: str, unit: str = "short", width: int = 4) -> stat.Panel:
    """One figure over the time range; a count is 0, not empty, when nothing happened."""
    return stats(pid, title, description, [query(q.zero_or(expr) if unit == "short" else expr)], unit, width)


def stats(pid: int, title: str, description: str, targets: Sequence[Dataquery], unit: str = "short",
          width: int = 4) -> stat.Panel:
    panel = (
        stat.Panel().id(pid).title(title).description(description).datasource(DATASOURCE).unit(unit)
        .height(4).span(width).graph_mode(BigValueGraphMode.NONE).color_mode(BigValueColorMode.VALUE)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(steps()).no_value(_no_value(unit))
    )
    for target in targets:
        panel = panel.with_target(target)
    return panel


def bars(pid: int, title: str, description: str, targets: Sequence[Dataquery], unit: str = "short",
         width: int = 12, height: int = 8) -> bargauge.Panel:
    panel = (
        bargauge.Panel().id(pid).title(title).description(description).datasource(DATASOURCE).unit(unit)
        .height(height).span(width).orientation(VizOrientation.HORIZONTAL)
        .display_mode(BarGaugeDisplayMode.BASIC).min(0)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(steps()).no_value(_no_value(unit))
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
        .height(8).span(width).fill_opacity(10).min(0).no_value(NO_COUNT if unit in ("cps", "short") else NO_SHARE)
        .legend(VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                .placement(LegendPlacement.BOTTOM).calcs([]))
    )
    if marks:
        panel = panel.thresholds(steps(*marks)).thresholds_style(
            GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED)
        )
    for target in targets:
        panel = panel.with_target(target)
    return panel


INFINITE = 1e300
"""The range mapping of +Inf starts here (Grafana has no special value for it)."""


def mapped(texts: Mapping[int, str] | Mapping[str, str], nan: str | None = None, infinite: str | None = None,
           ) -> list[ValueMapping]:
    """Value mappings: each value shown as its text, NaN (nothing to divide) as ``nan``, +Inf (no
    end) as ``infinite``."""
    mappings: list[ValueMapping] = [ValueMap(options={str(k): ValueMappingResult(text=t, index=i)
                                                for i, (k, t) in enumerate(texts.items())})] if texts else []
    if nan is not None:
        mappings.append(SpecialValueMap(options=SpecialOptions(match=SpecialValueMatch.NA_N,
                                                               result=ValueMappingResult(text=nan))))
    if infinite is not None:
        mappings.append(RangeMap(options=RangeOptions(from_val=INFINITE, to=None,
                                                      result=ValueMappingResult(text=infinite))))
    return mappings


def table_panel(pid: int, title: str, description: str, key: str, columns: Mapping[str, str],
                units: Mapping[str, str], width: int = 24, height: int = 8, *, row_names: Mapping[str, str],
                mappings: Mapping[str, list[ValueMapping]] | None = None) -> table.Panel:
    """A table of one row per value of ``key``: each of ``columns`` (name -> a vector by ``key``) an
    instant query, merged on ``key``; counts unless ``units`` says otherwise."""
    targets = [query(expr, name, ref(i)).format(PromQueryFormat.TABLE)
               for i, (name, expr) in enumerate(columns.items())]
    rename = {f"Value #{ref(i)}": name for i, name in enumerate(columns)} | {key: "row"}
    order = {"row": 0} | {name: i + 1 for i, name in enumerate(columns)}
    panel = (
        table.Panel().id(pid).title(title).description(description).datasource(DATASOURCE).unit("short")
        .height(height).span(width).no_value(NO_COUNT)
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True}, "renameByName": rename, "indexByName": order}))
        .override_by_name("row", [DynamicConfigValue("mappings", mapped(row_names)),
                                  DynamicConfigValue("displayName", "row")])
    )
    for name, unit in units.items():
        panel = panel.override_by_name(name, [DynamicConfigValue("unit", unit),
                                              DynamicConfigValue("noValue", NO_SHARE)])
    for name, values in (mappings or {}).items():
        panel = panel.override_by_name(name, [DynamicConfigValue("mappings", values)])
    for target in targets:
        panel = panel.with_target(target)
    return panel


# -- the board itself: variables, annotations --------------------------------------------------------


ALL = VariableOption(selected=True, text="All", value="$__all")


def base(uid: str, title: str, description: str, tags: Sequence[str], *, tolerance: str | None = None) -> Dashboard:
    """A board with the variables every panel reads: data source, cohort (``live`` by default: probe
    panels name theirs), policy and agent (All saved as the default, within the cohort), and on the
    threshold board the operator's ``tolerance``."""
    live = f'{TURNS}{{{COHORT}=~"${q.COHORT_VARIABLE}"}}'
    cohort = (
        CustomVariable(q.COHORT_VARIABLE).label("Cohort").values(f"{q.LIVE},{q.PROBE}")
        .description("Which turns the panels without a cohort of their own show: live (guarded by the main "
                     "configuration) or probe. The probe panels always read the probe cohort.")
        .current(VariableOption(selected=True, text=q.LIVE, value=q.LIVE))
        .options([VariableOption(selected=True, text=q.LIVE, value=q.LIVE),
                  VariableOption(selected=False, text=q.PROBE, value=q.PROBE)])
    )
    policies = (
        QueryVariable(q.POLICY_VARIABLE).label("Policy").datasource(DATASOURCE)
        .query(f"label_values({live}, {POLICY})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True).include_all(True).all_value(".*").sort(VariableSort.ALPHABETICAL_ASC).current(ALL)
    )
    agents = (
        QueryVariable(q.AGENT_VARIABLE).label("Agent").datasource(DATASOURCE)
        .query(f"label_values({live}, {AGENT})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True).include_all(True).all_value(".*").sort(VariableSort.ALPHABETICAL_ASC).current(ALL)
    )
    board = (
        Dashboard(title).uid(uid).description(description).tags(list(tags)).readonly()
        .time("now-24h", "now").refresh("1m").timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(cohort).with_variable(policies).with_variable(agents)
        .annotation(policy_changes())
    )
    if tolerance is not None:
        board = board.with_variable(
            TextBoxVariable(q.TOLERANCE_VARIABLE).label("Tolerance").default_value(tolerance)
            .description("The share of the turns a threshold halts that would have succeeded, that you accept "
                         "(0.10: one in ten). The probe rows say whether the evidence decides against it.")
            .current(VariableOption(selected=True, text=tolerance, value=tolerance)))
    return board


def policy_changes() -> AnnotationQuery:
    """A mark where a policy name first reports (a new or renamed GuardConfig went live)."""
    named = f'{TURNS}{{{POLICY}!=""}}'
    return (
        AnnotationQuery().name("Policy changes").datasource(DATASOURCE).enable(True).icon_color("purple")
        .expr(f"group by ({POLICY}) ({named}) unless group by ({POLICY}) ({named} offset 10m)")
    )


def with_panels(board: Dashboard, panels: Sequence[PanelBuilder]) -> Dashboard:
    for panel in panels:
        board = board.with_panel(panel)
    return board
