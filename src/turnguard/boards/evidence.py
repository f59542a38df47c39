"""The probe evidence on the threshold-validation board, in PromQL: for each live threshold the
probe turns it would have halted, what became of them, a 95% interval of the resolved share, whether
that decides against the operator's tolerance, and if not, how much more evidence it needs; and a
product-limit (Kaplan-Meier) estimate of how many calls the turns that reach the backstop need.

The arithmetic matches ``turnguard calibrate``'s (``turnguard.calibrate.evidence``):

- **Wilson score interval** (95%) of the resolved share among the probe turns with a known result
  (resolved / (resolved + unresolved); unknown apart), written as
  ``(R + z²/2 ± z·sqrt(R·U/n + z²/4)) / (n + z²)``, clamped to [0, 1]; (0, 1) with no result.
- **Decision** against the tolerance q (the ``tolerance`` variable: the share of halted turns that
  would have succeeded the operator accepts): ``above`` when the interval's low end is over q (the
  threshold halts too many productive turns), ``within`` when its high end is under q, else
  ``undecided``. A turn the probe halted itself counts as not resolved (it was not): ``within``
  holds as far as the probe sees, up to its own limits, and its table says how many it halted.
- **More probe turns**: the Wilson interval excludes q exactly when ``n·(p-q)² > z²·q(1-q)`` (it is
  the score test's inversion), so at the current share p the evidence decides once n passes
  ``z²·q(1-q)/(p-q)²``; the panel shows how many more turns with a result that is, and how long they
  take at the rate they came in over the dashboard's range. No end when p = q.
- **Kaplan-Meier** from the tool-call histogram's recorded buckets, over both cohorts: a turn that
  ended ``completed`` finished in its bucket; any other (halted by any threshold, cancelled, an
  error) is censored there and leaves the turns at risk from its bucket on. ``1 - S(kS)/S(H)`` is
  the share of turns that reach the backstop H that would have finished by k×S; where no turn was
  seen that far (past the probe's own cap, or without a probe) the estimate is NaN: not estimable.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence

from turnguard.boards import promql as q
from turnguard.boards.settings import CapSettings
from turnguard.config import GuardConfig
from turnguard.model import Threshold
from turnguard.telemetry import buckets

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
    Decision.ABOVE: "above the tolerance: it halts productive turns",
    Decision.UNDECIDED: "undecided: needs more probe turns",
    Decision.WITHIN: "within the tolerance, as far as the probe sees (up to its own limits)",
}


# -- Wilson, the decision and the evidence still needed --------------------------------------------
#
# Each takes R (resolved turns) and N (turns with a known result), PromQL vectors with the same
# labels; every figure is written so that each appears as few times as it can (PromQL has no let).


def share(resolved: str, known: str) -> str:
    """The resolved share among the turns with a known result (NaN without one)."""
    return f"({resolved} / {known})"


def _wilson(resolved: str, known: str, sign: str) -> str:
    spread = f"sqrt({resolved} - {resolved} ^ 2 / clamp_min({known}, 1) + {Z2 / 4!r})"
    return f"(({resolved} + {Z2 / 2!r} {sign} {Z95!r} * {spread}) / ({known} + {Z2!r}))"


def wilson_low(resolved: str, known: str) -> str:
    """The 95% Wilson interval's low end: 0 with no resolved turn (and with no result at all)."""
    return f"clamp_min({_wilson(resolved, known, '-')}, 0)"


def wilson_high(resolved: str, known: str) -> str:
    """The 95% Wilson interval's high end: 1 with no unresolved turn (and with no result at all)."""
    return f"clamp_max({_wilson(resolved, known, '+')}, 1)"


def _score(tolerance: str) -> str:
    return f"{Z2!r} * {tolerance} * (1 - {tolerance})"


def decision(resolved: str, known: str, tolerance: str = TOLERANCE) -> str:
    """``Decision`` per series: the interval excludes the tolerance q exactly when
    ``|R - q·N| > sqrt(z²·q(1-q)·N)`` (the score test it inverts); the sign says on which side."""
    distance = f"({resolved} - {tolerance} * {known})"
    return f"(sgn({distance}) * (abs({distance}) > bool sqrt({_score(tolerance)} * {known})))"


def more_turns(resolved: str, known: str, tolerance: str = TOLERANCE) -> str:
    """Probe turns with a result still needed to decide at the current share p = R/N: the interval
    excludes q once N passes ``z²·q(1-q)/(p-q)²``, so ``floor(z²·q(1-q)·N²/(R-q·N)²) + 1 - N``, which is
    0 or less once decided (clamped to 0); NaN with no result yet, +Inf when p = q."""
    needed = f"floor({_score(tolerance)} * {known} ^ 2 / ({resolved} - {tolerance} * {known}) ^ 2)"
    return f"clamp_min({needed} + 1 - {known}, 0)"


def time_needed(resolved: str, known: str, tolerance: str = TOLERANCE) -> str:
    """Seconds those turns take at the rate turns with a result came in over the dashboard's range."""
    return f"({more_turns(resolved, known, tolerance)} * $__range_s / {known})"


# -- the probe turns each live threshold would have halted --------------------------------------------


def probe_rows(cap: CapSettings, rows: Sequence[Threshold]) -> dict[str, str]:
    """Per column, a vector by ``turnguard_probe_main_threshold`` with one row for each of ``rows``
    (0 where nothing happened): the probe turns the main configuration would have halted there.

    A result counts whether it came in the turn (the turns' record) or later (an accepted late
    result): the two records are summed together (their series never share a label set: only a
    result has a ``turnguard_result_status``)."""
    thresholds = [t.value for t in rows]
    where = {q.COHORT: q.PROBE, q.POLICY: q.PROBE_POLICY, q.MAIN_THRESHOLD: q.values_regex(thresholds)}
    by = (q.MAIN_THRESHOLD,)

    def turns(**labels: str) -> str:
        return q.sum_over(q.TURNS, q.sel(**where, **labels))

    def late(**labels: str) -> str:
        return q.sum_over(q.RESULTS, q.sel(**where, **{q.RESULT_STATUS: "accepted"}, **labels))

    def fill(expr: str) -> str:
        return q.filled(f"sum by ({q.MAIN_THRESHOLD}) ({expr})", q.MAIN_THRESHOLD, thresholds)

    resolved = fill(f"{turns(**{q.RESOLVED: 'true'})} or {late(**{q.RESOLVED: 'true'})}")
    known = fill(f"{turns(**{q.RESOLVED: '~true|false'})} or {late(**{q.RESOLVED: '~true|false'})}")
    unresolved = fill(f"{turns(**{q.RESOLVED: 'false'})} or {late(**{q.RESOLVED: 'false'})}")
    calls_past = q.filled(q.recorded(q.CALLS_PAST_MAIN, q.sel(**{k: v for k, v in where.items() if k != q.COHORT}),
                                     by=by), q.MAIN_THRESHOLD, thresholds)
    return {
        "turns": fill(turns()),
        "resolved": resolved,
        "unresolved": unresolved,
        "unknown": f"({fill(turns(**{q.RESOLVED: 'unknown'}))} - {fill(late())})",
        "halted by the probe": fill(turns(**{q.OUTCOME: "halted"})),
        "resolved share": share(resolved, known),
        "95% low": wilson_low(resolved, known),
        "95% high": wilson_high(resolved, known),
        "decision": decision(resolved, known),
        "more probe turns": more_turns(resolved, known),
        "time at this rate": time_needed(resolved, known),
        "calls past it": calls_past,
    }


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


KM_TURNS = {q.COHORT: q.BOTH_COHORTS, q.POLICY: q.PROBE_POLICY, q.CAP_MODE: "adaptive"}
"""Both cohorts (live turns carry the curve to the live backstop, probe turns past it), the picked
policies with their probes, adaptive-cap turns."""
INTEGER_LE = "`([0-9]+)(\\.0)?`"
"""An integer bucket edge however the exporter wrote it (``1100`` or ``1100.0``): ``$1`` is the integer."""


def _by_edge(edges: Sequence[float], **labels: str) -> str:
    """Cumulative turns per bucket edge (a vector by ``le``, written as an integer), 0 where none."""
    matcher = "|".join(f"{int(e)}(\\\\.0)?" for e in edges)
    buckets_ = q.recorded(f"{q.TOOL_CALLS}_bucket", q.sel(**KM_TURNS, **labels, le=f"~{matcher}"), by=("le",))
    return q.filled(f'label_replace({buckets_}, "le", "$1", "le", {INTEGER_LE})', "le", [str(int(e)) for e in edges])


def _shifted(expr: str, edges: Sequence[float]) -> str:
    """``expr`` (by ``le`` over ``edges[:-1]``) with each edge renamed to the next one, top down so
    that no series is renamed twice."""
    for low, high in reversed(list(itertools.pairwise(edges))):
        expr = f'label_replace({expr}, "le", "{int(high)}", "le", "{int(low)}")'
    return expr


def finished_by(cap: CapSettings, k: int) -> str:
    """``1 - S(k×S) / S(H)``: of the turns that reach the backstop H, the share that would finish by
    k×S calls, from the recorded buckets between H and k×S (NaN where not estimable).

    Per bucket (e', e] past H: ``beyond`` = turns seen past e, ``finished`` = turns that completed in
    it; the turns at risk in it are both (the ones censored in it left at its start), and
    ``S(e)/S(e') = beyond / (beyond + finished) = 1 / (1 + finished / beyond)``. The product over the
    buckets is ``exp(-sum(ln(1 + finished / beyond)))``: one vector by ``le``, no per-bucket query."""
    edges = [e for e in _edges(cap) if cap.hard_cap <= e <= k * cap.soft_cap]
    completed = {q.OUTCOME: "completed"}
    total = f"scalar({q.zero_or(q.recorded(q.TURNS, q.sel(**KM_TURNS)))})"
    beyond = f"({total} - {_by_edge(edges[1:])})"
    finished = f"({_by_edge(edges[1:], **completed)} - {_shifted(_by_edge(edges[:-1], **completed), edges)})"
    return f"1 - exp(-sum(ln(1 + {finished} / {beyond})))"


def km_targets(cap: CapSettings) -> list[tuple[int, str]]:
    return [(k, finished_by(cap, k)) for k in km_multiples(cap)]
