"""The shipped Prometheus rules and config: promtool checks them and runs their unit tests, with
Debian's promtool (2.42) and Prometheus 3's, whose range selectors are left-open."""

from __future__ import annotations

import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard.boards import build  # noqa: E402

RULES_DIR = chain.RULES.parent
TESTS = RULES_DIR / "turnguard.rules.test.yaml"
PROMETHEUS_CONFIG = chain.ASSETS / "prometheus" / "prometheus.yml"
ALERTS = {"TurnguardHaltRateSpike", "TurnguardBackstopHalts", "TurnguardFalseHaltBudgetBurnFast",
          "TurnguardFalseHaltBudgetBurnSlow", "TurnguardCollectorExportFailing", "TurnguardProbeResolvedPastBackstop"}


@pytest.fixture(params=["promtool-2", "promtool-3"])
def promtool(request) -> str:
    if request.param == "promtool-2":
        return chain.promtool()
    return chain.require(str(Path(chain.prometheus3()).with_name("promtool")), "Prometheus 3's promtool")


def run(promtool: str, *args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def rules() -> dict:
    return yaml.safe_load(chain.RULES.read_text())


def test_promtool_accepts_the_rules(promtool):
    result = run(promtool, "check", "rules", str(chain.RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_prometheus_config_and_finds_the_rules(promtool):
    result = run(promtool, "check", "config", str(PROMETHEUS_CONFIG), cwd=PROMETHEUS_CONFIG.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout


def test_the_rules_unit_tests_pass(promtool):
    result = run(promtool, "test", "rules", TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails_the_unit_tests(promtool, tmp_path):
    """The unit tests can fail: the backstop alert expected for the wrong agent."""
    broken = TESTS.read_text().replace("gen_ai_agent_name: coder", "gen_ai_agent_name: reviewer")
    assert broken != TESTS.read_text()
    (tmp_path / TESTS.name).write_text(broken.replace("- turnguard.rules.yaml", f"- {chain.RULES}"))
    result = run(promtool, "test", "rules", TESTS.name, cwd=tmp_path)
    assert result.returncode != 0 and "TurnguardBackstopHalts" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not(rules):
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    defined = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert defined == ALERTS
    assert {c["alertname"] for c in cases if c.get("exp_alerts")} == ALERTS
    assert {c["alertname"] for c in cases if not c.get("exp_alerts")} == ALERTS


def test_every_alert_says_how_urgent_it_is_and_what_to_look_at(rules):
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


LAG, TILE = "1m", "6m"
"""The records' lag and the lagged tile's start (the rules file's header says why)."""


def tiling(metric: str, by: list[str]) -> str:
    """The one recording expression: ``metric``'s growth over the tile, a new series or a reset
    counted from zero, summed by ``by``."""
    return f"sum by ({', '.join(by)}) (({metric} offset {LAG} - {metric} offset {TILE}) >= 0 or {metric} offset {LAG})"


def _recording_rules(rules: dict) -> list[dict]:
    (group,) = [g for g in rules["groups"] if any("record" in r for r in g["rules"])]
    assert group["interval"] == build.RECORD_TILE
    return group["rules"]


def _by(expr: str) -> list[str]:
    match = re.match(r"\s*sum by \(([^)]*)\)", expr)
    assert match, expr
    return [name.strip() for name in match.group(1).split(",")]


def test_every_record_tiles_the_raw_series_the_board_maps_to_it(rules):
    """Each record is exactly the tiling of the raw series ``build.RECORDED`` names for it, every 5
    minutes: consecutive records cover consecutive 5-minute stretches, none twice, none skipped."""
    recorded = {r["record"]: r["expr"] for r in _recording_rules(rules)}
    assert set(recorded) == set(build.RECORDED.values())
    for metric, name in build.RECORDED.items():
        expr = re.sub(r"\s+\)", ")", re.sub(r"\(\s+", "(", " ".join(recorded[name].split())))
        assert expr == tiling(metric, _by(expr)), name


def test_records_keep_only_bounded_labels(rules):
    """No per-process, per-tool or per-conversation label reaches a record: they are summed away."""
    allowed = {"le", build.POLICY, build.AGENT, build.COHORT, build.RESOLVED, build.OUTCOME, build.THRESHOLD,
               build.CAP_MODE, build.STUCK, build.MAIN_THRESHOLD, build.PAST_SOFT_CAP, build.RESULT_STATUS,
               build.CALLS_BUCKET, build.LEVEL, build.ANSWER, build.SHADOW_POLICY, build.ACTION}
    for rule in _recording_rules(rules):
        assert set(_by(rule["expr"])) <= allowed, rule["record"]


def test_the_rules_query_the_names_the_boards_query(rules):
    text = chain.RULES.read_text()
    for metric in re.findall(r"\b(turnguard_[a-z_]+?(?:_total|_bucket|_count|_sum)|otelcol_[a-z_]+_total)\b", text):
        assert metric in {*build.RECORDED, *build.OTELCOL_SEND_FAILED.values()}, metric
    labels = set(re.findall(r"\b((?:turnguard|gen_ai)_[a-z_]+)=", text))
    known = {build.OUTCOME, build.THRESHOLD, build.AGENT, build.ANSWER, build.COHORT, build.RESOLVED}
    assert labels <= known, labels - known


# -- the records count exactly: random event streams, counted in Python, checked by promtool -----


@dataclass(frozen=True)
class Stream:
    """One raw series sampled every minute: ``events[i]`` happened in minute ``born + i`` (its
    sample holds the running total); a reset restarts the total from zero at minute ``reset``."""

    labels: dict[str, str]
    born: int
    events: list[int]
    reset: int | None = None

    def values(self, minutes: int) -> str:
        samples, value = ["_"] * self.born, 0
        for minute, events in enumerate(self.events, start=self.born):
            value = events if minute == self.reset else value + events
            samples.append(str(value))
        return " ".join(samples + ["_"] * (minutes + 1 - len(samples)))

    def counted(self, after: int, upto: int) -> int:
        """Events in the minutes ``(after, upto]``."""
        return sum(e for m, e in enumerate(self.events, start=self.born) if after < m <= upto)


MINUTES = 125
OUTCOME, THRESHOLD = build.OUTCOME, build.THRESHOLD


def _streams(seed: int) -> list[Stream]:
    """Two processes of one label set (one stops reporting), a series reset by a restart, and two
    label sets first seen mid-range (an agent's first backstop halt)."""
    rng = random.Random(seed)

    def events(n: int, most: int) -> list[int]:
        return [rng.randint(0, most) for _ in range(n)]

    completed = {OUTCOME: "completed", THRESHOLD: "none"}
    stuck = events(MINUTES + 1, 4)
    reset = rng.randrange(50, 60)
    tile = 5 * (reset // 5)  # the first minute of the tile holding the reset (the records' lag: a minute)
    stuck[tile:reset] = [0] * (reset - tile)  # what a reset's tile gains before it is lost: keep it none
    ends = rng.randrange(60, 80)
    first_backstop, first_streak = rng.randrange(20, 40), rng.randrange(80, 100)
    return [
        Stream({**completed, "instance": "a"}, 0, events(MINUTES + 1, 5)),
        Stream({**completed, "instance": "b"}, 0, events(ends + 1, 3)),
        Stream({OUTCOME: "halted", THRESHOLD: "soft_stuck", "instance": "a"}, 0, stuck, reset=reset),
        Stream({OUTCOME: "halted", THRESHOLD: "hard_backstop", "instance": "a"}, first_backstop,
               [1, *events(MINUTES - first_backstop, 1)]),
        Stream({OUTCOME: "halted", THRESHOLD: "soft_streak", "instance": "b"}, first_streak,
               [rng.randint(1, 3), *events(MINUTES - first_streak, 2)]),
    ]


def _exact_counts_test(streams: list[Stream], rules_path: Path) -> dict:
    """A promtool unit test: at each eval time T (a 5-minute evaluation) and for k tiles, the
    records' sum over ``[5k - 1 minutes]`` (k records, with left-closed or left-open ranges alike)
    must equal the events of the minutes ``(T - 5k - 1, T - 1]`` (the records' 1-minute lag)."""
    series = [{"series": build.TURNS + "{" + ", ".join(f'{k}="{v}"' for k, v in s.labels.items()) + "}",
               "values": s.values(MINUTES)} for s in streams]
    cases = []
    for at in (30, 60, 95, 125):
        for k in (1, 2, 6, 12, 25):
            groups: dict[tuple[str, str], int] = {}
            for s in streams:
                if s.born <= at - 1:  # its label set has a record by then
                    group = (s.labels[OUTCOME], s.labels[THRESHOLD])
                    groups[group] = groups.get(group, 0) + s.counted(at - 5 * k - 1, at - 1)
            cases.append({
                "expr": f"sum by ({OUTCOME}, {THRESHOLD}) "
                        f"(sum_over_time({build.RECORDED[build.TURNS]}[{5 * k - 1}m]))",
                "eval_time": f"{at}m",
                "exp_samples": [{"labels": f'{{{OUTCOME}="{o}", {THRESHOLD}="{t}"}}', "value": n}
                                for (o, t), n in sorted(groups.items())],
            })
    return {"rule_files": [str(rules_path)], "evaluation_interval": build.RECORD_TILE,
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}]}


SEEDS = (1, 2, 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_records_sum_to_the_exact_event_count(promtool, tmp_path, seed):
    """New series, a reset, a series that stops, several processes per label set: every range of
    whole tiles counts exactly the events in it."""
    test = tmp_path / "exact.test.yaml"
    test.write_text(yaml.safe_dump(_exact_counts_test(_streams(seed), chain.RULES), sort_keys=False))
    result = run(promtool, "test", "rules", test.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


OLD_FORM = ("(increase({m}[5m] offset 1m) and {m} offset 6m) "
            "or (last_over_time({m}[5m] offset 1m) unless {m} offset 6m)")
"""The tiling this file replaced (increase() per window, a new series from last_over_time), with the
same lag: increase() extrapolates inside each window and never sees the step between two windows."""


def test_the_exact_counts_test_fails_an_increase_based_record(promtool, tmp_path, rules):
    for rule in _recording_rules(rules):
        if rule["record"] == build.RECORDED[build.TURNS]:
            rule["expr"] = f"sum by ({', '.join(_by(rule['expr']))}) ({OLD_FORM.format(m=build.TURNS)})"
    old = tmp_path / "old.rules.yaml"
    old.write_text(yaml.safe_dump(rules, sort_keys=False))
    test = tmp_path / "exact.test.yaml"
    test.write_text(yaml.safe_dump(_exact_counts_test(_streams(SEEDS[0]), old), sort_keys=False))
    result = run(promtool, "test", "rules", test.name, cwd=tmp_path)
    assert result.returncode != 0 and build.RECORDED[build.TURNS] in result.stdout + result.stderr
