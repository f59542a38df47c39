"""The product-limit (Kaplan-Meier) estimate of how many calls turns need: checked against the
published values for the Freireich 6-MP leukaemia data, then read from recordings (which ends are
events and which censor a turn), never past the highest cap turns ran under, and merged exactly.

The 6-MP figures are those of R's ``survfit(Surv(time, status) ~ 1, conf.type = "log-log")`` as
printed in survival-analysis texts (Kleinbaum & Klein, *Survival Analysis*, the 6-MP group of
Freireich et al. 1963), and lifelines 0.30.3 gives the same (checked once, outside the project:
its ``KaplanMeierFitter`` and ``restricted_mean_survival_time``; lifelines pulls pandas, scipy and
matplotlib, too much for a development dependency when published values exist)."""

from __future__ import annotations

import io
import json
import random

import pytest

import turnguard as tg
from planted_fleet import LIVE, S, Work, run_fleet
from turnguard._calibrate import cli
from turnguard._calibrate.html import curve_points
from turnguard._calibrate.survival import (
    FACTORS,
    Survival,
    ended,
    estimate,
    finish_by,
    loglog_interval,
    restricted_mean,
    survival_lines,
)

# 6-MP group: remission times in weeks, + = censored.
SIX_MP = [(6, 1), (6, 1), (6, 1), (6, 0), (7, 1), (9, 0), (10, 1), (10, 0), (11, 0), (13, 1), (16, 1), (17, 0),
          (19, 0), (20, 0), (22, 1), (23, 1), (25, 0), (32, 0), (32, 0), (34, 0), (35, 0)]
PUBLISHED = [  # time, at risk, events, S(t), lower, upper (log-log 95%)
    (6, 21, 3, 0.857, 0.620, 0.952),
    (7, 17, 1, 0.807, 0.563, 0.923),
    (10, 15, 1, 0.753, 0.503, 0.889),
    (13, 12, 1, 0.690, 0.432, 0.849),
    (16, 11, 1, 0.627, 0.368, 0.805),
    (22, 7, 1, 0.538, 0.268, 0.747),
    (23, 6, 1, 0.448, 0.188, 0.680),
]


def six_mp() -> Survival:
    s = Survival()
    for t, event in SIX_MP:
        s.add(t, "completed" if event else "cancelled")
    return s


def test_the_estimate_and_its_log_log_interval_match_the_published_6mp_values():
    steps = six_mp().steps()
    assert [(s.t, s.at_risk, s.events) for s in steps] == [row[:3] for row in PUBLISHED]
    for step, (_, _, _, surv, low, high) in zip(steps, PUBLISHED, strict=True):
        assert step.survival == pytest.approx(surv, abs=5e-4)
        assert loglog_interval(step.survival, step.greenwood) == pytest.approx((low, high), abs=5e-4)


def test_the_restricted_mean_matches_lifelines():
    steps = six_mp().steps()
    assert restricted_mean(steps, 0, 23) == pytest.approx(17.909244, abs=1e-6)
    assert restricted_mean(steps, 0, 35) == pytest.approx(23.287395, abs=1e-6)


def test_finishing_by_k_among_those_reaching_b_is_the_conditional_estimate():
    s = six_mp()
    steps = s.steps()
    f = finish_by(s, steps, 10, 2.3, 23, horizon=35)
    assert f.share == pytest.approx(1 - 0.448179 / 0.752941, abs=1e-5)
    s10 = Survival.at(steps, 10)[0]
    assert s10 == pytest.approx(0.752941, abs=1e-6)
    assert f.extra_calls == pytest.approx(restricted_mean(steps, 10, 23) / s10, abs=1e-9)
    assert 0 < f.interval.low < f.share < f.interval.high < 1 and not f.interval.exact
    # From before the first event, the conditional is the plain estimate, with the same interval.
    plain = finish_by(s, steps, 1, 2.3, 23, horizon=35)
    interval = loglog_interval(0.448179, steps[-1].greenwood)
    assert plain.share == pytest.approx(1 - 0.448179, abs=1e-5)
    assert (plain.interval.low, plain.interval.high) == pytest.approx((1 - interval[1], 1 - interval[0]), abs=1e-5)


def test_nothing_is_estimated_past_the_horizon():
    s = six_mp()
    assert not finish_by(s, s.steps(), 10, 4.0, 36, horizon=35).estimable
    assert finish_by(s, s.steps(), 10, 4.0, 36, horizon=35).why == "past_cap"
    assert finish_by(s, s.steps(), 10, 3.5, 35, horizon=35).estimable


@pytest.mark.parametrize("seed", range(6))
def test_random_recordings_never_get_an_estimate_past_their_cap(seed):
    rng = random.Random(seed)
    s = Survival()
    cap = rng.choice([150, 200, 300])
    for _ in range(rng.randint(1, 400)):
        n = rng.randint(1, cap + 1)
        s.add(n, "hard_backstop" if n == cap + 1 else rng.choice(["completed", "completed", "streak", "error"]))
    est = estimate(s, 100, 10.0, cap, "limits")
    for f in est["finish_by"]:
        assert f["estimable"] == (f["calls"] <= cap) or f["why"] == "no_turns"
        if f["estimable"]:
            assert 0 <= f["share"] <= 1 and f["extra_calls_per_turn_reaching"] <= f["calls"] - 100
            assert 0 <= f["interval"][0] <= f["share"] <= f["interval"][1] <= 1
            assert f["interval"][0] < f["interval"][1]
    assert [f["multiple"] for f in est["finish_by"]] == [10 * x for x in FACTORS]


def _planted(*turns: tuple[int, str, int]) -> Survival:
    """A survival from ``(calls, ended_by, how many)``."""
    s = Survival()
    for calls, ended_by, n in turns:
        for _ in range(n):
            s.add(calls, ended_by)
    return s


def test_a_row_with_no_turn_finishing_has_the_exact_bound_over_the_turns_seen_past_it():
    """Planted truth: 19% of the turns past the backstop (100) finish by 2x (200). This sample of 11
    past it saw none finish (an 0.81^11 = 10% draw): one was stopped stuck at 150 and ten ran to the
    cap. Greenwood's variance is 0 there; the exact bound over the 10 seen past 200 covers 19%."""
    s = _planted((50, "completed", 30), (100, "hard_backstop", 9), (150, "soft_stuck", 1),
                 (300, "hard_backstop", 10))
    est = estimate(s, 100, 10.0, 300, "limits")
    row = {f["multiple"]: f for f in est["finish_by"]}[20.0]
    assert (row["share"], row["interval_from"], row["exact_over"]) == (0.0, "exact", 10)
    assert row["interval"] == pytest.approx([0.0, 1 - 0.05 ** (1 / 10)], abs=1e-6)
    assert row["interval"][0] <= 0.19 <= row["interval"][1]
    text = " ".join(survival_lines(est))
    assert "by 20x (200 calls): 0% finish (95% 0%-26%, exact: none finished, over the 10 seen past it)" in text


def test_a_row_where_every_turn_finished_has_the_exact_bound_over_those_that_did():
    s = _planted((50, "completed", 5), (120, "completed", 3), (130, "completed", 4), (120, "streak", 2))
    est = estimate(s, 100, 10.0, 300, "limits")
    for row in est["finish_by"]:
        assert (row["share"], row["interval_from"], row["exact_over"]) == (1.0, "exact", 7), row
        assert row["interval"] == pytest.approx([0.05 ** (1 / 7), 1.0], abs=1e-6)
    assert "100% finish (95% 65%-100%, exact: all finished, over the 7 that did)" in " ".join(survival_lines(est))


def test_the_share_needing_more_than_the_backstop_is_never_without_its_interval():
    """No turn finished by the backstop: S = 1, bounded below over the turns seen past it."""
    est = estimate(_planted((100, "soft_stuck", 4), (250, "completed", 6)), 100, 10.0, 300, "limits")
    reach = est["reach"]
    assert (reach["survival"], reach["interval_from"], reach["exact_over"], reach["at_risk"]) == (1.0, "exact", 6, 6)
    assert reach["interval"] == pytest.approx([0.05 ** (1 / 6), 1.0], abs=1e-6)
    assert "100.0% of the turns need more than the backstop's 100 calls (95% 60.7%-100.0%, exact" in (
        " ".join(survival_lines(est)))


def _band_at(points: list[tuple[int, float, float, float]], n: int) -> tuple[float, float]:
    """The chart's band at ``n`` calls: the last point at or before it (the band is a step curve)."""
    _, _, low, high = [p for p in points if p[0] <= n][-1]
    return low, high


def test_the_charts_band_is_the_tables_exact_bound_where_no_turn_finished_yet():
    """Before any turn finishes S is 1 and the log-log band is undefined: the chart draws the table's
    exact bound over the turns seen past n (narrowing as censored turns leave), not a bare line."""
    s = _planted((100, "soft_stuck", 4), (180, "hard_backstop", 3), (250, "completed", 6), (300, "hard_backstop", 2))
    points = curve_points(s, 300)
    reach = estimate(s, 100, 10.0, 300, "limits")["reach"]
    assert reach["interval_from"] == "exact"
    assert _band_at(points, 100) == pytest.approx(tuple(reach["interval"]))
    assert _band_at(points, 200) == pytest.approx((0.05 ** (1 / 8), 1.0))
    assert _band_at(points, 0) == pytest.approx((0.05 ** (1 / 15), 1.0))
    low, high = _band_at(points, 250)
    assert low < high and loglog_interval(points[-1][1], s.steps()[0].greenwood) == pytest.approx((low, high))


def test_the_charts_band_is_the_exact_bound_where_every_turn_finished():
    s = _planted((50, "completed", 5), (120, "completed", 3), (130, "completed", 4), (120, "streak", 2))
    points = curve_points(s, 300)
    assert points[-1][1] == 0.0
    assert _band_at(points, 200) == pytest.approx((0.0, 1 - 0.05 ** (1 / 12)))


@pytest.mark.parametrize("n", [1, 3, 10, 14, 15, 40, 300])
def test_the_exact_bound_misses_a_true_share_no_more_than_one_time_in_twenty(n):
    """For any true share p, a sample of n with none finishing (probability (1-p)^n) gets a bound
    under p at most 5% of the time."""
    s = _planted((250, "hard_backstop", n))
    high = finish_by(s, s.steps(), 100, 2.0, 200, horizon=250).interval.high
    for p in (i / 1000 for i in range(1, 1000)):
        assert (1 - p) ** n * (high < p) <= 0.05 + 1e-12


def test_no_figure_prints_a_bare_zero_or_hundred_percent():
    """A share under 0.5% (or over 99.5%) gets the digits it takes not to read 0% (100%)."""
    s = _planted((150, "completed", 1), (250, "hard_backstop", 999))
    text = " ".join(survival_lines(estimate(s, 100, 10.0, 300, "limits")))
    assert "0.1% finish (95% 0.0" in text and " 0% finish" not in text


# -- from recordings ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("km")
    f = run_fleet(folder / "turns.jsonl")
    config = folder / "turnguard.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items()))
    return f, config


def survival_of(fleet, *flags: str) -> dict:
    _, config = fleet
    out, err = io.StringIO(), io.StringIO()
    assert cli.main([*flags, "--config", str(config), "--soft-caps", str(S), "--multipliers", "10",
                     "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers", "--explicit-caps", "100",
                     "--key-modes", "canonical", "--json", "-"], stdout=out, stderr=err) == 0, err.getvalue()
    return json.loads(out.getvalue())["survival"]


def test_completed_turns_are_events_and_halted_ones_are_censored_at_their_count(fleet):
    f, _ = fleet
    est = survival_of(fleet, str(f.path))
    events, censored = {}, {}
    for t in f.of():
        hist = censored if t.summary.halted else events
        hist[str(t.summary.tool_calls)] = hist.get(str(t.summary.tool_calls), 0) + 1
    assert est["events_at"] == dict(sorted(events.items(), key=lambda kv: int(kv[0])))
    assert est["censored_at"] == dict(sorted(censored.items(), key=lambda kv: int(kv[0])))
    by = {"hard_backstop": "cap", "soft_stuck": "stuck", "streak": "streak"}
    expected: dict[str, int] = {}
    for t in f.of():
        if t.summary.halted:
            expected[by[str(t.summary.threshold)]] = expected.get(by[str(t.summary.threshold)], 0) + 1
    assert est["censored_by"] == dict(sorted(expected.items()))
    assert "informative" in est["informative_censoring"]


def test_the_estimate_reaches_the_probes_cap_and_not_past_it(fleet):
    f, _ = fleet
    est = survival_of(fleet, str(f.path))
    assert (est["horizon"], est["horizon_from"], est["from_calls"]) == (20 * S, "limits", 10 * S)
    by = {x["multiple"]: x for x in est["finish_by"]}
    assert by[15.0]["estimable"] and by[20.0]["estimable"] and not by[30.0]["estimable"]
    assert by[30.0]["why"] == "past_cap" and by[30.0]["share"] is None
    # Planted: of the probe turns past 10x, the long ones finish by 20x; the share is a KM of both cohorts.
    long_done = sum(1 for t in f.of("probe", Work.LONG))
    assert long_done > 0 and 0 < by[20.0]["share"] < 1


def test_survival_merges_and_workers_agree(fleet, tmp_path):
    f, _ = fleet
    whole = survival_of(fleet, str(f.path))
    lines = f.path.read_text().splitlines(keepends=True)
    parts = []
    for i in range(2):
        part = tmp_path / f"p{i}.jsonl"
        part.write_text("".join(lines[i::2]))
        out = tmp_path / f"p{i}.json"
        config = fleet[1]
        assert cli.main([str(part), "--config", str(config), "--soft-caps", str(S), "--multipliers", "10",
                         "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers", "--explicit-caps", "100",
                         "--key-modes", "canonical", "--json", str(out)], stdout=io.StringIO(),
                        stderr=io.StringIO()) == 0
        parts.append(str(out))
    merged = io.StringIO()
    assert cli.main(["merge", *parts, "--json", "-"], stdout=merged, stderr=io.StringIO()) == 0
    assert json.loads(merged.getvalue())["survival"] == whole
    assert survival_of(fleet, str(f.path), "--jobs", "2") == whole


def test_the_report_prints_the_estimate_with_its_caveat(fleet):
    f, config = fleet
    out = io.StringIO()
    assert cli.main([str(f.path), "--config", str(config), "--wide"], stdout=out, stderr=io.StringIO()) == 0
    text = " ".join(out.getvalue().split())
    assert "How many calls turns need (Kaplan-Meier, both cohorts" in text
    assert "by 30x (600 calls): not estimable: past the highest cap turns ran under (400 calls)" in text
    assert "Censoring by the stuck and streak thresholds is informative, not independent" in text


def test_a_recording_without_limits_reaches_only_as_far_as_its_longest_turn():
    s = Survival()
    for n in (5, 50, 120, 201):
        s.add(n, "completed" if n < 201 else "hard_backstop")
    est = estimate(s, 100, 10.0, s.largest(), "data")
    assert est["horizon"] == 201 and est["horizon_from"] == "data"


@pytest.mark.parametrize("seed", range(8))
def test_turns_halted_at_the_backstop_and_seen_no_further_give_no_estimate_past_it(seed):
    """Turns halted at the backstop (censored at base + 1, the call it denied) were seen up to it
    and no further: with no other turn past it, no row past the backstop is estimated, whatever
    else the recording holds below it."""
    rng = random.Random(seed)
    base, cap = 100 * rng.choice([5, 10]), 4000
    s = Survival()
    for _ in range(rng.randint(1, 300)):
        s.add(rng.randint(1, base), rng.choice(["completed", "completed", "streak", "soft_stuck", "error"]))
    for _ in range(rng.randint(1, 40)):
        s.add(base + 1, "hard_backstop")
    est = estimate(s, base, base / 100, cap, "limits")
    assert est["finish_by"] and all(not f["estimable"] for f in est["finish_by"])
    assert {f["why"] for f in est["finish_by"] if f["calls"] <= cap} == {"no_turns"}
    seen = _planted((base + 1, "hard_backstop", 5), (base + 2, rng.choice(["completed", "hard_backstop"]), 1))
    assert all(f["estimable"] for f in estimate(seen, base, base / 100, cap, "limits")["finish_by"]
               if f["calls"] <= cap)


def test_the_report_says_not_estimable_when_live_halts_are_all_that_reached_the_backstop(tmp_path):
    limits = {"cap_mode": "adaptive", "soft_cap": 100, "hard_cap": 1000, "stuck_repeat_threshold": 6,
              "streak_warn_at": 5, "streak_stop_at": 8, "max_cycles": 0}
    probe = {**limits, "hard_cap": 2000}
    lines = [{"id": f"s{i}", "calls": [{"tool": "run", "args": {"i": j}, "outcome": "ok"} for j in range(20)],
              "cohort": "live", "limits": limits, "ended_by": "completed", "resolved": True} for i in range(25)]
    lines += [{"id": f"p{i}", "calls": [{"tool": "run", "args": {"i": j}, "outcome": "ok"} for j in range(30)],
               "cohort": "probe", "limits": probe, "ended_by": "completed", "resolved": True} for i in range(5)]
    lines += [{"id": f"h{i}", "calls": [{"tool": "run", "args": {"i": j}, "outcome": "ok"} for j in range(1001)],
               "cohort": "live", "limits": limits, "ended_by": "hard_backstop", "tool_calls": 1001}
              for i in range(10)]
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out, err = io.StringIO(), io.StringIO()
    assert cli.main([str(path), "--soft-caps", "100", "--multipliers", "10", "--no-peers"], stdout=out,
                    stderr=err) == 0, err.getvalue()
    text = " ".join(out.getvalue().split())
    for k, calls in ((15, "1,500"), (20, "2,000")):
        assert f"by {k}x ({calls} calls): not estimable: no turn was seen past the backstop." in text


@pytest.mark.parametrize("threshold", [t.value for t in tg.Threshold])
def test_a_turn_halted_by_any_built_in_threshold_is_censored_under_a_named_cause(threshold):
    """Every threshold's halt is a censoring of its own kind, said in words and kept through
    ``--json``; "otherwise" is for ends turnguard does not name (issue 34: ``cycle_repeat`` is
    reported like any threshold, not as an unknown end)."""
    s = Survival()
    s.add(16, threshold)
    s.add(40, "completed")
    [cause] = s.censored_by
    assert cause != "other"
    again = Survival.from_json(json.loads(json.dumps(s.to_json())))
    assert again.censored_by == {cause: 1}
    words = ended({"events": 1, "censored": 1, "censored_by": again.censored_by})
    assert words.startswith("1 finished, 1 censored (1 ") and "otherwise" not in words


@pytest.mark.parametrize("stop", [3, 8])
@pytest.mark.parametrize("names", ["ab", "abc"])
def test_recorded_cycle_repeat_halts_are_censored_by_the_cycle_repeat_stop(tmp_path, names, stop):
    """Turns the live guard halted at ``cycle_repeat``'s stop, recorded and read back by calibrate:
    censored by that stop in ``--json`` and in the report's words."""
    path = tmp_path / "turns.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(path), cycle_repeat_warn_at=0, cycle_repeat_stop_at=stop,
                                    load_entrypoints=False), environ={})
    for t in range(3):
        with guard.turn() as turn:
            for i in range(len(names) * (stop + 1)):
                call = tg.ToolCall(names[i % len(names)], {"t": t})
                if turn.check_call(call).action is tg.Action.HALT:
                    break
                turn.record_outcome(call, "ok")
            assert turn.halted is not None and turn.halted.threshold is tg.Threshold.CYCLE_REPEAT
    as_json, as_text = io.StringIO(), io.StringIO()
    assert cli.main([str(path), "--json", "-"], stdout=as_json) == 0
    assert json.loads(as_json.getvalue())["survival"]["censored_by"] == {"cycle_repeat": 3}
    assert cli.main([str(path)], stdout=as_text) == 0
    assert "censored (3 by the cycle_repeat stop)" in " ".join(as_text.getvalue().split())
