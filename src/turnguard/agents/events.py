"""What an agent's hook event means to a turn, whatever agent sent it, and what a hook answers.

Each agent's module (a ``Protocol``) reads its own events into an ``AgentEvent`` and writes a
``Decision`` as a ``HookAnswer`` in its own schema; the driver (``hook``) works on these alone.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from typing import Protocol as TypingProtocol

from turnguard._model import MAX_ID_LENGTH

MAX_STDIN_BYTES = 8 * 1024 * 1024
"""A hook reads at most this much of stdin: a larger event is refused (and the agent allowed)."""
MAX_INPUT_DEPTH = 100
"""How deep a tool's input may nest: the session's state keeps the input of a call without an id
until its outcome, and must read back whole in the next hook process (JSON nested near Python's
recursion limit parses in one process and not in another). A deeper input is refused (and the
agent allowed); no tool takes one."""


class Kind(enum.Enum):
    """What an event does to the session's turn."""

    TURN_START = "turn_start"
    """The person submitted a prompt: a turn opens (the same turn again when the agent says so)."""
    MODEL_REQUEST = "model_request"
    """A model request is about to be sent (``Turn.begin_cycle``)."""
    TOOL_CHECK = "tool_check"
    """A tool call is about to run (``Turn.check_call``)."""
    TOOL_OUTCOME = "tool_outcome"
    """A tool call ran, failed or was refused (``Turn.record_outcome``)."""
    STEP_END = "step_end"
    """Every call of a model step has resolved (Claude Code's ``PostToolBatch``): a checked call
    with no outcome by now was refused (by a permission or a hook)."""
    TURN_END = "turn_end"
    """The agent stopped: the turn ends once the stop is confirmed (another hook may refuse it)."""
    SESSION_END = "session_end"
    """The session closed: its turn ends and its state is removed."""
    IGNORED = "ignored"
    """An event turnguard has nothing to do with (answered with an empty allow)."""


class BadEvent(ValueError):
    """The event cannot be read (not JSON, too large, a field missing or of the wrong type)."""


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One hook event, read: the fields a turn needs, whichever agent sent them."""

    kind: Kind
    name: str
    """The agent's own name for the event (``PreToolUse``, ``BeforeTool``...), for answers."""
    session_id: str
    turn_ref: str | None = None
    """The agent's own id of the turn (Codex's ``turn_id``, Claude Code's ``prompt_id``, the
    process of a headless Gemini CLI run), if any."""
    tool_name: str | None = None
    tool_input: Any = None
    call_id: str | None = None
    outcome: str | None = None
    """``ok``, ``error``, ``denied`` or ``unknown`` (``turnguard.Outcome`` values)."""
    result: Any = None
    cwd: str | None = None
    reason: str = "completed"
    """How the turn ended (``TURN_END``)."""
    transcript: str | None = None
    """The session's transcript file, where the agent's post events lack what it holds (Codex)."""
    batch: tuple[tuple[str, Any, str | None], ...] = ()
    """``STEP_END``: the step's calls, (tool name, input, call id)."""
    hook_denied: frozenset[str] = frozenset()
    """``STEP_END``: the ids of the step's calls another hook of the agent's denied (a deny
    overrides a question, so the person was never asked: its refusal is not the person's answer)."""
    thread: str | None = None
    """The sub-agent that sent the event, in a session whose sub-agents send their own prompt, model
    requests and stop (Codex's ``agent_id``); ``None`` for the session's main agent."""


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """What the hook process prints and exits with."""

    output: dict[str, Any] | None = field(default_factory=dict)
    """Printed as JSON on stdout (``None``: nothing printed)."""
    exit_code: int = 0
    stderr: str = ""

    def stdout_text(self) -> str:
        return "" if self.output is None else json.dumps(self.output) + "\n"  # ASCII: any text can be written


@dataclass(frozen=True, slots=True)
class Decision:
    """What the agent should do with the event.

    ``allow``: go on. ``remind``: go on, and give the model ``message``. ``ask``: ask the person
    before the call runs. ``halt``: the call does not run (``at_check``) or the turn must end
    after it (an outcome's halt): the model reads ``message``, and the agent's run is stopped where
    its protocol allows it.
    """

    kind: str
    message: str = ""
    at_check: bool = True

    @classmethod
    def allow(cls) -> Decision:
        return _ALLOW

    @classmethod
    def remind(cls, message: str) -> Decision:
        return cls("remind", message)

    @classmethod
    def ask(cls, message: str) -> Decision:
        return cls("ask", message)

    @classmethod
    def halt(cls, message: str, *, at_check: bool = True) -> Decision:
        return cls("halt", message, at_check)


_ALLOW = Decision("allow")


class Protocol(TypingProtocol):
    """One agent's hook protocol."""

    agent: str
    context_at_check: bool
    """Whether the model reads context given when a call is checked (else a reminder goes with the
    call's outcome)."""
    can_ask: bool
    """Whether a hook can put a question to the person (else, attended, it goes to the model)."""

    def read(self, payload: dict[str, Any], environ: Mapping[str, str], caller: int | None = None) -> AgentEvent:
        """The event; ``events.BadEvent`` when a field turnguard needs is missing or wrong.
        ``caller``: the process the agent started for the event, or one below it (``None``: none
        to look at), for an agent whose events leave out what its process tells."""

    def attended(self, event: AgentEvent, environ: Mapping[str, str]) -> bool:
        """Whether a person can be asked in this session (interactive) or not (headless)."""

    def answer(self, event: AgentEvent | None, decision: Decision) -> HookAnswer:
        """``decision`` in the agent's schema (``event`` is ``None`` when it could not be read)."""

    def failure(self, event: AgentEvent | None, reason: str) -> HookAnswer:
        """A block because turnguard failed under ``fail_mode="closed"``."""

    def ran(self, event: AgentEvent, call_id: str | None) -> bool:
        """Whether the agent ran the call ``call_id``, though its post event has not come (``False``
        where the agent does not say: a call without one by the next model request was refused)."""


@dataclass(frozen=True)
class CommandHooks:
    """What the agents' command hooks answer alike: an allow, or an event that could not be read,
    is an empty answer; a failure under ``fail_mode="closed"`` is exit status 2 with the reason on
    stderr, which blocks a tool call or a prompt; and the agent does not say which checked calls
    ran (``ran``). A subclass writes the other decisions in its agent's schema (``output``); its
    one instance (the module's ``PROTOCOL``) gives the ``Protocol``'s facts."""

    agent: str
    can_ask: bool
    context_at_check: bool

    def answer(self, event: AgentEvent | None, decision: Decision) -> HookAnswer:
        if decision.kind == "allow" or event is None:
            return HookAnswer({})
        return HookAnswer(self.output(event, decision))

    def output(self, event: AgentEvent, decision: Decision) -> dict[str, Any]:
        """``decision`` (not an allow) as the agent's hook output."""
        raise NotImplementedError

    def failure(self, event: AgentEvent | None, reason: str) -> HookAnswer:
        return HookAnswer(None, 2, reason)

    def ran(self, event: AgentEvent, call_id: str | None) -> bool:
        return False

    @staticmethod
    def specific(event: AgentEvent, **fields: Any) -> dict[str, Any]:
        """The event's ``hookSpecificOutput`` holding ``fields`` (a schema the three agents share)."""
        return {"hookSpecificOutput": {"hookEventName": event.name, **fields}}


def attended_from_env(environ: Mapping[str, str], entrypoint_var: str, interactive: frozenset[str]) -> bool:
    """``TURNGUARD_ATTENDED`` (``1``/``0``) when set, else whether ``entrypoint_var`` names an
    interactive start."""
    override = environ.get("TURNGUARD_ATTENDED", "").strip().lower()
    if override in ("1", "true", "yes"):
        return True
    if override in ("0", "false", "no"):
        return False
    return environ.get(entrypoint_var, "") in interactive


def text_field(payload: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """``payload[name]`` when it is a non-empty string; ``BadEvent`` when required and it is not."""
    value = payload.get(name)
    if isinstance(value, str) and value:
        return value
    if required:
        raise BadEvent(f"the event has no {name!r} string")
    return None


def id_field(payload: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """``text_field`` for an id the state keeps (a session's, a turn's, a call's, a tool's name: the
    journal keeps a call's tool name per call): one longer than ``MAX_ID_LENGTH`` or not UTF-8 (a
    lone surrogate) stands as a digest of itself, ``#`` and 32 hex digits, the same for the same id,
    so no id can grow the state or fail its writing."""
    value = text_field(payload, name, required=required)
    if value is None or (len(value) <= MAX_ID_LENGTH and _encodes(value)):
        return value
    return "#" + hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def common_fields(payload: dict[str, Any], kinds: Mapping[str, Kind], *, turn_ref: str | None = None,
                  call_id: str | None = None) -> dict[str, Any]:
    """The ``AgentEvent`` fields every agent sends alike: the event's name and kind (``kinds``, by
    name), the session, the working directory, the turn's id (the field ``turn_ref``), and for a
    tool event the tool's name, its input and the call's id (the field ``call_id``)."""
    name = text_field(payload, "hook_event_name", required=True)
    assert name is not None
    kind = kinds.get(name, Kind.IGNORED)
    fields: dict[str, Any] = {
        "kind": kind, "name": name, "cwd": text_field(payload, "cwd"),
        "session_id": id_field(payload, "session_id", required=kind is not Kind.IGNORED) or "",
        "turn_ref": id_field(payload, turn_ref) if turn_ref else None,
    }
    if kind in (Kind.TOOL_CHECK, Kind.TOOL_OUTCOME):
        tool_input = payload.get("tool_input")
        if nested_deeper(tool_input, MAX_INPUT_DEPTH):
            raise BadEvent(f"the event's tool_input nests deeper than {MAX_INPUT_DEPTH} levels")
        fields.update(tool_name=id_field(payload, "tool_name", required=True), tool_input=tool_input,
                      call_id=id_field(payload, call_id) if call_id else None)
    return fields


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether JSON data nests more than ``limit`` lists or objects deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


def read_payload(raw: bytes) -> dict[str, Any]:
    """The event object from the hook's stdin bytes; ``BadEvent`` saying why when it is not one."""
    if len(raw) > MAX_STDIN_BYTES:
        raise BadEvent(f"the event is larger than {MAX_STDIN_BYTES} bytes")
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadEvent(f"the event is not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(payload, dict):
        raise BadEvent(f"the event is JSON {type(payload).__name__}, not an object")
    return payload
