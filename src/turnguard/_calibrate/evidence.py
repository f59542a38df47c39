"""Probe evidence: what probe turns did past the main configuration's thresholds.

A probe turn was guarded by a more lenient configuration, so it shows what happens past the main
thresholds. For each multiple of the soft cap, D and the streak stop this counts the turns that
passed it by result, or censored (halted later by the probe's own limits: fate unknown), and the
calls they made past it; the ladders give, per threshold, the largest value that would halt each
probe turn (``frontier.py``). All are bounded histograms or counters, so partial runs merge exactly."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from turnguard._calibrate.bounds import MAX_COUNT, add_count, add_counts, count, histogram, histogram_json
from turnguard._probe import Cohort

if TYPE_CHECKING:
    from turnguard._calibrate.replay import TurnResult
    from turnguard._firing import TurnFacts

LOOP_DETECTORS = frozenset({"soft_stuck", "streak"})
"""The probe's halts that say the turn was looping (it failed); any other halt is a length limit
that cuts a turn that might have succeeded: censored."""
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
    """Turns the probe halted later at a length limit of its own (its backstop, explicit or cycle
    cap) whose task was not reported done: whether they would have succeeded is not recorded."""
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
        return {**{name: getattr(self, name) for name in _PASSED_COUNTS}, "unknown": self.unknown,
                "resolved_interval": [round(low, 6), round(high, 6)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Passed:
        passed = cls(**{name: count(data[name]) for name in _PASSED_COUNTS})
        if passed.known > passed.turns:
            raise ValueError(f"inconsistent probe evidence counts: {data!r}")
        return passed


_PASSED_COUNTS = ("turns", "resolved", "unresolved", "censored", "calls_past")


# -- ladders: probe turns by the largest value of a threshold that would halt them (frontier.py) -----

TOP = 256
"""The highest value a ladder tells apart: a turn reaching past it counts as reaching it."""
FATES = ("resolved", "unresolved", "censored", "unknown")
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
        if fate in ("unresolved", "censored"):
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


@dataclass
class ProbeEvidence:
    """Probe turns against the main configuration's ``soft_cap`` S, ``multiplier`` m, stuck
    threshold D and streak stop (the run's default policy; all ``None`` without an adaptive cap)."""

    soft_cap: int | None
    multiplier: float | None
    stuck_repeat: int | None
    streak_stop: int | None = None
    turns: int = 0
    resolved: int = 0
    unresolved: int = 0
    calls: int = 0
    live_turns: int = 0
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
    multiples: dict[int, Passed] = field(default_factory=dict)
    stuck: Passed = field(default_factory=Passed)
    """Turns the main configuration would have halted as ``soft_stuck`` (past S, stuck at D)."""
    streak: Passed = field(default_factory=Passed)
    """Turns the main configuration would have halted at its streak stop (unattended)."""
    ladders: dict[str, Ladder] = field(default_factory=new_ladders)
    """By threshold (``ladder.LADDERS``): the probe turns by the largest value that would halt
    them, for the recommended values (``frontier.py``)."""
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
            untold: bool = False, facts: TurnFacts | None = None, repeat_signal: bool = True) -> None:
        """One probe turn; ``main``: the main configuration's unattended replay of it (``None``: cannot
        fire); ``halted_by``: the probe's own threshold that halted it (a length limit censors it, a loop
        detector means it failed); ``facts``: its counts under the main keys, for the D and streak ladders."""
        self.turns += 1
        self.calls += calls
        self.resolved += resolved is True
        self.unresolved += resolved is False
        self.censored += halted_by is not None
        censored = halted_by is not None and halted_by not in LOOP_DETECTORS
        if untold and not (main is not None and main.halt_call):
            self.main_untold += 1
        if main is not None and main.halt_call:
            self.past_main += 1
            self.calls_past_main += max(0, calls - main.halt_call + 1)
        if self.explicit_cap is not None:
            step = value_step(self.explicit_cap)
            reach = min(TOP, (calls - 1) // step)
            self.ladders["explicit"].add(reach, _fate(resolved, censored), [v * step for v in range(1, reach + 1)],
                                         calls)
            if facts is not None:
                self._climb_counts(calls, _fate(resolved, censored), facts)
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
        self._climb(calls, _fate(resolved, censored), facts, repeat_signal)

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
        return {
            "soft_cap": self.soft_cap,
            "multiplier": self.multiplier,
            "stuck_repeat": self.stuck_repeat,
            "streak_stop": self.streak_stop,
            "explicit_cap": self.explicit_cap,
            **{name: getattr(self, name) for name in _EVIDENCE_COUNTS},
            "unknown": self.unknown,
            "passed_multiple": {str(k): p.to_json() for k, p in self.multiples.items()},
            "passed_stuck": self.stuck.to_json(),
            "passed_streak": self.streak.to_json(),
            "ladders": ladders_to_json(self.ladders),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeEvidence:
        soft_cap, multiplier, stuck, stop = (data["soft_cap"], data["multiplier"], data["stuck_repeat"],
                                             data["streak_stop"])
        if multiplier is not None and (type(multiplier) not in (int, float) or not 0 < multiplier <= MAX_COUNT):
            raise ValueError(f"the probe evidence's multiplier must be a positive number, got {multiplier!r:.40}")
        evidence = cls(None if soft_cap is None else count(soft_cap), None if multiplier is None else float(multiplier),
                       None if stuck is None else count(stuck), None if stop is None else count(stop))
        explicit = data.get("explicit_cap")
        evidence.explicit_cap = None if explicit is None else count(explicit)
        for name in _EVIDENCE_COUNTS:
            setattr(evidence, name, count(data.get(name, 0) if name in _ADDED_COUNTS else data[name]))
        if evidence.resolved + evidence.unresolved > evidence.turns or evidence.censored > evidence.turns or \
                evidence.past_main + evidence.main_untold > evidence.turns:
            raise ValueError("inconsistent probe evidence counts: more results than probe turns")
        multiples = data["passed_multiple"]
        if soft_cap is not None and set(multiples) != {str(k) for k in evidence.multiples}:
            raise ValueError(f"the probe evidence's multiples are not those of x{multiplier}: {sorted(multiples)}")
        evidence.multiples = {k: Passed.from_json(multiples[str(k)]) for k in evidence.multiples}
        evidence.stuck = Passed.from_json(data["passed_stuck"])
        evidence.streak = Passed.from_json(data["passed_streak"])
        evidence.ladders = ladders_from_json(data.get("ladders"))
        return evidence


def _fate(resolved: bool | None, censored: bool) -> str:
    """A probe turn's fate as its rows count it (``Passed.add``)."""
    return "resolved" if resolved is True else "censored" if censored else (
        "unresolved" if resolved is False else "unknown")


def multiples_for(multiplier: float | None) -> tuple[int, ...]:
    """``MULTIPLES``, with the main configuration's own multiplier when it is a whole number."""
    extra = {int(multiplier)} if multiplier is not None and float(multiplier).is_integer() else set()
    return tuple(sorted({*MULTIPLES, *extra}))


_EVIDENCE_COUNTS = ("turns", "resolved", "unresolved", "calls", "live_turns", "censored", "past_main",
                    "calls_past_main", "main_untold")
_ADDED_COUNTS = frozenset({"main_untold"})
"""Counts added after the format's first results: absent there, read as 0."""
