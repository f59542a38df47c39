"""What the readers of recorded turns give (``RecordedTurn``, ``RecordedCall``, ``Limits``,
``InputProblem``), and what both formats share: lines read as bytes, plain or gzipped, within
``--max-line-bytes``, and parsed within the memory bound. Every field that sizes the replay's
work has a ceiling past which the turn is reported, not replayed."""

from __future__ import annotations

import enum
import gzip
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from turnguard._calibrate import bounds
from turnguard._config import STREAK_STOP_ON, STUCK_SIGNALS
from turnguard._model import MAX_ID_LENGTH, Outcome, id_text
from turnguard.telemetry._names import CALL_UNFINISHED


class Unreported(enum.Enum):
    """A call whose outcome never came before its turn ended (the recorder's and the tool span's
    ``unfinished``): the replay reports none for it, as the live guard got none."""

    UNFINISHED = CALL_UNFINISHED


UNFINISHED = Unreported.UNFINISHED
OUTCOMES: dict[str, Outcome | Unreported] = {**{o.value: o for o in Outcome}, UNFINISHED.value: UNFINISHED}
"""The outcome texts the recorder and the plugin write (``parse_outcome`` reads any)."""


class RecordedCall(NamedTuple):
    """One tool call of a recorded turn: raw ``args`` or a ``digest``. A named tuple: a million
    are built per second of input, several times cheaper than a frozen dataclass."""

    tool: str
    args: Any = None
    digest: str | None = None
    outcome: Outcome | Unreported = Outcome.UNKNOWN
    cycle: int | None = None
    """The model request (1-based) that issued the call, when recorded."""
    result: str | None = None
    """A digest of the call's result, when recorded (the corpus's ``result``, the recorder's):
    equal digests, equal results. What ``stateful_tools`` policies replay with."""
    retries: int = 0
    """``retry()`` calls in the turn before the call was checked (0: none, or not recorded): the
    replay rolls the request back (``Ledger.rollback_cycle``) before a call whose count rose."""


CAP_MODES = ("explicit", "adaptive", "disabled")


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a turn ran under, as recorded: every setting that changes what a replay of the
    turn decides (``docs/calibration.md``). ``hard_cap`` the effective one (``None`` when
    disabled), ``max_cycles`` 0 when unbounded; a limit not recorded (an older recording) is
    ``None``, and is not compared."""

    cap_mode: str
    soft_cap: int | None = None
    hard_cap: int | None = None
    stuck_repeat_threshold: int | None = None
    streak_warn_at: int | None = None
    streak_stop_at: int | None = None
    max_cycles: int | None = None
    stateful_tools: tuple[str, ...] | None = None
    streak_exempt_tools: tuple[str, ...] | None = None
    stuck_signal: str | None = None
    """Which stuck signal gates the adaptive cap (``GuardConfig.stuck_signal``)."""
    streak_stop_on: str | None = None
    """What the streak's stop level counts: ``error`` or ``any``."""
    remind_model: bool | None = None
    """Whether the warn levels remind the model (``REMIND``) rather than ask or observe."""
    max_tracked_keys: int | None = None
    """The distinct keys counted per turn."""
    disabled_policies: tuple[str, ...] | None = None
    """The built-in policies the configuration turned off (``disable_plugins``), sorted."""
    cycle_repeat_warn_at: int | None = None
    cycle_repeat_stop_at: int | None = None
    cycle_repeat_max_period: int | None = None
    """``cycle_repeat``'s levels (0: off) and the longest cycle it looks for."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in LIMIT_KEYS}
        for name in NAME_LIST_KEYS:
            names = getattr(self, name)
            out[name] = None if names is None else list(names)
        return out


COUNT_KEYS = ("soft_cap", "hard_cap", "stuck_repeat_threshold", "streak_warn_at", "streak_stop_at", "max_cycles",
              "cycle_repeat_warn_at", "cycle_repeat_stop_at", "cycle_repeat_max_period", "max_tracked_keys")
"""``Limits``' numbers."""
CHOICE_KEYS: dict[str, tuple[str, ...]] = {"stuck_signal": STUCK_SIGNALS, "streak_stop_on": STREAK_STOP_ON}
"""``Limits``' choices, with the values each may take."""
FLAG_KEYS = ("remind_model",)
"""``Limits``' switches."""
TOOL_LIST_KEYS = ("stateful_tools", "streak_exempt_tools")
"""``Limits``' tool lists."""
NAME_LIST_KEYS = (*TOOL_LIST_KEYS, "disabled_policies")
"""``Limits``' lists of names: the tool lists and the policies turned off."""
LIMIT_KEYS = ("cap_mode", *COUNT_KEYS, *CHOICE_KEYS, *FLAG_KEYS)
"""``Limits``' single values (the cap mode first)."""
FIRST_LIMIT_KEYS = LIMIT_KEYS[:7]
"""The keys every recording with limits has (the cap mode, the caps, the streak's levels, the
cycle cap); the others came later and read as ``None`` when absent."""
MAX_LISTED_TOOLS = 1_000
"""The most names a recorded tool or policy list may hold (a longer one is malformed)."""


def limit_value(key: str, value: Any) -> Any:
    """A recorded limit other than the cap mode as ``Limits`` holds it (``None``: not recorded);
    a ``ValueError`` saying what it must be when it is malformed."""
    if value is None:
        return None
    if key in COUNT_KEYS:
        if type(value) is int and 0 <= value <= MAX_LIMIT:
            return value
        raise ValueError(f"{key!r} must be a whole number from 0 or null, got {shown(value)}")
    if key in CHOICE_KEYS:
        if type(value) is str and value in CHOICE_KEYS[key]:
            return value
        raise ValueError(f"{key!r} must be one of {', '.join(CHOICE_KEYS[key])} or null, got {shown(value)}")
    if key in FLAG_KEYS:
        if type(value) is bool:
            return value
        raise ValueError(f"{key!r} must be true, false or null, got {shown(value)}")
    if type(value) is list and len(value) <= MAX_LISTED_TOOLS and all(short_text(t) and t for t in value):
        return tuple(value)
    what = "tool" if key in TOOL_LIST_KEYS else "policy"
    raise ValueError(f"{key!r} must be a list of at most {MAX_LISTED_TOOLS:,} {what} names (texts of at most "
                     f"{MAX_ID_LENGTH} characters) or null, got {shown(value)}")


def read_limits(raw: Any) -> Limits:
    """``Limits`` from a recorded ``limits`` object (a key absent is not recorded); a
    ``ValueError`` saying what is wrong with it."""
    if type(raw) is not dict:
        raise ValueError(f"expected an object, got {json_type(raw)}")
    mode = raw.get("cap_mode")
    if mode not in CAP_MODES:
        raise ValueError(f"'cap_mode' must be one of {', '.join(CAP_MODES)}, got {shown(mode)}")
    return Limits(mode, **{key: limit_value(key, raw.get(key)) for key in (*LIMIT_KEYS[1:], *NAME_LIST_KEYS)})


MAX_LIMIT = 2**62
"""The largest limit value read (``config.MAX_CALLS``)."""
MAX_TURN_COUNT = 2**32
"""The largest count of calls a turn may give (``tool_calls``, ``calls_dropped``,
``calls_unrecorded``, an OTLP call index or ``turnguard.turn.tool_calls``): a turn's
``needed_calls`` is then under 2^34, so the sums of calls a run forms stay within what ``calibrate
merge`` accepts (``bounds.MAX_COUNT``, 2^62) for up to 2^28 turns at the largest counts each."""


def turn_count(value: Any) -> bool:
    """An ``int`` (not a ``bool``) from 0 to ``MAX_TURN_COUNT``."""
    return type(value) is int and 0 <= value <= MAX_TURN_COUNT


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
    cohort: str | None = None
    """``"live"`` or ``"probe"`` (guarded by a probe configuration), ``None`` when not recorded."""
    origin: str = ""
    """Where the turn came from (``file:line``), for messages."""
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
    """Calls missing before the listed ones (a resumed turn): the listed calls are its tail."""
    end_unknown: bool = False
    """The recording says neither how many calls the turn made nor how it ended (tool spans whose
    turn span never came): it may have gone on past its last listed call."""

    @property
    def needed_calls(self) -> int:
        """The calls the turn made (or asked for, for the one a halt denied)."""
        return max(len(self.calls) + self.calls_dropped + self.calls_unrecorded, self.tool_calls or 0)

    @property
    def in_part(self) -> bool:
        """The listed calls are not the turn's start: replaying them would replay another turn."""
        return self.calls_unrecorded > 0 or (self.tool_calls or 0) > len(self.calls) + self.calls_dropped

    @property
    def cut_short(self) -> bool:
        """The listed calls are the turn's first, but maybe not all: past the last one nothing is known."""
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
"""The longest line read (without its newline); a longer one is reported and skipped. Every
other bound derives from it (``bounds.py``)."""
MAX_TURN_CYCLES = 100_000
"""The most model requests a turn (``cycles``) or a call's ``cycle`` number may give: the replay
does work for each request, so a larger value is a reported problem, not a hang."""
MAX_TURN_CALLS = bounds.MAX_TURN_CALLS
"""The most tool calls a turn may hold at any line limit (100 times the recorder's per-turn
limit); at a given ``--max-line-bytes`` at most ``Bounds.turn_calls`` (131,072 at the default)."""
MAX_WAITING_CALLS = bounds.MAX_TURN_CALLS
"""The most OTLP tool spans held waiting for their turn spans; past it the oldest waiting turn
is reported and replayed as it is."""


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
    """``(line, size)`` for each line, or ``(None, size)`` for one longer than ``limit`` bytes
    (its rest read in blocks and dropped); ``size`` counts the newline."""
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
    """The lines of one file as bytes, un-gzipped by magic number, with the position on disk for
    progress bars; lines past ``max_line_bytes`` are reported and skipped."""

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


UNREADABLE: Any = object()
"""What ``parse_line`` returns for a line that holds no JSON value (JSON ``null`` is ``None``)."""


def parse_line(line: bytes, path: str, lineno: int, on_problem: ProblemSink,
               max_line_bytes: int = MAX_LINE_BYTES) -> Any:
    """The JSON value of a line, or ``UNREADABLE``: blank, not JSON, or too costly to parse (its
    estimated parsed size past ``bounds.PARSE_FACTOR`` x ``max_line_bytes``), each reported."""
    if blank(line):
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


def blank(line: bytes) -> bool:
    """Empty or whitespace only (without copying a long line, as ``strip`` would)."""
    return not line or line.isspace()


MAX_TIME = 1e11
"""Unix seconds past this (the year 5138) are not a time a turn ran at."""


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (``null``, ``an array``)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def count_in_range(value: Any, minimum: int, maximum: int = MAX_TURN_CYCLES) -> bool:
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


def parse_outcome(value: Any) -> Outcome | Unreported | None:
    """A recorded outcome: an ``Outcome``, ``UNFINISHED``, or ``None`` when it is neither (absent
    or ``null``: unknown)."""
    if value is None:
        return Outcome.UNKNOWN
    if value == UNFINISHED.value:
        return UNFINISHED
    try:
        return Outcome.parse(value)
    except ValueError:
        return None


def short_text(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_ID_LENGTH


MAX_ID_BITS = 800
"""Integers of at most this many bits have fewer than ``MAX_ID_LENGTH`` digits (and ``str`` of a
larger one could even raise: Python limits int-to-text conversion to 4,300 digits)."""


def turn_id_text(value: Any) -> str | None:
    """A recorded turn id as the live guard counts it (``model.id_text``): a text as it is, ``""``
    included, or an integer's digits (``0`` is ``"0"``), of at most ``MAX_ID_LENGTH`` characters;
    ``None`` for anything else (only an absent id gets a stand-in, and only where the caller says)."""
    if type(value) is str:
        return value if len(value) <= MAX_ID_LENGTH else None
    if type(value) is int and value.bit_length() <= MAX_ID_BITS:
        return id_text(value)
    return None


def first_given(obj: dict[str, Any], *keys: str) -> Any:
    """The value of the first of ``keys`` that ``obj`` gives (absent or ``null``: not given): an
    empty text, ``0`` or ``false`` is given, never passed over for a later key."""
    for key in keys:
        value = obj.get(key)
        if value is not None:
            return value
    return None
