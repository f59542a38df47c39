"""The threshold board's frontier panels apply calibrate's horizon rule (``evidence.horizon_too_low``):
where the probe's own limit may have cut productive turns off, no row is within and the column
*probe's own limit too low* says so. Planted fleets, as ``tests/ladders.py`` plants them (turns by
reach and fate), for panel 49's explicit cap rows (the probe's cap censoring the turns, as the
backstop's horizon tests do) and panel 50's streak stop rows, through ``promtool test rules``,
against calibrate's own ``frontier`` of the same turns: the low-cap fleets (productive turns ending
near the probe's limit among turns it halted) get no value and the limit shown too low; the keep and
raise fleets (productive turns well below it) keep their values."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

import test_dashboards_count_frontier as counts  # noqa: E402
import test_dashboards_frontier_first_step as first  # noqa: E402
from turnguard._boards import build, queries  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._boards.thresholds import SPARES, explicit_values, streak_values, stuck_values  # noqa: E402
from turnguard._calibrate.evidence import Frontier, Ladder, Scale, _fate, frontier, horizon_too_low  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._probe import CENSORING_HALTS  # noqa: E402

TOLERANCE = counts.TOLERANCE
LIMIT_TOO_LOW = "probe's own limit too low"
"""The column a user reads (``thresholds.LIMIT_TOO_LOW``)."""
LENGTH_LIMITS = set(CENSORING_HALTS)


@dataclass(frozen=True)
class Group:
    """``n`` probe turns reaching ``reach`` (the largest value that halts them), their result in
    the turn (``None``: none) and what ended them."""

    reach: int
    resolved: bool | None
    n: int
    ended_by: str = "none"


def _ladder(groups: list[Group], unit: int = 1) -> Ladder:
    ladder = Ladder()
    for g in groups:
        for _ in range(g.n):
            ladder.add(g.reach // unit, _fate(g.resolved, g.ended_by in LENGTH_LIMITS), [0] * (g.reach // unit), 0)
    return ladder


def _expected(f: Frontier, values: list[int], kind: str) -> dict[str, dict[str, float]]:
    """Calibrate's verdict on each board row: spares them where its rung is within, and whether
    the probe's limit is too low (the whole threshold's)."""
    out = {}
    for v in values:
        r = f.rung(v) if v // f.unit <= len(f.rungs) else None
        spares = float(r.decision == "within") if r is not None and r.at_risk else math.nan
        out[f"{kind}:{v}"] = {SPARES: spares, LIMIT_TOO_LOW: float(f.limit_too_low)}
    return out


def _samples(column: str, rows: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    """Every row: each fleet gives every row a turn at risk (promtool never finds NaN equal to NaN)."""
    assert not any(math.isnan(figures[column]) for figures in rows.values())
    return [{"labels": f'{{value="{row}"}}', "value": figures[column]} for row, figures in rows.items()]


def _check(promtool: str, tmp_path, config: GuardConfig, panel: int, rows: dict[str, dict[str, float]],
           series: list[dict[str, str]]) -> None:
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    tests = [{"expr": counts._expr(pq), "eval_time": "5m", "exp_samples": _samples(pq.legend, rows)}
             for pq in queries.panel_queries(board) if pq.panel_id == panel and pq.legend in (SPARES, LIMIT_TOO_LOW)]
    chain.promtool_expressions(promtool, tmp_path, series, tests)
    assert len(tests) == 2, "no column says whether the probe's own limit is too low"


# -- the fleets, on a threshold's values from its live value ``live`` to the probe's limit ``last + 1`` --


def low_cap(last: int, gap: int, censored: Group, step: int = 1) -> list[Group]:
    """One productive turn per value from half the limit up to ``gap`` values below the last one
    judged, among the ``censored`` turns the probe's limit halted past them
    (``test_calibrate_probe_horizon``), with short turns below every value."""
    return [*(Group(v, True, 1) for v in range(last // 2 // step * step, last - gap * step + 1, step)),
            censored, Group(step, True, 20), Group(4 * step, False, 40)]


def fleet(productive: tuple[int, int], censored: Group, failed: int, step: int = 1) -> list[Group]:
    """``frontier_fleet``'s keep and raise designs on one threshold: 40 productive turns spread over
    ``productive``, the ``censored`` runaways the probe's limit halted, 40 turns that failed
    at reach ``failed``, and short ones below every value."""
    low, high = productive
    spread = [low + (high - low) * i // 39 // step * step for i in range(40)]
    return [*(Group(v, True, 1) for v in spread), censored, Group(failed, False, 40),
            Group(step, True, 60)]


# -- panel 49: the explicit cap, live 100 calls (values in steps of 10), the probe's cap censoring ----

LIVE_CAP, STEP = 100, 10


def _explicit_config(probe_cap: int) -> GuardConfig:
    return GuardConfig(max_tool_calls_per_turn=LIVE_CAP, probe={"rate": 0.1, "max_tool_calls_per_turn": probe_cap})


def _at_the_cap(probe_cap: int, n: int) -> Group:
    """``n`` runaways the probe's explicit cap halted: past every value judged."""
    return Group(probe_cap, None, n, "explicit")


def _explicit_case(monkeypatch: pytest.MonkeyPatch, probe_cap: int,
                   groups: list[Group]) -> tuple[GuardConfig, Frontier, dict[str, dict[str, float]]]:
    """A reach v (calls) is a turn of v + 1 calls (``_call_series`` records its turns)."""
    config = _explicit_config(probe_cap)
    f = frontier("explicit", _ladder(groups, STEP), LIVE_CAP, TOLERANCE, Scale(0, 0, 0), probe_cap, STEP)
    turns: dict[tuple[int, bool | None, None, str], int] = {}
    for g in groups:
        key = (g.reach + 1, g.resolved, None, g.ended_by)
        turns[key] = turns.get(key, 0) + g.n
    monkeypatch.setattr(first, "TURNS", turns)
    return config, f, _expected(f, explicit_values(CapSettings.from_config(config)), "explicit")


@pytest.mark.parametrize("gap", [0, 1, 2, 3])
@pytest.mark.parametrize("probe_cap", [250, 400, 1000])
def test_panel_49_shows_no_cap_within_and_the_limit_too_low_where_calibrate_does(promtool, tmp_path, monkeypatch,
                                                                                  probe_cap, gap):
    last = probe_cap - STEP
    groups = low_cap(last, gap, _at_the_cap(probe_cap, 70), STEP)
    config, f, rows = _explicit_case(monkeypatch, probe_cap, groups)
    assert horizon_too_low(_ladder(groups, STEP), last // STEP) and f.limit_too_low and f.recommended is None
    assert all(figures[LIMIT_TOO_LOW] == 1.0 and figures[SPARES] != 1.0 for figures in rows.values())
    _check(promtool, tmp_path, config, 49, rows, first._call_series(config))


EXPLICIT_FLEETS = {
    "keep": (1000, fleet((160, 190), _at_the_cap(1000, 40), 60, STEP)),
    "raise": (1000, fleet((220, 440), _at_the_cap(1000, 40), 60, STEP)),
    "keep-under-400": (400, fleet((160, 190), _at_the_cap(400, 40), 60, STEP)),
}
"""``frontier_fleet``'s KEEP (long turns need 8x to 9.5x S = 20: 160 to 190 calls) and RAISE (11x to
22x: 220 to 440 calls) under a probe cap of 1000, and KEEP's under one of 400."""


@pytest.mark.parametrize("name", sorted(EXPLICIT_FLEETS))
def test_panel_49_keeps_the_values_of_fleets_whose_productive_turns_end_well_below_the_probes_cap(
        promtool, tmp_path, monkeypatch, name):
    probe_cap, groups = EXPLICIT_FLEETS[name]
    config, f, rows = _explicit_case(monkeypatch, probe_cap, groups)
    assert not f.limit_too_low and f.recommended is not None
    assert all(figures[LIMIT_TOO_LOW] == 0.0 for figures in rows.values())
    assert any(figures[SPARES] == 1.0 for figures in rows.values())
    _check(promtool, tmp_path, config, 49, rows, first._call_series(config))


# -- panel 50: the streak stop, live 8, the probe's 16; its backstop censoring ------------------------

STREAK_CONFIG = GuardConfig(probe={"rate": 0.1, "hard_multiplier": 20, "streak_stop_at": 16})
"""The probe's stop at twice the main's: its streak halts are failures, not cut."""
STOP = 16


def _at_the_backstop(reach: int, n: int) -> Group:
    """``n`` turns the probe's backstop halted with a failing streak of ``reach``."""
    return Group(reach, None, n, "hard_backstop")


STUCK = counts.Turn(150, 6, 0, False)
"""40 turns past S that failed repeating a call 6 times, no call failing: every D row's, none of the
streak stop's (D's rows are within, the limit not too low: no productive turn past S)."""


def _streak_case(monkeypatch: pytest.MonkeyPatch, groups: list[Group]) -> tuple[Frontier, dict[str, dict[str, float]]]:
    """A streak reach v: a turn (within S, so in no D row) whose longest failing streak was v
    (``counts._series`` records its turns, and ``STUCK``'s)."""
    f = frontier("streak", _ladder(groups), STREAK_CONFIG.streak_stop_at, TOLERANCE, Scale(0, 0, 0), STOP + 1)
    turns: dict[counts.Turn, int] = {STUCK: 40}
    for g in groups:
        t = counts.Turn(50, 1, g.reach, g.resolved, ended_by=g.ended_by)
        turns[t] = turns.get(t, 0) + g.n
    monkeypatch.setattr(counts, "TURNS", turns)
    cap = CapSettings.from_config(STREAK_CONFIG)
    rows = _expected(f, streak_values(cap), "streak")
    rows |= {f"stuck:{v}": {SPARES: 1.0, LIMIT_TOO_LOW: 0.0} for v in stuck_values(cap)}
    return f, rows


@pytest.mark.parametrize("gap", [2, 3, 4])
def test_panel_50_shows_no_stop_within_and_the_limit_too_low_where_calibrate_does(promtool, tmp_path, monkeypatch,
                                                                                   gap):
    """The probe's backstop halts 70 turns at a failing streak of 15 (its stop, 16, halts 40 that
    failed): productive turns ending up to ``gap`` values below the stop are cut off."""
    groups = [*low_cap(STOP, gap, _at_the_backstop(STOP - 1, 70)), Group(STOP, False, 40, "streak")]
    f, rows = _streak_case(monkeypatch, groups)
    assert horizon_too_low(_ladder(groups), STOP) and f.limit_too_low and f.recommended is None
    assert all(figures[SPARES] != 1.0 for row, figures in rows.items() if row.startswith("streak:"))
    _check(promtool, tmp_path, STREAK_CONFIG, 50, rows, counts._series(STREAK_CONFIG))


STREAK_FLEETS = {"keep": fleet((5, 7), _at_the_backstop(2, 40), STOP),
                 "raise": fleet((9, 12), _at_the_backstop(2, 40), STOP)}
"""``frontier_fleet``'s KEEP (retries succeed after 5 to 7 identical failures) and RAISE (9 to 12):
the failing turns halted at the probe's stop, the runaways at its backstop with short streaks."""


@pytest.mark.parametrize("name", sorted(STREAK_FLEETS))
def test_panel_50_keeps_the_values_of_fleets_whose_productive_turns_end_well_below_the_probes_stop(
        promtool, tmp_path, monkeypatch, name):
    f, rows = _streak_case(monkeypatch, STREAK_FLEETS[name])
    assert not f.limit_too_low and f.recommended == {"keep": 8, "raise": 13}[name]
    assert rows[f"streak:{f.recommended}"][SPARES] == 1.0
    _check(promtool, tmp_path, STREAK_CONFIG, 50, rows, counts._series(STREAK_CONFIG))


def test_the_board_says_the_limit_is_too_low_where_calibrates_test_of_the_gap_leaves_a_value(promtool, tmp_path,
                                                                                            monkeypatch):
    """The board does not run calibrate's conditional test of the values between the longest
    productive turn and the limit (docs/calibration.md): many productive turns per value, then
    none for 4 values among 40 censored, is a fall in calibrate's test (it sets 13), while the
    board, on the rule's observable conditions, shows no value within and the limit too low."""
    groups = [*(Group(v, True, 4) for v in range(5, 13)), _at_the_backstop(STOP - 1, 40), Group(STOP, False, 40)]
    f, rows = _streak_case(monkeypatch, groups)
    assert not f.limit_too_low and f.recommended == 13
    board = {row: {SPARES: 0.0, LIMIT_TOO_LOW: 1.0} if row.startswith("streak:") else figures
             for row, figures in rows.items()}
    _check(promtool, tmp_path, STREAK_CONFIG, 50, board, counts._series(STREAK_CONFIG))
