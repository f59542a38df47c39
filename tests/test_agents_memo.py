"""What the long-lived server keeps between events (``hook.Memo``): each folder's settings and the
state it last wrote to each session's file. Neither may change an answer: a session answered in
turn by the server and by hook processes of their own (the client's fallback) counts exactly, and
a configuration file changed, added or removed applies from the next turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_events import (
    AGENTS,
    Events,
    Step,
    is_allow,
    outcome_halts,
    ten_threads_round,
    tool_calls,
)
from turnguard.agents import hook
from turnguard.agents.events import HookAnswer


class Sender:
    """Sends one session's events to the server's ``hook.run`` (with its memo) or to a hook
    process's (without), as ``by`` says."""

    def __init__(self, agent: str, env: dict[str, str], root: Path, memo: hook.Memo) -> None:
        self.agent, self.env, self.memo = agent, env, memo
        self.events = Events(agent, root)

    def send(self, payload: dict[str, Any] | None, by: str = "server") -> HookAnswer | None:
        if payload is None:
            return None
        return hook.run(self.agent, json.dumps(payload).encode(), self.env,
                        memo=self.memo if by == "server" else None)

    def call(self, command: str, by: str = "server", *, failed: bool = True) -> Step:
        tool_input = {"command": command}
        call_id = self.events.call_id()
        pre = self.send(self.events.pre(tool_input, call_id), by)
        post = self.send(self.events.post(tool_input, call_id, failed=failed, output="failing" if failed else ""), by)
        response = "Exit code 1\nfailing" if failed else "(Bash completed with no output)"
        batch = self.send(self.events.batch([(self.events.tool, tool_input, call_id, response)]), by)
        return Step(pre, post, batch)


@pytest.mark.parametrize("agent", AGENTS)
def test_a_session_answered_by_the_server_and_hook_processes_in_turn_halts_at_the_eighth_failure(
        agent: str, env: dict[str, str], tmp_path: Path) -> None:
    memo = hook.Memo.new()
    s = Sender(agent, env, tmp_path, memo)
    assert is_allow(s.send(s.events.prompt()))
    answerers = ["server", "process", "server", "server", "process", "process", "server"]
    for n, by in enumerate(answerers, 1):
        step = s.call("make test", by)
        assert all(is_allow(a) for a in step.answers()), (n, by, step)
        assert tool_calls(env, agent, s.events.session_id) == n
    assert outcome_halts(agent, s.call("make test", "server"))


def test_threads_of_one_server_count_every_call_exactly(env: dict[str, str], tmp_path: Path) -> None:
    memo = hook.Memo.new()

    def run(i: int, agent: str, payload: bytes) -> HookAnswer:
        return hook.run(agent, payload, env, memo=memo if i % 3 else None)

    for round_ in range(6):
        ten_threads_round(env, round_, tmp_path / f"r{round_}", run)


def calls_until_denied(s: Sender, limit: int = 12) -> int | None:
    """A new turn of distinct calls; the number of the first call whose check is not allowed."""
    s.send(s.events.stop())
    s.send(s.events.prompt())
    for n in range(1, limit + 1):
        if not is_allow(s.call(f"cat f{n}.txt", failed=False).pre):
            return n
    return None


@pytest.mark.parametrize("agent", AGENTS)
def test_a_configuration_file_written_changed_or_removed_applies_from_the_next_turn(
        agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Sender(agent, env, tmp_path, hook.Memo.new())
    own = s.events.project / "turnguard.toml"
    above = tmp_path / "pyproject.toml"
    assert calls_until_denied(s) is None
    own.write_text("max_tool_calls_per_turn = 3\n")
    assert calls_until_denied(s) == 4
    own.write_text("max_tool_calls_per_turn = 5\n")  # the same size, in place
    assert calls_until_denied(s) == 6
    own.unlink()
    assert calls_until_denied(s) is None
    above.write_text("[tool.turnguard]\nmax_tool_calls_per_turn = 2\n")  # the nearest folder above configures it
    assert calls_until_denied(s) == 3
    above.write_text("[tool.other]\nmax_tool_calls_per_turn = 2\n")
    assert calls_until_denied(s) is None


@pytest.mark.parametrize("agent", AGENTS)
def test_the_configuration_of_each_events_variables_and_folder_is_its_own(
        agent: str, env: dict[str, str], tmp_path: Path) -> None:
    memo = hook.Memo.new()
    capped = Sender(agent, {**env, "TURNGUARD_MAX_TOOL_CALLS_PER_TURN": "2"}, tmp_path / "a", memo)
    free = Sender(agent, env, tmp_path / "b", memo)
    configured = Sender(agent, env, tmp_path / "c", memo)
    (configured.events.project / "turnguard.toml").write_text("max_tool_calls_per_turn = 4\n")
    for _ in range(2):
        assert calls_until_denied(capped) == 3
        assert calls_until_denied(free) is None
        assert calls_until_denied(configured) == 5


def test_a_bad_configuration_fails_open_every_time_until_it_is_fixed(env: dict[str, str], tmp_path: Path) -> None:
    s = Sender("claude-code", env, tmp_path, hook.Memo.new())
    own = s.events.project / "turnguard.toml"
    own.write_text("max_tool_calls_per_turn = 'many'\n")
    for _ in range(2):
        answer = s.send(s.events.prompt())
        assert answer is not None and answer.exit_code == 0 and answer.stderr.startswith(
            "turnguard hook claude-code: configuration:")
    own.write_text("max_tool_calls_per_turn = 2\n")
    assert calls_until_denied(s) == 3
