"""Bucket edges: the soft cap and its multiples up to 20x are edges, whatever the configuration."""

from __future__ import annotations

import contextlib
import itertools
import random
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import turnguard as tg
from turnguard.telemetry import _buckets as buckets
from turnguard.telemetry import _names as n


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


EDGE_FUNCTIONS = (buckets.tool_call_edges, buckets.cycle_edges, buckets.repeat_edges, buckets.failing_streak_edges)
INTEGER_OPTIONS = ("stuck_repeat_threshold", "streak_warn_at", "streak_stop_at", "soft_cap", "max_cycles_per_turn",
                   "max_tool_calls_per_turn")


def extreme_values(rng: random.Random) -> list[int]:
    """Values around where floats stop telling integers apart (2**53), the config's and machine
    integers' limits (2**62, 2**63, ``sys.maxsize``), and past the floats' range."""
    near = [2**53, 2**60, 2**62, 2**63, sys.maxsize, 10**400]
    around = [base + rng.randrange(-3, 4) for base in near for _ in range(3)]
    return around + [rng.randrange(1, 2**64) for _ in range(6)]


def accepted_configs() -> list[tg.GuardConfig]:
    """Every accepted configuration with one or two integer options at an extreme value."""
    rng = random.Random(53)
    found = []
    for value in extreme_values(rng):
        for option in INTEGER_OPTIONS:
            pairs = [{option: value}]
            if option == "streak_warn_at":
                pairs.append({option: value, "streak_stop_at": value + rng.randrange(1, 3)})
            if option == "soft_cap":
                pairs.append({option: value, "hard_multiplier": 1})
            for options in pairs:
                with contextlib.suppress(tg.ConfigError):
                    found.append(tg.GuardConfig(load_entrypoints=False, **options))
    assert len(found) > 40  # most extremes are accepted somewhere
    return found


def test_edges_are_strictly_increasing_floats_the_sdk_takes_for_every_accepted_configuration():
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("edges")
    for i, config in enumerate(accepted_configs()):
        for j, edges_of in enumerate(EDGE_FUNCTIONS):
            edges = edges_of(config)
            assert all(type(edge) is float for edge in edges)
            assert all(a < b for a, b in itertools.pairwise(edges)), (edges_of.__name__, config)
            histogram = meter.create_histogram(f"h{i}.{j}", explicit_bucket_boundaries_advisory=edges)
            histogram.record(3)  # the SDK checks the edges when the first point comes
    points = [m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    assert len(points) == len(accepted_configs()) * len(EDGE_FUNCTIONS)


@pytest.mark.parametrize("options", [{"stuck_repeat_threshold": sys.maxsize}, {"stuck_repeat_threshold": 10**400},
                                     {"streak_warn_at": 2**60, "streak_stop_at": 2**60 + 1},
                                     {"stuck_repeat_threshold": 2**53 + 1}])
def test_a_turn_under_an_extreme_configuration_exports_its_span_and_metrics(otel, options):
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, **options), **otel.providers())
    with guard.turn(agent_name="coder") as turn:
        call = tg.ToolCall("read", {})
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.OK)
    assert sorted(s.name for s in otel.spans()) == ["execute_tool read", "invoke_agent coder"]
    assert len(otel.points(n.METRIC_TURN_MAX_KEY_REPEAT[0])) == 1
    assert otel.points(n.METRIC_PLUGIN_ERRORS[0]) == []
