"""pydantic-ai: a capability that bounds each agent run (one run = one turn).

Tested with pydantic-ai-slim 2.68 (the ``pydantic-ai`` extra installs ``>=2.68,<3``). pydantic-ai's
own ``request_limit`` (50 by default) ends a long productive run before turnguard's cap: raise it
(``usage_limits=UsageLimits(request_limit=1000)``) and let turnguard bound the turn.

``Agent(model, capabilities=[TurnGuardCapability(guard)])``. Each model request is a cycle
(``before_model_request``); each tool call is checked in ``wrap_tool_execute``, inside
pydantic-ai's own tool span when the agent is instrumented, before the tool body runs. A tool that
raises (including ``ModelRetry`` and ``ToolFailed``) is an ``ERROR`` outcome. A call pydantic-ai
refuses before it runs (its arguments fail validation, or no tool has its name, or it is not
available yet) is an ``ERROR`` too, checked in its place in the batch (the model's order): before the
next call of its batch is checked, else when the batch ends, also when the run ends with it. When a
halt or an error ends a batch, the calls running beside it get the tool's own outcome if the body
returned, else ``ERROR``, also when the run ends before their task.

HALT raises ``TurnGuardHalted``, an ``AgentRunError`` (pydantic-ai's run-stopping family, like
``UsageLimitExceeded``) and a ``turnguard.LoopDetected``. ASK goes through pydantic-ai's deferred
tool approval when ``ask="approval"``: the call raises ``ApprovalRequired`` (metadata under
``"turnguard"``), so a ``HandleDeferredToolCalls`` capability or a ``DeferredToolRequests`` output
reaches the user; approving the call answers "continue", denying it answers "stop". The calls of
the batch after it are deferred with it, unchecked (``metadata["turnguard"]["held"]``;
``approval_requests`` returns them with the question): answer them alike. After a "stop" none of
them runs; after a "continue" each is checked as it runs, up to the next question, which cannot
pause a batch that is already resuming: that call and the rest of the batch answer "Not
executed" and the question comes with the model's next call. With a callable ``ask`` the callback
answers inline (the calls checked meanwhile wait for its answer). ``promptable`` defaults to
whether ``ask`` is set.

A run ended by a ``DeferredToolRequests`` output (turnguard's calls or the tools' own) puts its
turn aside (it is not ended): the run that resumes it (``message_history=``,
``deferred_tool_results=``) continues it, and the turn ends once. In another process, store
``turn_state(result)`` (the turn's snapshot, JSON) beside ``result.all_messages()`` and pass it
back as run metadata, ``agent.run(message_history=..., deferred_tool_results=...,
metadata={"turnguard": state})``: turns are opened ``durable``, so that works with the default
configuration. The state carries the key the turn's call digests are made with, so it is kept out
of what an instrumented run records: not on the deferred output, and taken out of the resumed
run's metadata when the run starts.
A REMIND (``GuardConfig(remind_model=True)``) is appended to the call's text result.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_ai.agent import CallToolsNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import AgentRunError, ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.tools import DeferredToolRequests

from turnguard import _state as st
from turnguard._guard import Guard
from turnguard._model import ALLOW, Outcome, ToolCall, Verdict
from turnguard._snapshot import pending as pending_verdict
from turnguard.integrations import _common as common

__all__ = ["TurnGuardCapability", "TurnGuardHalted", "approval_requests", "turn_state"]

APPROVAL = "approval"
"""``ask=APPROVAL``: reach the user through pydantic-ai's deferred tool approval."""
METADATA_KEY = "turnguard"
"""The key of turnguard's entry in a deferred call's metadata and in a resumed run's metadata."""
_STATES: dict[int, dict[str, Any]] = {}
"""The turn state of each deferred output this process made (by the output's id, while it lives):
kept off the output, whose metadata an instrumented run records on its span (``turn_state``)."""
ASKED_KEY = "pydantic_ai"
MAX_PARKED = 1024
REFUSED_BY_NAME = {"unknown_tool": "no such tool", "unavailable_tool": "not available yet"}
"""The ``retry.cause`` of a call pydantic-ai refused before resolving it to a tool (no tool hook sees
it), and the result its ``ERROR`` is recorded with (the same whether it is found or foreseen)."""
CUT_OFF = "cancelled while the tool ran"
"""The result an ``ERROR`` is recorded with for a call whose body had not returned when its task was
cancelled (a sibling's halt or error ended the batch, or the host cancelled the run)."""


class TurnGuardHalted(common.TurnHalted, AgentRunError):
    """turnguard stopped the run; an ``AgentRunError`` as well as a ``turnguard.LoopDetected``."""


@dataclass
class _PutAside:
    """A run that ended with turnguard's deferred calls: the turn the resumed run continues."""

    driver: common.RunDriver
    questions: dict[str, ToolCall]
    held: set[str]


Why = Exception | str
"""Why pydantic-ai refused a call before it ran: its error, or the result its ``ERROR`` is recorded with."""


@dataclass
class _Batch:
    """The tool calls of the model response being run, in the model's order: a call pydantic-ai
    refuses before it runs is checked in its place, so the refused calls are kept until then."""

    calls: list[ToolCall]
    history: int
    """How many messages the run had when the batch began: the request it adds comes after them."""
    foreseen: dict[str, str]
    """The calls pydantic-ai refuses by name (``_foreseen``), by call id, with why."""
    refused: dict[str, Why] = field(default_factory=dict)
    """Calls refused for their arguments (by call id, with why), not checked yet."""
    done: set[str] = field(default_factory=set)
    """The refused calls already checked."""

    @classmethod
    def of(cls, ctx: Any, response: Any) -> _Batch:
        calls = [ToolCall(part.tool_name, part.args, part.tool_call_id)
                 for part in response.parts if part.part_kind == "tool-call"]
        messages = getattr(ctx, "messages", None) or []
        # A resumed step (history ending past its response) does not validate the calls an earlier run refused.
        fresh = bool(messages) and getattr(messages[-1], "kind", None) == "response"
        foreseen = {call.call_id or "": why for call in calls
                    if fresh and (why := _foreseen(ctx, call.name)) is not None}
        return cls(calls, len(messages), foreseen)

    def holds(self, call_id: str) -> bool:
        return any(call.call_id == call_id for call in self.calls)

    def due(self, before: str | None = None, found: dict[str, str] | None = None) -> list[tuple[ToolCall, Why]]:
        """The refused calls not checked yet that come before the call ``before`` (all: ``None``),
        marked checked: refused for their arguments, else by name, as the request the batch added
        says (``found``, once it ended) or as foreseen."""
        refused_by_name = self.foreseen if found is None else found
        due = []
        for call in self.calls:
            call_id = call.call_id or ""
            if call_id == before:
                break
            why = self.refused.pop(call_id, None) or refused_by_name.get(call_id)
            if why is not None and call_id not in self.done:
                self.done.add(call_id)
                due.append((call, why))
        return due


def _foreseen(ctx: Any, name: str) -> str | None:
    """Why pydantic-ai refuses a call to ``name`` before resolving it to a tool (its
    ``ToolManager._resolve_tool``: no tool has the name, or the tool is not available yet), or
    ``None``: read from the step's tool manager, as the step begins (it validates the batch's calls
    before any runs)."""
    manager = getattr(ctx, "tool_manager", None)
    if manager is None:
        return None
    try:
        tool_def = manager.get_tool_def(name)
    except ValueError:  # not prepared for a step: nothing to foresee
        return None
    if tool_def is None:
        return REFUSED_BY_NAME["unknown_tool"]
    if tool_def.kind == "function" and not ctx.is_tool_available(tool_def):
        return REFUSED_BY_NAME["unavailable_tool"]
    return None


@dataclass
class TurnGuardCapability(AbstractCapability[Any]):
    """Bounds every run of the agent it is given to; per-run state lives in the ``for_run`` copy."""

    guard: Guard
    ask: common.Ask | Literal["approval"] | None = None
    promptable: bool | None = None
    _driver: common.RunDriver | None = field(default=None, init=False, repr=False)
    _questions: dict[str, ToolCall] = field(default_factory=dict, init=False, repr=False)
    """Calls turnguard asked the user about (deferred for approval) and not answered, by call id."""
    _held: set[str] = field(default_factory=set, init=False, repr=False)
    """Calls deferred with the question, unchecked: checked once it is approved."""
    _ask_next: Verdict | None = field(default=None, init=False, repr=False)
    _owed: dict[str, tuple[ToolCall, Outcome, Any]] = field(default_factory=dict, init=False, repr=False)
    """Calls handed to their tool whose outcome is not recorded yet, by call id, with the outcome
    they get if cancelled first (an ``ERROR`` until the body has returned): recorded then, or at the
    run's end, whichever comes first."""
    _batch: _Batch | None = field(default=None, init=False, repr=False)
    parked: OrderedDict[str, _PutAside] = field(default_factory=OrderedDict, repr=False, kw_only=True)
    """turnguard's own (the ``for_run`` copies share it; not for hosts): runs that ended with
    turnguard's deferred calls, by each of those calls' ids: a resumed run in this process continues
    their turn. Bounded: oldest dropped."""

    def __post_init__(self) -> None:
        common.checked_ask(self.ask, APPROVAL)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def for_run(self, ctx: Any) -> TurnGuardCapability:
        return TurnGuardCapability(self.guard, self.ask, self.promptable, parked=self.parked)

    # -- run lifecycle -------------------------------------------------------------------------

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        # Opened here, where pydantic-ai's own run span (if instrumented) is current.
        driver = self._open(ctx)
        try:
            result = await handler()
        except BaseException as exc:
            self._settle(driver, *self._owed)  # the batch's tasks may be cancelled after the run ends
            self._settle_refused(driver)
            driver.end(exc)
            raise
        self._settle(driver, *self._owed)
        if isinstance(getattr(result, "output", None), DeferredToolRequests):
            self._put_aside(driver, result.output)  # answered in a resumed run: the same turn
        else:
            driver.end()
        return result

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        driver = self._open(ctx)
        for call_id, call in list(self._questions.items()):
            # A question that did not come back approved was denied by the user.
            del self._questions[call_id]
            TurnGuardHalted.stop(driver.answer(driver.question or ALLOW, "stop", call, before=True))
        self._held.clear()  # held calls the user denied: the model goes on without them
        TurnGuardHalted.stop(await driver.acycle())
        return request_context

    async def before_node_run(self, ctx: Any, *, node: Any) -> Any:
        if isinstance(node, CallToolsNode):
            self._batch = _Batch.of(ctx, node.model_response)
        return node

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        batch = self._batch
        if isinstance(node, CallToolsNode) and batch is not None:
            # The batch ended: its refused calls left after its last checked call, found in the request it made.
            self._batch = None
            request = getattr(result, "request", None)
            added = [request] if request is not None else (getattr(ctx, "messages", None) or [])[batch.history:]
            driver = self._open(ctx)
            for call, why in batch.due(found=_refused_by_name(added)):
                await self._refused(driver, call, why)
        return result

    # -- tools ---------------------------------------------------------------------------------

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        call_id = call.tool_call_id
        driver = self._open(ctx)
        reminder = None
        if ctx.tool_call_approved and call_id in self._questions:
            # The user approved the call turnguard asked about: "continue" (it was counted when asked).
            tool_call = self._questions.pop(call_id)
            TurnGuardHalted.stop(driver.answer(driver.question or ALLOW, "continue", tool_call, before=True))
        else:
            tool_call = ToolCall(call.tool_name, args, call_id)
            if ctx.tool_call_approved and call_id in self._held:
                self._held.discard(call_id)
                decision = self._released(driver, tool_call)
                if isinstance(decision, str):  # not executed: the model is told
                    return decision
            else:
                await self._check_refused_before(driver, ctx, call_id)
                decision = await self._check(driver, tool_call, call_id)
            TurnGuardHalted.stop(decision)
            reminder = decision.reminder
        self._owed[call_id] = (tool_call, Outcome.ERROR, CUT_OFF)
        try:
            result = await handler(args)
        except (ApprovalRequired, CallDeferred):
            del self._owed[call_id]  # the tool deferred itself: its outcome comes when it is resumed
            raise
        except Exception as exc:
            await self._outcome(driver, tool_call, Outcome.ERROR, common.error_result(exc), cause=exc)
            raise
        except BaseException:
            self._settle(driver, call_id)
            raise
        await self._outcome(driver, tool_call, Outcome.OK, result)  # the tool's return value: its result
        return common.with_reminder(result, reminder)

    async def after_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, result: Any) -> Any:
        # The body returned: its outcome, should a cancellation come before wrap_tool_execute records it.
        owed = self._owed.get(call.tool_call_id)
        if owed is not None:
            self._owed[call.tool_call_id] = (owed[0], Outcome.OK, result)
        return result

    async def wrap_tool_validate(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        try:
            return await handler(args)
        except (ValidationError, ModelRetry, ToolFailed) as exc:
            # Refused before it runs (bad arguments): still a call the model made, and an ERROR,
            # checked in its place in the batch.
            call_id = call.tool_call_id
            if call_id not in self._questions and call_id not in self._held:  # counted when asked about
                if self._batch is not None and self._batch.holds(call_id):
                    self._batch.refused[call_id] = exc
                else:
                    await self._refused(self._open(ctx), ToolCall(call.tool_name, args, call_id), exc)
            raise

    # -- internals -----------------------------------------------------------------------------

    async def _check(self, driver: common.RunDriver, call: ToolCall, call_id: str) -> common.Decision:
        """The decision on a call about to run (``call_id``: pydantic-ai's id of it); with
        ``ask="approval"`` a question (or a call held with one) is deferred to the user
        (``ApprovalRequired``, raised)."""
        if self.ask != APPROVAL:
            return await driver.acheck(call)  # the callback (or the fallback) answers inline
        decision = driver.before(call)
        if decision.step is common.Step.HOLD:
            self._held.add(call_id)
            raise ApprovalRequired(metadata={METADATA_KEY: {**common.ask_payload(decision.verdict), "held": True}})
        if decision.step is common.Step.RUN and self._ask_next is not None:
            decision = common.Decision(common.Step.ASK, self._ask_next)
        self._ask_next = None
        if decision.step is common.Step.ASK:
            self._questions[call_id] = call
            driver.defer(decision.verdict)
            raise ApprovalRequired(metadata={METADATA_KEY: {**common.ask_payload(decision.verdict), "held": False}})
        return decision

    async def _check_refused_before(self, driver: common.RunDriver, ctx: Any, call_id: str) -> None:
        """Check the refused calls that come before ``call_id`` in its batch, in the model's order."""
        if self._batch is not None:
            for call, why in self._batch.due(before=call_id):
                await self._refused(driver, call, why)

    def _settle_refused(self, driver: common.RunDriver) -> None:
        """The run ends inside a batch: its refused calls not checked yet are checked and recorded
        (``ERROR``) once, as they come; their verdicts stop nothing more (the run is over)."""
        batch, self._batch = self._batch, None
        for call, why in batch.due() if batch is not None else ():
            if driver.before(call).step is not common.Step.HOLD:
                driver.after(call, Outcome.ERROR, common.error_result(why) if isinstance(why, Exception) else why)

    async def _refused(self, driver: common.RunDriver, call: ToolCall, error: Why) -> None:
        """A call pydantic-ai refused before running it (``error``: why, or the retry prompt the model
        is given): checked, its outcome ``ERROR``; a HALT stops the run. With ``ask="approval"`` a
        refused call cannot be deferred to the user: its question, or one waiting for the model's
        next call, gets the unattended fallback (a model stuck on refused calls gives no other call
        to ask with); a call held by a question asked before it is not checked."""
        cause, result = (error, common.error_result(error)) if isinstance(error, Exception) else (None, error)
        if self.ask != APPROVAL:
            TurnGuardHalted.stop(await driver.acheck(call), cause)
        else:
            decision = driver.before(call)
            if decision.step is common.Step.HOLD:
                return
            waiting, self._ask_next = self._ask_next, None
            if decision.step is common.Step.ASK:
                decision = driver.fallback(decision.verdict)
            elif waiting is not None and decision.step is common.Step.RUN:
                decision = driver.fallback(waiting)
            TurnGuardHalted.stop(decision, cause)
        self._owed[call.call_id or ""] = (call, Outcome.ERROR, result)
        await self._outcome(driver, call, Outcome.ERROR, result, cause=cause)

    def _settle(self, driver: common.RunDriver, *call_ids: str) -> None:
        """Record the outcomes owed for ``call_ids`` (cancelled, or left when the run ends) once."""
        for call_id in call_ids:
            owed = self._owed.pop(call_id, None)
            if owed is not None:
                driver.after(*owed)

    def _released(self, driver: common.RunDriver, call: ToolCall) -> common.Decision | str:
        """A held call the user approved: checked now that its question is answered. Its question
        still waiting means it was not approved (an approved one runs first): the user's stop. A
        second question cannot pause the resuming batch: that call and the rest of the batch do not
        run (the model is told) and the question is asked on the model's next call."""
        if driver.question is not None:
            for question_id, question in list(self._questions.items()):
                del self._questions[question_id]
                TurnGuardHalted.stop(driver.answer(driver.question, "stop", question, before=True))
        if self._ask_next is not None:  # a question waits for the next call: the rest of the batch too
            return common.not_executed(self._ask_next, asked_next=True)
        decision = driver.before(call)
        if decision.step is not common.Step.ASK:
            return decision
        driver.after(call, Outcome.DENIED)
        self._ask_next = decision.verdict
        return common.not_executed(decision.verdict, asked_next=True)

    async def _outcome(
        self, driver: common.RunDriver, call: ToolCall, outcome: Outcome, result: Any, cause: Exception | None = None
    ) -> None:
        """Record the outcome owed for ``call`` (``_owed``), unless the run's end recorded it already."""
        call_id = call.call_id or ""
        if call_id not in self._owed:  # recorded when the run ended (its task outlived it)
            return
        self._owed[call_id] = (call, outcome, result)
        if self.ask != APPROVAL:
            try:
                await driver.unasked()  # a sibling's question to the user holds this outcome
            except BaseException:
                self._settle(driver, call_id)
                raise
        if self._owed.pop(call_id, None) is None:  # the run ended meanwhile
            return
        if self.ask != APPROVAL:
            TurnGuardHalted.stop(await driver.aoutcome(call, outcome, result), cause)  # (no wait now)
            return
        decision = driver.after(call, outcome, result)
        if decision.step is common.Step.ASK:
            self._ask_next = decision.verdict  # the model's next call waits for the user
            return
        TurnGuardHalted.stop(decision, cause)

    def _open(self, ctx: Any) -> common.RunDriver:
        if self._driver is None:
            # Taken out of the run's metadata, which an instrumented run records on its span: the
            # state of a durable turn carries the key its calls' digests are made with.
            metadata = getattr(ctx, "metadata", None)
            state = metadata.pop(METADATA_KEY, None) if isinstance(metadata, dict) else None
            aside = self._unpark(ctx)
            if aside is not None:  # put aside in this process: the live turn (the state is its snapshot)
                self._driver, self._questions, self._held = aside.driver, aside.questions, aside.held
            elif state is not None:
                self._driver = self._resumed(state)
            else:
                agent = getattr(ctx, "agent", None)
                self._driver = common.open_turn(
                    self.guard,
                    ask=self.ask,
                    promptable=self.promptable,
                    conversation_id=getattr(ctx, "conversation_id", None),
                    agent_name=getattr(agent, "name", None),
                    durable=True,  # a deferred run's turn may resume in another process
                )
        return self._driver

    def _put_aside(self, driver: common.RunDriver, requests: DeferredToolRequests) -> None:
        """The run ended with deferred calls (turnguard's, or the tools' own): put the turn's
        snapshot on each (for ``turn_state``) and keep the turn for the run that resumes it in this
        process. A run no longer reachable (past ``MAX_PARKED``, or its call ids taken by a later
        run) is put aside as ``suspended`` (not reported here)."""
        state = driver.turn.snapshot(pending=driver.question)
        state[ASKED_KEY] = {"asked": {i: c.name for i, c in self._questions.items()}, "held": sorted(self._held)}
        _STATES[id(requests)] = state
        weakref.finalize(requests, _STATES.pop, id(requests), None)
        aside = _PutAside(driver, dict(self._questions), set(self._held))
        displaced = []
        for call in [*requests.approvals, *requests.calls]:
            previous = self.parked.pop(call.tool_call_id, None)
            self.parked[call.tool_call_id] = aside
            if previous is not None:  # a call id a later run reused: the earlier run is unreachable here
                displaced.append(previous)
        while len(self.parked) > MAX_PARKED:
            displaced.append(self.parked.popitem(last=False)[1])
        for stale in displaced:
            if all(parked is not stale for parked in self.parked.values()):
                common.put_aside(stale.driver.turn, stale.driver.question)

    def _unpark(self, ctx: Any) -> _PutAside | None:
        """The turn put aside by the run whose deferred calls this run's history ends with."""
        found = None
        for call_id in _last_response_call_ids(ctx):
            found = self.parked.pop(call_id, None) or found
        if found is not None:
            for call_id in [k for k, v in self.parked.items() if v is found]:
                del self.parked[call_id]
        return found

    def _resumed(self, state: Any) -> common.RunDriver:
        """The driver of a turn another run left deferred (``turn_state``), its question pending again."""
        asked, held = _questions(state)
        driver = common.RunDriver(self.guard.resume(state), ask=None if isinstance(self.ask, str) else self.ask)
        verdict = pending_verdict(state)
        if verdict is not None:
            driver.defer(verdict)
            # Already counted before it was asked about: the answer resolves it, its outcome follows.
            self._questions = {call_id: ToolCall(name, None, call_id) for call_id, name in asked.items()}
            self._held = set(held)
        return driver


def _questions(state: Any) -> tuple[dict[str, str], list[str]]:
    """The calls a ``turn_state`` asked about (call id -> tool name) and held, read before its turn
    is resumed (``common.adapter_section``)."""
    section = common.adapter_section(state, ASKED_KEY)
    if section is None:
        return {}, []
    path = section.at("asked")
    asked = {st.text(f"{path}.{call_id}", call_id, nonempty=True): st.text(f"{path}.{call_id}", name, nonempty=True)
             for call_id, name in section.mapping("asked", common.MAX_SECTION_CALLS, default={}).items()}
    held = common.section_call_ids(section, "held")
    section.done()
    return asked, held


def _refused_by_name(messages: Sequence[Any]) -> dict[str, str]:
    """The calls the requests ``messages`` tell the model were refused by name (no such tool, or not
    available yet), by call id, each with the result its ``ERROR`` is recorded with."""
    return {part.tool_call_id: REFUSED_BY_NAME[cause]
            for message in messages if getattr(message, "kind", None) == "request"
            for part in message.parts
            if (cause := getattr(getattr(part, "retry", None), "cause", None)) in REFUSED_BY_NAME}


def _last_response_call_ids(ctx: Any) -> list[str]:
    """The tool call ids of the last model response in the run's history."""
    for message in reversed(getattr(ctx, "messages", None) or ()):
        if getattr(message, "kind", None) == "response":
            return [part.tool_call_id for part in getattr(message, "parts", ()) if part.part_kind == "tool-call"]
    return []


def turn_state(result: Any) -> dict[str, Any] | None:
    """The JSON state of the turn a deferred run put aside (``Turn.snapshot()`` with the calls
    turnguard asked about and held), for ``metadata={"turnguard": state}`` on the resumed run in
    another process; ``None`` when the run was not deferred."""
    requests = getattr(result, "output", result)
    if not isinstance(requests, DeferredToolRequests):
        return None
    return _STATES.get(id(requests))


def approval_requests(requests: DeferredToolRequests) -> Sequence[Any]:
    """The deferred calls that turnguard (not the tool itself) put to the user: the call it asks
    about and the calls of its batch held with it (``metadata["turnguard"]["held"]``). Answer them
    alike: approving lets the batch go on (the held calls are checked then), denying stops the run."""
    ours = [(call, (requests.metadata.get(call.tool_call_id) or {}).get(METADATA_KEY)) for call in requests.approvals]
    return [call for call, entry in ours if isinstance(entry, dict) and "threshold" in entry]
