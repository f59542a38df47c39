"""Probe evidence: what probe turns did past the main configuration's thresholds, by result, as
bounded histograms and counters that merge exactly; the ladders (probe turns by *reach*, the largest
value of a threshold that would still halt them) and the frontier read from them, the value to set
for each threshold (docs/calibration.md, "A value to set")."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from turnguard._calibrate.bounds import (
    MAX_COUNT,
    Key,
    add_count,
    add_counts,
    count,
    dump,
    histogram,
    histogram_json,
    load,
)
from turnguard._probe import CENSORING_HALTS, LOOP_DETECTORS, SEEN_LOOPING, Cohort, judged

if TYPE_CHECKING:
    from turnguard._calibrate.records import Limits
    from turnguard._calibrate.replay import TurnResult
    from turnguard._firing import TurnFacts

MULTIPLES = (2, 3, 5, 10, 15, 20, 30)
"""The multiples of S counted, with the main configuration's own when a whole number."""
PROBE = Cohort.PROBE.value
LIVE = Cohort.LIVE.value
Z95 = 1.959963984540054
"""The standard normal quantile for a two-sided 95% interval."""
FEW = 10
"""Below this many turns with a known fate, the recommendation says the interval is wide."""


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (Newcombe 1998, method 3): inside [0, 1] and sensible at 0 and n
    successes, where this evidence sits. ``trials == 0``: ``(0.0, 1.0)``."""
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


class Sided(enum.Enum):
    """Which 95% bound an exact zero-event figure is: the value is the tail it leaves out."""

    ONE = 0.05
    """One-sided: the other end is the estimate itself (``1 - 0.05^(1/N)``, about 3/N)."""
    TWO = 0.025
    """The upper end of a two-sided interval (``1 - 0.025^(1/N)``, about 3.7/N)."""


def zero_event_bound(trials: int, sided: Sided) -> float:
    """The exact (Clopper-Pearson) 95% upper bound of a share with no event in ``trials``."""
    if trials < 0:
        raise ValueError(f"need trials >= 0, got {trials}")
    return 1 - sided.value ** (1 / trials) if trials else 1.0


@dataclass
class Passed:
    """The probe turns that passed one threshold."""

    turns: int = 0
    resolved: int = 0
    unresolved: int = 0
    censored: int = 0
    """Turns the probe halted later at a length limit of its own (``_probe.CENSORING_HALTS``: its
    backstop, explicit or cycle cap, ...), or at a loop detector of its own not well past the main
    one (``SEEN_LOOPING``), whose task was not reported done: whether they would have succeeded is
    not recorded."""
    calls_past: int = 0
    """Calls these turns made past the threshold: what letting them run past it cost."""

    @property
    def unknown(self) -> int:
        """Turns that ended on their own without a result."""
        return self.turns - self.resolved - self.unresolved - self.censored

    @property
    def known(self) -> int:
        """Turns with a known fate: resolved, unresolved, or censored (a fate bounded both ways)."""
        return self.resolved + self.unresolved + self.censored

    def interval(self) -> tuple[float, float]:
        """95% interval of the share that would have succeeded: Wilson, censored turns counted as
        failures for the low end and as successes for the high end."""
        n = self.known
        return wilson_interval(self.resolved, n)[0], wilson_interval(self.resolved + self.censored, n)[1]

    def add(self, resolved: bool | None, calls_past: int, censored: bool = False) -> None:
        """One probe turn past the threshold; ``censored``: its recording ends at a halt of its own."""
        self.turns += 1
        if resolved is True:
            self.resolved += 1
        elif censored:
            self.censored += 1
        elif resolved is False:
            self.unresolved += 1
        self.calls_past += calls_past

    def merge(self, other: Passed) -> None:
        for name in _PASSED_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_json(self) -> dict[str, Any]:
        low, high = self.interval()
        return dump(self, _PASSED_KEYS, resolved_interval=[round(low, 6), round(high, 6)])

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Passed:
        passed = cls(**load(data, _PASSED_KEYS))
        if passed.known > passed.turns:
            raise ValueError(f"inconsistent probe evidence counts: {data!r}")
        return passed


_PASSED_COUNTS = ("turns", "resolved", "unresolved", "censored", "calls_past")
_PASSED_KEYS = (*map(Key, _PASSED_COUNTS), Key("unknown", into=None), Key("resolved_interval", into=None))


# -- ladders: probe turns by the largest value of a threshold that would halt them -----

TOP = 256
"""The highest value a ladder tells apart: a turn reaching past it counts as reaching it."""
FATES = ("resolved", "unresolved", "censored", "unknown", "cut")
"""``censored``: halted by a length limit of the probe's own, counted as not productive below its
horizon; ``cut``: halted by a loop detector of the probe's own not well past the main one
(``SEEN_LOOPING``), counted as productive at an interval's high end: it may sit at any value judged."""
LADDERS = ("backstop", "stuck", "streak", "soft", "cycles", "explicit")
"""The thresholds laddered (soft and explicit caps in ``value_step`` calls)."""


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
        add_count(self.fates[fate], reach)
        if fate in ("unresolved", "censored", "cut"):
            for v in range(1, reach + 1):
                add_count(self.halt_calls, v, made[v - 1])
            add_count(self.end_calls, reach, end)

    def merge(self, other: Ladder) -> None:
        for fate in FATES:
            add_counts(self.fates[fate], other.fates[fate])
        add_counts(self.halt_calls, other.halt_calls)
        add_counts(self.end_calls, other.end_calls)

    def top(self) -> int:
        return max((k for f in FATES for k in self.fates[f]), default=0)

    def at(self, value: int) -> dict[str, int]:
        """The turns ``value`` would halt, by fate."""
        return {f: sum(n for k, n in self.fates[f].items() if k >= value) for f in FATES}

    def calls_under(self, value: int) -> int:
        """The calls the never-resolving turns make when ``value`` halts them."""
        return self.halt_calls.get(value, 0) + sum(n for k, n in self.end_calls.items() if k < value)

    def to_json(self) -> dict[str, Any]:
        return {**{f: histogram_json(self.fates[f]) for f in FATES}, "halt_calls": histogram_json(self.halt_calls),
                "end_calls": histogram_json(self.end_calls)}

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


def ladders_from_json(data: Any) -> dict[str, Ladder]:
    if data is None:
        return new_ladders()
    if not isinstance(data, dict) or set(data) - set(LADDERS):
        raise ValueError(f"the probe's ladders must be an object of {', '.join(LADDERS)}")
    return {k: Ladder.from_json(data[k]) if k in data else Ladder() for k in LADDERS}


def new_ladders() -> dict[str, Ladder]:
    return {k: Ladder() for k in LADDERS}


@dataclass
class ProbeEvidence:
    """Probe turns against the main configuration's ``soft_cap`` S, ``multiplier`` m, stuck
    threshold D and streak stop (the run's default policy; all ``None`` without an adaptive cap)."""

    soft_cap: int | None
    multiplier: float | None
    stuck_repeat: int | None
    streak_stop: int | None = None
    turns: int = 0
    censored: int = 0
    """Probe turns whose recording ends at a halt of the probe's own thresholds."""
    past_main: int = 0
    """Probe turns the main configuration would have halted."""
    calls_past_main: int = 0
    """The calls those turns made from the one the main configuration would have halted on: what
    the probe cost, beside what the main configuration would have spent."""
    main_untold: int = 0
    """Probe turns whose recording cannot tell whether the main configuration would have halted
    them (in part, or cut short): in the multiples' rows only."""
    resolved: int = 0
    unresolved: int = 0
    calls: int = 0
    live_turns: int = 0
    multiples: dict[int, Passed] = field(default_factory=dict)
    stuck: Passed = field(default_factory=Passed)
    """Turns the main configuration would have halted as ``soft_stuck`` (past S, stuck at D)."""
    streak: Passed = field(default_factory=Passed)
    """Turns the main configuration would have halted at its streak stop (unattended)."""
    ladders: dict[str, Ladder] = field(default_factory=new_ladders)
    """By threshold (``ladder.LADDERS``): the probe turns by the largest value that would halt
    them, for the recommended values (``frontier``)."""
    explicit_cap: int | None = None
    """The main configuration's explicit cap N (``None``: not explicit); then only the explicit
    cap's ladder is counted."""

    def __post_init__(self) -> None:
        if not self.multiples and self.soft_cap is not None:
            self.multiples = {k: Passed() for k in multiples_for(self.multiplier)}

    @classmethod
    def for_policy(cls, params: dict[str, Any] | None) -> ProbeEvidence:
        """Evidence against a policy's parameters (``Policy.describe()``)."""
        params = params or {}
        stop = params.get("streak_stop_at")
        if params.get("cap_mode") == "explicit":
            return cls(None, None, None, int(stop) if stop else None, explicit_cap=int(params["hard_cap"]))
        if params.get("cap_mode") != "adaptive":
            return cls(None, None, None)
        return cls(int(params["soft_cap"]), float(params["multiplier"]), int(params["stuck_repeat"]),
                   int(stop) if stop else None)

    @property
    def main(self) -> tuple[Any, ...]:
        return (self.soft_cap, self.multiplier, self.stuck_repeat, self.streak_stop, self.explicit_cap)

    @property
    def unknown(self) -> int:
        return self.turns - self.resolved - self.unresolved

    def add(self, calls: int, resolved: bool | None, main: TurnResult | None, halted_by: str | None = None,
            untold: bool = False, facts: TurnFacts | None = None, repeat_signal: bool = True,
            limits: Limits | None = None) -> None:
        """One probe turn; ``main``: the main configuration's unattended replay of it (``None``: cannot
        fire); ``halted_by``: the probe's own threshold that halted it (``fate_of``), ``limits``: the
        probe's own, as recorded; ``facts``: its counts under the main keys, for the D and streak ladders."""
        self.turns += 1
        self.calls += calls
        self.resolved += resolved is True
        self.unresolved += resolved is False
        self.censored += halted_by is not None
        fate = self.fate_of(resolved, halted_by, limits)
        censored = fate in ("censored", "cut")
        if untold and not (main is not None and main.halt_call):
            self.main_untold += 1
        if main is not None and main.halt_call:
            self.past_main += 1
            self.calls_past_main += max(0, calls - main.halt_call + 1)
        if self.explicit_cap is not None:
            step = value_step(self.explicit_cap)
            reach = min(TOP, (calls - 1) // step)
            self.ladders["explicit"].add(reach, fate, [v * step for v in range(1, reach + 1)],
                                         calls)
            if facts is not None:
                self._climb_counts(calls, fate, facts)
        if self.soft_cap is None:
            return
        for k, passed in self.multiples.items():
            limit = self.soft_cap * k
            if calls > limit:
                passed.add(resolved, calls - limit, censored)
        if main is not None and main.halt_call:
            row = {"soft_stuck": self.stuck, "streak": self.streak}.get(main.threshold or "")
            if row is not None:
                row.add(resolved, calls - main.halt_call + 1, censored)
        self._climb(calls, fate, facts, repeat_signal)

    def fate_of(self, resolved: bool | None, halted_by: str | None, limits: Limits | None) -> str:
        """A probe turn's fate on the ladders (``FATES``): a halt of the probe's loop detector says it
        failed only where the probe ran that detector at ``SEEN_LOOPING`` times the main's or more."""
        if resolved is True or halted_by not in LOOP_DETECTORS:
            return _fate(resolved, halted_by in CENSORING_HALTS)
        stuck = halted_by == "soft_stuck"
        main = self.stuck_repeat if stuck else self.streak_stop
        own = None if limits is None else limits.stuck_repeat_threshold if stuck else limits.streak_stop_at
        seen = main is not None and own is not None and own >= SEEN_LOOPING * main
        return _fate(resolved, False) if seen else "cut"

    def _climb(self, calls: int, fate: str, facts: TurnFacts | None, repeat_signal: bool) -> None:
        """The turn on each ladder, at the largest value that would halt it, with the calls it
        makes before each lower value would (the call a halt refuses is not made)."""
        s = self.soft_cap
        assert s is not None
        reach = min(TOP, (calls - 1) // s)
        self.ladders["backstop"].add(reach, fate, [k * s for k in range(1, reach + 1)], calls)
        if facts is None:
            return
        if repeat_signal and calls > s and facts.reach_repeat:
            reach = min(TOP, facts.max_repeat)
            self.ladders["stuck"].add(reach, fate, [max(s + 1, c) - 1 for c in facts.reach_repeat[:reach]], calls)
        self._climb_counts(calls, fate, facts)
        if repeat_signal and self.multiplier is not None and self.stuck_repeat is not None:
            self._climb_soft(calls, fate, facts)

    def _climb_counts(self, calls: int, fate: str, facts: TurnFacts) -> None:
        """The turn on the ladders that do not depend on the cap: the streak stop, the cycle cap."""
        if facts.reach_failing:
            reach = min(TOP, facts.max_failing)
            self.ladders["streak"].add(reach, fate, list(facts.reach_failing[:reach]), calls)
        if facts.cycles > 1:
            reach = min(TOP, facts.cycles - 1)
            self.ladders["cycles"].add(reach, fate, [c - 1 for c in facts.cycle_calls[1:reach + 1]], calls)

    def _climb_soft(self, calls: int, fate: str, facts: TurnFacts) -> None:
        """The turn on the soft cap's ladder (m and D held): halted at ``m s + 1`` calls, or where its
        most repeated call reaches D past s, whichever comes first."""
        assert self.multiplier is not None and self.stuck_repeat is not None
        step, m, d = value_step(self.soft_cap or 1), self.multiplier, self.stuck_repeat
        stuck_at = facts.reach_repeat[d - 1] if facts.max_repeat >= d else None

        def halt_call(s: int) -> int | None:
            """The call soft cap ``s`` refuses (``None``: it does not halt the turn)."""
            backstop = int(s * Fraction(repr(m))) + 1  # as ``GuardConfig.hard_cap``: no float rounding
            stuck = max(s + 1, stuck_at) if stuck_at is not None else backstop
            first = min(backstop, stuck)
            return first if first <= calls else None

        reach = min(TOP, (calls - 1) // step if stuck_at is not None else int(calls / m / step) + 1)
        while reach and halt_call(reach * step) is None:
            reach -= 1
        self.ladders["soft"].add(reach, fate, [(halt_call(v * step) or calls) - 1 for v in range(1, reach + 1)], calls)

    def rows(self) -> list[tuple[str, Passed]]:
        """``(key, row)`` for each threshold: ``"<k>"`` for the multiples, then ``"stuck"`` and
        ``"streak"``."""
        return [*((str(k), p) for k, p in self.multiples.items()), ("stuck", self.stuck), ("streak", self.streak)]

    def merge(self, other: ProbeEvidence) -> None:
        if self.main != other.main or set(self.multiples) != set(other.multiples):
            raise ValueError("cannot merge probe evidence measured against different main configurations")
        for name in _EVIDENCE_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, passed in self.multiples.items():
            passed.merge(other.multiples[k])
        self.stuck.merge(other.stuck)
        self.streak.merge(other.streak)
        for key, ladder in self.ladders.items():
            ladder.merge(other.ladders[key])

    def to_json(self) -> dict[str, Any]:
        """The counts (``decision.py`` adds what they decide)."""
        return dump(self, _EVIDENCE_KEYS)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeEvidence:
        evidence = cls(**load(data, _EVIDENCE_KEYS))
        if evidence.resolved + evidence.unresolved > evidence.turns or evidence.censored > evidence.turns or \
                evidence.past_main + evidence.main_untold > evidence.turns:
            raise ValueError("inconsistent probe evidence counts: more results than probe turns")
        multiples = data["passed_multiple"]
        if evidence.soft_cap is not None and set(multiples) != {str(k) for k in evidence.multiples}:
            raise ValueError(f"the probe evidence's multiples are not those of x{evidence.multiplier}: "
                             f"{sorted(multiples)}")
        evidence.multiples = {k: Passed.from_json(multiples[str(k)]) for k in evidence.multiples}
        return evidence


def _fate(resolved: bool | None, censored: bool) -> str:
    """A probe turn's fate as its rows count it (``Passed.add``)."""
    return "resolved" if resolved is True else "censored" if censored else (
        "unresolved" if resolved is False else "unknown")


def multiples_for(multiplier: float | None) -> tuple[int, ...]:
    """``MULTIPLES``, with the main configuration's own multiplier when it is a whole number."""
    extra = {int(multiplier)} if multiplier is not None and float(multiplier).is_integer() else set()
    return tuple(sorted({*MULTIPLES, *extra}))


def _limit(value: Any, what: str) -> int | None:
    return None if value is None else count(value, what)


def _multiplier(value: Any, what: str) -> float | None:
    if value is not None and (type(value) not in (int, float) or not 0 < value <= MAX_COUNT):
        raise ValueError(f"the probe evidence's multiplier must be a positive number, got {value!r:.40}")
    return None if value is None else float(value)


def _passed(value: Any, what: str) -> Passed:
    return Passed.from_json(value)


_EVIDENCE_KEYS = (
    Key("soft_cap", into=_limit), Key("multiplier", into=_multiplier), Key("stuck_repeat", into=_limit),
    Key("streak_stop", into=_limit), Key("explicit_cap", into=_limit, missing=None),
    *map(Key, ("turns", "resolved", "unresolved", "calls", "live_turns", "censored", "past_main",
               "calls_past_main")),
    Key("main_untold", missing=0), Key("unknown", into=None),
    Key("passed_multiple", "multiples", lambda m: {str(k): p.to_json() for k, p in m.items()}, None),
    Key("passed_stuck", "stuck", Passed.to_json, _passed), Key("passed_streak", "streak", Passed.to_json, _passed),
    Key("ladders", out=lambda ladders: {k: v.to_json() for k, v in ladders.items()},
        into=lambda v, _: ladders_from_json(v), missing=None),
)
"""``ProbeEvidence`` as a result holds it (``from_json`` reads the multiples: they depend on the
multiplier); ``main_untold`` was added after the format's first results: absent there, read as 0."""
_EVIDENCE_COUNTS = tuple(k.name for k in _EVIDENCE_KEYS if k.into is count)


# -- the frontier: a value to set for each probed threshold, what it buys and costs ---------------

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
    """Turns it would halt with a known fate (resolved, unresolved, censored, cut)."""
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
    censored: int = 0
    """Of ``at_risk``, the turns halted later at a limit of the probe's own: counted as not
    productive (what they would have done past it is unknown), and said so wherever they count."""
    cut: int = 0
    """Of ``at_risk``, the turns a loop detector of the probe's own halted not well past the main one
    (``SEEN_LOOPING``): productive at the interval's high end, so they never let a value be within."""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "at_risk": self.at_risk, "productive": self.productive, "unknown": self.unknown,
                "censored": self.censored, "cut": self.cut,
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
    limit_too_low: bool = False
    """Whether productive turns were still ending near the probe's own limit (``horizon_too_low``):
    then no value is within, and the sentence asks to raise that limit."""

    def rung(self, value: int) -> Rung:
        return self.rungs[value // self.unit - 1]

    def settable(self, r: Rung) -> bool:
        """Whether ``r`` is a value calibrate would recommend (``_probe.judged``); the others are the
        ladder's bottom, never recommended, judged or shown."""
        return judged(r.value, self.live, self.unit)

    def shown(self) -> list[Rung]:
        """The rungs the table shows: the usual values, the live, the recommended, the first with
        no productive turn and the last with evidence."""
        if not self.rungs or self.live is None:
            return []
        last = max((r.value for r in self.rungs if r.at_risk), default=0)
        zero = next((r.value for r in self.rungs if r.at_risk and not r.productive), None)
        usual = SHOWN.get(self.threshold) or tuple(self.live * k // 2 // self.unit * self.unit for k in (3, 4, 6))
        picks = {*usual, self.live, last, *(v for v in (self.recommended, zero) if v is not None)}
        return [r for r in self.rungs if r.value in picks and r.value <= max(last, self.live) and self.settable(r)]

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "live": self.live, "probed": self.probed, "recommended": self.recommended,
                "keep": self.recommended == self.live, "horizon": self.horizon, "sentence": self.sentence,
                "rows": [r.to_json() for r in self.rungs if (r.at_risk or r.value == self.live) and self.settable(r)]}


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


KNOWN_FATES = ("resolved", "unresolved", "censored", "cut")
"""The fates a turn at risk has: every one but ``unknown``."""


def _at_risk(fates: dict[str, int]) -> int:
    return sum(fates[f] for f in KNOWN_FATES)


NEAR = 0.75
"""A productive turn ending past this share of the rungs judged ends *near* the probe's own limit."""


def horizon_too_low(ladder: Ladder, last: int) -> bool:
    """Whether the probe's own limit may have cut productive turns off: the longest productive turn
    (reach ``longest``) ended near it (past ``NEAR`` of the rungs judged, ``last`` the highest),
    turns it censored reach past that turn, and the rungs between that turn and the limit, the
    *gap*, do not show that productive turns had stopped ending. The exact conditional test of
    equal success hazards, in turns at risk per rung, in the gap and in the twice as many rungs
    before it: ``share ** successes``, ``share`` the earlier rungs' part of the exposure, is the
    chance that every success falls before the gap if the hazard had not fallen; under
    ``EXACT.value`` it has fallen, and the censored turns are the runaways the frontier counts them
    as. No gap at all (a productive turn ending at the last rung judged) is too low."""
    longest = max((k for k in ladder.fates["resolved"] if k <= last), default=None)
    if longest is None or longest < NEAR * last or not ladder.at(longest + 1)["censored"]:
        return False
    gap = last - longest
    if gap <= 0:
        return True
    first = max(1, longest + 1 - 2 * gap)
    successes = ladder.at(first)["resolved"] - ladder.at(longest + 1)["resolved"]
    before = sum(_at_risk(ladder.at(i)) for i in range(first, longest + 1))
    after = sum(_at_risk(ladder.at(i)) for i in range(longest + 1, last + 1))
    return (before / (before + after)) ** successes >= EXACT.value


def frontier(threshold: str, ladder: Ladder, live: int, tolerance: float, scale: Scale,
             horizon: int | None = None, unit: int = 1) -> Frontier:
    """The frontier of one threshold against ``tolerance``; ``horizon``: the probe's own limit
    (values at or past it are not judged; when it is too low to tell productive turns from
    runaways, ``horizon_too_low``, no value is within); ``unit``: the ladder's step (``live`` a
    multiple of it)."""
    top = max(ladder.top(), live // unit)
    base = ladder.calls_under(live // unit)
    blind = horizon is not None and horizon_too_low(ladder, (horizon - 1) // unit)
    rungs = []
    for i in range(1, min(top, TOP) + 1):
        v = i * unit
        fates = ladder.at(i)
        n = _at_risk(fates)
        low, high = upper_bound(fates["resolved"], n)[0], upper_bound(fates["resolved"] + fates["cut"], n)[1]
        extra = ladder.calls_under(i) - base
        if horizon is not None and v >= horizon:
            decision = "past_cap"
        elif not n:
            decision = "no_evidence"
        else:
            decision = "within" if high < tolerance and not blind else "above" if low > tolerance else "undecided"
        rungs.append(Rung(v, n, fates["resolved"], fates["unknown"], low, high, extra, scale.share(extra), decision,
                          fates["censored"], fates["cut"]))
    f = Frontier(threshold, SETTINGS[threshold], live, None, tuple(rungs), "", horizon, unit, limit_too_low=blind)
    recommended = next((r.value for r in rungs if r.decision == "within" and f.settable(r)), None)
    f = dataclasses.replace(f, recommended=recommended)
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


def _what(threshold: str, v: int, which: int = 0) -> str:
    """``WORDS[threshold]``'s first sentence for ``v`` (``which=1``: its second)."""
    return WORDS[threshold][which].format(v=v, next=v + 1)


def value_text(threshold: str, v: int) -> str:
    return f"{v}x" if threshold == "backstop" else f"{v:,}"


def _cost(r: Rung) -> str:
    if r.extra_calls == 0:
        return "costs no calls"
    share = f"{abs(r.extra_share):.1%}" if r.extra_share is not None else f"{abs(r.extra_calls):,} probe calls"
    if r.extra_calls > 0:
        return f"lets turns that never resolve burn {share} more calls"
    return f"saves {share} of calls that turns which never resolve burn"


def _of(r: Rung, t: str | None) -> str:
    """``P of N`` turns at risk at ``r`` (``t``: the threshold, to say which), with how many of
    them the probe's own limit halted."""
    what = f" {_what(t, r.value)}" if t is not None else ""
    censored = f", {r.censored:,} of them halted at the probe's own limit" if r.censored else ""
    return f"{r.productive:,} of {r.at_risk:,}{what}{censored}{_cut(r)}"


def _cut(r: Rung) -> str:
    return (f", {r.cut:,} of them halted by the probe's own loop detector, not far enough past the live value to "
            "say they failed (counted as productive at the high end)" if r.cut else "")


def _bound(r: Rung) -> str:
    how = "exact binomial" if not r.productive + r.cut else "Wilson"
    return f"at most {r.high:.1%} at 95%, {how}"


def sentence(f: Frontier, tolerance: float) -> str:
    """The frontier in one plain sentence."""
    if not any(r.at_risk and f.settable(r) for r in f.rungs):
        return (f"{f.setting}: no probe turn with a known fate would be halted by any value of it: nothing to "
                "recommend yet.")
    if f.recommended is not None:
        return _recommended(f, f.rung(f.recommended))
    return _none_within(f, tolerance)


def _recommended(f: Frontier, r: Rung) -> str:
    """Keep or set the recommended value ``r``: what it spares (or halts) and costs."""
    t = f.threshold
    if r.productive:
        censored = f", {r.censored:,} of the {r.at_risk:,} halted at the probe's own limit" if r.censored else ""
        spared = (f"it halts {r.productive:,} of the {r.at_risk:,} probe turns {_what(t, r.value)} that succeeded "
                  f"({r.productive / r.at_risk:.1%}{censored}{_cut(r)}; {_bound(r)})")
    else:
        below = r.value - f.unit
        longest = f"; {_what(t, below, 1)}" if below >= f.unit and f.rung(below).productive else ""
        spared = f"it spares every productive turn the probe saw ({_of(r, t)}; {_bound(r)}{longest})"
    if r.value == f.live:
        return f"keep {f.setting} = {r.value}: {spared}."
    return f"set {f.setting} = {r.value}: {spared} and {_cost(r)}."


def _none_within(f: Frontier, tolerance: float) -> str:
    """Why no value is within the tolerance, and what would make one."""
    name, t = f.setting, f.threshold
    judged = [r for r in f.rungs if r.at_risk and r.decision != "past_cap" and f.settable(r)]
    if not judged:
        cap = f" ({value_text(t, f.horizon)})" if f.horizon else ""
        return (f"{name}: no value below the probe's own limit{cap} has a probe turn at risk: raise the probe's "
                f"limit to see past it.")
    last = judged[-1]
    if f.limit_too_low:
        return _limit_too_low(f, tolerance)
    zero = next((r for r in judged if not r.productive), None)
    if zero is not None and zero.cut:
        return (f"no value of {name} is within the tolerance of {tolerance:.0%}: the probe saw no productive turn "
                f"{_what(t, zero.value)} ({_of(zero, None)}; {_bound(zero)}); more turns will not decide it: raise "
                f"the probe's own {name} to {SEEN_LOOPING * (f.live or 1):,} or more to see past them.")
    if zero is not None:
        longest = f"{_what(t, zero.value - f.unit, 1)}; " if zero.value > f.unit else ""
        return (f"no value of {name} is within the tolerance of {tolerance:.0%} yet: the probe saw no productive "
                f"turn {_what(t, zero.value)} ({longest}{_of(zero, None)}; {_bound(zero)}); about "
                f"{turns_for_zero(tolerance):,} turns at risk there with none productive would bring the bound "
                f"under {tolerance:.0%}: let the probe run.")
    said = (f"no value of {name} up to {value_text(t, last.value)} is within the tolerance of {tolerance:.0%}: the "
            f"probe saw productive turns {_what(t, last.value)} ({_of(last, None)})")
    if t == "backstop" or (f.horizon is not None and last.value + f.unit >= f.horizon):
        cap = value_text(t, f.horizon if f.horizon else last.value)
        return f"{said}; raise the probe's own limit to see past {cap}."
    more = "; or try stuck_signal='stale_repeat' (it spares turns that edit and rerun a test)" if t == "stuck" else ""
    return (f"{said}, and none reaching more with a known fate: {name} = {last.value + f.unit} or more spares them, "
            f"but the probe cannot yet say what it would halt{more}.")


def _limit_too_low(f: Frontier, tolerance: float) -> str:
    """No value is within because productive turns were still ending near the probe's own limit."""
    t = f.threshold
    longest = max(r.value for r in f.rungs if r.productive)
    past = next((r for r in f.rungs if r.value > longest), None)
    cut = (f" and {past.censored:,} of the {past.at_risk:,} probe turns past it were halted at the probe's own "
           "limit: productive ones it cut off look there like runaways") if past is not None else ""
    cap = value_text(t, f.horizon) if f.horizon else value_text(t, longest)
    return (f"no value of {f.setting} is within the tolerance of {tolerance:.0%}: productive turns were "
            f"still ending near the probe's own limit ({_what(t, longest, 1)}{cut}); raise the probe's own limit "
            f"to see past {cap}.")
