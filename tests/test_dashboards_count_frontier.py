"""Panel 50 (D's and the streak stop's probe frontier) on a real Prometheus's PromQL: ``promtool test
rules`` evaluates its queries on the recording rules' series of a planted set of probe turns, with
results reported in the turn and later (by version 2 tokens, which carry the turn's repeat and
failing-streak buckets, and by version 1 ones, which do not), and compares each row with
calibrate's own rule: its ladders (``evidence.Ladder``: the probe turns by the largest value that
would halt them, by fate) and ``frontier.upper_bound`` against the tolerance, for a probe whose D and
streak stop are twice the main's (its loop halts are failures) and for one whose are not (they are
``cut``: productive at the bound's high end, calibrate's ``ProbeEvidence.fate_of``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

import chain
import evidence_oracle as oracle
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard._boards import (  # noqa: E402
    build,
    evidence,
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
    streak_values,
    stuck_values,
)
from turnguard._calibrate.evidence import Ladder, ProbeEvidence, _fate, upper_bound  # noqa: E402
from turnguard._calibrate.records import Limits  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._probe import CENSORING_HALTS  # noqa: E402
from turnguard.telemetry import _buckets as buckets  # noqa: E402

CONFIG = GuardConfig(probe={"rate": 0.1, "hard_multiplier": 20, "stuck_repeat_threshold": 12, "streak_stop_at": 16})
CAP = CapSettings.from_config(CONFIG)
CUT = GuardConfig(probe={"rate": 0.1, "hard_multiplier": 20, "stuck_repeat_threshold": 10, "streak_stop_at": 12})
"""A probe whose D (10) and streak stop (12) are raised less than twice the main's (6, 8): its stuck
and streak halts are not failures."""
CONFIGS = {"twice": CONFIG, "cut": CUT}
TOLERANCE = 0.1
LENGTH_LIMITS = set(CENSORING_HALTS)


@dataclass(frozen=True)
class Turn:
    calls: int
    repeat: int
    """Its largest repeat count of one call."""
    failing: int
    """Its longest failing identical-call streak."""
    resolved: bool | None
    """The result reported in the turn (``None``: none)."""
    late: bool | None = None
    """The result reported after it (``None``: none)."""
    token: int = 2
    """The version of the token the late result came with (1: no counts)."""
    ended_by: str = "none"
    cohort: str = "probe"


TURNS = {
    Turn(150, 7, 2, False): 3,                                          # failed past S, repeating 7 times
    Turn(250, 4, 3, True): 2,                                           # productive: D = 4 would halt them
    Turn(180, 9, 10, None, late=True): 1,                               # resolved later: placed by its buckets
    Turn(180, 9, 10, None, late=True, token=1): 1,                      # ... by a version 1 token: unknown here
    Turn(120, 12, 1, False, ended_by="soft_stuck"): 2,                  # the probe's D halted them: failed (cut)
    Turn(130, 10, 1, None, late=True, ended_by="soft_stuck"): 1,        # ... resolved later: resolved
    Turn(90, 8, 12, True): 4,                                           # not past S: streak rows only
    Turn(2001, 3, 0, None, ended_by="hard_backstop"): 2,                # the probe's backstop: censored
    Turn(2001, 3, 0, None, late=True, ended_by="hard_backstop"): 1,     # ... resolved later
    Turn(300, 5, 16, None, late=False, ended_by="streak"): 40,          # the probe's streak stop: failed (cut)
    Turn(50, 1, 0, True): 5,                                            # short and quiet: in no row
    Turn(150, 9, 9, True, cohort="live"): 3,                            # the live cohort: in no row
}
"""Planted turns, how many of each."""


def _ladders(config: GuardConfig) -> dict[str, Ladder]:
    """Calibrate's D and streak ladders of the probe turns (``ProbeEvidence._climb``'s reaches: D
    counts turns past S by their largest repeat, the streak stop every turn by its longest failing
    streak), each with the result the board can see: a version 1 token's late result is not. A turn
    the probe's own loop detector halted, not resolved, is ``cut`` where the probe's value is less
    than twice the main's (``evidence_oracle.cut_halts``)."""
    ladders = {"stuck": Ladder(), "streak": Ladder()}
    cut_by = oracle.cut_halts(config)
    for t, count in TURNS.items():
        if t.cohort != "probe":
            continue
        seen = t.late if t.resolved is None and t.token == 2 else t.resolved
        fate = "cut" if t.ended_by in cut_by and seen is not True else _fate(seen, t.ended_by in LENGTH_LIMITS)
        for _ in range(count):
            if t.calls > CAP.soft_cap and t.repeat:
                ladders["stuck"].add(t.repeat, fate, [0] * t.repeat, t.calls)
            if t.failing:
                ladders["streak"].add(t.failing, fate, [0] * t.failing, t.calls)
    return ladders


def _expected(kind: str, value: int, config: GuardConfig = CONFIG) -> dict[str, float]:
    fates = _ladders(config)[kind].at(value)
    turns = sum(fates.values())
    known = fates["resolved"] + fates["unresolved"] + fates["censored"] + fates["cut"]
    high = upper_bound(fates["resolved"] + fates["cut"], known)[1] if known else math.nan
    return {"turns": turns, **fates, SEEN_HIGH: high, SPARES: float(high < TOLERANCE) if known else math.nan,
            LIMIT_TOO_LOW: 0.0}


def test_the_board_judges_d_and_the_streak_stop_up_to_the_probes_own():
    assert stuck_values(CAP) == list(range(2, 12))
    assert streak_values(CAP) == list(range(2, 17))
    assert stuck_values(CapSettings.from_config(CONFIG.replace(probe={"rate": 0.1, "soft_cap": 300}))) == []
    assert stuck_values(CapSettings.from_config(GuardConfig())) == streak_values(CapSettings.from_config(
        GuardConfig())) == []


def test_the_planted_turns_give_both_directions():
    """D = 4 halts the two productive turns and the two resolved later (by a version 2 token, one of
    them halted by the probe's D); D = 5 only the latter, and at 9 the turn resolved by a version 1
    token stays unknown. A streak stop
    of 12 halts the four productive turns that failed 12 times in a row; 13 halts only the 40 that
    failed: the first value whose bound is under the tolerance."""
    assert (_expected("stuck", 4)["resolved"], _expected("stuck", 5)["resolved"]) == (4, 2)
    assert (_expected("stuck", 9)["unknown"], _expected("stuck", 9)["resolved"]) == (1, 2)
    assert (_expected("streak", 12)["resolved"], _expected("streak", 13)["resolved"]) == (4, 0)
    assert (_expected("stuck", 4)[SPARES], _expected("streak", 12)[SPARES], _expected("streak", 13)[SPARES]) == (
        0.0, 0.0, 1.0)


def test_a_probe_below_twice_the_main_value_never_spares_a_value_its_halts_reach():
    """With the probe's D at 10 and its stop at 12, its stuck and streak halts are cut: the 40 turns
    the stop halted count as productive at the high end, so no streak stop up to 12 spares them
    (with the probe's stop at 16, 13 does); D keeps the rows its cut turns do not reach."""
    cut = CapSettings.from_config(CUT)
    assert stuck_values(cut) == list(range(2, 11)) and streak_values(cut) == list(range(2, 13))
    assert [v for v in streak_values(cut) if _expected("streak", v, CUT)[SPARES] == 1.0] == []
    assert (_expected("streak", 12, CUT)["cut"], _expected("stuck", 9, CUT)["cut"]) == (40, 2)
    assert _expected("streak", 12)["cut"] == 0 and _expected("streak", 12)["unresolved"] == 40


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _series(config: GuardConfig) -> list[dict[str, str]]:
    """The records one evaluation would leave for ``TURNS`` (one sample each, at 1m)."""
    counts: dict[str, int] = {}

    def add(name: str, n: int) -> None:
        counts[name] = counts.get(name, 0) + n

    call_edges = [*_edges(CapSettings.from_config(config)), math.inf]
    for t, count in TURNS.items():
        base = {series.POLICY: "default-probe" if t.cohort == "probe" else "default", series.COHORT: t.cohort,
                series.AGENT: "a", series.THRESHOLD: t.ended_by}
        facts = {**base, series.RESOLVED: {True: "true", False: "false", None: "unknown"}[t.resolved]}
        for histogram, value, edges, more in (
                (series.MAX_REPEAT, t.repeat, buckets.repeat_edges(config),
                 {series.PAST_SOFT_CAP: "true" if t.calls > CAP.soft_cap else "false"}),
                (series.MAX_FAILING, t.failing, buckets.failing_streak_edges(config), {})):
            for e in [*edges, math.inf]:
                le = "+Inf" if e == math.inf else f"{e:g}"
                add(rules.RECORDED[f"{histogram}_bucket"] + _labels(**facts, **more, le=le), count * int(value <= e))
        if t.late is not None:
            bucket = next(e for e in call_edges if t.calls <= e)
            counted = buckets.count_bucket if t.token == 2 else (lambda _: buckets.count_bucket(None))
            result = {**base, series.RESOLVED: "true" if t.late else "false", series.RESULT_STATUS: "accepted",
                      series.MAIN_THRESHOLD: "none",
                      series.CALLS_BUCKET: "+Inf" if bucket == math.inf else f"{bucket:g}",
                      series.REPEAT_BUCKET: counted(t.repeat), series.FAILING_BUCKET: counted(t.failing)}
            add(rules.RECORDED[series.RESULTS] + _labels(**result), count)
    return [{"series": s, "values": f"_ {n}"} for s, n in counts.items()]


def _panel_queries(config: GuardConfig = CONFIG) -> list[queries.PanelQuery]:
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    return [pq for pq in queries.panel_queries(board) if pq.panel_id == 50]


def test_panel_50_has_the_frontier_columns():
    assert {pq.legend for pq in _panel_queries()} == {"turns", "resolved", "unresolved", "censored", "cut",
                                                       "unknown", SEEN_HIGH, SPARES, LIMIT_TOO_LOW}


VALUES = {"__range": "5m", "__range_s": "300", q.POLICY_VARIABLE: ".*", q.AGENT_VARIABLE: ".*",
          q.COHORT_VARIABLE: q.LIVE, q.TOLERANCE_VARIABLE: repr(TOLERANCE)}
SCALE = 1e9
"""The bound is compared to 9 places (PromQL and Python may differ in the last bit)."""


def _exp_samples(column: str, config: GuardConfig) -> list[dict[str, object]]:
    out = []
    cap = CapSettings.from_config(config)
    for kind, values in (("stuck", stuck_values(cap)), ("streak", streak_values(cap))):
        for value in values:
            figure = _expected(kind, value, config)[column]
            if math.isnan(figure):
                continue
            shown = round(figure * SCALE) if column == SEEN_HIGH else figure
            out.append({"labels": f'{{value="{kind}:{value}"}}', "value": shown})
    return out


def _expr(pq: queries.PanelQuery) -> str:
    expr = queries.resolve(pq.expr, VALUES)
    return f"round(({expr}) * {SCALE:g})" if pq.legend == SEEN_HIGH else expr


@pytest.mark.parametrize("probe", sorted(CONFIGS))
def test_panel_50_is_calibrates_frontier_of_the_planted_turns(promtool, tmp_path, probe):
    config = CONFIGS[probe]
    tests = [{"expr": _expr(pq), "eval_time": "5m", "exp_samples": _exp_samples(pq.legend, config)}
             for pq in _panel_queries(config)]
    chain.promtool_expressions(promtool, tmp_path, _series(config), tests)


@pytest.mark.parametrize("main", [(6, 8), (3, 6), (2, 2)], ids=str)
def test_the_board_cuts_a_probe_loop_halt_exactly_where_calibrate_does(main):
    """Every probe D and streak stop from 2 to three times the main's, and no probe known: the loop
    halts the board counts as censored are those calibrate's ``fate_of`` calls ``cut`` on the probe's
    recorded limits (none recorded where the board knows no probe)."""
    d, stop = main
    e = ProbeEvidence(100, 10.0, d, stop)
    live = GuardConfig(stuck_repeat_threshold=d, streak_stop_at=stop, streak_warn_at=1)

    def calibrates(limits: Limits | None) -> set[str]:
        return {t for t in ("soft_stuck", "streak") if e.fate_of(False, t, limits) == "cut"}

    def boards(config: GuardConfig) -> set[str]:
        return {t.value for t in evidence.ProbeHalts.of(CapSettings.from_config(config)).cut}

    for own_d in range(2, 3 * d + 1):
        for own_stop in range(2, 3 * stop + 1):
            config = live.replace(probe={"rate": 0.1, "stuck_repeat_threshold": own_d, "streak_stop_at": own_stop})
            limits = Limits("adaptive", 100, 1000, own_d, 1, own_stop)
            assert boards(config) == calibrates(limits), (main, own_d, own_stop)
    assert boards(live) == calibrates(None) == {"soft_stuck", "streak"}
