"""What bounds calibrate's memory on any input: every limit derives from ``--max-line-bytes``.

Peak memory above the baseline stays within ``MEMORY_FACTOR`` x ``--max-line-bytes``
(``benchmarks/bench_calibrate_memory.py``): at any moment calibrate holds one line and its parsed
form (estimated before parsing, refused past ``parse_bytes``), one turn of at most ``turn_calls``
calls, at most ``waiting_calls`` tool spans waiting, at most ``late_results`` results (ids hashed
to 8 bytes), and figures keyed by call counts or bucketed halt calls (``halt_bucket``).

The counts a ``--json`` result holds are checked here too (``count``, ``histogram``): ``calibrate
merge`` must refuse a tampered result with a clear message, not sum it into the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

MAX_COUNT = 2**62
"""The largest count a result may hold: far past any real recording, so a larger one is tampering."""
COHORT_KEYS = ("live", "probe", "unrecorded")
"""How figures are split by cohort: the turn's cohort, ``unrecorded`` when the recording has none."""


def count(value: Any, what: str = "a count") -> int:
    """``value`` when it is a whole number from 0 to ``MAX_COUNT``, else ``ValueError``."""
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_COUNT:,}, got {shown(value)}")
    return value


def histogram(data: Any, what: str, keys: Any = None) -> dict[Any, int]:
    """A ``{key: count}`` object of a result; ``keys`` (a callable) checks and converts each key."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object, got {shown(data)}")
    return {(keys(k) if keys else str(k)): count(v, f"{what}[{shown(k)}]") for k, v in data.items()}


K = TypeVar("K")


def add_count(hist: dict[K, int], key: K, n: int = 1) -> None:
    """Count ``n`` more under ``key``."""
    hist[key] = hist.get(key, 0) + n


def add_counts(mine: dict[K, int], theirs: dict[K, int]) -> None:
    """Merge the histogram ``theirs`` into ``mine``."""
    for k, n in theirs.items():
        mine[k] = mine.get(k, 0) + n


def histogram_json(hist: dict[Any, int]) -> dict[str, int]:
    """A histogram as a result holds it, sorted by key (``histogram`` reads it back)."""
    return {str(k): v for k, v in sorted(hist.items())}


def call_count_key(key: Any) -> int:
    """A histogram key that is a number of calls (JSON keys are texts)."""
    try:
        value = int(key)
    except (TypeError, ValueError):
        value = -1
    if not 0 <= value <= MAX_COUNT or str(value) != str(key):
        raise ValueError(f"a call count must be a whole number from 0, got {shown(key)}")
    return value


def key_in(choices: tuple[str, ...], what: str) -> Callable[[Any], str]:
    """A check of a histogram's keys (``histogram``'s ``keys``): each must be one of ``choices``."""

    def check(key: Any) -> str:
        if key not in choices:
            raise ValueError(f"{what} must be one of {', '.join(choices)}, got {shown(key)}")
        return key

    return check


cohort_key = key_in(COHORT_KEYS, "a cohort")


_REQUIRED: Any = object()


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a result's object: the field it holds (``attr``; empty: the key's name), how it
    is written (``out``; ``None``: as is) and read back (``into(value, what)``; ``None``: derived,
    not read), and what a result from before the key existed holds (``missing``)."""

    name: str
    attr: str = ""
    out: Callable[[Any], Any] | None = None
    into: Callable[[Any, str], Any] | None = count
    missing: Any = _REQUIRED


def dump(record: Any, keys: tuple[Key, ...], **given: Any) -> dict[str, Any]:
    """``record`` as a result holds it, in ``keys``' order; ``given``: values the caller computed."""
    out = {}
    for k in keys:
        if k.name in given:
            out[k.name] = given[k.name]
        else:
            value = getattr(record, k.attr or k.name)
            out[k.name] = value if k.out is None else k.out(value)
    return out


def load(data: Any, keys: tuple[Key, ...], prefix: str = "") -> dict[str, Any]:
    """The fields ``keys`` read back from a result's object, each checked (``ValueError``)."""
    if not isinstance(data, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'a result'} must be an object, got {shown(data)}")
    return {k.attr or k.name: k.into(data[k.name] if k.missing is _REQUIRED else data.get(k.name, k.missing),
                                      prefix + k.name) for k in keys if k.into is not None}


def hist(name: str, keys: Callable[[Any], Any], attr: str = "", missing: Any = _REQUIRED) -> Key:
    """The ``Key`` of a histogram whose keys ``keys`` checks (``histogram_json``, ``histogram``)."""
    return Key(name, attr, histogram_json, lambda data, what: histogram(data, what, keys), missing)


def shown(value: Any, width: int = 40) -> str:
    text = repr(value) if not isinstance(value, str) or len(value) <= width else repr(value[:width]) + "..."
    return text if len(text) <= width + 5 else text[:width] + "..."


MAX_LINE_BYTES = 32 * 1024 * 1024
"""The default ``--max-line-bytes``."""
MEMORY_FACTOR = 8
"""The documented bound: peak memory above the baseline, in ``--max-line-bytes``."""
PARSE_FACTOR = 4
"""A line's parsed form may take at most this many ``--max-line-bytes``."""
MAX_TURN_CALLS = 1_000_000
"""The most calls per turn at any ``--max-line-bytes`` (100 times the recorder's per-line limit)."""
BYTES_PER_CALL = 256
"""About what one call of the turn in hand costs while it is replayed (its record, its key, the
``ToolCall`` the hooks receive, the ledger's counts): ``turn_calls`` is the limit over this."""
BYTES_PER_WAITING_CALL = 512
"""About what a tool span waiting for its turn span costs at most (its call record, a tool name and a
digest of up to 256 characters each, its place in the waiting table)."""
BYTES_PER_RESULT = 64
"""A late result kept (a dict entry of an 8-byte hash and a flag, and one of its time when it has
one): ``late_results`` fit about 1 x the limit, 2 x when every result is timed."""
IDS_IN_ALL = 10_000
"""Ids of halted turns kept over the whole grid (each policy keeps ``ids_per_policy``)."""
MAX_IDS = 50
EXACT_HALT_CALLS = 64
"""Halt calls up to this are kept exactly; past it, in buckets of 1/8 of an octave (at most 6%)."""
ESTIMATE_FROM = 64 * 1024
"""Lines longer than this get their parsed size estimated before parsing (shorter ones cannot
exceed any bound)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """Every input bound of one run, from its ``--max-line-bytes``."""

    max_line_bytes: int = MAX_LINE_BYTES

    @property
    def parse_bytes(self) -> int:
        return PARSE_FACTOR * self.max_line_bytes

    @property
    def turn_calls(self) -> int:
        return max(1000, min(MAX_TURN_CALLS, self.max_line_bytes // BYTES_PER_CALL))

    @property
    def waiting_calls(self) -> int:
        return max(1000, min(MAX_TURN_CALLS, self.max_line_bytes // BYTES_PER_WAITING_CALL))

    @property
    def late_results(self) -> int:
        return max(1000, self.max_line_bytes // BYTES_PER_RESULT)


def ids_per_policy(policies: int) -> int:
    """Ids of halted turns kept per policy and kind (resolved, unresolved): ``MAX_IDS``, fewer in
    grids of more than ``IDS_IN_ALL / MAX_IDS`` policies (at least 5)."""
    return max(5, min(MAX_IDS, IDS_IN_ALL // max(1, policies)))


def parsed_size(line: bytes) -> int:
    """An upper estimate of the memory ``json.loads(line)`` takes, from the line's structure (per
    ``{``, ``:``, ``[``, quote pair and ``,``, plus the text): measured on every shape of line, never
    below the real size, at most about three times it."""
    return (len(line) + 184 * line.count(b"{") + 24 * line.count(b":") + 96 * line.count(b"[")
            + 26 * line.count(b'"') + 40 * line.count(b","))


MAX_PARSED_PER_BYTE = 185
"""``parsed_size(line)`` is at most this many times ``len(line)`` (each byte counts once, at most
184 for a ``{``, plus the text itself): a line this much under the budget needs no estimate."""


def halt_bucket(call: int) -> int:
    """The key a halt call is counted under: itself up to ``EXACT_HALT_CALLS``, else the lower
    edge of its 1/8-octave bucket (so a histogram of halt calls has at most about 500 keys)."""
    if call <= EXACT_HALT_CALLS:
        return call
    exponent = call.bit_length() - 1
    step = 1 << max(0, exponent - 3)
    return call - call % step if step > 1 else call
