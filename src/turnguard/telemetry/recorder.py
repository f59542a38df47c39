"""The local recorder: one JSON line per finished turn, in the corpus format, for calibration.

Enabled by ``GuardConfig(recorder_path=...)`` (``turnguard demo`` writes ``.turnguard/turns.jsonl``).
Each line is the corpus format (``source``, ``id``, ``calls[{tool, args, outcome}]``, ``cycles``,
``resolved``, ``ended_by``) with the call's keyed key digest in ``args`` instead of its arguments,
so ``turnguard calibrate`` can replay the turn (identical calls have identical digests) while the
file holds no tool arguments. Extra keys: ``agent``, ``conversation_id``, ``tool_calls`` (the
true count), ``calls_dropped`` and ``escalations`` (the users' answers).

Writes are whole-line appends: the line is built in memory and written with one ``os.write`` on
an ``O_APPEND`` descriptor, so concurrent writers (threads or processes) never interleave and a
crashed process leaves whole lines only. Memory is bounded: at most ``MAX_RECORDED_CALLS`` calls
are kept per turn; later calls are counted in ``calls_dropped`` (and in ``tool_calls``) only; at
most ``MAX_OPEN_TURNS`` turns are collected at once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turnguard.hookspecs import hookimpl
from turnguard.keys import cached_digest
from turnguard.model import Action, Outcome

if TYPE_CHECKING:
    from turnguard.config import GuardConfig
    from turnguard.ledger import Ledger
    from turnguard.model import LoopDetectedEvent, ToolCall, TurnSummary, Verdict

log = logging.getLogger("turnguard.telemetry")

SOURCE = "turnguard"
"""The ``source`` of every recorded line."""
MAX_RECORDED_CALLS = 10_000
"""Calls kept per turn: ten times the default hard backstop (1000), so a default-configured turn
is always recorded whole. Past it, calls are counted (``calls_dropped``) but not listed."""
MAX_OPEN_TURNS = 10_000
"""Turns collected at once; past it the oldest is dropped unwritten (a host that never ends its
turns cannot grow memory without bound)."""
HALTED_OUTCOME = Outcome.DENIED.value
"""The outcome recorded for a call turnguard halted (a policy refused it), unless the host reports one."""


@dataclass(slots=True)
class _Call:
    tool: str
    digest: str
    outcome: str = Outcome.UNKNOWN.value


@dataclass(slots=True)
class _TurnRecord:
    calls: list[_Call] = field(default_factory=list)
    index: dict[Any, int] = field(default_factory=dict)
    """Calls awaiting an outcome: ToolCall object -> position in ``calls``."""
    dropped: int = 0
    cycle_mark: tuple[int, int] = (0, 0)
    """(len(calls), dropped) when the current model request began: where a retry rolls back to."""
    escalations: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def append_line(path: str, line: bytes) -> None:
    """Append one whole line with a single ``write(2)`` on an ``O_APPEND`` descriptor.

    POSIX appends each such write at the current end of file atomically with respect to other
    appenders, so lines from concurrent writers never interleave. A short write (a full disk)
    is reported as an ``OSError`` rather than completed by a second write that could interleave.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        written = os.write(fd, line)
    finally:
        os.close(fd)
    if written != len(line):
        raise OSError(f"short write to {path}: {written} of {len(line)} bytes (disk full?)")


class Recorder:
    """Collects each turn's calls (digests and outcomes) and appends a line when the turn ends."""

    def __init__(self, path: str, *, max_calls: int = MAX_RECORDED_CALLS) -> None:
        self.path = os.fspath(path)
        self.max_calls = max_calls
        self._turns: dict[Ledger, _TurnRecord] = {}
        self._lock = threading.Lock()
        self._dir_ready = False

    def _record(self, turn: Ledger) -> _TurnRecord:
        record = self._turns.get(turn)
        if record is None:
            with self._lock:
                record = self._turns.setdefault(turn, _TurnRecord())
        return record

    @hookimpl
    def turnguard_turn_started(self, turn: Ledger) -> None:
        self._record(turn)
        if len(self._turns) > MAX_OPEN_TURNS:
            with self._lock:
                try:
                    del self._turns[next(iter(self._turns))]
                except (StopIteration, RuntimeError, KeyError):  # changed meanwhile: next time
                    return
            log.warning("turnguard recorder: more than %d turns open; the oldest is dropped", MAX_OPEN_TURNS)

    @hookimpl
    def turnguard_cycle_checked(self, turn: Ledger) -> None:
        record = self._record(turn)
        with record.lock:
            record.cycle_mark = (len(record.calls), record.dropped)

    @hookimpl
    def turnguard_retry(self, turn: Ledger) -> None:
        """The ledger discarded the current request's calls; so does the record."""
        record = self._record(turn)
        with record.lock:
            kept, record.dropped = record.cycle_mark
            del record.calls[kept:]
            record.index = {call: at for call, at in record.index.items() if at < kept}

    @hookimpl
    def turnguard_call_checked(self, turn: Ledger, call: ToolCall, verdict: Verdict) -> None:
        record = self._record(turn)
        digest = cached_digest(call)
        entry = _Call(call.name, digest.hex() if digest is not None else "")
        if verdict.action is Action.HALT:
            entry.outcome = HALTED_OUTCOME
        with record.lock:
            if len(record.calls) >= self.max_calls:
                record.dropped += 1
                return
            record.index[call] = len(record.calls)
            record.calls.append(entry)

    @hookimpl
    def turnguard_outcome_recorded(self, turn: Ledger, call: ToolCall, outcome: Outcome) -> None:
        record = self._turns.get(turn)
        if record is None:
            return
        with record.lock:
            at = record.index.pop(call, None)
            if at is not None:
                record.calls[at].outcome = outcome.value

    @hookimpl
    def turnguard_escalation_resolved(self, turn: Ledger, event: LoopDetectedEvent, response: str) -> None:
        record = self._record(turn)
        with record.lock:
            record.escalations.append(
                {
                    "threshold": str(event.threshold),
                    "level": str(event.level),
                    "answer": str(response),
                    "at_call": event.tool_calls,
                }
            )

    @hookimpl
    def turnguard_turn_ended(self, turn: Ledger, summary: TurnSummary) -> None:
        with self._lock:
            record = self._turns.pop(turn, None)
        if record is None:
            record = _TurnRecord()
        with record.lock:
            line = turn_line(summary, record.calls, dropped=record.dropped, escalations=record.escalations)
        self.write(line)

    def write(self, line: bytes) -> None:
        """Append ``line``, creating the folder on first use; failures are logged, never raised."""
        try:
            if not self._dir_ready:
                folder = os.path.dirname(self.path)
                if folder:
                    os.makedirs(folder, exist_ok=True)
                self._dir_ready = True
            append_line(self.path, line)
        except OSError as exc:
            log.warning("turnguard recorder: could not append to %s: %s", self.path, exc)


def ended_by(summary: TurnSummary) -> str:
    """The threshold that ended the turn, or the reason it ended (``completed``, ``error``, ...)."""
    return str(summary.threshold) if summary.threshold is not None else summary.reason


def turn_line(
    summary: TurnSummary,
    calls: list[_Call],
    *,
    dropped: int = 0,
    escalations: list[dict[str, Any]] | None = None,
) -> bytes:
    """One corpus-format JSON line (with its newline) for a finished turn."""
    data: dict[str, Any] = {
        "source": SOURCE,
        "id": summary.turn_id,
        "calls": [{"tool": c.tool, "args": c.digest, "outcome": c.outcome} for c in calls],
        "cycles": summary.cycles,
        "resolved": None,
        "ended_by": ended_by(summary),
        "agent": summary.agent_name,
        "conversation_id": summary.conversation_id,
        "tool_calls": summary.tool_calls,
        "calls_dropped": dropped,
        "escalations": escalations or [],
    }
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), default=str)  # ASCII: valid whatever the names
    return (text + "\n").encode("ascii")


def plugin_for(config: GuardConfig, **_: Any) -> Recorder | None:
    """The recorder when ``config.recorder_path`` is set, else nothing to register."""
    if not config.recorder_path:
        return None
    return Recorder(config.recorder_path)
