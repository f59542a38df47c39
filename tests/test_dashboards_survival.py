"""Panel 47 (of the turns that reach the backstop, the share that would finish by k×S) on a real
Prometheus's PromQL: ``promtool test rules`` (Debian's 2.42 and Prometheus 3's) evaluates the
panel's own queries on planted ``fates`` records whose estimate is 0 or 1, where Greenwood's
variance is 0 and only the exact binomial bound says how sure the share is. Every row shows the
share with that bound and the turns it rests on, never a bare 0% or 100%, and the figures are
calibrate's (``survival.estimate``) on the same turns.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

import pytest

from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

import turnguard as tg  # noqa: E402
from turnguard._boards import (  # noqa: E402
    build,
    evidence,
    queries,
    series,
)
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._calibrate.survival import Survival, estimate  # noqa: E402

CONFIG = tg.GuardConfig(soft_cap=100, load_entrypoints=False)
"""The backstop at 1,000 calls; rows at 15x, 20x and 30x S (no probe cap: every row estimable)."""
CAP = CapSettings.from_config(CONFIG)
SURVIVAL = 47
CLOSE = 1e-9


@dataclass(frozen=True)
class Fleet:
    """Turns as ``(calls, finished)``, each fleet under an agent of its own."""

    agent: str
    turns: tuple[tuple[int, bool], ...]

    def buckets(self) -> dict[tuple[str, str], int]:
        """Cumulative turns per ``(fate, le)``, as the ``fates`` record holds them."""
        edges = [*(str(int(e)) for e in evidence._edges(CAP)), "+Inf"]
        out = {}
        for fate, finished in (("finished", True), ("censored", False)):
            for le in edges:
                top = float("inf") if le == "+Inf" else int(le)
                out[fate, le] = sum(1 for calls, done in self.turns if done is finished and calls <= top)
        return out

    def calibrate(self) -> dict[int, dict]:
        """Calibrate's rows on the same turns, by multiple."""
        survival = Survival()
        for calls, finished in self.turns:
            survival.add(calls, "completed" if finished else "hard_backstop")
        est = estimate(survival, CAP.hard_cap, CAP.hard_multiplier, 10_000, "limits")
        return {round(row["multiple"] * 1.0): row for row in est["finish_by"]}


ALL_FINISH = Fleet("all-finish", ((400, True),) * 50 + ((1050, True),) * 4)
"""The 4 turns past the backstop all finish by 1,100 calls; no turn is seen past that: every row
is 100%, at least 0.05^(1/4) (47%) over the 4 that finished."""
NONE_FINISH = Fleet("none-finish", ((400, True),) * 50 + ((6000, False),) * 10)
"""The 10 turns past the backstop run on to 6,000 calls and are halted there: every row is 0%, at
most 1 - 0.05^(1/10) (26%, which a planted truth of 19% lies within) over the 10 seen past k×S."""
FLEETS = (ALL_FINISH, NONE_FINISH)
EXPECTED = {
    ALL_FINISH: {"finish by k×S": 1.0, "95% low": 0.05 ** (1 / 4), "95% high": 1.0,
                 "at risk past the backstop": 4, "seen past k×S": 0},
    NONE_FINISH: {"finish by k×S": 0.0, "95% low": 0.0, "95% high": 1 - 0.05 ** (1 / 10),
                  "at risk past the backstop": 10, "seen past k×S": 10},
}


def _panel_queries() -> list[queries.PanelQuery]:
    board = json.loads(build.for_config(CONFIG)[build.FILES[build.THRESHOLDS_UID]])
    return [pq for pq in queries.panel_queries(board) if pq.panel_id == SURVIVAL]


def _series(fleet: Fleet) -> list[dict[str, str]]:
    labels = {series.COHORT: "live", series.POLICY: "default", series.CAP_MODE: "adaptive", series.AGENT: fleet.agent}
    out = []
    for (fate, le), count in fleet.buckets().items():
        matchers = ",".join(f'{k}="{v}"' for k, v in {**labels, "fate": fate, "le": le}.items())
        out.append({"series": f"{q.FATES}{{{matchers}}}", "values": f"_ {count}"})
    return out


def _close_to(expr: str, fleet: Fleet, value: float) -> str:
    """1 per row where the panel's ``expr`` (for ``fleet``'s agent) is within ``CLOSE`` of ``value``."""
    values = {"__range": "10m", q.AGENT_VARIABLE: fleet.agent, q.POLICY_VARIABLE: ".*", q.COHORT_VARIABLE: "live",
              q.TOLERANCE_VARIABLE: "0.10"}
    return f"abs(({queries.resolve(expr, values)}) - {value!r}) < bool {CLOSE!r}"


def test_the_planted_fleets_are_0_and_1_in_calibrate_with_its_exact_bounds():
    """The oracle the panel is held to: calibrate's rows on the same turns."""
    for fleet in FLEETS:
        expected = EXPECTED[fleet]
        for k, row in fleet.calibrate().items():
            assert row["share"] == expected["finish by k×S"] and row["interval_from"] == "exact", (fleet.agent, k)
            assert row["interval"] == pytest.approx([expected["95% low"], expected["95% high"]], abs=1e-6)
    assert NONE_FINISH.calibrate()[15]["interval"][1] > 0.19


def test_panel_47_shows_each_0_or_1_with_its_exact_bound_and_the_turns_it_rests_on(promtool, tmp_path):
    rows = [str(k) for k in evidence.km_multiples(CAP)]
    assert rows == ["15", "20", "30"]
    panel = _panel_queries()
    assert {pq.legend for pq in panel} == set(evidence.KM_COLUMN_UNITS)
    tests = [{"expr": _close_to(pq.expr, fleet, EXPECTED[fleet][pq.legend]), "eval_time": "2m",
              "exp_samples": [{"labels": f'{{multiple="{row}"}}', "value": 1} for row in rows]}
             for fleet in FLEETS for pq in panel]
    test_file = {"rule_files": [], "evaluation_interval": "1m",
                 "tests": [{"interval": "1m", "input_series": [s for f in FLEETS for s in _series(f)],
                            "promql_expr_test": tests}]}
    path = tmp_path / "survival.test.yaml"
    path.write_text(yaml.safe_dump(test_file, width=10**6, allow_unicode=True))
    result = subprocess.run([promtool, "test", "rules", path.name], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
