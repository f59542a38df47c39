"""The fast reading of the Collector's span lines: msgspec's typed JSON decoder, when installed.

A Collector line holds one export batch (hundreds of spans of about 600 bytes each), and of each
span calibrate reads a few fields and attributes. The standard ``json`` module builds every object
of the line as a dict; msgspec (the ``cli`` extra) decodes straight into the few typed fields
declared here and skips the rest (ids, times, links, resources; a span's events are kept as their
JSON text, parsed for turn spans only) without building them:
about three times less work per span. A span's attributes are kept as their JSON text too: a tool
span's, as the plugin writes them, are read by one match of ``TOOL_ATTRIBUTES`` (no object per
attribute); any others (turn spans, tool spans of another layout) are parsed by ``json`` before
the line is used, and read as the plain reading reads them.

It is a fast path, never a second reading: ``decode`` gives the document only for a line whose
every field read has the type the plain reading expects and whose JSON the ``json`` module reads
identically; anything else (a field of another type, JSON that ``json`` would refuse or read
differently) gives ``None``, and the line is read by the plain path, which says what is wrong with
it. What each side gives is compared on random and hostile lines in
``tests/test_calibrate_span_decoding.py``.
Without msgspec, ``AVAILABLE`` is false and every line takes the plain path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from turnguard.model import MAX_ID_LENGTH
from turnguard.telemetry import names

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
    """The line's spans in order (``DecodedSpan``), or ``None``: msgspec missing, a field read of a type the plain
    reading would treat otherwise, or JSON that the ``json`` module might read differently.

    What is refused before decoding: text that is not UTF-8 (msgspec does not check the strings
    it skips; ``json`` refuses the line). What msgspec refuses itself, and ``json`` would still
    read: ``NaN``/``Infinity``, numbers out of a float's range, lone surrogates in escapes, a
    byte-order mark. Nesting: msgspec is called ``EXTRA_FRAMES`` frames deeper than ``json`` is,
    so it gives up on deep nesting first (``agrees_on_depth``). Both keep the last of duplicate
    keys."""
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
"""Python frames between ``decode`` and msgspec: where Python frames count against the recursion
limit (CPython 3.11), this leaves msgspec fewer levels of nesting than ``json.loads`` gets from
the plain reading's call (``inputs.parse_line``, three frames of its own)."""


def _deeper(line: bytes, frames: int) -> Any:
    return _deeper(line, frames - 1) if frames else _spans(_DECODER.decode(line))


def _spans(document: Any) -> list[DecodedSpan]:
    """Every span of the document with its attributes read: by the template, else parsed (which
    may refuse the line, before any of its spans is used)."""
    match, typed = _TOOL_MATCH, _parsed
    found: list[DecodedSpan] = []
    add = found.append
    for rs in document.resourceSpans:
        for ss in rs.scopeSpans:
            for span in ss.spans:
                raw = span.attributes
                m = match(raw)
                add((span, None, m) if m is not None else (span, typed(raw), None))
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
    + b"," + _pair(names.GEN_AI_TOOL_NAME, b'"stringValue":"' + _TEXT + b'"')
    + b"," + _pair(names.GEN_AI_OPERATION_NAME, b'"stringValue":"' + re.escape(names.OP_EXECUTE_TOOL.encode()) + b'"')
    + b"," + _pair(names.CALL_OUTCOME, b'"stringValue":"([a-z]{1,16})"')
    + _unread(names.FAILING_STREAK_LENGTH, _COUNT)
    + _unread(names.ERROR_TYPE, b'"stringValue":"' + re.escape(names.ERROR_TYPE_OTHER.encode()) + b'"')
    + rb"\]")
"""A tool span's attributes exactly as turnguard's plugin writes them and the Collector's file
exporter prints them (compact, in this order, no escapes): the index, the key digest, the repeat
and streak counts when past 1, the tool name, the operation, the outcome, and for a failed call
its failing streak and ``error.type``. Groups: the index's digits, the key digest, the tool name,
the outcome's text (the counts and the error type are not read). Anything else (escapes,
non-ASCII, whitespace, other or more attributes, another order, other types) does not match and
is parsed by ``json``."""
_TOOL_MATCH = TOOL_ATTRIBUTES.fullmatch


_checked: list[bool] = []


def _usable() -> bool:
    """msgspec is installed and gives up on nesting no later than ``json`` (checked once)."""
    if not _checked:
        _checked.append(AVAILABLE and agrees_on_depth())
    return _checked[0]


def agrees_on_depth() -> bool:
    """Whether every nesting ``decode`` reads, ``json.loads`` reads too, called as the plain
    reading calls it: the deepest line each reads, found by bisection (a few milliseconds). When
    not (another interpreter's recursion accounting), the fast path is not used."""
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
