"""turnguard's Prometheus recording and alerting rules, as code: one counting form for every record.

    python -m turnguard._boards.rules            # regenerate the committed rules (rules/)
    python -m turnguard._boards.rules --check    # exit 1 if they are stale

Every record counts what a cumulative series gained since the previous evaluation of its group,
from a per-series record of where that evaluation left it (``turnguard:<metric>:tile_end``), so
consecutive records chain: a gap in the samples or in the evaluations (a Prometheus outage) is
counted once, in the first record after it, and a late sample in the record after its own. The
rendered file's header says what the form assumes and which way it errs where it cannot know.

Two variants from this one source (``Tiling.start_times``): ``turnguard.rules.yaml`` for stores
that do not know when a cumulative series started (Prometheus 2.x; remote write 1.0, the shipped
Collector route) and ``turnguard.start-times.rules.yaml`` for Prometheus 3 with
``--enable-feature=created-timestamp-zero-ingestion`` fed over OTLP or remote write 2.0, where each
series' start time is stored as a 0 sample and tells a new series from an old one first seen.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from turnguard import _assets as assets
from turnguard._boards import rule_cases
from turnguard._boards.series import (
    ACTION,
    AGENT,
    ANSWER,
    ANSWERS,
    CALLS_BUCKET,
    CALLS_PAST_MAIN,
    CAP_MODE,
    COHORT,
    CYCLES,
    DETECTIONS,
    FAILING_BUCKET,
    FIRST_STUCK,
    LEVEL,
    MAIN_THRESHOLD,
    MAX_FAILING,
    MAX_REPEAT,
    NOT_HALTED,
    OTELCOL_SEND_FAILED,
    OUTCOME,
    PAST_SOFT_CAP,
    POLICY,
    REPEAT_BUCKET,
    RESOLVED,
    RESULT_STATUS,
    RESULTS,
    SHADOW_DETECTIONS,
    SHADOW_POLICY,
    SHADOW_TOOL_CALLS,
    STUCK,
    THRESHOLD,
    TOOL_CALLS,
    TURNS,
)


@dataclass(frozen=True)
class Count:
    """A record counting ``metric``'s events per evaluation, summed by ``by``."""

    record: str
    metric: str
    by: tuple[str, ...]


_TURN = (POLICY, AGENT, COHORT, RESOLVED, OUTCOME, THRESHOLD, CAP_MODE, STUCK, MAIN_THRESHOLD)
COUNTS = (
    Count("turnguard:turns:increase5m", TURNS, _TURN),
    Count("turnguard:turn_tool_calls_bucket:increase5m", f"{TOOL_CALLS}_bucket",
          ("le", POLICY, AGENT, COHORT, RESOLVED, OUTCOME, THRESHOLD, CAP_MODE, STUCK, MAIN_THRESHOLD)),
    Count("turnguard:turn_tool_calls_sum:increase5m", f"{TOOL_CALLS}_sum", (POLICY, AGENT, COHORT, THRESHOLD)),
    Count("turnguard:turn_cycles_bucket:increase5m", f"{CYCLES}_bucket",
          ("le", POLICY, AGENT, COHORT, RESOLVED, THRESHOLD)),
    Count("turnguard:turn_max_key_repeat_bucket:increase5m", f"{MAX_REPEAT}_bucket",
          ("le", POLICY, AGENT, COHORT, RESOLVED, THRESHOLD, PAST_SOFT_CAP)),
    Count("turnguard:turn_max_key_repeat_count:increase5m", f"{MAX_REPEAT}_count",
          (POLICY, AGENT, COHORT, RESOLVED, THRESHOLD, PAST_SOFT_CAP)),
    Count("turnguard:turn_max_failing_streak_bucket:increase5m", f"{MAX_FAILING}_bucket",
          ("le", POLICY, AGENT, COHORT, RESOLVED, THRESHOLD)),
    Count("turnguard:turn_first_stuck_call_sum:increase5m", f"{FIRST_STUCK}_sum", (POLICY, AGENT, COHORT, THRESHOLD)),
    Count("turnguard:turn_first_stuck_call_count:increase5m", f"{FIRST_STUCK}_count",
          (POLICY, AGENT, COHORT, THRESHOLD)),
    Count("turnguard:turn_results:increase5m", RESULTS,
          (POLICY, AGENT, COHORT, RESOLVED, RESULT_STATUS, CALLS_BUCKET, THRESHOLD, MAIN_THRESHOLD, REPEAT_BUCKET,
           FAILING_BUCKET)),
    Count("turnguard:probe_calls_past_main_threshold:increase5m", CALLS_PAST_MAIN, (POLICY, AGENT, MAIN_THRESHOLD)),
    Count("turnguard:loop_detections:increase5m", DETECTIONS, (POLICY, AGENT, COHORT, THRESHOLD, LEVEL)),
    Count("turnguard:escalation_answers:increase5m", ANSWERS, (POLICY, AGENT, COHORT, THRESHOLD, ANSWER)),
    Count("turnguard:shadow_turns:increase5m", f"{SHADOW_TOOL_CALLS}_count",
          (POLICY, AGENT, COHORT, SHADOW_POLICY, OUTCOME, THRESHOLD)),
    Count("turnguard:shadow_turn_tool_calls_sum:increase5m", f"{SHADOW_TOOL_CALLS}_sum",
          (POLICY, AGENT, COHORT, SHADOW_POLICY)),
    Count("turnguard:shadow_detections:increase5m", SHADOW_DETECTIONS,
          (POLICY, AGENT, COHORT, SHADOW_POLICY, THRESHOLD, LEVEL, ACTION)),
)
RECORDED = {c.metric: c.record for c in COUNTS}
"""Raw series -> the record that counts it (the boards read these)."""


def duration(seconds: float) -> str:
    """A Prometheus duration: ``300`` -> ``5m``, ``899`` -> ``14m59s``, ``0.5`` -> ``500ms``."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts) or "0s"


@dataclass(frozen=True)
class Tiling:
    """When the records evaluate and how far back they look.

    ``tile``: the group's interval; ``lag``: how far behind the evaluation each record's end lies
    (samples up to that late land in their own record); ``lookback``: how long a series may go
    unseen and still count from where it was left; ``start_times``: the store holds each series'
    start as a 0 sample (Prometheus 3's created-timestamp zero ingestion); ``late``: how far back
    each evaluation's state looks for a series' last sample, so a sample that lands late (queued in
    the Collector through a Prometheus outage) is counted whenever it lands: Prometheus's head takes
    nothing older than about an hour before its newest sample (half its 2-hour block)."""

    tile: float = 300
    lag: float = 60
    lookback: float = 86_400
    start_times: bool = False
    late: float = 3600

    @property
    def fresh_window(self) -> float:
        """How far back a store's first record looks for a series' first sample (or its start's 0)."""
        return 3 * self.tile


HEARTBEAT = "turnguard:tile_end:series"
"""How many series the last evaluation left a state for: absent for ``lookback``, the store is new to the rules."""


def state(metric: str) -> str:
    """The per-series record of where the last evaluation left ``metric``."""
    return f"turnguard:{metric}:tile_end"


def settled(t: Tiling) -> str:
    """Present once the store has held the records' state for ``fresh_window`` (and within ``lookback``).

    In the start-times variant a store younger than that (new, emptied, replaced) reads each series
    over the fresh window only: a running process's start, kept as a 0 long before the store began,
    must not become its first state, or the records would count its history again."""
    return f"last_over_time({HEARTBEAT}[{duration(t.lookback)}] offset {duration(t.fresh_window)})"


def where(metric: str, t: Tiling = Tiling()) -> str:
    """The state's expression: the series' last sample up to the records' end, however late it landed
    (in a store the rules have not yet ``settled`` in, start-times variant: within the fresh window)."""
    late = f"last_over_time({metric}[{duration(t.late)}] offset {duration(t.lag)})"
    if not t.start_times:
        return late
    fresh = f"last_over_time({metric}[{duration(t.fresh_window)}] offset {duration(t.lag)})"
    return f"{late} and on() {settled(t)}\nor {fresh} unless on() {settled(t)}"


def counted(metric: str, by: Sequence[str], t: Tiling = Tiling()) -> str:
    """The one counting form: per series, what ``metric`` gained since the previous evaluation, summed by ``by``.

    ``now`` is the series at the record's end as this evaluation's state recorded it (the state rule
    runs first, so a sample landing between two rules of one evaluation cannot slip between the
    record and the state; it reads ``late`` back, so a sample that lands late is counted when it
    lands); ``before`` the previous state (up to ``lookback`` ago). A value below ``before`` or a
    drop within the tile is a reset: the run after it counts from zero, plus the growth before it
    when the tile's peak shows it (a late sample has no tile). A series with no ``before`` counts from zero
    (from its start's 0 where the store keeps one), except in a store the rules have not yet left
    any state in (start-times variant: not yet ``settled`` in), where it counts from its first sample
    within the fresh window."""
    lag, tile, back = duration(t.lag), duration(t.tile), duration(t.lookback)
    now = state(metric)
    before = f"last_over_time({state(metric)}[{back}] offset 1ms)"
    low = f"min_over_time({metric}[{tile}] offset {lag})"
    peak = f"max_over_time({metric}[{tile}] offset {lag})"
    known = settled(t) if t.start_times else f"last_over_time({HEARTBEAT}[{back}])"
    first = f"{now} - min_over_time({metric}[{back}] offset {lag})" if t.start_times else now
    fresh = f"{now} - min_over_time({metric}[{duration(t.fresh_window)}] offset {lag})"
    reset = f"({low} < {before} or {now} < {before} or resets({metric}[{tile}] offset {lag}) > 0)"
    return (f"sum by ({', '.join(by)}) (\n"
            f"  ({now} - {before}) unless {reset}\n"
            f"  or ({now} + (clamp_min({peak} - {before}, 0) * ({peak} > bool {now}) or {now} * 0)) and {reset}\n"
            f"  or ({first} unless {before}) and on() {known}\n"
            f"  or ({fresh} unless {before}) unless on() {known}\n"
            f")")


# -- alerts: in the records' group, after the records they read --------------------------------------


def last(record: str, selector: str, seconds: float, by: Sequence[str] = ()) -> str:
    """What ``record`` counted in the records of the last ``seconds`` (a range one second short of
    them, so the record one window back is left out whether ranges are closed, as in 2.x, or not)."""
    group = f" by ({', '.join(by)})" if by else ""
    return f"sum{group} (sum_over_time({record}{selector}[{duration(seconds - 1)}]))"


HOUR, DAY = 3600, 86_400
TURNS_RECORD, ANSWERS_RECORD, RESULTS_RECORD = (RECORDED[m] for m in (TURNS, ANSWERS, RESULTS))
NO_HALT = NOT_HALTED[THRESHOLD]
HALTED = f'{{{THRESHOLD}!="{NO_HALT}"}}'
"""Halted turns by their threshold (``series.HALTED``), however the host ended them."""
BACKSTOP = f'{{{THRESHOLD}="hard_backstop", {COHORT}!="probe"}}'
CONTINUE = f'{{{ANSWER}="continue"}}'
PROBE_AT_BACKSTOP = f'{COHORT}="probe", {MAIN_THRESHOLD}="hard_backstop"'
SHARE_WINDOW = 7 * DAY


def probe_resolved(seconds: float, selector: str = "", by: Sequence[str] = ()) -> str:
    """Probe turns the live backstop would have halted whose task was resolved: at the turn's end (its
    histogram) or later (an accepted late result), as the boards count them."""
    extra = f", {selector}" if selector else ""
    at_end = "{" + f'{PROBE_AT_BACKSTOP}, {RESOLVED}="true"{extra}' + "}"
    late = "{" + f'{PROBE_AT_BACKSTOP}, {RESOLVED}="true", {RESULT_STATUS}="accepted"{extra}' + "}"
    return (f"({last(TURNS_RECORD, at_end, seconds, by)} or vector(0))"
            f" + ({last(RESULTS_RECORD, late, seconds, by)} or vector(0))")


def probe_share_sentence() -> str:
    """An annotation sentence: the agent's probe evidence at the backstop, from the records."""
    agent = f'{AGENT}=%[1]q'
    past = last(TURNS_RECORD, f"{{{PROBE_AT_BACKSTOP}, {agent}}}", SHARE_WINDOW)
    share = f"({probe_resolved(SHARE_WINDOW, agent)}) / ({past} > 0)"
    return ("{{ with printf `" + share + "` $labels." + AGENT + " | query }}"
            "Of this agent's probe turns the backstop would have halted (7 days), {{ . | first | value | "
            "humanizePercentage }} resolved their task."
            "{{ else }}No probe turn of this agent reached the backstop in 7 days: nothing says whether "
            "these were runaways.{{ end }}")


def alerts() -> list[dict]:
    halted_1h, all_1h = last(TURNS_RECORD, HALTED, HOUR), last(TURNS_RECORD, "", HOUR)
    share_1h = f"({halted_1h} / {all_1h})"
    share_7d = f"({last(TURNS_RECORD, HALTED, 7 * DAY)} / {last(TURNS_RECORD, '', 7 * DAY)})"

    def burn(long: float, short: float, factor: int, least: int) -> str:
        def ratio(seconds: float) -> str:
            return (f"({last(ANSWERS_RECORD, CONTINUE, seconds)} / {last(ANSWERS_RECORD, '', seconds)}) / 0.10")
        return (f"{ratio(long)} > {factor}\nand\n{ratio(short)} > {factor}\n"
                f"and {last(ANSWERS_RECORD, '', long)} >= {least}")

    return [
        {"alert": "TurnguardHaltRateSpike",
         "comment": "The share of turns halted in the last hour is three times the week's and above 5%.",
         "expr": f"{share_1h} > 0.05\nand\n{share_1h} > 3 * {share_7d}\nand {all_1h} >= 50",
         "for": "15m", "labels": {"severity": "ticket"},
         "annotations": {
             "summary": "turnguard halts {{ $value | humanizePercentage }} of turns, three times the weekly share",
             "description": "A model, prompt or tool change is making agents loop, or a threshold is too tight. "
                            "The halts board's \"Halts by threshold\" and \"Top tools by halts\" show which."}},
        {"alert": "TurnguardBackstopHalts",
         "comment": "Live turns halted at the backstop (S x m calls) without the stuck signal ending them first.",
         "expr": f"{last(TURNS_RECORD, BACKSTOP, 15 * 60, (AGENT,))} > 0",
         "labels": {"severity": "ticket"},
         "annotations": {
             "summary": "{{ $value }} turns of agent {{ $labels." + AGENT + " }} halted at the backstop in 15 minutes",
             "description": "Each made the backstop's S x m tool calls and was halted there: halted at the "
                            "backstop, not necessarily a runaway. " + probe_share_sentence() + " The "
                            "threshold-validation board's \"Turns halted at the backstop\" row shows whether the "
                            "stuck signal flagged them earlier."}},
        {"alert": "TurnguardFalseHaltBudgetBurnFast",
         "comment": "Objective: at most 10% of turnguard's asks are answered \"continue\" (the user judged the "
                    "turn fine). Fast burn: over half of the asks in the last hour and the last 15 minutes.",
         "expr": burn(HOUR, 15 * 60, 5, 10), "labels": {"severity": "page"},
         "annotations": {
             "summary": "{{ $value | humanize }}x the false-halt budget: users answer \"continue\" to most asks",
             "description": "turnguard interrupts productive turns. Look at \"False-positive rate by threshold\" on "
                            "the halts board; raise that threshold or run `turnguard calibrate` on recent turns."}},
        {"alert": "TurnguardFalseHaltBudgetBurnSlow",
         "comment": "Slow burn: over 20% of the asks in the last 6 hours and the last 30 minutes.",
         "expr": burn(6 * HOUR, 30 * 60, 2, 20), "labels": {"severity": "ticket"},
         "annotations": {"summary": "{{ $value | humanize }}x the false-halt budget over 6 hours",
                         "description": "A threshold asks too often on turns users judge fine; calibrate it."}},
        {"alert": "TurnguardProbeResolvedPastBackstop",
         "comment": "Probe turns the live backstop would have halted (turnguard_probe_main_threshold) whose task "
                    "was then resolved, at the turn's end or by a late result: the backstop kills wins.",
         "expr": f"{probe_resolved(DAY)} > 0", "labels": {"severity": "ticket"},
         "annotations": {
             "summary": "{{ $value }} probe turns the backstop would have halted resolved their task in the last day",
             "description": "The live backstop would have halted these productive turns. Check the "
                            "threshold-validation board and `turnguard calibrate` probe evidence before raising "
                            "hard_multiplier."}},
    ]


# -- alerts on the task results: are they arriving, and are they the turns' own? ---------------------

WITH_RESULT = f'{{{RESOLVED}=~"true|false"}}'
ACCEPTED = f'{{{RESULT_STATUS}="accepted"}}'
INVALID_TOKEN = f'{{{RESULT_STATUS}="invalid_token"}}'
RESULTS_LEAST_TURNS = 20
"""Turns an agent must end in the hour before its silence counts: a quiet agent is not a broken reporter."""


def results_arrived(seconds: float) -> str:
    """Agents with a task result in the last ``seconds``: reported with the turn (its histogram's
    ``resolved``) or after it (an accepted late result)."""
    return (f"({last(TURNS_RECORD, WITH_RESULT, seconds, (AGENT,))} > 0"
            f" or {last(RESULTS_RECORD, ACCEPTED, seconds, (AGENT,))} > 0)")


def result_alerts() -> list[dict]:
    """Task results that stop arriving (a broken reporter, a result token that no longer reaches a
    guard) and result tokens that are refused (another ``digest_key``, truncated or forged tokens)."""
    turns_1h = last(TURNS_RECORD, "", HOUR, (AGENT,))
    invalid_1h, reports_1h = last(RESULTS_RECORD, INVALID_TOKEN, HOUR), last(RESULTS_RECORD, "", HOUR)
    return [
        {"alert": "TurnguardResultsStopped",
         "comment": "An agent that reported task results in the last day ended turns in the last hour with none.",
         "expr": (f"{turns_1h} >= {RESULTS_LEAST_TURNS}\nunless on({AGENT}) {results_arrived(HOUR)}\n"
                  f"and on({AGENT}) {results_arrived(DAY)}"),
         "labels": {"severity": "ticket"},
         "annotations": {
             "summary": "No task result for agent {{ $labels." + AGENT + " }} in an hour ({{ $value }} turns ended)",
             "description": "This agent reported results earlier today and none since: its reporter (turn."
                            "report_result, guard.report_result, a CI job with the result token) stopped or its "
                            "results reach no guard. Without results the probe evidence and calibrate cannot tell "
                            "productive turns from failed ones. The halts board's \"Task results\" row shows "
                            "which status they get."}},
        {"alert": "TurnguardInvalidResultTokens",
         "comment": "Result tokens refused (invalid_token): more than 10% of the late reports in the hour, 5 or more.",
         "expr": f"{invalid_1h} >= 5\nand\n{invalid_1h} > 0.1 * {reports_1h}",
         "labels": {"severity": "ticket"},
         "annotations": {
             "summary": "{{ $value }} result tokens refused in an hour",
             "description": "Tokens that do not read as this guard's: a digest_key that differs between the "
                            "process that ran the turn and the one that reports (refused as forged), tokens cut "
                            "short or rewritten on the way, or forged ones. Their results are lost. The halts "
                            "board's \"Task results\" row shows them beside the accepted ones."}},
    ]

UPTIME = "otelcol_process_uptime_seconds_total"


def export_failing(window: float = 15 * 60, t: Tiling = Tiling()) -> dict:
    """The Collector alert, from its raw counters: failures first seen within ``window``.

    Per series: everything a Collector younger than the window (just started or restarted) has
    failed; or the growth since its last sample before the window, however old (up to the lookback:
    what it failed while Prometheus was down is seen at once when Prometheus is back, the Prometheus
    that evaluates this being the one that was down), all of it when it dropped meanwhile (a
    restart); or the whole value of a series first seen in the window while Prometheus had scraped
    the Collector before it (the failure counter is born at its first failure, in the window or in a
    gap; a new store is not a birth); or, in a store new to the series, the growth among the
    window's own samples. A failure seen only before the window does not page."""
    w, back = duration(window), duration(t.lookback)

    def failed(metric: str, signal: str) -> str:
        young = f"{metric} and on(job, instance) {UPTIME} < {window:g}"
        grown = f"(last_over_time({metric}[{w}]) - last_over_time({metric}[{back}] offset {w}))"
        anchored = f"{grown} >= 0 or last_over_time({metric}[{w}]) and {grown} < 0"
        born = (f"(last_over_time({metric}[{w}]) unless last_over_time({metric}[{back}] offset {w}))"
                f" and on(job) count by (job) (last_over_time(up[{back}] offset {w}))")
        within = f"max_over_time({metric}[{w}]) - min_over_time({metric}[{w}])"
        return (f"label_replace(sum by (job, instance, exporter) (\n  {young}\n  or {anchored}\n  or {born}\n"
                f"  or {within}\n), \"signal\", \"{signal}\", \"\", \"\") > 0")

    return {
        "alert": "TurnguardCollectorExportFailing",
        "comment": "Telemetry is late or lost: the dashboards would show fewer halts, not an error. The remote "
                   "write's failures are failed tries (the queue in front keeps the points); otlp_http/queue's "
                   "and the other exporters' are points dropped.",
        "expr": "\nor\n".join(failed(m, s.replace("_", " ")) for s, m in OTELCOL_SEND_FAILED.items()),
        "labels": {"severity": "page"},
        "annotations": {
            "summary": "Collector {{ $labels.instance }}: exporter {{ $labels.exporter }} failed to send "
                       "{{ $value }} {{ $labels.signal }} in 15 minutes",
            "description": "The backend behind {{ $labels.exporter }} is down or refusing data. Until it is fixed "
                           "the turnguard boards undercount; the halts board's Collector row shows since when."}}


# -- the file ----------------------------------------------------------------------------------------


CENSORING_OUTCOMES = ("halted", "error", "cancelled", "abandoned", "plugin_error")
"""The ends that censor a turn at its call count (calibrate's ``survival.CENSORING_ENDS``), besides a
threshold: a halted turn is censored whatever outcome the host gave it; any other outcome of a turn
no threshold halted, ``completed`` or a host's reason of its own, is the turn finishing."""
FATE = "fate"
FATES_RECORD = "turnguard:turn_tool_calls_fate_bucket:increase5m"
"""The tool-call histogram's record by how each turn ended (``fate``: ``finished`` or ``censored``)."""


def fates() -> dict:
    """The tiles' tool-call buckets, by whether the turn finished or was censored at its count: what a
    product-limit (Kaplan-Meier) estimate reads. Config-free (every ``le`` kept); the board picks the
    buckets its configuration needs (past the backstop, never past the probe's cap)."""
    bucket, censoring = RECORDED[f"{TOOL_CALLS}_bucket"], "|".join(CENSORING_OUTCOMES)
    by = ", ".join(("le", POLICY, AGENT, COHORT, CAP_MODE, FATE))
    finished = f'{bucket}{{{THRESHOLD}="{NO_HALT}", {OUTCOME}!~"{censoring}"}}'
    censored = f'{bucket}{HALTED} or {bucket}{{{OUTCOME}=~"{censoring}"}}'
    return {"record": FATES_RECORD,
            "comment": "Derived from the bucket record of the same evaluation: turns per bucket, finished (ended on "
                       "their own) or censored (halted by any threshold, however the host then ended them; "
                       "cancelled, failed) at their call count, as calibrate's ended_by decides.",
            "expr": (f"sum by ({by}) (\n"
                     f'  label_replace({finished}, "{FATE}", "finished", "", "")\n'
                     f'  or label_replace({censored}, "{FATE}", "censored", "", "")\n'
                     f")")}


DERIVED: list[dict] = [fates()]
"""Records computed from the counting records (ratios, intervals): in the group after them, before the alerts."""


def groups(t: Tiling = Tiling()) -> list[dict]:
    states = [{"record": state(c.metric), "expr": where(c.metric, t)} for c in COUNTS]
    records = [{"record": c.record, "expr": counted(c.metric, c.by, t)} for c in COUNTS] + DERIVED
    heartbeat = {"record": HEARTBEAT, "expr": 'count({__name__=~"turnguard:.+:tile_end"})'}
    return [
        {"name": "turnguard", "interval": duration(t.tile),
         "rules": [*states, *records, *alerts(), *result_alerts(), heartbeat]},
        {"name": "turnguard-collector", "rules": [export_failing(t=t)]},
    ]


def _scalar(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def _rule_lines(rule: dict) -> list[str]:
    kind = "alert" if "alert" in rule else "record"
    lines = [f"      - {kind}: {rule[kind]}"]
    if rule.get("comment"):
        lines += [f"        # {line}" for line in _wrap(rule["comment"], 92)]
    lines.append("        expr: |-")
    lines += [f"          {line}" if line else "" for line in rule["expr"].split("\n")]
    if "for" in rule:
        lines.append(f"        for: {rule['for']}")
    for key in ("labels", "annotations"):
        if key in rule:
            lines.append(f"        {key}:")
            lines += [f"          {k}: {_scalar(v)}" for k, v in rule[key].items()]
    return lines


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def render(t: Tiling = Tiling(), *, commented: bool = True) -> str:
    """The rules file's text (with its header unless not ``commented``)."""
    lines = [f"# {line}".rstrip() for line in header(t).split("\n")] if commented else []
    lines.append("groups:")
    for group in groups(t):
        lines.append(f"  - name: {group['name']}")
        if "interval" in group:
            lines.append(f"    interval: {group['interval']}")
        lines.append("    rules:")
        for rule in group["rules"]:
            lines += _rule_lines(rule)
    return "\n".join(lines) + "\n"


# -- the variants, their headers, the Prometheus configs that load them -----------------------------

PORTABLE, START_TIMES = Tiling(), Tiling(start_times=True)
FILES = {PORTABLE: "turnguard.rules.yaml", START_TIMES: "turnguard.start-times.rules.yaml"}
TEST_FILES = {PORTABLE: "turnguard.rules.test.yaml", START_TIMES: "turnguard.start-times.rules.test.yaml"}
CONFIGS = {PORTABLE: "prometheus.yml", START_TIMES: "prometheus-start-times.yml"}
ZERO_INGESTION = "--enable-feature=created-timestamp-zero-ingestion"

_ROUTE = {
    PORTABLE: """\
This file: any Prometheus (2.42 or later) whose store does not know when a cumulative series
started: fed by remote write 1.0 (the shipped Collector route), or Prometheus 3 without
  {flag}.
Prometheus 3 fed over OTLP or remote write 2.0 with that flag: load {other}
instead (the same rules, told when each series started; prometheus/prometheus-start-times.yml).""",
    START_TIMES: """\
This file: Prometheus 3 run with
  {flag}
(it stores each series' start time, OTLP's StartTimeUnixNano, as a 0 sample), fed over OTLP
(--web.enable-otlp-receiver: the SDK's OTLP exporter, or a Collector's otlp_http exporter) or
remote write 2.0 (the Collector's prometheus_remote_write with protobuf_message:
io.prometheus.write.v2.Request, behind its feature gate
exporter.prometheusremotewritexporter.enableSendingRW2). Remote write 1.0 carries no start time:
with it, or without the flag, load {other}.""",
}

_COUNTING = """\
Counting. Every {tile} the group first records each raw cumulative series m where it stands at the
records' end, turnguard:m:tile_end = last_over_time(m[{late}] offset {lag}) (its last sample however
late it landed, up to {late}: Prometheus takes no older one); then each record stores, per label set, what
m gained since the previous evaluation, summed by the labels the boards and alerts read:
  now    = turnguard:m:tile_end                            this evaluation's state (the same read as
                                                         the state's: nothing lands between them)
  before = last_over_time(turnguard:m:tile_end[{back}] offset 1ms)   the previous evaluation's state
  reset  = min_over_time(m[{tile}] offset {lag}) < before, now < before, or resets(m[{tile}] offset {lag}) > 0
  gained = now - before                                  (no reset)
         = now + the tile's peak - before, if the peak is above now, else now   (after a reset)
         = {first:<46} (no before: a new series)
         = now - min_over_time(m[{fresh}] offset {lag})        (no before, in a store the rules
                                                          never left a state in: from its first sample)
and turnguard:tile_end:series, last in the group, counts the states.
Consecutive records chain: sum_over_time() of a record over whole tiles is exactly what the
series gained (no extrapolation, nothing lost between windows), and
  - a gap up to the lookback, {back} (samples missing, or the evaluations themselves: a Prometheus
    outage), is counted once, in the first record after it: when in the gap is unknown;
  - a sample later than the lag is counted in the first record after it lands, never lost: one
    the Collector queued through a Prometheus outage, the only sample of a process that exported
    once and exited during it, counts when it lands (however long after the first evaluation);
  - a series that stops reporting records 0 for {late}, then nothing; back within {back} it counts
    from where it was;
  - a counter reset with a stable service.instance.id (a restarted process) is seen as a drop.
The lag ({lag}) lets samples that arrive late (batched, retried) land in their own record; the
records run {lag} to {tile_lag} behind the data. Cost: one state series per raw series seen in the last
{late}, each state reads {late} of its raw series, and each record reads {back} of its states (and, in
the start-times file, {back} of its raw series).
"""

_ERRS = {
    PORTABLE: """\
Where the records err here, and why (the store cannot tell an old count from a new series):
  - a series seen again after more than {back} counts its whole value again: high;
  - a store that begins with old counters (new, emptied or replaced): its first record counts
    each series from its first sample, so history is not counted again, but a series born in
    that first tile loses its first sample (low); old counters that first arrive after it, from a
    source that joins later, count whole (high);
  - a reset to a value at or above the one before it is not seen: the record counts the
    difference, low by the value before; a reset is otherwise seen, and the growth before it is
    counted when the tile's peak shows it (the run after the reset still below it), else lost
    (low); several resets in one tile lose the runs between the first and the last (low).""",
    START_TIMES: """\
Where the records err here, and why (each series' start is a 0 the store keeps when the start is
after the series' last sample, before the sample in milliseconds and at most an hour older than
the newest sample; turnguard's configure() moves a start in its sample's millisecond one back):
  - a series with no before counts from its start's 0 if the store kept it within {back}, else
    from its first sample: a series seen again after more than {back}, or old counters from a
    source that joins later, count only what they gain (low, never high); a series whose 0 was
    not kept (born over an hour before its first sample arrived, or exported in the millisecond it
    started by a host whose exporter does not move the start) loses its first sample (low);
  - a store that begins with old counters (new, emptied or replaced): for its first {fresh} the
    states read each series within {fresh} only (a running process's start, kept as a 0 from
    before the store began, is never a state) and a series with no before counts from its start's 0
    if it started within {fresh} of the record's end, so a series started up to {fresh} before the
    store also counts what it did before (high, once); every other series from its first sample;
    a running process whose first sample in the new store lands in the last {lag} of those {fresh}
    counts its history (high, once);
  - every reset within a tile is seen (its 0); a reset during a gap is seen only when the value
    after it is below the one before (else low, by the value before); the growth before a reset
    is counted when the tile's peak shows it (low otherwise); several resets in one tile lose the
    runs between the first and the last (low).""",
}

_ALERTS = """\
Alerts. The turnguard alerts are in this group after the records they read, so each sees this
evaluation's records whatever order Prometheus evaluates groups in; their windows are whole tiles
(a range one second short of them: the same records on 2.x's closed ranges and 3.x's open ones).
They err as the records: a low count fires late or not at all (TurnguardBackstopHalts,
TurnguardProbeResolvedPastBackstop; the budget and spike ratios either way). A gap's events are
in the first record after it, so an alert counts them once, at that evaluation, with its window's
summary. TurnguardCollectorExportFailing reads the Collector's raw counters in its own group and
pages on failures first seen within its 15 minutes: all of a Collector younger than that, growth
since the series' last sample before the window however old (up to {back}: what failed while this
Prometheus was down pages when it is back), all of it after a drop (a restart), a failure series
born in the window or in a gap of a Collector this store had scraped, else growth within the window;
failures already seen before the window, or from before the store began, do not page. During an
outage it cannot page from here: load the turnguard-collector group in a Prometheus that scrapes
the Collector and is not the one it writes to (docs/deployment.md)."""


def header(t: Tiling) -> str:
    other = FILES[PORTABLE if t.start_times else START_TIMES]
    first = "now - min_over_time(m[{back}] offset {lag})" if t.start_times else "now"
    values = {"tile": duration(t.tile), "lag": duration(t.lag), "back": duration(t.lookback), "late": duration(t.late),
              "fresh": duration(t.fresh_window), "tile_lag": duration(t.tile + t.lag)}
    first = first.format(**values)
    key = START_TIMES if t.start_times else PORTABLE
    intro = ("Prometheus recording and alerting rules for turnguard, GENERATED by\n"
             "  python -m turnguard._boards.rules   (src/turnguard/_boards/rules.py: edit that, not this file)\n"
             f"Unit tests: promtool test rules {TEST_FILES[key]}")
    return "\n\n".join([intro, _ROUTE[key].format(flag=ZERO_INGESTION, other=other),
                        _COUNTING.format(first=first, **values).rstrip(), _ERRS[key].format(**values),
                        _ALERTS.format(**values)])


def prometheus_config(t: Tiling) -> str:
    key = START_TIMES if t.start_times else PORTABLE
    run = ("prometheus --config.file=DIR/prometheus/prometheus.yml \\\n"
           "#     --web.enable-remote-write-receiver --enable-feature=exemplar-storage"
           if not t.start_times else
           "prometheus --config.file=DIR/prometheus/prometheus-start-times.yml \\\n"
           f"#     --web.enable-otlp-receiver --web.enable-remote-write-receiver {ZERO_INGESTION},exemplar-storage")
    feed = ("# The Collector remote-writes turnguard's metrics to /api/v1/write (remote write 1.0). Works with\n"
            "# Prometheus 2.42 and 3.x. For Prometheus 3 fed over OTLP, use prometheus-start-times.yml.\n"
            if not t.start_times else
            "# Prometheus 3 only. turnguard's metrics arrive over OTLP at /api/v1/otlp/v1/metrics (the SDK's\n"
            "# OTLP metrics exporter, or a Collector's otlp_http exporter) or over remote write 2.0; the flag\n"
            "# stores each series' start, which the rules file loaded here needs.\n")
    otlp = ("" if not t.start_times else
            "\notlp:\n  # the names the boards query (the default): dots to underscores, units and _total added\n"
            "  translation_strategy: UnderscoreEscapingWithSuffixes\n")
    return (f"# Prometheus for turnguard's chain (written by `turnguard assets DIR`; GENERATED by\n"
            f"# `python -m turnguard._boards.rules`). Run it as\n#   {run}\n{feed}"
            "global:\n  scrape_interval: 15s\n  evaluation_interval: 1m\n"
            f"{otlp}\nrule_files:\n  - ../rules/{FILES[key]}   # recording rules and alerts (relative to this file)\n\n"
            "scrape_configs:\n"
            "  # The Collector's own metrics (collector-config.yaml serves them on :8888): accepted, refused,\n"
            "  # failed exports, queue size. The halts board's Collector row and TurnguardCollectorExportFailing "
            "read them.\n"
            "  - job_name: otelcol\n    static_configs:\n      - targets: [\"otelcol:8888\"]\n")


_TESTS_HEADER = """\
promtool test rules {tests}: the records count each series' events once and never more, through
gaps, resets and new stores; each alert fires on the traffic it is for and stays quiet on the
traffic next to it. GENERATED by python -m turnguard._boards.rules from the cases in
src/turnguard/_boards/rule_cases.py, whose store model computes every expected count the records
can know (tests/test_rules.py checks the others against it: they err only as the rules' header
says). The counting cases sample every 30 s; the records evaluate every 5 minutes, each ending a
minute before its evaluation."""


def written(root: Path) -> dict[Path, str]:
    """Every generated file under ``root`` (the assets' top level) -> its text."""
    out = {}
    for t in (PORTABLE, START_TIMES):
        tests = TEST_FILES[t]
        out[root / "rules" / FILES[t]] = render(t)
        out[root / "rules" / tests] = rule_cases.unit_tests(
            FILES[t], t.start_times, RECORDED[TURNS], duration, _TESTS_HEADER.format(tests=tests))
        out[root / "prometheus" / CONFIGS[t]] = prometheus_config(t)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="the assets' top level (default: the checkout's)")
    parser.add_argument("--check", action="store_true", help="fail if the files differ from a fresh render")
    args = parser.parse_args(argv)
    if args.out is None and assets.installed() and not args.check:
        parser.error(assets.INSTALLED)
    files = written(args.out or assets.root())
    if args.check:
        stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is stale: run python -m turnguard._boards.rules", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
