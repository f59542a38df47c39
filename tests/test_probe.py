"""The probe cohort: deterministic sampling by conversation (else turn) id, the probe
configuration guarding its turns live while the main one runs beside it as a shadow named after
it, and the cohort on summaries, metrics, spans, the recorder and in calibrate's evidence."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import turnguard as tg
from conftest import distinct_call, drive
from turnguard._calibrate import cli
from turnguard._probe import sample_point, selects
from turnguard.telemetry import _names as n

NO_TELEMETRY = {"load_entrypoints": False, "disable_plugins": ("otel", "recorder")}


class Shadows:
    def __init__(self) -> None:
        self.detected: list[tuple[str, str, int]] = []

    @tg.hookimpl
    def turnguard_shadow_detected(self, turn, policy, event):
        self.detected.append((policy, str(event.threshold), event.tool_calls))


def test_sampling_is_the_same_in_another_process():
    ids = [f"conv-{i}" for i in range(50)]
    here = [sample_point(i) for i in ids]
    code = f"from turnguard._probe import sample_point; print([sample_point(i) for i in {ids!r}])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(there) == here


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_the_sampled_share_is_the_rate(rate):
    n_ids = 40_000
    picked = sum(selects(rate, None, f"turn-{i}") for i in range(n_ids))
    sigma = math.sqrt(n_ids * rate * (1 - rate))
    assert abs(picked - n_ids * rate) < 5 * sigma


def test_a_conversation_stays_in_one_cohort_and_the_ends_are_exact():
    for conversation in (f"c{i}" for i in range(200)):
        assert len({selects(0.3, conversation, f"t{j}") for j in range(5)}) == 1
    assert not any(selects(0.0, None, f"t{i}") for i in range(1000))
    assert all(selects(1.0, None, f"t{i}") for i in range(1000))


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan"), True, "0.1"])
def test_a_bad_rate_is_a_config_error(rate):
    with pytest.raises(tg.ConfigError, match=r"probe.rate"):
        tg.Probe(rate, tg.GuardConfig())


def test_probe_configurations_are_checked():
    with pytest.raises(tg.ConfigError, match=r"probe.config"):
        tg.Probe(0.1, {"hard_multiplier": 20})
    with pytest.raises(tg.ConfigError, match=r"probe.config.probe"):
        tg.Probe(0.1, tg.GuardConfig(probe={"rate": 0.5}))
    with pytest.raises(tg.ConfigError, match=r"probe.rate"):
        tg.GuardConfig(probe={"hard_multiplier": 20})
    with pytest.raises(tg.ConfigError, match=r"probe.hard_multiplier"):
        tg.GuardConfig(probe={"rate": 0.1, "hard_multiplier": 0})
    with pytest.raises(tg.ConfigError, match="TURNGUARD_PROBE"):
        tg.GuardConfig.from_env({"TURNGUARD_PROBE": "0.1"})


def test_a_probe_from_toml_applies_over_the_main_configuration_and_gets_its_own_name(tmp_path: Path):
    toml = 'name = "prod"\nsoft_cap = 50\n[probe]\nrate = 0.01\nhard_multiplier = 20\n'
    (tmp_path / "turnguard.toml").write_text(toml)
    config = tg.GuardConfig.load(search=tmp_path, environ={})
    probe = config.probe_settings()
    assert probe.rate == 0.01
    assert (probe.config.soft_cap, probe.config.hard_multiplier, probe.config.name) == (50, 20, "prod-probe")
    named = tg.GuardConfig(probe=tg.Probe(0.1, tg.GuardConfig(name="lenient")))
    assert named.probe_settings().config.name == "lenient"


def test_the_main_policys_name_cannot_also_be_a_shadows():
    with pytest.raises(tg.ConfigError, match="shadow"):
        tg.Guard(tg.GuardConfig(**NO_TELEMETRY, probe={"rate": 0.5}, shadow={"default": {"soft_cap": 5}}))


def runaway(guard: tg.Guard, turn_id: str, calls: int = 2500) -> tg.Turn:
    turn = guard.turn(turn_id=turn_id)
    drive(turn, [distinct_call(i) for i in range(calls)])
    turn.end()
    return turn


def test_probe_turns_run_under_the_probe_and_the_main_config_is_a_shadow_that_fires_where_it_would():
    shadows = Shadows()
    g = tg.Guard(tg.GuardConfig(**NO_TELEMETRY, name="main", probe={"rate": 0.5, "hard_multiplier": 20}),
                 plugins={"shadows": shadows}, environ={})
    by_cohort: dict[str, list[tg.Turn]] = {"live": [], "probe": []}
    for i in range(12):
        turn = runaway(g, f"turn-{i}")
        by_cohort[turn.summary.cohort].append(turn)
    assert by_cohort["live"] and by_cohort["probe"]
    assert {t.summary.tool_calls for t in by_cohort["live"]} == {1001}   # call 1001 halted (10 x 100)
    assert {t.summary.tool_calls for t in by_cohort["probe"]} == {2001}  # the probe's backstop: 20 x 100
    assert all(t.summary.threshold == "hard_backstop" for ts in by_cohort.values() for t in ts)
    # The main configuration, as the shadow "main", would have halted each probe turn at call 1001.
    assert sorted(shadows.detected) == sorted([("main", "hard_backstop", 1001)] * len(by_cohort["probe"]))
    assert all(selects(0.5, None, t.turn_id) == (c == "probe") for c, ts in by_cohort.items() for t in ts)


def first_call_digest(guard: tg.Guard, turn_id: str) -> tuple[str, str]:
    with guard.turn(turn_id=turn_id) as turn:
        for _ in range(5):
            verdict = turn.check_call(tg.ToolCall("bash", "pytest -q"))
    return turn.summary.cohort, verdict.event.key_digest


@pytest.mark.parametrize("probe_config", [tg.GuardConfig(**NO_TELEMETRY, hard_multiplier=20), None])
def test_a_call_has_one_digest_in_both_cohorts_when_only_the_main_config_sets_the_key(probe_config):
    main = tg.GuardConfig(**NO_TELEMETRY, digest_key="fleet-secret")
    probe = {"rate": 0.5, "hard_multiplier": 20} if probe_config is None else tg.Probe(0.5, probe_config)
    g = tg.Guard(main.replace(probe=probe), environ={})
    seen = dict(first_call_digest(g, f"turn-{i}") for i in range(16))
    assert set(seen) == {"live", "probe"}
    assert seen["live"] == seen["probe"] == first_call_digest(tg.Guard(main, environ={}), "x")[1]


def test_a_probe_configuration_with_its_own_digest_key_keeps_it():
    main = tg.GuardConfig(**NO_TELEMETRY, digest_key="fleet-secret")
    g = tg.Guard(main.replace(probe=tg.Probe(1.0, main.replace(digest_key="probe-secret"))), environ={})
    other = tg.Guard(main.replace(digest_key="probe-secret"), environ={})
    assert first_call_digest(g, "t")[1] == first_call_digest(other, "t")[1]
    assert first_call_digest(g, "t")[1] != first_call_digest(tg.Guard(main, environ={}), "t")[1]


def test_probe_turns_given_a_whole_configuration_are_recorded_where_live_turns_are(tmp_path: Path):
    path = tmp_path / "turns.jsonl"
    main = tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",), recorder_path=str(path))
    probe = tg.Probe(0.5, tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",), hard_multiplier=20))
    g = tg.Guard(main.replace(probe=probe), environ={})
    cohorts = [runaway(g, f"turn-{i}", 5).summary.cohort for i in range(16)]
    recorded = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["cohort"] for r in recorded if "cohort" in r) == sorted(cohorts)
    assert {"live", "probe"} <= set(cohorts)


def test_without_a_probe_every_turn_is_live_and_rate_1_probes_every_turn():
    assert {runaway(tg.Guard(tg.GuardConfig(**NO_TELEMETRY), environ={}), f"t{i}", 5).summary.cohort
            for i in range(10)} == {"live"}
    g = tg.Guard(tg.GuardConfig(**NO_TELEMETRY, probe={"rate": 1.0, "soft_cap": 7}), environ={})
    assert {runaway(g, f"t{i}", 5).summary.cohort for i in range(10)} == {"probe"}


def test_probe_turns_are_reported_with_their_cohort_and_the_probe_policys_name(otel):
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), name="main",
                                probe={"rate": 1.0, "hard_multiplier": 20}), environ={}, **otel.providers())
    turn = runaway(g, "t1", 1200)
    assert turn.summary.cohort == "probe"
    (calls,) = otel.points(n.METRIC_TURN_TOOL_CALLS[0])
    assert (calls.attributes[n.POLICY], calls.attributes[n.TURN_COHORT]) == ("main-probe", "probe")
    shadow = {p.attributes[n.SHADOW_POLICY]: p for p in otel.points(n.METRIC_SHADOW_TURN_TOOL_CALLS[0])}
    assert shadow["main"].sum == 1001 and shadow["main"].attributes[n.TURN_COHORT] == "probe"
    (detection,) = otel.points(n.METRIC_SHADOW_DETECTIONS[0])
    assert detection.attributes[n.LOOP_THRESHOLD] == "hard_backstop"
    span = otel.span("invoke_agent")
    assert (span.attributes[n.TURN_COHORT], span.attributes[n.POLICY], span.attributes[n.LOOP_HARD_CAP]) == (
        "probe", "main-probe", 2000)


def test_probe_turns_carry_where_the_main_policy_would_have_halted_them_and_the_calls_past_it(otel):
    """The false-halt evidence: the main configuration's would-be threshold on the probe turn's
    metrics and late result (``none`` when it would not have halted; not on live turns or for
    another shadow's halt), and the calls made past its would-be halt."""
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), name="main",
                                shadow={"tight": {"soft_cap": 10, "hard_multiplier": 2}},
                                probe={"rate": 0.5, "hard_multiplier": 20}), environ={}, **otel.providers())
    turns = [runaway(g, f"t{i}", 1200 if i % 2 else 50) for i in range(16)]
    for turn in turns:
        assert g.report_result(turn.turn_id, True)
    cohorts = {(t.summary.cohort, t.summary.tool_calls) for t in turns}
    assert {("probe", 1200), ("probe", 50), ("live", 1001), ("live", 50)} <= cohorts
    main = {(p.attributes[n.TURN_COHORT], p.attributes.get(n.PROBE_MAIN_THRESHOLD)): p
            for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0])}
    assert set(main) == {("live", None), ("probe", "hard_backstop"), ("probe", "none")}
    long_probes = sum(1 for t in turns if (t.summary.cohort, t.summary.tool_calls) == ("probe", 1200))
    assert main[("probe", "hard_backstop")].count == long_probes
    (past,) = otel.points(n.METRIC_PROBE_CALLS_PAST_MAIN[0])
    assert past.attributes[n.PROBE_MAIN_THRESHOLD] == "hard_backstop"
    assert past.value == long_probes * (1200 - 1001)  # main would have halted at call 1001
    late = {(p.attributes[n.TURN_COHORT], p.attributes.get(n.PROBE_MAIN_THRESHOLD)): p.value
            for p in otel.points(n.METRIC_TURN_RESULTS[0])}
    assert late[("probe", "hard_backstop")] == long_probes
    assert set(late) == {("live", None), ("probe", "hard_backstop"), ("probe", "none")}


def test_a_probe_run_recorded_gives_calibrate_its_probe_evidence(tmp_path: Path):
    path = tmp_path / "turns.jsonl"
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",), recorder_path=str(path),
                                probe={"rate": 0.5, "hard_multiplier": 20}), environ={})
    turns = [runaway(g, f"turn-{i}", 1500) for i in range(10)]
    probe = [t for t in turns if t.summary.cohort == "probe"]
    for i, turn in enumerate(probe):
        g.report_result(turn.turn_id, i % 2 == 0)
    out = io.StringIO()
    assert cli.main([str(path), "--soft-caps", "100", "--multipliers", "10", "--no-peers", "--explicit-caps", "100",
                     "--json", "-"], stdout=out, stderr=io.StringIO()) == 0
    evidence = json.loads(out.getvalue())["probe"]
    assert (evidence["turns"], evidence["live_turns"]) == (len(probe), len(turns) - len(probe))
    passed = evidence["passed_multiple"]["10"]
    resolved = sum(i % 2 == 0 for i in range(len(probe)))
    assert (passed["turns"], passed["resolved"], passed["unresolved"], passed["calls_past"]) == (
        len(probe), resolved, len(probe) - resolved, 500 * len(probe))


# -- a probe turn resumed from its snapshot keeps the main configuration's evidence -----------------

REPEATED_AT = (10, 20, 30, 40, 45, 60)
"""One call made six times (the stuck threshold), five of them before the cut at call 50."""


class ShadowEnds:
    """Each would-be detection with the shadow's count and the live call it came at, and each
    shadow summary."""

    def __init__(self) -> None:
        self.detected: list[tuple[str, str, int, int]] = []
        self.ended: list[tuple[str, int, bool, str]] = []

    @tg.hookimpl
    def turnguard_shadow_detected(self, turn, policy, event):
        self.detected.append((policy, str(event.threshold), event.tool_calls, turn.tool_calls))

    @tg.hookimpl
    def turnguard_shadow_turn_ended(self, policy, summary):
        self.ended.append((policy, summary.tool_calls, summary.halted, str(summary.threshold)))


def probe_guard(heard: ShadowEnds) -> tg.Guard:
    lenient = tg.GuardConfig(hard_multiplier=20, stuck_repeat_threshold=12)
    config = tg.GuardConfig(name="main", probe=tg.Probe(1.0, lenient), **NO_TELEMETRY)
    return tg.Guard(config, plugins={"heard": heard}, environ={})


def probe_calls(total: int, repeats: tuple[int, ...]) -> list[tg.ToolCall]:
    repeated = tg.ToolCall("bash", "npm run build")
    return [repeated if i in repeats else distinct_call(i) for i in range(1, total + 1)]


@pytest.mark.parametrize(("total", "repeats", "expected"), [
    (1100, (), ("main", "hard_backstop", 1001, 1001)),
    (150, REPEATED_AT, ("main", "soft_stuck", 101, 101)),
])
def test_a_probe_turn_resumed_at_call_50_records_the_main_policys_detection_where_it_fires(total, repeats, expected):
    calls = probe_calls(total, repeats)
    whole_heard, resumed_heard = ShadowEnds(), ShadowEnds()
    with probe_guard(whole_heard).turn(durable=True) as whole:
        assert all(v.action is tg.Action.ALLOW for v in drive(whole, calls))
    first = probe_guard(resumed_heard).turn(durable=True)
    drive(first, calls[:50])
    state = json.loads(json.dumps(first.suspend()))
    resumed = probe_guard(resumed_heard).resume(state)  # another guard, as another process has
    assert all(v.action is tg.Action.ALLOW for v in drive(resumed, calls[50:]))
    summary = resumed.end()
    assert summary.cohort == "probe" and summary.tool_calls == total and summary.fresh_state == ()
    assert whole_heard.detected == [expected]
    assert resumed_heard.detected == whole_heard.detected
    assert resumed_heard.ended == whole_heard.ended == [("main", expected[2], True, expected[1])]


def test_a_probe_turn_resumed_from_a_snapshot_without_shadow_state_counts_afresh_and_says_so():
    calls = probe_calls(1100, ())
    heard = ShadowEnds()
    first = probe_guard(heard).turn(durable=True)
    drive(first, calls[:50])
    state = json.loads(json.dumps(first.suspend()))
    del state["plugins"]  # what a version 1 snapshot holds
    resumed = probe_guard(heard).resume(state)
    drive(resumed, calls[50:])
    assert resumed.end().fresh_state == ("shadow",)
    assert heard.detected == [("main", "hard_backstop", 1001, 1051)]  # the shadow counted from the resume


def test_a_probe_with_a_later_cycle_repeat_stop_runs_past_the_main_policys_and_records_where_it_would_halt():
    """As for the streak stop: the probe's own stop (16 repetitions) lets an A,B loop run past the
    main policy's (8: call 16), whose would-be halt the shadow records there."""
    shadows = Shadows()
    g = tg.Guard(tg.GuardConfig(**NO_TELEMETRY, name="main", cycle_repeat_warn_at=5, cycle_repeat_stop_at=8,
                                probe={"rate": 1.0, "cycle_repeat_stop_at": 16}),
                 plugins={"shadows": shadows}, environ={})
    with g.turn(turn_id="loop") as turn:
        for i in range(1, 41):
            call = tg.ToolCall("read" if i % 2 else "list", {"path": "a"})
            turn.check_call(call)
            verdict = turn.record_outcome(call, tg.Outcome.OK)
            if verdict.action is tg.Action.HALT:
                break
    assert turn.summary.cohort == "probe"
    assert (i, verdict.threshold, verdict.event.limit) == (32, tg.Threshold.CYCLE_REPEAT, 16)
    assert ("main", "cycle_repeat", 16) in shadows.detected


def _streak_then_work(g: tg.Guard, failures: int, then: int) -> tg.Turn:
    """A failing streak of ``failures`` identical calls (the last passes, unless the probe stops it
    first), then ``then`` distinct productive calls."""
    with g.turn() as turn:
        for i in range(failures):
            call = tg.ToolCall("run_tests", {})
            if turn.check_call(call).action is tg.Action.HALT:
                return turn
            turn.record_outcome(call, "ok" if i == failures - 1 else "error")
        for i in range(then):
            call = tg.ToolCall("edit", {"i": i})
            if turn.check_call(call).action is tg.Action.HALT:
                return turn
            turn.record_outcome(call, "ok")
    return turn


@pytest.mark.parametrize(("failures", "then"), [(13, 0), (13, 90), (9, 0), (9, 90), (12, 90), (10, 2000)])
def test_a_raised_streak_stop_costs_up_to_the_probes_backstop_past_the_main_stop(otel, failures, then):
    """docs/stuck-signals.md's cost of a probe raising ``streak_stop_at`` from 8 to 12: a streak that
    keeps failing is stopped 4 calls later; one that breaks before 12 lets the turn go on, every
    call of it past the main stop (call 8) counted, up to the probe's backstop."""
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), name="main",
                                probe={"rate": 1.0, "streak_stop_at": 12}), environ={}, **otel.providers())
    turn = _streak_then_work(g, failures, then)
    (past,) = otel.points(n.METRIC_PROBE_CALLS_PAST_MAIN[0])
    assert past.attributes[n.PROBE_MAIN_THRESHOLD] == "streak"
    assert past.value == turn.summary.tool_calls - 8
    assert past.value <= g.config.hard_cap + 1 - 8  # the table's bound: the probe's backstop - the main stop
    if failures > 12:
        assert (turn.summary.threshold, past.value) == (tg.Threshold.STREAK, 12 - 8)
    if failures <= 12 and then:
        assert past.value > 12 - 8  # past the old "L_probe - L_main" figure
    docs = (Path(__file__).resolve().parent.parent / "docs" / "stuck-signals.md").read_text(encoding="utf-8")
    assert "L_probe - L_main per failing streak" not in docs and "costs 4 calls per stopped streak" not in docs


# -- a turn resumed on a guard whose probe changed since ------------------------------------------------

LENIENT = tg.GuardConfig(hard_multiplier=20, stuck_repeat_threshold=12)
PROBE_CHANGES = {
    "the same probe": tg.Probe(0.5, LENIENT),
    "no probe": None,
    "a probe at rate 0": tg.Probe(0.0, LENIENT),
    "another rate": tg.Probe(0.25, LENIENT),
    "another probe configuration": tg.Probe(0.5, tg.GuardConfig(hard_multiplier=30, streak_stop_at=6)),
    "another probe name": tg.Probe(0.5, tg.GuardConfig(name="canary", hard_multiplier=20, stuck_repeat_threshold=12)),
}
"""The probe of the guard a snapshot is resumed on; the snapshot's was the first (half the turns)."""


def changed_guard(probe: tg.Probe | None, heard: ShadowEnds, registered: bool) -> tg.Guard:
    guard = tg.Guard(tg.GuardConfig(name="main", probe=probe, **NO_TELEMETRY),
                     plugins=None if registered else {"heard": heard}, environ={})
    if registered:
        guard.register(heard, name="heard")
    return guard


def turn_id_in(cohort: str) -> str:
    return next(f"t{i}" for i in range(100) if selects(0.5, None, f"t{i}") is (cohort == "probe"))


@pytest.mark.parametrize("registered", [False, True], ids=["plugins given", "plugins registered"])
@pytest.mark.parametrize("cohort", ["live", "probe"])
@pytest.mark.parametrize("change", list(PROBE_CHANGES))
def test_a_turn_resumed_where_the_probe_changed_goes_on_as_it_was_decided_in_its_cohort(change, cohort, registered):
    """A host that turned its probe off, or changed its rate or configuration, and restarted
    loses no turn in flight: a live turn resumes under the main configuration, a probe turn under
    the configuration it was decided with, in the probe cohort, with the main configuration's
    shadow; the verdicts, the summary and the shadow's would-be detections are the whole turn's."""
    calls, turn_id = probe_calls(150, REPEATED_AT), turn_id_in(cohort)
    whole_heard, resumed_heard = ShadowEnds(), ShadowEnds()
    original = PROBE_CHANGES["the same probe"]
    with changed_guard(original, whole_heard, False).turn(durable=True, turn_id=turn_id) as whole:
        verdicts = [(v.action, v.threshold) for v in drive(whole, calls)]
    first = changed_guard(original, resumed_heard, False).turn(durable=True, turn_id=turn_id)
    before = [(v.action, v.threshold) for v in drive(first, calls[:50])]
    state = json.loads(json.dumps(first.suspend()))
    assert state["turn"]["cohort"] == cohort
    resumed = changed_guard(PROBE_CHANGES[change], resumed_heard, registered).resume(state)
    after = [(v.action, v.threshold) for v in drive(resumed, calls[50:])]
    assert before + after == verdicts
    assert resumed.end() == dataclasses.replace(whole.summary, duration_s=resumed.summary.duration_s)
    assert resumed.summary.cohort == cohort and resumed.turn_id == turn_id
    assert resumed_heard.detected == whole_heard.detected and resumed_heard.ended == whole_heard.ended
    assert bool(whole_heard.detected) is (cohort == "probe")  # (the main policy's shadow, on probe turns)


@pytest.mark.parametrize("change", ["no probe", "another probe configuration"])
@pytest.mark.parametrize(("setting", "value"), [("hard_multiplier", -1), ("no_such_setting", 1),
                                                ("cap_mode", "explicit")])
def test_a_probe_turn_whose_settings_cannot_be_taken_is_refused_naming_config(change, setting, value):
    first = changed_guard(PROBE_CHANGES["the same probe"], ShadowEnds(), False).turn(turn_id=turn_id_in("probe"))
    state = json.loads(json.dumps(first.suspend()))
    state["config"][setting] = value
    with pytest.raises(tg.SnapshotError, match="settings") as refused:
        changed_guard(PROBE_CHANGES[change], ShadowEnds(), False).resume(state)
    assert refused.value.field == "config"
