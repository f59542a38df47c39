"""The Collector's format: OTLP JSON, one ``{"resourceSpans": [...]}`` export batch per line,
turned back into turns by ``OtlpAssembler``.

With msgspec (the ``cli`` extra) a line is decoded into the few fields calibrate reads, and a tool
span's attributes as the plugin writes them are read by one match of ``TOOL_ATTRIBUTES``; any other
span, and any line msgspec might read otherwise than ``json``, goes through ``json``, which says
what is wrong. Both give the same turns (``tests/test_calibrate_span_decoding.py``)."""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnguard._calibrate.records import (
    CAP_MODES,
    MAX_LINE_BYTES,
    MAX_TIME,
    MAX_TURN_COUNT,
    MAX_TURN_CYCLES,
    OUTCOMES,
    InputProblem,
    Limits,
    ProblemSink,
    RecordedCall,
    RecordedTurn,
    Unreported,
    count_in_range,
    limit_value,
    parse_outcome,
    short_text,
    shown,
    turn_calls_limit,
    turn_count,
    turn_id_text,
    waiting_calls_limit,
)
from turnguard._guard import SUSPENDED
from turnguard._model import MAX_ID_LENGTH, Action, Outcome
from turnguard._probe import COHORTS
from turnguard.telemetry import _names as names
from turnguard.telemetry._recorder import HALTED_OUTCOME

try:
    import msgspec
    from msgspec import UnsetType
except ImportError:  # the library works without the cli extra: every line is read by the json module
    msgspec = None  # type: ignore[assignment]

UNSET: Any = getattr(msgspec, "UNSET", None)
AVAILABLE = msgspec is not None

if msgspec is not None:
    class Span(msgspec.Struct, gc=False):
        name: str
        spanId: str | None = None
        parentSpanId: str | None = None
        startTimeUnixNano: str | int | None = None
        endTimeUnixNano: str | int | None = None
        attributes: msgspec.Raw = msgspec.Raw(b"null")
        """Kept as its JSON text: read by ``TOOL_ATTRIBUTES``, else parsed by ``json``."""
        events: msgspec.Raw | UnsetType = UNSET
        """Kept as its JSON text, parsed only for a turn span (``events``)."""

    class ScopeSpans(msgspec.Struct, gc=False):
        spans: list[Span]

    class ResourceSpans(msgspec.Struct, gc=False):
        scopeSpans: list[ScopeSpans]

    class Document(msgspec.Struct, gc=False):
        """One Collector line: ``{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}``."""

        resourceSpans: list[ResourceSpans]

    _DECODER: Any = msgspec.json.Decoder(Document)
    _FAILED: tuple[type[BaseException], ...] = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def events(raw: Any) -> Any:
    """A decoded span's ``events`` as the plain reading gives them (``None`` when absent, or
    nested past what ``json`` reads here)."""
    if raw is UNSET:
        return None
    try:
        return json.loads(bytes(raw))
    except (ValueError, RecursionError):
        return None


DecodedSpan = tuple[Any, Any, Any]
"""``(span, attributes, found)``: a ``Span``, and either its attributes parsed by ``json`` with
``found`` ``None``, or ``None`` with ``found`` the match of ``TOOL_ATTRIBUTES``."""


def decode(line: bytes) -> list[DecodedSpan] | None:
    """The line's spans in order, or ``None`` where the ``json`` module might read the line
    otherwise: msgspec missing, text that is not UTF-8, a field of another type, ``NaN``, lone
    surrogates, a byte-order mark, nesting deeper than ``json`` reads (``agrees_on_depth``)."""
    if not _usable():
        return None
    if not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return _deeper(line, EXTRA_FRAMES)
    except _FAILED:
        return None


EXTRA_FRAMES = 8
"""Frames between ``decode`` and msgspec, so that where Python frames count against the
recursion limit msgspec gives up on nesting before ``json.loads`` in ``records.parse_line`` does."""


def _deeper(line: bytes, frames: int) -> Any:
    return _deeper(line, frames - 1) if frames else _spans(_DECODER.decode(line))


def _spans(document: Any) -> list[DecodedSpan]:
    """Every span of the document with its attributes read: by the template, else parsed (which
    may refuse the line, before any of its spans is used)."""
    match, parsed = _TOOL_MATCH, _parsed
    found: list[DecodedSpan] = []
    add = found.append
    for rs in document.resourceSpans:
        for ss in rs.scopeSpans:
            for span in ss.spans:
                raw = span.attributes
                m = match(raw)
                add((span, None, m) if m is not None else (span, parsed(raw), None))
    return found


def _parsed(raw: Any) -> Any:
    try:
        return json.loads(bytes(raw))
    except ValueError as exc:
        raise msgspec.DecodeError(str(exc)) from exc


def plain(decoded: DecodedSpan) -> dict[str, Any]:
    """A decoded span as the ``json`` module gives it, with the fields calibrate reads."""
    span, attributes, found = decoded
    return {"name": span.name, "attributes": attributes if found is None else json.loads(bytes(span.attributes)),
            "spanId": span.spanId, "parentSpanId": span.parentSpanId, "startTimeUnixNano": span.startTimeUnixNano,
            "endTimeUnixNano": span.endTimeUnixNano, "events": events(span.events)}


_TEXT = rb'([ !#-\[\]-~]{1,%d})' % MAX_ID_LENGTH
"""A JSON string's content without escapes, printable ASCII (so its length in bytes is its
length in characters), 1 to ``MAX_ID_LENGTH`` of them: the value as it reads."""


def _pair(key: str, value: bytes) -> bytes:
    return rb'\{"key":"' + re.escape(key.encode()) + rb'","value":\{' + value + rb'\}\}'


def _unread(key: str, value: bytes) -> bytes:
    """An attribute the plugin writes only when it says something (absent: its default), and that
    calibrate does not read: matched as it is written, taken by no group."""
    return rb"(?:," + _pair(key, value) + rb")?"


_COUNT = rb'"intValue":"[0-9]{1,18}"'
TOOL_ATTRIBUTES = re.compile(
    rb"\[" + _pair(names.CALL_INDEX, rb'"intValue":"([0-9]{1,18})"')
    + b"," + _pair(names.CALL_KEY_DIGEST, b'"stringValue":"' + _TEXT + b'"')
    + _unread(names.CALL_REPEAT, _COUNT) + _unread(names.STREAK_LENGTH, _COUNT)
    + rb"(?:," + _pair(names.CALL_CYCLE, rb'"intValue":"([0-9]{1,18})"') + rb")?"
    + rb"(?:," + _pair(names.CALL_RETRIES, rb'"intValue":"([0-9]{1,18})"') + rb")?"
    + b"," + _pair(names.GEN_AI_TOOL_NAME, b'"stringValue":"' + _TEXT + b'"')
    + b"," + _pair(names.GEN_AI_OPERATION_NAME, b'"stringValue":"' + re.escape(names.OP_EXECUTE_TOOL.encode()) + b'"')
    + b"," + _pair(names.CALL_OUTCOME, b'"stringValue":"([a-z]{1,16})"')
    + rb"(?:," + _pair(names.CALL_RESULT_DIGEST, b'"stringValue":"' + _TEXT + b'"') + rb")?"
    + _unread(names.FAILING_STREAK_LENGTH, _COUNT)
    + _unread(names.ERROR_TYPE, b'"stringValue":"' + re.escape(names.ERROR_TYPE_OTHER.encode()) + b'"')
    + rb"\]")
"""A tool span's attributes exactly as the plugin writes them and the file exporter prints them
(compact, in order, no escapes). Groups: index, key digest, model request or ``None``, retries or
``None``, tool name, outcome, result digest or ``None``. Anything else does not match and is parsed by ``json``."""
_TOOL_MATCH = TOOL_ATTRIBUTES.fullmatch


_checked: list[bool] = []


def _usable() -> bool:
    """msgspec is installed and gives up on nesting no later than ``json`` (checked once)."""
    if not _checked:
        _checked.append(AVAILABLE and agrees_on_depth())
    return _checked[0]


def agrees_on_depth() -> bool:
    """Whether ``json.loads``, called as the plain reading calls it, reads every nesting
    ``decode`` reads (found by bisection); if not, the fast path is not used."""
    for shape in (_nested_skipped, _nested_arrays):
        if _deepest(lambda line: _from_parse_line(line, 2), shape) < _deepest(_decodes, shape):
            return False
    return True


def _from_parse_line(line: bytes, frames: int) -> bool:
    """``json.loads`` of the line from as deep as the plain reading calls it (and a frame more)."""
    if frames:
        return _from_parse_line(line, frames - 1)
    try:
        json.loads(line)
    except RecursionError:
        return False
    return True


def _decodes(line: bytes) -> bool:
    try:
        return _deeper(line, EXTRA_FRAMES) is not None
    except _FAILED:
        return False


def _deepest(reads: Callable[[bytes], bool], shape: Callable[[int], bytes]) -> int:
    low, high = 1, 64
    while high < 1 << 20 and reads(shape(high)):
        low, high = high, high * 2
    while low < high:
        middle = (low + high + 1) // 2
        if reads(shape(middle)):
            low = middle
        else:
            high = middle - 1
    return low


def _nested_skipped(depth: int) -> bytes:
    """A span line whose one skipped field nests ``depth`` arrays."""
    return b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"x","x":' + b"[" * depth + b"]" * depth + b"}]}]}]}"


def _nested_arrays(depth: int) -> bytes:
    """A span line with an attribute of arrays in arrays ``depth`` deep."""
    inner = b'{"arrayValue":{"values":[' * depth + b'{"stringValue":"a"}' + b"]}}" * depth
    return (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"x","attributes":[{"key":"k","value":' + inner
            + b"}]}]}]}]}")


# -- attribute values, as the json module gives them ---------------------------------------------

MAX_ARRAY_DEPTH = 8
"""Arrays in arrays nested deeper than this read as ``None`` (no hostile value recurses further)."""


def attributes(items: Any) -> dict[str, Any]:
    """OTLP JSON ``[{"key": k, "value": {"stringValue": ...}}]`` as a plain dict (the last of
    duplicate keys wins; items that are not ``{"key": text, ...}`` are left out)."""
    out: dict[str, Any] = {}
    if not isinstance(items, list):
        return out
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            out[item["key"]] = any_value(item.get("value"))
    return out


@dataclass(frozen=True, slots=True)
class Mistyped:
    """An ``intValue`` or ``boolValue`` that is not of its OTLP type (``{"boolValue": "false"}``,
    ``{"intValue": 2.9}``, ``{"intValue": "abc"}``): never coerced, so no check accepts it; where
    a value is required or bounded it is a reported problem, elsewhere it reads as absent."""

    kind: str
    value: Any

    def __repr__(self) -> str:
        return f"{{{self.kind!r}: {shown(self.value)}}}"


def any_value(value: Any, depth: int = 0) -> Any:
    """An attribute's value: the first of its fields present, in this order (an ``intValue``
    or ``boolValue`` not of its type is ``Mistyped``; any other kind reads as ``None``)."""
    if not isinstance(value, dict):
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:  # int64 is a string in OTLP JSON (a JSON integer is read too)
        raw = value["intValue"]
        if type(raw) is int:
            return raw
        if type(raw) is str:
            try:
                return int(raw)
            except ValueError:
                pass
        return Mistyped("intValue", raw)
    if "boolValue" in value:
        raw = value["boolValue"]
        return raw if type(raw) is bool else Mistyped("boolValue", raw)
    if "doubleValue" in value:
        return value["doubleValue"]
    if "arrayValue" in value:
        return array_value(value["arrayValue"], depth)
    return None


def array_value(array: Any, depth: int = 0) -> list[Any] | None:
    """An ``arrayValue``: its ``values`` converted (an empty list without a list of them), or
    ``None`` past ``MAX_ARRAY_DEPTH`` levels of arrays in arrays."""
    if depth >= MAX_ARRAY_DEPTH:
        return None
    items = array.get("values") if isinstance(array, dict) else None
    return [any_value(v, depth + 1) for v in items] if isinstance(items, list) else []


# -- turns from spans -----------------------------------------------------------------------------

OTLP_MARKER = b'"resourceSpans"'
"""What every OTLP JSON line holds (and corpus lines practically never do)."""


def is_otlp_line(line: bytes) -> bool:
    """Cheap test used to route a line before parsing it (OTLP lines need the assembler)."""
    return OTLP_MARKER in line


# -- OTLP JSON (the Collector's file exporter) ----------------------------------------------------


_TurnSpan = tuple[str, dict[str, Any], Any, Any, Any, int, Any]
"""A turn span's fields as ``OtlpAssembler._turn_span`` takes them."""


@dataclass(slots=True)
class _Pending:
    path: str
    lineno: int
    calls: list[tuple[int, RecordedCall]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Open:
    """A turn whose turn span came before some of its tool spans may have (``awaited``): held, its
    calls taking the tool spans of the numbers it misses, until none is missing, the stream ends or
    the waiting bound releases it."""

    turn_id: str
    calls: list[tuple[int, RecordedCall]]
    facts: dict[str, Any]
    keys: tuple[str, ...]
    gaps: Gaps
    closed: bool = False

    def awaits(self, number: int) -> bool:
        have, low, top = self.gaps
        return low <= number and (top is None or number <= top) and number not in have

    def took(self, number: int) -> bool:
        """Note a call of an awaited number; whether the turn now misses none."""
        have, low, top = self.gaps
        have.add(number)
        return top is not None and len(have) > top - low


Gaps = tuple[set[int], int, "int | None"]
"""``(the numbers held from the lowest awaited on, the lowest awaited, the last)``; the last is
``None`` when the turn span ended before its turn did: any number it lacks may come."""


def awaited(numbers: Iterable[int], tool_calls: int | None, ended: bool, resumed: bool) -> Gaps | None:
    """What a turn span's tool spans leave to come, ``None`` when nothing: every number from 1 (a
    resumed turn's: from its first listed, the calls before the resume being another span's) to its
    count (``turnguard.turn.tool_calls``, else the last listed) is held. A turn span without
    ``turnguard.turn.outcome`` (a host's span ended before its turn) awaits any number it lacks."""
    have = set(numbers)
    if resumed and not have:
        return None
    low = min(have) if resumed else 1
    if not ended:
        return have, low, None
    top = tool_calls if tool_calls is not None else max(have, default=0)
    if have and (min(have) < low or max(have) > top):
        have = {n for n in have if low <= n <= top}
    return None if len(have) > top - low else (have, low, top)


Awaiting = tuple[list[int], "int | None", bool, bool]
"""A held turn span's call numbers read in its range, count, whether ended and resumed: what
``awaited`` judges again with the calls of earlier ranges added (``take_range``)."""
Emitted = tuple[str, "str | None", int, int, "Awaiting | None"]
"""Per turn span a holding assembler read: its keys, the calls that waited under each there, and
``Awaiting`` when its calls there leave numbers missing (``None``: none missing, none can be)."""


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


_SPAN_OUTCOMES: dict[str, Outcome | Unreported | None] = dict(OUTCOMES)
"""``turnguard.call.outcome`` texts read so far and what they mean (at most ``MAX_SHARED_TOOLS``)."""
_TEMPLATE_OUTCOMES = {text.encode(): outcome for text, outcome in OUTCOMES.items()}
"""The usual outcome texts as bytes (``OtlpAssembler._take_template``; another text takes the longer way)."""


_new_call = tuple.__new__


def span_outcome(raw: Any) -> Outcome | Unreported | None:
    """A tool span's ``turnguard.call.outcome`` (``unfinished``: ``UNFINISHED``, its turn ended
    before it); ``None``: not an outcome."""
    if type(raw) is str:
        found = _SPAN_OUTCOMES.get(raw, False)
        if found is not False:
            return found  # type: ignore[return-value]
    outcome = parse_outcome(raw)
    if type(raw) is str and len(_SPAN_OUTCOMES) < MAX_SHARED_TOOLS:
        _SPAN_OUTCOMES[raw] = outcome
    return outcome



class OtlpAssembler:
    """Rebuilds turns from turnguard's spans: the turn span (one with ``turnguard.turn.id``) and its
    tool spans (with ``turnguard.call.index``), linked by ``parentSpanId`` or a turn id of their own.

    Tool spans are exported before their turn span, or in the same line (a line's turn spans close
    after all its spans are taken): their calls wait here, at most
    ``MAX_WAITING_CALLS``, until it comes; one assembler reads a rotated stream in order, so a turn
    straddling a rotation is one turn. Calls whose turn span never comes are reported and replayed as
    a turn of their own. A turn span whose calls leave numbers missing (``awaited``) is held open,
    counted against the same bound, for tool spans of later lines (``_Open``). With ``hold`` (a
    worker reading a byte range), a turn span gives a ``HeldTurn``, and ``emitted`` /
    ``leftovers()`` let the parent join the ranges (``take_range``)."""

    def __init__(self, on_problem: ProblemSink, path: str = "", *, max_line_bytes: int = MAX_LINE_BYTES,
                 hold: bool = False) -> None:
        self.path = path
        self.on_problem = on_problem
        self.max_waiting = waiting_calls_limit(max_line_bytes)
        self.max_calls = turn_calls_limit(max_line_bytes)
        self._tools: dict[str, str] = {}
        """Tool names seen, each kept once (a waiting call holds the shared text)."""
        self._pending: dict[str, _Pending] = {}
        self._open: dict[str, _Open] = {}
        """Turns held for tool spans of later lines (``awaited``), under each of their keys."""
        self._done: list[_Open] = []
        """Open turns that miss nothing any more (or another turn span of their key came): given at the
        end of the line."""
        self._waiting = 0
        self.hold = hold
        self.emitted: list[Emitted] = []
        """With ``hold``: per turn span, its keys, how many calls waited under each here, and what it
        awaits when its calls here leave numbers missing (``Awaiting``)."""
        self.most_waiting = 0
        """With ``hold``: the most calls that waited at once after a span."""
        self.released = False
        """A turn was released because too many calls waited (``_release_oldest``)."""
        self._last_parent: str | None = None
        """The parent of the last call held (``_take_template``), whose calls are ``_last_calls``: the
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
        closing: list[_TurnSpan] = []
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
                    turn_span = self._span(span, lineno)
                    if turn_span is not None:
                        closing.append(turn_span)
                    if self._waiting > self.most_waiting and self._most_waiting():
                        yield self._release_oldest()
        yield from self._line_end(closing)

    def add_decoded(self, spans: list[DecodedSpan], lineno: int) -> Iterator[Any]:
        """``add`` for a line decoded by ``decode``: template-matched tool spans are taken directly,
        any other span is read as ``add`` reads it."""
        template, siblings = self._take_template, self._take_siblings
        closing: list[_TurnSpan] = []
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
                turn_span = self._span(plain(decoded), lineno)
                if turn_span is not None:
                    closing.append(turn_span)
            if self._waiting > self.most_waiting and self._most_waiting():
                yield self._release_oldest()
        yield from self._line_end(closing)

    def _line_end(self, closing: list[_TurnSpan]) -> Iterator[Any]:
        """What a line completes: its turn spans' turns, then any turn the line's spans complete."""
        yield from self._close_turns(closing)
        if self._done:
            yield from self._completed()

    def _close_turns(self, closing: list[_TurnSpan]) -> Iterator[Any]:
        """The turns of a line's turn spans, closed once every span of the line is taken: the
        exporter groups a batch by instrumentation scope, so a host's turn span may come before
        turnguard's tool spans in the same line."""
        for turn_span in closing:
            turn = self._turn_span(*turn_span)
            if turn is not None:
                yield turn
            elif self._waiting > self.most_waiting and self._most_waiting():
                yield self._release_oldest()

    def _completed(self) -> Iterator[RecordedTurn]:
        """The open turns done in this line, in the order they came to miss nothing."""
        done, self._done = self._done, []
        for held in done:
            if not held.closed:
                yield self._close_open(held)

    def _open_turn(self, held: _Open) -> None:
        """Hold a turn for tool spans of later lines; an open turn of one of its keys is done (a
        second reading of the turn, a copy, takes that key's spans from here on)."""
        for key in held.keys:
            older = self._open.get(key)
            if older is not None and older not in self._done:
                self._done.append(older)
        for key in held.keys:
            self._open[key] = held
        self._waiting += 1 + len(held.calls)

    def _close_open(self, held: _Open) -> RecordedTurn:
        held.closed = True
        for key in held.keys:
            if self._open.get(key) is held:
                del self._open[key]
        self._waiting -= 1 + len(held.calls)
        self._last_parent = None
        return _recorded_turn(held.turn_id, held.calls, held.facts)

    def _take_siblings(self, spans: list[DecodedSpan], i: int) -> tuple[int, bool]:
        """Take the template-matched siblings of the last call held from ``spans[i]`` on, in one
        loop: ``(the first span not taken, whether the waiting bound now releases a turn)``."""
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
            index, digest, cycle, retries, raw_tool, text, result = found.groups()
            outcome, tool, number = _TEMPLATE_OUTCOMES.get(text), tools.get(raw_tool), int(index)
            if outcome is None or tool is None or not 0 < number <= MAX_TURN_COUNT or len(calls) >= limit or (
                    cycle is not None and not 0 < int(cycle) <= MAX_TURN_CYCLES) or (
                    retries is not None and int(retries) > MAX_TURN_COUNT):
                break
            calls.append((number, _new_call(RecordedCall, (tool, None, digest.decode(), outcome, cycle and int(cycle),
                                                           result and result.decode(), int(retries or 0)))))
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
        """Take a template-matched tool span with the checks ``_call`` makes (``False``: not taken,
        nothing changed; ``_span`` then reads it and says what is wrong)."""
        index, digest, raw_cycle, raw_retries, raw_tool, text, raw_result = found.groups()
        outcome, number, cycle = _TEMPLATE_OUTCOMES.get(text), int(index), raw_cycle and int(raw_cycle)
        retries = int(raw_retries or 0)
        if outcome is None or not parent or len(parent) > MAX_ID_LENGTH or not 0 < number <= MAX_TURN_COUNT or (
                cycle is not None and not 0 < cycle <= MAX_TURN_CYCLES) or retries > MAX_TURN_COUNT:
            return False
        tool = self._tool_texts.get(raw_tool)
        if tool is None:
            tool = raw_tool.decode()
            if len(self._tool_texts) < MAX_SHARED_TOOLS:
                self._tool_texts[raw_tool] = tool
        key = "span:" + parent
        calls = self._hold(key, number, tool, digest.decode(), outcome, raw_result and raw_result.decode(), lineno,
                           cycle, retries)
        if calls is None:
            return False
        if self._open and key in self._open and key not in self._pending:  # an open turn's: each number checked
            self._last_parent = None
        else:
            self._last_parent, self._last_calls = parent, calls
        return True

    def _hold(self, key: str, number: int, tool: str, digest: str, outcome: Outcome | Unreported, result: str | None,
              lineno: int, cycle: int | None = None, retries: int = 0) -> list[tuple[int, RecordedCall]] | None:
        """Hold a checked tool span's call under ``key`` for its turn span, or give it to the open
        turn of the key that awaits its number: the calls held there (``None``: the turn's bound
        refuses it, nothing changed)."""
        pending: _Pending | _Open | None = self._pending.get(key)
        if pending is None:
            held = self._open.get(key) if self._open else None
            if held is not None and held.awaits(number):
                if len(held.calls) >= self.max_calls:
                    return None
                pending = held
                if held.took(number):
                    self._done.append(held)
            else:
                pending = self._pending[key] = _Pending(self.path, lineno)
        elif len(pending.calls) >= self.max_calls:
            return None
        tools = self._tools
        shared = tools.get(tool)
        if shared is not None:
            tool = shared
        elif len(tools) < MAX_SHARED_TOOLS:
            tools[tool] = tool
        pending.calls.append((number, _new_call(RecordedCall, (tool, None, digest, outcome, cycle, result, retries))))
        self._waiting += 1
        return pending.calls

    def _most_waiting(self) -> bool:
        """Note a new most of waiting calls; ``True`` when past the bound (the oldest is released)."""
        self.most_waiting = self._waiting
        return self._waiting > self.max_waiting

    def _release_oldest(self) -> RecordedTurn:
        """The turn given up on: the oldest open one (it has its turn span), else the oldest calls
        waiting for theirs (reported)."""
        self.released = True
        if self._open:
            self.most_waiting = min(self.most_waiting, self.max_waiting)
            return self._close_open(next(iter(self._open.values())))
        key, pending = next(iter(self._pending.items()))
        del self._pending[key]
        self._last_parent = None
        self._waiting -= len(pending.calls)
        self.most_waiting = min(self.most_waiting, self.max_waiting)  # past it, every span checks the bound
        self._bad(pending.lineno, f"{len(pending.calls)} tool span(s) of {key} waited longest while more than "
                                  f"{self.max_waiting:,} waited for their turn spans (replayed as a turn of "
                                  "their own)", pending.path)
        return self._orphan(key, pending)

    def finish(self) -> Iterator[RecordedTurn]:
        """End of the stream: the open turns, then the calls whose turn span never came (reported and
        still replayed)."""
        for held in list(dict.fromkeys(self._open.values())):
            if not held.closed:
                yield self._close_open(held)
        self._done.clear()
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

    def _span(self, span: Any, lineno: int) -> _TurnSpan | None:
        """Take a tool span; a turn span is returned, to be closed at the end of its line."""
        if not isinstance(span, dict) or not isinstance(span.get("name"), str):
            self._bad(lineno, "span without a name")
            return None
        name = span["name"]
        attrs = attributes(span.get("attributes"))
        if names.CALL_INDEX in attrs:
            self._call(name, attrs.get(names.GEN_AI_TOOL_NAME), attrs[names.CALL_INDEX],
                       attrs.get(names.CALL_KEY_DIGEST), call_outcome(attrs), attrs.get(names.TURN_ID),
                       span.get("parentSpanId"), lineno, attrs.get(names.CALL_RESULT_DIGEST),
                       attrs.get(names.CALL_CYCLE), attrs.get(names.CALL_RETRIES, 0))
            return None
        if names.TURN_ID not in attrs:
            return None  # not one of turnguard's spans (the host's own, an HTTP client...)
        return (name, attrs, span.get("spanId"), span.get("startTimeUnixNano"), span.get("endTimeUnixNano"), lineno,
                span.get("events"))

    def _turn_span(self, name: str, attrs: dict[str, Any], span_id: Any, start: Any, end: Any,
                   lineno: int, events: Any = None) -> Any:
        turn_id = turn_id_text(attrs[names.TURN_ID])
        if turn_id is None or not (span_id is None or short_text(span_id)):
            self._bad(lineno, f"turn span {shown(name)}: {names.TURN_ID} (a text or an integer) and spanId must be "
                              f"of at most {MAX_ID_LENGTH} characters; skipped")
            return None
        own_key, child_key = f"turn:{turn_id}", f"span:{span_id}" if span_id else None
        own = self._pending.pop(own_key, None)
        children = self._pending.pop(child_key, None) if child_key else None
        self._last_parent = None
        self._waiting -= (len(own.calls) if own else 0) + (len(children.calls) if children else 0)
        facts = self._facts(turn_id, attrs, lineno, None, span_times(start, end))
        facts["continued"] = span_continued(events)
        calls = own.calls if own else []
        if children is not None:
            calls = calls + children.calls
        awaits = (facts["tool_calls"], names.TURN_OUTCOME in attrs, names.TURN_RESUMED_FROM in attrs)
        gaps = awaited(map(_INDEX, calls), *awaits)
        if self.hold:
            self.emitted.append((own_key, child_key, len(own.calls) if own else 0,
                                 len(children.calls) if children else 0,
                                 None if gaps is None else (list(map(_INDEX, calls)), *awaits)))
            return HeldTurn(turn_id, own.calls if own else [], children.calls if children else [], facts)
        if gaps is not None:
            self._open_turn(_Open(turn_id, calls, facts, (own_key,) if child_key is None else (own_key, child_key),
                                  gaps))
            return None
        return _recorded_turn(turn_id, calls, facts)

    def _call(self, name: str, tool: Any, index: Any, digest: Any, raw_outcome: Any, turn_id: Any, parent: Any,
              lineno: int, result: Any = None, cycle: Any = None, retries: Any = 0) -> None:
        """One tool span's fields (its attributes as read); reported and skipped when unusable (a
        model request number out of range: reported and left out, the call kept). A turn id of its
        own links it whatever its text (``""`` too); an empty ``parentSpanId`` is OTLP's "no parent"."""
        if tool is None:
            tool = name.removeprefix(names.OP_EXECUTE_TOOL).strip()
        outcome = span_outcome(raw_outcome)
        own_id = turn_id_text(turn_id)
        key = (f"turn:{own_id}" if own_id is not None else None if turn_id is not None
               else f"span:{parent}" if parent else None)
        problem = _call_problem(key, tool, index, digest, turn_id, parent, raw_outcome, outcome, result)
        if problem:
            self._bad(lineno, f"tool span {name!r}: {problem}")
            return
        assert key is not None and type(index) is int and outcome is not None  # (no problem above)
        if cycle is not None and not count_in_range(cycle, 1):
            self._bad(lineno, f"tool span {name!r}: {names.CALL_CYCLE} must be an integer from 1 to "
                              f"{MAX_TURN_CYCLES:,}, got {shown(cycle)}; left out")
            cycle = None
        if not turn_count(retries):
            self._bad(lineno, f"tool span {name!r}: {names.CALL_RETRIES} must be a whole number from 0 to "
                              f"{MAX_TURN_COUNT:,}, got {shown(retries)}; read as 0")
            retries = 0
        if self._hold(key, index, tool, digest, outcome, result, lineno, cycle, retries) is None:
            self._bad(lineno, f"tool span {name!r}: its turn already has {self.max_calls:,} calls (the limit); skipped")

    def _facts(self, turn_id: str, attrs: dict[str, Any], lineno: int, path: str | None,
               times: tuple[float, float] | None) -> dict[str, Any]:
        """What a turn span says about its turn (``RecordedTurn``'s fields but its calls),
        reported when out of range."""
        cycles = attrs.get(names.TURN_CYCLES)
        if cycles is not None and not count_in_range(cycles, 0):
            self._bad(lineno, f"turn {shown(turn_id)}: {names.TURN_CYCLES} must be an integer from 0 to "
                              f"{MAX_TURN_CYCLES:,}, got {shown(cycles)} (replayed as one request)", path)
            cycles = None
        tool_calls = attrs.get(names.TURN_TOOL_CALLS)
        if tool_calls is not None and not turn_count(tool_calls):
            self._bad(lineno, f"turn {shown(turn_id)}: {names.TURN_TOOL_CALLS} must be a whole number from 0 to "
                              f"{MAX_TURN_COUNT:,}, got {shown(tool_calls)}; left out", path)
        resolved = attrs.get(names.TURN_RESOLVED)
        if not resolved_readable(resolved):
            self._bad(lineno, f"turn {shown(turn_id)}: {names.TURN_RESOLVED} must be {RESOLVED_VALUES}, got "
                              f"{shown(resolved)} (read as unknown)", path)
        cohort = attrs.get(names.TURN_COHORT)
        return {
            "cycles": cycles,
            "resolved": span_resolved(resolved),
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

    def take_range(self, emitted: Sequence[Emitted],
                   leftovers: Sequence[tuple[str, str, int, list[tuple[int, RecordedCall]]]], most_waiting: int
                   ) -> dict[int, tuple[list[tuple[int, RecordedCall]], list[tuple[int, RecordedCall]]]] | None:
        """Join a range a holding assembler read to the stream read so far, as if read here: the
        waiting calls its turn spans take (by position in ``emitted``), its leftovers waiting on.
        ``None``, changing nothing, when reading it here could have given other turns (the waiting bound
        or a turn's call limit reached, a turn held open: ``_awaits_none``); the caller then reads the
        range itself."""
        if not self._joins_alike(emitted, leftovers, most_waiting):
            return None
        stitched: dict[int, tuple[list[tuple[int, RecordedCall]], list[tuple[int, RecordedCall]]]] = {}
        self._last_parent = None
        for i, (own, child, *_) in enumerate(emitted):
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

    def _joins_alike(self, emitted: Sequence[Emitted],
                     leftovers: Sequence[tuple[str, str, int, list[tuple[int, RecordedCall]]]], most_waiting: int
                     ) -> bool:
        """Whether this assembler would have read the range alike: never more calls waiting than
        the bound, and no turn past its call limit with the calls waiting here added."""
        if self._waiting + most_waiting > self.max_waiting or not self._awaits_none(emitted, leftovers):
            return False
        taken: dict[str, int] = {}
        for own, child, n_own, n_children, _ in emitted:
            for key, n in ((own, n_own), (child, n_children)):
                if key is not None and key in self._pending and key not in taken:
                    taken[key] = n
        if any(len(self._pending[key].calls) + n > self.max_calls for key, n in taken.items()):
            return False
        return not any(key in self._pending and key not in taken
                       and len(self._pending[key].calls) + len(calls) > self.max_calls
                       for key, _, _, calls in leftovers)

    def _awaits_none(self, emitted: Sequence[Emitted],
                     leftovers: Sequence[tuple[str, str, int, list[tuple[int, RecordedCall]]]]) -> bool:
        """Whether reading the range here would hold no turn open and give none held open a call:
        no key of its is an open turn's, and each turn span whose calls there leave numbers missing
        misses none with the calls waiting here for it."""
        if self._open and any(key in self._open for e in emitted for key in e[:2] if key is not None):
            return False
        if self._open and any(key in self._open for key, *_ in leftovers):
            return False
        taken: set[str] = set()
        for own, child, _, _, awaiting in emitted:
            keys = [key for key in (own, child) if key is not None and key in self._pending and key not in taken]
            taken.update(keys)
            if awaiting is not None:
                numbers, tool_calls, ended, resumed = awaiting
                before = [number for key in keys for number, _ in self._pending[key].calls]
                if awaited([*before, *numbers], tool_calls, ended, resumed) is not None:
                    return False
        return True


_HALT = names.ACTION_LABELS[Action.HALT]


def call_outcome(attrs: dict[str, Any]) -> Any:
    """A tool span's recorded outcome: a call its check halted ends its span without one
    (``turnguard.verdict.action`` ``halt``), and reads as the recorder lists it (``HALTED_OUTCOME``)."""
    raw = attrs.get(names.CALL_OUTCOME)
    return HALTED_OUTCOME if raw is None and attrs.get(names.VERDICT_ACTION) == _HALT else raw


def _call_problem(key: str | None, tool: Any, index: Any, digest: Any, turn_id: Any, parent: Any, raw_outcome: Any,
                  outcome: Outcome | Unreported | None, result: Any = None) -> str | None:
    """What makes a tool span unusable, the first thing of these; ``None``: nothing."""
    return (
        f"a turn id (a text or an integer) of at most {MAX_ID_LENGTH} characters expected, got {shown(turn_id)}"
        if turn_id is not None and turn_id_text(turn_id) is None
        else "neither a parentSpanId nor a turn id" if key is None
        else f"a tool name, digest or parentSpanId longer than {MAX_ID_LENGTH} characters"
        if not all(v is None or short_text(v) for v in (tool, digest, parent))
        else "no tool name" if not isinstance(tool, str) or not tool
        else f"{names.CALL_INDEX} must be a whole number from 1 to {MAX_TURN_COUNT:,}, got {shown(index)}"
        if type(index) is not int or not 0 < index <= MAX_TURN_COUNT
        else f"{names.CALL_KEY_DIGEST} missing" if not isinstance(digest, str) or not digest
        else f"unknown {names.CALL_OUTCOME} {raw_outcome!r}" if outcome is None
        else f"{names.CALL_RESULT_DIGEST} must be a text of at most {MAX_ID_LENGTH} characters, got {shown(result)}"
        if not (result is None or short_text(result))
        else None
    )


def _short_or_none(value: Any) -> str | None:
    return value if short_text(value) else None


def span_ended_by(attrs: dict[str, Any]) -> str | None:
    """What ended the turn, as a recorder line says it: the threshold that halted it
    (``turnguard.loop.threshold``), else the reason it ended (``turnguard.turn.outcome``). A span
    ending a part put aside (``suspended``) says so whatever halt the turn had latched: the part is
    not a turn, and the span of the part that ends the turn says how it ended."""
    outcome = _short_or_none(attrs.get(names.TURN_OUTCOME))
    if outcome == SUSPENDED:
        return outcome
    threshold = _short_or_none(attrs.get(names.LOOP_THRESHOLD))
    if threshold and threshold != names.NO_THRESHOLD:
        return threshold
    return outcome


SPAN_LIMITS = (("soft_cap", names.LOOP_SOFT_CAP), ("hard_cap", names.LOOP_HARD_CAP),
               ("stuck_repeat_threshold", names.POLICY_STUCK_REPEAT), ("streak_warn_at", names.POLICY_STREAK_WARN_AT),
               ("streak_stop_at", names.POLICY_STREAK_STOP_AT), ("max_cycles", names.POLICY_MAX_CYCLES),
               ("stateful_tools", names.POLICY_STATEFUL_TOOLS),
               ("streak_exempt_tools", names.POLICY_STREAK_EXEMPT_TOOLS),
               ("stuck_signal", names.POLICY_STUCK_SIGNAL), ("streak_stop_on", names.POLICY_STREAK_STOP_ON),
               ("cycle_repeat_warn_at", names.POLICY_CYCLE_REPEAT_WARN_AT),
               ("cycle_repeat_stop_at", names.POLICY_CYCLE_REPEAT_STOP_AT),
               ("cycle_repeat_max_period", names.POLICY_CYCLE_REPEAT_MAX_PERIOD),
               ("remind_model", names.POLICY_REMIND_MODEL), ("max_tracked_keys", names.POLICY_MAX_TRACKED_KEYS),
               ("disabled_policies", names.POLICY_DISABLED))
"""``Limits``' fields other than the cap mode, and the turn span attributes that carry them."""


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
        facts["limits"] = Limits(mode, **{key: _limit(key, attrs.get(attr)) for key, attr in SPAN_LIMITS})
    if times is not None:
        facts["started_at"], facts["ended_at"] = times
    tool_calls = attrs.get(names.TURN_TOOL_CALLS)
    facts["tool_calls"] = tool_calls if turn_count(tool_calls) else None
    return facts


def span_listing(indexed: list[tuple[int, RecordedCall]], tool_calls: int | None) -> dict[str, Any]:
    """A turn's tool spans sorted by index, as ``calls``, ``calls_dropped`` and ``calls_unrecorded``:
    the calls numbered 1, 2, ... are listed; from the first gap or repeated number on, the calls
    are dropped (counted, as a recorder line's past 10,000 calls). Without call 1 every span is kept
    and the calls missing are unrecorded (the turn is recorded in part). The calls a ``retry()``
    rolled back are left out first (``_kept``)."""
    past_count = tool_calls is not None and bool(indexed) and indexed[-1][0] > tool_calls
    if past_count or any(map(_RETRIES, map(_CALL, indexed))):
        indexed = _kept(indexed, tool_calls)
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
_RETRIES = operator.itemgetter(6)  # RecordedCall.retries


def _kept(indexed: list[tuple[int, RecordedCall]], tool_calls: int | None) -> list[tuple[int, RecordedCall]]:
    """The calls of a turn with ``retry()`` calls, without those a retry rolled back: a retry takes
    the count back, so the request's re-sent calls have the rolled-back calls' numbers and more
    retries before them; of the spans of one number, the latest (most retries) is the turn's, and
    past the turn's final count (``turnguard.turn.tool_calls``) none is (a request rolled back
    and not re-sent before the turn ended)."""
    latest: dict[int, tuple[int, RecordedCall]] = {}
    for number, call in indexed:
        held = latest.get(number)
        if held is None or call.retries > held[1].retries:
            latest[number] = (number, call)
        elif call.retries == held[1].retries:
            return indexed  # two spans of one number and one retry count: read as without retries
    kept = [latest[number] for number in sorted(latest)]
    return kept if tool_calls is None else [item for item in kept if item[0] <= tool_calls]


def _limit(key: str, value: Any) -> Any:
    """A turn span's limit, ``None`` when it is absent or malformed (left out, as an older span's)."""
    try:
        return limit_value(key, value)
    except ValueError:
        return None


RESOLVED_VALUES = "a boolean or 'true', 'false' or 'unknown'"
_RESOLVED_TEXTS = {"true": True, "false": False, "unknown": None}


def span_resolved(value: Any) -> bool | None:
    """A span's ``turnguard.turn.resolved``: ``True``/``False`` (or their strings), else unknown."""
    if type(value) is bool:
        return value
    return _RESOLVED_TEXTS.get(value) if type(value) is str else None


def resolved_readable(value: Any) -> bool:
    """Whether a ``turnguard.turn.resolved`` is absent or one of ``RESOLVED_VALUES`` (anything
    else, a ``{"boolValue": "false"}`` included, is a reported problem, read as unknown)."""
    return value is None or type(value) is bool or (type(value) is str and value in _RESOLVED_TEXTS)
