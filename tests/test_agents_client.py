"""The client the command ``turnguard install`` writes runs: ``.../agents/client.py AGENT``, which asks the
long-lived local server and falls back to ``python -m turnguard hook AGENT`` in a process of its
own. Whatever answers, the answer and the session's state are the same."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from turnguard.agents import client
from turnguard.agents.store import SessionStore, state_root

CLIENT = [sys.executable, "-S", client.__file__, "claude-code"]


def event(name: str, i: int = 0, session: str = "s") -> bytes:
    payload = {"hook_event_name": name, "session_id": session, "prompt_id": "p", "cwd": "/"}
    if name != "UserPromptSubmit":
        payload.update(tool_name="Bash", tool_input={"command": "make"}, tool_use_id=f"t{i}")
    if name == "PostToolUseFailure":
        payload["error"] = "Exit code 2"
    return json.dumps(payload).encode()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    return {**os.environ, "TURNGUARD_STATE_DIR": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(runtime),
            "TURNGUARD_RECORDER_PATH": str(tmp_path / "turns.jsonl")}


def ask(data: bytes, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(CLIENT, input=data, env=env, capture_output=True, timeout=60, check=False)


def socket_of(env: dict[str, str]) -> Path:
    code = "from turnguard.agents import client; print(client.socket_path())"
    return Path(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                               check=True).stdout.strip())


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no server socket at {path}"
        time.sleep(0.05)


def streak_answers(env: dict[str, str]) -> list[dict[str, object]]:
    """Eight identical failing calls, through the client: the answers to each outcome."""
    assert ask(event("UserPromptSubmit"), env).returncode == 0
    answers = []
    for i in range(8):
        assert json.loads(ask(event("PreToolUse", i), env).stdout) == {}
        done = ask(event("PostToolUseFailure", i), env)
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    return answers


def test_the_client_starts_a_server_and_its_answers_are_the_hooks(env: dict[str, str]) -> None:
    answers = streak_answers(env)
    assert answers[:7] == [{}] * 7 and answers[7]["decision"] == "block"
    wait_for(socket_of(env))
    direct = subprocess.run([sys.executable, "-m", "turnguard", "hook", "claude-code"], input=event("PreToolUse", 9),
                            env=env, capture_output=True, timeout=60, check=True)
    through = ask(event("PreToolUse", 10), env)
    assert json.loads(through.stdout) == json.loads(direct.stdout)
    assert json.loads(through.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_a_server_killed_between_events_loses_nothing(env: dict[str, str]) -> None:
    assert ask(event("UserPromptSubmit"), env).returncode == 0
    path = socket_of(env)
    for i in range(4):
        ask(event("PreToolUse", i), env)
        ask(event("PostToolUseFailure", i), env)
    wait_for(path)
    killed = subprocess.run(["pkill", "-KILL", "-f", f"turnguard.agents serve {path}"], check=False)
    assert killed.returncode == 0, "the server was running"
    for i in range(4, 8):
        assert json.loads(ask(event("PreToolUse", i), env).stdout) == {}
        last = ask(event("PostToolUseFailure", i), env)
    assert json.loads(last.stdout)["decision"] == "block"  # the 8th failure, counted across the death
    with SessionStore(state_root(env), "claude-code").locked("s") as session:
        assert session.data["turn"]["facts"]["tool_calls"] == 8


def test_a_long_temporary_folder_still_gets_a_socket_path_that_fits(env: dict[str, str], tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    env = {**env, "TMPDIR": str(deep)}
    env.pop("XDG_RUNTIME_DIR")
    path = socket_of(env)
    assert len(str(path)) <= client.MAX_SOCKET_PATH
    streak_answers(env)
    wait_for(path)


def test_a_socket_folder_open_to_others_is_never_used_and_every_event_is_answered(
        env: dict[str, str], tmp_path: Path) -> None:
    path = socket_of(env)
    path.parent.mkdir(mode=0o777)
    path.parent.chmod(0o777)
    answers = streak_answers(env)
    assert answers[7]["decision"] == "block"
    assert not path.exists()


def test_turnguard_result_reports_the_last_turn_once_with_the_agents_labels(env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    from turnguard.telemetry._receiver import OtlpReceiver, attributes

    def accepted(rx: OtlpReceiver) -> list[dict[str, object]]:
        records = [attributes(record.attributes) for _, record in rx.logs()]
        return [a for a in records if a.get("turnguard.turn.resolved") is True]

    command = [sys.executable, "-m", "turnguard", "result", "claude-code", "resolved"]
    none = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert none.returncode == 1 and "no ended claude-code turn" in none.stderr
    streak_answers(env)
    assert ask(event("Stop"), env).returncode == 0
    assert ask(event("SessionEnd"), env).returncode == 0  # (the stop is confirmed: the turn ends)
    kept = Path(env["TURNGUARD_STATE_DIR"]) / "hooks" / "results" / "claude-code"
    wait_for_any(kept)
    with OtlpReceiver() as rx:
        otlp = {**env, "TURNGUARD_OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "TURNGUARD_OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        done = subprocess.run(command, env=otlp, capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout) == (0, "claude-code: resolved\n"), done.stderr
        assert rx.wait_for(lambda r: bool(accepted(r)))
        (labels,) = accepted(rx)
    assert (labels["gen_ai.agent.name"], labels["turnguard.loop.threshold"]) == ("claude-code", "streak")
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 1 and "already" in again.stderr


def wait_for_any(folder: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (folder.is_dir() and any(folder.glob("*.json"))):
        assert time.monotonic() < deadline, f"no result token kept in {folder}"
        time.sleep(0.1)


def test_the_request_header_carries_the_agent_folder_and_environment_exactly(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TG_ODD", "a=b \udcff ü")
    monkeypatch.setenv("TURNGUARD_CONFIG", "conf/turnguard.toml")
    agent, cwd, env = client.read_header(client.header("codex"))
    assert (agent, cwd) == ("codex", str(tmp_path))
    assert env["TURNGUARD_CONFIG"] == str(tmp_path / "conf" / "turnguard.toml")  # the server runs elsewhere
    assert {**env, "TURNGUARD_CONFIG": "conf/turnguard.toml"} == dict(os.environ)


def imported(argv: list[str], data: bytes, env: dict[str, str]) -> set[str]:
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", *argv], input=data, env=env,
                          capture_output=True, timeout=60, check=False)
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines()
            if line.startswith("import time:") and "|" in line} - {"imported package"}


def test_the_client_loads_only_a_socket_and_a_hash_besides_os(env: dict[str, str]) -> None:
    """Each module more costs every tool call (``json`` or ``socket``: more than starting Python)."""
    streak_answers(env)
    wait_for(socket_of(env))
    bare = imported(["-c", "from __future__ import annotations; import os, sys"], b"", env)
    extra = imported(CLIENT[2:], event("PreToolUse", 9), env) - bare
    assert extra <= {"_socket", "_sha256", "_sha2", "hashlib"} and "_socket" in extra, extra


USAGE_ERRORS = [[], ["claude"], ["Claude-Code"], ["claude-code", "--verbose"], ["codex", "gemini"], [""]]
"""Hook commands written wrong by hand."""


@pytest.mark.parametrize("command", ["client", "turnguard hook"])
@pytest.mark.parametrize("argv", USAGE_ERRORS)
def test_a_hook_command_written_wrong_never_blocks_and_says_why(command: str, argv: list[str],
                                                                env: dict[str, str]) -> None:
    """Exit 2 would block every tool call and prompt: a usage error exits 1, which all three agents
    show as a hook error and go on."""
    env["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tg-", dir="/tmp")  # short: the socket's own folder
    program = [sys.executable, "-S", client.__file__] if command == "client" else [sys.executable, "-m",
                                                                                    "turnguard", "hook"]
    done = subprocess.run([*program, *argv], input=event("PreToolUse"), env=env, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 1 and done.stdout == b"", done
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("turnguard hook: usage: ") and "claude-code,codex,gemini" in line, line
    assert line.endswith("; allowed") and repr(" ".join(argv)) in line, line
    try:
        assert not socket_of(env).parent.exists(), "no server is started for it"
    finally:
        shutil.rmtree(env["XDG_RUNTIME_DIR"])
    errors = Path(env["TURNGUARD_STATE_DIR"], "hooks", "errors.log").read_text().splitlines()
    assert len(errors) == 1 and "usage" in errors[0], errors


def test_the_clients_agents_are_the_hooks() -> None:
    from turnguard.agents.hook import PROTOCOLS

    assert tuple(PROTOCOLS) == client.AGENTS


# -- a wedged server ---------------------------------------------------------------------------------

HOLDER = """
import fcntl, os, socket, sys, time
path = os.environ["TG_SOCKET"]
lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_EX)
os.ftruncate(lock, 0)
os.pwrite(lock, os.environ.get("TG_WRITTEN", str(os.getpid())).encode(), 0)
if os.path.exists(path):
    os.unlink(path)
listening = socket.socket(socket.AF_UNIX)
listening.bind(path)
listening.listen(64)
print("ready", flush=True)
time.sleep(600)
"""
"""A process that holds a server's lock and socket and never accepts: with the socket's path among
its arguments (as ``python -m turnguard.agents serve PATH``) it is a wedged server; without, it is
some other process the client must leave alone. ``TG_WRITTEN``: what it writes in the lock file."""


def hold(path: Path, env: dict[str, str], names_socket: bool, written: str | None = None) -> subprocess.Popen[bytes]:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    extra = {"TG_SOCKET": str(path), **({"TG_WRITTEN": written} if written is not None else {})}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, *([str(path)] if names_socket else [])],
                              env={**env, **extra}, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
    return holder


def stopped_server(path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The real server, stopped (``SIGSTOP``) between events: it holds its lock and never answers."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    server = subprocess.Popen([sys.executable, "-m", "turnguard.agents", "serve", str(path)], env=env)
    lock = Path(f"{path}.lock")
    deadline = time.monotonic() + 60
    while not (path.exists() and lock.exists() and lock.read_text() == str(server.pid)):
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    os.kill(server.pid, signal.SIGSTOP)
    return server


def ask_within(data: bytes, env: dict[str, str], wait_s: float, *,
               fallback: bool = True) -> subprocess.CompletedProcess[bytes]:
    """The installed client with its wait for the server set to ``wait_s``; ``fallback=False``:
    it exits 99 where it would answer in a process of its own (so 0 means the server answered)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(client.__file__).parent)!r}); import client; "
            f"client.ANSWER_TIMEOUT_S = {wait_s}; "
            + ("" if fallback else "client.answer_here = lambda argv, event: (99, b'', b'answered here'); ")
            + "raise SystemExit(client.main(['claude-code']))")
    return subprocess.run([sys.executable, "-S", "-c", code], input=data, env=env, capture_output=True,
                          timeout=120, check=False)


def end_servers_of(path: Path) -> None:
    """End the servers of ``path`` the clients started in a test (each names the test's own socket)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)


def wait_for_new_server(path: Path, wedged_pid: int) -> None:
    """Until the server the client started in the wedged one's place listens: the lock names
    another process and the socket takes a connection (its start is not timed by the test)."""
    import socket as sockets

    lock = Path(f"{path}.lock")
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "no server took the wedged one's place"
        with contextlib.suppress(OSError), sockets.socket(sockets.AF_UNIX) as probe:
            if lock.read_text() not in ("", str(wedged_pid)):
                probe.connect(str(path))
                return
        time.sleep(0.05)


@pytest.mark.parametrize("wedge", ["stopped", "never accepts"])
def test_a_wedged_server_is_ended_and_replaced_so_only_one_event_waits_for_it(wedge: str,
                                                                            env: dict[str, str]) -> None:
    path = socket_of(env)
    wedged = stopped_server(path, env) if wedge == "stopped" else hold(path, env, names_socket=True)
    try:
        first = ask_within(event("UserPromptSubmit"), env, 1.0)
        assert first.returncode == 0 and json.loads(first.stdout) == {}, first
        assert wedged.wait(timeout=30) == -signal.SIGKILL, "the wedged server was ended"
        wait_for_new_server(path, wedged.pid)
        answers = []
        for i in range(8):  # every later event answered by the new server, none in a process of its own
            assert ask_within(event("PreToolUse", i), env, 60.0, fallback=False).returncode == 0
            done = ask_within(event("PostToolUseFailure", i), env, 60.0, fallback=False)
            assert done.returncode == 0, done
            answers.append(json.loads(done.stdout))
        assert answers[:7] == [{}] * 7 and answers[7]["decision"] == "block"  # counted as ever
    finally:
        with contextlib.suppress(ProcessLookupError):
            wedged.kill()
        wedged.wait()
        end_servers_of(path)


@pytest.mark.parametrize("written", ["own", "another process", "", "garbage", "1", "-1", "99999999"])
def test_a_lock_holder_that_is_not_a_server_of_the_socket_is_never_ended(written: str, env: dict[str, str]) -> None:
    """Whatever its lock file says, a process that does not name the socket is left alone; the
    event is answered all the same."""
    path = socket_of(env)
    bystander = subprocess.Popen(["sleep", "600"])
    text = {"own": None, "another process": str(bystander.pid)}.get(written, written)
    holder = hold(path, env, names_socket=False, written=text)
    try:
        answered = [ask_within(event(name), env, 0.5) for name in ("UserPromptSubmit", "PreToolUse")]
        assert all(done.returncode == 0 and json.loads(done.stdout) == {} for done in answered), answered
        assert holder.poll() is None and bystander.poll() is None, "nothing but a wedged server is ended"
    finally:
        for process in (holder, bystander):
            process.kill()
            process.wait()
        end_servers_of(path)


def test_a_lock_file_left_by_a_dead_server_ends_nothing(env: dict[str, str]) -> None:
    """A server gone (no process holds its lock) is not ended again, whatever process has its old id
    now, even one naming the socket."""
    path = socket_of(env)
    path.parent.mkdir(mode=0o700)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(path)])
    Path(f"{path}.lock").write_text(str(bystander.pid))
    try:
        client.end_wedged_server(str(path))
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
