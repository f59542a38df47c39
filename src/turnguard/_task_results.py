"""Task results: whether a turn's task succeeded, reported by the host during or after the turn,
in this process or in any other.

``turn.report_result(resolved)`` before the turn ends, ``guard.report_result(turn_id, resolved)``
afterwards (a thumbs-up, a CI run an hour later). A late result needs the turn it is about, so
the guard remembers its recently ended turns here (``ResultBook``): at most ``MAX_RECENT_TURNS``
(then the oldest is forgotten, as *expired*), and the ids of at most as many expired ones (then
they are *unknown*). A turn id counts by its text (``model.id_text``: ``12345`` is ``"12345"``),
exactly: one longer than ``MAX_ID_LENGTH`` characters is kept as a 16-byte digest of it. What the
book keeps of a turn is bounded whatever the host's ids and names (``kept_summary``: each cut to
``MAX_ID_LENGTH`` characters, as exported text is), so an entry is a few hundred bytes, about 5 kB
when the turn id, conversation id, agent name and end reason are each a mebibyte, and under 20 kB
whatever the summary holds. The first result for a turn stands: the book also remembers an 8-byte
digest of each turn id that got a result (``Remembered``: at least the last
``MAX_REMEMBERED_RESULTS``), so a second one is *duplicate* long after the turn was forgotten.

A result from another process comes with the turn's *result token* (``turn.result_token``,
``result_token``): a short ASCII string holding the turn id and the labels its late result is
reported with (``ResultLabels``), so any guard can report it as the turn's own guard would. Every
report gets a ``ResultStatus``; only ``ACCEPTED`` changes anything, the others are counted and
ignored, never raised: a report's id and token are untrusted input. A token's result never enters
the book of this process's own turns (so no number of tokens pushes one of them out): the turn is
remembered by its digest alone, apart from the host's own results (``Remembered``, one for each).
A token naming a turn in the book is that turn's only when it is the very token the turn has.

The token, version 2: ``tg2.<turn id>.<cohort>.<policy>.<tool calls>.<edge S>.<edge H>.
<max repeat>.<max failing streak>.<threshold>.<reason>.<agent>.<main threshold>.<check>``;
version 1 (``tg1``, without the two counts) is still taken, its counts unknown (``None``). Each
text field keeps ``A-Z a-z 0-9 _ -`` and writes every other character as ``%XX`` per UTF-8 byte
(a lone surrogate as its three bytes, so every id comes back exactly); an empty field is "none",
``~`` the empty string and ``*`` a label that did not fit. ``edge S`` / ``edge H`` are the soft
cap and backstop the turn's histogram edges come from (its call bucket is computed from them, so
it is the bucket the turn's own guard reports). ``max repeat`` and ``max failing streak`` are the
turn's largest repeat count of one call and longest failing identical-call streak, so that the
threshold board can place a late result against D and the streak stop (in fixed buckets:
``telemetry.buckets.count_bucket``). ``check`` is 16 hex digits of BLAKE2b over the rest, keyed by
the guard's ``digest_key`` when it has one: a token is taken only by a guard with the same key (or,
like its own, none), so a garbled or truncated token is refused, and with a key a forged one too.
Without a key anyone can make a token, with any labels: its labels are not ``trusted``, and
telemetry shows of them only values it shows already
(``telemetry.metrics.Instruments.result_labels``). A
token is at most ``MAX_ID_LENGTH`` characters: when the labels do not fit, the agent name goes first,
then the end reason, the policy name, the main threshold and the threshold (each then reported as
the overflow value, ``_other``); a turn whose id alone does not fit has no token (``None``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import hmac
import operator
import re
import secrets
import threading
import time
import uuid
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from turnguard._model import MAX_ID_LENGTH, TurnSummary, cut_text, direct_init, id_text

MAX_RECENT_TURNS = 10_000
"""Ended turns a late result can still reach (a summary each, ``kept_summary``: a few hundred bytes,
under 20 kB whatever the ids)."""
MAX_REMEMBERED_RESULTS = 2**17
"""Results the book remembers by an 8-byte digest of their turn id (at least the last 131,072, at
most twice as many; 16 to 32 bytes each), so that a second result for a turn is ``duplicate`` long
after the turn left the book: at most 4 MiB, for the host's own results and, apart, as much for
results taken by token."""
MAX_COUNT = 2**62
"""The largest call count or cap a token may carry (``config.MAX_CALLS``)."""
TOKEN_VERSION = "tg2"
TOKEN_VERSIONS = ("tg1", "tg2")
"""The versions a guard takes: version 1 tokens (made before the counts were added) still report,
their counts unknown."""
TOKEN_PATTERN = re.compile(r"tg[0-9]+\.")
"""How a report's id reads as a result token (of any version) rather than a plain turn id."""


class ResultStatus(enum.StrEnum):
    """What became of a reported result (``turnguard.result.status`` on the results counter)."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    """The turn already has a result (the first one stands; also for a turn id that ended twice,
    and after the turn left the book: ``MAX_REMEMBERED_RESULTS``)."""
    UNKNOWN = "unknown"
    """No such turn among the recent ones (never seen, or forgotten long ago)."""
    EXPIRED = "expired"
    """The turn ended too long ago (more than ``MAX_RECENT_TURNS`` turns since)."""
    AFTER_SHUTDOWN = "after_shutdown"
    INVALID = "invalid"
    """``resolved`` was not a bool."""
    INVALID_ID = "invalid_id"
    """The id was neither a string nor an integer (a list, a dict, an object)."""
    INVALID_TOKEN = "invalid_token"
    """A string that reads as a result token and is not one this guard takes: garbled, truncated,
    too long, of another version, or checked with another ``digest_key`` (forged)."""


@direct_init
@dataclass(frozen=True, slots=True)
class ResultLabels:
    """What a late result is reported with: the turn and the facts its labels need (the results
    counter's, the ``turnguard.turn.result`` event's, the recorder's result record's); from a turn
    this process ended, or from a result token (``remote``). ``dropped`` names the labels a token
    had no room for (their value here is ``None``). Nothing here is an argument or a result."""

    turn_id: str
    cohort: str
    policy: str | None
    tool_calls: int
    threshold: str | None
    """The threshold that halted the turn, or ``None``."""
    reason: str | None
    """How it ended: ``completed``, ``halted``, ``error`` or the host's reason."""
    agent_name: str | None
    main_threshold: str | None
    """On a probe turn, where the main configuration would have halted it (``None``: nowhere)."""
    edge_soft_cap: int
    edge_hard_cap: int | None
    """The soft cap and backstop the turn's histogram edges come from."""
    max_key_repeat: int | None = None
    """The turn's largest repeat count of one call (``None``: unknown, from a version 1 token)."""
    max_failing_streak: int | None = None
    """The turn's longest failing identical-call streak (``None``: unknown, from a version 1 token)."""
    dropped: frozenset[str] = frozenset()
    remote: bool = False
    trusted: bool = True
    """``False`` for a token taken without a ``digest_key``: anyone could have made it, so its labels
    may name values no turn ever had (the boards show only values they show already)."""
    reported_ns: int | None = None
    """When this process took the result (Unix nanoseconds; ``None`` until it is taken), read once
    for the recorder's result record and the log record alike: ``turnguard calibrate`` keeps a
    turn's earliest result by it, whatever order its files come in."""


@dataclass(slots=True)
class Ended:
    """A recently ended turn of this process: its summary (``kept_summary``), the guard whose
    plugins saw it, its result so far, its policy's name and, on a probe turn, where the main
    configuration would have halted it (threshold, call); every text in it is bounded."""

    summary: TurnSummary
    guard: Any
    resolved: bool | None
    policy: str = ""
    main: tuple[str, int] | None = None


class Remembered:
    """Whether a 64-bit digest was added, for at least the last ``limit`` ones added and at most
    twice as many (then the oldest are forgotten): two open-addressing tables of 8-byte slots, the
    newer one filling up to ``limit`` digests at half load, then the older one dropped. A digest
    costs 16 to 32 bytes, whatever it digests, and the tables grow only as digests come. Not
    thread-safe (the book's lock guards it)."""

    __slots__ = ("_count", "_newer", "_older", "limit")

    _FIRST_SLOTS = 16

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._newer = array("Q", [0]) * self._FIRST_SLOTS
        self._older: array[int] | None = None
        self._count = 0

    def __contains__(self, digest: int) -> bool:
        digest = digest or 1  # 0 marks an empty slot
        return _holds(self._newer, digest) or (self._older is not None and _holds(self._older, digest))

    def add(self, digest: int) -> None:
        digest = digest or 1
        if digest in self:
            return
        if self._count >= self.limit:  # the newer table is full: it becomes the older one
            self._older, self._newer, self._count = self._newer, array("Q", [0]) * self._FIRST_SLOTS, 0
        elif 2 * (self._count + 1) > len(self._newer):
            grown = array("Q", [0]) * (2 * len(self._newer))
            for kept in self._newer:
                if kept:
                    _put(grown, kept)
            self._newer = grown
        _put(self._newer, digest)
        self._count += 1

    def __len__(self) -> int:
        """Digests remembered (those of the older table included)."""
        return self._count + (0 if self._older is None else sum(1 for kept in self._older if kept))


def _holds(table: array[int], digest: int) -> bool:
    mask = len(table) - 1
    at = digest & mask
    while True:
        kept = table[at]
        if kept == digest:
            return True
        if not kept:
            return False
        at = (at + 1) & mask


def _put(table: array[int], digest: int) -> None:
    mask = len(table) - 1
    at = digest & mask
    while table[at]:
        at = (at + 1) & mask
    table[at] = digest


class ResultBook:
    """The recently ended turns, for late results, and how many results got each status;
    thread-safe, bounded (``limit`` turns, and as many expired ids).

    ``edges`` are the (soft cap, backstop) of the guard's histogram edges and ``digest_key`` its
    key: the tokens this book makes and takes carry the one and are checked with the other."""

    def __init__(self, limit: int = MAX_RECENT_TURNS, *, edges: tuple[int, int | None] = (100, 1000),
                 digest_key: str | None = None, remembered: int = MAX_REMEMBERED_RESULTS) -> None:
        self.limit = limit
        self.edges = edges
        self.digest_key = digest_key
        self.counts: dict[ResultStatus, int] = dict.fromkeys(ResultStatus, 0)
        """Results reported, by status (in the turn and later)."""
        self._ended: OrderedDict[str | bytes, Ended] = OrderedDict()
        """By ``_key``: the turn id, or a digest of one too long to keep."""
        self._expired: OrderedDict[str | bytes, None] = OrderedDict()
        self._results = Remembered(remembered)
        """The turn ids of this process's turns that got a result (``_digest``), however long ago
        their turn left the book."""
        self._token_results = Remembered(remembered)
        """The turn ids results came for by token, for turns not in the book (another process's,
        or forgotten here): apart, so that tokens, which anyone may make without a key, never
        push out what the host's own results are remembered by."""
        self.closed = False
        """Whether the guard was shut down: every result from then on is ``after_shutdown``."""
        self._secret = secrets.token_bytes(16)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Take no result from now on (``Guard.shutdown``)."""
        self.closed = True

    def __len__(self) -> int:
        return len(self._ended)

    def count(self, status: ResultStatus) -> None:
        with self._lock:
            self.counts[status] += 1

    def ended(self, summary: TurnSummary, guard: Any, policy: str = "") -> Ended | None:
        """Remember a turn that just ended (with the result it got before ending, if any): its
        entry (``None`` for an id with no text: it cannot be reported later). A turn id that ends
        again (a double resume, a host reusing ids) keeps the first result it got, however it came
        (``_had_result``)."""
        key = _key(id_text(summary.turn_id))
        entry = Ended(kept_summary(summary), guard, None, cut_text(policy)) if key is not None else None
        with self._lock:
            resolved = summary.resolved
            old = self._ended.get(key) if key is not None else None
            if old is not None and old.resolved is not None:
                if resolved is not None:
                    self.counts[ResultStatus.DUPLICATE] += 1
                resolved = old.resolved
            elif resolved is not None:
                if key is not None and self._had_result(self._digest(key)):
                    self.counts[ResultStatus.DUPLICATE] += 1  # its id's first result came long ago
                else:
                    self.counts[ResultStatus.ACCEPTED] += 1
                    if key is not None:
                        self._results.add(self._digest(key))
            if key is not None and entry is not None:
                entry.resolved = resolved
                self._remember(key, entry)
        return entry

    def main_halted(self, turn_id: Any, threshold: str, call: int) -> None:
        """The main configuration (a probe turn's shadow named after it) would have halted the
        turn that just ended: where, for its late result."""
        key = _key(id_text(turn_id))
        with self._lock:
            entry = self._ended.get(key) if key is not None else None
            if entry is not None:
                entry.main = (cut_text(threshold), call)

    def report(self, turn_id: Any, resolved: Any) -> tuple[ResultStatus, Ended | None, ResultLabels | None]:
        """Take a late result (``turn_id``: a turn id or a result token): its status, the turn's
        entry when it is known, and the labels to report it with. Never raises."""
        text = id_text(turn_id)
        key = _key(text)
        labels = None
        if text is not None and TOKEN_PATTERN.match(text) and key not in self._ended:
            labels = read_token(text, self.digest_key)  # outside the lock: pure, bounded work
        with self._lock:
            status, entry = self._take(text, key, resolved, labels)
            self.counts[status] += 1
        if entry is not None:  # a turn of this process is reported with what is known here
            labels = self.labels_of(entry.summary, entry.policy, entry.main)
        if status is ResultStatus.ACCEPTED and labels is not None:
            labels = dataclasses.replace(labels, reported_ns=time.time_ns())
        return status, entry, labels

    def _take(self, text: str | None, key: str | bytes | None, resolved: Any,
              labels: ResultLabels | None) -> tuple[ResultStatus, Ended | None]:
        if self.closed:
            return ResultStatus.AFTER_SHUTDOWN, None
        if type(resolved) is not bool:
            return ResultStatus.INVALID, None
        if text is None or key is None:
            return ResultStatus.INVALID_ID, None
        entry = self._ended.get(key)
        if entry is None and TOKEN_PATTERN.match(text):
            if labels is None:
                return ResultStatus.INVALID_TOKEN, None
            key = _key(labels.turn_id) or ""
            entry = self._ended.get(key)
            if entry is not None and not hmac.compare_digest(text, self._token_of(entry)):
                entry = None  # not that turn's own token: another turn of its id's, or made up
            if entry is None:  # a turn another process ran, or one that left the book
                digest = self._digest(key)
                if digest in self._results or digest in self._token_results:
                    return ResultStatus.DUPLICATE, None
                self._token_results.add(digest)  # never the book: a token may be anyone's
                return ResultStatus.ACCEPTED, None
        if entry is None:
            digest = self._digest(key)
            if digest in self._results or digest in self._token_results:  # its result stands
                return ResultStatus.DUPLICATE, None
            return (ResultStatus.EXPIRED if key in self._expired else ResultStatus.UNKNOWN), None
        digest = self._digest(key)
        if entry.resolved is not None or self._had_result(digest):
            return ResultStatus.DUPLICATE, entry  # (an id that ended again: its first result stands)
        entry.resolved = resolved
        self._results.add(digest)
        return ResultStatus.ACCEPTED, entry

    def _had_result(self, digest: int) -> bool:
        """Whether the turn id of ``digest`` got a result: by id, or by token where tokens are
        checked by ``digest_key`` (so made by a guard of the operator's: an earlier turn of the
        id's stands). Without the key a token may be anyone's, so it never keeps the id's own turn
        from its result."""
        return digest in self._results or (self.digest_key is not None and digest in self._token_results)

    def _token_of(self, entry: Ended) -> str:
        """The token of a turn in the book, as its own guard made it (``""``: it has none)."""
        return result_token(self.labels_of(entry.summary, entry.policy, entry.main), self.digest_key) or ""

    def _digest(self, key: str | bytes) -> int:
        """The 8 bytes ``Remembered`` keeps a turn id by (``_key``'s; keyed by a secret of the book's own)."""
        data = b"d" + key if isinstance(key, bytes) else b"s" + key.encode("utf-8", "surrogatepass")
        return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=self._secret,
                                              person=b"tg-result-seen").digest(), "little")

    def _remember(self, key: str | bytes, entry: Ended) -> None:
        self._expired.pop(key, None)
        self._ended[key] = entry
        self._ended.move_to_end(key)
        while len(self._ended) > self.limit:
            old, _ = self._ended.popitem(last=False)
            self._expired[old] = None
            if len(self._expired) > self.limit:
                self._expired.popitem(last=False)

    # -- labels and tokens -------------------------------------------------------------------

    def labels_of(self, summary: TurnSummary, policy: str, main: tuple[str, int] | None) -> ResultLabels:
        """The labels of a turn this process ended under ``policy`` (``main``: where the main
        configuration would have halted it, on a probe turn)."""
        main_threshold = main[0] if str(summary.cohort) == "probe" and main is not None else None
        return ResultLabels(
            turn_id=id_text(summary.turn_id) or "", cohort=str(summary.cohort), policy=policy,
            tool_calls=summary.tool_calls, threshold=id_text(summary.threshold),
            reason=id_text(summary.reason), agent_name=id_text(summary.agent_name), main_threshold=main_threshold,
            edge_soft_cap=max(self.edges[0], 0), edge_hard_cap=self.edges[1],
            max_key_repeat=summary.max_key_repeat, max_failing_streak=summary.max_failing_streak)

    def token_for(self, entry: Ended | None) -> str | None:
        """The result token of a turn that ended here, by the entry ``ended`` gave it (``None``: its
        id has no text, or does not fit in a token); the same however long ago the turn left the book."""
        if entry is None:
            return None
        with self._lock:
            main = entry.main
        return result_token(self.labels_of(entry.summary, entry.policy, main), self.digest_key)


def kept_summary(summary: TurnSummary) -> TurnSummary:
    """``summary`` as the book keeps it, for a late result: every text in it (turn, conversation and
    agent ids, end reason, threshold, the snapshot's id, ...) within ``MAX_ID_LENGTH`` characters,
    cut as exported text is, and every tuple (the fresh plugins, the per-tool streak restarts) to
    its first ``MAX_KEPT_ITEMS``, so that a host's or a model's text never grows the book. The
    summary itself when nothing needs cutting (nearly always)."""
    changes: dict[str, Any] = {}
    for name, value in zip(_TEXT_FIELDS, _text_values(summary), strict=True):
        kind = value.__class__
        if value is None or (kind is str and len(value) <= MAX_ID_LENGTH) or (kind is tuple and not value):
            continue  # nearly every value
        kept = _kept(value)
        if kept is not value:
            changes[name] = kept
    return dataclasses.replace(summary, **changes) if changes else summary


MAX_KEPT_ITEMS = 4
"""The items a kept summary's tuples keep (``fresh_state``, ``result_restarts``: a few, nearly always)."""
_TEXT_FIELDS = tuple(f.name for f in dataclasses.fields(TurnSummary)
                     if f.type not in ("int", "float", "bool", "bool | None"))
"""The fields of a summary that may hold a host's text (any field but a count, a time or a flag:
one added later is bounded too)."""
_text_values = operator.attrgetter(*_TEXT_FIELDS)


def _kept(value: Any) -> Any:
    """A value of a summary as the book keeps it: a string (a subclass's too, untouched), an
    integer or bytes within ``MAX_ID_LENGTH`` characters as it is, a longer one as its text, cut; a
    tuple's first ``MAX_KEPT_ITEMS`` items, each kept; a UUID as it is; any other value (a host's
    object of any size) as its text, cut."""
    if isinstance(value, str):
        return value if str.__len__(value) <= MAX_ID_LENGTH else cut_text(str.__str__(value))
    if isinstance(value, tuple):
        if not value:
            return value
        items = tuple(_kept(item) for item in value[:MAX_KEPT_ITEMS])
        return value if len(value) <= MAX_KEPT_ITEMS and all(map(operator.is_, items, value)) else items
    if value is None or value.__class__ in (bool, float, uuid.UUID) or (
            value.__class__ is bytes and len(value) <= MAX_ID_LENGTH):
        return value
    text = id_text(value)
    if text is not None:
        return value if len(text) <= MAX_ID_LENGTH else cut_text(text)
    try:
        text = str(value)
    except Exception:  # a host object whose text fails: its type names it
        text = None
    return cut_text(str.__str__(text)) if isinstance(text, str) else f"<{type(value).__qualname__}>"


def _key(text: str | None) -> str | bytes | None:
    """What the book knows a turn id by: its text, or, past ``MAX_ID_LENGTH`` characters, 16 bytes
    of BLAKE2b over it (so a long id still reaches its turn exactly, at a bounded cost)."""
    if text is None or len(text) <= MAX_ID_LENGTH:
        return text
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, person=b"tg-long-turn-id").digest()


_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_NONE, _EMPTY, _DROPPED = "", "~", "*"
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_TEXT_FIELD = re.compile(r"(?:[A-Za-z0-9_-]|%[0-9A-F]{2})+")
_NUMBER = re.compile(r"0|[1-9][0-9]{0,18}")
_DROP_ORDER = ("agent_name", "reason", "policy", "main_threshold", "threshold")
"""The labels a token drops, first to last, until it fits."""
_PARTS = {"tg1": 12, "tg2": 14}
"""The fields of a token of each version, its check included."""


def _escape(text: str | None) -> str:
    if text is None:
        return _NONE
    if not text:
        return _EMPTY
    if _PLAIN.fullmatch(text):
        return text
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in text)


def _unescape(field: str) -> str | None:
    """A text field's value; ``ValueError`` for anything a token could not hold."""
    if field in (_NONE, _DROPPED):
        return None
    if field == _EMPTY:
        return ""
    if _PLAIN.fullmatch(field):
        return field
    if not _TEXT_FIELD.fullmatch(field):
        raise ValueError("not a text field")
    return unquote_to_bytes(field).decode("utf-8", "surrogatepass")


def _number(field: str, *, optional: bool = False) -> int | None:
    if optional and field == _NONE:
        return None
    if not _NUMBER.fullmatch(field) or int(field) > MAX_COUNT:
        raise ValueError("not a count")
    return int(field)


@functools.lru_cache(maxsize=16)
def _check_state(digest_key: str | None) -> Any:
    """A BLAKE2b state keyed for ``digest_key`` (copied per token: the key is set up once)."""
    key = b"" if digest_key is None else hashlib.blake2b(
        digest_key.encode("utf-8", "surrogatepass"), digest_size=32, person=b"tg-token-key").digest()
    return hashlib.blake2b(digest_size=8, key=key, person=b"tg-result-tok1")


def _check(body: str, digest_key: str | None) -> str:
    state = _check_state(digest_key).copy()
    state.update(body.encode("ascii"))
    return state.hexdigest()


def _optional(count: int | None) -> str:
    return _NONE if count is None else str(min(count, MAX_COUNT))


def result_token(labels: ResultLabels, digest_key: str | None = None) -> str | None:
    """``labels`` as a version-2 token (see the module docstring), checked with ``digest_key``;
    ``None`` when even the turn id and the counts do not fit in ``MAX_ID_LENGTH`` characters."""
    fields = {
        "policy": _escape(labels.policy), "threshold": _escape(labels.threshold), "reason": _escape(labels.reason),
        "agent_name": _escape(labels.agent_name), "main_threshold": _escape(labels.main_threshold),
    }
    head = (TOKEN_VERSION, _escape(labels.turn_id), _escape(labels.cohort))
    counts = (str(labels.tool_calls), str(labels.edge_soft_cap),
              _NONE if labels.edge_hard_cap is None else str(labels.edge_hard_cap),
              _optional(labels.max_key_repeat), _optional(labels.max_failing_streak))
    for drop in (None, *_DROP_ORDER):
        if drop is not None:
            fields[drop] = _DROPPED
        body = ".".join((*head, fields["policy"], *counts, fields["threshold"], fields["reason"],
                         fields["agent_name"], fields["main_threshold"]))
        if len(body) + 17 <= MAX_ID_LENGTH:
            return f"{body}.{_check(body, digest_key)}"
    return None


def read_token(token: str, digest_key: str | None = None) -> ResultLabels | None:
    """The labels a result token holds, or ``None`` for anything that is not a whole, unaltered
    token of a version this guard takes (``TOKEN_VERSIONS``) checked with ``digest_key``. Never raises."""
    if len(token) > MAX_ID_LENGTH or not token.isascii():
        return None
    body, _, check = token.rpartition(".")
    parts = token.split(".")
    if len(parts) != _PARTS.get(parts[0]) or not hmac.compare_digest(check, _check(body, digest_key)):
        return None
    if parts[0] == "tg1":  # no counts: unknown
        parts[7:7] = [_NONE, _NONE]
    _, turn_id, cohort, policy, calls, soft_cap, hard_cap, repeat, failing, threshold, reason, agent, main, _ = parts
    try:
        text_id = _unescape(turn_id)
        labels = ResultLabels(
            turn_id=text_id or "", cohort=_unescape(cohort) or "", policy=_unescape(policy),
            tool_calls=_number(calls) or 0, threshold=_unescape(threshold), reason=_unescape(reason),
            agent_name=_unescape(agent), main_threshold=_unescape(main), edge_soft_cap=_number(soft_cap) or 0,
            edge_hard_cap=_number(hard_cap, optional=True) or None, max_key_repeat=_number(repeat, optional=True),
            max_failing_streak=_number(failing, optional=True), remote=True, trusted=digest_key is not None,
            dropped=frozenset(name for name, field in zip(("policy", "threshold", "reason", "agent_name",
                                                           "main_threshold"),
                                                          (policy, threshold, reason, agent, main), strict=True)
                              if field == _DROPPED),
        )
    except (ValueError, UnicodeDecodeError):
        return None
    if text_id is None or not labels.cohort:  # ("~", the empty turn id, is an id: turn(turn_id=""))
        return None
    return labels
