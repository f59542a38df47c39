"""Google ADK end to end: a real Runner driven by a scripted ``BaseLlm`` (no network), with the plugin."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import subprocess
import sys
from collections.abc import AsyncGenerator, Iterable

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

optional_dependency("google.adk")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.agents.invocation_context import LlmCallsLimitExceededError  # noqa: E402
from google.adk.agents.run_config import RunConfig  # noqa: E402
from google.adk.apps import App  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.plugins.base_plugin import BasePlugin  # noqa: E402
from google.adk.plugins.reflect_retry_tool_plugin import ReflectAndRetryToolPlugin  # noqa: E402
from google.adk.runners import InMemoryRunner, Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.adk.tools.tool_context import ToolContext  # noqa: E402
from google.genai import types  # noqa: E402

import turnguard as tg  # noqa: E402
from turnguard.integrations.google_adk import (  # noqa: E402
    TurnGuardPlugin,
    confirmation_answer,
    confirmation_requests,
    halt_of,
)

UNBOUNDED = RunConfig(max_llm_calls=0)
"""ADK's own budget (500 model calls) raised so that turnguard is what stops these runs."""


class ScriptedLlm(BaseLlm):
    """ADK's model interface playing a script: each step is a list of ``(name, args)`` calls made in
    one response, or a final text; past the script it answers "done"."""

    steps: object = None
    requests: int = 0

    async def generate_content_async(self, llm_request, stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        self.requests += 1
        step = next(self.steps, "done")
        if isinstance(step, str):
            parts = [types.Part(text=step)]
        else:
            parts = [
                types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"call-{self.requests}-{k}"))
                for k, (name, args) in enumerate(step)
            ]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def scripted(steps: Iterable) -> ScriptedLlm:
    return ScriptedLlm(model="scripted", steps=iter(steps))


def one_call_each(calls: Iterable[tuple[str, dict]]) -> ScriptedLlm:
    return scripted([call] for call in calls)


def forever(name: str, args: dict) -> ScriptedLlm:
    return scripted(itertools.repeat([(name, args)]))


class Session:
    """One runner and session; ``send`` runs an invocation and collects its events."""

    def __init__(self, model: ScriptedLlm, tools: list, plugins: list, run_config: RunConfig = UNBOUNDED) -> None:
        app = App(name="coding", root_agent=LlmAgent(name="coder", model=model, tools=tools), plugins=plugins)
        self.runner = InMemoryRunner(app=app)
        self.run_config = run_config
        self.session_id: str | None = None
        self.events: list = []

    async def asend(self, message: types.Content) -> list:
        if self.session_id is None:
            session = await self.runner.session_service.create_session(app_name=self.runner.app_name, user_id="u")
            self.session_id = session.id
        events = []
        async for event in self.runner.run_async(
            user_id="u", session_id=self.session_id, new_message=message, run_config=self.run_config
        ):
            events.append(event)
        self.events.extend(events)
        return events

    def send(self, text: str) -> list:
        return asyncio.run(self.asend(types.Content(role="user", parts=[types.Part(text=text)])))

    def confirm(self, request, confirmed: bool) -> list:
        response = types.FunctionResponse(name=request.name, id=request.id, response={"confirmed": confirmed})
        return asyncio.run(self.asend(types.Content(role="user", parts=[types.Part(function_response=response)])))

    def final_text(self) -> str:
        texts = [p.text for e in self.events if e.content for p in e.content.parts or () if p.text]
        return texts[-1] if texts else ""


@pytest.fixture
def ran() -> list:
    return []


@pytest.fixture
def read_file(ran):
    def read_file(path: str) -> dict:
        """Read a file."""
        ran.append(path)
        if path.startswith("missing"):
            return {"error": f"{path}: no such file"}
        return {"content": f"contents of {path}"}

    return read_file


@pytest.fixture
def raising_read_file(ran):
    def read_file(path: str) -> dict:
        """Read a file."""
        ran.append(path)
        raise FileNotFoundError(path)

    return read_file


def test_unattended_identical_failing_calls_stop_at_the_eighth_and_the_ninth_never_runs(ran, read_file, turn_ends):
    model = forever("read_file", {"path": "missing.py"})
    session = Session(model, [read_file], [TurnGuardPlugin(turn_ends.guard())])
    events = session.send("read it")
    assert len(ran) == 8
    assert halt_of(events)["threshold"] == "streak"
    assert session.final_text().startswith("turnguard stopped the run: threshold streak (stop, limit 8)")
    assert "8 failing" in session.final_text()
    assert model.requests == 8  # the run ended instead of asking the model again
    turn_ends.assert_ended("halted")


def test_a_raising_tool_recovered_by_adks_retry_plugin_counts_as_a_failure(ran, raising_read_file):
    plugins = [TurnGuardPlugin(tg.Guard()), ReflectAndRetryToolPlugin(max_retries=100)]
    session = Session(forever("read_file", {"path": "a.py"}), [raising_read_file], plugins)
    assert halt_of(session.send("read it"))["threshold"] == "streak"
    assert len(ran) == 8


def test_one_hundred_fifty_distinct_calls_complete_under_the_adaptive_cap(ran, read_file):
    model = one_call_each(("read_file", {"path": f"f{i}.py"}) for i in range(150))
    session = Session(model, [read_file], [TurnGuardPlugin(tg.Guard())])
    session.send("read them")
    assert session.final_text() == "done"
    assert len(ran) == 150


def test_explicit_cap_of_one_hundred_halts_call_one_hundred_one_before_its_body_runs(ran, read_file):
    model = one_call_each(("read_file", {"path": f"f{i}.py"}) for i in range(150))
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))
    session = Session(model, [read_file], [TurnGuardPlugin(guard)])
    assert halt_of(session.send("read them"))["threshold"] == "explicit"
    assert len(ran) == 100
    assert "threshold explicit (stop, limit 100); 101 tool calls" in session.final_text()
    responses = [
        p.function_response.response for e in session.events for p in e.content.parts or () if p.function_response
    ]
    assert responses[-1]["error"].startswith("Not executed: turnguard stopped the run: threshold explicit")


def test_attended_run_asks_the_callback_and_continue_lets_it_go_on(ran, read_file):
    asked = []

    async def ask(verdict: tg.Verdict) -> str:
        asked.append((verdict.event.level, verdict.event.streak_length))
        return "continue"

    model = one_call_each([("read_file", {"path": "a.py"})] * 7)
    session = Session(model, [read_file], [TurnGuardPlugin(tg.Guard(), ask=ask)])
    session.send("poll a.py")
    assert session.final_text() == "done"
    assert asked == [(tg.Level.WARN, 5)] and len(ran) == 7


def test_attended_run_reaches_the_user_through_adks_tool_confirmation_and_resumes(ran, read_file, turn_ends):
    model = one_call_each([("read_file", {"path": "a.py"})] * 7)
    session = Session(model, [read_file], [TurnGuardPlugin(turn_ends.guard(), ask="confirmation")])
    (request,) = confirmation_requests(session.send("poll a.py"))
    payload = request.args["toolConfirmation"]["payload"]["turnguard"]
    assert payload["threshold"] == "streak" and payload["level"] == "warn"
    assert len(ran) == 4 and turn_ends.summaries == []  # paused: the fifth has not run, the turn is open
    session.confirm(request, confirmed=True)
    assert session.final_text() == "done"
    assert len(ran) == 7
    summary = turn_ends.assert_ended("completed")
    assert summary.tool_calls == 7  # one turn across the pause; the confirmed call counted once


def test_a_refused_confirmation_is_the_users_stop(ran, read_file):
    model = one_call_each([("read_file", {"path": "a.py"})] * 7)
    session = Session(model, [read_file], [TurnGuardPlugin(tg.Guard(), ask="confirmation")])
    (request,) = confirmation_requests(session.send("poll a.py"))
    session.confirm(request, confirmed=False)
    assert "stopped by the user" in session.final_text()
    assert len(ran) == 4


def test_an_attended_stop_after_the_eighth_failure_is_confirmed_on_the_next_call(ran, read_file):
    model = one_call_each([("read_file", {"path": "missing.py"})] * 10)
    guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))
    session = Session(model, [read_file], [TurnGuardPlugin(guard, ask="confirmation")])
    (request,) = confirmation_requests(session.send("read it"))
    assert request.args["toolConfirmation"]["payload"]["turnguard"]["level"] == "stop" and len(ran) == 8
    session.confirm(request, confirmed=True)
    assert session.final_text() == "done" and len(ran) == 10


def test_promptable_without_a_route_falls_back_to_halting_at_the_stop_level(ran, read_file):
    session = Session(
        forever("read_file", {"path": "missing.py"}), [read_file], [TurnGuardPlugin(tg.Guard(), promptable=True)]
    )
    session.send("read it")
    assert "nobody could be asked" in session.final_text()
    assert len(ran) == 8


def test_parallel_calls_in_one_response_are_each_checked_and_recorded(ran, read_file, turn_ends):
    batch = [("read_file", {"path": f"f{i}.py"}) for i in range(3)]
    session = Session(scripted([batch, batch[:1]]), [read_file], [TurnGuardPlugin(turn_ends.guard())])
    session.send("read them")
    assert sorted(ran) == ["f0.py", "f0.py", "f1.py", "f2.py"]
    summary = turn_ends.assert_ended("completed")
    assert summary.tool_calls == 4
    calls = [s for s in turn_ends.otel.spans() if s.name == "execute_tool read_file"]
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in calls) == [
        "call-1-0",
        "call-1-1",
        "call-1-2",
        "call-2-0",
    ]


def test_the_runs_spans_and_loop_detected_events_are_recorded(ran, read_file, otel):
    guard = tg.Guard(tg.GuardConfig(), **otel.providers())
    session = Session(forever("read_file", {"path": "missing.py"}), [read_file], [TurnGuardPlugin(guard)])
    session.send("read it")
    turn_span = otel.span("invoke_agent coder")
    assert turn_span.attributes["turnguard.turn.outcome"] == "halted"
    assert turn_span.attributes["gen_ai.conversation.id"] == session.session_id
    tool_spans = [s for s in otel.spans() if s.name == "execute_tool read_file"]
    assert len(tool_spans) == 8
    assert all(s.parent.span_id == turn_span.context.span_id for s in tool_spans)
    records = otel.logs("turnguard.loop_detected")
    assert [(r.attributes["turnguard.loop.level"], r.attributes["turnguard.loop.action"]) for r in records] == [
        ("warn", "allow"),
        ("stop", "halt"),
    ]
    assert records[-1].span_id == tool_spans[-1].context.span_id


def test_remind_model_adds_the_reminder_to_the_fifth_identical_result(ran, read_file):
    model = one_call_each([("read_file", {"path": "a.py"})] * 6)
    session = Session(model, [read_file], [TurnGuardPlugin(tg.Guard(tg.GuardConfig(remind_model=True)))])
    session.send("poll")
    results = [
        p.function_response.response for e in session.events for p in e.content.parts or () if p.function_response
    ]
    assert [("You have called read_file 5 times" in str(r.get("turnguard", ""))) for r in results] == [False] * 4 + [
        True,
        False,
    ]


def test_an_ask_that_is_neither_a_callback_nor_confirmation_is_refused():
    with pytest.raises(ValueError, match="'confirm'"):
        TurnGuardPlugin(tg.Guard(), ask="confirm")


def test_the_example_stops_a_model_stuck_on_a_missing_file_and_prints_why(run_example):
    printed = run_example("google_adk_agent", model=forever("read_file", {"path": "missing.py"}))
    assert printed.startswith(STOPPED_AT_THE_EIGHTH_FAILURE.removeprefix("stopped: ")) and "8 failing" in printed


def test_the_example_completes_a_long_productive_turn(run_example):
    model = one_call_each(("read_file", {"path": f"f{i}.py"}) for i in range(150))
    assert run_example("google_adk_agent", model=model) == "done\n"


# -- the turn ends on every exit path ----------------------------------------------------------


def test_a_tool_that_raises_with_no_error_handler_ends_the_turn_with_error(ran, raising_read_file, turn_ends):
    session = Session(
        one_call_each([("read_file", {"path": "a.py"})]), [raising_read_file], [TurnGuardPlugin(turn_ends.guard())]
    )
    with pytest.raises(FileNotFoundError):
        session.send("read it")
    summary = turn_ends.assert_ended("error")
    assert summary.tool_calls == 1 and ran == ["a.py"]


def test_a_run_cancelled_in_a_tool_call_ends_the_turn_as_cancelled(turn_ends):
    async def start(started):
        async def wait_for_input(prompt: str) -> dict:
            """Wait for the user."""
            return {"answer": await wait_forever(started)}

        model = one_call_each([("wait_for_input", {"prompt": "?"})])
        session = Session(model, [wait_for_input], [TurnGuardPlugin(turn_ends.guard())])
        return await session.asend(types.Content(role="user", parts=[types.Part(text="go")]))

    cancel_once_started(start)
    turn_ends.assert_ended("cancelled")


class StalledLlm(ScriptedLlm):
    """A model whose second request never answers (the host cancels the run)."""

    started: object = None

    async def generate_content_async(self, llm_request, stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        if self.requests:
            await wait_forever(self.started)
        async for response in super().generate_content_async(llm_request, stream):
            yield response


def test_a_run_cancelled_in_a_model_request_ends_the_turn_as_cancelled(read_file, turn_ends):
    async def start(started):
        model = StalledLlm(model="stalled", steps=iter([[("read_file", {"path": "a.py"})]]), started=started)
        session = Session(model, [read_file], [TurnGuardPlugin(turn_ends.guard())])
        return await session.asend(types.Content(role="user", parts=[types.Part(text="go")]))

    cancel_once_started(start)
    turn_ends.assert_ended("cancelled")


def test_adks_own_model_call_limit_ends_the_turn_with_error(read_file, turn_ends):
    model = one_call_each(("read_file", {"path": f"f{i}.py"}) for i in range(10))
    session = Session(model, [read_file], [TurnGuardPlugin(turn_ends.guard())], RunConfig(max_llm_calls=3))
    with pytest.raises(LlmCallsLimitExceededError):
        session.send("read them")
    turn_ends.assert_ended("error")


# -- identical calls in one response (the core's rule for a parallel batch) ----------------------


def test_of_ten_identical_failing_calls_in_one_response_at_most_eight_run_unattended(ran, read_file):
    batch = [("read_file", {"path": "missing.py"})] * 10
    session = Session(scripted([batch]), [read_file], [TurnGuardPlugin(tg.Guard())])
    assert halt_of(session.send("read it"))["threshold"] == "streak"
    assert len(ran) <= 8


def test_ten_identical_calls_in_one_attended_response_ask_the_stop_level_once(ran, read_file):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict.event.level)
        return "continue"

    batch = [("read_file", {"path": "missing.py"})] * 10
    plugin = TurnGuardPlugin(tg.Guard(tg.GuardConfig(streak_warn_at=0)), ask=ask)
    Session(scripted([batch]), [read_file], [plugin]).send("read it")
    assert asked == [tg.Level.STOP]


@pytest.mark.parametrize("close", ["aclose", "break"])
def test_run_async_closed_early_by_the_host_ends_the_turn_as_cancelled(read_file, turn_ends, close):
    """ADK treats an early close as a clean completion (``after_run_callback`` runs); the turn says
    what it was: cancelled, as a closed stream is in the other adapters."""

    async def scenario() -> None:
        model = one_call_each(("read_file", {"path": f"f{i}.py"}) for i in range(10))
        session = Session(model, [read_file], [TurnGuardPlugin(turn_ends.guard())])
        created = await session.runner.session_service.create_session(app_name=session.runner.app_name, user_id="u")
        events = session.runner.run_async(user_id="u", session_id=created.id, run_config=UNBOUNDED,
                                          new_message=types.Content(role="user", parts=[types.Part(text="go")]))
        async for _ in events:
            break
        if close == "aclose":
            await events.aclose()
            assert [s.reason for s in turn_ends.summaries] == ["cancelled"]  # ended by the close itself

    asyncio.run(scenario())
    turn_ends.assert_ended("cancelled")


# -- a question holds the rest of its batch, on every route -------------------------------------

FIRST_QUESTION = {"defaults": ({}, 4), "warn-off": ({"streak_warn_at": 0}, 8)}
"""Guard options, and how many of a batch of identical failing calls come before its first
question: the warn level at the 5th call, or (warn off) the stop level at the 9th (the 8th
failure has run just before it)."""

BATCH_OF_30 = [("read_file", {"path": "missing.py"})] * 30


def answered(session: Session, events: list, confirmed: bool) -> list:
    return asyncio.run(session.asend(confirmation_answer(events, confirmed)))


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_confirmation_holds_its_batch_and_a_refusal_runs_none_of_it(ran, read_file, turn_ends, options, before):
    plugin = TurnGuardPlugin(turn_ends.guard(tg.GuardConfig(**options)), ask="confirmation")
    session = Session(scripted([BATCH_OF_30]), [read_file], [plugin])
    events = session.send("read it")
    assert len(ran) == before  # the calls after the question are paused with it
    requests = confirmation_requests(events)
    held = [r.args["toolConfirmation"]["payload"]["turnguard"]["held"] for r in requests]
    assert held == [False] + [True] * (29 - before) and turn_ends.summaries == []
    answered(session, events, confirmed=False)
    assert "stopped by the user" in session.final_text() and len(ran) == before
    assert turn_ends.assert_ended("halted").tool_calls == before + 1


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_held_call_confirmed_without_its_question_is_the_users_stop(ran, read_file, options, before):
    session = Session(scripted([BATCH_OF_30]), [read_file],
                      [TurnGuardPlugin(tg.Guard(tg.GuardConfig(**options)), ask="confirmation")])
    question, *held = confirmation_requests(session.send("read it"))

    def reply(request, confirmed: bool) -> types.Part:
        return types.Part(function_response=types.FunctionResponse(name=request.name, id=request.id,
                                                                   response={"confirmed": confirmed}))

    parts = [reply(question, False), *(reply(r, True) for r in held)]
    asyncio.run(session.asend(types.Content(role="user", parts=parts)))
    assert "stopped by the user" in session.final_text() and len(ran) == before


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_confirmed_question_releases_its_batch_up_to_the_next_question(ran, read_file, options, before):
    """Confirmed, the held calls are checked in order and run; the next question cannot pause a
    batch ADK is already resuming (it asks for no confirmation there), so from it on the batch does
    not run: the model is told, and the question waits for the next call."""
    session = Session(scripted([BATCH_OF_30]), [read_file],
                      [TurnGuardPlugin(tg.Guard(tg.GuardConfig(**options)), ask="confirmation")])
    events = answered(session, session.send("read it"), confirmed=True)
    assert confirmation_requests(events) == [] and session.final_text() == "done"
    responses = [p.function_response.response for e in events for p in e.content.parts or () if p.function_response]
    told = [r for r in responses if "the user is asked at the next call" in str(r.get("error", ""))]
    assert len(ran) > before + 1 and len(ran) + len(told) == 30


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_callback_question_holds_the_calls_after_it_until_the_user_refuses(ran, read_file, options, before):
    """ADK runs a response's calls as concurrent tasks: while the async callback takes its time,
    the calls after the one asked about (or after the failure that asks) wait for the answer."""
    asked = []

    async def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict)
        await asyncio.sleep(0.2)
        return "stop"

    session = Session(scripted([BATCH_OF_30]), [read_file], [TurnGuardPlugin(tg.Guard(tg.GuardConfig(**options)),
                                                                            ask=ask)])
    session.send("read it")
    assert len(asked) == 1 and len(ran) == before
    assert "stopped by the user" in session.final_text()


class UnreachableLlm(ScriptedLlm):
    """A model whose provider goes away after its first answer."""

    async def generate_content_async(self, llm_request, stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        if self.requests:
            raise ConnectionError("the model is unreachable")
        async for response in super().generate_content_async(llm_request, stream):
            yield response


def test_a_model_that_raises_ends_the_turn_with_error(read_file, turn_ends):
    model = UnreachableLlm(model="unreachable", steps=iter([[("read_file", {"path": "a.py"})]]))
    session = Session(model, [read_file], [TurnGuardPlugin(turn_ends.guard())])
    with pytest.raises(ConnectionError):
        session.send("read it")
    assert turn_ends.assert_ended("error").tool_calls == 1


@pytest.mark.parametrize("changing", [True, False])
def test_a_polling_tools_response_is_its_result_and_a_changed_one_is_progress(changing, turn_ends):
    answers, polled = iter(ci_statuses(changing)), []

    def ci_status(run: int) -> dict:
        """The CI run's status."""
        polled.append(run)
        return {"status": next(answers)}

    session = Session(one_call_each([("ci_status", {"run": 42})] * POLLS), [ci_status],
                      [TurnGuardPlugin(turn_ends.guard(POLLING))])
    events = session.send("wait for CI")
    if changing:
        assert session.final_text() == "done" and halt_of(events) is None
    else:
        assert halt_of(events)["threshold"] == "streak"
    assert_polled(turn_ends, changing, len(polled))


# -- a refusal holds whatever order or grouping the answers come in ------------------------------


def ordered_groupings(items: list[int]) -> list[list[list[int]]]:
    """Every way to send ``items`` as a sequence of messages: each ordered partition, each message's
    answers in one order (ADK re-runs a message's calls in the order they were made)."""
    if not items:
        return [[]]
    found = []
    for mask in range(1, 2 ** len(items)):
        first = [x for k, x in enumerate(items) if mask >> k & 1]
        rest = [x for k, x in enumerate(items) if not mask >> k & 1]
        found.extend([first, *tail] for tail in ordered_groupings(rest))
    return found


class Ends:
    def __init__(self) -> None:
        self.summaries: list[tg.TurnSummary] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary) -> None:
        self.summaries.append(summary)


def answered_in_messages(options: dict, n: int, groups: list[list[int]], confirmed: list[bool]) -> tuple:
    """One response of ``n`` identical failing calls under ``ask="confirmation"``; the confirmations
    it pauses on (the question first) answered in ``groups``, one message each. The ids of the calls
    that ran, the id of the call each confirmation paused, and the turns' summaries."""
    ran, ends = [], Ends()

    def read_file(path: str, tool_context: ToolContext) -> dict:
        """Read a file."""
        ran.append(tool_context.function_call_id)
        return {"error": f"{path}: no such file"}

    guard = tg.Guard(tg.GuardConfig(**options), plugins={"ends": ends})
    session = Session(scripted([[("read_file", {"path": "missing.py"})] * n]), [read_file],
                      [TurnGuardPlugin(guard, ask="confirmation")])
    requests = confirmation_requests(session.send("read it"))
    paused = [r.args["originalFunctionCall"]["id"] for r in requests]
    assert len(requests) == len(confirmed)
    for group in groups:
        parts = [types.Part(function_response=types.FunctionResponse(
            name=requests[k].name, id=requests[k].id, response={"confirmed": confirmed[k]})) for k in group]
        asyncio.run(session.asend(types.Content(role="user", parts=parts)))
    return ran, paused, ends.summaries


def assert_refusals_hold(ran: list, paused: list, summaries: list, groups: list, confirmed: list, before: int):
    """A refused call never runs; a refused question (or a held call confirmed in the first answer,
    without its question: the user's stop) runs none of the batch; every call that ran was checked
    in the invocation's one turn, no more than the stop level lets run after the question's answer."""
    assert not {paused[k] for k, yes in enumerate(confirmed) if not yes} & set(ran)
    stopped = not confirmed[0] or (0 not in groups[0] and any(confirmed[k] for k in groups[0]))
    assert summaries and summaries[0].tool_calls >= len(ran)
    assert [s.tool_calls for s in summaries[1:]] == [0] * (len(summaries) - 1)
    if stopped:
        assert len(ran) == before and [s.reason for s in summaries] == ["halted"]
    assert len(ran) <= 2 * before + 1


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
@pytest.mark.parametrize("held", [1, 2, 3])
def test_refusals_hold_in_every_order_and_grouping_of_the_answers(options, before, held):
    """The question and the ``held`` calls paused with it, refused or confirmed in every
    combination (three held: all refused), answered in every order and grouping of messages (ADK
    resumes the invocation at each message, its model asked again in between)."""
    pending = list(range(held + 1))
    answers = [list(a) for a in itertools.product([False, True], repeat=held + 1)] if held < 3 else [[False] * 4]
    cases = [(g, a) for g in ordered_groupings(pending) for a in answers]
    for groups, confirmed in cases:
        ran, paused, summaries = answered_in_messages(options, before + 1 + held, groups, confirmed)
        assert_refusals_hold(ran, paused, summaries, groups, confirmed, before)


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
@pytest.mark.parametrize("n", [10, 30])
def test_each_refusal_in_its_own_message_question_first_runs_nothing_more(options, before, n):
    """The audit's case: every confirmation refused in its own message, the question first (with
    ``streak_warn_at=0`` and 10 calls, the held call used to run in a new turn that completed)."""
    pending = list(range(n - before))
    ran, _, summaries = answered_in_messages(options, n, [[k] for k in pending], [False] * len(pending))
    assert len(ran) == before and [s.reason for s in summaries] == ["halted"]
    assert summaries[0].tool_calls == before + 1


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
@pytest.mark.parametrize("seed", range(3))
def test_refusals_hold_in_a_large_batch_answered_in_random_messages(options, before, seed):
    rng = random.Random(seed)
    pending = list(range(30 - before))
    confirmed = [rng.random() < 0.5 for _ in pending]
    order = rng.sample(pending, len(pending))
    cuts = sorted(rng.sample(range(1, len(order)), rng.randint(0, 5)))
    groups = [sorted(order[a:b]) for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]
    ran, paused, summaries = answered_in_messages(options, 30, groups, confirmed)
    assert_refusals_hold(ran, paused, summaries, groups, confirmed, before)


# -- a paused turn goes on wherever its answer comes: a fresh plugin, another process -------------

RESUMABLE_AGENT = '''
import asyncio, json, sys
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types
import turnguard as tg
from turnguard.integrations.google_adk import TurnGuardPlugin, confirmation_answer, confirmation_requests

phase, db, confirmed = sys.argv[1], sys.argv[2], sys.argv[3] == "yes"
ran, ended = [], []

class Same(BaseLlm):
    requests: int = 0
    async def generate_content_async(self, request, stream=False):
        self.requests += 1
        call = types.FunctionCall(name="read_file", args={"path": "a.py"}, id=f"{phase}-{self.requests}")
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))

def read_file(path: str) -> dict:
    """Read a file."""
    ran.append(path)
    return {"error": f"{path}: no such file"}

class Ends:
    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary):
        ended.append([summary.reason, summary.tool_calls, summary.turn_id])

async def main():
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=7), environ={})
    guard.register(Ends(), "ends")
    app = App(name="coding", root_agent=LlmAgent(name="coder", model=Same(model="same"), tools=[read_file]),
              plugins=[TurnGuardPlugin(guard, ask="confirmation")])
    runner = Runner(app=app, session_service=SqliteSessionService(db))
    if phase == "start":
        await runner.session_service.create_session(app_name="coding", user_id="u", session_id="s")
        message = types.Content(role="user", parts=[types.Part(text="read it")])
    else:
        stored = await runner.session_service.get_session(app_name="coding", user_id="u", session_id="s")
        message = confirmation_answer(stored.events, confirmed)
    events = [e async for e in runner.run_async(user_id="u", session_id="s", new_message=message,
                                                run_config=RunConfig(max_llm_calls=0))]
    texts = [p.text for e in events if e.content for p in e.content.parts or () if p.text]
    print(json.dumps({"ran": len(ran), "asked": len(confirmation_requests(events)), "ended": ended,
                      "last": texts[-1] if texts else ""}))

asyncio.run(main())
'''


@pytest.fixture
def two_processes(tmp_path):
    """``run(phase, confirmed)``: a phase of ``RESUMABLE_AGENT`` in a fresh Python process, the
    sessions in one SQLite file."""
    optional_dependency("aiosqlite")
    program, db = tmp_path / "agent.py", tmp_path / "sessions.sqlite"
    program.write_text(RESUMABLE_AGENT, encoding="utf-8")

    def run(phase: str, confirmed: bool = False) -> dict:
        command = [sys.executable, str(program), phase, str(db), "yes" if confirmed else "no"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


@pytest.mark.parametrize("confirmed", [False, True])
def test_a_confirmation_answered_in_another_process_answers_the_same_turn(two_processes, confirmed):
    """Process 1 runs 4 identical failing calls and pauses on the 5th (the warn level); process 2
    answers from the stored session. Refused, the call does not run and the turn halts; confirmed,
    it runs in the same turn, whose explicit cap of 7 stops the 8th call after 3 more, not 7. Only
    the process that finishes the turn reports it."""
    first = two_processes("start")
    assert (first["ran"], first["asked"], first["ended"]) == (4, 1, [])
    second = two_processes("resume", confirmed)
    assert second["asked"] == 0
    if confirmed:
        assert second["ran"] == 3 and "threshold explicit (stop, limit 7); 8 tool calls" in second["last"]
        assert [e[:2] for e in second["ended"]] == [["halted", 8]]
    else:
        assert second["ran"] == 0 and "stopped by the user" in second["last"]
        assert [e[:2] for e in second["ended"]] == [["halted", 5]]


def answered_through(options: dict, n: int, groups: list[list[int]], confirmed: list[bool], fresh: bool) -> tuple:
    """``answered_in_messages`` with the session kept by one session service and each answer sent
    either by the first runner or (``fresh``) by a runner, plugin and guard of its own, as a new
    process would: the ids of the calls that ran, and the turns' (reason, tool calls)."""
    ran, ends, service = [], Ends(), InMemorySessionService()

    def read_file(path: str, tool_context: ToolContext) -> dict:
        """Read a file."""
        ran.append(tool_context.function_call_id)
        return {"error": f"{path}: no such file"}

    def runner(steps: list) -> Runner:
        guard = tg.Guard(tg.GuardConfig(**options), plugins={"ends": ends})
        app = App(name="coding", root_agent=LlmAgent(name="coder", model=scripted(steps), tools=[read_file]),
                  plugins=[TurnGuardPlugin(guard, ask="confirmation")])
        return Runner(app=app, session_service=service)

    async def send(run: Runner, message: types.Content) -> list:
        return [e async for e in run.run_async(user_id="u", session_id="s", new_message=message, run_config=UNBOUNDED)]

    async def scenario() -> None:
        await service.create_session(app_name="coding", user_id="u", session_id="s")
        first = runner([[("read_file", {"path": "missing.py"})] * n])
        requests = confirmation_requests(await send(first, types.Content(role="user", parts=[types.Part(text="go")])))
        assert len(requests) == len(confirmed)
        for group in groups:
            parts = [types.Part(function_response=types.FunctionResponse(
                name=requests[k].name, id=requests[k].id, response={"confirmed": confirmed[k]})) for k in group]
            await send(runner([]) if fresh else first, types.Content(role="user", parts=parts))

    asyncio.run(scenario())
    return sorted(ran), [(s.reason, s.tool_calls) for s in ends.summaries]


@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
@pytest.mark.parametrize("held", [0, 1])
def test_a_fresh_plugin_answers_confirmations_as_the_plugin_that_asked_them(options, before, held):
    """The question and the ``held`` calls paused with it, each refused or confirmed, answered in
    every order and grouping of messages: sent through a fresh plugin and guard each time (nothing
    in memory: the turn is in the session's state), the same calls run and the same turns end as
    with the plugin that asked; a refused call never runs."""
    answers = list(itertools.product([False, True], repeat=held + 1))
    for groups in ordered_groupings(list(range(held + 1))):
        for confirmed in map(list, answers):
            fresh = answered_through(options, before + 1 + held, groups, confirmed, fresh=True)
            same = answered_through(options, before + 1 + held, groups, confirmed, fresh=False)
            assert fresh == same, (groups, confirmed)
            assert len(fresh[0]) <= 2 * before + 1 and fresh[1], (groups, confirmed)
            if not confirmed[0] and 0 in groups[0]:
                assert len(fresh[0]) == before and fresh[1] == [("halted", before + 1)], (groups, confirmed)


@pytest.mark.parametrize("held", [False, True])
def test_a_refused_confirmation_whose_turn_cannot_be_resumed_still_does_not_run(ran, read_file, held, caplog):
    """The stored turn is of another configuration (``tg.SnapshotError``: logged, a new turn starts):
    the answer to turnguard's confirmation is still one. The refused question stops the run; a
    held call refused with its question confirmed does not run either."""
    service = InMemorySessionService()

    def runner(config: tg.GuardConfig, steps: list) -> Runner:
        app = App(name="coding", root_agent=LlmAgent(name="coder", model=scripted(steps), tools=[read_file]),
                  plugins=[TurnGuardPlugin(tg.Guard(config), ask="confirmation")])
        return Runner(app=app, session_service=service)

    async def scenario() -> list:
        await service.create_session(app_name="coding", user_id="u", session_id="s")
        asking = runner(tg.GuardConfig(), [[("read_file", {"path": "missing.py"})] * 6])
        message = types.Content(role="user", parts=[types.Part(text="go")])
        requests = confirmation_requests([e async for e in asking.run_async(
            user_id="u", session_id="s", new_message=message, run_config=UNBOUNDED)])
        assert len(requests) == 2 and len(ran) == 4
        parts = [types.Part(function_response=types.FunctionResponse(name=r.name, id=r.id, response={
            "confirmed": (k == 0) == held})) for k, r in enumerate(requests)]
        answering = runner(tg.GuardConfig(max_tool_calls_per_turn=50), [])
        return [e async for e in answering.run_async(user_id="u", session_id="s", run_config=UNBOUNDED,
                                                     new_message=types.Content(role="user", parts=parts))]

    events = asyncio.run(scenario())
    texts = [p.text for e in events if e.content for p in e.content.parts or () if p.text]
    assert len(ran) == 4 + held  # a confirmed question's call is checked again, the refused held one never runs
    assert ("stopped by the user" in texts[-1]) != held
    assert "cannot be resumed here" in caplog.text


class Closes(Ends):
    """How turns close: ended (reported) or suspended (put aside for whoever resumes them)."""

    def __init__(self) -> None:
        super().__init__()
        self.suspended: list[str] = []

    @tg.hookimpl
    def turnguard_turn_suspended(self, turn, summary) -> None:
        self.suspended.append(summary.turn_id)


def test_a_paused_invocation_dropped_past_the_bound_is_suspended_and_its_answer_resumes_it(ran, read_file,
                                                                                           monkeypatch):
    """Past ``MAX_OPEN_TURNS`` a paused invocation is put aside, not ended as abandoned: its turn is
    reported once, by the run the user's answer resumes, under its id."""
    monkeypatch.setattr("turnguard.integrations.google_adk.MAX_OPEN_TURNS", 1)
    closes = Closes()
    plugin = TurnGuardPlugin(tg.Guard(tg.GuardConfig(), plugins={"closes": closes}), ask="confirmation")
    paused = Session(one_call_each([("read_file", {"path": "missing.py"})] * 7), [read_file], [plugin])
    events = paused.send("read it")
    assert len(ran) == 4 and closes.summaries == [] and closes.suspended == []
    Session(one_call_each([("read_file", {"path": "b.py"})]), [read_file], [plugin]).send("read b")
    assert len(closes.suspended) == 1 and [s.reason for s in closes.summaries] == ["completed"]
    assert ran[4:] == ["b.py"]
    answered(paused, events, confirmed=False)
    assert len(ran) == 5 and "stopped by the user" in paused.final_text()
    assert [(s.reason, s.tool_calls) for s in closes.summaries[1:]] == [("halted", 5)]
    assert closes.summaries[1].turn_id == closes.suspended[0]


# -- a resumed invocation's run, however it ends, leaves its turn as it is in the session ---------

RESUMED_ENDINGS = {
    "completes": "completed",
    "model-raises": "error",
    "tool-raises": "error",
    "adks-call-limit": "error",
    "closed-by-the-host": None,  # still paused on the held call: the session keeps its snapshot, current
}
"""How the run that resumes an invocation on the user's answer to turnguard's question ends, and
how its turn ends then (``None``: it does not, a held call still waits)."""


class Resuming(ScriptedLlm):
    """A scripted model that, at the step ``"raise"``, fails as an unreachable model does."""

    async def generate_content_async(self, llm_request, stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        self.steps, ahead = itertools.tee(self.steps)
        if next(ahead, None) == "raise":
            raise ConnectionError("model unreachable")
        async for response in super().generate_content_async(llm_request, stream):
            yield response


def resumed_then_answered_again(ending: str, same_plugin: bool) -> tuple[dict, list, list, list]:
    """Five identical failing calls in one response: the fifth is asked about (the warn level), the
    sixth held with it. The question is confirmed alone, by the plugin that asked (``same_plugin``)
    or a fresh one, and that resumed run ends as ``ending`` says; the held call's confirmation then
    comes through a fresh plugin, guard and runner (another process, the same session store). The
    session's entry after the resumed run, the calls that ran, and the turns' (id, reason)."""
    service, ran, ends, resumed = InMemorySessionService(), [], Ends(), []

    def read_file(path: str, tool_context: ToolContext) -> dict:
        """Read a file."""
        ran.append(tool_context.function_call_id)
        if resumed and ending == "tool-raises":
            raise OSError("disk gone")
        return {"error": f"{path}: no such file"}

    def runner(steps: list, run_config: RunConfig = UNBOUNDED) -> tuple[Runner, RunConfig]:
        guard = tg.Guard(tg.GuardConfig(), plugins={"ends": ends})
        app = App(name="coding", root_agent=LlmAgent(name="coder", model=Resuming(model="s", steps=iter(steps)),
                                                     tools=[read_file]),
                  plugins=[TurnGuardPlugin(guard, ask="confirmation")])
        return Runner(app=app, session_service=service), run_config

    async def send(driven: tuple[Runner, RunConfig], parts: list, close_after: int | None = None) -> list:
        run, run_config = driven
        events = []
        stream = run.run_async(user_id="u", session_id="s", run_config=run_config,
                               new_message=types.Content(role="user", parts=parts))
        try:
            async for event in stream:
                events.append(event)
                if len(events) == close_after:
                    break
        except (ConnectionError, OSError, LlmCallsLimitExceededError):
            pass
        await stream.aclose()
        return events

    def answer(request) -> types.Part:
        return types.Part(function_response=types.FunctionResponse(
            name=request.name, id=request.id, response={"confirmed": True}))

    async def scenario() -> dict:
        await service.create_session(app_name="coding", user_id="u", session_id="s")
        steps = {"model-raises": ["raise"], "adks-call-limit": [[("read_file", {"path": "b.py"})]]}.get(ending, [])
        first = runner([[("read_file", {"path": "a.py"})] * 6, *steps])
        requests = confirmation_requests(await send(first, [types.Part(text="go")]))
        assert len(requests) == 2 and len(ran) == 4
        resumed.append(True)
        again = first if same_plugin else runner(steps)
        if ending == "adks-call-limit":  # the resumed run may ask the model once: the second request is refused
            again = again[0], RunConfig(max_llm_calls=1)
        await send(again, [answer(requests[0])], close_after=1 if ending == "closed-by-the-host" else None)
        session = await service.get_session(app_name="coding", user_id="u", session_id="s")
        (entry,) = [value for key, value in session.state.items() if key.startswith("turnguard:")]
        await send(runner([]), [answer(requests[1])])
        return entry

    entry = asyncio.run(scenario())
    return entry, ran, [(s.turn_id, s.reason) for s in ends.summaries], ends.summaries


@pytest.mark.parametrize("same_plugin", [True, False], ids=["same-plugin", "fresh-plugin"])
@pytest.mark.parametrize("ending", RESUMED_ENDINGS)
def test_a_resumed_run_leaves_its_turn_in_the_session_as_it_is_however_it_ends(ending, same_plugin):
    """The session keeps the turn's entry as the resumed run left it: how it ended (then a later
    answer resumes no ended turn: each turn ends once, and the held call runs in no later turn), or,
    still paused, its snapshot with the question answered (the held call's confirmation then runs it
    in the same turn, which ends once)."""
    entry, ran, turns, summaries = resumed_then_answered_again(ending, same_plugin)
    ids = [turn_id for turn_id, _ in turns]
    assert len(set(ids)) == len(ids), turns  # no turn ended twice
    reason = RESUMED_ENDINGS[ending]
    if reason is not None:
        assert "ended" in entry, entry
        assert turns[0][1] == reason, turns
        assert summaries[0].tool_calls == (6 if ending == "adks-call-limit" else 5), turns  # (its model called once)
        assert ran.count("call-1-5") == 0  # paused in the ended turn: it runs in no later one
    else:
        assert "ended" not in entry and entry.get("pending") is None, entry  # the question was answered
        assert turns == [(turns[0][0], "completed")] and summaries[0].tool_calls == 6, turns
        assert ran.count("call-1-5") == 1


class RewritingPlugin(BasePlugin):
    """A plugin that answers ``after_tool`` itself (ADK then skips the plugins after it)."""

    def __init__(self, answer: dict) -> None:
        super().__init__(name="rewriter")
        self.answer = answer

    async def after_tool_callback(self, *, tool, tool_args, tool_context, result):
        return self.answer


class ErrorExtractingRetry(ReflectAndRetryToolPlugin):
    """ADK's retry plugin taught to retry on a returned ``{"error": ...}`` (its documented extension
    point): it answers ``after_tool`` with its reflection, and raises once its retries are spent."""

    async def extract_error_from_result(self, *, tool, tool_args, tool_context, result):
        return result if isinstance(result, dict) and "error" in result else None


def _tool_response(behaviour: str, attempt: int) -> dict:
    """What ``read_file`` does at its ``attempt``-th run (0-based) for a path."""
    if behaviour == "raises" or (behaviour == "raises_once" and not attempt):
        raise FileNotFoundError("no such file")
    return {"error": "no such file"} if behaviour == "error_dict" else {"content": "x"}


TOOL_BEHAVIOURS = ("raises", "raises_once", "error_dict", "ok")
OTHER_PLUGINS = {
    "retry": lambda: ReflectAndRetryToolPlugin(max_retries=2),
    "retry_on_error_dicts": lambda: ErrorExtractingRetry(max_retries=2),
    "rewriter_ok": lambda: RewritingPlugin({"content": "rewritten"}),
    "rewriter_error": lambda: RewritingPlugin({"error": "rewritten"}),
}


def _recorded(behaviour: str, other: str, turnguard_first: bool, parallel: int) -> tuple[CallOutcomes, list]:
    """A run of four responses of ``parallel`` calls each, its tool behaving as ``behaviour``, with
    turnguard's plugin and the ``other`` one in that order or the reverse."""
    attempts: dict[str, int] = {}

    def read_file(path: str) -> dict:
        """Read a file."""
        attempts[path] = attempts.get(path, 0) + 1
        return _tool_response(behaviour, attempts[path] - 1)

    book = CallOutcomes()
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",)), plugins={"book": book})
    plugins = [TurnGuardPlugin(guard), OTHER_PLUGINS[other]()]
    if not turnguard_first:
        plugins.reverse()
    steps = [[("read_file", {"path": f"f{k}.py"}) for k in range(parallel)]] * 4
    session = Session(scripted(steps), [read_file], plugins)
    with contextlib.suppress(Exception):  # the run died on the tool's error, or the retry plugin's
        session.send("read them")
    return book, session.events


@pytest.mark.parametrize("parallel", [1, 2])
@pytest.mark.parametrize("other", list(OTHER_PLUGINS))
@pytest.mark.parametrize("behaviour", TOOL_BEHAVIOURS)
def test_every_checked_call_gets_one_outcome_whichever_plugin_answers_its_result_first(behaviour, other, parallel):
    """A plugin listed before turnguard's that answers a call's ``on_tool_error`` or ``after_tool``
    itself (ADK's ``ReflectAndRetryToolPlugin`` recovering an error for a retry, or giving up and
    raising; a plugin rewriting the result) keeps turnguard's own callback from running: the call
    still gets exactly one outcome, the one it gets with turnguard's plugin first (a tool that
    raised is a failure, whatever recovered it), also when the run dies on the retry's error (a
    rewritten result counts as the model is given it)."""
    first, _ = _recorded(behaviour, other, True, parallel)
    second, _ = _recorded(behaviour, other, False, parallel)
    outcomes = second.each_once()
    assert first.ended == second.ended and second.ended is not None
    if not other.startswith("rewriter"):
        assert first.each_once() == outcomes
    elif behaviour in ("error_dict", "ok"):  # (a tool that raises, unrecovered, ends the run: "error")
        assert set(outcomes) == {other.removeprefix("rewriter_")}
    if behaviour in ("raises", "error_dict") and not other.startswith("rewriter"):
        assert set(outcomes) == {"error"}
