"""Synthetic probe ladders for the frontier's tests: turns given by reach and fate, no fleet run."""

from __future__ import annotations

from turnguard._calibrate.evidence import Ladder


def ladder_of(*groups: tuple[int, str, int]) -> Ladder:
    """``(reach, fate, how many)`` groups; a value ``v`` halts a turn after ``10 v`` calls, and each
    turn made ``10 * reach`` calls."""
    out = Ladder()
    for reach, fate, n in groups:
        for _ in range(n):
            out.add(reach, fate, [10 * v for v in range(1, reach + 1)], 10 * reach)
    return out
