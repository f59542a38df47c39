"""When a turn ran, on the wall clock, read once for everything that reports it.

The turn opens at ``Ledger.opened_ns`` (the wall clock, read at the opening) and lasts
``TurnSummary.duration_s`` (the monotonic clock). The turn span and the recorder line both take
their start and end from here, so ``turnguard calibrate`` tells the same times from the
Collector's file and from the recorder's: each reading the clock on its own would differ by the
time between their hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from turnguard._ledger import Ledger, LedgerView
    from turnguard._model import TurnSummary

NS_PER_S = 1_000_000_000


def turn_start_ns(turn: Ledger | LedgerView) -> int:
    """When the turn opened, Unix nanoseconds."""
    return turn.opened_ns


def turn_end_ns(turn: Ledger | LedgerView, summary: TurnSummary) -> int:
    """When the turn ended, Unix nanoseconds: its opening plus its duration."""
    return turn.opened_ns + round(summary.duration_s * NS_PER_S)


def unix_s(ns: int) -> float:
    """Unix seconds, the float ``turnguard calibrate`` makes of a span's time (``ns / 1e9``, not
    ``ns / 10**9``: the nanoseconds are made a float first, which can round the last digit)."""
    return ns / 1e9
