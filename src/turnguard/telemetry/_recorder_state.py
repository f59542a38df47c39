"""The recorder's per-turn record in a turn's snapshot (``plugins.recorder``), written and read back.

A turn suspended in one process and finished in another is one turn: the line the finishing
process writes must list every call the turn made, or ``turnguard calibrate`` replays another
turn. So the record travels in the snapshot, in a compact form (each tool name and call digest
once, the calls as indexes into those tables), and comes back validated like every other field of
a snapshot (``turnguard._state``): a bad one is a ``SnapshotError`` naming it at the resume, never
an error at the next call or at the turn's end. The section::

    {"started_at": 1764633600.25,                 # Unix seconds: when the turn opened
     "tools": ["run_tests", "read_file"],          # each tool name once
     "digests": ["9f2c4e1a0b7d3c55", ...],         # each call digest once (hex, as on the line)
     "calls": [[0, 0, "error"], [1, 1, "ok", 0]],  # [tool index, digest index, outcome(, result index)]
     "results": ["c1d2e3f4a5b6c7d8"],              # optional: each result digest once (hex)
     "cycles": [1, 1],                             # optional: each call's model request (0: before any)
     "retries": [0, 1],                            # optional: each call's retry() calls before it
     "dropped": 3,                                 # optional: calls past the bound, counted only
     "cycle_mark": [2, 0],                         # optional: (calls, dropped) at the request's start
     "awaiting": [[7, 1]],                         # optional: [check number, call index] still waiting
     "escalations": [{"threshold": ..., "level": ..., "answer": ..., "at_call": ...}],  # optional
     "escalations_dropped": 0}                     # optional

Optional fields are written only when they hold something other than their default (nothing),
as the snapshot format's rule for version 2 says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from turnguard import _state as st
from turnguard._keys import DIGEST_SIZE
from turnguard._model import Answer, Outcome
from turnguard._state import Fields
from turnguard.telemetry._names import CALL_UNFINISHED

PATH = "plugins.recorder"
"""Where the section sits in a snapshot (the built-in recorder's plugin name), for messages."""
MAX_TIME = 1e11
"""Unix seconds past this (the year 5138) are not a time a turn opened at (as ``turnguard
calibrate`` reads ``started_at``)."""
OUTCOMES = (*(outcome.value for outcome in Outcome), CALL_UNFINISHED)
"""A recorded call's outcomes: ``unfinished`` while it waits for one."""
ANSWERS = tuple(answer.value for answer in Answer)
_OUTCOME_SET = frozenset(OUTCOMES)
_HEX = re.compile("[0-9a-f]*")


@dataclass(frozen=True, slots=True)
class Carried:
    """A turn's record as a snapshot carries it (and as the recorder keeps it meanwhile)."""

    started_at: float
    calls: list[tuple[str, str, str, str | None, int, int]]
    """(tool name, call digest in hex, outcome, result digest in hex or ``None``, model request,
    retries before it), in check order. A snapshot without ``cycles`` or ``retries`` (an older
    one) gives 0 to its calls."""
    dropped: int = 0
    cycle_mark: tuple[int, int] = (0, 0)
    awaiting: dict[int, int] | None = None
    """Calls still waiting for their outcome: check number -> index in ``calls``."""
    escalations: list[dict[str, Any]] | None = None
    escalations_dropped: int = 0


def write(carried: Carried) -> dict[str, Any]:
    """The section's JSON data."""
    tools: dict[str, int] = {}
    digests: dict[str, int] = {}
    results: dict[str, int] = {}
    calls = []
    cycles = [call[4] for call in carried.calls]
    retries = [call[5] for call in carried.calls]
    for tool, digest, outcome, result, _, _ in carried.calls:
        entry = [tools.setdefault(tool, len(tools)), digests.setdefault(digest, len(digests)), outcome]
        if result is not None:
            entry.append(results.setdefault(result, len(results)))
        calls.append(entry)
    data: dict[str, Any] = {"started_at": carried.started_at, "tools": list(tools), "digests": list(digests),
                            "calls": calls}
    if results:
        data["results"] = list(results)
    if any(cycles):
        data["cycles"] = cycles
    if any(retries):
        data["retries"] = retries
    if carried.dropped:
        data["dropped"] = carried.dropped
    if carried.cycle_mark != (0, 0):
        data["cycle_mark"] = list(carried.cycle_mark)
    if carried.awaiting:
        data["awaiting"] = [[seq, at] for seq, at in sorted(carried.awaiting.items())]
    if carried.escalations:
        data["escalations"] = [dict(entry) for entry in carried.escalations]
    if carried.escalations_dropped:
        data["escalations_dropped"] = carried.escalations_dropped
    return data


def read(data: Any, *, checks: int, max_calls: int, max_escalations: int) -> Carried:
    """The section back, every field checked: ``checks`` is the resumed turn's check count (the
    waiting calls' check numbers are at most it), ``max_calls`` and ``max_escalations`` the
    recorder's bounds (a live turn never keeps more)."""
    f = Fields(data, PATH)
    started_at = f.number("started_at", 0, MAX_TIME)
    tools = [st.text(f"{PATH}.tools[{i}]", tool, nonempty=True) for i, tool in enumerate(f.items("tools", max_calls))]
    digests = _digests(f.items("digests", max_calls), "digests")
    results = _digests(f.items("results", max_calls, default=[]), "results")
    calls = _calls(f.items("calls", max_calls), tools, digests, results)
    for at, name in ((4, "cycles"), (5, "retries")):
        if f.get(name, None) is not None:
            numbers = f.items(name, max_calls)
            if len(numbers) != len(calls):
                st.refuse(f.at(name), f"one number per call ({len(calls)})", numbers)
            numbers = [st.integer(f"{PATH}.{name}[{i}]", n) for i, n in enumerate(numbers)]
            calls = [(*call[:at], n, *call[at + 1:]) for call, n in zip(calls, numbers, strict=True)]
    dropped = f.integer("dropped", default=0)
    cycle_mark = _cycle_mark(f, len(calls), dropped)
    awaiting = _awaiting(f, len(calls), checks)
    escalations = [_escalation(Fields(entry, f"{PATH}.escalations[{i}]"))
                   for i, entry in enumerate(f.items("escalations", max_escalations, default=[]))]
    escalations_dropped = f.integer("escalations_dropped", default=0)
    f.done()
    return Carried(started_at, calls, dropped, cycle_mark, awaiting, escalations, escalations_dropped)


def _digests(values: list[Any], name: str) -> list[str]:
    """A digest table (``digests``, ``results``): checked at once when it is what the recorder
    writes, else one by one (which names the bad one)."""
    joined = "".join(values) if all(type(v) is str and len(v) == 2 * DIGEST_SIZE for v in values) else None
    if joined is not None and _HEX.fullmatch(joined):
        return values
    return [_digest(f"{PATH}.{name}[{i}]", value, empty=name == "digests") for i, value in enumerate(values)]


def _calls(entries: list[Any], tools: list[str], digests: list[str],
           results: list[str]) -> list[tuple[str, str, str, str | None, int, int]]:
    """The calls: checked in one pass when they are what the recorder writes, else one by one
    (which names the bad one)."""
    ntools, ndigests, nresults, outcomes = len(tools), len(digests), len(results), _OUTCOME_SET
    if all(type(e) is list and (len(e) == 3 or (len(e) == 4 and type(e[3]) is int and 0 <= e[3] < nresults))
           and type(e[0]) is int and 0 <= e[0] < ntools and type(e[1]) is int and 0 <= e[1] < ndigests
           and type(e[2]) is str and e[2] in outcomes for e in entries):
        return [(tools[e[0]], digests[e[1]], e[2], results[e[3]] if len(e) == 4 else None, 0, 0) for e in entries]
    return [_call(f"{PATH}.calls[{i}]", entry, tools, digests, results) for i, entry in enumerate(entries)]


def _digest(path: str, value: Any, *, empty: bool) -> str:
    """A digest as the line writes it: lower-case hex (``empty``: or empty, for a call no guard keyed)."""
    if empty and value == "":
        return ""
    return st.digest(path, value, DIGEST_SIZE).hex()


def _call(path: str, entry: Any, tools: list[str], digests: list[str],
          results: list[str]) -> tuple[str, str, str, str | None, int, int]:
    if not isinstance(entry, list | tuple) or len(entry) not in (3, 4):
        st.refuse(path, "a [tool index, digest index, outcome] or [..., result index] entry", entry)
    result = results[_index(f"{path}[3]", entry[3], results, "results")] if len(entry) == 4 else None
    return (tools[_index(f"{path}[0]", entry[0], tools, "tools")], digests[_index(f"{path}[1]", entry[1], digests,
            "digests")], st.choice(f"{path}[2]", entry[2], OUTCOMES), result, 0, 0)


def _index(path: str, value: Any, table: list[str], name: str) -> int:
    if not table:
        st.refuse(path, f"an index into {PATH}.{name}, which is empty", value)
    return st.integer(path, value, 0, len(table) - 1)


def _cycle_mark(f: Fields, calls: int, dropped: int) -> tuple[int, int]:
    """Where a retry rolls the record back to: at most what the record holds."""
    mark = f.get("cycle_mark", None)
    if mark is None:
        return 0, 0
    path = f.at("cycle_mark")
    if not isinstance(mark, list | tuple) or len(mark) != 2:
        st.refuse(path, "a [calls, dropped] pair", mark)
    return st.integer(f"{path}[0]", mark[0], 0, calls), st.integer(f"{path}[1]", mark[1], 0, dropped)


def _awaiting(f: Fields, calls: int, checks: int) -> dict[int, int]:
    """The waiting calls: check numbers rising, up to the turn's; each a call of the record, once."""
    waiting: dict[int, int] = {}
    low, seen = 1, set()
    for i, entry in enumerate(f.items("awaiting", calls, default=[])):
        path = f"{PATH}.awaiting[{i}]"
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            st.refuse(path, "a [check number, call index] entry", entry)
        seq = st.integer(f"{path}[0]", entry[0], low, max(checks, 0))
        at = st.integer(f"{path}[1]", entry[1], 0, calls - 1)
        if at in seen:
            st.refuse(f"{path}[1]", "a call not listed as waiting before", at)
        seen.add(at)
        waiting[seq], low = at, seq + 1
    return waiting


def _escalation(f: Fields) -> dict[str, Any]:
    entry = {"threshold": f.text("threshold"), "level": f.text("level"), "answer": f.choice("answer", ANSWERS),
             "at_call": f.integer("at_call")}
    f.done()
    return entry
