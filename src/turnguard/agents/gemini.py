"""Gemini CLI's command hooks (tested with 0.61.0).

Events: ``BeforeAgent`` opens a turn, ``BeforeModel`` counts a model request
(``max_cycles_per_turn``), ``BeforeTool`` checks a call, ``AfterTool`` reports it, ``AfterAgent``
stops the turn (it ends at the next ``BeforeAgent`` or ``SessionEnd``, ``ending``), ``SessionEnd``
ends the session. A refused ``AfterAgent`` comes back as a ``BeforeAgent`` with the refusal as its
prompt, which no field tells from a new prompt; but a headless run (``gemini -p``) takes one prompt
per process, so there a ``BeforeAgent`` names its turn by the run's process (``headless_run``), and
a second one of the same run goes on with the turn. An interactive session's opens a turn.
Gemini CLI passes no call id: an outcome belongs to the earliest waiting call with the same tool and
arguments (identical parallel calls are alike anyway), found by their digest (``hook._take_waiting``).
A failure is a ``tool_response`` with an ``error``, or a shell call whose output ends with a
non-zero ``Exit Code: N``.

Answers: a reminder is ``additionalContext``, which Gemini CLI gives the model from ``AfterTool``
only: one due at a check goes with that call's outcome. A halt is ``decision: "deny"`` with the
reason the model reads and ``continue: false``, which stops the run (from ``BeforeTool``,
``AfterTool`` and ``BeforeModel``). Gemini CLI's hooks cannot ask the person: turnguard takes its
sessions as unattended unless ``TURNGUARD_ATTENDED=1``, and then a question is put to the model
as a reminder to ask the person, the call allowed.

Gemini CLI has a loop detector of its own (on by default): it stops a run after a few identical
calls, before turnguard's streak stop; ``{"model": {"disableLoopDetection": true}}`` in its
settings leaves identical calls to turnguard.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from turnguard.agents import processes
from turnguard.agents.events import AgentEvent, CommandHooks, Decision, Kind, attended_from_env, common_fields

KINDS = {
    "BeforeAgent": Kind.TURN_START,
    "BeforeModel": Kind.MODEL_REQUEST,
    "BeforeTool": Kind.TOOL_CHECK,
    "AfterTool": Kind.TOOL_OUTCOME,
    "AfterAgent": Kind.TURN_END,
    "SessionEnd": Kind.SESSION_END,
}


class Gemini(CommandHooks):
    def read(self, payload: dict[str, Any], environ: Mapping[str, str], caller: int | None = None) -> AgentEvent:
        common = common_fields(payload, KINDS)
        kind = common["kind"]
        if kind is Kind.TOOL_OUTCOME:
            response = payload.get("tool_response")
            common.update(outcome=outcome_of(response), result=result_of(response))
        elif kind is Kind.TURN_START and caller is not None:
            common["turn_ref"] = headless_run(caller)
        return AgentEvent(**common)

    def attended(self, event: AgentEvent, environ: Mapping[str, str]) -> bool:
        return attended_from_env(environ, "TURNGUARD_ATTENDED", frozenset())

    def output(self, event: AgentEvent, decision: Decision) -> dict[str, Any]:
        if decision.kind == "halt":
            answer: dict[str, Any] = {"continue": False, "stopReason": decision.message}
            if event.kind in (Kind.TOOL_CHECK, Kind.MODEL_REQUEST):
                answer.update(decision="deny", reason=decision.message)
            elif event.kind is Kind.TOOL_OUTCOME:
                answer.update(self.specific(event, additionalContext=decision.message))
            return answer
        if event.kind is Kind.TOOL_OUTCOME:
            return self.specific(event, additionalContext=decision.message)
        return {}


def headless_run(caller: int) -> str | None:
    """The headless Gemini CLI run whose hook ``caller`` is (or is below), named by its process
    (``run:PID:START``); ``None`` when no Gemini CLI process is found above it or its run may take
    more than one prompt. A wrong ``None`` only splits a turn at a refused stop; a wrong name would
    merge two prompts, so only a run its arguments make headless for sure is named."""
    for process in processes.ancestors(caller):
        arguments = gemini_arguments(process.argv)
        if arguments is not None:
            return f"run:{process.identity}" if headless(arguments) else None
    return None


def gemini_arguments(argv: tuple[str, ...]) -> tuple[str, ...] | None:
    """Gemini CLI's own arguments when ``argv`` runs it (``node [OPTIONS] …/gemini[.js] ARGS``, or
    its launcher run directly), else ``None``."""
    for place, word in enumerate(argv[:MAX_SCRIPT_PLACE]):
        if place and word.startswith("-"):
            continue  # (node's own options)
        if os.path.basename(word).removesuffix(".js") == "gemini":
            return argv[place + 1:]
        if place:
            return None
    return None


MAX_SCRIPT_PLACE = 4
"""Where in a process's arguments Gemini CLI's script may stand: after node and its options (the
CLI relaunches itself with a memory option)."""


def headless(arguments: tuple[str, ...]) -> bool:
    """Whether Gemini CLI's ``arguments`` make its run headless for sure: a ``-p``/``--prompt``,
    and no option that makes it interactive (``-i``, ``--prompt-interactive``, ``--acp``,
    ``--experimental-acp``, in any spelling its parser takes). Any other start (a positional
    prompt, a piped stdin) may be headless too, but is not taken as one."""
    names = set()
    for word in arguments:
        if word == "--":
            break
        if word.startswith("--"):
            names.add(word[2:].partition("=")[0].replace("-", "").replace("_", "").lower())
        elif word.startswith("-") and len(word) > 1:
            names.update(word[1:])  # (short options together: -yp)
    return not names & INTERACTIVE_OPTIONS and bool(names & PROMPT_OPTIONS)


PROMPT_OPTIONS = frozenset({"p", "prompt"})
"""The options that give a Gemini CLI run its one prompt (spelt as ``headless`` reads them: no
dashes, lower case)."""
INTERACTIVE_OPTIONS = frozenset({"i", "promptinteractive", "acp", "experimentalacp"})
"""The options that make a Gemini CLI run take prompts one after another (spelt alike)."""


def outcome_of(response: Any) -> str:
    if not isinstance(response, dict):
        return "ok"
    if response.get("error"):
        return "error"
    content = response.get("llmContent")
    if isinstance(content, str):
        code = trailer(content).get("Exit Code")
        if code is not None and code.strip() not in ("0", ""):
            return "error"
    return "ok"


def trailer(content: str) -> dict[str, str]:
    """The lines Gemini CLI writes after a shell command's output (``Exit Code: 1``, ``Process Group
    PGID: 9445``...), read from the end: a command that prints such text itself is not taken at
    its word unless it ends its output with it."""
    lines = content.rstrip().removesuffix("</untrusted_context>").rstrip().splitlines()
    found: dict[str, str] = {}
    for line in reversed(lines):
        key, sep, value = line.partition(": ")
        if not sep or key not in TRAILER_KEYS or key in found:
            break
        found[key] = value
    return found


TRAILER_KEYS = frozenset({"Error", "Exit Code", "Signal", "Background PIDs", "Process Group PGID"})


def result_of(response: Any) -> Any:
    """The call's result as the person sees it (``returnDisplay``): the text the model gets also
    names the shell's process group, new on every call, which would make every poll progress."""
    if isinstance(response, dict) and isinstance(response.get("returnDisplay"), str):
        return response["returnDisplay"]
    return response


PROTOCOL = Gemini(agent="gemini", can_ask=False, context_at_check=False)
