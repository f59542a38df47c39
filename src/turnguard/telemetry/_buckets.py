"""Histogram bucket edges, derived from the guard's configuration.

The dashboards answer "how many productive turns would a cap of k x S cut?" from the
``turnguard.turn.tool_calls`` histogram alone, so the soft cap S and every multiple of S up to
20 x S are bucket edges (Prometheus ``le`` values), with a 1-2-5 series below S and a few edges
past 20 x S. The edges reach the SDK as ``explicit_bucket_boundaries_advisory``; a user's View
still wins.
"""

from __future__ import annotations

import bisect
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from turnguard._config import GuardConfig

DEFAULT_SOFT_CAP = 100
"""The S used for bucket edges when the adaptive cap is off (explicit or disabled)."""
MAX_MULTIPLE = 20
"""Every k x S for k = 1..MAX_MULTIPLE is an edge."""
ABOVE_MULTIPLES = (30, 50, 100)
"""Edges past 20 x S (as multiples of S), so runaway turns are not one undifferentiated bucket."""
_SERIES = (1, 2, 5)


def one_two_five(below: float) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... strictly below ``below``."""
    edges: list[int] = []
    scale = 1
    while True:
        for step in _SERIES:
            edge = step * scale
            if edge >= below:
                return edges
            edges.append(edge)
        scale *= 10


def soft_cap_of(config: GuardConfig) -> int:
    """S for bucket purposes: the configured soft cap, or the default when it is not in force."""
    return config.soft_cap if config.soft_cap > 0 else DEFAULT_SOFT_CAP


def tool_call_edges(config: GuardConfig) -> tuple[float, ...]:
    """Edges for tool calls per turn (and the first stuck call): S, 2S, ... 20S must be among them.

    The explicit cap N, the adaptive backstop H and the stuck threshold's first possible call are
    added too, so each threshold's boundary is exact.
    """
    return tool_call_edges_for(config.soft_cap, config.hard_cap)


@functools.lru_cache(maxsize=64)
def tool_call_edges_for(soft_cap: int, hard_cap: int | None) -> tuple[float, ...]:
    """``tool_call_edges`` of a configuration with this soft cap and backstop (a result token
    carries the two, so another process reports the turn's own call bucket)."""
    s = soft_cap if soft_cap > 0 else DEFAULT_SOFT_CAP
    edges: set[int] = set(one_two_five(s))
    edges.update(s * k for k in range(1, MAX_MULTIPLE + 1))
    edges.update(s * k for k in ABOVE_MULTIPLES)
    if hard_cap:
        edges.add(hard_cap)
    return _strict(edges)


def cycle_edges(config: GuardConfig) -> tuple[float, ...]:
    """Edges for model requests per turn; the cycle cap (when set) is one."""
    edges: set[int] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200, 300, 500, 1000}
    if config.max_cycles_per_turn:
        edges.add(config.max_cycles_per_turn)
    return _strict(edges)


def repeat_edges(config: GuardConfig) -> tuple[float, ...]:
    """Edges for the largest key repeat per turn: every count up to 10, the stuck threshold D,
    D - 1 and D - 2 (so ``r >= D`` and ``r = D - 1``, which the dashboards show, are bucket
    boundaries, up to 2**53 where floats still tell them apart), the streak levels, then a coarse
    tail."""
    edges: set[int] = set(range(1, 11)) | {12, 15, 20, 30, 50, 100, 200, 500, 1000}
    d = config.stuck_repeat_threshold
    edges.update((d - 2, d - 1, d, config.streak_warn_at, config.streak_stop_at))
    return _strict(edges)


COUNT_EDGES = (*range(1, 17), 20, 24, 32)
"""Fixed edges for a turn's largest repeat count and longest failing streak as labels of its late
result (``count_bucket``; the values D and the streak stop are probed at and calibrate's frontier
shows, each one with its predecessor): the same in every process, whatever its configuration, so a
result token needs only the counts, and the labels a token can show are a closed set."""
OVERFLOW_BUCKET = "+Inf"
UNKNOWN_BUCKET = "unknown"
"""The bucket of a count not known (a version 1 result token carries none)."""
COUNT_BUCKETS = frozenset({*(str(e) for e in COUNT_EDGES), OVERFLOW_BUCKET, UNKNOWN_BUCKET})
"""Every value ``count_bucket`` gives."""


def count_bucket(count: int | None) -> str:
    """The upper edge of the ``COUNT_EDGES`` bucket ``count`` falls in (``"+Inf"`` past 32;
    ``"unknown"`` for ``None``): a histogram's ``le`` semantics, 0 in the first bucket."""
    if count is None:
        return UNKNOWN_BUCKET
    at = bisect.bisect_left(COUNT_EDGES, count)
    return OVERFLOW_BUCKET if at == len(COUNT_EDGES) else str(COUNT_EDGES[at])


def failing_streak_edges(config: GuardConfig) -> tuple[float, ...]:
    """Edges for the longest failing streak per turn: ``COUNT_EDGES`` (the late results' buckets),
    the streak levels and a coarse tail."""
    return _strict({*COUNT_EDGES, config.streak_warn_at, config.streak_stop_at, 50, 100, 200})


LARGEST_EDGE = 2**63
"""No count reaches it (calls and repeats are counted one by one): every edge past it is this one."""


def _strict(edges: set[int]) -> tuple[float, ...]:
    """Strictly increasing positive floats (the SDK rejects anything else), whatever integers the
    configuration accepts: deduplicated as floats, since past 2**53 neighbouring integers (D - 1
    and D) are one float, and capped at ``LARGEST_EDGE`` (an integer past the floats' range has none)."""
    return tuple(sorted({float(min(e, LARGEST_EDGE)) for e in edges if e > 0}))
