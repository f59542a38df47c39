"""The policy grid: the seeds' values, the multipliers, the peers' rules, flags parsed strictly."""

from __future__ import annotations

import itertools

import pytest

import turnguard as tg
from turnguard._calibrate.grid import (
    GridSpec,
    IdenticalCallsRule,
    build_grid,
    parse_floats,
    parse_ints,
    parse_key_modes,
    parse_streaks,
)


def test_default_grid_holds_the_seeds_values_the_multipliers_and_the_peers() -> None:
    policies = build_grid(GridSpec())
    default = policies[0]
    assert default.is_default and default.name == "default"
    c = default.config
    assert (c.soft_cap, c.hard_multiplier, c.stuck_repeat_threshold, c.streak_warn_at, c.streak_stop_at) == (
        100, 10, 6, 5, 8)
    assert c.max_tool_calls_per_turn is None and c.key_mode == "canonical"
    assert sum(p.is_default for p in policies) == 1
    adaptive = [p.config for p in policies if p.config.cap_mode == "adaptive" and p.family == "turnguard"]
    assert {m for m in (cfg.hard_multiplier for cfg in adaptive)} >= {2, 3, 5, 10, 20}
    assert any(p.config.key_mode == "bytes" for p in policies)  # the second seed's byte identity
    assert {p.config.stuck_signal for p in policies} == set(tg.STUCK_SIGNALS)  # signals are compared
    assert any(p.config.streak_stop_on == "any" for p in policies)
    peers = {p.name: p for p in policies if p.family == "peer"}
    cap = peers["peer: explicit cap 100 only"].config
    assert (cap.max_tool_calls_per_turn, cap.streak_warn_at, cap.streak_stop_at) == (100, 0, 0)
    identical = peers["peer: halt at 5 identical calls"]
    assert identical.extras == (IdenticalCallsRule(5),) and identical.config.cap_mode == "disabled"
    assert len({(p.config, p.extras) for p in policies}) == len(policies), "no duplicate policies"


def test_cross_grid_is_the_full_product_and_keeps_every_policy_valid() -> None:
    spec = GridSpec(soft_caps=(10, 100), multipliers=(2, 10), stuck_repeats=(6,), streaks=((5, 8), (3, 5)),
                    explicit_caps=(50,), cycle_caps=(0,), key_modes=("canonical", "bytes"), stuck_signals=("repeat",),
                    stop_on=("error",), cycle_repeats=(), peers=False, cross=True)
    policies = build_grid(spec)
    assert len(policies) == 2 * 2 * 2 * 2 + 2 * 2  # adaptive product + explicit x streaks x keys
    axes = {(c.soft_cap, c.hard_multiplier, (c.streak_warn_at, c.streak_stop_at), c.key_mode)
            for c in (p.config for p in policies) if c.cap_mode == "adaptive"}
    assert axes == set(itertools.product(spec.soft_caps, spec.multipliers, spec.streaks, spec.key_modes))
    assert len({p.name for p in policies}) == len(policies)


@pytest.mark.parametrize("cross", [False, True], ids=["axes", "cross"])
def test_cycle_repeat_has_a_row_per_stop_value_around_the_default(cross: bool) -> None:
    spec = GridSpec(soft_caps=(100,), multipliers=(10,), stuck_repeats=(6,), streaks=((5, 8),), explicit_caps=(),
                    key_modes=("canonical",), stuck_signals=("repeat",), stop_on=("error",), peers=False, cross=cross)
    policies = build_grid(spec)
    rows = {(p.config.cycle_repeat_warn_at, p.config.cycle_repeat_stop_at): p for p in policies}
    assert set(rows) == {(5, 6), (5, 8), (5, 10), (0, 0)}
    assert rows[(0, 0)].is_default
    assert rows[(5, 8)].name == "cycle repeat 5/8" and rows[(5, 8)].describe()["cycle_repeat"] == "5/8"
    assert {p.config.replace(cycle_repeat_warn_at=0, cycle_repeat_stop_at=0) for p in policies} == {
        policies[0].config}, "cycle_repeat varies alone"
    assert len(policies) <= spec.size


def test_a_base_configuration_moves_the_default() -> None:
    policies = build_grid(GridSpec(base=tg.GuardConfig(soft_cap=200), soft_caps=(50,), multipliers=(10,),
                                   stuck_repeats=(6,)))
    assert policies[0].config.soft_cap == 200 and policies[0].is_default
    assert policies[0].config.recorder_path is None and not policies[0].config.load_entrypoints


@pytest.mark.parametrize(
    ("parse", "text"),
    [(parse_ints, "1,x"), (parse_ints, ""), (parse_ints, "-3"), (parse_floats, "0.5"), (parse_floats, "nan"),
     (parse_streaks, "8:5"), (parse_streaks, "a:b"), (parse_streaks, "-1:2"), (parse_key_modes, "canonical,sha")],
)
def test_bad_flag_values_are_refused_with_what_is_accepted(parse, text: str) -> None:
    with pytest.raises(ValueError, match=r"expected|must be"):
        parse(text)


def test_flag_values_parse() -> None:
    assert parse_ints("50, 100,200") == (50, 100, 200)
    assert parse_floats("2,2.5") == (2, 2.5)
    assert parse_streaks("5:8,3,0:0") == ((5, 8), (3, 0), (0, 0))
    assert parse_key_modes("bytes") == ("bytes",)


def test_stateful_tools_lists_parse_and_each_is_a_row_of_its_own():
    from turnguard._calibrate.grid import GridSpec, build_grid, parse_tool_sets

    assert parse_tool_sets("none; ci_status,job_status ;*;none") == ((), ("ci_status", "job_status"), ("*",))
    for bad in ("", ";", "a;;b", " , "):
        with pytest.raises(ValueError, match="'none' for no tool"):
            parse_tool_sets(bad)
    spec = GridSpec(soft_caps=(100,), multipliers=(10,), stuck_repeats=(6,), streaks=(), explicit_caps=(),
                    cycle_caps=(), cycle_repeats=(), stuck_signals=(), stop_on=(), key_modes=(), peers=False,
                    stateful_tools=((), ("ci_status",), ("*",)))
    policies = build_grid(spec)
    assert [p.name for p in policies] == ["default", "stateful ci_status", "stateful *"]
    assert [p.config.stateful_tools for p in policies] == [(), ("ci_status",), ("*",)]
    assert policies[2].describe()["stateful_tools"] == ["*"] and spec.size == 1 + 1 + 3
    crossed = build_grid(GridSpec(soft_caps=(20, 100), multipliers=(10,), stuck_repeats=(6,), streaks=((5, 8),),
                                  explicit_caps=(), stuck_signals=("repeat",), stop_on=("error",),
                                  key_modes=("canonical",), cycle_repeats=(), peers=False, cross=True,
                                  stateful_tools=((), ("*",))))
    assert sorted(p.name for p in crossed) == ["S=20", "S=20 stateful *", "default", "stateful *"]
