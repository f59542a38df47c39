"""Codex's sub-agents (``spawn_agent``) in the hook's turn, over the event shapes Codex 0.169 sends.

A sub-agent's events come in its parent's session with its ``agent_id`` and a ``turn_id`` of its
own, its transcript its own: ``SubagentStart``, its task as a ``UserPromptSubmit``, its
``PreModelRequest``/``PreToolUse``/``PostToolUse``, and ``SubagentStop`` in place of ``Stop``.
They run beside the parent's: any interleaving of the two agents' events is one Codex can send
(each agent's own events in their order; a call's ``PostToolUse`` before that agent's next
``PreModelRequest``). Whatever the order, the sub-agent's calls count in the parent's turn, which
neither splits nor ends nor goes on because of them, and a model request settles as refused only
the calls of the agent that makes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_events import Events, Session, check_halts, hook_env, is_allow, recorded
from turnguard.agents import export

AGENT_ID = "01a24f06-9144-7c11-b50e-834ee5502d9d"


def exported(env: dict[str, str]) -> list[dict[str, Any]]:
    export.export_outbox(env)
    return recorded(env)


class SubAgent:
    """A sub-agent of ``parent``'s session: its events as Codex sends them (``agent_id`` on each,
    its own turn id and transcript)."""

    def __init__(self, parent: Session, root: Path) -> None:
        self.parent = parent
        self.events = Events("codex", root, parent.session_id)
        self.events._ids = itertools.count(1001)  # (call ids are unique in a session: Codex's are the model's)

    def _own(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "agent_id": AGENT_ID, "agent_type": "default"}

    def send(self, payload: dict[str, Any]) -> Any:
        return self.parent.send(self._own(payload))

    def lifecycle(self, name: str) -> dict[str, Any]:
        """``SubagentStart`` / ``SubagentStop``, or a ``Stop`` naming the sub-agent."""
        payload = {**self.events.stop(), "hook_event_name": name}
        if name == "SubagentStop":
            payload["agent_transcript_path"] = str(self.events.transcript)
        return payload

    def prompt(self) -> dict[str, Any]:
        return self.events.prompt("SUBTASK: run the checks")


def call_events(events: Events, command: str, *, failed: bool) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """A call's check and its outcome, each built when it is sent (the outcome's transcript record
    is written then, as Codex writes it)."""
    tool_input = {"command": command}
    call_id = events.call_id()
    return (lambda: events.pre(tool_input, call_id),
            lambda: events.post(tool_input, call_id, failed=failed, output="out\n"))


def interleavings(a: list[Any], b: list[Any]) -> list[list[tuple[str, Any]]]:
    """Every merge of ``a`` and ``b`` keeping each one's own order, tagged by whose event it is."""
    merges = []
    for places in itertools.combinations(range(len(a) + len(b)), len(b)):
        left, right = iter(a), iter(b)
        merges.append([("sub", next(right)) if i in places else ("parent", next(left))
                       for i in range(len(a) + len(b))])
    return merges


def run_order(s: Session, sub: SubAgent, order: list[tuple[str, Any]]) -> list[Any]:
    answers = []
    for whose, build in order:
        answers.append(sub.send(build()) if whose == "sub" else s.send(build()))
    return answers


def parent_events(s: Session, spawn: tuple[Callable[[], Any], ...]) -> list[Any]:
    """The parent's events beside the sub-agent's: the spawn call's outcome, then a call of its
    own model step (its stop comes after the sub-agent's work: ``SubagentStop`` is ignored)."""
    return [spawn[1], s.events.model_request, *call_events(s.events, "ls", failed=False)]


def sub_events(sub: SubAgent) -> list[Any]:
    """A sub-agent's work: its task, a failing call of its first model step, its second step."""
    return [sub.prompt, sub.events.model_request, *call_events(sub.events, "make test", failed=True),
            sub.events.model_request]


MERGES = len(interleavings([None] * 4, [None] * 5))


@pytest.mark.parametrize("merge", range(MERGES))
def test_in_any_order_a_sub_agents_calls_count_in_the_parents_one_turn_by_their_own_outcomes(
        merge: int, env: dict[str, str], tmp_path: Path) -> None:
    s = Session("codex", env, tmp_path / "parent")
    sub = SubAgent(s, tmp_path / "sub")
    s.start()
    s.send(s.events.model_request())
    spawn = call_events(s.events, "spawn_agent", failed=False)
    s.send(spawn[0]())
    order = interleavings(parent_events(s, spawn), sub_events(sub))[merge]
    answers = run_order(s, sub, order)
    assert all(is_allow(a) for a in answers), answers
    s.finish()
    (turn,) = exported(env)
    assert (turn["ended_by"], turn["tool_calls"]) == ("completed", 3), [w for w, _ in order]
    assert sorted(c["outcome"] for c in turn["calls"]) == ["error", "ok", "ok"], [w for w, _ in order]
    assert turn["cycles"] == 4


@pytest.mark.parametrize("refused_by", ["parent", "sub"])
@pytest.mark.parametrize("between", ["parent", "sub", "both"])
def test_a_model_request_settles_as_refused_only_its_own_agents_calls(
        refused_by: str, between: str, env: dict[str, str], tmp_path: Path) -> None:
    """A call with no outcome is refused once its own agent asks the model again; the other agent's
    requests before that leave it waiting (its outcome may yet come, or not)."""
    s = Session("codex", env, tmp_path / "parent")
    sub = SubAgent(s, tmp_path / "sub")
    s.start()
    sub.send(sub.prompt())
    agents = {"parent": (s.send, s.events), "sub": (sub.send, sub.events)}
    send, events = agents[refused_by]
    other = "sub" if refused_by == "parent" else "parent"
    send(events.model_request())
    refused = events.call_id()
    send(events.pre({"command": "rm -rf build"}, refused))
    for whose in ([other] if between != "both" else [other, other]):
        other_send, other_events = agents[whose]
        other_send(other_events.model_request())
        for build in call_events(other_events, "pwd", failed=False):
            other_send(build())
    assert [w[2] for w in s.snapshot()["waiting"]] == [refused], "still waiting: its agent has not asked again"
    send(events.model_request())
    assert s.snapshot()["waiting"] == []
    s.finish()
    (turn,) = exported(env)
    others = 1 + (between == "both")
    assert sorted(c["outcome"] for c in turn["calls"]) == ["denied"] + ["ok"] * others


@pytest.mark.parametrize("last_by", ["parent", "sub"])
@pytest.mark.parametrize("sub_calls", [1, 2, 3])
def test_a_sub_agents_calls_count_toward_the_parents_cap_and_its_halt_holds_for_both(
        last_by: str, sub_calls: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "start_exporter", lambda environ: None)
    env = hook_env(tmp_path, TURNGUARD_MAX_TOOL_CALLS_PER_TURN="4")
    s = Session("codex", env, tmp_path / "parent")
    sub = SubAgent(s, tmp_path / "sub")
    s.start()
    sub.send(sub.prompt())
    for n in range(4 - sub_calls):
        assert all(is_allow(s.send(b())) for b in call_events(s.events, f"echo p{n}", failed=False))
    for n in range(sub_calls):
        assert all(is_allow(sub.send(b())) for b in call_events(sub.events, f"echo s{n}", failed=False))
    fifth = (s.send, s.events) if last_by == "parent" else (sub.send, sub.events)
    assert check_halts("codex", fifth[0](fifth[1].pre({"command": "echo 5"}, fifth[1].call_id()))), \
        "the 5th call of the turn, whichever agent makes it, is over the cap of 4"
    assert check_halts("codex", s.send(s.events.pre({"command": "ls"}, s.events.call_id())))
    assert check_halts("codex", sub.send(sub.events.pre({"command": "ls"}, sub.events.call_id())))
    s.finish()
    (turn,) = exported(env)
    assert turn["ended_by"] == "explicit"


@pytest.mark.parametrize("after_stop", ["SubagentStop", "Stop", "call", "model_request"])
def test_a_sub_agents_events_after_the_parents_stop_do_not_take_it_back(
        after_stop: str, env: dict[str, str], tmp_path: Path) -> None:
    """The parent's stop is noted; a sub-agent still at work after it (its stop, a call, a model
    request) counts in the turn, which ends at the session's end as the parent stopped."""
    s = Session("codex", env, tmp_path / "parent")
    sub = SubAgent(s, tmp_path / "sub")
    s.start()
    sub.send(sub.prompt())
    for build in call_events(s.events, "ls", failed=False):
        s.send(build())
    s.stop()
    stopped = s.snapshot()["stopped"]
    if after_stop in ("SubagentStop", "Stop"):
        sub.send(sub.lifecycle(after_stop))
    elif after_stop == "call":
        for build in call_events(sub.events, "make test", failed=True):
            sub.send(build())
    else:
        sub.send(sub.events.model_request())
    assert s.snapshot()["stopped"] == stopped
    s.send(s.events.session_end())
    (turn,) = exported(env)
    assert (turn["ended_by"], turn["tool_calls"]) == ("completed", 1 + (after_stop == "call"))


def test_a_sub_agents_own_stop_does_not_stop_the_parents_turn(env: dict[str, str], tmp_path: Path) -> None:
    """A ``Stop`` naming the sub-agent ends its work only: the parent goes on in the same turn, and
    its next prompt after its own stop opens the next turn."""
    s = Session("codex", env, tmp_path / "parent")
    sub = SubAgent(s, tmp_path / "sub")
    s.start()
    sub.send(sub.prompt())
    sub.send(sub.lifecycle("Stop"))
    assert "stopped" not in s.snapshot()
    for build in call_events(s.events, "ls", failed=False):
        s.send(build())
    s.stop()
    s.start()
    s.finish()
    assert [(t["ended_by"], t["tool_calls"]) for t in exported(env)] == [("completed", 1), ("completed", 0)]


def test_calls_kept_waiting_by_an_earlier_version_are_the_main_agents(env: dict[str, str], tmp_path: Path) -> None:
    """A session's state written before calls said whose they are (three fields) still settles:
    its waiting call is the main agent's, refused at its next model request."""
    from turnguard.agents.store import SessionStore, state_root

    s = Session("codex", env, tmp_path)
    s.start()
    s.send(s.events.model_request())
    s.send(s.events.pre({"command": "rm -rf build"}, s.events.call_id()))
    with SessionStore(state_root(env), "codex").locked(s.session_id) as session:
        session.data["waiting"] = [w[:3] for w in session.data["waiting"]]
        session.save()
    s.send(s.events.model_request())
    assert s.snapshot()["waiting"] == []
    s.finish()
    (turn,) = exported(env)
    assert [c["outcome"] for c in turn["calls"]] == ["denied"]
