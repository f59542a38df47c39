"""The recorder's format (corpus-format JSONL): one turn per line, with raw arguments or key
digests, and what the recorder says about how the turn ran. A line that cannot be a turn is
reported, never dropped silently."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from turnguard._calibrate import bounds, records
from turnguard._model import MAX_ID_LENGTH
from turnguard._probe import COHORTS
from turnguard.telemetry._recorder import SOURCE as RECORDER_SOURCE

RESULT_KEY = "result_for"
"""The key that makes a corpus-format line a late result record (``_calibrate/results.py``)."""
LOGS_KEY = "resourceLogs"
"""OTLP JSON logs: read for late results only (``_calibrate/results.py``)."""


def corpus_turn(obj: Any, path: str, lineno: int, on_problem: records.ProblemSink,
                max_line_bytes: int = records.MAX_LINE_BYTES) -> records.RecordedTurn | None:
    """A corpus/recorder line as a turn, or ``None`` after reporting why it cannot be one."""

    def bad(message: str) -> None:
        on_problem(records.InputProblem(path, lineno, message))

    if not isinstance(obj, dict):
        bad(f"expected a JSON object (one turn), got {records.json_type(obj)}; skipped")
        return None
    raw_calls = obj.get("calls")
    if raw_calls is None and (RESULT_KEY in obj or LOGS_KEY in obj):
        return None  # a late result or an OTLP logs document: read before the replay (results.py)
    if not isinstance(raw_calls, list):
        bad("'calls' is missing or not a list")
        return None
    limit = records.turn_calls_limit(max_line_bytes)
    if len(raw_calls) > limit:
        bad(f"{len(raw_calls):,} calls: more than the limit of {limit:,} per turn (--max-line-bytes / "
            f"{bounds.BYTES_PER_CALL})")
        return None
    digests = digests_in_args(obj)
    calls = _plain_calls(raw_calls, digests)
    if calls is None:
        calls = []
        for i, raw in enumerate(raw_calls, 1):
            call = _corpus_call(raw, digests)
            if isinstance(call, str):
                bad(f"call {i}: {call}")
                return None
            calls.append(call)
    cycles = obj.get("cycles")
    if cycles is not None and not records.count_in_range(cycles, 0):
        bad(f"'cycles' must be an integer from 0 to {records.MAX_TURN_CYCLES:,}, got {records.shown(cycles)}")
        return None
    resolved = obj.get("resolved")
    if resolved is not None and not isinstance(resolved, bool):
        bad(f"'resolved' must be true, false or null, got {records.shown(resolved)}")
        return None
    cohort = obj.get("cohort")
    if cohort is not None and cohort not in COHORTS:
        bad(f"'cohort' must be one of {', '.join(COHORTS)} or null, got {cohort!r}")
        return None
    origin = f"{path}:{lineno}"
    return records.RecordedTurn(
        id=_turn_id(records.first_given(obj, "id", "turn_id"), origin, bad),
        calls=tuple(calls),
        cycles=cycles,
        resolved=resolved,
        ended_by=_bounded_text(obj.get("ended_by"), "ended_by", bad),
        source=_bounded_text(obj.get("source"), "source", bad),
        origin=origin,
        cohort=cohort,
        **recorded_facts(obj, bad),
    )


def _turn_id(value: Any, origin: str, bad: Callable[[str], None]) -> str:
    """A turn's id: a string or an integer of at most ``MAX_ID_LENGTH`` characters; anything
    else is reported, and the turn replayed under its origin (``file:line``)."""
    if value is None:
        return origin
    text = records.turn_id_text(value)
    if text is not None:
        return text
    what = (f"{len(value):,} characters" if type(value) is str else f"an integer of more than {MAX_ID_LENGTH} digits"
            if type(value) is int else records.json_type(value))
    bad(f"the turn id must be a string or an integer of at most {MAX_ID_LENGTH} characters, got {what} "
        f"(replayed as {origin})")
    return origin


def _bounded_text(value: Any, key: str, bad: Callable[[str], None]) -> str | None:
    """A short text field (``ended_by``, ``source``, ``policy``): at most ``MAX_ID_LENGTH``
    characters, else reported and left out."""
    if value is None:
        return None
    if type(value) is not str:
        value = records.shown(value, MAX_ID_LENGTH + 1)
    if len(value) > MAX_ID_LENGTH:
        bad(f"{key!r} is longer than {MAX_ID_LENGTH} characters ({len(value):,}); left out")
        return None
    return value


def recorded_facts(obj: dict[str, Any], bad: Callable[[str], None]) -> dict[str, Any]:
    """What a recorder line says about how its turn ran; a malformed key is reported and left
    out, the turn still read."""
    facts: dict[str, Any] = {"policy": _bounded_text(obj.get("policy"), "policy", bad)}
    raw = obj.get("limits")
    if raw is not None:
        try:
            facts["limits"] = records.read_limits(raw)
        except ValueError as exc:
            bad(f"'limits': {exc}; left out")
    times = _times(obj.get("started_at"), obj.get("ended_at"))
    if isinstance(times, str):
        bad(f"'started_at' / 'ended_at': {times}; left out")
    elif times is not None:
        facts["started_at"], facts["ended_at"] = times
    for key in ("tool_calls", "calls_dropped", "calls_unrecorded"):
        count = obj.get(key)
        if count is not None:
            if records.turn_count(count):
                facts[key] = count
            else:
                bad(f"{key!r} must be a whole number from 0 to {records.MAX_TURN_COUNT:,}, got "
                    f"{records.shown(count)}; left out")
    escalations = obj.get("escalations")
    if type(escalations) is list:
        facts["continued"] = any(type(e) is dict and e.get("answer") == "continue" for e in escalations)
    return facts


def _times(started: Any, ended: Any) -> tuple[float, float] | str | None:
    """``(started_at, ended_at)``, ``None`` when neither is recorded, or what is wrong."""
    if started is None and ended is None:
        return None
    for value in (started, ended):
        if type(value) not in (int, float) or not 0 <= value <= records.MAX_TIME:
            return f"Unix seconds expected (both), got {records.shown(started)} and {records.shown(ended)}"
    if ended < started:
        return f"the turn ends ({ended}) before it starts ({started})"
    return float(started), float(ended)


def _plain_calls(raw_calls: list[Any], digests: bool) -> list[records.RecordedCall] | None:
    """The common shape (every call exactly ``tool``, ``args``, ``outcome``, maybe ``result``,
    ``cycle`` and ``retries``) in one comprehension; ``None`` sends the line through the checked
    path, which says what is wrong."""
    make, call, outcomes = tuple.__new__, records.RecordedCall, records.OUTCOMES
    try:
        if digests:
            calls = [make(call, (r["tool"], None, r["args"], outcomes[r["outcome"]], r.get("cycle"), r.get("result"),
                                 r.get("retries", 0)))
                     for r in raw_calls if type(r) is dict and len(r) - ("result" in r) - ("cycle" in r)
                     - ("retries" in r) == 3 and type(r["args"]) is str]
        else:
            calls = [make(call, (r["tool"], r["args"], None, outcomes[r["outcome"]], r.get("cycle"), r.get("result"),
                                 r.get("retries", 0)))
                     for r in raw_calls if type(r) is dict and len(r) - ("result" in r) - ("cycle" in r)
                     - ("retries" in r) == 3]
        tools = set(map(_TOOL, calls))  # a few names: checked once each
        plain = _plain_values(calls)
    except (KeyError, TypeError):  # TypeError: also an unhashable value (the checked path says what is wrong)
        return None
    if not plain or len(calls) != len(raw_calls) or not all(type(t) is str and t for t in tools):
        return None
    return calls


def _plain_values(calls: list[records.RecordedCall]) -> bool:
    """The fast path's results, request numbers and retry counts are what the checked path takes
    (each distinct value checked once)."""
    return (all(r is None or records.short_text(r) for r in set(map(_RESULT, calls)))
            and all(c is None or records.count_in_range(c, 1) for c in set(map(_CYCLE, calls)))
            and all(map(records.turn_count, set(map(_RETRIES, calls)))))


_TOOL = operator.itemgetter(0)  # records.RecordedCall.tool
_CYCLE = operator.itemgetter(4)  # records.RecordedCall.cycle
_RESULT = operator.itemgetter(5)  # records.RecordedCall.result
_RETRIES = operator.itemgetter(6)  # records.RecordedCall.retries


def digests_in_args(obj: dict[str, Any]) -> bool:
    """Whether text ``args`` are key digests: the recorder writes the live guard's digest there,
    and reading it as arguments could parse one as JSON (``7467334316e84052`` is a number)."""
    return obj.get("source") == RECORDER_SOURCE


def _corpus_call(raw: Any, digests: bool = False) -> records.RecordedCall | str:
    if type(raw) is not dict:
        return f"expected an object, got {records.json_type(raw)}"
    tool = records.first_given(raw, "tool", "name")
    if type(tool) is not str or not tool:
        return "'tool' is missing or not a non-empty string"
    digest = records.first_given(raw, "digest", "key_digest")
    if digest is not None and type(digest) is not str:
        return f"'digest' must be a string, got {type(digest).__name__}"
    if digest is None and "args" not in raw:
        return "neither 'args' nor 'digest'"
    value = raw.get("outcome")
    outcome = records.OUTCOMES.get(value) if type(value) is str else None
    if outcome is None:
        outcome = records.parse_outcome(value)
        if outcome is None:
            return f"unknown outcome {records.shown(value)} (expected ok, error, denied, unknown or unfinished)"
    cycle = raw.get("cycle")
    if cycle is not None and not records.count_in_range(cycle, 1):
        return f"'cycle' must be an integer from 1 to {records.MAX_TURN_CYCLES:,}, got {records.shown(cycle)}"
    result = raw.get("result")
    if result is not None and not records.short_text(result):
        return (f"'result' must be a digest (text of at most {MAX_ID_LENGTH} characters) or null, "
                f"got {records.shown(result)}")
    retries = raw.get("retries", 0)
    if not records.turn_count(retries):
        return f"'retries' must be a whole number from 0 to {records.MAX_TURN_COUNT:,}, got {records.shown(retries)}"
    args = raw.get("args")
    if digest is None and digests and type(args) is str:  # the digest is in ``args`` (``digests_in_args``)
        args, digest = None, args
    return records.RecordedCall(tool, None if digest is not None else args, digest, outcome, cycle, result, retries)
