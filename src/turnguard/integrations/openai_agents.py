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
  ``run`` applies) gives the run a copy of the agent, and of every agent it hands off to (an
  ``Agent`` in its ``handoffs`` or a ``Handoff`` such as ``handoff(agent, ...)``, nested too), whose
  function tools report each handled failure to the hooks, whatever the tool's
  ``failure_error_function`` and whether tracing is on. The tools of its MCP servers
  (``mcp_servers``) are observed alike, and a result a server flags ``isError`` (how an MCP tool
  fails; the SDK hands it to the model as the output) is reported as a failure too.
  The run's ``tool_error_formatter``, the SDK's span error and its default error text are also
  read, for tools the hooks did not observe (e.g. hooks passed to ``Runner.run`` on an agent that
  was not observed). A tool with no failure function raises and ends the run: its call is
  recorded as an error and the turn ends with ``error``.
- HALT raises ``TurnGuardHalted``, an ``AgentsException`` (the SDK's run-stopping family, like
  ``MaxTurnsExceeded``) and a ``turnguard.LoopDetected``; the tool body does not run. The calls of
  the same response already let run, which the SDK cancels, are recorded ``unknown`` when the turn
  ends (``error`` when the run died on an exception).
- ASK: ``ask="approval"`` uses the SDK's own approvals. The observed tools' ``needs_approval``
  checks each call when the SDK plans the model's batch (in order, before any of it runs, as the
  core's rule for a parallel batch expects); a call turnguard asks about interrupts the run, and
  the calls planned after it are interrupted with it, unchecked (a question holds the rest of its
  batch). ``approval_requests(result)`` is turnguard's question: ``state.approve(item)``
  ("continue") or ``state.reject(item)`` ("stop"), then ``run(guard, agent, state,
  ask="approval")`` resumes it as the same turn; leave the held calls undecided: after a
  "continue" turnguard checks them in order and approves them, up to the next question, which
  holds the rest again (after a "stop" none runs). The tool's own ``needs_approval`` is asked
  first; a call it sends to the user is checked in ``on_tool_start`` once approved. A stop-level
  ASK (raised by an outcome) is asked on the model's next call. A callable ``ask`` answers inline
  (sync or async; the calls of the batch checked meanwhile wait for its answer). Without a route
  the fallback applies (a warning is observed, a stop halts).
- Another process: store ``state_string(result)`` (the SDK's ``RunState`` string with the turn's
  state in it) and restore it with ``resume_state(guard, agent, string)``, which rebuilds the run
  on turnguard's observed copy of ``agent`` (``RunState.from_string(agent, ...)`` alone rebuilds it
  on ``agent`` itself: no failure reports, no approvals); answer it, then ``run`` it. ``run`` also
  rebuilds a ``RunState`` the SDK restored on ``agent`` on the copy (``observed_state``), so
  ``turn_state=`` beside the SDK's own string works too; hooks passed to ``Runner.run`` directly
  need ``RunState.from_string(hooks.observe(agent), ...)`` (or ``await hooks.observed_state``).
- REMIND (``GuardConfig(remind_model=True)``) cannot be injected: run hooks cannot change a tool's
  output (a per-tool output guardrail could); the reminder is recorded, not shown to the model.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from agents import Agent, FunctionTool, Handoff, RunConfig, RunContextWrapper, RunHooks, Runner, RunState
from agents.exceptions import AgentsException
from agents.tool import default_tool_error_function
from agents.tracing import get_current_span

from turnguard._guard import Guard
from turnguard._model import Outcome, ToolCall, Verdict
from turnguard.integrations import _common as common

__all__ = [
    "TurnGuardHalted",
    "TurnGuardRunHooks",
    "approval_requests",
    "resume_state",
    "run",
    "run_sync",
    "state_string",
    "turn_state",
]

APPROVAL = "approval"
"""``ask=APPROVAL``: reach the user through the SDK's tool approvals (``needs_approval``, ``RunState``)."""
MAX_PARKED = 1024
"""Interrupted runs waiting to be resumed in this process; past it the oldest is put aside as
``suspended`` (not reported here: a process that resumes it from its state reports it)."""
_PARKED: OrderedDict[str, TurnGuardRunHooks] = OrderedDict()
"""The hooks of interrupted runs by the call id they asked about: the resumed run is the same turn."""

_DEFAULT_ERROR_TEXT = default_tool_error_function(RunContextWrapper(context=None), Exception())


class TurnGuardHalted(common.TurnHalted, AgentsException):
    """turnguard stopped the run; an ``AgentsException`` as well as a ``turnguard.LoopDetected``."""


class TurnGuardRunHooks(RunHooks[Any]):
    """Run hooks holding one run's turn. ``inner`` hooks, if given, are called as well."""

    def __init__(
        self,
        guard: Guard,
        *,
        ask: common.Ask | str | None = None,
        promptable: bool | None = None,
        conversation_id: str | None = None,
        inner: RunHooks[Any] | None = None,
    ) -> None:
        self.guard = guard
        self.ask = common.checked_ask(ask, APPROVAL)
        self.promptable = promptable
        self.conversation_id = conversation_id
        self.inner = inner
        self.driver: common.RunDriver | None = None
        self._calls: dict[str, ToolCall] = {}
        self._failed: set[str] = set()
        self._planned: dict[str, common.Decision] = {}
        """Calls checked when the SDK planned them (``ask="approval"``), by call id."""
        self._asked: dict[str, tuple[Verdict, ToolCall]] = {}
        """Calls interrupted for the user's approval, by call id."""
        self._held: set[str] = set()
        """Calls interrupted with the question, unchecked: turnguard decides them once it is answered."""
        self._ask_next: Verdict | None = None
        self._observed: Copies = {}
        """The observed copy of each agent observed (given to ``observe``, or reached from one through
        a handoff, when observed or when a ``handoff()`` returns it): one copy per source agent, so a
        resumed ``RunState`` and the run share it."""

    # -- lifecycle -----------------------------------------------------------------------------

    def _open(self, agent: Agent[Any] | None) -> common.RunDriver:
        if self.driver is None:
            self.driver = common.open_turn(
                self.guard,
                ask=self.ask,
                promptable=self.promptable,
                conversation_id=self.conversation_id,
                agent_name=getattr(agent, "name", None),
                durable=True,  # an interrupted run's state may resume in another process
            )
        return self.driver

    def end(self, exc: BaseException | None = None) -> None:
        """End the run's turn (idempotent) with the reason ``exc`` gives; ``run`` calls it for you.

        Calls checked and let run but never finished (the SDK cancels a batch's other calls when
        one stops the run) are recorded: ``error`` when the run died on an exception (a tool that
        raised), else ``unknown``, whatever ended it (a halt or a refusal included)."""
        if self.driver is None:
            return
        outcome = common.unfinished_outcome(exc)
        for call in list(self._calls.values()):
            self.driver.turn.record_outcome(call, outcome)
        self._calls.clear()
        self.driver.end(exc)

    def observe(self, agent: Agent[Any]) -> Agent[Any]:
        """A copy of ``agent`` (and of the agents it hands off to, in ``handoffs`` or through a
        ``Handoff`` such as ``handoff(agent, ...)``) whose function tools report each
        failure their failure function handled to these hooks (and, with ``ask="approval"``, check
        each call when the SDK plans it); ``agent`` itself is left as it is."""
        plan = self._plan if self.ask == APPROVAL else None
        return _observed_agent(agent, self._note_failure, plan, self._observed)

    async def observed_state(self, agent: Agent[Any], state: Any) -> Any:
        """``state`` (a ``RunState``; anything else is returned as it is) on the observed copy of
        ``agent``. One restored by the SDK's own ``RunState.from_string(agent, ...)`` runs on
        ``agent`` itself, whose tools neither report their handled failures nor ask turnguard: it
        is rebuilt on the copy (through its JSON, its context object and approvals kept); one that
        cannot be rebuilt puts the turn resumed for it aside (``put_aside``)."""
        current = getattr(state, "_current_agent", None)
        if not isinstance(state, RunState) or current is None or _is_copy(current, self._observed):
            return state
        try:
            data = state.to_json(context_serializer=lambda _context: {})  # the context object is kept below
            return await RunState.from_json(self.observe(agent), data, context_override=state._context)
        except BaseException:
            self.put_aside()
            raise

    async def _plan(self, tool_name: str, params: Any, call_id: str) -> bool:
        """``needs_approval`` of an observed tool: check the call now; True interrupts the run for
        the user (the call turnguard asks about, or one held with it)."""
        return self._planned_step(common.make_call(tool_name, params, call_id)) is not common.Step.RUN

    def _planned_step(self, call: ToolCall) -> common.Step:
        """Check a call the SDK plans: ``common.Step.ASK`` it is asked about (the question), ``common.Step.HOLD``
        it waits with the question, ``common.Step.RUN`` it goes on (a HALT is enforced when it would start)."""
        call_id = str(call.call_id)
        decision = self._open(None).before(call)
        if decision.step is common.Step.HOLD:
            self._held.add(call_id)
            return common.Step.HOLD
        if decision.step is common.Step.RUN and self._ask_next is not None:
            decision = common.Decision(common.Step.ASK, self._ask_next)
        self._ask_next = None
        if decision.step is not common.Step.HALT:  # a halted call never runs: no outcome to settle
            self._calls[call_id] = call
        self._planned[call_id] = decision
        if decision.step is not common.Step.ASK:
            return common.Step.RUN
        self._asked[call_id] = (decision.verdict, call)
        self._open(None).defer(decision.verdict)
        return common.Step.ASK

    def release_held(self, state: Any, interruptions: Any) -> bool:
        """After a run interrupted with held calls: once the question is answered, turnguard decides
        them, in order (each checked: approved to run, or the next question, which holds the rest);
        ``True`` when it approved any (the run goes on). A question neither approved (it would have
        started) nor still waiting was rejected: the user's stop."""
        driver = self.driver
        if driver is None or not self._held:
            return False
        waiting = {getattr(item, "call_id", None): item for item in interruptions}
        if driver.question is not None:
            rejected = [call_id for call_id in self._asked if call_id not in waiting]
            for asked_id in rejected:
                verdict, call = self._asked.pop(asked_id)
                self._planned.pop(asked_id, None)
                self._calls.pop(asked_id, None)
                TurnGuardHalted.stop(driver.answer(verdict, "stop", call, before=True))
            return False
        approved = False
        for call_id, item in waiting.items():
            if call_id not in self._held:
                continue
            self._held.discard(call_id)
            name = getattr(item, "tool_name", None) or getattr(item, "name", None)
            arguments = _params(getattr(item.raw_item, "arguments", None))
            step = self._planned_step(common.make_call(name, arguments, call_id))
            if step is common.Step.RUN:
                state.approve(item)
                approved = True
        return approved

    def turn_state(self) -> dict[str, Any]:
        """The open turn's snapshot with the question pending and, under ``ADAPTER_KEY``, the calls
        asked about and held (the module's ``turn_state``; ``restore_questions`` reads them back)."""
        assert self.driver is not None  # (only a run that opened its turn is parked)
        state = self.driver.turn.snapshot(pending=self.driver.question)
        state[ADAPTER_KEY] = {"asked": list(self._asked), "held": sorted(self._held)}
        return state

    def asked_about(self, call_id: str) -> bool:
        """Whether the call ``call_id`` is one turnguard asked the user about and is waiting on."""
        return call_id in self._asked

    def restore_questions(self, verdict: Verdict, asked: Iterable[str], held: Iterable[str]) -> None:
        """Continue a ``turn_state`` taken elsewhere: the calls it asked about (with ``verdict``, the
        pending question) and the calls it held (call ids, read by ``_questions``)."""
        for call_id in asked:
            call = ToolCall("tool", None, call_id)  # its outcome is matched by call_id
            self._asked[call_id] = (verdict, call)
            self._planned[call_id] = common.Decision(common.Step.ASK, verdict)
            self._calls[call_id] = call
        self._held = set(held)

    def put_aside(self) -> None:
        """Put the turn resumed for this run aside as ``suspended`` (the run could not be restored
        around it): its state stays the turn's to resume, under its id."""
        if self.driver is not None:
            common.put_aside(self.driver.turn, self.driver.question)

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
        if call_id is not None and planned is not None:  # checked when the SDK planned it
            asked = self._asked.pop(call_id, None)
            # It starts, so an asked call was approved: the user's "continue".
            decision = planned if asked is None else driver.answer(asked[0], "continue", asked[1], before=True)
        elif call_id is not None and call_id in self._held:  # a held call the user approved themselves
            self._held.discard(call_id)
            call = self._calls[call_id] = _call(context, tool)
            decision = await self._held_start(driver, call)
        else:
            call = _call(context, tool)
            if call.call_id is not None:
                self._calls[call.call_id] = call
            decision = await driver.acheck(call)
        try:
            TurnGuardHalted.stop(decision)
        except TurnGuardHalted:  # the call does not run (a refused one is recorded DENIED): nothing to settle
            if call_id is not None:
                self._calls.pop(call_id, None)
            raise
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        driver = self._open(agent)
        call_id = getattr(context, "tool_call_id", None)
        call = (self._calls.pop(call_id, None) if call_id is not None else None) or _call(context, tool)
        outcome = Outcome.ERROR if self._failed_call(call_id, result) else Outcome.OK
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)
        if self.ask == APPROVAL:
            decision = driver.after(call, outcome, result)
            if decision.step is common.Step.ASK:  # the stop level: the model's next call asks the user
                self._ask_next = decision.verdict
                return
            TurnGuardHalted.stop(decision)
            return
        TurnGuardHalted.stop(await driver.aoutcome(call, outcome, result))  # the tool's output: its result

    async def _held_start(self, driver: common.RunDriver, call: ToolCall) -> common.Decision:
        """A held call starting because the user approved it: its question still waiting was not
        approved (an approved one starts first): the user's stop. Otherwise it is checked now; an
        ASK cannot pause a call that is starting, so the no-route fallback answers it."""
        for call_id, (verdict, asked) in list(self._asked.items()):
            del self._asked[call_id]
            self._planned.pop(call_id, None)
            self._calls.pop(call_id, None)
            TurnGuardHalted.stop(driver.answer(verdict, "stop", asked, before=True))
        decision = driver.before(call)
        return driver.fallback(decision.verdict) if decision.step is common.Step.ASK else decision

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
    return common.make_call(
        getattr(tool, "name", None), getattr(context, "tool_arguments", None), getattr(context, "tool_call_id", None)
    )


async def run(
    guard: Guard,
    agent: Agent[Any],
    input: Any,
    *,
    ask: common.Ask | str | None = None,
    promptable: bool | None = None,
    conversation_id: str | None = None,
    hooks: RunHooks[Any] | None = None,
    run_config: RunConfig | None = None,
    turn_state: dict[str, Any] | None = None,
    **runner_kwargs: Any,
) -> Any:
    """``Runner.run`` under turnguard: the run is one turn, ended however the run finishes.

    A run interrupted for approvals (turnguard's, with ``ask="approval"``, or a tool's own) keeps its
    turn open: pass the ``RunState`` with your answers back to ``run`` and the turn goes on (the calls
    turnguard held with its question are decided by turnguard once you answered it). To resume in
    another process, store ``state_string(result)`` and restore it with ``resume_state``: it
    rebuilds the run on turnguard's observed copy of ``agent`` (whose tools report their handled
    failures and ask turnguard before running) and carries the turn's state. The SDK's own
    ``RunState.from_string(agent, ...)`` rebuilds it on ``agent`` itself, which does neither: ``run``
    rebuilds such a state on the copy (a round trip through its JSON, keeping its context object);
    pass the turn's state with it as ``turn_state=turn_state(result)``, stored beside the SDK's
    ``to_string()``, or the run is a new turn.

    ``conversation_id`` defaults to the SDK's own name for the conversation: ``Runner.run``'s
    ``conversation_id``, else ``RunConfig.group_id``, else the ``session``'s ``session_id``.
    """
    config = run_config if run_config is not None else RunConfig()
    if conversation_id is None:
        conversation_id = _sdk_conversation_id(runner_kwargs, config)
    guarded = _resumed(input)
    if guarded is None:
        guarded = _turn_hooks(guard, turn_state, ask=ask, promptable=promptable, inner=hooks,
                              conversation_id=conversation_id)
    input = await guarded.observed_state(agent, input)
    agent = guarded.observe(agent)
    if hasattr(config, "tool_error_formatter"):  # older SDKs: the span error and default text remain
        config = dataclasses.replace(
            config, tool_error_formatter=guarded.tool_error_formatter(config.tool_error_formatter)
        )
    try:
        result = await Runner.run(agent, input, hooks=guarded, run_config=config, **runner_kwargs)
        while result.interruptions:  # calls held with a question that was answered: turnguard decides
            state = result.to_state()
            if not guarded.release_held(state, result.interruptions):
                break
            result = await Runner.run(agent, state, hooks=guarded, run_config=config, **runner_kwargs)
    except BaseException as exc:
        guarded.end(_unwrap(exc))
        raise
    interruptions = getattr(result, "interruptions", None)
    if interruptions:  # the user answers (turnguard's question or the tool's own) in a resumed run
        _park(guarded, interruptions)
        return result
    guarded.end()
    return result


def _sdk_conversation_id(runner_kwargs: dict[str, Any], config: Any) -> str | None:
    """The conversation a run belongs to, as the SDK names it: ``Runner.run``'s ``conversation_id``,
    else ``RunConfig.group_id`` (a ``RunConfig`` or its mapping), else the ``session``'s
    ``session_id`` (the conversation a ``SQLiteSession`` or ``OpenAIConversationsSession`` holds), so
    that probe sampling keeps a conversation in one cohort. A session that cannot name itself yet
    (an ``OpenAIConversationsSession`` before its first request raises) names none."""
    group_id = config.get("group_id") if isinstance(config, dict) else getattr(config, "group_id", None)
    named = runner_kwargs.get("conversation_id") or group_id
    if named:
        return named
    session = runner_kwargs.get("session")
    if session is None:
        return None
    try:
        session_id = session.session_id
    except Exception:  # a lazily created remote conversation has no id until its first request
        return None
    return session_id if isinstance(session_id, str) and session_id else None


def turn_state(result: Any) -> dict[str, Any] | None:
    """The JSON state of the turn an interrupted ``run`` left open (``Turn.snapshot()`` with the
    calls turnguard asked about and held), for ``run(..., turn_state=...)`` in another process."""
    for item in getattr(result, "interruptions", None) or ():
        hooks = _PARKED.get(getattr(item, "call_id", None) or "")
        if hooks is not None and hooks.driver is not None:
            return hooks.turn_state()
    return None


def approval_requests(result: Any) -> list[Any]:
    """The interruptions of an interrupted ``run`` (its result, or a ``RunState``) that turnguard
    asks the user about: approve one (``state.approve(item)``) for "continue", reject it for "stop".
    The calls it holds with its question are interruptions too: leave them undecided, turnguard
    decides them once you answered (approved, a held call is checked when it starts; rejected, it
    does not run)."""
    found = []
    interruptions = getattr(result, "get_interruptions", None)
    for item in interruptions() if callable(interruptions) else getattr(result, "interruptions", None) or ():
        call_id = getattr(item, "call_id", None) or ""
        hooks = _PARKED.get(call_id)
        if hooks is not None and hooks.asked_about(call_id):
            found.append(item)
    return found


ADAPTER_KEY = "openai_agents"


def _turn_hooks(
    guard: Guard, state: dict[str, Any] | None, *, ask: Any, promptable: bool | None, inner: RunHooks[Any] | None,
    conversation_id: str | None = None,
) -> TurnGuardRunHooks:
    """A run's hooks: for a new turn (``state`` ``None``), or continuing the turn another process
    left open (``turn_state``), whose conversation is the snapshot's."""
    if state is None:
        return TurnGuardRunHooks(guard, ask=ask, promptable=promptable, conversation_id=conversation_id, inner=inner)
    from turnguard._snapshot import pending

    hooks = TurnGuardRunHooks(guard, ask=ask, promptable=promptable, inner=inner)
    asked, held = _questions(state)
    turn = guard.resume(state)
    hooks.driver = common.RunDriver(turn, ask=None if isinstance(hooks.ask, str) else hooks.ask)
    verdict = pending(state)
    if verdict is None:
        return hooks
    hooks.driver.defer(verdict)
    hooks.restore_questions(verdict, asked, held)
    return hooks


def _questions(state: Any) -> tuple[list[str], list[str]]:
    """The call ids a ``turn_state`` asked about and held, read before its turn is resumed
    (``common.adapter_section``)."""
    section = common.adapter_section(state, ADAPTER_KEY)
    if section is None:
        return [], []
    asked, held = common.section_call_ids(section, "asked"), common.section_call_ids(section, "held")
    section.done()
    return asked, held


STATE_STRING_KEY = "turnguard"
"""The key of the turn's state inside a ``state_string`` (the SDK's ``RunState`` JSON)."""


def state_string(result: Any, **to_string_options: Any) -> str:
    """An interrupted ``run`` as one string to store: the SDK's ``result.to_state().to_string()``
    (``to_string_options`` go to it) with the turn's state (``turn_state``) inside, for
    ``resume_state`` in this process or another."""
    data = json.loads(result.to_state().to_string(**to_string_options))
    data[STATE_STRING_KEY] = turn_state(result)
    return json.dumps(data)


async def resume_state(
    guard: Guard,
    agent: Agent[Any],
    state_string: str,
    *,
    ask: common.Ask | str | None = APPROVAL,
    promptable: bool | None = None,
    hooks: RunHooks[Any] | None = None,
    turn_state: dict[str, Any] | None = None,
    **from_string_options: Any,
) -> Any:
    """The ``RunState`` a guarded run left in ``state_string`` (``state_string(result)``, or the
    SDK's own ``to_string()`` with ``turn_state=``), restored for ``run`` to resume as the same turn.

    ``RunState.from_string(agent, ...)`` alone rebuilds the run on ``agent`` itself, without the copy
    turnguard observes (its failure reports, its approvals): this restores it on that copy. Answer
    its interruptions on the returned state (``approval_requests``), then
    ``await run(guard, agent, state)``. ``from_string_options`` go to ``RunState.from_string``."""
    data = json.loads(state_string)
    stored = data.pop(STATE_STRING_KEY, None) if isinstance(data, dict) else None
    guarded = _turn_hooks(guard, turn_state if turn_state is not None else stored, ask=ask, promptable=promptable,
                          inner=hooks)
    try:
        restored = await RunState.from_string(guarded.observe(agent), json.dumps(data), **from_string_options)
    except BaseException:
        guarded.put_aside()
        raise
    _park(guarded, restored.get_interruptions())
    return restored


def _park(hooks: TurnGuardRunHooks, interruptions: Any) -> None:
    """Keep an interrupted run's hooks for the run that resumes it, by its interruptions' call ids.
    A run no longer reachable (past ``MAX_PARKED``, or its call ids taken by a later run) is put
    aside: never resumed here, it may be resumed from its state in another process."""
    displaced = []
    for item in interruptions:
        key = getattr(item, "call_id", None) or ""
        previous = _PARKED.pop(key, None)
        _PARKED[key] = hooks
        if previous is not None and previous is not hooks:
            displaced.append(previous)
    while len(_PARKED) > MAX_PARKED:
        displaced.append(_PARKED.popitem(last=False)[1])
    for stale in displaced:
        if stale.driver is not None and all(parked is not stale for parked in _PARKED.values()):
            common.put_aside(stale.driver.turn, stale.driver.question)


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
Copies = dict[int, tuple[Agent[Any], Agent[Any]]]
"""Observed copies by the source agent's id: (the source, its copy). The source is kept with its copy
so that its id is not taken by another agent (one a ``handoff()`` makes per call) while the run lasts."""


def _observed_agent(
    agent: Agent[Any], failed: Callable[[str | None], None], plan: Plan | None, seen: Copies
) -> Agent[Any]:
    """The observed copy of ``agent`` and, through its handoffs, of every agent it reaches; ``seen``
    holds the copies by the source agent's id (agents may hand off to each other)."""
    if id(agent) in seen:
        return seen[id(agent)][1]
    clone = agent.clone(tools=[_observed_tool(tool, failed, plan) for tool in agent.tools],
                        mcp_servers=[_ObservedServer(server, failed) for server in agent.mcp_servers])
    seen[id(agent)] = (agent, clone)
    clone.handoffs = [_observed_handoff(target, failed, plan, seen) for target in agent.handoffs]
    if clone.mcp_servers:
        listed = clone.get_mcp_tools

        async def get_mcp_tools(run_context: RunContextWrapper[Any]) -> list[Any]:
            # The servers' tools, listed for each model request: observed like the agent's own.
            return [_observed_tool(tool, failed, plan) for tool in await listed(run_context)]

        clone.get_mcp_tools = get_mcp_tools  # type: ignore[method-assign]
    return clone


class _ObservedServer:
    """An agent's MCP server as the observed run reaches it: the server itself, whose tool results
    the server flags ``isError`` (how an MCP tool fails: the SDK hands the model the error as the
    tool's output, nothing raises) are reported to ``failed``, through the SDK's
    ``custom_data_extractor`` (the server's own, if any, is called after)."""

    def __init__(self, server: Any, failed: Callable[[str | None], None]) -> None:
        self._server = server
        self._failed = failed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    async def custom_data_extractor(self, context: Any) -> Any:
        if context.is_error:
            self._failed(getattr(context.run_context, "tool_call_id", None))
        own = getattr(self._server, "custom_data_extractor", None)
        return await _maybe_await(own(context)) if own is not None else None


def _observed_handoff(
    target: Any, failed: Callable[[str | None], None], plan: Plan | None, seen: Copies
) -> Any:
    """A handoff target as the observed run reaches it: an ``Agent``'s observed copy, or a copy of a
    ``Handoff`` (``handoff(agent, ...)``, its callback and input filter kept) whose invocation
    returns the observed copy of the agent it hands off to. That agent is observed now when the
    ``Handoff`` names it (``RunState`` finds the agents of a run through it), else when invoked."""
    if isinstance(target, Agent):
        return _observed_agent(target, failed, plan, seen)
    if not isinstance(target, Handoff):
        return target
    invoke = target.on_invoke_handoff

    async def on_invoke_handoff(context: RunContextWrapper[Any], input_json: str) -> Any:
        agent = await invoke(context, input_json)
        return _observed_agent(agent, failed, plan, seen) if isinstance(agent, Agent) else agent

    observed = copy.copy(target)
    observed.on_invoke_handoff = on_invoke_handoff
    named = target._agent_ref() if target._agent_ref is not None else None
    if isinstance(named, Agent):
        # (held strongly by ``seen``, which the hooks keep: the reference stays alive with the run)
        observed._agent_ref = weakref.ref(_observed_agent(named, failed, plan, seen))
    return observed


def _is_copy(agent: Any, seen: Copies) -> bool:
    return any(observed is agent for _source, observed in seen.values())


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

    # (the SDK's invoker has this attribute, read above; its declared type, a Callable, does not say so)
    invoker._on_handled_error = on_handled_error  # type: ignore[attr-defined]
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


def _params(arguments: Any) -> Any:
    """A function call's arguments as ``needs_approval`` gets them (parsed JSON), else as they are."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _unwrap(exc: BaseException) -> BaseException:
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, common.TurnHalted):
        cause = cause.__cause__
    return cause or exc
