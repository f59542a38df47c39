"""The threshold board's frontier panels apply calibrate's horizon rule (``evidence.horizon_too_low``):
where the probe's own limit may have cut productive turns off, no row is within and the column
*probe's own limit too low* says so. Planted fleets, as ``tests/ladders.py`` plants them (turns by
reach and fate), for panel 49's explicit cap rows (the probe's cap censoring the turns, as the
backstop's horizon tests do), panel 50's streak stop rows and panel 41's multiples of S (the
probe's backstop censoring), through ``promtool test rules``,
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
from turnguard._boards import build, horizon, queries  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._boards.thresholds import (  # noqa: E402
    SET_HERE,
    SPARES,
    explicit_values,
    past_multiples,
    streak_values,
    stuck_values,
)
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


# -- panel 41: the backstop's multiples of S = 100, the probe's backstop censoring ------------------

S = 100
BACKSTOP_CASES = {12: 11, 15: 14, 20: 19, 30: 29}
"""The probe's backstop multiple: the last multiple calibrate judges below it (``advice``'s horizon,
the probe's cap over S, rounded up)."""
ROWS_SEEN = (20, 30)
"""Probe backstops whose turns are seen past every row of panel 41 (2x to 20x): each row has a
figure (promtool never finds NaN equal to NaN); a row at or past the probe's cap is calibrate's
``past_cap``, never within (the flag zeroes it)."""


def _backstop_config(probe_multiple: int) -> GuardConfig:
    return GuardConfig(probe={"rate": 0.1, "hard_multiplier": probe_multiple})


def _halted_at_the_probes_backstop(probe_multiple: int, n: int, late: bool | None = None) -> Group:
    """``n`` runaways the probe's backstop halted (a result reported later: ``late``), past every
    multiple judged."""
    return Group(probe_multiple, late, n, "hard_backstop")


def _backstop_case(monkeypatch: pytest.MonkeyPatch, probe_multiple: int, groups: list[Group],
                   late: tuple[Group, ...] = ()) -> tuple[GuardConfig, Frontier, dict[str, dict[str, float]]]:
    """A reach k (multiples of S) is a turn of k×S + 1 calls (``first._call_series`` records the
    turns, ``late``'s results reported after the turn); calibrate's backstop frontier of the same
    turns, judged up to the probe's cap over S; each of panel 41's rows calibrate's decision."""
    config = _backstop_config(probe_multiple)
    probe = CapSettings.from_config(config).probe
    assert probe is not None and probe.hard_cap is not None
    f = frontier("backstop", _ladder([*groups, *late]), int(config.hard_multiplier), TOLERANCE, Scale(0, 0, 0),
                 -(-probe.hard_cap // S))
    turns: dict[tuple[int, bool | None, bool | None, str], int] = {}
    for g, after in [*((g, False) for g in groups), *((g, True) for g in late)]:
        key = (g.reach * S + 1, None if after else g.resolved, g.resolved if after else None, g.ended_by)
        turns[key] = turns.get(key, 0) + g.n
    monkeypatch.setattr(first, "TURNS", turns)
    rows = {}
    for k in past_multiples(CapSettings.from_config(config)):
        r = f.rung(k) if k <= len(f.rungs) else None
        spares = float(r.decision == "within") if r is not None and r.at_risk else math.nan
        rows[str(k)] = {SET_HERE: spares, LIMIT_TOO_LOW: float(f.limit_too_low)}
    return config, f, rows


def _check_41(promtool: str, tmp_path, config: GuardConfig, rows: dict[str, dict[str, float]]) -> None:
    """Panel 41's two columns through the rules: the flag on every row, whether a backstop there
    spares them where a probe turn is seen past it (none is at or past the probe's cap)."""
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    tests = [{"expr": counts._expr(pq), "eval_time": "5m", "exp_samples": [
        {"labels": f'{{multiple="{row}"}}', "value": figures[pq.legend]} for row, figures in rows.items()
        if not math.isnan(figures[pq.legend])]}
        for pq in queries.panel_queries(board) if pq.panel_id == 41 and pq.legend in (SET_HERE, LIMIT_TOO_LOW)]
    assert len(tests) == 2, "no column says whether the probe's own cap is too low"
    chain.promtool_expressions(promtool, tmp_path, first._call_series(config), tests)


@pytest.mark.parametrize("gap", [0, 1, 2])
@pytest.mark.parametrize("probe_multiple", ROWS_SEEN)
def test_panel_41_shows_no_backstop_within_and_the_limit_too_low_where_calibrate_does(
        promtool, tmp_path, monkeypatch, probe_multiple, gap):
    """Productive turns ending up to ``gap`` multiples below the last one judged, among 70 the
    probe's backstop halted: calibrate gives no multiple, and no row of panel 41 spares them."""
    last = BACKSTOP_CASES[probe_multiple]
    groups = low_cap(last, gap, _halted_at_the_probes_backstop(probe_multiple, 70))
    config, f, rows = _backstop_case(monkeypatch, probe_multiple, groups)
    assert f.horizon is not None and f.horizon - 1 == last
    assert horizon_too_low(_ladder(groups), last) and f.limit_too_low and f.recommended is None
    assert all(figures[LIMIT_TOO_LOW] == 1.0 and figures[SET_HERE] != 1.0 for figures in rows.values())
    _check_41(promtool, tmp_path, config, rows)


@pytest.mark.parametrize("probe_multiple", ROWS_SEEN)
def test_panel_41_does_not_spare_at_a_row_that_only_a_few_long_productive_turns_pass(promtool, tmp_path,
                                                                                     monkeypatch, probe_multiple):
    """A few productive turns ending near the probe's cap among 400 it halted: at 10x their share's
    bound is under the tolerance, so a backstop there would read as sparing them, but calibrate finds
    the cap too low and gives no multiple; panel 41 says no there, and why."""
    last = BACKSTOP_CASES[probe_multiple]
    groups = [*(Group(v, True, 1) for v in range(last - 4, last + 1)),
              _halted_at_the_probes_backstop(probe_multiple, 400), Group(1, True, 20), Group(4, False, 40)]
    config, f, rows = _backstop_case(monkeypatch, probe_multiple, groups)
    assert f.limit_too_low and f.recommended is None and f.rung(10).high < TOLERANCE
    assert rows["10"] == {SET_HERE: 0.0, LIMIT_TOO_LOW: 1.0}
    _check_41(promtool, tmp_path, config, rows)


BACKSTOP_FLEETS = {
    "keep": (30, fleet((3, 4), _halted_at_the_probes_backstop(30, 40), 8), ()),
    "raise": (30, fleet((4, 9), _halted_at_the_probes_backstop(30, 40), 12), ()),
    "keep, runaways resolved later": (30, fleet((3, 4), _halted_at_the_probes_backstop(30, 40), 8),
                                      (_halted_at_the_probes_backstop(30, 3, late=True),)),
}
"""Productive turns well below the probe's backstop (3x to 4x; 4x to 9x), runaways it halted (some
reported resolved after the turn: past every multiple judged, they are not the longest productive
turn calibrate reads), turns that failed at 8x or 12x."""


@pytest.mark.parametrize("name", sorted(BACKSTOP_FLEETS))
def test_panel_41_keeps_the_multiples_of_fleets_whose_productive_turns_end_well_below_the_probes_cap(
        promtool, tmp_path, monkeypatch, name):
    probe_multiple, groups, late = BACKSTOP_FLEETS[name]
    config, f, rows = _backstop_case(monkeypatch, probe_multiple, groups, late)
    assert not f.limit_too_low
    assert all(figures[LIMIT_TOO_LOW] == 0.0 for figures in rows.values())
    assert any(figures[SET_HERE] == 1.0 for figures in rows.values()) or late
    _check_41(promtool, tmp_path, config, rows)


def test_panel_41_rows_judged_are_the_multiples_below_the_probes_cap():
    """The rule reads the rows calibrate judges: multiples up to the probe's cap over S, less one."""
    for probe_multiple, last in BACKSTOP_CASES.items():
        assert horizon.last_judged(CapSettings.from_config(_backstop_config(probe_multiple)), "backstop") == last
    explicit = GuardConfig(probe={"rate": 0.1, "max_tool_calls_per_turn": 1450})
    assert horizon.last_judged(CapSettings.from_config(explicit), "backstop") == 14


def test_panel_41_says_whether_the_probes_cap_is_too_low_only_where_it_knows_the_probe():
    """The shipped board, rendered with no probe, cannot tell; one rendered for a probe always says."""
    def legends(config: GuardConfig) -> set[str]:
        board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
        return {pq.legend for pq in queries.panel_queries(board) if pq.panel_id == 41}

    assert SET_HERE in legends(GuardConfig()) and LIMIT_TOO_LOW not in legends(GuardConfig())
    assert {SET_HERE, LIMIT_TOO_LOW} <= legends(_backstop_config(20))


PROBE_LIMITS = (1, 2, 3, 4, 9, 10, 11, 19, 20, 21, 49, 50, 51, 99, 100, 101, 150, 199, 200, 201, 999, 1000, 1001, 1450)
"""Where a probe's limit can sit against the frontier panels' rows: at, just under and just over
their values, under the lowest and past the highest."""
PROBE_SETTINGS = ("max_tool_calls_per_turn", "soft_cap", "max_cycles_per_turn", "stuck_repeat_threshold",
                  "streak_stop_at", "cycle_repeat_stop_at")
MAINS = {"adaptive": GuardConfig(), "explicit and cycles": GuardConfig(
    max_tool_calls_per_turn=50, max_cycles_per_turn=20, cycle_repeat_stop_at=4)}


@pytest.mark.parametrize("main", sorted(MAINS))
@pytest.mark.parametrize("setting", PROBE_SETTINGS)
def test_a_board_renders_for_a_probe_limit_anywhere_against_the_rows(main, setting):
    """The board renders for a probe whose limit sits anywhere against the frontier panels' rows,
    panel 41 with its flag; a probe's cap at or under S (no multiple judged) flags none."""
    rendered = 0
    for limit in PROBE_LIMITS:
        try:
            config = MAINS[main].replace(probe={"rate": 0.1, setting: limit})
        except ValueError:  # (a limit the probe's settings refuse, e.g. a stop under its warn level)
            continue
        board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
        flags = {pq.panel_id: pq for pq in queries.panel_queries(board) if pq.legend == LIMIT_TOO_LOW}
        assert 41 in flags, (setting, limit)
        cap = CapSettings.from_config(config)
        if cap.probe is not None and cap.probe.hard_cap and cap.probe.hard_cap <= cap.soft_cap:
            assert horizon.last_judged(cap, "backstop") == 0
            assert "clamp_max" not in flags[41].expr, (setting, limit)
        rendered += 1
    assert rendered >= len(PROBE_LIMITS) // 2, setting


@pytest.mark.parametrize("kind", ["backstop", "soft", "explicit", "cycles", "stuck", "streak"])
def test_the_flag_is_never_set_when_every_row_is_past_the_last_value_judged(kind):
    """Rows only above the last value judged (the probe's limit at or under the lowest row): no row
    can hold the longest productive turn, so the rule cannot hold."""
    config = GuardConfig(max_tool_calls_per_turn=50, max_cycles_per_turn=20,
                         probe={"rate": 0.1, "max_tool_calls_per_turn": 60, "max_cycles_per_turn": 25,
                                "stuck_repeat_threshold": 3, "streak_warn_at": 2, "streak_stop_at": 3})
    cap = CapSettings.from_config(config)
    last = horizon.last_judged(cap, kind)
    assert last is not None, kind
    rows = {last + step: {"resolved": "vector(1)", "censored": "vector(1)"} for step in (1, 2, 5)}
    assert horizon.limit_too_low(cap, kind, rows) == "vector(0)"
