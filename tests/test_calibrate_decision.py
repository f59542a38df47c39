"""An answer with its power: each probe row decides against the tolerance, or says how many more
probe turns past the threshold would decide it and how long they take at the observed traffic;
and no row or recommendation calls a threshold enough when the evidence could not see past it
(a row at or above the probe's own cap, turns the probe cut off at its cap)."""

from __future__ import annotations

import io
import json
import random
import re

import pytest

from planted_fleet import LIVE, MIX, PROBE, S, Work, run_fleet
from turnguard._calibrate import cli
from turnguard._calibrate.advice import MAX_MORE, Context, assess, decide, recommendation, turns_to_decide
from turnguard._calibrate.evidence import Z95, Passed, ProbeEvidence, wilson_interval
from turnguard._calibrate.recording import Recording
from turnguard._calibrate.records import Limits, RecordedTurn


def passed(resolved: int, unresolved: int, censored: int = 0, unknown: int = 0) -> Passed:
    return Passed(resolved + unresolved + censored + unknown, resolved, unresolved, censored, 0)


@pytest.mark.parametrize("seed", range(5))
def test_the_decision_is_the_intervals_and_the_turns_it_names_decide_it(seed):
    """For random counts and tolerances: ``above`` exactly when the interval's low end is over the
    tolerance, ``within`` exactly when its high end is under; an undecided row's ``more_turns``
    at the same shares decides it, one turn fewer does not."""
    rng = random.Random(seed)
    for _ in range(400):
        p = passed(rng.randint(0, 60), rng.randint(0, 60), rng.choice([0, 0, rng.randint(0, 20)]))
        q = rng.choice([0.05, 0.1, 0.2, 0.5])
        d = decide(p, q)
        low, high = p.interval()
        if not p.known:
            assert d.verdict == "no_evidence"
            continue
        assert (d.verdict == "above") == (low > q) and (d.verdict == "within") == (high < q)
        if d.why != "needs_turns":
            continue
        n, share = p.known, (p.resolved / p.known if p.resolved / p.known > q else (p.resolved + p.censored) / p.known)
        total = n + d.more_turns
        assert total * (share - q) ** 2 > Z95 ** 2 * q * (1 - q)  # the score test the Wilson interval inverts
        if d.more_turns > 1:
            assert (total - 1) * (share - q) ** 2 <= Z95 ** 2 * q * (1 - q)


@pytest.mark.parametrize("q", [0.05, 0.1, 0.25])
def test_the_turns_needed_at_a_share_of_0_or_1_are_the_wilson_intervals_own(q):
    """At p = 0 (none resolved) the normal approximation would say 0 turns; the Wilson interval
    needs as many as the score test says: found here by counting."""
    n0 = next(n for n in range(1, 10_000) if wilson_interval(0, n)[1] < q)
    n1 = next(n for n in range(1, 10_000) if wilson_interval(n, n)[0] > q)
    assert turns_to_decide(0.0, q) == n0 and turns_to_decide(1.0, q) == n1


def test_a_share_at_the_tolerance_or_censored_both_ways_needs_no_count_of_turns():
    at = decide(passed(10, 90), 0.1)
    assert (at.verdict, at.why, at.more_turns) == ("undecided", "at_tolerance", None)
    assert turns_to_decide(0.1 + 1e-9, 0.1) is None and MAX_MORE < 10**10
    both = decide(passed(2, 30, censored=20), 0.1)  # 2/52 below, 22/52 above: the censored decide it
    assert (both.verdict, both.why, both.more_turns) == ("undecided", "censored", None)


def test_how_long_the_turns_take_is_read_at_the_recordings_traffic():
    p = passed(4, 8)  # 12 turns past the threshold with a fate in 3 days: 4 a day; 33% against 20%
    d = decide(p, 0.2, days=3.0)
    assert d.why == "needs_turns" and d.more_days == pytest.approx(d.more_turns / 4)
    assert decide(p, 0.2).more_days is None


def recording_with(probe_cap: int, stop: int = 13, days: float = 2.0) -> Recording:
    r = Recording()
    limits = Limits("adaptive", 100, probe_cap, 6, 5, stop, 0)
    r.add(RecordedTurn("a", (), limits=limits, started_at=1000.0, ended_at=1001.0), "probe")
    r.add(RecordedTurn("b", (), limits=limits, started_at=1000.0, ended_at=1000.0 + days * 86400), "probe")
    return r


def evidence_with(rng: random.Random) -> ProbeEvidence:
    """Probe turns of random lengths and fates, some cut off at the probe's cap (2,000 calls)."""
    e = ProbeEvidence(100, 10, 6, 8)
    for _ in range(rng.randint(0, 300)):
        calls = rng.choice([rng.randint(10, 2000), 2001])
        cut = calls == 2001
        resolved = None if rng.random() < 0.1 else (False if cut else rng.random() < 0.6)
        e.add(calls, resolved, None, "hard_backstop" if cut else None)
    return e


@pytest.mark.parametrize("seed", range(8))
def test_no_recommendation_calls_a_threshold_enough_past_the_probes_cap(seed):
    """Whatever the evidence: rows at or past the probe's cap (20x) are censored there, never
    decided, and no advice keeps a multiple or raises to one the probe could not see past."""
    rng = random.Random(seed)
    e = evidence_with(rng)
    ctx = Context(rng.choice([0.05, 0.1, 0.3]), recording_with(2000))
    decisions = assess(e, ctx)
    for k in e.multiples:
        d = decisions[str(k)]
        if k * 100 >= 2000:
            assert d.censored_at_cap == ("hard_backstop", 2000) and d.verdict in ("undecided", "no_evidence"), k
    for line in recommendation(e, ctx):
        for k in re.findall(r"(?:keep|raising it to|raise it to) (\d+)x", line):
            assert int(k) * 100 < 2000, line
        if "keep 10x" in line:
            assert decisions["10"].verdict == "within"


def test_a_backstop_at_the_probes_cap_is_said_to_be_unseen():
    e = ProbeEvidence(100, 20, 6, 8)
    for _ in range(50):
        e.add(2001, False, None, "hard_backstop")
    ctx = Context(0.1, recording_with(2000))
    (advice, *_) = recommendation(e, ctx)
    assert "no probe turn can be seen past it; raise the probe's cap to see past 20x" in advice
    assert "keep" not in advice


def test_the_streak_row_at_or_above_the_probes_own_stop_is_censored_there():
    e = ProbeEvidence(100, 10, 6, 8)
    e.add(10, True, None)
    ctx = Context(0.1, recording_with(3000, stop=8))
    assert assess(e, ctx)["streak"].censored_at_cap == ("streak", 8)
    assert assess(e, Context(0.1, recording_with(3000, stop=13)))["streak"].censored_at_cap is None
    streak = next(line for line in recommendation(e, ctx) if "streak stop" in line)
    assert "raise the probe's streak_stop_at to see past 8" in streak


def test_without_the_probes_limits_calibrate_says_it_cannot_check_the_caps():
    e = ProbeEvidence(100, 10, 6, 8)
    e.add(2001, False, None, "hard_backstop")
    notes = recommendation(e, Context(0.1, Recording()))
    assert any("The probe's limits are not in the recording" in n for n in notes)
    assert assess(e, Context(0.1, Recording()))["20"].censored_at_cap is None
    assert e.multiples[20].censored == 1  # the halted turn still counts as censored, from its own record


# -- through the command, on the planted fleet ------------------------------------------------------


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("decide")
    fleet = run_fleet(folder / "turns.jsonl", mix={**MIX, Work.LONG: 60, Work.RUNAWAY: 10})
    config = folder / "turnguard.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items())
                      + "[probe]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in PROBE.items()))
    return fleet, config


def probe_json(fleet_run, *flags: str) -> dict:
    fleet, config = fleet_run
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([str(fleet.path), "--config", str(config), "--soft-caps", str(S), "--multipliers", "10",
                     "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers", "--explicit-caps", "100",
                     "--key-modes", "canonical", *flags, "--json", "-"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())["probe"]


def test_the_planted_fleets_decisions_match_its_truth(fleet_run):
    """10x: most probe turns past it finish later (above); the probe's own 20x is not seen past
    (censored at its cap); D and the streak stop halt turns that finish (above)."""
    fleet, _ = fleet_run
    probe = probe_json(fleet_run)
    assert probe["passed_multiple"]["10"]["decision"] == "above"
    assert probe["passed_multiple"]["20"]["censored_at_cap"] == {"threshold": "hard_backstop", "cap": 20 * S}
    assert probe["passed_multiple"]["30"]["censored_at_cap"] == {"threshold": "hard_backstop", "cap": 20 * S}
    assert probe["passed_stuck"]["decision"] in ("above", "undecided")
    assert probe["passed_streak"]["resolved"] == sum(1 for t in fleet.of("probe", Work.RETRY))
    probe_turns = len(fleet.of("probe"))
    assert probe["configured_rate"] == PROBE["rate"] and probe["turns"] == probe_turns


def test_a_stricter_tolerance_changes_the_decision_and_merge_can_redecide(fleet_run, tmp_path):
    loose = probe_json(fleet_run, "--tolerance", "0.9")["passed_multiple"]["10"]
    assert loose["decision"] in ("within", "undecided") and loose["tolerance"] == 0.9
    part = tmp_path / "r.json"
    fleet, config = fleet_run
    assert cli.main([str(fleet.path), "--config", str(config), "--json", str(part)], stdout=io.StringIO(),
                    stderr=io.StringIO()) == 0
    out = io.StringIO()
    assert cli.main(["merge", str(part), "--tolerance", "0.9", "--json", "-"], stdout=out, stderr=io.StringIO()) == 0
    assert json.loads(out.getvalue())["probe"]["passed_multiple"]["10"]["tolerance"] == 0.9


@pytest.mark.parametrize("bad", ["0", "1", "-0.1", "1.5", "x", "nan"])
def test_a_tolerance_outside_0_1_is_a_usage_error(fleet_run, bad):
    fleet, _ = fleet_run
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(fleet.path), "--tolerance", bad], stdout=io.StringIO(), stderr=err)
    assert exit_.value.code == 2


def test_the_probes_cost_is_scaled_to_the_fleet_at_the_configured_rate(fleet_run):
    probe = probe_json(fleet_run)
    cost = next(line for line in probe["recommendation"] if line.startswith("The probe cost"))
    assert f"at the configured rate of {PROBE['rate']:.1%}" in cost and "of the fleet's calls" in cost
    assert f"{probe['calls_past_main']:,} calls" in cost


def test_every_decision_field_is_in_every_row(fleet_run):
    probe = probe_json(fleet_run)
    rows = [*probe["passed_multiple"].values(), probe["passed_stuck"], probe["passed_streak"]]
    for row in rows:
        assert set(row) >= {"turns", "resolved", "unresolved", "censored", "unknown", "calls_past",
                            "resolved_interval", "tolerance", "decision", "why", "more_turns", "more_days",
                            "censored_at_cap"}
        assert row["decision"] in ("above", "within", "undecided", "no_evidence")
        low, high = row["resolved_interval"]
        assert 0 <= low <= high <= 1
