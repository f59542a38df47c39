"""The real coding agents, guarded by ``turnguard install``, against a scripted model on 127.0.0.1.

Each test installs turnguard's hooks into a fresh project the way a user would (``turnguard
install AGENT``), runs the agent headless (``claude -p``, ``codex exec``, ``gemini -p``) on a
scripted model, and checks what ran (each scripted shell call appends a line to a file in the
project), what the model was sent, and what the recorder wrote once the exporter replayed the
turn. The CLIs are pinned in ``tests/coding_agents/package.json`` (``./dev.sh test`` installs
them); under CI a missing one fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import chain
import turnguard
from coding_agents import clis
from coding_agents.model_server import Agent, Call, ModelRequest, ModelServer, Reply, codex_spawn, codex_wait, shell

AGENTS: tuple[Agent, ...] = ("claude", "codex", "gemini")
NAME = {"claude": "claude-code", "codex": "codex", "gemini": "gemini"}
"""The agent's name for turnguard (``turnguard install NAME``, ``gen_ai.agent.name``)."""
SHELL_TOOL = {"claude": "Bash", "codex": "Bash", "gemini": "run_shell_command"}
"""The shell tool's name as the hooks see it."""
GEMINI_OWN_LOOP_DETECTION_OFF = {"model": {"disableLoopDetection": True}}
"""Gemini CLI stops a run after a few identical calls by itself: off, to see turnguard's stop."""
STREAK_REASON = "failed 8 times in a row"


@dataclass
class Guarded:
    """A project with turnguard installed for ``agent``, its own state directory and recorder."""

    agent: Agent
    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def state(self) -> Path:
        return Path(self.env.get("TURNGUARD_STATE_DIR", self.root / "state"))

    @property
    def recorder(self) -> Path:
        return Path(self.env.get("TURNGUARD_RECORDER_PATH", self.root / "turns.jsonl"))

    def lines(self, name: str = "calls.txt") -> list[str]:
        path = self.project / name
        return path.read_text().splitlines() if path.exists() else []

    def append(self, text: str, name: str = "calls.txt") -> str:
        """A shell command that records that it ran."""
        return f"echo {text} >> {self.project / name}"

    def run(self, script: Any, prompt: str = "Do the scripted work.", home: Path | None = None,
            **options: Any) -> tuple[clis.AgentRun, ModelServer]:
        if self.agent == "gemini":
            options.setdefault("settings", GEMINI_OWN_LOOP_DETECTION_OFF)
        with ModelServer(script) as server:
            run = clis.run(self.agent, self.project, server.url, prompt, env=self.env, timeout=240,
                           home=home, **options)
        assert not run.timed_out, run.describe()
        assert server.errors == [], server.errors
        return run, server

    def turns(self, count: int, timeout: float = 90) -> list[dict[str, Any]]:
        """The recorder's lines once ``count`` turns were exported (the exporter runs detached)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.recorder.read_text().splitlines() if self.recorder.exists() else []
            if len(lines) >= count and not list((self.state / "hooks" / "outbox").glob("*.json")):
                return [json.loads(line) for line in lines]
            if time.monotonic() > deadline:
                log = self.state / "hooks" / "export.log"
                raise AssertionError(f"{len(lines)} of {count} turns recorded; export log: "
                                     f"{log.read_text() if log.exists() else '-'}")
            time.sleep(0.2)


def install(agent: Agent, project: Path, home: Path) -> None:
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    done = subprocess.run([sys.executable, "-m", "turnguard", "install", NAME[agent], "--project"], cwd=project,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def guard_project(agent: Agent, root: Path, **env: str) -> Guarded:
    """A new project under ``root`` with turnguard installed for ``agent`` (``env``: the agent's)."""
    clis.require(agent)
    guarded = Guarded(agent, root)
    guarded.project.mkdir(parents=True)
    guarded.env.update({"TURNGUARD_STATE_DIR": str(guarded.state), "TURNGUARD_RECORDER_PATH": str(guarded.recorder),
                        **env})
    install(agent, guarded.project, root / "install-home")
    return guarded


@pytest.fixture(params=AGENTS)
def guarded(request: pytest.FixtureRequest, tmp_path: Path) -> Guarded:
    return guard_project(request.param, tmp_path)


def repeat(call: Call, times: int, then: str = "I give up.") -> Any:
    """The model asks for ``call`` at each step, ``times`` steps, then ends with ``then``."""
    def script(request: ModelRequest) -> Reply:
        return call if request.step < times else then
    return script


def reason_reached_the_agent(run: clis.AgentRun, server: ModelServer, reason: str) -> bool:
    """The reason is in what the model was sent, what the agent printed, or the session's
    transcript (a run stopped at once has no next request: the reason is in its conversation)."""
    if server.seen(reason) or reason in run.stdout or reason in run.stderr:
        return True
    return any(reason in p.read_text(errors="replace") for p in run.home.rglob("*.jsonl") if p.is_file())


def test_identical_failing_calls_halt_at_the_eighth_failure_and_the_run_ends(guarded: Guarded) -> None:
    run, server = guarded.run(repeat(shell(guarded.agent, guarded.append("ran") + "; exit 1"), 12))
    assert len(guarded.lines()) == 8, run.describe()
    assert run.returncode == 0, run.describe()
    if guarded.agent == "codex":  # a hook cannot stop Codex mid-turn: every later call is refused instead
        assert len(server.main_requests) == 13
        assert all(STREAK_REASON in r.text() for r in server.main_requests[9:])
    else:  # stopped before the model was asked again
        assert len(server.main_requests) == 8, run.describe()
    assert reason_reached_the_agent(run, server, STREAK_REASON)
    (turn,) = guarded.turns(1)
    assert (turn["agent"], turn["ended_by"], turn["tool_calls"]) == (NAME[guarded.agent], "streak", 8)
    assert [c["outcome"] for c in turn["calls"]] == ["error"] * 8
    report = guarded.root / "calibrate.json"  # the recorder's line is calibrate's input
    calibrate = [sys.executable, "-m", "turnguard", "calibrate", str(guarded.recorder), "--json", str(report)]
    done = subprocess.run(calibrate, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["turns"] == 1


def test_codex_identical_failing_calls_with_records_past_512_kib_halt_at_the_eighth_failure(
        tmp_path: Path) -> None:
    """Codex keeps 64 KiB of a command's output in its transcript record of the call, and the whole
    command twice, both JSON-escaped: 64 KiB of control characters printed (6 bytes each in the
    record) and 60 KB of quotes in the command (2 bytes each) make a record over 600 KB, and its
    exit code is read all the same (``codex.TRANSCRIPT_LIMIT``)."""
    guarded = guard_project("codex", tmp_path)
    quotes = ": '" + '"' * 60_000 + "'"
    prints = "head -c 70000 /dev/zero | tr '\\0' '\\1'"
    run, _ = guarded.run(repeat(shell("codex", f"{quotes}; {prints}; {guarded.append('ran')}; exit 1"), 12))
    assert len(guarded.lines()) == 8, run.describe()
    records = [line for p in run.home.rglob("rollout-*.jsonl") for line in p.read_bytes().splitlines()
               if b'"item_completed"' in line and b'"exit_code":1' in line]
    assert len(records) == 8 and min(map(len, records)) > 600_000
    (turn,) = guarded.turns(1)
    assert (turn["ended_by"], turn["tool_calls"]) == ("streak", 8)
    assert [c["outcome"] for c in turn["calls"]] == ["error"] * 8


def test_distinct_calls_complete_and_nothing_fires(guarded: Guarded) -> None:
    replies: list[Reply] = [[shell(guarded.agent, guarded.append(f"{10 * step + i}")) for i in range(10)]
                            for step in range(15)]
    run, server = guarded.run(lambda request: replies[request.step] if request.step < 15 else "All 150 done.")
    assert sorted(map(int, guarded.lines())) == list(range(150)), run.describe()
    assert run.returncode == 0 and run.text == "All 150 done.", run.describe()
    assert not server.seen("turnguard: ")  # no message of turnguard's reached the model
    (turn,) = guarded.turns(1)
    assert (turn["tool_calls"], turn["ended_by"]) == (150, "completed")
    assert {c["outcome"] for c in turn["calls"]} == {"ok"}


@pytest.mark.parametrize("source", ["environment", "turnguard.toml"])
def test_an_explicit_cap_of_20_lets_exactly_20_calls_run(guarded: Guarded, source: str) -> None:
    if source == "environment":
        guarded.env["TURNGUARD_MAX_TOOL_CALLS_PER_TURN"] = "20"
    else:
        (guarded.project / "turnguard.toml").write_text("max_tool_calls_per_turn = 20\n")
    run, _server = guarded.run(lambda r: shell(guarded.agent, guarded.append(str(r.step))) if r.step < 25 else "Done.")
    assert guarded.lines() == [str(i) for i in range(20)], run.describe()
    (turn,) = guarded.turns(1)
    assert (turn["ended_by"], turn["tool_calls"]) == ("explicit", 21)  # call 21 was checked, and refused


def test_a_polling_tool_runs_while_its_result_changes_and_halts_once_it_settles(guarded: Guarded) -> None:
    guarded.env["TURNGUARD_STATEFUL_TOOLS"] = SHELL_TOOL[guarded.agent]
    poll = guarded.project / "poll.sh"
    poll.write_text(f'cd {guarded.project}; n=$(($(cat n 2>/dev/null || echo 0) + 1)); echo $n > n; '
                    f'echo ran >> calls.txt; [ $n -le 20 ] && echo "pending $n" || echo "pending 20"; exit 1\n')
    run, _server = guarded.run(repeat(shell(guarded.agent, f"sh {poll}"), 40))
    ran = len(guarded.lines())
    assert 21 <= ran <= 28, run.describe()
    (turn,) = guarded.turns(1)
    assert turn["ended_by"] == "streak" and turn["tool_calls"] == ran


def test_parallel_calls_of_one_response_are_counted_exactly(guarded: Guarded) -> None:
    reads = [shell(guarded.agent, c) for c in ("ls", "pwd", f"cat {guarded.project / 'poll.sh'} || true")]
    (guarded.project / "poll.sh").write_text("x\n")
    run, _server = guarded.run([reads, reads, reads, "Read them all."])
    assert run.text == "Read them all.", run.describe()
    (turn,) = guarded.turns(1)
    assert (turn["tool_calls"], turn["ended_by"]) == (9, "completed")
    with_state = list((guarded.state / "hooks" / NAME[guarded.agent]).glob("*.json"))
    assert all(json.loads(p.read_text()).get("turn") is None for p in with_state)


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_whose_turnguard_was_uninstalled_under_its_hooks_runs_unblocked(agent: Agent,
                                                                                 tmp_path: Path) -> None:
    """``pip uninstall turnguard`` without ``turnguard uninstall``: the hooks name a client that is
    gone, and every prompt and call still runs (the hooks fail with exit 1, never the blocking 2)."""
    clis.require(agent)
    site = tmp_path / "site"
    shutil.copytree(Path(turnguard.__file__).parent, site / "turnguard", ignore=shutil.ignore_patterns("__pycache__"))
    guarded = Guarded(agent, tmp_path)
    guarded.project.mkdir()
    home = tmp_path / "install-home"
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex"), "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-m", "turnguard", "install", NAME[agent], "--project"],
                          cwd=guarded.project, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    shutil.rmtree(site)
    run, _server = guarded.run(lambda r: shell(agent, guarded.append(str(r.step))) if r.step < 3 else "Done.")
    assert guarded.lines() == ["0", "1", "2"], run.describe()
    assert run.returncode == 0 and run.text == "Done.", run.describe()


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_two_sessions_at_once_never_share_counts_and_a_resumed_session_starts_a_new_turn(
        tmp_path: Path, agent: Agent) -> None:
    shared = {"TURNGUARD_STATE_DIR": str(tmp_path / "state"), "TURNGUARD_RECORDER_PATH": str(tmp_path / "turns.jsonl")}
    projects = [guard_project(agent, tmp_path / name, **shared) for name in ("a", "b")]
    runs: dict[str, clis.AgentRun] = {}

    def six_failures(g: Guarded) -> None:  # 12 identical failing calls shared would halt at 8
        runs[g.root.name] = g.run(repeat(shell(agent, "echo x; exit 1"), 6))[0]

    threads = [threading.Thread(target=six_failures, args=(g,)) for g in projects]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    turns = projects[0].turns(2)
    assert sorted((t["tool_calls"], t["ended_by"]) for t in turns) == [(6, "completed"), (6, "completed")]
    assert len({t["conversation_id"] for t in turns}) == 2
    first = runs["a"]
    assert first.session_id
    again = shell(agent, "echo x; exit 1")  # the conversation holds the 6 before: count this run's requests
    resumed, _ = projects[0].run(lambda r: again if r.index < 3 else "Stopping.", prompt="Go on.", home=first.home,
                                 resume=first.session_id)
    assert resumed.returncode == 0, resumed.describe()
    turns = projects[0].turns(3)
    assert turns[-1]["conversation_id"] == first.session_id
    assert (turns[-1]["tool_calls"], turns[-1]["ended_by"]) == (3, "completed")


def test_hook_turns_reach_the_collector_file(tmp_path: Path) -> None:
    """Spans, the loop event and the turn's span attributes of a halted Claude Code turn reach the
    shipped Collector's file (the input of ``turnguard calibrate``), exported after the turn."""
    otelcol = chain.collector()
    g = guard_project("claude", tmp_path)
    collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=f"http://127.0.0.1:{chain.free_port()}")
    try:
        # (Claude Code passes no OTEL_* variable to its hooks: turnguard reads them with its prefix)
        g.env.update(TURNGUARD_OTEL_EXPORTER_OTLP_ENDPOINT=collector.otlp_http,
                     TURNGUARD_OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
        g.run(repeat(shell("claude", "echo x; exit 1"), 12))
        g.turns(1)
        events = chain.wait_until("the loop event in the Collector's file",
                                  lambda: _loop_events(collector.otlp_file) or None, collector.exited, timeout=60)
    finally:
        collector.stop()
    assert [(e["turnguard.loop.threshold"], e["turnguard.loop.level"], e["gen_ai.agent.name"]) for e in events
            if e["turnguard.loop.level"] == "stop"] == [("streak", "stop", "claude-code")]


def _loop_events(path: Path) -> list[dict[str, Any]]:
    found = []
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        for resource in json.loads(line).get("resourceLogs", []):
            for scope in resource.get("scopeLogs", []):
                for record in scope.get("logRecords", []):
                    attrs = {a["key"]: next(iter(a["value"].values()), None) for a in record.get("attributes", [])}
                    if record.get("eventName") == "turnguard.loop_detected" or "turnguard.loop.threshold" in attrs:
                        found.append(attrs)
    return found


def test_a_subagents_calls_count_in_the_turn_of_the_prompt_that_started_it(tmp_path: Path) -> None:
    """Claude Code's subagent (the ``Agent`` tool) runs inside the parent's turn: its calls carry the
    parent's session and prompt ids, and the person pays for both."""
    g = guard_project("claude", tmp_path)
    task = {"description": "sub", "prompt": "SUBTASK: append two lines", "subagent_type": "general-purpose",
            "run_in_background": False}

    def script(request: ModelRequest) -> Reply:
        if "SUBTASK" in request.user_text():
            return shell("claude", g.append("sub")) if request.step < 2 else "sub done"
        return [Call("Agent", task), shell("claude", g.append("parent")), "all done"][min(request.step, 2)]

    run, _server = g.run(script, allowed_tools=("Bash", "Agent"))
    assert sorted(g.lines()) == ["parent", "sub", "sub"], run.describe()
    (turn,) = g.turns(1)
    assert turn["tool_calls"] == 4 and [c["tool"] for c in turn["calls"]].count("Agent") == 1


def test_gemini_clis_own_loop_detector_stops_identical_calls_before_turnguards_streak(tmp_path: Path) -> None:
    """With Gemini CLI's own detector on (its default) it ends 12 identical failing calls first;
    turnguard records the turn and does not halt it."""
    g = guard_project("gemini", tmp_path)
    run, _ = g.run(repeat(shell("gemini", g.append("ran") + "; exit 1"), 12), settings={})
    assert 1 <= len(g.lines()) < 8, run.describe()
    (turn,) = g.turns(1)
    assert turn["ended_by"] == "completed" and turn["tool_calls"] == len(g.lines())


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_a_cycle_cap_counts_the_agents_model_requests(tmp_path: Path, agent: Agent) -> None:
    """Gemini CLI's ``BeforeModel`` halt stops the run at the 4th request; Codex ignores an answer to
    ``PreModelRequest``, so its next call is refused instead. (Claude Code has no model event.)"""
    g = guard_project(agent, tmp_path, TURNGUARD_MAX_CYCLES_PER_TURN="3")
    run, _server = g.run(lambda r: shell(agent, g.append(str(r.step))) if r.step < 6 else "Done.")
    assert g.lines() == ["0", "1", "2"], run.describe()
    (turn,) = g.turns(1)
    assert (turn["ended_by"], turn["cycles"]) == ("cycle_cap", 4)


ASKED = "Do you want to proceed?"
"""Claude Code's own permission question (2.1.328)."""


def test_interactive_claude_code_asks_the_person_and_goes_by_the_answer(tmp_path: Path) -> None:
    """The real interactive CLI in a terminal (tmux): the streak's warn level in an attended
    session is Claude Code's own permission question, with turnguard's reason. "Yes" runs the call
    and the streak starts again; "No" refuses it, Claude Code interrupts the turn, and turnguard
    ends it as the streak's halt when the person's next prompt comes. The answers reach the
    recorder as the turn's escalations."""
    g = guard_project("claude", tmp_path)
    enough = "That is enough, stop."

    def script(request: ModelRequest) -> Reply:
        if enough in request.user_text():
            return "Stopped."
        return shell("claude", g.append("ran") + "; exit 1") if request.step < 30 else "I give up."

    with ModelServer(script) as server:
        terminal = clis.claude_interactive(g.project, server.url, clis.new_home(g.project), env=g.env)
        try:
            terminal.wait_for(lambda screen: "Claude Code v" in screen and "❯" in screen, "prompt box")
            terminal.type("Do the scripted work.")
            terminal.press("Enter")
            first = terminal.wait_for(lambda screen: ASKED in screen, "permission question")
            assert "turnguard: Bash called 5 times in a row" in first
            assert len(g.lines()) == 4  # the 5th call waits for the person
            terminal.press("Enter")  # 1. Yes
            second = terminal.wait_for(lambda screen: ASKED in screen and len(g.lines()) == 9,
                                       "second question, at the 5th call since the answer")
            assert "turnguard: Bash called 5 times in a row" in second
            asked_at = len(server.main_requests)
            terminal.press("Escape")  # No
            terminal.wait_for(lambda screen: "Interrupted" in screen and ASKED not in screen, "interrupted turn")
            assert (len(g.lines()), len(server.main_requests)) == (9, asked_at)  # refused; the model not asked again
            terminal.type(enough)
            terminal.press("Enter")
            terminal.wait_for(lambda screen: "Stopped." in screen, "the next turn's answer")
        finally:
            terminal.close()
        assert server.errors == [], server.errors
    refused, nothing = g.turns(2)
    assert [(e["level"], e["answer"], e["at_call"]) for e in refused["escalations"]] == [
        ("warn", "continue", 5), ("warn", "stop", 10)]
    assert (refused["tool_calls"], refused["ended_by"]) == (10, "streak")  # the person stopped it there
    assert (nothing["tool_calls"], nothing["ended_by"]) == (0, "completed")


STOP_AT_E2E = 8
STOP_EVENT = {"claude": "Stop", "codex": "Stop", "gemini": "AfterAgent"}
SETTINGS = {"claude": ".claude/settings.json", "codex": ".codex/hooks.json", "gemini": ".gemini/settings.json"}


def refuse_stops(g: Guarded, times: int) -> Path:
    """A user's own stop hook beside turnguard's that refuses the agent's first ``times`` stops
    (``decision: "block"``, Gemini CLI's ``"deny"``); returns the file that counts the stops."""
    counter = g.root / "stops.txt"
    decision = "deny" if g.agent == "gemini" else "block"
    script = g.root / "refuse_stop.py"
    script.write_text(f"import json, os, sys\nsys.stdin.read()\np = {str(counter)!r}\n"
                      f"n = os.path.getsize(p) if os.path.exists(p) else 0\nopen(p, 'a').write('x')\n"
                      f"print(json.dumps({{'decision': {decision!r}, 'reason': 'Keep going.'}}) if n < {times} "
                      f"else '{{}}')\n")
    settings = g.project / SETTINGS[g.agent]
    hooks = json.loads(settings.read_text())
    hooks["hooks"].setdefault(STOP_EVENT[g.agent], []).append(
        {"hooks": [{"type": "command", "command": f"{sys.executable} {script}"}]})
    settings.write_text(json.dumps(hooks, indent=2))
    return counter


def test_a_stop_another_hook_refuses_goes_on_with_the_same_turn(guarded: Guarded) -> None:
    """12 identical failing calls, the model stopping after every 4th; a user's hook refuses the
    first 2 stops. Each agent goes on with the same turn: its 8th failure halts it (Gemini CLI's
    refused stop comes back as a prompt, ``BeforeAgent``, of the same headless run)."""
    counter = refuse_stops(guarded, 2)
    call = shell(guarded.agent, guarded.append("ran") + "; exit 1")
    run, _server = guarded.run(lambda r: "done for real" if r.step >= 15 else "done" if r.step % 5 == 4 else call)
    stops = len(counter.read_text()) if counter.exists() else 0
    assert len(guarded.lines()) == STOP_AT_E2E, run.describe()
    assert stops == 3 if guarded.agent == "codex" else stops >= 1, run.describe()  # (a halt ends the others' run)
    (turn,) = guarded.turns(1)
    assert (turn["ended_by"], turn["tool_calls"]) == ("streak", STOP_AT_E2E)


KILL_AFTER_S = 60
"""When the endless run is killed: time enough for a CLI's start and first call on a busy machine."""


def test_a_killed_runs_turn_reaches_the_recorder_once_stale(guarded: Guarded) -> None:
    """A run killed mid-turn (SIGKILL to its process group, as a CI time limit does) sends no
    more events; the next hook run of any session hands its turn over once it is stale."""
    from turnguard.agents import stale

    def script(request: ModelRequest) -> Reply:
        return shell(guarded.agent, guarded.append(str(request.step)) + "; sleep 1")
    if guarded.agent == "gemini":
        guarded.env.setdefault("GEMINI_CLI_TRUST_WORKSPACE", "true")
    with ModelServer(script) as server:
        run = clis.run(guarded.agent, guarded.project, server.url, "Loop.", env=guarded.env, timeout=KILL_AFTER_S,
                       **({"settings": GEMINI_OWN_LOOP_DETECTION_OFF} if guarded.agent == "gemini" else {}))
    assert run.timed_out, run.describe()
    ran = len(guarded.lines())
    assert ran >= 1, run.describe()
    sessions = list((guarded.state / "hooks" / NAME[guarded.agent]).glob("*.json"))
    assert [json.loads(p.read_text())["turn"] is not None for p in sessions] == [True]
    then = time.time() - stale.OPEN_STALE_S - 1
    os.utime(sessions[0], (then, then))
    (guarded.state / "hooks" / stale.MARKER).unlink(missing_ok=True)
    other = json.dumps({"session_id": "another", "hook_event_name": "UserPromptSubmit", "turn_id": "t1",
                        "cwd": str(guarded.root), "prompt": "x"})
    done = subprocess.run([sys.executable, "-m", "turnguard", "hook", "codex"], input=other, text=True,
                          env={**os.environ, **guarded.env}, capture_output=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "{}"), done.stderr
    (turn,) = guarded.turns(1)
    assert turn["agent"] == NAME[guarded.agent] and turn["ended_by"] == "abandoned"
    assert ran <= turn["tool_calls"] <= ran + 1  # (a call checked as the run was killed)


def test_a_codex_sub_agents_calls_count_in_the_parents_turn_by_their_own_outcomes(tmp_path: Path) -> None:
    """Codex's sub-agent (``spawn_agent``) sends its events in the parent's session, with a turn id of
    its own and its ``agent_id``: its prompt does not split the parent's turn, its calls count in it,
    and the parent's model request while the sub-agent's call runs does not take that call for
    refused. (The sub-agent's call waits for a file the parent's second call makes, which the parent
    makes after its model request; the parent's first call waits until the sub-agent's call runs.)"""
    g = guard_project("codex", tmp_path)
    started, go = g.project / "started", g.project / "go"

    def after(path: Path) -> str:
        return f"for i in $(seq 600); do [ -f {path} ] && break; sleep 0.1; done"

    def script(request: ModelRequest) -> Reply:
        if "SUBTASK" in request.user_text() and "Do the scripted work" not in request.user_text():
            return shell("codex", f"touch {started}; {after(go)}; {g.append('sub')}; exit 1") if request.step < 1 \
                else "sub done"
        replies: list[Reply] = [codex_spawn("SUBTASK: one failing call"), shell("codex", after(started)),
                                shell("codex", f"touch {go}; {g.append('parent')}"),
                                codex_wait(request.spawned_agents()), "all done"]
        return replies[min(request.step, len(replies) - 1)]

    run, _server = g.run(script)
    assert sorted(g.lines()) == ["parent", "sub"], run.describe()
    (turn,) = g.turns(1)
    assert (turn["ended_by"], turn["tool_calls"]) == ("completed", 5)
    outcomes = {c["call_id"]: c["outcome"] for c in turn["calls"]} if "call_id" in turn["calls"][0] else None
    assert sorted(c["outcome"] for c in turn["calls"]) == ["error", "ok", "ok", "ok", "ok"], (outcomes, turn["calls"])
