"""The grafana/dashboard-linter rules that apply to turnguard's boards, as pytest checks.

The Go linter cannot be installed here, so its relevant rules are re-stated below (rule names in
the comments), applied to the committed JSON, and each is shown to catch the mistake it is for.
Exceptions, stated here rather than in a ``.lint`` file: counts are ``promql.counted`` (the last
sample in ``$__range``, ``$__rate_interval`` or the heatmap's ``$__interval`` less the last one up to
a day before it: no ``increase``, no bare counter after ``offset``) or, on the
threshold-validation board, recorded tiles summed by ``sum_over_time`` over ``$__range`` or
``$__interval``, and
``rate``/``irate`` must use ``$__rate_interval``; the job/instance rules are left out because
OpenTelemetry-sourced series get ``job`` from ``service.name``, which
the boards must not assume.

The project's own rules follow, each stated for every panel, so that a panel added later is held to
them too: counting from zero, the agent, policy and cohort variables (no panel mixes the live and
probe cohorts by leaving the cohort out), 0 instead of "No data", a figure built on per-turn
distributions saying that halted turns are censored in it, percentiles beside the halted share,
halts named by what stopped them (never "runaway"), the backstop's halts beside the probe's resolved
share, every resolved share with its interval, its decision against the tolerance variable and the
evidence still needed, a probe row for every threshold in force, and no live figure past the live
backstop. They run on the committed boards and on boards rendered for other configurations.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import optional_dependency
from turnguard._boards import promql, queries
from turnguard._config import GuardConfig
from turnguard.telemetry import _names as n

yaml = optional_dependency("yaml")

DEFAULT_CONFIG = GuardConfig()

BOARD_DIR = queries.BOARDS
BOARDS = queries.boards(BOARD_DIR)
HALTS, THRESHOLDS = "turnguard-halts", "turnguard-threshold-validation"
SHADOW_IDS = range(100, 200)

VALID_UNITS = frozenset({"short", "none", "percent", "percentunit", "cps", "ops", "reqps", "s", "ms", "bytes"})
"""Grafana unit ids the boards may use (a subset of Grafana's; a typo is not a unit)."""
RANGE_FUNCTION = re.compile(r"\b(rate|irate|increase|(?:last|min|max|sum)_over_time|resets)\(\s*[^\[\]]*\[([^\]]+)\]")
COUNTER = re.compile(r"\b([a-zA-Z_:][\w:]*_total)\b")
COUNT_WINDOWS = {"$__rate_interval", "$__range", "$__interval"}
ALLOWED_RANGES = {"rate": {"$__rate_interval"}, "irate": {"$__rate_interval"},
                  "increase": COUNT_WINDOWS, "min_over_time": COUNT_WINDOWS, "max_over_time": COUNT_WINDOWS,
                  "resets": COUNT_WINDOWS, "last_over_time": COUNT_WINDOWS | {promql.COUNTED_LOOKBACK},
                  "sum_over_time": {"$__range", "$__interval"}}
"""A count's windows (``promql.counted``'s ``before`` looks a day back from the window's start).
Recorded 5-minute tiles are summed over the range or the step's own interval, never over
``$__rate_interval`` (the interval plus a scrape interval: not a whole number of tiles)."""

PANEL_IDS = {
    HALTS: {1: "row", 2: "stat", 3: "stat", 4: "stat", 5: "stat", 6: "stat", 7: "stat", 10: "row",
            11: "timeseries", 12: "timeseries", 13: "bargauge", 20: "row", 21: "bargauge", 22: "bargauge",
            23: "bargauge", 30: "row", 31: "bargauge", 32: "bargauge", 33: "timeseries", 40: "row", 41: "bargauge",
            42: "timeseries", 50: "row", 51: "stat", 52: "timeseries", 53: "timeseries", 54: "timeseries",
            60: "row", 61: "bargauge", 62: "bargauge"},
    THRESHOLDS: {1: "row", 2: "heatmap", 3: "timeseries", 4: "bargauge", 10: "row", 11: "stat", 12: "bargauge",
                 13: "bargauge", 20: "row", 21: "stat", 22: "stat", 23: "stat", 24: "stat", 25: "stat",
                 26: "bargauge", 27: "stat", 30: "row", 31: "bargauge", 40: "row", 41: "table", 43: "bargauge",
                 44: "table", 47: "table", 48: "text",
                 100: "row", 101: "bargauge", 102: "bargauge", 103: "bargauge", 104: "bargauge", 105: "timeseries"},
}
"""The stable panel ids (links and annotations point at them): renumbering is a breaking change. Retired,
never to be reused: threshold validation 42 and 45 (their counts are columns of 41 and 44), 46 (the
calls past each threshold, a column of 44)."""
RETIRED = {THRESHOLDS: {42, 45, 46}}
CONFIGURED_IDS = {THRESHOLDS: {49: "table", 50: "table"}}
"""Panels only a board built for some configurations has (49: the soft, explicit and cycle caps'
frontier, where the probe runs past them; 50: D's and the streak stop's, where a probe is
configured): pinned like the others, absent from the committed board."""


def _content_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that show figures (not rows, nor text panels: words only)."""
    return [p for p in queries.panels(board) if p["type"] not in ("row", "text")]


# -- the rules (each returns the problems it finds) -----------------------------------------------


def template_datasource_rule(board):
    found = [v for v in board.get("templating", {}).get("list", []) if v.get("type") == "datasource"]
    if len(found) != 1:
        return [f"expected exactly one datasource variable, found {len(found)}"]
    var = found[0]
    problems = []
    if var.get("name") != "datasource":
        problems.append(f"datasource variable is named {var.get('name')!r}, not 'datasource'")
    if var.get("label") != "Data source":
        problems.append(f"datasource variable is labelled {var.get('label')!r}, not 'Data source'")
    if var.get("query") != "prometheus":
        problems.append(f"datasource variable selects {var.get('query')!r} data sources, not prometheus")
    return problems


def panel_datasource_rule(board):
    problems = []
    for panel in _content_panels(board):
        for where, ds in [("panel", panel.get("datasource")), *(("target " + t.get("refId", "?"), t.get("datasource"))
                                                                for t in panel.get("targets", []))]:
            if not ds or ds.get("uid") != "${datasource}":
                problems.append(f"panel {panel['id']} {where}: datasource {ds!r} is not ${{datasource}}")
    if "__inputs" in board or "${DS_" in json.dumps(board):
        problems.append("uses __inputs/${DS_...}: only the UI import resolves them, provisioning does not")
    return problems


def panel_units_rule(board):
    problems = []
    for panel in _content_panels(board):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in VALID_UNITS:
            problems.append(f"panel {panel['id']} ({panel['title']}): unit {unit!r}")
    return problems


def panel_title_description_rule(board):
    return [f"panel {p['id']}: needs a title and a description" for p in _content_panels(board)
            if not p.get("title") or not p.get("description")]


def target_rate_interval_rule(board):
    problems = []
    for q in queries.panel_queries(board):
        for function, interval in RANGE_FUNCTION.findall(q.expr):
            if interval not in ALLOWED_RANGES[function]:
                problems.append(f"panel {q.panel_id} {q.ref_id}: {function}(...[{interval}])")
    return problems


def target_counter_agg_rule(board):
    problems = []
    for q in queries.panel_queries(board):
        for match in COUNTER.finditer(q.expr):
            # promql.counted reads a counter's samples with these (its last, least and greatest
            # value in the window and the day before it, its resets) instead of increase()
            if not re.search(r"\b(rate|irate|increase|(last|min|max)_over_time|resets)\(\s*$",
                             q.expr[: match.start()]):
                problems.append(f"panel {q.panel_id} {q.ref_id}: counter {match.group(1)} not in rate/increase")
    return problems


def panel_no_targets_rule(board):
    problems = []
    for panel in _content_panels(board):
        refs = [t.get("refId") for t in panel.get("targets", [])]
        if not refs:
            problems.append(f"panel {panel['id']}: no queries")
        if not all(refs) or len(set(refs)) != len(refs):
            problems.append(f"panel {panel['id']}: refIds {refs} must be set and unique")
    return problems


def uneditable_dashboard_rule(board):
    return [] if board.get("editable") is False else [f"editable is {board.get('editable')!r}, not false"]


def stable_panel_ids_rule(board):
    ids = [p.get("id") for p in queries.panels(board)]
    problems = [f"panel {p.get('title')!r} has no integer id" for p in queries.panels(board)
                if not isinstance(p.get("id"), int)]
    if len(set(ids)) != len(ids):
        problems.append(f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}")
    pinned = PANEL_IDS.get(board["uid"], {})
    actual = {p["id"]: p["type"] for p in queries.panels(board) if isinstance(p.get("id"), int)}
    for pid, kind in pinned.items():
        if actual.get(pid) != kind:
            problems.append(f"panel id {pid} should be a {kind}, is {actual.get(pid)!r}")
    reused = set(actual) & RETIRED.get(board["uid"], set())
    if reused:
        problems.append(f"retired panel ids {sorted(reused)} reused")
    optional = CONFIGURED_IDS.get(board["uid"], {})
    problems += [f"panel id {pid} should be a {kind}, is {actual[pid]!r}" for pid, kind in optional.items()
                 if pid in actual and actual[pid] != kind]
    extra = set(actual) - set(pinned) - set(optional) - (set(SHADOW_IDS) if board["uid"] == THRESHOLDS else set())
    if extra:
        problems.append(f"unpinned panel ids {sorted(extra)}: add them to PANEL_IDS (never renumber)")
    return problems


COUNTED = re.compile(r"last_over_time\((\w+(?:\{[^}]*\})?)\[(\$__\w+)\]\)")
"""A raw counter's last sample in a dashboard window: ``promql.counted``'s ``now``."""
INSTANT_OFFSET = re.compile(r"(?<![\w\]])(\w+(?:\{[^}]*\})?) offset \$__\w+")
"""A bare series after ``offset``: looks back only the lookback delta (5 minutes) before the window."""
AGENT_MATCHER = '=~"$agent"'
RULES_FILE = Path(__file__).resolve().parents[1] / "rules" / "turnguard.rules.yaml"


def _records_by() -> dict[str, set[str]]:
    """Each record of the shipped rules file -> the labels it keeps (its outer ``sum by``)."""
    found = {}
    for rule in (r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "record" in r):
        by = re.match(r"\s*sum by \(([^)]*)\)", rule["expr"])
        found[rule["record"]] = {name.strip() for name in by.group(1).split(",")} if by else set()
    return found


def carrying(attribute: str) -> re.Pattern[str]:
    """A selector of any series that carries ``attribute``'s label: a raw metric that exports it
    (``names.METRIC_ATTRIBUTES``) or a record of the rules file that keeps it, with its matchers.
    Not the label ``turnguard_turn_tool_calls_bucket`` (the results counter's) that spells a metric."""
    label = attribute.replace(".", "_")
    raw = [metric.replace(".", "_") for metric, keys in n.METRIC_ATTRIBUTES.items() if attribute in keys]
    records = [record for record, by in _records_by().items() if label in by]
    metrics = "|".join(map(re.escape, sorted(raw, key=len, reverse=True)))
    names = "|".join([*map(re.escape, sorted(records, key=len, reverse=True)),
                      f"(?:{metrics})(?:_total|_bucket|_sum|_count)?"])
    return re.compile(rf"(?<![\w:])({names})(?![\w:=!])(\{{[^}}]*\}})?")


AGENT_MATCHER = '=~"$agent"'
AGENT_SCOPED = carrying(n.GEN_AI_AGENT_NAME)
SCHEMA_VERSION = 42
RECORD_TILE = "5m"
"""The recording rules' tile (rules/turnguard.rules.yaml's group interval)."""
EXEMPLAR_PANELS = {HALTS: {11, 12}}
"""Panels whose points link to the turn's trace (Tempo): detections and halts over time."""


def count_from_zero_rule(board):
    """Every count is ``promql.counted``'s: a series born in the window counts from zero, one silent
    for longer than the lookback delta before it (a gap) counts from its last sample, not again
    from zero. ``increase()`` drops a new series' first sample; ``m offset $__range`` sees a sample
    only 5 minutes back."""
    problems = []
    for q in queries.panel_queries(board):
        if "increase(" in q.expr:
            problems.append(f"panel {q.panel_id} {q.ref_id}: increase() drops a new series' first sample")
        for series in INSTANT_OFFSET.findall(q.expr):
            problems.append(f"panel {q.panel_id} {q.ref_id}: {series} offset: a gap reads as a new series")
        for series, window in COUNTED.findall(q.expr):
            before = f"last_over_time({series}[{promql.COUNTED_LOOKBACK}] offset {window}) or 0 * "
            if before not in q.expr or f"resets({series}[{window}])" not in q.expr:
                problems.append(f"panel {q.panel_id} {q.ref_id}: {series} over {window} is not promql.counted")
    return problems


def agent_variable_rule(board):
    problems = []
    variable = [v for v in board["templating"]["list"] if v.get("name") == "agent"]
    if not variable or variable[0].get("includeAll") is not True or variable[0].get("allValue") != ".*":
        problems.append("no multi-value agent variable with All = .*")
    for q in queries.panel_queries(board):
        for metric, selector in AGENT_SCOPED.findall(q.expr):
            if AGENT_MATCHER not in (selector or ""):
                problems.append(f"panel {q.panel_id} {q.ref_id}: {metric} ignores the agent variable")
    return problems


POLICY_SCOPED = re.compile(r"\b(turnguard(?:_\w+|:\w+:increase5m))(?:(\{[^}]*\})|(?=\[))")
"""Every turnguard metric carries ``turnguard_policy`` (``GuardConfig.name``), and every record keeps it."""
POLICY_MATCHERS = ('turnguard_policy=~"$policy"', 'turnguard_policy=~"($policy)(-probe)?"')


def policy_variable_rule(board):
    """One policy's series at a time: a threshold change under a new name is a new series, not a mix."""
    problems = []
    variable = [v for v in board["templating"]["list"] if v.get("name") == "policy"]
    if not variable or variable[0].get("includeAll") is not True or variable[0].get("allValue") != ".*":
        problems.append("no multi-value policy variable with All = .*")
    elif "turnguard_policy" not in json.dumps(variable[0].get("query")):
        problems.append("the policy variable does not list turnguard_policy values")
    for q in queries.panel_queries(board):
        for metric, selector in POLICY_SCOPED.findall(q.expr):
            if not any(m in (selector or "") for m in POLICY_MATCHERS):
                problems.append(f"panel {q.panel_id} {q.ref_id}: {metric} ignores the policy variable")
    return problems


def current_schema_rule(board):
    problems = [] if board.get("schemaVersion") == SCHEMA_VERSION else [f"schemaVersion {board.get('schemaVersion')}"]
    for v in board["templating"]["list"]:
        noise = {"auto", "auto_count", "auto_min"} & set(v)
        if v.get("type") != "interval" and noise:
            problems.append(f"variable {v['name']}: interval fields {sorted(noise)}")
    return problems


def exemplars_and_annotations_rule(board):
    problems = []
    for panel in _content_panels(board):
        wanted = panel["id"] in EXEMPLAR_PANELS.get(board["uid"], ())
        if wanted and not all(t.get("exemplar") for t in panel["targets"]):
            problems.append(f"panel {panel['id']}: no exemplars")
    policy = [a for a in board.get("annotations", {}).get("list", []) if "turnguard_policy" in a.get("expr", "")]
    if not policy or not policy[0].get("enable"):
        problems.append("no policy-change annotation")
    return problems


# -- censoring, cohorts, probe rows, intervals: the classes of defect issue 19 names ----------------------


COHORT_SCOPED = carrying(n.TURN_COHORT)
"""Every series that carries ``turnguard_turn_cohort`` (raw or recorded)."""
COHORT_MATCHERS = {'turnguard_turn_cohort=~"$cohort"': "the variable", 'turnguard_turn_cohort="probe"': "probe",
                   'turnguard_turn_cohort="live"': "live", 'turnguard_turn_cohort=~"live|probe"': "both",
                   'turnguard_turn_cohort=""': "no turn"}
"""``no turn``: results that reached no turn (unknown, expired, invalid) carry no cohort."""
BOTH_COHORTS_SAID = "both cohorts"


def _selectors(board, pattern=COHORT_SCOPED):
    for panel in _content_panels(board):
        for target in panel.get("targets", []):
            for metric, selector in pattern.findall(target.get("expr", "")):
                yield panel, target, metric, selector or ""


def cohort_variable_rule(board):
    """A ``cohort`` variable (live by default, never All), and every cohort-carrying selector names a
    cohort: the variable's, probe or live; both cohorts only where the panel says so."""
    problems = []
    found = [v for v in board["templating"]["list"] if v.get("name") == "cohort"]
    if not found:
        return ["no cohort variable"]
    variable = found[0]
    values = {o.get("value") for o in variable.get("options", [])}
    if (variable.get("type") != "custom" or values != {"live", "probe"} or variable.get("includeAll")
            or variable.get("multi") or variable.get("current", {}).get("value") != "live"):
        problems.append(f"the cohort variable must offer live and probe, default live, no All: {variable}")
    for panel, target, metric, selector in _selectors(board):
        named = [kind for matcher, kind in COHORT_MATCHERS.items() if matcher in selector]
        if len(named) != 1:
            problems.append(f"panel {panel['id']} {target['refId']}: {metric} names no cohort (mixes them)")
        elif named == ["both"] and BOTH_COHORTS_SAID not in panel["description"]:
            problems.append(f"panel {panel['id']}: reads both cohorts without saying so")
    return problems


def saved_defaults_rule(board):
    """The policy and agent variables save All as their default, and list the cohort's values only."""
    problems = []
    for name in ("policy", "agent"):
        variable = next((v for v in board["templating"]["list"] if v.get("name") == name), {})
        if variable.get("current", {}).get("value") not in ("$__all", ["$__all"]):
            problems.append(f"the {name} variable saves {variable.get('current')!r}, not All")
        if '$cohort' not in json.dumps(variable.get("query")):
            problems.append(f"the {name} variable lists values of every cohort")
    return problems


def no_value_rule(board):
    """Where nothing happened a panel says so (0 for a count), never Grafana's "No data"."""
    return [f"panel {p['id']} ({p['title']}): no noValue" for p in _content_panels(board)
            if not p.get("fieldConfig", {}).get("defaults", {}).get("noValue")]


DISTRIBUTION = re.compile(r"histogram_quantile|turnguard[_:]turn_(?:tool_calls|max_key_repeat)_bucket")
"""A per-turn distribution (how many calls or repeats turns made): a halted turn is censored in it."""
CENSORED = "censored"


def censoring_said_rule(board):
    """A figure built from per-turn distributions depends on halted turns, censored at their halt: it
    says so."""
    return [f"panel {p['id']} ({p['title']}): reads a per-turn distribution and does not say "
            f"{CENSORED!r} in its description"
            for p in _content_panels(board)
            if any(DISTRIBUTION.search(t.get("expr", "")) for t in p.get("targets", []))
            and CENSORED not in p["description"]]


def halted_share_beside_percentiles_rule(board):
    """A percentile of the turns that were not halted is drawn beside the halted share."""
    problems = []
    for panel in _content_panels(board):
        targets = panel.get("targets", [])
        if any("histogram_quantile" in t.get("expr", "") for t in targets):
            beside = [t for t in targets if 'turnguard_loop_threshold!="none"' in t.get("expr", "")
                      and "halted share" in t.get("legendFormat", "")]
            if not beside:
                problems.append(f"panel {panel['id']}: percentiles without the halted share beside them")
    return problems


def _texts(board):
    for panel in queries.panels(board):
        yield panel["id"], panel.get("title", "")
        yield panel["id"], panel.get("description", "")
        for target in panel.get("targets", []):
            yield panel["id"], target.get("legendFormat", "")
        yield panel["id"], json.dumps(panel.get("fieldConfig", {}))


def no_runaway_claims_rule(board):
    """A halt says what stopped the turn ("halted at the backstop"), never what it was doing."""
    return [f"panel {pid}: says 'runaway': {text[:80]!r}" for pid, text in _texts(board)
            if "runaway" in text.lower()]


BACKSTOP_HALTS = 'turnguard_loop_threshold="hard_backstop"'
PROBE_BACKSTOP = re.compile(r'turnguard_probe_main_threshold=~?"[^"]*hard_backstop')


def _rows(board):
    """Row title -> the content panels under it (in the order the board lists them)."""
    rows, current = {}, None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = list(panel.get("panels", []))
        elif current is not None:
            rows[current].append(panel)
    return rows


def backstop_beside_probe_rule(board):
    """Panels of the backstop's halts sit beside the probe's resolved share of such turns, with its
    interval: a halt at the backstop is not a runaway until the probe says so."""
    problems = []
    for title, panels in _rows(board).items():
        about_backstop = [p for p in panels if p.get("targets")
                          and all(BACKSTOP_HALTS in t.get("expr", "") for t in p["targets"])]
        beside = [p for p in panels if any(PROBE_BACKSTOP.search(t.get("expr", "")) for t in p.get("targets", []))
                  and any(t.get("legendFormat") == "95% low" for t in p["targets"])]
        if about_backstop and not beside:
            problems.append(f"row {title!r}: backstop halts (panels {[p['id'] for p in about_backstop]}) without "
                            "the probe's resolved share and interval beside them")
    return problems


RESOLVED_SHARE = re.compile(r'turnguard_turn_resolved="true".*\)\s*/\s*\(')
EVIDENCE_COLUMNS = ("95% low", "95% high", "decision", "more probe turns", "time at this rate")
FRONTIER_COLUMNS = ("productive seen, 95% high", "backstop here spares them")
"""Panel 41's bound of the productive turns seen and its decision against the tolerance: a bound,
not a share, and never one without the other (checked below; panel 49's decision is
``CAP_FRONTIER_SPARES``)."""
CAP_FRONTIER_SPARES = "value here spares them"


def interval_beside_share_rule(board):
    """A share of resolved turns never shows alone: its 95% interval, the decision against the tolerance
    (which reads the ``tolerance`` variable) and the evidence still needed are beside it."""
    problems = []
    for panel in _content_panels(board):
        targets = panel.get("targets", [])
        legends = {t.get("legendFormat") for t in targets}
        shares = [t for t in targets if RESOLVED_SHARE.search(t.get("expr", "")) and t.get("legendFormat") not in
                  (*EVIDENCE_COLUMNS, *FRONTIER_COLUMNS, CAP_FRONTIER_SPARES)]
        decisions = legends & {FRONTIER_COLUMNS[1], CAP_FRONTIER_SPARES}
        if (FRONTIER_COLUMNS[0] in legends) != bool(decisions) or len(decisions) > 1:
            problems.append(f"panel {panel['id']}: {FRONTIER_COLUMNS[0]!r} needs one decision beside it, has "
                            f"{sorted(decisions)}")
        for t in targets:
            if t.get("legendFormat") in decisions and "$tolerance" not in t["expr"]:
                problems.append(f"panel {panel['id']}: {t['legendFormat']!r} does not read $tolerance")
        if shares and not set(EVIDENCE_COLUMNS) <= legends:
            problems.append(f"panel {panel['id']}: a resolved share without {sorted(set(EVIDENCE_COLUMNS) - legends)}")
        for target in targets:
            if target.get("legendFormat") in ("decision", "more probe turns") and "$tolerance" not in target["expr"]:
                problems.append(f"panel {panel['id']} {target['refId']}: does not read $tolerance")
    return problems


PRODUCT_LIMIT = "1 - exp(-(max(ln("
SURVIVAL_COLUMNS = ("95% low", "95% high", "at risk past the backstop")


def survival_interval_rule(board):
    """A product-limit share never shows alone (a bare 0% or 100% says nothing about how many turns
    it rests on): its 95% interval and the turns at risk are beside it, each reading the buckets too."""
    problems = []
    for panel in _content_panels(board):
        targets = panel.get("targets", [])
        if not any(PRODUCT_LIMIT in t.get("expr", "") for t in targets):
            continue
        legends = {t.get("legendFormat"): t.get("expr", "") for t in targets}
        missing = [c for c in SURVIVAL_COLUMNS if "turnguard" not in legends.get(c, "")]
        if missing:
            problems.append(f"panel {panel['id']}: a product-limit share without {missing}")
    return problems


def tolerance_variable_rule(board):
    """A board that decides against a tolerance lets the operator set it (default 0.10)."""
    decides = "$tolerance" in json.dumps([t for p in _content_panels(board) for t in p.get("targets", [])])
    found = [v for v in board["templating"]["list"] if v.get("name") == "tolerance"]
    if not decides:
        return [] if not found else ["a tolerance variable nothing reads"]
    if not found or found[0].get("type") != "textbox" or found[0].get("query") != "0.10":
        return [f"no textbox variable tolerance defaulting to 0.10: {found}"]
    return []


ZERO_ROW = re.compile(r'label_replace\(vector\(0\), "turnguard_probe_main_threshold", "(\w+)", "", ""\)')
MAIN_MATCHER = re.compile(r'turnguard_probe_main_threshold=~"([\w|]+)"')


def in_force(config):
    """The thresholds that can halt a turn under ``config``: each must have its probe row."""
    mode = config.cap_mode
    return ({"hard_backstop", "soft_stuck"} if mode == "adaptive" else set()) | (
        {"explicit"} if mode == "explicit" else set()) | ({"streak"} if config.streak_stop_at else set()) | (
        {"cycle_cap"} if config.max_cycles_per_turn else set())


def probe_row_per_threshold_rule(board, config=None):
    """Each query of a probe table by threshold has a row, 0 where nothing happened, for every
    threshold the configuration has in force, and no other."""
    wanted = in_force(config or DEFAULT_CONFIG)
    problems = []
    tables = [p for p in _content_panels(board) if p["type"] == "table"
              and any("turnguard_probe_main_threshold" in t.get("expr", "") for t in p.get("targets", []))]
    if board["uid"] == THRESHOLDS and not tables:
        problems.append("no probe evidence table by threshold")
    for panel in tables:
        for target in panel["targets"]:
            expr = target["expr"]
            zero = set(ZERO_ROW.findall(expr))
            matched = {v for m in MAIN_MATCHER.findall(expr) for v in m.split("|")}
            if zero != wanted or matched - wanted:
                problems.append(f"panel {panel['id']} {target['refId']}: rows {sorted(zero)} (matching "
                                f"{sorted(matched)}), the thresholds in force are {sorted(wanted)}")
    return problems


BUCKET_EDGE = re.compile(r"turnguard[_:]turn_tool_calls_bucket(?::increase5m)?\{([^}]*)\}")
LE = re.compile(r"le=~[`\"]([^`\"]*)[`\"]")


def live_figures_within_the_live_cap_rule(board, config=None):
    """No figure of the live cohort reads past the live backstop: every live turn that got there was
    halted at it, so all a bucket past it holds is the censoring."""
    config = config or DEFAULT_CONFIG
    # the adaptive panels read adaptive turns: without an adaptive cap they are built on the default one
    hard_cap = (config if config.cap_mode == "adaptive" else DEFAULT_CONFIG).hard_cap or 0
    problems = []
    for panel in _content_panels(board):
        for target in panel.get("targets", []):
            for selector in BUCKET_EDGE.findall(target.get("expr", "")):
                if 'turnguard_turn_cohort=~"$cohort"' not in selector:
                    continue
                edges = [int(e) for e in re.findall(r"(\d+)\(", " ".join(LE.findall(selector)))]
                if any(e > hard_cap for e in edges):
                    problems.append(f"panel {panel['id']} {target['refId']}: a live bucket past {hard_cap}: {edges}")
    return problems


ESTIMATE = re.compile(r"\b(?:exp|ln|histogram_quantile)\(")
TOOL_CALL_BUCKETS = re.compile(r"turnguard[_:]turn_tool_calls(?:_fate)?_bucket(?::increase5m)?\{([^}]*)\}")
PAST_THE_PROBE_CAP = "past the probe's cap"


def estimates_within_the_probe_cap_rule(board, config=None):
    """No estimate (a product-limit share, a quantile) reads a tool-call bucket past the probe's own
    cap: no probe turn passes it, so past it there is only censoring, and a bucket the cap cuts reads
    as if every turn in it finished. Such a figure is named as past the probe's cap and reads no
    bucket (with no probe in the configuration the board cannot know the cap)."""
    probe = (config or DEFAULT_CONFIG).probe_settings()
    cap = probe.config.hard_cap if probe is not None else None
    problems = []
    for panel in _content_panels(board) if cap is not None else []:
        for target in panel.get("targets", []):
            expr, name = target.get("expr", ""), target.get("legendFormat", "")
            edges = [int(e) for selector in TOOL_CALL_BUCKETS.findall(expr)
                     for e in re.findall(r"(\d+)\(", " ".join(LE.findall(selector)))]
            if ESTIMATE.search(expr) and any(e > cap for e in edges):
                problems.append(f"panel {panel['id']} {target['refId']}: an estimate past the probe's cap {cap}")
            if PAST_THE_PROBE_CAP in name and edges:
                problems.append(f"panel {panel['id']} {target['refId']}: {name!r} reads buckets {edges}")
    return problems


def override_units_rule(board):
    """Units set per column or per query are Grafana units too."""
    problems = []
    for panel in _content_panels(board):
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in override.get("properties", []):
                if prop.get("id") == "unit" and prop.get("value") not in VALID_UNITS:
                    problems.append(f"panel {panel['id']}: override unit {prop.get('value')!r}")
    return problems


RULES: dict[str, Callable[..., list[str]]] = {
    "template-datasource-rule": template_datasource_rule,
    "panel-datasource-rule": panel_datasource_rule,
    "panel-units-rule": panel_units_rule,
    "panel-title-description-rule": panel_title_description_rule,
    "target-rate-interval-rule": target_rate_interval_rule,
    "target-counter-agg-rule": target_counter_agg_rule,
    "panel-no-targets-rule": panel_no_targets_rule,
    "uneditable-dashboard": uneditable_dashboard_rule,
    "stable-panel-ids": stable_panel_ids_rule,
    "count-from-zero": count_from_zero_rule,
    "agent-variable": agent_variable_rule,
    "policy-variable": policy_variable_rule,
    "current-schema": current_schema_rule,
    "exemplars-and-annotations": exemplars_and_annotations_rule,
    "cohort-variable": cohort_variable_rule,
    "saved-defaults": saved_defaults_rule,
    "no-value": no_value_rule,
    "censoring-said": censoring_said_rule,
    "halted-share-beside-percentiles": halted_share_beside_percentiles_rule,
    "no-runaway-claims": no_runaway_claims_rule,
    "backstop-beside-probe": backstop_beside_probe_rule,
    "interval-beside-share": interval_beside_share_rule,
    "survival-interval": survival_interval_rule,
    "tolerance-variable": tolerance_variable_rule,
    "probe-row-per-threshold": probe_row_per_threshold_rule,
    "live-figures-within-the-live-cap": live_figures_within_the_live_cap_rule,
    "estimates-within-the-probe-cap": estimates_within_the_probe_cap_rule,
    "override-units": override_units_rule,
}
CONFIGURED = frozenset({"probe-row-per-threshold", "live-figures-within-the-live-cap",
                        "estimates-within-the-probe-cap"})
"""Rules that check a board against the configuration it was built for."""


# -- the committed boards pass every rule -----------------------------------------------------------


def test_both_boards_are_committed():
    assert set(BOARDS) == {HALTS, THRESHOLDS}


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_board_passes_lint_rule(uid, rule):
    assert RULES[rule](BOARDS[uid]) == []


def test_rows_group_every_panel():
    for board in BOARDS.values():
        assert board["panels"][0]["type"] == "row"


def test_heatmap_counts_each_step_once_in_whole_recorded_tiles():
    """The window is the step ($__interval: no event in two cells), over recorded 5-minute tiles."""
    (heatmap,) = [p for p in queries.panels(BOARDS[THRESHOLDS]) if p["type"] == "heatmap"]
    windows = {w for t in heatmap["targets"] for _, w in RANGE_FUNCTION.findall(t["expr"])}
    assert windows == {"$__interval"}
    assert all("sum_over_time(turnguard:" in t["expr"] for t in heatmap["targets"])
    assert heatmap["interval"] == RECORD_TILE


def tiles_rule(board):
    """A panel summing recorded tiles over ``$__interval`` has the tile as its minimum interval:
    Grafana's interval is then a whole number of tiles (5m, 10m, 15m, 30m, 1h...)."""
    problems = []
    for panel in _content_panels(board):
        summed = [t for t in panel.get("targets", []) if re.search(r"sum_over_time\(turnguard:[^\[]*\[\$__interval\]",
                                                                      t.get("expr", ""))]
        if summed and panel.get("interval") != RECORD_TILE:
            problems.append(f"panel {panel['id']}: sums records over $__interval with min interval "
                            f"{panel.get('interval')!r}, not {RECORD_TILE}")
    return problems


def test_panels_summing_records_per_step_step_in_whole_tiles():
    board = BOARDS[THRESHOLDS]
    stepped = [p for p in _content_panels(board)
               if any("[$__interval]" in t["expr"] and "turnguard:" in t["expr"] for t in p["targets"])]
    assert {p["id"] for p in stepped} == {2, 3, 105}
    assert tiles_rule(board) == []
    broken = copy.deepcopy(board)
    next(p for p in _content_panels(broken) if p["id"] == 105)["interval"] = "1m"
    assert tiles_rule(broken) == ["panel 105: sums records over $__interval with min interval '1m', not 5m"]


def test_heatmap_reads_prometheus_buckets_as_they_are():
    heatmaps = [p for p in queries.panels(BOARDS[THRESHOLDS]) if p["type"] == "heatmap"]
    assert heatmaps
    for panel in heatmaps:
        assert panel["options"]["calculate"] is False
        assert all(t["format"] == "heatmap" and "by (le)" in t["expr"] for t in panel["targets"])


# -- and each rule catches the mistake it is for --------------------------------------------------------


def _first_content(board):
    return _content_panels(board)[0]


def _break_datasource_label(board):
    next(v for v in board["templating"]["list"] if v["type"] == "datasource")["label"] = "Datasource"


def _break_panel_datasource(board):
    _first_content(board)["datasource"] = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def _drop_unit(board):
    del _first_content(board)["fieldConfig"]["defaults"]["unit"]


def _misspell_unit(board):
    _first_content(board)["fieldConfig"]["defaults"]["unit"] = "precentunit"


def _drop_description(board):
    _first_content(board)["description"] = ""


def _fixed_rate_window(board):
    panel = next(p for p in _content_panels(board) if any("$__rate_interval" in t["expr"] for t in p["targets"]))
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace("$__rate_interval", "5m")


def _rate_over_range(board):
    target = _first_content(board)["targets"][0]
    target["expr"] = "sum(rate(turnguard_loop_detections_total[$__range]))"


def _bare_counter(board):
    _first_content(board)["targets"][0]["expr"] = "sum(turnguard_loop_detections_total)"


def _duplicate_ref(board):
    panel = _first_content(board)
    panel["targets"].append(dict(panel["targets"][0]))


def _make_editable(board):
    board["editable"] = True


def _duplicate_id(board):
    _content_panels(board)[1]["id"] = _content_panels(board)[0]["id"]


def _renumber(board):
    _first_content(board)["id"] = 77


def _plain_increase(board):
    _first_content(board)["targets"][0]["expr"] = "sum(increase(turnguard_turn_tool_calls_count[$__range]))"


def _instant_lookback(board):
    """The form the Halts board had: ``increase`` where a sample is 5 minutes before the window."""
    series = "turnguard_loop_detections_total"
    _first_content(board)["targets"][0]["expr"] = (f"sum((increase({series}[$__range]) and {series} offset $__range)"
                                                   f" or (last_over_time({series}[$__range]) unless {series} offset "
                                                   "$__range))")


def _no_day_before(board):
    """The last sample alone (no ``before``): a series' whole history, every window."""
    _first_content(board)["targets"][0]["expr"] = "sum(last_over_time(turnguard_loop_detections_total[$__range]))"


def _unscoped_agent(board):
    target = _first_content(board)["targets"][0]
    target["expr"] = re.sub(r',?gen_ai_agent_name=~"\$agent"', "", target["expr"])


def _unscoped_policy(board):
    target = _first_content(board)["targets"][0]
    target["expr"] = re.sub(r',?turnguard_policy=~"\$policy"', "", target["expr"])


def _policy_variable_dropped(board):
    board["templating"]["list"] = [v for v in board["templating"]["list"] if v["name"] != "policy"]


def _old_schema(board):
    board["schemaVersion"] = 39


def _no_exemplars(board):
    next(p for p in _content_panels(board) if p["id"] == 11)["targets"][0].pop("exemplar")


def _interval_noise(board):
    next(v for v in board["templating"]["list"] if v["type"] == "datasource")["auto_count"] = 30


def _panel(board, pid):
    return next(p for p in _content_panels(board) if p["id"] == pid)


def _target(board, pid, legend):
    return next(t for t in _panel(board, pid)["targets"] if t.get("legendFormat") == legend)


def _mix_cohorts(board):
    target = _first_content(board)["targets"][0]
    target["expr"] = target["expr"].replace(',turnguard_turn_cohort=~"$cohort"', "")


def _cohort_all(board):
    next(v for v in board["templating"]["list"] if v["name"] == "cohort")["includeAll"] = True


def _save_one_policy(board):
    next(v for v in board["templating"]["list"] if v["name"] == "policy")["current"] = {"text": "prod",
                                                                                         "value": "prod"}


def _no_value_dropped(board):
    del _first_content(board)["fieldConfig"]["defaults"]["noValue"]


def _censoring_unsaid(board):
    panel = _panel(board, 3)
    panel["description"] = panel["description"].replace("censored", "left out")


def _percentiles_alone(board):
    panel = _panel(board, 3)
    panel["targets"] = [t for t in panel["targets"] if "histogram_quantile" in t["expr"]]


def _call_them_runaways(board):
    _panel(board, 21)["title"] = "Runaways the backstop ended"


def _backstop_alone(board):
    for row in board["panels"]:
        row.get("panels", []).clear()
    board["panels"] = [p for p in board["panels"] if p.get("id") != 27]


def _share_without_interval(board):
    panel = _panel(board, 27)
    panel["targets"] = [t for t in panel["targets"] if t["legendFormat"] != "95% low"]


def _survival_alone(board):
    panel = _panel(board, 47)
    panel["targets"] = [t for t in panel["targets"] if t["legendFormat"] != "95% high"]


def _tolerance_dropped(board):
    board["templating"]["list"] = [v for v in board["templating"]["list"] if v["name"] != "tolerance"]


def _streak_row_dropped(board):
    target = _target(board, 44, "turns")
    target["expr"] = target["expr"].replace(' or label_replace(vector(0), "turnguard_probe_main_threshold", '
                                            '"streak", "", "")', "")


def _live_past_the_backstop(board):
    for target in _panel(board, 12)["targets"]:
        target["expr"] = target["expr"].replace("le=~`1000(", "le=~`2000(")


def _override_typo(board):
    override = _panel(board, 44)["fieldConfig"]["overrides"][1]
    next(p for p in override["properties"] if p["id"] == "unit")["value"] = "percentage"


def _both_cohorts_unsaid(board):
    panel = _panel(board, 47)
    panel["description"] = panel["description"].replace("both cohorts", "every turn")


def _fixed_tolerance(board):
    target = _target(board, 44, "decision")
    target["expr"] = target["expr"].replace("$tolerance", "0.1")


def _estimate_past_the_probe_cap(board):
    """The product-limit shares read from the buckets whatever the probe's cap (the committed board's,
    built without a probe), on a board built for a probe whose cap is below 20x."""
    _panel(board, 47)["targets"] = copy.deepcopy(_panel(BOARDS[THRESHOLDS], 47)["targets"])


BREAKAGES = {
    "template-datasource-rule": _break_datasource_label,
    "panel-datasource-rule": _break_panel_datasource,
    "panel-units-rule": _drop_unit,
    "panel-title-description-rule": _drop_description,
    "target-rate-interval-rule": _fixed_rate_window,
    "target-counter-agg-rule": _bare_counter,
    "panel-no-targets-rule": _duplicate_ref,
    "uneditable-dashboard": _make_editable,
    "stable-panel-ids": _duplicate_id,
    "count-from-zero": _plain_increase,
    "agent-variable": _unscoped_agent,
    "policy-variable": _unscoped_policy,
    "current-schema": _old_schema,
    "exemplars-and-annotations": _no_exemplars,
    "cohort-variable": _mix_cohorts,
    "saved-defaults": _save_one_policy,
    "no-value": _no_value_dropped,
    "censoring-said": _censoring_unsaid,
    "halted-share-beside-percentiles": _percentiles_alone,
    "no-runaway-claims": _call_them_runaways,
    "backstop-beside-probe": _backstop_alone,
    "interval-beside-share": _share_without_interval,
    "survival-interval": _survival_alone,
    "tolerance-variable": _tolerance_dropped,
    "probe-row-per-threshold": _streak_row_dropped,
    "live-figures-within-the-live-cap": _live_past_the_backstop,
    "estimates-within-the-probe-cap": _estimate_past_the_probe_cap,
    "override-units": _override_typo,
}
MORE_BREAKAGES = [
    ("panel-units-rule", _misspell_unit),
    ("target-rate-interval-rule", _rate_over_range),
    ("stable-panel-ids", _renumber),
    ("current-schema", _interval_noise),
    ("policy-variable", _policy_variable_dropped),
    ("cohort-variable", _cohort_all),
    ("cohort-variable", _both_cohorts_unsaid),
    ("interval-beside-share", _fixed_tolerance),
    ("count-from-zero", _instant_lookback),
    ("count-from-zero", _no_day_before),
]
ON_THE_THRESHOLD_BOARD = {_censoring_unsaid, _percentiles_alone, _call_them_runaways, _backstop_alone,
                          _share_without_interval, _tolerance_dropped, _streak_row_dropped, _live_past_the_backstop,
                          _override_typo, _both_cohorts_unsaid, _fixed_tolerance, _survival_alone}
"""Breakages of panels only the threshold-validation board has."""


@pytest.mark.parametrize(("rule", "breakage"), [*BREAKAGES.items(), *MORE_BREAKAGES],
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_rule_catches_a_broken_board(rule, breakage):
    config = BUILT_FOR.get(breakage)
    if config is None:
        board = copy.deepcopy(BOARDS[THRESHOLDS if breakage in ON_THE_THRESHOLD_BOARD else HALTS])
    else:
        optional_dependency("grafana_foundation_sdk")
        from turnguard._boards import build

        board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
        assert RULES[rule](board, config) == [], f"{rule} fails the unbroken board"
    breakage(board)
    problems = RULES[rule](board) if config is None else RULES[rule](board, config)
    assert problems, f"{rule} missed {breakage.__name__}"


def test_every_rule_has_a_breakage():
    assert set(BREAKAGES) == set(RULES)


A_LOW_PROBE_CAP = GuardConfig(probe={"rate": 0.1, "hard_multiplier": 17.5})
"""A probe whose cap (1,750 calls) lies inside a bucket, below 20x: the board cannot see to 20x."""
BUILT_FOR = {_estimate_past_the_probe_cap: A_LOW_PROBE_CAP}
"""Breakages shown on a board built for a configuration of their own (the committed one has no probe)."""


OTHER_CONFIGURATIONS = {
    "S=250 x8 D=4": {"soft_cap": 250, "hard_multiplier": 8, "stuck_repeat_threshold": 4},
    "fractional multiplier": {"hard_multiplier": 2.5},
    "a cycle cap": {"max_cycles_per_turn": 30},
    "no streak stop": {"streak_stop_at": 0, "streak_warn_at": 0},
    "an explicit cap": {"max_tool_calls_per_turn": 300},
    "a probe at 20x": {"probe": {"rate": 0.05, "hard_multiplier": 20, "streak_stop_at": 16}},
    "a probe at 17.5x": {"probe": {"rate": 0.1, "hard_multiplier": 17.5}},
    "a probe raising S": {"probe": {"rate": 0.1, "soft_cap": 300, "hard_multiplier": 20}},
    "a probed explicit cap": {"max_tool_calls_per_turn": 300,
                              "probe": {"rate": 0.1, "max_tool_calls_per_turn": 2000}},
    "a probed cycle cap": {"max_cycles_per_turn": 30, "probe": {"rate": 0.1, "max_cycles_per_turn": 200}},
    "a probe raising S past a cycle cap": {"max_cycles_per_turn": 30,
                                           "probe": {"rate": 0.1, "soft_cap": 300, "hard_multiplier": 20,
                                                     "max_cycles_per_turn": 0}},
    "a named probe with a cycle cap": {"name": "prod", "max_cycles_per_turn": 40,
                                       "probe": {"rate": 0.1, "name": "canary", "hard_multiplier": 30}},
}


@pytest.mark.parametrize("name", sorted(OTHER_CONFIGURATIONS))
def test_boards_rendered_for_another_configuration_pass_every_rule(name):
    optional_dependency("grafana_foundation_sdk")
    from turnguard._boards import build

    config = GuardConfig(**OTHER_CONFIGURATIONS[name])
    for text in build.for_config(config).values():
        board = json.loads(text)
        for rule_name, rule in RULES.items():
            problems = rule(board, config) if rule_name in CONFIGURED else rule(board)
            assert problems == [], f"{name}: {rule_name}"


def test_a_board_for_one_configuration_fails_another_ones_probe_rows():
    """The committed board has no row for a cycle cap: a configuration with one needs its own board."""
    assert probe_row_per_threshold_rule(BOARDS[THRESHOLDS], GuardConfig(max_cycles_per_turn=30))
    assert live_figures_within_the_live_cap_rule(BOARDS[THRESHOLDS], GuardConfig(hard_multiplier=5))


def test_every_derived_record_of_the_rules_is_read_by_a_board():
    """A derived record (``rules.DERIVED``: computed from the counting records for the boards) that no
    panel reads costs an evaluation every tile for nothing; each is read, with the variables' matchers."""
    from turnguard._boards import rules

    exprs = [pq.expr for board in BOARDS.values() for pq in queries.panel_queries(board)]
    for record in (r["record"] for r in rules.DERIVED):
        assert record in _records_by(), f"{record} is not in the shipped rules file"
        reading = [e for e in exprs if record in e]
        assert reading, f"no panel reads {record}"
