"""The grafana/dashboard-linter rules that apply to turnguard's boards, as pytest checks.

The Go linter cannot be installed here, so its relevant rules are re-stated below (rule names in
the comments), applied to the committed JSON, and each is shown to catch the mistake it is for.
Exceptions, stated here rather than in a ``.lint`` file: counts are ``build.counted`` (``increase``
and, for a series born in the window, ``last_over_time``, over ``$__range``, ``$__rate_interval``
or the heatmap's ``$__interval``; the bare counter after ``offset`` tells the two apart) or, on the
threshold-validation board, recorded tiles summed by ``sum_over_time`` over ``$__range`` or
``$__interval``, and
``rate``/``irate`` must use ``$__rate_interval``; the job/instance rules are left out because
OpenTelemetry-sourced series get ``job`` from ``service.name``, which
the boards must not assume.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from turnguard.boards import queries

BOARD_DIR = queries.BOARDS
BOARDS = queries.boards(BOARD_DIR)
HALTS, THRESHOLDS = "turnguard-halts", "turnguard-threshold-validation"
SHADOW_IDS = range(100, 200)

VALID_UNITS = frozenset({"short", "none", "percent", "percentunit", "cps", "ops", "reqps", "s", "ms", "bytes"})
"""Grafana unit ids the boards may use (a subset of Grafana's; a typo is not a unit)."""
RANGE_FUNCTION = re.compile(r"\b(rate|irate|increase|last_over_time|sum_over_time)\(\s*[^\[\]]*\[([^\]]+)\]")
COUNTER = re.compile(r"\b([a-zA-Z_:][\w:]*_total)\b")
COUNT_WINDOWS = {"$__rate_interval", "$__range", "$__interval"}
ALLOWED_RANGES = {"rate": {"$__rate_interval"}, "irate": {"$__rate_interval"},
                  "increase": COUNT_WINDOWS, "last_over_time": COUNT_WINDOWS,
                  "sum_over_time": {"$__range", "$__interval"}}
"""Recorded 5-minute tiles are summed over the range or the step's own interval, never over
``$__rate_interval`` (the interval plus a scrape interval: not a whole number of tiles)."""

PANEL_IDS = {
    HALTS: {1: "row", 2: "stat", 3: "stat", 4: "stat", 5: "stat", 6: "stat", 7: "stat", 10: "row",
            11: "timeseries", 12: "timeseries", 13: "bargauge", 20: "row", 21: "bargauge", 22: "bargauge",
            30: "row", 31: "bargauge", 32: "bargauge", 33: "timeseries", 40: "row", 41: "bargauge",
            42: "timeseries", 50: "row", 51: "stat", 52: "timeseries", 53: "timeseries", 54: "timeseries"},
    THRESHOLDS: {1: "row", 2: "heatmap", 3: "timeseries", 4: "bargauge", 10: "row", 11: "stat", 12: "bargauge",
                 13: "bargauge", 20: "row", 21: "stat", 22: "stat", 23: "stat", 24: "stat", 25: "stat",
                 26: "bargauge", 30: "row", 31: "bargauge", 40: "row", 41: "bargauge", 42: "bargauge", 43: "bargauge",
                 44: "bargauge", 45: "bargauge", 46: "bargauge",
                 100: "row", 101: "bargauge", 102: "bargauge", 103: "bargauge", 104: "bargauge", 105: "timeseries"},
}
"""The stable panel ids (links and annotations point at them): renumbering is a breaking change."""


def _content_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in queries.panels(board) if p["type"] != "row"]


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
            after = q.expr[match.end():]
            offset_only = re.match(r"\{[^}]*\} offset \$__\w+", after) or after.startswith(" offset $__")
            if not re.search(r"\b(rate|irate|increase|last_over_time)\(\s*$", q.expr[: match.start()]) \
                    and not offset_only:
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
    extra = set(actual) - set(pinned) - (set(SHADOW_IDS) if board["uid"] == THRESHOLDS else set())
    if extra:
        problems.append(f"unpinned panel ids {sorted(extra)}: add them to PANEL_IDS (never renumber)")
    return problems


COUNTED = re.compile(r"increase\((\w+(?:\{[^}]*\})?)\[(\$__\w+)\]\)")
AGENT_MATCHER = '=~"$agent"'
AGENT_SCOPED = re.compile(r"\b(turnguard:\w+:increase5m|"
                          r"turnguard_(?:turn_tool_calls|turn_max_key_repeat|turn_first_stuck_call|loop_detections|"
                          r"escalation_answers|shadow_detections|shadow_turn_tool_calls|turn_results)(?:_total|_bucket|_sum|_count)?)"
                          r"(?![\w=!])(\{[^}]*\})?")
"""A metric name, not the label ``turnguard_turn_tool_calls_bucket`` (the results counter's) that spells the same."""
SCHEMA_VERSION = 42
RECORD_TILE = "5m"
"""The recording rules' tile (rules/turnguard.rules.yaml's group interval)."""
EXEMPLAR_PANELS = {HALTS: {11, 12}}
"""Panels whose points link to the turn's trace (Tempo): detections and halts over time."""


def count_from_zero_rule(board):
    """Every increase() is build.counted's: a series born in the window counts from zero."""
    problems = []
    for q in queries.panel_queries(board):
        for series, window in COUNTED.findall(q.expr):
            fallback = f"last_over_time({series}[{window}]) unless {series} offset {window}"
            if f"and {series} offset {window}" not in q.expr or fallback not in q.expr:
                problems.append(f"panel {q.panel_id} {q.ref_id}: increase({series}[{window}]) drops a new series")
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
"""Every turnguard metric carries ``turnguard_policy`` (DESIGN section 8), and every record keeps it."""
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


RULES: dict[str, Callable[[dict[str, Any]], list[str]]] = {
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
}


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
    target["expr"] = target["expr"].replace("increase(", "rate(", 1)


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
}
MORE_BREAKAGES = {
    "panel-units-rule": _misspell_unit,
    "target-rate-interval-rule": _rate_over_range,
    "stable-panel-ids": _renumber,
    "current-schema": _interval_noise,
    "policy-variable": _policy_variable_dropped,
}


@pytest.mark.parametrize(("rule", "breakage"), [*BREAKAGES.items(), *MORE_BREAKAGES.items()],
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_rule_catches_a_broken_board(rule, breakage):
    board = copy.deepcopy(BOARDS[HALTS])
    breakage(board)
    assert RULES[rule](board), f"{rule} missed {breakage.__name__}"


def test_every_rule_has_a_breakage():
    assert set(BREAKAGES) == set(RULES)
