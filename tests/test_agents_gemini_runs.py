"""Gemini CLI's refused stop: a headless run's keeps the turn, an interactive session's opens one.

Gemini CLI sends a refused ``AfterAgent`` back as a ``BeforeAgent`` whose prompt is the refusal,
which no field tells from a new prompt. A headless run (``gemini -p``) takes one prompt per
process, so there the ``BeforeAgent`` names its turn by the run's process (``gemini.headless_run``)
and the turn goes on, its counts, halts and caps with it; where the run may be interactive (or no
Gemini CLI process is found above the hook) each ``BeforeAgent`` opens a turn, so two prompts of
a person's are never one turn.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import turnguard
from agent_events import Session, check_halts, hook_env, is_allow, outbox, outcome_halts, recorded, wait_for_export
from turnguard.agents import export, gemini, processes, server

STOP_AT = 8
RUN = "run:4242:1000"
OTHER_RUN = "run:4343:2000"


class Run(Session):
    """A Gemini CLI session whose hooks come from a process: ``run`` is what ``headless_run``
    finds above them (``None``: an interactive session, or no Gemini CLI process found)."""

    def __init__(self, env: dict[str, str], root: Path, monkeypatch: pytest.MonkeyPatch, run: str | None) -> None:
        super().__init__("gemini", env, root)
        self.run = run
        monkeypatch.setattr(gemini, "headless_run", lambda caller: self.run)

    def send(self, payload: Any) -> Any:
        from turnguard.agents.hook import run

        if payload is None:
            return None
        return run(self.agent, json.dumps(payload).encode(), self.env, caller=os.getpid())

    def refused_stop(self) -> None:
        """Gemini CLI stops, another hook refuses it, and the refusal comes back as a prompt."""
        assert is_allow(self.stop())
        assert is_allow(self.send(self.events.prompt("Keep going.")))


def exported(env: dict[str, str]) -> list[dict[str, Any]]:
    export.export_outbox(env)
    assert not any(outbox(env).glob("*.json"))
    return recorded(env)


# -- the event orders -------------------------------------------------------------------------------


@pytest.mark.parametrize("refusals", [0, 1, 2, 3])
@pytest.mark.parametrize("run", [RUN, None], ids=["headless", "interactive"])
def test_identical_failures_across_refused_stops_halt_only_in_a_headless_run(
        run: str | None, refusals: int, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Run(env, tmp_path, monkeypatch, run)
    s.start()
    cuts = {2 * (i + 1) for i in range(refusals)}
    halted_at = STOP_AT if run is not None or not refusals else None
    for n in range(1, STOP_AT + 1):
        step = s.call("make test", failed=True)
        assert (not all(is_allow(a) for a in step.answers())) == (n == halted_at), (n, step)
        if n in cuts:
            s.refused_stop()
    s.finish()
    lines = exported(env)
    if halted_at is not None:
        assert outcome_halts("gemini", step)
        assert [(line["ended_by"], line["tool_calls"]) for line in lines] == [("streak", STOP_AT)]
    else:
        assert [line["tool_calls"] for line in lines] == [2] * refusals + [STOP_AT - 2 * refusals]
        assert {line["ended_by"] for line in lines} == {"completed"}


@pytest.mark.parametrize("refusals", [1, 2])
@pytest.mark.parametrize("run", [RUN, None], ids=["headless", "interactive"])
def test_a_halted_headless_run_stays_halted_after_its_stop_is_refused(
        run: str | None, refusals: int, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Run(env, tmp_path, monkeypatch, run)
    s.start()
    for _ in range(STOP_AT):
        s.call("make test", failed=True)
    for _ in range(refusals):
        s.refused_stop()
        answer = s.check("ls")
        assert check_halts("gemini", answer) if run is not None else is_allow(answer)
    s.finish()
    lines = exported(env)
    assert lines[0]["ended_by"] == "streak"
    assert len(lines) == (1 if run is not None else 1 + refusals)


@pytest.mark.parametrize("refusals", [1, 3])
@pytest.mark.parametrize("run", [RUN, None], ids=["headless", "interactive"])
def test_the_explicit_cap_counts_across_refused_stops_of_a_headless_run(
        run: str | None, refusals: int, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env["TURNGUARD_MAX_TOOL_CALLS_PER_TURN"] = "6"
    s = Run(env, tmp_path, monkeypatch, run)
    s.start()
    for n in range(1, 7):
        assert is_allow(s.call(f"echo {n}", failed=False).pre), n
        if n <= refusals:
            s.refused_stop()
    answer = s.check("echo 7")
    assert check_halts("gemini", answer) if run is not None else is_allow(answer)
    s.finish()
    if run is not None:
        (line,) = exported(env)
        assert (line["ended_by"], line["tool_calls"]) == ("explicit", 7)
    else:
        assert {line["ended_by"] for line in exported(env)} == {"completed"}


@pytest.mark.parametrize("run", [RUN, None], ids=["headless", "interactive"])
def test_the_cycle_cap_counts_across_refused_stops_of_a_headless_run(
        run: str | None, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env["TURNGUARD_MAX_CYCLES_PER_TURN"] = "4"
    s = Run(env, tmp_path, monkeypatch, run)
    s.start()
    for n in range(1, 5):
        s.call(f"echo {n}", failed=False, model_request=True)
        s.refused_stop()
    s.send(s.events.model_request())
    answer = s.check("echo 5")
    assert check_halts("gemini", answer) if run is not None else is_allow(answer)
    s.finish()
    assert (exported(env)[0]["ended_by"] == "cycle_cap") == (run is not None)


def test_a_stopped_headless_run_resumed_by_another_run_is_a_new_turn(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gemini -p --resume``: the same session in another process; its prompt is the person's."""
    s = Run(env, tmp_path, monkeypatch, RUN)
    s.start()
    for _ in range(5):
        s.call("make test", failed=True)
    s.stop()
    s.run = OTHER_RUN
    s.start()
    for n in range(1, 6):
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers()), n
    s.finish()
    assert [(line["ended_by"], line["tool_calls"]) for line in exported(env)] == [("completed", 5)] * 2


def test_a_run_found_only_at_a_later_prompt_opens_a_turn(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn opened where no run was found (``None``) is not one a run found later goes on with."""
    s = Run(env, tmp_path, monkeypatch, None)
    s.start()
    s.call("ls", failed=False)
    s.stop()
    s.run = RUN
    s.start()
    s.call("pwd", failed=False)
    s.finish()
    assert [line["tool_calls"] for line in exported(env)] == [1, 1]


@pytest.mark.parametrize("refusals", [1, 2])
@pytest.mark.parametrize("then", ["session_end", "resume"])
def test_a_headless_runs_turn_ends_once_as_it_last_stopped(
        refusals: int, then: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Run(env, tmp_path, monkeypatch, RUN)
    s.start()
    for _ in range(refusals):
        s.call("ls", failed=False)
        s.refused_stop()
    s.call("ls", failed=False)
    s.stop()
    stopped_at = time.time()
    assert exported(env) == [], "a stop may yet be refused"
    if then == "session_end":
        s.send(s.events.session_end())
    else:
        s.run = OTHER_RUN
        s.start()
        s.finish()
    first = exported(env)[0]
    assert (first["ended_by"], first["tool_calls"]) == ("completed", refusals + 1)
    assert first["ended_at"] <= stopped_at


# -- which runs are headless ------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", [
    ("-p", "fix it"), ("--prompt", "fix it"), ("--prompt=fix it",), ("-p", "x", "--yolo", "-o", "json"),
    ("--yolo", "-p", "x", "--resume", "abc"), ("-yp", "x"), ("-m", "-p"), ("-p", "x", "--", "-i"),
])
def test_a_prompt_option_makes_a_run_headless(arguments: tuple[str, ...]) -> None:
    assert gemini.headless(arguments)


@pytest.mark.parametrize("arguments", [
    (), ("fix it",), ("--yolo",), ("-i", "fix it"), ("-p", "x", "-i"), ("--prompt-interactive", "x"),
    ("--prompt-interactive=x", "-p", "y"), ("--promptInteractive", "x", "-p", "y"), ("--acp", "-p", "x"),
    ("--experimental-acp", "--prompt", "x"), ("--experimentalAcp", "-p", "x"), ("-ip", "x"), ("-yi", "-p", "x"),
    ("--", "-p"), ("--resume", "latest"), ("--prompt_interactive", "x", "-p", "y"),
])
def test_a_run_that_may_take_more_prompts_is_not_headless(arguments: tuple[str, ...]) -> None:
    assert not gemini.headless(arguments)


@pytest.mark.parametrize(("argv", "arguments"), [
    (("node", "/usr/lib/node_modules/@google/gemini-cli/bundle/gemini.js", "-p", "x"), ("-p", "x")),
    (("/usr/bin/node", "--max-old-space-size=4096", "/home/u/.npm/bin/gemini", "-p", "x"), ("-p", "x")),
    (("node", "--no-warnings", "--max-old-space-size=8", "/x/gemini.js"), ()),
    (("/usr/local/bin/gemini", "-p", "x"), ("-p", "x")),
    (("node", "/x/gemini-helper.js", "-p", "x"), None),
    (("python3", "/x/run.py", "gemini", "-p", "x"), None),
    (("bash", "-c", "gemini -p x"), None),
    ((), None),
])
def test_gemini_clis_arguments_are_read_from_its_process(argv: tuple[str, ...],
                                                         arguments: tuple[str, ...] | None) -> None:
    assert gemini.gemini_arguments(argv) == arguments


FAKE_GEMINI = """\
import subprocess, sys
child = subprocess.Popen(["sh", "-c", "sleep 30; true"])
print(child.pid, flush=True)
sys.stdin.read()
child.kill()
"""


def start_fake_gemini(tmp_path: Path, *arguments: str) -> tuple[subprocess.Popen[str], int]:
    """A process whose arguments are Gemini CLI's (a script ``gemini.js``), and the pid of a shell
    it started (as Gemini CLI starts each hook)."""
    script = tmp_path / "bundle" / "gemini.js"
    script.parent.mkdir(exist_ok=True)
    script.write_text(FAKE_GEMINI)
    fake = subprocess.Popen([sys.executable, str(script), *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert fake.stdout is not None
    return fake, int(fake.stdout.readline())


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


@needs_proc
@pytest.mark.parametrize(("arguments", "headless"), [(("-p", "go"), True), (("-i", "go"), False), ((), False),
                                                     (("--acp",), False)])
def test_a_hooks_run_is_the_gemini_process_above_it(arguments: tuple[str, ...], headless: bool,
                                                     tmp_path: Path) -> None:
    fake, shell = start_fake_gemini(tmp_path, *arguments)
    try:
        found = gemini.headless_run(shell)
        process = processes.read_process(fake.pid)
        assert process is not None
        assert found == (f"run:{fake.pid}:{process.started}" if headless else None)
        assert gemini.headless_run(shell) == found, "the same run each time"
    finally:
        fake.communicate("")


@needs_proc
def test_no_run_is_found_above_a_process_gemini_did_not_start() -> None:
    assert gemini.headless_run(os.getpid()) is None
    assert processes.read_process(2 ** 22 + 1) is None  # (past Linux's largest pid)
    assert list(processes.ancestors(2 ** 22 + 1)) == []


@needs_proc
def test_a_process_is_named_by_its_pid_and_start() -> None:
    me = processes.read_process(os.getpid())
    assert me is not None
    assert (me.parent, me.argv) == (os.getppid(), tuple(sys.orig_argv))
    parent = next(processes.ancestors(os.getpid()))
    assert parent.pid == os.getppid()
    assert parent.started <= me.started
    assert me.identity == f"{os.getpid()}:{me.started}"


@needs_proc
def test_the_server_knows_its_clients_process() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert server.client_pid(left) == os.getpid()


@needs_proc
@pytest.mark.parametrize("arguments", [("-p", "go"), ("-i", "go")])
def test_the_hook_command_finds_the_run_that_started_it(arguments: tuple[str, ...], tmp_path: Path) -> None:
    """``turnguard hook gemini`` run by a headless run's shell goes on with the run's turn at its
    refused stop; run by an interactive one, opens a turn."""
    env = hook_env(tmp_path)
    events = Session("gemini", env, tmp_path).events
    script = tmp_path / "bundle" / "gemini.js"
    script.parent.mkdir()
    script.write_text(textwrap.dedent("""\
        import subprocess, sys
        for event in sys.argv[sys.argv.index("--events") + 1:]:
            subprocess.run(["sh", "-c", f"{sys.executable} -m turnguard hook gemini < {event}"], check=True,
                           stdout=subprocess.DEVNULL)
        """))
    order = [events.prompt(), events.pre({"command": "make"}, None),
             events.post({"command": "make"}, None, failed=True), events.stop(), events.prompt("Keep going."),
             events.pre({"command": "make"}, None), events.post({"command": "make"}, None, failed=True),
             events.stop(), events.session_end()]
    files = []
    for n, payload in enumerate(order):
        files.append(tmp_path / f"event-{n}.json")
        files[-1].write_text(json.dumps(payload))
    done = subprocess.run([sys.executable, str(script), *arguments, "--events", *map(str, files)],
                          env={**env, "PYTHONPATH": str(Path(turnguard.__file__).parents[1])}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    wait_for_export(env)
    lines = recorded(env)
    assert [line["tool_calls"] for line in lines] == ([2] if arguments[0] == "-p" else [1, 1])
