"""Panel 49 (the soft and explicit caps' probe frontier) on a real Prometheus's PromQL: ``promtool
test rules`` evaluates its queries on the recording rules' series of a planted set of probe turns
and compares each row with the same rule in plain Python: calibrate's ``frontier.upper_bound`` of
the productive turns a value would halt, against the tolerance."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard.boards import build, queries, rules  # noqa: E402
from turnguard.boards import promql as q  # noqa: E402
from turnguard.boards.settings import CapSettings  # noqa: E402
from turnguard.boards.thresholds import SEEN_HIGH, SPARES, _edges, soft_values  # noqa: E402
from turnguard.calibrate.frontier import upper_bound  # noqa: E402
from turnguard.config import GuardConfig  # noqa: E402

CONFIG = GuardConfig(probe={"rate": 0.1, "soft_cap": 300, "hard_multiplier": 20})
CAP = CapSettings.from_config(CONFIG)
TOLERANCE = 0.1
LIMITS = {"hard_backstop", "explicit", "cycle_cap"}


@dataclass(frozen=True)
class Turn:
    calls: int
    stuck: bool
    resolved: bool | None
    """The result reported in the turn (``None``: none)."""
    late: bool | None = None
    """The result reported after it (``None``: none)."""
    ended_by: str = "none"


TURNS = [
    *[Turn(150, True, False, ended_by="soft_stuck")] * 3,    # stuck past 100 and 150: failed
    *[Turn(250, True, True)] * 2,                            # stuck, resolved in the turn: productive at s=100, 200
    Turn(180, True, None, late=True),                        # stuck, resolved later: unknown below the backstop
    *[Turn(1500, False, None, late=True)] * 2,               # past 1000 only: resolved later, placed by its bucket
    *[Turn(2500, False, None, late=False)] * 4,              # past 2000: failed, reported later
    *[Turn(4001, False, None, ended_by="hard_backstop")] * 5,  # the probe's backstop: censored
    Turn(4001, False, None, late=True, ended_by="hard_backstop"),  # ... and resolved later
    *[Turn(80, False, True)] * 10,                           # short: no soft cap here halts them
]


def _backstop(soft: int) -> int:
    return GuardConfig(soft_cap=soft, hard_multiplier=CAP.hard_multiplier).hard_cap or 0


def _expected(soft: int) -> dict[str, float]:
    """The panel's rule: past the backstop every result counts; stuck below it, results in the turn only."""
    fates = dict.fromkeys(("resolved", "unresolved", "censored", "unknown"), 0)
    turns = 0
    for t in TURNS:
        past, below = t.calls > _backstop(soft), t.stuck and soft < t.calls <= _backstop(soft)
        if not (past or below):
            continue
        turns += 1
        result = t.resolved if below or t.resolved is not None else t.late
        if result is True:
            fates["resolved"] += 1
        elif t.ended_by in LIMITS and (result is False or (past and result is None)):
            fates["censored"] += 1
        elif result is False:
            fates["unresolved"] += 1
        else:
            fates["unknown"] += 1
    known = fates["resolved"] + fates["unresolved"] + fates["censored"]
    high = upper_bound(fates["resolved"], known)[1] if known else math.nan
    return {"turns": turns, **fates, SEEN_HIGH: high, SPARES: float(high < TOLERANCE) if known else math.nan}


def _labels(**more: str) -> str:
    base = {q.POLICY: "default-probe", q.COHORT: "probe", q.AGENT: "a", q.CAP_MODE: "adaptive",
            q.MAIN_THRESHOLD: "none"}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in {**base, **more}.items()) + "}"


def _series() -> list[dict[str, str]]:
    """The records one evaluation would leave for ``TURNS`` (one sample each, at 1m)."""
    edges = [*_edges(CAP), math.inf]
    counts: dict[str, int] = {}

    def add(series: str, n: int = 1) -> None:
        counts[series] = counts.get(series, 0) + n

    for t in TURNS:
        facts = {q.RESOLVED: {True: "true", False: "false", None: "unknown"}[t.resolved], q.THRESHOLD: t.ended_by,
                 q.STUCK: "true" if t.stuck else "false"}
        add(rules.RECORDED[q.TURNS] + _labels(**facts))
        for e in edges:
            le = "+Inf" if e == math.inf else f"{e:g}"
            add(rules.RECORDED[f"{q.TOOL_CALLS}_bucket"] + _labels(**facts, le=le), int(t.calls <= e))
        if t.late is not None:
            bucket = next(e for e in edges if t.calls <= e)
            result = {q.RESOLVED: "true" if t.late else "false", q.RESULT_STATUS: "accepted", q.THRESHOLD: t.ended_by,
                      q.CALLS_BUCKET: "+Inf" if bucket == math.inf else f"{bucket:g}"}
            add(rules.RECORDED[q.RESULTS] + _labels(**result))
    return [{"series": s, "values": f"_ {n}"} for s, n in counts.items()]


def _panel_queries() -> list[queries.PanelQuery]:
    board = json.loads(build.for_config(CONFIG)[build.FILES[build.THRESHOLDS_UID]])
    return [pq for pq in queries.panel_queries(board) if pq.panel_id == 49]


VALUES = {"__range": "5m", "__range_s": "300", q.POLICY_VARIABLE: ".*", q.AGENT_VARIABLE: ".*",
          q.COHORT_VARIABLE: q.LIVE, q.TOLERANCE_VARIABLE: repr(TOLERANCE)}


def _exp_samples(column: str) -> list[dict[str, object]]:
    out = []
    for soft in soft_values(CAP):
        value = _expected(soft)[column]
        if math.isnan(value):
            continue
        shown = round(value * SCALE) if column == SEEN_HIGH else value
        out.append({"labels": f'{{value="soft:{soft}"}}', "value": shown})
    return out


def test_the_board_judges_soft_caps_below_the_probes():
    assert soft_values(CAP) == [100, 200]
    assert {pq.legend for pq in _panel_queries()} == {"turns", "resolved", "unresolved", "censored", "unknown",
                                                       SEEN_HIGH, SPARES}


def test_the_planted_turns_place_late_results_only_past_the_backstop():
    """At s = 100 (backstop 1000) the two turns resolved later past 1000 and the one resolved later at
    the probe's backstop count with the two stuck ones resolved in the turn; the stuck one resolved
    later (180 calls) stays unknown; at 200 (backstop 2000) the ones past 1000 only drop out."""
    at_100, at_200 = _expected(100), _expected(200)
    assert (at_100["resolved"], at_100["unknown"], at_100["censored"]) == (5, 1, 5)
    assert (at_200["resolved"], at_200["turns"]) == (3, 12)
    assert at_100[SPARES] == at_200[SPARES] == 0.0


@pytest.fixture(params=["promtool-2", "promtool-3"])
def promtool(request) -> str:
    if request.param == "promtool-2":
        return chain.promtool()
    return chain.require(str(Path(chain.prometheus3()).with_name("promtool")), "Prometheus 3's promtool")


SCALE = 1e9
"""The bound is compared to 9 places (PromQL and Python may differ in the last bit)."""


def _expr(pq: queries.PanelQuery) -> str:
    expr = queries.resolve(pq.expr, VALUES)
    return f"round(({expr}) * {SCALE:g})" if pq.legend == SEEN_HIGH else expr


def test_panel_49_is_the_planted_turns_frontier(promtool, tmp_path):
    tests = [{"expr": _expr(pq), "eval_time": "5m", "exp_samples": _exp_samples(pq.legend)} for pq in _panel_queries()]
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _series(), "promql_expr_test": tests}]}))
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
