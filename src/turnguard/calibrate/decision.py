"""What a probe row decides against the operator's tolerance, and what it would take to decide.

The tolerance ``q`` (``--tolerance``, default 0.10) is the share of the turns past a threshold
that would have succeeded which the operator accepts losing to it. A row's interval
(``Passed.interval``: Wilson, with censored turns counted as failures for its low end and as
successes for its high end) decides:

- ``above``: its low end is above ``q``: the threshold halts too many turns that would have
  succeeded (raise it);
- ``within``: its high end is below ``q``: it halts at most that share (keep it);
- ``undecided`` otherwise, with why: ``needs_turns`` (at the current share, ``more_turns`` more
  probe turns past the threshold with a known fate decide it; ``more_days`` is how long they take
  at the observed traffic), ``censored`` (the turns the probe's own thresholds halted could go
  either way: more turns at the same shares never decide it; raise the probe's cap), or
  ``at_tolerance`` (the share is the tolerance: the data are consistent with it);
- ``no_evidence``: no probe turn past the threshold has a known fate.

The number of turns inverts the score test the Wilson interval is built from: the interval at
share ``p`` over ``n`` turns excludes ``q`` exactly when ``n (p - q)^2 > z^2 q (1 - q)``, so the
smallest such ``n`` is ``floor(z^2 q (1 - q) / (p - q)^2) + 1`` (unlike the normal
approximation ``z^2 p (1 - p) / (p - q)^2`` it does not vanish at ``p = 0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from turnguard.calibrate.evidence import Z95, Passed

DEFAULT_TOLERANCE = 0.10
VERDICTS = ("above", "within", "undecided", "no_evidence")
REASONS = ("decided", "needs_turns", "censored", "at_tolerance", "no_evidence")
MAX_MORE = 10**9
"""Past this many more turns the share is, for any fleet, the tolerance itself (``at_tolerance``)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A row's interval against the tolerance."""

    tolerance: float
    low: float
    high: float
    verdict: str
    why: str
    more_turns: int | None = None
    more_days: float | None = None
    censored_at_cap: tuple[str, int] | None = None
    """``(threshold, cap)``: the row is at or above the probe's own cap, which no probe turn passes."""

    def to_json(self) -> dict[str, Any]:
        days = None if self.more_days is None else round(self.more_days, 3)
        return {"tolerance": self.tolerance, "decision": self.verdict, "why": self.why,
                "more_turns": self.more_turns, "more_days": days,
                "censored_at_cap": None if self.censored_at_cap is None else
                {"threshold": self.censored_at_cap[0], "cap": self.censored_at_cap[1]}}


def turns_to_decide(p: float, q: float, z: float = Z95) -> int | None:
    """The fewest turns at share ``p`` whose Wilson interval excludes ``q`` (``None``: ``p == q``,
    or more than ``MAX_MORE``)."""
    if p == q:
        return None
    needed = math.floor(z * z * q * (1 - q) / ((p - q) ** 2)) + 1
    return needed if needed <= MAX_MORE else None


def decide(passed: Passed, tolerance: float, days: float | None = None,
           censored_at_cap: tuple[str, int] | None = None) -> Decision:
    """``passed``'s decision against ``tolerance``; ``days``: how long the recording spans (for
    ``more_days``: the turns past the threshold arrive at ``passed.known / days`` a day)."""
    n = passed.known
    low, high = passed.interval()
    if n == 0:
        return Decision(tolerance, low, high, "no_evidence", "no_evidence", censored_at_cap=censored_at_cap)
    if low > tolerance:
        return Decision(tolerance, low, high, "above", "decided", censored_at_cap=censored_at_cap)
    if high < tolerance:
        return Decision(tolerance, low, high, "within", "decided", censored_at_cap=censored_at_cap)
    p_low, p_high = passed.resolved / n, (passed.resolved + passed.censored) / n
    share = p_low if p_low > tolerance else p_high if p_high < tolerance else None
    if share is None:
        why = "censored" if p_low < p_high else "at_tolerance"
        return Decision(tolerance, low, high, "undecided", why, censored_at_cap=censored_at_cap)
    needed = turns_to_decide(share, tolerance)
    if needed is None:
        return Decision(tolerance, low, high, "undecided", "at_tolerance", censored_at_cap=censored_at_cap)
    more = max(1, needed - n)
    more_days = more / (n / days) if days else None
    return Decision(tolerance, low, high, "undecided", "needs_turns", more, more_days, censored_at_cap)


def valid_tolerance(value: float) -> float:
    """A tolerance strictly between 0 and 1 (``ValueError`` otherwise)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1:
        raise ValueError(f"the tolerance is a share strictly between 0 and 1, got {value!r:.40}")
    return float(value)
