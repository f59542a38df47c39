"""LangChain end to end: a real ``create_agent`` graph driven by a fake chat model, with the middleware."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from conftest import (
    POLLING,
    POLLS,
    STOPPED_AT_THE_EIGHTH_FAILURE,
    CallOutcomes,
    assert_polled,
    cancel_once_started,
    ci_statuses,
    optional_dependency,
    wait_forever,
)

optional_dependency("langchain.agents")

from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import ModelRetryMiddleware, ToolRetryMiddleware  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import ToolException, tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.errors import GraphRecursionError  # noqa: E402
from langgraph.types import Command  # noqa: E402

import turnguard as tg  # noqa: E402
from turnguard.integrations.langchain import TurnGuardHalted, TurnGuardMiddleware  # noqa: E402

LIMIT = {"recursion_limit": 1000}
"""LangGraph's own superstep budget, raised so that turnguard is what stops these runs."""


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's fake chat model, accepting the tools ``create_agent`` binds (they are scripted)."""

    def bind_tools(self, tools, **kwargs):
        return self


def call(name: str, args: dict, i: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}", "type": "tool_call"}])


def calls_then_done(calls: list[tuple[str, dict]]) -> ToolCallingFakeModel:
    return ToolCallingFakeModel(messages=iter([*(call(n, a, i) for i, (n, a) in enumerate(calls)), AIMessage("done")]))


def forever(name: str, args: dict) -> ToolCallingFakeModel:
    return ToolCallingFakeModel(messages=(call(name, args, i) for i in itertools.count()))


@pytest.fixture
def ran() -> list:
    return []


@pytest.fixture
def tools(ran):
    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        if path.startswith("missing"):
            raise ToolException(f"{path}: no such file")
        return f"contents of {path}"

    read_file.handle_tool_error = True
    return [read_file]


def ask_user(prompt: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}]}


def test_unattended_identical_failing_calls_stop_at_the_eighth_and_the_ninth_never_runs(ran, tools):
    stuck = forever("read_file", {"path": "missing.py"})
    agent = create_agent(stuck, tools, middleware=[TurnGuardMiddleware(tg.Guard())])
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.invoke(ask_user("read it"), LIMIT)
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert "streak" in str(stopped.value) and "8 failing" in str(stopped.value)


def test_the_async_graph_is_stopped_the_same_way(ran, tools):
    stuck = forever("read_file", {"path": "missing.py"})
    agent = create_agent(stuck, tools, middleware=[TurnGuardMiddleware(tg.Guard())])
    with pytest.raises(TurnGuardHalted):
        asyncio.run(agent.ainvoke(ask_user("read it"), LIMIT))
    assert len(ran) == 8


def test_one_hundred_fifty_distinct_calls_complete_under_the_adaptive_cap(ran, tools):
    model = calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(tg.Guard())])
    state = agent.invoke(ask_user("read them"), LIMIT)
    assert state["messages"][-1].content == "done"
    assert len(ran) == 150


def test_explicit_cap_of_one_hundred_halts_call_one_hundred_one_before_its_body_runs(ran, tools):
    model = calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(guard)])
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.invoke(ask_user("read them"), LIMIT)
    assert len(ran) == 100
    assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert "explicit" in str(stopped.value) and "101 tool calls" in str(stopped.value)


def test_exit_behavior_end_answers_the_halted_call_and_ends_with_a_message(ran, tools):
    model = calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(guard, exit_behavior="end")])
    state = agent.invoke(ask_user("read them"), LIMIT)
    assert len(ran) == 100
    refused, final = state["messages"][-2:]
    assert isinstance(refused, ToolMessage) and refused.status == "error" and refused.tool_call_id == "call-100"
    assert isinstance(final, AIMessage) and "threshold explicit (stop, limit 100)" in final.content


def test_attended_run_asks_the_callback_and_continue_lets_it_go_on(ran, tools):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict)
        return "continue"

    model = calls_then_done([("read_file", {"path": "a.py"})] * 7)
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(tg.Guard(), ask=ask)])
    assert agent.invoke(ask_user("poll a.py"), LIMIT)["messages"][-1].content == "done"
    assert len(ran) == 7
    assert [(v.threshold, v.event.level, v.event.streak_length) for v in asked] == [
        (tg.Threshold.STREAK, tg.Level.WARN, 5)
    ]


def test_attended_run_reaches_the_user_through_a_langgraph_interrupt_and_resumes(ran, tools):
    model = calls_then_done([("read_file", {"path": "a.py"})] * 7)
    agent = create_agent(
        model, tools, middleware=[TurnGuardMiddleware(tg.Guard(), ask="interrupt")], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "t1"}, **LIMIT}
    paused = agent.invoke(ask_user("poll a.py"), config)
    (pending,) = paused["__interrupt__"]
    assert pending.value["turnguard"]["threshold"] == "streak" and pending.value["turnguard"]["level"] == "warn"
    assert len(ran) == 4  # the fifth identical call waits for the user
    state = agent.invoke(Command(resume="continue"), config)
    assert state["messages"][-1].content == "done"
    assert len(ran) == 7


def test_interrupt_answered_stop_refuses_the_call_and_halts(ran, tools):
    model = calls_then_done([("read_file", {"path": "a.py"})] * 7)
    agent = create_agent(
        model, tools, middleware=[TurnGuardMiddleware(tg.Guard(), ask="interrupt")], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "t2"}, **LIMIT}
    agent.invoke(ask_user("poll a.py"), config)
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        agent.invoke(Command(resume={"answer": "stop"}), config)
    assert len(ran) == 4


def test_the_example_stops_a_model_stuck_on_a_missing_file_and_prints_why(run_example):
    printed = run_example("langchain_agent", model=forever("read_file", {"path": "missing.py"}))
    assert printed.startswith(STOPPED_AT_THE_EIGHTH_FAILURE) and "8 failing" in printed


def test_the_example_completes_a_long_productive_turn_past_langgraphs_recursion_limit(run_example):
    """150 tool rounds, 300 graph steps: LangGraph's default ``recursion_limit=25`` would have stopped it."""
    model = calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    assert run_example("langchain_agent", model=model) == "done\n"


def test_the_runs_spans_and_loop_detected_events_are_recorded(ran, tools, otel):
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100), **otel.providers())
    model = calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(guard)], name="coder")
    with pytest.raises(TurnGuardHalted):
        agent.invoke(ask_user("read them"), {"configurable": {"thread_id": "th-9"}, **LIMIT})

    turn_span = otel.span("invoke_agent coder")
    assert turn_span.attributes["turnguard.turn.outcome"] == "halted"
    assert turn_span.attributes["turnguard.turn.tool_calls"] == 101
    assert turn_span.attributes["gen_ai.conversation.id"] == "th-9"
    tool_spans = [s for s in otel.spans() if s.name == "execute_tool read_file"]
    assert len(tool_spans) == 101  # the 101st is checked and halted; its body never ran
    assert tool_spans[-1].attributes["turnguard.verdict.action"] == "halt"

    (record,) = otel.logs("turnguard.loop_detected")
    assert record.attributes["turnguard.loop.threshold"] == "explicit"
    assert record.attributes["turnguard.loop.limit"] == 100
    assert record.span_id == tool_spans[-1].context.span_id


def test_remind_model_appends_the_reminder_to_the_fifth_identical_tool_message(ran, tools):
    model = calls_then_done([("read_file", {"path": "a.py"})] * 6)
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(tg.Guard(tg.GuardConfig(remind_model=True)))])
    state = agent.invoke(ask_user("poll"), LIMIT)
    contents = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [("[turnguard] You have called read_file 5 times" in c) for c in contents] == [False] * 4 + [True, False]


def test_exit_behavior_end_after_the_eighth_failure_ends_before_the_next_model_request(ran, tools):
    stuck = forever("read_file", {"path": "missing.py"})
    agent = create_agent(stuck, tools, middleware=[TurnGuardMiddleware(tg.Guard(), exit_behavior="end")])
    state = agent.invoke(ask_user("read it"), LIMIT)
    assert len(ran) == 8
    assert "threshold streak (stop, limit 8)" in state["messages"][-1].content
    assert sum(isinstance(m, ToolMessage) for m in state["messages"]) == 8


def test_an_unknown_exit_behavior_is_refused_with_the_accepted_values():
    with pytest.raises(ValueError, match="'error' or 'end'"):
        TurnGuardMiddleware(tg.Guard(), exit_behavior="raise")


def test_an_ask_that_is_neither_a_callback_nor_interrupt_is_refused():
    with pytest.raises(ValueError, match="'interupt'"):
        TurnGuardMiddleware(tg.Guard(), ask="interupt")


def test_an_attended_stop_after_the_eighth_failure_interrupts_before_the_next_model_request(ran, tools):
    model = calls_then_done([("read_file", {"path": "missing.py"})] * 10)
    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    middleware = [TurnGuardMiddleware(guard, ask="interrupt")]
    agent = create_agent(model, tools, middleware=middleware, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t3"}, **LIMIT}
    paused = agent.invoke(ask_user("read it"), config)
    (pending,) = paused["__interrupt__"]
    assert pending.value["turnguard"]["level"] == "stop" and len(ran) == 8
    state = agent.invoke(Command(resume="continue"), config)  # the user lets it try again
    assert state["messages"][-1].content == "done"
    assert len(ran) == 10  # the eighth ran once: resuming did not re-run the tool node


# -- the turn ends on every exit path ----------------------------------------------------------


def watched(model, tools, guard: tg.Guard, **options):
    middleware = TurnGuardMiddleware(guard)
    return middleware.watch(create_agent(model, tools, middleware=[middleware], **options))


def test_a_tool_that_raises_with_no_error_handler_ends_the_turn_with_error(ran, turn_ends):
    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        raise OSError(f"{path}: disk gone")

    agent = watched(calls_then_done([("read_file", {"path": "a.py"})]), [read_file], turn_ends.guard())
    with pytest.raises(OSError, match="disk gone"):
        agent.invoke(ask_user("read it"), LIMIT)
    summary = turn_ends.assert_ended("error")
    assert summary.tool_calls == 1 and ran == ["a.py"]


def test_a_cancelled_async_run_ends_the_turn_as_cancelled(turn_ends):
    async def start(started):
        @tool
        async def wait_for_input(prompt: str) -> str:
            """Wait for the user."""
            return await wait_forever(started)

        agent = watched(calls_then_done([("wait_for_input", {"prompt": "?"})]), [wait_for_input], turn_ends.guard())
        return await agent.ainvoke(ask_user("go"), LIMIT)

    cancel_once_started(start)
    turn_ends.assert_ended("cancelled")


def test_langgraphs_own_recursion_limit_ends_the_turn_with_error(tools, turn_ends):
    agent = watched(forever("read_file", {"path": "f.py"}), tools, turn_ends.guard())
    with pytest.raises(GraphRecursionError):
        agent.invoke(ask_user("read it"), {"recursion_limit": 6})
    turn_ends.assert_ended("error")


def test_an_interrupt_does_not_end_the_turn_and_the_resume_ends_it_once(ran, tools, turn_ends):
    middleware = TurnGuardMiddleware(turn_ends.guard(), ask="interrupt")
    model = calls_then_done([("read_file", {"path": "a.py"})] * 7)
    agent = middleware.watch(create_agent(model, tools, middleware=[middleware], checkpointer=InMemorySaver()))
    config = {"configurable": {"thread_id": "t-end"}, **LIMIT}
    assert agent.invoke(ask_user("poll a.py"), config)["__interrupt__"]
    assert turn_ends.summaries == []
    agent.invoke(Command(resume="continue"), config)
    turn_ends.assert_ended("completed")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tool_that_raises_with_no_error_handler_ends_the_turn_without_watch(ran, turn_ends, mode):
    """The documented basic setup (no ``watch``): the exception passes through the middleware's own
    tool wrapper, which ends the turn."""

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        raise OSError(f"{path}: disk gone")

    model = calls_then_done([("read_file", {"path": "a.py"})])
    agent = create_agent(model, [read_file], middleware=[TurnGuardMiddleware(turn_ends.guard())])
    with pytest.raises(OSError, match="disk gone"):
        invoke(agent, ask_user("read it"), LIMIT, mode=mode)
    summary = turn_ends.assert_ended("error")
    assert summary.tool_calls == 1 and ran == ["a.py"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tool_error_a_middleware_outside_recovers_keeps_the_turn_open_and_guarded(ran, turn_ends, mode):
    """``ToolRetryMiddleware`` outside turnguard's wrapper catches the tool's exception and retries
    it (then answers with an error message): the run goes on, so the turn does too, and counts
    each retry; the streak stops the identical failing retries at the eighth, and the halt is not
    swallowed by the retrying middleware either."""
    from langchain.agents.middleware import ToolRetryMiddleware

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        raise OSError(f"{path}: disk gone")

    middleware = [ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False), TurnGuardMiddleware(
        turn_ends.guard())]
    agent = create_agent(forever("read_file", {"path": "a.py"}), [read_file], middleware=middleware)
    with pytest.raises(TurnGuardHalted) as stopped:
        invoke(agent, ask_user("read it"), LIMIT, mode=mode)
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert len(ran) == 8
    summary = turn_ends.assert_ended("halted")
    assert summary.tool_calls == 8


class UnreachableAfter(ToolCallingFakeModel):
    """The fake chat model, whose provider goes away after ``answers`` responses."""

    answers: int = 1

    def _generate(self, *args, **kwargs):
        if self.answers <= 0:
            raise ConnectionError("the model is unreachable")
        self.answers -= 1
        return super()._generate(*args, **kwargs)

    async def _agenerate(self, *args, **kwargs):
        return self._generate(*args, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_model_that_raises_ends_the_turn_with_error_without_watch(ran, tools, turn_ends, mode):
    model = UnreachableAfter(messages=iter([call("read_file", {"path": "a.py"}, 0), AIMessage("done")]))
    agent = create_agent(model, tools, middleware=[TurnGuardMiddleware(turn_ends.guard())])
    with pytest.raises(ConnectionError):
        invoke(agent, ask_user("read it"), LIMIT, mode=mode)
    assert turn_ends.assert_ended("error").tool_calls == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_model_error_a_middleware_outside_recovers_keeps_the_turn_going(ran, tools, turn_ends, mode):
    """``ModelRetryMiddleware`` outside turnguard's model wrapper answers the failed request with a
    message of its own: the run completes, and the turn with it, once."""
    from langchain.agents.middleware import ModelRetryMiddleware

    model = UnreachableAfter(messages=iter([call("read_file", {"path": "a.py"}, 0), AIMessage("done")]))
    retry = ModelRetryMiddleware(max_retries=1, initial_delay=0, jitter=False)
    agent = create_agent(model, tools, middleware=[retry, TurnGuardMiddleware(turn_ends.guard())])
    state = invoke(agent, ask_user("read it"), LIMIT, mode=mode)
    assert "failed" in state["messages"][-1].content
    assert turn_ends.assert_ended("completed").tool_calls == 1


def invoke(agent, payload, config, *, mode: str):
    """``agent.invoke`` or, with ``mode="async"``, ``agent.ainvoke`` run to its end."""
    if mode == "async":
        return asyncio.run(agent.ainvoke(payload, config))
    return agent.invoke(payload, config)


# -- identical calls in one response (the core's rule for a parallel batch) ----------------------


def one_batch(name: str, args: dict, n: int) -> ToolCallingFakeModel:
    calls = [{"name": name, "args": args, "id": f"call-{k}", "type": "tool_call"} for k in range(n)]
    return ToolCallingFakeModel(messages=iter([AIMessage(content="", tool_calls=calls), AIMessage("done")]))


def test_of_ten_identical_failing_calls_in_one_response_at_most_eight_run_unattended(ran, tools):
    agent = create_agent(
        one_batch("read_file", {"path": "missing.py"}, 10), tools, middleware=[TurnGuardMiddleware(tg.Guard())]
    )
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.invoke(ask_user("read it"), LIMIT)
    assert len(ran) <= 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK


def test_ten_identical_calls_in_one_attended_response_ask_the_stop_level_once(ran, tools):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict.event.level)
        return "continue"

    middleware = TurnGuardMiddleware(tg.Guard(tg.GuardConfig(streak_warn_at=0)), ask=ask)
    agent = create_agent(one_batch("read_file", {"path": "missing.py"}, 10), tools, middleware=[middleware])
    agent.invoke(ask_user("read it"), LIMIT)
    assert asked == [tg.Level.STOP]


# -- a turn that survives the process: LangGraph's SQLite checkpointer, two processes -----------

RESUMABLE_AGENT = '''
import json, sys
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
import turnguard as tg
from turnguard.integrations.langchain import TurnGuardHalted, TurnGuardMiddleware


class Model(GenericFakeChatModel):
    def bind_tools(self, tools, **kwargs):
        return self


phase, db, shape = sys.argv[1], sys.argv[2], sys.argv[3]
first = 0 if phase == "start" else 5  # the model's script goes on where the first process left it
calls = [{"name": "read_file", "args": {"path": "missing.py"}, "id": f"call-{i}", "type": "tool_call"}
         for i in range(first, 30)]
if shape == "batch":  # one response of 10 identical calls (the first process's, resumed by the second)
    responses = [AIMessage(content="", tool_calls=calls[:10])] if phase == "start" else [AIMessage("done")]
else:
    responses = [AIMessage(content="", tool_calls=[c]) for c in calls]
model = Model(messages=iter(responses))
ran = []


@tool
def read_file(path: str) -> str:
    """Read a file."""
    ran.append(path)
    raise ToolException(f"{path}: no such file")


read_file.handle_tool_error = True
config = tg.GuardConfig(max_tool_calls_per_turn=7,  # the defaults otherwise: no key shared by the processes
                        disable_plugins=("otel", "recorder", "shadow"), load_entrypoints=False)
exit_behavior = "end" if shape == "batch" else "error"
ended = []


class Ends:
    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary):
        ended.append(summary.reason)


guard = tg.Guard(config, environ={})
guard.register(Ends(), "ends")
middleware = TurnGuardMiddleware(guard, ask="interrupt", exit_behavior=exit_behavior)
with SqliteSaver.from_conn_string(db) as saver:
    agent = middleware.watch(create_agent(model, [read_file], middleware=[middleware], checkpointer=saver))
    thread = {"configurable": {"thread_id": "t-1"}, "recursion_limit": 1000}
    start = {"messages": [{"role": "user", "content": "read it"}]}
    try:
        out = agent.invoke(start if phase == "start" else Command(resume="continue"), thread)
        print(json.dumps({"ran": len(ran), "asked": [i.value["turnguard"] for i in out.get("__interrupt__", [])],
                          "last": out["messages"][-1].content, "ended": ended}))
    except TurnGuardHalted as stop:
        print(json.dumps({"ran": len(ran), "halted": str(stop), "ended": ended}))
'''


@pytest.fixture
def two_processes(tmp_path):
    """``run(phase, shape)``: a phase of ``RESUMABLE_AGENT`` in a fresh Python process, the
    checkpoints in one SQLite file."""
    optional_dependency("langgraph.checkpoint.sqlite")
    program, db = tmp_path / "agent.py", tmp_path / "checkpoints.sqlite"
    program.write_text(RESUMABLE_AGENT, encoding="utf-8")

    def run(phase: str, shape: str = "serial") -> dict:
        command = [sys.executable, str(program), phase, str(db), shape]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def test_a_turn_interrupted_for_an_ask_goes_on_in_a_fresh_process_with_the_same_checkpointer(two_processes):
    """Process 1 runs 4 failing calls and is interrupted at the 5th (the warn level); process 2
    resumes the thread with ``Command(resume="continue")``: the resumed turn still holds the first
    4 calls, so the explicit cap of 7 stops the 8th call of the turn after 3 more, not 7. Neither
    process shares a key with the other (the turn is durable), and only the second reports it."""
    run = two_processes
    first = run("start")
    assert first["ran"] == 4 and first["ended"] == []  # paused: not reported by the first process
    assert [(a["threshold"], a["level"]) for a in first["asked"]] == [("streak", "warn")]
    second = run("resume")
    assert second["ran"] == 3  # call 5 (answered "continue"), 6 and 7
    assert "threshold explicit (stop, limit 7); 8 tool calls" in second["halted"]
    assert second["ended"] == ["halted"]  # the process that finished the turn reported it, once


# -- parallel calls with ask="interrupt": one step, many tool messages --------------------------


def batches(per_response: int, responses: int) -> ToolCallingFakeModel:
    """``responses`` model responses of ``per_response`` distinct calls each, then "done"."""
    messages = []
    for r in range(responses):
        calls = [{"name": "read_file", "args": {"path": f"f{r}-{k}.py"}, "id": f"call-{r}-{k}", "type": "tool_call"}
                 for k in range(per_response)]
        messages.append(AIMessage(content="", tool_calls=calls))
    return ToolCallingFakeModel(messages=iter([*messages, AIMessage("done")]))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("per_response", [2, 3, 10])
def test_parallel_calls_with_interrupt_write_one_snapshot_per_step(ran, tools, per_response, mode):
    """Each tool message of a parallel batch carries the turn's snapshot; LangGraph takes the
    newest of them (the state key's reducer) instead of refusing two values in one step."""
    middleware = TurnGuardMiddleware(tg.Guard(), ask="interrupt")
    agent = create_agent(batches(per_response, 3), tools, middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"p-{per_response}-{mode}"}, **LIMIT}
    state = invoke(agent, ask_user("read them"), config, mode=mode)
    assert state["messages"][-1].content == "done"
    assert len(ran) == 3 * per_response
    assert "turnguard_snapshot" not in state  # private: kept by the checkpointer, not output
    kept = agent.get_state(config).values["turnguard_snapshot"]
    assert kept["facts"]["seq"] == 3 * per_response  # the snapshot after the last batch's last call


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("per_response", [2, 3, 10])
def test_a_question_in_a_parallel_batch_pauses_it_once_and_the_answer_resumes_it(ran, tools, per_response, mode):
    """Identical calls in one response: the fifth asks. The batch pauses on one interrupt (where an
    interrupt per tool call would leave LangGraph several, which one resume value cannot answer),
    none of it runs while the user is asked, and "continue" runs all of it."""
    agent = create_agent(one_batch("read_file", {"path": "a.py"}, per_response), tools,
                         middleware=[TurnGuardMiddleware(tg.Guard(), ask="interrupt")], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"q-{per_response}-{mode}"}, **LIMIT}
    paused = invoke(agent, ask_user("poll a.py"), config, mode=mode)
    if per_response < 5:  # no question: the batch ran
        assert "__interrupt__" not in paused and len(ran) == per_response
        return
    (pending,) = paused["__interrupt__"]
    assert pending.value["turnguard"]["level"] == "warn" and ran == []
    state = invoke(agent, Command(resume="continue"), config, mode=mode)
    while "__interrupt__" in state:  # every fifth identical call asks again
        state = invoke(agent, Command(resume="continue"), config, mode=mode)
    assert state["messages"][-1].content == "done"
    assert len(ran) == per_response


# -- a question holds the rest of its batch, on every route -------------------------------------

REFUSE_EVERYTHING = {"defaults": {}, "warn-off": {"streak_warn_at": 0}}
"""The first question of a batch of identical failing calls: the warn level at the 5th call, or
(warn off) the stop level at the 9th, which the 8 waiting before it count toward."""


@pytest.fixture
def failing_tools(ran):
    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        raise ToolException(f"{path}: no such file")

    read_file.handle_tool_error = True
    return [read_file]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("config", REFUSE_EVERYTHING.values(), ids=REFUSE_EVERYTHING.keys())
def test_a_callback_question_holds_the_calls_after_it_until_the_user_refuses(ran, failing_tools, config, mode):
    """30 identical failing calls in one response, run in parallel (threads, or tasks) while the
    callback takes its time: the calls after the one asked about wait for the answer, so only
    those before it ran, and the user's "stop" refuses the rest."""
    before = 4 if config == {} else 8
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(len(ran))
        time.sleep(0.2)  # the other calls of the batch are checked meanwhile
        return "stop"

    async def aask(verdict: tg.Verdict) -> str:
        asked.append(len(ran))
        await asyncio.sleep(0.2)
        return "stop"

    middleware = TurnGuardMiddleware(tg.Guard(tg.GuardConfig(**config)), ask=ask if mode == "sync" else aask)
    agent = create_agent(one_batch("read_file", {"path": "a.py"}, 30), failing_tools, middleware=[middleware])
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        invoke(agent, ask_user("read it"), LIMIT, mode=mode)
    assert len(asked) == 1
    assert len(ran) == before


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("config", REFUSE_EVERYTHING.values(), ids=REFUSE_EVERYTHING.keys())
def test_an_interrupt_holds_the_whole_batch_and_a_refusal_runs_none_of_it(ran, failing_tools, config, mode):
    guard = tg.Guard(tg.GuardConfig(**config))
    agent = create_agent(one_batch("read_file", {"path": "a.py"}, 30), failing_tools,
                         middleware=[TurnGuardMiddleware(guard, ask="interrupt")], checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "refused"}, **LIMIT}
    paused = invoke(agent, ask_user("read it"), thread, mode=mode)
    assert len(paused["__interrupt__"]) == 1 and ran == []
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        invoke(agent, Command(resume="stop"), thread, mode=mode)
    assert ran == []



class Answers:
    """Each question the turn had answered, in order: its call count, level, and the answer applied."""

    def __init__(self) -> None:
        self.resolved: list[tuple[int, str, str]] = []

    @tg.hookimpl
    def turnguard_escalation_resolved(self, turn, event, response) -> None:
        self.resolved.append((event.tool_calls, str(event.level), str(response)))


def batch_questions(config: tg.GuardConfig, n: int) -> list[tuple[int, str]]:
    """The reference: the questions the core raises on ``n`` identical calls checked in order before
    any runs (as ``after_model`` checks a batch), each answered "continue"."""
    asked = []
    with tg.Guard(config).turn(promptable=True) as turn:
        for k in range(n):
            verdict = turn.check_call(tg.ToolCall("read_file", {"path": "a.py"}, call_id=f"call-{k}"))
            if verdict.action is tg.Action.ASK:
                asked.append((verdict.event.tool_calls, str(verdict.event.level)))
                turn.resolve(verdict.event, "continue")
    return asked


def interrupted_batch(failing_tools, config: dict, n: int, thread: str, answers: Answers):
    guard = tg.Guard(tg.GuardConfig(**config), plugins={"answers": answers})
    agent = create_agent(one_batch("read_file", {"path": "a.py"}, n), failing_tools,
                         middleware=[TurnGuardMiddleware(guard, ask="interrupt")], checkpointer=InMemorySaver())
    return agent, {"configurable": {"thread_id": thread}, **LIMIT}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("n", [12, 30, 61])
@pytest.mark.parametrize("config", REFUSE_EVERYTHING.values(), ids=REFUSE_EVERYTHING.keys())
def test_every_question_of_a_batch_is_interrupted_for_and_takes_its_own_answer(ran, failing_tools, config, n, mode):
    """LangGraph re-runs ``after_model`` from its start on each resume and hands its interrupts
    their resume values by position: each question of the batch must still reach the user (one
    interrupt each, where the core raises it) and be answered by the value given to it."""
    answers = Answers()
    agent, thread = interrupted_batch(failing_tools, config, n, f"each-{n}-{mode}", answers)
    state, given = invoke(agent, ask_user("read it"), thread, mode=mode), []
    while "__interrupt__" in state and ran == []:  # the batch's questions, before any of it runs
        assert len(state["__interrupt__"]) == 1  # one interrupt per question
        given.append(("continue", "redirect")[len(given) % 2])
        state = invoke(agent, Command(resume=given[-1]), thread, mode=mode)
    expected = batch_questions(tg.GuardConfig(**config), n)
    assert len(expected) >= n // 10 and len(given) == len(expected)
    assert [(calls, level, answer) for calls, level, answer in answers.resolved[:len(given)]] == [
        (calls, level, answer) for (calls, level), answer in zip(expected, given, strict=True)]
    assert len(ran) == n  # every call was let go on, so the whole batch ran


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("config", REFUSE_EVERYTHING.values(), ids=REFUSE_EVERYTHING.keys())
def test_a_stop_to_any_question_of_a_batch_refuses_all_of_it(ran, failing_tools, config, mode):
    """The k-th answer is the k-th question's: "stop" to any one of them, after "continue" to those
    before it, halts the run there and none of the batch runs."""
    expected = batch_questions(tg.GuardConfig(**config), 30)
    for k in range(1, len(expected) + 1):
        answers = Answers()
        agent, thread = interrupted_batch(failing_tools, config, 30, f"stop-{k}-{mode}", answers)
        state = invoke(agent, ask_user("read it"), thread, mode=mode)
        for _ in range(k - 1):
            state = invoke(agent, Command(resume="continue"), thread, mode=mode)
        assert len(state["__interrupt__"]) == 1
        with pytest.raises(TurnGuardHalted, match="stopped by the user"):
            invoke(agent, Command(resume="stop"), thread, mode=mode)
        assert ran == []
        assert answers.resolved == [(calls, level, "continue") for calls, level in expected[:k - 1]] + [
            (*expected[k - 1], "stop")]

def test_with_exit_behavior_end_a_refused_batch_is_answered_and_the_run_ends(ran, failing_tools):
    guard = tg.Guard()
    middleware = TurnGuardMiddleware(guard, ask="interrupt", exit_behavior="end")
    agent = create_agent(one_batch("read_file", {"path": "a.py"}, 30), failing_tools, middleware=[middleware],
                         checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "refused-end"}, **LIMIT}
    invoke(agent, ask_user("read it"), thread, mode="sync")
    state = invoke(agent, Command(resume="stop"), thread, mode="sync")
    answered = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert len(answered) == 30 and all(m.status == "error" and "Not executed" in m.content for m in answered)
    assert "stopped by the user" in state["messages"][-1].content and ran == []


def test_a_parallel_batch_interrupted_for_an_ask_goes_on_in_a_fresh_process(two_processes):
    """Process 1: one response of 10 identical calls; the 5th asks, so none runs. Process 2 answers
    "continue": the turn re-checks the batch from the checkpointed snapshot, the first 7 calls run
    and the explicit cap of 7 stops the 8th (the other three are answered, not executed)."""
    first = two_processes("start", "batch")
    assert first["ran"] == 0 and [a["level"] for a in first["asked"]] == ["warn"] and first["ended"] == []
    second = two_processes("resume", "batch")
    assert second["ran"] == 7
    assert "threshold explicit (stop, limit 7); 8 tool calls" in second["last"]
    assert second["ended"] == ["halted"]


# -- a paused run this process drops is put aside, not reported ----------------------------------


class Closes:
    """How turns close: ended (reported) or suspended (put aside for whoever resumes them)."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.suspended: list[str] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary) -> None:
        self.ended.append(summary.turn_id)

    @tg.hookimpl
    def turnguard_turn_suspended(self, turn, summary) -> None:
        self.suspended.append(summary.turn_id)


def test_a_paused_run_dropped_past_the_bound_is_suspended_and_its_resume_reports_it_once(ran, tools, monkeypatch):
    import turnguard.integrations.langchain as adapter

    monkeypatch.setattr(adapter, "MAX_OPEN_TURNS", 1)
    closes, guard = Closes(), tg.Guard()
    guard.register(closes, "closes")
    middleware = TurnGuardMiddleware(guard, ask="interrupt")
    agents = [create_agent(calls_then_done([("read_file", {"path": path})] * 7), tools, middleware=[middleware],
                           checkpointer=InMemorySaver()) for path in ("a.py", "b.py")]
    threads = [{"configurable": {"thread_id": name}, **LIMIT} for name in ("first", "second")]
    for agent, thread in zip(agents, threads, strict=True):
        assert agent.invoke(ask_user("poll"), thread)["__interrupt__"]  # the second drops the first
    assert len(closes.suspended) == 1 and closes.ended == []
    state = agents[0].invoke(Command(resume="continue"), threads[0])  # resumed from the checkpoint
    assert state["messages"][-1].content == "done" and len(ran) == 4 + 4 + 3
    assert len(closes.ended) == 1  # the turn put aside, reported once, by the run that finished it


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("changing", [True, False])
def test_a_polling_tools_message_content_is_its_result_and_a_changed_one_is_progress(changing, asynchronous,
                                                                                    turn_ends):
    answers, polled = iter(ci_statuses(changing)), []

    @tool
    def ci_status(run: int) -> str:
        """The CI run's status."""
        polled.append(run)
        return next(answers)

    model = calls_then_done([("ci_status", {"run": 42})] * POLLS)  # each message has its own id
    agent = create_agent(model, [ci_status], middleware=[TurnGuardMiddleware(turn_ends.guard(POLLING))])
    run = agent.ainvoke if asynchronous else agent.invoke
    if changing:
        state = asyncio.run(run(ask_user("wait for CI"), LIMIT)) if asynchronous else run(ask_user("wait"), LIMIT)
        assert state["messages"][-1].content == "done"
    else:
        with pytest.raises(TurnGuardHalted):
            asyncio.run(run(ask_user("wait for CI"), LIMIT)) if asynchronous else run(ask_user("wait"), LIMIT)
    assert_polled(turn_ends, changing, len(polled))


# -- parallel batches: checked in the model's order, every outcome of a halted batch recorded ----


class Seen:
    """The calls checked and the outcomes recorded (a plugin), and the turn's summary."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, tg.Outcome]] = []
        self.summaries: list[tg.TurnSummary] = []

    @tg.hookimpl
    def turnguard_outcome_recorded(self, turn, call, outcome, verdict) -> None:
        self.outcomes.append((call.args["path"], outcome))

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary) -> None:
        self.summaries.append(summary)


def reference(config: tg.GuardConfig, script: list[list[str]]) -> tuple[list[str], object]:
    """What the documented batch rule gives: each response's calls checked in the model's order
    (up to a halt), then their outcomes; the paths run and the threshold that stopped the turn."""
    turn = tg.Guard(config).turn()
    ran: list[str] = []
    for i, paths in enumerate(script):
        allowed = []
        for j, path in enumerate(paths):
            call = tg.ToolCall("read_file", {"path": path}, call_id=f"c{i}-{j}")
            if turn.check_call(call).action is tg.Action.HALT:
                break
            allowed.append(call)
        for call in allowed:
            ran.append(call.args["path"])
            turn.record_outcome(call, tg.Outcome.ERROR if call.args["path"].startswith("missing") else tg.Outcome.OK)
        if turn.halted is not None:
            break
    return sorted(ran), turn.end().threshold


def jittered_reader(seed: int, fails: Callable[[str], bool]) -> tuple[Any, list[str]]:
    """A ``read_file`` tool whose body sleeps a random few milliseconds (so the tool node's threads
    or tasks finish in a different order each run) and fails where ``fails`` says, with the paths
    it ran, in the order they ran."""
    jitter = random.Random(seed)
    ran: list[str] = []

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        time.sleep(jitter.random() * 0.004)
        ran.append(path)
        if fails(path):
            raise ToolException(f"{path}: no such file")
        return f"contents of {path}"

    read_file.handle_tool_error = True
    return read_file, ran


def jittered_run(config: tg.GuardConfig, script: list[list[str]], mode: str, exit_behavior: str, seed: int):
    """``script`` (one list of paths per response) through the agent, each body sleeping a random
    few milliseconds so the tool node's threads or tasks finish in a different order each run."""
    read_file, ran = jittered_reader(seed, fails=lambda path: path.startswith("missing"))
    seen = Seen()
    responses = [AIMessage(content="", tool_calls=[
        {"name": "read_file", "args": {"path": p}, "id": f"c{i}-{j}", "type": "tool_call"}
        for j, p in enumerate(paths)]) for i, paths in enumerate(script)]
    middleware = TurnGuardMiddleware(tg.Guard(config, plugins={"seen": seen}), exit_behavior=exit_behavior)
    agent = create_agent(ToolCallingFakeModel(messages=iter([*responses, AIMessage("done")])), [read_file],
                         middleware=[middleware])
    try:
        invoke(agent, ask_user("read them"), LIMIT, mode=mode)
    except TurnGuardHalted:
        assert exit_behavior == "error"
    return ran, seen


BATCHES = {
    **{f"cap-{cap}-of-4": (tg.GuardConfig(max_tool_calls_per_turn=cap), [["a.py", "b.py", "c.py", "d.py"]])
       for cap in (1, 2, 3)},
    "cap-after-a-batch": (tg.GuardConfig(max_tool_calls_per_turn=3), [["a.py", "b.py"], ["c.py", "d.py", "e.py"]]),
    "streak-then-others": (tg.GuardConfig(), [["missing.py"]] * 7 + [["missing.py", "b.py", "b.py"]]),
    "others-then-streak": (tg.GuardConfig(), [["missing.py"]] * 6 + [["b.py", "missing.py", "missing.py"]]),
    "streak-in-one-batch": (tg.GuardConfig(), [["missing.py"] * 10]),
}


@pytest.mark.parametrize("exit_behavior", ["error", "end"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_a_parallel_batch_gets_the_same_verdicts_and_outcomes_on_every_run(batch, mode, exit_behavior):
    """Whatever order the tool node's threads or tasks run in: the calls are checked in the
    model's order (the cap and the streak fall on the same call every run), and every body that
    ran has its outcome recorded before the turn ends, a halt in its batch included."""
    config, script = batch
    expected = reference(config, script)
    results = set()
    for seed in range(4):
        ran, seen = jittered_run(config, script, mode, exit_behavior, seed)
        (summary,) = seen.summaries
        assert sorted(path for path, _ in seen.outcomes) == sorted(ran)
        assert summary.reason == ("halted" if expected[1] is not None else "completed")
        results.add((tuple(sorted(ran)), summary.threshold))
    assert results == {(tuple(expected[0]), expected[1])}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("refused_at", [1, 2, 4])
def test_a_callback_refusal_in_a_batch_runs_exactly_the_calls_before_it_with_their_outcomes(mode, refused_at, seed):
    """The callback is asked in the model's order, before any call of the response runs: the calls
    before the one it refuses run and report, it and those after it do not run."""
    read_file, ran = jittered_reader(seed, fails=lambda path: True)
    seen = Seen()

    def ask(verdict: tg.Verdict) -> str:
        assert ran == []
        return "stop"

    guard = tg.Guard(tg.GuardConfig(streak_warn_at=refused_at + 1), plugins={"seen": seen})
    agent = create_agent(one_batch("read_file", {"path": "a.py"}, 6), [read_file],
                         middleware=[TurnGuardMiddleware(guard, ask=ask)])
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        invoke(agent, ask_user("read them"), LIMIT, mode=mode)
    assert len(ran) == refused_at
    assert sorted(o.value for _, o in seen.outcomes) == ["denied"] + ["error"] * refused_at


def test_a_run_cancelled_while_a_batch_runs_settles_every_call_it_checked(turn_ends):
    """Cancelled with three bodies running: each of them ends ``error``, none is left waiting."""
    seen = Seen()

    async def start(started):
        running = []

        @tool
        async def read_file(path: str) -> str:
            """Read a file."""
            running.append(path)
            if len(running) == 3:
                started.set()
            await asyncio.Event().wait()
            return "never"

        guard = tg.Guard(plugins={"seen": seen})
        agent = TurnGuardMiddleware(guard)
        graph = agent.watch(create_agent(one_batch("read_file", {"path": "a.py"}, 3), [read_file], middleware=[agent]))
        return await graph.ainvoke(ask_user("go"), LIMIT)

    cancel_once_started(start)
    assert [o for _, o in seen.outcomes] == [tg.Outcome.ERROR] * 3
    assert seen.summaries[-1].reason == "cancelled"


def _batch(i: int, n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "read_file", "args": {"path": f"p{k}"}, "id": f"c{i}-{k}",
                                              "type": "tool_call"} for k in range(n)])


RETRIES = {
    "tool_retry_outside": lambda: [ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False), "turnguard"],
    "tool_retry_inside": lambda: ["turnguard", ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)],
    "tool_retry_outside_raising": lambda: [
        ToolRetryMiddleware(max_retries=1, initial_delay=0, jitter=False, on_failure="error"), "turnguard"],
    "model_retry_outside": lambda: [ModelRetryMiddleware(max_retries=1, initial_delay=0, jitter=False), "turnguard"],
    "model_retry_inside": lambda: ["turnguard", ModelRetryMiddleware(max_retries=1, initial_delay=0, jitter=False)],
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("parallel", [1, 2])
@pytest.mark.parametrize("behaviour", ["raises", "raises_once"])
@pytest.mark.parametrize("retry", list(RETRIES))
def test_every_checked_call_gets_one_outcome_through_each_retry_middleware(retry, behaviour, parallel, mode):
    """LangChain's retrying middlewares, outside turnguard's wrappers or inside them, the tool
    failing each time or once, one call a response or two in parallel, the model failing once
    after its first response: each check turnguard lets run (a retry outside re-runs the call
    through turnguard's wrapper: checked again) gets exactly one outcome, and the turn ends."""
    attempts: dict[str, int] = {}

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        attempts[path] = attempts.get(path, 0) + 1
        if behaviour == "raises" or attempts[path] == 1:
            raise OSError(f"{path}: disk gone")
        return "contents"

    book = CallOutcomes()
    turnguard = TurnGuardMiddleware(tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",)),
                                             plugins={"book": book}))
    model = UnreachableAfter(messages=iter([_batch(0, parallel), _batch(1, parallel), AIMessage("done")]),
                             answers=1 if retry.startswith("model") else 3)
    middleware = [turnguard if m == "turnguard" else m for m in RETRIES[retry]()]
    agent = turnguard.watch(create_agent(model, [read_file], middleware=middleware))
    with contextlib.suppress(OSError, ConnectionError):
        invoke(agent, ask_user("read them"), LIMIT, mode=mode)
    assert book.ended is not None
    outcomes = book.each_once()  # (a call beside one whose error ended the run: "unknown" as the turn ends)
    assert outcomes and set(outcomes) <= {"ok", "error", "unknown"}
    if behaviour == "raises" and not retry.startswith("model"):
        assert "ok" not in outcomes
