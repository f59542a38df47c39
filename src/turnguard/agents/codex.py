"""Codex's command hooks (tested with 0.169.0).

Events: ``UserPromptSubmit`` opens a turn (``turn_id`` names it; ``codex exec resume`` starts a new
one), ``PreModelRequest`` counts a model request (``max_cycles_per_turn``), ``PreToolUse`` checks a
call (``tool_use_id``: the model's ``call_id``), ``PostToolUse`` reports it, ``Stop`` stops the
turn (it ends when the stop is confirmed, ``ending``: another ``Stop`` hook may refuse it, and Codex
goes on with the same ``turn_id``), ``SessionEnd`` ends the session.
A refused call gets no ``PostToolUse``; it stays without an outcome, which never counts as a failure.

A sub-agent (``spawn_agent``) sends its events in the parent's session, each with its ``agent_id``
(``AgentEvent.thread``) and a ``turn_id`` of its own: its ``UserPromptSubmit`` (its task),
``PreModelRequest``, ``PreToolUse`` and ``PostToolUse`` (its ``transcript_path`` is its own), and
``SubagentStart``/``SubagentStop`` (ignored) in place of ``Stop``. They count in the session's open
turn (``hook``): the person pays for both.

``PostToolUse`` carries the command's output only, not whether it failed: the outcome is read from
the session's transcript (``transcript_path``), whose ``item_completed`` record of the call holds
its ``exit_code`` (0 is a success) or its ``status``, searched for from the file's end back (the
record holds the whole command twice and up to 64 KiB of its output, JSON-escaped; the records of
calls that ran beside it may follow it) within ``TRANSCRIPT_LIMIT``. A call the transcript does
not show there (yet) is an unknown outcome.

Answers: a reminder is ``additionalContext`` (a developer message the model reads); a halt is
``permissionDecision: "deny"`` with the reason the model reads (Codex accepts no ``continue:
false`` there: it would run the call), and every later call of the turn is denied alike. Codex
cannot be stopped by a hook in the middle of a turn, and its hooks cannot ask the person: turnguard
takes Codex sessions as unattended (``TURNGUARD_ATTENDED=1`` does not change that), so what would
be a question is a halt. A halt with an outcome replaces the call's output with the reason.
A cycle-cap halt at ``PreModelRequest`` cannot stop the request (Codex ignores the answer): the
next call is denied.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from turnguard.agents.events import AgentEvent, CommandHooks, Decision, Kind, common_fields, id_field, text_field

KINDS = {
    "UserPromptSubmit": Kind.TURN_START,
    "PreModelRequest": Kind.MODEL_REQUEST,
    "PreToolUse": Kind.TOOL_CHECK,
    "PostToolUse": Kind.TOOL_OUTCOME,
    "Stop": Kind.TURN_END,
    "SessionEnd": Kind.SESSION_END,
}
TRANSCRIPT_CHUNK = 64 * 1024
"""How much of the transcript is read at a time, from its end back."""
TRANSCRIPT_LIMIT = 16 * 1024 * 1024
"""How far back from the transcript's end a call's record is searched for, and so the most of it
held at once: a record that ends further back, or is larger, is not found, and the call's
outcome is unknown."""
TRANSCRIPT_TRIES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4)
"""Waits before each search (Codex writes the record about when it runs the hook; on a busy
machine later): under a second in all, and only while the record is not there."""


class Codex(CommandHooks):
    def read(self, payload: dict[str, Any], environ: Mapping[str, str], caller: int | None = None) -> AgentEvent:
        common = common_fields(payload, KINDS, turn_ref="turn_id", call_id="tool_use_id")
        common["transcript"] = text_field(payload, "transcript_path")
        common["thread"] = id_field(payload, "agent_id")
        kind = common["kind"]
        if kind is Kind.TOOL_OUTCOME:
            # (the id as Codex wrote it: the event's may stand as its digest, events.id_field)
            common.update(outcome=outcome_from_transcript(common["transcript"], text_field(payload, "tool_use_id")),
                          result=payload.get("tool_response"))
        return AgentEvent(**common)

    def attended(self, event: AgentEvent, environ: Mapping[str, str]) -> bool:
        return False

    def output(self, event: AgentEvent, decision: Decision) -> dict[str, Any]:
        if event.kind is Kind.TOOL_CHECK:
            if decision.kind == "remind":
                return self.specific(event, additionalContext=decision.message)
            return self.specific(event, permissionDecision="deny", permissionDecisionReason=decision.message)
        if event.kind is Kind.TOOL_OUTCOME:
            if decision.kind == "halt":
                return {"decision": "block", "reason": decision.message}
            return self.specific(event, additionalContext=decision.message)
        return {}

    def ran(self, event: AgentEvent, call_id: str | None) -> bool:
        """Codex waits for a step's post-tool hooks (parallel calls' too) before that agent's next
        ``PreModelRequest``; a call the transcript shows completed ran all the same, should its
        post event come later."""
        return outcome_from_transcript(event.transcript, call_id, tries=(0.0,)) != "unknown"


def outcome_from_transcript(path: str | None, call_id: str | None,
                            tries: tuple[float, ...] = TRANSCRIPT_TRIES) -> str:
    """``ok`` / ``error`` from the transcript's record of the call, ``unknown`` without one."""
    if not path or not call_id or not os.path.isfile(path):
        return "unknown"
    for wait in tries:
        if wait:
            time.sleep(wait)
        try:
            outcome = _search(path, call_id)
        except OSError:
            return "unknown"
        if outcome is not None:
            return outcome
    return "unknown"


def _search(path: str, call_id: str) -> str | None:
    """The outcome in the call's ``item_completed`` record, searched for from the transcript's end
    back to the call's own ``function_call`` record (written before it runs) at most."""
    needle = f'"id":"{call_id}"'.encode("utf-8", "surrogatepass")  # (a lone surrogate: no record has it)
    called = f'"call_id":"{call_id}"'.encode("utf-8", "surrogatepass")
    with open(path, "rb") as f:
        for line in _lines_backwards(f):
            if needle in line and b'"item_completed"' in line:
                outcome = _completed(line)
                if outcome is not None:
                    return outcome
            elif called in line and b'"function_call"' in line and _is_call(line, call_id):
                return None
    return None


def _lines_backwards(f: BinaryIO) -> Iterator[bytes]:
    """The file's lines, last first, each whole within its last ``TRANSCRIPT_LIMIT`` bytes (a line
    that is not is left out). Reads ``TRANSCRIPT_CHUNK`` at a time: a long line is joined once."""
    size = os.fstat(f.fileno()).st_size
    pos = size
    start: list[bytes] = []  # pieces of the line whose start is not read yet, last piece first
    while pos > 0 and size - pos < TRANSCRIPT_LIMIT:
        n = min(TRANSCRIPT_CHUNK, pos, TRANSCRIPT_LIMIT - (size - pos))
        pos -= n
        f.seek(pos)
        block = f.read(n)
        if len(block) != n:
            return
        first, *rest = block.split(b"\n")
        if rest:
            rest[-1] = b"".join([rest[-1], *reversed(start)])
            start = []
            yield from reversed(rest)
        start.append(first)
    if pos == 0 or _byte_at(f, pos - 1) == b"\n":
        yield b"".join(reversed(start))


def _byte_at(f: BinaryIO, pos: int) -> bytes:
    f.seek(pos)
    return f.read(1)


def _is_call(line: bytes, call_id: str) -> bool:
    try:
        payload = json.loads(line)["payload"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return False
    return isinstance(payload, dict) and payload.get("type") == "function_call" and payload.get("call_id") == call_id


def _completed(line: bytes) -> str | None:
    try:
        item = json.loads(line)["payload"]["item"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(item, dict):
        return None
    code = item.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return "ok" if code == 0 else "error"
    status = item.get("status")
    if status in ("failed", "declined"):
        return "denied" if status == "declined" else "error"
    return "ok" if status == "completed" else None


PROTOCOL = Codex(agent="codex", can_ask=False, context_at_check=True)
