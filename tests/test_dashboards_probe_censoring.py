"""Which of the probe's own halts censor a turn, on every threshold-board panel that mirrors
calibrate's probe evidence (41: past k×S, 44: by live threshold, 49: the caps' frontier, 50: D's and
the streak stop's), against calibrate's own rule (``ProbeEvidence.fate_of``, fed as its engine feeds
it: ``stats.halt_ended`` decides which recorded ends are halts).

For every halt a probe turn can carry (each built-in threshold, ``plugin_error`` and a third-party
threshold's name, and none), ``promtool test rules`` evaluates each panel's fate columns over
planted records of probe turns that halt past every row: three with a false result, one resolved.
Each column must hold what calibrate's fate of those turns says, for a probe that runs its loop
detectors at twice the main's values (their halts are failures) and for one that keeps the main's
(they are ``cut``)."""

from __future__ import annotations

import json
import math
import re

import pytest

import chain
from conftest import optional_dependency

optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard._boards import build, queries, rules, series  # noqa: E402
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._boards.thresholds import _edges  # noqa: E402
from turnguard._calibrate.evidence import ProbeEvidence  # noqa: E402
from turnguard._calibrate.records import Limits  # noqa: E402
from turnguard._calibrate.stats import halt_ended  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._model import PLUGIN_ERROR_THRESHOLD, Threshold  # noqa: E402
from turnguard.telemetry import _buckets as buckets  # noqa: E402
from turnguard.telemetry import _names as names  # noqa: E402

THIRD_PARTY = "budget"
"""A threshold a third-party policy halts on."""
HALTS = (*(t.value for t in Threshold), PLUGIN_ERROR_THRESHOLD, THIRD_PARTY, names.NO_THRESHOLD)
FAILED, RESOLVED = 3, 1
"""Planted probe turns per halt: with a false result, and resolved in the turn."""
CALLS, CYCLES, COUNT = 10_000, 1_000, 100
"""Past every row's value: calls, model requests, repeats of one call and failing streak."""

TWICE = GuardConfig(max_cycles_per_turn=20, probe={
    "rate": 0.1, "hard_multiplier": 20, "max_cycles_per_turn": 100, "stuck_repeat_threshold": 12,
    "streak_stop_at": 16})
"""Panels 41, 44, 49 (cycle caps) and 50, the probe's D and streak stop twice the main's."""
KEPT = GuardConfig(max_cycles_per_turn=20, probe={
    "rate": 0.1, "soft_cap": 300, "hard_multiplier": 20, "max_cycles_per_turn": 100})
"""Panels 41, 44, 49 (soft and cycle caps) and 50 (streak stop), the probe keeping the main's D and stop."""
EXPLICIT = GuardConfig(max_tool_calls_per_turn=200, probe={"rate": 0.1, "max_tool_calls_per_turn": 5000})
"""Panels 44 and 49 (explicit caps) for an explicit cap."""
CONFIGS = {"twice": TWICE, "kept": KEPT, "explicit": EXPLICIT}
PANELS = {41: "multiple", 44: series.MAIN_THRESHOLD, 49: "value", 50: "value"}
"""The panels that mirror calibrate's probe rows, and the label their rows are keyed by."""
FATE_COLUMNS = ("resolved", "unresolved", "censored", "cut", "unknown")
VALUES = {"__range": "5m", "__range_s": "300", q.POLICY_VARIABLE: ".*", q.AGENT_VARIABLE: ".*",
          q.COHORT_VARIABLE: q.LIVE, q.TOLERANCE_VARIABLE: "0.1"}


def _limits(config: GuardConfig) -> Limits:
    """The probe's limits as the recorder writes them on its turns (``turn_limits``)."""
    p = config.probe_settings()
    assert p is not None
    probe = p.config
    return Limits(probe.cap_mode, probe.soft_cap if probe.cap_mode == "adaptive" else None, probe.hard_cap,
                  probe.stuck_repeat_threshold, probe.streak_warn_at, probe.streak_stop_at,
                  probe.max_cycles_per_turn)


def calibrates(config: GuardConfig, halt: str) -> str:
    """The fate calibrate gives a probe turn with a false result that ``halt`` ended (its engine: a
    recorded end that is no halt leaves the turn to its result)."""
    main = ProbeEvidence(config.soft_cap if config.cap_mode == "adaptive" else None, config.hard_multiplier,
                         config.stuck_repeat_threshold, config.streak_stop_at or None)
    return main.fate_of(False, halt if halt_ended(halt) else None, _limits(config))


def _expected(config: GuardConfig, halt: str, panel: int) -> dict[str, float]:
    """A row's fate columns: panel 44's ``censored`` holds the ``cut`` turns too (calibrate's
    ``Passed`` rows), the frontier panels show them apart."""
    fate = calibrates(config, halt)
    counts = dict.fromkeys(FATE_COLUMNS, 0)
    counts["resolved"] = RESOLVED
    counts[fate] += FAILED
    if panel == 44:
        counts["censored"] += counts.pop("cut")
    return counts


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _buckets(name: str, edges: tuple[float, ...], value: int, labels: dict[str, str], n: int) -> dict[str, int]:
    return {rules.RECORDED[f"{name}_bucket"] + _labels(**labels, le="+Inf" if e == math.inf else f"{e:g}"):
            n * int(value <= e) for e in (*edges, math.inf)}


def _records(config: GuardConfig, halt: str) -> list[dict[str, str]]:
    """The records one evaluation leaves for the planted turns, under each live threshold that would
    have halted them (panel 44's rows; the other panels count them once per row here)."""
    cap = CapSettings.from_config(config)
    counts: dict[str, int] = {}
    for main in cap.thresholds:
        for resolved, n in (("false", FAILED), ("true", RESOLVED)):
            labels = {series.POLICY: "default-probe", series.COHORT: "probe", series.AGENT: "a",
                      series.CAP_MODE: config.cap_mode, series.MAIN_THRESHOLD: main.value,
                      series.THRESHOLD: halt, series.RESOLVED: resolved}
            counts[rules.RECORDED[series.TURNS] + _labels(**labels, **{series.STUCK: "true"})] = n
            counts |= _buckets(series.TOOL_CALLS, _edges(cap), CALLS, {**labels, series.STUCK: "true"}, n)
            counts |= _buckets(series.CYCLES, buckets.cycle_edges(config), CYCLES, labels, n)
            counts |= _buckets(series.MAX_REPEAT, buckets.repeat_edges(config), COUNT,
                               {**labels, series.PAST_SOFT_CAP: "true"}, n)
            counts |= _buckets(series.MAX_FAILING, buckets.failing_streak_edges(config), COUNT, labels, n)
    return [{"series": s, "values": f"_ {n}"} for s, n in counts.items()]


def _rows(config: GuardConfig) -> dict[int, dict[str, queries.PanelQuery]]:
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    out: dict[int, dict[str, queries.PanelQuery]] = {}
    for pq in queries.panel_queries(board):
        if pq.panel_id in PANELS and pq.legend in FATE_COLUMNS:
            out.setdefault(pq.panel_id, {})[pq.legend] = pq
    return out


def _cases(config: GuardConfig, halt: str) -> list[dict[str, object]]:
    cases = []
    multiplicity = len(CapSettings.from_config(config).thresholds)
    for panel, columns in _rows(config).items():
        keys = _keys(config, panel)
        expected = _expected(config, halt, panel)
        for legend, pq in columns.items():
            per_row = expected[legend] * (1 if panel == 44 else multiplicity)
            cases.append({"expr": queries.resolve(pq.expr, VALUES), "eval_time": "1m", "exp_samples": [
                {"labels": _labels(**{PANELS[panel]: k}), "value": per_row} for k in keys]})
    return cases


def _keys(config: GuardConfig, panel: int) -> list[str]:
    """The panel's row keys as built for ``config`` (from its ``turns`` column: ``label_replace``s)."""
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    (turns,) = [pq for pq in queries.panel_queries(board) if pq.panel_id == panel and pq.legend == "turns"]
    return sorted(set(re.findall(rf'"{PANELS[panel]}", "([^"]+)"', turns.expr)))


def test_every_mirroring_panel_has_rows_for_the_configurations_here():
    """Each panel has rows under some configuration here, and its fate columns (44: no ``cut``)."""
    seen: dict[int, int] = {}
    for config in CONFIGS.values():
        for panel, columns in _rows(config).items():
            assert set(columns) == set(FATE_COLUMNS) - ({"cut"} if panel == 44 else set()), panel
            seen[panel] = seen.get(panel, 0) + len(_keys(config, panel))
    assert set(seen) == set(PANELS) and all(seen.values()), seen
    kinds = {k.split(":")[0] for config in CONFIGS.values() for k in _keys(config, 49)}
    assert kinds == {"soft", "explicit", "cycles"}
    assert {k.split(":")[0] for k in _keys(TWICE, 50)} == {"stuck", "streak"}


def test_calibrate_censors_the_probes_non_loop_halts_and_cuts_or_fails_its_loop_halts():
    """The rule the board must follow, as calibrate states it: a probe turn halted by its own
    backstop, explicit or cycle cap, ``cycle_repeat`` stop or a failing plugin is censored; by its
    D or streak stop, failed at twice the main's values, else ``cut``; any other end (no halt, or a
    name calibrate cannot tell from a host's own end reason) leaves it to its result."""
    loops = {Threshold.SOFT_STUCK.value, Threshold.STREAK.value}
    for halt in HALTS:
        built_in = halt in {t.value for t in Threshold} | {PLUGIN_ERROR_THRESHOLD}
        for config, loop_fate in ((TWICE, "unresolved"), (KEPT, "cut")):
            want = loop_fate if halt in loops else "censored" if built_in else "unresolved"
            assert calibrates(config, halt) == want, (halt, config)


@pytest.mark.parametrize("probe", sorted(CONFIGS))
@pytest.mark.parametrize("halt", HALTS)
def test_the_board_counts_a_probe_halt_as_calibrate_does(promtool, tmp_path, probe, halt):
    config = CONFIGS[probe]
    chain.promtool_expressions(promtool, tmp_path, _records(config, halt), _cases(config, halt))
