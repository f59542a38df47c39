"""How many calls turns need: a product-limit (Kaplan-Meier) estimate over both cohorts, with
Greenwood's variance and a log-log 95% interval, and what raising the backstop costs (the
restricted mean); histograms only, so partial runs merge (docs/calibration.md, "How many calls
turns need")."""

from __future__ import annotations

import math
import textwrap
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from turnguard._calibrate.bounds import Key, add_count, add_counts, call_count_key, dump, hist, key_in, load
from turnguard._calibrate.evidence import Z95, Sided, zero_event_bound
from turnguard._model import PLUGIN_ERROR_THRESHOLD, Threshold

CENSORING_ENDS = frozenset({*(str(t) for t in Threshold), "halted", PLUGIN_ERROR_THRESHOLD, "cancelled", "error",
                            "abandoned"})
"""``ended_by`` values that censor a turn at its call count (any other recorded end is an event)."""
CENSOR_GROUPS = {"hard_backstop": "cap", "explicit": "cap", "cycle_cap": "cap", "soft_stuck": "stuck",
                 "streak": "streak", "cycle_repeat": "cycle_repeat", "cancelled": "cancelled", "error": "error"}
"""How censored turns are counted in the report: every built-in threshold has a group (any other
censoring end: ``other``)."""
FACTORS = (1.5, 2.0, 3.0)
"""The backstop multiples asked about, as factors of the default's own (x10: 15x, 20x, 30x)."""


@dataclass(frozen=True, slots=True)
class Step:
    """The estimate at one event count ``t``: turns at risk, finishing, ``S(t)`` and the Greenwood sum."""

    t: int
    at_risk: int
    events: int
    survival: float
    greenwood: float


def loglog_interval(s: float, greenwood: float, z: float = Z95) -> tuple[float, float] | None:
    """The log-log 95% interval of a survival ``s`` with Greenwood sum ``greenwood`` (``None``
    where it is not defined: ``s`` is 0 or 1, or the sum is infinite)."""
    if not 0 < s < 1 or not math.isfinite(greenwood):
        return None
    theta = z * math.sqrt(greenwood) / math.log(s)  # negative: log s < 0
    return s ** math.exp(-theta), s ** math.exp(theta)


EXACT = Sided.ONE
"""Where the estimate is 0 or 1 Greenwood's variance says nothing: the exact one-sided 95% bound
``1 - 0.05^(1/N)`` over the turns whose fate is known."""


class Interval(NamedTuple):
    """A survival's 95% interval, how it was had, and the turns an exact one rests on."""

    low: float
    high: float
    exact: bool
    known: int | None = None
    """For an exact one: the turns seen past the point (survival 1) or finishing before it (0)."""

    def to_json(self) -> dict[str, Any]:
        return {"interval": [round(self.low, 6), round(self.high, 6)],
                "interval_from": "exact" if self.exact else "log-log", "exact_over": self.known}


def survival_interval(s: float, greenwood: float, survivors: int, finishers: int) -> Interval:
    """The 95% interval of a survival ``s``: log-log strictly between 0 and 1; exact at 1 over the
    ``survivors`` and at 0 over the ``finishers``; ``[0, 1]`` over none."""
    interval = loglog_interval(s, greenwood)
    if interval is not None:
        return Interval(*interval, exact=False)
    if s >= 1:
        return Interval(1 - zero_event_bound(survivors, EXACT), 1.0, True, survivors)
    return Interval(0.0, zero_event_bound(finishers, EXACT), True, finishers)


@dataclass
class Survival:
    """The turns' call counts as events and censorings, and the estimate read from them."""

    events: dict[int, int] = field(default_factory=dict)
    censored: dict[int, int] = field(default_factory=dict)
    censored_by: dict[str, int] = field(default_factory=dict)
    unknown_end: int = 0
    """Turns recorded without how they ended: left out of the estimate."""

    def add(self, calls: int, ended_by: str | None) -> None:
        if ended_by is None:
            self.unknown_end += 1
            return
        if ended_by in CENSORING_ENDS:
            add_count(self.censored, calls)
            add_count(self.censored_by, CENSOR_GROUPS.get(ended_by, "other"))
        else:
            add_count(self.events, calls)

    def merge(self, other: Survival) -> None:
        add_counts(self.events, other.events)
        add_counts(self.censored, other.censored)
        add_counts(self.censored_by, other.censored_by)
        self.unknown_end += other.unknown_end

    @property
    def turns(self) -> int:
        return sum(self.events.values()) + sum(self.censored.values())

    def steps(self) -> list[Step]:
        """The estimate at each event count, in order (counts between them keep the last one's)."""
        r = self.turns
        s, v = 1.0, 0.0
        out = []
        for t in sorted({*self.events, *self.censored}):
            d = self.events.get(t, 0)
            if d:
                s *= 1 - d / r
                v = v + d / (r * (r - d)) if r > d else math.inf
                out.append(Step(t, r, d, s, v))
            r -= d + self.censored.get(t, 0)
        return out

    def events_between(self, low: int, high: int) -> int:
        """Turns that finished after ``low`` calls and by ``high``."""
        return sum(v for k, v in self.events.items() if low < k <= high)

    def at_risk(self, n: int) -> int:
        """Turns observed to need at least ``n`` calls (their count is ``n`` or more)."""
        return sum(v for k, v in self.events.items() if k >= n) + sum(v for k, v in self.censored.items() if k >= n)

    def seen_past(self, n: int) -> bool:
        """Whether any turn was observed past ``n`` calls: one that finished after it, or was
        censored later than call ``n + 1`` (a turn halted at ``n + 1``, as a backstop at ``n`` halts
        one, is seen up to ``n`` and no further)."""
        return any(k > n for k in self.events) or any(k > n + 1 for k in self.censored)

    def largest(self) -> int:
        """The largest call count observed (0: no turn)."""
        return max([0, *self.events, *self.censored])

    @staticmethod
    def at(steps: list[Step], n: int) -> tuple[float, float]:
        """``S(n)`` and its Greenwood sum from ``steps``."""
        i = bisect_right([s.t for s in steps], n)
        return (1.0, 0.0) if i == 0 else (steps[i - 1].survival, steps[i - 1].greenwood)

    def to_json(self) -> dict[str, Any]:
        return dump(self, _SURVIVAL_KEYS)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Survival:
        return cls(**load(data, _SURVIVAL_KEYS, "survival."))


_group = key_in((*dict.fromkeys(CENSOR_GROUPS.values()), "other"), "a censoring group")
_SURVIVAL_KEYS = (hist("events_at", call_count_key, "events"), hist("censored_at", call_count_key, "censored"),
                  hist("censored_by", _group), Key("unknown_end"))


class FinishBy(NamedTuple):
    """Of the turns that reach ``base`` calls, what happens by ``calls``."""

    multiple: float
    calls: int
    estimable: bool
    why: str | None = None
    """Why not estimable: ``past_cap`` (past the highest cap turns ran under) or ``no_turns``."""
    share: float | None = None
    """The share that finish by ``calls``: ``1 - S(calls)/S(base)``."""
    interval: Interval | None = None
    """The share's 95% interval (present whenever the share is)."""
    at_risk: int = 0
    extra_calls: float | None = None
    """Calls per turn that reaches ``base`` that a backstop at ``calls`` would add (restricted mean)."""
    extra_calls_per_turn: float | None = None
    """The same per turn of the whole recording (times ``S(base)``)."""

    def to_json(self) -> dict[str, Any]:
        interval = (self.interval.to_json() if self.interval is not None else
                    {"interval": None, "interval_from": None, "exact_over": None})
        return {"multiple": self.multiple, "calls": self.calls, "estimable": self.estimable, "why": self.why,
                "share": _rounded(self.share, 6), **interval, "at_risk": self.at_risk,
                "extra_calls_per_turn_reaching": _rounded(self.extra_calls, 3),
                "extra_calls_per_turn": _rounded(self.extra_calls_per_turn, 3)}


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def restricted_mean(steps: list[Step], start: int, end: int) -> float:
    """``sum_{n=start}^{end-1} S(n)``: the calls between ``start`` and ``end`` a turn makes on average."""
    total, n = 0.0, start
    s, _ = Survival.at(steps, start)
    for step in steps:
        if step.t <= start:
            continue
        if step.t >= end:
            break
        total += s * (step.t - n)
        n, s = step.t, step.survival
    return total + s * (end - n)


def finish_by(survival: Survival, steps: list[Step], base: int, multiple: float, calls: int,
              horizon: int) -> FinishBy:
    """Of the turns that reach ``base``, the share that finish by ``calls`` and what it costs."""
    at_risk = survival.at_risk(calls)
    if calls > horizon:
        return FinishBy(multiple, calls, False, "past_cap", at_risk=at_risk)
    s_base, v_base = Survival.at(steps, base)
    if s_base <= 0 or not survival.seen_past(base):
        return FinishBy(multiple, calls, False, "no_turns", at_risk=at_risk)
    s_k, v_k = Survival.at(steps, calls)
    conditional = s_k / s_base
    kept = survival_interval(conditional, v_k - v_base, survival.at_risk(calls + 1),
                             survival.events_between(base, calls))
    extra = restricted_mean(steps, base, calls) / s_base
    return FinishBy(multiple, calls, True, None, 1 - conditional,
                    Interval(1 - kept.high, 1 - kept.low, kept.exact, kept.known), at_risk, extra, extra * s_base)


INFORMATIVE = ("Censoring by the stuck and streak thresholds is informative, not independent: those turns were "
               "looping, not a random sample of the turns still running, so the estimate leans toward turns "
               "finishing; read it with the probe rows.")


def estimate(survival: Survival, base: int | None, multiplier: float | None, horizon: int | None,
             horizon_from: str) -> dict[str, Any]:
    """The report's figures: ``S(base)``, and for each of ``FACTORS`` x the multiplier the share of
    the turns reaching ``base`` that finish by then, up to ``horizon`` and never past it."""
    steps = survival.steps()
    out: dict[str, Any] = {"turns": survival.turns, "events": sum(survival.events.values()),
                           "censored": sum(survival.censored.values()), "censored_by": dict(survival.censored_by),
                           "unknown_end": survival.unknown_end, "horizon": horizon, "horizon_from": horizon_from,
                           "informative_censoring": INFORMATIVE, "from_calls": base, "reach": None, "finish_by": []}
    if base is None or multiplier is None or horizon is None or not survival.turns:
        return out
    s, v = Survival.at(steps, base)
    reach = survival.at_risk(base + 1)
    interval = survival_interval(s, v, reach, survival.events_between(0, base))
    out["reach"] = {"survival": round(s, 6), **interval.to_json(), "at_risk": reach}
    soft = base / multiplier
    for factor in FACTORS:
        k = multiplier * factor
        out["finish_by"].append(finish_by(survival, steps, base, k, round(k * soft), horizon).to_json())
    return out


def ended(est: dict[str, Any]) -> str:
    by = est["censored_by"]
    names = {"cap": "at a cap", "stuck": "stuck", "streak": "by the streak stop",
             "cycle_repeat": "by the cycle_repeat stop", "cancelled": "cancelled", "error": "by an error",
             "other": "otherwise"}
    parts = ", ".join(f"{by[k]:,} {names[k]}" for k in names if by.get(k))
    return f"{est['events']:,} finished, {est['censored']:,} censored" + (f" ({parts})" if parts else "")


def percent(x: float, digits: int = 0) -> str:
    """``x`` as a percentage with as many more digits (up to 3) as it takes never to read 0% or
    100% for a share that is not exactly that."""
    text = f"{x:.{digits}%}"
    while digits < 3 and ((x > 0 and float(text[:-1]) == 0) or (x < 1 and float(text[:-1]) == 100)):
        digits += 1
        text = f"{x:.{digits}%}"
    return text


def _seen(n: int) -> str:
    return f"{n:,} was seen" if n == 1 else f"{n:,} were seen"


def _band(figure: dict[str, Any], digits: int, exact: str) -> str:
    """A figure's 95% interval in words; an exact one says the turns it rests on (``exact``: how)."""
    low, high = figure["interval"]
    text = f"95% {percent(low, digits)}-{percent(high, digits)}"
    if figure["interval_from"] == "exact":
        text += f", exact: {exact.format(n=figure['exact_over'])}"
    return text


def survival_lines(est: dict[str, Any]) -> list[str]:
    """The estimate in sentences (empty without turns)."""
    if not est["turns"]:
        return []
    left_out = f"; {est['unknown_end']:,} recorded without their end are left out" if est["unknown_end"] else ""
    head = f"How many calls turns need (Kaplan-Meier, both cohorts: {est['turns']:,} turns, {ended(est)}{left_out})."
    out = [head]
    reach, base = est["reach"], est["from_calls"]
    if reach is None:
        return [*out, "The default configuration has no adaptive backstop: no threshold question to answer."]
    exact = ("no turn finished by it, over the {n:,} seen past it" if reach["survival"] >= 1 else
             "every turn finished by it, over the {n:,} that did")
    out.append(f"{percent(reach['survival'], 1)} of the turns need more than the backstop's {base:,} calls "
               f"({_band(reach, 1, exact)}; {_seen(reach['at_risk'])} past it). Of the turns that reach it:")
    cap = est["horizon"]
    for f in est["finish_by"]:
        label = f"by {f['multiple']:g}x ({f['calls']:,} calls)"
        if not f["estimable"]:
            why = (f"not estimable: past the highest cap turns ran under ({cap:,} calls); raise the probe's cap to see "
                   "there" if f["why"] == "past_cap" else "not estimable: no turn was seen past the backstop")
            out.append(f"  {label}: {why}.")
            continue
        exact = ("none finished, over the {n:,} seen past it" if f["share"] <= 0 else
                 "all finished, over the {n:,} that did")
        out.append(f"  {label}: {percent(f['share'])} finish ({_band(f, 0, exact)}), {f['at_risk']:,} still "
                   "running there; a backstop "
                   f"there costs {f['extra_calls_per_turn_reaching']:,.0f} more calls per turn that reaches "
                   f"{base:,} ({f['extra_calls_per_turn']:,.1f} per turn).")
    source = "the caps the turns ran under" if est["horizon_from"] == "limits" else (
        "the longest turn recorded: the recording does not say its caps")
    out.append(f"The estimate reaches {cap:,} calls ({source}) and never past. {est['informative_censoring']}")
    return out


def survival_text(est: dict[str, Any], width: int) -> list[str]:
    lines = survival_lines(est)
    if not lines:
        return []
    out = [""]
    for i, line in enumerate(lines):
        indent = "  " if i else ""
        out += textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=indent + "  ")
    return out
