"""The probe evidence (``evidence.ProbeEvidence``) as rows, as terminal text and as HTML: counts
always beside any share, and beside each interval what it decides against the tolerance, so a
share of 2 turns never reads like one of 2,000 and an undecided row never reads like a decided one."""

from __future__ import annotations

import html
import textwrap
from typing import Any

from turnguard.calibrate.advice import Context, assess, recommendation
from turnguard.calibrate.decision import Decision
from turnguard.calibrate.evidence import ProbeEvidence
from turnguard.terminal import DEFAULT_WIDTH, fit_table


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


HEADERS = (("threshold", "threshold"), ("passed", "passed"), ("resolved", "resolved"),
           ("unresolved", "unresolved"), ("censored", "censored"), ("unknown", "unknown"),
           ("95% succeed", "interval"), ("decides", "decides"), ("calls past", "calls_past"))


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
        shown = [(h, key) for h, key in HEADERS if key not in ("censored", "unknown") or any(r[key] for r in rows)]
        header = [h for h, _ in shown]
        cells = [[_cell(r[key]) for _, key in shown] for r in rows]
        right = [i for i, (_, key) in enumerate(shown) if key not in ("threshold", "decides")]
        wrap = [i for i, (_, key) in enumerate(shown) if key in ("threshold", "interval", "decides")]
        out += ["  " + line for line in fit_table(header, cells, width - 2, right=right, wrap=wrap)]
        out += textwrap.wrap(
            "passed: probe turns past the threshold; resolved / unresolved / unknown: their results (a turn the "
            "probe's own loop detectors halted failed under it: unresolved); censored: halted later at a length limit "
            f"of the probe's own, its backstop or another cap (their fate past it is not recorded); 95% succeed: the "
            f"Wilson interval of the share that would have succeeded (censored turns counted as failures for its low "
            f"end, as successes for its high end); decides: against the tolerance of {ctx.tolerance:.0%} "
            "(--tolerance), or how many more probe turns past it with a known fate would decide it, and how long "
            "they take at the observed traffic; calls past: the calls they made past it.", width, initial_indent="  ",
            subsequent_indent="  ")
    for advice in recommendation(e, ctx, turns=turns, calls=calls, default_limits=default_limits):
        out += textwrap.wrap(advice, width, initial_indent="  ", subsequent_indent="    ")
    return out


def _cell(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def evidence_html(e: ProbeEvidence, ctx: Context, *, turns: int = 0, calls: int = 0,
                  default_limits: dict[str, object] | None = None) -> str:
    """The HTML report's section (empty when the input holds no probe turn)."""
    if e.turns == 0:
        return ""
    esc = html.escape
    left = ["<th class='l'>", "<td class='l'>"]
    head = "".join((left[0] if i == 0 else "<th>") + esc(h) + "</th>" for i, (h, _) in enumerate(HEADERS))
    body = "".join(
        "<tr>" + "".join((left[1] if i == 0 else "<td>") + esc(_cell(r[key])) + "</td>"
                         for i, (_, key) in enumerate(HEADERS)) + "</tr>"
        for r in evidence_rows(e, ctx))
    table = f"<table id='probe-evidence'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>" if body else ""
    advice = "".join(f"<li>{esc(line)}</li>" for line in recommendation(e, ctx, turns=turns, calls=calls,
                                                                         default_limits=default_limits))
    return (f"<h2 id='probe'>Probe evidence</h2><p>{e.turns:,} probe turns ({e.resolved:,} resolved, "
            f"{e.unresolved:,} unresolved, {e.unknown:,} unknown; {e.censored:,} ended at a halt of the probe's own) "
            f"and {e.live_turns:,} live turns, against the default configuration's thresholds. The interval is the "
            "95% Wilson interval of the share of the turns past the threshold that would have succeeded, the turns "
            "the probe's own thresholds halted counted as failures for its low end and as successes for its high end; "
            f"each row says what it decides against the tolerance of {ctx.tolerance:.0%}.</p>{table}"
            f"<ul id='probe-advice'>{advice}</ul>")
