"""The threshold board's frontier rows at a ladder's first step (a backstop of 1x, D = 1, a streak
stop, cap or cycle cap of 1): a row exactly where calibrate's frontier judges that step, as the live
value only (``_probe.judged``, the one rule both read). Row sets for every threshold's ladder with
the live value at the first step and above it, then panels 41 and 50 through ``promtool test
rules`` against calibrate's own ``frontier`` rungs on the same planted turns."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

import test_dashboards_count_frontier as counts  # noqa: E402
from turnguard._boards import build, queries, rules, series  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._boards.thresholds import (  # noqa: E402
    BACKSTOP_MULTIPLES,
    LIMIT_TOO_LOW,
    SEEN_HIGH,
    SET_HERE,
    SPARES,
    _count_note,
    _edges,
    cycle_values,
    explicit_values,
    past_multiples,
    streak_values,
    stuck_values,
)
from turnguard._calibrate.evidence import Frontier, Ladder, Scale, _fate, frontier  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._probe import CENSORING_HALTS, judged  # noqa: E402

TOLERANCE = counts.TOLERANCE
PROBE = {"rate": 0.1, "hard_multiplier": 20, "stuck_repeat_threshold": 12, "streak_stop_at": 16,
         "max_cycles_per_turn": 0}
LIVES = (1, 2, 3, 6)
"""Live values: the first step, the next and two above it."""


def _config(probe: dict[str, object] | None = None, **live: object) -> GuardConfig:
    return GuardConfig(probe={**PROBE, **(probe or {})}, **live)


def _calibrate(threshold: str, live: int) -> Frontier:
    """Calibrate's frontier of a ladder with productive and failed turns at every value up to 8."""
    ladder = Ladder()
    for reach in range(1, 9):
        ladder.add(reach, "resolved", [0] * reach, 10)
        ladder.add(reach, "unresolved", [0] * reach, 10)
    return frontier(threshold, ladder, live, TOLERANCE, Scale(0, 0, 0))


def _calibrate_rows(f: Frontier) -> set[int]:
    return {row["value"] for row in f.to_json()["rows"]}


BOARD_ROWS: dict[str, tuple[Callable[[int], GuardConfig], Callable[[CapSettings], list[int]]]] = {
    "backstop": (lambda v: _config(hard_multiplier=v), past_multiples),
    "stuck": (lambda v: _config(stuck_repeat_threshold=v, streak_warn_at=0), stuck_values),
    "cycles": (lambda v: _config(max_cycles_per_turn=v), cycle_values),
    "explicit": (lambda v: _config({"max_tool_calls_per_turn": 1000},
                                            max_tool_calls_per_turn=v), explicit_values),
}
"""Per ladder the board has rows for (the streak stop's is below): the main configuration with a live
value, and the board's values for it."""


@pytest.mark.parametrize("live", LIVES)
@pytest.mark.parametrize("threshold", sorted(BOARD_ROWS))
def test_the_board_has_a_first_step_row_exactly_where_calibrate_has_one(threshold, live):
    configured, values = BOARD_ROWS[threshold]
    rows = values(CapSettings.from_config(configured(live)))
    calibrate = _calibrate(threshold, live)
    assert (1 in rows) == (1 in _calibrate_rows(calibrate)) == (live == 1), (rows, calibrate.to_json()["rows"])
    assert all(judged(v, live) for v in rows)
    assert live in rows or (threshold == "backstop" and live not in (1, *BACKSTOP_MULTIPLES))


@pytest.mark.parametrize("multiplier", [1, 1.5, 2, 10])
def test_panel_41_adds_the_first_step_only_as_the_live_whole_multiple(multiplier):
    rows = past_multiples(CapSettings.from_config(_config(hard_multiplier=multiplier)))
    assert rows == ([1] if multiplier == 1 else []) + list(BACKSTOP_MULTIPLES)


@pytest.mark.parametrize("live", LIVES)
def test_a_live_streak_stop_of_1_is_said_to_be_calibrates_alone(live):
    """The failing-streak buckets hold a turn with no failure and one with a single failure together:
    the board has no row for a stop of 1, and panel 48 says calibrate, which judges it, has it."""
    cap = CapSettings.from_config(_config(streak_stop_at=live, streak_warn_at=1))
    assert (1 in _calibrate_rows(_calibrate("streak", live))) == (live == 1)
    assert 1 not in streak_values(cap) and all(judged(v, live) for v in streak_values(cap))
    said = "live streak stop of 1" in _count_note(cap)
    assert said == (live == 1)


# -- panel 50 and panel 41 on promtool against calibrate's frontier --------------------------------


def _columns(f: Frontier, value: int) -> dict[str, float]:
    """Calibrate's rung ``value`` in the board's columns (no turn reaches it past the ladder's top)."""
    if value > len(f.rungs):
        return {"turns": 0, "resolved": 0, "unresolved": 0, "censored": 0, "cut": 0, "unknown": 0,
                SEEN_HIGH: math.nan, SPARES: math.nan, LIMIT_TOO_LOW: float(f.limit_too_low)}
    r = f.rung(value)
    high = r.high if r.at_risk else math.nan
    return {"turns": r.at_risk + r.unknown, "resolved": r.productive,
            "unresolved": r.at_risk - r.productive - r.censored - r.cut, "censored": r.censored, "cut": r.cut,
            "unknown": r.unknown, SEEN_HIGH: high, SPARES: float(high < TOLERANCE) if r.at_risk else math.nan,
            LIMIT_TOO_LOW: float(f.limit_too_low)}


def _samples(column: str, rows: dict[str, dict[str, float]], key: str) -> list[dict[str, object]]:
    column = SPARES if column == SET_HERE else column
    out = []
    for row, figures in rows.items():
        figure = figures[column]
        if not math.isnan(figure):
            shown = round(figure * counts.SCALE) if column == SEEN_HIGH else figure
            out.append({"labels": f'{{{key}="{row}"}}', "value": shown})
    return out


def _panel(config: GuardConfig, panel: int) -> list[queries.PanelQuery]:
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    return [pq for pq in queries.panel_queries(board) if pq.panel_id == panel]


COUNT_LIVES = {"D = 1": {"stuck_repeat_threshold": 1, "streak_warn_at": 0}, "D = 2": {"stuck_repeat_threshold": 2},
               "D = 6": {}}


@pytest.mark.parametrize("live", sorted(COUNT_LIVES))
def test_panel_50_rows_are_calibrates_frontier_with_the_live_first_step(promtool, tmp_path, monkeypatch, live):
    """Panel 50 on test_dashboards_count_frontier's planted turns and three failed turns past S that
    never repeat a call, main D at 1, 2 and 6: each row is calibrate's ``frontier`` rung of that
    value, D = 1 a row exactly when it is the live D (and then holding those three too)."""
    monkeypatch.setattr(counts, "TURNS", {**counts.TURNS, counts.Turn(150, 1, 1, False): 3})
    config = counts.CONFIG.replace(**COUNT_LIVES[live])
    cap = CapSettings.from_config(config)
    ladders = counts._ladders(config)
    fronts = {kind: frontier(kind, ladders[kind], live_value, TOLERANCE, Scale(0, 0, 0)) for kind, live_value in
              (("stuck", cap.stuck_repeat_threshold), ("streak", cap.streak_stop_at))}
    values = {"stuck": stuck_values(cap), "streak": streak_values(cap)}
    assert (1 in values["stuck"]) == (1 in _calibrate_rows(fronts["stuck"])) == (cap.stuck_repeat_threshold == 1)
    rows = {f"{kind}:{v}": _columns(fronts[kind], v) for kind in values for v in values[kind]}
    if cap.stuck_repeat_threshold == 1:
        assert rows["stuck:1"]["unresolved"] == rows["stuck:2"]["unresolved"] + 3
    tests = [{"expr": counts._expr(pq), "eval_time": "5m", "exp_samples": _samples(pq.legend, rows, "value")}
             for pq in _panel(config, 50)]
    chain.promtool_expressions(promtool, tmp_path, counts._series(config), tests)


TURNS = {  # (calls, result in the turn, result later, the probe's halt): how many
    (150, True, None, "none"): 2,               # past 1x only: productive
    (180, False, None, "none"): 3,              # past 1x only: failed
    (250, None, True, "none"): 1,               # past 2x: resolved later, placed by its call bucket
    (400, False, None, "none"): 6,              # past 3x: failed
    (1200, None, False, "none"): 30,            # past 10x: failed, reported later
    (2001, None, None, "hard_backstop"): 2,     # the probe's backstop: censored
    (90, True, None, "none"): 4,                # within S: in no row
}
LENGTH_LIMITS = set(CENSORING_HALTS)


def _backstop_ladder(config: GuardConfig) -> Ladder:
    """Calibrate's backstop ladder of ``TURNS`` (``ProbeEvidence._climb``: reach ``(calls - 1) // S``)."""
    ladder, s = Ladder(), config.soft_cap
    for (calls, resolved, late, ended_by), n in TURNS.items():
        seen = late if resolved is None else resolved
        for _ in range(n):
            ladder.add((calls - 1) // s, _fate(seen, ended_by in LENGTH_LIMITS), [0] * ((calls - 1) // s), calls)
    return ladder


def _call_series(config: GuardConfig) -> list[dict[str, str]]:
    """The records one evaluation would leave for ``TURNS``: turns, their call buckets, late results."""
    edges = [*_edges(CapSettings.from_config(config)), math.inf]
    base = {series.POLICY: "default-probe", series.COHORT: "probe", series.AGENT: "a", series.CAP_MODE: "adaptive",
            series.MAIN_THRESHOLD: "none"}
    out: dict[str, int] = {}

    def add(name: str, labels: dict[str, str], n: int) -> None:
        key = name + "{" + ", ".join(f'{k}="{v}"' for k, v in {**base, **labels}.items()) + "}"
        out[key] = out.get(key, 0) + n

    for (calls, resolved, late, ended_by), n in TURNS.items():
        facts = {series.RESOLVED: {True: "true", False: "false", None: "unknown"}[resolved], series.THRESHOLD: ended_by}
        add(rules.RECORDED[series.TURNS], facts, n)
        for e in edges:
            add(rules.RECORDED[f"{series.TOOL_CALLS}_bucket"], {**facts, "le": "+Inf" if e == math.inf else f"{e:g}"},
                n * int(calls <= e))
        if late is not None:
            bucket = next(e for e in edges if calls <= e)
            add(rules.RECORDED[series.RESULTS], {series.RESOLVED: "true" if late else "false",
                                                 series.RESULT_STATUS: "accepted", series.THRESHOLD: ended_by,
                                                 series.CALLS_BUCKET: "+Inf" if bucket == math.inf else f"{bucket:g}"},
                n)
    return [{"series": s, "values": f"_ {n}"} for s, n in out.items()]


@pytest.mark.parametrize("multiplier", [1, 2, 10])
def test_panel_41_rows_are_calibrates_backstop_frontier_with_the_live_first_step(promtool, tmp_path, multiplier):
    """Panel 41, main backstop at 1x, 2x and 10x: each row is calibrate's backstop ``frontier``
    rung of that multiple, 1x a row exactly when it is the live multiple (and then, with only
    failed turns past S besides the productive ones, the bound is calibrate's)."""
    config = GuardConfig(hard_multiplier=multiplier, probe={"rate": 0.1, "hard_multiplier": 20})
    f = frontier("backstop", _backstop_ladder(config), multiplier, TOLERANCE, Scale(0, 0, 0))
    multiples = past_multiples(CapSettings.from_config(config))
    assert (1 in multiples) == (1 in _calibrate_rows(f)) == (multiplier == 1)
    rows = {str(k): _columns(f, k) for k in multiples}
    if multiplier == 1:
        assert rows["1"]["turns"] == rows["2"]["turns"] + 5
    tests = [{"expr": counts._expr(pq), "eval_time": "5m", "exp_samples": _samples(pq.legend, rows, "multiple")}
             for pq in _panel(config, 41)]
    chain.promtool_expressions(promtool, tmp_path, _call_series(config), tests)
