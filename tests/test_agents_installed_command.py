"""The hook command ``turnguard install`` writes never blocks its agent by failing to start.

All three agents take a hook's exit status 2 as a refusal of the event (a prompt, a tool call, and
at ``Stop`` the agent's stop), and Python exits 2 when it cannot open the script it is given. So
the command runs the client through ``install.LAUNCHER``: when the client is gone (turnguard
uninstalled without ``turnguard uninstall``, its environment rebuilt on another Python, a moved
checkout), every event of every agent gets exit 1, which the agents show as a hook error and go
on, with one line on stderr. While the client is there, every answer and exit status passes
through as the client gives it: a block under ``fail_mode="closed"`` still blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import turnguard
from turnguard.agents import install as ins

AGENTS = ins.AGENTS
BLOCKING_EXIT = 2


def _remove_package(package: Path) -> None:
    shutil.rmtree(package)


def _move_environment(package: Path) -> None:
    package.parent.rename(package.parent.with_name(package.parent.name + "-old"))


def _remove_client(package: Path) -> None:
    (package / "agents" / "client.py").unlink()


def _client_a_folder(package: Path) -> None:
    client = package / "agents" / "client.py"
    client.unlink()
    client.mkdir()


GONE: dict[str, Callable[[Path], None]] = {
    "uninstalled": _remove_package,
    "environment moved": _move_environment,
    "client removed": _remove_client,
    "client a folder": _client_a_folder,
}
"""Ways the client the installed command names stops being there."""


def installed_commands(agent: str, root: Path) -> dict[str, str]:
    """``turnguard install AGENT --project`` run from a copy of this turnguard under ``root``, as
    a user would run it: the command written for each of the agent's events."""
    site = root / "site"
    shutil.copytree(Path(turnguard.__file__).parent, site / "turnguard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    project, home = root / "project", root / "home"
    project.mkdir()
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(site),
           "CODEX_HOME": str(home / ".codex"), "TURNGUARD_LOAD_PLUGINS": "0"}
    done = subprocess.run([sys.executable, "-m", "turnguard", "install", agent, "--project"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    spec = ins.AGENT_HOOKS[agent]
    settings = json.loads((project / spec.folder / spec.file).read_text())
    commands = {name: group["hooks"][0]["command"] for name, groups in settings["hooks"].items()
                for group in groups}
    assert sorted(commands) == sorted(e.name for e in spec.events)
    return commands


def run_command(command: str, payload: bytes, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The command as the agents run it: by a shell, the event on stdin."""
    return subprocess.run(["/bin/sh", "-c", command], input=payload, env=env, cwd=cwd, capture_output=True,
                          timeout=60, check=False)


def payload(event: str, call: int = 1) -> bytes:
    return json.dumps({"hook_event_name": event, "session_id": "s1", "prompt_id": "p1", "turn_id": "t1",
                       "tool_name": "Bash", "tool_input": {"command": f"make {call}"}, "tool_use_id": f"c{call}",
                       "cwd": "/"}).encode()


@pytest.mark.parametrize("gone", GONE)
@pytest.mark.parametrize("agent", AGENTS)
def test_a_client_that_is_gone_never_blocks_any_event_and_says_so_once(agent: str, gone: str,
                                                                        tmp_path: Path) -> None:
    commands = installed_commands(agent, tmp_path)
    client = str(tmp_path / "site" / "turnguard" / "agents" / "client.py")
    GONE[gone](tmp_path / "site" / "turnguard")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"),
           "TURNGUARD_STATE_DIR": str(tmp_path / "state")}
    for event, command in commands.items():
        done = run_command(command, payload(event), env, tmp_path / "project")
        assert done.returncode == 1, (event, done.returncode, done.stderr)
        assert done.stdout == b"", event
        lines = done.stderr.decode().splitlines()
        assert len(lines) == 1 and client in lines[0] and lines[0].endswith("; allowed"), (event, lines)


@pytest.fixture
def hook_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The installed command's environment; the server the client starts is ended afterwards."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "TURNGUARD_STATE_DIR": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(runtime),
           "TURNGUARD_RECORDER_PATH": str(tmp_path / "turns.jsonl"), "TURNGUARD_LOAD_PLUGINS": "0",
           "TURNGUARD_MAX_TOOL_CALLS_PER_TURN": "2"}
    yield env
    for lock in runtime.glob("*/*.lock"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(lock.read_text() or "0"), signal.SIGKILL)


@pytest.mark.parametrize("agent", AGENTS)
def test_while_the_client_is_there_every_answer_and_exit_status_passes_through(agent: str, hook_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    command = ins.hook_command(agent)
    start = {"claude-code": "UserPromptSubmit", "codex": "UserPromptSubmit", "gemini": "BeforeAgent"}[agent]
    check = {"claude-code": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}[agent]
    direct = [sys.executable, "-m", "turnguard", "hook", agent]
    for data, extra in ((payload(start), {}), (payload(check), {}), (b"not json", {}),
                        (b"not json", {"TURNGUARD_FAIL_MODE": "closed"}),
                        (payload(check, 2), {}), (payload(check, 3), {})):
        env = {**hook_env, **extra}
        through = run_command(command, data, env, tmp_path)
        env["TURNGUARD_STATE_DIR"] += "-direct"  # (the same events, in a state of their own)
        expected = subprocess.run(direct, input=data, env=env, capture_output=True, timeout=60, check=False)
        assert (through.returncode, through.stdout, through.stderr.rstrip(b"\n")) == (
            expected.returncode, expected.stdout, expected.stderr.rstrip(b"\n")), (data, extra)
    halted = json.loads(through.stdout)  # (call 3 of a turn capped at 2)
    assert "deny" in json.dumps(halted), halted
    closed = run_command(command, b"not json", {**hook_env, "TURNGUARD_FAIL_MODE": "closed"}, tmp_path)
    assert closed.returncode == BLOCKING_EXIT and b"blocked (fail_mode=closed)" in closed.stderr


def test_the_written_command_is_turnguards_and_runs_the_client_named_in_it() -> None:
    client = str(Path(ins.__file__).with_name("client.py"))
    words = shlex.split(ins.hook_command("codex", "/a b/python"))
    assert words[:4] == ["/a b/python", "-S", "-P", "-c"] and words[5] == "codex"
    assert ins.launched_client(words[4]) == client
    for path in ("/x y/site-packages/turnguard/agents/client.py", "/q'\"$`\\/turnguard/agents/client.py",
                 "/é\udcff/turnguard/agents/client.py"):
        code = ins.LAUNCHER.replace("{client}", json.dumps(path))
        assert ins.launched_client(code) == path
        assert ins.is_turnguard_command(shlex.join(["python3", "-S", "-P", "-c", code, "gemini"])), path
    for code in (ins.LAUNCHER.replace("{client}", json.dumps("/x/turnguard/agents/other.py")),
                 ins.LAUNCHER.replace("{client}", "__import__('os').system('x')"),
                 ins.LAUNCHER.replace("{client}", "1"),
                 "import runpy; runpy.run_path('/x/turnguard/agents/client.py')",
                 ins.LAUNCHER.replace("{client}", json.dumps("/x/turnguard/agents/client.py")) + ";print(1)"):
        assert ins.launched_client(code) in (None, "/x/turnguard/agents/other.py"), code
        assert not ins.is_turnguard_command(shlex.join(["python3", "-S", "-c", code, "codex"])), code
