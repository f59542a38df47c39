"""Panel 49 (the soft, explicit and cycle caps' probe frontier) on a real Prometheus's PromQL:
``promtool test rules`` evaluates its queries on the recording rules' series of a planted set of
probe turns (for the cycle cap, on the raw series the guard exports, recorded by the shipped rules)
and compares each row with the same rule in plain Python: calibrate's ``frontier.upper_bound`` of
the productive turns a value would halt, against the tolerance."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass

import chain
import evidence_oracle as oracle
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard._boards import (  # noqa: E402
    build,
    queries,
    rules,
    series,
)
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._boards.thresholds import (  # noqa: E402
    LIMIT_TOO_LOW,
    SEEN_HIGH,
    SPARES,
    _edges,
    cycle_values,
    explicit_values,
    soft_values,
)
from turnguard._calibrate.evidence import upper_bound  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._probe import CENSORING_HALTS  # noqa: E402
from turnguard.telemetry._buckets import cycle_edges  # noqa: E402

CONFIG = GuardConfig(probe={"rate": 0.1, "soft_cap": 300, "hard_multiplier": 20})
CAP = CapSettings.from_config(CONFIG)
TOLERANCE = 0.1
LIMITS = set(CENSORING_HALTS)
CUT_BY = oracle.cut_halts(CONFIG)
"""The probe keeps the main D and streak stop: its stuck and streak halts are cut, not failures."""


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
    *[Turn(150, True, False, ended_by="soft_stuck")] * 3,    # the probe's D (the main's): cut, not failed
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
    fates = dict.fromkeys(("resolved", "unresolved", "censored", "cut", "unknown"), 0)
    turns = 0
    for t in TURNS:
        past, below = t.calls > _backstop(soft), t.stuck and soft < t.calls <= _backstop(soft)
        if not (past or below):
            continue
        turns += 1
        result = t.resolved if below or t.resolved is not None else t.late
        if result is True:
            fates["resolved"] += 1
        elif t.ended_by in LIMITS | CUT_BY and (result is False or (past and result is None)):
            fates["censored" if t.ended_by in LIMITS else "cut"] += 1
        elif result is False:
            fates["unresolved"] += 1
        else:
            fates["unknown"] += 1
    known = fates["resolved"] + fates["unresolved"] + fates["censored"] + fates["cut"]
    high = upper_bound(fates["resolved"] + fates["cut"], known)[1] if known else math.nan
    return {"turns": turns, **fates, SEEN_HIGH: high, SPARES: float(high < TOLERANCE) if known else math.nan,
            LIMIT_TOO_LOW: LIMIT_TOO_LOW_AT_THE_PROBES_BACKSTOP}


LIMIT_TOO_LOW_AT_THE_PROBES_BACKSTOP = 1.0
"""The soft caps are judged up to 290 (the probe's soft cap, 300): the stuck turns resolved at 250
calls reach 200, the highest row, and the probe's backstop halted turns past it: productive turns
it cut off would read as runaways (calibrate's horizon rule), so no soft cap spares them."""


def _labels(**more: str) -> str:
    base = {series.POLICY: "default-probe", series.COHORT: "probe", series.AGENT: "a", series.CAP_MODE: "adaptive",
            series.MAIN_THRESHOLD: "none"}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in {**base, **more}.items()) + "}"


def _series() -> list[dict[str, str]]:
    """The records one evaluation would leave for ``TURNS`` (one sample each, at 1m)."""
    edges = [*_edges(CAP), math.inf]
    counts: dict[str, int] = {}

    def add(name: str, n: int = 1) -> None:
        counts[name] = counts.get(name, 0) + n

    for t in TURNS:
        facts = {series.RESOLVED: {True: "true", False: "false", None: "unknown"}[t.resolved],
                 series.THRESHOLD: t.ended_by, series.STUCK: "true" if t.stuck else "false"}
        add(rules.RECORDED[series.TURNS] + _labels(**facts))
        for e in edges:
            le = "+Inf" if e == math.inf else f"{e:g}"
            add(rules.RECORDED[f"{series.TOOL_CALLS}_bucket"] + _labels(**facts, le=le), int(t.calls <= e))
        if t.late is not None:
            bucket = next(e for e in edges if t.calls <= e)
            result = {series.RESOLVED: "true" if t.late else "false", series.RESULT_STATUS: "accepted",
                      series.THRESHOLD: t.ended_by,
                      series.CALLS_BUCKET: "+Inf" if bucket == math.inf else f"{bucket:g}"}
            add(rules.RECORDED[series.RESULTS] + _labels(**result))
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
    assert {pq.legend for pq in _panel_queries()} == {"turns", "resolved", "unresolved", "censored", "cut",
                                                       "unknown", SEEN_HIGH, SPARES, LIMIT_TOO_LOW}


def test_the_planted_turns_place_late_results_only_past_the_backstop():
    """At s = 100 (backstop 1000) the two turns resolved later past 1000 and the one resolved later at
    the probe's backstop count with the two stuck ones resolved in the turn; the stuck one resolved
    later (180 calls) stays unknown; at 200 (backstop 2000) the ones past 1000 only drop out."""
    at_100, at_200 = _expected(100), _expected(200)
    assert (at_100["resolved"], at_100["unknown"], at_100["censored"], at_100["cut"]) == (5, 1, 5, 3)
    assert (at_200["resolved"], at_200["turns"]) == (3, 12)
    assert at_100[SPARES] == at_200[SPARES] == 0.0


SCALE = 1e9
"""The bound is compared to 9 places (PromQL and Python may differ in the last bit)."""


def _expr(pq: queries.PanelQuery) -> str:
    expr = queries.resolve(pq.expr, VALUES)
    return f"round(({expr}) * {SCALE:g})" if pq.legend == SEEN_HIGH else expr


def test_panel_49_is_the_planted_turns_frontier(promtool, tmp_path):
    tests = [{"expr": _expr(pq), "eval_time": "5m", "exp_samples": _exp_samples(pq.legend)} for pq in _panel_queries()]
    chain.promtool_expressions(promtool, tmp_path, _series(), tests)


# -- the cycle cap's rows: raw series through the shipped rules ----------------------------------------

CYCLE_CONFIG = GuardConfig(max_cycles_per_turn=20, probe={"rate": 0.1, "max_cycles_per_turn": 100})
CYCLE_CAP = CapSettings.from_config(CYCLE_CONFIG)
PROBE_CAP = 100


@dataclass(frozen=True)
class Requests:
    """A turn as its request count, the result in it, a result after it and what ended it."""

    cycles: int
    resolved: bool | None
    late: bool | None = None
    ended_by: str = "none"
    cohort: str = "probe"


REQUEST_TURNS = {
    Requests(15, True): 3,                                      # below every cycle cap
    Requests(25, True): 2,                                      # productive past 20 only
    Requests(35, None, late=True): 1,                           # resolved later: no request count, unknown
    Requests(45, False, ended_by="soft_stuck"): 2,              # the probe's D, the main's: cut, not failed
    Requests(55, None, ended_by="hard_backstop"): 1,            # the probe's backstop, no result in it: unknown
    Requests(70, False, ended_by="hard_backstop"): 1,           # ... with a false one: censored
    Requests(85, False): 60,                                    # failed past every value but the last
    Requests(PROBE_CAP + 1, None, ended_by="cycle_cap"): 4,     # the probe's cycle cap: censored
    Requests(PROBE_CAP + 1, None, late=True, ended_by="cycle_cap"): 1,   # ... resolved later: placed
    Requests(PROBE_CAP + 1, None, late=False, ended_by="cycle_cap"): 1,  # ... failed later: censored
    Requests(90, True, cohort="live"): 5,                       # the live cohort: in no row
    Requests(PROBE_CAP + 1, None, late=True, ended_by="cycle_cap", cohort="live"): 2,
}
"""Planted turns, how many of each."""


def _expected_cycles(value: int) -> dict[str, float]:
    """The rule: probe turns that made more than ``value`` requests; a late result counts only for a
    turn the probe halted at its own cycle cap (past every value), any other stays as its turn left it."""
    fates = dict.fromkeys(("resolved", "unresolved", "censored", "cut", "unknown"), 0)
    turns = 0
    for t, count in REQUEST_TURNS.items():
        if t.cohort != "probe" or t.cycles <= value:
            continue
        turns += count
        placed = t.ended_by == "cycle_cap"
        result = t.late if placed and t.resolved is None else t.resolved
        if result is True:
            fates["resolved"] += count
        elif t.ended_by in LIMITS and (result is False or (placed and result is None)):
            fates["censored"] += count
        elif t.ended_by in oracle.cut_halts(CYCLE_CONFIG) and result is False:
            fates["cut"] += count
        elif result is False:
            fates["unresolved"] += count
        else:
            fates["unknown"] += count
    known = fates["resolved"] + fates["unresolved"] + fates["censored"] + fates["cut"]
    high = upper_bound(fates["resolved"] + fates["cut"], known)[1] if known else math.nan
    return {"turns": turns, **fates, SEEN_HIGH: high, SPARES: float(high < TOLERANCE) if known else math.nan,
            LIMIT_TOO_LOW: 0.0}


QUIET, RUN = 20, 40
"""Minutes each raw series holds 0 (the rules see it start), then minutes at its count."""


def _raw(value: int) -> str:
    return f"0x{QUIET} {value}x{RUN}"


def _raw_series() -> list[dict[str, str]]:
    """The raw cumulative series the guard exports for ``REQUEST_TURNS`` (labels the rules sum away
    among them), sampled every minute."""
    edges = [*(f"{e:g}" for e in cycle_edges(CYCLE_CONFIG)), "+Inf"]
    buckets: dict[str, int] = {}
    results: dict[str, int] = {}
    for t, count in REQUEST_TURNS.items():
        base = {series.POLICY: "default-probe" if t.cohort == "probe" else "default", series.COHORT: t.cohort,
                series.AGENT: "a", series.THRESHOLD: t.ended_by, "job": "agent", "instance": "i1"}
        facts = {**base, series.RESOLVED: {True: "true", False: "false", None: "unknown"}[t.resolved],
                 series.OUTCOME: "halted" if t.ended_by != "none" else "completed", series.CAP_MODE: "adaptive",
                 series.STUCK: "false"}
        for le in edges:
            bucket = f"{series.CYCLES}_bucket" + _labels_of(**facts, le=le)
            buckets[bucket] = buckets.get(bucket, 0) + count * int(le == "+Inf" or t.cycles <= float(le))
        if t.late is not None:
            result = {**base, series.RESOLVED: "true" if t.late else "false", series.RESULT_STATUS: "accepted",
                      series.CALLS_BUCKET: "+Inf"}
            name = series.RESULTS + _labels_of(**result)
            results[name] = results.get(name, 0) + count
    return [{"series": s, "values": _raw(n)} for s, n in {**buckets, **results}.items()]


def _labels_of(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _cycle_queries() -> list[queries.PanelQuery]:
    board = json.loads(build.for_config(CYCLE_CONFIG)[build.FILES[build.THRESHOLDS_UID]])
    return [pq for pq in queries.panel_queries(board) if pq.panel_id == 49]


CYCLE_VALUES = {**VALUES, "__range": f"{QUIET + RUN}m", "__range_s": str((QUIET + RUN) * 60)}


def test_the_board_judges_cycle_caps_from_the_live_one_below_the_probes():
    assert cycle_values(CYCLE_CAP) == [20, 30, 40, 60, 80]
    assert soft_values(CYCLE_CAP) == [] and explicit_values(CYCLE_CAP) == []
    assert cycle_values(CapSettings.from_config(CYCLE_CONFIG.replace(probe={"rate": 0.1}))) == []  # not past it
    unbounded = CapSettings.from_config(CYCLE_CONFIG.replace(probe={"rate": 0.1, "max_cycles_per_turn": 0}))
    assert cycle_values(unbounded) == [20, 30, 40, 60, 100, 200]
    assert {pq.legend for pq in _cycle_queries()} == {"turns", "resolved", "unresolved", "censored", "cut",
                                                      "unknown", SEEN_HIGH, SPARES, LIMIT_TOO_LOW}


def test_the_planted_request_counts_place_late_results_only_at_the_probes_cycle_cap():
    """At 20: the two turns resolved in the turn past 20 and the one resolved later at the probe's cap;
    the turn resolved later at 35 requests and the one at the probe's backstop with no result stay
    unknown. At 80 only the probe's cap and the 60 failures past 80 are left: a value that spares
    them, where 20 does not."""
    at_20, at_80 = _expected_cycles(20), _expected_cycles(80)
    assert (at_20["resolved"], at_20["unresolved"], at_20["censored"], at_20["cut"], at_20["unknown"]) == (
        3, 60, 6, 2, 2)
    assert (at_80["resolved"], at_80["unresolved"], at_80["censored"], at_80["unknown"]) == (1, 60, 5, 0)
    assert (at_20[SPARES], at_80[SPARES]) == (0.0, 1.0)


def _cycle_samples(column: str) -> list[dict[str, object]]:
    out = []
    for value in cycle_values(CYCLE_CAP):
        figure = _expected_cycles(value)[column]
        out.append({"labels": f'{{value="cycles:{value}"}}', "value": round(figure * SCALE) if column == SEEN_HIGH
                    else figure})
    return out


def test_panel_49_is_the_frontier_of_the_planted_request_counts_through_the_rules(promtool, tmp_path):
    """The raw request histogram and results counter, recorded by the shipped rules (the request
    histogram's record among them), read by panel 49's cycle cap rows: each column is the rule's."""
    at = f"{QUIET + RUN}m"
    tests = [{"expr": queries.resolve(pq.expr, CYCLE_VALUES) if pq.legend != SEEN_HIGH
              else f"round(({queries.resolve(pq.expr, CYCLE_VALUES)}) * {SCALE:g})",
              "eval_time": at, "exp_samples": _cycle_samples(pq.legend)} for pq in _cycle_queries()]
    (tmp_path / chain.RULES.name).write_text(chain.RULES.read_text())
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": [chain.RULES.name], "evaluation_interval": "5m",
        "tests": [{"interval": "1m", "input_series": _raw_series(), "promql_expr_test": tests}]}))
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
