"""Probe turns by the largest value of a threshold that would halt them (``frontier.py`` reads them).

Everything is a histogram keyed by value (at most ``TOP`` keys), so partial runs merge exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turnguard.calibrate.bounds import histogram

TOP = 256
"""The highest value a ladder tells apart: a turn reaching past it counts as reaching it."""
FATES = ("resolved", "unresolved", "censored", "unknown")
LADDERS = ("backstop", "stuck", "streak", "soft", "cycles", "explicit")
"""The thresholds laddered: the backstop multiple of S, the stuck threshold D, the streak stop,
the soft cap S (in ``value_step`` calls, the multiple and D held), the cycle cap on model
requests and the explicit cap N (in ``value_step`` calls)."""


def value_step(live: int) -> int:
    """A call-count ladder's unit: a tenth of the live value when it is a multiple of 10 (values up
    to 25.6 times it), else one call."""
    return live // 10 if live % 10 == 0 else 1


@dataclass
class Ladder:
    """Probe turns by the largest value of one threshold that would halt them, and by fate."""

    fates: dict[str, dict[int, int]] = field(default_factory=lambda: {f: {} for f in FATES})
    halt_calls: dict[int, int] = field(default_factory=dict)
    """By value: the calls the never-resolving turns reaching it make before it halts them."""
    end_calls: dict[int, int] = field(default_factory=dict)
    """By reach: the calls the never-resolving turns make when nothing at their reach halts them."""

    def add(self, reach: int, fate: str, made: Sequence[int], end: int) -> None:
        """One turn reaching ``reach``; ``made[v - 1]``: the calls it makes before ``v`` halts it."""
        reach = min(reach, TOP)
        if reach < 1:
            return
        _inc(self.fates[fate], reach)
        if fate in ("unresolved", "censored"):
            for v in range(1, reach + 1):
                _inc(self.halt_calls, v, made[v - 1])
            _inc(self.end_calls, reach, end)

    def merge(self, other: Ladder) -> None:
        for fate in FATES:
            for k, n in other.fates[fate].items():
                _inc(self.fates[fate], k, n)
        for mine, theirs in ((self.halt_calls, other.halt_calls), (self.end_calls, other.end_calls)):
            for k, n in theirs.items():
                _inc(mine, k, n)

    def top(self) -> int:
        return max((k for f in FATES for k in self.fates[f]), default=0)

    def at(self, value: int) -> dict[str, int]:
        """The turns ``value`` would halt, by fate."""
        return {f: sum(n for k, n in self.fates[f].items() if k >= value) for f in FATES}

    def calls_under(self, value: int) -> int:
        """The calls the never-resolving turns make when ``value`` halts them."""
        return self.halt_calls.get(value, 0) + sum(n for k, n in self.end_calls.items() if k < value)

    def to_json(self) -> dict[str, Any]:
        def keyed(h: dict[int, int]) -> dict[str, int]:
            return {str(k): v for k, v in sorted(h.items())}
        return {**{f: keyed(self.fates[f]) for f in FATES}, "halt_calls": keyed(self.halt_calls),
                "end_calls": keyed(self.end_calls)}

    @classmethod
    def from_json(cls, data: Any) -> Ladder:
        if not isinstance(data, dict):
            raise ValueError("a probe ladder must be an object")
        return cls({f: histogram(data.get(f, {}), f"ladder {f}", _value) for f in FATES},
                   histogram(data.get("halt_calls", {}), "ladder halt_calls", _value),
                   histogram(data.get("end_calls", {}), "ladder end_calls", _value))


def _value(key: Any) -> int:
    value = int(key) if isinstance(key, str) and key.isdigit() else -1
    if not 1 <= value <= TOP or str(value) != key:
        raise ValueError(f"a ladder value must be a whole number from 1 to {TOP}, got {key!r:.40}")
    return value


def _inc(h: dict[int, int], key: int, n: int = 1) -> None:
    h[key] = h.get(key, 0) + n


def ladders_to_json(ladders: dict[str, Ladder]) -> dict[str, Any]:
    return {k: v.to_json() for k, v in ladders.items()}


def ladders_from_json(data: Any) -> dict[str, Ladder]:
    if data is None:
        return new_ladders()
    if not isinstance(data, dict) or set(data) - set(LADDERS):
        raise ValueError(f"the probe's ladders must be an object of {', '.join(LADDERS)}")
    return {k: Ladder.from_json(data[k]) if k in data else Ladder() for k in LADDERS}


def new_ladders() -> dict[str, Ladder]:
    return {k: Ladder() for k in LADDERS}
