"""Claude Code's command hooks (tested with 2.1.328).

Events: ``UserPromptSubmit`` opens a turn (``prompt_id`` names it), ``PreToolUse`` checks a call
(``tool_use_id``), ``PostToolUse`` / ``PostToolUseFailure`` report it (a failure with
``is_interrupt`` is an unknown outcome), ``PostToolBatch`` closes a model step: a checked call
without a post event by then was refused (a permission, or a hook), which is a denied outcome.
``Stop`` stops the turn (it ends when the stop is confirmed, ``ending``: another ``Stop`` hook may
refuse it, and Claude Code goes on with the same ``prompt_id``), ``SessionEnd`` ends the session.
A subagent's calls (the ``Agent``/Task tool) carry the session's and the prompt's ids and count in
the turn of the prompt that started it: the person pays for both. A background subagent's report
comes back as a prompt of its own (``<task-notification>``): Claude Code makes it a turn, and so
does turnguard. A background subagent's call after its prompt's turn ended carries that prompt's
id: it counts in the open turn. Claude Code has no event before a model request, so
``max_cycles_per_turn`` cannot act here.

Answers: a reminder is ``additionalContext`` (the model reads it); a question is
``permissionDecision: "ask"`` (Claude Code's own permission prompt, interactive sessions only);
a halt at ``PreToolUse`` is ``permissionDecision: "deny"`` with the reason the model reads, and
``continue: false``, which ends the run (``claude -p`` reports ``terminal_reason: hook_stopped``).
A halt with an outcome gives the model the reason (``decision: "block"`` and ``additionalContext``)
and stops the run: from ``PostToolUse`` itself, and after a failure (``PostToolUseFailure``, which
cannot stop a run) from the step's ``PostToolBatch``, before the next model request.

Interactive or headless: Claude Code tells its hooks in ``CLAUDE_CODE_SESSION_ATTENDED`` (``0``
under ``claude -p``), and how it was started in ``CLAUDE_CODE_ENTRYPOINT`` (``cli`` is the
interactive terminal, ``sdk-cli`` is ``claude -p``), read when the first is not set.
``TURNGUARD_ATTENDED=1|0`` overrides both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnguard.agents.events import (
    AgentEvent,
    CommandHooks,
    Decision,
    Kind,
    attended_from_env,
    common_fields,
    id_field,
)

KINDS = {
    "UserPromptSubmit": Kind.TURN_START,
    "PreToolUse": Kind.TOOL_CHECK,
    "PostToolUse": Kind.TOOL_OUTCOME,
    "PostToolUseFailure": Kind.TOOL_OUTCOME,
    "PostToolBatch": Kind.STEP_END,
    "Stop": Kind.TURN_END,
    "StopFailure": Kind.TURN_END,
    "SessionEnd": Kind.SESSION_END,
}
INTERACTIVE_ENTRYPOINTS = frozenset({"cli"})


class ClaudeCode(CommandHooks):
    def read(self, payload: dict[str, Any], environ: Mapping[str, str], caller: int | None = None) -> AgentEvent:
        common = common_fields(payload, KINDS, turn_ref="prompt_id", call_id="tool_use_id")
        kind, name = common["kind"], common["name"]
        if kind is Kind.STEP_END:
            common["batch"] = _batch(payload.get("tool_calls"))
            common["hook_denied"] = _hook_denied(payload.get("tool_calls"))
        if kind is Kind.TOOL_OUTCOME:
            if name == "PostToolUse":
                common.update(outcome="ok", result=payload.get("tool_response"))
            else:
                interrupted = payload.get("is_interrupt") is True
                common.update(outcome="unknown" if interrupted else "error", result=payload.get("error"))
        if name == "StopFailure":
            common["reason"] = "error"
        return AgentEvent(**common)

    def attended(self, event: AgentEvent, environ: Mapping[str, str]) -> bool:
        said = environ.get("CLAUDE_CODE_SESSION_ATTENDED")
        if said in ("0", "1") and not environ.get("TURNGUARD_ATTENDED"):
            return said == "1"
        return attended_from_env(environ, "CLAUDE_CODE_ENTRYPOINT", INTERACTIVE_ENTRYPOINTS)

    def output(self, event: AgentEvent, decision: Decision) -> dict[str, Any]:
        message = decision.message
        stop: dict[str, Any] = {"continue": False, "stopReason": message}
        if event.kind is Kind.TOOL_CHECK:
            if decision.kind == "remind":
                return self.specific(event, additionalContext=message)
            if decision.kind == "ask":
                return self.specific(event, permissionDecision="ask", permissionDecisionReason=message)
            return {**self.specific(event, permissionDecision="deny", permissionDecisionReason=message), **stop}
        if event.kind is Kind.TOOL_OUTCOME:
            if decision.kind != "halt":
                return self.specific(event, additionalContext=message)
            answer = {"decision": "block", "reason": message, **self.specific(event, additionalContext=message)}
            # (from PostToolUseFailure Claude Code does not stop: its PostToolBatch does)
            return {**answer, **stop} if event.name == "PostToolUse" else answer
        if event.kind is Kind.STEP_END and decision.kind == "halt":
            return stop
        return {}


def _batch(calls: Any) -> tuple[tuple[str, Any, str | None], ...]:
    if not isinstance(calls, list):
        return ()
    return tuple((c["tool_name"], c.get("tool_input"), id_field(c, "tool_use_id")) for c in calls
                 if isinstance(c, dict) and isinstance(c.get("tool_name"), str) and c["tool_name"])


def _hook_denied(calls: Any) -> frozenset[str]:
    """The ids of the calls a ``PreToolUse`` hook denied: Claude Code gives the model
    ``PreToolUse:TOOL hook error: REASON`` as their result (2.1.328), where a person's "No" to a
    permission question interrupts the turn."""
    if not isinstance(calls, list):
        return frozenset()
    return frozenset(call_id for c in calls if isinstance(c, dict) and isinstance(c.get("tool_name"), str)
                     and isinstance(c.get("tool_response"), str)
                     and c["tool_response"].startswith(f"PreToolUse:{c['tool_name']} hook error:")
                     and (call_id := id_field(c, "tool_use_id")) is not None)


PROTOCOL = ClaudeCode(agent="claude-code", can_ask=True, context_at_check=True)
