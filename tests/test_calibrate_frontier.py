"""The recommended value per threshold (``_calibrate/evidence.py``, its frontier): the rule on hand-made ladders,
then on two planted fleets whose right answer is known (``frontier_fleet``), in both directions."""

from __future__ import annotations

import io
import json
import random
import re

import pytest

import frontier_fleet as ff
from turnguard._calibrate import cli, survival
from turnguard._calibrate.evidence import (
    Ladder,
    Scale,
    Sided,
    frontier,
    ladders_from_json,
    turns_for_zero,
    upper_bound,
    zero_event_bound,
)
from turnguard._calibrate.stats import RunStats

TOLERANCE = 0.1
LIVE = {"backstop": 10, "stuck": 6, "streak": 8}
planted_result: dict[int, dict] = {}
"""The whole ``--json`` result of each planted run, by its probe part's id."""
SETTING = {"backstop": "hard_multiplier", "stuck": "stuck_repeat_threshold", "streak": "streak_stop_at"}


# -- the rule ----------------------------------------------------------------------------------------


def test_with_no_productive_turn_the_bound_is_the_exact_binomial_one():
    assert upper_bound(0, 40) == (0.0, pytest.approx(1 - 0.025 ** (1 / 40)))
    assert upper_bound(0, 40)[1] == pytest.approx(0.0881, abs=1e-4)  # about 3.7/N, not 3/N
    assert turns_for_zero(0.1) == 36 and upper_bound(0, 36)[1] < 0.1 <= upper_bound(0, 35)[1]


@pytest.mark.parametrize("n", [1, 3, 10, 40, 300])
def test_the_one_exact_zero_event_bound_misses_one_time_in_its_tail(n):
    """For any true share p, n turns with no event (probability (1-p)^n) put the bound under p at
    most as often as the bound's tail: 5% one-sided, 2.5% for a two-sided interval's upper end."""
    for sided in Sided:
        high = zero_event_bound(n, sided)
        misses = [(1 - p) ** n for p in (i / 1000 for i in range(1, 1000)) if high < p]
        assert max(misses) <= sided.value + 1e-12 and max(misses) > sided.value / 2
    assert zero_event_bound(0, Sided.ONE) == zero_event_bound(0, Sided.TWO) == 1.0


def test_the_frontier_is_two_sided_and_the_survival_estimate_one_sided():
    assert upper_bound(0, 40)[1] == zero_event_bound(40, Sided.TWO)
    assert survival.survival_interval(0.0, 0.0, 0, 40).high == zero_event_bound(40, Sided.ONE)
    assert zero_event_bound(40, Sided.ONE) == pytest.approx(3 / 40, rel=0.05)


def ladder(*turns: tuple[int, str, int]) -> Ladder:
    """Turns as ``(reach, fate, calls)``; a value ``v`` halts one after ``10 v`` calls."""
    out = Ladder()
    for reach, fate, calls in turns:
        out.add(reach, fate, [10 * v for v in range(1, reach + 1)], calls)
    return out


def runaways(n: int, reach: int = 40) -> list[tuple[int, str, int]]:
    return [(reach, "censored", 10 * reach)] * n


def test_the_smallest_value_within_the_tolerance_is_recommended_with_its_cost():
    turns = [(k, "resolved", 10 * k) for k in (12, 15, 20, 25)] + runaways(40)
    f = frontier("backstop", ladder(*turns), 10, TOLERANCE, Scale(44, 1000, 20_000), horizon=40)
    assert f.recommended == 26
    assert f.rungs[25].at_risk == f.rungs[25].censored == 40 and f.rungs[25].productive == 0
    assert f.rungs[25].extra_calls == 40 * (260 - 100)  # the runaways burn 26x instead of 10x
    assert f.rungs[25].extra_share == pytest.approx(40 * 160 / 44 / 20)
    assert f.sentence == ("set hard_multiplier = 26: it spares every productive turn the probe saw (0 of 40 past 26x, "
                          "40 of them halted at the probe's own limit; at most 8.8% at 95%, exact binomial; the "
                          "longest productive turn passed 25x) and lets turns that never resolve burn 727.3% more "
                          "calls.")


@pytest.mark.parametrize("censored", [0, 1, 17, 40])
def test_a_recommendation_says_how_many_of_its_turns_the_probes_own_limit_halted(censored):
    """Turns the probe halted at its own limit count as not productive at a value below it (what
    they would have done past it is unknown): the sentence and the row say how many there are."""
    ended = [(40, "unresolved", 400)] * (40 - censored)
    turns = [(k, "resolved", 10 * k) for k in (12, 15)] + runaways(censored) + ended
    f = frontier("backstop", ladder(*turns), 10, TOLERANCE, Scale(42, 1000, 20_000), horizon=40)
    row = next(r for r in f.to_json()["rows"] if r["value"] == f.recommended)
    assert (row["at_risk"], row["censored"]) == (40, censored)
    said = f"(0 of 40 past {f.recommended}x, {censored} of them halted at the probe's own limit;"
    assert (said in f.sentence) is ("halted at the probe's own limit" in f.sentence) is bool(censored)


def test_the_live_value_when_it_is_the_smallest_within_is_kept():
    turns = [(9, "resolved", 95)] * 20 + runaways(40)
    f = frontier("backstop", ladder(*turns), 10, TOLERANCE, Scale(60, 60, 6000), horizon=40)
    assert f.recommended == 10 and f.to_json()["keep"] is True
    assert f.sentence.startswith("keep hard_multiplier = 10: it spares every productive turn the probe saw (0 of 40")


def test_a_lower_value_within_the_tolerance_is_recommended_as_saving_calls():
    f = frontier("stuck", ladder(*runaways(50, 20)), 6, TOLERANCE, Scale(50, 50, 1000))
    assert f.recommended == 2 and "saves" in f.sentence and f.rungs[1].extra_calls == 50 * (20 - 60)


def test_too_few_turns_at_risk_say_how_many_would_decide_not_raise_the_cap():
    turns = [(12, "resolved", 120)] * 5 + runaways(10)
    f = frontier("backstop", ladder(*turns), 10, TOLERANCE, Scale(15, 15, 1500), horizon=40)
    assert f.recommended is None
    assert "0 of 10" in f.sentence and "about 36 turns at risk" in f.sentence and "let the probe run" in f.sentence
    assert "raise the probe" not in f.sentence


def test_productive_turns_up_to_the_probes_cap_ask_to_raise_it():
    turns = [(39, "resolved", 395)] * 10 + runaways(40)
    f = frontier("backstop", ladder(*turns), 10, TOLERANCE, Scale(50, 50, 5000), horizon=40)
    assert f.recommended is None and "raise the probe's own limit to see past 40x" in f.sentence
    assert f.rungs[39].decision == "past_cap"


def test_ladders_merge_exactly_and_round_trip_through_json():
    a, b = ladder((3, "resolved", 30), (5, "censored", 50)), ladder((5, "unresolved", 55), (1, "unknown", 12))
    whole = ladder((3, "resolved", 30), (5, "censored", 50), (5, "unresolved", 55), (1, "unknown", 12))
    a.merge(b)
    assert a == whole
    assert ladders_from_json({"stuck": json.loads(json.dumps(a.to_json()))})["stuck"] == whole
    with pytest.raises(ValueError, match="ladder value"):
        Ladder.from_json({"resolved": {"0": 1}})


# -- the planted fleets --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[ff.KEEP, ff.RAISE], ids=lambda d: d.name)
def planted(request, tmp_path_factory) -> tuple[ff.Design, list[ff.Planted], dict, str, str]:
    folder = tmp_path_factory.mktemp(request.param.name)
    turns = ff.run(folder / "turns.jsonl", request.param)
    args = [str(folder / "turns.jsonl"), "--config", str(ff.config_file(folder)), "--soft-caps", str(ff.S),
            "--multipliers", "10", "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers", "--explicit-caps", "100",
            "--key-modes", "canonical"]
    out = [io.StringIO() for _ in range(3)]
    html = folder / "report.html"
    assert cli.main([*args, "--json", "-"], stdout=out[0], stderr=out[2]) == 0, out[2].getvalue()
    assert cli.main([*args, "--html", str(html), "--wide"], stdout=out[1], stderr=out[2]) == 0
    result = json.loads(out[0].getvalue())
    planted_result[id(result["probe"])] = result
    return request.param, turns, result["probe"], out[1].getvalue(), html.read_text()


@pytest.mark.parametrize("threshold", sorted(LIVE))
def test_each_recommended_value_is_within_the_truths_range(planted, threshold):
    """Between the truth's smallest safe value and the smallest value the probe's turns put within
    the tolerance, and the live value exactly where it is right."""
    design, turns, probe, _, _ = planted
    got = probe["frontier"][threshold]
    safe, within = ff.truth_safe(turns, threshold, TOLERANCE), ff.smallest_within(turns, threshold, TOLERANCE)
    assert safe is not None and within is not None
    assert safe <= got["recommended"] == within, (threshold, safe, got["recommended"], within)
    if design.right:
        assert got["recommended"] == LIVE[threshold] and got["keep"] is True
    else:
        assert got["recommended"] > LIVE[threshold] and got["keep"] is False


@pytest.mark.parametrize("threshold", sorted(LIVE))
def test_the_sentence_says_keep_or_set_with_the_bound_and_the_cost(planted, threshold):
    design, turns, probe, text, _ = planted
    got = probe["frontier"][threshold]
    v = got["recommended"]
    row = next(r for r in got["rows"] if r["value"] == v)
    at_risk = sum(t.seen[threshold] >= v for t in turns)
    assert row["at_risk"] == at_risk and row["productive"] == 0
    assert row["interval"][1] == pytest.approx(1 - 0.025 ** (1 / at_risk), abs=1e-6)
    bound = f"0 of {at_risk}"
    verb = "keep" if design.right else "set"
    assert got["sentence"].startswith(f"{verb} {SETTING[threshold]} = {v}: it spares every productive turn the probe "
                                      f"saw ({bound}")
    assert f"at most {1 - 0.025 ** (1 / at_risk):.1%} at 95%, exact binomial" in got["sentence"]
    assert (" more calls" in got["sentence"]) is (not design.right)
    assert f"Recommended: {got['sentence']}" in probe["recommendation"]
    assert " ".join(f"Recommended: {got['sentence']}".split()) in " ".join(text.split())


def test_the_cost_is_the_calls_never_resolving_turns_burn_past_the_live_value(planted):
    """Backstop: ``min(calls, v S) - min(calls, 10 S)`` over the turns that never resolve, and as a
    share of the fleet's calls at the probe's per-turn rate."""
    _, turns, probe, _, _ = planted
    got = probe["frontier"]["backstop"]
    v = got["recommended"]
    want = sum(min(t.calls, v * ff.S) - min(t.calls, 10 * ff.S) for t in turns if not t.work.productive)
    row = next(r for r in got["rows"] if r["value"] == v)
    assert row["extra_calls"] == want
    result = planted_result[id(probe)]
    calls = result["calls"]  # the calls made, and the one each halt refused
    assert result["turns"] == len(turns) and 0 <= calls - sum(t.calls for t in turns) <= len(turns)
    assert row["extra_share"] == pytest.approx(want / len(turns) / (calls / len(turns)), abs=1e-6)


def test_the_backstop_advice_stops_asking_to_raise_the_probes_cap_once_within(planted):
    design, _, probe, _, _ = planted
    backstop = probe["recommendation"][0]
    assert "raise the probe's cap" not in backstop
    if not design.right:
        assert "set hard_multiplier = 22 (below)" in backstop


def test_the_reports_show_the_frontier_table(planted):
    design, _, probe, text, html = planted
    assert "Recommended values" in text and ("(keep)" if design.right else "(set)") in text
    assert "<table id='probe-frontier'>" in html and ("(keep)" if design.right else "(set)") in html
    rows = probe["frontier"]["backstop"]["rows"]
    assert [r["value"] for r in rows] == sorted(r["value"] for r in rows)
    assert all(set(r) == {"value", "at_risk", "productive", "unknown", "censored", "cut", "interval", "extra_calls",
                          "extra_share", "decision"} for r in rows)
    assert all(r["decision"] == "past_cap" for r in rows if r["value"] >= 40)


def test_a_result_read_back_recommends_the_same(planted):
    """The ladders are counters in ``--json``: a result read back (as ``calibrate merge`` reads its
    inputs) recommends the same, with the same rows."""
    _, _, probe, _, _ = planted
    again = RunStats.from_json(planted_result[id(probe)]).probe_json()
    assert again["frontier"] == probe["frontier"] and again["ladders"] == probe["ladders"]


# -- the soft cap and the cycle cap: probed where the probe runs past them, said plainly where not ----------


def test_thresholds_the_probe_does_not_run_past_are_said_not_probed(planted):
    """The main fleets' probe keeps the soft cap and has no cycle cap, and the live cap is adaptive:
    each of the three says why no value can be recommended, in the JSON, the table and the HTML."""
    _, _, probe, text, html = planted
    why = {"soft": "the probe's soft cap, 20, is not above the live 20",
           "cycles": "the live cycle cap is unbounded (0)", "explicit": "the live cap is adaptive"}
    for threshold, reason in why.items():
        got = probe["frontier"][threshold]
        assert got["probed"] is False and got["recommended"] is None and got["rows"] == []
        assert got["sentence"].startswith(f"{got['setting']}: not probed ({reason}")
        assert got["sentence"].endswith("): no value can be recommended.")
        assert got["sentence"] in probe["recommendation"]
    assert all(probe["frontier"][t]["probed"] for t in LIVE)
    flat = " ".join(text.split())
    for label in ("soft cap 20 (live)", "cycle cap 0 (live)", "explicit cap - (live)"):
        assert f"{label} - - - not probed" in flat
    assert html.count("<td>not probed</td>") == 3


PROBED = {"soft": {"live": ff.S, "probe": ff.SOFT_PROBE},
          "explicit": {"live": ff.EXPLICIT_LIVE, "probe": ff.EXPLICIT_PROBE},
          "cycles": dict(zip(("live", "probe", "per_request"), ff.cycled(), strict=True))}


@pytest.fixture(scope="module", params=[(d, t) for t in PROBED for d in (ff.KEEP, ff.RAISE)],
                ids=lambda p: f"{p[1]}-{p[0].name}")
def probed(request, tmp_path_factory) -> tuple[ff.Design, str, list[ff.Planted], dict, str, str]:
    design, threshold = request.param
    folder = tmp_path_factory.mktemp(f"{threshold}-{design.name}")
    given = PROBED[threshold]
    live = given["live"] if isinstance(given["live"], dict) else None
    turns = ff.run(folder / "turns.jsonl", design, live=live, probe=given["probe"],
                   per_request=given.get("per_request"))
    args = [str(folder / "turns.jsonl"), "--config", str(ff.config_file(folder, live, given["probe"])),
            "--soft-caps", str(ff.S), "--multipliers", "10", "--stuck-repeats", "6", "--streaks", "5:8", "--no-peers",
            "--explicit-caps", "100", "--key-modes", "canonical"]
    out, err = io.StringIO(), io.StringIO()
    html = folder / "report.html"
    assert cli.main([*args, "--json", "-"], stdout=out, stderr=err) == 0, err.getvalue()
    text = io.StringIO()
    assert cli.main([*args, "--html", str(html), "--wide"], stdout=text, stderr=err) == 0
    return design, threshold, turns, json.loads(out.getvalue())["probe"], text.getvalue(), html.read_text()


LIVE_VALUE = {"soft": ff.S, "cycles": ff.CYCLE_LIVE, "explicit": ff.EXPLICIT}
SETTING.update(soft="soft_cap", cycles="max_cycles_per_turn", explicit="max_tool_calls_per_turn")
HORIZON = {"soft": 3 * ff.S, "cycles": ff.CYCLE_PROBE, "explicit": 4 * ff.EXPLICIT}


def test_the_soft_and_cycle_caps_recommended_are_within_the_truths_range(probed):
    """Where the probe raises the soft cap (to 3 S) or has a higher cycle cap, the recommended value
    lies between the truth's smallest safe value and the smallest the probe's turns put within the
    tolerance; "keep" exactly where the live value is right."""
    design, threshold, turns, probe, _, _ = probed
    got = probe["frontier"][threshold]
    safe, within = ff.truth_safe(turns, threshold, TOLERANCE), ff.smallest_within(turns, threshold, TOLERANCE)
    assert got["probed"] is True and safe is not None and within is not None
    assert safe <= got["recommended"] == within, (threshold, safe, got["recommended"], within)
    assert got["keep"] is design.right and (got["recommended"] == LIVE_VALUE[threshold]) is design.right
    assert got["horizon"] == HORIZON[threshold]
    assert all(r["value"] % ff.UNITS.get(threshold, 1) == 0 for r in got["rows"])
    assert all(r["decision"] == "past_cap" for r in got["rows"] if r["value"] >= got["horizon"])


def test_the_soft_and_cycle_cap_sentences_and_tables(probed):
    design, threshold, turns, probe, text, html = probed
    got = probe["frontier"][threshold]
    v = got["recommended"]
    at_risk = sum(t.seen[threshold] >= v for t in turns)
    row = next(r for r in got["rows"] if r["value"] == v)
    assert row["at_risk"] == at_risk and row["productive"] == 0
    verb = "keep" if design.right else "set"
    assert got["sentence"].startswith(f"{verb} {SETTING[threshold]} = {v}: it spares every productive turn the "
                                      f"probe saw (0 of {at_risk}")
    assert f"at most {1 - 0.025 ** (1 / at_risk):.1%} at 95%, exact binomial" in got["sentence"]
    assert f"Recommended: {got['sentence']}" in probe["recommendation"]
    label = {"soft": "soft cap", "cycles": "cycle cap", "explicit": "explicit cap"}[threshold]
    mark = "(keep)" if design.right else "(set)"
    assert f"{label} {v} {mark}" in " ".join(text.split())
    assert f"<td class='l'>{v} {mark}</td>" in html


@pytest.mark.parametrize("probed", [(d, "cycles") for d in (ff.KEEP, ff.RAISE)], indirect=True,
                         ids=lambda p: f"{p[1]}-{p[0].name}")
def test_a_cycle_cap_costs_the_requests_never_resolving_turns_make_past_the_live_one(probed):
    """The runaways' calls between the live cap's requests and the recommended one's; the recorder
    gives a turn's request total, not where each began, so calibrate spreads the calls evenly over
    the requests (a runaway refused its 101st request after 500 calls: 4.95 a request, not 5)."""
    design, _, turns, probe, _, _ = probed
    got = probe["frontier"]["cycles"]
    v, per = got["recommended"], ff.PER_REQUEST
    row = next(r for r in got["rows"] if r["value"] == v)
    want = sum(min(t.calls, v * per) - min(t.calls, ff.CYCLE_LIVE * per) for t in turns if not t.work.productive)
    assert row["extra_calls"] == pytest.approx(want, rel=0.02)
    assert (row["extra_calls"] > 0) is (not design.right)


@pytest.mark.parametrize("probed", [(d, "explicit") for d in (ff.KEEP, ff.RAISE)], indirect=True,
                         ids=lambda p: f"{p[1]}-{p[0].name}")
def test_under_an_explicit_cap_the_streak_stop_is_still_recommended_and_the_cycle_cap_said_not_probed(probed):
    design, _, turns, probe, _, _ = probed
    assert set(probe["frontier"]) == {"explicit", "streak", "cycles"}
    streak = probe["frontier"]["streak"]
    assert streak["recommended"] == ff.smallest_within(turns, "streak", TOLERANCE) and streak["keep"] is design.right
    assert probe["frontier"]["cycles"]["probed"] is False
    assert "the live cycle cap is unbounded (0)" in probe["frontier"]["cycles"]["sentence"]


def test_turns_only_the_ladders_bottom_would_halt_recommend_nothing_and_contradict_nothing():
    """40 probe turns that never repeated a call: only D = 1 would halt them, and D = 1 is never
    recommended, so nothing is (the sentence used to quote D = 1's bound, under the tolerance, as
    too few turns at risk), and its row is not shown."""
    f = frontier("stuck", ladder(*[(1, "unresolved", 30)] * 40), 6, TOLERANCE, Scale(40, 400, 8000))
    assert f.recommended is None
    assert f.sentence == ("stuck_repeat_threshold: no probe turn with a known fate would be halted by any value of "
                          "it: nothing to recommend yet.")
    assert [r["value"] for r in f.to_json()["rows"]] == [6] and 1 not in [r.value for r in f.shown()]


@pytest.mark.parametrize("seed", range(40))
def test_the_sentence_never_contradicts_the_rung_it_quotes(seed):
    """Random ladders: a value is recommended exactly when some value above one unit is within the
    tolerance; when none is, the rung the sentence quotes is above one unit and not within, and
    "let the probe run" is said only with fewer turns at risk than would decide."""
    rng = random.Random(seed)
    threshold = rng.choice(["backstop", "stuck", "streak"])
    live = LIVE[threshold]
    turns = [(rng.randint(1, 30), rng.choice(["resolved", "unresolved", "censored", "unknown"]), rng.randint(1, 400))
             for _ in range(rng.randint(0, 120))]
    f = frontier(threshold, ladder(*turns), live, TOLERANCE, Scale(len(turns) or 1, 500, 50_000),
                 horizon=40 if threshold == "backstop" else None)
    within = [r.value for r in f.rungs if r.decision == "within" and r.value > 1]
    assert f.recommended == (within[0] if within else None)
    assert all(r["value"] > 1 or r["value"] == live for r in f.to_json()["rows"])
    quoted = re.search(r"\(.*?(\d[\d,]*) of (\d[\d,]*)[^)]*at most ([\d.]+)%", f.sentence)
    if f.recommended is None and "let the probe run" in f.sentence:
        assert quoted is not None
        at_risk, high = int(quoted.group(2).replace(",", "")), float(quoted.group(3)) / 100
        assert at_risk < turns_for_zero(TOLERANCE) and high >= TOLERANCE
