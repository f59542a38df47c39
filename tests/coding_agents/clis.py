"""The pinned coding-agent CLIs, run headless in a project folder against a ``ModelServer``.

Each run gets its own HOME (so no user setting, credential or session leaks in or out) and talks
to 127.0.0.1 only. The runners never write hook settings unless given ``hooks``: the real tests
install them with ``turnguard install``."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coding_agents.model_server import Agent

HERE = Path(__file__).resolve().parent
LOCKFILE = HERE / "package-lock.json"
"""With ``package.json`` beside it, the exact versions ``./dev.sh test`` installs (``npm ci``)."""

BINARIES: dict[Agent, str] = {"claude": "claude", "codex": "codex", "gemini": "gemini"}
API_KEY = "test-key-not-a-secret"
DROPPED_ENV = ("ANTHROPIC_", "CLAUDE", "OPENAI_", "CODEX_", "GEMINI_", "GOOGLE_", "XDG_", "HTTP_PROXY",
               "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
"""Outer settings that would point an agent at a real account, a real HOME or a proxy."""


def agents_dir() -> Path:
    """``$TG_AGENTS_DIR``, else the cache folder ``./dev.sh test`` installs into (keyed like it by
    the lockfile's hash, so a version bump is a new folder)."""
    if os.environ.get("TG_AGENTS_DIR"):
        return Path(os.environ["TG_AGENTS_DIR"])
    cache = os.environ.get("TG_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "turnguard"
    return Path(cache) / f"agents-{hashlib.sha256(LOCKFILE.read_bytes()).hexdigest()[:16]}"


def binary(agent: Agent) -> Path:
    return agents_dir() / "node_modules" / ".bin" / BINARIES[agent]


def require(agent: Agent) -> Path:
    """The agent's binary; skips without it, fails under CI (where ``./dev.sh test`` installs it)."""
    path = binary(agent)
    if not os.access(path, os.X_OK):
        message = f"{agent} is not installed at {path} (./dev.sh test installs it; TG_AGENTS_DIR overrides)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass
class AgentRun:
    """What one CLI run left: its exit, its output, and ``result`` parsed from stdout (Claude
    Code's and Gemini CLI's JSON result object, Codex's list of JSONL events)."""

    agent: Agent
    returncode: int
    stdout: str
    stderr: str
    result: Any
    seconds: float
    home: Path
    timed_out: bool = False

    @property
    def text(self) -> str | None:
        """The agent's final answer text."""
        if self.agent == "codex":
            messages = [e["item"]["text"] for e in self.result or [] if e.get("type") == "item.completed"
                        and e.get("item", {}).get("type") == "agent_message"]
            return messages[-1] if messages else None
        if isinstance(self.result, dict):
            return self.result.get("result" if self.agent == "claude" else "response")
        return None

    @property
    def session_id(self) -> str | None:
        """The id a later run resumes with (``resume=``)."""
        if self.agent == "codex":
            return next((e.get("thread_id") for e in self.result or [] if e.get("type") == "thread.started"), None)
        return self.result.get("session_id") if isinstance(self.result, dict) else None

    def describe(self) -> str:
        """Exit, time and output tails, for an assertion message."""
        return (f"{self.agent} exited {self.returncode} after {self.seconds:.1f} s"
                f"{' (timed out)' if self.timed_out else ''}\n--- stdout\n{self.stdout[-3000:]}"
                f"\n--- stderr\n{self.stderr[-3000:]}")


def base_env(home: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment without the agents' own settings, with HOME and TMPDIR in
    ``home`` and no proxy for 127.0.0.1; ``extra`` last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV)}
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"), NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost", NO_COLOR="1")
    env.update(extra or {})
    return env


def new_home(project: Path) -> Path:
    """A fresh HOME beside the project (so a test's ``tmp_path`` holds and removes it)."""
    return Path(tempfile.mkdtemp(prefix=f"{project.name}-home-", dir=project.parent))


def execute(agent: Agent, argv: Sequence[str], project: Path, env: dict[str, str], home: Path,
            timeout: float) -> AgentRun:
    """Runs ``argv`` in its own process group, so a timeout also ends the commands it started."""
    start = time.monotonic()
    process = subprocess.Popen(argv, cwd=project, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    return AgentRun(agent, process.returncode, stdout, stderr, parse_result(agent, stdout),
                    time.monotonic() - start, home, timed_out)


def parse_result(agent: Agent, stdout: str) -> Any:
    if agent == "codex":
        return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    start = stdout.find("{")
    try:
        return json.loads(stdout[start:]) if start >= 0 else None
    except ValueError:
        return None


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def run_claude(project: Path, url: str, prompt: str, *, env: Mapping[str, str] | None = None,
               timeout: float = 120, home: Path | None = None, resume: str | None = None,
               allowed_tools: Sequence[str] = ("Bash",), args: Sequence[str] = (),
               hooks: Mapping[str, Any] | None = None) -> AgentRun:
    """``claude -p PROMPT --output-format json`` (root may not skip permissions: the tools the
    model may use are ``allowed_tools``). The project is marked trusted in ``~/.claude.json``."""
    home = home or new_home(project)
    state = home / ".claude.json"
    if not state.exists():
        trusted = {str(project): {"hasTrustDialogAccepted": True}}
        write_json(state, {"hasCompletedOnboarding": True, "projects": trusted})
    if hooks is not None:
        write_hooks("claude", project, hooks, home)
    argv = [str(require("claude")), "-p", prompt, "--output-format", "json",
            "--allowedTools", ",".join(allowed_tools), *(["--resume", resume] if resume else []), *args]
    agent_env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": API_KEY, "DISABLE_AUTOUPDATER": "1",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **(env or {})}
    return execute("claude", argv, project, base_env(home, agent_env), home, timeout)


def claude_interactive(project: Path, url: str, home: Path, *, env: Mapping[str, str] | None = None) -> Any:
    """The interactive ``claude`` in a terminal (``tmux.Terminal``), past every first-run screen:
    onboarding done and the project trusted (``~/.claude.json``), the API key of the environment
    approved there (else it asks whether to use it), and the permission mode ``default`` (the
    ``auto`` mode, the default, asks a classifier of Anthropic's servers, which the scripted model
    server is not). Shell commands are allowed by the project's settings, so the only permission
    question is one a hook asks for."""
    from coding_agents.tmux import Terminal

    write_json(home / ".claude.json", {
        "hasCompletedOnboarding": True, "theme": "dark",
        "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
        "projects": {str(project): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}})
    settings = project / ".claude" / "settings.json"
    current = json.loads(settings.read_text(encoding="utf-8")) if settings.exists() else {}
    write_json(settings, {**current, "permissions": {"allow": ["Bash"], "defaultMode": "default"}})
    agent_env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": API_KEY, "DISABLE_AUTOUPDATER": "1",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "TERM": "xterm-256color", **(env or {})}
    return Terminal([str(require("claude"))], project, base_env(home, agent_env), home / "tmux.sock")


def codex_config(url: str, project: Path) -> str:
    """``config.toml`` for a provider on the scripted server (no retries: a failure shows at once),
    hooks on, analytics off, and ``project`` trusted (so its ``.codex/`` layer loads too)."""
    return "\n".join([
        'model = "scripted-model"', 'model_provider = "scripted"', "",
        "[model_providers.scripted]", 'name = "scripted"', f'base_url = "{url}/v1"', 'wire_api = "responses"',
        'env_key = "TG_MODEL_API_KEY"', "request_max_retries = 0", "stream_max_retries = 0", "",
        "[features]", "hooks = true", "", "[analytics]", "enabled = false", "",
        f"[projects.{json.dumps(str(project))}]", 'trust_level = "trusted"', ""])


def run_codex(project: Path, url: str, prompt: str, *, env: Mapping[str, str] | None = None,
              timeout: float = 120, home: Path | None = None, resume: str | None = None, args: Sequence[str] = (),
              bypass_hook_trust: bool = True, hooks: Mapping[str, Any] | None = None) -> AgentRun:
    """``codex exec --json`` without approvals or sandbox; ``$CODEX_HOME`` is ``HOME/.codex``.
    Codex runs no hook it has not recorded as reviewed (``[hooks.state]`` in ``config.toml``),
    silently, unless ``bypass_hook_trust``."""
    home = home or new_home(project)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(url, project), encoding="utf-8")
    if hooks is not None:
        write_hooks("codex", project, hooks, home)
    flags = ["--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
             *(["--dangerously-bypass-hook-trust"] if bypass_hook_trust else []), *args]
    argv = [str(require("codex")), "exec", *(["resume", *flags, resume] if resume else flags), prompt]
    agent_env = {"CODEX_HOME": str(codex_home), "TG_MODEL_API_KEY": API_KEY, **(env or {})}
    return execute("codex", argv, project, base_env(home, agent_env), home, timeout)


GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}
"""The user settings of a Gemini CLI run: API-key auth (on the scripted server), nothing sent home."""


def run_gemini(project: Path, url: str, prompt: str, *, env: Mapping[str, str] | None = None,
               timeout: float = 120, home: Path | None = None, resume: str | None = None, args: Sequence[str] = (),
               settings: Mapping[str, Any] | None = None, hooks: Mapping[str, Any] | None = None) -> AgentRun:
    """``gemini -p PROMPT --yolo -o json`` in a trusted workspace; ``settings`` are merged over
    ``GEMINI_SETTINGS`` in the user settings. It does not start itself again for a larger heap
    (``GEMINI_CLI_NO_RELAUNCH``): that second start of its bundle costs seconds."""
    home = home or new_home(project)
    write_json(home / ".gemini" / "settings.json", merge(GEMINI_SETTINGS, settings or {}))
    if hooks is not None:
        write_hooks("gemini", project, hooks, home)
    argv = [str(require("gemini")), "-p", prompt, "--yolo", "--output-format", "json",
            *(["--resume", resume] if resume else []), *args]
    agent_env = {"GEMINI_CLI_TRUST_WORKSPACE": "true", "GEMINI_API_KEY": API_KEY, "GOOGLE_GEMINI_BASE_URL": url,
                 "GEMINI_CLI_NO_RELAUNCH": "true", **(env or {})}
    return execute("gemini", argv, project, base_env(home, agent_env), home, timeout)


RUNNERS = {"claude": run_claude, "codex": run_codex, "gemini": run_gemini}


def run(agent: Agent, project: Path, url: str, prompt: str, **options: Any) -> AgentRun:
    """The agent's runner, for tests parametrized over agents."""
    return RUNNERS[agent](project, url, prompt, **options)


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base``, nested mappings key by key."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = merge(merged[key], value) if isinstance(value, Mapping) and isinstance(
            merged.get(key), Mapping) else value
    return merged


def write_hooks(agent: Agent, project: Path, hooks: Mapping[str, Any], home: Path | None = None) -> Path:
    """Writes a ``{"EventName": [{"matcher": ..., "hooks": [...]}]}`` block where the agent reads it:
    Claude Code and Gemini CLI in the project's settings, Codex in ``$CODEX_HOME/hooks.json``."""
    if agent == "codex":
        assert home is not None, "Codex reads hooks from $CODEX_HOME (HOME/.codex)"
        path = home / ".codex" / "hooks.json"
    else:
        path = project / f".{agent}" / "settings.json"
    current = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    write_json(path, {**current, "hooks": dict(hooks)})
    return path


def command_hooks(command: str, events: Sequence[str], matcher: str | None = "*",
                  timeout: float | None = None) -> dict[str, Any]:
    """A hooks block running ``command`` for each of ``events`` (``matcher`` for tool events)."""
    hook: dict[str, Any] = {"type": "command", "command": command}
    if timeout is not None:
        hook["timeout"] = timeout
    tool_events = {"PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest", "BeforeTool", "AfterTool"}
    return {event: [{**({"matcher": matcher} if matcher and event in tool_events else {}), "hooks": [hook]}]
            for event in events}


LOG_EVENT = ("import sys; line = sys.stdin.read().replace(chr(10), ' ').strip(); "
             "open(sys.argv[1], 'a').write(line + chr(10)); print(sys.argv[2])")


def logging_hook(log: Path, answer: str = "{}") -> str:
    """A command that appends each event's stdin (one line) to ``log`` and prints ``answer``."""
    return " ".join(shlex.quote(part) for part in (sys.executable, "-c", LOG_EVENT, str(log), answer))


def logged_events(log: Path) -> list[dict[str, Any]]:
    """The events a ``logging_hook`` wrote, in the order their hooks finished."""
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
