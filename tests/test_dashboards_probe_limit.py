"""Panel 44 (the probe evidence by live threshold) at the probe's own limit, on a real Prometheus's
PromQL: ``promtool test rules`` evaluates its decision, "more probe turns" and "time at this rate"
columns over planted probe turns, and compares each row with calibrate's ``advice.decide``, which
never says "within" for a row whose threshold the probe does not raise past the main one's
(``advice.row_cap``: the probe halts those turns first, none is seen past it). The board judges by
the probe it is built for (``turnguard assets --config``); calibrate by the probe's recorded limits."""

from __future__ import annotations

import json
import math

import pytest

import chain
from conftest import optional_dependency

optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard._boards import build, queries, rules, series  # noqa: E402
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._calibrate.advice import decide, row_cap  # noqa: E402
from turnguard._calibrate.evidence import Passed, ProbeEvidence  # noqa: E402
from turnguard._calibrate.recording import PolicySeen, Recording  # noqa: E402
from turnguard._calibrate.records import Limits  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._model import Threshold  # noqa: E402
from turnguard.telemetry._recorder import turn_limits  # noqa: E402

PROBE = {"rate": 0.1}
CASES: dict[str, tuple[GuardConfig, set[str]]] = {
    "probe raises S only": (GuardConfig(probe={**PROBE, "soft_cap": 200}), {"soft_stuck", "streak"}),
    "probe keeps the backstop": (GuardConfig(probe={**PROBE, "stuck_repeat_threshold": 12, "streak_stop_at": 16}),
                                 {"hard_backstop"}),
    "probe below the main": (GuardConfig(probe={**PROBE, "hard_multiplier": 20, "stuck_repeat_threshold": 4,
                                                "streak_stop_at": 5}), {"soft_stuck", "streak"}),
    "probe past every limit": (GuardConfig(probe={**PROBE, "hard_multiplier": 20, "stuck_repeat_threshold": 12,
                                                  "streak_stop_at": 16}), set()),
    "no probe known": (GuardConfig(), set()),
    "explicit and cycles, kept": (
        GuardConfig(max_tool_calls_per_turn=50, max_cycles_per_turn=20, cycle_repeat_stop_at=4,
                    probe={**PROBE, "max_tool_calls_per_turn": 50, "max_cycles_per_turn": 20,
                           "cycle_repeat_stop_at": 4, "streak_stop_at": 16}),
        {"explicit", "cycle_cap", "cycle_repeat"}),
    "explicit and cycles, raised": (
        GuardConfig(max_tool_calls_per_turn=50, max_cycles_per_turn=20, cycle_repeat_stop_at=4,
                    probe={**PROBE, "max_tool_calls_per_turn": 100, "max_cycles_per_turn": 40,
                           "cycle_repeat_stop_at": 8, "streak_stop_at": 8}),
        {"streak"}),
}
"""A main configuration with or without a probe, and the rows of panel 44 at the probe's own limit."""

FATES = ((0, 40, 2), (30, 10, 0), (5, 35, 1), (3, 37, 0))
"""(resolved, unresolved, unknown) planted for a row: at 10%, within unless the row is at the probe's
limit; above; undecided, more turns at its share decide it; undecided, within by the high end at more."""
SHIFTS = range(len(FATES))
"""Each row gets each planted fate in one of the runs."""
TOLERANCES = (0.1, 0.3)
VALUES = {"__range": "5m", "__range_s": "300", q.POLICY_VARIABLE: ".*", q.AGENT_VARIABLE: ".*",
          q.COHORT_VARIABLE: q.LIVE}
COLUMNS = ("decision", "more probe turns", "time at this rate")
VERDICTS = {"above": 1, "within": -1, "undecided": 0}
CALIBRATE_ROWS = {"hard_backstop": None, "soft_stuck": "stuck", "streak": "streak"}
"""Calibrate's probe row of each of the board's it has (its backstop row: the turns past m x S, keyed
by the main configuration's whole multiple m)."""


def _fates(config: GuardConfig, shift: int = 0) -> dict[str, tuple[int, int, int]]:
    rows = [t.value for t in CapSettings.from_config(config).thresholds]
    return {row: FATES[(i + shift) % len(FATES)] for i, row in enumerate(rows)}


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _series(config: GuardConfig, shift: int) -> list[dict[str, str]]:
    """The turns record one evaluation leaves for the planted probe turns (one sample, at 1m)."""
    out = []
    for row, counts in _fates(config, shift).items():
        for resolved, n in zip(("true", "false", "unknown"), counts, strict=True):
            labels = {series.POLICY: f"{config.name}-probe", series.COHORT: q.PROBE, series.AGENT: "a",
                      series.MAIN_THRESHOLD: row, series.THRESHOLD: "none", series.RESOLVED: resolved}
            out.append({"series": rules.RECORDED[series.TURNS] + _labels(**labels), "values": f"_ {n}"})
    return out


def _panel(config: GuardConfig) -> dict[str, queries.PanelQuery]:
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    return {pq.legend: pq for pq in queries.panel_queries(board) if pq.panel_id == 44 and pq.legend in COLUMNS}


def _calibrates_stop(config: GuardConfig, row: str) -> bool:
    """Whether calibrate's ``row_cap`` marks ``row`` as at the probe's own limit, reading the probe's
    limits as the recorder writes them (no probe: no limits recorded)."""
    recording = Recording()
    probe = config.probe_settings()
    if probe is not None:
        raw = turn_limits(probe.config)
        limits = Limits(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
        recording.seen[("probe", probe.config.name, limits)] = PolicySeen("probe", probe.config.name, limits, turns=1)
    e = ProbeEvidence(config.soft_cap, config.hard_multiplier, config.stuck_repeat_threshold, config.streak_stop_at)
    key = CALIBRATE_ROWS[row] or str(int(config.hard_multiplier))
    return row_cap(e, key, recording) is not None


def _expected(config: GuardConfig, stops: set[str], tolerance: float, shift: int = 0) -> dict[str, dict[str, float]]:
    """Per column, per row: calibrate's ``decide`` on the row's counts, at the probe's limit where
    ``stops`` says so."""
    out: dict[str, dict[str, float]] = {column: {} for column in COLUMNS}
    for row, (resolved, unresolved, unknown) in _fates(config, shift).items():
        passed = Passed(turns=resolved + unresolved + unknown, resolved=resolved, unresolved=unresolved)
        d = decide(passed, tolerance, None, (row, 1) if row in stops else None)
        more = 0.0 if d.verdict != "undecided" else float(d.more_turns or math.inf)
        out["decision"][row] = VERDICTS[d.verdict]
        out["more probe turns"][row] = more
        out["time at this rate"][row] = more * 300 / passed.known
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rows_at_the_probes_own_limit_are_calibrates(case):
    """The board's rows at the probe's own limit are the ones calibrate's ``row_cap`` marks, on the
    probe's limits as recorded, for every row calibrate has; the others as the cases say."""
    config, stops = CASES[case]
    cap = CapSettings.from_config(config)
    assert {t.value for t in cap.thresholds if cap.probe_stops_at(t)} == stops
    for row in CALIBRATE_ROWS.keys() & {t.value for t in cap.thresholds}:
        assert _calibrates_stop(config, row) == (row in stops), (case, row)


@pytest.mark.parametrize("main", [(6, 8, 10.0), (3, 3, 2.0), (10, 12, 5.0)], ids=str)
def test_every_probe_value_around_the_main_ones_stops_the_rows_calibrate_stops(main):
    """Each probe D, streak stop and backstop multiple from half to twice the main's: the board's
    rows at the probe's limit are calibrate's."""
    d, stop, m = main
    live = GuardConfig(stuck_repeat_threshold=d, streak_stop_at=stop, streak_warn_at=1, hard_multiplier=m)
    for own_d in range(max(1, d // 2), 2 * d + 1):
        for own_stop in range(max(1, stop // 2), 2 * stop + 1):
            for own_m in (m / 2, m, m + 1, 2 * m):
                config = live.replace(probe={**PROBE, "stuck_repeat_threshold": own_d, "streak_stop_at": own_stop,
                                             "hard_multiplier": own_m})
                cap = CapSettings.from_config(config)
                for t in (Threshold.HARD_BACKSTOP, Threshold.SOFT_STUCK, Threshold.STREAK):
                    assert cap.probe_stops_at(t) == _calibrates_stop(config, t.value), (main, own_d, own_stop,
                                                                                      own_m, t)


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("tolerance", TOLERANCES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_panel_44_decides_each_row_as_calibrate_does(promtool, tmp_path, case, tolerance, shift):
    """Never "within" at the probe's own limit (above, or undecided with no number of turns deciding
    it: "never"); elsewhere as before: calibrate's decision and turns still needed."""
    config, stops = CASES[case]
    panel, expected = _panel(config), _expected(config, stops, tolerance, shift)
    values = {**VALUES, q.TOLERANCE_VARIABLE: repr(tolerance)}
    tests = [{"expr": queries.resolve(panel[column].expr, values), "eval_time": "5m",
              "exp_samples": [{"labels": _labels(**{series.MAIN_THRESHOLD: row}), "value": value}
                              for row, value in expected[column].items()]}
             for column in COLUMNS]
    chain.promtool_expressions(promtool, tmp_path, _series(config, shift), tests)


def test_the_planted_fates_are_within_unless_at_the_probes_limit():
    """Calibrate on the first planted fate at 10%: within where the probe sees past the threshold,
    undecided with no number of turns deciding it at the probe's limit (the case the panel got
    wrong); the second is above either way."""
    within, above = Passed(turns=42, resolved=0, unresolved=40), Passed(turns=40, resolved=30, unresolved=10)
    assert decide(within, 0.1).verdict == "within"
    stopped = decide(within, 0.1, None, ("soft_stuck", 6))
    assert (stopped.verdict, stopped.more_turns) == ("undecided", None)
    assert decide(above, 0.1, None, ("soft_stuck", 6)).verdict == decide(above, 0.1).verdict == "above"
