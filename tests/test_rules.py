"""The shipped Prometheus rules and configs: generated from ``turnguard._boards.rules``, checked and
unit-tested by Debian's promtool (2.42) and Prometheus 3's, whose ranges are left-open.

The counting records are held to a store model that knows the truth (``rule_cases``): on random
streams with gaps of every length, series that come and go, new series at any time and, on the
start-times route, each run's start as a 0, every record equals the events that became visible in
it; with counter resets too, no record ever exceeds them (history is never counted twice) and the
total loses at most what the series held before each reset.
"""

from __future__ import annotations

import itertools
import random
import re
import subprocess
from pathlib import Path

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")

from turnguard._boards import build, rule_cases, rules, series  # noqa: E402
from turnguard._calibrate.survival import CENSORING_ENDS  # noqa: E402

VARIANTS = {"portable": rules.PORTABLE, "start-times": rules.START_TIMES}
RULES_DIR = chain.RULES.parent
PROMETHEUS_DIR = chain.ASSETS / "prometheus"
ALERTS = {"TurnguardHaltRateSpike", "TurnguardBackstopHalts", "TurnguardFalseHaltBudgetBurnFast",
          "TurnguardFalseHaltBudgetBurnSlow", "TurnguardCollectorExportFailing", "TurnguardProbeResolvedPastBackstop",
          "TurnguardResultsStopped", "TurnguardInvalidResultTokens"}
GROUP = "turnguard_loop_threshold"
RECORD = rules.RECORDED[series.TURNS]


@pytest.fixture(params=sorted(VARIANTS))
def variant(request) -> rules.Tiling:
    return VARIANTS[request.param]


def run(promtool: str, *args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def loaded(t: rules.Tiling) -> dict:
    return yaml.safe_load((RULES_DIR / rules.FILES[t]).read_text())


def test_the_committed_rules_tests_and_configs_are_the_generators():
    """One source: rules/, their unit tests and prometheus/*.yml are what turnguard._boards.rules writes."""
    assert rules.main(["--check"]) == 0
    for path, text in rules.written(chain.ASSETS).items():
        assert path.read_text() == text, path


def test_promtool_accepts_the_rules(promtool, variant):
    result = run(promtool, "check", "rules", rules.FILES[variant])
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_prometheus_config_loads_its_rules_file(promtool):
    configs = [rules.PORTABLE] if promtool == chain.promtool() else [rules.PORTABLE, rules.START_TIMES]
    for t in configs:
        result = run(promtool, "check", "config", rules.CONFIGS[t], cwd=PROMETHEUS_DIR)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 rule files found" in result.stdout and rules.FILES[t] in result.stdout


def test_the_rules_unit_tests_pass(promtool, variant):
    result = run(promtool, "test", "rules", rules.TEST_FILES[variant])
    assert result.returncode == 0, result.stdout + result.stderr


def _alert_cases(t: rules.Tiling, tmp_path: Path) -> str:
    """The unit tests' alert cases alone (cheap to run again and again)."""
    doc = yaml.safe_load((RULES_DIR / rules.TEST_FILES[t]).read_text())
    doc["rule_files"] = [str(RULES_DIR / rules.FILES[t])]
    doc["tests"] = [c for c in doc["tests"] if "alert_rule_test" in c]
    path = tmp_path / "alerts.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path.name


def test_every_alert_gives_the_same_answer_run_after_run(promtool, variant, tmp_path):
    """promtool evaluates groups in a random order: alerts that read another group's records
    flipped between runs. Each alert case, run five times, passes every time."""
    name = _alert_cases(variant, tmp_path)
    for _ in range(5):
        result = run(promtool, "test", "rules", name, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_reads_records_only_in_its_own_group_after_them(variant):
    """So an alert sees this evaluation's records whatever the order of groups: each record an alert
    reads is defined earlier in the alert's group; an alert in another group reads no record."""
    recorded = {r["record"] for g in loaded(variant)["groups"] for r in g["rules"] if "record" in r}
    assert set(rules.RECORDED.values()) <= recorded
    for group in loaded(variant)["groups"]:
        before: set[str] = set()
        for rule in group["rules"]:
            if "record" in rule:
                before.add(rule["record"])
                continue
            reads = set(re.findall(r"\bturnguard:[\w:]+", rule["expr"] + str(rule.get("annotations"))))
            assert reads <= before, (rule["alert"], reads - before)
            assert bool(reads) == (group["name"] == "turnguard"), rule["alert"]  # the Collector's: raw series only


def test_a_wrong_expectation_fails_the_unit_tests(promtool, tmp_path):
    """The unit tests can fail: the backstop alert expected for the wrong agent."""
    tests = RULES_DIR / rules.TEST_FILES[rules.PORTABLE]
    broken = tests.read_text().replace('gen_ai_agent_name: "coder"', 'gen_ai_agent_name: "reviewer"')
    assert broken != tests.read_text()
    (tmp_path / tests.name).write_text(broken.replace(f"- {chain.RULES.name}", f"- {chain.RULES}"))
    result = run(promtool, "test", "rules", tests.name, cwd=tmp_path)
    assert result.returncode != 0 and "TurnguardBackstopHalts" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not(variant):
    tests = yaml.safe_load((RULES_DIR / rules.TEST_FILES[variant]).read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    defined = {r["alert"] for g in loaded(variant)["groups"] for r in g["rules"] if "alert" in r}
    assert defined == ALERTS
    assert {c["alertname"] for c in cases if c.get("exp_alerts")} == ALERTS
    assert {c["alertname"] for c in cases if not c.get("exp_alerts")} == ALERTS


def test_every_alert_says_how_urgent_it_is_and_what_to_look_at():
    for rule in (r for g in loaded(rules.PORTABLE)["groups"] for r in g["rules"] if "alert" in r):
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_backstop_wording_says_halted_at_the_backstop_not_runaways():
    text = chain.RULES.read_text()
    backstop = next(r for g in loaded(rules.PORTABLE)["groups"] for r in g["rules"]
                    if r.get("alert") == "TurnguardBackstopHalts")
    assert "halted at the backstop" in backstop["annotations"]["summary"]
    assert "runaway" not in backstop["annotations"]["summary"].lower()
    assert "runaways the backstop" not in text


def test_no_rule_hard_codes_a_threshold_or_a_bucket_edge():
    """The rules are config-free (an operator's S and m change no rule): no ``le`` matcher, no call count."""
    for t in VARIANTS.values():
        for rule in (r for g in loaded(t)["groups"] for r in g["rules"]):
            assert not re.search(r"\ble\s*=", rule["expr"]), rule.get("alert", rule.get("record"))
            assert not re.search(r"\b1000\b", rule["expr"] + str(rule.get("annotations"))), rule


# -- the records' form ----------------------------------------------------------------------------------


def _by(expr: str) -> list[str]:
    match = re.match(r"\s*sum by \(([^)]*)\)", expr)
    assert match, expr
    return [name.strip() for name in match.group(1).split(",")]


def test_every_record_is_the_one_counting_form_of_its_raw_series(variant):
    """The group: each raw series' state, then every counting record (exactly ``counted`` of the raw
    series the board maps to it), the derived records (``rules.DERIVED``, read by the boards), the
    alerts, and the count of states; every 5 minutes."""
    (group, collector) = loaded(variant)["groups"]
    assert group["interval"] == build.RECORD_TILE == rules.duration(variant.tile)
    derived = {r["record"]: r["expr"] for r in rules.DERIVED}
    kinds = [("count" if r.get("record") in rules.RECORDED.values() else "alert" if "alert" in r
              else "derived" if r["record"] in derived
              else "state" if r["record"].endswith(":tile_end") else "heartbeat") for r in group["rules"]]
    assert kinds == sorted(kinds, key=["state", "count", "derived", "alert", "heartbeat"].index)
    exprs = {r["record"]: r["expr"] for r in group["rules"] if "record" in r}
    assert {record: exprs[record] for record in derived} == derived
    assert build.RECORDED == rules.RECORDED
    for c in rules.COUNTS:
        assert exprs[c.record] == rules.counted(c.metric, c.by, variant), c.record
        late = f"last_over_time({c.metric}[1h] offset 1m)"
        young = f"last_over_time({c.metric}[15m] offset 1m) unless on() {rules.settled(variant)}"
        assert exprs[rules.state(c.metric)] == (
            f"{late} and on() {rules.settled(variant)}\nor {young}" if variant.start_times else late)
    assert "interval" not in collector and [r["alert"] for r in collector["rules"]] == \
        ["TurnguardCollectorExportFailing"]


def test_records_keep_only_bounded_labels(variant):
    """No per-process, per-tool or per-conversation label reaches a record: they are summed away."""
    allowed = {"le", series.POLICY, series.AGENT, series.COHORT, series.RESOLVED, series.OUTCOME, series.THRESHOLD,
               series.CAP_MODE, series.STUCK, series.MAIN_THRESHOLD, series.PAST_SOFT_CAP, series.RESULT_STATUS,
               series.CALLS_BUCKET, series.LEVEL, series.ANSWER, series.SHADOW_POLICY, series.ACTION,
               series.REPEAT_BUCKET, series.FAILING_BUCKET}  # (a probe turn's count buckets: a closed set)
    for rule in loaded(variant)["groups"][0]["rules"]:
        if rule.get("record") in rules.RECORDED.values():
            assert set(_by(rule["expr"])) <= allowed, rule["record"]


def test_the_rules_query_the_names_the_boards_query():
    text = chain.RULES.read_text()
    for metric in re.findall(r"\b(turnguard_[a-z_]+?(?:_total|_bucket|_count|_sum)|otelcol_[a-z_]+_total)\b", text):
        assert metric in {*build.RECORDED, *series.OTELCOL_SEND_FAILED.values(), rules.UPTIME}, metric
    labels = set(re.findall(r"\b((?:turnguard|gen_ai)_[a-z_]+)=", text))
    known = {series.OUTCOME, series.THRESHOLD, series.AGENT, series.ANSWER, series.COHORT, series.RESOLVED,
             series.MAIN_THRESHOLD, series.RESULT_STATUS}
    assert labels <= known, labels - known


def test_a_shortened_tiling_changes_only_the_durations():
    """The boards' fleet tests run the rules with a 1-second tile: the same rules, other durations."""
    short = rules.render(rules.Tiling(tile=1, lag=10), commented=False)
    assert re.sub(r"\[[^\]]*\]|offset \w+|interval: \w+", "", short) == \
        re.sub(r"\[[^\]]*\]|offset \w+|interval: \w+", "", rules.render(commented=False))
    assert "interval: 1s" in short and "offset 10s" in short and "[1s]" in short


@pytest.mark.parametrize(("seconds", "text"), [(300, "5m"), (899, "14m59s"), (86_400, "1d"), (0.5, "500ms"),
                                                (93_784, "1d2h3m4s")])
def test_durations_are_written_as_prometheus_reads_them(seconds, text):
    assert rules.duration(seconds) == text


# -- the store model that knows the truth -------------------------------------------------------------


def test_the_model_attributes_each_event_to_the_first_record_that_can_see_it():
    """A run born at 1 minute with 3 events, sampled at 1.5 and 2.5 minutes; a store down from 2 to 10
    minutes: the first sample (1.5 min, in the record of 5 min) holds the 3, the event at 2 minutes
    waits for the sample after the gap (10.5 min, in the record of 15 min)."""
    stream = rule_cases.Series({GROUP: "a"}, (rule_cases.Run(2, (3, 0, 1, *[0] * 20)),))
    store = rule_cases.Store(((0, 4), (20, 40)))
    assert rule_cases.truth([stream], store, GROUP) == {10: {"a": 3}, 30: {"a": 1}}
    assert rule_cases.values(stream, store, 24).split()[:4] == ["_", "_", "_", "3"]
    with_starts = rule_cases.held(stream, rule_cases.Store(((0, 4), (20, 40)), start_times=True))
    assert with_starts.values[2] == 0 and with_starts.values[3] == 3


def test_the_model_keeps_a_start_only_after_the_series_last_sample_and_within_the_hour():
    late = rule_cases.Series({GROUP: "a"}, (rule_cases.Run(0, (1,) * 400),))
    store = rule_cases.Store(((300, 500),), start_times=True)
    assert 0 not in rule_cases.held(late, store).values  # born 2.5 hours before its first sample
    restart = rule_cases.Series({GROUP: "a"}, (rule_cases.Run(0, (1,) * 10), rule_cases.Run(10, (1,) * 10)))
    kept = rule_cases.held(restart, rule_cases.Store(((0, 30),), start_times=True)).values
    assert kept[10] == 10  # the first run's last sample, at the second's start: no 0 at the same time


def test_every_named_case_expects_the_truth_or_errs_as_the_header_says():
    """A case's expectation differs from the model's truth only where it says why, and only low,
    except the two highs the headers name: the portable route's series back after more than a day,
    the start-times route's series started just before a new store."""
    highs = set()
    for case in rule_cases.COUNTING:
        for _, _, deltas in case.checks:
            for start_times, by_group in (deltas or {}).items():
                assert case.why, case.name
                highs |= {(start_times, case.name[:20], g) for g, d in by_group.items() if d > 0}
    assert highs == {(False, "a series silent for ", "hard_backstop"), (True, "a store that starts ", "young")}
    header = {t.start_times: rules.header(t) for t in VARIANTS.values()}
    assert "counts its whole value again: high" in header[False]
    assert "also counts what it did before (high, once)" in header[True]


# -- random streams against the truth -------------------------------------------------------------------


SLOTS = 720
"""Six hours of 30-second slots."""


def _stream(seed: int, *, resets: bool) -> tuple[list[rule_cases.Series], tuple[tuple[int, int], ...]]:
    """A warm-up series from the start (so the store's first record is behind), six series born at
    random times, some ending, some silent for a while, some restarted (``resets``); a store with up
    to two gaps of 1.5 minutes to 2 hours, anywhere (across tile edges too)."""
    rng = random.Random(seed)
    streams = [rule_cases.Series({GROUP: "w", "instance": "warm"}, (rule_cases.Run(0, (0,) * SLOTS),), phase=0)]
    for i in range(6):
        start = rng.choice([12, 12, rng.randrange(12, SLOTS - 20)])
        end = rng.choice([SLOTS, SLOTS, rng.randrange(start + 5, SLOTS + 1)])
        runs, at = [], start
        while at < end:
            length = min(end - at, rng.randrange(3, 200)) if resets else end - at
            runs.append(rule_cases.Run(at, tuple(rng.choice((0, 0, 0, 1, 2, 3)) for _ in range(length))))
            at += length + (rng.choice((0, 1, 2, 5)) if resets else 0)
        silent = ()
        if rng.random() < 0.4:
            a = rng.randrange(0, SLOTS)
            silent = ((a, a + rng.randrange(3, 300)),)
        streams.append(rule_cases.Series({GROUP: "abc"[i % 3], "instance": f"i{i}"}, tuple(runs),
                                        phase=rng.randrange(2), silent=silent))
    up, at = [], 0
    for _ in range(rng.randrange(0, 3)):
        a = rng.randrange(at, SLOTS)
        up.append((at, a))
        at = a + rng.randrange(3, 240)
    up.append((at, SLOTS + 1))
    return streams, tuple(up)


def _test_file(tmp_path: Path, streams, store: rule_cases.Store, t: rules.Tiling, cases: list[dict]) -> str:
    inputs = [{"series": series.TURNS + rule_cases.selector(s.labels), "values": rule_cases.values(s, store, SLOTS)}
              for s in streams]
    doc = {"rule_files": [str(RULES_DIR / rules.FILES[t])], "evaluation_interval": "5m",
           "tests": [{"interval": "30s", "input_series": inputs, "promql_expr_test": cases}]}
    (tmp_path / "stream.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return "stream.test.yaml"


def _each_record_is_the_truth(truth: dict[int, dict[str, int]]) -> list[dict]:
    return [{"expr": f"sum by ({GROUP}) ({RECORD}) != 0", "eval_time": f"{at * rule_cases.SLOT_S}s",
             "exp_samples": [{"labels": f'{{{GROUP}="{g}"}}', "value": v}
                             for g, v in sorted(truth.get(at, {}).items()) if v]}
            for at in range(0, SLOTS + 1, rule_cases.TILE)]


SEEDS = (1, 2, 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_record_counts_exactly_what_became_visible_in_it(promtool, variant, tmp_path, seed):
    """Gaps up to 2 hours, silences up to 2.5, new series at any time: each record (not only their
    sum) equals the events first visible in its tile, so none is counted twice, none lost."""
    streams, up = _stream(seed, resets=False)
    store = rule_cases.Store(up, variant.start_times)
    name = _test_file(tmp_path, streams, store, variant, _each_record_is_the_truth(rule_cases.truth(streams, store,
                                                                                                     GROUP)))
    result = run(promtool, "test", "rules", name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _never_above(truth: dict[int, dict[str, int]], groups: list[str]) -> list[dict]:
    def vector(at: int) -> str:
        return " or ".join(f'label_replace(vector({truth.get(at, {}).get(g, 0)}), "{GROUP}", "{g}", "", "")'
                           for g in groups)

    return [{"expr": f"(sum by ({GROUP}) ({RECORD}) - on({GROUP}) ({vector(at)})) > 0",
             "eval_time": f"{at * rule_cases.SLOT_S}s", "exp_samples": []}
            for at in range(0, SLOTS + 1, rule_cases.TILE)]


def _lost_at_most(streams, store: rule_cases.Store, truth: dict[int, dict[str, int]]) -> list[dict]:
    """The whole stream's records fall short of the truth by at most each reset's value before it."""
    held = {s.labels["instance"]: rule_cases.held(s, store) for s in streams}
    allowance: dict[str, int] = {}
    for s in streams:
        runs = held[s.labels["instance"]].run_of
        before = [max((v for slot, v in held[s.labels["instance"]].values.items() if runs[slot] == i), default=0)
                  for i in range(len(s.runs) - 1)]
        allowance[s.labels[GROUP]] = allowance.get(s.labels[GROUP], 0) + sum(before)
    totals: dict[str, int] = {}
    for groups in truth.values():
        for g, v in groups.items():
            totals[g] = totals.get(g, 0) + v
    bound = " or ".join(f'label_replace(vector({totals.get(g, 0) - allowance[g]}), "{GROUP}", "{g}", "", "")'
                        for g in sorted(allowance))
    return [{"expr": f"(sum by ({GROUP}) (sum_over_time({RECORD}[{SLOTS * rule_cases.SLOT_S}s])) - on({GROUP}) "
                     f"({bound})) < 0", "eval_time": f"{SLOTS * rule_cases.SLOT_S}s", "exp_samples": []}]


@pytest.mark.parametrize("seed", SEEDS)
def test_resets_never_count_history_twice_and_lose_at_most_the_value_before(promtool, variant, tmp_path, seed):
    """Restarts with a stable instance id at random, several in a tile, in gaps, to equal or higher
    values: no record above the truth, and the total short of it by at most the values before the resets."""
    streams, up = _stream(seed, resets=True)
    assert sum(len(s.runs) - 1 for s in streams) >= 10
    store = rule_cases.Store(up, variant.start_times)
    truth = rule_cases.truth(streams, store, GROUP)
    cases = _never_above(truth, sorted({s.labels[GROUP] for s in streams})) + _lost_at_most(streams, store, truth)
    result = run(promtool, "test", "rules", _test_file(tmp_path, streams, store, variant, cases), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


AUDITED_FORM = "sum by ({by}) (({m} offset 1m - {m} offset 6m) >= 0 or {m} offset 1m)"
"""The form the audit found counting history twice after a gap (a series with no sample 5 minutes
back counts its whole value)."""


def _audited(monkeypatch, directory: Path) -> Path:
    """The shipped rules with the audited counting form and the audited export-failure alert."""
    monkeypatch.setattr(rules, "counted", lambda m, by, t=rules.PORTABLE: AUDITED_FORM.format(m=m, by=", ".join(by)))
    shipped = rules.export_failing()
    monkeypatch.setattr(rules, "export_failing", lambda **_: {**shipped, "expr": AUDITED_EXPORT_ALERT})
    path = directory / rules.FILES[rules.PORTABLE]
    path.write_text(rules.render(rules.PORTABLE))
    return path


AUDITED_EXPORT_ALERT = "\nor\n".join(
    f"label_replace(sum by (job, instance, exporter) ((increase({m}[15m]) and {m} offset 15m) or "
    f"(last_over_time({m}[15m]) unless {m} offset 15m)), \"signal\", \"{s.replace('_', ' ')}\", \"\", \"\") > 0"
    for s, m in series.OTELCOL_SEND_FAILED.items())
"""The export-failure alert the audit found paging on old failures."""


def test_the_random_streams_fail_the_audited_form(tmp_path, monkeypatch):
    audited = _audited(monkeypatch, tmp_path)
    streams, up = _stream(SEEDS[0], resets=False)
    store = rule_cases.Store(up)
    doc = {"rule_files": [str(audited)], "evaluation_interval": "5m", "tests": [{
        "interval": "30s", "input_series": [{"series": series.TURNS + rule_cases.selector(s.labels),
                                             "values": rule_cases.values(s, store, SLOTS)} for s in streams],
        "promql_expr_test": _each_record_is_the_truth(rule_cases.truth(streams, store, GROUP))}]}
    (tmp_path / "audited.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run(chain.promtool(), "test", "rules", "audited.test.yaml", cwd=tmp_path)
    assert result.returncode != 0 and RECORD in result.stdout + result.stderr


def test_the_named_cases_fail_the_audited_form(tmp_path, monkeypatch):
    """The shipped unit tests catch the audit's defects: a gap counted twice, the backstop alert firing
    again after a gap, old Collector failures paging."""
    _audited(monkeypatch, tmp_path)
    tests = RULES_DIR / rules.TEST_FILES[rules.PORTABLE]
    (tmp_path / tests.name).write_text(tests.read_text())
    out = run(chain.promtool(), "test", "rules", tests.name, cwd=tmp_path)
    assert out.returncode != 0
    failed = out.stdout + out.stderr
    for window, at in (("1h59m59s", "2h"), ("2h59m59s", "3h"), ("1h19m59s", "1h20m"), ("1d2h59m59s", "1d3h")):
        assert f"{RECORD}[{window}]))\", time: {at}," in failed, (window, at)  # 10-min and 2-h gaps, old counters, 23 h
    assert "alertname: TurnguardBackstopHalts, time: 55m" in failed
    assert "name: old failures do not page" in failed


HOST_ENDS = ("completed", "halted", "error", "cancelled", "abandoned", "plugin_error", "budget", "timeout")
"""Every outcome a turn is recorded with: the guard's own and a host's reasons of its own."""
FATE_THRESHOLDS = ("none", "hard_backstop", "soft_stuck", "streak", "explicit", "cycle_cap")


def _censored(outcome: str, threshold: str) -> bool:
    """calibrate's fate of the turn (``ended_by``: its threshold when one fired, else its reason)."""
    ended_by = threshold if threshold != "none" else outcome
    return ended_by in CENSORING_ENDS


def test_the_fates_record_censors_every_halted_turn_however_the_host_ended_it(promtool, variant, tmp_path):
    """Each outcome x threshold, one turn apiece: a halted turn the host ended by its own exception,
    end("cancelled") or end("<its own reason>") is censored, as calibrate censors it; only a turn no
    threshold halted that ended on its own, completed or with a reason of its own, finished."""
    pairs = list(itertools.product(HOST_ENDS, FATE_THRESHOLDS))
    inputs = [{"series": f"{series.TOOL_CALLS}_bucket" + rule_cases.selector(
                   {"le": "+Inf", series.AGENT: f"a{i}", series.OUTCOME: o, series.THRESHOLD: th,
                    series.CAP_MODE: "adaptive", series.COHORT: "live"}),
               "values": "0x20 1x40"} for i, (o, th) in enumerate(pairs)]
    fate = {True: "censored", False: "finished"}
    expected = [{"labels": f'{{{series.AGENT}="a{i}", {rules.FATE}="{fate[_censored(o, th)]}"}}', "value": 1}
                for i, (o, th) in enumerate(pairs)]
    case = {"expr": f"sum by ({series.AGENT}, {rules.FATE}) (sum_over_time({rules.FATES_RECORD}[29m]))",
            "eval_time": "29m", "exp_samples": expected}
    doc = {"rule_files": [str(RULES_DIR / rules.FILES[variant])], "evaluation_interval": "5m",
           "tests": [{"interval": "30s", "input_series": inputs, "promql_expr_test": [case]}]}
    (tmp_path / "fates.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run(promtool, "test", "rules", "fates.test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_heartbeat_is_its_groups_last_rule(variant):
    """The harness waits for it (``board_runs._records``): Prometheus writes each rule of an evaluation
    on its own, so only the last rule's sample says every record of that evaluation is written."""
    (group,) = [g for g in loaded(variant)["groups"] if g["name"] == "turnguard"]
    assert group["rules"][-1].get("record") == rules.HEARTBEAT
