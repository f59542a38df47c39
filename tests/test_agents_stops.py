"""A hook turn's end: a stop another hook refuses, and a run that never says its turn ended.

An agent's stop can be refused by another of its hooks (a user's ``Stop`` hook answering
``decision: "block"``): the agent goes on with the same turn, so the counts, a latched halt, the
explicit cap and the cycle cap go on too, and the turn is one line in the recorder, ended once.
A run killed mid-turn (SIGKILL, a CI time limit) sends nothing more: a later hook run of any
session hands its turn to the outbox once it is stale, before any clean could delete it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agent_events import AGENTS, Session, check_halts, is_allow, outbox, outcome_halts, recorded
from turnguard.agents import export, stale
from turnguard.agents.events import id_field
from turnguard.agents.store import SessionStore, state_root

STOP_AT = 8
REFS = ("claude-code", "codex")
"""The agents whose events name their turn: a refused stop's later events carry the same id."""


def exported(env: dict[str, str]) -> list[dict[str, Any]]:
    export.export_outbox(env)
    assert not any(outbox(env).glob("*.json"))
    return recorded(env)


def refused_stop(s: Session) -> None:
    """The agent stops, another hook refuses it, and the agent goes on with the same turn."""
    assert is_allow(s.stop())


def session_file(env: dict[str, str], s: Session) -> Path:
    kept = id_field({"session_id": s.session_id}, "session_id") or ""
    return SessionStore(state_root(env), s.agent).path(kept)


def go_stale(env: dict[str, str], s: Session, age_s: float) -> None:
    """The session untouched for ``age_s``, and no sweep since: the next hook run sweeps."""
    then = time.time() - age_s
    os.utime(session_file(env, s), (then, then))
    (state_root(env) / "hooks" / stale.MARKER).unlink(missing_ok=True)


def another_session_runs(env: dict[str, str], tmp_path: Path, agent: str = "codex") -> None:
    other = Session(agent, env, tmp_path / f"other-{time.monotonic_ns()}")
    assert is_allow(other.start())


# -- a refused stop --------------------------------------------------------------------------------------


@pytest.mark.parametrize("refusals", [0, 1, 2, 3])
@pytest.mark.parametrize("agent", REFS)
def test_identical_failures_halt_at_the_eighth_across_refused_stops(
        agent: str, refusals: int, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    cuts = {3 * (i + 1) for i in range(refusals)}
    for n in range(1, STOP_AT + 1):
        step = s.call("make test", failed=True)
        assert (not all(is_allow(a) for a in step.answers())) == (n == STOP_AT), (n, step)
        if n in cuts:
            refused_stop(s)
    assert outcome_halts(agent, step)
    assert check_halts(agent, s.check("make test")), "no 9th call"
    s.finish()
    (line,) = exported(env)
    assert (line["ended_by"], line["tool_calls"]) == ("streak", STOP_AT)


@pytest.mark.parametrize("refusals", [1, 2, 3])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_halted_turn_stays_halted_after_its_stop_is_refused(
        agent: str, refusals: int, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(STOP_AT):
        s.call("make test", failed=True)
    for _ in range(refusals):
        refused_stop(s)
        if agent == "gemini":  # (no turn id: any event but a prompt is the same turn's)
            assert check_halts(agent, s.send(s.events.pre({"command": "ls"}, None)))
        else:
            assert check_halts(agent, s.check("ls")), "a refused stop does not un-halt"
    s.finish()
    (line,) = exported(env)
    assert line["ended_by"] == "streak"


@pytest.mark.parametrize("refusals", [0, 1, 3])
@pytest.mark.parametrize("agent", AGENTS)
def test_the_explicit_cap_counts_across_refused_stops(agent: str, refusals: int, env: dict[str, str],
                                                       tmp_path: Path) -> None:
    env["TURNGUARD_MAX_TOOL_CALLS_PER_TURN"] = "6"
    s = Session(agent, env, tmp_path)
    s.start()
    for n in range(1, 7):
        assert is_allow(s.call(f"echo {n}", failed=False).pre), n
        if n <= refusals:
            refused_stop(s)
    assert check_halts(agent, s.check("echo 7"))
    s.finish()
    (line,) = exported(env)
    assert (line["ended_by"], line["tool_calls"]) == ("explicit", 7)


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_the_cycle_cap_counts_across_a_refused_stop(agent: str, env: dict[str, str], tmp_path: Path) -> None:
    env["TURNGUARD_MAX_CYCLES_PER_TURN"] = "4"
    s = Session(agent, env, tmp_path)
    s.start()
    for n in range(1, 5):
        s.call(f"echo {n}", failed=False, model_request=True)
        refused_stop(s)
    s.send(s.events.model_request())
    assert check_halts(agent, s.check("echo 5"))
    s.finish()
    (line,) = exported(env)
    assert line["ended_by"] == "cycle_cap"


# -- when a stopped turn ends --------------------------------------------------------------------------


@pytest.mark.parametrize("then", ["prompt", "session_end", "stale"])
@pytest.mark.parametrize("refusals", [0, 2])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_stopped_turn_ends_once_as_it_stopped(agent: str, refusals: int, then: str, env: dict[str, str],
                                                tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    for _ in range(refusals + 1):
        s.call("ls", failed=False)
        s.stop()
    stopped_at = time.time()
    assert exported(env) == [], "a stop may yet be refused: the turn is not handed over at it"
    if then == "prompt":
        s.start()
        s.call("pwd", failed=False)
        s.finish()
    elif then == "session_end":
        s.send(s.events.session_end())
    else:
        go_stale(env, s, stale.STOPPED_STALE_S - 60)
        another_session_runs(env, tmp_path)
        assert exported(env) == [], "not stale yet"
        go_stale(env, s, stale.STOPPED_STALE_S + 1)
        another_session_runs(env, tmp_path)
    lines = [line for line in exported(env) if line["agent"] == agent and line["tool_calls"]]
    first = lines[0]
    assert (first["ended_by"], first["tool_calls"]) == ("completed", refusals + 1)
    assert first["ended_at"] <= stopped_at, "ended at its stop"
    assert len(lines) == (2 if then == "prompt" else 1)
    if then == "prompt":
        assert (lines[1]["ended_by"], lines[1]["tool_calls"]) == ("completed", 1)


@pytest.mark.parametrize("agent", REFS)
def test_a_background_call_of_an_earlier_turn_does_not_take_back_the_stop(
        agent: str, env: dict[str, str], tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    first = s.events.prompt()
    s.send(first)
    s.call("ls", failed=False)
    s.stop()
    s.start()
    s.call("pwd", failed=False)
    s.stop()
    late = {**s.events.pre({"command": "sleep 1"}, s.events.call_id()),
            ("prompt_id" if agent == "claude-code" else "turn_id"): first[
                "prompt_id" if agent == "claude-code" else "turn_id"]}
    assert is_allow(s.send(late))
    s.send(s.events.session_end())
    second = [line for line in exported(env) if line["tool_calls"] == 2]
    assert [line["ended_by"] for line in second] == ["completed"], "counted in the open turn, still stopped"


# -- a run that never sends its turn's end ---------------------------------------------------------------


KILLED_AFTER = ["prompt", "model_request", "pre", "post", "batch", "stop"]


@pytest.mark.parametrize("killed_after", KILLED_AFTER)
@pytest.mark.parametrize("agent", AGENTS)
def test_a_killed_runs_turn_is_handed_over_once_stale(agent: str, killed_after: str, env: dict[str, str],
                                                      tmp_path: Path) -> None:
    s = Session(agent, env, tmp_path)
    s.start()
    s.call("make test", failed=True)
    events: dict[str, Any] = {"prompt": None, "model_request": s.events.model_request(),
                              "pre": s.events.pre({"command": "make test"}, None if agent == "gemini" else "toolu_x")}
    calls = 1
    if killed_after in ("model_request", "pre", "post", "batch"):
        s.send(events["model_request"])
    if killed_after in ("pre", "post", "batch"):
        s.send(events["pre"])
        calls = 2
    if killed_after in ("post", "batch"):
        s.send(s.events.post({"command": "make test"}, None if agent == "gemini" else "toolu_x", failed=True,
                             output="failing"))
    if killed_after == "batch":
        s.send(s.events.batch([(s.events.tool, {"command": "make test"}, "toolu_x", "Exit code 1")]))
    if killed_after == "stop":
        s.stop()
    last_event = time.time()
    bound = stale.STOPPED_STALE_S if killed_after == "stop" else stale.OPEN_STALE_S
    go_stale(env, s, bound - 60)
    another_session_runs(env, tmp_path)
    assert [line for line in exported(env) if line["agent"] == agent] == [], "not stale yet"
    assert SessionStore(state_root(env), agent).clean(now=time.time() + 8 * 24 * 3600) >= 0
    assert session_file(env, s).exists(), "clean never deletes a turn not handed over"
    go_stale(env, s, bound + 1)
    another_session_runs(env, tmp_path, agent="gemini" if agent == "codex" else "codex")
    (line,) = [line for line in exported(env) if line["agent"] == agent]
    assert line["ended_by"] == ("completed" if killed_after == "stop" else "abandoned")
    assert line["tool_calls"] == calls
    assert line["ended_at"] <= last_event, "ended at its last event, not when it was found"
    assert json.loads(session_file(env, s).read_text())["turn"] is None
    another_session_runs(env, tmp_path)
    assert [line for line in exported(env) if line["agent"] == agent] == [line], "handed over once"


def test_a_session_in_use_is_not_swept(env: dict[str, str], tmp_path: Path) -> None:
    s = Session("codex", env, tmp_path)
    s.start()
    go_stale(env, s, stale.OPEN_STALE_S + 1)
    kept = id_field({"session_id": s.session_id}, "session_id") or ""
    with SessionStore(state_root(env), "codex").locked(kept):
        assert stale.sweep(env, force=True) == 0
    assert stale.sweep(env, force=True) == 1


@pytest.mark.parametrize("last_sweep_s", [-2 * 3600.0, -stale.SWEEP_EVERY_S, -1.0, 0.0, 1.0, stale.SWEEP_EVERY_S - 1,
                                          stale.SWEEP_EVERY_S, 2 * 3600.0])
def test_a_sweep_is_due_a_minute_after_the_last_one_whichever_way_the_clock_went(
        last_sweep_s: float, env: dict[str, str], tmp_path: Path) -> None:
    """``last_sweep_s``: how long ago the last sweep began by the clock now; below 0, the clock was
    set back since (NTP, a restored machine): that sweep is no recent one, and holds off none."""
    s = Session("gemini", env, tmp_path)
    s.start()
    now = time.time()
    then = now - stale.OPEN_STALE_S - 1
    os.utime(session_file(env, s), (then, then))
    marker = state_root(env) / "hooks" / stale.MARKER
    swept = now - last_sweep_s
    marker.touch()
    os.utime(marker, (swept, swept))
    due = not 0 <= last_sweep_s < stale.SWEEP_EVERY_S
    assert stale.sweep(env, now=now) == (1 if due else 0)
    assert marker.stat().st_mtime == pytest.approx(now if due else swept, abs=1e-3)


def test_a_sweep_runs_at_most_once_a_minute(env: dict[str, str], tmp_path: Path) -> None:
    s = Session("gemini", env, tmp_path)
    s.start()
    now = time.time()
    assert stale.sweep(env, now=now) == 0
    then = now - stale.OPEN_STALE_S - 1
    os.utime(session_file(env, s), (then, then))
    assert stale.sweep(env, now=now + stale.SWEEP_EVERY_S - 1) == 0
    assert stale.sweep(env, now=now + stale.SWEEP_EVERY_S) == 1
