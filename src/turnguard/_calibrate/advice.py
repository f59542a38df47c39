"""What a probe row decides against the operator's tolerance (``--tolerance``), what it would take
to decide (the turns needed invert the Wilson score test), and the evidence in words, as terminal
text and as HTML (docs/calibration.md, "Probe evidence")."""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from turnguard._calibrate.bounds import COHORT_KEYS
from turnguard._calibrate.evidence import (
    FEW,
    Z95,
    Frontier,
    Passed,
    ProbeEvidence,
    Scale,
    frontier,
    not_probed,
    value_step,
    value_text,
)
from turnguard._calibrate.recording import Recording
from turnguard._calibrate.records import TOOL_LIST_KEYS, Limits
from turnguard._probe import sees_past
from turnguard._terminal import DEFAULT_WIDTH, fit_table

DEFAULT_TOLERANCE = 0.10
MAX_MORE = 10**9
"""Past this many more turns the share is, for any fleet, the tolerance itself (``at_tolerance``)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A row's interval against the tolerance."""

    tolerance: float
    low: float
    high: float
    verdict: str
    why: str
    more_turns: int | None = None
    more_days: float | None = None
    censored_at_cap: tuple[str, int] | None = None
    """``(threshold, cap)``: the row is at or above the probe's own cap, which no probe turn passes."""

    def to_json(self) -> dict[str, Any]:
        days = None if self.more_days is None else round(self.more_days, 3)
        return {"tolerance": self.tolerance, "decision": self.verdict, "why": self.why,
                "more_turns": self.more_turns, "more_days": days,
                "censored_at_cap": None if self.censored_at_cap is None else
                {"threshold": self.censored_at_cap[0], "cap": self.censored_at_cap[1]}}


def turns_to_decide(p: float, q: float, z: float = Z95) -> int | None:
    """The fewest turns at share ``p`` whose Wilson interval excludes ``q`` (``None``: ``p == q``,
    or more than ``MAX_MORE``)."""
    if p == q:
        return None
    needed = math.floor(z * z * q * (1 - q) / ((p - q) ** 2)) + 1
    return needed if needed <= MAX_MORE else None


def decide(passed: Passed, tolerance: float, days: float | None = None,
           censored_at_cap: tuple[str, int] | None = None) -> Decision:
    """``passed``'s decision against ``tolerance``; ``days``: how long the recording spans (for
    ``more_days``: the turns past the threshold arrive at ``passed.known / days`` a day). A row at the
    probe's own cap is never ``within``: no probe turn is seen past it, whatever its counts say."""
    n = passed.known
    low, high = passed.interval()
    if n == 0:
        return Decision(tolerance, low, high, "no_evidence", "no_evidence", censored_at_cap=censored_at_cap)
    if low > tolerance:
        return Decision(tolerance, low, high, "above", "decided", censored_at_cap=censored_at_cap)
    if censored_at_cap is not None:
        return Decision(tolerance, low, high, "undecided", "censored", censored_at_cap=censored_at_cap)
    if high < tolerance:
        return Decision(tolerance, low, high, "within", "decided", censored_at_cap=censored_at_cap)
    p_low, p_high = passed.resolved / n, (passed.resolved + passed.censored) / n
    share = p_low if p_low > tolerance else p_high if p_high < tolerance else None
    if share is None:
        why = "censored" if p_low < p_high else "at_tolerance"
        return Decision(tolerance, low, high, "undecided", why, censored_at_cap=censored_at_cap)
    needed = turns_to_decide(share, tolerance)
    if needed is None:
        return Decision(tolerance, low, high, "undecided", "at_tolerance", censored_at_cap=censored_at_cap)
    more = max(1, needed - n)
    more_days = more / (n / days) if days else None
    return Decision(tolerance, low, high, "undecided", "needs_turns", more, more_days, censored_at_cap)


def valid_tolerance(value: float) -> float:
    """A tolerance strictly between 0 and 1 (``ValueError`` otherwise)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1:
        raise ValueError(f"the tolerance is a share strictly between 0 and 1, got {value!r:.40}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Context:
    """What the rows are read against: the tolerance, the recording, the configured probe rate."""

    tolerance: float
    recording: Recording
    probe_rate: float | None = None
    """The probe's configured rate (``--config``), ``None`` when not configured."""
    main_cycles: int | None = None
    """The default policy's cycle cap (0: unbounded; ``None``: not known)."""


def probe_hard_cap(recording: Recording) -> int | None:
    """The highest hard cap the probe's turns ran under (``None``: none recorded, or one ran
    without a cap)."""
    limits = recording.limits_of("probe")
    caps = [lim.hard_cap for lim, _ in limits]
    return None if not caps or None in caps else max(c for c in caps if c is not None)


def probe_highest(recording: Recording, limit: str) -> int | None:
    """The highest ``limit`` (a ``Limits`` field) the probe's turns ran under (``None``: not
    recorded, or one ran with it off)."""
    values = [getattr(lim, limit) for lim, _ in recording.limits_of("probe")]
    return None if not values or any(not v for v in values) else max(v for v in values if v)


def row_cap(e: ProbeEvidence, key: str, recording: Recording) -> tuple[str, int] | None:
    """The probe's own cap when a row is at or above it (``(threshold, cap)``), else ``None``. The
    probe's stuck signal is not read from its recorded limits: a D not above the main one marks the
    stuck row even where the probe's signal spares some turns (it then asks to raise a D it need not)."""
    if e.soft_cap is None:
        return None
    if key in ("streak", "stuck"):
        main = e.streak_stop if key == "streak" else e.stuck_repeat
        own = probe_highest(recording, "streak_stop_at" if key == "streak" else "stuck_repeat_threshold")
        name = "streak" if key == "streak" else "soft_stuck"
        return (name, own) if own is not None and not sees_past(main, own) else None
    cap = probe_hard_cap(recording)
    return ("hard_backstop", cap) if cap is not None and not sees_past(int(key) * e.soft_cap, cap) else None


def frontiers(e: ProbeEvidence, ctx: Context, turns: int = 0, calls: int = 0) -> list[Frontier]:
    """The recommended value of each threshold of the main configuration (``evidence.frontier``), or why
    it is not probed."""
    if not e.turns or (e.soft_cap is None and e.explicit_cap is None):
        return []
    scale = Scale(e.turns, turns, calls)
    if e.soft_cap is None:
        return [_explicit_frontier(e, ctx, scale), *_streak_frontier(e, ctx, scale), _cycles_frontier(e, ctx, scale)]
    out = []
    m = e.multiplier
    if m is not None and float(m).is_integer():
        cap = probe_hard_cap(ctx.recording)
        out.append(frontier("backstop", e.ladders["backstop"], int(m), ctx.tolerance, scale,
                            None if cap is None else -(-cap // e.soft_cap)))
    if e.stuck_repeat is not None and e.ladders["stuck"].top():
        own = probe_highest(ctx.recording, "stuck_repeat_threshold")
        out.append(frontier("stuck", e.ladders["stuck"], e.stuck_repeat, ctx.tolerance, scale,
                            None if own is None else own + 1))
    out += _streak_frontier(e, ctx, scale)
    out.append(_soft_frontier(e, ctx, scale))
    out.append(_cycles_frontier(e, ctx, scale))
    out.append(not_probed("explicit", None, "the live cap is adaptive, S x m: max_tool_calls_per_turn is not in "
                          "force, and the soft cap and the backstop multiple stand for it"))
    return out


def _soft_frontier(e: ProbeEvidence, ctx: Context, scale: Scale) -> Frontier:
    """The soft cap S, the multiple and D held: probed where every probe turn ran under a higher
    soft cap (or none); judged up to the lowest probe soft cap and its backstop."""
    assert e.soft_cap is not None
    s, m = e.soft_cap, e.multiplier
    limits = [lim for lim, _ in ctx.recording.limits_of("probe")]
    if not limits or ctx.recording.unlimited_turns("probe"):
        return not_probed("soft", s, "the probe's turns do not all record the limits they ran under")
    lowest = min((lim.soft_cap for lim in limits if lim.cap_mode == "adaptive" and lim.soft_cap), default=None)
    if lowest is not None and lowest <= s:
        return not_probed("soft", s, f"the probe's soft cap, {lowest:,}, is not above the live {s:,}, so no probe "
                                     "turn is seen past it")
    if m is None or any(lim.cap_mode == "explicit" for lim in limits):
        return not_probed("soft", s, "the probe's turns ran under an explicit cap, not a soft one")
    caps = [-(-lim.hard_cap // m) for lim in limits if lim.hard_cap is not None]
    horizon = min([*caps, *([lowest] if lowest is not None else [])], default=None)
    return frontier("soft", e.ladders["soft"], s, ctx.tolerance, scale, None if horizon is None else int(horizon),
                    value_step(s))


def _streak_frontier(e: ProbeEvidence, ctx: Context, scale: Scale) -> list[Frontier]:
    """The streak stop (when on), judged up to the probe's own."""
    if not e.streak_stop:
        return []
    stop = probe_highest(ctx.recording, "streak_stop_at")
    return [frontier("streak", e.ladders["streak"], e.streak_stop, ctx.tolerance, scale,
                     None if stop is None else stop + 1)]


def _explicit_frontier(e: ProbeEvidence, ctx: Context, scale: Scale) -> Frontier:
    """The explicit cap N: probed where every probe turn ran under a higher cap or none; judged up
    to the lowest probe cap."""
    n = e.explicit_cap
    assert n is not None
    limits = [lim for lim, _ in ctx.recording.limits_of("probe")]
    if not limits or ctx.recording.unlimited_turns("probe"):
        return not_probed("explicit", n, "the probe's turns do not all record the limits they ran under")
    lowest = min((lim.hard_cap for lim in limits if lim.hard_cap is not None), default=None)
    if lowest is not None and lowest <= n:
        return not_probed("explicit", n, f"the probe's cap, {lowest:,} calls, is not above the live {n:,}")
    return frontier("explicit", e.ladders["explicit"], n, ctx.tolerance, scale, lowest, value_step(n))


def _cycles_frontier(e: ProbeEvidence, ctx: Context, scale: Scale) -> Frontier:
    """The cycle cap on model requests: probed where the live one is bounded and every probe turn
    ran under a higher one (or none); judged up to the lowest probe cap."""
    cap = ctx.main_cycles
    if cap is None:
        return not_probed("cycles", None, "the default policy's cycle cap is not known")
    if cap == 0:
        return not_probed("cycles", 0, "the live cycle cap is unbounded (0): the probe cannot run past it")
    probe = [lim.max_cycles for lim, _ in ctx.recording.limits_of("probe")]
    if not probe or None in probe or ctx.recording.unlimited_turns("probe"):
        return not_probed("cycles", cap, "the probe's turns do not all record their cycle cap")
    lowest = min((c for c in probe if c), default=None)
    if lowest is not None and lowest <= cap:
        return not_probed("cycles", cap, f"the probe's cycle cap, {lowest:,}, is not above the live {cap:,}")
    return frontier("cycles", e.ladders["cycles"], cap, ctx.tolerance, scale, lowest)


def assess(e: ProbeEvidence, ctx: Context) -> dict[str, Decision]:
    """Each row's decision (keys of ``ProbeEvidence.rows``)."""
    days = ctx.recording.days
    return {key: decide(p, ctx.tolerance, days, row_cap(e, key, ctx.recording)) for key, p in e.rows()}


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _turns(n: int, what: str = "probe turn") -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _fates(p: Passed) -> str:
    parts = [f"{p.resolved:,} resolved", f"{p.unresolved:,} unresolved"]
    if p.censored:
        parts.append(f"{p.censored:,} censored (halted later at a limit of the probe's own, or by a loop detector of "
                     "its own not well past the main one)")
    if p.unknown:
        parts.append(f"{p.unknown:,} without a result")
    return ", ".join(parts)


def _interval(p: Passed, d: Decision) -> str:
    few = f"; only {p.known:,} with a known fate, so it is wide" if p.known < FEW else ""
    return f"95% interval of the share that would have succeeded {_pct(d.low)}-{_pct(d.high)}{few}"


def _when(d: Decision, what: str) -> str:
    """How much more evidence an undecided row needs, in words."""
    if d.why == "censored":
        return (f"not decided against the tolerance of {_pct(d.tolerance)}: the censored turns could go either "
                f"way, and more turns at the same shares will not decide it: raise the probe's own limit to see "
                f"past {what}")
    if d.why == "at_tolerance":
        return (f"the share is the tolerance of {_pct(d.tolerance)} itself: the data are consistent with it, and "
                "more turns will not decide it soon")
    more = f"about {_turns(d.more_turns or 0, 'more probe turn')} past {what} with a known fate decide it"
    if d.more_days is None:
        return (f"not decided against the tolerance of {_pct(d.tolerance)}: {more} (how long that takes cannot be "
                "told: the recording has no turn times)")
    return (f"not decided against the tolerance of {_pct(d.tolerance)}: {more}, about {d.more_days:,.1f} days at "
            "the observed traffic")


def backstop_advice(e: ProbeEvidence, decisions: dict[str, Decision], recommended: int | None = None) -> str:
    """The backstop ``m x S`` in words; ``recommended``: the frontier's multiple, if any (then no
    "raise the probe's cap": the probe has seen enough below it)."""
    assert e.soft_cap is not None and e.multiplier is not None
    m, s = e.multiplier, e.soft_cap
    what = f"{m:g}x"
    head = f"On {_turns(e.turns)}"
    key = str(int(m)) if float(m).is_integer() else None
    if key is None or key not in decisions:
        return f"{head}: the backstop {what} is not a whole multiple; read the rows beside it."
    p, d = e.multiples[int(m)], decisions[key]
    if d.censored_at_cap is not None:
        return (f"{head}: the probe's own cap ({d.censored_at_cap[1]:,} calls) is not past the backstop {what} "
                f"(S={s:,}, {int(m * s):,} calls): no probe turn can be seen past it; raise the probe's cap to see "
                f"past {what}.")
    if p.turns == 0:
        return (f"{head}, none passed {what} (S={s:,}, {int(m * s):,} calls): no evidence about the backstop yet; "
                "let the probe run until turns reach it.")
    if d.verdict == "no_evidence":
        return (f"{head}, {p.turns:,} passed {what} but none has a result: report results "
                "(turn.report_result / guard.report_result) to judge the backstop.")
    said = f"{head}, {p.turns:,} passed {what} ({_fates(p)}; {_interval(p, d)})"
    if d.verdict == "within":
        return (f"{said}: within the tolerance of {_pct(d.tolerance)}: keep {what}; letting them run on cost "
                f"{p.calls_past:,} calls past it.")
    if d.verdict == "undecided":
        return f"{said}: {_when(d, what)}."
    if recommended is not None and recommended > m:
        return (f"{said}: above the tolerance of {_pct(d.tolerance)}, the backstop halts turns that would have "
                f"succeeded; past {recommended}x the probe saw few enough succeed: set hard_multiplier = "
                f"{recommended} (below).")
    return f"{said}: above the tolerance of {_pct(d.tolerance)}, the backstop halts turns that would have " \
           f"succeeded; {_raise_to(e, decisions, m)}"


def _raise_to(e: ProbeEvidence, decisions: dict[str, Decision], m: float) -> str:
    """Where to raise the backstop: the first higher multiple whose row is within the tolerance,
    never one at or past the probe's own cap."""
    higher = [k for k in e.multiples if k > m]
    for k in higher:
        d = decisions[str(k)]
        if d.censored_at_cap is not None:
            cap = f"{d.censored_at_cap[1] / e.soft_cap:g}x" if e.soft_cap else f"{d.censored_at_cap[1]:,} calls"
            return (f"up to the probe's own cap ({d.censored_at_cap[1]:,} calls, {cap}) no multiple it sees is within "
                    f"the tolerance, and past it the evidence cannot say where they stop: raise the probe's cap to see "
                    f"past {cap}.")
        if d.verdict == "within":
            cost = e.multiples[int(m)].calls_past - e.multiples[k].calls_past
            return (f"at {k}x the share past it is within the tolerance ({_pct(d.low)}-{_pct(d.high)}): raising it "
                    f"to {k}x costs about {cost:,} more calls on these turns.")
    top = higher[-1] if higher else int(m)
    return f"the evidence does not yet say where they stop (up to {top}x): raise it and let the probe run."


@dataclass(frozen=True, slots=True)
class LoopWords:
    """A loop detector's probe row in words: templates filled with ``main`` (the main
    configuration's setting), ``cap`` (the probe's own, in ``not_past``), ``soft_cap`` (S) and
    ``calls_past`` (the calls the row's turns made past the would-be halts)."""

    not_past: str
    """The probe's own setting is not past the main one: no probe turn can be seen past it."""
    halted: str
    setting: str
    none: str
    """No probe turn would have been halted."""
    within: str
    above: str


STUCK_WORDS = LoopWords(
    not_past="The probe's own D ({cap}) is not past the main one ({main}): no probe turn halted as stuck can be "
             "seen past it; raise the probe's stuck_repeat_threshold to see past D={main}.",
    halted="halted as stuck (D={main})", setting="D={main}",
    none="No probe turn would have been halted as stuck (D={main}, past S={soft_cap:,}): no evidence about D yet.",
    within="keep D={main}; going on cost {calls_past:,} calls past the would-be halts",
    above="D={main} halts turns that would have succeeded; raise D or try stuck_signal='stale_repeat' (it spares "
          "edit-and-rerun)")
STREAK_WORDS = LoopWords(
    not_past="The probe's own streak stop ({cap}) is not past the main one ({main}): no probe turn can be seen "
             "past it; raise the probe's streak_stop_at to see past {main}.",
    halted="halted by the streak stop ({main})", setting="the streak stop {main}",
    none="No probe turn would have been halted by the streak stop ({main} identical failures): no evidence about it "
         "yet.",
    within="keep streak_stop_at={main}",
    above="the streak stop halts retries that would have succeeded; raise streak_stop_at")


def loop_advice(words: LoopWords, p: Passed, d: Decision, main: int | None, soft_cap: int | None) -> str:
    """A loop detector's probe row ``p`` in words: the turns it would have halted, their fates and
    the advice for its ``main`` setting, by the decision ``d``."""
    if d.censored_at_cap is not None:
        return words.not_past.format(cap=d.censored_at_cap[1], main=main)
    fill = {"main": main, "soft_cap": soft_cap, "calls_past": p.calls_past}
    halted = words.halted.format(**fill)
    if p.turns == 0:
        return words.none.format(**fill)
    if d.verdict == "no_evidence":
        return f"{_turns(p.turns)} would have been {halted}, none has a result yet."
    said = f"{_turns(p.turns)} would have been {halted}: {_fates(p)} ({_interval(p, d)})"
    if d.verdict == "within":
        return f"{said}: within the tolerance of {_pct(d.tolerance)}: {words.within.format(**fill)}."
    if d.verdict == "undecided":
        return f"{said}: {_when(d, words.setting.format(**fill))}."
    return (f"{said}: above the tolerance of {_pct(d.tolerance)}: {words.above.format(**fill)}, at "
            f"{p.calls_past:,} calls past the would-be halts.")


def cost_advice(e: ProbeEvidence, ctx: Context, turns: int, calls: int) -> str | None:
    """What the probe costs beside the main configuration, scaled to the whole fleet at the
    configured rate (``None`` without probe turns)."""
    if not e.turns:
        return None
    per_turn = e.calls_past_main / e.turns
    observed = e.turns / (e.turns + e.live_turns) if e.live_turns else None
    rate = ctx.probe_rate if ctx.probe_rate is not None else observed
    said = (f"The probe cost {e.calls_past_main:,} calls past where the main configuration would have halted "
            f"{e.past_main:,} of its {_turns(e.turns)} ({per_turn:,.1f} per probe turn)")
    untold = (f" At least: for {_turns(e.main_untold)} the recording lists too few calls to tell whether the main "
              "configuration would have halted them (recorded in part or cut short)." if e.main_untold else "")
    if rate is None or not turns or not calls:
        return said + "." + untold
    which = (f"the configured rate of {rate:.1%}" + (f" (observed {observed:.1%})" if observed is not None else "")
             if ctx.probe_rate is not None else f"the observed rate of {rate:.1%} (no probe in --config)")
    share = rate * per_turn / (calls / turns)
    said += f"; at {which} that is {share:.2%} of the fleet's calls"
    days = ctx.recording.days
    if days:
        per_day = rate * per_turn * turns / days
        said += f", about {per_day:,.0f} calls a day at the observed {turns / days:,.0f} turns a day"
    return said + "." + untold


def limits_notes(e: ProbeEvidence, recording: Recording, default_limits: dict[str, object] | None) -> list[str]:
    """What the recording cannot tell about the limits, and a default row that is not the live policy."""
    notes = []
    if e.turns and not recording.limits_of("probe"):
        notes.append("The probe's limits are not in the recording (recorded before turnguard wrote them): no row can "
                     "be checked against the probe's own cap; turns the probe halted count as censored.")
    live = recording.limits_of("live")
    if live and default_limits is not None:
        differ = limits_differing(live[0][0], default_limits)
        if differ:
            shown = ", ".join(f"{k}={_limit_text(v)} (--config: {_limit_text(default_limits[k])})"
                              for k, v in differ.items())
            notes.append(f"The default row is not the live policy most live turns ran under ({shown}): give --config "
                         "the live configuration so that the probe rows are read against it.")
    return notes


SWITCHED_BY: dict[str, tuple[str, ...]] = {
    "cycle_repeat_max_period": ("cycle_repeat_warn_at", "cycle_repeat_stop_at"),
    "streak_stop_on": ("streak_stop_at",),
}
"""Settings that change a replay only while one of their levels is set (``cycle_repeat`` looks
for cycles only when on; the streak's stop count matters only where the stop can fire)."""


def in_force(setting: str, read: Callable[[str], object]) -> bool:
    """Whether ``setting`` can change a replay under the settings ``read`` gives (by name)."""
    switches = SWITCHED_BY.get(setting)
    return switches is None or any(map(read, switches))


def limits_differing(limits: Limits, default_limits: dict[str, object]) -> dict[str, object]:
    """The recorded ``limits`` that are not the default row's, by key: only where both say one (a
    limit an older recording or result does not have is not compared) and where either side has
    it in force."""
    recorded = limits.to_json()
    return {k: recorded[k] for k, mine in default_limits.items()
            if k in recorded and not _unsaid_or_equal(recorded[k], mine)
            and (in_force(k, recorded.get) or in_force(k, default_limits.get))}


def _unsaid_or_equal(theirs: object, mine: object) -> bool:
    """Equal, or one side does not say (a cap's ``None`` differs in ``cap_mode`` too)."""
    return theirs is None or mine is None or theirs == mine


def _limit_text(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value)


def tool_list_warning(recording: Recording, params: dict[str, Any] | None) -> str | None:
    """In words, when the recording's tool lists are not the default policy's: the replay would
    count the recorded calls as the fleet did not. ``None``: they agree, or none is recorded."""
    if params is None:
        return None
    differ = []
    for key in TOOL_LIST_KEYS:
        mine = frozenset(params.get(key) or ())
        turns: dict[frozenset[str], int] = {}
        for cohort in COHORT_KEYS:
            for limits, n in recording.limits_of(cohort):
                tools = getattr(limits, key)
                if tools is not None and frozenset(tools) != mine:
                    turns[frozenset(tools)] = turns.get(frozenset(tools), 0) + n
        if turns:
            theirs = max(turns, key=lambda tools: turns[tools])
            ran = _turns(sum(turns.values()), "turn")
            differ.append(f"{key} {_tools(theirs)} in {ran} (--config: {_tools(mine)})")
    if not differ:
        return None
    return (f"the recording's {'; '.join(differ)}: give --config the live configuration, or the replay counts the "
            "recorded calls as the fleet did not (polling as repeats, exempt tools in streaks).")


def _tools(tools: frozenset[str]) -> str:
    return ",".join(sorted(tools)) or "none"


def recommendation(e: ProbeEvidence, ctx: Context, *, turns: int = 0, calls: int = 0,
                   default_limits: dict[str, object] | None = None) -> list[str]:
    """What the evidence says, in words (empty: no probe turns)."""
    if e.turns == 0:
        return []
    found = frontiers(e, ctx, turns, calls)
    if e.soft_cap is None:
        return [f"{e.turns:,} probe turns, but the main configuration has no adaptive cap: no row to compare.",
                *(f"Recommended: {f.sentence}" if f.probed else f.sentence for f in found)]
    decisions = assess(e, ctx)
    backstop = next((f.recommended for f in found if f.threshold == "backstop"), None)
    out = [backstop_advice(e, decisions, backstop),
           loop_advice(STUCK_WORDS, e.stuck, decisions["stuck"], e.stuck_repeat, e.soft_cap)]
    if e.streak_stop:
        out.append(loop_advice(STREAK_WORDS, e.streak, decisions["streak"], e.streak_stop, e.soft_cap))
    out += [f"Recommended: {f.sentence}" if f.probed else f.sentence for f in found]
    cost = cost_advice(e, ctx, turns, calls)
    if cost:
        out.append(cost)
    return out + limits_notes(e, ctx.recording, default_limits)


def decision_text(d: Decision) -> str:
    """A row's decision in a few words (the table's ``decides`` column)."""
    if d.censored_at_cap is not None:
        return f"censored (cap {d.censored_at_cap[1]:,})"
    if d.verdict == "above":
        return f"above {d.tolerance:.0%}"
    if d.verdict == "within":
        return f"within {d.tolerance:.0%}"
    if d.verdict == "no_evidence":
        return "no evidence"
    if d.why == "needs_turns":
        when = f" ({d.more_days:,.1f} d)" if d.more_days is not None else ""
        return f"{d.more_turns:,} more{when}"
    return "censored" if d.why == "censored" else "at tolerance"


def evidence_rows(e: ProbeEvidence, ctx: Context) -> list[dict[str, Any]]:
    """One row per threshold: each multiple of S, then D and the streak stop."""
    if e.soft_cap is None:
        return []
    decisions = assess(e, ctx)
    labels = {**{str(k): f"{k}x S ({k * e.soft_cap:,})" for k in e.multiples},
              "stuck": f"D={e.stuck_repeat} past S", "streak": f"streak stop {e.streak_stop}"}
    out = []
    for key, p in e.rows():
        if key == "streak" and not e.streak_stop:
            continue
        d = decisions[key]
        out.append({"threshold": labels[key], "passed": p.turns, "resolved": p.resolved, "unresolved": p.unresolved,
                    "censored": p.censored, "unknown": p.unknown,
                    "interval": "-" if not p.known else f"{d.low:.0%}-{d.high:.0%}", "decides": decision_text(d),
                    "calls_past": p.calls_past})
    return out


class Column(NamedTuple):
    """A report table's column: its header, its rows' key, and in the terminal whether it is
    right-aligned (figures) and may wrap."""

    header: str
    key: str
    right: bool = False
    wrap: bool = False


def text_table(columns: Sequence[Column], rows: list[dict[str, Any]], width: int, legend: str) -> list[str]:
    """``rows`` under ``columns``, indented within ``width``, then the ``legend`` saying what they are."""
    header, cells = [c.header for c in columns], [[_cell(r[c.key]) for c in columns] for r in rows]
    right, wrap = [i for i, c in enumerate(columns) if c.right], [i for i, c in enumerate(columns) if c.wrap]
    return ["  " + line for line in fit_table(header, cells, width - 2, right=right, wrap=wrap)] + textwrap.wrap(
        legend, width, initial_indent="  ", subsequent_indent="  ")


def html_table(table_id: str, columns: Sequence[Column], rows: list[dict[str, Any]], left: int = 1) -> str:
    """``rows`` under ``columns`` as HTML, the first ``left`` columns aligned left ("" without rows)."""
    def tr(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join((f"<{tag} class='l'>" if i < left else f"<{tag}>") + html.escape(c) + f"</{tag}>"
                                for i, c in enumerate(cells)) + "</tr>"
    body = "".join(tr([_cell(r[c.key]) for c in columns], "td") for r in rows)
    head = tr([c.header for c in columns], "th")
    return f"<table id='{table_id}'><thead>{head}</thead><tbody>{body}</tbody></table>" if body else ""


def _cell(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


FRONTIER_COLUMNS = (Column("threshold", "threshold", wrap=True), Column("value", "value", wrap=True),
                    Column("productive halted", "halted", right=True), Column("95%", "interval", True, True),
                    Column("extra calls", "extra", True, True), Column("decision", "decision", wrap=True))
_LABELS = {"backstop": "backstop", "stuck": "D", "streak": "streak stop", "soft": "soft cap", "cycles": "cycle cap",
           "explicit": "explicit cap"}
_DECISIONS = {"within": "within", "above": "above", "undecided": "undecided", "no_evidence": "no evidence",
              "past_cap": "past the probe's limit"}


def _value_cell(f: Frontier, v: int | None) -> str:
    return "-" if v is None else value_text(f.threshold, v)


def frontier_rows(found: list[Frontier]) -> list[dict[str, str]]:
    """The frontier table: for each threshold the values worth reading, the live one and the
    recommended one marked."""
    out = []
    for f in found:
        if not f.probed:
            out.append({"threshold": _LABELS[f.threshold], "value": _value_cell(f, f.live) + " (live)", "halted": "-",
                        "interval": "-", "extra": "-", "decision": "not probed"})
        for r in f.shown():
            mark = " (keep)" if r.value == f.live == f.recommended else " (live)" if r.value == f.live else \
                " (set)" if r.value == f.recommended else ""
            value = _value_cell(f, r.value)
            extra = "-" if not r.extra_calls else f"{r.extra_calls:+,}" + (
                f" ({r.extra_share:+.1%})" if r.extra_share is not None else "")
            out.append({"threshold": _LABELS[f.threshold], "value": value + mark,
                        "halted": f"{r.productive:,} of {r.at_risk:,}" if r.at_risk else "-",
                        "interval": f"{r.low:.1%}-{r.high:.1%}" if r.at_risk else "-", "extra": extra,
                        "decision": _DECISIONS[r.decision]})
    return out


def frontier_text(found: list[Frontier], tolerance: float, width: int) -> list[str]:
    """The frontier table and its key, for the terminal (none without a frontier)."""
    rows = frontier_rows(found)
    if not rows:
        return []
    return textwrap.wrap("Recommended values (each threshold alone, from the probe turns):", width) + text_table(
        FRONTIER_COLUMNS, rows, width,
        "(live): the live value; (set): the recommended one; (keep): both. productive halted: of the probe turns "
        "the value would halt with a known fate, those that succeeded (a "
        "turn the probe halted at a limit of its own counts as not productive: its fate past the limit is not "
        "recorded); 95%: their share's interval (Wilson; with none productive, the exact binomial bound "
        f"1-0.025^(1/N)); extra calls: what the turns that never resolve burn under the value beyond the live one "
        f"(and as a share of the fleet's calls); the recommended value is the smallest whose upper bound is below "
        f"the tolerance of {tolerance:.0%}.")


COLUMNS = (Column("threshold", "threshold", wrap=True), *(Column(k, k, right=True) for k in
           ("passed", "resolved", "unresolved", "censored", "unknown")), Column("95% succeed", "interval", True, True),
           Column("decides", "decides", wrap=True), Column("calls past", "calls_past", right=True))


def evidence_text(e: ProbeEvidence, ctx: Context, *, width: int = DEFAULT_WIDTH, turns: int = 0, calls: int = 0,
                  default_limits: dict[str, object] | None = None) -> list[str]:
    """Lines for the terminal report, ``width`` columns at most (none when the input holds no probe turn)."""
    if e.turns == 0:
        return []
    out = ["", *textwrap.wrap(
        f"Probe evidence: {e.turns:,} probe turns ({e.resolved:,} resolved, {e.unresolved:,} unresolved, "
        f"{e.unknown:,} unknown; {e.censored:,} ended at a halt of the probe's own; {e.live_turns:,} live turns beside "
        "them), against the default's " + ("thresholds:" if e.soft_cap is not None else "(no adaptive cap)."), width)]
    rows = evidence_rows(e, ctx)
    if rows:
        shown = [c for c in COLUMNS if c.key not in ("censored", "unknown") or any(r[c.key] for r in rows)]
        out += text_table(shown, rows, width, (
            "passed: probe turns past the threshold; resolved / unresolved / unknown: their results (a turn a loop "
            "detector of the probe's own halted at twice the main's value or more failed under it: unresolved); "
            "censored: halted later at a length limit of the probe's own (its backstop or another cap), or by a loop "
            "detector of its own set below twice the main's value (their fate past it is not recorded); 95% "
            "succeed: the Wilson interval of the share that would have succeeded (censored turns counted as failures "
            f"for its low end, as successes for its high end); decides: against the tolerance of {ctx.tolerance:.0%} "
            "(--tolerance), or how many more probe turns past it with a known fate would decide it, and how long "
            "they take at the observed traffic; calls past: the calls they made past it."))
    out += frontier_text(frontiers(e, ctx, turns, calls), ctx.tolerance, width)
    for advice in recommendation(e, ctx, turns=turns, calls=calls, default_limits=default_limits):
        out += textwrap.wrap(advice, width, initial_indent="  ", subsequent_indent="    ")
    return out


def evidence_html(e: ProbeEvidence, ctx: Context, *, turns: int = 0, calls: int = 0,
                  default_limits: dict[str, object] | None = None) -> str:
    """The HTML report's section (empty when the input holds no probe turn)."""
    if e.turns == 0:
        return ""
    esc = html.escape
    table = html_table("probe-evidence", COLUMNS, evidence_rows(e, ctx))
    fronts = html_table("probe-frontier", FRONTIER_COLUMNS, frontier_rows(frontiers(e, ctx, turns, calls)), 2)
    frontier = ("<h3 id='recommended'>Recommended values</h3><p>Each threshold alone: of the probe turns a value "
                "would halt with a known fate, those that succeeded (95% interval: Wilson; with none, the exact "
                "binomial bound), and the calls the turns that never resolve burn under it beyond the live value. "
                f"The recommended value is the smallest whose upper bound is below {ctx.tolerance:.0%}.</p>{fronts}"
                if fronts else "")
    advice = "".join(f"<li>{esc(line)}</li>" for line in recommendation(e, ctx, turns=turns, calls=calls,
                                                                         default_limits=default_limits))
    return (f"<h2 id='probe'>Probe evidence</h2><p>{e.turns:,} probe turns ({e.resolved:,} resolved, "
            f"{e.unresolved:,} unresolved, {e.unknown:,} unknown; {e.censored:,} ended at a halt of the probe's own) "
            f"and {e.live_turns:,} live turns, against the default configuration's thresholds. The interval is the "
            "95% Wilson interval of the share of the turns past the threshold that would have succeeded, the turns "
            "the probe's own thresholds halted counted as failures for its low end and as successes for its high end; "
            f"each row says what it decides against the tolerance of {ctx.tolerance:.0%}.</p>{table}{frontier}"
            f"<ul id='probe-advice'>{advice}</ul>")
