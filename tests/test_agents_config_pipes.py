"""Every hook event of the three coding agents, with ``TURNGUARD_CONFIG`` naming a pipe
(``config_pipes``): the hook reads a pipe that ends like a file; for one that gave no end within
``PIPE_WAIT_SECONDS`` it allows the event, saying why in one line. It never blocks its agent."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agent_events import AGENTS, Events, hook_env, hook_process
from config_pipes import PIPE_KINDS, SAYS_WHEN_NOT_READ, given_pipe

EVENTS: dict[str, Callable[[Events], dict[str, Any] | None]] = {
    "prompt": lambda e: e.prompt(),
    "model request": lambda e: e.model_request(),
    "tool check": lambda e: e.pre({"command": "ls"}, e.call_id()),
    "tool outcome": lambda e: e.post({"command": "ls"}, e.call_id(), failed=True, output="no"),
    "tool batch": lambda e: e.batch([("Bash", {"command": "ls"}, "toolu_0001", "ok")]),
    "stop": lambda e: e.stop(),
    "session end": lambda e: e.session_end(),
}
"""Each kind of event an agent sends its hook."""
NOT_SENT = {("claude-code", "model request"), ("codex", "tool batch"), ("gemini", "tool batch")}
"""The kinds an agent has no event of."""
CASES = [(agent, event) for agent in AGENTS for event in EVENTS if (agent, event) not in NOT_SENT]


@pytest.mark.parametrize("kind", list(PIPE_KINDS))
@pytest.mark.parametrize(("agent", "event"), CASES, ids=[f"{a}-{e}" for a, e in CASES])
def test_every_hook_event_reads_a_piped_configuration_or_allows_within_the_bound_saying_why(
        agent, event, kind, tmp_path):
    events = Events(agent, tmp_path)
    events.prompt()
    payload = EVENTS[event](events)
    with given_pipe(kind, tmp_path, b"soft_cap = 7\n") as pipe:
        done = hook_process(agent, json.dumps(payload).encode(), hook_env(tmp_path, TURNGUARD_CONFIG=pipe.path),
                            pass_fds=pipe.pass_fds)
    stderr = done.stderr.decode()
    assert (done.returncode, json.loads(done.stdout)) == (0, {}), stderr
    if PIPE_KINDS[kind]:
        assert stderr == "", stderr
    else:
        line, = stderr.splitlines()
        assert line.startswith(f"turnguard hook {agent}: configuration: {pipe.path}: {SAYS_WHEN_NOT_READ[kind]}")
        assert line.endswith("; allowed"), line
