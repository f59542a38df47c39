"""openai-agents end to end: a real Runner driven by the SDK's ScriptedModel, guarded by run hooks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from conftest import (
    POLLING,
    POLLS,
    STOPPED_AT_THE_EIGHTH_FAILURE,
    assert_polled,
    cancel_once_started,
    ci_statuses,
    optional_dependency,
    wait_forever,
)

optional_dependency("agents")

from agents import (  # noqa: E402
    Agent,
    Handoff,
    RunConfig,
    Runner,
    RunState,
    SQLiteSession,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from agents.exceptions import AgentsException, MaxTurnsExceeded  # noqa: E402
from agents.memory import OpenAIConversationsSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import turnguard as tg  # noqa: E402
from turnguard.integrations.openai_agents import (  # noqa: E402
    TurnGuardHalted,
    TurnGuardRunHooks,
    _sdk_conversation_id,
    approval_requests,
    resume_state,
    run,
    run_sync,
    state_string,
)

NO_EXPORT = RunConfig(tracing_disabled=True)
"""The SDK's default trace exporter would try to reach OpenAI; these runs stay local."""


def calls_then_done(calls: list[tuple[str, dict]]) -> ScriptedModel:
    """One call per model request, then a final answer."""
    steps = [[function_call(name, args, call_id=f"call-{i}")] for i, (name, args) in enumerate(calls)]
    return ScriptedModel([*steps, [assistant_message("done")]])


@pytest.fixture
def ran() -> list:
    return []


@pytest.fixture
def make_agent(ran):
    def make(model: ScriptedModel, *, fail: bool) -> Agent:
        @function_tool
        def read_file(path: str) -> str:
            """Read a file."""
            ran.append(path)
            if fail:
                raise FileNotFoundError(path)
            return f"contents of {path}"

        return Agent(name="coder", model=model, tools=[read_file])

    return make


def test_unattended_identical_failing_calls_stop_at_the_eighth_and_the_ninth_never_runs(ran, make_agent):
    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 30), fail=True)
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(tg.Guard(tg.GuardConfig()), agent, "read a.py", max_turns=100, run_config=NO_EXPORT)
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert "streak" in str(stopped.value) and "8 failing" in str(stopped.value)
    assert isinstance(stopped.value, AgentsException) and isinstance(stopped.value, tg.LoopDetected)


@pytest.fixture
def tracing_off():
    """SDK tracing off for the whole process, as hosts with non-OpenAI backends run it."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def failing_tool(ran: list, **options):
    @function_tool(**options)
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        raise FileNotFoundError(path)

    return read_file


CUSTOM_FAILURE = {"failure_error_function": lambda ctx, error: f"cannot read: {error}"}


@pytest.mark.parametrize("options", [CUSTOM_FAILURE, {}], ids=["custom-failure-function", "sdk-default"])
def test_failures_are_seen_with_the_tools_own_failure_function_and_tracing_off(ran, tracing_off, options):
    tool = failing_tool(ran, **options)
    agent = Agent(name="coder", model=calls_then_done([("read_file", {"path": "a.py"})] * 30), tools=[tool])
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(tg.Guard(tg.GuardConfig()), agent, "read a.py", max_turns=100)
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert agent.tools == [tool]  # the host's agent and tool are not changed


def test_hooks_used_directly_see_failures_through_the_observed_agent(ran, tracing_off):
    agent = Agent(
        name="coder",
        model=calls_then_done([("read_file", {"path": "a.py"})] * 30),
        tools=[failing_tool(ran, **CUSTOM_FAILURE)],
    )
    hooks = TurnGuardRunHooks(tg.Guard(tg.GuardConfig()))
    with pytest.raises(TurnGuardHalted) as stopped:
        Runner.run_sync(hooks.observe(agent), "read a.py", hooks=hooks, max_turns=100)
    hooks.end(stopped.value)
    assert len(ran) == 8
    assert hooks.driver.turn.summary.reason == "halted"


def test_failures_are_seen_through_the_tool_span_when_the_agent_is_not_observed(ran):
    """Hooks alone (no observed agent, no error formatter), tracing on: the SDK's span error marks
    the failure."""
    agent = Agent(
        name="coder",
        model=calls_then_done([("read_file", {"path": "a.py"})] * 30),
        tools=[failing_tool(ran, **CUSTOM_FAILURE)],
    )
    hooks = TurnGuardRunHooks(tg.Guard(tg.GuardConfig()))
    with pytest.raises(TurnGuardHalted):
        Runner.run_sync(agent, "read a.py", hooks=hooks, max_turns=100)
    hooks.end()
    assert len(ran) == 8
    assert hooks.driver.turn.summary.halted and hooks.driver.turn.summary.reason == "halted"


def test_one_hundred_fifty_distinct_calls_complete_under_the_adaptive_cap(ran, make_agent):
    agent = make_agent(calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)]), fail=False)
    result = run_sync(tg.Guard(tg.GuardConfig()), agent, "read them", max_turns=200, run_config=NO_EXPORT)
    assert result.final_output == "done"
    assert len(ran) == 150


def test_explicit_cap_of_one_hundred_halts_call_one_hundred_one_before_its_body_runs(ran, make_agent):
    agent = make_agent(calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)]), fail=False)
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(guard, agent, "read them", max_turns=200, run_config=NO_EXPORT)
    assert len(ran) == 100
    assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert "explicit" in str(stopped.value) and "101 tool calls" in str(stopped.value)


def test_attended_run_asks_the_async_callback_and_continue_lets_it_go_on(ran, make_agent):
    asked = []

    async def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict)
        return "continue"

    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 7), fail=False)
    guard = tg.Guard(tg.GuardConfig())
    result = asyncio.run(run(guard, agent, "poll a.py", ask=ask, max_turns=50, run_config=NO_EXPORT))
    assert result.final_output == "done"
    assert len(ran) == 7
    assert [(v.threshold, v.event.level, v.event.streak_length) for v in asked] == [
        (tg.Threshold.STREAK, tg.Level.WARN, 5)
    ]


def test_attended_stop_level_reaches_the_user_after_the_eighth_failure(ran, make_agent):
    """Attended, the stop level is an ASK: the user's "stop" halts; the ninth call never runs."""
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append((verdict.event.level, verdict.event.failing_streak_length))
        return "stop"

    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 30), fail=True)
    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(guard, agent, "read a.py", ask=ask, max_turns=100, run_config=NO_EXPORT)
    assert asked == [(tg.Level.STOP, 8)]
    assert len(ran) == 8
    assert "stopped by the user" in str(stopped.value)


def test_answering_continue_resets_the_streak_so_the_user_is_asked_every_fifth_identical_call(ran, make_agent):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict.event.tool_calls)
        return "continue"

    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 12), fail=True)
    result = run_sync(tg.Guard(tg.GuardConfig()), agent, "read a.py", ask=ask, max_turns=100, run_config=NO_EXPORT)
    assert result.final_output == "done"
    assert asked == [5, 10]
    assert len(ran) == 12


def test_promptable_without_a_route_falls_back_to_halting_at_the_stop_level(ran, make_agent):
    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 30), fail=True)
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(tg.Guard(tg.GuardConfig()), agent, "read a.py", promptable=True, max_turns=100, run_config=NO_EXPORT)
    assert len(ran) == 8
    assert "nobody could be asked" in str(stopped.value)


def test_the_example_stops_a_model_stuck_on_a_missing_file_and_prints_why(run_example):
    printed = run_example("openai_agents_agent", model=calls_then_done([("read_file", {"path": "missing.py"})] * 30))
    assert printed.startswith(STOPPED_AT_THE_EIGHTH_FAILURE) and "8 failing" in printed


def test_the_examples_explicit_cap_stops_call_one_hundred_one_and_prints_why(run_example):
    """150 model requests, past the SDK's default ``max_turns=10``: the example's cap of 100 stops it."""
    model = calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    printed = run_example("openai_agents_agent", model=model)
    assert printed.startswith("stopped: turnguard stopped the run: threshold explicit (stop, limit 100)")
    assert "101 tool calls" in printed


def test_the_runs_spans_and_loop_detected_events_are_recorded(ran, make_agent, otel):
    """The SDK traces through its own (non-OpenTelemetry) tracing, so turnguard's spans are the
    OpenTelemetry ones: a turn span and one span per call, the detections logged on the call's span."""
    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 30), fail=True)
    guard = tg.Guard(tg.GuardConfig(), **otel.providers())
    with pytest.raises(TurnGuardHalted):
        run_sync(guard, agent, "read a.py", conversation_id="conv-1", max_turns=100, run_config=NO_EXPORT)

    turn_span = otel.span("invoke_agent coder")
    assert turn_span.attributes["turnguard.turn.outcome"] == "halted"
    assert turn_span.attributes["gen_ai.conversation.id"] == "conv-1"
    tool_spans = [s for s in otel.spans() if s.name == "execute_tool read_file"]
    assert len(tool_spans) == 8
    assert all(s.parent.span_id == turn_span.context.span_id for s in tool_spans)
    assert [s.attributes["gen_ai.tool.call.id"] for s in tool_spans] == [f"call-{i}" for i in range(8)]

    records = otel.logs("turnguard.loop_detected")
    assert [(r.attributes["turnguard.loop.level"], r.attributes["turnguard.loop.action"]) for r in records] == [
        ("warn", "allow"),
        ("stop", "halt"),
    ]
    assert records[-1].attributes["turnguard.loop.threshold"] == "streak"
    assert records[-1].span_id == tool_spans[-1].context.span_id


# -- the turn ends on every exit path ----------------------------------------------------------


def test_a_tool_that_raises_with_no_failure_function_ends_the_turn_with_error(ran, turn_ends):
    agent = Agent(
        name="coder",
        model=calls_then_done([("read_file", {"path": "a.py"})]),
        tools=[failing_tool(ran, failure_error_function=None)],
    )
    with pytest.raises(Exception) as died:
        run_sync(turn_ends.guard(), agent, "read a.py", run_config=NO_EXPORT)
    assert not isinstance(died.value, tg.LoopDetected)
    summary = turn_ends.assert_ended("error")
    assert summary.tool_calls == 1 and ran == ["a.py"]


@pytest.mark.parametrize("reported", [True, False])
def test_a_result_the_host_reported_in_the_turn_stands_when_the_run_then_dies_on_an_error(ran, reported):
    """Hooks passed to ``Runner.run``: the host reports the task's result through the run's turn,
    then a tool without a failure function ends the run; the turn ends ``error`` with the host's
    result, and the run's own "unresolved" is not added as a second (``duplicate``) result."""
    statuses, summaries = [], []

    class Results:
        @tg.hookimpl
        def turnguard_turn_result(self, turn_id, summary, resolved, status, labels) -> None:
            statuses.append(status)

        @tg.hookimpl
        def turnguard_turn_ended(self, turn, summary) -> None:
            summaries.append(summary)

    guard = tg.Guard(tg.GuardConfig())
    guard.register(Results(), "results")
    hooks = TurnGuardRunHooks(guard)

    @function_tool(failure_error_function=None)
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        hooks.driver.turn.report_result(reported)
        raise FileNotFoundError(path)

    agent = hooks.observe(Agent(name="coder", model=calls_then_done([("read_file", {"path": "a.py"})]),
                                tools=[read_file]))
    with pytest.raises(Exception) as died:
        Runner.run_sync(agent, "read a.py", hooks=hooks, run_config=NO_EXPORT)
    hooks.end(died.value)
    assert ran == ["a.py"] and statuses == []
    assert [(s.reason, s.resolved) for s in summaries] == [("error", reported)]


def test_a_cancelled_async_run_ends_the_turn_as_cancelled(turn_ends):
    async def start(started):
        @function_tool
        async def wait_for_input(prompt: str) -> str:
            """Wait for the user."""
            return await wait_forever(started)

        model = calls_then_done([("wait_for_input", {"prompt": "?"})])
        agent = Agent(name="coder", model=model, tools=[wait_for_input])
        return await run(turn_ends.guard(), agent, "go", run_config=NO_EXPORT)

    cancel_once_started(start)
    turn_ends.assert_ended("cancelled")


def test_the_sdks_own_max_turns_ends_the_turn_with_error(ran, make_agent, turn_ends):
    agent = make_agent(calls_then_done([("read_file", {"path": f"f{i}.py"}) for i in range(10)]), fail=False)
    with pytest.raises(MaxTurnsExceeded):
        run_sync(turn_ends.guard(), agent, "read them", max_turns=3, run_config=NO_EXPORT)
    turn_ends.assert_ended("error")


# -- attended runs through the SDK's own approvals -----------------------------------------------


def resume(result, *, approve: bool):
    """The user's answer to the run's one pending approval, as the SDK takes it: a ``RunState``."""
    (item,) = result.interruptions
    state = result.to_state()
    if approve:
        state.approve(item)
    else:
        state.reject(item)
    return state


def test_attended_run_asks_through_the_sdks_approval_and_the_resumed_run_is_the_same_turn(ran, make_agent, turn_ends):
    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 7), fail=False)
    guard = turn_ends.guard()
    paused = run_sync(guard, agent, "poll a.py", ask="approval", max_turns=50, run_config=NO_EXPORT)
    (item,) = paused.interruptions
    assert item.call_id == "call-4" and len(ran) == 4  # the fifth identical call waits for the user
    assert turn_ends.summaries == []
    result = run_sync(guard, agent, resume(paused, approve=True), ask="approval", max_turns=50, run_config=NO_EXPORT)
    assert result.final_output == "done" and len(ran) == 7
    summary = turn_ends.assert_ended("completed")
    assert summary.tool_calls == 7  # one turn across the interruption; the approved call counted once


def test_a_rejected_approval_is_the_users_stop(ran, make_agent):
    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 7), fail=False)
    guard = tg.Guard(tg.GuardConfig())
    paused = run_sync(guard, agent, "poll a.py", ask="approval", max_turns=50, run_config=NO_EXPORT)
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        run_sync(guard, agent, resume(paused, approve=False), ask="approval", max_turns=50, run_config=NO_EXPORT)
    assert len(ran) == 4


def test_an_attended_stop_after_the_eighth_failure_is_approved_on_the_next_call(ran, make_agent):
    agent = make_agent(calls_then_done([("read_file", {"path": "a.py"})] * 10), fail=True)
    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    paused = run_sync(guard, agent, "read a.py", ask="approval", max_turns=50, run_config=NO_EXPORT)
    assert paused.interruptions[0].call_id == "call-8" and len(ran) == 8
    result = run_sync(guard, agent, resume(paused, approve=True), ask="approval", max_turns=50, run_config=NO_EXPORT)
    assert result.final_output == "done" and len(ran) == 10


def test_a_tools_own_approval_is_asked_first_and_the_call_is_checked_once_approved(ran, turn_ends):
    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    agent = Agent(name="coder", model=calls_then_done([("delete_file", {"path": "a.py"})]), tools=[delete_file])
    guard = turn_ends.guard()
    paused = run_sync(guard, agent, "clean up", ask="approval", run_config=NO_EXPORT)
    assert ran == [] and len(paused.interruptions) == 1 and turn_ends.summaries == []
    result = run_sync(guard, agent, resume(paused, approve=True), ask="approval", run_config=NO_EXPORT)
    assert result.final_output == "done" and ran == ["a.py"]
    assert turn_ends.assert_ended("completed").tool_calls == 1


# -- identical calls in one response (the core's rule for a parallel batch) ----------------------


def one_batch(name: str, args: dict, n: int) -> ScriptedModel:
    return ScriptedModel(
        [[function_call(name, args, call_id=f"call-{k}") for k in range(n)], [assistant_message("done")]]
    )


def test_of_ten_identical_failing_calls_in_one_response_at_most_eight_run_unattended(ran, make_agent):
    agent = make_agent(one_batch("read_file", {"path": "a.py"}, 10), fail=True)
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(tg.Guard(), agent, "read a.py", run_config=NO_EXPORT)
    assert len(ran) <= 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK


def test_ten_identical_calls_in_one_attended_response_ask_the_stop_level_once(ran, make_agent):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict.event.level)
        return "continue"

    agent = make_agent(one_batch("read_file", {"path": "a.py"}, 10), fail=True)
    run_sync(tg.Guard(tg.GuardConfig(streak_warn_at=0)), agent, "read a.py", ask=ask, run_config=NO_EXPORT)
    assert asked == [tg.Level.STOP]


def test_with_approvals_the_batch_is_checked_as_planned_and_the_ninth_asks(ran, make_agent):
    agent = make_agent(one_batch("read_file", {"path": "a.py"}, 10), fail=True)
    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    paused = run_sync(guard, agent, "read a.py", ask="approval", run_config=NO_EXPORT)
    assert [item.call_id for item in approval_requests(paused)] == ["call-8"]
    assert [item.call_id for item in paused.interruptions] == ["call-8", "call-9"]  # the tenth waits with it
    assert len(ran) == 8


# -- a question holds the rest of its batch, on every route -------------------------------------

FIRST_QUESTION = {"defaults": ({}, 4), "warn-off": ({"streak_warn_at": 0}, 8)}
"""Guard options, and how many of a batch of identical failing calls come before its first
question: the warn level at the 5th call, or (warn off) the stop level at the 9th, which the 8
waiting before it count toward."""


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_an_approval_question_holds_its_batch_and_a_rejection_runs_none_of_it(ran, make_agent, turn_ends,
                                                                               options, before):
    agent = make_agent(one_batch("read_file", {"path": "a.py"}, 30), fail=True)
    guard = turn_ends.guard(tg.GuardConfig(**options))
    paused = run_sync(guard, agent, "read a.py", ask="approval", run_config=NO_EXPORT)
    assert len(ran) == before  # the calls after the question wait with it
    (question,) = approval_requests(paused)
    assert len(paused.interruptions) == 30 - before
    state = paused.to_state()
    state.reject(question)
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        run_sync(guard, agent, state, ask="approval", run_config=NO_EXPORT)
    assert len(ran) == before
    assert turn_ends.assert_ended("halted").tool_calls == before + 1


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_approving_each_question_runs_the_held_calls_checked_in_order(ran, make_agent, turn_ends, options, before):
    """Each answer releases the calls held with the question; turnguard checks them in order, and
    the next question holds the rest again: one turn, every call run once, and no call ran while a
    question was waiting."""
    agent = make_agent(one_batch("read_file", {"path": "a.py"}, 30), fail=True)
    guard = turn_ends.guard(tg.GuardConfig(**options))
    result = run_sync(guard, agent, "read a.py", ask="approval", run_config=NO_EXPORT)
    paused_at = []
    while result.interruptions:
        (question,) = approval_requests(result)
        paused_at.append(len(ran))
        assert len(result.interruptions) == 30 - len(ran)  # the question and every call after it
        state = result.to_state()
        state.approve(question)
        result = run_sync(guard, agent, state, ask="approval", run_config=NO_EXPORT)
    assert result.final_output == "done" and len(ran) == 30
    assert paused_at[0] == before and len(paused_at) > 1
    assert turn_ends.assert_ended("completed").tool_calls == 30


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_callback_question_holds_the_calls_after_it_until_the_user_refuses(ran, make_agent, options, before):
    """The SDK runs a response's calls as concurrent tasks: while the async callback takes its
    time, the calls after the one asked about wait for the answer instead of running."""
    asked = []

    async def ask(verdict: tg.Verdict) -> str:
        asked.append(len(ran))
        await asyncio.sleep(0.2)
        return "stop"

    agent = make_agent(one_batch("read_file", {"path": "a.py"}, 30), fail=True)
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        run_sync(tg.Guard(tg.GuardConfig(**options)), agent, "read a.py", ask=ask, run_config=NO_EXPORT)
    assert len(asked) == 1 and len(ran) == before


# -- a turn that survives the process: the SDK's RunState and turn_state, two processes ---------

RESUMABLE_RUN = '''
import asyncio, json, sys
from pathlib import Path
from agents import Agent, RunConfig, RunState, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
import turnguard as tg
from turnguard.integrations.openai_agents import TurnGuardHalted, run, turn_state

phase, folder = sys.argv[1], Path(sys.argv[2])
first = 0 if phase == "start" else 5  # the model's script goes on where the first process left it
steps = [[function_call("read_file", {"path": "a.py"}, call_id=f"call-{i}")] for i in range(first, 20)]
ran = []


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    ran.append(path)
    return "contents"


agent = Agent(name="coder", model=ScriptedModel([*steps, [assistant_message("done")]]), tools=[read_file])
config = tg.GuardConfig(max_tool_calls_per_turn=6,  # the defaults otherwise: no key shared by the processes
                        disable_plugins=("otel", "recorder", "shadow"), load_entrypoints=False)
guard = tg.Guard(config, environ={})
ended = []


class Ends:
    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary):
        ended.append(summary.reason)


guard.register(Ends(), "ends")
options = {"ask": "approval", "max_turns": 50, "run_config": RunConfig(tracing_disabled=True)}


async def main():
    if phase == "start":
        result = await run(guard, agent, "poll a.py", **options)
        (folder / "run.json").write_text(result.to_state().to_string())
        (folder / "turn.json").write_text(json.dumps(turn_state(result)))
        return {"ran": len(ran), "asked": [item.call_id for item in result.interruptions], "ended": ended}
    state = await RunState.from_string(agent, (folder / "run.json").read_text())
    state.approve(state.get_interruptions()[0])
    try:
        await run(guard, agent, state, turn_state=json.loads((folder / "turn.json").read_text()), **options)
    except TurnGuardHalted as stop:
        return {"ran": len(ran), "halted": str(stop), "ended": ended}
    return {"ran": len(ran), "ended": ended}


print(json.dumps(asyncio.run(main())))
'''


def test_a_turn_interrupted_for_approval_goes_on_in_a_fresh_process_from_the_run_state(tmp_path):
    """Process 1 runs 4 calls; the 5th identical one waits for approval. Process 2 restores the
    SDK's RunState and the turn's state, approves: the turn still holds the first 5 calls, so the
    explicit cap of 6 stops the turn's 7th call after 2 more."""
    program = tmp_path / "agent.py"
    program.write_text(RESUMABLE_RUN, encoding="utf-8")

    def run_phase(phase: str) -> dict:
        done = subprocess.run([sys.executable, str(program), phase, str(tmp_path)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run_phase("start") == {"ran": 4, "asked": ["call-4"], "ended": []}  # paused: not reported
    second = run_phase("resume")
    assert second["ran"] == 2  # call 5 (approved) and 6
    assert "threshold explicit (stop, limit 6); 7 tool calls" in second["halted"]
    assert second["ended"] == ["halted"]  # the process that finished the turn reported it, once


# -- resume_state: a run restored from its string keeps turnguard's observation ------------------

OBSERVED_RESUME = '''
import asyncio, json, sys
from pathlib import Path
from agents import Agent, RunConfig, RunState, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
import turnguard as tg
from turnguard.integrations.openai_agents import (TurnGuardHalted, approval_requests, resume_state, run,
                                                  state_string, turn_state)

phase, folder = sys.argv[1], Path(sys.argv[2])
set_tracing_disabled(True)  # as hosts with other backends run it: no span records the failures
first = 9 if phase in ("resume", "sdk") else 0  # the model's script goes on where the first process left it
steps = [[function_call("read_file", {"path": "a.py"}, call_id=f"call-{i}")] for i in range(first, 30)]
ran = []


@function_tool(failure_error_function=lambda ctx, error: f"cannot read: {error}")
def read_file(path: str) -> str:
    """Read a file."""
    ran.append(path)
    raise FileNotFoundError(path)


agent = Agent(name="coder", model=ScriptedModel([*steps, [assistant_message("done")]]), tools=[read_file])
config = tg.GuardConfig(streak_warn_at=0,  # the defaults otherwise: no key shared by the processes
                        disable_plugins=("otel", "recorder", "shadow"), load_entrypoints=False)
guard = tg.Guard(config, environ={})
ended = []


class Ends:
    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary):
        ended.append(summary.reason)


guard.register(Ends(), "ends")
options = {"ask": "approval", "max_turns": 100}


async def main():
    if phase == "resume":
        state = await resume_state(guard, agent, (folder / "run.txt").read_text())
    elif phase == "sdk":  # the SDK's own string and restore, the turn's state stored beside it
        state = await RunState.from_string(agent, (folder / "sdk.txt").read_text())
        turn = json.loads((folder / "turn.json").read_text())
        for item in state.get_interruptions():
            if item.call_id in turn["openai_agents"]["asked"]:
                state.approve(item)
        result = await run(guard, agent, state, turn_state=turn, **options)
        return {"ran": len(ran), "asked": [item.call_id for item in result.interruptions], "ended": ended}
    else:
        result = await run(guard, agent, "read a.py", **options)
        if phase == "start":
            (folder / "run.txt").write_text(state_string(result))
            (folder / "sdk.txt").write_text(result.to_state().to_string())
            (folder / "turn.json").write_text(json.dumps(turn_state(result)))
            return {"ran": len(ran), "asked": [item.call_id for item in result.interruptions], "ended": ended}
        state = result.to_state()  # "both": the control, resumed in the same process
        del ran[:]
    for item in approval_requests(state):
        state.approve(item)
    result = await run(guard, agent, state, **options)
    return {"ran": len(ran), "asked": [item.call_id for item in result.interruptions], "ended": ended}


print(json.dumps(asyncio.run(main())))
'''


def test_a_run_resumed_from_its_string_in_a_fresh_process_keeps_failures_and_approvals(tmp_path):
    """Tracing off and a tool with its own failure function: only turnguard's observed copy of the
    agent sees the failures, and only its tools ask turnguard before running. Process 1 runs 8
    failing calls; the stop level asks at the 9th. Process 2 restores the run from its string with
    ``resume_state`` and approves: the restored run is still observed, so it goes on exactly as the
    same run resumed in one process does (8 more failures after the approved call ask again at
    the 18th; an unobserved run would have run the remaining 21 unasked)."""
    program = tmp_path / "agent.py"
    program.write_text(OBSERVED_RESUME, encoding="utf-8")

    def run_phase(phase: str) -> dict:
        done = subprocess.run([sys.executable, str(program), phase, str(tmp_path)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run_phase("start") == {"ran": 8, "asked": ["call-8"], "ended": []}
    resumed = run_phase("resume")
    assert resumed == run_phase("both") == {"ran": 9, "asked": ["call-17"], "ended": []}
    # the SDK's own RunState.from_string(agent, ...) with turn_state=: run rebuilds it on the copy
    assert run_phase("sdk") == resumed


def test_a_model_that_raises_ends_the_turn_with_error(ran, make_agent, turn_ends):
    model = ScriptedModel([[function_call("read_file", {"path": "a.py"}, call_id="call-0")],
                           ConnectionError("the model is unreachable")])
    with pytest.raises(ConnectionError):
        run_sync(turn_ends.guard(), make_agent(model, fail=False), "read a.py", run_config=NO_EXPORT)
    assert turn_ends.assert_ended("error").tool_calls == 1


def test_a_paused_run_dropped_past_the_bound_is_suspended_not_reported(make_agent, monkeypatch):
    """Past ``MAX_PARKED`` interrupted runs (or when a later run's interruptions reuse its call
    ids, as these scripted runs do), the older is put aside: another process may resume it from
    its state and report it; this one does not."""
    import turnguard.integrations.openai_agents as adapter

    monkeypatch.setattr(adapter, "MAX_PARKED", 1)
    closes, guard = Closes(), tg.Guard()
    guard.register(closes, "closes")
    for path in ("a.py", "b.py", "c.py"):
        agent = make_agent(calls_then_done([("read_file", {"path": path})] * 7), fail=False)
        assert run_sync(guard, agent, "poll", ask="approval", max_turns=50, run_config=NO_EXPORT).interruptions
    assert len(closes.suspended) == 2 and closes.ended == []


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


@pytest.mark.parametrize("changing", [True, False])
def test_a_polling_tools_output_is_its_result_and_a_changed_one_is_progress(changing, turn_ends):
    answers, polled = iter(ci_statuses(changing)), []

    @function_tool
    def ci_status(run: int) -> str:
        """The CI run's status."""
        polled.append(run)
        return next(answers)

    agent = Agent(name="waiter", model=calls_then_done([("ci_status", {"run": 42})] * POLLS), tools=[ci_status])
    guard = turn_ends.guard(POLLING)
    if changing:
        assert run_sync(guard, agent, "wait for CI", max_turns=100, run_config=NO_EXPORT).final_output == "done"
    else:
        with pytest.raises(TurnGuardHalted):
            run_sync(guard, agent, "wait for CI", max_turns=100, run_config=NO_EXPORT)
    assert_polled(turn_ends, changing, len(polled))


# -- a damaged turn state is refused before its turn is resumed ----------------------------------

from damaged_sections import Summaries, state_mutants  # noqa: E402

SECTION = {"asked": ["call-4"], "held": []}
"""What a run paused at its fifth identical call keeps under ``openai_agents`` (checked below)."""
DAMAGED = state_mutants("openai_agents", SECTION)


def polling_agent(calls: int = 7) -> Agent:
    """A fresh agent whose model reads one file ``calls`` times, then answers (a resumed run's goes
    on where the paused one's stopped: the call asked about is in the run state)."""
    @function_tool
    def read_file(path: str) -> str:
        """Read a file."""
        return "contents"

    return Agent(name="coder", model=calls_then_done([("read_file", {"path": "a.py"})] * calls), tools=[read_file])


@pytest.fixture(scope="module")
def paused_string() -> str:
    """``state_string`` of a run paused for approval at its fifth identical call."""
    paused = run_sync(Summaries().guard(), polling_agent(), "poll a.py", ask="approval", run_config=NO_EXPORT)
    return state_string(paused)


def resumes_as_the_same_turn(guard: tg.Guard, summaries: Summaries, string: str) -> None:
    """The correct state, resumed and approved in ``guard``, completes as the turn it was taken of."""
    turn_id = json.loads(string)["turnguard"]["turn"]["turn_id"]
    state = asyncio.run(resume_state(guard, polling_agent(2), string))
    for item in approval_requests(state):
        state.approve(item)
    result = run_sync(guard, polling_agent(2), state, ask="approval", run_config=NO_EXPORT)
    assert result.final_output == "done"
    (summary,) = summaries.summaries
    assert (summary.turn_id, summary.resumed_from, summary.reason) == (turn_id, None, "completed")


@pytest.mark.parametrize("what", DAMAGED)
def test_a_damaged_section_is_refused_by_name_and_the_right_state_resumes_the_same_turn(paused_string, what):
    """Every field of the adapter's section damaged (another type, bad entries, past its bound,
    unknown), and the whole state: a ``tg.SnapshotError`` naming the field, before any turn is
    resumed, so the correct state resumed afterwards in the same guard keeps the turn's id."""
    data = json.loads(paused_string)
    assert data["turnguard"]["openai_agents"] == SECTION
    field, damage = DAMAGED[what]
    bad = json.dumps({**data, "turnguard": damage(data["turnguard"])})
    summaries = Summaries()
    guard = summaries.guard()
    with pytest.raises(tg.SnapshotError) as refused:
        asyncio.run(resume_state(guard, polling_agent(2), bad))
    assert refused.value.field == field
    resumes_as_the_same_turn(guard, summaries, paused_string)


@pytest.mark.parametrize("what", ["asked = 5", "held holds None", "the state in a list"])
def test_a_damaged_turn_state_passed_to_run_is_refused_by_name_before_the_turn_resumes(paused_string, what):
    damaged = {"asked = 5": ("openai_agents.asked", lambda s: {**s, "openai_agents": {"asked": 5, "held": []}}),
               "held holds None": ("openai_agents.held[0]",
                                   lambda s: {**s, "openai_agents": {"asked": ["call-4"], "held": [None]}}),
               "the state in a list": ("kind", lambda s: [s])}
    field, damage = damaged[what]
    data = json.loads(paused_string)
    sdk_string = json.dumps({k: v for k, v in data.items() if k != "turnguard"})
    summaries = Summaries()
    guard = summaries.guard()
    state = asyncio.run(RunState.from_string(polling_agent(2), sdk_string))
    with pytest.raises(tg.SnapshotError) as refused:
        run_sync(guard, polling_agent(2), state, ask="approval", turn_state=damage(data["turnguard"]),
                 run_config=NO_EXPORT)
    assert refused.value.field == field
    resumes_as_the_same_turn(guard, summaries, paused_string)


def test_a_run_state_the_sdk_cannot_restore_leaves_no_turn_open(paused_string):
    """The turn's state is sound but the SDK's part of the string is not: the turn resumed for it
    is put aside, so the correct string resumed afterwards keeps the turn's id."""
    data = json.loads(paused_string)
    summaries = Summaries()
    guard = summaries.guard()
    with pytest.raises(Exception) as failed:
        asyncio.run(resume_state(guard, polling_agent(2), json.dumps({**data, "current_agent": 5})))
    assert not isinstance(failed.value, tg.SnapshotError)
    resumes_as_the_same_turn(guard, summaries, paused_string)


# -- every way a run reaches a tool: the root agent, a handoff to an Agent or through handoff() ---


def handed_off(form: str, reader: Agent) -> Agent:
    """An agent whose run reaches ``reader``'s tools in the way ``form`` names (its model's first
    response is the handoff, whatever the form)."""
    if form == "root":
        return reader
    transfer = [[function_call(Handoff.default_tool_name(reader), {}, call_id="handoff")]]
    targets: dict[str, Any] = {
        "agent": reader,
        "handoff()": handoff(reader),
        "handoff(on_handoff)": handoff(reader, on_handoff=lambda context: None),
        "handoff(input_filter)": handoff(reader, input_filter=lambda data: data.clone(pre_handoff_items=())),
        "custom Handoff": unnamed_handoff(reader),
    }
    if form in targets:
        return Agent(name="triage", model=ScriptedModel(transfer), handoffs=[targets[form]])
    middle = Agent(name="middle", model=ScriptedModel([[function_call("transfer_to_reader", {}, call_id="h2")]]),
                   handoffs=[reader if form == "nested agent→handoff()" else handoff(reader)])
    first = [[function_call("transfer_to_middle", {}, call_id="h1")]]
    return Agent(name="triage", model=ScriptedModel(first), handoffs=[handoff(middle)])


def unnamed_handoff(reader: Agent) -> Handoff:
    """A ``Handoff`` built by hand, whose agent is known only once it is invoked."""

    async def invoke(context, input_json):
        return reader

    return Handoff(tool_name="transfer_to_reader", tool_description="Hand off to the reader.",
                   input_json_schema={}, on_invoke_handoff=invoke, agent_name=reader.name)


FORMS = ["root", "agent", "handoff()", "handoff(on_handoff)", "handoff(input_filter)", "custom Handoff",
         "nested handoff()", "nested agent→handoff()"]


@pytest.fixture(params=["tracing-off", "tracing-on"])
def tracing(request):
    set_tracing_disabled(request.param == "tracing-off")
    yield
    set_tracing_disabled(False)


@pytest.mark.parametrize("options", [CUSTOM_FAILURE, {}], ids=["custom-failure-function", "sdk-default"])
@pytest.mark.parametrize("form", FORMS)
def test_failures_are_seen_in_every_agent_the_run_reaches(ran, tracing, options, form):
    tool = failing_tool(ran, **options)
    reader = Agent(name="reader", model=calls_then_done([("read_file", {"path": "a.py"})] * 30), tools=[tool])
    agent = handed_off(form, reader)
    with pytest.raises(TurnGuardHalted) as stopped:
        run_sync(tg.Guard(tg.GuardConfig()), agent, "read a.py", max_turns=100)
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert reader.tools == [tool]  # the host's agents are not changed


@pytest.mark.parametrize("form", FORMS)
def test_with_approvals_the_batch_of_any_agent_the_run_reaches_is_checked_as_planned(ran, make_agent, form):
    reader = make_agent(one_batch("read_file", {"path": "a.py"}, 10), fail=True)
    reader.name = "reader"
    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    paused = run_sync(guard, handed_off(form, reader), "read a.py", ask="approval", run_config=NO_EXPORT)
    assert [item.call_id for item in approval_requests(paused)] == ["call-8"]
    assert [item.call_id for item in paused.interruptions] == ["call-8", "call-9"]
    assert len(ran) == 8


RESTORABLE_FORMS = [form for form in FORMS if form != "custom Handoff"]
"""The SDK restores a run from its string only in agents it can name from the root: a hand-built
``Handoff``'s agent is unknown until invoked (``RunState.from_string`` refuses it without turnguard)."""


@pytest.mark.parametrize("form", RESTORABLE_FORMS)
def test_a_run_paused_in_any_agent_it_reaches_resumes_on_the_observed_copy(ran, tracing_off, form):
    """Resumed from its string, a run paused inside a handed-off agent goes on where turnguard
    still sees that agent's failures and asks before its calls: the fifth identical call after the
    "continue" asks again."""
    tool = failing_tool(ran, **CUSTOM_FAILURE)
    reader = Agent(name="reader", model=calls_then_done([("read_file", {"path": "a.py"})] * 12), tools=[tool])
    agent = handed_off(form, reader)
    guard = tg.Guard(tg.GuardConfig())
    paused = run_sync(guard, agent, "read a.py", ask="approval", max_turns=100)
    assert [item.call_id for item in approval_requests(paused)] == ["call-4"]  # the warn level
    state = asyncio.run(resume_state(guard, agent, state_string(paused)))
    (question,) = approval_requests(state)
    state.approve(question)
    again = run_sync(guard, agent, state, ask="approval", max_turns=100)
    assert [item.call_id for item in approval_requests(again)] == ["call-9"] and len(ran) == 9  # five more


# -- a halt or a refusal in a batch settles the calls of it that were let run --------------------


class Outcomes:
    """Each call's checks (by call id, with the verdict's action) and outcomes, and the outcomes the
    turn ignored (a host error)."""

    def __init__(self) -> None:
        self.checked: dict[str, list[tg.Action]] = {}
        self.outcomes: dict[str, list[tg.Outcome]] = {}
        self.ignored: list[tuple[str, str]] = []

    @tg.hookimpl
    def turnguard_call_checked(self, turn, call, verdict) -> None:
        self.checked.setdefault(call.call_id, []).append(verdict.action)

    @tg.hookimpl
    def turnguard_outcome_recorded(self, turn, call, outcome, verdict) -> None:
        self.outcomes.setdefault(call.call_id, []).append(outcome)

    @tg.hookimpl
    def turnguard_outcome_ignored(self, turn, call, outcome, reason) -> None:
        self.ignored.append((call.call_id, reason))

    def assert_settled(self) -> None:
        """Every call let run (or refused) has one outcome; a halted call has none; none ignored."""
        let_run = {call_id for call_id, actions in self.checked.items() if tg.Action.HALT not in actions}
        assert self.ignored == []
        assert set(self.outcomes) == let_run
        assert all(len(outcomes) == 1 for outcomes in self.outcomes.values()), self.outcomes


HALT_IN_A_BATCH = [(n, k) for n in range(2, 6) for k in range(2, n + 1)]
"""(calls in one response, the call the cap halts): every position of a halt in batches of 2 to 5."""


async def refuse(verdict: tg.Verdict) -> str:
    await asyncio.sleep(0.05)
    return "stop"


@pytest.mark.parametrize("ask", [None, "approval", refuse], ids=["unattended", "approval", "callback"])
@pytest.mark.parametrize(("n", "k"), HALT_IN_A_BATCH)
def test_a_halt_at_any_call_of_a_batch_settles_every_call_of_it_that_was_let_run(ran, make_agent, ask, n, k):
    model = ScriptedModel([[function_call("read_file", {"path": f"f{i}.py"}, call_id=f"call-{i}") for i in range(n)],
                           [assistant_message("done")]])
    outcomes = Outcomes()
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=k - 1), plugins={"outcomes": outcomes})
    with pytest.raises(TurnGuardHalted):
        run_sync(guard, make_agent(model, fail=False), "read them", ask=ask, run_config=NO_EXPORT)
    assert len(ran) < k
    outcomes.assert_settled()
    assert outcomes.checked[f"call-{k - 1}"] == [tg.Action.HALT]


@pytest.mark.parametrize("fail", [True, False], ids=["failing", "succeeding"])
@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_refusal_in_a_batch_settles_every_call_of_it_that_was_let_run(ran, make_agent, options, before, fail):
    outcomes = Outcomes()
    guard = tg.Guard(tg.GuardConfig(**options, streak_stop_on="any"), plugins={"outcomes": outcomes})
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        run_sync(guard, make_agent(one_batch("read_file", {"path": "a.py"}, 12), fail=fail), "read a.py",
                 ask=refuse, run_config=NO_EXPORT)
    outcomes.assert_settled()
    assert outcomes.outcomes[f"call-{before}"] == [tg.Outcome.DENIED]


# -- an agent's MCP servers: their tools are observed like its own ------------------------------

FILES_SERVER = '''
"""An MCP server over stdio with one tool, read_file, that fails (isError) for paths starting with "missing"."""
try:
    from mcp.server.mcpserver import MCPServer  # mcp 2
except ImportError:
    from mcp.server.fastmcp import FastMCP as MCPServer  # mcp 1

server = MCPServer("files")


@server.tool()
def read_file(path: str) -> str:
    """Read a file."""
    if path.startswith("missing"):
        raise FileNotFoundError(path)
    return f"contents of {path}"


server.run("stdio")
'''


@pytest.fixture
def files_server(tmp_path):
    """The SDK's own stdio client for a local MCP server (a child process, no network)."""
    from agents.mcp import MCPServerStdio

    program = tmp_path / "files_server.py"
    program.write_text(FILES_SERVER, encoding="utf-8")
    return lambda **options: MCPServerStdio(params={"command": sys.executable, "args": [str(program)]},
                                            name="files", **options)


def mcp_run(server, model: ScriptedModel, outcomes: Outcomes, *, via_handoff: bool = False, **options) -> Any:
    """``run`` an agent whose read_file comes from ``server`` (or, ``via_handoff``, from the agent it
    hands off to first), the server connected for the run."""

    async def main():
        guard = tg.Guard(tg.GuardConfig())
        guard.register(outcomes, "outcomes")
        async with server:
            agent = Agent(name="coder", model=model, mcp_servers=[server])
            if via_handoff:
                agent = Agent(name="triage", model=model, handoffs=[agent])
            return await run(guard, agent, "go", max_turns=100, run_config=NO_EXPORT, **options)

    return asyncio.run(main())


@pytest.mark.parametrize("via_handoff", [False, True], ids=["its-own", "handed-off-to"])
def test_a_model_stuck_on_a_failing_mcp_tool_is_stopped_at_the_eighth(files_server, via_handoff):
    """The MCP tool fails the MCP way (a result flagged ``isError``, which the SDK gives the model as
    the tool's output): each call is an ``error``, and the eighth identical failure stops the run."""
    outcomes = Outcomes()
    handoff_step = [[function_call("transfer_to_coder", {}, call_id="h")]] if via_handoff else []
    steps = [*handoff_step, *([function_call("read_file", {"path": "missing.py"}, call_id=f"c{i}")] for i in range(12))]
    with pytest.raises(TurnGuardHalted) as stopped:
        mcp_run(files_server(), ScriptedModel([*steps, [assistant_message("done")]]), outcomes, via_handoff=via_handoff)
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert list(outcomes.outcomes.values()) == [[tg.Outcome.ERROR]] * 8  # (a handoff is no tool call)
    outcomes.assert_settled()


@pytest.mark.parametrize("extractor", [False, True], ids=["no-extractor", "the-servers-own-extractor"])
def test_each_mcp_tool_result_is_its_calls_outcome_and_the_servers_own_extractor_still_runs(files_server, extractor):
    extracted = []

    def own(context) -> dict:
        extracted.append(context.is_error)
        return {"seen": True}

    outcomes = Outcomes()
    paths = ["a.py", "missing.py", "b.py", "missing.py"]
    model = calls_then_done([("read_file", {"path": path}) for path in paths])
    server = files_server(**({"custom_data_extractor": own} if extractor else {}))
    assert mcp_run(server, model, outcomes).final_output == "done"
    expected = [tg.Outcome.ERROR if path.startswith("missing") else tg.Outcome.OK for path in paths]
    assert list(outcomes.outcomes.values()) == [[outcome] for outcome in expected]
    assert extracted == ([False, True, False, True] if extractor else [])


def test_an_mcp_tool_call_is_asked_about_through_the_sdks_approvals(files_server):
    """With ``ask="approval"`` the fifth identical call (the warn level) interrupts the run for the
    user, as the agent's own tools' calls do, instead of being answered by the no-route fallback."""
    outcomes = Outcomes()
    model = calls_then_done([("read_file", {"path": "a.py"})] * 6)
    result = mcp_run(files_server(), model, outcomes, ask="approval")
    assert len(approval_requests(result)) == 1
    assert list(outcomes.checked.values()) == [[tg.Action.ALLOW]] * 4 + [[tg.Action.ASK]]


# -- the conversation a run belongs to: one cohort for all its runs ------------------------------

class Ends:
    def __init__(self) -> None:
        self.summaries: list[tg.TurnSummary] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary):
        self.summaries.append(summary)


class NamedSession(SQLiteSession):
    """A session naming itself with whatever the test says."""

    def __init__(self, session_id: Any) -> None:
        super().__init__("unused")
        self.named = session_id

    @property  # type: ignore[override]
    def session_id(self) -> Any:
        return self.named

    @session_id.setter
    def session_id(self, value: Any) -> None:
        self.named = value


NAMINGS = {
    "runner-conversation-id": ({"conversation_id": "conv-7"}, "conv-7"),
    "run-config-group-id": ({"run_config": RunConfig(tracing_disabled=True, group_id="conv-7")}, "conv-7"),
    "run-config-mapping-group-id": ({"run_config": {"tracing_disabled": True, "group_id": "conv-7"}}, "conv-7"),
    "sqlite-session": ({"session": SQLiteSession("conv-7")}, "conv-7"),
    "session-and-group-id": ({"session": SQLiteSession("other"),
                              "run_config": RunConfig(tracing_disabled=True, group_id="conv-7")}, "conv-7"),
    "session-id-not-text": ({"session": NamedSession(42)}, None),
    "no-name": ({}, None),
}


@pytest.mark.parametrize(("options", "expected"), NAMINGS.values(), ids=NAMINGS.keys())
@pytest.mark.parametrize("entry", ["run_sync", "run"])
def test_a_run_belongs_to_the_conversation_the_sdk_names_and_stays_in_its_cohort(options, expected, entry):
    ends = Ends()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",),
                                    probe=tg.Probe(0.5, tg.GuardConfig(hard_multiplier=20))), environ={})
    guard.register(ends)
    for i in range(12):
        agent = Agent(name="coder", model=ScriptedModel([[assistant_message("done")]]))
        kwargs = {"run_config": NO_EXPORT, **options}
        if entry == "run":
            asyncio.run(run(guard, agent, f"hello {i}", **kwargs))
        else:
            run_sync(guard, agent, f"hello {i}", **kwargs)
    assert [s.conversation_id for s in ends.summaries] == [expected] * 12
    if expected is not None:
        cohort = "probe" if guard.config.probe.selects(expected, None) else "live"
        assert [s.cohort for s in ends.summaries] == [cohort] * 12


def test_an_explicit_conversation_id_names_the_run_over_the_sdks():
    ends = Ends()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",)), environ={})
    guard.register(ends)
    agent = Agent(name="coder", model=ScriptedModel([[assistant_message("done")]]))
    run_sync(guard, agent, "hello", conversation_id="mine", session=SQLiteSession("sdk"),
             run_config=RunConfig(tracing_disabled=True, group_id="group"))
    assert [s.conversation_id for s in ends.summaries] == ["mine"]


def test_a_hosted_conversation_session_names_the_run_once_it_has_an_id_and_never_raises():
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="offline", base_url="http://127.0.0.1:9")  # never reached
    config = RunConfig(tracing_disabled=True)
    named = OpenAIConversationsSession(conversation_id="conv_abc", openai_client=client)
    lazy = OpenAIConversationsSession(openai_client=client)  # its session_id raises until a first request
    assert _sdk_conversation_id({"session": named}, config) == "conv_abc"
    assert _sdk_conversation_id({"session": lazy}, config) is None
