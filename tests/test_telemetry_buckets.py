"""Bucket edges: the soft cap and its multiples up to 20x are edges, whatever the configuration."""

from __future__ import annotations

import pytest

import turnguard as tg
from turnguard.telemetry import _buckets as buckets


@pytest.mark.parametrize("soft_cap", [1, 3, 7, 100, 250, 1000])
def test_soft_cap_and_every_multiple_to_20x_are_edges(soft_cap):
    edges = buckets.tool_call_edges(tg.GuardConfig(soft_cap=soft_cap))
    assert all(float(soft_cap * k) in edges for k in range(1, 21))
    assert max(edges) > 20 * soft_cap
    assert list(edges) == sorted(set(edges)) and edges[0] >= 1


def test_default_edges_below_the_soft_cap_are_a_1_2_5_series():
    edges = buckets.tool_call_edges(tg.GuardConfig())
    assert [e for e in edges if e < 100] == [1, 2, 5, 10, 20, 50]
    assert 1000.0 in edges  # the default hard backstop


def test_explicit_cap_is_an_edge_and_the_default_soft_cap_is_kept():
    edges = buckets.tool_call_edges(tg.GuardConfig(max_tool_calls_per_turn=37))
    assert 37.0 in edges and 100.0 in edges and 2000.0 in edges


def test_disabled_cap_still_gets_default_multiples():
    edges = buckets.tool_call_edges(tg.GuardConfig(soft_cap=0))
    assert all(float(100 * k) in edges for k in range(1, 21))


def test_fractional_multiplier_backstop_is_an_edge():
    assert 150.0 in buckets.tool_call_edges(tg.GuardConfig(soft_cap=100, hard_multiplier=1.5))


def test_repeat_edges_split_at_the_stuck_threshold():
    edges = buckets.repeat_edges(tg.GuardConfig(stuck_repeat_threshold=17, streak_warn_at=13, streak_stop_at=19))
    assert {16.0, 17.0, 13.0, 19.0} <= set(edges)
    assert list(edges) == sorted(set(edges))


def test_repeat_edges_with_threshold_one_have_no_zero_edge():
    edges = buckets.repeat_edges(tg.GuardConfig(stuck_repeat_threshold=1, streak_warn_at=0, streak_stop_at=0))
    assert edges[0] == 1.0


def test_cycle_cap_is_an_edge():
    assert 7.0 in buckets.cycle_edges(tg.GuardConfig(max_cycles_per_turn=7))


def test_one_two_five_series():
    assert buckets.one_two_five(60) == [1, 2, 5, 10, 20, 50]
    assert buckets.one_two_five(1) == []
