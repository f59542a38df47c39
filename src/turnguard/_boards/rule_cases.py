"""What a store holds of turnguard's counters, and what the records should count from it.

A ``Series`` is one label set reported by a sequence of ``Run``s (processes that kept the same
``service.instance.id``: each new run is a counter reset). A ``Store`` ingests the samples that
fall in its up-times (a gap is a stretch it missed); on the start-times route it also holds a 0 at
each run's start, as Prometheus 3's created-timestamp zero ingestion appends it. ``truth`` says,
per evaluation of the records, how many events first became visible in it: the count a record
must equal where the rules can know it, and never exceed anywhere.

Time is in slots of 30 seconds (the promtool inputs' interval); the records evaluate every 10 slots
(5 minutes) and end 2 slots (1 minute) before their evaluation, as the shipped rules do.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

SLOT_S = 30
TILE, LAG = 10, 2
"""The records' tile and lag, in slots."""
ACCEPT_START = 120
"""How old a run's start may be, in slots behind the store's newest sample when its first sample is
appended, for the store to keep its 0 (Prometheus: half its 2-hour head chunk range)."""


@dataclass(frozen=True)
class Run:
    """One process's life for a series: events in slots ``start``, ``start + 1``, ...; samples every
    second slot (on the series' phase) after ``start`` and a last one at its end (the shutdown flush).
    A sample at slot s holds the events of the slots before s."""

    start: int
    events: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.events)

    def samples(self, phase: int) -> list[int]:
        slots = [s for s in range(self.start + 1, self.end) if s % 2 == phase]
        return [*slots, self.end]

    def value(self, slot: int) -> int:
        return sum(self.events[: max(0, min(slot - self.start, len(self.events)))])


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    runs: tuple[Run, ...]
    phase: int = 1
    silent: tuple[tuple[int, int], ...] = ()
    """Stretches ``[a, b)`` in which its samples never reach the store (its counter goes on)."""

    def reports(self, slot: int) -> bool:
        return not any(a <= slot < b for a, b in self.silent)


@dataclass(frozen=True)
class Store:
    """The stretches ``[a, b)`` of slots the store ingested; ``start_times``: it keeps each run's 0 at its start."""

    up: tuple[tuple[int, int], ...]
    start_times: bool = False

    def ingests(self, slot: int) -> bool:
        return any(a <= slot < b for a, b in self.up)

    @property
    def began(self) -> int:
        return self.up[0][0]

    def newest_before(self, slot: int) -> int:
        """The store's newest sample before ``slot``: its last up slot (something reports all the time)."""
        return max((min(b, slot) - 1 for a, b in self.up if a < slot), default=slot)


@dataclass
class Held:
    """One series as the store holds it: slot -> value, and which run each sample came from."""

    values: dict[int, int] = field(default_factory=dict)
    run_of: dict[int, int] = field(default_factory=dict)


def held(series: Series, store: Store) -> Held:
    out, newest = Held(), -1
    for i, run in enumerate(series.runs):
        first = True
        for slot in run.samples(series.phase):
            if not (store.ingests(slot) and series.reports(slot)):
                continue
            kept = newest < run.start and run.start >= store.newest_before(slot) - ACCEPT_START
            if first and store.start_times and kept:
                out.values[run.start], out.run_of[run.start] = 0, i
            first = False
            out.values[slot], out.run_of[slot] = run.value(slot), i
            newest = slot
    return out


def evaluation_of(slot: int) -> int:
    """The first evaluation whose record ends at or after ``slot``."""
    return -(-(slot + LAG) // TILE) * TILE


def visible(series: Series, store: Store) -> Iterator[tuple[int, int]]:
    """(evaluation, events) for every event a held sample carries, at the first evaluation that sees
    it; events before the store began are history, never counted."""
    h = held(series, store)
    for i, run in enumerate(series.runs):
        slots = sorted(s for s, r in h.run_of.items() if r == i and not (store.start_times and s == run.start
                                                                              and h.values[s] == 0))
        for offset, count in enumerate(run.events):
            at = run.start + offset
            k = bisect.bisect_right(slots, at)
            if count and k < len(slots) and at >= store.began:
                yield evaluation_of(slots[k]), count


def truth(series: Sequence[Series], store: Store, key: str) -> dict[int, dict[str, int]]:
    """Evaluation slot -> label value of ``key`` -> events first visible in that evaluation's record."""
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in series:
        for at, count in visible(s, store):
            out[at][s.labels[key]] += count
    return {at: dict(groups) for at, groups in out.items()}


def values(series: Series, store: Store, slots: int) -> str:
    """The promtool ``values`` string of the series over ``slots + 1`` slots."""
    h = held(series, store)
    return " ".join(str(h.values[s]) if s in h.values else "_" for s in range(slots + 1))


def selector(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# -- the shipped unit tests: named cases, rendered for both rule files ---------------------------------

MINUTE = 2
"""Slots per minute."""


def steady(start: int, end: int, every: int = 1, count: int = 1) -> Run:
    """A run with ``count`` events every ``every`` slots from ``start`` to ``end``."""
    return Run(start, tuple(count if (s - start) % every == 0 else 0 for s in range(start, end)))


@dataclass(frozen=True)
class Counting:
    """A promtool case of the counting records: ``series`` (of the turns histogram's count, grouped
    by threshold) in ``store``; each check is (minutes from, minutes to, expected per variant or
    None for the truth): the records from the one ending at ``from`` (exclusive) to ``to``."""

    name: str
    series: tuple[Series, ...]
    up: tuple[tuple[int, int], ...]
    slots: int
    checks: tuple[tuple[int, int, Mapping[bool, Mapping[str, int]] | None], ...]
    why: str = ""


def _groups(series: Sequence[Series], store: Store, key: str, after: int, upto: int) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for at, groups in truth(series, store, key).items():
        if after < at <= upto:
            for g, v in groups.items():
                out[g] += v
    return dict(out)


def run(start: int, end: int, *, first: int = 0, every: int = 0, count: int = 1, quiet: int = 1) -> Run:
    """A run from ``start`` to ``end``: ``first`` events at its start, then ``count`` every ``every``
    slots from ``quiet`` slots after it."""
    events = [0] * (end - start)
    events[0] = first
    for i in range(quiet, end - start, every or end):
        events[i] += count if every else 0
    return Run(start, tuple(events))


def live(end: int, every: int = MINUTE, count: int = 1, since: int = 0) -> Run:
    """A run alive before the store starts at ``since`` whose first sample there holds nothing yet,
    then ``count`` events every ``every`` slots until ``end``."""
    return run(since - 2, end, every=every, count=count, quiet=4)


def one(name: str, *runs: Run, phase: int = 1, silent: tuple[tuple[int, int], ...] = ()) -> Series:
    return Series({"turnguard_loop_threshold": name, "instance": name}, runs, phase, silent)


H = 60 * MINUTE
COUNTING = (
    Counting("a 10-minute gap: every event counted once, those of the gap in the record after it",
             (one("none", live(240)), one("hard_backstop", live(240, every=10 * MINUTE), phase=0)),
             ((0, 80), (100, 241)), 240, ((0, 120, None), (45, 60, None))),
    Counting("a 2-hour gap: the same, from where the last evaluation before it left each series",
             (one("none", live(360)), one("soft_stuck", live(360, every=7)),
              one("hard_backstop", run(160, 360, first=1), phase=0)),
             ((0, 60), (300, 361)), 360, ((0, 180, None), (145, 155, None))),
    Counting("a gap from 12.5 to 17.5 minutes, across a tile's edge",
             (one("none", live(80)), one("soft_stuck", live(80, every=3), phase=0)),
             ((0, 25), (35, 81)), 80, ((0, 40, None), (10, 20, None))),
    Counting("a counter reset to a lower value: the run after it from zero, the growth before it from the "
             "tile's peak",
             (one("none", live(61, count=3), run(62, 120, first=2, every=MINUTE)),), ((0, 121),), 120,
             ((0, 60, None), (25, 35, None))),
    Counting("a counter reset to an equal value: invisible without start times; the start's 0 shows it",
             (one("none", live(60), run(61, 120, first=30, every=MINUTE, quiet=9)),), ((0, 121),), 120,
             ((25, 35, {False: {"none": -29}, True: {"none": -1}}),
              (0, 60, {False: {"none": -29}, True: {"none": -1}})),
             why="the first run ends at 29 and the next reaches 30 by the record's end: without start times "
                 "the reset is invisible and the record counts 30 - 28, low by the value before it (29); "
                 "its 0 shows it, and only the first run's last event is lost (the peak is the run after)"),
    Counting("several resets in one tile: the first run's growth and the last run counted, the ones between lost",
             (one("none", live(61, count=3), run(62, 65, first=3), run(66, 120, first=2, every=MINUTE)),),
             ((0, 121),), 120, ((25, 35, {False: {"none": -3}, True: {"none": -3}}),
                                (0, 60, {False: {"none": -3}, True: {"none": -3}})),
             why="three runs within 30 to 33 minutes: the middle one's 3 events are lost"),
    Counting("a reset during a gap: seen when the value after it is below the one before",
             (one("soft_stuck", live(80, count=2), run(95, 160, first=1, every=MINUTE)),
              one("hard_backstop", live(80), run(95, 160, first=60, every=MINUTE))),
             ((0, 80), (110, 161)), 160, ((40, 80, {False: {"hard_backstop": -39}, True: {}}),),
             why="the samples stop from 40 to 55 minutes, both processes restart at 47.5: soft_stuck's comes "
                 "back below its value before and counts from zero; hard_backstop's comes back above it "
                 "(60 > 39): without start times the reset is invisible, low by the value before (39); "
                 "the records kept evaluating through the gap, so the start's 0 was in a tile (after a "
                 "Prometheus outage it would not be, and this errs the same way with start times)"),
    Counting("a store that starts with old counters: history is not counted again",
             (one("old", live(160, since=-720)), one("young", run(30, 160, first=1, every=MINUTE)),
              one("new", run(44, 160, first=3, every=MINUTE), phase=0),
              one("later", run(101, 160, first=2, every=MINUTE))),
             ((40, 161),), 160, ((0, 80, {False: {"old": -1, "new": -4}, True: {"old": -1, "young": 6}}),),
             why="the store begins at 20 minutes: old (alive for hours) and young (born at 15 minutes) count "
                 "from their first sample, losing the event just before it (old: 1); new, born at 22 minutes, "
                 "loses its first sample (4) without start times; with them its 0 counts it from zero, and "
                 "young's 0, within the first record's 15 minutes, counts its 6 events before the store too"),
    Counting("a series silent for 23 hours counts from where it was left; after 25 hours it counts again",
             (one("none", live(27 * H, every=H), silent=((H, 24 * H),)),
              one("hard_backstop", live(27 * H, every=H), silent=((H, 26 * H),), phase=0)),
             ((0, 27 * H + 1),), 27 * H, ((0, 27 * 60, {False: {"hard_backstop": 1}, True: {"hard_backstop": -25}}),),
             why="none, silent from 1 to 24 hours, counts its 23 hours of events once, when back; "
                 "hard_backstop, silent from 1 to 26 hours (past the 1-day lookback), counts its whole value "
                 "again without start times (high by the 1 counted before); with them it counts what it "
                 "gains once back, low by the 25 events of its silence"),
)


def check_truth(case: Counting, start_times: bool) -> list[dict[str, int]]:
    store = Store(case.up, start_times)
    return [_groups(case.series, store, "turnguard_loop_threshold", a * MINUTE, b * MINUTE)
            for a, b, _ in case.checks]


@dataclass(frozen=True)
class Input:
    """A promtool input series; ``born``: minutes without samples before its first (its start's 0 is
    in the last of them on the start-times route)."""

    series: str
    values: str
    born: int = 0

    def rendered(self, start_times: bool) -> str:
        if not self.born:
            return self.values
        if not start_times:
            return f"_x{self.born} {self.values}"
        return " ".join([*([f"_x{self.born - 1}"] if self.born > 1 else []), "0", self.values])


@dataclass(frozen=True)
class Alerting:
    """A promtool case of the alerts: inputs sampled every minute; (alert, minute, firing alerts)."""

    name: str
    inputs: tuple[Input, ...]
    tests: tuple[tuple[str, int, tuple[Mapping[str, Mapping[str, str]], ...]], ...]


TURNS = "turnguard_turn_tool_calls_count"
RESULTS = "turnguard_turn_results_total"
ANSWERS = "turnguard_escalation_answers_total"
FAILED = "otelcol_exporter_send_failed_metric_points_total"
NO_PROBE = ("No probe turn of this agent reached the backstop in 7 days: nothing says whether these were "
            "runaways.")


def _answers(threshold: str, stop: str, go_on: str, born: int = 0) -> tuple[Input, Input]:
    """The answers to one threshold's asks: ``stop``'s samples and ``continue``'s (from minute ``born``)."""
    answered = ANSWERS + f'{{turnguard_loop_threshold="{threshold}", turnguard_escalation_answer='
    return Input(answered + '"stop"}', stop), Input(answered + '"continue"}', go_on, born)


def expected_alert(severity: str, summary: str, description: str, **labels: str) -> Mapping[str, Mapping[str, str]]:
    """An alert ``promtool test rules`` expects to fire: its labels (``severity`` first) and annotations."""
    return {"exp_labels": {"severity": severity, **labels},
            "exp_annotations": {"summary": summary, "description": description}}


def backstop_alert(agent: str, count: int, probe: str = NO_PROBE) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "ticket", f"{count} turns of agent {agent} halted at the backstop in 15 minutes",
        "Each made the backstop's S x m tool calls and was halted there: halted at the backstop, not necessarily a "
        f"runaway. {probe} The threshold-validation board's \"Turns halted at the backstop\" row shows whether the "
        "stuck signal flagged them earlier.", gen_ai_agent_name=agent)


def halt_rate_alert(share: str) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "ticket", f"turnguard halts {share} of turns, three times the weekly share",
        "A model, prompt or tool change is making agents loop, or a threshold is too tight. The halts board's "
        "\"Halts by threshold\" and \"Top tools by halts\" show which.")


def fast_burn_alert(ratio: str) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "page", f"{ratio}x the false-halt budget: users answer \"continue\" to most asks",
        "turnguard interrupts productive turns. Look at \"False-positive rate by threshold\" on the halts board; "
        "raise that threshold or run `turnguard calibrate` on recent turns.")


def slow_burn_alert(ratio: str) -> Mapping[str, Mapping[str, str]]:
    return expected_alert("ticket", f"{ratio}x the false-halt budget over 6 hours",
                          "A threshold asks too often on turns users judge fine; calibrate it.")


def export_alert(count: int) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "page", f"Collector collector:8888: exporter prometheus_remote_write failed to send {count} metric points in "
        "15 minutes",
        "The backend behind prometheus_remote_write is down or refusing data. Until it is fixed the turnguard boards "
        "undercount; the halts board's Collector row shows since when.",
        job="otelcol", instance="collector:8888", exporter="prometheus_remote_write", signal="metric points")


def probe_alert(count: int) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "ticket", f"{count} probe turns the backstop would have halted resolved their task in the last day",
        "The live backstop would have halted these productive turns. Check the threshold-validation board and "
        "`turnguard calibrate` probe evidence before raising hard_multiplier.")


COLLECTOR = 'job="otelcol", instance="collector:8888"'


def _export_failing(name: str, *, failed: str, up: str, uptime: str | None = None,
                    pages: Mapping[int, int]) -> Alerting:
    """A case of ``TurnguardCollectorExportFailing`` from the Collector's failed sends, ``up`` and
    uptime samples; ``pages``: per minute, the count the alert pages with (0: it does not fire)."""
    samples = {FAILED + "{" + COLLECTOR + ', exporter="prometheus_remote_write"}': failed, "up{" + COLLECTOR + "}": up,
               "otelcol_process_uptime_seconds_total{" + COLLECTOR + "}": uptime}
    firing = tuple(("TurnguardCollectorExportFailing", minute, (export_alert(count),) if count else ())
                   for minute, count in pages.items())
    return Alerting(name, tuple(Input(series, values) for series, values in samples.items() if values), firing)


CODER_DONE = TURNS + '{gen_ai_agent_name="coder", turnguard_turn_cohort="live", turnguard_turn_outcome="completed", ' \
                     'turnguard_loop_threshold="none"}'
CODER_BACKSTOP = TURNS + '{gen_ai_agent_name="coder", turnguard_turn_cohort="live", turnguard_turn_outcome="halted", ' \
                         'turnguard_loop_threshold="hard_backstop"}'
PROBE = 'gen_ai_agent_name="coder", turnguard_turn_cohort="probe", turnguard_probe_main_threshold="hard_backstop"'
ALERTING = (
    Alerting("the first backstop halt of an agent is a new series, alerted on once; a 10-minute gap after it "
             "does not alert again",
             (Input(CODER_DONE, "0+10x39 _x10 500+10x10"), Input(CODER_BACKSTOP, "1x17 _x10 1x10", born=22),
              Input(TURNS + '{gen_ai_agent_name="support", turnguard_turn_outcome="halted", '
                            'turnguard_loop_threshold="soft_stuck"}', "2+1x48", born=12)),
             (("TurnguardBackstopHalts", 20, ()), ("TurnguardBackstopHalts", 30, (backstop_alert("coder", 1),)),
              ("TurnguardBackstopHalts", 45, ()), ("TurnguardBackstopHalts", 55, ()),
              ("TurnguardBackstopHalts", 60, ()))),
    Alerting("backstop halts beside the probe's evidence at the backstop: the share of the probe turns it would "
             "have halted that resolved their task, at the turn's end or by a late result",
             (Input(CODER_BACKSTOP, "2x30", born=8),
              Input(TURNS + "{" + PROBE + ', turnguard_turn_resolved="true"}', "0 1x37"),
              Input(TURNS + "{" + PROBE + ', turnguard_turn_resolved="unknown"}', "0 3x37"),
              Input(RESULTS + "{" + PROBE + ', turnguard_turn_resolved="true", turnguard_result_status="accepted"}',
                    "1x30", born=8),
              Input(RESULTS + "{" + PROBE + ', turnguard_turn_resolved="true", turnguard_result_status="duplicate"}',
                    "1x30", born=8)),
             (("TurnguardBackstopHalts", 15, (backstop_alert(
                 "coder", 2, "Of this agent's probe turns the backstop would have halted (7 days), 50% resolved "
                             "their task."),)),)),
    Alerting("a halt-rate spike against the share of the records' history fires after 15 minutes, steady halts "
             "do not; a halted turn counts by its threshold however the host ended it (its own exception, "
             "cancelled, a reason of its own), a turn no threshold halted does not, whatever its outcome",
             (Input(TURNS + '{turnguard_turn_outcome="completed", turnguard_loop_threshold="none"}', "0+5x720"),
              Input(TURNS + '{turnguard_turn_outcome="cancelled", turnguard_loop_threshold="none"}', "0+4x720"),
              Input(TURNS + '{turnguard_turn_outcome="budget", turnguard_loop_threshold="none"}', "0+1x720"),
              *(Input(TURNS + f'{{turnguard_turn_outcome="{outcome}", turnguard_loop_threshold="{threshold}"}}',
                      "0+0.025x600 15+1.25x120")
                for outcome, threshold in (("halted", "soft_stuck"), ("error", "hard_backstop"),
                                           ("cancelled", "streak"), ("budget", "hard_backstop")))),
             (("TurnguardHaltRateSpike", 595, ()), ("TurnguardHaltRateSpike", 610, ()),
              ("TurnguardHaltRateSpike", 690, (halt_rate_alert("33.33%"),)))),
    Alerting("users answering continue to most asks burn the false-halt budget fast; a few do not",
             _answers("soft_streak", "0+1x140", "1+0x54 1+3x80", born=5),
             (("TurnguardFalseHaltBudgetBurnFast", 60, ()), ("TurnguardFalseHaltBudgetBurnSlow", 60, ()),
              ("TurnguardFalseHaltBudgetBurnFast", 130, (fast_burn_alert("7.5"),)))),
    Alerting("a steady share of \"continue\" answers above the objective burns the budget slowly, not fast",
             _answers("soft_stuck", "0+1x400", "0+0.4x400"),
             (("TurnguardFalseHaltBudgetBurnFast", 380, ()),
              ("TurnguardFalseHaltBudgetBurnSlow", 380, (slow_burn_alert("2.857"),)))),
    Alerting("probe turns the backstop would have halted that resolved their task, at the end or by a late "
             "result, open a ticket; resolved probe turns no threshold would have halted do not",
             (Input(TURNS + "{" + PROBE + ', turnguard_turn_resolved="true"}', "1x30", born=10),
              Input(RESULTS + "{" + PROBE + ', turnguard_turn_resolved="true", turnguard_result_status="accepted"}',
                    "1x20", born=20),
              Input(TURNS + '{gen_ai_agent_name="coder", turnguard_turn_cohort="probe", '
                            'turnguard_probe_main_threshold="none", turnguard_turn_resolved="true"}', "0+1x40"),
              Input(TURNS + "{" + PROBE + ', turnguard_turn_resolved="false"}', "0+1x40")),
             (("TurnguardProbeResolvedPastBackstop", 10, ()),
              ("TurnguardProbeResolvedPastBackstop", 15, (probe_alert(1),)),
              ("TurnguardProbeResolvedPastBackstop", 35, (probe_alert(2),)))),
    _export_failing("a Collector exporter that starts failing pages, from its first failure, while it is scraped",
                    failed="_x17 40x40", up="1x60", pages={15: 0, 20: 40, 40: 0}),
    _export_failing("failures that go on growing page with what they grew in 15 minutes, and stop paging after",
                    failed="_x5 10+10x19 200x30", up="1x55", pages={15: 110, 30: 90, 40: 0}),
    _export_failing("old failures do not page: not in a store that begins with them, not after a 10-minute gap",
                    failed="40x20 _x10 40x20", up="1x20 _x10 1x20", uptime="36000+60x20 _x10 37860+60x20",
                    pages=dict.fromkeys((5, 10, 15, 20, 35, 40, 45, 50), 0)),
    _export_failing("after a 40-minute outage of the Prometheus that evaluates it, what failed meanwhile pages once "
                    "it is back, once",
                    failed="5x20 _x40 905x30", up="1x20 _x40 1x30", uptime="36000+60x20 _x40 38460+60x30",
                    pages={15: 0, 55: 0, 65: 900, 75: 900, 80: 0}),
    _export_failing("a Collector's first failures, in a 40-minute outage of the Prometheus that evaluates it, page "
                    "once it is back",
                    failed="_x20 _x40 900x30", up="1x20 _x40 1x30", uptime="36000+60x20 _x40 38460+60x30",
                    pages={65: 900, 80: 0}),
    _export_failing("a Collector restarted in a 40-minute outage pages all it failed since, even below the value "
                    "before",
                    failed="500x20 _x40 300x30", up="1x20 _x40 1x30", uptime="36000+60x20 _x40 1200+60x30",
                    pages={65: 300, 80: 0}),
    _export_failing("a restarted (or new) Collector's failures page, all of them within the window, even when they "
                    "come back to the value before",
                    failed="40x20 40x20", up="1x40", uptime="0+60x20 0+60x20", pages={15: 0, 25: 40, 40: 0}),
)


def results_stopped_alert(agent: str, turns: int) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "ticket", f"No task result for agent {agent} in an hour ({turns} turns ended)",
        "This agent reported results earlier today and none since: its reporter (turn.report_result, "
        "guard.report_result, a CI job with the result token) stopped or its results reach no guard. Without results "
        "the probe evidence and calibrate cannot tell productive turns from failed ones. The halts board's \"Task "
        "results\" row shows which status they get.", gen_ai_agent_name=agent)


def invalid_tokens_alert(count: int) -> Mapping[str, Mapping[str, str]]:
    return expected_alert(
        "ticket", f"{count} result tokens refused in an hour",
        "Tokens that do not read as this guard's: a digest_key that differs between the process that ran the turn and "
        "the one that reports (refused as forged), tokens cut short or rewritten on the way, or forged ones. Their "
        "results are lost. The halts board's \"Task results\" row shows them beside the accepted ones.")


def _turns_of(agent: str, resolved: str) -> str:
    return TURNS + f'{{gen_ai_agent_name="{agent}", turnguard_turn_resolved="{resolved}"}}'


def _results(status: str, agent: str = "ci") -> str:
    return RESULTS + f'{{gen_ai_agent_name="{agent}", turnguard_result_status="{status}"}}'


RESULT_ALERTING = (
    Alerting("an agent whose results stop (with the turn and late) while its turns go on opens a ticket; an "
             "agent that never reported one, and one that ends few turns, do not",
             (Input(_turns_of("ci", "unknown"), "0+1x240"), Input(_turns_of("ci", "true"), "0+1x60 60x180"),
              Input(_results("accepted"), "0+1x90 90x150"),
              Input(_turns_of("chat", "unknown"), "0+2x240"),
              Input(_turns_of("nightly", "unknown"), "0+0.1x240"), Input(_turns_of("nightly", "false"), "0x240")),
             (("TurnguardResultsStopped", 100, ()), ("TurnguardResultsStopped", 120, ()),
              ("TurnguardResultsStopped", 200, (results_stopped_alert("ci", 60),)))),
    Alerting("refused result tokens rising past a tenth of the late reports open a ticket; a few among many "
             "accepted do not",
             (Input(_results("accepted"), "0+5x200"), Input(_results("invalid_token"), "0+0.2x60 12+2x140")),
             (("TurnguardInvalidResultTokens", 55, ()),
              ("TurnguardInvalidResultTokens", 180, (invalid_tokens_alert(120),)))),
)
"""The task-results alerts' cases (``rules.result_alerts``)."""

# -- rendering ---------------------------------------------------------------------------------------


def _q(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else json.dumps(value)


def _counting_test(case: Counting, start_times: bool, record: str, duration: Callable[[float], str]) -> list[str]:
    store = Store(case.up, start_times)
    lines = [f"  - name: {_q(case.name)}", "    interval: 30s", "    input_series:"]
    for s in case.series:
        lines += [f"      - series: {_q(TURNS + selector(s.labels))}",
                  f"        values: {_q(values(s, store, case.slots))}"]
    lines.append("    promql_expr_test:")
    for (a, b, deltas), groups in zip(case.checks, check_truth(case, start_times), strict=True):
        delta = (deltas or {}).get(start_times, {})
        got = {g: groups.get(g, 0) + delta.get(g, 0) for g in sorted({*groups, *delta})}
        window = duration((b - a) * 60 - 1)
        lines += [f"      - expr: sum by (turnguard_loop_threshold) (sum_over_time({record}[{window}]))",
                  f"        eval_time: {b}m", "        exp_samples:"]
        lines += [f"          - labels: '{{turnguard_loop_threshold=\"{g}\"}}'\n            value: {v}"
                  for g, v in got.items() if v]
    return lines


def _alerting_test(case: Alerting, start_times: bool) -> list[str]:
    lines = [f"  - name: {_q(case.name)}", "    interval: 1m", "    input_series:"]
    for i in case.inputs:
        lines += [f"      - series: {_q(i.series)}", f"        values: {_q(i.rendered(start_times))}"]
    lines.append("    alert_rule_test:")
    for name, minute, firing in case.tests:
        lines += [f"      - alertname: {name}", f"        eval_time: {minute}m"]
        if firing:
            lines.append("        exp_alerts:")
        for alert in firing:
            lines.append("          - exp_labels:")
            lines += [f"              {k}: {_q(v)}" for k, v in alert["exp_labels"].items()]
            lines.append("            exp_annotations:")
            lines += [f"              {k}: {_q(v)}" for k, v in alert["exp_annotations"].items()]
    return lines


def unit_tests(rules_file: str, start_times: bool, record: str, duration: Callable[[float], str],
               why_header: str) -> str:
    """The ``promtool test rules`` file for one rules file."""
    lines = [f"# {line}".rstrip() for line in why_header.split("\n")]
    lines += [f"rule_files:\n  - {rules_file}", "evaluation_interval: 5m", "", "tests:"]
    for case in COUNTING:
        if case.why:
            lines += [f"  # {line}" for line in _wrap(case.why)]
        lines += _counting_test(case, start_times, record, duration)
    for alerting in (*ALERTING, *RESULT_ALERTING):
        lines += _alerting_test(alerting, start_times)
    return "\n".join(lines) + "\n"


def _wrap(text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, 96)
