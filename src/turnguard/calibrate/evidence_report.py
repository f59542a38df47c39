"""The probe evidence (``evidence.ProbeEvidence``) as rows, as terminal text and as HTML: counts
always beside any share, so a share of 2 turns never reads like one of 2,000."""

from __future__ import annotations

import html
import textwrap
from typing import Any

from turnguard.calibrate.evidence import ProbeEvidence, recommendation


def evidence_rows(e: ProbeEvidence) -> list[dict[str, Any]]:
    """One row per threshold: each multiple of S, then D."""
    if e.soft_cap is None:
        return []
    rows = [(f"{k}x S ({k * e.soft_cap:,} calls)", p) for k, p in e.multiples.items()]
    rows.append((f"D={e.stuck_repeat} (stuck past S)", e.stuck))
    out = []
    for label, p in rows:
        low, high = p.interval()
        out.append({"threshold": label, "passed": p.turns, "resolved": p.resolved, "unresolved": p.unresolved,
                    "unknown": p.unknown, "interval": "-" if not p.known else f"{low:.0%}-{high:.0%}",
                    "calls_past": p.calls_past})
    return out


HEADERS = (("threshold", "threshold"), ("passed", "passed"), ("resolved", "resolved"),
           ("unresolved", "unresolved"), ("unknown", "unknown"), ("95% resolved", "interval"),
           ("calls past", "calls_past"))


def evidence_text(e: ProbeEvidence, *, width: int = 100) -> list[str]:
    """Lines for the terminal report, ``width`` columns at most (none when the input holds no probe turn)."""
    if e.turns == 0:
        return []
    out = ["", *textwrap.wrap(
        f"Probe evidence: {e.turns:,} probe turns ({e.resolved:,} resolved, {e.unresolved:,} unresolved, "
        f"{e.unknown:,} unknown; {e.live_turns:,} live turns beside them), against the default's "
        + ("thresholds:" if e.soft_cap is not None else "(no adaptive cap)."), width)]
    rows = evidence_rows(e)
    if rows:
        cells = [[h for h, _ in HEADERS]] + [[_cell(r[key]) for _, key in HEADERS] for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
        for c in cells:
            out.append("  " + "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                        for i, (v, w) in enumerate(zip(c, widths, strict=True))).rstrip())
        out += textwrap.wrap("passed: probe turns past the threshold; resolved / unresolved / unknown: their results; "
                             "95%: Wilson interval of the resolved share (known results); calls past: the calls "
                             "they made past it.", width, initial_indent="  ", subsequent_indent="  ")
    for advice in recommendation(e):
        out += textwrap.wrap(advice, width, initial_indent="  ", subsequent_indent="    ")
    return out


def _cell(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def evidence_html(e: ProbeEvidence) -> str:
    """The HTML report's section (empty when the input holds no probe turn)."""
    if e.turns == 0:
        return ""
    esc = html.escape
    left = ["<th class='l'>", "<td class='l'>"]
    head = "".join((left[0] if i == 0 else "<th>") + esc(h) + "</th>" for i, (h, _) in enumerate(HEADERS))
    body = "".join(
        "<tr>" + "".join((left[1] if i == 0 else "<td>") + esc(_cell(r[key])) + "</td>"
                         for i, (_, key) in enumerate(HEADERS)) + "</tr>"
        for r in evidence_rows(e))
    table = f"<table id='probe-evidence'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>" if body else ""
    advice = "".join(f"<li>{esc(line)}</li>" for line in recommendation(e))
    return (f"<h2 id='probe'>Probe evidence</h2><p>{e.turns:,} probe turns ({e.resolved:,} resolved, "
            f"{e.unresolved:,} unresolved, {e.unknown:,} unknown) and {e.live_turns:,} live turns, against the "
            f"default configuration's thresholds. The interval is the 95% Wilson interval of the resolved share "
            f"among the turns with a known result.</p>{table}<ul id='probe-advice'>{advice}</ul>")
