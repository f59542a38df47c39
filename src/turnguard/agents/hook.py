"""``turnguard hook AGENT``: answer one hook event of a coding agent, then exit.

The turn lives in the session's store as a durable snapshot (``Guard.turn(durable=True)``): each
event resumes it under the session's lock, does what the event says (``Turn.check_call`` before a
tool, ``record_outcome`` after it, ``begin_cycle`` before a model request; at the stop it is
noted, and the turn ends when the stop is confirmed: ``ending``),
and puts it aside again (``Turn.suspend``). So the verdicts are those of one process running the
turn, whatever the processes and their order. The guard here decides only: telemetry and the
recorder are left out of this path and fed afterwards from the turn's journal (``export``), so
no tool call waits for an exporter or imports the OpenTelemetry SDK.

A hook never blocks its agent by failing: bad input, a broken store or a bug allows the event
(exit 0) and says why in one line on stderr, or blocks it under ``fail_mode="closed"`` where it gates an
action (``GATES``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from turnguard.agents.ending import ASKED, STOPPED, TRANSIENT, UNSEEN, end_turn, note_stop, stop_of, went_on
from turnguard.agents.events import (
    MAX_STDIN_BYTES,
    AgentEvent,
    BadEvent,
    Decision,
    HookAnswer,
    Kind,
    Protocol,
    read_payload,
)
from turnguard.agents.store import SessionStore, StoreError, state_root

PROTOCOLS: dict[str, str] = {
    "claude-code": "turnguard.agents.claude_code",
    "codex": "turnguard.agents.codex",
    "gemini": "turnguard.agents.gemini",
}
"""Agent name (as in ``turnguard hook AGENT`` and ``gen_ai.agent.name``) -> its module, imported
only when that agent's hook runs."""
MAX_JOURNAL = 50_000
"""Journal entries kept per turn for telemetry; past it the turn is decided as ever but not
exported (the exporter counts it as a host error)."""
MAX_WAITING = 1024
"""Calls kept waiting for an outcome (``_wait``), so that they cannot outgrow the state: past it
the oldest is given up (no agent runs that many calls at once), and no longer said refused at the
step's end."""
UNNAMED = "~"
"""Before the random id the hook gives a call its agent names by no id (``_wait``): the turn's
snapshot and the waiting list then hold that id and a digest of the input, never the input."""
MAX_ANSWERED = 1024
"""Answers kept per turn to give again when a call's check or outcome comes twice (the same hook
installed twice: Codex runs the hooks of every settings layer, at once): a check's until its
outcome, an outcome's until the next check of its call id (``_repeated``)."""
HALT_NOTE = "turnguard halted this turn"
ASK_MODEL = "Ask the user before going on. "
"""Before a question put to the model, in an attended session of an agent whose hooks cannot ask."""


def main(argv: list[str], stdin: Any = None, stdout: Any = None, stderr: Any = None,
         environ: Mapping[str, str] | None = None) -> int:
    """The command: ``argv`` is ``[AGENT]``. Reads stdin, prints the answer, returns the exit code."""
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    environ = os.environ if environ is None else environ
    if len(argv) != 1 or argv[0] not in PROTOCOLS:
        why = f"usage: turnguard hook {{{','.join(PROTOCOLS)}}} (the event on stdin), not {' '.join(argv)!r}"
        note_error(environ, argv[0] if argv and argv[0] in PROTOCOLS else "unknown", why)
        with contextlib.suppress(OSError, ValueError):
            stdin.read(MAX_READ)  # (the agent's write of the event does not fail)
        with contextlib.suppress(OSError, ValueError):
            stderr.write(f"turnguard hook: {why}; allowed\n")
        return USAGE_EXIT
    try:
        raw = stdin.read(MAX_READ)
    except (OSError, ValueError) as exc:
        raw = b""
        answer = fail(protocol_for(argv[0]), None, f"cannot read stdin: {exc}", environ)
    else:
        answer = run(argv[0], raw, environ, caller=os.getpid())
    try:
        stdout.write(answer.stdout_text())
        stdout.flush()
    except (OSError, ValueError):
        pass
    if answer.stderr:
        try:
            stderr.write(answer.stderr.rstrip("\n") + "\n")
            stderr.flush()
        except (OSError, ValueError):
            pass
    return answer.exit_code


USAGE_EXIT = 1
"""The exit status of a hook command written wrong: an error all three agents show without
blocking anything (2 would block every tool call and prompt until the command is mended)."""
MAX_READ = MAX_STDIN_BYTES + 1
"""One byte past the largest event: a larger one is seen as larger, not cut to look whole."""


def run(agent: str, raw: bytes, environ: Mapping[str, str], cwd: str | None = None,
        memo: Memo | None = None, caller: int | None = None) -> HookAnswer:
    """The answer to one event: never raises (a failure is the fail-mode's answer). ``cwd``: where
    the agent ran the hook (this process's own when ``None``), for an event that names none;
    ``memo``: what a long-lived process keeps between events; ``caller``: the process the agent
    ran for the event, or one below it (``None``: not known)."""
    protocol = protocol_for(agent)
    payload: Any = None
    event: AgentEvent | None = None
    hook: Hook | None = None
    try:
        payload = read_payload(raw)
        event = protocol.read(payload, environ, caller)
        if event.kind is Kind.IGNORED:
            return protocol.answer(event, Decision.allow())
        hook = Hook(protocol, environ, event.cwd or cwd, memo)
        return hook.handle(event)
    except Exception as exc:  # a hook never takes its agent down
        from turnguard._config import ConfigError

        if isinstance(exc, BadEvent):
            why = f"bad event: {exc}"
        elif isinstance(exc, StoreError):
            why = f"session state: {exc.strerror or exc}"
        elif isinstance(exc, ConfigError):
            why = f"configuration: {exc}"
        else:
            why = f"{type(exc).__name__}: {exc}"
        closed = hook.config.fail_mode == "closed" if hook is not None and hook.config is not None else None
        kind = event.kind if event is not None else kind_named(agent, payload)
        return fail(protocol, event, why, environ, closed=closed, kind=kind)


def protocol_for(agent: str) -> Protocol:
    protocol: Protocol = importlib.import_module(PROTOCOLS[agent]).PROTOCOL
    return protocol


def kind_named(agent: str, payload: Any) -> Kind | None:
    """The kind of an event that could not be read, by its name, where it has one."""
    name = payload.get("hook_event_name") if isinstance(payload, dict) else None
    kinds: Mapping[str, Kind] = importlib.import_module(PROTOCOLS[agent]).KINDS
    return kinds.get(name, Kind.IGNORED) if isinstance(name, str) else None


GATES = frozenset({Kind.TURN_START, Kind.MODEL_REQUEST, Kind.TOOL_CHECK})
"""The events a failure blocks under ``fail_mode="closed"``: each comes before what it would stop (a
prompt, a model request, a tool call). The others gate nothing, and a block means something else
there: exit 2 at a ``Stop`` tells the agent not to stop."""


def fail(protocol: Protocol, event: AgentEvent | None, why: str, environ: Mapping[str, str],
         closed: bool | None = None, kind: Kind | None = None) -> HookAnswer:
    """What a failure answers: allow (``fail_mode="open"``, the default) or block (``closed``, at
    an event of ``GATES``, or one whose ``kind`` is unknown), with one line on stderr; counted in the
    state directory's ``hooks/errors.log``. Before the configuration could be read,
    ``TURNGUARD_FAIL_MODE`` decides."""
    if closed is None:
        closed = environ.get("TURNGUARD_FAIL_MODE", "").strip().lower() == "closed"
    note_error(environ, protocol.agent, why)
    verb = "allowed"
    if closed and kind is not None and kind not in GATES:
        closed, verb = False, "allowed (fail_mode=closed: this event gates nothing)"
    elif closed:
        verb = "blocked (fail_mode=closed)"
    line = f"turnguard hook {protocol.agent}: {why[:500]}; {verb}"
    answer = protocol.failure(event, line) if closed else protocol.answer(event, Decision.allow())
    return HookAnswer(answer.output, answer.exit_code, line)


ERRORS_LOG_MAX_BYTES = 4 * 1024 * 1024
"""Where ``hooks/errors.log`` stops growing (tens of thousands of lines): only an export empties it, and
without telemetry none does, so a hook failing at every event would fill the disk. Hooks running
at once may each add their line past it."""


def note_error(environ: Mapping[str, str], agent: str, why: str) -> None:
    """One line per failure in ``hooks/errors.log`` (appended whole: lines of parallel hooks
    never mix), which the exporter reports as host errors; none once the log holds
    ``ERRORS_LOG_MAX_BYTES``. Best effort."""
    try:
        root = state_root(dict(environ)) / "hooks"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = f"{time.time():.3f}\t{agent}\t{why[:200]!r}\n".encode("utf-8", "backslashreplace")
        fd = os.open(root / "errors.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < ERRORS_LOG_MAX_BYTES:
                os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


@dataclass(frozen=True, slots=True)
class Memo:
    """What a process that answers many events (the long-lived server) keeps between them: the
    settings of each folder, and the state it last wrote to each session's file. Neither changes
    an answer: each is used only while the files it came from are unchanged."""

    configs: Any
    written: Any

    @classmethod
    def new(cls) -> Memo:
        from turnguard.agents.configs import Configs
        from turnguard.agents.store import Written

        return cls(Configs(), Written())


@dataclass(slots=True)
class Hook:
    """One event's work: the guard, the session's store, and the turn in between."""

    protocol: Protocol
    environ: Mapping[str, str]
    cwd: str | None
    memo: Memo | None = None

    def __post_init__(self) -> None:
        self.store = SessionStore(state_root(dict(self.environ)), self.protocol.agent,
                                  self.memo.written if self.memo is not None else None)
        self.opening = os.path.abspath(self.cwd if self.cwd and os.path.isdir(self.cwd) else ".")
        self._configure(self.opening)

    config: Any = None
    live_config: Any = None
    store: Any = None
    opening: str = "."
    """The folder whose configuration a turn this event opens is decided under: the event's."""
    folder: str | None = None
    """The folder the configuration in use was read from."""
    _guard: Any = None
    _session: Any = None

    def _configure(self, folder: str) -> None:
        """Decide under the configuration found from ``folder`` (and the environment)."""
        from turnguard.agents import configs

        if folder == self.folder:
            return
        hooks = self.store.directory.parent
        if self.memo is not None:
            settings = self.memo.configs.get(self.environ, folder, hooks)
        else:
            settings = configs.read(self.environ, folder, hooks)
        self.config, self.live_config, self.folder, self._guard = settings.config, settings.live, folder, None

    @property
    def guard(self) -> Any:
        if self._guard is None:
            self._guard = guard_for(self.live_config, self.environ)
        return self._guard

    def handle(self, event: AgentEvent) -> HookAnswer:
        with self.store.locked(event.session_id) as session:
            self._session = session
            data = session.data
            damage = state_damage(data)
            if damage is not None:
                self._set_aside(damage)
            opened_in = data.get("cwd")
            if data.get("turn") is not None and opened_in is not None and os.path.isdir(opened_in):
                self._configure(opened_in)  # an open turn is decided under the settings it opened with
            if event.kind is Kind.TURN_START:
                answer = self._start(data, event)
                self.store.clean()
            elif event.kind is Kind.TURN_END:
                if event.thread is None:  # (a sub-agent's stop ends its own work, not the turn)
                    note_stop(data, event.reason)
                answer = self.protocol.answer(event, Decision.allow())
            elif event.kind is Kind.SESSION_END:
                answer = self._end(data, event)
            else:
                answer = self._step(data, event)
            if event.kind is Kind.SESSION_END:
                session.remove()
            else:
                session.save()
        self._sweep()
        return answer

    def _sweep(self) -> None:
        """Hand over the turns of stale sessions (``stale``): never at this event's expense."""
        from turnguard.agents import stale

        try:
            stale.sweep(self.environ)
        except Exception as exc:
            note_error(self.environ, self.protocol.agent,
                       f"the stale sessions' sweep failed: {type(exc).__name__}: {exc}")

    # -- the turn's lifecycle -----------------------------------------------------------------

    def _start(self, data: dict[str, Any], event: AgentEvent) -> HookAnswer:
        """A prompt opens a turn, ending the open one; the main agent's prompt of the open turn
        again (a refused stop) goes on with it, and a sub-agent's task (``thread``) works in it."""
        if data.get("turn") is not None:
            if event.thread is not None:
                return self.protocol.answer(event, Decision.allow())
            if event.turn_ref is not None and data.get("ref") == event.turn_ref:
                went_on(data)
                return self.protocol.answer(event, Decision.allow())  # the agent goes on with the same turn
            self._close(data, "interrupted")
        data["turn"] = self._open(data, event).suspend()
        return self.protocol.answer(event, Decision.allow())

    def _open(self, data: dict[str, Any], event: AgentEvent) -> Any:
        self._configure(self.opening)
        attended = self.protocol.attended(event, self.environ)
        turn = self.guard.turn(conversation_id=event.session_id, agent_name=self.protocol.agent,
                               promptable=attended, durable=True)
        data["ref"] = event.turn_ref
        data["session"] = event.session_id
        data["cwd"] = self.opening
        data["journal"] = [["o", time.time_ns(), turn.turn_id, attended]]
        for transient in TRANSIENT:
            data.pop(transient, None)
        return turn

    def _resume(self, data: dict[str, Any], event: AgentEvent) -> Any:
        """The session's turn: resumed from its snapshot, or opened when the agent started one
        turnguard did not see (hooks installed mid-session, a lost prompt event, a turn id never
        seen). An event of one of the session's earlier turns (a background subagent's call after
        its prompt's turn ended), or of a sub-agent (``thread``: its own turn id), counts in the
        open turn: the person pays for both. An event of the main agent in the turn itself after its
        stop means the stop was refused (another hook of the agent's): the turn goes on, its counts
        and halts with it (``ending``)."""
        state = data.get("turn")
        ref = data.get("ref")
        same = event.turn_ref is None or ref is None or ref == event.turn_ref
        if state is not None and (same or event.thread is not None or event.turn_ref in data.get("earlier", ())):
            turn = self._resumed(data)
            if turn is not None:
                if same and event.thread is None:
                    went_on(data)
                return turn
        elif state is not None:
            self._close(data, "interrupted")
        return self._open(data, event)

    def _resumed(self, data: dict[str, Any]) -> Any:
        """The turn of the session's snapshot; ``None`` (the failure noted) when this
        configuration cannot resume it: the configuration changed in the middle of a turn (the
        snapshot is dropped), or the snapshot is damaged (the file is set aside). The session then
        goes on with a new turn."""
        from turnguard._snapshot import SnapshotError

        try:
            return self.guard.resume(data["turn"])
        except SnapshotError as exc:
            turn = self._resumed_as_decided(data["turn"]) if (exc.field or "").startswith("config.") else None
            if turn is not None:
                return turn
            if exc.field == "key_check" or (exc.field or "").startswith("config."):  # (another digest key)
                note_error(self.environ, self.protocol.agent, f"the turn's snapshot was dropped: {exc}")
                data["turn"] = None
                data["journal"] = []
            else:
                self._set_aside(f"its turn cannot resume: {exc}")
            return None
        except Exception as exc:  # (a wrong type where the snapshot's reader expects none)
            self._set_aside(f"its turn cannot resume: {type(exc).__name__}: {exc}")
            return None

    def _resumed_as_decided(self, state: dict[str, Any]) -> Any:
        """The turn under the settings its snapshot was decided under, when the configuration
        changed since it opened (an edited ``turnguard.toml`` applies from the next turn); the
        event decides under them. ``None`` when they cannot be taken."""
        from turnguard._snapshot import SnapshotError, decided_config

        try:
            settings = state.get("config")
            config, live = decided_config(self.config, settings), decided_config(self.live_config, settings)
            guard = guard_for(live, self.environ)
            turn = guard.resume(state)
        except SnapshotError:
            return None
        self.config, self.live_config, self._guard = config, live, guard
        self.folder = None  # (a turn this event opens next reads its folder's settings again)
        return turn

    def _set_aside(self, damage: str) -> None:
        """A damaged state: its file set aside, the failure noted; the event goes on with a new turn."""
        name = self._session.set_aside()
        note_error(self.environ, self.protocol.agent,
                   f"the session's state is damaged ({damage}); set aside as {name}, a new turn begins")

    def _end(self, data: dict[str, Any], event: AgentEvent) -> HookAnswer:
        if data.get("turn") is not None:
            self._close(data, event.reason)
        return self.protocol.answer(event, Decision.allow())

    def _close(self, data: dict[str, Any], reason: str) -> None:
        """End the session's turn (a stopped one as it stopped: ``ending.end_turn``) and hand its
        journal to the exporter, when this configuration can resume it."""
        if self._resumed(data) is not None:
            end_turn(data, self.protocol.agent, self.environ, reason)

    # -- one step -----------------------------------------------------------------------------

    def _step(self, data: dict[str, Any], event: AgentEvent) -> HookAnswer:
        key = _answer_key(event)
        fingerprint = self._digest(event.tool_name or "", event.tool_input) if key is not None else ""
        answered = _repeated(data, event, key, fingerprint)
        if answered is not None:  # the same call's check (or outcome) again: the answer it got
            return self.protocol.answer(event, answered)
        turn = self._resume(data, event)
        decision = Decision.allow()
        if event.kind is Kind.MODEL_REQUEST:
            self._settle_refused(turn, data, ran=lambda call_id: self.protocol.ran(event, call_id), thread=event.thread)
            verdict = turn.begin_cycle()
            self._journal(data["journal"], ["m", time.time_ns()])
            decision = self._decision(verdict, turn, at_check=True)
        elif event.kind is Kind.TOOL_CHECK:
            decision = self._check(turn, data, event)
        elif event.kind is Kind.TOOL_OUTCOME:
            assert event.tool_name is not None and event.outcome is not None
            decision = self._outcome(turn, data, event.tool_name, event.tool_input, event.call_id, event.outcome,
                                     event.result)
        elif event.kind is Kind.STEP_END:
            for call_id in event.hook_denied:
                _ask_again(data, call_id)
            self._settle_refused(turn, data, {call_id for _, _, call_id in event.batch})
            if turn.halted is not None:
                decision = Decision.halt(turn.halted.message or HALT_NOTE, at_check=False)
        decision = self._deliver(data, event, decision)
        if key is not None:
            _keep_answer(data, event, key, fingerprint, decision)
        data["turn"] = turn.suspend()
        return self.protocol.answer(event, decision)

    def _settle_refused(self, turn: Any, data: dict[str, Any], step: set[str | None] | None = None,
                        ran: Callable[[str | None], bool] | None = None, thread: str | None = None) -> None:
        """The calls of the last model step that got no outcome: the agent refused them (a
        permission, or a hook), which is a denial. Said when the step is over: at the agent's next
        model request, or Claude Code's ``PostToolBatch`` (``step``: the ids of its calls; a
        background subagent's calls may still be running beside them). A model request ends the
        step of the agent that makes it only (``thread``: a sub-agent's calls run beside its
        parent's steps). ``ran``: whether the agent says a call ran (its post event, in a hook
        process of its own, may come after the request)."""
        waiting = data.get("waiting") or []
        refused = [w for w in waiting if _thread_of(w) == thread and (step is None or w[2] in step)
                   and not (ran and ran(w[2]))]
        data["waiting"] = [w for w in waiting if w not in refused]
        for entry in refused:
            self._outcome(turn, data, entry[0], None, None, "denied", None, settled=entry)

    def _deliver(self, data: dict[str, Any], event: AgentEvent, decision: Decision) -> Decision:
        """A reminder for an agent that gives the model no context at a check goes with the next
        outcome's answer instead."""
        if self.protocol.context_at_check:
            return decision
        if event.kind is Kind.TOOL_CHECK and decision.kind == "remind":
            data["remind"] = decision.message
            return Decision.allow()
        if event.kind is Kind.TOOL_OUTCOME and "remind" in data:
            message = data.pop("remind")
            if decision.kind == "allow":
                return Decision.remind(message)
            return Decision(decision.kind, f"{message}\n{decision.message}", decision.at_check)
        return decision

    def _check(self, turn: Any, data: dict[str, Any], event: AgentEvent) -> Decision:
        from turnguard._model import ToolCall

        assert event.tool_name is not None
        for asked in _questions_asked(data):
            if not _waits(data, asked["call"]):  # (one waiting runs beside this call: its answer is to come)
                self._answer(turn, data, asked, "redirect")  # the person refused the asked call; the agent went on
        ask = data.get("ask")
        if ask is not None and ask.get("call") is not None:
            data.setdefault(ASKED, []).append(data.pop("ask"))  # its call runs beside this one: it stays open
            ask = None
        digest = self._digest(event.tool_name, event.tool_input)
        checked_id = event.call_id if event.call_id is not None else UNNAMED + secrets.token_hex(8)
        call = ToolCall(event.tool_name, event.tool_input, call_id=checked_id)
        _forget_answer(data, "r:", event.call_id)
        verdict = turn.check_call(call)
        _wait(data, [event.tool_name, None if event.call_id is not None else digest, checked_id, event.thread])
        self._journal(data["journal"], ["c", time.time_ns(), event.tool_name, digest, event.call_id])
        decision = self._decision(verdict, turn, at_check=True)
        if decision.kind == "ask":
            data["ask"] = {"verdict": _verdict_data(verdict), "call": event.call_id or "",
                           "at": len(data["journal"]) - 1}
        elif ask is not None and decision.kind in ("allow", "remind"):
            ask["call"] = event.call_id or ""  # an ASK that came with an outcome: asked now, before this call
            ask.pop(UNSEEN, None)
            decision = Decision.ask(ask["verdict"]["message"])
        return decision

    def _outcome(self, turn: Any, data: dict[str, Any], name: str, tool_input: Any, call_id: str | None,
                 outcome: str, result: Any, settled: list[Any] | None = None) -> Decision:
        """A call's outcome: reported (the event's input and id), or a refusal said for a call the
        waiting list held (``settled``, taken off it already: its input is known by its digest only)."""
        from turnguard._model import ToolCall

        if settled is None:
            digest = self._digest(name, tool_input)
            checked_id = _take_waiting(data, name, digest, call_id)
        else:
            digest = settled[1] if settled[1] is not None else self._digest(name, None)
            checked_id, call_id = settled[2], None if settled[1] is not None else settled[2]
        _forget_answer(data, "c:", call_id)
        for asked in _questions_asked(data):
            if asked["call"] == (call_id or ""):
                self._answer(turn, data, asked, "stop" if outcome == "denied" else "continue")
        call = ToolCall(name, tool_input, call_id=checked_id)
        keyed_result = name in self.guard.result_tools or "*" in self.guard.result_tools
        verdict = turn.record_outcome(call, outcome, result if keyed_result else None)
        self._journal(data["journal"], [
            "r", time.time_ns(), name, digest, call_id, outcome,
            self._digest("", result) if keyed_result and result is not None else None,
        ])
        decision = self._decision(verdict, turn, at_check=False)
        if decision.kind == "ask":
            data["ask"] = {"verdict": _verdict_data(verdict), "call": None, "at": len(data["journal"]) - 1}
            return Decision.remind(verdict.message)
        return decision

    def _answer(self, turn: Any, data: dict[str, Any], ask: dict[str, Any], answer: str) -> None:
        """The person's answer to a question asked at a call (``_questions_asked``), told to the
        turn (and the journal); the question is closed."""
        from turnguard._snapshot import read_verdict

        _take_question(data, ask)
        verdict = read_verdict(ask["verdict"], "ask")
        if verdict is not None and verdict.event is not None:
            turn.resolve(verdict.event, answer)
            self._journal(data["journal"], ["a", time.time_ns(), answer, ask["at"]])

    def _decision(self, verdict: Any, turn: Any, *, at_check: bool) -> Decision:
        from turnguard._model import Action

        action = verdict.action
        if action is Action.ALLOW:
            return Decision.allow()
        if action is Action.REMIND:
            return Decision.remind(verdict.message)
        if action is Action.ASK and turn.promptable:
            if self.protocol.can_ask:
                return Decision.ask(verdict.message)
            return Decision.remind(ASK_MODEL + verdict.message)  # put to the model: the agent cannot ask
        return Decision.halt(verdict.message or HALT_NOTE, at_check=at_check)

    def _digest(self, name: str, value: Any) -> str:
        from turnguard._keys import identity_bytes

        return "#" + hashlib.blake2b(identity_bytes(name, value, self.config.key_mode), digest_size=8).hexdigest()

    @staticmethod
    def _journal(journal: list[Any], entry: list[Any]) -> None:
        if len(journal) < MAX_JOURNAL:
            journal.append(entry)
        elif journal[-1] != ["x"]:
            journal.append(["x"])  # cut: the exporter leaves this turn out and counts it


def _wait(data: dict[str, Any], entry: list[Any]) -> None:
    """A checked call waits for its outcome: ``[tool name, input digest, the id its check was given,
    thread]``. The digest (``None`` for a call the agent names by id) stands for the input, which the
    state never keeps; past ``MAX_WAITING`` calls the oldest is given up."""
    waiting = data.setdefault("waiting", [])
    waiting.append(entry)
    del waiting[:-MAX_WAITING]


def _waits(data: dict[str, Any], call_id: str) -> bool:
    """Whether the call the agent named ``call_id`` is checked and waits for its outcome: the agent
    runs it still (a call of the same step may be checked beside it), or has not said it refused it."""
    return bool(call_id) and any(w[2] == call_id for w in data.get("waiting") or ())


def _questions_asked(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The open questions put to the person at a call (not one that waits for the next call to be
    asked): those whose calls run beside later checks (``ASKED``), oldest first, then ``ask``."""
    ask = data.get("ask")
    return [*(data.get(ASKED) or ()), *((ask,) if ask is not None and ask.get("call") is not None else ())]


def _take_question(data: dict[str, Any], ask: dict[str, Any]) -> None:
    """Close one of the open questions (``_questions_asked``)."""
    if data.get("ask") is ask:
        del data["ask"]
    else:
        data[ASKED].remove(ask)


def _ask_again(data: dict[str, Any], call_id: str) -> None:
    """The question asked at ``call_id``, which another hook denied (the person never saw it): not
    answered, asked again at the next call. A question already waiting for the next call stays."""
    for asked in _questions_asked(data):
        if asked["call"] == call_id:
            _take_question(data, asked)
            ask = data.get("ask")
            if ask is not None and ask.get("call") is not None:
                data.setdefault(ASKED, []).append(data.pop("ask"))
            if data.get("ask") is None:
                data["ask"] = {**asked, "call": None, UNSEEN: True}


def _take_waiting(data: dict[str, Any], name: str, digest: str, call_id: str | None) -> str | None:
    """The id the check of the call an outcome reports was given, its entry taken off the waiting
    list: the agent's ``call_id``, or for a call without one (Gemini CLI) ``UNNAMED`` and random
    hex given to the earliest waiting call of the tool whose input has ``digest``. ``call_id``
    when no call waits."""
    waiting = data.get("waiting") or []
    for i, (other, other_digest, other_id, *_) in enumerate(waiting):
        if (other_id == call_id) if call_id is not None else (other == name and other_digest == digest):
            del waiting[i]
            return other_id if isinstance(other_id, str) else call_id
    return call_id


def _forget_answer(data: dict[str, Any], kind: str, call_id: str | None) -> None:
    """A check of ``call_id`` ends the repeat of its earlier outcome (``kind`` ``"r:"``), an
    outcome (reported, or a refusal said at the step's end) that of its check (``"c:"``)."""
    answers = data.get("answered")
    if answers and call_id is not None:
        answers.pop(kind + call_id, None)


def _answer_key(event: AgentEvent) -> str | None:
    """What names a call's check or outcome in the turn: the call's id, where the agent sends one."""
    if event.call_id is None or event.kind not in (Kind.TOOL_CHECK, Kind.TOOL_OUTCOME):
        return None
    return ("c:" if event.kind is Kind.TOOL_CHECK else "r:") + event.call_id


def _repeated(data: dict[str, Any], event: AgentEvent, key: str | None, fingerprint: str) -> Decision | None:
    """The answer a call's check or outcome got, when this event is that one again: a check of the
    same call (name and input) whose outcome has not come, or an outcome with no check of its call
    id since. A call id used again for a later call (after its outcome) is a new call."""
    answer = (data.get("answered") or {}).get(key) if key is not None else None
    if answer is None or answer[3] != fingerprint:
        return None
    return Decision(answer[0], answer[1], answer[2])


def _keep_answer(data: dict[str, Any], event: AgentEvent, key: str, fingerprint: str, decision: Decision) -> None:
    """Keep the answer for a repeat (``_repeated``; ``_forget_answer`` ends it)."""
    answers = data.setdefault("answered", {})
    answers[key] = [decision.kind, decision.message, decision.at_check, fingerprint]
    if len(answers) > MAX_ANSWERED:
        del answers[next(iter(answers))]


def state_damage(data: dict[str, Any]) -> str | None:
    """What makes a session's stored state one this hook cannot go on with (a field of the wrong
    type), or ``None``. The turn's snapshot is checked by ``Guard.resume``; the journal's later
    entries by the exporter, which leaves a damaged journal out and counts it."""
    for name, (expected, sound) in _FIELDS.items():
        if name in data and not sound(data[name]):
            return f"its field {name!r} is not {expected}"
    journal = data.get("journal") or []
    if journal and not _opening(journal[0]):
        return "its journal does not begin with the turn's opening entry"
    if data.get("turn") is not None and "journal" not in data:
        return "it has a turn without a journal"
    for ask in [data.get("ask"), *(data.get(ASKED) or ())]:
        if ask is not None:
            from turnguard._snapshot import read_verdict

            try:
                read_verdict(ask["verdict"], "ask.verdict")
            except Exception as exc:  # a SnapshotError, or a wrong type where it expects none
                return f"its pending question cannot be read: {exc}"
    return None


def _optional_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opening(entry: Any) -> bool:
    return (isinstance(entry, list) and len(entry) == 4 and entry[0] == "o" and _count(entry[1])
            and isinstance(entry[2], str) and TURN_ID.fullmatch(entry[2]) is not None and isinstance(entry[3], bool))


def _waiting(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(w, list) and len(w) in (3, 4) and isinstance(w[0], str) and _optional_text(w[1])
        and _optional_text(w[2])
        and _optional_text(_thread_of(w)) for w in value)


def _thread_of(waiting: list[Any]) -> Any:
    """The sub-agent a waiting call is of (``None``: the main agent's, or kept before calls said whose)."""
    return waiting[3] if len(waiting) > 3 else None


def _ask(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and "verdict" in value and _optional_text(value.get("call"))
                             and _count(value.get("at")))


TURN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
"""A turn id as the journal's file in the outbox is named after it."""
_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "turn": ("an object", lambda v: v is None or isinstance(v, dict)),
    "ref": ("a string", _optional_text),
    "session": ("a string", _optional_text),
    "cwd": ("a string", _optional_text),
    "journal": ("a list", lambda v: isinstance(v, list)),
    "waiting": ("a list of waiting calls", _waiting),
    "ask": ("a pending question", _ask),
    ASKED: ("a list of questions asked at calls", lambda v: isinstance(v, list) and all(
        isinstance(a, dict) and a.get("call") is not None and _ask(a) for a in v)),
    "remind": ("a string", lambda v: isinstance(v, str)),
    STOPPED: ("a stop", lambda v: stop_of({STOPPED: v}) is not None),
    "earlier": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(r, str) for r in v)),
    "answered": ("the answers given", lambda v: isinstance(v, dict) and all(
        isinstance(a, list) and len(a) == 4 and isinstance(a[0], str) and isinstance(a[1], str)
        and isinstance(a[2], bool) and isinstance(a[3], str) for a in v.values())),
}
"""The state's fields this hook reads, and what each must be."""


GUARDS: dict[Any, Any] = {}
"""Guards by configuration (and the plugin selection), for a process that answers many events:
the long-lived server. A guard opens and resumes any number of turns; building its plugin
manager costs more than the rest of an event."""
MAX_GUARDS = 8
_GUARDS_LOCK = threading.Lock()


def guard_for(config: Any, environ: Mapping[str, str]) -> Any:
    from turnguard._guard import Guard

    key = (config, environ.get("TURNGUARD_LOAD_PLUGINS"))
    try:
        hash(key)
    except TypeError:  # a setting of a third party's that cannot be a key: a guard of its own
        return Guard(config, environ=environ)
    with _GUARDS_LOCK:
        guard = GUARDS.get(key)
        if guard is None:
            if len(GUARDS) >= MAX_GUARDS:
                GUARDS.pop(next(iter(GUARDS)))
            guard = GUARDS[key] = Guard(config, environ=environ)
    return guard


def _verdict_data(verdict: Any) -> dict[str, Any]:
    from turnguard._snapshot import verdict_data

    data = verdict_data(verdict)
    assert data is not None
    return data
