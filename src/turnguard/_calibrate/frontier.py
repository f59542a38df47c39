"""A value to set for each probed threshold, what it buys and what it costs.

Every probe turn has a *reach* per threshold: the largest value that would still halt it. A
``Ladder`` counts the probe turns by reach and fate, and the calls the never-resolving ones would
make under each value. For a value ``v``, the turns at risk are those reaching it with a known fate
(a censored turn counts as not productive), the share of productive ones has a 95% interval
(Wilson; with none productive, the exact bound ``1 - 0.025^(1/N)``), and the cost is the calls the
never-resolving turns burn between the live value and ``v``. The recommended value is the smallest
above 1 whose upper bound is below ``--tolerance``; a threshold the probe does not pass is
``not_probed``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from turnguard._calibrate.evidence import TOP, Ladder, Sided, wilson_interval, zero_event_bound

EXACT = Sided.TWO
"""The frontier's exact zero-event bound: the upper end of a two-sided 95% interval."""
SETTINGS = {"backstop": "hard_multiplier", "stuck": "stuck_repeat_threshold", "streak": "streak_stop_at",
            "soft": "soft_cap", "cycles": "max_cycles_per_turn", "explicit": "max_tool_calls_per_turn"}
"""The ``GuardConfig`` field each ladder's value sets."""
SHOWN = {"backstop": (2, 3, 5, 10, 15, 20, 30), "stuck": (3, 4, 6, 8, 12, 16), "streak": (4, 6, 8, 12, 16),
         "cycles": (5, 10, 20, 30, 50, 100)}
"""Values the frontier table shows beside the live, the recommended and the edges of the evidence."""


def upper_bound(productive: int, at_risk: int) -> tuple[float, float]:
    """The 95% interval of the productive share among ``at_risk`` turns: Wilson, except the exact
    binomial bound at zero productive turns."""
    if at_risk and productive == 0:
        return 0.0, zero_event_bound(at_risk, EXACT)
    return wilson_interval(productive, at_risk)


def turns_for_zero(tolerance: float) -> int:
    """The fewest turns at risk, none productive, whose exact bound is below ``tolerance``."""
    return math.floor(math.log(EXACT.value) / math.log(1 - tolerance)) + 1


@dataclass(frozen=True, slots=True)
class Rung:
    """One value of the frontier: what it halts, and what the never-resolving turns burn under it."""

    value: int
    at_risk: int
    """Turns it would halt with a known fate (resolved, unresolved, censored)."""
    productive: int
    unknown: int
    low: float
    high: float
    extra_calls: int
    """Calls the never-resolving probe turns burn under it beyond the live value (negative: saved)."""
    extra_share: float | None
    """``extra_calls`` scaled to the fleet, as a share of its calls (``None``: no fleet calls)."""
    decision: str
    """``within``, ``above``, ``undecided``, ``no_evidence``, or ``past_cap`` (past the probe's own limit)."""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "at_risk": self.at_risk, "productive": self.productive, "unknown": self.unknown,
                "interval": [round(self.low, 6), round(self.high, 6)], "extra_calls": self.extra_calls,
                "extra_share": None if self.extra_share is None else round(self.extra_share, 6),
                "decision": self.decision}


@dataclass(frozen=True, slots=True)
class Frontier:
    """One threshold's rungs, its recommended value and the sentence that says it."""

    threshold: str
    setting: str
    live: int | None
    """The live value (``None``: not in force or not recorded)."""
    recommended: int | None
    rungs: tuple[Rung, ...]
    sentence: str
    horizon: int | None = None
    """The probe's own limit in this threshold's values (``None``: not recorded)."""
    unit: int = 1
    """The step between the values (``ladder.value_step`` calls for the soft and explicit caps; 1 for the others)."""
    probed: bool = True
    """Whether the probe runs past the live value at all (``False``: no rungs, the sentence says why)."""

    def rung(self, value: int) -> Rung:
        return self.rungs[value // self.unit - 1]

    def shown(self) -> list[Rung]:
        """The rungs the table shows: the usual values, the live, the recommended, the first with
        no productive turn and the last with evidence."""
        if not self.rungs or self.live is None:
            return []
        last = max((r.value for r in self.rungs if r.at_risk), default=0)
        zero = next((r.value for r in self.rungs if r.at_risk and not r.productive), None)
        usual = SHOWN.get(self.threshold) or tuple(self.live * k // 2 // self.unit * self.unit for k in (3, 4, 6))
        picks = {*usual, self.live, last, *(v for v in (self.recommended, zero) if v is not None)}
        return [r for r in self.rungs if r.value in picks and (r.value <= max(last, self.live))]

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "live": self.live, "probed": self.probed, "recommended": self.recommended,
                "keep": self.recommended == self.live, "horizon": self.horizon, "sentence": self.sentence,
                "rows": [r.to_json() for r in self.rungs if r.at_risk or r.value == self.live]}


@dataclass(frozen=True, slots=True)
class Scale:
    """What the probe's calls are scaled to: the probe turns and the fleet's turns and calls."""

    probe_turns: int
    turns: int
    calls: int

    def share(self, extra: int) -> float | None:
        if not self.probe_turns or not self.turns or not self.calls:
            return None
        return extra / self.probe_turns / (self.calls / self.turns)


def not_probed(threshold: str, live: int | None, why: str) -> Frontier:
    """A threshold the probe does not run past (``why``): said plainly, no value recommended."""
    setting = SETTINGS[threshold]
    return Frontier(threshold, setting, live, None, (), f"{setting}: not probed ({why}): no value can be recommended.",
                    probed=False)


def frontier(threshold: str, ladder: Ladder, live: int, tolerance: float, scale: Scale,
             horizon: int | None = None, unit: int = 1) -> Frontier:
    """The frontier of one threshold against ``tolerance``; ``horizon``: the probe's own limit
    (values at or past it are not judged); ``unit``: the ladder's step (``live`` a multiple of it)."""
    top = max(ladder.top(), live // unit)
    base = ladder.calls_under(live // unit)
    rungs = []
    for i in range(1, min(top, TOP) + 1):
        v = i * unit
        fates = ladder.at(i)
        n = fates["resolved"] + fates["unresolved"] + fates["censored"]
        low, high = upper_bound(fates["resolved"], n)
        extra = ladder.calls_under(i) - base
        if horizon is not None and v >= horizon:
            decision = "past_cap"
        elif not n:
            decision = "no_evidence"
        else:
            decision = "within" if high < tolerance else "above" if low > tolerance else "undecided"
        rungs.append(Rung(v, n, fates["resolved"], fates["unknown"], low, high, extra, scale.share(extra), decision))
    recommended = next((r.value for r in rungs if r.decision == "within" and r.value > unit), None)
    f = Frontier(threshold, SETTINGS[threshold], live, recommended, tuple(rungs), "", horizon, unit)
    return dataclasses.replace(f, sentence=sentence(f, tolerance))


WORDS = {
    "backstop": ("past {v}x", "the longest productive turn passed {v}x"),
    "stuck": ("repeating a call {v} or more times past S",
              "the most a productive turn repeated a call past S: {v} times"),
    "soft": ("halted under a soft cap of {v:,}", "the largest soft cap that halts a productive turn: {v:,}"),
    "cycles": ("past {v:,} model requests", "the most model requests a productive turn made: {next:,}"),
    "explicit": ("past {v:,} calls", "the largest cap that halts a productive turn: {v:,} calls"),
    "streak": ("with {v} or more identical failures in a row", "the longest failing streak of a productive turn: {v}"),
}
"""By threshold: the turns value ``v`` halts, and the furthest a productive probe turn went (``v``: the
largest value that would halt one), in words."""


def _what(threshold: str, v: int) -> str:
    return WORDS[threshold][0].format(v=v, next=v + 1)


def _value_text(threshold: str, v: int) -> str:
    return f"{v}x" if threshold == "backstop" else f"{v:,}"


def _longest(threshold: str, v: int) -> str:
    return WORDS[threshold][1].format(v=v, next=v + 1)


def _cost(r: Rung) -> str:
    if r.extra_calls == 0:
        return "costs no calls"
    share = f"{abs(r.extra_share):.1%}" if r.extra_share is not None else f"{abs(r.extra_calls):,} probe calls"
    if r.extra_calls > 0:
        return f"lets turns that never resolve burn {share} more calls"
    return f"saves {share} of calls that turns which never resolve burn"


def _bound(r: Rung) -> str:
    how = "exact binomial" if not r.productive else "Wilson"
    return f"at most {r.high:.1%} at 95%, {how}"


def sentence(f: Frontier, tolerance: float) -> str:
    """The frontier in one plain sentence."""
    if not any(r.at_risk for r in f.rungs):
        return (f"{f.setting}: no probe turn with a known fate would be halted by any value of it: nothing to "
                "recommend yet.")
    if f.recommended is not None:
        return _recommended(f, f.rung(f.recommended))
    return _none_within(f, tolerance)


def _recommended(f: Frontier, r: Rung) -> str:
    """Keep or set the recommended value ``r``: what it spares (or halts) and costs."""
    t = f.threshold
    if r.productive:
        spared = (f"it halts {r.productive:,} of the {r.at_risk:,} probe turns {_what(t, r.value)} that succeeded "
                  f"({r.productive / r.at_risk:.1%}; {_bound(r)})")
    else:
        below = r.value - f.unit
        longest = f"; {_longest(t, below)}" if below >= f.unit and f.rung(below).productive else ""
        spared = (f"it spares every productive turn the probe saw (0 of {r.at_risk:,} {_what(t, r.value)}; "
                  f"{_bound(r)}{longest})")
    if r.value == f.live:
        return f"keep {f.setting} = {r.value}: {spared}."
    return f"set {f.setting} = {r.value}: {spared} and {_cost(r)}."


def _none_within(f: Frontier, tolerance: float) -> str:
    """Why no value is within the tolerance, and what would make one."""
    name, t = f.setting, f.threshold
    judged = [r for r in f.rungs if r.at_risk and r.decision != "past_cap"]
    if not judged:
        cap = f" ({_value_text(t, f.horizon)})" if f.horizon else ""
        return (f"{name}: no value below the probe's own limit{cap} has a probe turn at risk: raise the probe's "
                f"limit to see past it.")
    last = judged[-1]
    zero = next((r for r in judged if not r.productive), None)
    if zero is not None:
        longest = f"{_longest(t, zero.value - f.unit)}; " if zero.value > f.unit else ""
        return (f"no value of {name} is within the tolerance of {tolerance:.0%} yet: the probe saw no productive "
                f"turn {_what(t, zero.value)} ({longest}0 of {zero.at_risk:,}; {_bound(zero)}); about "
                f"{turns_for_zero(tolerance):,} turns at risk there with none productive would bring the bound "
                f"under {tolerance:.0%}: let the probe run.")
    said = (f"no value of {name} up to {_value_text(t, last.value)} is within the tolerance of {tolerance:.0%}: the "
            f"probe saw productive turns {_what(t, last.value)} ({last.productive:,} of {last.at_risk:,})")
    if t == "backstop" or (f.horizon is not None and last.value + f.unit >= f.horizon):
        cap = _value_text(t, f.horizon if f.horizon else last.value)
        return f"{said}; raise the probe's own limit to see past {cap}."
    more = "; or try stuck_signal='stale_repeat' (it spares turns that edit and rerun a test)" if t == "stuck" else ""
    return (f"{said}, and none reaching more with a known fate: {name} = {last.value + f.unit} or more spares them, "
            f"but the probe cannot yet say what it would halt{more}.")
