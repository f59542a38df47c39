"""Calibrate's horizon rule (``_calibrate.evidence.horizon_too_low``) on the frontier panels' rows
(panel 41's multiples of S, panels 49's and 50's values):
whether the probe's own length limit may have cut productive turns off, so that no value is within
and the probe's limit is to be raised.

The board has rows at some values only, not the turns at risk at every value, so it applies the
rule's observable conditions, not its exact conditional test: the longest productive turn's reach
L (between the highest row with a resolved turn and the next row) may be at least ``NEAR`` of the
highest value calibrate judges, and turns the probe's limit halted reach that row. Wherever
calibrate's rule holds, so does this one (it may also hold where calibrate's test of the gap shows
that productive turns had stopped ending, and calibrate leaves a value).
"""

from __future__ import annotations

from collections.abc import Mapping

from turnguard._boards.settings import CapSettings
from turnguard._calibrate.evidence import NEAR, value_step
from turnguard._model import Threshold

RESOLVED_SHORT = "resolved short of the limit"
"""A row's resolved turns that the probe's own limit did not halt, where that limit can halt a
resolved turn past the last value judged (the backstop's, soft, explicit and cycle caps'): calibrate's longest
productive turn is the longest up to that value. The other rows' ``resolved`` are all short of it."""


def _in_values(horizon: int | None, unit: int) -> int | None:
    """The highest value a frontier judges below the probe's own limit ``horizon`` (``frontier``'s
    ``(horizon - 1) // unit`` rungs of ``unit``); ``None`` without a limit."""
    return None if not horizon else (horizon - 1) // unit * unit


def last_judged(cap: CapSettings, kind: str) -> int | None:
    """The highest value of ``kind`` (a frontier table's row kind: ``backstop``, panel 41's multiples
    of S, ``soft``, ``explicit``, ``cycles``, ``stuck``, ``streak``) calibrate judges under the
    board's probe (``advice``'s horizons); ``None`` where the probe has no such limit (then the
    rule never holds)."""
    p = cap.probe
    if p is None:
        return None
    if kind == "backstop":
        return _in_values(-(-p.hard_cap // cap.soft_cap), 1) if p.hard_cap else None
    if kind == "stuck":
        return p.stuck_repeat_threshold or None
    if kind == "streak":
        return p.limit(Threshold.STREAK) or None
    if kind == "cycles":
        return _in_values(p.limit(Threshold.CYCLE_CAP), 1)
    if kind == "explicit":
        return _in_values(p.hard_cap, _unit(cap, kind))
    limits = [-(-p.hard_cap // cap.hard_multiplier)] if p.hard_cap else []
    return _in_values(int(min([*limits, *([p.soft_cap] if p.soft_cap else [])], default=0)), _unit(cap, kind))


def _unit(cap: CapSettings, kind: str) -> int:
    """The step between calibrate's values of ``kind`` (``advice``: a tenth of the live cap for the
    soft and explicit caps, one for the others)."""
    if kind == "soft":
        return value_step(cap.soft_cap)
    return value_step(cap.explicit_cap or 1) if kind == "explicit" else 1


def _short(row: Mapping[str, str]) -> str:
    return row.get(RESOLVED_SHORT, row["resolved"])


def limit_too_low(cap: CapSettings, kind: str, rows: Mapping[int, Mapping[str, str]]) -> str:
    """1 where the rule's observable conditions hold on ``kind``'s rows (value -> column -> the
    turns that value halts: ``resolved``, and ``censored`` at the probe's own limit), else 0: some
    row v is the highest with a resolved turn, the next row above it is past ``NEAR`` of the last
    value judged (or v is the highest row up to it), and turns the probe's limit halted reach v."""
    last, unit = last_judged(cap, kind), _unit(cap, kind)
    if last is None:
        return "vector(0)"
    values = sorted(v for v in rows if v <= last)
    if not values:  # (the probe's limit at or under the lowest row: every row is past it)
        return "vector(0)"
    terms = []
    for v, above in zip(values, [*values[1:], None], strict=True):
        if (above - unit if above is not None else last) < NEAR * last:
            continue
        none_above = f" * ({_short(rows[above])} == bool 0)" if above is not None else ""
        terms.append(f"(({_short(rows[v])} > bool 0) * ({rows[v]['censored']} > bool 0){none_above})")
    return f"clamp_max({' + '.join(terms)}, 1)" if terms else "vector(0)"
