"""pydantic-ai end to end: a real Agent driven by FunctionModel scripts, guarded by the capability."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import subprocess
import sys
import time
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

optional_dependency("pydantic_ai")

from pydantic import BaseModel  # noqa: E402
from pydantic_ai import Agent, ModelResponse, TextPart, ToolCallPart  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability, HandleDeferredToolCalls  # noqa: E402
from pydantic_ai.exceptions import AgentRunError, ModelRetry, ToolFailed, UsageLimitExceeded  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults  # noqa: E402
from pydantic_ai.usage import UsageLimits  # noqa: E402

import turnguard as tg  # noqa: E402
from turnguard.integrations.pydantic_ai import (  # noqa: E402
    APPROVAL,
    TurnGuardCapability,
    TurnGuardHalted,
    approval_requests,
    turn_state,
)

NO_REQUEST_LIMIT = UsageLimits(request_limit=None)
"""pydantic-ai's own budget (50 requests) would stop a 150-call run first; turnguard is under test."""


def _tool_returns(messages) -> int:
    return sum(1 for m in messages for p in getattr(m, "parts", ()) if p.part_kind == "tool-return")


def scripted(calls: list[tuple[str, dict]]) -> FunctionModel:
    """A model that makes the given calls one per request, then answers "done"."""

    def respond(messages, info: AgentInfo) -> ModelResponse:
        i = _tool_returns(messages)
        if i < len(calls):
            name, args = calls[i]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call-{i}")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def forever(name: str, args: dict) -> FunctionModel:
    """A model that repeats one call with identical arguments, whatever it is told."""
    counter = iter(range(10**6))
    return FunctionModel(lambda m, i: ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{next(counter)}")]))


def agent_with(model: FunctionModel, capability: TurnGuardCapability, ran: list, *, fail: bool, also=(), **kw) -> Agent:
    """A real agent with one tool, ``read_file``, whose bodies are logged in ``ran``."""
    agent = Agent(model, capabilities=[capability, *also], **kw)

    @agent.tool_plain
    def read_file(path: str) -> str:
        ran.append(path)
        if fail:
            raise ToolFailed(f"{path}: no such file")
        return f"contents of {path}"

    return agent


@pytest.fixture
def ran() -> list:
    return []


def test_unattended_identical_failing_calls_stop_at_the_eighth_and_the_ninth_never_runs(ran):
    guard = tg.Guard(tg.GuardConfig())
    agent = agent_with(forever("read_file", {"path": "a.py"}), TurnGuardCapability(guard), ran, fail=True)
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.run_sync("read a.py")
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert "streak" in str(stopped.value) and "8 failing" in str(stopped.value)
    assert isinstance(stopped.value, AgentRunError) and isinstance(stopped.value, tg.LoopDetected)


def test_one_hundred_fifty_distinct_calls_complete_under_the_adaptive_cap(ran):
    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": f"f{i}.py"}) for i in range(150)]
    agent = agent_with(scripted(calls), TurnGuardCapability(guard), ran, fail=False)
    result = agent.run_sync("read them all", usage_limits=NO_REQUEST_LIMIT)
    assert result.output == "done"
    assert len(ran) == 150


def test_explicit_cap_of_one_hundred_halts_call_one_hundred_one_before_its_body_runs(ran):
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))
    calls = [("read_file", {"path": f"f{i}.py"}) for i in range(150)]
    agent = agent_with(scripted(calls), TurnGuardCapability(guard), ran, fail=False)
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.run_sync("read them all", usage_limits=NO_REQUEST_LIMIT)
    assert len(ran) == 100
    assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert "explicit" in str(stopped.value) and "101 tool calls" in str(stopped.value)


def test_attended_run_asks_the_callback_and_continue_lets_it_go_on(ran):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict)
        return "continue"

    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": "a.py"})] * 7
    agent = agent_with(scripted(calls), TurnGuardCapability(guard, ask=ask), ran, fail=False)
    assert agent.run_sync("poll a.py").output == "done"
    assert len(ran) == 7
    assert [(v.action, v.threshold, v.event.level) for v in asked] == [
        (tg.Action.ASK, tg.Threshold.STREAK, tg.Level.WARN)
    ]
    assert asked[0].event.promptable and asked[0].event.streak_length == 5


def test_attended_run_answer_stop_refuses_the_call_and_halts(ran):
    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": "a.py"})] * 7
    agent = agent_with(scripted(calls), TurnGuardCapability(guard, ask=lambda v: "stop"), ran, fail=False)
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.run_sync("poll a.py")
    assert len(ran) == 4  # the fifth identical call was refused before it ran
    assert "stopped by the user" in str(stopped.value)


def test_attended_run_reaches_the_user_through_deferred_tool_approval_inline(ran):
    seen = []

    def approve(ctx, requests: DeferredToolRequests) -> DeferredToolResults:
        ours = approval_requests(requests)
        seen.extend(requests.metadata[c.tool_call_id]["turnguard"] for c in ours)
        return requests.build_results(approvals={c.tool_call_id: True for c in ours})

    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": "a.py"})] * 7
    capability = TurnGuardCapability(guard, ask=APPROVAL)
    agent = agent_with(scripted(calls), capability, ran, fail=False, also=[HandleDeferredToolCalls(handler=approve)])
    assert agent.run_sync("poll a.py").output == "done"
    assert len(ran) == 7
    assert [m["threshold"] for m in seen] == ["streak"]
    assert "threshold streak (warn, limit 5)" in seen[0]["message"]


def test_denied_approval_stops_the_run_as_the_users_answer(ran):
    def deny(ctx, requests: DeferredToolRequests) -> DeferredToolResults:
        return requests.build_results(approvals={c.tool_call_id: False for c in approval_requests(requests)})

    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": "a.py"})] * 7
    capability = TurnGuardCapability(guard, ask=APPROVAL)
    agent = agent_with(scripted(calls), capability, ran, fail=False, also=[HandleDeferredToolCalls(handler=deny)])
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.run_sync("poll a.py")
    assert len(ran) == 4
    assert "stopped by the user" in str(stopped.value)


def test_approval_through_a_deferred_output_is_answered_in_the_resumed_run(ran):
    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": "a.py"})] * 7
    capability = TurnGuardCapability(guard, ask=APPROVAL)
    agent = agent_with(scripted(calls), capability, ran, fail=False, output_type=[str, DeferredToolRequests])
    first = agent.run_sync("poll a.py")
    assert isinstance(first.output, DeferredToolRequests) and len(ran) == 4
    ours = approval_requests(first.output)
    assert len(ours) == 1
    resumed = agent.run_sync(
        message_history=first.all_messages(),
        deferred_tool_results=first.output.build_results(approvals={ours[0].tool_call_id: True}),
    )
    assert resumed.output == "done"
    assert len(ran) == 7


def test_the_example_stops_a_model_stuck_on_a_missing_file_and_prints_why(run_example):
    printed = run_example("pydantic_ai_agent", model=forever("read_file", {"path": "missing.py"}))
    assert printed.startswith(STOPPED_AT_THE_EIGHTH_FAILURE) and "8 failing" in printed


def test_the_example_completes_a_long_productive_turn_past_pydantic_ais_request_limit(run_example):
    """150 model requests: pydantic-ai's default ``request_limit=50`` would have stopped it."""
    model = scripted([("read_file", {"path": f"f{i}.py"}) for i in range(150)])
    assert run_example("pydantic_ai_agent", model=model) == "done\n"


def test_denial_given_to_a_resumed_run_is_the_users_stop(ran):
    guard = tg.Guard(tg.GuardConfig())
    calls = [("read_file", {"path": "a.py"})] * 7
    agent = agent_with(
        scripted(calls),
        TurnGuardCapability(guard, ask=APPROVAL),
        ran,
        fail=False,
        output_type=[str, DeferredToolRequests],
    )
    first = agent.run_sync("poll a.py")
    (ours,) = approval_requests(first.output)
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        agent.run_sync(
            message_history=first.all_messages(),
            deferred_tool_results=first.output.build_results(approvals={ours.tool_call_id: False}),
        )
    assert len(ran) == 4


def test_turnguard_enriches_pydantic_ais_own_spans_and_logs_the_detection_on_the_tool_span(ran, otel):
    from pydantic_ai.capabilities import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    guard = tg.Guard(tg.GuardConfig(), **otel.providers())
    instrumented = Instrumentation(InstrumentationSettings(tracer_provider=otel.tracer_provider))
    agent = agent_with(
        forever("read_file", {"path": "a.py"}), TurnGuardCapability(guard), ran, fail=True, also=[instrumented]
    )
    with pytest.raises(TurnGuardHalted):
        agent.run_sync("read a.py")

    finished = otel.spans()
    tool_spans = [s for s in finished if s.name == "execute_tool read_file"]
    assert len(tool_spans) == 8  # pydantic-ai's spans, enriched: turnguard did not add its own
    assert [s.attributes["turnguard.call.index"] for s in tool_spans] == list(range(1, 9))
    assert tool_spans[-1].attributes["turnguard.verdict.threshold"] == "streak"
    (run_span,) = [s for s in finished if s.name.startswith("invoke_agent")]
    assert run_span.attributes["turnguard.turn.outcome"] == "halted"
    assert run_span.attributes["turnguard.turn.tool_calls"] == 8

    records = otel.logs("turnguard.loop_detected")
    assert [(r.attributes["turnguard.loop.level"], r.attributes["turnguard.loop.action"]) for r in records] == [
        ("warn", "allow"),  # unattended: the warning is observed
        ("stop", "halt"),
    ]
    stop = records[-1]
    assert stop.attributes["turnguard.loop.threshold"] == "streak"
    assert stop.attributes["turnguard.loop.failing_streak_length"] == 8
    assert stop.span_id == tool_spans[-1].context.span_id  # emitted in the offending call's span
    assert "a.py" not in repr(dict(stop.attributes))  # never the arguments


def test_remind_model_appends_the_reminder_to_the_fifth_identical_calls_result(ran):
    seen = []

    def respond(messages, info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", ()) if p.part_kind == "tool-return"]
        seen.extend(p.content for p in returns[len(seen) :])
        if len(returns) < 6:
            return ModelResponse(parts=[ToolCallPart("read_file", {"path": "a.py"}, tool_call_id=f"c{len(returns)}")])
        return ModelResponse(parts=[TextPart("done")])

    guard = tg.Guard(tg.GuardConfig(remind_model=True))
    agent = agent_with(FunctionModel(respond), TurnGuardCapability(guard), ran, fail=False)
    assert agent.run_sync("poll").output == "done"
    assert [("[turnguard] You have called read_file 5 times" in c) for c in seen] == [False] * 4 + [True, False]


def test_an_attended_stop_after_a_failure_is_asked_on_the_models_next_call(ran):
    """The eighth failure has already run, so the question rides on the next call's approval."""
    asked = []

    def approve(ctx, requests: DeferredToolRequests) -> DeferredToolResults:
        ours = approval_requests(requests)
        asked.extend((requests.metadata[c.tool_call_id]["turnguard"]["level"], c.tool_call_id) for c in ours)
        return requests.build_results(approvals={c.tool_call_id: True for c in ours})

    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    calls = [("read_file", {"path": "a.py"})] * 10
    capability = TurnGuardCapability(guard, ask=APPROVAL)
    agent = agent_with(scripted(calls), capability, ran, fail=True, also=[HandleDeferredToolCalls(handler=approve)])
    assert agent.run_sync("read a.py").output == "done"
    assert asked == [("stop", "call-8")]
    assert len(ran) == 10


def test_an_ask_that_is_neither_a_callback_nor_approval_is_refused():
    with pytest.raises(ValueError, match="'aproval'"):
        TurnGuardCapability(tg.Guard(), ask="aproval")


# -- the turn ends on every exit path ----------------------------------------------------------


def test_a_tool_that_raises_an_unhandled_error_ends_the_turn_with_error(turn_ends):
    agent = Agent(scripted([("read_file", {"path": "a.py"})]), capabilities=[TurnGuardCapability(turn_ends.guard())])
    ran = []

    @agent.tool_plain
    def read_file(path: str) -> str:
        ran.append(path)
        raise OSError(f"{path}: disk gone")

    with pytest.raises(OSError, match="disk gone"):
        agent.run_sync("read a.py")
    summary = turn_ends.assert_ended("error")
    assert summary.tool_calls == 1 and ran == ["a.py"]


def test_a_cancelled_async_run_ends_the_turn_as_cancelled(turn_ends):
    async def start(started):
        agent = Agent(
            scripted([("wait_for_input", {"prompt": "?"})]), capabilities=[TurnGuardCapability(turn_ends.guard())]
        )

        @agent.tool_plain
        async def wait_for_input(prompt: str) -> str:
            return await wait_forever(started)

        return await agent.run("go")

    cancel_once_started(start)
    turn_ends.assert_ended("cancelled")


def test_pydantic_ais_own_request_limit_ends_the_turn_with_error(ran, turn_ends):
    calls = [("read_file", {"path": f"f{i}.py"}) for i in range(10)]
    agent = agent_with(scripted(calls), TurnGuardCapability(turn_ends.guard()), ran, fail=False)
    with pytest.raises(UsageLimitExceeded):
        agent.run_sync("read them", usage_limits=UsageLimits(request_limit=3))
    turn_ends.assert_ended("error")


# -- identical calls in one response (the core's rule for a parallel batch) ----------------------


def one_batch(name: str, args: dict, n: int) -> FunctionModel:
    """A model whose first response holds ``n`` identical calls, then answers "done"."""

    def respond(messages, info: AgentInfo) -> ModelResponse:
        if _tool_returns(messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{k}") for k in range(n)])

    return FunctionModel(respond)


def test_of_ten_identical_failing_calls_in_one_response_at_most_eight_run_unattended(ran):
    agent = agent_with(one_batch("read_file", {"path": "a.py"}, 10), TurnGuardCapability(tg.Guard()), ran, fail=True)
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.run_sync("read a.py")
    assert len(ran) <= 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK


def test_ten_identical_calls_in_one_attended_response_ask_the_stop_level_once(ran):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict.event.level)
        return "continue"

    capability = TurnGuardCapability(tg.Guard(tg.GuardConfig(streak_warn_at=0)), ask=ask)
    agent = agent_with(one_batch("read_file", {"path": "a.py"}, 10), capability, ran, fail=True)
    agent.run_sync("read a.py")
    assert asked == [tg.Level.STOP]


# -- a turn that survives the process: deferred tool calls, message history and turn_state ------

RESUMABLE_RUN = '''
import json, sys
from pathlib import Path
from pydantic_ai import Agent, ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
import turnguard as tg
from turnguard.integrations.pydantic_ai import APPROVAL, TurnGuardCapability, TurnGuardHalted, turn_state

phase, folder, use_state = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "with-state"


def respond(messages, info):
    done = sum(1 for m in messages for p in getattr(m, "parts", ()) if p.part_kind == "tool-return")
    if done < 20:
        return ModelResponse(parts=[ToolCallPart("read_file", {"path": "a.py"}, tool_call_id=f"call-{done}")])
    return ModelResponse(parts=[TextPart("done")])


config = tg.GuardConfig(max_tool_calls_per_turn=6,  # the defaults otherwise: no key shared by the processes
                        disable_plugins=("otel", "recorder", "shadow"), load_entrypoints=False)
guard = tg.Guard(config, environ={})
ended = []


class Ends:
    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary):
        ended.append(summary.reason)


guard.register(Ends(), "ends")
agent = Agent(FunctionModel(respond), capabilities=[TurnGuardCapability(guard, ask=APPROVAL)],
              output_type=[str, DeferredToolRequests])
ran = []


@agent.tool_plain
def read_file(path: str) -> str:
    ran.append(path)
    return "contents"


if phase == "start":
    result = agent.run_sync("poll a.py")
    (folder / "messages.json").write_bytes(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
    (folder / "turn.json").write_text(json.dumps(turn_state(result)))
    asked = [call.tool_call_id for call in result.output.approvals]
    (folder / "asked.json").write_text(json.dumps(asked))
    print(json.dumps({"ran": len(ran), "asked": asked, "ended": ended}))
else:
    history = ModelMessagesTypeAdapter.validate_json((folder / "messages.json").read_bytes())
    answer = phase == "approve"
    results = DeferredToolResults(approvals={i: answer for i in json.loads((folder / "asked.json").read_text())})
    state = json.loads((folder / "turn.json").read_text())
    try:
        out = agent.run_sync(message_history=history, deferred_tool_results=results,
                             metadata={"turnguard": state} if use_state else None)
        deferred = isinstance(out.output, DeferredToolRequests)
        print(json.dumps({"ran": len(ran), "output": "deferred" if deferred else out.output, "ended": ended}))
    except TurnGuardHalted as stop:
        print(json.dumps({"ran": len(ran), "halted": str(stop), "ended": ended}))
'''


@pytest.fixture
def two_processes(tmp_path):
    """Runs a phase of ``RESUMABLE_RUN`` in a fresh Python process; the state lives in ``tmp_path``."""
    program = tmp_path / "agent.py"
    program.write_text(RESUMABLE_RUN, encoding="utf-8")

    def run_phase(phase: str, state: str = "with-state") -> dict:
        done = subprocess.run(
            [sys.executable, str(program), phase, str(tmp_path), state], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run_phase


def test_a_deferred_turn_goes_on_in_a_fresh_process_from_the_message_history_and_turn_state(two_processes):
    """Process 1 runs 4 calls; the 5th identical one is deferred for approval. Process 2 restores
    the message history and the turn's state, approves: the turn still holds the first 5 calls, so
    the explicit cap of 6 stops the turn's 7th call after 2 more."""
    first = two_processes("start")
    assert first == {"ran": 4, "asked": ["call-4"], "ended": []}  # put aside: not reported here
    second = two_processes("approve")
    assert second["ran"] == 2  # call 4 (approved) and call 5
    assert "threshold explicit (stop, limit 6); 7 tool calls" in second["halted"]
    assert second["ended"] == ["halted"]  # the process that finished the turn reported it, once


def test_without_the_turn_state_the_resumed_run_starts_a_new_turn(two_processes):
    """The control: the same resume without ``turn_state`` counts from zero, so the cap of 6 never
    stops it (the new turn's own streak asks again at its 5th call)."""
    two_processes("start")
    second = two_processes("approve", "without-state")
    assert second == {"ran": 4, "output": "deferred", "ended": []}


def test_a_denial_in_a_fresh_process_stops_the_resumed_turn_as_the_users_answer(two_processes):
    two_processes("start")
    second = two_processes("deny")
    assert second == {"ran": 0, "halted": second["halted"], "ended": ["halted"]}
    assert "stopped by the user" in second["halted"]


def test_a_turn_state_from_a_guard_with_another_digest_key_is_refused(ran):
    first_guard = tg.Guard(tg.GuardConfig(digest_key="one"))
    calls = [("read_file", {"path": "a.py"})] * 7
    agent = agent_with(scripted(calls), TurnGuardCapability(first_guard, ask=APPROVAL), ran, fail=False,
                       output_type=[str, DeferredToolRequests])
    first = agent.run_sync("poll a.py")
    state = turn_state(first)
    assert state is not None and json.loads(json.dumps(state)) == state
    other = agent_with(scripted(calls), TurnGuardCapability(tg.Guard(tg.GuardConfig(digest_key="two")), ask=APPROVAL),
                       [], fail=False, output_type=[str, DeferredToolRequests])
    with pytest.raises(tg.SnapshotError, match="digest key"):
        other.run_sync(message_history=first.all_messages(), metadata={"turnguard": state},
                       deferred_tool_results=first.output.build_results(approve_all=True))


def test_turn_state_is_none_when_turnguard_asked_nothing(ran):
    agent = agent_with(scripted([("read_file", {"path": "a.py"})]), TurnGuardCapability(tg.Guard()), ran, fail=False)
    assert turn_state(agent.run_sync("read a.py")) is None


# -- a deferred approval puts the turn aside; the resumed run ends it once ----------------------


@pytest.mark.parametrize("with_state", [False, True], ids=["history-only", "with-turn-state"])
def test_a_deferred_run_and_its_resume_are_one_turn_ended_once(ran, turn_ends, with_state):
    calls = [("read_file", {"path": "a.py"})] * 7
    agent = agent_with(scripted(calls), TurnGuardCapability(turn_ends.guard(), ask=APPROVAL), ran, fail=False,
                       output_type=[str, DeferredToolRequests])
    first = agent.run_sync("poll a.py")
    assert isinstance(first.output, DeferredToolRequests) and len(ran) == 4
    assert turn_ends.summaries == []  # put aside, not ended: no summary, no metric point
    (ours,) = approval_requests(first.output)
    resumed = agent.run_sync(
        message_history=first.all_messages(),
        deferred_tool_results=first.output.build_results(approvals={ours.tool_call_id: True}),
        metadata={"turnguard": turn_state(first)} if with_state else None,
    )
    assert resumed.output == "done" and len(ran) == 7
    assert turn_ends.assert_ended("completed").tool_calls == 7


# -- a question holds the rest of its batch, on every route -------------------------------------

FIRST_QUESTION = {"defaults": ({}, 4), "warn-off": ({"streak_warn_at": 0}, 8)}
"""Guard options, and how many of a batch of identical failing calls come before its first
question: the warn level at the 5th call, or (warn off) the stop level at the 9th, which the 8
waiting before it count toward."""


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_deferred_question_holds_its_batch_and_a_denial_runs_none_of_it(ran, turn_ends, options, before):
    capability = TurnGuardCapability(turn_ends.guard(tg.GuardConfig(**options)), ask=APPROVAL)
    agent = agent_with(one_batch("read_file", {"path": "a.py"}, 30), capability, ran, fail=True,
                       output_type=[str, DeferredToolRequests])
    first = agent.run_sync("read a.py")
    assert len(ran) == before  # the calls after the question were deferred with it
    ours = approval_requests(first.output)
    assert len(ours) == 30 - before
    assert [first.output.metadata[c.tool_call_id]["turnguard"]["held"] for c in ours] == [False] + [True] * (
        29 - before)
    denied = first.output.build_results(approvals={c.tool_call_id: False for c in ours})
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        agent.run_sync(message_history=first.all_messages(), deferred_tool_results=denied)
    assert len(ran) == before
    assert turn_ends.assert_ended("halted").tool_calls == before + 1


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_held_call_approved_without_its_question_is_the_users_stop(ran, options, before):
    """The question is answered first (its call comes first in the batch): a held call approved
    while its question was denied does not run."""
    capability = TurnGuardCapability(tg.Guard(tg.GuardConfig(**options)), ask=APPROVAL)
    agent = agent_with(one_batch("read_file", {"path": "a.py"}, 30), capability, ran, fail=True,
                       output_type=[str, DeferredToolRequests])
    first = agent.run_sync("read a.py")
    question, *held = approval_requests(first.output)
    answers = {question.tool_call_id: False, **{c.tool_call_id: True for c in held}}
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        agent.run_sync(message_history=first.all_messages(),
                       deferred_tool_results=first.output.build_results(approvals=answers))
    assert len(ran) == before


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_an_approved_question_releases_its_batch_up_to_the_next_question(ran, options, before):
    """Approved inline, the held calls are checked in order and run; the next question (the streak
    asks again) cannot pause a batch that is already resuming, so from it on the batch does not
    run: the model is told, and the question waits for the model's next call."""
    seen = []

    def approve(ctx, requests: DeferredToolRequests) -> DeferredToolResults:
        ours = approval_requests(requests)
        seen.append((len(ran), len(ours)))
        return requests.build_results(approvals={c.tool_call_id: True for c in ours})

    def respond(messages, info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", ()) if p.part_kind == "tool-return"]
        if returns:
            told.extend(p.content for p in returns if str(p.content).startswith("Not executed"))
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("read_file", {"path": "a.py"}, tool_call_id=f"c{k}")
                                    for k in range(30)])

    told = []
    capability = TurnGuardCapability(tg.Guard(tg.GuardConfig(**options)), ask=APPROVAL)
    handler = HandleDeferredToolCalls(handler=approve)
    agent = agent_with(FunctionModel(respond), capability, ran, fail=True, also=[handler])
    assert agent.run_sync("read a.py").output == "done"
    assert seen == [(before, 30 - before)]
    assert len(ran) + len(told) == 30 and len(ran) > before + 1  # the held calls ran up to the next question
    assert all("the user is asked at the next call" in t for t in told)


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_callback_question_holds_the_calls_after_it_until_the_user_refuses(ran, options, before):
    """pydantic-ai runs a response's calls as concurrent tasks: while the async callback takes its
    time, the calls after the one asked about wait for the answer instead of running."""
    asked = []

    async def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict)
        await asyncio.sleep(0.2)
        return "stop"

    capability = TurnGuardCapability(tg.Guard(tg.GuardConfig(**options)), ask=ask)
    agent = agent_with(one_batch("read_file", {"path": "a.py"}, 30), capability, ran, fail=True)
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        agent.run_sync("read a.py")
    assert len(asked) == 1 and len(ran) == before


def test_a_model_that_raises_ends_the_turn_with_error(ran, turn_ends):
    def respond(messages, info: AgentInfo) -> ModelResponse:
        if _tool_returns(messages):
            raise ConnectionError("the model is unreachable")
        return ModelResponse(parts=[ToolCallPart("read_file", {"path": "a.py"}, tool_call_id="c0")])

    agent = agent_with(FunctionModel(respond), TurnGuardCapability(turn_ends.guard()), ran, fail=False)
    with pytest.raises(ConnectionError):
        agent.run_sync("read a.py")
    assert turn_ends.assert_ended("error").tool_calls == 1


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


def test_a_deferred_run_dropped_past_the_bound_is_suspended_not_reported(ran, monkeypatch):
    import turnguard.integrations.pydantic_ai as adapter

    monkeypatch.setattr(adapter, "MAX_PARKED", 1)
    closes, guard = Closes(), tg.Guard()
    guard.register(closes, "closes")
    capability = TurnGuardCapability(guard, ask=APPROVAL)
    for _ in range(3):  # past the bound, and reusing the call ids of the run before (scripted ids)
        agent = agent_with(scripted([("read_file", {"path": "a.py"})] * 7), capability, ran, fail=False,
                           output_type=[str, DeferredToolRequests])
        assert isinstance(agent.run_sync("poll a.py").output, DeferredToolRequests)
    assert len(closes.suspended) == 2 and closes.ended == []


def test_a_tools_own_deferred_approval_puts_the_turn_aside_too(turn_ends):
    """A run paused on the tool's own approval is one turn with its resume, as turnguard's are."""
    agent = Agent(scripted([("delete_file", {"path": "a.py"})]), capabilities=[TurnGuardCapability(turn_ends.guard())],
                  output_type=[str, DeferredToolRequests])
    deleted = []

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        deleted.append(path)
        return "deleted"

    first = agent.run_sync("clean up")
    assert isinstance(first.output, DeferredToolRequests) and approval_requests(first.output) == []
    assert turn_ends.summaries == [] and turn_state(first) is not None
    resumed = agent.run_sync(message_history=first.all_messages(),
                             deferred_tool_results=first.output.build_results(approve_all=True))
    assert resumed.output == "done" and deleted == ["a.py"]
    assert turn_ends.assert_ended("completed").tool_calls == 1


def test_an_instrumented_deferred_run_and_its_resume_record_no_turn_state(ran, otel):
    """A durable turn's state carries the key its call digests are made with (and the digests are
    on the detection events): neither the deferred output nor the resumed run's metadata, which
    pydantic-ai records on its run spans, holds it."""
    from pydantic_ai.capabilities import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    guard = tg.Guard(tg.GuardConfig(), **otel.providers())
    instrumented = Instrumentation(InstrumentationSettings(tracer_provider=otel.tracer_provider))
    agent = agent_with(scripted([("read_file", {"path": "a.py"})] * 7), TurnGuardCapability(guard, ask=APPROVAL), ran,
                       fail=False, also=[instrumented], output_type=[str, DeferredToolRequests])
    first = agent.run_sync("poll a.py")
    state = turn_state(first)
    assert state is not None and state["turn_key"]
    resumed = agent.run_sync(message_history=first.all_messages(), metadata={"turnguard": state},
                             deferred_tool_results=first.output.build_results(approve_all=True))
    assert resumed.output == "done"
    recorded = json.dumps([dict(s.attributes) for s in otel.spans()], default=str)
    assert state["turn_key"] not in recorded and "turn_key" not in recorded


@pytest.mark.parametrize("changing", [True, False])
def test_a_polling_tools_return_value_is_its_result_and_a_changed_one_is_progress(changing, turn_ends):
    answers, polled = iter(ci_statuses(changing)), []
    model = scripted([("ci_status", {"run": 42})] * POLLS)
    agent = Agent(model, capabilities=[TurnGuardCapability(turn_ends.guard(POLLING))])

    @agent.tool_plain
    def ci_status(run: int) -> dict:
        polled.append(run)
        return {"run": run, "status": next(answers)}

    if changing:
        assert agent.run_sync("wait for the CI run", usage_limits=NO_REQUEST_LIMIT).output == "done"
    else:
        with pytest.raises(TurnGuardHalted):
            agent.run_sync("wait for the CI run", usage_limits=NO_REQUEST_LIMIT)
    assert_polled(turn_ends, changing, len(polled))


@pytest.mark.parametrize("changing", [True, False])
def test_a_polling_tool_that_fails_while_pending_makes_progress_when_its_error_changes(changing, turn_ends):
    answers, polled = iter([f"pending, {n if changing else 5} ahead" for n in range(POLLS, 0, -1)]), []
    model = scripted([("ci_status", {"run": 42})] * POLLS)
    agent = Agent(model, capabilities=[TurnGuardCapability(turn_ends.guard(POLLING))])

    @agent.tool_plain
    def ci_status(run: int) -> str:
        polled.append(run)
        raise ToolFailed(next(answers))

    if changing:
        assert agent.run_sync("wait for the CI run", usage_limits=NO_REQUEST_LIMIT).output == "done"
        assert len(polled) == POLLS and dict(turn_ends.summaries[-1].result_restarts) == {"ci_status": POLLS - 1}
    else:
        with pytest.raises(TurnGuardHalted):
            agent.run_sync("wait for the CI run", usage_limits=NO_REQUEST_LIMIT)
        assert len(polled) == 8


# -- a damaged turn state is refused before its turn is resumed ----------------------------------

from damaged_sections import Summaries, state_mutants  # noqa: E402

SECTION = {"asked": {"call-4": "read_file"}, "held": []}
"""What a run deferred at its fifth identical call keeps under ``pydantic_ai`` (checked below)."""
DAMAGED = state_mutants("pydantic_ai", SECTION)


def polling_agent(guard: tg.Guard) -> Agent:
    return agent_with(scripted([("read_file", {"path": "a.py"})] * 7), TurnGuardCapability(guard, ask=APPROVAL), [],
                      fail=False, output_type=[str, DeferredToolRequests])


@pytest.fixture(scope="module")
def deferred():
    """A run deferred for approval at its fifth identical call, and its turn state as stored."""
    first = polling_agent(Summaries().guard()).run_sync("poll a.py")
    return first, json.loads(json.dumps(turn_state(first)))


def resumed(guard: tg.Guard, first, state) -> object:
    return polling_agent(guard).run_sync(message_history=first.all_messages(), metadata={"turnguard": state},
                                         deferred_tool_results=first.output.build_results(approve_all=True))


@pytest.mark.parametrize("what", DAMAGED)
def test_a_damaged_section_is_refused_by_name_and_the_right_state_resumes_the_same_turn(deferred, what):
    """Every field of the adapter's section damaged (another type, bad entries, past its bound,
    unknown), and the whole state: a ``tg.SnapshotError`` naming the field, before any turn is
    resumed, so the correct state resumed afterwards in the same guard keeps the turn's id."""
    first, state = deferred
    assert state["pydantic_ai"] == SECTION
    field, damage = DAMAGED[what]
    summaries = Summaries()
    guard = summaries.guard()
    with pytest.raises(tg.SnapshotError) as refused:
        resumed(guard, first, damage(state))
    assert refused.value.field == field
    assert resumed(guard, first, copy.deepcopy(state)).output == "done"
    (summary,) = summaries.summaries
    assert (summary.turn_id, summary.resumed_from, summary.reason) == (state["turn"]["turn_id"], None, "completed")


# -- calls pydantic-ai refuses before they run, and batches a halt cuts short -------------------


class Calls:
    """The checks and outcomes a turn saw, and the outcomes it ignored (a host error)."""

    def __init__(self) -> None:
        self.checks: list[tuple[str | None, str]] = []
        self.outcomes: dict[str | None, list[tg.Outcome]] = {}
        self.ignored: list[str] = []

    @tg.hookimpl
    def turnguard_call_checked(self, turn, call, verdict) -> None:
        self.checks.append((call.call_id, verdict.action.label))

    @tg.hookimpl
    def turnguard_outcome_recorded(self, turn, call, outcome, verdict) -> None:
        self.outcomes.setdefault(call.call_id, []).append(outcome)

    @tg.hookimpl
    def turnguard_outcome_ignored(self, turn, call, outcome, reason) -> None:
        self.ignored.append(reason)

    def guard(self, config: tg.GuardConfig | None = None) -> tg.Guard:
        guard = tg.Guard(config or tg.GuardConfig())
        guard.register(self, "calls")
        return guard


def run(agent: Agent, asynchronous: bool, **kw):
    """``agent.run`` in an event loop, or ``agent.run_sync``: the two ways a host drives a run."""
    if asynchronous:
        return asyncio.run(agent.run("go", **kw))
    return agent.run_sync("go", **kw)


REFUSED = {
    "wrong-type": ("read_file", {"path": ["a.py"]}),
    "missing-argument": ("read_file", {}),
    "extra-argument": ("read_file", {"path": "a.py", "mode": "r"}),
    "misspelt-argument": ("read_file", {"pathx": "a.py"}),
    "not-json": ("read_file", '{"path": "a.py"'),
    "rejected-by-its-validator": ("checked_read", {"path": "/etc/passwd"}),
    "failed-by-its-validator": ("checked_read", {"path": "~/secret"}),
    "unknown-name": ("no_such_tool", {"path": "a.py"}),
}
"""Calls pydantic-ai refuses before their tool runs, each answered with a retry prompt (or a failed
result) the model reads: bad arguments (schema, JSON, the tool's own ``args_validator``) and a name
no tool has."""


def refusing_agent(model: FunctionModel, capability: TurnGuardCapability, ran: list, **kw) -> Agent:
    """``read_file`` and ``checked_read`` (whose validator refuses absolute paths by retry, home paths
    by failure), with their bodies logged in ``ran``; pydantic-ai's own retry budget set high, as a
    long-running host sets it."""
    agent = agent_with(model, capability, ran, fail=False, retries=20, **kw)

    def no_absolute_paths(ctx, path: str) -> None:
        if path.startswith("/"):
            raise ModelRetry("absolute paths are not allowed")
        if path.startswith("~"):
            raise ToolFailed("home paths are not readable")

    @agent.tool_plain(args_validator=no_absolute_paths)
    def checked_read(path: str) -> str:
        ran.append(path)
        return f"contents of {path}"

    return agent


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
@pytest.mark.parametrize("refused", REFUSED.values(), ids=REFUSED.keys())
def test_a_model_stuck_on_a_call_pydantic_ai_refuses_is_stopped_at_the_eighth(ran, refused, asynchronous):
    calls = Calls()
    agent = refusing_agent(forever(*refused), TurnGuardCapability(calls.guard()), ran)
    with pytest.raises(TurnGuardHalted) as stopped:  # a refusal by failure costs pydantic-ai no retry
        run(agent, asynchronous, usage_limits=UsageLimits(request_limit=30))
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert stopped.value.verdict.event.tool_calls == 8
    assert ran == []
    assert len(calls.checks) == 8 and list(calls.outcomes.values()) == [[tg.Outcome.ERROR]] * 8


BATCH_KINDS = {"runs": ("read_file", {"path": "a.py"}), "bad-arguments": REFUSED["wrong-type"],
               "validator": REFUSED["rejected-by-its-validator"], "unknown-name": REFUSED["unknown-name"]}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
def test_every_call_of_a_batch_is_checked_once_and_its_outcome_recorded_once_whether_refused_or_run(asynchronous):
    for n in (1, 2, 3):
        for kinds in itertools.product(BATCH_KINDS, repeat=n):
            calls, ran = Calls(), []
            script = [[BATCH_KINDS[kind] for kind in kinds]]
            agent = refusing_agent(batches(script), TurnGuardCapability(calls.guard()), ran)
            assert run(agent, asynchronous).output == "done"
            ids = [f"c0-{i}" for i in range(n)]
            assert sorted(call_id for call_id, _ in calls.checks) == ids, kinds
            expected = {call_id: [tg.Outcome.OK if kind == "runs" else tg.Outcome.ERROR]
                        for call_id, kind in zip(ids, kinds, strict=True)}
            assert calls.outcomes == expected, kinds
            assert calls.ignored == []


def batches(script: list[list[tuple[str, object]]]) -> FunctionModel:
    """A model whose k-th response holds the k-th batch of calls (ids ``c<k>-<i>``), then answers "done"."""
    responses = enumerate(script)

    def respond(messages, info: AgentInfo) -> ModelResponse:
        k, batch = next(responses, (None, None))
        if batch is None:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{k}-{i}")
                                    for i, (name, args) in enumerate(batch)])

    return FunctionModel(respond)


def test_a_halt_on_a_call_refused_for_its_arguments_stops_the_run_before_any_call_of_its_batch_runs():
    calls, ran = Calls(), []
    script = [[BATCH_KINDS["bad-arguments"]] * 3 + [BATCH_KINDS["runs"]]]
    capability = TurnGuardCapability(calls.guard(tg.GuardConfig(max_tool_calls_per_turn=2)))
    with pytest.raises(TurnGuardHalted) as stopped:
        refusing_agent(batches(script), capability, ran).run_sync("go")
    assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert ran == [] and [action for _, action in calls.checks] == ["allow", "allow", "halt"]


def test_a_halt_on_a_call_to_an_unknown_tool_stops_the_run_in_its_place_before_the_rest_of_its_batch_runs():
    calls, ran, requests = Calls(), [], []
    script = [[BATCH_KINDS["unknown-name"]] * 3 + [BATCH_KINDS["runs"]], [BATCH_KINDS["runs"]]]
    model = batches(script)
    counted = FunctionModel(lambda messages, info: requests.append(1) or model.function(messages, info))
    capability = TurnGuardCapability(calls.guard(tg.GuardConfig(max_tool_calls_per_turn=2)))
    with pytest.raises(TurnGuardHalted) as stopped:
        refusing_agent(counted, capability, ran).run_sync("go")
    assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert len(requests) == 1 and ran == []  # the third call halted: the fourth, after it, did not run
    assert calls.checks == [("c0-0", "allow"), ("c0-1", "allow"), ("c0-2", "halt")]


REFUSED_KINDS = ("bad-arguments", "validator", "unknown-name")


def positions() -> list[tuple[str, ...]]:
    """Every batch of one to three calls with at least one refused call, in every position."""
    return [kinds for n in (1, 2, 3) for kinds in itertools.product(BATCH_KINDS, repeat=n)
            if any(kind in REFUSED_KINDS for kind in kinds)]


def assert_each_call_checked_once_in_the_models_order(calls: Calls, kinds: tuple[str, ...], where) -> None:
    ids = [f"c0-{i}" for i in range(len(kinds))]
    assert [call_id for call_id, _ in calls.checks] == ids, where
    assert calls.outcomes == {call_id: [tg.Outcome.OK if kind == "runs" else tg.Outcome.ERROR]
                              for call_id, kind in zip(ids, kinds, strict=True)}, where
    assert calls.ignored == [], where


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
@pytest.mark.parametrize("ending", ["next-request-answers", "request-limit", "deferred-output"])
def test_a_refused_call_is_checked_in_its_place_in_the_batch_however_the_run_ends(asynchronous, ending):
    """Refused for its arguments (the schema, the tool's validator) or its name, first, between or
    last: checked in the model's order, its outcome recorded once, whether the model is asked
    again, pydantic-ai's request limit ends the run there, or the run ends deferred (a tool of the
    batch asks for approval itself)."""
    for kinds in positions():
        calls, ran = Calls(), []
        batch = [BATCH_KINDS[kind] for kind in kinds]
        if ending == "deferred-output":
            batch.append(("needs_approval", {}))
        agent = refusing_agent(batches([batch]), TurnGuardCapability(calls.guard()), ran,
                               output_type=[str, DeferredToolRequests])

        @agent.tool(requires_approval=True)
        def needs_approval(ctx) -> str:
            return "approved"

        if ending == "request-limit":
            with pytest.raises(UsageLimitExceeded):
                run(agent, asynchronous, usage_limits=UsageLimits(request_limit=1))
        else:
            output = run(agent, asynchronous).output
            assert isinstance(output, DeferredToolRequests) if ending == "deferred-output" else output == "done"
        assert_each_call_checked_once_in_the_models_order(calls, kinds, (ending, kinds))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
@pytest.mark.parametrize("end_strategy", ["graceful", "exhaustive"])
def test_a_refused_call_beside_the_final_output_is_checked_in_its_place(asynchronous, end_strategy):
    """The response that ends the run with its output tool's result still refuses the calls made beside it."""
    for kinds in positions():
        for output_at in range(len(kinds) + 1):
            calls, ran = Calls(), []
            batch = [BATCH_KINDS[kind] for kind in kinds]
            batch.insert(output_at, ("final_result", {"response": 7}))
            ids = [f"c0-{i}" for i in range(len(batch)) if i != output_at]
            agent = refusing_agent(then_the_output(batch), TurnGuardCapability(calls.guard()), ran,
                                   output_type=int, end_strategy=end_strategy)
            assert run(agent, asynchronous).output == 7
            where = (end_strategy, kinds, output_at)
            assert [call_id for call_id, _ in calls.checks] == ids, where
            assert calls.outcomes == {call_id: [tg.Outcome.OK if kind == "runs" else tg.Outcome.ERROR]
                                      for call_id, kind in zip(ids, kinds, strict=True)}, where
            assert calls.ignored == [], where


def then_the_output(batch: list[tuple[str, object]]) -> FunctionModel:
    """A model whose first response is ``batch`` (ids ``c0-<i>``), then only the output tool's call."""
    responses = itertools.count()

    def respond(messages, info: AgentInfo) -> ModelResponse:
        k = next(responses)
        if k:
            return ModelResponse(parts=[ToolCallPart("final_result", {"response": 7}, tool_call_id=f"f{k}")])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c0-{i}")
                                    for i, (name, args) in enumerate(batch)])

    return FunctionModel(respond)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
@pytest.mark.parametrize("refused", REFUSED_KINDS)
def test_a_refused_call_in_a_batch_a_tools_error_ends_is_still_checked_and_recorded(asynchronous, refused):
    """A tool that raises (not a retry) ends the run inside its batch: the refused calls of the batch
    are checked and recorded before the turn ends, in the model's order."""
    for kinds in [("fails", refused), (refused, "fails"), (refused, "fails", refused)]:
        calls, ran = Calls(), []
        script = [[("crash", {}) if kind == "fails" else BATCH_KINDS[kind] for kind in kinds]]
        agent = refusing_agent(batches(script), TurnGuardCapability(calls.guard()), ran)

        @agent.tool_plain
        def crash() -> str:
            raise OSError("disk gone")

        with pytest.raises(OSError, match="disk gone"):
            run(agent, asynchronous)
        assert_each_call_checked_once_in_the_models_order(calls, kinds, kinds)  # the crash is an ERROR too


@pytest.mark.parametrize("refused", REFUSED_KINDS)
def test_a_halt_lands_on_the_call_the_models_order_puts_past_the_cap(refused):
    """The explicit cap of two halts the third call of the batch, whichever kind it is: the calls
    before it are allowed (the valid ones run), none after it runs."""
    for kinds in itertools.product(("runs", refused), repeat=4):
        calls, ran = Calls(), []
        script = [[BATCH_KINDS[kind] for kind in kinds]]
        capability = TurnGuardCapability(calls.guard(tg.GuardConfig(max_tool_calls_per_turn=2)))
        with pytest.raises(TurnGuardHalted) as stopped:
            refusing_agent(batches(script), capability, ran).run_sync("go")
        assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT, kinds
        assert calls.checks[:3] == [("c0-0", "allow"), ("c0-1", "allow"), ("c0-2", "halt")], kinds
        assert len(ran) <= kinds[:2].count("runs"), kinds  # (a thread may not have started its body)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
def test_a_resumed_run_does_not_check_again_the_calls_its_first_run_refused(asynchronous):
    for kinds in positions():
        calls, ran = Calls(), []
        batch = [*(BATCH_KINDS[kind] for kind in kinds), ("needs_approval", {})]
        agent = refusing_agent(batches([batch]), TurnGuardCapability(calls.guard()), ran,
                               output_type=[str, DeferredToolRequests])

        @agent.tool(requires_approval=True)
        def needs_approval(ctx) -> str:
            return "approved"

        first = run(agent, asynchronous)
        approval = first.output.approvals[0].tool_call_id
        history, answers = first.all_messages(), DeferredToolResults(approvals={approval: True})
        second = (asyncio.run(agent.run(message_history=history, deferred_tool_results=answers)) if asynchronous
                  else agent.run_sync(message_history=history, deferred_tool_results=answers))
        assert second.output == "done", kinds
        ids = [f"c0-{i}" for i in range(len(kinds))]
        assert [call_id for call_id, _ in calls.checks] == [*ids, approval], kinds
        assert calls.ignored == [], kinds


def stop(verdict: tg.Verdict) -> str:
    return "stop"


@pytest.mark.parametrize("ask", [APPROVAL, stop], ids=["approval", "callback-stop"])
@pytest.mark.parametrize("refused", ["bad-arguments", "unknown-name"])
def test_an_attended_run_stuck_on_a_refused_call_is_stopped_though_no_approval_can_be_asked(ran, ask, refused):
    calls = Calls()
    agent = refusing_agent(forever(*BATCH_KINDS[refused]), TurnGuardCapability(calls.guard(), ask=ask), ran,
                           output_type=[str, DeferredToolRequests])
    with pytest.raises(TurnGuardHalted) as stopped:
        agent.run_sync("go", usage_limits=UsageLimits(request_limit=30))
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert ran == [] and len(calls.checks) <= 9


class SlowAfterHook(AbstractCapability[Any]):
    """Another capability whose ``after_tool_execute`` awaits: a cancellation lands after the body returned."""

    async def after_tool_execute(self, ctx, *, call, tool_def, args, result):
        await asyncio.sleep(0.05)
        return result


BODIES = {"sync-in-a-thread": tg.Outcome.ERROR, "async-awaiting": tg.Outcome.ERROR, "async-returned": tg.Outcome.OK}
"""How the calls let run beside the one that stops the run end, by their tool's body: cut off while it
runs (ERROR), or returned before the cancellation reached the adapter (its own outcome)."""
CUT_SHORT = [(n, k) for n in (2, 3, 4) for k in range(2, n + 1)]
"""(calls in the response, the one that stops the run): every position in batches of two to four."""


def cut_short_agent(n: int, body: str, capability: TurnGuardCapability, ran: list) -> Agent:
    model = batches([[("read_file", {"path": "a.py"})] * n])
    agent = Agent(model, capabilities=[SlowAfterHook(), capability] if body == "async-returned" else [capability])
    if body == "sync-in-a-thread":

        @agent.tool_plain
        def read_file(path: str) -> str:
            ran.append(path)
            time.sleep(0.3)
            return "contents"
    else:

        @agent.tool_plain
        async def read_file(path: str) -> str:
            ran.append(path)
            if body == "async-awaiting":
                await asyncio.Event().wait()
            return "contents"

    return agent


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_sync", "run"])
@pytest.mark.parametrize("ending", ["halt", "user-stop"])
@pytest.mark.parametrize("body", BODIES)
def test_the_calls_let_run_beside_the_call_that_stops_the_run_have_their_outcome_recorded(body, ending, asynchronous):
    for n, k in CUT_SHORT:
        calls, ran = Calls(), []
        if ending == "halt":
            capability = TurnGuardCapability(calls.guard(tg.GuardConfig(max_tool_calls_per_turn=k - 1)))
        else:  # the k-th identical call asks the stop level; the user refuses it
            config = tg.GuardConfig(streak_warn_at=0, streak_stop_at=k - 1)
            capability = TurnGuardCapability(calls.guard(config), ask=stop)
        with pytest.raises(TurnGuardHalted):
            run(cut_short_agent(n, body, capability, ran), asynchronous)
        expected = {f"c0-{i}": [BODIES[body]] for i in range(k - 1)}
        if ending == "user-stop":
            expected[f"c0-{k - 1}"] = [tg.Outcome.DENIED]
        assert calls.outcomes == expected, (n, k)
        assert calls.ignored == [] and len(ran) <= k - 1  # (a thread may not have started its body)


def test_a_call_that_ran_while_a_sibling_was_asked_about_keeps_its_outcome_when_the_run_is_cancelled():
    calls = Calls()

    async def start(started: asyncio.Event):
        async def ask(verdict: tg.Verdict) -> str:
            return await wait_forever(started)  # the user never answers: the host gives up on the run

        capability = TurnGuardCapability(calls.guard(tg.GuardConfig(streak_warn_at=0, streak_stop_at=1)), ask=ask)
        agent = Agent(batches([[("read_file", {"path": "a.py"})] * 2]), capabilities=[capability])

        @agent.tool_plain
        async def read_file(path: str) -> str:
            await asyncio.sleep(0)  # the second call is checked (and asked about) meanwhile
            return "contents"

        return await agent.run("go")

    cancel_once_started(start)
    assert calls.outcomes == {"c0-0": [tg.Outcome.OK]} and calls.ignored == []


class _Answer(BaseModel):
    answer: str


def _part(name: str, args: dict, call_id: str) -> ToolCallPart:
    return ToolCallPart(name, args, tool_call_id=call_id)


RETRY_SCRIPTS = {
    # (response i -> parts; the run's output type; whether the output validator retries once; the tool raises)
    "text_and_call_output_retried": (lambda i: [TextPart("hi"), _part("read_file", {"path": "a"}, f"c{i}")]
                                     if i < 2 else [TextPart("done")], str, True, None),
    "call_and_output_tool_retried": (lambda i: [_part("read_file", {"path": "a"}, f"c{i}"),
                                                _part("final_result", {"answer": "x"}, f"f{i}")], _Answer, True, None),
    "call_and_invalid_output_tool": (lambda i: [_part("read_file", {"path": "a"}, f"c{i}"), _part(
        "final_result", {"wrong": 1} if i == 0 else {"answer": "y"}, f"f{i}")], _Answer, False, None),
    "tool_model_retry_until_spent": (lambda i: [_part("read_file", {"path": "a"}, f"c{i}"),
                                                _part("read_file", {"path": "b"}, f"d{i}")], str, False, "retry"),
    "tool_failed": (lambda i: [_part("read_file", {"path": "a"}, f"c{i}")] if i < 3 else [TextPart("done")], str,
                    False, "failed"),
    "invalid_args_until_spent": (lambda i: [_part("read_file", {"nope": 1}, f"c{i}"),
                                            _part("read_file", {"path": "a"}, f"d{i}")], str, False, None),
}


@pytest.mark.parametrize("end_strategy", ["early", "exhaustive"])
@pytest.mark.parametrize("script", list(RETRY_SCRIPTS))
def test_every_checked_call_gets_one_outcome_through_each_retry_path(script, end_strategy):
    """pydantic-ai's retry paths: an output validator's ``ModelRetry`` (text or output tool), an
    output tool's invalid arguments, a tool's ``ModelRetry`` until the retry budget is spent (the
    run dies), ``ToolFailed``, arguments refused until the budget is spent; beside calls of the
    same response, under either ``end_strategy``: each call turnguard checked gets exactly one
    outcome, and the turn ends."""
    respond, output_type, validator_retries, raises = RETRY_SCRIPTS[script]
    responses = itertools.count()
    book = CallOutcomes()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",)), plugins={"book": book})
    agent = Agent(FunctionModel(lambda m, info: ModelResponse(parts=respond(next(responses)))),
                  capabilities=[TurnGuardCapability(guard)], output_type=output_type, end_strategy=end_strategy,
                  retries=3)

    @agent.tool_plain
    def read_file(path: str) -> str:
        if raises == "retry":
            raise ModelRetry("try another path")
        if raises == "failed":
            raise ToolFailed("no such file")
        return "contents"

    validated = itertools.count()

    @agent.output_validator
    def once(output: Any) -> Any:
        if validator_retries and next(validated) == 0:
            raise ModelRetry("say it again")
        return output

    with contextlib.suppress(AgentRunError):
        agent.run_sync("go")
    assert book.ended is not None
    outcomes = book.each_once()
    assert set(outcomes) <= {"ok", "error"}
    if raises is not None:
        assert outcomes and "ok" not in outcomes
