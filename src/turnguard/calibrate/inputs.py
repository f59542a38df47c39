"""Readers for recorded turns: corpus-format JSONL (raw arguments or key digests, which is also
what the local recorder writes) and the OpenTelemetry Collector's file exporter (OTLP JSON, one
``{"resourceSpans": [...]}`` object per line), plain or gzip-compressed, mixed freely.

Every reader streams: one turn is in memory at a time (for OTLP, the turns whose turn span has not
arrived yet). A line or span that cannot be read is reported as an ``InputProblem`` (file, line,
what is wrong) through the caller's ``on_problem``; nothing is dropped silently.

Hostile input is bounded: a line longer than ``MAX_LINE_BYTES`` is skipped (and reported) after
reading at most that much of it, JSON nested deeper than the interpreter can parse is a reported
problem, and every field that sizes the replay's work (``cycles``, a call's ``cycle``, the number
of calls) has a ceiling past which the turn is reported, not replayed.
"""

from __future__ import annotations

import gzip
import json
import operator
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from turnguard.calibrate import bounds, span_decoding
from turnguard.calibrate.attributes import attributes
from turnguard.model import MAX_ID_LENGTH, Outcome
from turnguard.probe import COHORTS
from turnguard.telemetry import names


class RecordedCall(NamedTuple):
    """One tool call of a recorded turn: raw ``args`` or, when only that was recorded, a ``digest``.

    A named tuple rather than a frozen dataclass: a million of these are built per second of
    input, and a tuple is several times cheaper to make (it is just as immutable).
    """

    tool: str
    args: Any = None
    digest: str | None = None
    outcome: Outcome = Outcome.UNKNOWN
    cycle: int | None = None
    """The model request (1-based) that issued the call, when recorded."""
    result: str | None = None
    """A digest of the call's result, when recorded (the corpus's ``result``, the recorder's):
    equal digests, equal results. What ``stateful_tools`` policies replay with."""


CAP_MODES = ("explicit", "adaptive", "disabled")


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a turn ran under, as the recorder line's ``limits`` and the turn span's
    attributes give them: ``hard_cap`` is the effective one (N when explicit, S x m when adaptive,
    ``None`` when disabled); ``max_cycles`` 0 when unbounded. A limit not recorded is ``None``."""

    cap_mode: str
    soft_cap: int | None = None
    hard_cap: int | None = None
    stuck_repeat_threshold: int | None = None
    streak_warn_at: int | None = None
    streak_stop_at: int | None = None
    max_cycles: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LIMIT_KEYS}


LIMIT_KEYS = ("cap_mode", "soft_cap", "hard_cap", "stuck_repeat_threshold", "streak_warn_at", "streak_stop_at",
              "max_cycles")
MAX_LIMIT = 2**62
"""The largest limit value read (``config.MAX_CALLS``)."""


@dataclass(frozen=True, slots=True)
class RecordedTurn:
    """One recorded agent turn, as the replay needs it, and what the recording says about how it
    ran: the policy and limits in force, when it ran, its true call count."""

    id: str
    calls: tuple[RecordedCall, ...]
    cycles: int | None = None
    resolved: bool | None = None
    ended_by: str | None = None
    """The threshold that halted the turn, or the reason it ended (``completed``, ``error``, a
    host's own reason); ``None`` when not recorded."""
    source: str | None = None
    origin: str = ""
    """Where the turn came from (``file:line``), for messages."""
    cohort: str | None = None
    """``"live"`` or ``"probe"`` (guarded by a probe configuration), ``None`` when not recorded."""
    policy: str | None = None
    """The ``GuardConfig.name`` in force (the probe's on a probe turn), when recorded."""
    limits: Limits | None = None
    started_at: float | None = None
    """Unix seconds, when recorded (with ``ended_at``)."""
    ended_at: float | None = None
    tool_calls: int | None = None
    """The turn's true number of calls when recorded (the recorder keeps at most 10,000 of them)."""
    continued: bool = False
    """An attended ask of the turn was answered "continue" (the recorder's ``escalations``)."""
    calls_dropped: int = 0
    """Calls the turn made after its listed ones, only counted (the recorder's ``calls_dropped``
    past 10,000 calls; tool spans missing after the turn's first ones): its recording stops early."""
    calls_unrecorded: int = 0
    """Calls of the turn missing before its listed ones (the recorder's ``calls_unrecorded``: a
    turn resumed from a snapshot without the recorder's section; a resumed turn's tool spans, or
    any without the turn's first call): the listed calls are the turn's tail."""
    end_unknown: bool = False
    """The recording says neither how many calls the turn made nor how it ended (tool spans whose
    turn span never came): it may have gone on past its last listed call."""

    @property
    def needed_calls(self) -> int:
        """The calls the turn made (or asked for, for the one a halt denied)."""
        return max(len(self.calls) + self.calls_dropped + self.calls_unrecorded, self.tool_calls or 0)

    @property
    def in_part(self) -> bool:
        """The listed calls are not the turn's start (``calls_unrecorded``, or fewer listed and
        dropped calls than ``tool_calls``: a resumed turn recorded before the recorder counted
        them): replaying them would replay another turn."""
        return self.calls_unrecorded > 0 or (self.tool_calls or 0) > len(self.calls) + self.calls_dropped

    @property
    def cut_short(self) -> bool:
        """The listed calls are the turn's first ones, but not all of them (``calls_dropped``) or
        maybe not all (``end_unknown``): what a threshold would do past the last listed call is
        not recorded."""
        return (self.calls_dropped > 0 or self.end_unknown) and not self.in_part


@dataclass(frozen=True, slots=True)
class InputProblem:
    """A line or span that could not be used, and why."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


MAX_LINE_BYTES = bounds.MAX_LINE_BYTES
"""The longest line read (without its newline); a longer one is reported and skipped, reading at
most this much of it at a time. The recorder writes at most 10,000 calls per line (under 1 MB);
the Collector's file exporter writes one export batch per line. Every other bound derives from it
(``bounds.py``)."""
MAX_TURN_CYCLES = 100_000
"""The most model requests a turn (``cycles``) or a call's ``cycle`` number may give: the replay
does work for each request, so a larger value is a reported problem, not a hang."""
MAX_TURN_CALLS = bounds.MAX_TURN_CALLS
"""The most tool calls a turn may hold at any line limit (100 times the recorder's per-turn
limit); at a given ``--max-line-bytes`` at most ``Bounds.turn_calls`` (131,072 at the default)."""
MAX_WAITING_CALLS = bounds.MAX_TURN_CALLS
"""The most OTLP tool spans held while their turn spans have not arrived (at a given
``--max-line-bytes``, at most ``Bounds.waiting_calls``); past it the turn waiting longest is
reported and replayed as it is, so memory stays bounded on any input."""


def turn_calls_limit(max_line_bytes: int) -> int:
    return min(MAX_TURN_CALLS, bounds.Bounds(max_line_bytes).turn_calls)


def waiting_calls_limit(max_line_bytes: int) -> int:
    return min(MAX_WAITING_CALLS, bounds.Bounds(max_line_bytes).waiting_calls)


class InputError(Exception):
    """A fatal input problem (``--strict``), or an unreadable file."""


ProblemSink = Callable[[InputProblem], None]


SKIP_BLOCK = 1 << 20
READ_BUFFER = 1 << 22
"""The read buffer of a plain input file: a Collector line is a few hundred kilobytes, and
``readline`` through the default 8 KiB buffer joins it from dozens of reads (four times slower)."""


def bounded_lines(readline: Callable[[int], bytes], limit: int) -> Iterator[tuple[bytes | None, int]]:
    """``(line, size)`` for each line ``readline`` gives, or ``(None, size)`` for a line longer
    than ``limit`` bytes (its rest is read in blocks and dropped, so memory holds at most
    ``limit`` bytes of it); ``size`` is the line's length in bytes, newline included."""
    while line := readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        del line
        while block := readline(SKIP_BLOCK):
            size += len(block)
            if block.endswith(b"\n"):
                break
        yield None, size


def too_long(path: str, lineno: int, size: int, limit: int) -> InputProblem:
    return InputProblem(path, lineno, f"line longer than the limit of {limit:,} bytes (--max-line-bytes): "
                                      f"{size:,} bytes with its newline; skipped")


class LineSource:
    """The lines of one file as bytes, transparently un-gzipped (by magic number, not by name),
    with how far into the file (on disk) reading has got, for progress bars. Lines longer than
    ``max_line_bytes`` are reported to ``on_problem`` and skipped."""

    def __init__(self, path: str | Path, on_problem: ProblemSink | None = None, *,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.path = str(path)
        self.on_problem = on_problem
        self.max_line_bytes = max_line_bytes
        try:
            self._raw = open(path, "rb", buffering=READ_BUFFER)  # noqa: SIM115 - closed by close()
            self.size = os.fstat(self._raw.fileno()).st_size
            gzipped = self._raw.read(2) == b"\x1f\x8b"
            self._raw.seek(0)
        except OSError as exc:
            raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from exc
        self._lines: Any = gzip.GzipFile(fileobj=self._raw, mode="rb") if gzipped else self._raw

    def position(self) -> int:
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return self.size

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        limit = self.max_line_bytes
        for lineno, (line, size) in enumerate(bounded_lines(self._lines.readline, limit), 1):
            if line is not None:
                yield lineno, line
            elif self.on_problem is not None:
                self.on_problem(too_long(self.path, lineno, size, limit))

    def close(self) -> None:
        self._lines.close()
        self._raw.close()

    def __enter__(self) -> LineSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_turns(paths: Iterable[str | Path], on_problem: ProblemSink, *,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[RecordedTurn]:
    """Every turn of every file, in file order, the files one stream (a turn's spans may be in
    two files of a rotated set: ``streams.py``); each file's format is detected per line."""
    spans = OtlpAssembler(on_problem, max_line_bytes=max_line_bytes)
    for path in paths:
        with LineSource(path, on_problem, max_line_bytes=max_line_bytes) as source:
            yield from read_source(source, on_problem, spans)
    yield from spans.finish()


RESULT_KEY = "result_for"
"""The key that makes a corpus-format line a late result record (``calibrate/results.py``)."""
LOGS_KEY = "resourceLogs"
"""OTLP JSON logs: read for late results only (``calibrate/results.py``)."""
OTLP_MARKER = b'"resourceSpans"'
"""What every OTLP JSON line holds (and corpus lines practically never do)."""


def is_otlp_line(line: bytes) -> bool:
    """Cheap test used to route a line before parsing it (OTLP lines need the assembler)."""
    return OTLP_MARKER in line


def read_source(source: LineSource, on_problem: ProblemSink,
                spans: OtlpAssembler | None = None) -> Iterator[RecordedTurn]:
    """The turns of one file: corpus lines and OTLP lines may even be mixed in one file. With
    ``spans``, an assembler shared by the files of one stream, tool spans still waiting for their
    turn span at the end of the file wait on (the caller finishes it); without, they are released
    at the end of this file."""
    label, limit = source.path, source.max_line_bytes
    own = spans is None
    if spans is None:
        spans = OtlpAssembler(on_problem, max_line_bytes=limit)
    spans.path = label
    try:
        for lineno, line in source:
            yield from read_line(line, label, lineno, on_problem, limit, spans)
    except (OSError, EOFError, zlib.error) as exc:
        on_problem(InputProblem(label, 0, f"file ends badly: {exc}"))
    if own:
        yield from spans.finish()


def read_line(line: bytes, path: str, lineno: int, on_problem: ProblemSink, max_line_bytes: int,
              spans: OtlpAssembler) -> Iterator[Any]:
    """The turns one line gives: a corpus line's turn, or those an OTLP line completes in
    ``spans`` (decoded by msgspec when it can, ``span_decoding``; else parsed by ``json``)."""
    if not is_otlp_line(line):
        turn = corpus_line(line, path, lineno, on_problem, max_line_bytes)
        if turn is not None:
            yield turn
        return
    if too_costly(line, max_line_bytes) is None:
        document = span_decoding.decode(line)
        if document is not None:
            yield from spans.add_decoded(document, lineno)
            return
    obj = parse_line(line, path, lineno, on_problem, max_line_bytes)
    if obj is UNREADABLE:
        return
    if isinstance(obj, dict) and "resourceSpans" in obj:
        yield from spans.add(obj, lineno)
        return
    turn = corpus_turn(obj, path, lineno, on_problem, max_line_bytes)
    if turn is not None:
        yield turn


UNREADABLE: Any = object()
"""What ``parse_line`` returns for a line that holds no JSON value (JSON ``null`` is ``None``)."""


def parse_line(line: bytes, path: str, lineno: int, on_problem: ProblemSink,
               max_line_bytes: int = MAX_LINE_BYTES) -> Any:
    """The JSON value of a line, or ``UNREADABLE``: a blank line, or one reported as not JSON
    (nesting too deep for the parser included), or as too costly to parse: its parsed form,
    estimated from its structure (``bounds.parsed_size``), would take more than
    ``bounds.PARSE_FACTOR`` x ``max_line_bytes``."""
    if _blank(line):
        return UNREADABLE
    size = too_costly(line, max_line_bytes)
    if size is not None:
        budget = bounds.PARSE_FACTOR * max_line_bytes
        on_problem(InputProblem(path, lineno, f"too many JSON values to read within the memory bound: about "
                                              f"{size / 2**20:,.0f} MiB once parsed, more than "
                                              f"{bounds.PARSE_FACTOR} x --max-line-bytes ({budget / 2**20:,.0f} "
                                              "MiB); skipped"))
        return UNREADABLE
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        message = f"not JSON: {exc}"
    except RecursionError:
        message = "not readable: JSON nested too deeply"
    on_problem(InputProblem(path, lineno, message))
    return UNREADABLE


def too_costly(line: bytes, max_line_bytes: int) -> int | None:
    """The estimated parsed size of a line too costly to parse (``parse_line``), else ``None``."""
    budget = bounds.PARSE_FACTOR * max_line_bytes
    if len(line) <= bounds.ESTIMATE_FROM or bounds.MAX_PARSED_PER_BYTE * len(line) <= budget:
        return None  # (within the bound whatever the line holds)
    size = bounds.parsed_size(line)
    return size if size > budget else None


def corpus_line(line: bytes, path: str, lineno: int, on_problem: ProblemSink,
                max_line_bytes: int = MAX_LINE_BYTES) -> RecordedTurn | None:
    """One corpus-format line as a turn (blank lines are skipped, anything else is reported)."""
    obj = parse_line(line, path, lineno, on_problem, max_line_bytes)
    return None if obj is UNREADABLE else corpus_turn(obj, path, lineno, on_problem, max_line_bytes)


def _blank(line: bytes) -> bool:
    """Empty or whitespace only (without copying a long line, as ``strip`` would)."""
    return not line or line.isspace()


# -- corpus format -------------------------------------------------------------------------------

_OUTCOMES = {o.value: o for o in Outcome}


def corpus_turn(obj: Any, path: str, lineno: int, on_problem: ProblemSink,
                max_line_bytes: int = MAX_LINE_BYTES) -> RecordedTurn | None:
    """A corpus/recorder line as a turn, or ``None`` after reporting why it cannot be one."""

    def bad(message: str) -> None:
        on_problem(InputProblem(path, lineno, message))

    if not isinstance(obj, dict):
        bad(f"expected a JSON object (one turn), got {json_type(obj)}; skipped")
        return None
    raw_calls = obj.get("calls")
    if raw_calls is None and (RESULT_KEY in obj or LOGS_KEY in obj):
        return None  # a late result or an OTLP logs document: read before the replay (results.py)
    if not isinstance(raw_calls, list):
        bad("'calls' is missing or not a list")
        return None
    limit = turn_calls_limit(max_line_bytes)
    if len(raw_calls) > limit:
        bad(f"{len(raw_calls):,} calls: more than the limit of {limit:,} per turn (--max-line-bytes / "
            f"{bounds.BYTES_PER_CALL})")
        return None
    calls = _plain_calls(raw_calls)
    if calls is None:
        calls = []
        for i, raw in enumerate(raw_calls, 1):
            call = _corpus_call(raw)
            if isinstance(call, str):
                bad(f"call {i}: {call}")
                return None
            calls.append(call)
    cycles = obj.get("cycles")
    if cycles is not None and not _count_in_range(cycles, 0):
        bad(f"'cycles' must be an integer from 0 to {MAX_TURN_CYCLES:,}, got {shown(cycles)}")
        return None
    resolved = obj.get("resolved")
    if resolved is not None and not isinstance(resolved, bool):
        bad(f"'resolved' must be true, false or null, got {shown(resolved)}")
        return None
    cohort = obj.get("cohort")
    if cohort is not None and cohort not in COHORTS:
        bad(f"'cohort' must be one of {', '.join(COHORTS)} or null, got {cohort!r}")
        return None
    origin = f"{path}:{lineno}"
    return RecordedTurn(
        id=_turn_id(obj.get("id", obj.get("turn_id")), origin, bad),
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
    if type(value) is int and value.bit_length() <= MAX_ID_BITS:
        return str(value)
    if type(value) is str and len(value) <= MAX_ID_LENGTH:
        return value
    what = (f"{len(value):,} characters" if type(value) is str else f"an integer of more than {MAX_ID_LENGTH} digits"
            if type(value) is int else json_type(value))
    bad(f"the turn id must be a string or an integer of at most {MAX_ID_LENGTH} characters, got {what} "
        f"(replayed as {origin})")
    return origin


MAX_ID_BITS = 800
"""Integers of at most this many bits have fewer than ``MAX_ID_LENGTH`` digits (and ``str`` of a
larger one could even raise: Python limits int-to-text conversion to 4,300 digits)."""


def _bounded_text(value: Any, key: str, bad: Callable[[str], None]) -> str | None:
    """A short text field (``ended_by``, ``source``, ``policy``): at most ``MAX_ID_LENGTH``
    characters, else reported and left out."""
    if value is None:
        return None
    if type(value) is not str:
        value = shown(value, MAX_ID_LENGTH + 1)
    if len(value) > MAX_ID_LENGTH:
        bad(f"{key!r} is longer than {MAX_ID_LENGTH} characters ({len(value):,}); left out")
        return None
    return value


def recorded_facts(obj: dict[str, Any], bad: Callable[[str], None]) -> dict[str, Any]:
    """What a recorder line says about how its turn ran (``policy``, ``limits``, ``started_at``,
    ``ended_at``, ``tool_calls``, ``calls_dropped``, ``calls_unrecorded``, a "continue" among its
    ``escalations``): each key that is
    present but malformed is reported and left out, the turn still read. Older lines have none."""
    facts: dict[str, Any] = {"policy": _bounded_text(obj.get("policy"), "policy", bad)}
    raw = obj.get("limits")
    if raw is not None:
        limits = _limits(raw)
        if isinstance(limits, str):
            bad(f"'limits': {limits}; left out")
        else:
            facts["limits"] = limits
    times = _times(obj.get("started_at"), obj.get("ended_at"))
    if isinstance(times, str):
        bad(f"'started_at' / 'ended_at': {times}; left out")
    elif times is not None:
        facts["started_at"], facts["ended_at"] = times
    for key in ("tool_calls", "calls_dropped", "calls_unrecorded"):
        count = obj.get(key)
        if count is not None:
            if type(count) is int and 0 <= count <= MAX_LIMIT:
                facts[key] = count
            else:
                bad(f"{key!r} must be a whole number from 0, got {shown(count)}; left out")
    escalations = obj.get("escalations")
    if type(escalations) is list:
        facts["continued"] = any(type(e) is dict and e.get("answer") == "continue" for e in escalations)
    return facts


def _limits(raw: Any) -> Limits | str:
    """``Limits`` from a recorder line's ``limits`` object, or what is wrong with it."""
    if type(raw) is not dict:
        return f"expected an object, got {json_type(raw)}"
    mode = raw.get("cap_mode")
    if mode not in CAP_MODES:
        return f"'cap_mode' must be one of {', '.join(CAP_MODES)}, got {shown(mode)}"
    values: dict[str, Any] = {"cap_mode": mode}
    for key in LIMIT_KEYS[1:]:
        value = raw.get(key)
        if value is not None and not (type(value) is int and 0 <= value <= MAX_LIMIT):
            return f"{key!r} must be a whole number from 0 or null, got {shown(value)}"
        values[key] = value
    return Limits(**values)


MAX_TIME = 1e11
"""Unix seconds past this (the year 5138) are not a time a turn ran at."""


def _times(started: Any, ended: Any) -> tuple[float, float] | str | None:
    """``(started_at, ended_at)``, ``None`` when neither is recorded, or what is wrong."""
    if started is None and ended is None:
        return None
    for value in (started, ended):
        if type(value) not in (int, float) or not 0 <= value <= MAX_TIME:
            return f"Unix seconds expected (both), got {shown(started)} and {shown(ended)}"
    if ended < started:
        return f"the turn ends ({ended}) before it starts ({started})"
    return float(started), float(ended)


def _plain_calls(raw_calls: list[Any]) -> list[RecordedCall] | None:
    """The common shape, every call exactly ``{"tool", "args", "outcome"}`` with a known outcome
    (and maybe a ``result`` digest), read in one comprehension; ``None`` sends the line through the
    checked path (which says what is wrong, if anything is)."""
    make, outcomes = tuple.__new__, _OUTCOMES
    try:
        calls = [make(RecordedCall, (r["tool"], r["args"], None, outcomes[r["outcome"]], None, r.get("result")))
                 for r in raw_calls if type(r) is dict and len(r) - ("result" in r) == 3]
        tools = set(map(_TOOL, calls))  # a few names: checked once each
        results = set(map(_RESULT, calls))
    except (KeyError, TypeError):  # TypeError: also an unhashable tool name (the checked path says so)
        return None
    if len(calls) != len(raw_calls) or not all(type(t) is str and t for t in tools):
        return None
    if not all(r is None or _short_text(r) for r in results):
        return None
    return calls


_TOOL = operator.itemgetter(0)  # RecordedCall.tool
_RESULT = operator.itemgetter(5)  # RecordedCall.result


def _corpus_call(raw: Any) -> RecordedCall | str:
    if type(raw) is not dict:
        return f"expected an object, got {json_type(raw)}"
    tool = raw.get("tool") or raw.get("name")
    if type(tool) is not str or not tool:
        return "'tool' is missing or not a non-empty string"
    digest = raw.get("digest") or raw.get("key_digest")
    if digest is not None and type(digest) is not str:
        return f"'digest' must be a string, got {type(digest).__name__}"
    if digest is None and "args" not in raw:
        return "neither 'args' nor 'digest'"
    value = raw.get("outcome")
    outcome = _OUTCOMES.get(value) if type(value) is str else None
    if outcome is None:
        outcome = _outcome(value)
        if outcome is None:
            return f"unknown outcome {shown(value)} (expected ok, error, denied or unknown)"
    cycle = raw.get("cycle")
    if cycle is not None and not _count_in_range(cycle, 1):
        return f"'cycle' must be an integer from 1 to {MAX_TURN_CYCLES:,}, got {shown(cycle)}"
    result = raw.get("result")
    if result is not None and not _short_text(result):
        return f"'result' must be a digest (text of at most {MAX_ID_LENGTH} characters) or null, got {shown(result)}"
    return RecordedCall(tool, raw.get("args") if digest is None else None, digest, outcome, cycle, result)


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (``null``, ``an array``)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _count_in_range(value: Any, minimum: int, maximum: int = MAX_TURN_CYCLES) -> bool:
    """An ``int`` (not a ``bool``, not a float) from ``minimum`` to ``maximum``."""
    return type(value) is int and minimum <= value <= maximum


def shown(value: Any, width: int = 40) -> str:
    """``repr(value)`` cut to ``width`` characters (a huge number or text in a message stays short,
    and costs no more than its shown part)."""
    if type(value) is int and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    if type(value) is str and len(value) > width:
        return repr(value[:width])[: width - 3] + f"... ({len(value):,} characters)"
    if isinstance(value, (dict, list)) and len(value) > width:
        return f"{json_type(value)} of {len(value):,} items"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _outcome(value: Any) -> Outcome | None:
    if value is None:
        return Outcome.UNKNOWN
    try:
        return Outcome.parse(value)
    except ValueError:
        return None


# -- OTLP JSON (the Collector's file exporter) ----------------------------------------------------


@dataclass(slots=True)
class _Pending:
    path: str
    lineno: int
    calls: list[tuple[int, RecordedCall]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class HeldTurn:
    """A turn span read by a worker process (``OtlpAssembler(hold=True)``): its calls and facts,
    kept until the parent says which calls of earlier byte ranges belong to it (``build``)."""

    turn_id: str
    own: list[tuple[int, RecordedCall]]
    """The calls that waited under the turn id (``turn:<id>``)."""
    children: list[tuple[int, RecordedCall]]
    """The calls that waited under its span id (``span:<id>``)."""
    facts: dict[str, Any]

    def build(self, own_before: Sequence[tuple[int, RecordedCall]] = (),
              children_before: Sequence[tuple[int, RecordedCall]] = ()) -> RecordedTurn:
        """The turn, with the calls under each key that earlier ranges left waiting first (the
        order one reader would have appended them in)."""
        calls = [*own_before, *self.own, *children_before, *self.children]
        return _recorded_turn(self.turn_id, calls, self.facts)


_INDEX = operator.itemgetter(0)


def _recorded_turn(turn_id: str, calls: list[tuple[int, RecordedCall]], facts: dict[str, Any]) -> RecordedTurn:
    """The turn of a turn span's facts and its tool spans' calls (``span_listing``)."""
    calls.sort(key=_INDEX)  # stable: calls of one index keep their order
    return RecordedTurn(id=turn_id, **span_listing(calls, facts.get("tool_calls")), **facts)


MAX_SHARED_TOOLS = 10_000
"""Tool names an assembler keeps one copy of (the telemetry's own bound on tool names)."""


_CALL_DEFAULTS = tuple(RecordedCall._field_defaults[f] for f in RecordedCall._fields[4:])
"""``RecordedCall``'s fields after ``outcome`` at their defaults (a span call sets the first four)."""
_SPAN_OUTCOMES: dict[str, Outcome | None] = {}
"""``turnguard.call.outcome`` texts read so far and what they mean (at most ``MAX_SHARED_TOOLS``)."""


_new_call = tuple.__new__


def span_outcome(raw: Any) -> Outcome | None:
    """A tool span's ``turnguard.call.outcome`` (``unfinished``: unknown); ``None``: not an outcome."""
    if type(raw) is str:
        found = _SPAN_OUTCOMES.get(raw, False)
        if found is not False:
            return found  # type: ignore[return-value]
    outcome = Outcome.UNKNOWN if raw == names.CALL_UNFINISHED else _outcome(raw)
    if type(raw) is str and len(_SPAN_OUTCOMES) < MAX_SHARED_TOOLS:
        _SPAN_OUTCOMES[raw] = outcome
    return outcome


for _text in (*(o.value for o in Outcome), names.CALL_UNFINISHED):
    span_outcome(_text)  # the usual texts, known from the start (the template's path reads them)
_TEMPLATE_OUTCOMES = {text.encode(): outcome for text, outcome in _SPAN_OUTCOMES.items() if outcome is not None}
"""The usual outcome texts as bytes (``OtlpAssembler._take_template``; another text takes the longer way)."""


class OtlpAssembler:
    """Rebuilds turns from turnguard's spans: the turn span (``invoke_agent {agent}``, or a
    host's own span that turnguard enriched with ``turnguard.turn.id``) and its tool-call spans
    (``execute_tool {tool}`` with ``turnguard.call.index``, ``turnguard.call.key_digest``,
    ``turnguard.call.outcome``), linked by ``parentSpanId`` (or a ``turnguard.turn.id`` of their own).

    Child spans end, and are exported, before their turn span: calls wait here, keyed by their
    parent, until it arrives, so memory holds only the turns in flight (at most
    ``MAX_WAITING_CALLS`` calls). One assembler reads the files of one stream in order (``path``
    is the file being read), so a turn whose spans straddle a rotation is one turn. Calls whose
    turn span never arrives are reported, then replayed as a turn of their own at the end of the
    stream (or when the bound is reached).

    A line comes parsed by the ``json`` module (``add``) or decoded by msgspec (``add_decoded``);
    both give each span's fields to the same ``_call`` and ``_turn_span``. With ``hold`` (a worker
    reading one byte range of a file, ``run.py``), a turn span gives a ``HeldTurn`` instead of a
    turn, and ``emitted`` / ``leftovers()`` say what the parent needs to join the ranges exactly
    (``take_range``).
    """

    def __init__(self, on_problem: ProblemSink, path: str = "", *, max_line_bytes: int = MAX_LINE_BYTES,
                 hold: bool = False) -> None:
        self.path = path
        self.on_problem = on_problem
        self.max_waiting = waiting_calls_limit(max_line_bytes)
        self.max_calls = turn_calls_limit(max_line_bytes)
        self._tools: dict[str, str] = {}
        """Tool names seen, each kept once (a waiting call holds the shared text)."""
        self._pending: dict[str, _Pending] = {}
        self._waiting = 0
        self.hold = hold
        self.emitted: list[tuple[str, str | None, int, int]] = []
        """With ``hold``: per turn span, its keys and how many calls waited under each here."""
        self.most_waiting = 0
        """With ``hold``: the most calls that waited at once after a span."""
        self.released = False
        """A turn was released because too many calls waited (``_release_oldest``)."""
        self._last_parent: str | None = None
        """The parent of the last call held (``_pend_call``), whose calls are ``_last_calls``: the
        next tool span is most often its sibling. Forgotten whenever a key leaves ``_pending``."""
        self._last_calls: list[tuple[int, RecordedCall]] = []
        self._tool_texts: dict[bytes, str] = {}
        """Tool names as the template matched them, each decoded once (at most ``MAX_SHARED_TOOLS``)."""

    def add(self, obj: dict[str, Any], lineno: int) -> Iterator[Any]:
        """Take one exported line (parsed by ``json``); yield the turns it completes."""
        resource_spans = obj.get("resourceSpans")
        if not isinstance(resource_spans, list):
            self._bad(lineno, "'resourceSpans' is not a list")
            return
        for rs in resource_spans:
            scope_spans = rs.get("scopeSpans") if isinstance(rs, dict) else None
            if not isinstance(scope_spans, list):
                self._bad(lineno, "a resourceSpans entry without a 'scopeSpans' list")
                continue
            for ss in scope_spans:
                spans = ss.get("spans") if isinstance(ss, dict) else None
                if not isinstance(spans, list):
                    self._bad(lineno, "a scopeSpans entry without a 'spans' list")
                    continue
                for span in spans:
                    turn = self._span(span, lineno)
                    if turn is not None:
                        yield turn
                    if self._waiting > self.most_waiting and self._most_waiting():
                        yield self._release_oldest()

    def add_decoded(self, spans: list[span_decoding.DecodedSpan], lineno: int) -> Iterator[Any]:
        """``add`` for a line decoded by ``span_decoding.decode``: the same spans in the same order.
        A tool span as the plugin writes it is taken from its template match (``_take_siblings``,
        ``_take_template``); any other is read as ``add`` reads it (``span_decoding.plain``)."""
        template, siblings = self._take_template, self._take_siblings
        i, end = 0, len(spans)
        while i < end:
            i, due = siblings(spans, i)
            if due:
                yield self._release_oldest()
                continue
            if i == end:
                break
            decoded = spans[i]
            i += 1
            span, _, found = decoded
            if found is None or not template(found, span.parentSpanId, lineno):
                turn = self._span(span_decoding.plain(decoded), lineno)
                if turn is not None:
                    yield turn
            if self._waiting > self.most_waiting and self._most_waiting():
                yield self._release_oldest()

    def _take_siblings(self, spans: list[span_decoding.DecodedSpan], i: int) -> tuple[int, bool]:
        """Take the spans from ``spans[i]`` on that the template matched and that are siblings of
        the last call held, each as ``_take_template`` would, in one loop; stop at any other.
        ``(the first span not taken, whether the waiting bound now releases a turn)``."""
        parent, calls = self._last_parent, self._last_calls
        if parent is None:
            return i, False
        tools, limit, bound = self._tool_texts, self.max_calls, self.max_waiting
        waiting, most, end = self._waiting, self.most_waiting, len(spans)
        due = False
        while i < end:
            span, _, found = spans[i]
            if found is None or span.parentSpanId != parent:
                break
            index, digest, raw_tool, text = found.groups()
            outcome, tool, number = _TEMPLATE_OUTCOMES.get(text), tools.get(raw_tool), int(index)
            if outcome is None or tool is None or number < 1 or len(calls) >= limit:
                break
            calls.append((number, _new_call(RecordedCall, (tool, None, digest.decode(), outcome, *_CALL_DEFAULTS))))
            waiting += 1
            i += 1
            if waiting > most:
                most = waiting
                if waiting > bound:
                    due = True
                    break
        self._waiting, self.most_waiting = waiting, most
        return i, due

    def _take_template(self, found: Any, parent: str | None, lineno: int) -> bool:
        """Take a tool span whose attributes matched ``span_decoding.TOOL_ATTRIBUTES`` (the match
        checked their types and lengths) when its outcome is a usual one, its parent a short text,
        its index from 1 and its turn below its bound, as ``_call`` checks them (``False``: not
        taken, nothing changed; ``_span`` reads it and says what is wrong)."""
        index, digest, raw_tool, text = found.groups()
        outcome = _TEMPLATE_OUTCOMES.get(text)
        if outcome is None or not parent or len(parent) > MAX_ID_LENGTH:
            return False
        tool = self._tool_texts.get(raw_tool)
        if tool is None:
            tool = raw_tool.decode()
            if len(self._tool_texts) < MAX_SHARED_TOOLS:
                self._tool_texts[raw_tool] = tool
        number = int(index)
        if parent != self._last_parent:
            return self._pend_call(parent, number, tool, digest.decode(), outcome, lineno)
        calls = self._last_calls
        if number < 1 or len(calls) >= self.max_calls:
            return False
        calls.append((number, _new_call(RecordedCall, (tool, None, digest.decode(), outcome, *_CALL_DEFAULTS))))
        self._waiting += 1
        return True

    def _pend_call(self, parent: str, number: int, tool: str, digest: str, outcome: Outcome, lineno: int) -> bool:
        """Hold a checked tool span's call for its turn span (``False``: its index or the turn's
        bound refuses it, nothing changed)."""
        key = "span:" + parent
        pending = self._pending.get(key)
        if number < 1 or (pending is not None and len(pending.calls) >= self.max_calls):
            return False
        if pending is None:
            pending = self._pending[key] = _Pending(self.path, lineno)
        tools = self._tools
        shared = tools.get(tool)
        if shared is not None:
            tool = shared
        elif len(tools) < MAX_SHARED_TOOLS:
            tools[tool] = tool
        pending.calls.append((number, _new_call(RecordedCall, (tool, None, digest, outcome, *_CALL_DEFAULTS))))
        self._waiting += 1
        self._last_parent, self._last_calls = parent, pending.calls
        return True

    def _most_waiting(self) -> bool:
        """Note a new most of waiting calls; ``True`` when past the bound (the oldest is released)."""
        self.most_waiting = self._waiting
        return self._waiting > self.max_waiting

    def _release_oldest(self) -> RecordedTurn:
        key, pending = next(iter(self._pending.items()))
        del self._pending[key]
        self._last_parent = None
        self._waiting -= len(pending.calls)
        self.released = True
        self.most_waiting = min(self.most_waiting, self.max_waiting)  # past it, every span checks the bound
        self._bad(pending.lineno, f"{len(pending.calls)} tool span(s) of {key} waited longest while more than "
                                  f"{self.max_waiting:,} waited for their turn spans (replayed as a turn of "
                                  "their own)", pending.path)
        return self._orphan(key, pending)

    def finish(self) -> Iterator[RecordedTurn]:
        """End of the stream: calls whose turn span never came are reported and still replayed."""
        for key, pending in list(self._pending.items()):
            self._bad(pending.lineno, f"{len(pending.calls)} tool span(s) of {key} without their turn span "
                                      "(replayed as a turn of their own)", pending.path)
            yield self._orphan(key, pending)
        self._pending.clear()
        self._last_parent = None
        self._waiting = 0

    def _orphan(self, key: str, pending: _Pending) -> RecordedTurn:
        turn_id = key.partition(":")[2]
        facts = self._facts(turn_id, {}, pending.lineno, pending.path, None)
        facts["end_unknown"] = True  # without the turn span, the calls after the last one here are not known
        return _recorded_turn(turn_id, pending.calls, facts)

    def _bad(self, lineno: int, message: str, path: str | None = None) -> None:
        self.on_problem(InputProblem(self.path if path is None else path, lineno, message))

    def _span(self, span: Any, lineno: int) -> Any:
        if not isinstance(span, dict) or not isinstance(span.get("name"), str):
            self._bad(lineno, "span without a name")
            return None
        name = span["name"]
        attrs = attributes(span.get("attributes"))
        if names.CALL_INDEX in attrs:
            self._call(name, attrs.get(names.GEN_AI_TOOL_NAME), attrs[names.CALL_INDEX],
                       attrs.get(names.CALL_KEY_DIGEST), attrs.get(names.CALL_OUTCOME), attrs.get(names.TURN_ID),
                       span.get("parentSpanId"), lineno)
            return None
        if names.TURN_ID not in attrs:
            return None  # not one of turnguard's spans (the host's own, an HTTP client...)
        return self._turn_span(name, attrs, span.get("spanId"), span.get("startTimeUnixNano"),
                               span.get("endTimeUnixNano"), lineno, span.get("events"))

    def _turn_span(self, name: str, attrs: dict[str, Any], span_id: Any, start: Any, end: Any,
                   lineno: int, events: Any = None) -> Any:
        turn_id = attrs[names.TURN_ID]
        if not _short_text(turn_id) or not (span_id is None or _short_text(span_id)):
            self._bad(lineno, f"turn span {shown(name)}: {names.TURN_ID} and spanId must be texts of at most "
                              f"{MAX_ID_LENGTH} characters; skipped")
            return None
        own_key, child_key = f"turn:{turn_id}", f"span:{span_id}" if span_id else None
        own = self._pending.pop(own_key, None)
        children = self._pending.pop(child_key, None) if child_key else None
        self._last_parent = None
        self._waiting -= (len(own.calls) if own else 0) + (len(children.calls) if children else 0)
        facts = self._facts(turn_id, attrs, lineno, None, span_times(start, end))
        facts["continued"] = span_continued(events)
        if self.hold:
            self.emitted.append((own_key, child_key, len(own.calls) if own else 0,
                                 len(children.calls) if children else 0))
            return HeldTurn(turn_id, own.calls if own else [], children.calls if children else [], facts)
        calls = own.calls if own else []
        if children is not None:
            calls = calls + children.calls
        return _recorded_turn(turn_id, calls, facts)

    def _call(self, name: str, tool: Any, index: Any, digest: Any, raw_outcome: Any, turn_id: Any, parent: Any,
              lineno: int) -> None:
        """One tool span's fields (its attributes as read); reported and skipped when unusable."""
        tool = tool or name.removeprefix(names.OP_EXECUTE_TOOL).strip()
        outcome = span_outcome(raw_outcome)
        key = f"turn:{turn_id}" if turn_id else f"span:{parent}" if parent else None
        if not _usable_call(key, tool, index, digest, turn_id, parent, outcome):
            problem = _call_problem(key, tool, index, digest, turn_id, parent, raw_outcome, outcome)
            if problem:
                self._bad(lineno, f"tool span {name!r}: {problem}")
                return
        assert key is not None and isinstance(index, int) and outcome is not None  # (no problem above)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(self.path, lineno)
        if len(pending.calls) >= self.max_calls:
            self._bad(lineno, f"tool span {name!r}: its turn already has {self.max_calls:,} calls (the limit); skipped")
            return
        if len(self._tools) < MAX_SHARED_TOOLS:
            tool = self._tools.setdefault(tool, tool)
        pending.calls.append((index, tuple.__new__(RecordedCall, (tool, None, digest, outcome, *_CALL_DEFAULTS))))
        self._waiting += 1

    def _facts(self, turn_id: str, attrs: dict[str, Any], lineno: int, path: str | None,
               times: tuple[float, float] | None) -> dict[str, Any]:
        """What a turn span says about its turn (``RecordedTurn``'s fields but its calls),
        reported when out of range."""
        cycles = attrs.get(names.TURN_CYCLES)
        if cycles is not None and not _count_in_range(cycles, 0):
            self._bad(lineno, f"turn {shown(turn_id)}: {names.TURN_CYCLES} must be an integer from 0 to "
                              f"{MAX_TURN_CYCLES:,}, got {shown(cycles)} (replayed as one request)", path)
            cycles = None
        cohort = attrs.get(TURN_COHORT)
        return {
            "cycles": cycles,
            "resolved": span_resolved(attrs.get(TURN_RESOLVED)),
            "ended_by": span_ended_by(attrs),
            "source": _short_or_none(attrs.get(names.GEN_AI_AGENT_NAME)),
            "origin": f"{self.path if path is None else path}:{lineno}",
            "cohort": cohort if cohort in COHORTS else None,
            **span_facts(attrs, times),
        }

    # -- joining byte ranges read by worker processes (run.py) ------------------------------------

    def leftovers(self) -> list[tuple[str, str, int, list[tuple[int, RecordedCall]]]]:
        """With ``hold``, at the end of a range: the calls still waiting, by key, oldest key first."""
        return [(key, p.path, p.lineno, p.calls) for key, p in self._pending.items()]

    def take_range(self, emitted: Sequence[tuple[str, str | None, int, int]],
                   leftovers: Sequence[tuple[str, str, int, list[tuple[int, RecordedCall]]]], most_waiting: int
                   ) -> dict[int, tuple[list[tuple[int, RecordedCall]], list[tuple[int, RecordedCall]]]] | None:
        """Join a range that a holding assembler read (its ``emitted``, ``leftovers()`` and
        ``most_waiting``) to the stream read so far, as if this assembler had read it: the calls
        waiting here that its turn spans take (by position in ``emitted``: the calls under the turn
        id, then under the span id), its leftovers waiting on. ``None``, changing nothing, when
        reading it here could have given other turns: more calls would have waited than the bound
        at some point, or a turn would have reached its call limit; the caller then reads the
        range itself."""
        if not self._joins_alike(emitted, leftovers, most_waiting):
            return None
        stitched: dict[int, tuple[list[tuple[int, RecordedCall]], list[tuple[int, RecordedCall]]]] = {}
        self._last_parent = None
        for i, (own, child, _, _) in enumerate(emitted):
            own_before = self._pending.pop(own, None)
            children_before = self._pending.pop(child, None) if child is not None else None
            if own_before is not None or children_before is not None:
                stitched[i] = (own_before.calls if own_before else [], children_before.calls if children_before else [])
                self._waiting -= sum(len(p.calls) for p in (own_before, children_before) if p is not None)
        for key, path, lineno, calls in leftovers:
            mine = self._pending.get(key)
            if mine is None:
                self._pending[key] = _Pending(path, lineno, list(calls))
            else:
                mine.calls.extend(calls)
            self._waiting += len(calls)
        return stitched

    def _joins_alike(self, emitted: Sequence[tuple[str, str | None, int, int]],
                     leftovers: Sequence[tuple[str, str, int, list[tuple[int, RecordedCall]]]], most_waiting: int
                     ) -> bool:
        """Whether this assembler would have read the range alike: never more calls waiting than
        the bound, and no turn past its call limit with the calls waiting here added."""
        if self._waiting + most_waiting > self.max_waiting:
            return False
        taken: dict[str, int] = {}
        for own, child, n_own, n_children in emitted:
            for key, n in ((own, n_own), (child, n_children)):
                if key is not None and key in self._pending and key not in taken:
                    taken[key] = n
        if any(len(self._pending[key].calls) + n > self.max_calls for key, n in taken.items()):
            return False
        return not any(key in self._pending and key not in taken
                       and len(self._pending[key].calls) + len(calls) > self.max_calls
                       for key, _, _, calls in leftovers)


def _usable_call(key: str | None, tool: Any, index: Any, digest: Any, turn_id: Any, parent: Any,
                 outcome: Outcome | None) -> bool:
    """A shortcut for ``not _call_problem(...)``: every usual field in range (when not, the
    problem, if any, is worked out)."""
    return (type(index) is int and index >= 1 and type(tool) is str and 0 < len(tool) <= MAX_ID_LENGTH
            and type(digest) is str and 0 < len(digest) <= MAX_ID_LENGTH and outcome is not None and key is not None
            and (turn_id is None or _short_text(turn_id)) and (parent is None or _short_text(parent)))


def _call_problem(key: str | None, tool: Any, index: Any, digest: Any, turn_id: Any, parent: Any, raw_outcome: Any,
                  outcome: Outcome | None) -> str | None:
    """What makes a tool span unusable, the first thing of these; ``None``: nothing."""
    return (
        "neither a parentSpanId nor a turn id" if key is None
        else f"a tool name, digest, turn id or parentSpanId longer than {MAX_ID_LENGTH} characters"
        if not all(v is None or _short_text(v) for v in (tool, digest, turn_id, parent))
        else "no tool name" if not isinstance(tool, str) or not tool
        else f"{names.CALL_INDEX} is not a positive integer" if not isinstance(index, int) or index < 1
        else f"{names.CALL_KEY_DIGEST} missing" if not isinstance(digest, str) or not digest
        else f"unknown {names.CALL_OUTCOME} {raw_outcome!r}" if outcome is None
        else None
    )



def _short_text(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_ID_LENGTH


def _short_or_none(value: Any) -> str | None:
    return value if _short_text(value) else None


def span_ended_by(attrs: dict[str, Any]) -> str | None:
    """What ended the turn, as a recorder line says it: the threshold that halted it
    (``turnguard.loop.threshold``), else the reason it ended (``turnguard.turn.outcome``)."""
    threshold = _short_or_none(attrs.get(names.LOOP_THRESHOLD))
    if threshold and threshold != names.NO_THRESHOLD:
        return threshold
    return _short_or_none(attrs.get(names.TURN_OUTCOME))


SPAN_LIMITS = (("soft_cap", names.LOOP_SOFT_CAP), ("hard_cap", names.LOOP_HARD_CAP),
               ("stuck_repeat_threshold", names.POLICY_STUCK_REPEAT), ("streak_warn_at", names.POLICY_STREAK_WARN_AT),
               ("streak_stop_at", names.POLICY_STREAK_STOP_AT), ("max_cycles", names.POLICY_MAX_CYCLES))
"""``Limits`` fields and the turn span attributes that carry them."""


def span_times(start_ns: Any, end_ns: Any) -> tuple[float, float] | None:
    """A span's start and end, Unix seconds (OTLP JSON gives nanoseconds as decimal text)."""
    try:
        start, end = int(start_ns) / 1e9, int(end_ns) / 1e9
    except (TypeError, ValueError, OverflowError):
        return None
    return (start, end) if 0 < start <= end <= MAX_TIME else None


def span_continued(events: Any) -> bool:
    """Whether an attended ask of the turn was answered "continue": a ``turnguard.escalation_resolved``
    event among its turn span's ``events`` (the recorder line's ``escalations``)."""
    return isinstance(events, list) and any(
        isinstance(e, dict) and e.get("name") == names.ESCALATION_RESOLVED_EVENT
        and attributes(e.get("attributes")).get(names.ESCALATION_ANSWER) == "continue" for e in events)


def span_facts(attrs: dict[str, Any], times: tuple[float, float] | None) -> dict[str, Any]:
    """What a turn span says about how its turn ran (``RecordedTurn``'s policy, limits, times and
    true call count); an attribute out of range is left out."""
    facts: dict[str, Any] = {"policy": _short_or_none(attrs.get(names.POLICY))}
    mode = attrs.get(names.CAP_MODE)
    if mode in CAP_MODES:
        facts["limits"] = Limits(mode, **{key: _limit(attrs.get(attr)) for key, attr in SPAN_LIMITS})
    if times is not None:
        facts["started_at"], facts["ended_at"] = times
    facts["tool_calls"] = _limit(attrs.get(names.TURN_TOOL_CALLS))
    return facts


def span_listing(indexed: list[tuple[int, RecordedCall]], tool_calls: int | None) -> dict[str, Any]:
    """A turn's tool spans, sorted by ``turnguard.call.index``, as the ``RecordedTurn`` fields
    ``calls``, ``calls_dropped`` and ``calls_unrecorded``. The calls numbered 1, 2, ... without a
    gap are the turn's first ones, listed; from the first missing number (spans lost, sampled or
    past the per-turn bound) or the first number given twice (a retried request's calls: which
    one the turn kept is not recorded) on, the calls are dropped and counted with those the turn
    span counts past them (``tool_calls``): the recording stops there, as a recorder line's past
    10,000 calls. Without the turn's first call (a resumed turn's spans, or lost ones) every span
    is kept and the calls it lacks are unrecorded: the turn is recorded in part."""
    n = len(indexed)
    total = max(tool_calls or 0, indexed[-1][0] if indexed else 0)
    numbers = list(map(_INDEX, indexed))
    if not numbers or numbers[0] != 1:
        return {"calls": tuple(map(_CALL, indexed)), "calls_unrecorded": max(0, total - n)}
    if numbers == list(range(1, n + 1)):
        return {"calls": tuple(map(_CALL, indexed)), "calls_dropped": total - n}
    listed = next(i for i, number in enumerate(numbers) if number != i + 1)
    if numbers[listed] == listed:  # the number before is given twice: neither of its calls is known to be the turn's
        listed -= 1
    return {"calls": tuple(map(_CALL, indexed[:listed])), "calls_dropped": total - listed}


_CALL = operator.itemgetter(1)


def _limit(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_LIMIT else None


TURN_RESOLVED = "turnguard.turn.resolved"
"""The task result on a turn span: a boolean, or ``"true"`` / ``"false"`` / ``"unknown"``."""


def span_resolved(value: Any) -> bool | None:
    """A span's ``turnguard.turn.resolved``: ``True``/``False`` (or their strings), else unknown."""
    if isinstance(value, bool):
        return value
    return {"true": True, "false": False}.get(value) if isinstance(value, str) else None


TURN_COHORT = "turnguard.turn.cohort"
"""``"live"`` or ``"probe"`` on a turn span (any other value: not recorded)."""
