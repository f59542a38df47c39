"""The probe evidence read against the tolerance and the recording's own limits, in words.

``assess`` decides each probe row (``decision.decide``) with what the recording says: how long it
spans (the traffic rate) and the probe's own caps (a row at or above them is censored there: no
probe turn can be seen past it). ``recommendation`` says what that means for the backstop, D and
the streak stop, never calling a threshold enough when the evidence could not see past it, and
what the probe costs the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnguard.calibrate.decision import Decision, decide
from turnguard.calibrate.evidence import FEW, Passed, ProbeEvidence
from turnguard.calibrate.recording import Recording


@dataclass(frozen=True, slots=True)
class Context:
    """What the rows are read against: the tolerance, the recording, the configured probe rate."""

    tolerance: float
    recording: Recording
    probe_rate: float | None = None
    """The probe's configured rate (``--config``), ``None`` when not configured."""


def probe_hard_cap(recording: Recording) -> int | None:
    """The highest hard cap the probe's turns ran under (``None``: none recorded, or one ran
    without a cap)."""
    limits = recording.limits_of("probe")
    caps = [lim.hard_cap for lim, _ in limits]
    return None if not caps or None in caps else max(c for c in caps if c is not None)


def probe_streak_stop(recording: Recording) -> int | None:
    """The highest streak stop the probe's turns ran under (``None``: not recorded, or disabled)."""
    stops = [lim.streak_stop_at for lim, _ in recording.limits_of("probe")]
    return None if not stops or any(not s for s in stops) else max(s for s in stops if s)


def row_cap(e: ProbeEvidence, key: str, recording: Recording) -> tuple[str, int] | None:
    """The probe's own cap when a row is at or above it (``(threshold, cap)``), else ``None``.
    The stuck row is judged on its turns alone: the recorded limits do not name the probe's stuck
    signal, so they cannot say whether it sees past the main D."""
    if key == "stuck" or e.soft_cap is None:
        return None
    if key == "streak":
        stop = probe_streak_stop(recording)
        return ("streak", stop) if stop is not None and e.streak_stop and e.streak_stop >= stop else None
    cap = probe_hard_cap(recording)
    return ("hard_backstop", cap) if cap is not None and int(key) * e.soft_cap >= cap else None


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
        parts.append(f"{p.censored:,} censored (halted later at a length limit of the probe's own)")
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


def backstop_advice(e: ProbeEvidence, decisions: dict[str, Decision]) -> str:
    """The backstop ``m x S`` in words."""
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


def stuck_advice(e: ProbeEvidence, decisions: dict[str, Decision]) -> str:
    """The stuck threshold D in words."""
    p, d, dd = e.stuck, decisions["stuck"], e.stuck_repeat
    if p.turns == 0:
        return (f"No probe turn would have been halted as stuck (D={dd}, past S={e.soft_cap:,}): no evidence about D "
                "yet.")
    if d.verdict == "no_evidence":
        return f"{_turns(p.turns)} would have been halted as stuck (D={dd}), none has a result yet."
    said = f"{_turns(p.turns)} would have been halted as stuck (D={dd}): {_fates(p)} ({_interval(p, d)})"
    if d.verdict == "within":
        return (f"{said}: within the tolerance of {_pct(d.tolerance)}: keep D={dd}; going on cost "
                f"{p.calls_past:,} calls past the would-be halts.")
    if d.verdict == "undecided":
        return f"{said}: {_when(d, f'D={dd}')}."
    return (f"{said}: above the tolerance of {_pct(d.tolerance)}: D={dd} halts turns that would have succeeded; "
            f"raise D or try stuck_signal='stale_repeat' (it spares edit-and-rerun), at {p.calls_past:,} calls past "
            "the would-be halts.")


def streak_advice(e: ProbeEvidence, decisions: dict[str, Decision]) -> str:
    """The streak stop in words."""
    p, d, stop = e.streak, decisions["streak"], e.streak_stop
    if d.censored_at_cap is not None:
        return (f"The probe's own streak stop ({d.censored_at_cap[1]}) is not past the main one ({stop}): no probe "
                f"turn can be seen past it; raise the probe's streak_stop_at to see past {stop}.")
    if p.turns == 0:
        return (f"No probe turn would have been halted by the streak stop ({stop} identical failures): no evidence "
                "about it yet.")
    if d.verdict == "no_evidence":
        return f"{_turns(p.turns)} would have been halted by the streak stop ({stop}), none has a result yet."
    said = f"{_turns(p.turns)} would have been halted by the streak stop ({stop}): {_fates(p)} ({_interval(p, d)})"
    if d.verdict == "within":
        return f"{said}: within the tolerance of {_pct(d.tolerance)}: keep streak_stop_at={stop}."
    if d.verdict == "undecided":
        return f"{said}: {_when(d, f'the streak stop {stop}')}."
    return (f"{said}: above the tolerance of {_pct(d.tolerance)}: the streak stop halts retries that would have "
            f"succeeded; raise streak_stop_at, at {p.calls_past:,} calls past the would-be halts.")


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
        limits, _ = live[0]
        recorded = {k: getattr(limits, k) for k in default_limits}
        if recorded != default_limits:
            shown = ", ".join(f"{k}={v}" for k, v in recorded.items())
            notes.append(f"The default row is not the live policy most live turns ran under ({shown}): give --config "
                         "the live configuration so that the probe rows are read against it.")
    return notes


def recommendation(e: ProbeEvidence, ctx: Context, *, turns: int = 0, calls: int = 0,
                   default_limits: dict[str, object] | None = None) -> list[str]:
    """What the evidence says, in words (empty: no probe turns)."""
    if e.turns == 0:
        return []
    if e.soft_cap is None:
        return [f"{e.turns:,} probe turns, but the main configuration has no adaptive cap: nothing to compare."]
    decisions = assess(e, ctx)
    out = [backstop_advice(e, decisions), stuck_advice(e, decisions)]
    if e.streak_stop:
        out.append(streak_advice(e, decisions))
    cost = cost_advice(e, ctx, turns, calls)
    if cost:
        out.append(cost)
    return out + limits_notes(e, ctx.recording, default_limits)
