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
its ``exit_code`` (0 is a success) or its ``status``. A call the transcript does not show yet is an
unknown outcome.

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
from collections.abc import Mapping
from typing import Any

from turnguard.agents.events import AgentEvent, CommandHooks, Decision, Kind, common_fields, id_field, text_field

KINDS = {
    "UserPromptSubmit": Kind.TURN_START,
    "PreModelRequest": Kind.MODEL_REQUEST,
    "PreToolUse": Kind.TOOL_CHECK,
    "PostToolUse": Kind.TOOL_OUTCOME,
    "Stop": Kind.TURN_END,
    "SessionEnd": Kind.SESSION_END,
}
TRANSCRIPT_TAIL = 512 * 1024
"""How much of the transcript's end is searched for a call's record."""
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
    needle = f'"id":"{call_id}"'.encode("utf-8", "surrogatepass")  # (a lone surrogate: no record has it)
    for wait in tries:
        if wait:
            time.sleep(wait)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - TRANSCRIPT_TAIL))
                tail = f.read()
        except OSError:
            return "unknown"
        for line in reversed(tail.splitlines()):
            if needle in line and b'"item_completed"' in line:
                outcome = _completed(line)
                if outcome is not None:
                    return outcome
    return "unknown"


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
