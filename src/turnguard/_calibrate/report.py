"""Terminal and JSON reports of a calibration run (``RunStats``): per policy, the turns it halts
and by which threshold, the resolved ones among them (the false-positive proxy), the unresolved
ones and the calls saved, where halts land and the asks; the default marked ``*``."""

from __future__ import annotations

import json
from typing import Any

from turnguard._calibrate.advice import Column, evidence_text
from turnguard._calibrate.stats import RunStats, default_limits
from turnguard._calibrate.survival import survival_text
from turnguard._model import PLUGIN_ERROR_THRESHOLD, Threshold
from turnguard._terminal import DEFAULT_WIDTH, layout, shown, wrap_items, wrap_text

THRESHOLD_ORDER = (*(t.value for t in Threshold), PLUGIN_ERROR_THRESHOLD)
"""The order the reports list halts by threshold in: every built-in one, as declared."""
BOLD, RESET = "\x1b[1m", "\x1b[0m"


def median_of(hist: dict[int, int]) -> int | None:
    """The median key of a histogram (lower median), or ``None`` when it is empty."""
    total = sum(hist.values())
    if not total:
        return None
    seen = 0
    for key in sorted(hist):
        seen += hist[key]
        if seen * 2 >= total:
            return key
    return None  # pragma: no cover - unreachable


def median_halt(hist: dict[int, list[int]]) -> int | str | None:
    """The median halt call of a bucketed histogram (``stats.add_halt_call``): the call itself
    when its bucket's halts all fell on one call, else the bucket's range (``"960-1023"``)."""
    key = median_of({k: v[0] for k, v in hist.items()})
    if key is None:
        return None
    _, lo, hi = hist[key]
    return lo if lo == hi else f"{lo}-{hi}"


def median_decile(deciles: list[int]) -> str:
    """The tenth of the turn the median halt lands in (``median_of`` over the tenths)."""
    i = median_of(dict(enumerate(deciles)))
    if i is None:
        return "-"
    return "end" if i == 10 else f"{i * 10}-{i * 10 + 10}%"


def thresholds_text(by: dict[str, int]) -> str:
    keys = [k for k in THRESHOLD_ORDER if by.get(k)] + sorted(k for k in by if k not in THRESHOLD_ORDER and by[k])
    return " ".join(f"{k}:{by[k]}" for k in keys) or "-"


def rows(stats: RunStats) -> list[dict[str, Any]]:
    """One row of figures per policy (the table's content, also used by the HTML report)."""
    out = []
    for info, modes in zip(stats.policies, stats.modes, strict=True):
        u, a = modes["unattended"], modes["attended"]
        censored = stats.censored(u)
        out.append({
            "name": info["name"], "default": bool(info["default"]), "family": info["family"],
            "cap": info["params"]["cap"], "streak": info["params"]["streak"],
            "halted": u.halted, "by_threshold": dict(u.by_threshold),
            "halted_resolved": u.halted_resolved, "resolved_ids": list(u.resolved_ids),
            "halted_unresolved": u.halted_unresolved, "unresolved_ids": list(u.unresolved_ids),
            "saved_unresolved": u.saved_unresolved, "halted_unknown": u.halted_unknown,
            "censored": sum(censored.values()), "censored_by_cohort": censored,
            "halted_censored": sum(u.halted_censored.values()), "saved_censored": u.saved_censored,
            "evidence_halts": u.evidence_halts, "evidence_by_source": dict(u.evidence),
            "median_halt_call": median_halt(u.halt_calls), "median_position": median_decile(u.halt_deciles),
            "halt_deciles": list(u.halt_deciles), "halt_calls": {k: list(v) for k, v in u.halt_calls.items()},
            "asks": a.asks, "turns_with_asks": a.turns_with_asks, "asks_resolved": a.asks_resolved,
            "attended_halted": a.halted,
        })
    return out


COLUMNS = (Column("policy", "name", wrap=True), Column("cap", "cap"), Column("streak", "streak"),
           Column("halted", "halted_text", True), Column("censored", "censored", True),
           Column("by threshold", "thresholds", wrap=True), Column("resolved", "resolved_text", True),
           Column("unresolved", "halted_unresolved", True), Column("saved", "saved_unresolved", True),
           Column("at call", "median_halt_call", True, True), Column("at", "median_position", True),
           Column("asks (turns)", "asks_text", True, True))


FIGURES = ("halted", "by_threshold", "halted_resolved", "resolved_ids", "halted_unresolved", "unresolved_ids",
           "saved_unresolved", "halted_unknown", "censored_by_cohort", "halted_censored", "saved_censored",
           "evidence_by_source", "halt_calls", "asks", "turns_with_asks", "attended_halted")


NARROW_DROPS = (("cap", "streak"), ("at",))
"""Columns left out, stage by stage, when the table would not fit (``--wide`` shows them all)."""
UNDER = "by threshold"
"""The wordy column that goes on an indented line under its row when, even with the
``NARROW_DROPS`` left out, the table would not fit beside it (80 columns, a censored column)."""


LEGEND = (
    "halted: turns halted unattended (in brackets, when the run has censored turns: of them, the halts of turns "
    "whose recording ends at a halt of their own, no false-positive evidence); censored: turns whose recording "
    "ends at a halt of their own or whose listed "
    "calls stop before this row's threshold, and turns recorded in part (what the row would do to them is not "
    "recorded: neither halted nor not); resolved (the false-positive proxy) / unresolved: of the halted turns whose "
    "recording goes on to their own end (probe turns, attended 'continue' answers, rows stricter than the live "
    "policy; '?': this row has no such halt, its false-positive rate is not in the recording: read the probe "
    "evidence); saved: calls the unresolved halts save; at call, at: median halt call and tenth of the turn; asks: "
    "attended asks (turns).")
"""What the table's columns say, printed under it."""


def table(stats: RunStats, *, color: bool = False, fold: bool = False, width: int = DEFAULT_WIDTH) -> str:
    """The terminal table with its summary, legend, censoring, named ids and evidence, within
    ``width`` where the words allow. ``fold``: a policy whose figures equal an earlier row's is listed
    under the table instead."""
    every_row = rows(stats)
    data, folded = _folded(every_row) if fold else (every_row, {})
    out = wrap_text(
        f"{stats.turns:,} turns, {stats.calls:,} tool calls ({stats.resolved:,} resolved, "
        f"{stats.unresolved:,} unresolved, {stats.unknown:,} unknown); {stats.problems:,} input problems; "
        f"{len(stats.policies)} policies; * = the default configuration.", width)
    figures, narrowed = _figures_table(data, width, color, censoring=censoring(stats))
    out += ["", *figures, ""]
    if narrowed:
        named = ", ".join(narrowed[:-1]) + " and " + narrowed[-1] if len(narrowed) > 1 else narrowed[0]
        out += wrap_text(f"The {named} columns are left out to fit the terminal: --wide shows them.", width)
    out += wrap_text(LEGEND, width)
    if censoring(stats):
        out += wrap_text(censoring_text(stats), width)
    if folded:
        out += ["", "Same figures as the row named first (folded):"]
        for name, names in folded.items():
            out += wrap_items(f"  {name}: ", names, width)
    if stats.in_part_ids:
        more = sum(stats.recorded_in_part.values()) - len(stats.in_part_ids)
        out += ["", "Turns recorded in part (not replayed):", *_ids_text(stats.in_part_ids, more, width)]
    ids, more = default_unresolved(every_row)
    if ids:
        out += ["", "Unresolved turns the default halts:", *_ids_text(ids, more, width)]
    fps = _fp_groups(every_row)
    if fps:
        out += ["", *wrap_text("Resolved turns halted (the false-positive proxy), by the policies that halt them:",
                               width)]
        for ids, names, count in fps:
            listed = [*map(shown, ids[:8]), *([f"... ({count} in all)"] if count > len(ids[:8]) else [])]
            out += wrap_items("  ", [*listed[:-1], listed[-1] + ":"], width)
            out += wrap_items("    ", names, width, "; ")
    out += evidence_text(stats.probe, stats.context(), width=width, turns=stats.turns, calls=stats.calls,
                         default_limits=default_limits(stats.default_params))
    if stats.survival.censored:
        out += survival_text(stats.survival_json(), width)
    return "\n".join(out) + "\n"


def _ids_text(ids: list[str], more: int, width: int) -> list[str]:
    return wrap_items("  ", [*map(shown, ids), *([f"... ({more} more)"] if more > 0 else [])], width)


def _folded(data: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The rows whose figures no earlier row has, and by the name of such a row the later rows
    with its figures."""
    folded: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    kept = []
    for r in data:
        key = repr([r[k] for k in FIGURES])
        if key in first:
            folded.setdefault(first[key], []).append(r["name"])
        else:
            first[key] = r["name"]
            kept.append(r)
    return kept, folded


def _figures_table(data: list[dict[str, Any]], width: int, color: bool, *,
                   censoring: bool = True) -> tuple[list[str], list[str]]:
    """The policies' figures and the ``NARROW_DROPS`` left out to fit ``width`` (the censored column
    only with ``censoring``)."""
    cells = [_figure_cells(r, censoring) for r in data]
    columns, narrowed, under = _figure_columns(cells, width, censoring)
    header = [COLUMNS[i].header for i in columns]
    rows_of_cells = [[c[i] for i in columns] for c in cells]
    right = [k for k, i in enumerate(columns) if COLUMNS[i].right]
    wrap = [k for k, i in enumerate(columns) if COLUMNS[i].wrap and not (under and COLUMNS[i].header == UNDER)]
    fitted = layout(header, rows_of_cells, width, right=right, wrap=wrap, free_last=under)
    lines = fitted.header(header)
    for r, c in zip(data, rows_of_cells, strict=True):
        row = fitted.row(c)
        lines += [f"{BOLD}{line}{RESET}" for line in row] if color and r["default"] else row
    return lines, narrowed


def censoring(stats: RunStats) -> bool:
    """Whether the run has turns whose recording stops before their end (a censored column)."""
    return bool(stats.halt_ended or stats.cut_short or stats.recorded_in_part)


def censoring_text(stats: RunStats) -> str:
    """The run's censoring in words: how many turns end at a halt of their own, list only their
    first calls or are recorded in part, by cohort ("" when none)."""
    out = []
    if stats.halt_ended:
        total, parts, one = _by_cohort(stats.halt_ended)
        out.append(f"{total} {'ends' if one else 'end'} at a halt of {'its' if one else 'their'} own in the recording "
                   f"({parts}): each is censored there, so a row that would not halt it before that point counts it "
                   "as censored, and a halt of it is no false-positive evidence.")
    if stats.cut_short:
        total, parts, one = _by_cohort(stats.cut_short)
        out.append(f"{total} {'lists only its' if one else 'list only their'} first calls ({parts}; the recorder "
                   "lists at most 10,000 per turn, or tool spans or the turn span are missing): a row that does not "
                   "halt one within them counts it as censored.")
    if stats.recorded_in_part:
        total, parts, one = _by_cohort(stats.recorded_in_part)
        out.append(f"{total} {'is' if one else 'are'} recorded in part ({parts}; the calls listed are not the turn's "
                   "first ones: a turn resumed without its earlier calls, tool spans missing): not replayed, censored "
                   "for every row; their call counts, ends and results still count in the survival and probe "
                   "figures.")
    return " ".join(out)


def _by_cohort(counts: dict[str, int]) -> tuple[str, str, bool]:
    """``("N turns", "n1 live, n2 probe", N == 1)``."""
    total = sum(counts.values())
    return (f"{total:,} {'turn' if total == 1 else 'turns'}",
            ", ".join(f"{n:,} {c}" for c, n in sorted(counts.items()) if n), total == 1)


def resolved_text(r: dict[str, Any]) -> str:
    """The false-positive proxy of a row, ``?`` when none of its halts has a recorded future."""
    return "?" if r["halted"] and not r["evidence_halts"] else str(r["halted_resolved"])


def _figure_cells(r: dict[str, Any], censoring: bool = False) -> list[str]:
    """One policy's row, a text per ``COLUMNS`` entry (``-`` for a figure it does not have); with
    ``censoring``, the halts of turns censored at a halt of their own beside the halts."""
    halted = f"{r['halted']} ({r['halted_censored']})" if censoring else str(r["halted"])
    r = {**r, "halted_text": halted, "thresholds": thresholds_text(r["by_threshold"]),
         "resolved_text": resolved_text(r),
         "asks_text": f"{r['asks']} ({r['turns_with_asks']})",
         "name": ("* " if r["default"] else "  ") + r["name"]}
    return [("-" if r[c.key] is None else str(r[c.key])) for c in COLUMNS]


def _figure_columns(cells: list[list[str]], width: int, censoring: bool) -> tuple[list[int], list[str], bool]:
    """The ``COLUMNS`` shown, those left out, and whether ``UNDER`` goes under its row: all when they
    fit, else the fewest ``NARROW_DROPS`` stages (then ``UNDER`` moved under) that make the rest fit."""
    columns = [i for i in range(len(COLUMNS)) if censoring or COLUMNS[i].header != "censored"]
    beside, dropped = _beside(cells, width, columns)
    if _width(cells, beside, True) <= width or UNDER not in (COLUMNS[i].header for i in columns):
        return beside, dropped, False
    under = next(i for i in columns if COLUMNS[i].header == UNDER)
    rest, dropped = _beside(cells, width, [i for i in columns if i != under])
    return [*rest, under], dropped, True


def _width(cells: list[list[str]], shown: list[int], floor: bool) -> int:
    """The table's width: unwrapped, or with the wrapping columns at their longest word."""
    def size(text: str, i: int) -> int:
        wraps = floor and COLUMNS[i].wrap
        return max(map(len, text.split()), default=0) if wraps else len(text)
    return sum(max([size(COLUMNS[i].header, i), *(size(c[i], i) for c in cells)]) for i in shown) + 2 * (len(shown) - 1)


def _beside(cells: list[list[str]], width: int, columns: list[int]) -> tuple[list[int], list[str]]:
    """``columns`` as they are when they fit ``width`` unwrapped, else without the ``NARROW_DROPS``
    stages needed for them to fit once wrapped (all of them when none is enough)."""
    if _width(cells, columns, False) <= width:
        return columns, []
    dropped: list[str] = []
    for stage in NARROW_DROPS:
        columns = [i for i in columns if COLUMNS[i].header not in stage]
        dropped += stage
        if _width(cells, columns, True) <= width:
            break
    return columns, dropped


def default_unresolved(data: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The unresolved turns the default configuration halts that the rows name, and how many more
    it halts (none when no row is the default)."""
    default = next((r for r in data if r["default"]), None)
    if default is None:
        return [], 0
    return default["unresolved_ids"], default["halted_unresolved"] - len(default["unresolved_ids"])


def _fp_groups(data: list[dict[str, Any]]) -> list[tuple[list[str], list[str], int]]:
    groups: dict[tuple[str, ...], list[str]] = {}
    counts: dict[tuple[str, ...], int] = {}
    for r in data:
        if r["halted_resolved"]:
            key = tuple(r["resolved_ids"])
            groups.setdefault(key, []).append(r["name"])
            counts[key] = r["halted_resolved"]
    return [(list(k), v, counts[k]) for k, v in groups.items()]


def to_json_text(stats: RunStats) -> str:
    return json.dumps(stats.to_json(), indent=1, sort_keys=False) + "\n"
