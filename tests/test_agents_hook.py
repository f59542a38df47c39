"""``turnguard hook AGENT``: the answers Claude Code, Codex and Gemini CLI get to their hook events.

Each test drives one agent session the way that agent's CLI does (``agent_events``: the payloads
of ``/work/notes/agent-events.md``), mostly in-process through ``hook.run``, and through hook
processes where the process boundary is the point (concurrency, SIGKILL, stdin, exit codes,
resource limits): ``python -m turnguard hook AGENT`` itself, and, where a test needs hundreds of
them or must kill them mid-work, the same command's ``__main__`` in processes forked from an
interpreter that has imported turnguard already (``agent_events.ForkServer``).

The verdicts must be those of one guard running the turn: the streak stop at the 8th identical
failure when unattended, the warn level's question at the 5th identical call when attended, an
explicit cap's halt at call N+1, progress for a stateful tool's changed result, nothing for
distinct calls; and the exporter's recorder line must say what the live hooks did. A turn's end
hands its journal to the outbox: most tests export it in this process (``export_now``), the
``live_env`` ones wait for the detached exporter the hook started.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_events import (
    AGENTS,
    SHELL_TOOL,
    TIMEOUT_S,
    Events,
    ForkServer,
    Session,
    Step,
    asks,
    check_halts,
    hook_env,
    hook_process,
    is_allow,
    outbox,
    outcome_halts,
    recorded,
    session_data,
    ten_threads_round,
    tool_calls,
    wait_for_export,
)
from turnguard._model import MAX_ID_LENGTH
from turnguard.agents import codex, export, gemini, hook
from turnguard.agents.events import MAX_INPUT_DEPTH, MAX_STDIN_BYTES, HookAnswer, nested_deeper
from turnguard.agents.hook import state_damage
from turnguard.agents.store import SessionStore, state_root

STOP_AT = 8
WARN_AT = 5


@pytest.fixture
def live_env(tmp_path: Path) -> Any:
    """The test's hook environment with the real detached exporter; none outlives the test."""
    environ = hook_env(tmp_path)
    yield environ
    wait_for_export(environ)


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = ForkServer(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


def export_now(env: dict[str, str]) -> list[dict[str, Any]]:
    """Export the outbox in this process (what the detached exporter does); the recorder's lines."""
    export.export_outbox(env)
    assert not any(outbox(env).glob("*.json")), "every journal exported"
    return recorded(env)


def only_line(env: dict[str, str], *, live: bool = False) -> dict[str, Any]:
    """The recorder's one line: once the detached exporter is done (``live``), else exported here."""
    if live:
        wait_for_export(env)
    lines = recorded(env) if live else export_now(env)
    assert len(lines) == 1, lines
    return lines[0]


def fail_until_halted(session: Session, limit: int = 40, command: str = "make test") -> int:
    """Identical failing calls until an outcome's answers halt; returns that call's number (every
    earlier answer must be the empty allow)."""
    for n in range(1, limit + 1):
        step = session.call(command, failed=True)
        if not all(is_allow(a) for a in step.answers()):
            assert is_allow(step.pre), (n, step)
            assert outcome_halts(session.agent, step), (n, step)
            return n
    raise AssertionError(f"no halt in {limit} identical failing calls")


# -- 1. the streak stop ---------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_eighth_identical_failure_halts_an_unattended_turn(agent: str, live_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    env = live_env
    s = Session(agent, env, tmp_path)
    assert is_allow(s.start())
    for n in range(1, STOP_AT):
        step = s.call("make test", failed=True)
        assert all(is_allow(a) for a in step.answers()), (n, step)
    eighth = s.call("make test", failed=True)
    assert is_allow(eighth.pre)
    assert outcome_halts(agent, eighth), eighth
    if agent == "claude-code":  # PostToolUseFailure cannot stop a run: its step's PostToolBatch does
        assert "continue" not in eighth.post.output
    assert check_halts(agent, s.check("make test")), "the 9th identical call must be denied"
    assert check_halts(agent, s.check("ls")), "every later call of a halted turn is denied alike"
    assert is_allow(s.finish())
    line = only_line(env, live=True)  # the detached exporter's replay of the turn's journal
    assert (line["agent"], line["ended_by"], line["tool_calls"]) == (agent, "streak", STOP_AT)
    assert [c["outcome"] for c in line["calls"]] == ["error"] * STOP_AT


@pytest.mark.parametrize("agent", AGENTS)
def test_streak_of_identical_failures_is_broken_by_a_success(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(STOP_AT - 1):
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers())
    assert all(is_allow(a) for a in s.call("make test", failed=False).answers())
    assert fail_until_halted(s) == STOP_AT, "a success starts the failure streak again"


@pytest.mark.parametrize("agent", AGENTS)
def test_streak_needs_identical_arguments(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for n in range(2 * STOP_AT + 1):
        step = s.call(f"make test-{n % 2}", failed=True)  # two calls alternating: never 8 in a row
        assert all(is_allow(a) for a in step.answers()), (n, step)


def test_claude_interrupted_calls_are_unknown_and_never_stop(env: dict[str, str], tmp_path: Path) -> None:
    s = Session("claude-code", env, tmp_path)
    s.start()
    for n in range(STOP_AT + 1):
        call_id = s.events.call_id()
        post = s.events.post({"command": "make test"}, call_id, failed=True)
        post["is_interrupt"] = True  # the person pressed Esc: not the command's failure
        answers = [s.send(s.events.pre({"command": "make test"}, call_id)), s.send(post)]
        assert all(is_allow(a) for a in answers), (n, answers)
    assert s.snapshot()["turn"]["facts"]["outcomes"]["error"] == 0


@pytest.mark.parametrize("case", ["file missing", "no transcript_path", "no record of the call"])
def test_codex_outcome_without_a_transcript_record_is_unknown_and_never_stops(
        case: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session("codex", env, tmp_path)
    s.start()
    if case == "file missing":
        s.events.transcribing = False
    for n in range(STOP_AT + 1):
        call_id = s.events.call_id()
        tool_input = {"command": "make test"}
        pre = s.events.pre(tool_input, call_id)
        post = s.events.post(tool_input, call_id, failed=True, output="failing\n", transcribe=False)
        if case == "no transcript_path":
            del pre["transcript_path"], post["transcript_path"]
        answers = [s.send(pre), s.send(post)]
        assert all(is_allow(a) for a in answers), (n, answers)
    outcomes = s.snapshot()["turn"]["facts"]["outcomes"]
    assert outcomes["unknown"] == STOP_AT + 1 and outcomes["error"] == 0


@pytest.mark.parametrize(("record", "outcome"), [
    ({"exit_code": 1}, "error"),
    ({"exit_code": 2}, "error"),
    ({"exit_code": 0}, "ok"),
    ({"status": "declined"}, "denied"),
    ({"status": "failed"}, "error"),
    ({"status": "completed"}, "ok"),
])
def test_codex_outcome_is_read_from_the_calls_item_completed_record(
        record: dict[str, Any], outcome: str, tmp_path: Path) -> None:
    events = Events("codex", tmp_path)
    events.prompt()
    mine, other = "call_1", "call_10"  # one id the prefix of the other
    events.pre({"command": "x"}, mine)
    events.complete(other, {"command": "x"}, exit_code=0 if outcome != "ok" else 1)
    events.complete(mine, {"command": "x"}, **record)
    payload = events.post({"command": "x"}, mine, failed=False, transcribe=False)
    assert codex.PROTOCOL.read(payload, {}).outcome == outcome


def test_codex_record_of_another_call_is_not_this_calls_outcome(tmp_path: Path) -> None:
    events = Events("codex", tmp_path)
    events.prompt()
    events.complete("call_10", {"command": "x"}, exit_code=1)
    events.complete("xcall_1", {"command": "x"}, exit_code=1)
    payload = events.post({"command": "x"}, "call_1", failed=True, transcribe=False)
    assert codex.PROTOCOL.read(payload, {}).outcome == "unknown"


@pytest.mark.parametrize(("response", "outcome"), [
    ({"llmContent": "<untrusted_context>\nOutput: failing\nExit Code: 1\nProcess Group PGID: 9445\n"
                    "</untrusted_context>", "returnDisplay": "failing"}, "error"),
    ({"llmContent": "<untrusted_context>\nOutput: (empty)\nExit Code: 127\nProcess Group PGID: 9445\n"
                    "</untrusted_context>", "returnDisplay": ""}, "error"),
    ({"llmContent": "<untrusted_context>\nOutput: (empty)\nProcess Group PGID: 9348\n</untrusted_context>",
      "returnDisplay": ""}, "ok"),
    ({"llmContent": "", "returnDisplay": "", "error": {"message": "boom", "type": "execution_failed"}}, "error"),
    # a command that succeeded printing text that looks like a failure's trailer
    ({"llmContent": "<untrusted_context>\nOutput: step 3: Exit Code: 1\nProcess Group PGID: 9348\n"
                    "</untrusted_context>", "returnDisplay": "step 3: Exit Code: 1"}, "ok"),
    ({"llmContent": "<untrusted_context>\nOutput: Exit Code: 1\nretrying\nExit Code: 1\ndone\n"
                    "Process Group PGID: 9348\n</untrusted_context>",
      "returnDisplay": "Exit Code: 1\nretrying\nExit Code: 1\ndone"}, "ok"),
])
def test_gemini_outcome_is_the_shell_calls_exit_code(response: dict[str, Any], outcome: str, tmp_path: Path) -> None:
    events = Events("gemini", tmp_path)
    payload = events.post({"command": "x"}, None, failed=False)
    payload["tool_response"] = response
    assert gemini.PROTOCOL.read(payload, {}).outcome == outcome


def test_gemini_successful_calls_that_print_exit_code_text_never_stop(env: dict[str, str], tmp_path: Path) -> None:
    s = Session("gemini", env, tmp_path)
    s.start()
    for n in range(STOP_AT + 2):
        step = s.call("grep -h 'Exit Code' build.log", failed=False, output="step 3: Exit Code: 1")
        assert all(is_allow(a) for a in step.answers()), (n, step)


# -- 2. the explicit cap ----------------------------------------------------------------------------------


def run_to_cap(s: Session, cap: int, *, outcomes: bool = True) -> None:
    for n in range(1, cap + 1):
        step = s.call(f"cat part-{n}.txt", failed=False) if outcomes else Step(s.check(f"cat part-{n}.txt"))
        assert all(is_allow(a) for a in step.answers()), (n, step)
    assert check_halts(s.agent, s.check(f"cat part-{cap + 1}.txt")), f"call {cap + 1} must be denied"
    assert check_halts(s.agent, s.check(f"cat part-{cap + 2}.txt"))


@pytest.mark.parametrize("cap", [20, 1])
@pytest.mark.parametrize("agent", AGENTS)
def test_explicit_cap_from_the_environment_denies_call_n_plus_1(agent: str, cap: int, env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    env["TURNGUARD_MAX_TOOL_CALLS_PER_TURN"] = str(cap)
    s = Session(agent, env, tmp_path)
    s.start()
    run_to_cap(s, cap)
    live_count = s.tool_calls()
    s.finish()
    line = only_line(env)
    assert (line["agent"], line["ended_by"], line["tool_calls"]) == (agent, "explicit", live_count)
    assert live_count in (cap, cap + 1)


@pytest.mark.parametrize(("file", "text"), [("turnguard.toml", "max_tool_calls_per_turn = 20\n"),
                                            ("pyproject.toml", "[tool.turnguard]\nmax_tool_calls_per_turn = 20\n")])
@pytest.mark.parametrize("agent", AGENTS)
def test_explicit_cap_from_the_configuration_in_the_events_cwd(
        agent: str, file: str, text: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    (s.events.project / file).write_text(text)
    s.start()
    run_to_cap(s, 20, outcomes=False)


@pytest.mark.parametrize("agent", AGENTS)
def test_an_open_turn_keeps_the_settings_of_the_folder_it_opened_in(agent: str, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    """The agent's ``cwd`` follows the model's ``cd``: a call made from another folder (one with other
    settings, none, one gone since, or no ``cwd`` at all) counts in the open turn, under its settings."""
    s = Session(agent, env, tmp_path)
    (s.events.project / "turnguard.toml").write_text("max_tool_calls_per_turn = 5\n")
    other, bare = tmp_path / "other", tmp_path / "bare"
    for folder in (other, bare):
        folder.mkdir()
    (other / "turnguard.toml").write_text("max_tool_calls_per_turn = 50\nstreak_stop_at = 20\n")
    folders = [str(s.events.project), str(other), str(bare), str(tmp_path / "gone"), None]
    rng = random.Random(f"cwd-{agent}")

    def moved(payload: dict[str, Any]) -> dict[str, Any]:
        folder = rng.choice(folders)
        return {**payload, "cwd": folder} if folder else {k: v for k, v in payload.items() if k != "cwd"}

    def call(n: int) -> Any:
        tool_input, call_id = {"command": f"cat part-{n}.txt"}, s.events.call_id()
        check = s.send(moved(s.events.pre(tool_input, call_id)))
        s.send(moved(s.events.post(tool_input, call_id, failed=False)))
        return check

    for _ in range(3):
        s.start()  # in the project: a cap of 5
        assert all(is_allow(call(n)) for n in range(1, 6))
        assert check_halts(agent, call(6))
        s.finish()
    s.send({**s.events.prompt(), "cwd": str(other)})  # a turn opened elsewhere: a cap of 50
    assert all(is_allow(call(n)) for n in range(1, 21))
    assert s.tool_calls() == 20
    assert errors_logged(env) == []


# -- 2b. alternating loops (cycle_repeat) ---------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_an_alternating_loop_halts_with_the_cycle_repeat_reason(agent: str, env: dict[str, str],
                                                               tmp_path: Path) -> None:
    """Two calls alternating with unchanged results: the hook reports ``cycle_repeat`` like any
    threshold, at the outcome of call 16 (the 8th repetition of the cycle), with its reason."""
    env.update(TURNGUARD_CYCLE_REPEAT_WARN_AT="5", TURNGUARD_CYCLE_REPEAT_STOP_AT="8")
    s = Session(agent, env, tmp_path)
    s.start()
    for n in range(1, 16):
        step = s.call("git status" if n % 2 else "git diff", failed=False, output="clean")
        assert all(is_allow(a) for a in step.answers()), (n, step)
    step = s.call("git diff", failed=False, output="clean")
    assert outcome_halts(agent, step), step
    assert "repeat a cycle of 2 identical calls 8 times (cycle_repeat_stop_at=8)" in json.dumps(step.post.output)
    assert check_halts(agent, s.check("git status")), "every later call of a halted turn is denied"
    s.finish()
    line = only_line(env)
    assert (line["ended_by"], line["tool_calls"]) == ("cycle_repeat", 16)


# -- 3. distinct calls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_distinct_calls_never_fire(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    ev = s.events
    for first in range(0, 150, 3):  # model steps of three calls each, as parallel read-only calls come
        calls = [({"command": f"pytest tests/test_{n}.py"}, ev.call_id(), n % 2 == 0) for n in range(first, first + 3)]
        answers = [s.send(ev.pre(tool_input, call_id)) for tool_input, call_id, _ in calls]
        answers += [s.send(ev.post(tool_input, call_id, failed=failed, output="1 failed"))
                    for tool_input, call_id, failed in calls]
        answers.append(s.send(ev.batch([(ev.tool, i, c, "Exit code 1\n1 failed") for i, c, _ in calls])))
        assert all(a is None or is_allow(a) for a in answers), (first, answers)
    assert s.tool_calls() == 150


# -- 4. stateful tools --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("agent", "which"), [(a, "the tool's name") for a in AGENTS] + [("claude-code", "*")])
def test_stateful_tool_progresses_while_its_result_changes_then_halts_when_it_stops_changing(
        agent: str, which: str, env: dict[str, str], tmp_path: Path) -> None:
    env["TURNGUARD_STATEFUL_TOOLS"] = SHELL_TOOL[agent] if which != "*" else "*"
    s = Session(agent, env, tmp_path)
    s.start()
    for n in range(1, 21):
        step = s.call("./deploy --status", failed=True, output=f"pending: {n} of 40 done")
        assert all(is_allow(a) for a in step.answers()), (n, step)
    halt_at = 20 + STOP_AT - 1  # the 20th result and the 7 unchanged after it: 8 identical failures
    for n in range(21, halt_at + 1):
        step = s.call("./deploy --status", failed=True, output="pending: 20 of 40 done")
        if n < halt_at:
            assert all(is_allow(a) for a in step.answers()), (n, step)
    assert outcome_halts(agent, step), step
    if which == "*":
        return
    s.finish()
    line = only_line(env)
    assert (line["ended_by"], line["tool_calls"]) == ("streak", halt_at)
    assert [c["outcome"] for c in line["calls"]] == ["error"] * halt_at


# -- 5. concurrency -------------------------------------------------------------------------------------------


PROCESS_ROUNDS = 20
THREAD_ROUNDS = 20


def test_concurrent_hook_processes_count_every_call_exactly(forks: ForkServer, env: dict[str, str],
                                                            tmp_path: Path) -> None:
    """Ten hook processes at once on one turn, round after round (the agents' sessions in turn)."""
    sessions = {agent: Events(agent, tmp_path / agent) for agent in AGENTS}
    for agent, events in sessions.items():
        assert forks.run(agent, [json.dumps(events.prompt()).encode()], env)[0].status == 0
    for round_ in range(PROCESS_ROUNDS):
        agent = AGENTS[round_ % 3]
        events = sessions[agent]
        batch = [json.dumps(events.pre({"command": f"cat r{round_}-f{i}.txt"}, events.call_id())).encode()
                 for i in range(10)]
        exits = forks.run(agent, batch, env)
        assert [(e.status, e.stdout, e.stderr) for e in exits] == [(0, b"{}\n", b"")] * 10, round_
        assert tool_calls(env, agent, events.session_id) == 10 * (round_ // 3 + 1), round_


def test_concurrent_real_hook_commands_count_every_call_exactly(env: dict[str, str], tmp_path: Path) -> None:
    """The same with ten fresh interpreters running the command itself (the entry points scanned too,
    as installed)."""
    agent = "claude-code"
    events = Events(agent, tmp_path)
    env = {k: v for k, v in env.items() if k != "TURNGUARD_LOAD_PLUGINS"}
    assert hook_process(agent, json.dumps(events.prompt()).encode(), env).returncode == 0
    procs = [subprocess.Popen([sys.executable, "-m", "turnguard", "hook", agent], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(10)]
    for i, p in enumerate(procs):  # every event written before any answer is read: the ten run at once
        assert p.stdin is not None
        p.stdin.write(json.dumps(events.pre({"command": f"cat f{i}.txt"}, events.call_id())).encode())
        p.stdin.close()
    results = []
    for p in procs:
        assert p.stdout is not None and p.stderr is not None
        results.append((p.wait(TIMEOUT_S), p.stdout.read(), p.stderr.read()))
        p.stdout.close()
        p.stderr.close()
    assert results == [(0, b"{}\n", b"")] * 10
    assert tool_calls(env, agent, events.session_id) == 10


CALL_ID_AGENTS = ("claude-code", "codex")
"""The agents that send a call's id (Gemini CLI sends none)."""


@pytest.mark.parametrize("agent", CALL_ID_AGENTS)
def test_a_hook_installed_twice_counts_each_call_once(agent: str, forks: ForkServer, env: dict[str, str],
                                                      tmp_path: Path) -> None:
    """Codex runs the hooks of every settings layer, at once: with turnguard at user and project
    scope each event comes twice, concurrently. Both get the answer one hook would give."""
    env["TURNGUARD_MAX_TOOL_CALLS_PER_TURN"] = "10"
    events = Events(agent, tmp_path)

    def twice(event: dict[str, Any]) -> list[Any]:
        return forks.run(agent, [json.dumps(event).encode()] * 2, env)

    assert [e.status for e in twice(events.prompt())] == [0, 0]
    for n in range(1, 12):
        tool_input, call_id = {"command": f"echo {n}"}, events.call_id()
        first, second = twice(events.pre(tool_input, call_id))
        assert first == second, (n, first, second)
        if n <= 10:
            assert (first.status, first.stdout, first.stderr) == (0, b"{}\n", b""), (n, first)
            assert [e.stderr for e in twice(events.post(tool_input, call_id, failed=False))] == [b"", b""]
        else:
            assert b"call 11 exceeds max_tool_calls_per_turn=10" in first.stdout, first
    assert tool_calls(env, agent, events.session_id) == 11


@pytest.mark.parametrize("repeated", ["check", "outcome", "both"])
@pytest.mark.parametrize("agent", CALL_ID_AGENTS)
def test_a_calls_check_or_outcome_given_again_gets_the_same_answer_and_counts_once(
        agent: str, repeated: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    rng = random.Random(f"again-{agent}-{repeated}")
    for n in range(1, 40):
        tool_input, call_id = {"command": "make test"}, s.events.call_id()
        pre = s.events.pre(tool_input, call_id)
        checks = [s.send(pre) for _ in range(1 + (repeated != "outcome") * rng.randrange(1, 4))]
        assert all(c == checks[0] for c in checks), (n, checks)
        post = s.events.post(tool_input, call_id, failed=True)
        posts = [s.send(post) for _ in range(1 + (repeated != "check") * rng.randrange(1, 4))]
        assert all(p == posts[0] for p in posts), (n, posts)
        assert s.tool_calls() == n
        step = Step(checks[0], posts[0], s.send(s.events.batch([(s.events.tool, tool_input, call_id, "x")])))
        if not all(is_allow(a) for a in step.answers()):
            assert n == STOP_AT and outcome_halts(agent, step), (n, step)
            break
    else:
        raise AssertionError("no halt")
    assert s.snapshot()["turn"]["facts"]["outcomes"]["error"] == STOP_AT


@pytest.mark.parametrize("same_input", [True, False])
@pytest.mark.parametrize("agent", CALL_ID_AGENTS)
def test_a_call_id_used_again_for_a_later_call_is_a_new_call(
        agent: str, same_input: bool, env: dict[str, str], tmp_path: Path) -> None:
    """An agent (or a sender) that gives every call one id: each call after the last one's outcome
    counts, identical or not, so no cap or streak is hidden behind the first call's answer."""
    s = Session(agent, env, tmp_path)
    s.start()
    for n in range(1, 40):
        tool_input = {"command": "make test" if same_input else f"make test-{n}"}
        if not is_allow(s.send(s.events.pre(tool_input, "call_0"))):  # the streak's stop, latched
            assert same_input and n == STOP_AT + 1, n
            break
        s.send(s.events.post(tool_input, "call_0", failed=True))
        assert s.tool_calls() == n
    else:
        assert not same_input


HOSTILE_IDS = {"long": "x" * 300_000, "surrogate": "call_\udc80", "surrogate_long": "\ud800" * 400}


@pytest.mark.parametrize("kind", list(HOSTILE_IDS))
@pytest.mark.parametrize("agent", CALL_ID_AGENTS)
def test_call_and_turn_ids_of_any_length_or_text_keep_the_state_small_and_the_counts_exact(
        agent: str, kind: str, env: dict[str, str], tmp_path: Path) -> None:
    """Ids the state keeps per call or turn (call ids, prompt or turn ids) stand as a digest past
    MAX_ID_LENGTH or when not UTF-8: the state stays small, nothing fails, every call counts, and a
    loop under such ids halts at the streak's stop as under the agent's own (Codex's outcome is read
    from its transcript's record of the id: a long id's record is found however large, a record of
    an id not UTF-8 is not, as the transcript escapes it: no failure shows there, and the calls
    count as ever)."""
    s = Session(agent, env, tmp_path)
    s.start(turn_id=HOSTILE_IDS[kind] + "turn")
    halts = agent != "codex" or kind == "long"
    for n in range(1, STOP_AT + 3):
        call_id = f"{HOSTILE_IDS[kind]}{n}"
        if not is_allow(s.send(s.events.pre({"command": "make test"}, call_id))):
            assert halts and n == STOP_AT + 1, n
            break
        s.send(s.events.post({"command": "make test"}, call_id, failed=True))
        assert s.tool_calls() == n
    else:
        assert not halts
    files = list((tmp_path / "state").rglob("*.json"))
    assert files and max(f.stat().st_size for f in files) < 64 * 1024
    assert not (tmp_path / "state" / "hooks" / "errors.log").exists()


@pytest.mark.parametrize("kind", list(HOSTILE_IDS))
@pytest.mark.parametrize("agent", AGENTS)
def test_session_ids_of_any_length_or_text_keep_the_state_and_the_record_small(
        agent: str, kind: str, env: dict[str, str], tmp_path: Path) -> None:
    """A session's id is kept like a call's: past MAX_ID_LENGTH or not UTF-8 it stands as its
    digest, in the state and in the recorded turn, and its calls count and halt as under any id;
    two such ids that differ only past the limit are two sessions."""
    s = Session(agent, env, tmp_path, session_id=HOSTILE_IDS[kind] + "a")
    other = Session(agent, env, tmp_path, session_id=HOSTILE_IDS[kind] + "b")
    s.start()
    other.start()
    assert fail_until_halted(s) == STOP_AT
    other.call("make test", failed=True)
    assert other.tool_calls() == 1
    s.finish()
    files = list((tmp_path / "state").rglob("*.json"))
    assert files and max(f.stat().st_size for f in files) < 64 * 1024
    line = only_line(env)
    assert len(line["conversation_id"]) <= MAX_ID_LENGTH and line["tool_calls"] == STOP_AT
    assert not (tmp_path / "state" / "hooks" / "errors.log").exists()


HOSTILE_NAMES = {**HOSTILE_IDS, "huge": "T" * 3_000_000}
"""Tool names a model may make up: past the limit (by far: a few of these fill the state's bound), or not UTF-8."""


@pytest.mark.parametrize("kind", list(HOSTILE_NAMES))
@pytest.mark.parametrize("agent", AGENTS)
def test_tool_names_of_any_length_or_text_keep_the_state_small_and_the_loop_guarded(
        agent: str, kind: str, env: dict[str, str], tmp_path: Path) -> None:
    """A tool's name is kept per call in the turn's journal, like a call's id: past MAX_ID_LENGTH or
    not UTF-8 it stands as its digest, so the state stays small, no event fails, a loop of such a
    call halts at the streak's stop as under a short name, two names that differ only past the limit
    are two tools, and the recorded turn's names are bounded."""
    s = Session(agent, env, tmp_path)
    s.start()
    name, other = HOSTILE_NAMES[kind] + "a", HOSTILE_NAMES[kind] + "b"
    for n in range(1, STOP_AT + 1):
        assert all(is_allow(a) for a in s.call("make test", failed=True, tool=other if n == 1 else name).answers()), n
    halted = s.call("make test", failed=True, tool=name)
    assert check_halts(agent, halted.pre) or outcome_halts(agent, halted), halted
    assert s.tool_calls() == STOP_AT + 1
    s.finish()
    files = list((tmp_path / "state").rglob("*.json"))
    assert files and max(f.stat().st_size for f in files) < 64 * 1024
    line = only_line(env)
    assert len(line["calls"]) == STOP_AT + 1 and all(len(c["tool"]) <= MAX_ID_LENGTH for c in line["calls"])
    assert len({c["tool"] for c in line["calls"]}) == 2
    assert not (tmp_path / "state" / "hooks" / "errors.log").exists()


def test_concurrent_threads_in_one_process_count_every_call_exactly(env: dict[str, str], tmp_path: Path) -> None:
    """Ten threads calling ``hook.run`` at once on a new session (each takes the lock on a
    descriptor of its own), round after round."""
    for round_ in range(THREAD_ROUNDS):
        ten_threads_round(env, round_, tmp_path / f"r{round_}", lambda _, agent, payload: hook.run(agent, payload, env))


# -- 6. sessions and turns ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_two_sessions_never_share_counts_or_a_halt(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    a, b = Session(agent, env, tmp_path / "a"), Session(agent, env, tmp_path / "b")
    a.start()
    b.start()
    for n in range(1, STOP_AT):
        for s in (a, b):
            assert all(is_allow(x) for x in s.call("make test", failed=True).answers()), (s.session_id, n)
        assert a.tool_calls() == b.tool_calls() == n
    assert outcome_halts(agent, a.call("make test", failed=True))
    assert a.tool_calls() == STOP_AT and b.tool_calls() == STOP_AT - 1
    b_check = b.check("ls")  # b is untouched by a's halt
    assert is_allow(b_check)
    assert check_halts(agent, a.check("ls"))
    assert b.tool_calls() == STOP_AT


def test_the_same_session_id_of_two_agents_is_two_sessions(env: dict[str, str], tmp_path: Path) -> None:
    claude = Session("claude-code", env, tmp_path / "c", session_id="shared-id")
    codex_ = Session("codex", env, tmp_path / "x", session_id="shared-id")
    claude.start()
    codex_.start()
    assert fail_until_halted(claude) == STOP_AT
    assert is_allow(codex_.check("make test"))
    assert codex_.tool_calls() == 1


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_open_turns_prompt_again_keeps_its_counts(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(5):
        s.call("make test", failed=True)
    assert is_allow(s.start(turn_id=s.events.turn_id))
    assert s.tool_calls() == 5
    assert fail_until_halted(s) == STOP_AT - 5
    assert not (outbox(env).is_dir() and any(outbox(env).glob("*.json"))) and recorded(env) == []


@pytest.mark.parametrize("agent", AGENTS)
def test_a_new_turn_starts_from_zero_and_the_old_one_ends_interrupted(agent: str, env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(5):
        s.call("make test", failed=True)
    assert is_allow(s.start())
    for n in range(1, STOP_AT):
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers()), n
        assert s.tool_calls() == n
    line = only_line(env)
    assert (line["agent"], line["ended_by"], line["tool_calls"]) == (agent, "interrupted", 5)


TURN_ID_AGENTS = ("claude-code", "codex")
"""The agents whose events name their turn (``prompt_id``, ``turn_id``)."""


@pytest.mark.parametrize("agent", TURN_ID_AGENTS)
def test_calls_of_an_earlier_turn_count_in_the_open_turn(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    """A background subagent started under one prompt goes on calling tools while the person's next
    prompt runs: its calls carry the first prompt's id, and count in the open turn (the person pays
    for both) instead of ending it. Only a new prompt opens a new turn."""
    env["TURNGUARD_MAX_TOOL_CALLS_PER_TURN"] = "30"
    s = Session(agent, env, tmp_path)
    rng = random.Random(f"earlier-{agent}")
    s.start()
    first = s.events.turn_id
    s.call("npm install", failed=False)
    s.stop()
    s.start()
    second = s.events.turn_id

    def call_of(turn_id: str | None, command: str, *, failed: bool) -> Step:
        current, s.events.turn_id = s.events.turn_id, turn_id
        try:
            return s.call(command, failed=failed)
        finally:
            s.events.turn_id = current

    for n in range(1, 31):  # the two interleaved at random, distinct calls: the cap counts them all
        turn_id = rng.choice([first, second])
        assert all(is_allow(a) for a in call_of(turn_id, f"cat part-{n}.txt", failed=False).answers()), n
    assert s.tool_calls() == 30
    assert check_halts(agent, s.check("cat part-31.txt"))
    s.stop()
    s.start()
    third = s.events.turn_id
    assert s.tool_calls() == 0  # a new prompt opens a new turn
    for n in range(1, STOP_AT + 1):  # identical failures from an earlier turn and the open one: one streak
        step = call_of(rng.choice([first, second, third]), "npm test", failed=True)
        assert all(is_allow(a) for a in step.answers()) == (n < STOP_AT), (n, step)
    assert outcome_halts(agent, step)
    assert s.tool_calls() == STOP_AT
    lines = export_now(env)
    assert [(line["ended_by"], line["tool_calls"]) for line in lines] == [("completed", 1), ("explicit", 31)]


@pytest.mark.parametrize("agent", AGENTS)
def test_a_turn_without_tool_calls_is_recorded_too(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    assert is_allow(s.start())
    s.send(s.events.model_request())
    assert is_allow(s.finish())
    lines = export_now(env)
    assert len(lines) == 1, f"one recorder line for the turn (it made no tool call), not {lines}"
    assert (lines[0]["agent"], lines[0]["ended_by"], lines[0]["tool_calls"]) == (agent, "completed", 0)


@pytest.mark.parametrize("agent", AGENTS)
def test_session_end_ends_the_turn_and_forgets_the_session(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(3):
        s.call("make test", failed=True)
    assert is_allow(s.send(s.events.session_end()))
    assert not SessionStore(state_root(env), agent).path(s.session_id).exists()
    line = only_line(env)
    assert (line["agent"], line["tool_calls"]) == (agent, 3)


# -- 7. SIGKILL at any moment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_a_hook_killed_at_any_moment_leaves_a_state_that_resumes(agent: str, forks: ForkServer, env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    rng = random.Random(20261205)
    events = Events(agent, tmp_path)
    assert is_allow(hook.run(agent, json.dumps(events.prompt()).encode(), env))
    path = SessionStore(state_root(env), agent).path(events.session_id)
    completed = killed = 0
    for n in range(15):
        payload = json.dumps(events.pre({"command": f"cat k{n}.txt"}, events.call_id())).encode()
        pid = forks.start(agent, payload, env)
        time.sleep(rng.uniform(0.0, 0.060))
        os.kill(pid, signal.SIGKILL)
        ended = forks.wait(pid)
        if ended.status == -signal.SIGKILL:
            killed += 1
        else:
            assert (ended.status, ended.stdout, ended.stderr) == (0, b"{}\n", b"")
            completed += 1
        state = json.loads(path.read_bytes())  # whole: the last state written, or the one before it
        assert isinstance(state, dict) and state["version"] == 1 and isinstance(state.get("turn", {}), dict | None)
        following = hook.run(agent, json.dumps(events.pre({"command": f"ls {n}"}, events.call_id())).encode(), env)
        assert is_allow(following), (n, following)
        completed += 1
    assert completed <= tool_calls(env, agent, events.session_id) <= completed + killed


# -- 8. bad input and broken state ---------------------------------------------------------------------------------


def tool_event(agent: str, root: Path) -> dict[str, Any]:
    events = Events(agent, root, session_id="bad-input-session")
    events.prompt()
    return events.pre({"command": "make test"}, events.call_id())


def without(key: str) -> Any:
    def change(event: dict[str, Any]) -> bytes:
        event.pop(key)
        return json.dumps(event).encode()
    return change


def setting(key: str, value: Any) -> Any:
    def change(event: dict[str, Any]) -> bytes:
        event[key] = value
        return json.dumps(event).encode()
    return change


BAD_EVENTS: dict[str, Any] = {
    "empty": lambda e: b"",
    "whitespace": lambda e: b" \n\t\n",
    "not JSON": lambda e: b"{hook_event_name: PreToolUse",
    "truncated JSON": lambda e: json.dumps(e).encode()[:-7],
    "JSON array": lambda e: json.dumps([e]).encode(),
    "JSON number": lambda e: b"5",
    "JSON string": lambda e: b'"PreToolUse"',
    "JSON null": lambda e: b"null",
    "invalid UTF-8": lambda e: json.dumps(e).encode().replace(b"make test", b"make \xff\xfe test"),
    "NUL bytes": lambda e: b"\x00" * 64,
    "nested too deeply": lambda e: b"[" * 100_000 + b"]" * 100_000,
    "larger than 8 MiB": lambda e: setting("padding", "x" * MAX_STDIN_BYTES)(e),
    "missing hook_event_name": without("hook_event_name"),
    "missing session_id": without("session_id"),
    "missing tool_name": without("tool_name"),
    "tool_name is a number": setting("tool_name", 5),
    "tool_name is empty": setting("tool_name", ""),
    "tool_name is null": setting("tool_name", None),
    "session_id is a list": setting("session_id", ["s"]),
    "session_id is empty": setting("session_id", ""),
    "hook_event_name is a number": setting("hook_event_name", 5),
}


def assert_failed_open(agent: str, status: int, stdout: bytes, stderr: bytes) -> None:
    assert status == 0, (status, stdout, stderr)
    assert stdout == b"{}\n", stdout  # exactly one JSON object: the empty allow
    lines = stderr.decode("utf-8", "replace").splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"turnguard hook {agent}: "), stderr
    assert b"Traceback" not in stdout + stderr


def assert_failed_closed(agent: str, status: int, stdout: bytes, stderr: bytes) -> None:
    assert status == 2, (status, stdout, stderr)
    assert stdout == b"", stdout
    lines = stderr.decode("utf-8", "replace").splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"turnguard hook {agent}: "), stderr
    assert "closed" in lines[0] and b"Traceback" not in stderr


def errors_logged(env: dict[str, str]) -> list[str]:
    path = Path(env["TURNGUARD_STATE_DIR"]) / "hooks" / "errors.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@pytest.mark.parametrize("kind", list(BAD_EVENTS))
@pytest.mark.parametrize("agent", AGENTS)
def test_bad_event_fails_open_or_closed_with_one_line_on_stderr(agent: str, kind: str, forks: ForkServer,
                                                                 env: dict[str, str], tmp_path: Path) -> None:
    raw = BAD_EVENTS[kind](tool_event(agent, tmp_path))
    [opened] = forks.run(agent, [raw], env)
    assert_failed_open(agent, opened.status, opened.stdout, opened.stderr)
    assert len(errors_logged(env)) == 1
    [closed] = forks.run(agent, [raw], {**env, "TURNGUARD_FAIL_MODE": "closed"})
    assert_failed_closed(agent, closed.status, closed.stdout, closed.stderr)


REAL_COMMAND_CASES = [("claude-code", "empty"), ("codex", "not JSON"), ("gemini", "JSON array"),
                      ("claude-code", "invalid UTF-8"), ("codex", "larger than 8 MiB"),
                      ("gemini", "missing session_id")]
"""Kinds of bad input through ``python -m turnguard hook`` itself (every kind, for every agent,
goes through a forked hook process above: a fresh interpreter costs a quarter of a second)."""


@pytest.mark.parametrize("room", [-1, 0, 1, 300])
@pytest.mark.parametrize("agent", AGENTS)
def test_the_errors_log_stops_growing_at_its_bound_and_the_hook_still_fails_open(
        agent: str, room: int, forks: ForkServer, env: dict[str, str], tmp_path: Path) -> None:
    """A log within ``room`` bytes of the bound (negative: past it) takes a failure's line while
    it is under the bound, and none once at or past it; either way the event is allowed with its
    line on stderr, and a log the export emptied takes lines again."""
    log = Path(env["TURNGUARD_STATE_DIR"], "hooks", "errors.log")
    log.parent.mkdir(parents=True)
    filler = b"1.000\tcodex\t'earlier failure'\n"
    size = hook.ERRORS_LOG_MAX_BYTES - room
    log.write_bytes(filler * (size // len(filler)) + b"x" * (size % len(filler)))
    raw = BAD_EVENTS["not JSON"](tool_event(agent, tmp_path))
    runs = [forks.run(agent, [raw], env) for _ in range(2)]  # one after the other: hooks at once may each pass
    for [done] in runs:
        assert_failed_open(agent, done.status, done.stdout, done.stderr)
    grown = log.stat().st_size - size
    if room <= 0:
        assert grown == 0
    else:
        added = log.read_bytes()[size:]
        first_line = added.index(b"\n") + 1
        assert added.count(b"\n") == (2 if first_line < room else 1) and grown == len(added)
    log.unlink()
    [again] = forks.run(agent, [raw], env)
    assert_failed_open(agent, again.status, again.stdout, again.stderr)
    assert len(errors_logged(env)) == 1


@pytest.mark.parametrize(("agent", "kind"), REAL_COMMAND_CASES)
def test_bad_event_through_the_real_command(agent: str, kind: str, tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    raw = BAD_EVENTS[kind](tool_event(agent, tmp_path))
    done = hook_process(agent, raw, env)
    assert_failed_open(agent, done.returncode, done.stdout, done.stderr)
    if kind in ("larger than 8 MiB", "missing session_id"):
        done = hook_process(agent, raw, {**env, "TURNGUARD_FAIL_MODE": "closed"})
        assert_failed_closed(agent, done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("agent", AGENTS)
def test_unknown_events_and_unknown_fields_are_answered_quietly(agent: str, forks: ForkServer, env: dict[str, str],
                                                                tmp_path: Path) -> None:
    event = tool_event(agent, tmp_path)
    unknown = [{**event, "hook_event_name": "SomethingNew"}, {"hook_event_name": "Notification"},
               {"hook_event_name": "SessionStart", "source": "startup", "session_id": 5}]
    extra = {**event, "brand_new_field": {"nested": [1, 2]}, "effort": "max", "tool_use_ids": None}
    exits = forks.run(agent, [json.dumps(e).encode() for e in [*unknown, extra]], env)
    assert [(e.status, e.stdout, e.stderr) for e in exits] == [(0, b"{}\n", b"")] * 4
    assert tool_calls(env, agent, event["session_id"]) == 1  # the event with extra fields counted its call
    assert errors_logged(env) == []


@pytest.mark.parametrize("what", ["a bad value in the cwd's turnguard.toml", "an unknown TURNGUARD_ variable"])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_configuration_error_fails_open_or_closed(agent: str, what: str, forks: ForkServer, env: dict[str, str],
                                                    tmp_path: Path) -> None:
    event = tool_event(agent, tmp_path)
    if what.startswith("a bad value"):
        (Path(event["cwd"]) / "turnguard.toml").write_text("streak_stop_at = 'eight'\n")
    else:
        env["TURNGUARD_STREAK_STOP"] = "4"  # a typo of TURNGUARD_STREAK_STOP_AT
    [opened] = forks.run(agent, [json.dumps(event).encode()], env)
    assert_failed_open(agent, opened.status, opened.stdout, opened.stderr)
    assert "configuration" in opened.stderr.decode()
    [closed] = forks.run(agent, [json.dumps(event).encode()], {**env, "TURNGUARD_FAIL_MODE": "closed"})
    assert_failed_closed(agent, closed.status, closed.stdout, closed.stderr)


def every_event(agent: str, root: Path) -> dict[str, dict[str, Any]]:
    """One event of each name the agent sends turnguard, by name."""
    events = Events(agent, root, session_id="every-event-session")
    call_id = events.call_id()
    listed = [events.prompt(), events.model_request(), events.pre({"command": "ls"}, call_id),
              events.post({"command": "ls"}, call_id, failed=False),
              events.batch([(events.tool, {"command": "ls"}, call_id, "")]), events.stop(), events.session_end()]
    if agent == "claude-code":
        listed.append(events.post({"command": "ls"}, call_id, failed=True))
        listed.append({**events.stop(), "hook_event_name": "StopFailure", "error": "rate_limit"})
    return {e["hook_event_name"]: e for e in listed if e is not None}


GATING_EVENTS = {"UserPromptSubmit", "PreToolUse", "PreModelRequest", "BeforeAgent", "BeforeModel", "BeforeTool"}
"""The events before what a block would stop: a prompt, a model request, a tool call."""


@pytest.mark.parametrize("failure", ["a configuration error", "an event missing its session_id"])
@pytest.mark.parametrize("agent", AGENTS)
def test_fail_mode_closed_blocks_only_events_that_gate_an_action(agent: str, failure: str, forks: ForkServer,
                                                                env: dict[str, str], tmp_path: Path) -> None:
    """A block at a turn's or a session's end, or at an outcome, would mean something else (exit 2 at
    a ``Stop`` tells the agent to go on): there a failure allows, as under ``fail_mode="open"``."""
    events = every_event(agent, tmp_path)
    assert GATING_EVENTS & set(events) and set(events) - GATING_EVENTS
    env["TURNGUARD_FAIL_MODE"] = "closed"
    if failure == "a configuration error":
        (tmp_path / "project" / "turnguard.toml").write_text("streak_stop_at = 'eight'\n")
    raws = [json.dumps({k: v for k, v in e.items() if failure == "a configuration error" or k != "session_id"})
            .encode() for e in events.values()]
    for name, done in zip(events, forks.run(agent, raws, env), strict=True):
        if name in GATING_EVENTS:
            assert_failed_closed(agent, done.status, done.stdout, done.stderr)
        else:
            assert_failed_open(agent, done.status, done.stdout, done.stderr)
            assert "gates nothing" in done.stderr.decode(), (name, done.stderr)
    assert len(errors_logged(env)) == len(events)


def write_state(env: dict[str, str], agent: str, session_id: str, body: bytes) -> Path:
    path = SessionStore(state_root(env), agent).path(session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("garbage", [b"\x00\xff garbage", b'{"version": 1, "turn": ', b"[]", b'{"version": 99}',
                                     b'{"version": 1, "waiting": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                     b'{"version": 1, "turn": {"version": 2, "kind": "nonsense"}}'])
def test_a_corrupt_session_state_is_allowed_and_logged(agent: str, garbage: bytes, env: dict[str, str],
                                                       tmp_path: Path) -> None:
    event = tool_event(agent, tmp_path)
    write_state(env, agent, event["session_id"], garbage)
    answer = hook.run(agent, json.dumps(event).encode(), env)
    assert answer.output == {} and answer.exit_code == 0  # allowed: failed open, or went on with a new turn
    assert answer.stderr == "" or (answer.stderr.startswith(f"turnguard hook {agent}: ")
                                   and "\n" not in answer.stderr.strip()), answer.stderr
    assert len(errors_logged(env)) == 1


@pytest.mark.parametrize("agent", AGENTS)
def test_a_corrupt_session_state_fails_open_in_a_hook_process(agent: str, forks: ForkServer, env: dict[str, str],
                                                              tmp_path: Path) -> None:
    event = tool_event(agent, tmp_path)
    write_state(env, agent, event["session_id"], b"\x89PNG\r\n\x1a\n not a state")
    [opened] = forks.run(agent, [json.dumps(event).encode()], env)
    assert_failed_open(agent, opened.status, opened.stdout, opened.stderr)
    assert len(errors_logged(env)) == 1
    [recovered] = forks.run(agent, [json.dumps(event).encode()], env)  # the bad state was set aside
    assert (recovered.status, recovered.stderr) == (0, b""), recovered
    write_state(env, agent, event["session_id"], b"\x89PNG\r\n\x1a\n not a state")
    [closed] = forks.run(agent, [json.dumps(event).encode()], {**env, "TURNGUARD_FAIL_MODE": "closed"})
    assert_failed_closed(agent, closed.status, closed.stdout, closed.stderr)


def test_a_corrupt_session_state_through_the_real_command(env: dict[str, str], tmp_path: Path) -> None:
    event = tool_event("claude-code", tmp_path)
    write_state(env, "claude-code", event["session_id"], b"\x89PNG\r\n\x1a\n not a state")
    done = hook_process("claude-code", json.dumps(event).encode(), env)
    assert_failed_open("claude-code", done.returncode, done.stdout, done.stderr)
    assert len(errors_logged(env)) == 1


@pytest.mark.parametrize("how", ["garbage state", "nested too deep to parse", "another configuration",
                                 "another state version"])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_session_whose_state_cannot_resume_is_guarded_again_from_the_next_turn(
        agent: str, how: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(3):
        s.call("make test", failed=True)
    if how == "garbage state":
        write_state(env, agent, s.session_id, b"\x00garbage")
    elif how == "nested too deep to parse":
        write_state(env, agent, s.session_id, b'{"version": 1, "waiting": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    elif how == "another configuration":
        (s.events.project / "turnguard.toml").write_text("streak_warn_at = 3\nstreak_stop_at = 4\n")
    else:  # written by a later turnguard
        data = s.snapshot()
        data["version"] = 2
        write_state(env, agent, s.session_id, json.dumps(data).encode())
    s.call("make test", failed=True)  # this turn may go unguarded (it fails open)
    start = s.start()
    assert is_allow(start), f"the next turn must open normally: {start}"
    assert fail_until_halted(s) == (4 if how == "another configuration" else STOP_AT)


SETTINGS_EDITS: list[tuple[str, str | None, int, int]] = [
    ("", "streak_warn_at = 3\nstreak_stop_at = 4\n", STOP_AT, 4),
    ("streak_warn_at = 3\nstreak_stop_at = 4\n", "", 4, STOP_AT),
    ("streak_warn_at = 3\nstreak_stop_at = 4\n", None, 4, STOP_AT),
    ("streak_warn_at = 3\nstreak_stop_at = 4\n", "streak_warn_at = 5\nstreak_stop_at = 6\nsoft_cap = 50\n", 4, 6),
]
"""``turnguard.toml`` before and after an edit (``None``: removed), and the call that halts the
turn open across the edit, and the next turn."""


@pytest.mark.parametrize(("before", "after", "open_halts", "next_halts"), SETTINGS_EDITS)
@pytest.mark.parametrize("agent", AGENTS)
def test_settings_edited_in_the_middle_of_a_turn_apply_from_the_next_turn_and_lose_no_call(
        agent: str, before: str, after: str | None, open_halts: int, next_halts: int, live_env: dict[str, str],
        tmp_path: Path) -> None:
    s = Session(agent, live_env, tmp_path)
    settings = s.events.project / "turnguard.toml"
    settings.write_text(before)
    s.start()
    for _ in range(2):
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers())
    if after is None:
        settings.unlink()
    else:
        settings.write_text(after)
    assert 2 + fail_until_halted(s) == open_halts, "the open turn goes on under the settings it opened with"
    assert s.tool_calls() == open_halts
    s.start()
    assert fail_until_halted(s) == next_halts
    s.finish()
    wait_for_export(live_env)
    calls = sorted(turn["tool_calls"] for turn in recorded(live_env))  # (two exporters may write in either order)
    assert calls == sorted([open_halts, next_halts]), "each turn recorded whole, once"
    assert not errors_logged(live_env)


WRONG_VALUES: list[Any] = [None, "x", 5, -1, True, 1e308, [], [[]], {}, {"a": 1}]


def json_paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from json_paths(child, (*at, key))


def replaced(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    data = json.loads(json.dumps(data))
    place = data
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    return data


def damaged_states(agent: str, base: dict[str, Any], sampled: int) -> list[tuple[tuple[Any, ...], Any]]:
    """Every field of the state outside the turn's snapshot and each of its items, with each wrong
    value; and ``sampled`` of the snapshot's fields, with one each (``Guard.resume`` reads those)."""
    paths = [p for p in json_paths(base) if p and p != ("version",)]
    outside = [(p, v) for p in paths if p[0] != "turn" for v in WRONG_VALUES]
    rng = random.Random(f"damaged-{agent}")
    inside = [(p, rng.choice(WRONG_VALUES)) for p in rng.sample([p for p in paths if p[0] == "turn"], sampled)]
    return outside + inside


@pytest.mark.parametrize("agent", AGENTS)
def test_a_session_state_with_any_field_damaged_goes_on_with_a_new_turn(agent: str, env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """A state that parses but holds a wrong value anywhere is set aside (or its snapshot dropped)
    and noted; no event of the session ever fails on it, even under ``fail_mode="closed"``, and
    the next turn counts from its first call."""
    env.update(TURNGUARD_ATTENDED="1", TURNGUARD_FAIL_MODE="closed")  # a pending question or reminder too
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(WARN_AT - 1):
        s.call("make test", failed=True)
    pending = {"command": "make test"}
    pending_id = s.events.call_id()
    s.send(s.events.pre(pending, pending_id))
    base = s.snapshot()
    assert base["waiting"] and base["journal"] and base["turn"]
    path = SessionStore(state_root(env), agent).path(s.session_id)
    cases = damaged_states(agent, base, sampled=40)
    assert len(cases) > 150
    for where, value in cases:
        write_state(env, agent, s.session_id, json.dumps(replaced(base, where, value)).encode())
        answers = [s.send(s.events.post(pending, pending_id, failed=True)), s.stop(), s.start(),
                   s.send(s.events.pre({"command": "ls"}, s.events.call_id()))]
        assert all(a.exit_code == 0 and a.stderr == "" for a in answers), (where, value, answers)
        assert s.tool_calls() == 1, (where, value)
        assert state_damage(s.snapshot()) is None
        path.with_name(path.name + ".bad").unlink(missing_ok=True)
    assert errors_logged(env), "the damage was noted"


@pytest.mark.parametrize("agent", AGENTS)
def test_a_damaged_journal_is_set_aside_and_the_next_turn_halts(agent: str, forks: ForkServer, env: dict[str, str],
                                                                tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    s.call("make test", failed=True)
    path = write_state(env, agent, s.session_id, json.dumps({**s.snapshot(), "journal": 5}).encode())
    for event in (s.events.stop(), s.events.prompt(), s.events.session_end(), s.events.prompt()):
        [done] = forks.run(agent, [json.dumps(event).encode()], env)
        assert (done.status, done.stderr) == (0, b""), (event["hook_event_name"], done)
    assert json.loads(path.with_name(path.name + ".bad").read_text())["journal"] == 5
    assert len(errors_logged(env)) == 1
    assert fail_until_halted(s) == STOP_AT


def deep_json(depth: int, shape: str) -> bytes:
    """JSON text nesting ``depth`` lists or objects (``mixed``: in turn), built as text: this
    process could not ``json.dumps`` the deepest."""
    opens = {"list": ["["], "object": ['{"a":'], "mixed": ["[", '{"a":']}[shape]
    closes = {"[": "]", '{"a":': "}"}
    levels = [opens[i % len(opens)] for i in range(depth)]
    return ("".join(levels) + "1" + "".join(closes[o] for o in reversed(levels))).encode()


def with_tool_input(event: dict[str, Any], tool_input: bytes) -> bytes:
    head = json.dumps({k: v for k, v in event.items() if k != "tool_input"}).encode()
    return head[:-1] + b', "tool_input": ' + tool_input + b"}"


@pytest.mark.parametrize("shape", ["list", "object", "mixed"])
@pytest.mark.parametrize("depth", [MAX_INPUT_DEPTH, MAX_INPUT_DEPTH + 1, 500, 985])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_deeply_nested_tool_input_never_leaves_the_session_unguarded(
        agent: str, depth: int, shape: str, forks: ForkServer, env: dict[str, str], tmp_path: Path) -> None:
    """A call without an id keeps its input in the state until its outcome: whatever its depth, the
    next hook processes read the state back and the session stays guarded."""
    s = Session(agent, env, tmp_path)
    assert [e.status for e in forks.run(agent, [json.dumps(s.events.prompt()).encode()], env)] == [0]
    [deep] = forks.run(agent, [with_tool_input(s.events.pre(None, None), deep_json(depth, shape))], env)
    assert deep.status == 0 and deep.stdout == b"{}\n", deep
    if depth > MAX_INPUT_DEPTH:
        assert_failed_open(agent, deep.status, deep.stdout, deep.stderr)
        assert re.search(rf"deeper than {MAX_INPUT_DEPTH}|not JSON", deep.stderr.decode()), deep.stderr
    else:
        assert deep.stderr == b""
    later = [s.events.pre({"command": "ls"}, s.events.call_id()), s.events.stop(), s.events.prompt(),
             s.events.pre({"command": "ls"}, s.events.call_id())]
    for event in later:
        [done] = forks.run(agent, [json.dumps(event).encode()], env)
        assert (done.status, done.stderr) == (0, b""), (event["hook_event_name"], done)
    assert len(errors_logged(env)) == (depth > MAX_INPUT_DEPTH)
    assert fail_until_halted(s) == STOP_AT


def test_nested_deeper_counts_the_levels_of_any_json_data() -> None:
    def depth(value: Any) -> int:
        children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else None
        return 0 if children is None else 1 + max(map(depth, children), default=0)

    rng = random.Random(30)
    for _ in range(500):
        value: Any = rng.choice([1, "x", None, [], {}])
        for _ in range(rng.randrange(12)):
            siblings = [rng.choice([1, "s", [], {"k": 2}]) for _ in range(rng.randrange(3))]
            if rng.random() < 0.5:
                value = [*siblings, value] if rng.random() < 0.5 else [value, *siblings]
            else:
                value = {**{f"k{i}": v for i, v in enumerate(siblings)}, "v": value}
        for limit in range(0, 14):
            assert nested_deeper(value, limit) == (depth(value) > limit), (value, limit)


@pytest.mark.parametrize("agent", AGENTS)
def test_a_state_directory_that_is_a_file_fails_open(agent: str, forks: ForkServer, tmp_path: Path) -> None:
    (tmp_path / "state").write_text("I am a file\n")
    env = hook_env(tmp_path)
    raw = json.dumps(tool_event(agent, tmp_path)).encode()
    [opened] = forks.run(agent, [raw], env)
    assert_failed_open(agent, opened.status, opened.stdout, opened.stderr)
    assert "Not a directory" in opened.stderr.decode()
    if agent == "claude-code":
        done = hook_process(agent, raw, env)
        assert_failed_open(agent, done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("agent", AGENTS)
def test_a_session_folder_that_is_a_file_fails_open_and_is_logged(agent: str, env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    folder = Path(env["TURNGUARD_STATE_DIR"]) / "hooks" / agent
    folder.parent.mkdir(parents=True)
    folder.write_text("I am a file\n")
    answer = hook.run(agent, json.dumps(tool_event(agent, tmp_path)).encode(), env)
    assert answer.output == {} and answer.exit_code == 0 and answer.stderr.startswith(f"turnguard hook {agent}: ")
    assert len(errors_logged(env)) == 1


def small_files(limit: int) -> Any:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("agent", AGENTS)
def test_a_full_disk_fails_open_keeps_the_last_state_and_is_logged(agent: str, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    s.call("make test", failed=True)
    path = SessionStore(state_root(env), agent).path(s.session_id)
    before = path.read_bytes()
    assert len(before) > 1024
    payload = s.events.pre({"command": "make test"}, s.events.call_id())
    done = hook_process(agent, json.dumps(payload).encode(), env, preexec_fn=small_files(1024))
    assert_failed_open(agent, done.returncode, done.stdout, done.stderr)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert len(errors_logged(env)) == 1
    assert is_allow(s.send(payload))  # space again: the call is counted on the state that was kept
    assert s.tool_calls() == 2


@pytest.mark.parametrize("agent", AGENTS)
def test_a_halt_for_any_tool_name_reaches_the_agent_as_one_json_object(agent: str, forks: ForkServer,
                                                                      env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    name = "mcp__files__read\ud800"  # a lone surrogate: valid JSON (\ud800), not encodable as UTF-8
    for n in range(1, STOP_AT):
        call_id = s.events.call_id()
        answers = [s.send(s.events.pre({"path": "a"}, call_id, tool=name)),
                   s.send(s.events.post({"path": "a"}, call_id, failed=True, tool=name))]
        assert all(is_allow(a) for a in answers), (n, answers)
    call_id = s.events.call_id()
    assert is_allow(s.send(s.events.pre({"path": "a"}, call_id, tool=name)))
    eighth = s.events.post({"path": "a"}, call_id, failed=True, tool=name)
    ninth = s.events.pre({"path": "a"}, s.events.call_id(), tool=name)
    for payload in (eighth, ninth):  # the 8th failure's answer, then the 9th call's, each from a hook process
        [done] = forks.run(agent, [json.dumps(payload).encode()], env)
        assert done.status == 0 and b"Traceback" not in done.stderr, done
        assert done.stdout.count(b"\n") == 1 and done.stdout.startswith(b"{"), f"not one JSON object: {done}"
    assert check_halts(agent, HookAnswer(json.loads(done.stdout))), done


# -- 9. attended sessions ------------------------------------------------------------------------------------------


def test_attended_claude_asks_at_the_fifth_identical_call_and_records_continue(live_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    env = {**live_env, "CLAUDE_CODE_SESSION_ATTENDED": "1"}
    s = Session("claude-code", env, tmp_path)
    s.start()
    for n in range(1, WARN_AT):
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers()), n
    fifth = s.call("make test", failed=True)
    assert asks(fifth.pre), fifth.pre
    assert is_allow(fifth.post) and is_allow(fifth.batch)
    for n in range(WARN_AT + 1, STOP_AT + 1):  # "continue" started the streak again: no halt at the 8th
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers()), n
    s.finish()
    line = only_line(env, live=True)
    assert line["escalations"] == [{"threshold": "streak", "level": "warn", "answer": "continue", "at_call": WARN_AT}]
    assert line["ended_by"] == "completed"


def test_attended_claude_asks_the_stop_level_question_at_the_next_check(env: dict[str, str], tmp_path: Path) -> None:
    env.update(CLAUDE_CODE_SESSION_ATTENDED="1", TURNGUARD_STREAK_WARN_AT="0")
    s = Session("claude-code", env, tmp_path)
    s.start()
    for n in range(1, STOP_AT):
        assert all(is_allow(a) for a in s.call("make test", failed=True).answers()), n
    eighth = s.call("make test", failed=True)
    assert eighth.post.output.get("hookSpecificOutput", {}).get("additionalContext")
    assert "decision" not in eighth.post.output and is_allow(eighth.batch), "asked, not halted"
    ninth = s.call("make test", failed=True)
    assert asks(ninth.pre), ninth.pre
    s.finish()
    line = only_line(env)
    assert line["escalations"] == [{"threshold": "streak", "level": "stop", "answer": "continue", "at_call": STOP_AT}]


def test_attended_claude_refused_question_is_not_recorded_as_continue(env: dict[str, str], tmp_path: Path) -> None:
    env["CLAUDE_CODE_SESSION_ATTENDED"] = "1"
    s = Session("claude-code", env, tmp_path)
    s.start()
    for _ in range(1, WARN_AT):
        s.call("make test", failed=True)
    refused = s.denied("make test")  # the person said no at the prompt: the call never ran
    assert asks(refused.pre)
    s.finish()
    [escalation] = only_line(env)["escalations"]
    assert (escalation["level"], escalation["at_call"]) == ("warn", WARN_AT)
    assert escalation["answer"] in ("stop", "redirect"), "a refusal is not a 'continue'"


def _asked_steps() -> list[tuple[int, int, str]]:
    """(calls in the step, the asked call's place in it, what its siblings are): identical siblings
    before the asked call count toward its streak, distinct ones would break it (so only after)."""
    steps = [(width, place, "identical") for width in (1, 2, 3) for place in range(width)]
    return steps + [(width, 0, "distinct") for width in (2, 3)]


@pytest.mark.parametrize("asked_first", [True, False], ids=["asked-outcome-first", "asked-outcome-last"])
@pytest.mark.parametrize("answer", ["yes-ok", "yes-failed", "no"])
@pytest.mark.parametrize(("width", "place", "siblings"), _asked_steps())
def test_attended_claude_question_is_answered_by_the_asked_call_whatever_calls_run_beside_it(
        width: int, place: int, siblings: str, answer: str, asked_first: bool, env: dict[str, str],
        tmp_path: Path) -> None:
    """Claude Code runs the hooks of a step's concurrency-safe calls (reads, searches) at once: the
    calls checked beside the asked one are not the person's answer to its question. "Yes" (the
    call ran, whatever its outcome) is ``continue``, "No" (no post event by the step's end) is
    ``stop``, as for the asked call alone."""
    env["CLAUDE_CODE_SESSION_ATTENDED"] = "1"
    s = Session("claude-code", env, tmp_path)
    s.start()
    command = "grep -rn TODO src"
    for _ in range(WARN_AT - 1 - place):
        s.call(command, failed=False)
    ev = s.events
    step = [({"command": command} if siblings == "identical" or i == place else {"command": f"ls dir{i}"},
             ev.call_id()) for i in range(width)]
    checks = [s.send(ev.pre(tool_input, call_id)) for tool_input, call_id in step]
    assert asks(checks[place]), checks[place]
    assert all(is_allow(a) for i, a in enumerate(checks) if i != place), checks
    order = sorted(range(width), key=lambda i: (i != place) == asked_first)
    for i in order:
        if i != place or answer != "no":
            tool_input, call_id = step[i]
            s.send(ev.post(tool_input, call_id, failed=i == place and answer == "yes-failed"))
    s.send(ev.batch([(ev.tool, tool_input, call_id, "output") for tool_input, call_id in step]))
    s.finish()
    [escalation] = only_line(env)["escalations"]
    assert escalation == {"threshold": "streak", "level": "warn", "at_call": WARN_AT,
                          "answer": "stop" if answer == "no" else "continue"}


def _questions_in_steps() -> list[tuple[tuple[bool, ...], tuple[bool, ...], tuple[int, ...]]]:
    """(which calls of the step ask, which of them the person lets run, the order of their outcomes):
    steps of 1-3 calls with 1-3 questions, every answer, every order of the outcomes."""
    cases = []
    for width in (1, 2, 3):
        for asking in itertools.product((True, False), repeat=width):
            if not any(asking):
                continue
            for runs in itertools.product((True, False), repeat=width):
                if any(not r and not a for r, a in zip(runs, asking, strict=True)):
                    continue  # (only a question is refused: a call asked nothing runs)
                cases += [(asking, runs, order)
                          for order in itertools.permutations(i for i in range(width) if runs[i])]
    return cases


@pytest.mark.parametrize(("asking", "runs", "order"), _questions_in_steps())
def test_attended_claude_every_question_of_a_step_gets_its_own_calls_answer(
        asking: tuple[bool, ...], runs: tuple[bool, ...], order: tuple[int, ...], env: dict[str, str],
        tmp_path: Path) -> None:
    """Claude Code checks a step's concurrency-safe calls at once, so a call may ask while an
    earlier call's question is still open. Each question is answered by its own call, as if the
    calls ran one at a time: ``continue`` when it ran, ``stop`` when the person refused it (no
    post event by the step's end); none is lost to the one after it."""
    env.update(CLAUDE_CODE_SESSION_ATTENDED="1", TURNGUARD_STREAK_WARN_AT="1", TURNGUARD_STREAK_STOP_AT="2",
               TURNGUARD_STREAK_EXEMPT_TOOLS="Read")
    s = Session("claude-code", env, tmp_path)
    s.start()
    ev = s.events
    step = [("Bash" if a else "Read", {"command": f"grep -rn TODO dir{i}"}, ev.call_id())
            for i, a in enumerate(asking)]
    checks = [s.send(ev.pre(tool_input, call_id, tool)) for tool, tool_input, call_id in step]
    assert [asks(a) for a in checks] == list(asking), checks
    for i in order:
        tool, tool_input, call_id = step[i]
        s.send(ev.post(tool_input, call_id, failed=False, tool=tool))
    s.send(ev.batch([(tool, tool_input, call_id, "output") for tool, tool_input, call_id in step]))
    s.finish()
    line = only_line(env)
    expected = sorted((i + 1, "continue" if runs[i] else "stop") for i in range(len(step)) if asking[i])
    assert sorted((e["at_call"], e["answer"]) for e in line["escalations"]) == expected
    assert line["ended_by"] == ("completed" if all(runs) else "streak")


@pytest.mark.parametrize("ended_by", ["step-end", "session-end"])
def test_attended_claude_questions_open_beside_each_other_are_kept_and_read_back(
        ended_by: str, env: dict[str, str], tmp_path: Path) -> None:
    """Questions open at once are kept in the session's state between hook processes; a damaged one
    is state damage (the state is set aside), and the turn's end answers every open one ``stop``."""
    env.update(CLAUDE_CODE_SESSION_ATTENDED="1", TURNGUARD_STREAK_WARN_AT="1", TURNGUARD_STREAK_STOP_AT="2")
    s = Session("claude-code", env, tmp_path)
    s.start()
    ev = s.events
    step = [({"command": f"ls dir{i}"}, ev.call_id()) for i in range(3)]
    assert all(asks(s.send(ev.pre(tool_input, call_id))) for tool_input, call_id in step)
    data = s.snapshot()
    assert state_damage(data) is None
    assert [q["call"] for q in data["asked"]] + [data["ask"]["call"]] == [call_id for _, call_id in step]
    for bad in ({}, [1], [{"verdict": {}, "at": 0}], [{**data["asked"][0], "call": None}],
                [{**data["asked"][0], "verdict": {"action": "nonsense"}}], [{**data["asked"][0], "at": "0"}]):
        assert state_damage({**data, "asked": bad}) is not None, bad
    if ended_by == "step-end":
        s.send(ev.batch([(ev.tool, tool_input, call_id, "denied") for tool_input, call_id in step]))
    s.send(ev.session_end())
    assert [e["answer"] for e in only_line(env)["escalations"]] == ["stop"] * 3


HOOK_DENIED = "PreToolUse:Bash hook error: my policy denies this"
"""What Claude Code (2.1.328) gives the model for a call another ``PreToolUse`` hook denied."""


def _fates_of_asked_calls() -> list[tuple[str, ...]]:
    """What became of each asking call of a step of 1-3: it ran (the person said yes), the person
    said no, or another hook denied it (at most one: one question waits for the next call)."""
    return [fates for width in (1, 2, 3) for fates in itertools.product(("ran", "no", "hook-denied"), repeat=width)
            if fates.count("hook-denied") <= 1]


@pytest.mark.parametrize(("response", "denied_by_a_hook"), [
    (HOOK_DENIED, True),
    ("PreToolUse:Bash hook error: [python3 deny.py]: No stderr output", True),
    ("PreToolUse:Read hook error: my policy denies this", False),  # (another tool's hook: not this call's)
    ("Claude requested permissions to use Bash, but you haven't granted it yet.", False),
    ("Exit code 1\nPreToolUse:Bash hook error: printed by the command", False),
    (["PreToolUse:Bash hook error: x"], False),
    (None, False),
])
def test_claude_code_step_end_names_the_calls_another_hook_denied(response: Any, denied_by_a_hook: bool) -> None:
    payload = {**Events("claude-code", Path("/nonexistent")).batch([("Bash", {"command": "ls"}, "toolu_1", "")]),
               "session_id": "s"}
    payload["tool_calls"][0]["tool_response"] = response
    event = hook.protocol_for("claude-code").read(payload, {})
    assert event.hook_denied == (frozenset({"toolu_1"}) if denied_by_a_hook else frozenset())


@pytest.mark.parametrize("following", ["ran", "hook-denied"])
@pytest.mark.parametrize("fates", _fates_of_asked_calls(), ids="-".join)
def test_attended_claude_a_question_another_hook_denied_is_not_the_persons_answer(
        fates: tuple[str, ...], following: str, env: dict[str, str], tmp_path: Path) -> None:
    """A user's own ``PreToolUse`` hook that denies the asked call overrides the question: the
    person never sees it. That is not their "No" (no ``stop``, no halt): the question is asked
    again at the next call, and its answer is that call's; when the person never sees it (denied
    there too, or the turn stopped by another question's "No") it stays unanswered."""
    env.update(CLAUDE_CODE_SESSION_ATTENDED="1", TURNGUARD_STREAK_WARN_AT="1", TURNGUARD_STREAK_STOP_AT="2",
               TURNGUARD_STREAK_EXEMPT_TOOLS="Read")
    s = Session("claude-code", env, tmp_path)
    s.start()
    ev = s.events
    step = [({"command": f"grep -rn TODO dir{i}"}, ev.call_id()) for i in range(len(fates))]
    assert all(asks(s.send(ev.pre(tool_input, call_id))) for tool_input, call_id in step)
    results = []
    for (tool_input, call_id), fate in zip(step, fates, strict=True):
        if fate == "ran":
            s.send(ev.post(tool_input, call_id, failed=False))
        results.append((ev.tool, tool_input, call_id, HOOK_DENIED if fate == "hook-denied" else "output"))
    s.send(ev.batch(results))
    said_no = "no" in fates
    following_input = {"command": "cat notes.txt"}
    following_id = ev.call_id()
    check = s.send(ev.pre(following_input, following_id, "Read"))
    if said_no:
        assert check_halts("claude-code", check), check
    else:
        assert asks(check) if "hook-denied" in fates else is_allow(check), check
        if following == "ran":
            s.send(ev.post(following_input, following_id, failed=False, tool="Read"))
    denied = following == "hook-denied" and not said_no
    s.send(ev.batch([("Read", following_input, following_id,
                      HOOK_DENIED.replace("Bash", "Read") if denied else "output")]))
    s.finish()
    line = only_line(env)
    seen_again = following == "ran" and not said_no  # (a halted turn asks nothing more)
    answers = {"ran": "continue", "no": "stop", "hook-denied": "continue" if seen_again else None}
    assert sorted((e["at_call"], e["answer"]) for e in line["escalations"]) == [
        (i + 1, answers[fate]) for i, fate in enumerate(fates) if answers[fate] is not None]  # (unanswered: none)
    assert line["ended_by"] == ("streak" if said_no else "completed")


@pytest.mark.parametrize("settings", [
    {"CLAUDE_CODE_SESSION_ATTENDED": "1"},
    {"CLAUDE_CODE_ENTRYPOINT": "cli"},
    {"CLAUDE_CODE_SESSION_ATTENDED": "0", "TURNGUARD_ATTENDED": "1"},
    {"TURNGUARD_ATTENDED": "1", "CLAUDE_CODE_ENTRYPOINT": "sdk-cli"},
])
def test_claude_attended_sessions_ask(settings: dict[str, str], env: dict[str, str], tmp_path: Path) -> None:
    env.update(settings)
    s = Session("claude-code", env, tmp_path)
    s.start()
    for _ in range(1, WARN_AT):
        s.call("make test", failed=True)
    assert asks(s.check("make test"))


@pytest.mark.parametrize("settings", [
    {"CLAUDE_CODE_SESSION_ATTENDED": "0"},
    {"CLAUDE_CODE_SESSION_ATTENDED": "0", "CLAUDE_CODE_ENTRYPOINT": "cli"},
    {"CLAUDE_CODE_SESSION_ATTENDED": "1", "TURNGUARD_ATTENDED": "0"},
    {"CLAUDE_CODE_ENTRYPOINT": "sdk-cli"},
    {},
])
def test_claude_unattended_sessions_never_ask_and_halt(settings: dict[str, str], env: dict[str, str],
                                                       tmp_path: Path) -> None:
    env.update(settings)
    s = Session("claude-code", env, tmp_path)
    s.start()
    assert fail_until_halted(s) == STOP_AT


def test_codex_is_unattended_whatever_turnguard_attended_says(env: dict[str, str], tmp_path: Path) -> None:
    env["TURNGUARD_ATTENDED"] = "1"
    s = Session("codex", env, tmp_path)
    s.start()
    assert fail_until_halted(s) == STOP_AT


@pytest.mark.parametrize("level", ["warn", "stop"])
def test_attended_gemini_puts_the_question_to_the_model(level: str, env: dict[str, str], tmp_path: Path) -> None:
    env["TURNGUARD_ATTENDED"] = "1"
    if level == "stop":
        env["TURNGUARD_STREAK_WARN_AT"] = "0"
    s = Session("gemini", env, tmp_path)
    s.start()
    due = WARN_AT if level == "warn" else STOP_AT
    told: list[str] = []
    for n in range(1, due + 2):
        step = s.call("make test", failed=True)
        assert step.pre.output.get("continue") is not False, (n, step)
        context = (step.post.output.get("hookSpecificOutput") or {}).get("additionalContext", "")
        if context.startswith(hook.ASK_MODEL):
            told.append(f"call {n}")
    assert told and told[0] in (f"call {due}", f"call {due + 1}"), \
        f"the model must be asked to ask the person by the {level} level's next outcome; told at {told}"


# -- 10. refused calls ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["FDFDFDFDFFFF", "DDDDFFFFFFFF", "FFFFFFFDF", "FFFDDDDFFFFF"])
def test_claude_denied_calls_are_recorded_denied_and_never_count_as_failures(
        pattern: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session("claude-code", env, tmp_path)
    s.start()
    halt_at = [i for i, p in enumerate(pattern, 1) if p == "F"][STOP_AT - 1]
    for n, p in enumerate(pattern, 1):
        step = s.call("make test", failed=True) if p == "F" else s.denied("make test")
        if n < halt_at:
            assert all(is_allow(a) for a in step.answers()), (n, pattern, step)
    assert outcome_halts("claude-code", step), step
    s.finish()
    line = only_line(env)
    assert [c["outcome"] for c in line["calls"]] == ["error" if p == "F" else "denied" for p in pattern]
    assert (line["ended_by"], line["tool_calls"]) == ("streak", len(pattern))


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_calls_refused_without_an_outcome_never_count_as_failures(agent: str, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    pattern = "FRFRFRFRFFFF"
    for n, p in enumerate(pattern, 1):
        if p == "F":
            step = s.call("make test", failed=True, model_request=True)
        else:  # checked, then refused elsewhere (the sandbox, another hook): no outcome event at all
            s.send(s.events.model_request())
            step = Step(s.check("make test"))
        if n < len(pattern):
            assert all(is_allow(a) for a in step.answers()), (n, step)
    assert outcome_halts(agent, step), "the 8th failure halts"


# -- 11. the exporter --------------------------------------------------------------------------------------------------


def journal_digests(env: dict[str, str], agent: str, session_id: str) -> list[str]:
    return [e[3] for e in session_data(env, agent, session_id)["journal"] if e[0] == "c"]


def numeric_digest_commands(count: int) -> list[str]:
    """Distinct commands whose journal digests read as one JSON number (they overflow to infinity)."""
    from turnguard._keys import identity_bytes

    found: list[str] = []
    n = 0
    while len(found) < count:
        command = f"cat part-{n}.log"
        digest = hashlib.blake2b(identity_bytes("Bash", {"command": command}, "canonical"), digest_size=8).hexdigest()
        if re.fullmatch(r"[1-9][0-9]*e[0-9]{3,}", digest):
            found.append(command)
        n += 1
    return found


def test_the_exporter_replays_distinct_calls_as_distinct_whatever_their_digests(env: dict[str, str],
                                                                               tmp_path: Path) -> None:
    s = Session("claude-code", env, tmp_path)
    s.start()
    commands = numeric_digest_commands(STOP_AT)
    for command in commands:
        assert all(is_allow(a) for a in s.call(command, failed=True).answers())
    digests = journal_digests(env, "claude-code", s.session_id)
    assert len(set(digests)) == STOP_AT and all(float(d.lstrip("#")) == float("inf") for d in digests)
    s.finish()
    line = only_line(env)
    assert (line["ended_by"], line["tool_calls"]) == ("completed", STOP_AT), "the live hooks never halted"
    assert len({c["args"] for c in line["calls"]}) == STOP_AT


def test_a_journal_left_by_a_dead_exporter_is_exported_and_removed(env: dict[str, str], tmp_path: Path) -> None:
    s = Session("claude-code", env, tmp_path)  # (``env``: the exporter died before it started)
    s.start()
    assert fail_until_halted(s) == STOP_AT
    s.finish()
    left = list(outbox(env).glob("*.json"))
    assert len(left) == 1 and recorded(env) == []
    done = subprocess.run([sys.executable, "-m", "turnguard.agents.export"], env=env, capture_output=True,
                          timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert list(outbox(env).glob("*.json")) == []
    line = only_line(env, live=True)
    assert (line["agent"], line["ended_by"], line["tool_calls"]) == ("claude-code", "streak", STOP_AT)


def test_the_next_turns_exporter_takes_a_journal_left_behind(live_env: dict[str, str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    env = live_env
    with monkeypatch.context() as m:
        m.setattr(export, "start_exporter", lambda environ: None)
        s = Session("gemini", env, tmp_path)
        s.start()
        s.call("make test", failed=True)
        s.finish()
    s.start()
    s.call("ls", failed=False)
    s.finish()
    wait_for_export(env)
    assert sorted(line["tool_calls"] for line in recorded(env)) == [1, 1]
    assert {line["agent"] for line in recorded(env)} == {"gemini"}


CORRUPT_JOURNALS: dict[str, bytes] = {
    "empty file": b"",
    "not JSON": b"\x00\x01garbage",
    "truncated": b'{"agent":"claude-code","session":"s","cwd":null,"journal":[["o",1,"t',
    "JSON array": b"[]",
    "empty object": b"{}",
    "journal not a list": b'{"agent":"claude-code","session":"s","cwd":null,"journal":"x"}',
    "empty journal": b'{"agent":"claude-code","session":"s","cwd":null,"journal":[]}',
    "short opening entry": b'{"agent":"claude-code","session":"s","cwd":null,"journal":[["o"]]}',
    "bad entry": b'{"agent":"claude-code","session":"s","cwd":null,"journal":[["o",1,"abc",false],["c",2]]}',
    "no agent": b'{"session":"s","cwd":null,"journal":[["o",1,"abc",false],["e",2,"completed"]]}',
}


@pytest.mark.parametrize("corrupt", list(CORRUPT_JOURNALS))
def test_a_corrupt_outbox_file_does_not_stop_the_others(corrupt: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session("codex", env, tmp_path)
    s.start()
    s.call("make test", failed=True)
    s.finish()
    box = outbox(env)
    (box / f"{0:020d}-corrupt.json").write_bytes(CORRUPT_JOURNALS[corrupt])  # first in the exporter's order
    [good] = [p for p in box.glob("*.json") if "corrupt" not in p.name]
    try:
        export.export_outbox(env)
        error = None
    except Exception as exc:  # (said in the assertion: the point is what became of the good journal)
        error = exc
    assert not good.exists(), f"the valid journal was left in the outbox; the exporter: {error!r}"
    assert [(line["agent"], line["tool_calls"]) for line in recorded(env)] == [("codex", 1)]
