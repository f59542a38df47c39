"""A session's state stays small whatever an agent's events carry, so a hook never fails open on it.

The state (``turnguard.agents.store``) is refused past ``MAX_STATE_BYTES``, and then every event of
the session is allowed unguarded: a loop runs on. So no field of an event the state keeps may grow
it: ids and names stand as a digest past ``MAX_ID_LENGTH``, a call's input as a digest (a call the
agent names by no id waits for its outcome by it), a result as a digest, the working directory only
as a folder that exists. Each case sends one field at megabytes to ``PARALLEL`` calls left waiting
for their outcome, each with an input of megabytes (together far past the state's bound), then a
stuck loop beside them: the loop halts at the streak's stop as under small fields, every call
counts, nothing fails, and the state stays under ``STATE_BOUND``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_events import AGENTS, Session, Step, check_halts, is_allow, outcome_halts
from turnguard.agents import hook
from turnguard.agents.events import MAX_STDIN_BYTES
from turnguard.agents.store import MAX_STATE_BYTES

STOP_AT = 8
PARALLEL = 8
INPUT_SIZE = 2_500_000
HUGE = "h" * 3_000_000
LONG_ID = "i" * 200_000
"""A session's or turn's id far past ``MAX_ID_LENGTH``, yet short enough that Codex's transcript
records naming it fit the part of the transcript the hook reads (``codex.TRANSCRIPT_LIMIT``)."""
STATE_BOUND = 64 * 1024
"""What the state of these sessions must stay under: a few kilobytes per waiting call at most."""

FIELDS: dict[str, tuple[str, ...]] = {
    "tool_input": AGENTS,  # each waiting call named by no id (Gemini CLI never sends one)
    "tool_name": AGENTS,
    "call_id": ("claude-code", "codex"),
    "session_id": AGENTS,
    "turn_ref": ("claude-code", "codex"),
    "cwd": AGENTS,
    "result": AGENTS,
    "thread": ("codex",),
}
"""Each field of an event the state keeps (or might), and the agents that send it."""
CASES = [(agent, name) for name, agents in FIELDS.items() for agent in agents]


class HostileSession(Session):
    """A session whose every event carries a working directory of megabytes (``cwd``)."""

    def __init__(self, agent: str, env: dict[str, str], root: Path, field: str) -> None:
        super().__init__(agent, env, root, session_id=LONG_ID if field == "session_id" else "")
        self.field = field

    def send(self, payload: Any) -> Any:
        if payload is not None and self.field == "cwd":
            payload = {**payload, "cwd": HUGE}
        return super().send(payload)


def waiting_check(s: HostileSession, n: int) -> Any:
    """The check of the ``n``-th call of a parallel step whose outcomes have not come: an input of
    megabytes, and the case's field at megabytes."""
    call_id = s.events.call_id()
    if s.field == "call_id":
        call_id = f"{HUGE}{n}"
    tool = f"{HUGE}{n}" if s.field == "tool_name" else "write_file"
    payload = s.events.pre({"file_path": f"f{n}.txt", "content": str(n % 10) * INPUT_SIZE}, call_id, tool)
    if s.field == "tool_input":
        payload.pop("tool_use_id", None)
    if s.field == "thread":
        payload["agent_id"] = HUGE
    return s.send(payload)


def failing_call(s: HostileSession) -> Step:
    """One call of the stuck loop: the same failing command, its result of megabytes (``result``)."""
    tool_input = {"command": "make test"}
    call_id = s.events.call_id()
    step = Step(s.send(s.events.pre(tool_input, call_id)))
    post = s.events.post(tool_input, call_id, failed=True, output="failing")
    if s.field == "result":
        if s.agent == "claude-code":
            post["error"] = HUGE
        elif s.agent == "codex":
            post["tool_response"] = HUGE
        else:
            post["tool_response"]["returnDisplay"] = HUGE
    step.post = s.send(post)
    step.batch = s.send(s.events.batch([(s.events.tool, tool_input, call_id, "Exit code 1\nfailing")]))
    return step


@pytest.mark.parametrize(("agent", "field"), CASES)
def test_no_field_of_any_size_grows_the_state_and_a_loop_beside_waiting_calls_halts(
        agent: str, field: str, env: dict[str, str], tmp_path: Path) -> None:
    assert PARALLEL * INPUT_SIZE > MAX_STATE_BYTES and len(HUGE) + INPUT_SIZE < MAX_STDIN_BYTES
    s = HostileSession(agent, env, tmp_path, field)
    assert is_allow(s.start(turn_id=LONG_ID if field == "turn_ref" else None))
    for n in range(PARALLEL):
        assert is_allow(waiting_check(s, n)), n
    for n in range(1, STOP_AT):
        assert all(is_allow(a) for a in failing_call(s).answers()), n
    assert outcome_halts(agent, failing_call(s)), "the streak's stop, as under small fields"
    assert s.tool_calls() == PARALLEL + STOP_AT
    assert len(s.snapshot()["waiting"]) == PARALLEL
    assert check_halts(agent, s.check("make test")), "a halted turn denies every later call"
    files = list((tmp_path / "state").rglob("*.json"))
    assert files and max(f.stat().st_size for f in files) < STATE_BOUND
    assert not (tmp_path / "state" / "hooks" / "errors.log").exists()


@pytest.mark.parametrize("agent", AGENTS)
def test_calls_waiting_past_the_bound_give_up_the_oldest_and_the_latest_still_settle(
        agent: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More parallel calls without an outcome than ``MAX_WAITING`` (made small here): the state
    keeps the latest ``MAX_WAITING``, every call counts, and a late outcome of the latest one
    (Gemini CLI's, by its input alone) still finds its check: it leaves the list and counts."""
    bound = 16
    monkeypatch.setattr(hook, "MAX_WAITING", bound)
    s = Session(agent, env, tmp_path)
    s.start()
    inputs = [{"command": f"cat part-{n}.txt"} for n in range(bound + 20)]
    ids = [s.events.call_id() for _ in inputs]
    for tool_input, call_id in zip(inputs, ids, strict=True):
        assert is_allow(s.send(s.events.pre(tool_input, call_id)))
    assert len(s.snapshot()["waiting"]) == bound
    assert s.tool_calls() == bound + 20
    s.send(s.events.post(inputs[-1], ids[-1], failed=True))
    after = s.snapshot()
    assert len(after["waiting"]) == bound - 1
    assert after["turn"]["facts"]["outcomes"]["error"] == 1
