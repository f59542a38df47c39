"""Probe evidence: what probe turns did past the main configuration's thresholds.

A probe turn (``cohort: "probe"`` in the recorder's lines, ``turnguard.turn.cohort`` on OTLP turn
spans) was guarded live by a more lenient configuration, so it shows what happens past the
thresholds the main configuration would have stopped it at. For each multiple ``k x S`` of the
main soft cap (``MULTIPLES``) and for the stuck threshold D (the main configuration replayed on
the turn would have halted it as ``soft_stuck``), this counts the probe turns that passed it, how
many of them were resolved, unresolved or of unknown result, and the calls they made past it
(what raising the threshold costs). The resolved share gets a 95% Wilson score interval.

Everything is a counter, so partial runs merge exactly and memory does not grow with the turns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turnguard.probe import Cohort

if TYPE_CHECKING:
    from turnguard.calibrate.replay import TurnResult

MULTIPLES = (2, 3, 5, 10, 20)
"""The multiples of S whose passing turns are counted (the grid's backstop multipliers)."""
PROBE = Cohort.PROBE.value
LIVE = Cohort.LIVE.value
Z95 = 1.959963984540054
"""The standard normal quantile for a two-sided 95% interval."""
FEW = 10
"""Below this many turns with a known result, the recommendation says the interval is wide."""


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (Wilson 1927; Newcombe 1998, method
    3): unlike the normal approximation it stays inside [0, 1] and is sensible at 0 and n
    successes, where the evidence here usually sits. ``trials == 0``: ``(0.0, 1.0)``."""
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


@dataclass
class Passed:
    """The probe turns that passed one threshold."""

    turns: int = 0
    resolved: int = 0
    unresolved: int = 0
    calls_past: int = 0
    """Calls these turns made past the threshold: what letting them run past it cost."""

    @property
    def unknown(self) -> int:
        return self.turns - self.resolved - self.unresolved

    @property
    def known(self) -> int:
        return self.resolved + self.unresolved

    def interval(self) -> tuple[float, float]:
        """95% interval of the resolved share among the turns with a known result."""
        return wilson_interval(self.resolved, self.known)

    def add(self, resolved: bool | None, calls_past: int) -> None:
        self.turns += 1
        self.resolved += resolved is True
        self.unresolved += resolved is False
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
        passed = cls(**{name: int(data[name]) for name in _PASSED_COUNTS})
        if passed.known > passed.turns or min(passed.turns, passed.resolved, passed.unresolved, passed.calls_past) < 0:
            raise ValueError(f"inconsistent probe evidence counts: {data!r}")
        return passed


_PASSED_COUNTS = ("turns", "resolved", "unresolved", "calls_past")


@dataclass
class ProbeEvidence:
    """Probe turns against the main configuration's ``soft_cap`` S, ``multiplier`` m and stuck
    threshold D (the run's default policy; ``None`` when it has no adaptive cap)."""

    soft_cap: int | None
    multiplier: float | None
    stuck_repeat: int | None
    turns: int = 0
    resolved: int = 0
    unresolved: int = 0
    calls: int = 0
    live_turns: int = 0
    multiples: dict[int, Passed] = field(default_factory=lambda: {k: Passed() for k in MULTIPLES})
    stuck: Passed = field(default_factory=Passed)
    """Turns the main configuration would have halted as ``soft_stuck`` (past S, stuck at D)."""

    @classmethod
    def for_policy(cls, params: dict[str, Any] | None) -> ProbeEvidence:
        """Evidence against a policy's parameters (``Policy.describe()``)."""
        params = params or {}
        if params.get("cap_mode") != "adaptive":
            return cls(None, None, None)
        return cls(int(params["soft_cap"]), float(params["multiplier"]), int(params["stuck_repeat"]))

    @property
    def unknown(self) -> int:
        return self.turns - self.resolved - self.unresolved

    def add(self, calls: int, resolved: bool | None, main: TurnResult | None) -> None:
        """One probe turn of ``calls`` calls; ``main``: the main configuration's unattended replay
        of it (``None`` when it cannot fire on the turn)."""
        self.turns += 1
        self.calls += calls
        self.resolved += resolved is True
        self.unresolved += resolved is False
        if self.soft_cap is None:
            return
        for k, passed in self.multiples.items():
            limit = self.soft_cap * k
            if calls > limit:
                passed.add(resolved, calls - limit)
        if main is not None and main.halt_call and main.threshold == "soft_stuck":
            self.stuck.add(resolved, calls - main.halt_call + 1)

    def merge(self, other: ProbeEvidence) -> None:
        if (self.soft_cap, self.multiplier, self.stuck_repeat) != (other.soft_cap, other.multiplier,
                                                                   other.stuck_repeat):
            raise ValueError("cannot merge probe evidence measured against different main configurations")
        for name in _EVIDENCE_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, passed in self.multiples.items():
            passed.merge(other.multiples[k])
        self.stuck.merge(other.stuck)

    def to_json(self) -> dict[str, Any]:
        return {
            "soft_cap": self.soft_cap,
            "multiplier": self.multiplier,
            "stuck_repeat": self.stuck_repeat,
            **{name: getattr(self, name) for name in _EVIDENCE_COUNTS},
            "unknown": self.unknown,
            "passed_multiple": {str(k): p.to_json() for k, p in self.multiples.items()},
            "passed_stuck": self.stuck.to_json(),
            "recommendation": recommendation(self),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeEvidence:
        soft_cap, multiplier, stuck = data["soft_cap"], data["multiplier"], data["stuck_repeat"]
        evidence = cls(None if soft_cap is None else int(soft_cap), None if multiplier is None else float(multiplier),
                       None if stuck is None else int(stuck))
        for name in _EVIDENCE_COUNTS:
            setattr(evidence, name, int(data[name]))
        evidence.multiples = {k: Passed.from_json(data["passed_multiple"][str(k)]) for k in MULTIPLES}
        evidence.stuck = Passed.from_json(data["passed_stuck"])
        return evidence


_EVIDENCE_COUNTS = ("turns", "resolved", "unresolved", "calls", "live_turns")


def _share(passed: Passed) -> str:
    low, high = passed.interval()
    return f"95% interval of the resolved share {low:.0%}-{high:.0%}"


def _probe_turns(n: int) -> str:
    return f"{n:,} probe turn" + ("" if n == 1 else "s")


def _few(passed: Passed) -> str:
    return f"; only {passed.known:,} with a result, so the interval is wide" if passed.known < FEW else ""


def _multiple(m: float) -> str:
    return f"{m:g}x"


def backstop_advice(e: ProbeEvidence) -> str:
    """The backstop ``m x S`` in words, from the probe turns that passed it."""
    assert e.soft_cap is not None and e.multiplier is not None
    m, s = e.multiplier, e.soft_cap
    passed = e.multiples.get(int(m)) if float(m).is_integer() else None
    head = f"On {_probe_turns(e.turns)}"
    if passed is None:
        return (f"{head}: the backstop {_multiple(m)} is not one of the measured multiples "
                f"({', '.join(map(_multiple, MULTIPLES))}); read the rows beside it.")
    if passed.turns == 0:
        return (f"{head}, none passed {_multiple(m)} (S={s:,}, {int(m * s):,} calls): no evidence about the "
                f"backstop yet; keep {_multiple(m)} and let the probe run until turns reach it.")
    if passed.known == 0:
        return (f"{head}, {passed.turns:,} passed {_multiple(m)} but none has a result: report results "
                "(turn.report_result / guard.report_result) to judge the backstop.")
    few = _few(passed)
    if passed.resolved == 0:
        return (f"{head}, {passed.turns:,} passed {_multiple(m)} and none of the {passed.known:,} with a result "
                f"was resolved ({_share(passed)}{few}): keep {_multiple(m)}; letting them run on cost "
                f"{passed.calls_past:,} calls past it for nothing.")
    higher = [k for k in MULTIPLES if k > m]
    target = next((k for k in higher if e.multiples[k].resolved == 0), None)
    said = (f"{head}, {passed.turns:,} passed {_multiple(m)} and {passed.resolved:,} of them "
            f"{'was' if passed.resolved == 1 else 'were'} resolved (of {passed.known:,} with a result; "
            f"{_share(passed)}{few}): the backstop halts turns that would have succeeded")
    if target is None:
        return f"{said}, even past {_multiple(max(MULTIPLES))}; raise it beyond that or probe with a higher one."
    cost = passed.calls_past - e.multiples[target].calls_past
    return (f"{said}; raising it to {target}x would have let them finish, at {cost:,} more calls on the "
            f"{passed.turns:,} turns past {_multiple(m)}.")


def stuck_advice(e: ProbeEvidence) -> str:
    """The stuck threshold D in words, from the probe turns the main configuration would have
    halted as ``soft_stuck``."""
    passed, d = e.stuck, e.stuck_repeat
    if passed.turns == 0:
        return (f"No probe turn would have been halted as stuck (D={d}, past S={e.soft_cap:,}): no evidence "
                f"about D yet; keep D={d}.")
    if passed.known == 0:
        return f"{_probe_turns(passed.turns)} would have been halted as stuck (D={d}), none has a result yet."
    said = (f"{_probe_turns(passed.turns)} would have been halted as stuck (D={d}) and {passed.resolved:,} of the "
            f"{passed.known:,} with a result {'was' if passed.resolved == 1 else 'were'} resolved "
            f"({_share(passed)}{_few(passed)})")
    if passed.resolved == 0:
        return f"{said}: keep D={d}; going on cost {passed.calls_past:,} calls past the would-be halt."
    return (f"{said}: D={d} halts turns that would have succeeded; raise D or try stuck_signal='stale_repeat' "
            f"(it spares edit-and-rerun), at {passed.calls_past:,} calls past the would-be halts.")


def recommendation(e: ProbeEvidence) -> list[str]:
    """What the evidence says about the backstop and about D, in words (empty: no probe turns)."""
    if e.turns == 0:
        return []
    if e.soft_cap is None:
        return [f"{e.turns:,} probe turns, but the main configuration has no adaptive cap: nothing to compare."]
    return [backstop_advice(e), stuck_advice(e)]
