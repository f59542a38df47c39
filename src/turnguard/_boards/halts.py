"""The **Halts** board: what fired, where, how often, what users answered, and whether the Collector
is delivering. It reads the raw series (short ranges, no recording lag), of the cohort the
``cohort`` variable picks (``live`` by default)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from turnguard._boards import promql as q
from turnguard._boards import series as ps
from turnguard._boards.panels import (
    PanelBuilder,
    bars,
    base,
    legend,
    over_time,
    query,
    ref,
    stat_panel,
    stats,
    with_panels,
)
from turnguard._boards.settings import DEFAULTS, CapSettings

UID = "turnguard-halts"
NO_TOOL = "(no tool: a model request, e.g. the cycle cap)"
"""The top-tools panel's name for halts that no tool call tripped (the cycle cap halts a model request)."""


def overview_panels() -> list[PanelBuilder]:
    """Panels of the overview row: the time range's counts and shares."""
    halted = q.sel(**ps.HALTED)
    answered_continue = q.sel(**{ps.ANSWER: "continue"})
    return [
        stat_panel(2, "Turns", "Agent turns that ended in the time range.", q.total(ps.TURNS)),
        stat_panel(3, "Turns halted",
                   "Turns that ended because turnguard halted them (any threshold, or a user's stop).",
                   q.total(ps.TURNS, halted)),
        stat_panel(4, "Halted share", "Turns halted / turns ended.",
                   f"{q.total(ps.TURNS, halted)} / {q.total(ps.TURNS)}", "percentunit"),
        stat_panel(5, "Detections", "Every time a threshold fired, acted on or only observed.",
                   q.total(ps.DETECTIONS)),
        stat_panel(6, "Asks answered \"continue\"",
                   "Share of turnguard's questions the user answered \"continue\": the false-positive "
                   "rate.", f"{q.total(ps.ANSWERS, answered_continue)} / {q.total(ps.ANSWERS)}", "percentunit"),
        stat_panel(7, "Plugin errors",
                   "turnguard plugins that raised; the guard isolated them (fail_mode). Every cohort.",
                   q.total(ps.PLUGIN_ERRORS)),
    ]


def detection_panels() -> list[PanelBuilder]:
    halt_action = q.sel(**{ps.ACTION: "halt"})
    action_attendance = (
        'sum by (action, attendance) (label_replace(label_replace(label_replace(label_replace('
        f'{q.counted(ps.DETECTIONS)}, '
        f'"action", "observed", "{ps.ACTION}", "allow"), '
        f'"action", "$1", "{ps.ACTION}", "(remind|ask|halt)"), '
        f'"attendance", "attended", "{ps.PROMPTABLE}", "true"), '
        f'"attendance", "unattended", "{ps.PROMPTABLE}", "false"))'
    )
    return [
        over_time(11, "Detections by threshold and level", "Detections per second.",
                  [query(q.per_second(ps.DETECTIONS, by=(ps.THRESHOLD, ps.LEVEL)), legend(ps.THRESHOLD, ps.LEVEL),
                         instant=False, exemplar=True)]),
        over_time(12, "Halts by threshold", "Detections whose action was halt, per second.",
                  [query(q.per_second(ps.DETECTIONS, halt_action, by=(ps.THRESHOLD,)), legend(ps.THRESHOLD),
                         instant=False, exemplar=True)]),
        bars(13, "What turnguard did, attended vs unattended",
             "Detections by action (observed = recorded, not acted on) and by whether a person was "
             "watching the turn (promptable).",
             [query(action_attendance, "{{action}} · {{attendance}}")], width=24, height=7),
    ]


def where_panels() -> list[PanelBuilder]:
    halt_action = q.sel(**{ps.ACTION: "halt"})
    halts = q.total(ps.DETECTIONS, halt_action, by=(ps.TOOL,))
    by_tool = f'label_replace({halts}, "{ps.TOOL}", "{NO_TOOL}", "{ps.TOOL}", "")'
    return [
        bars(21, "Top agents by halts", "Halting detections per agent (top 10).",
             [query(f"topk(10, {q.total(ps.DETECTIONS, halt_action, by=(ps.AGENT,))})", legend(ps.AGENT))], width=8),
        bars(22, "Top tools by halts",
             "Halting detections per tool: the call that tripped the threshold (top 10). A halt no tool call "
             f"tripped (the cycle cap halts a model request) is listed as {NO_TOOL}.",
             [query(f"topk(10, {by_tool})", legend(ps.TOOL))], width=8),
        polling_panel(),
    ]


def polling_panel() -> PanelBuilder:
    """Which tools poll: the streaks a changed result restarted, beside the streak's halts, by tool."""
    streak_halts = q.sel(**{ps.ACTION: "halt", ps.THRESHOLD: "streak"})
    return bars(23, "Which tools poll: streaks restarted by a new result, beside the streak's halts",
                "Per tool (top 10): identical-call streaks of a tool listed in stateful_tools that a changed result "
                "restarted (the call polled and the answer moved on: progress, not a loop), and the turns the "
                "identical-call streak halted at a call of that tool. A listed tool with no restarts was never "
                "called twice alike, or never answered differently; a tool with streak halts and no restarts that "
                "does poll needs listing (and its results passed to record_outcome).",
                [query(f"topk(10, {q.total(ps.RESULT_RESTARTS, by=(ps.TOOL,))})", f"{legend(ps.TOOL)}: restarted",
                       "A"),
                 query(f"topk(10, {q.total(ps.DETECTIONS, streak_halts, by=(ps.TOOL,))})",
                       f"{legend(ps.TOOL)}: streak halts", "B")], width=8)


def escalation_panels() -> list[PanelBuilder]:
    answered_continue = q.sel(**{ps.ANSWER: "continue"})
    fp_rate = (f"{q.total(ps.ANSWERS, answered_continue, by=(ps.THRESHOLD,))} / "
               f"{q.total(ps.ANSWERS, by=(ps.THRESHOLD,))}")
    return [
        bars(31, "Answers by threshold",
             "Users' answers to turnguard's questions (ASK), by the threshold that asked.",
             [query(q.total(ps.ANSWERS, by=(ps.THRESHOLD, ps.ANSWER)), legend(ps.THRESHOLD, ps.ANSWER, sep=": "))],
             width=8),
        bars(32, "False-positive rate by threshold",
             "Share of asks answered \"continue\": the user judged the turn fine.",
             [query(fp_rate, legend(ps.THRESHOLD))], unit="percentunit", width=8),
        over_time(33, "Answers over time", "Answers per second.",
                  [query(q.per_second(ps.ANSWERS, by=(ps.ANSWER,)), legend(ps.ANSWER), instant=False)], width=8),
    ]


def turn_panels() -> list[PanelBuilder]:
    return [
        bars(41, "Turns by how they ended",
             "Turns by outcome and the threshold that ended them (none: it ended on its own).",
             [query(q.total(ps.TURNS, by=(ps.OUTCOME, ps.THRESHOLD)), legend(ps.OUTCOME, ps.THRESHOLD))]),
        over_time(42, "Turns ending, by outcome", "Turns ended per second.",
                  [query(q.per_second(ps.TURNS, by=(ps.OUTCOME,)), legend(ps.OUTCOME), instant=False)]),
    ]


NO_TURN = ""
"""The cohort of a result that reached no turn (unknown, expired, invalid token or id): it has none."""


def results_panels() -> list[PanelBuilder]:
    """Task results: how they arrive and what becomes of them, and the turns left without one, so a
    broken reporter or a mismatched ``digest_key`` shows before the probe evidence goes quiet."""
    with_turn = q.sel(**{ps.RESOLVED: "~true|false"})
    accepted, unknown = q.sel(**{ps.RESULT_STATUS: "accepted"}), q.sel(**{ps.RESOLVED: "unknown"})
    no_turn = q.sel(**{ps.COHORT: NO_TURN})
    turns = q.total(ps.TURNS, by=(ps.AGENT,))
    without = q.total(ps.TURNS, unknown, by=(ps.AGENT,))
    late = q.total(ps.RESULTS, accepted, by=(ps.AGENT,))
    return [
        bars(61, "Task results by channel and status",
             "Results reported with the turn (turn.report_result, by whether the task was resolved), and after "
             "it (guard.report_result with the turn id or its result token), by what became of them: accepted, "
             "duplicate (the turn had one: the first stands), and, reaching no turn of this cohort, unknown (no "
             "such turn), expired (ended too long ago), invalid token (another digest_key, cut short, forged), "
             "invalid id or value. Only accepted results count; the others are lost.",
             [query(q.total(ps.TURNS, with_turn, by=(ps.RESOLVED,)), f"with the turn: resolved={legend(ps.RESOLVED)}",
                    "A"),
              query(q.total(ps.RESULTS, by=(ps.RESULT_STATUS,)), f"after the turn: {legend(ps.RESULT_STATUS)}", "B"),
              query(q.total(ps.RESULTS, no_turn, by=(ps.RESULT_STATUS,)), f"no turn: {legend(ps.RESULT_STATUS)}",
                    "C")], width=12, height=8),
        bars(62, "Ended turns with no result, by agent",
             "Per agent that ended turns in the time range, the share of them that have no task result: none with the "
             "turn, less the results accepted after it (late results of turns that ended before the range "
             "count too, so a share can read low, never below 0). Near 1 for an agent that reports results: its "
             "reporter is broken or its results reach no guard (see the statuses beside it).",
             [query(f"clamp_min(({without} or 0 * {turns}) - ({late} or 0 * {turns}), 0) / ({turns} > 0)",
                    legend(ps.AGENT))],
             unit="percentunit", width=12, height=8),
    ]

REMOTE_WRITE, QUEUE_RECEIVER = "prometheus_remote_write", "otlp/queue"
"""The metrics' second leg (collector-config.yaml): the remote write tries each request once and the
disk queue in front of it (``otlp_http/queue``) retries it, so its failures are tries, not losses;
the loopback receiver between the legs refuses what the remote write failed, so its refusals are
not the agents' points turned away."""


def collector_panels() -> list[PanelBuilder]:
    """The Collector's own metrics, so "no data" (a broken pipeline) and "no halts" look different.

    A point is lost where an exporter other than the remote write gives up on it (``otlp_http/queue``
    drops what Prometheus refuses) or where the agents' receiver refuses it; the remote write's
    failures are tries the disk queue repeats, shown apart; the internal receiver is left out."""
    dropped, tries = q.sel(exporter=f"!{REMOTE_WRITE}"), q.sel(exporter=REMOTE_WRITE)
    agents = q.sel(receiver=f"!{QUEUE_RECEIVER}")
    points = ps.OTELCOL_SEND_FAILED["metric_points"]
    failed = [query(q.per_second(metric, dropped, by=("exporter",)),
                    f"{{{{exporter}}}} {signal.replace('_', ' ')} dropped", ref(i), instant=False)
              for i, (signal, metric) in enumerate(ps.OTELCOL_SEND_FAILED.items())]
    failed.append(query(q.per_second(points, tries, by=("exporter",)),
                        "{{exporter}} failed tries (retried from the disk queue)", ref(len(failed)), instant=False))
    return [
        stats(51, "Metric points the Collector dropped; failed tries",
              "Over the time range. Dropped: points an exporter gave up on (otlp_http/queue: Prometheus refused "
              "them), lost to the boards, which show fewer halts, not an error. Failed tries: the remote write's "
              "tries that failed (Prometheus down or refusing), one per point per try; the disk queue keeps "
              "those points and retries them, so they land late, not lost.",
              [query(q.zero_or(q.total(points, dropped)), "dropped", "A"),
               query(q.zero_or(q.total(points, tries)), "failed tries (retried)", "B")]),
        over_time(52, "Metric points received from the agents: accepted vs refused",
                  "Per second, by receiver, the Collector's internal otlp/queue left out (it refuses what a failed "
                  "try returns, which the disk queue retries). Refused points were turned away (memory limiter, "
                  "bad data, a full disk queue): the sender may retry them, else they are lost.",
                  [query(q.per_second(ps.OTELCOL_ACCEPTED, agents, by=("receiver",)), "{{receiver}} accepted", "A",
                         instant=False),
                   query(q.per_second(ps.OTELCOL_REFUSED, agents, by=("receiver",)), "{{receiver}} refused", "B",
                         instant=False)], width=7),
        over_time(53, "Dropped exports and failed tries, by exporter",
                  "Items per second an exporter gave up on (dropped: the backend refused them, or is down and "
                  "the exporter's retries ran out), and the remote write's failed tries (Prometheus down or "
                  "refusing; the disk queue retries the points, so a try failing is not a point lost).",
                  failed, width=7),
        over_time(54, "Export queue fill, by exporter",
                  "Queue size over capacity: near 1, new data is refused (otlp_http/queue, on disk: the agents' "
                  "exports, refused on panel 52).",
                  [query(f"max by (exporter) ({ps.OTELCOL_QUEUE_SIZE} / {ps.OTELCOL_QUEUE_CAPACITY})", "{{exporter}}",
                         instant=False)], unit="percentunit", width=6),
    ]


def halts_dashboard(cap: CapSettings = DEFAULTS) -> Dashboard:
    """What fired, where, how often, and what users answered."""
    board = base(UID, "turnguard: halts",
                 "What turnguard detected and did to agent turns, where, and what users answered when asked. "
                 "The cohort variable picks live (the default) or probe turns.", ["turnguard", "agents"])
    for row, title, panels in ((1, "Overview", overview_panels()), (10, "Detections", detection_panels()),
                               (20, "Where", where_panels()), (30, "Escalations", escalation_panels()),
                               (40, "Turns", turn_panels()),
                               (50, "Collector: is the telemetry arriving?", collector_panels()),
                               (60, "Task results: are they arriving?", results_panels())):
        board = with_panels(board.with_row(Row(title).id(row)), panels)
    return board
