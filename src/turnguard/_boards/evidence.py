"""The probe evidence on the threshold-validation board, in PromQL: for each live threshold the
probe turns it would have halted, what became of them, a 95% interval of the resolved share, whether
that decides against the operator's tolerance, and if not, how much more evidence it needs; and a
product-limit (Kaplan-Meier) estimate of how many calls the turns that reach the backstop need.

The arithmetic matches ``turnguard calibrate``'s (``turnguard._calibrate.evidence``):

- **Fates**: a probe turn is resolved (its task succeeded: reported in the turn or later),
  censored (the probe halted it at a length limit of its own, ``_probe.CENSORING_HALTS``: its
  backstop, explicit or cycle cap, ``cycle_repeat`` stop or a failing plugin's halt, or by its own D
  or streak stop set below twice the main value, ``ProbeHalts``, and no result says it succeeded:
  it might have), unresolved (the other failures, the probe's own stuck and streak
  halts at twice the main value or more among them: seen looping, they failed), or unknown (no
  result). The metrics do not carry the probe's D or stop: the board judges by the probe it is
  rendered for, and with none known, censors every probe stuck and streak halt.
- **Interval** (95%) of the share that would have succeeded among the N turns with a known fate:
  Wilson's low end with the censored turns counted as failures, its high end with them counted as
  successes (``(x + z²/2 ± z·sqrt(x - x²/N + z²/4)) / (N + z²)``, clamped to [0, 1]); (0, 1) with
  no fate known.
- **Decision** against the tolerance q (the ``tolerance`` variable: the share of the turns a
  threshold halts that would have succeeded which the operator accepts): ``above`` when the low
  end is over q (the threshold halts too many turns that would have succeeded), ``within`` when the
  high end is under q, else ``undecided``. A row at the probe's own limit (the probe's backstop, D,
  streak stop, ... not past the main one's, ``CapSettings.probe_stops_at``) is never ``within``: the
  probe halts those turns first, so none is seen past it (calibrate's ``advice.row_cap``); it is
  ``above`` or ``undecided``, and no number of turns decides it.
- **More probe turns**: a Wilson bound at share p over N turns is past q exactly when
  ``N·(p-q)² > z²·q(1-q)`` (the score test it inverts), so the evidence decides once N passes
  ``z²·q(1-q)/(p-q)²`` at the low end's share (when it is above q) or the high end's (below q); the
  panel shows how many more turns with a known fate that is, and how long they take at the rate
  they came in over the dashboard's range. No number decides it when q lies between the two (the
  censored turns could go either way: raise the probe's cap), or when the share is q.
- **Kaplan-Meier** from the tool-call histogram's buckets as the recording rules keep them by fate
  (``rules.fates``: a derived record in the rules' group), over both cohorts: a turn that ended on
  its own (``completed``, or a host's reason of its own) finished in its bucket; one halted by any
  threshold, ``cancelled`` or an ``error`` is censored there and leaves the turns at risk from its
  bucket on (calibrate's rule, on exact call counts: where no turn is censored inside a bucket, the
  two estimates are the same). ``1 - S(kS)/S(H)`` is the share of turns that reach the backstop H
  that would have finished by k×S; past the probe's own cap, or where no turn was seen that far
  (without a probe, nothing is seen past H), the estimate is NaN: not estimable.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from turnguard._boards import promql as q
from turnguard._boards.series import (
    CALLS_PAST_MAIN,
    CAP_MODE,
    COHORT,
    MAIN_THRESHOLD,
    POLICY,
    RESOLVED,
    RESULT_STATUS,
    RESULTS,
    THRESHOLD,
    TURNS,
)
from turnguard._boards.settings import CapSettings
from turnguard._config import GuardConfig
from turnguard._model import Threshold
from turnguard._probe import CENSORING_HALTS, LOOP_DETECTORS, SEEN_LOOPING
from turnguard.telemetry import _buckets as buckets

Z95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval (calibrate's ``Z95``)."""
Z2 = Z95 * Z95
TOLERANCE = "$" + q.TOLERANCE_VARIABLE
DEFAULT_TOLERANCE = "0.10"


class Decision(enum.IntEnum):
    """The values the decision column takes (its value mappings name them)."""

    ABOVE = 1
    UNDECIDED = 0
    WITHIN = -1


DECISION_TEXT = {
    Decision.ABOVE: "above the tolerance: it halts turns that would have succeeded (raise it)",
    Decision.UNDECIDED: "undecided",
    Decision.WITHIN: "within the tolerance (keep it)",
}


# -- Wilson, the decision and the evidence still needed --------------------------------------------
#
# Each takes R (resolved turns), RC (resolved or censored) and N (turns with a known fate: resolved,
# unresolved or censored), PromQL vectors with the same labels, and is written so that each appears
# as few times as it can (PromQL has no let).


def share(resolved: str, known: str) -> str:
    """The resolved share among the turns with a known fate (NaN without one)."""
    return f"({resolved} / {known})"


def _wilson(successes: str, known: str, sign: str) -> str:
    spread = f"sqrt({successes} - {successes} ^ 2 / clamp_min({known}, 1) + {Z2 / 4!r})"
    return f"(({successes} + {Z2 / 2!r} {sign} {Z95!r} * {spread}) / ({known} + {Z2!r}))"


def wilson_low(resolved: str, known: str) -> str:
    """The 95% interval's low end: Wilson's, the censored turns counted as failures (0 with no
    resolved turn, and with no fate known)."""
    return f"clamp_min({_wilson(resolved, known, '-')}, 0)"


def wilson_high(resolved_or_censored: str, known: str) -> str:
    """Its high end: Wilson's, the censored turns counted as successes (1 with every fate known a
    success or censored, and with none known)."""
    return f"clamp_max({_wilson(resolved_or_censored, known, '+')}, 1)"


def _score(tolerance: str) -> str:
    return f"{Z2!r} * {tolerance} * (1 - {tolerance})"


def _above(resolved: str, known: str, tolerance: str) -> str:
    """1 where the low end is past the tolerance (the evidence says above), else 0."""
    return f"({resolved} - {tolerance} * {known} > bool sqrt({_score(tolerance)} * {known}))"


def decision(resolved: str, resolved_or_censored: str, known: str, tolerance: str = TOLERANCE,
             open_rows: str | None = None) -> str:
    """``Decision`` per series (NaN with no fate known). A Wilson bound of ``x`` of ``N`` is past the
    tolerance q exactly when ``|x - q·N| > sqrt(z²·q(1-q)·N)`` (the score test it inverts): above
    when the low end is, within when the high end is. ``open_rows``: 1 on the rows that can be
    within, 0 on those at the probe's own limit, which never are (``probe_rows``)."""
    bound = f"sqrt({_score(tolerance)} * {known})"
    within = f"({tolerance} * {known} - {resolved_or_censored} > bool {bound})"
    if open_rows is not None:
        within = f"({within} * {open_rows})"
    return f"(({_above(resolved, known, tolerance)} - {within}) / ({known} / {known}))"


def _needed(successes: str, known: str, tolerance: str) -> str:
    """``floor(z²·q(1-q)·N² / (x - q·N)²) + 1 - N``: the turns still needed at the share x/N."""
    return f"(floor({_score(tolerance)} * {known} ^ 2 / ({successes} - {tolerance} * {known}) ^ 2) + 1 - {known})"


def more_turns(resolved: str, resolved_or_censored: str, known: str, tolerance: str = TOLERANCE,
               stopped: str | None = None) -> str:
    """Probe turns with a known fate still needed to decide: at the low end's share when it is above
    q, the high end's when it is below (0 once decided); +Inf when the tolerance lies between them
    (the censored turns could go either way: no number of turns at these shares decides, raise the
    probe's cap; or the share is the tolerance); NaN with no fate known. On the ``stopped`` rows (at
    the probe's own limit: never within) 0 once above, else +Inf: no number of turns decides them,
    raise the probe's limit (calibrate's ``advice.decide``)."""
    low = f"({_needed(resolved, known, tolerance)} and ({resolved} - {tolerance} * {known} > 0))"
    rc = resolved_or_censored
    high = f"({_needed(rc, known, tolerance)} and ({rc} - {tolerance} * {known} < 0))"
    needed = f"clamp_min({low} or {high} or ({known} / {known} * Inf), 0)"
    if stopped is None:
        return needed
    never = f"((1 / {_above(resolved, known, tolerance)} - 1) * ({known} / {known}))"
    return f"(({needed} unless {stopped}) or ({never} and {stopped}))"


def time_needed(resolved: str, resolved_or_censored: str, known: str, tolerance: str = TOLERANCE,
                stopped: str | None = None) -> str:
    """Seconds those turns take at the rate turns with a known fate came in over the range."""
    return f"({more_turns(resolved, resolved_or_censored, known, tolerance, stopped)} * $__range_s / {known})"


# -- the probe turns each live threshold would have halted --------------------------------------------


@dataclass(frozen=True)
class ProbeHalts:
    """How the probe's own halts count, as calibrate's ``ProbeEvidence.fate_of`` counts them: a length
    limit censors a turn; a loop detector of ``cut`` halts it too soon to say it failed (calibrate's
    ``cut``: censored in the rows, productive at a frontier bound's high end); any other loop halt
    is a failure. The metrics do not carry the probe's D or stop per turn: the board judges by the
    probe's configuration it is rendered for (``turnguard assets --config``)."""

    cut: tuple[Threshold, ...]

    @classmethod
    def of(cls, cap: CapSettings) -> ProbeHalts:
        """With no probe configured here, both loop detectors cut (calibrate's rule where the probe's
        values are not recorded; a probe given no D or stop of its own keeps the main's)."""
        main = {Threshold.SOFT_STUCK: cap.stuck_repeat_threshold, Threshold.STREAK: cap.streak_stop_at}
        p = cap.probe
        return cls(tuple(t for t in map(Threshold, LOOP_DETECTORS) if p is None or not (
            main[t] and (p.limit(t) or 0) >= SEEN_LOOPING * main[t])))

    @property
    def length(self) -> dict[str, str]:
        """The selector of the turns a length limit of the probe's halted (``_probe.CENSORING_HALTS``)."""
        return {THRESHOLD: "~" + "|".join(CENSORING_HALTS)}

    @property
    def cutting(self) -> dict[str, str] | None:
        """The selector of the turns halted by a loop detector in ``cut`` (``None``: none is)."""
        return {THRESHOLD: "~" + "|".join(t.value for t in self.cut)} if self.cut else None

    @property
    def censoring(self) -> dict[str, str]:
        """The selector of the turns a probe row counts as censored: a length limit's or ``cut``'s."""
        return {THRESHOLD: "~" + "|".join((*CENSORING_HALTS, *self.cut))}

    @property
    def other(self) -> dict[str, str]:
        """The selector of every other turn (ended on its own, or halted as looping: failed)."""
        return {THRESHOLD: "!~" + "|".join((*CENSORING_HALTS, *self.cut))}


def fates(turns: Callable[..., str], late: Callable[..., str], fill: Callable[[str], str],
          halts: ProbeHalts) -> dict[str, str]:
    """The probe turns' fates, as calibrate counts them (``evidence.Passed``): resolved (in the turn
    or by a late result), censored (halted at a length limit of the probe's, or by a loop detector of
    ``halts.cut``, not resolved), unresolved (the others whose result was false), unknown (the others
    without a result); and the sums the interval reads, RC = resolved + censored and
    N = resolved + unresolved + censored. ``turns(**labels)`` and ``late(**labels)`` select the
    turns' and the late results' records, ``fill`` aggregates a selection into the table's rows.

    A result is counted whether it came in the turn (the turns' record) or later (an accepted late
    result): the two records are summed together (their series never share a label set: only a
    result has a ``turnguard_result_status``)."""
    res = RESOLVED
    true, false, known = {res: "true"}, {res: "false"}, {res: "~true|false"}
    limited, other = halts.censoring, halts.other
    not_true = {res: "~false|unknown"}
    return {
        "resolved": fill(f"{turns(**true)} or {late(**true)}"),
        "unresolved": fill(f"{turns(**other, **false)} or {late(**other, **false)}"),
        "censored": f"({fill(turns(**limited, **not_true))} - {fill(late(**limited, **true))})",
        "unknown": f"({fill(turns(**other, **{res: 'unknown'}))} - {fill(late(**other))})",
        "RC": fill(f"{turns(**true)} or {turns(**limited, **not_true)} or {late(**other, **true)}"),
        "N": fill(f"{turns(**known)} or {turns(**limited, **{res: 'unknown'})} or {late(**other, **known)}"),
    }


def probe_rows(cap: CapSettings, rows: Sequence[Threshold]) -> dict[str, str]:
    """Per column, a vector by ``turnguard_probe_main_threshold`` with one row for each of ``rows``
    (0 where nothing happened): the probe turns the main configuration would have halted there."""
    thresholds = [t.value for t in rows]
    where = {COHORT: q.PROBE, POLICY: q.PROBE_POLICY, MAIN_THRESHOLD: q.values_regex(thresholds)}
    by = (MAIN_THRESHOLD,)

    def turns(**labels: str) -> str:
        return q.sum_over(TURNS, q.sel(**where, **labels))

    def late(**labels: str) -> str:
        return q.sum_over(RESULTS, q.sel(**where, **{RESULT_STATUS: "accepted"}, **labels))

    def fill(expr: str) -> str:
        return q.filled(f"sum by ({MAIN_THRESHOLD}) ({expr})", MAIN_THRESHOLD, thresholds)

    f = fates(turns, late, fill, ProbeHalts.of(cap))
    calls_past = q.filled(q.recorded(CALLS_PAST_MAIN, q.sel(**{k: v for k, v in where.items() if k != COHORT}),
                                     by=by), MAIN_THRESHOLD, thresholds)
    stops = {t.value for t in rows if cap.probe_stops_at(t)}
    open_rows = f'({q.rows(MAIN_THRESHOLD, {t: "vector(0)" if t in stops else "vector(1)" for t in thresholds})})'
    stopped = f'({q.rows(MAIN_THRESHOLD, {t: "vector(1)" for t in thresholds if t in stops})})'
    judged = (f["resolved"], f["RC"], f["N"], TOLERANCE)
    return {
        "turns": fill(turns()),
        **{name: f[name] for name in ("resolved", "unresolved", "censored", "unknown")},
        "resolved share": share(f["resolved"], f["N"]),
        "95% low": wilson_low(f["resolved"], f["N"]),
        "95% high": wilson_high(f["RC"], f["N"]),
        "decision": decision(*judged, open_rows if stops else None),
        "more probe turns": more_turns(*judged, stopped if stops else None),
        "time at this rate": time_needed(*judged, stopped if stops else None),
        "calls past it": calls_past,
    }


EXACT_TWO_SIDED = 0.025
"""The exact binomial bound with no productive turn among N at risk, ``1 - 0.025^(1/N)`` (two-sided
95%, calibrate's ``evidence.zero_event_bound`` with ``Sided.TWO``)."""


def productive_high(resolved: str, known: str) -> str:
    """The 95% upper bound of the productive share the probe *saw* (the censored turns counted as
    not productive: calibrate's frontier rule): the exact binomial bound with none resolved, else
    Wilson's high end (NaN with no fate known)."""
    exact = f"((1 - {EXACT_TWO_SIDED!r} ^ (1 / {known})) and ({resolved} == 0))"
    return f"(({exact} or {wilson_high(resolved, known)}) * ({known} / {known}))"


def within_seen(resolved: str, known: str, tolerance: str = TOLERANCE) -> str:
    """1 where that bound is under the tolerance (a backstop here spares the productive turns the
    probe saw), 0 where it is not, NaN with no fate known."""
    return f"(({productive_high(resolved, known)} < bool {tolerance}) / ({known} / {known}))"


PROBE_COLUMN_UNITS = {"resolved share": "percentunit", "95% low": "percentunit", "95% high": "percentunit",
                      "time at this rate": "s"}
"""The probe table's columns that are not counts."""


# -- Kaplan-Meier: of the turns that reach the backstop, the share that would finish by k x S ---------------


KM_SPREAD = (1.5, 2, 3)
"""The rows, as multiples of the backstop multiplier m: at m = 10, 15x, 20x and 30x S."""


def km_multiples(cap: CapSettings) -> list[int]:
    """The k (multiples of S that are bucket edges, past the backstop) nearest to 1.5 m, 2 m and 3 m."""
    edges = set(_edges(cap))
    candidates = [k for k in (*range(1, buckets.MAX_MULTIPLE + 1), *buckets.ABOVE_MULTIPLES)
                  if k * cap.soft_cap > cap.hard_cap and k * cap.soft_cap in edges]
    chosen: list[int] = []
    for spread in KM_SPREAD:
        if candidates:
            k = min(candidates, key=lambda c: (abs(c - spread * cap.hard_multiplier), c))
            if k not in chosen:
                chosen.append(k)
    return sorted(chosen)


def _edges(cap: CapSettings) -> tuple[float, ...]:
    return buckets.tool_call_edges(GuardConfig(soft_cap=cap.soft_cap, hard_multiplier=cap.hard_multiplier,
                                               stuck_repeat_threshold=cap.stuck_repeat_threshold))


KM_TURNS = {COHORT: q.BOTH_COHORTS, POLICY: q.PROBE_POLICY, CAP_MODE: "adaptive"}
"""Both cohorts (live turns carry the curve to the live backstop, probe turns past it), the picked
policies with their probes, adaptive-cap turns."""
FINISHED = {q.FATE: "finished"}
"""The turns that ended on their own (``rules.fates``: any end but ``rules.CENSORING_OUTCOMES``)."""
INTEGER_LE = "`([0-9]+)(\\.0)?`"
"""An integer bucket edge however the exporter wrote it (``1100`` or ``1100.0``): ``$1`` is the integer."""
ALL_TURNS = {"le": "~\\\\+Inf"}
"""The ``+Inf`` bucket: every turn."""


def _by_edge(edges: Sequence[float], **labels: str) -> str:
    """Cumulative turns per bucket edge (a vector by ``le``, written as an integer), 0 where none."""
    matcher = "|".join(f"{int(e)}(\\\\.0)?" for e in edges)
    buckets_ = q.fates(q.sel(**KM_TURNS, **labels, le=f"~{matcher}"), by=("le",))
    return q.filled(f'label_replace({buckets_}, "le", "$1", "le", {INTEGER_LE})', "le", [str(int(e)) for e in edges])


def _shifted(expr: str, edges: Sequence[float]) -> str:
    """``expr`` (by ``le`` over ``edges[:-1]``) with each edge renamed to the next one, top down so
    that no series is renamed twice."""
    for low, high in reversed(list(itertools.pairwise(edges))):
        expr = f'label_replace({expr}, "le", "{int(high)}", "le", "{int(low)}")'
    return expr


def estimable(cap: CapSettings, k: int) -> bool:
    """Whether some turn can be seen as far as k×S: not past the probe's own cap, which no probe
    turn passes (with no probe configured here the board cannot say, and reads what is there)."""
    return cap.probe_sees_past(k * cap.soft_cap - 1) is not False


NOT_ESTIMABLE = "vector(NaN)"


def _km_parts(cap: CapSettings, k: int) -> tuple[str, str]:
    """Per bucket (e', e] between H and k×S, vectors by ``le``: ``finished`` (turns that completed in
    it) and ``beyond`` (turns seen past e)."""
    edges = [e for e in _edges(cap) if cap.hard_cap <= e <= k * cap.soft_cap]
    total = f"scalar({q.zero_or(q.fates(q.sel(**KM_TURNS, **ALL_TURNS)))})"
    beyond = f"({total} - {_by_edge(edges[1:])})"
    finished = f"({_by_edge(edges[1:], **FINISHED)} - {_shifted(_by_edge(edges[:-1], **FINISHED), edges)})"
    return finished, beyond


def _hazard(cap: CapSettings, k: int) -> str:
    """``L = -ln(S(k×S)/S(H)) = sum(ln(1 + finished / beyond))`` over the buckets: 0 when no turn
    finished there, +Inf when every turn at risk in some bucket did (the buckets after it, with none
    at risk, change nothing: S is 0 from there on, as calibrate's estimate has it), NaN when a
    bucket had none at risk before any such (``max`` of the terms passes over NaN)."""
    finished, beyond = _km_parts(cap, k)
    terms = f"ln(1 + {finished} / {beyond})"
    return f"(max({terms}) == Inf or sum({terms}))"


def finished_by(cap: CapSettings, k: int) -> str:
    """``1 - S(k×S) / S(H)``: of the turns that reach the backstop H, the share that would finish by
    k×S calls, from the ``fates`` record's buckets between H and k×S (NaN where not estimable: no
    turn seen that far, or k×S past the probe's cap, where a bucket the cap splits would read as
    every turn in it finishing; 1 where every turn at risk finished before k×S, as in calibrate).

    Per bucket (e', e] past H: ``beyond`` = turns seen past e, ``finished`` = turns that completed in
    it; the turns at risk in it are both (the ones censored in it left at its start), and
    ``S(e)/S(e') = beyond / (beyond + finished) = 1 / (1 + finished / beyond)``. The product over the
    buckets is ``exp(-sum(ln(1 + finished / beyond)))``: one vector by ``le``, no per-bucket query."""
    if not estimable(cap, k):
        return NOT_ESTIMABLE
    return f"1 - exp(-{_hazard(cap, k)})"


EXACT_ONE_SIDED = 0.05
"""Zero events (or all events) in N turns: the exact binomial bound at 95%, ``1 - 0.05^(1/N)``
(about 3/N), one-sided, since the other end is the estimate itself (calibrate's
``evidence.zero_event_bound`` with ``Sided.ONE``)."""


def _past(edge: float) -> str:
    """Turns seen past ``edge`` calls, both cohorts (a scalar's single series)."""
    total = f"scalar({q.zero_or(q.fates(q.sel(**KM_TURNS, **ALL_TURNS)))})"
    return f"({total} - sum({_by_edge([edge])}))"


def seen_past(cap: CapSettings, k: int) -> str:
    """Turns seen past k×S calls (still running there: at risk at k×S)."""
    return _past(k * cap.soft_cap)


def reach_backstop(cap: CapSettings) -> str:
    """Turns seen past the backstop H: the turns the estimate is about (at risk past H)."""
    return _past(cap.hard_cap)


def finished_by_bounds(cap: CapSettings, k: int) -> tuple[str, str]:
    """The 95% interval of ``finished_by``, never a bare 0 or 1 without one: on the log-log scale
    (calibrate's ``survival.loglog_interval``, Greenwood's sum ``V = sum(d / (r (r - d)))`` over the
    buckets, r = finished + beyond, d = finished) where the estimate is strictly between 0 and 1;
    exact where it is not: with no turn finishing, ``[0, 1 - 0.05^(1/N)]`` over the N turns seen past
    k×S (the turns whose fate by then is known); with every turn at risk finishing, ``[0.05^(1/N), 1]``
    over the N that finished (none was seen past k×S). NaN where the estimate is."""
    if not estimable(cap, k):
        return NOT_ESTIMABLE, NOT_ESTIMABLE
    finished, beyond = _km_parts(cap, k)
    hazard = _hazard(cap, k)
    greenwood = f"sum({finished} / (({beyond} + {finished}) * {beyond}))"
    spread = f"({Z95!r} * sqrt({greenwood}) / {hazard})"
    inside = f"({hazard} > 0 < Inf)"
    none_finished, all_finished = f"({hazard} == 0)", f"(({hazard} == bool Inf) == 1)"
    seen = seen_past(cap, k)
    finishing = f"sum({finished})"
    exact_high = f"(1 - {EXACT_ONE_SIDED!r} ^ (1 / {seen}))"
    exact_low = f"({EXACT_ONE_SIDED!r} ^ (1 / {finishing}))"
    nan = f"({hazard} != {hazard})"
    low = (f"(1 - exp(-{hazard} * exp(-{spread}))) and {inside} or 0 * {none_finished} "
           f"or {exact_low} and {all_finished} or {nan}")
    high = (f"(1 - exp(-{hazard} * exp({spread}))) and {inside} or {exact_high} and {none_finished} "
            f"or {all_finished} or {nan}")
    return low, high


def km_rows(cap: CapSettings) -> dict[str, str]:
    """Per column, a vector by ``multiple`` (one row per k of ``km_multiples``): the share that would
    finish by k×S, its 95% interval, and the turns it rests on (past the backstop; seen past k×S)."""
    columns: dict[str, dict[str, str]] = {name: {} for name in KM_COLUMN_UNITS}
    reach = reach_backstop(cap)
    for k in km_multiples(cap):
        row = str(k)
        low, high = finished_by_bounds(cap, k)
        columns["finish by k×S"][row] = finished_by(cap, k)
        columns["95% low"][row] = low
        columns["95% high"][row] = high
        columns["at risk past the backstop"][row] = reach
        columns["seen past k×S"][row] = seen_past(cap, k) if estimable(cap, k) else NOT_ESTIMABLE
    return {name: q.rows("multiple", per_row) for name, per_row in columns.items()}


KM_COLUMN_UNITS = {"finish by k×S": "percentunit", "95% low": "percentunit", "95% high": "percentunit",
                   "at risk past the backstop": "short", "seen past k×S": "short"}
"""The survival table's columns, in order, and their units."""
