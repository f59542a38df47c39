"""The shipped Prometheus rules and config: promtool checks them and runs their unit tests, with
Debian's promtool (2.42) and Prometheus 3's, whose range selectors are left-open."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import chain
from conftest import optional_dependency

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from dashboards import build  # noqa: E402

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


def test_recording_windows_tile_time(rules):
    """Each recorded 5-minute count is taken every 5 minutes: sum_over_time counts an event once."""
    (group,) = [g for g in rules["groups"] if any("record" in r for r in g["rules"])]
    assert group["interval"] == "5m"
    for rule in group["rules"]:
        assert set(re.findall(r"\[(\w+)\]", rule["expr"])) == {"5m"}, rule["record"]
        assert "offset 5m" in rule["expr"] and "last_over_time(" in rule["expr"], rule["record"]


def test_the_rules_query_the_names_the_boards_query(rules):
    text = chain.RULES.read_text()
    for metric in re.findall(r"\b(turnguard_[a-z_]+?(?:_total|_bucket|_count)|otelcol_[a-z_]+_total)\b", text):
        assert metric in {build.TURNS, f"{build.TOOL_CALLS}_bucket", build.DETECTIONS, build.ANSWERS,
                          *build.OTELCOL_SEND_FAILED.values()}, metric
    labels = set(re.findall(r"\b((?:turnguard|gen_ai)_[a-z_]+)=", text))
    known = {build.OUTCOME, build.THRESHOLD, build.AGENT, build.ANSWER, build.label("turnguard.turn.cohort"),
             build.label("turnguard.turn.resolved")}
    assert labels <= known, labels - known
