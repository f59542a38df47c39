"""Hook events of the three coding agents in the shapes their CLIs send (``/work/notes/agent-events.md``:
Claude Code 2.1.328, Codex 0.169.0, Gemini CLI 0.61.0), a session driver answering them in-process
through ``turnguard.agents.hook.run``, readers of the answers, and hook processes.

``Events`` builds one session's payloads (and, for Codex, appends to the session's transcript the
``item_completed`` records Codex writes, from which the hook reads a call's outcome). ``Session``
sends them and keeps the answers. ``check_halts`` / ``outcome_halts`` say whether an answer is the
agent's own way of stopping a call or the run.

Hook processes: ``hook_process`` is the real command (``python -m turnguard hook AGENT``).
``ForkServer`` runs the same command's ``__main__`` in processes forked from an interpreter that
has already imported turnguard, on real file descriptors 0/1/2: a fork costs a few milliseconds
where a fresh interpreter costs a quarter of a second, so tests can start hundreds of concurrent
hook processes, and kill them while they work (a fresh interpreter spends its first 250 ms
importing). Run as a script, this module is that server.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import turnguard

AGENTS: tuple[str, ...] = ("claude-code", "codex", "gemini")
SHELL_TOOL = {"claude-code": "Bash", "codex": "Bash", "gemini": "run_shell_command"}
"""The shell tool's name as each agent's hooks see it."""
HOOK_COMMAND = (sys.executable, "-m", "turnguard", "hook")
TIMEOUT_S = 60.0
"""Generous bound for anything a test waits for (an exporter, a process); never an assertion."""


def hook_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of one test's hooks: a state directory and a recorder of its own, nothing
    inherited but ``PATH`` (no ``OTEL_*``, no ``TURNGUARD_*`` of the machine), and the processes
    it starts (an exporter, a server) import the turnguard under test. Entry-point plugins
    are not scanned (``TURNGUARD_LOAD_PLUGINS=0``): none is installed here, so the verdicts are the
    same, and the scan is most of an in-process event's cost."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",
        "TURNGUARD_STATE_DIR": str(tmp_path / "state"),
        "TURNGUARD_RECORDER_PATH": str(tmp_path / "turns.jsonl"),
        "TURNGUARD_LOAD_PLUGINS": "0",
        "PYTHONPATH": str(Path(turnguard.__file__).parents[1]),
    }
    env.update(extra)
    return env


# -- the agents' events ---------------------------------------------------------------------------


@dataclass
class Events:
    """One agent session's hook events, as that agent's CLI writes them."""

    agent: str
    root: Path
    session_id: str = ""
    turn_id: str | None = None
    transcribing: bool = True
    """Whether Codex writes its transcript (``False``: the file is never written)."""
    project: Path = field(init=False)
    transcript: Path = field(init=False)
    _ids: Iterator[int] = field(init=False, default_factory=lambda: itertools.count(1))
    _ordinal: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.session_id:
            self.session_id = str(uuid.uuid4())
        self.project = self.root / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(self.session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]  # any id
        if self.agent == "claude-code":
            self.transcript = self.root / "home" / ".claude" / "projects" / "-project" / f"{name}.jsonl"
        elif self.agent == "codex":
            self.transcript = (self.root / "codex-home" / "sessions" / "2026" / "12" / "05"
                               / f"rollout-2026-12-05T14-52-54-{name}.jsonl")
        else:
            chats = self.root / "home" / ".gemini" / "tmp" / "project" / "chats"
            self.transcript = chats / f"session-{name}.jsonl"
        self.transcript.parent.mkdir(parents=True, exist_ok=True)

    @property
    def tool(self) -> str:
        return SHELL_TOOL[self.agent]

    def call_id(self) -> str | None:
        """The next call's id as the agent names it (Gemini passes none)."""
        n = next(self._ids)
        return {"claude-code": f"toolu_{n:04d}", "codex": f"call_{n:04d}", "gemini": None}[self.agent]

    def _common(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "transcript_path": str(self.transcript), "cwd": str(self.project)}

    def _turn(self) -> dict[str, Any]:
        if self.agent == "claude-code":
            return {"prompt_id": self.turn_id, "permission_mode": "default"}
        if self.agent == "codex":
            return {"turn_id": self.turn_id, "model": "scripted-model", "permission_mode": "bypassPermissions"}
        return {"timestamp": "2026-12-05T14:55:06.814Z"}

    def prompt(self, text: str = "Do the thing", turn_id: str | None = None) -> dict[str, Any]:
        """The event that opens a turn (a new turn id unless ``turn_id`` is given)."""
        self.turn_id = turn_id or str(uuid.uuid4())
        name = {"claude-code": "UserPromptSubmit", "codex": "UserPromptSubmit", "gemini": "BeforeAgent"}[self.agent]
        return {**self._common(), **self._turn(), "hook_event_name": name, "prompt": text}

    def model_request(self) -> dict[str, Any] | None:
        """The event before a model request (Claude Code has none)."""
        if self.agent == "codex":
            return {**self._common(), "turn_id": self.turn_id, "model": "scripted-model",
                    "hook_event_name": "PreModelRequest"}
        if self.agent == "gemini":
            return {**self._common(), **self._turn(), "hook_event_name": "BeforeModel",
                    "llm_request": {"model": "gemini-3.1-pro-preview",
                                    "messages": [{"role": "user", "content": "Do the thing"}], "config": {}}}
        return None

    def pre(self, tool_input: Any, call_id: str | None, tool: str | None = None) -> dict[str, Any]:
        tool = tool or self.tool
        if self.agent == "claude-code":
            return {**self._common(), **self._turn(), "effort": {"level": "medium"}, "hook_event_name": "PreToolUse",
                    "tool_name": tool, "tool_input": tool_input, "tool_use_id": call_id}
        if self.agent == "codex":
            self._transcribe({"type": "response_item", "payload": {
                "type": "function_call", "status": "completed", "id": f"fc_{call_id}", "name": "exec_command",
                "arguments": json.dumps({"cmd": _command(tool_input)}), "call_id": call_id,
                "internal_chat_message_metadata_passthrough": {"turn_id": self.turn_id}}})
            return {**self._common(), **self._turn(), "hook_event_name": "PreToolUse", "tool_name": tool,
                    "tool_input": tool_input, "tool_use_id": call_id}
        return {**self._common(), **self._turn(), "hook_event_name": "BeforeTool", "tool_name": tool,
                "tool_input": tool_input}

    def post(self, tool_input: Any, call_id: str | None, *, failed: bool, output: str = "",
             tool: str | None = None, transcribe: bool = True) -> dict[str, Any]:
        """The event after the call ran (Codex: its ``item_completed`` record goes to the transcript
        first, as Codex writes it about when it runs the hook; not with ``transcribe=False``)."""
        tool = tool or self.tool
        if self.agent == "claude-code":
            if failed:
                return {**self._common(), **self._turn(), "effort": {"level": "medium"},
                        "hook_event_name": "PostToolUseFailure", "tool_name": tool, "tool_input": tool_input,
                        "tool_use_id": call_id, "error": f"Exit code 1\n{output}", "is_interrupt": False,
                        "duration_ms": 16}
            return {**self._common(), **self._turn(), "effort": {"level": "medium"}, "hook_event_name": "PostToolUse",
                    "tool_name": tool, "tool_input": tool_input,
                    "tool_response": {"stdout": output, "stderr": "", "interrupted": False, "isImage": False,
                                      "noOutputExpected": False},
                    "tool_use_id": call_id, "duration_ms": 56}
        if self.agent == "codex":
            if transcribe:
                self.complete(call_id, tool_input, exit_code=1 if failed else 0, output=output)
            return {**self._common(), **self._turn(), "hook_event_name": "PostToolUse", "tool_name": tool,
                    "tool_input": tool_input, "tool_response": output, "tool_use_id": call_id}
        pgid = 9000 + next(self._ids)  # a new process group on every call, as Gemini CLI's shell reports it
        lines = [f"Output: {output or '(empty)'}", *(["Exit Code: 1"] if failed else []), f"Process Group PGID: {pgid}"]
        content = "<untrusted_context>\n" + "\n".join(lines) + "\n</untrusted_context>"
        return {**self._common(), **self._turn(), "hook_event_name": "AfterTool", "tool_name": tool,
                "tool_input": tool_input, "tool_response": {"llmContent": content, "returnDisplay": output}}

    def complete(self, call_id: str | None, tool_input: Any, *, exit_code: int | None = None,
                 status: str | None = None, output: str = "") -> None:
        """Codex's transcript records of a finished call: ``item_completed`` (exit code and status),
        then the output the model gets."""
        status = status or ("completed" if exit_code == 0 else "failed")
        item: dict[str, Any] = {
            "type": "CommandExecution", "id": call_id, "process_id": "99927",
            "command": ["/bin/bash", "-lc", _command(tool_input)], "cwd": f"file://{self.project}",
            "parsed_cmd": [{"type": "unknown", "cmd": _command(tool_input)}], "source": "unified_exec_startup",
            "status": status, "aggregated_output": output, "duration": {"secs": 0, "nanos": 10309}}
        if exit_code is not None:
            item["exit_code"] = exit_code
        self._transcribe({"type": "event_msg", "payload": {
            "type": "item_completed", "thread_id": self.session_id, "turn_id": self.turn_id, "item": item,
            "started_at_ms": 1796482375592, "completed_at_ms": 1796482375594}})
        self._transcribe({"type": "response_item", "payload": {
            "type": "function_call_output", "id": f"fco_{call_id}", "call_id": call_id,
            "output": f"Chunk ID: 9956bf\nWall time: 0.0000 seconds\nProcess exited with code {exit_code}\n"
                      f"Original token count: 0\nOutput:\n{output}"}})

    def _transcribe(self, record: dict[str, Any]) -> None:
        if not self.transcribing:
            return
        self._ordinal += 1
        line = {"timestamp": "2026-12-05T14:52:55.594Z", "ordinal": self._ordinal, **record}
        with open(self.transcript, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")

    def batch(self, calls: list[tuple[str, Any, str | None, str]]) -> dict[str, Any] | None:
        """Claude Code's ``PostToolBatch`` for a model step's calls: (tool, input, call id, the
        result text the model gets). Other agents have no such event."""
        if self.agent != "claude-code":
            return None
        return {**self._common(), **self._turn(), "effort": {"level": "medium"}, "hook_event_name": "PostToolBatch",
                "tool_calls": [{"tool_name": t, "tool_input": i, "tool_use_id": c, "tool_response": r}
                               for t, i, c, r in calls]}

    def stop(self) -> dict[str, Any]:
        if self.agent == "claude-code":
            return {**self._common(), **self._turn(), "hook_event_name": "Stop", "stop_hook_active": False,
                    "last_assistant_message": "All done.", "background_tasks": [], "session_crons": []}
        if self.agent == "codex":
            return {**self._common(), **self._turn(), "hook_event_name": "Stop", "stop_hook_active": False,
                    "last_assistant_message": "All done."}
        return {**self._common(), **self._turn(), "hook_event_name": "AfterAgent", "prompt": "Do the thing",
                "prompt_response": "All done.", "stop_hook_active": False}

    def session_end(self) -> dict[str, Any]:
        reason = "exit" if self.agent == "gemini" else "other"
        out = {**self._common(), "hook_event_name": "SessionEnd", "reason": reason}
        if self.agent == "claude-code":
            out["prompt_id"] = self.turn_id
        return out


def _command(tool_input: Any) -> str:
    return str(tool_input.get("command", "")) if isinstance(tool_input, dict) else str(tool_input)


# -- a session, answered in-process ------------------------------------------------------------------


@dataclass
class Step:
    """The answers to one call: before it, after it, and (Claude Code) its step's ``PostToolBatch``."""

    pre: Any
    post: Any = None
    batch: Any = None

    def answers(self) -> list[Any]:
        return [a for a in (self.pre, self.post, self.batch) if a is not None]


class Session:
    """One agent session's events sent to ``hook.run`` in this process."""

    def __init__(self, agent: str, env: Mapping[str, str], root: Path, session_id: str = "") -> None:
        self.agent = agent
        self.env = dict(env)
        self.events = Events(agent, root, session_id)

    @property
    def session_id(self) -> str:
        return self.events.session_id

    def send(self, payload: Mapping[str, Any] | None) -> Any:
        from turnguard.agents.hook import run

        if payload is None:
            return None
        return run(self.agent, json.dumps(payload).encode(), self.env)

    def start(self, turn_id: str | None = None) -> Any:
        return self.send(self.events.prompt(turn_id=turn_id))

    def call(self, command: str, *, failed: bool = True, output: str | None = None, tool: str | None = None,
             model_request: bool = False) -> Step:
        """One call of its own model step: (the model request,) the check, the outcome, the step's end."""
        if model_request:
            self.send(self.events.model_request())
        tool_input = {"command": command}
        call_id = self.events.call_id()
        step = Step(self.send(self.events.pre(tool_input, call_id, tool)))
        text = output if output is not None else ("failing" if failed else "")
        step.post = self.send(self.events.post(tool_input, call_id, failed=failed, output=text, tool=tool))
        response = f"Exit code 1\n{text}" if failed else (text or "(Bash completed with no output)")
        step.batch = self.send(self.events.batch([(tool or self.events.tool, tool_input, call_id, response)]))
        return step

    def check(self, command: str, tool: str | None = None) -> Any:
        """Only the check of a call (no outcome)."""
        return self.send(self.events.pre({"command": command}, self.events.call_id(), tool))

    def denied(self, command: str) -> Step:
        """A call the agent refused after the hook allowed it (Claude Code: ``PreToolUse``, no post
        event, then the step's ``PostToolBatch`` with the denial text)."""
        tool_input = {"command": command}
        call_id = self.events.call_id()
        step = Step(self.send(self.events.pre(tool_input, call_id)))
        step.batch = self.send(self.events.batch([(self.events.tool, tool_input, call_id,
                                                   "Claude requested permissions to use Bash, but you haven't "
                                                   "granted it yet.")]))
        return step

    def stop(self) -> Any:
        return self.send(self.events.stop())

    def finish(self) -> Any:
        """The agent stops and its session ends (a headless run's exit): the turn ends then, not
        at the stop, which another hook of the agent's may refuse (``turnguard.agents.ending``)."""
        answer = self.stop()
        self.send(self.events.session_end())
        return answer

    def snapshot(self) -> dict[str, Any]:
        return session_data(self.env, self.agent, self.session_id)

    def tool_calls(self) -> int:
        return int(self.snapshot()["turn"]["facts"]["tool_calls"])


def session_data(env: Mapping[str, str], agent: str, session_id: str) -> dict[str, Any]:
    """The session's stored state, read under its lock (under the id as the hook keeps it)."""
    from turnguard.agents.events import id_field
    from turnguard.agents.store import SessionStore, state_root

    kept = id_field({"session_id": session_id}, "session_id") or ""
    with SessionStore(state_root(dict(env)), agent).locked(kept) as session:
        return json.loads(json.dumps(session.data))


def tool_calls(env: Mapping[str, str], agent: str, session_id: str) -> int:
    return int(session_data(env, agent, session_id)["turn"]["facts"]["tool_calls"])


# -- reading answers ---------------------------------------------------------------------------------


def is_allow(answer: Any) -> bool:
    """The empty answer: go on, nothing said."""
    return answer.output == {} and answer.exit_code == 0 and answer.stderr == ""


def check_halts(agent: str, answer: Any) -> bool:
    """A check's answer denies the call in the agent's way, and stops the run where the agent allows
    it: Claude Code and Gemini CLI with ``continue: false``; Codex never (it would run the call)."""
    out = answer.output
    if answer.exit_code != 0 or not isinstance(out, dict):
        return False
    if agent == "claude-code":
        specific = out.get("hookSpecificOutput") or {}
        return (specific.get("hookEventName") == "PreToolUse" and specific.get("permissionDecision") == "deny"
                and bool(specific.get("permissionDecisionReason")) and out.get("continue") is False)
    if agent == "codex":
        specific = out.get("hookSpecificOutput") or {}
        return (specific.get("hookEventName") == "PreToolUse" and specific.get("permissionDecision") == "deny"
                and bool(specific.get("permissionDecisionReason")) and "continue" not in out)
    return out.get("decision") == "deny" and bool(out.get("reason")) and out.get("continue") is False


def outcome_halts(agent: str, step: Step) -> bool:
    """A call's outcome answers stop the run in the agent's way: Claude Code gives the model the
    reason from ``PostToolUseFailure`` (which cannot stop a run) and stops from the step's
    ``PostToolBatch``; Codex replaces the output with the reason (it cannot be stopped mid-turn);
    Gemini CLI stops from ``AfterTool``."""
    post = step.post.output
    if step.post.exit_code != 0 or not isinstance(post, dict):
        return False
    if agent == "claude-code":
        specific = post.get("hookSpecificOutput") or {}
        batch = step.batch.output if step.batch is not None else {}
        return (post.get("decision") == "block" and bool(specific.get("additionalContext"))
                and batch.get("continue") is False and bool(batch.get("stopReason")))
    if agent == "codex":
        return post.get("decision") == "block" and bool(post.get("reason")) and "continue" not in post
    specific = post.get("hookSpecificOutput") or {}
    return post.get("continue") is False and bool(specific.get("additionalContext"))


def asks(answer: Any) -> bool:
    """Claude Code's permission prompt for the call."""
    specific = (answer.output or {}).get("hookSpecificOutput") or {}
    return specific.get("permissionDecision") == "ask" and "continue" not in answer.output


# -- the exporter's work -------------------------------------------------------------------------------


def outbox(env: Mapping[str, str]) -> Path:
    return Path(env["TURNGUARD_STATE_DIR"]) / "hooks" / "outbox"


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def wait_for_export(env: Mapping[str, str]) -> None:
    """Until every journal handed over has been exported (the outbox holds none)."""
    box = outbox(env)
    wait_for(lambda: not box.is_dir() or not any(box.glob("*.json")), f"the outbox {box} to empty")


def recorded(env: Mapping[str, str]) -> list[dict[str, Any]]:
    path = Path(env["TURNGUARD_RECORDER_PATH"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# -- hook processes --------------------------------------------------------------------------------------


def hook_process(agent: str, stdin: bytes, env: Mapping[str, str],
                 **options: Any) -> subprocess.CompletedProcess[bytes]:
    """``python -m turnguard hook AGENT`` with ``stdin``: the command as an agent runs it."""
    return subprocess.run([*HOOK_COMMAND, agent], input=stdin, capture_output=True, env=dict(env),
                          timeout=TIMEOUT_S, check=False, **options)


@dataclass
class Exit:
    """How a forked hook process ended: its exit status (``-N``: killed by signal N) and output."""

    status: int
    stdout: bytes
    stderr: bytes


class ForkServer:
    """Hook processes forked from one interpreter that already imported turnguard (see the module's
    docstring). ``run`` starts one process per event at once and waits for them all; ``start``
    starts one and returns its pid (to kill it), ``wait`` reaps it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, __file__, str(workdir)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = self.process.stdout.readline()  # type: ignore[union-attr]
        assert ready.strip() == b"ready", ready

    def _ask(self, request: dict[str, Any]) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        reply = json.loads(line)
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(f"the fork server failed: {reply['error']}")
        return reply

    def run(self, agent: str, events: list[bytes], env: Mapping[str, str]) -> list[Exit]:
        """One process per event, all started at once; how each ended, in the events' order."""
        reply = self._ask({"op": "run", "agent": agent, "env": dict(env),
                           "events": [base64.b64encode(e).decode() for e in events]})
        return [Exit(r["status"], base64.b64decode(r["stdout"]), base64.b64decode(r["stderr"])) for r in reply]

    def start(self, agent: str, event: bytes, env: Mapping[str, str]) -> int:
        return int(self._ask({"op": "start", "agent": agent, "env": dict(env),
                              "events": [base64.b64encode(event).decode()]}))

    def wait(self, pid: int) -> Exit:
        r = self._ask({"op": "wait", "pid": pid})
        return Exit(r["status"], base64.b64decode(r["stdout"]), base64.b64decode(r["stderr"]))

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()  # the server's loop ends with its input
        try:
            self.process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def _serve(workdir: Path) -> None:  # pragma: no cover (runs in the server process)
    import runpy
    import tempfile
    import traceback

    import turnguard  # (what a fresh interpreter spends its first quarter second on)
    import turnguard._guard
    import turnguard.agents.claude_code
    import turnguard.agents.codex
    import turnguard.agents.gemini
    import turnguard.agents.hook

    numbers = itertools.count()
    started: dict[int, tuple[Path, Path]] = {}
    with tempfile.TemporaryDirectory() as warm:  # each agent's path run once: its caches warm in every child
        env = hook_env(Path(warm))
        for agent in AGENTS:
            events = Events(agent, Path(warm))
            for payload in (events.prompt(), events.pre({"command": "x"}, events.call_id()),
                            events.post({"command": "x"}, "call_0001", failed=True)):
                turnguard.agents.hook.run(agent, json.dumps(payload).encode(), env)

    def fork(agent: str, env: dict[str, str], event: bytes, go: tuple[int, int] | None) -> int:
        n = next(numbers)
        files = (workdir / f"in-{n}", workdir / f"out-{n}", workdir / f"err-{n}")
        files[0].write_bytes(event)
        files[1].write_bytes(b"")  # (a child killed before it opens them has written nothing)
        files[2].write_bytes(b"")
        pid = os.fork()
        if pid == 0:
            status = 70
            try:
                if go is not None:
                    os.close(go[1])
                    os.read(go[0], 1)  # every child of a batch starts when the server closes the other end
                for fd, (path, flags) in enumerate(((files[0], os.O_RDONLY),
                                                    (files[1], os.O_WRONLY | os.O_TRUNC),
                                                    (files[2], os.O_WRONLY | os.O_TRUNC))):
                    opened = os.open(path, flags, 0o600)
                    os.dup2(opened, fd)
                    os.close(opened)
                sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
                sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
                os.environ.clear()
                os.environ.update(env)
                sys.argv = ["turnguard", "hook", agent]
                try:
                    runpy.run_module("turnguard", run_name="__main__", alter_sys=True)
                    status = 0
                except SystemExit as exc:
                    status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                except BaseException:
                    traceback.print_exc()
                    status = 1
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
            finally:
                os._exit(status)
        started[pid] = files[1], files[2]
        return pid

    def reap(pid: int) -> dict[str, Any]:
        _, raw = os.waitpid(pid, 0)
        out, err = started.pop(pid)
        status = -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
        return {"status": status, "stdout": base64.b64encode(out.read_bytes()).decode(),
                "stderr": base64.b64encode(err.read_bytes()).decode()}

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        events = [base64.b64decode(e) for e in request.get("events", [])]
        reply: Any
        try:
            if request["op"] == "run":
                go_read, go_write = os.pipe()
                pids = [fork(request["agent"], request["env"], e, (go_read, go_write)) for e in events]
                os.close(go_read)
                os.close(go_write)
                reply = [reap(pid) for pid in pids]
            elif request["op"] == "start":
                reply = fork(request["agent"], request["env"], events[0], None)
            else:
                reply = reap(int(request["pid"]))
        except Exception as exc:  # said to the test, which fails with it; the server goes on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))


def ten_threads_round(env: dict[str, str], round_: int, folder: Path, run: Callable[[int, str, bytes], Any]) -> None:
    """Round ``round_`` of ten threads checking ten distinct calls of a new turn at once through
    ``run(i, agent, payload)``: every answer allows, and the session counts all ten."""
    agent = AGENTS[round_ % 3]
    events = Events(agent, folder)
    events.turn_id = f"turn-{round_}"
    payloads = [json.dumps(events.pre({"command": f"cat t{i}.txt"}, events.call_id())).encode() for i in range(10)]
    answers: list[Any] = [None] * 10
    start = threading.Barrier(10)

    def one(i: int) -> None:
        start.wait()
        answers[i] = run(i, agent, payloads[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert all(a is not None and is_allow(a) for a in answers), (round_, answers)
    assert tool_calls(env, agent, events.session_id) == 10, round_
