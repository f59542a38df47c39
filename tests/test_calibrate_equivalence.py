"""Grouping policies (``equivalence.signature``), skipping quiet turns and key modes, and starting
checks late from a shared prefix must not change any figure: a grouped run and a run that replays
every policy on every turn from the first call agree exactly."""

from __future__ import annotations

import dataclasses
import random

import pytest

import turnguard as tg
from alternating_turns import alternating_turn
from synthetic import SMALL, records
from turnguard._calibrate.corpus import corpus_turn
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.equivalence import signature, turn_facts
from turnguard._calibrate.grid import GridSpec, Policy, build_grid
from turnguard._calibrate.records import UNFINISHED
from turnguard._calibrate.replay import cycle_starts
from turnguard._keys import identity_bytes, is_json_text


def turns(count: int, seed: int) -> list:
    problems: list = []
    out = [corpus_turn(r, "gen", i, problems.append) for i, r in enumerate(records(count, seed=seed, mix=SMALL))]
    assert not problems
    return out


def figures(policies: list[Policy], sample: list, *, group: bool) -> dict:
    cal = Calibrator(policies, group=group)
    data = cal.add_all(sample).to_json()
    data.pop("replays")
    return data


GRIDS = {
    "axes": GridSpec(soft_caps=(5, 20, 50), stuck_repeats=(2, 3, 6), streaks=((2, 3), (3, 5), (5, 8), (5, 0), (0, 4)),
                     explicit_caps=(10, 40), cycle_caps=(0, 10)),
    "cross": GridSpec(soft_caps=(5, 20), multipliers=(2, 10), stuck_repeats=(2, 6), streaks=((2, 3), (5, 8)),
                      explicit_caps=(15,), cycle_caps=(0, 10), cross=True),
}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_grouped_run_equals_replaying_every_policy_on_every_turn(grid: str) -> None:
    policies = build_grid(GRIDS[grid])
    sample = turns(90, seed=11)
    grouped = Calibrator(policies, group=True)
    grouped.add_all(sample)
    assert grouped.stats.replays < len(policies) * 2 * len(sample) / 4, "grouping should save most replays"
    data = grouped.stats.to_json()
    data.pop("replays")
    assert data == figures(policies, sample, group=False)
    assert sum(p["unattended"]["halted"] > 0 for p in data["policies"]) > len(policies) // 2


def test_grouped_run_equals_replaying_every_policy_with_cycle_repeat_rows() -> None:
    """``cycle_repeat``'s rows (other levels, periods, attended warnings, reminders) group, skip
    and fork from shared prefixes without changing a figure, on turns full of alternating loops."""
    spec = GridSpec(soft_caps=(8, 100), multipliers=(3,), stuck_repeats=(4,), streaks=((3, 5), (5, 8)),
                    explicit_caps=(20,), cycle_repeats=((2, 3), (3, 5), (5, 8), (0, 4), (0, 0)), peers=False,
                    stop_on=("error",), key_modes=("canonical", "bytes"))
    base = spec.base
    policies = [*build_grid(spec),
                Policy("period 3", base.replace(cycle_repeat_warn_at=3, cycle_repeat_stop_at=5,
                                                cycle_repeat_max_period=3)),
                Policy("reminding", base.replace(cycle_repeat_warn_at=3, cycle_repeat_stop_at=5, remind_model=True)),
                Policy("stateful", base.replace(cycle_repeat_warn_at=3, cycle_repeat_stop_at=5,
                                                stateful_tools=("read",)))]
    rng = random.Random(4)
    sample = [*(alternating_turn(rng, n) for n in range(120)), *turns(40, seed=2)]
    grouped = Calibrator(policies, group=True)
    grouped.add_all(sample)
    data = grouped.stats.to_json()
    data.pop("replays")
    assert data == figures(policies, sample, group=False)
    halted = {p["name"]: p["unattended"]["by_threshold"].get("cycle_repeat", 0) for p in data["policies"]}
    assert halted["cycle repeat 2/3"] > halted["cycle repeat 5/8"] > 0 and halted["default"] == 0


def test_signature_none_means_the_policy_cannot_fire() -> None:
    policy = Policy("x", tg.GuardConfig(soft_cap=10, hard_multiplier=2, stuck_repeat_threshold=4))
    cal = Calibrator([policy], group=False)
    quiet = 0
    for turn in turns(150, seed=3):
        digests = cal.keys(turn, cal.keyers["canonical"])
        facts = turn_facts(digests, [c.outcome for c in turn.calls], cycle_starts(turn))
        results = cal.results(turn)[0]
        for mode, promptable in (("unattended", False), ("attended", True)):
            if signature(policy, facts, promptable) is None:
                quiet += 1
                assert not results[mode].halted and not results[mode].asks
    assert quiet, "no turn had a None signature: the test would check nothing"


def test_byte_identity_never_counts_more_than_canonical_identity() -> None:
    """The rule that lets a run skip the ``bytes`` keys of turns quiet under ``canonical``."""
    cal = Calibrator(build_grid(GridSpec()))
    for turn in [*turns(200, seed=5), _respaced_turn()]:
        outcomes = [c.outcome for c in turn.calls]
        starts = cycle_starts(turn)
        canonical = turn_facts(cal.keys(turn, cal.keyers["canonical"]), outcomes, starts)
        exact = turn_facts(cal.keys(turn, cal.keyers["bytes"]), outcomes, starts)
        assert exact.max_repeat <= canonical.max_repeat
        assert exact.max_run <= canonical.max_run
        assert exact.max_failing <= canonical.max_failing


def _respaced_turn():
    rng = random.Random(1)
    calls = [{"tool": "read", "args": rng.choice(['{"a":1,"b":2}', '{"b": 2, "a": 1}']), "outcome": "error"}
             for _ in range(12)]
    return corpus_turn({"id": "respaced", "calls": calls}, "t", 1, print)


def _respaced_loops(count: int, seed: int) -> list:
    """Short turns over a few calls, one of them written two ways: one key under ``canonical``, two
    as bytes. Under bytes the respaced call is news to ``stale_repeat``; when it comes round, the
    loop's credit can take that count past the canonical one (it is not monotone, unlike repeats)."""
    rng = random.Random(seed)
    pool = [("read", '{"a":1}'), ("read", '{"a": 1}'), ("grep", "grep x\n"), ("edit", "e")]
    out = []
    for n in range(count):
        calls = [{"tool": t, "args": a, "outcome": rng.choice(["ok", "error"])}
                 for t, a in (rng.choice(pool) for _ in range(rng.randint(3, 12)))]
        out.append(corpus_turn({"id": f"loop-{n}", "calls": calls, "cycles": len(calls)}, "t", n, print))
    return out


def test_grouping_is_exact_for_stale_repeat_under_both_key_modes() -> None:
    """The exact ``stale_repeat`` reach is read per keying, never carried to a finer identity."""
    policies = [Policy(f"{mode} D={d}", tg.GuardConfig(soft_cap=2, hard_multiplier=5, stuck_repeat_threshold=d,
                                                       stuck_signal="stale_repeat", key_mode=mode,
                                                       streak_warn_at=0, streak_stop_at=0))
                for mode, d in (("canonical", 2), ("canonical", 3), ("bytes", 3))]
    # Canonical: the stale count reaches 2; bytes: '{"a":1}' is news at call 5, and when it comes
    # round the loop's credit takes the count to 3 at call 8 (found by search; kept as a fixture).
    calls = [("read", '{"a": 1}'), ("grep", "x"), ("read", '{"a": 1}'), ("edit", "y"), ("read", '{"a":1}'),
             ("read", '{"a":1}'), ("grep", "x"), ("grep", "x")]
    credited = corpus_turn({"id": "credited", "calls": [{"tool": t, "args": a, "outcome": "ok"} for t, a in calls],
                            "cycles": len(calls)}, "t", 0, print)
    sample = [credited, *_respaced_loops(300, seed=8)]
    data = Calibrator(policies, group=True).add_all(sample).to_json()
    data.pop("replays")
    assert data == figures(policies, sample, group=False)
    assert all(p["unattended"]["by_threshold"].get("soft_stuck", 0) > 0 for p in data["policies"])


TEXTS = ["make test", "grep -n x src\n", "true", "true\n", " true", "true\x0c", "\xa0null", "nullish", "5", "5\n",
         "5x", "-", "-1", '"quoted"', "quoted", '{"a": 1}', '{"a":1}', "{not json", "[1, 2]", "[1,2]", "\x02t3:abc",
         "", " ", "\t\n", "fals", "false ", "ls -la", "échec"]


def test_text_that_is_not_json_is_told_apart_alike_by_both_key_modes() -> None:
    """The rule that keys a turn of such text once for both modes (``keys.is_json_text``)."""
    plain = [t for t in TEXTS if not is_json_text(t)]
    assert {"make test", "true\x0c", "\xa0null", "{not json", "quoted"} <= set(plain)
    assert not {"true\n", " true", "5\n", '{"a": 1}', '"quoted"'} & set(plain)
    for a in plain:
        for b in plain:
            same_canonical = identity_bytes("t", a, "canonical") == identity_bytes("t", b, "canonical")
            assert same_canonical == (identity_bytes("t", a, "bytes") == identity_bytes("t", b, "bytes")), (a, b)
    # JSON text is why the rule stops there: canonical mode reads the value, bytes mode the text.
    assert identity_bytes("t", '{"a": 1}') == identity_bytes("t", '{"a":1}')
    assert identity_bytes("t", '{"a": 1}', "bytes") != identity_bytes("t", '{"a":1}', "bytes")


def turns_with_results(count: int, seed: int) -> list:
    """The generated turns with a result digest on every call: runs of one result, then another
    (progress), a few without one."""
    rng = random.Random(seed)
    problems: list = []
    out = []
    for i, record in enumerate(records(count, seed=seed, mix=SMALL)):
        result = "r0"
        for call in record["calls"]:
            if rng.random() < 0.25:
                result = rng.choice(("r0", "r1", "r2", None))
            call["result"] = result
        out.append(corpus_turn(record, "gen", i, problems.append))
    assert not problems and any(c.result for t in out for c in t.calls)
    return out


def test_grouped_run_equals_replaying_every_policy_with_stateful_tools() -> None:
    """Policies naming tools replay alone where their counts by call let them fire; elsewhere
    they are skipped: the figures are those of replaying every one on every turn."""
    spec = GridSpec(soft_caps=(5, 20), multipliers=(10,), stuck_repeats=(2, 4), streaks=((2, 3), (5, 8)),
                    explicit_caps=(15,), stuck_signals=("repeat", "stale_repeat"), stop_on=("any",),
                    key_modes=("canonical",), stateful_tools=((), ("read_file", "mvn"), ("*",)), peers=False,
                    cross=True)
    policies = [*build_grid(spec), Policy("exempt", tg.GuardConfig(streak_exempt_tools=("mvn",), soft_cap=5))]
    assert sum(bool(p.config.stateful_tools) for p in policies) > len(policies) // 2
    sample = turns_with_results(50, seed=5)
    grouped = Calibrator(policies, group=True)
    grouped.add_all(sample)
    data = grouped.stats.to_json()
    data.pop("replays")
    assert data == figures(policies, sample, group=False)
    by_name = {p["name"]: p["unattended"]["halted"] for p in data["policies"]}
    assert any(by_name[p.name] != by_name[p.name.replace(" stateful *", "")]
               for p in policies if p.name.endswith("stateful *")), "results never changed a figure"


def test_the_cap_says_the_same_in_both_modes_so_one_plan_serves_both() -> None:
    """``engine._groups`` plans a policy once for both modes where its other rules say the same in
    both: that holds only while the cap's firing ignores ``promptable``, and the shortcut must give
    the groups and members that planning each mode on its own gives."""
    policies = build_grid(GRIDS["axes"]) + build_grid(GRIDS["cross"])
    cal = Calibrator(policies)
    checked = 0
    for turn in turns(120, seed=5):
        keyed = cal._keyed(turn, [c.outcome for c in turn.calls], cycle_starts(turn))
        for rules in cal.rules:
            for _, f in keyed.values():
                assert rules.cap.firing(f, True) == rules.cap.firing(f, False)
        groups, members = cal._groups(keyed)
        expected = []
        for idx, (cp, rules) in enumerate(zip(cal.compiled, cal.rules, strict=True)):
            if cp.config.key_mode not in keyed:
                continue  # quiet under a coarser identity
            keys, f = keyed[cp.config.key_mode]
            for mode, promptable in (("unattended", False), ("attended", True)):
                plan = None if rules.triggers[promptable].quiet(f) else rules.plan(f, promptable)
                if plan is not None:
                    key = (id(keys), *plan.signature[1:])
                    expected.append((idx, mode, key))
                    g = groups[key]
                    assert (g.first_call, g.cap_call) == (plan.first_call, plan.cap_call)
                    checked += promptable
        assert members == expected
    assert checked > 100, "too few attended plans: the test would check little"


def with_lost_outcomes(sample: list, seed: int, share: float = 0.08) -> list:
    """``sample`` with a share of its calls ``UNFINISHED`` (their turn ended before their outcome:
    the live guard waited for them), singly and in runs."""
    rng = random.Random(seed)
    out = []
    for turn in sample:
        calls = list(turn.calls)
        i = 0
        while i < len(calls):
            if rng.random() < share:
                for j in range(i, min(len(calls), i + rng.choice((1, 1, 2, 5)))):
                    calls[j] = calls[j]._replace(outcome=UNFINISHED)
                i = j
            i += 1
        out.append(dataclasses.replace(turn, calls=tuple(calls)))
    assert any(c.outcome is UNFINISHED for t in out for c in t.calls)
    return out


LOST_OUTCOME_GRIDS = {
    **GRIDS,
    "stop on any, stale, stateful": GridSpec(
        soft_caps=(5, 20), multipliers=(10,), stuck_repeats=(2, 4), streaks=((2, 3), (5, 8)), explicit_caps=(15,),
        stuck_signals=("repeat", "stale_repeat"), stop_on=("any", "error"), key_modes=("canonical",),
        stateful_tools=((), ("read_file", "mvn")), peers=False, cross=True),
    "cycle repeat": GridSpec(soft_caps=(8, 100), multipliers=(3,), stuck_repeats=(4,), streaks=((3, 5), (5, 8)),
                             explicit_caps=(20,), cycle_repeats=((2, 3), (3, 5), (0, 4)), peers=False,
                             stop_on=("error",), key_modes=("canonical",)),
}


@pytest.mark.parametrize("grid", list(LOST_OUTCOME_GRIDS))
def test_grouped_run_equals_replaying_every_policy_on_turns_with_lost_outcomes(grid: str) -> None:
    """A call whose outcome never came stays waiting in every replay, as in the live turn: the
    shortcuts (skipped policies, shared prefixes, late starts) must not change a figure there."""
    policies = build_grid(LOST_OUTCOME_GRIDS[grid])
    rng = random.Random(8)
    sample = with_lost_outcomes([*turns_with_results(60, seed=9), *(alternating_turn(rng, n) for n in range(40))],
                                seed=3)
    grouped = Calibrator(policies, group=True)
    grouped.add_all(sample)
    data = grouped.stats.to_json()
    data.pop("replays")
    assert data == figures(policies, sample, group=False)
    assert sum(p["unattended"]["halted"] > 0 for p in data["policies"]) > len(policies) // 2
