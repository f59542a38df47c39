"""turnguard._boards.queries: reading panels and queries back, and resolving Grafana's macros."""

from __future__ import annotations

import pytest

from turnguard._boards import queries


def test_macros_finds_variables_in_every_grafana_spelling():
    expr = 'sum(rate(x{job=~"$job"}[$__rate_interval])) / ${datasource} + ${agent:regex} + $__range'
    assert queries.macros(expr) == {"job", "__rate_interval", "datasource", "agent", "__range"}


def test_regex_group_references_are_not_variables():
    expr = 'label_replace(up, "action", "$1", "a", "(.*)") + label_replace(up, "b", "${2}", "a", "(.*)")'
    assert queries.macros(expr) == set()
    assert queries.resolve(expr, {}) == expr


def test_resolve_substitutes_and_refuses_unknown_names():
    assert queries.resolve("increase(x[$__range]) * ${k}", {"__range": "90s", "k": "2"}) == "increase(x[90s]) * 2"
    with pytest.raises(KeyError, match="__rate_interval"):
        queries.resolve("rate(x[$__rate_interval])", {"__range": "1h"})


def test_panels_include_rows_and_panels_inside_collapsed_rows():
    board = {"uid": "b", "panels": [
        {"id": 1, "type": "row", "panels": []},
        {"id": 2, "type": "stat", "targets": [{"refId": "A", "expr": "up", "instant": True}]},
        {"id": 3, "type": "row", "collapsed": True, "panels": [
            {"id": 4, "type": "timeseries", "targets": [{"refId": "A", "expr": "rate(x[1m])", "range": True}]},
        ]},
    ]}
    assert [p["id"] for p in queries.panels(board)] == [1, 2, 3, 4]
    found = list(queries.panel_queries(board))
    assert [(q.panel_id, q.ref_id, q.instant) for q in found] == [(2, "A", True), (4, "A", False)]


def test_boards_are_read_by_uid(tmp_path):
    (tmp_path / "a.json").write_text('{"uid": "first", "panels": []}')
    (tmp_path / "b.json").write_text('{"uid": "second", "panels": []}')
    assert set(queries.boards(tmp_path)) == {"first", "second"}
