"""openai-agents: run hooks that bound one ``Runner.run`` (one run = one turn).

Tested with openai-agents 0.24 (the ``openai-agents`` extra installs ``>=0.24,<0.25``).

``await run(guard, agent, input)`` (or ``run_sync``) runs the agent with ``TurnGuardRunHooks``
and ends the turn however the run finishes (``completed``, ``halted``, ``error`` - the SDK's own
``MaxTurnsExceeded`` included - or ``cancelled``). The hooks can also be passed to
``Runner.run(hooks.observe(agent), ..., hooks=hooks)`` directly (one hooks object per run; call
``hooks.end(exc)`` afterwards, as ``run`` does).

- ``on_llm_start`` is a cycle; ``on_tool_start`` checks the call inside the SDK's own
  ``function_span``, after its tool input guardrails and approvals, right before the tool body;
  ``on_tool_end`` records the outcome.
- A failing function tool does not raise in this SDK: its failure function turns the exception
  into the tool's output, and with tracing off nothing else records it. ``observe(agent)`` (which
  ``run`` applies) gives the run a copy of the agent whose function tools report each handled
  failure to the hooks, whatever the tool's ``failure_error_function`` and whether tracing is on.
  The run's ``tool_error_formatter``, the SDK's span error and its default error text are also
  read, for tools the hooks did not observe (e.g. hooks passed to ``Runner.run`` on an agent that
  was not observed). A tool with no failure function raises and ends the run: its call is
  recorded as an error and the turn ends with ``error``.
- HALT raises ``TurnGuardHalted``, an ``AgentsException`` (the SDK's run-stopping family, like
  ``MaxTurnsExceeded``) and a ``turnguard.LoopDetected``; the tool body does not run.
- ASK: ``ask="approval"`` uses the SDK's own approvals. The observed tools' ``needs_approval``
  checks each call when the SDK plans the model's batch (in order, before any of it runs, as the
  core's rule for a parallel batch expects); a call turnguard asks about interrupts the run
  (``result.interruptions`` holds its ``ToolApprovalItem``), and ``state.approve(item)`` ("continue")
  or ``state.reject(item)`` ("stop") followed by ``run(guard, agent, state, ask="approval")``
  resumes it as the same turn. The tool's own ``needs_approval`` is asked first; a call it sends to
  the user is checked in ``on_tool_start`` once approved. A stop-level ASK (raised by an outcome)
  is asked on the model's next call. A callable ``ask`` answers inline (sync or async). Without a
  route the fallback applies (a warning is observed, a stop halts).
- REMIND (``GuardConfig(remind_model=True)``) cannot be injected: run hooks cannot change a tool's
  output (a per-tool output guardrail could); the reminder is recorded, not shown to the model.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from agents import Agent, FunctionTool, RunConfig, RunHooks, Runner
from agents.exceptions import AgentsException
from agents.tool import default_tool_error_function
from agents.tracing import get_current_span

from turnguard.guard import Guard
from turnguard.integrations._common import (
    Ask,
    Decision,
    RunDriver,
    Step,
    TurnHalted,
    checked_ask,
    end_reason,
    make_call,
    open_turn,
)
from turnguard.model import Outcome, ToolCall, Verdict

APPROVAL = "approval"
"""``ask=APPROVAL``: reach the user through the SDK's tool approvals (``needs_approval``, ``RunState``)."""
MAX_PARKED = 1024
"""Runs interrupted for turnguard's question, waiting to be resumed (oldest dropped past it)."""
_PARKED: OrderedDict[str, TurnGuardRunHooks] = OrderedDict()
"""The hooks of interrupted runs by the call id they asked about: the resumed run is the same turn."""

_DEFAULT_ERROR_TEXT = default_tool_error_function(None, None)  # type: ignore[arg-type]


class TurnGuardHalted(TurnHalted, AgentsException):
    """turnguard stopped the run; an ``AgentsException`` as well as a ``turnguard.LoopDetected``."""


class TurnGuardRunHooks(RunHooks[Any]):
    """Run hooks holding one run's turn. ``inner`` hooks, if given, are called as well."""

    def __init__(
        self,
        guard: Guard,
        *,
        ask: Ask | str | None = None,
        promptable: bool | None = None,
        conversation_id: str | None = None,
        inner: RunHooks[Any] | None = None,
    ) -> None:
        self.guard = guard
        self.ask = checked_ask(ask, APPROVAL)
        self.promptable = promptable
        self.conversation_id = conversation_id
        self.inner = inner
        self.driver: RunDriver | None = None
        self._calls: dict[str, ToolCall] = {}
        self._failed: set[str] = set()
        self._planned: dict[str, Decision] = {}
        """Calls checked when the SDK planned them (``ask="approval"``), by call id."""
        self._asked: dict[str, tuple[Verdict, ToolCall]] = {}
        """Calls interrupted for the user's approval, by call id."""
        self._ask_next: Verdict | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def _open(self, agent: Agent[Any] | None) -> RunDriver:
        if self.driver is None:
            self.driver = open_turn(
                self.guard,
                ask=self.ask,
                promptable=self.promptable,
                conversation_id=self.conversation_id,
                agent_name=getattr(agent, "name", None),
            )
        return self.driver

    def end(self, exc: BaseException | None = None) -> None:
        """End the run's turn (idempotent) with the reason ``exc`` gives; ``run`` calls it for you.

        Calls checked but never finished are recorded: ``error`` when the run died on an
        exception (a tool that raised), ``unknown`` when it was cancelled."""
        if self.driver is None:
            return
        reason = end_reason(exc)
        if reason in ("error", "cancelled"):
            outcome = Outcome.ERROR if reason == "error" else Outcome.UNKNOWN
            for call in list(self._calls.values()):
                self.driver.turn.record_outcome(call, outcome)
            self._calls.clear()
        self.driver.end(exc)

    def observe(self, agent: Agent[Any]) -> Agent[Any]:
        """A copy of ``agent`` (and of the agents it hands off to) whose function tools report each
        failure their failure function handled to these hooks (and, with ``ask="approval"``, check
        each call when the SDK plans it); ``agent`` itself is left as it is."""
        plan = self._plan if self.ask == APPROVAL else None
        return _observed_agent(agent, self._note_failure, plan, {})

    async def _plan(self, tool_name: str, params: Any, call_id: str) -> bool:
        """``needs_approval`` of an observed tool: check the call now; True asks the user."""
        call = make_call(tool_name, params, call_id)
        decision = self._open(None).before(call)
        if decision.step is Step.RUN and self._ask_next is not None:
            decision = Decision(Step.ASK, self._ask_next)
        self._ask_next = None
        self._calls[call_id] = call
        self._planned[call_id] = decision
        if decision.step is not Step.ASK:
            return False  # a HALT is enforced when the call would start
        self._asked[call_id] = (decision.verdict, call)
        return True

    def _note_failure(self, call_id: str | None) -> None:
        if call_id is not None:
            self._failed.add(call_id)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self._open(agent)
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
        driver = self._open(agent)
        for call_id, (verdict, call) in list(self._asked.items()):
            # Resumed, and the call turnguard asked about never started: the user rejected it.
            del self._asked[call_id]
            self._planned.pop(call_id, None)
            self._calls.pop(call_id, None)
            TurnGuardHalted.stop(driver.answer(verdict, "stop", call, before=True))
        TurnGuardHalted.stop(await driver.acycle())
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    # -- tools ---------------------------------------------------------------------------------

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        driver = self._open(agent)
        call_id = getattr(context, "tool_call_id", None)
        planned = self._planned.pop(call_id, None) if call_id is not None else None
        if planned is not None:  # checked when the SDK planned it
            asked = self._asked.pop(call_id, None)
            # It starts, so an asked call was approved: the user's "continue".
            decision = planned if asked is None else driver.answer(asked[0], "continue", asked[1], before=True)
        else:
            call = _call(context, tool)
            if call.call_id is not None:
                self._calls[call.call_id] = call
            decision = await driver.acheck(call)
        TurnGuardHalted.stop(decision)
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        driver = self._open(agent)
        call_id = getattr(context, "tool_call_id", None)
        call = self._calls.pop(call_id, None) or _call(context, tool)
        outcome = Outcome.ERROR if self._failed_call(call_id, result) else Outcome.OK
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)
        if self.ask == APPROVAL:
            decision = driver.after(call, outcome)
            if decision.step is Step.ASK:  # the stop level: the model's next call asks the user
                self._ask_next = decision.verdict
                return
            TurnGuardHalted.stop(decision)
            return
        TurnGuardHalted.stop(await driver.aoutcome(call, outcome))

    def _failed_call(self, call_id: str | None, result: Any) -> bool:
        if call_id is not None and call_id in self._failed:
            self._failed.discard(call_id)
            return True
        span = get_current_span()
        if span is not None and span.error is not None:
            return True
        return isinstance(result, str) and result == _DEFAULT_ERROR_TEXT

    def tool_error_formatter(self, inner: Any = None) -> Any:
        """A ``RunConfig.tool_error_formatter`` that notes failed calls, then defers to ``inner``."""

        async def formatter(args: Any) -> str | None:
            if args.kind == "tool_exception":
                self._failed.add(args.call_id)
            if inner is None:
                return None
            message = inner(args)
            return await message if inspect.isawaitable(message) else message

        return formatter


def _call(context: Any, tool: Any) -> ToolCall:
    return make_call(
        getattr(tool, "name", None), getattr(context, "tool_arguments", None), getattr(context, "tool_call_id", None)
    )


async def run(
    guard: Guard,
    agent: Agent[Any],
    input: Any,
    *,
    ask: Ask | str | None = None,
    promptable: bool | None = None,
    conversation_id: str | None = None,
    hooks: RunHooks[Any] | None = None,
    run_config: RunConfig | None = None,
    turn_state: dict[str, Any] | None = None,
    **runner_kwargs: Any,
) -> Any:
    """``Runner.run`` under turnguard: the run is one turn, ended however the run finishes.

    A run interrupted for approvals (turnguard's, with ``ask="approval"``, or a tool's own) keeps its
    turn open: pass the ``RunState`` with your answers back to ``run`` and the turn goes on. To
    resume in another process, store ``turn_state(result)`` beside ``state.to_string()`` and pass it
    back as ``turn_state=`` (both guards need the same ``GuardConfig(digest_key=...)``).

    ``conversation_id`` defaults to ``Runner.run``'s ``conversation_id`` or ``RunConfig.group_id``.
    """
    config = run_config if run_config is not None else RunConfig()
    if conversation_id is None:  # the SDK's own names for the conversation, when given
        conversation_id = runner_kwargs.get("conversation_id") or getattr(config, "group_id", None)
    guarded = _resumed(input)
    if guarded is None and turn_state is not None:
        guarded = _from_turn_state(guard, turn_state, ask=ask, promptable=promptable, inner=hooks)
    if guarded is None:
        guarded = TurnGuardRunHooks(
            guard, ask=ask, promptable=promptable, conversation_id=conversation_id, inner=hooks
        )
    agent = guarded.observe(agent)
    if hasattr(config, "tool_error_formatter"):  # older SDKs: the span error and default text remain
        config = dataclasses.replace(
            config, tool_error_formatter=guarded.tool_error_formatter(config.tool_error_formatter)
        )
    try:
        result = await Runner.run(agent, input, hooks=guarded, run_config=config, **runner_kwargs)
    except BaseException as exc:
        guarded.end(_unwrap(exc))
        raise
    interruptions = getattr(result, "interruptions", None)
    if interruptions:  # the user answers (turnguard's question or the tool's own) in a resumed run
        for item in interruptions:
            _PARKED[getattr(item, "call_id", None) or ""] = guarded
        while len(_PARKED) > MAX_PARKED:
            _, stale = _PARKED.popitem(last=False)
            stale.end()
        return result
    guarded.end()
    return result


def turn_state(result: Any) -> dict[str, Any] | None:
    """The JSON state of the turn an interrupted ``run`` left open (``Turn.snapshot()`` with the
    calls turnguard asked about), for ``run(..., turn_state=...)`` in another process."""
    for item in getattr(result, "interruptions", None) or ():
        hooks = _PARKED.get(getattr(item, "call_id", None) or "")
        if hooks is not None and hooks.driver is not None:
            asked = list(hooks._asked.items())
            state = hooks.driver.turn.snapshot(pending=asked[0][1][0] if asked else None)
            state[ADAPTER_KEY] = {"asked": [call_id for call_id, _ in asked]}
            return state
    return None


ADAPTER_KEY = "openai_agents"


def _from_turn_state(
    guard: Guard, state: dict[str, Any], *, ask: Any, promptable: bool | None, inner: RunHooks[Any] | None
) -> TurnGuardRunHooks:
    """Hooks continuing a turn another process left open (``turn_state``)."""
    from turnguard.snapshot import pending

    hooks = TurnGuardRunHooks(guard, ask=ask, promptable=promptable, inner=inner)
    turn = guard.resume(state)
    hooks.driver = RunDriver(turn, ask=None if isinstance(hooks.ask, str) else hooks.ask)
    verdict = pending(state)
    names = {entry[2]: entry[1] for entry in state.get("awaiting", ())}
    for call_id in (state.get(ADAPTER_KEY) or {}).get("asked", ()):
        if verdict is not None and call_id in names:
            call = ToolCall(names[call_id], None, call_id)  # its outcome is matched by call_id
            hooks._asked[call_id] = (verdict, call)
            hooks._planned[call_id] = Decision(Step.ASK, verdict)
            hooks._calls[call_id] = call
    return hooks


def _resumed(input: Any) -> TurnGuardRunHooks | None:
    """The hooks of the run ``input`` (a ``RunState``) resumes, if it was interrupted by turnguard."""
    interruptions = getattr(input, "get_interruptions", None)
    if not callable(interruptions):
        return None
    found = None
    for item in interruptions():
        found = _PARKED.pop(getattr(item, "call_id", None) or "", None) or found
    if found is not None:
        for call_id in [k for k, v in _PARKED.items() if v is found]:
            del _PARKED[call_id]
    return found


def run_sync(guard: Guard, agent: Agent[Any], input: Any, **kwargs: Any) -> Any:
    """``run`` for synchronous callers (no event loop running)."""
    return asyncio.run(run(guard, agent, input, **kwargs))


Plan = Callable[[str, Any, str], Any]


def _observed_agent(
    agent: Agent[Any], failed: Callable[[str | None], None], plan: Plan | None, seen: dict[int, Agent[Any]]
) -> Agent[Any]:
    if id(agent) in seen:  # agents may hand off to each other
        return seen[id(agent)]
    clone = seen[id(agent)] = agent.clone(tools=[_observed_tool(tool, failed, plan) for tool in agent.tools])
    clone.handoffs = [
        _observed_agent(target, failed, plan, seen) if isinstance(target, Agent) else target
        for target in agent.handoffs
    ]
    return clone


def _observed_tool(tool: Any, failed: Callable[[str | None], None], plan: Plan | None) -> Any:
    """A copy of a ``function_tool`` whose handled failures are reported to ``failed``.

    The SDK's invoker catches the tool's exception, asks the tool's failure function for the text
    the model sees, and reports the handled error (to tracing and the log) through its
    ``_on_handled_error``; the copy's invoker (the SDK binds a fresh one to each copy) reports it
    to turnguard first. Tools built otherwise are returned as they are."""
    if not isinstance(tool, FunctionTool):
        return tool
    observed = copy.copy(tool)
    invoker = observed.on_invoke_tool
    handled = getattr(invoker, "_on_handled_error", None)
    if invoker is tool.on_invoke_tool or not callable(handled):
        return tool

    def on_handled_error(function_tool: Any, error: Exception, input_json: str, context: Any) -> None:
        failed(getattr(context, "tool_call_id", None))
        handled(function_tool, error, input_json, context)

    invoker._on_handled_error = on_handled_error
    if plan is not None:
        own = tool.needs_approval

        async def needs_approval(context: Any, params: Any, call_id: str) -> bool:
            if own is True or (callable(own) and await _maybe_await(own(context, params, call_id))):
                return True  # the tool's own approval; turnguard checks the call once it starts
            return await plan(observed.name, params, call_id)

        observed.needs_approval = needs_approval
    return observed


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _unwrap(exc: BaseException) -> BaseException:
    cause = exc
    while cause is not None and not isinstance(cause, TurnHalted):
        cause = cause.__cause__
    return cause or exc
