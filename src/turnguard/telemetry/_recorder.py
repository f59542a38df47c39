"""The local recorder: one JSON line per finished turn, in the corpus format, for calibration.

Enabled by ``GuardConfig(recorder_path=...)`` (``turnguard demo`` writes ``.turnguard/turns.jsonl``).
Each line is the corpus format (``source``, ``id``, ``calls[{tool, args, outcome, result}]``,
``cycles``, ``resolved``, ``cohort``, ``ended_by``) with the call's keyed key digest in ``args``
instead of its arguments, so ``turnguard calibrate`` can replay the turn (identical calls have
identical digests) while the file holds no tool arguments; ``result`` (only when known) is the
keyed digest of the result the host passed, for the ``stateful_tools`` (whose results are keyed
anyway) or, with ``GuardConfig(recorder_results=True)``, for every tool: never the result itself.
A call whose outcome never came before its turn ended has ``outcome`` ``unfinished`` (its tool
span's word), so calibrate replays it as the live guard saw it: waiting.
Extra keys: ``agent``, ``conversation_id``, ``tool_calls`` (the true count), ``calls_dropped``,
``escalations`` (the users' answers), and what calibrate needs to know which limits could have
cut the turn and when it ran: ``policy`` (the ``GuardConfig.name`` in force: the probe's on a
probe turn), ``limits`` (``turn_limits``) and ``started_at`` / ``ended_at`` (Unix seconds); when
not 0, ``calls_unrecorded`` (calls of the turn the line neither lists nor counts in
``calls_dropped``) and ``escalations_dropped``.

Writes are whole-line appends: the line is built in memory and written with one ``os.write`` on
an ``O_APPEND`` descriptor under an exclusive ``flock``, so concurrent writers (threads or
processes) never interleave and a crashed process leaves whole lines only. A full disk never
leaves half a line either: a short write is cut back off the file (``ftruncate`` to where the
line began, under the lock), and a file found ending mid-line (written by something else) gets
its newline before the next record. A line that could not be written (``ENOSPC``, ``EIO``) is
kept, up to ``MAX_PENDING_BYTES``, and written before the next one once space frees (also at
interpreter exit), so no finished turn is lost to a disk that was full for a while; a forked
child leaves them to its parent, so none is written twice. Memory is
bounded: at most ``MAX_RECORDED_CALLS`` calls are kept per turn; later calls are counted in
``calls_dropped`` (and in ``tool_calls``) only; at most ``MAX_OPEN_TURNS`` turns are collected at
once.

A turn suspended and resumed (``Turn.suspend``, ``Guard.resume``) is one turn: its record travels
in the snapshot (``plugins.recorder``, ``recorder_state``), so the process that finishes it writes
the line of the whole turn. A snapshot without that section (taken by a guard without a recorder)
leaves the calls before it unlisted: the line says how many in ``calls_unrecorded``.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turnguard._keys import KEY_CHECK, KEY_RESULT, CallKey, cached_digest
from turnguard._model import Action, Outcome, cut_text
from turnguard._plugins import disabled_policies
from turnguard.hookspecs import hookimpl
from turnguard.telemetry import _recorder_state as recorder_state
from turnguard.telemetry._clock import turn_end_ns, turn_start_ns, unix_s
from turnguard.telemetry._names import CALL_UNFINISHED
from turnguard.telemetry._recorder_state import Carried

if TYPE_CHECKING:
    from turnguard._config import GuardConfig
    from turnguard._ledger import Ledger
    from turnguard._model import LoopDetectedEvent, ToolCall, TurnSummary, Verdict
    from turnguard._task_results import ResultLabels

log = logging.getLogger("turnguard.telemetry")

SOURCE = "turnguard"
"""The ``source`` of every recorded line."""
MAX_RECORDED_CALLS = 10_000
"""Calls kept per turn: ten times the default hard backstop (1000), so a default-configured turn
is always recorded whole. Past it, calls are counted (``calls_dropped``) but not listed."""
MAX_RECORDED_ESCALATIONS = MAX_RECORDED_CALLS
"""Users' answers kept per turn; past it they are counted (``escalations_dropped``) but not listed."""
MAX_OPEN_TURNS = 10_000
"""Turns collected at once; past it the oldest is dropped unwritten (a host that never ends its
turns cannot grow memory without bound)."""
MAX_PENDING_BYTES = 8 * 1024 * 1024
"""Lines that could not be written yet (a full disk) are kept up to this many bytes; past it the
oldest are dropped, with a warning."""
WARN_EVERY_S = 60.0
"""While appends fail (a full disk), one warning per this many seconds says so, with how many
failed since the last one: not a line per turn."""
HALTED_OUTCOME = Outcome.DENIED.value
"""The outcome recorded for a call turnguard halted (a policy refused it, so it did not run),
whatever the host reports for it later: its tool span, ended at the check, says the same."""


@dataclass(slots=True)
class _Call:
    tool: str
    digest: str
    outcome: str = CALL_UNFINISHED
    result: str | None = None
    """The result's keyed digest (hex), when the guard keyed it (``keys.cached_result``)."""
    cycle: int = 0
    """The model requests begun in the turn when the call was checked (0: none): calibrate places
    the requests where the live guard counted them, so the cycle cap halts where it did."""
    retries: int = 0
    """``retry()`` calls in the turn before the call was checked: calibrate rolls the request back
    (repeats and streaks cleared, as the live ledger did) before the call whose count rose."""


@dataclass(slots=True)
class _TurnRecord:
    calls: list[_Call] = field(default_factory=list)
    index: dict[Any, int] = field(default_factory=dict)
    """Calls awaiting an outcome: ToolCall object -> position in ``calls`` (of its earliest check)."""
    later: dict[Any, list[int]] = field(default_factory=dict)
    """An object checked again while it waited: the positions of its later checks, in check order
    (the guard credits its outcomes check by check, as ``index`` then ``later`` hand them out)."""
    dropped: int = 0
    cycle_mark: tuple[int, int] = (0, 0)
    """(len(calls), dropped) when the current model request began: where a retry rolls back to."""
    escalations: list[dict[str, Any]] = field(default_factory=list)
    escalations_dropped: int = 0
    restored: dict[int, int] = field(default_factory=dict)
    """Calls that waited for an outcome when the turn's snapshot was taken: check number ->
    position in ``calls`` (the resumed turn hands their outcomes over on calls of its own)."""
    started_at: float | None = None
    """When the turn opened (Unix seconds), for a turn resumed from a snapshot."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def append_line(path: str, line: bytes) -> None:
    """Append one whole line, or nothing: a single ``write(2)`` on an ``O_APPEND`` descriptor,
    under an exclusive ``flock`` so that other appenders neither interleave nor land between the
    write and its repair.

    A short write (a full disk) is cut back off the file before the ``OSError`` is raised, so it
    never leaves half a line; a file that already ends mid-line (written by something else, or
    cut by a crash of the file system) gets a newline first, so this line stays whole.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _lock(fd)
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            line = b"\n" + line
        written = os.write(fd, line)
        if written != len(line):
            os.ftruncate(fd, start)
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes, cut back off); disk full?",
                          path)
    finally:
        os.close(fd)  # also releases the lock


def _lock(fd: int) -> None:
    """An exclusive ``flock``, where the platform and file system have one (else ``O_APPEND``
    alone, as NFS without a lock daemon gives: still whole lines, only the repair may race)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


class Recorder:
    """Collects each turn's calls (digests and outcomes) and appends a line when the turn ends."""

    def __init__(self, path: str, *, max_calls: int = MAX_RECORDED_CALLS) -> None:
        self.path = os.fspath(path)
        self.max_calls = max_calls
        self._turns: dict[Ledger, _TurnRecord] = {}
        self._lock = threading.Lock()
        self._dir_ready = False
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._write_lock = threading.Lock()
        self.lines_lost = 0
        """Lines dropped because more than ``MAX_PENDING_BYTES`` waited for the disk."""
        self._unsaid = 0
        """Failed appends since the last warning (``WARN_EVERY_S``)."""
        self._failing = False
        _LIVE.add(self)

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
            if record.later:
                later = ((call, [at for at in ats if at < kept]) for call, ats in record.later.items())
                record.later = {call: ats for call, ats in later if ats}
            if record.restored:
                record.restored = {seq: at for seq, at in record.restored.items() if at < kept}

    @hookimpl
    def turnguard_call_checked(self, turn: Ledger, call: ToolCall, verdict: Verdict) -> None:
        record = self._record(turn)
        digest = cached_digest(call)
        entry = _Call(call.name, digest.hex() if digest is not None else "", cycle=turn.cycles,
                      retries=turn.retries)
        halted = verdict.action is Action.HALT
        if halted:
            entry.outcome = HALTED_OUTCOME
        with record.lock:
            if len(record.calls) >= self.max_calls:
                record.dropped += 1
                return
            at = len(record.calls)
            if not halted and record.index.setdefault(call, at) != at:  # a halted call awaits no outcome
                record.later.setdefault(call, []).append(at)
            record.calls.append(entry)

    @hookimpl
    def turnguard_outcome_recorded(self, turn: Ledger, call: ToolCall, outcome: Outcome) -> None:
        record = self._turns.get(turn)
        if record is None:
            return
        key: CallKey | None = call.key  # keys.cached_result, inlined
        result = key[KEY_RESULT].hex() if key is not None and len(key) > KEY_RESULT else None
        with record.lock:
            at = record.index.pop(call, None)
            if record.later and call in record.later:
                ats = record.later[call]
                record.index[call] = ats.pop(0)
                if not ats:
                    del record.later[call]
            if at is None and record.restored:  # a call that waited across the snapshot: its check number
                at = record.restored.pop(key[KEY_CHECK], None) if key is not None else None
            if at is not None:
                entry = record.calls[at]
                entry.outcome = outcome.value
                entry.result = result

    @hookimpl
    def turnguard_escalation_resolved(self, turn: Ledger, event: LoopDetectedEvent, response: str) -> None:
        record = self._record(turn)
        with record.lock:
            if len(record.escalations) >= MAX_RECORDED_ESCALATIONS:
                record.escalations_dropped += 1
                return
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
        # the turn span's instants (_clock.py); a resumed turn opened earlier: record.started_at
        started_at, ended_at = unix_s(turn_start_ns(turn)), unix_s(turn_end_ns(turn, summary))
        config = turn.config
        with record.lock:
            if record.started_at is not None:
                started_at = min(record.started_at, started_at)
            unrecorded = summary.tool_calls - len(record.calls) - record.dropped
            line = turn_line(summary, record.calls, dropped=record.dropped, escalations=record.escalations,
                             policy=config.name, limits=turn_limits(config), started_at=started_at,
                             ended_at=ended_at, unrecorded=max(unrecorded, 0),
                             escalations_dropped=record.escalations_dropped)
        self.write(line)

    @hookimpl
    def turnguard_turn_snapshot(self, turn: Ledger) -> dict[str, Any] | None:
        """The turn's record so far, for the process that finishes the turn (``recorder_state``)."""
        record = self._turns.get(turn)
        if record is None:
            return None
        with record.lock:
            return recorder_state.write(_carried(record, turn))

    @hookimpl
    def turnguard_turn_resumed(self, turn: Ledger, state: Any) -> None:
        """The resumed turn's record goes on from the snapshot's, checked field by field
        (``plugins.recorder.*``). Without one (a guard without a recorder took the snapshot) it
        starts empty: the line counts the calls before the resume in ``calls_unrecorded``."""
        if state is None:
            return
        carried = recorder_state.read(state, checks=turn.checks, max_calls=self.max_calls,
                                      max_escalations=MAX_RECORDED_ESCALATIONS)
        record = self._record(turn)
        with record.lock:
            record.calls = [_Call(*call) for call in carried.calls]
            record.index.clear()
            record.later.clear()
            record.dropped, record.cycle_mark = carried.dropped, carried.cycle_mark
            record.restored = dict(carried.awaiting or {})
            record.escalations = list(carried.escalations or [])
            record.escalations_dropped = carried.escalations_dropped
            record.started_at = carried.started_at

    @hookimpl
    def turnguard_turn_suspended(self, turn: Ledger) -> None:
        """Put aside to be resumed: no line here (the process that finishes the turn writes it)."""
        with self._lock:
            self._turns.pop(turn, None)

    @hookimpl
    def turnguard_turn_result(self, resolved: bool | None, status: str, labels: ResultLabels | None) -> None:
        """A result that came after the turn's line (from this process or, with the turn's result
        token, from another): a result record (``_calibrate/results.py``)."""
        if status == "accepted" and labels is not None:
            self.write(result_line(labels, bool(resolved)))

    def write(self, line: bytes) -> None:
        """Append ``line`` after any lines still waiting for the disk, creating the folder on first
        use; failures are logged and the line kept for the next write, never raised."""
        with self._write_lock:
            self._pending.append(line)
            self._pending_bytes += len(line)
            self._drain()

    def flush(self) -> bool:
        """Write the lines still waiting for the disk; ``True`` when none is left."""
        with self._write_lock:
            return self._drain()

    @property
    def pending(self) -> int:
        """Lines not written yet (the disk was full)."""
        return len(self._pending)

    def _drain(self) -> bool:
        while self._pending:
            line = self._pending[0]
            try:
                if not self._dir_ready:
                    folder = os.path.dirname(self.path)
                    if folder:
                        os.makedirs(folder, exist_ok=True)
                    self._dir_ready = True
                append_line(self.path, line)
            except OSError as exc:
                self._bound_pending()
                self._warn(exc)
                return False
            self._pending.popleft()
            self._pending_bytes -= len(line)
        if self._failing:
            log.info("turnguard recorder: appending to %s again", self.path)
            self._failing, self._unsaid = False, 0
        return True

    def _warn(self, exc: OSError) -> None:
        """An append failed: a warning, at most one per ``WARN_EVERY_S``."""
        self._failing = True
        self._unsaid += 1
        now = time.monotonic()
        last = _WARNED_AT.get(self.path)
        if last is not None and now - last < WARN_EVERY_S:
            return
        _WARNED_AT[self.path] = now
        since = f"; {self._unsaid} failed appends since the last warning" if self._unsaid > 1 else ""
        log.warning("turnguard recorder: could not append to %s (%d line(s) kept for the next write, %d dropped%s): "
                    "%s", self.path, len(self._pending), self.lines_lost, since, exc)
        self._unsaid = 0

    def after_fork_in_child(self) -> None:
        """In a forked child: none of the parent's held-back lines (the parent writes them; written
        by both, a turn would be on the file twice), and locks of its own (a thread of the parent
        may have held one at the fork, and would never release it here)."""
        self._pending.clear()
        self._pending_bytes = 0
        self._failing, self._unsaid = False, 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        for record in list(self._turns.values()):
            record.lock = threading.Lock()

    def _bound_pending(self) -> None:
        while self._pending_bytes > MAX_PENDING_BYTES and len(self._pending) > 1:
            self._pending_bytes -= len(self._pending.popleft())
            self.lines_lost += 1  # (said by the next warning)


_LIVE: weakref.WeakSet[Recorder] = weakref.WeakSet()
_WARNED_AT: dict[str, float] = {}
"""When a failed append to each path was last warned about: one pace per path and process,
however many guards (a probe's, one per demo scenario) record there."""


@atexit.register
def _flush_at_exit() -> None:
    """A last try for lines a full disk held back (a recorder is not closed by its host)."""
    for recorder in list(_LIVE):
        if recorder.pending:
            recorder.flush()


def _after_fork_in_child() -> None:
    for recorder in list(_LIVE):
        recorder.after_fork_in_child()


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _carried(record: _TurnRecord, turn: Ledger) -> Carried:
    """``record`` as a snapshot carries it: the calls still waiting by their check number (a
    call's key names the check; one whose key another check replaced is left unmatched)."""
    waiting = dict(record.restored)
    for call, at in record.index.items():
        key: CallKey | None = call.key
        seq = key[KEY_CHECK] if key is not None else None
        if type(seq) is int and 0 < seq <= turn.checks:
            waiting.setdefault(seq, at)
    started_at = record.started_at
    if started_at is None:
        started_at = unix_s(turn_start_ns(turn))
    return Carried(started_at, [(c.tool, c.digest, c.outcome, c.result, c.cycle, c.retries) for c in record.calls],
                   record.dropped,
                   record.cycle_mark, waiting, record.escalations, record.escalations_dropped)


def ended_by(summary: TurnSummary) -> str:
    """The threshold that ended the turn, or the reason it ended (``completed``, ``error``, ...)."""
    return str(summary.threshold) if summary.threshold is not None else summary.reason


def turn_limits(config: GuardConfig) -> dict[str, Any]:
    """The limits a turn ran under (the recorder line's ``limits``): every setting that changes what
    a replay of the turn decides. ``hard_cap`` is the effective one (N when explicit, S x m when
    adaptive, ``None`` when disabled), ``soft_cap`` S (adaptive only), ``max_cycles`` 0 when
    unbounded, the lists (``stateful_tools``, ``streak_exempt_tools``, ``disabled_policies``: the
    built-in policies turned off) empty when none is listed."""
    mode = config.cap_mode
    return {
        "cap_mode": mode,
        "soft_cap": config.soft_cap if mode == "adaptive" else None,
        "hard_cap": config.hard_cap,
        "stuck_repeat_threshold": config.stuck_repeat_threshold,
        "streak_warn_at": config.streak_warn_at,
        "streak_stop_at": config.streak_stop_at,
        "max_cycles": config.max_cycles_per_turn,
        "stateful_tools": list(config.stateful_tools),
        "streak_exempt_tools": list(config.streak_exempt_tools),
        "stuck_signal": config.stuck_signal,
        "streak_stop_on": config.streak_stop_on,
        "cycle_repeat_warn_at": config.cycle_repeat_warn_at,
        "cycle_repeat_stop_at": config.cycle_repeat_stop_at,
        "cycle_repeat_max_period": config.cycle_repeat_max_period,
        "remind_model": config.remind_model,
        "max_tracked_keys": config.max_tracked_keys,
        "disabled_policies": list(disabled_policies(config)),
    }


def turn_line(
    summary: TurnSummary,
    calls: list[_Call],
    *,
    dropped: int = 0,
    escalations: list[dict[str, Any]] | None = None,
    policy: str | None = None,
    limits: dict[str, Any] | None = None,
    started_at: float | None = None,
    ended_at: float | None = None,
    unrecorded: int = 0,
    escalations_dropped: int = 0,
) -> bytes:
    """One corpus-format JSON line (with its newline) for a finished turn (``policy``, ``limits``
    and the times are left out when not given; ``calls_unrecorded`` and ``escalations_dropped``
    when 0)."""
    data: dict[str, Any] = {
        "source": SOURCE,
        "id": cut_text(summary.turn_id) if isinstance(summary.turn_id, str) else summary.turn_id,
        "calls": [_call_json(c) for c in calls],
        "cycles": summary.cycles,
        "resolved": summary.resolved,
        "cohort": str(summary.cohort),
        "ended_by": ended_by(summary),
        "agent": summary.agent_name,
        "conversation_id": summary.conversation_id,
        "tool_calls": summary.tool_calls,
        "calls_dropped": dropped,
        "escalations": escalations or [],
    }
    extra = (("policy", policy), ("limits", limits), ("started_at", started_at), ("ended_at", ended_at),
             ("resumed_from", summary.resumed_from), ("fresh_state", list(summary.fresh_state) or None),
             ("calls_unrecorded", unrecorded or None), ("escalations_dropped", escalations_dropped or None))
    data.update((key, value) for key, value in extra if value is not None)
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), default=str)  # ASCII: valid whatever the names
    return (text + "\n").encode("ascii")


def _call_json(call: _Call) -> dict[str, Any]:
    """A call as the line lists it; ``result``, ``cycle`` and ``retries`` only when known and not 0."""
    data: dict[str, Any] = {"tool": call.tool, "args": call.digest, "outcome": call.outcome}
    if call.result is not None:
        data["result"] = call.result
    if call.cycle:
        data["cycle"] = call.cycle
    if call.retries:
        data["retries"] = call.retries
    return data


def result_line(labels: ResultLabels, resolved: bool) -> bytes:
    """A late result record for ``turnguard calibrate``: ``{"result_for": <turn id>, "resolved":
    ...}``, with what the turn's labels say (``policy``, ``cohort``, ``ended_by``, ``tool_calls``;
    a label a result token had no room for is left out), ``from_token`` (reported in another
    process than the turn's) and ``reported_at`` (when it was taken, Unix seconds: calibrate keeps
    a turn's earliest result)."""
    data: dict[str, Any] = {"source": SOURCE, "result_for": labels.turn_id, "resolved": resolved,
                            "cohort": labels.cohort, "tool_calls": labels.tool_calls}
    dropped = labels.dropped
    if "policy" not in dropped and labels.policy is not None:
        data["policy"] = labels.policy
    if labels.threshold is not None:
        data["ended_by"] = labels.threshold
    elif "threshold" not in dropped and "reason" not in dropped and labels.reason is not None:
        data["ended_by"] = labels.reason
    data["from_token"] = labels.remote
    if labels.reported_ns is not None:
        data["reported_at"] = unix_s(labels.reported_ns)
    return (json.dumps(data, ensure_ascii=True, separators=(",", ":"), default=str) + "\n").encode("ascii")


def plugin_for(config: GuardConfig, **_: Any) -> Recorder | None:
    """The recorder when ``config.recorder_path`` is set, else nothing to register."""
    if not config.recorder_path:
        return None
    return Recorder(config.recorder_path)
