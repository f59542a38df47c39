"""The threshold-validation board reads recorded series only, and the rules keep what it reads.

Each query is scanned (strings blanked, selectors and ``by (...)`` lists found, parentheses
matched) for the series it selects, the labels each selector matches on and the labels every
aggregation around it groups by. A record summed without one of those labels would still answer,
with every value of the label added together: the panel would be silently wrong, so the check is
against the rules file's ``by (...)`` lists, not the builder's intent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard._boards import build, queries, rules, series  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402

BOARD = queries.boards()[build.THRESHOLDS_UID]
PROBED_CYCLE_CAP = GuardConfig(max_cycles_per_turn=30, probe={"rate": 0.1, "max_cycles_per_turn": 200})
"""A configuration whose board reads what the committed one does not: the request histogram's record
(panel 49's cycle cap rows, where the probe runs past the live cycle cap)."""
CONFIGURED = json.loads(build.for_config(PROBED_CYCLE_CAP)[build.FILES[build.THRESHOLDS_UID]])
PROBED_COUNTS = GuardConfig(probe={"rate": 0.1, "stuck_repeat_threshold": 12, "streak_stop_at": 16})
"""A configuration whose board reads the failing-streak histogram's record (panel 50's streak-stop
rows, where the probe runs past the live streak stop)."""
COUNTED = json.loads(build.for_config(PROBED_COUNTS)[build.FILES[build.THRESHOLDS_UID]])
BOARDS = {"committed": BOARD, "a probed cycle cap": CONFIGURED, "a probed D and streak stop": COUNTED}
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                      "offset", "bool", "atan2", "inf", "nan"})
TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_:][\w:]*)|(?P<braces>\{[^}]*\})|(?P<range>\[[^\]]*\])"
                   r"|(?P<open>\()|(?P<close>\))|(?P<other>\$\w+|\d[\w.]*|[^\s\w:{}\[\]()$]+))")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")


@dataclass(frozen=True)
class Selection:
    """One series selector in a query: its name, the labels it matches on, the labels grouped by
    around it."""

    series: str
    matched: frozenset[str]
    grouped: frozenset[str]


def selections(expr: str) -> list[Selection]:
    """Every selector of ``expr`` (PromQL as the builder writes it: prefix ``by``, no ``without``
    nor vector matching, which this scanner refuses rather than misreads)."""
    text = STRING.sub('""', expr)
    tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in TOKEN.finditer(text) if m.lastgroup]
    scanned = "".join(re.sub(r"\s+", "", value) for _, value in tokens)
    assert scanned == re.sub(r"\s+", "", text), f"unscanned text in {expr!r}"
    found: list[Selection] = []
    scopes: list[frozenset[str]] = [frozenset()]
    pending: frozenset[str] | None = None
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "name" and value in {"without", "on", "ignoring", "group_left", "group_right"}:
            raise AssertionError(f"{value} (...) in {expr!r}: the check does not read it")
        if kind == "name" and value == "by":
            end = next(j for j in range(i + 2, len(tokens)) if tokens[j][0] == "close")
            assert tokens[i - 1][0] == "name" and following[0] == "open", f"a trailing by in {expr!r}"
            pending = frozenset(v for k, v in tokens[i + 2:end] if k == "name")
            i = end + 1
            continue
        if kind == "open":
            scopes.append(scopes[-1] | (pending or frozenset()))
            pending = None
        elif kind == "close":
            scopes.pop()
        elif kind == "name" and value.lower() not in KEYWORDS and following[0] != "open" \
                and following[1] not in {"by", "without"}:  # not a function or an aggregation
            matchers = following[1] if following[0] == "braces" else ""
            found.append(Selection(value, frozenset(MATCHER.findall(matchers)), scopes[-1]))
        i += 1
    return found


def record_labels(rules_text: str) -> dict[str, frozenset[str]]:
    """Record name -> the labels its outer ``sum by (...)`` keeps."""
    labels = {}
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                by = re.match(r"\s*sum by \(([^)]*)\)", rule["expr"])
                labels[rule["record"]] = frozenset(n.strip() for n in by.group(1).split(",")) if by else frozenset()
    return labels


def problems(board: dict, recorded: dict[str, frozenset[str]]) -> list[str]:
    found = []
    for q in queries.panel_queries(board):
        where = f"panel {q.panel_id} {q.ref_id}"
        for s in selections(q.expr):
            if s.series not in recorded:
                found.append(f"{where}: reads {s.series}, not a record the rules define")
                continue
            missing = (s.matched | s.grouped) - recorded[s.series]
            if missing:
                found.append(f"{where}: {s.series} is summed without {sorted(missing)}")
    return found


RULES_TEXT = chain.RULES.read_text()


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_every_threshold_board_query_reads_records_with_the_labels_it_needs(board):
    assert problems(BOARDS[board], record_labels(RULES_TEXT)) == []


def test_the_board_reads_every_record_and_every_record_label_it_selects_on():
    """The scan sees the selectors (a scanner that found nothing would pass anything). The committed
    board reads every record but the request histogram's, which a board with a probed cycle cap reads,
    and the failing-streak histogram's, which a board whose probe runs past the streak stop reads."""
    def read(board: dict) -> set[str]:
        return {s.series for q in queries.panel_queries(board) for s in selections(q.expr)}

    cycles = build.RECORDED[f"{series.CYCLES}_bucket"]
    failing = build.RECORDED[f"{series.MAX_FAILING}_bucket"]
    assert read(BOARD) == {*build.RECORDED.values(), *(r["record"] for r in rules.DERIVED)} - {cycles, failing}
    assert read(CONFIGURED) == read(BOARD) | {cycles, failing}  # (its probe runs past the streak stop too)
    assert read(COUNTED) == read(BOARD) | {failing}
    heatmap = next(q for q in queries.panel_queries(BOARD) if q.panel_id == 2)
    (selection,) = selections(heatmap.expr)
    matched = frozenset({series.CAP_MODE, series.POLICY, series.AGENT, series.COHORT})
    assert selection == Selection(build.RECORDED[f"{series.TOOL_CALLS}_bucket"], matched, frozenset({"le"}))


def _label_uses() -> list[tuple[str, str]]:
    uses = {(s.series, label) for board in BOARDS.values() for q in queries.panel_queries(board)
            for s in selections(q.expr) for label in s.matched | s.grouped}
    return sorted(uses)


@pytest.mark.parametrize(("record", "label"), _label_uses(), ids=lambda v: v)
def test_dropping_a_label_the_board_reads_from_its_rule_fails_the_check(record, label):
    start = RULES_TEXT.index(f"record: {record}\n")
    end = RULES_TEXT.find("- record:", start + 1)
    rule = RULES_TEXT[start:end if end > 0 else None]
    by = re.search(r"sum by \(([^)]*)\)", rule)
    kept = [n.strip() for n in by.group(1).split(",") if n.strip() != label]
    broken = RULES_TEXT.replace(rule, rule.replace(by.group(0), f"sum by ({', '.join(kept)})"))
    assert broken != RULES_TEXT
    found = [p for board in BOARDS.values() for p in problems(board, record_labels(broken))]
    assert any(f"{record} is summed without ['{label}']" in p for p in found)


def test_a_raw_series_or_an_undefined_record_on_the_board_fails_the_check():
    recorded = record_labels(RULES_TEXT)
    for name in (series.TURNS, "turnguard:turns:increase1h"):
        board = {"uid": build.THRESHOLDS_UID, "panels": [{"id": 11, "targets": [
            {"refId": "A", "expr": f'sum(sum_over_time({name}{{turnguard_policy=~"$policy"}}[$__range]))'}]}]}
        assert problems(board, recorded) == [f"panel 11 A: reads {name}, not a record the rules define"]


@pytest.mark.parametrize(("expr", "want"), [
    ('sum by (a, b) (sum_over_time(x:y:z{c="1", d=~"$v"}[$__range])) / sum(x:y:z offset 5m)',
     [Selection("x:y:z", frozenset({"c", "d"}), frozenset({"a", "b"})),
      Selection("x:y:z", frozenset(), frozenset())]),
    ('histogram_quantile(0.5, sum by (le) (rate(m_bucket{k="by (x)"}[5m]))) or vector(0)',
     [Selection("m_bucket", frozenset({"k"}), frozenset({"le"}))]),
    ("sum by (a) (m) - sum by (b) (n)",
     [Selection("m", frozenset(), frozenset({"a"})), Selection("n", frozenset(), frozenset({"b"}))]),
])
def test_the_scanner_reads_selectors_matchers_and_grouping(expr, want):
    assert selections(expr) == want


@pytest.mark.parametrize("expr", ["sum without (a) (m)", "m * on (a) n", "sum(m) by (a)"])
def test_the_scanner_refuses_what_it_cannot_check(expr):
    with pytest.raises(AssertionError):
        selections(expr)
