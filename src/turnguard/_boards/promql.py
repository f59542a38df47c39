"""The boards' PromQL: the selectors and the counting forms every panel is written in, over the
metric and label names of ``series``.

Every selector goes through ``scoped``, which adds the board variables' matchers (policy, agent,
cohort) to the metrics that carry those labels, so no panel can forget one: a panel that means one
cohort names it (``turnguard_turn_cohort="probe"``), every other panel reads the ``cohort``
variable (default ``live``), and no panel mixes the two by omission.

Nothing here needs grafana-foundation-sdk: ``build`` turns these strings into panels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from turnguard._boards import rules
from turnguard._boards.series import AGENT, COHORT, POLICY, TOOL_CALLS, label
from turnguard.telemetry import _names as n

AGENT_VARIABLE = "agent"
POLICY_VARIABLE = "policy"
COHORT_VARIABLE = "cohort"
TOLERANCE_VARIABLE = "tolerance"
LIVE, PROBE = "live", "probe"
BOTH_COHORTS = f"~{LIVE}|{PROBE}"
"""The matcher of a panel that reads both cohorts on purpose (the Kaplan-Meier estimate), and says so."""


def _carrying(key: str) -> frozenset[str]:
    return frozenset(label(metric) for metric, keys in n.METRIC_ATTRIBUTES.items() if key in keys)


POLICY_SCOPED = _carrying(n.POLICY)
"""Metrics carrying the policy's name: the boards' ``policy`` variable picks one policy's series (a
threshold change under a new ``GuardConfig.name`` is a series of its own, not a mix)."""
AGENT_SCOPED = _carrying(n.GEN_AI_AGENT_NAME)
"""Metrics carrying the agent name: the ``agent`` variable filters them (a metric without the label,
such as plugin errors, is not filtered)."""
COHORT_SCOPED = _carrying(n.TURN_COHORT)
"""Metrics carrying the cohort: a panel names its cohort or reads the ``cohort`` variable."""
PROBE_POLICY = f"~(${POLICY_VARIABLE})(-probe)?"
"""The probe panels' policy matcher: the picked policies and their probes (a probe named by its main
configuration reports as ``<name>-probe``)."""


# -- selectors ------------------------------------------------------------------------------------


def sel(**labels: str) -> str:
    """A label selector; a value starting with ``!`` means "not equal", ``~`` "matches the regex",
    ``!~`` "does not match it"."""

    def matcher(k: str, v: str) -> str:
        if v.startswith("!~"):
            return f'{k}!~"{v[2:]}"'
        if v.startswith("!"):
            return f'{k}!="{v[1:]}"'
        return f'{k}=~"{v[1:]}"' if v.startswith("~") else f'{k}="{v}"'

    return "{" + ",".join(matcher(k, v) for k, v in labels.items()) + "}" if labels else ""


def _names(selector: str, key: str) -> bool:
    return f"{key}=" in selector or f"{key}!" in selector


def scoped(metric: str, selector: str) -> str:
    """``selector`` with the board variables' matchers added where ``metric`` carries their label
    and ``selector`` does not match on it already: policy, agent and cohort."""
    base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
    matchers = [selector[1:-1]] if selector else []
    if base in POLICY_SCOPED and not _names(selector, POLICY):
        matchers.append(f'{POLICY}=~"${POLICY_VARIABLE}"')
    if base in AGENT_SCOPED:
        matchers.append(f'{AGENT}=~"${AGENT_VARIABLE}"')
    if base in COHORT_SCOPED and not _names(selector, COHORT):
        matchers.append(f'{COHORT}=~"${COHORT_VARIABLE}"')
    return "{" + ",".join(matchers) + "}" if matchers else ""


def le_sel(edge: float, **labels: str) -> str:
    """A selector for the bucket ``le == edge`` however the exporter formatted the number."""
    number = str(int(edge)) if float(edge).is_integer() else re.escape(repr(float(edge)))
    base = sel(**labels)
    le = f"le=~`{number}(\\.0)?`"
    return "{" + (base[1:-1] + "," if base else "") + le + "}"


# -- counting -------------------------------------------------------------------------------------


COUNTED_LOOKBACK = "1d"
"""How far before a window ``counted`` looks for a series' last sample: a series silent longer than
this before the window (a gap, a stopped exporter) counts as new there, its whole value again."""


def counted(metric: str, selector: str = "", window: str = "$__range") -> str:
    """Per series, the events that became visible in ``window``: the rules' counting form
    (``rules.counted``) on the raw samples, so a gap counts each event once and history never twice.

    ``now`` is the series' last sample in the window, ``before`` its last one up to a day before it
    (an instant ``offset`` would look back only 5 minutes: after a longer gap a series would count
    its whole history again, as new), or 0 for a series with none: a new series counts from zero,
    as a cumulative series starts there (``increase()`` would miss a series born at 1, or count it
    0). Gained = ``now - before``; after a reset (a value below ``before``, or a drop in the window)
    the run after it counts from zero, plus the growth before it that the window's peak shows.
    Exact, integer counts: no extrapolation to the window's edges."""
    m = f"{metric}{scoped(metric, selector)}"
    now = f"last_over_time({m}[{window}])"
    before = f"(last_over_time({m}[{COUNTED_LOOKBACK}] offset {window}) or 0 * {now})"
    low, peak = f"min_over_time({m}[{window}])", f"max_over_time({m}[{window}])"
    reset = f"({low} < {before} or resets({m}[{window}]) > 0)"
    return (f"({now} - {before}) unless {reset} "
            f"or ({now} + clamp_min({peak} - {before}, 0) * ({peak} > bool {now})) and {reset}")


def _by(by: Sequence[str]) -> str:
    return f" by ({', '.join(by)})" if by else ""


def total(metric: str, selector: str = "", by: Sequence[str] = (), window: str = "$__range") -> str:
    """Events counted over the dashboard's time range (or ``window``), from zero for new series."""
    return f"sum{_by(by)} ({counted(metric, selector, window)})"


def per_second(metric: str, selector: str = "", by: Sequence[str] = ()) -> str:
    """Events per second over ``$__rate_interval``, counted as ``total`` counts them (a new series'
    first sample included, which ``rate()`` would drop)."""
    return f"{total(metric, selector, by, window='$__rate_interval')} / ($__rate_interval_ms / 1000)"


RECORD_TILE = "5m"
"""The recording rules' tile (rules/turnguard.rules.yaml): each record counts one 5-minute stretch."""
RECORDED = rules.RECORDED
"""Raw series -> the recording rule that counts it (``turnguard._boards.rules`` defines each, by the labels the
threshold-validation board reads)."""


def recorded(metric: str, selector: str = "", by: Sequence[str] = (), window: str = "$__range") -> str:
    """``total``'s count read from ``metric``'s recorded tiles: one sample per 5 minutes per label set
    instead of every raw sample of every series, exact where the range is a multiple of the tile."""
    return f"sum{_by(by)} ({sum_over(metric, selector, window)})"


def sum_over(metric: str, selector: str = "", window: str = "$__range") -> str:
    """``metric``'s recorded tiles summed over ``window``, per series (no aggregation yet)."""
    return f"sum_over_time({RECORDED[metric]}{scoped(metric, selector)}[{window}])"


FATES = rules.FATES_RECORD
"""The tool-call buckets by ``fate`` (finished or censored at the call count): a derived record
(``rules.DERIVED``) keeping the policy, agent, cohort and cap mode of the histogram it sums."""
FATE = rules.FATE


def fates(selector: str = "", by: Sequence[str] = (), window: str = "$__range") -> str:
    """The ``FATES`` record summed over ``window``, the board variables' matchers added as for the
    tool-call histogram it comes from."""
    return f"sum{_by(by)} (sum_over_time({FATES}{scoped(TOOL_CALLS, selector)}[{window}]))"


def recorded_per_second(metric: str, selector: str = "", by: Sequence[str] = ()) -> str:
    """Events per second over each step's own ``$__interval`` (a panel reading records sets its min
    interval to the tile, so the interval is a multiple of it and no tile is counted twice)."""
    return f"{recorded(metric, selector, by, window='$__interval')} / ($__interval_ms / 1000)"


# -- rows: one series per value of a label, zero where nothing happened ----------------------------------


def zero_or(expr: str) -> str:
    """``expr``, or 0 when it has no series (nothing happened): a count shows 0, not "No data"."""
    return f"({expr} or vector(0))"


def as_row(expr: str, key: str, value: str) -> str:
    """``expr`` (one series, no labels) labelled ``key="value"``."""
    return f'label_replace({expr}, "{key}", "{value}", "", "")'


def rows(key: str, exprs: Mapping[str, str]) -> str:
    """One series per row: each of ``exprs`` (value -> an expression of one unlabelled series, never
    empty) labelled ``key="value"``, as one vector a table shows row by row."""
    return " or ".join(as_row(expr, key, value) for value, expr in exprs.items())


def zeros(key: str, values: Sequence[str]) -> str:
    """0 for each of ``values`` of ``key``: ``sum by (key) (...) or zeros(...)`` has every row."""
    return rows(key, {value: "vector(0)" for value in values})


def filled(expr: str, key: str, values: Sequence[str]) -> str:
    """``expr`` (by ``key``, restricted to ``values``) with a 0 row for each value it lacks."""
    return f"({expr} or {zeros(key, values)})"


def values_regex(values: Sequence[str]) -> str:
    """A ``=~`` matcher value for exactly these label values."""
    return "~" + "|".join(re.escape(v) for v in values)
