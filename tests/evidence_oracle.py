"""What the boards' probe evidence must show, computed the plain way in Python (never from the
boards' own PromQL): the Wilson interval by calibrate's ``wilson_interval``, the decision by
comparing it with the tolerance, the probe turns still needed by searching for the first count
whose interval excludes the tolerance, and the product-limit estimate by walking the buckets."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from turnguard.calibrate.evidence import Z95, wilson_interval

ABOVE, UNDECIDED, WITHIN = 1, 0, -1


def share(resolved: int, known: int) -> float:
    return resolved / known if known else math.nan


def decision(resolved: int, known: int, tolerance: float) -> int:
    low, high = wilson_interval(resolved, known)
    return ABOVE if low > tolerance else WITHIN if high < tolerance else UNDECIDED


def _wilson_at(p: float, n: int) -> tuple[float, float]:
    """The Wilson interval of a share ``p`` held over ``n`` turns (successes need not be whole)."""
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return centre - half, centre + half


def more_turns(resolved: int, known: int, tolerance: float, *, limit: int = 10**7) -> float:
    """Probe turns with a result to add, at the current share, before the interval excludes the
    tolerance: 0 once decided, NaN without a result, inf when the share is the tolerance."""
    if not known:
        return math.nan
    if decision(resolved, known, tolerance) != UNDECIDED:
        return 0
    p = resolved / known
    if p == tolerance:
        return math.inf
    n = known
    step = 1
    while True:  # gallop, then bisect: the first n whose interval leaves the tolerance out
        low, high = _wilson_at(p, n + step)
        if low > tolerance or high < tolerance:
            break
        n, step = n + step, step * 2
        assert n < limit
    lo, hi = n, n + step  # lo undecided, hi decided
    while hi - lo > 1:
        mid = (lo + hi) // 2
        low, high = _wilson_at(p, mid)
        lo, hi = (lo, mid) if (low > tolerance or high < tolerance) else (mid, hi)
    return hi - known


def finished_by(turns: Iterable[tuple[int, bool]], edges: Sequence[float], start: float, end: float) -> float:
    """``1 - S(end)/S(start)`` by the product-limit rule over the bucket edges between ``start`` and
    ``end``: ``turns`` are (calls, completed); a turn that completed in a bucket finished there, any
    other turn in it is censored and leaves at the bucket's start. NaN where nobody was at risk."""
    turns = list(turns)
    cut = [e for e in edges if start <= e <= end]
    survival = 1.0
    for low, high in itertools.pairwise(cut):
        beyond = sum(1 for calls, _ in turns if calls > high)
        finished = sum(1 for calls, completed in turns if completed and low < calls <= high)
        at_risk = beyond + finished
        if at_risk == 0:
            return math.nan
        survival *= 1 - finished / at_risk
    return 1 - survival


@dataclass(frozen=True)
class ProbeFact:
    """One probe turn as the probe tables see it."""

    calls: int
    resolved: bool | None
    """Its result, in the turn or reported later (``None``: none yet)."""
    halted_by_probe: bool
    main_threshold: str
    """Where the main configuration would have halted it (``none``: nowhere)."""
    calls_past_main: int = 0


def threshold_table(facts: Iterable[ProbeFact], thresholds: Sequence[str], tolerance: float,
                    range_s: float) -> dict[str, dict[str, float]]:
    """Column -> row (threshold) -> value, as the probe evidence table must show them."""
    table: dict[str, dict[str, float]] = {}
    facts = list(facts)
    for threshold in thresholds:
        rows = [f for f in facts if f.main_threshold == threshold]
        resolved = sum(1 for f in rows if f.resolved is True)
        unresolved = sum(1 for f in rows if f.resolved is False)
        known = resolved + unresolved
        low, high = wilson_interval(resolved, known)
        more = more_turns(resolved, known, tolerance)
        values = {"turns": len(rows), "resolved": resolved, "unresolved": unresolved,
                  "unknown": sum(1 for f in rows if f.resolved is None),
                  "halted by the probe": sum(1 for f in rows if f.halted_by_probe),
                  "resolved share": share(resolved, known), "95% low": low, "95% high": high,
                  "decision": decision(resolved, known, tolerance), "more probe turns": more,
                  "time at this rate": more * range_s / known if known else math.nan,
                  "calls past it": sum(f.calls_past_main for f in rows)}
        for column, value in values.items():
            table.setdefault(column, {})[threshold] = value
    return table


def past_table(facts: Iterable[ProbeFact], multiples: Sequence[int], soft_cap: int) -> dict[str, dict[str, float]]:
    """Column -> row (k) -> value, as the "probe turns past k×S" table must show them."""
    table: dict[str, dict[str, float]] = {}
    facts = list(facts)
    for k in multiples:
        rows = [f for f in facts if f.calls > k * soft_cap]
        values = {"turns": len(rows), "resolved": sum(1 for f in rows if f.resolved is True),
                  "unresolved": sum(1 for f in rows if f.resolved is False),
                  "unknown": sum(1 for f in rows if f.resolved is None),
                  "halted by the probe": sum(1 for f in rows if f.halted_by_probe)}
        for column, value in values.items():
            table.setdefault(column, {})[str(k)] = value
    return table
