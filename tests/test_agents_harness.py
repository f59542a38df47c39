"""The end-to-end harness itself (``tests/coding_agents``): the scripted model server speaks each
agent's wire format well enough that the real CLIs run its calls, hand the results back and end
with its text; and a missing CLI fails under CI instead of skipping."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from coding_agents import clis
from coding_agents.model_server import EXHAUSTED, SHELL_TOOLS, Agent, ModelRequest, ModelServer, Reply, shell

AGENTS: tuple[Agent, ...] = ("claude", "codex", "gemini")
PRE_TOOL = {"claude": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}


def post(server: ModelServer, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize("agent", AGENTS)
def test_the_agent_runs_the_scripted_calls_and_ends_with_the_scripted_text(agent: Agent, tmp_path: Path) -> None:
    clis.require(agent)
    project = tmp_path / "project"
    project.mkdir()
    log = tmp_path / "events.jsonl"

    line = f"echo line >> {project / 'calls.txt'}"
    replies: list[Reply] = [[shell(agent, line)], [shell(agent, line), shell(agent, line)], f"finished {agent}"]

    def script(request: ModelRequest) -> Reply:
        return replies[min(request.step, 2)]

    hooks = clis.command_hooks(clis.logging_hook(log), [PRE_TOOL[agent]])
    with ModelServer(script) as server:
        run = clis.run(agent, project, server.url, "Run the scripted commands.", hooks=hooks, timeout=90)
    assert run.returncode == 0, run.describe()
    assert (project / "calls.txt").read_text().splitlines() == ["line"] * 3, run.describe()
    assert run.text == f"finished {agent}", run.describe()
    assert run.session_id
    requests = server.main_requests
    assert [r.step for r in requests] == [0, 1, 2]
    assert [len(r.tool_results()) for r in requests] == [0, 1, 2]
    assert SHELL_TOOLS[agent][0] in requests[0].tool_names()
    assert "Run the scripted commands." in requests[0].user_text()
    assert server.errors == []
    events = clis.logged_events(log)
    assert [e["hook_event_name"] for e in events] == [PRE_TOOL[agent]] * 3
    assert all(e["session_id"] == run.session_id for e in events)


def test_side_requests_do_not_consume_the_script_and_an_exhausted_script_ends_the_run() -> None:
    with ModelServer([[shell("claude", "true")]]) as server:
        status, _ = post(server, "/v1/messages", {"messages": [], "stream": False})  # no tools: a side request
        assert status == 200
        status, body = post(server, "/v1/messages", {"messages": [], "tools": [{"name": "Bash"}], "stream": False})
        assert json.loads(body)["content"][0]["input"] == {"command": "true"}
        _, body = post(server, "/v1/messages", {"messages": [], "tools": [{"name": "Bash"}], "stream": False})
        assert json.loads(body)["content"] == [{"type": "text", "text": EXHAUSTED}]
    assert [(r.main, r.index) for r in server.requests] == [(False, -1), (True, 0), (True, 1)]


def test_gemini_side_requests_get_an_object_their_schema_accepts() -> None:
    schema = {"type": "OBJECT", "required": ["complexity_reasoning", "complexity_score"],
              "properties": {"complexity_reasoning": {"type": "STRING"}, "complexity_score": {"type": "INTEGER"}}}
    with ModelServer([]) as server:
        _, body = post(server, "/v1beta/models/m:generateContent",
                       {"contents": [], "generationConfig": {"responseJsonSchema": schema}})
    text = json.loads(body)["candidates"][0]["content"]["parts"][0]["text"]
    assert json.loads(text) == {"complexity_reasoning": "ok", "complexity_score": 1}


def test_a_failing_script_answers_400_and_is_recorded() -> None:
    def script(request: ModelRequest) -> Reply:
        raise ValueError("no reply scripted")

    with ModelServer(script) as server:
        status, _ = post(server, "/v1/responses", {"input": [], "tools": [{"name": "exec_command"}]})
    assert status == 400
    assert "no reply scripted" in server.errors[0]


@pytest.mark.parametrize("ci", ["", "1"])
def test_a_missing_cli_skips_locally_and_fails_under_ci(ci: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_AGENTS_DIR", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="not installed"):
        clis.require("codex")
