"""What the boards' probe evidence must show, computed in Python, never from the boards' own
PromQL: the probe rows as ``turnguard calibrate`` counts and decides them (``evidence.Passed``,
``decision.decide``: the board must agree with it), the plain Wilson interval and a brute-force
search for the turns still needed (to check the closed form both use), and the product-limit
estimate by walking the buckets."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turnguard import TurnSummary
from turnguard._calibrate.advice import decide
from turnguard._calibrate.evidence import Z95, Passed, wilson_interval
from turnguard._calibrate.survival import CENSORING_ENDS, loglog_interval
from turnguard._probe import CENSORING_HALTS, SEEN_LOOPING
from turnguard.telemetry._recorder import ended_by

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


def finished(summary: TurnSummary) -> bool:
    """Whether the turn finished (an event), as calibrate's survival counts it: by ``ended_by``, its
    threshold when one halted it (however the host ended it), else its reason."""
    return ended_by(summary) not in CENSORING_ENDS


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
            return 1.0 if survival == 0 else math.nan  # after every turn at risk finished, S stays 0
        survival *= 1 - finished / at_risk
    return 1 - survival



EXACT = 0.05
"""The one-sided exact binomial bound where the estimate is 0 or 1: ``1 - 0.05^(1/N)``."""


def survival_row(turns: Iterable[tuple[int, bool]], edges: Sequence[float], start: float, end: float
                 ) -> dict[str, float]:
    """One row of the survival table: ``finished_by`` with its 95% interval (calibrate's log-log one
    from Greenwood's sum where the share is strictly between 0 and 1, the exact binomial bound over
    the turns whose fate by ``end`` is known where it is 0 or 1), the turns past ``start`` and past
    ``end``."""
    turns = list(turns)
    cut = [e for e in edges if start <= e <= end]
    survival, greenwood, finishing = 1.0, 0.0, 0
    for low, high in itertools.pairwise(cut):
        beyond = sum(1 for calls, _ in turns if calls > high)
        finished = sum(1 for calls, completed in turns if completed and low < calls <= high)
        at_risk = beyond + finished
        if at_risk == 0:
            if survival != 0:  # after every turn at risk finished, S stays 0
                survival = math.nan
            break
        survival *= 1 - finished / at_risk
        greenwood += finished / (at_risk * beyond) if beyond else math.inf
        finishing += finished
    seen = sum(1 for calls, _ in turns if calls > end)
    row = {"finish by k×S": 1 - survival, "at risk past the backstop": sum(1 for calls, _ in turns if calls > start),
           "seen past k×S": seen}
    if math.isnan(survival):
        return {**row, "95% low": math.nan, "95% high": math.nan}
    if survival == 1:
        return {**row, "95% low": 0.0, "95% high": 1 - EXACT ** (1 / seen) if seen else 1.0}
    if survival == 0:
        return {**row, "95% low": EXACT ** (1 / finishing), "95% high": 1.0}
    interval = loglog_interval(survival, greenwood)
    assert interval is not None
    return {**row, "95% low": 1 - interval[1], "95% high": 1 - interval[0]}


def survival_table(turns: Iterable[tuple[int, bool]], edges: Sequence[float], start: float,
                   ends: dict[str, float | None]) -> dict[str, dict[str, float]]:
    """Per column, per row (``ends``: row -> the row's end, ``None`` where not estimable: NaN but the
    turns past ``start``), what the survival table must show."""
    turns = list(turns)
    out: dict[str, dict[str, float]] = {}
    for row, end in ends.items():
        values = (survival_row(turns, edges, start, end) if end is not None else
                  {"finish by k×S": math.nan, "95% low": math.nan, "95% high": math.nan, "seen past k×S": math.nan,
                   "at risk past the backstop": sum(1 for calls, _ in turns if calls > start)})
        for column, value in values.items():
            out.setdefault(column, {})[row] = value
    return out

@dataclass(frozen=True)
class ProbeFact:
    """One probe turn as the probe tables see it."""

    calls: int
    resolved: bool | None
    """Its result, in the turn or reported later (``None``: none yet)."""
    ended_by: str | None
    """The probe's own threshold that halted it (``None``: it ended on its own)."""
    main_threshold: str
    """Where the main configuration would have halted it (``none``: nowhere)."""
    calls_past_main: int = 0
    cut_by: frozenset[str] = frozenset()
    """The probe's loop detectors that halt too soon to say a turn failed (``cut_halts``)."""

    @property
    def cut(self) -> bool:
        """Halted, not resolved, by a loop detector of ``cut_by``: its fate past the halt is unknown."""
        return self.ended_by in self.cut_by and self.resolved is not True

    @property
    def censored(self) -> bool:
        """Halted at a length limit of the probe's, or ``cut``: a probe row counts both as censored."""
        return self.ended_by in CENSORING_HALTS or self.ended_by in self.cut_by




def cut_halts(config: Any) -> frozenset[str]:
    """The loop detectors whose probe halts are not failures under a main ``GuardConfig`` and its
    probe (none configured: both, the probe's values not known)."""
    settings = config.probe_settings()
    probe = None if settings is None else settings.config
    out = set()
    for halt, option in {"soft_stuck": "stuck_repeat_threshold", "streak": "streak_stop_at"}.items():
        live, own = getattr(config, option), None if probe is None else getattr(probe, option)
        if not (live and own and own >= SEEN_LOOPING * live):
            out.add(halt)
    return frozenset(out)


def passed(facts: Iterable[ProbeFact]) -> Passed:
    """The facts as calibrate counts a probe row."""
    row = Passed()
    for f in facts:
        row.add(f.resolved, f.calls_past_main, f.censored)
    return row


DECISIONS = {"above": ABOVE, "within": WITHIN, "undecided": UNDECIDED, "no_evidence": math.nan}


def decided(row: Passed, tolerance: float, range_s: float) -> tuple[float, float, float]:
    """(decision, more turns, seconds they take) as the board shows calibrate's ``decide``."""
    d = decide(row, tolerance, range_s / 86_400)
    if d.verdict in ("above", "within"):
        return DECISIONS[d.verdict], 0, 0.0
    if d.verdict == "no_evidence":
        return math.nan, math.nan, math.nan
    more = math.inf if d.more_turns is None else d.more_turns
    return UNDECIDED, more, more * range_s / row.known


def threshold_table(facts: Iterable[ProbeFact], thresholds: Sequence[str], tolerance: float,
                    range_s: float) -> dict[str, dict[str, float]]:
    """Column -> row (threshold) -> value, as the probe evidence table must show them."""
    table: dict[str, dict[str, float]] = {}
    facts = list(facts)
    for threshold in thresholds:
        rows = [f for f in facts if f.main_threshold == threshold]
        row = passed(rows)
        low, high = row.interval()
        verdict, more, seconds = decided(row, tolerance, range_s)
        values = {"turns": len(rows), "resolved": row.resolved, "unresolved": row.unresolved,
                  "censored": row.censored, "unknown": row.unknown,
                  "resolved share": share(row.resolved, row.known), "95% low": low, "95% high": high,
                  "decision": verdict, "more probe turns": more, "time at this rate": seconds,
                  "calls past it": row.calls_past}
        for column, value in values.items():
            table.setdefault(column, {})[threshold] = value
    return table


HARD_CAP_HALTS = frozenset({"explicit", "hard_backstop"})
"""The probe's own hard cap's halts (explicit, or its backstop)."""


def backstop_too_low(facts: Sequence[ProbeFact], multiples: Sequence[int], soft_cap: int, probe_hard_cap: int) -> float:
    """The board's reading of calibrate's horizon rule on the "probe turns past k×S" rows: 1 where
    some row k, judged (k×S under the probe's hard cap), is the highest with a resolved turn the
    probe's hard cap did not halt, the reach up to the next row is at least ``NEAR`` of the last
    multiple judged, and turns the probe's limits halted pass k×S."""
    from turnguard._calibrate.evidence import NEAR

    last = -(-probe_hard_cap // soft_cap) - 1

    def short(k: int) -> int:
        return sum(f.calls > k * soft_cap and f.resolved is True and f.ended_by not in HARD_CAP_HALTS for f in facts)

    def censored(k: int) -> int:
        return sum(f.calls > k * soft_cap and f.censored and not f.cut for f in facts)

    judged = [k for k in sorted(multiples) if k <= last]
    for i, k in enumerate(judged):
        above = judged[i + 1] if i + 1 < len(judged) else None
        if (above - 1 if above is not None else last) >= NEAR * last and short(k) and censored(k) and (
                above is None or not short(above)):
            return 1.0
    return 0.0


def past_table(facts: Iterable[ProbeFact], multiples: Sequence[int], soft_cap: int,
               tolerance: float = 0.1, probe_hard_cap: int | None = None) -> dict[str, dict[str, float]]:
    """Column -> row (k) -> value, as the "probe turns past k×S" table must show them (its frontier
    columns: calibrate's ``frontier.upper_bound`` of the productive turns seen, the cut ones counted
    productive at the high end, against ``tolerance``; with the probe's hard cap known, its horizon
    flag, which zeroes "spares" where it is set)."""
    from turnguard._calibrate.evidence import upper_bound

    table: dict[str, dict[str, float]] = {}
    facts = list(facts)
    flag = None if probe_hard_cap is None else backstop_too_low(facts, multiples, soft_cap, probe_hard_cap)
    for k in multiples:
        rows = [f for f in facts if f.calls > k * soft_cap]
        row = passed(rows)
        cut = sum(f.cut for f in rows)
        high = upper_bound(row.resolved + cut, row.known)[1] if row.known else math.nan
        values = {"turns": len(rows), "resolved": row.resolved, "unresolved": row.unresolved,
                  "censored": row.censored - cut, "cut": cut, "unknown": row.unknown,
                  "productive seen, 95% high": high,
                  "backstop here spares them": float(high < tolerance and not flag) if row.known else math.nan}
        if flag is not None:
            values["probe's own limit too low"] = flag
        for column, value in values.items():
            table.setdefault(column, {})[str(k)] = value
    return table


def probe_facts(truth: Any, cut_by: frozenset[str]) -> list[ProbeFact]:
    """Every probe turn of a ``probe_fleet.ProbeTruth`` as the probe rows see it: where the main
    configuration, run alone on the same calls, would have halted it, and the result the host
    reported (in the turn, later, or from another process); ``cut_by``: ``cut_halts`` of the fleet's
    configuration, or of the board's."""
    out = []
    for _, s in truth.summaries:
        if s.cohort != "probe":
            continue
        main = truth.main_halts.get(s.turn_id)
        out.append(ProbeFact(calls=s.tool_calls, resolved=truth.reported[s.turn_id],
                             ended_by=str(s.threshold) if s.reason == "halted" else None,
                             main_threshold=str(main.threshold) if main else "none",
                             calls_past_main=s.tool_calls - main.tool_calls if main else 0, cut_by=cut_by))
    return out
