"""LangChain 1.x: an agent middleware that bounds each ``create_agent`` invocation (one turn).

Tested with langchain 1.5 and langgraph 1.2 (the ``langchain`` extra installs ``langchain>=1.5,<2``
and ``langgraph>=1.2,<2``).

``middleware = TurnGuardMiddleware(guard)``, ``agent = middleware.watch(create_agent(model, tools,
middleware=[middleware]))``. ``before_agent`` opens the turn, ``before_model`` is a cycle,
``after_model`` checks the response's calls in the model's order before any runs,
``wrap_tool_call`` applies each call's decision and records its outcome (an exception, or a
``ToolMessage`` with ``status="error"``, is ``ERROR``), ``after_agent`` ends the turn. A halt in
a batch of parallel calls is raised by its last call to settle, so the others report first; a
call checked whose outcome never comes settles ``UNKNOWN`` as the turn ends (``ERROR`` when the
run was cancelled while it ran).

A tool that raises with no error handler, or a model that raises, ends the run, and the exception
passes through ``wrap_tool_call`` / ``wrap_model_call``, which end the turn (``error``) there,
unless another middleware's wrapper is outside turnguard's (listed before it), which may still
catch it (``ToolRetryMiddleware``, ``ModelRetryMiddleware``, ``ModelFallbackMiddleware``): then the
turn goes on, or ends where ``watch`` sees the run fail. A run can also die where no middleware
hook runs: LangGraph's own ``recursion_limit``, a cancelled ``ainvoke``.
``watch(agent)`` binds a callback handler that sees the graph run fail and ends its turn with the
reason (``error`` or ``cancelled``); without it such a turn stays open until ``MAX_OPEN_TURNS``
later turns end it as ``abandoned`` (a cancellation that lands in a tool call is seen by the
middleware itself).

HALT: ``exit_behavior="error"`` (the default) raises ``TurnGuardHalted`` (a ``turnguard.LoopDetected``);
``exit_behavior="end"`` answers the halted call with an error ``ToolMessage`` instead of running it
and ends the run before the next model request with an ``AIMessage`` naming the threshold and the
counts, like LangChain's own ``ToolCallLimitMiddleware(exit_behavior="end")``.

ASK: ``ask="interrupt"`` uses LangGraph's human-in-the-loop ``interrupt()`` (the agent needs a
checkpointer, as ``HumanInTheLoopMiddleware`` does). The model's calls are checked in
``after_model``, in order, before any of them runs (as ``HumanInTheLoopMiddleware`` asks): a
question pauses the whole batch on one interrupt whose value holds ``{"turnguard": {...}}``, and
``agent.invoke(Command(resume="continue"), config)`` answers it (``"stop"``/``"redirect"``, an
``Answer``, or ``{"answer": ...}`` work too): "continue" goes on checking the batch (a later
question pauses it again: each question of the batch is asked, and each resume answers the one it
was given to), "stop" runs none of it. A stop-level question raised by an outcome
pauses before the next model request. A callable ``ask`` answers inline, in ``after_model``,
before any call of the batch runs. With ``ask="interrupt"`` the
turn's snapshot (``Turn.snapshot()``) goes into the graph state with each model request, the
batch's checks and each tool message (parallel tool messages of one step: the newest snapshot is
kept), so the checkpointer keeps it: a ``Command(resume=...)`` from another process with the same
checkpointer continues the same turn (its counts, streaks and pending question) with the default
configuration (the turn is opened ``durable``); a snapshot this guard cannot resume starts a new
turn (logged). A paused run this process drops (past ``MAX_OPEN_TURNS``) is put aside as
``suspended``, not reported: the process that resumes it reports it, once.
``promptable`` defaults to whether ``ask`` is set; with neither route the fallback applies (a
warning is observed, a stop halts). A REMIND (``GuardConfig(remind_model=True)``) is appended to
the call's ``ToolMessage`` text.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, NotRequired
from uuid import UUID

from langchain.agents.middleware.types import AgentMiddleware, AgentState, PrivateStateAttr, hook_config
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.messages import ToolCall as ModelToolCall
from langgraph._internal._constants import CONFIG_KEY_CALL
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command, interrupt

from turnguard._guard import Guard
from turnguard._model import ALLOW, Outcome, ToolCall, Verdict
from turnguard._snapshot import SnapshotError
from turnguard._snapshot import pending as snapshot_pending
from turnguard.integrations import _common as common

__all__ = ["RunEndHandler", "TurnGuardHalted", "TurnGuardMiddleware"]

INTERRUPT = "interrupt"
"""``ask=INTERRUPT``: reach the user through LangGraph's ``interrupt()`` / ``Command(resume=...)``."""
INTERRUPT_KEY = "turnguard"
SNAPSHOT_KEY = "turnguard_snapshot"
MAX_OPEN_TURNS = 1024
"""Turns whose run died without ``after_agent`` are ended (reason ``abandoned``) past this many."""
ERROR_IF_CANCELLED = {False: Outcome.UNKNOWN, True: Outcome.ERROR}
"""How a call still running as its turn ends settles, by whether the run was cancelled."""


_log = logging.getLogger(__name__)


class TurnGuardHalted(common.TurnHalted):
    """turnguard stopped the agent; a ``turnguard.LoopDetected`` whose message names threshold and counts."""


def _newest(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any] | None:
    """Of two snapshots written in one step (parallel tool calls), the one further along."""
    if old is None or new is None:
        return new if new is not None else old
    return new if _progress(new) >= _progress(old) else old


def _progress(snapshot: dict[str, Any]) -> tuple[int, int]:
    facts = snapshot.get("facts") or {}
    return int(facts.get("seq", 0)), sum((facts.get("outcomes") or {}).values())


class TurnGuardState(AgentState[Any]):
    """The agent state plus the run's turn (private: not input, not output): its id, and with
    ``ask="interrupt"`` its snapshot, which the checkpointer keeps so another process can resume it."""

    turnguard_turn: NotRequired[Annotated[str, PrivateStateAttr]]
    # LangGraph takes the reducer from the last ``Annotated`` item only: ``_newest`` must stay last
    # (parallel tool calls each write a snapshot in one step).
    turnguard_snapshot: NotRequired[Annotated[dict[str, Any] | None, PrivateStateAttr, _newest]]


class _Run:
    """One invocation's turn and what is waiting on the user (whether it halted is the turn's)."""

    def __init__(self, driver: common.RunDriver) -> None:
        self.driver = driver
        self.asked: dict[str, tuple[Verdict, ToolCall]] = {}
        self.asked_after: Verdict | None = None
        self.planned: dict[str, tuple[ToolCall, common.Decision]] = {}
        """Calls of the model's last response checked in ``after_model`` and not started yet, by id."""
        self.running: dict[str, ToolCall] = {}
        """Calls whose body runs and whose outcome is not recorded yet, by id: whoever pops one
        records its outcome (its own wrapper, or the turn's end settling it)."""
        self.unsettled = 0
        """Calls of the batch ``after_model`` planned that have not settled (run, or been refused)."""
        self.halting: tuple[common.Decision, BaseException | None] | None = None
        """A halt met inside the batch, raised by its last call to settle: the others run and
        report their outcomes first, whatever order the framework's threads or tasks run them in."""
        self.answered: dict[str, Verdict] = {}
        """The questions ``after_model`` asked about the batch and got answers to, by call id, in
        the order asked: LangGraph re-runs the node from its start on each resume and hands its
        ``interrupt()`` calls their resume values by position, so a re-run asks them again, in
        place (each takes back its own answer at once), before the next question takes the new one."""
        self.paused: dict[str, ToolCall] = {}
        """Calls whose tool interrupted the graph itself (LangGraph re-runs it on resume), by id."""
        self.graph_runs: set[UUID] = set()
        """The LangGraph runs (an invocation, then each resume) this turn has been driven from."""

    @property
    def waiting(self) -> bool:
        """Whether the run is paused on an interrupt (turnguard's question, or its tool's own)."""
        return bool(self.asked or self.asked_after is not None or self.paused)


class RunEndHandler(BaseCallbackHandler):
    """Ends a turn when the graph run driving it fails (what ``TurnGuardMiddleware.watch`` binds).

    It follows the runs it is told about (a node's run belongs to the graph run that is its parent)
    while they are running."""

    run_inline = True

    def __init__(self, middleware: TurnGuardMiddleware) -> None:
        self.middleware = middleware
        self.parents: dict[UUID, UUID | None] = {}

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.parents[run_id] = parent_run_id

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.parents.pop(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.parents.pop(run_id, None)
        if not isinstance(error, GraphBubbleUp):  # an interrupt pauses the run; it does not end it
            self.middleware.graph_run_failed(run_id, error)


class TurnGuardMiddleware(AgentMiddleware[TurnGuardState, Any, Any]):
    """Bounds every invocation of the agent; one instance may serve many invocations and threads."""

    state_schema = TurnGuardState

    def __init__(
        self,
        guard: Guard,
        *,
        ask: common.Ask | Literal["interrupt"] | None = None,
        promptable: bool | None = None,
        exit_behavior: Literal["error", "end"] = "error",
    ) -> None:
        super().__init__()
        if exit_behavior not in ("error", "end"):
            raise ValueError(f"exit_behavior must be 'error' or 'end', got {exit_behavior!r}")
        self.guard = guard
        self.ask = common.checked_ask(ask, INTERRUPT)
        self.promptable = promptable
        self.exit_behavior = exit_behavior
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._by_graph_run: dict[UUID, str] = {}
        self._halted: OrderedDict[str, Verdict] = OrderedDict()
        self._lock = threading.Lock()
        self.run_end_handler = RunEndHandler(self)

    def watch(self, agent: Any) -> Any:
        """``agent`` bound to ``run_end_handler``, so a run that dies outside the middleware's hooks
        (a tool raising, the recursion limit, a cancellation) still ends its turn."""
        return agent.with_config(callbacks=[self.run_end_handler])

    # -- agent lifecycle -----------------------------------------------------------------------

    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        thread, agent_name = _run_identity(runtime)
        driver = common.open_turn(
            self.guard, ask=self.ask, promptable=self.promptable, conversation_id=thread, agent_name=agent_name,
            durable=self.ask == INTERRUPT,  # its snapshot is checkpointed: any process may resume it
        )
        key = driver.turn.turn_id
        run = _Run(driver)
        with self._lock:
            self._runs[key] = run
            self._note_graph_run(run, key)
            while len(self._runs) > MAX_OPEN_TURNS:
                _, stale = self._runs.popitem(last=False)
                self._forget(stale)
                if stale.waiting:  # paused on turnguard's question: resumable here or elsewhere
                    common.put_aside(stale.driver.turn, stale.asked_after)
                else:
                    stale.driver.turn.end("abandoned")
        return {"turnguard_turn": key}

    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        key = _turn_key(state)
        with self._lock:
            run = self._runs.pop(key, None) if key is not None else None
            if run is not None:
                self._forget(run)
        if run is not None:
            self._settle_unreported(run, None)
            run.driver.end()  # "halted" when the turn latched a HALT
        return None

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        run = self._run(state)
        if run is None:
            # A halted run that goes on (a middleware outside this one caught turnguard's halt in a
            # tool call): it stops here, where no other middleware's tool wrapper can catch it.
            with self._lock:
                halted = self._halted.get(_turn_key(state) or "")
            if halted is None:
                return None
            if self.exit_behavior == "error":
                raise TurnGuardHalted(halted)
            return {"jump_to": "end", "messages": [AIMessage(content=common.describe(halted))]}
        if run.unsettled or run.planned or run.running:
            # Calls of the last batch that never reached the tool node (a middleware jumped past
            # it) settle as UNKNOWN; a halt met in the batch stops the run below.
            self._settle_unreported(run, None)
        halted = run.driver.turn.halted
        if halted is not None:  # the halted call was answered ("end"), or never reached: end the run
            return self._end(run, self._halt(run, common.Decision(common.Step.HALT, halted)))
        if run.asked_after is not None:
            # The stop level fired on an outcome: ask before the next model request (the tool has
            # already run, so the pause cannot sit inside the tool node, which a resume re-runs).
            verdict = run.asked_after
            answer = interrupt({INTERRUPT_KEY: _payload(verdict)})
            run.asked_after = None
            decision = run.driver.answer(verdict, _answer(answer), None, before=False)
            if decision.step is not common.Step.RUN:
                return self._end(run, self._halt(run, decision))
        decision = run.driver.cycle()
        if decision.step is not common.Step.RUN:
            return self._end(run, self._halt(run, decision))
        return self._persisted(run)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """Check the model's calls here, in its order, before any of them runs: the tool node runs
        them in parallel threads or tasks, whose scheduling would otherwise decide where a cap or a
        streak falls. With ``ask="interrupt"`` a question is one interrupt of this node and the
        whole batch waits for the answer (an interrupt in each parallel tool call would pause it
        with many, and let the other calls run meanwhile); a refusal stops the run before any call
        of the batch runs."""
        run = self._run(state)
        if run is None or run.driver.turn.halted is not None:
            return None
        calls = _unanswered_calls(state)
        if self.ask == INTERRUPT:
            return self._asked_batch(run, calls)
        for index, tc in enumerate(calls):
            call = common.make_call(tc.get("name"), tc.get("args"), tc.get("id"))
            if not self._plan(run, calls, index, call, run.driver.check(call)):
                break
        run.unsettled = len(calls)
        return None

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        if self.ask == INTERRUPT:
            return self.after_model(state, runtime)
        run = self._run(state)
        if run is None or run.driver.turn.halted is not None:
            return None
        calls = _unanswered_calls(state)
        for index, tc in enumerate(calls):
            call = common.make_call(tc.get("name"), tc.get("args"), tc.get("id"))
            if not self._plan(run, calls, index, call, await run.driver.acheck(call)):
                break
        run.unsettled = len(calls)
        return None

    def _asked_batch(self, run: _Run, calls: list[ModelToolCall]) -> dict[str, Any] | None:
        """``after_model`` with ``ask="interrupt"``: each question of the batch is an interrupt."""
        for index, tc in enumerate(calls):
            key = str(tc.get("id"))
            if key in run.planned:  # this node ran again, resumed after one of its interrupts
                replayed = run.answered.get(key)
                if replayed is not None:  # its answer is the resume value at this position
                    interrupt({INTERRUPT_KEY: _payload(replayed)})
                continue
            if key in run.asked:
                verdict, call = run.asked[key]
            else:
                call = common.make_call(tc.get("name"), tc.get("args"), tc.get("id"))
                decision = run.driver.before(call)
                if decision.step is not common.Step.ASK:
                    if not self._plan(run, calls, index, call, decision):
                        break
                    continue
                verdict = decision.verdict
                run.asked[key] = (verdict, call)
            answer = interrupt({INTERRUPT_KEY: _payload(verdict)})  # raises until resumed
            del run.asked[key]
            run.answered[key] = verdict
            decision = run.driver.answer(verdict, _answer(answer), call, before=True)
            if decision.step is not common.Step.RUN:
                run.answered.clear()
                return self._refuse_batch(run, decision, calls)
            run.planned[key] = (call, decision)
        run.answered.clear()  # the node is done: the next batch's questions start at position 0
        run.unsettled = len(calls)
        return self._persisted(run)

    @staticmethod
    def _plan(run: _Run, calls: list[ModelToolCall], index: int, call: ToolCall, decision: common.Decision) -> bool:
        """Plan ``calls[index]``; whether to go on. After a halt the later calls are not checked:
        none of them runs, as none would have after the same calls run one at a time."""
        run.planned[str(calls[index].get("id"))] = (call, decision)
        if decision.step is common.Step.RUN:
            return True
        rest = common.Decision(common.Step.HALT, decision.verdict)
        for tc in calls[index + 1:]:
            run.planned[str(tc.get("id"))] = (common.make_call(tc.get("name"), tc.get("args"), tc.get("id")), rest)
        return False

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(request)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            self._model_failed(request.state, exc, asynchronous=False)
            raise

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            return await handler(request)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            self._model_failed(request.state, exc, asynchronous=True)
            raise

    def _model_failed(self, state: Any, exc: Exception, *, asynchronous: bool) -> None:
        """The model raised: unless a middleware outside this one may still recover it (a retry, a
        fallback model), the exception ends the run here, and so the turn (``error``)."""
        run = self._run(state)
        if run is not None and run.driver.turn.summary is None and _outermost(self, asynchronous, tool=False):
            self._ended(run, exc)

    # -- tools ---------------------------------------------------------------------------------

    def _admitted(self, run: _Run, request: Any, call: ToolCall, decision: common.Decision, batch: bool) -> Any:
        """Apply a call's decision before its tool runs: the tool message it gets instead when it
        may not run; ``None`` when it runs (it is then among the run's calls ``running``)."""
        if decision.step is not common.Step.RUN:
            self._settle(run, batch, decision)
            return _not_executed(request, decision.verdict)
        run.running[str(call.call_id)] = call
        return None

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._run(request.state)
        if run is None:
            halted = self._unguarded(request)
            return handler(request) if halted is None else self._refused(request, halted)
        call, decision, batch = self._check(run, request)
        if decision is None:
            decision = run.driver.check(call)
        refused = self._admitted(run, request, call, decision, batch)
        if refused is not None:
            return refused
        key = str(call.call_id)
        try:
            result = handler(request)
        except GraphBubbleUp:  # the tool interrupted the graph itself: it runs again on resume
            self._paused(run, key, call, batch)
            raise
        except Exception as exc:
            after = self._after(run, key, Outcome.ERROR, common.error_result(exc))
            self._failed(run, batch, after, exc, asynchronous=False)
            raise
        except BaseException as exc:  # KeyboardInterrupt: no error handler catches it; the run ends
            self._cancelled(run, key, exc)
            raise
        self._settle(run, batch, self._after(run, key, _outcome(result), _result(result)))
        return self._persisted(run, _remind(result, decision.reminder))

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        run = self._run(request.state)
        if run is None:
            halted = self._unguarded(request)
            return await handler(request) if halted is None else self._refused(request, halted)
        call, decision, batch = self._check(run, request)
        if decision is None:
            decision = await run.driver.acheck(call)
        refused = self._admitted(run, request, call, decision, batch)
        if refused is not None:
            return refused
        key = str(call.call_id)
        try:
            result = await handler(request)
        except GraphBubbleUp:  # the tool interrupted the graph itself: it runs again on resume
            self._paused(run, key, call, batch)
            raise
        except Exception as exc:
            after = await self._aafter(run, key, Outcome.ERROR, common.error_result(exc))
            self._failed(run, batch, after, exc, asynchronous=True)
            raise
        except BaseException as exc:  # the run was cancelled while the tool ran
            self._cancelled(run, key, exc)
            raise
        self._settle(run, batch, await self._aafter(run, key, _outcome(result), _result(result)))
        return self._persisted(run, _remind(result, decision.reminder))

    # -- internals -----------------------------------------------------------------------------

    def _check(self, run: _Run, request: Any) -> tuple[ToolCall, common.Decision | None, bool]:
        """The call, its decision when it was made already (planned in ``after_model``, or the call
        is re-run after an interrupt; ``None``: the caller checks it), and whether it is a call of
        the batch ``after_model`` planned."""
        tc = request.tool_call
        call_id = tc.get("id")
        key = str(call_id)
        planned = run.planned.pop(key, None)
        if planned is not None:
            return *planned, True
        paused = run.paused.pop(key, None)
        if paused is not None:  # counted when it first ran; its outcome is still to come
            return paused, common.Decision(common.Step.RUN, ALLOW), False
        if call_id is not None and key in run.asked:
            # Resumed after an interrupt: the call was counted when it was first checked.
            verdict, call = run.asked[key]
        else:
            call = common.make_call(tc.get("name"), tc.get("args"), call_id)
            if self.ask != INTERRUPT:
                return call, None, False
            # A call after_model did not plan (a tool node entered another way): asked in its tool.
            decision = run.driver.before(call)
            if decision.step is not common.Step.ASK:
                return call, decision, False
            verdict = decision.verdict
            run.asked[key] = (verdict, call)
        answer = interrupt({INTERRUPT_KEY: _payload(verdict)})  # raises until resumed
        del run.asked[key]
        return call, run.driver.answer(verdict, _answer(answer), call, before=True), False

    def _after(self, run: _Run, key: str, outcome: Outcome, result: Any) -> common.Decision | None:
        """Record the outcome of the running call ``key`` with what the tool returned (``_result``,
        or the error's); ``None`` when the turn's end settled it already, or (``ask="interrupt"``)
        when its question waits for the next model request."""
        call = run.running.pop(key, None)
        if call is None:
            return None
        if self.ask == INTERRUPT:
            return self._recorded(run, call, outcome, result)
        return run.driver.outcome(call, outcome, result)

    async def _aafter(self, run: _Run, key: str, outcome: Outcome, result: Any) -> common.Decision | None:
        call = run.running.pop(key, None)
        if call is None:
            return None
        if self.ask == INTERRUPT:
            return self._recorded(run, call, outcome, result)
        return await run.driver.aoutcome(call, outcome, result)

    def _recorded(self, run: _Run, call: ToolCall, outcome: Outcome, result: Any) -> common.Decision | None:
        """The decision on the outcome, with ``ask="interrupt"``; ``None`` when its question waits
        for the next model request (``run.asked_after``)."""
        decision = run.driver.after(call, outcome, result)
        if decision.step is common.Step.ASK:
            run.asked_after = decision.verdict
            return None
        return decision

    def _failed(
        self, run: _Run, batch: bool, decision: common.Decision | None, exc: Exception, *, asynchronous: bool
    ) -> None:
        """A tool raised and no error handler turned it into a message: a halt on its outcome is
        raised now (the exception ends the run anyway); else, unless a middleware outside this one
        may still recover it, the exception ends the run here, and so the turn."""
        if decision is not None and decision.step is not common.Step.RUN:
            self._halt(run, decision, exc)  # "end": the run ends before the next model request
        if run.driver.turn.summary is None and _outermost(self, asynchronous, tool=True):
            self._ended(run, exc)
        else:
            self._settle(run, batch, None)

    def _paused(self, run: _Run, key: str, call: ToolCall, batch: bool) -> None:
        """The tool interrupted the graph: its outcome comes when the resume runs it again."""
        run.running.pop(key, None)
        run.paused[key] = call
        self._settle(run, batch, None)

    def _cancelled(self, run: _Run, key: str, exc: BaseException) -> None:
        """The run was cancelled in the tool's body: the call failed, and the turn ends."""
        call = run.running.pop(key, None)
        if call is not None:
            run.driver.after(call, Outcome.ERROR, common.error_result(exc))
        self._ended(run, exc)

    def _settle(self, run: _Run, batch: bool, decision: common.Decision | None, cause: Exception | None = None) -> None:
        """A call is done (it ran, or was not run). A halt on a call of the planned batch is raised
        by the batch's last call to settle (``exit_behavior="error"``), so the calls allowed
        beside it run and report their outcomes whatever order their threads or tasks run in, and
        the framework cancels none of them; ``"end"`` lets every call finish anyway."""
        stop = decision if decision is not None and decision.step is not common.Step.RUN else None
        if not batch or self.exit_behavior != "error":
            if stop is not None:
                self._halt(run, stop, cause)
            return
        with self._lock:
            run.unsettled -= 1
            if stop is not None and run.halting is None:
                run.halting = (stop, cause)
            halting = run.halting if run.unsettled <= 0 else None
        if halting is not None and run.driver.turn.summary is None:
            self._halt(run, *halting)

    def _settle_unreported(self, run: _Run, exc: BaseException | None) -> None:
        """As the turn ends, the calls it checked whose outcome has not come settle: ``UNKNOWN`` (a
        planned call the tool node never started, or a body still running), ``ERROR`` for a body
        the run's cancellation stopped. A later report finds the call settled and is dropped."""
        running = ERROR_IF_CANCELLED[common.end_reason(exc) == common.CANCELLED]
        for key in list(run.running):
            call = run.running.pop(key, None)
            if call is not None:
                run.driver.after(call, running)
        for key in list(run.planned):
            planned = run.planned.pop(key, None)
            if planned is not None and planned[1].step is common.Step.RUN:
                run.driver.after(planned[0], Outcome.UNKNOWN)
        run.unsettled = 0
        run.halting = None

    def _halt(self, run: _Run, decision: common.Decision, cause: BaseException | None = None) -> Verdict:
        """A decision that stops the run. ``exit_behavior="error"``: end the turn (``after_agent``
        will not run) and raise; ``"end"``: return the HALT for the caller to end the run its way."""
        if self.exit_behavior == "error":
            halted = TurnGuardHalted(decision.verdict)
            self._ended(run, halted)
            raise halted from cause
        return decision.verdict

    def _refuse_batch(self, run: _Run, decision: common.Decision, calls: list[ModelToolCall]) -> dict[str, Any]:
        """The user refused a call of the batch: none of it runs, and the run ends."""
        for tc in calls:
            run.planned.pop(str(tc.get("id")), None)
        verdict = self._halt(run, decision)  # raises with exit_behavior="error"
        update = self._end(run, verdict)
        update["messages"] = [*(_not_executed_call(tc, verdict) for tc in calls), *update["messages"]]
        return update

    def _refused(self, request: Any, halted: Verdict) -> ToolMessage:
        if self.exit_behavior == "error":
            raise TurnGuardHalted(halted)
        return _not_executed(request, halted)

    def _end(self, run: _Run, verdict: Verdict) -> dict[str, Any]:
        self._settle_unreported(run, None)
        run.driver.turn.end("halted")
        return {"jump_to": "end", "messages": [AIMessage(content=common.describe(verdict))]}

    def _run(self, state: Any) -> _Run | None:
        key = _turn_key(state)
        if key is None:
            return None
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                run = self._restored(state, key)
            if run is not None:
                self._note_graph_run(run, key)
            return run

    def _persisted(self, run: _Run, result: Any = None) -> Any:
        """With ``ask="interrupt"``, the turn's snapshot goes into the graph state with the step's
        other writes (the checkpointer keeps it): before a model request, and with a tool's message."""
        if self.ask != INTERRUPT:
            return result
        update = {SNAPSHOT_KEY: run.driver.turn.snapshot(pending=run.asked_after)}
        if result is None:
            return update
        if isinstance(result, ToolMessage):
            return Command(update={"messages": [result], **update})
        return result

    def _restored(self, state: Any, key: str) -> _Run | None:
        """The turn of a run this process has not seen, continued from the checkpointed snapshot
        (a resume in a fresh process, or after this one dropped it). A snapshot this guard cannot
        continue (``tg.SnapshotError``: another ``digest_key``, a damaged state) is logged and a new
        turn opened."""
        snapshot = state.get(SNAPSHOT_KEY) if isinstance(state, dict) else getattr(state, SNAPSHOT_KEY, None)
        if not snapshot:
            return None
        try:
            turn = self.guard.resume(snapshot)
            pending = snapshot_pending(snapshot)
        except SnapshotError as exc:
            _log.warning("turnguard: the checkpointed turn cannot be resumed here (%s); a new turn starts", exc)
            turn = common.open_turn(self.guard, ask=self.ask, promptable=self.promptable, durable=True).turn
            pending = None
        run = _Run(common.RunDriver(turn, ask=None if isinstance(self.ask, str) else self.ask))
        run.asked_after = pending
        self._runs[key] = run
        return run

    def _note_graph_run(self, run: _Run, key: str) -> None:
        """Remember which graph run drives the turn now (a resume is a new graph run): the parent
        of the current node's run, when ``watch`` follows the runs."""
        node = _node_run_id()
        graph_run = self.run_end_handler.parents.get(node) if node is not None else None
        if graph_run is not None and graph_run not in run.graph_runs:
            run.graph_runs.add(graph_run)
            self._by_graph_run[graph_run] = key

    def _forget(self, run: _Run) -> None:
        for graph_run in run.graph_runs:
            self._by_graph_run.pop(graph_run, None)

    def graph_run_failed(self, graph_run: UUID, error: BaseException) -> None:
        """The graph run ``graph_run`` of an invocation failed (``RunEndHandler``'s call): its turn ends."""
        with self._lock:
            run = self._runs.get(self._by_graph_run.get(graph_run, ""))
        if run is not None:
            self._ended(run, error)

    def _ended(self, run: _Run, exc: BaseException) -> None:
        key = run.driver.turn.turn_id
        with self._lock:
            if self._runs.pop(key, None) is not None:
                self._forget(run)
            halted = run.driver.turn.halted
            if halted is not None:  # parallel calls of the halted batch still arrive: refuse them
                self._halted[key] = halted
                while len(self._halted) > MAX_OPEN_TURNS:
                    self._halted.popitem(last=False)
        self._settle_unreported(run, exc)
        run.driver.end(exc)

    def _unguarded(self, request: Any) -> Verdict | None:
        """A call of a run that is not open here: its turn's HALT if turnguard halted it (a call of
        the halted batch that arrives after the turn ended is not executed either)."""
        with self._lock:
            return self._halted.get(_turn_key(request.state) or "")


def _outermost(middleware: TurnGuardMiddleware, asynchronous: bool, *, tool: bool) -> bool:
    """Whether ``middleware``'s tool (or model) wrapper is the outermost one of the graph node
    running it: no other middleware's ``wrap_tool_call`` (``wrap_model_call``) around it could
    catch what it raises. ``True`` when the node's wrappers are not found (the exception is taken
    to end the run, as it does with no other middleware)."""
    try:  # the running task (LangGraph's call helper holds a weak reference to it), and its node
        task = get_config()["configurable"][CONFIG_KEY_CALL].args[0]()
        node = task.proc.steps[0]
        if tool:
            wrapper = node._awrap_tool_call if asynchronous and node._awrap_tool_call else node._wrap_tool_call
        else:  # create_agent's model node closes over its composed model-call handler
            function = node.afunc if asynchronous else node.func
            name = "awrap_model_call_handler" if asynchronous else "wrap_model_call_handler"
            wrapper = _cells(function)[name].cell_contents
    except (RuntimeError, KeyError, AttributeError, IndexError, TypeError, ValueError):
        return True
    return getattr(_first_wrapper(wrapper), "__self__", middleware) is middleware


def _cells(function: Any) -> dict[str, Any]:
    return dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=True))


_OUTER_CELL = {"composed": "outer", "normalized_single": "single_handler"}
"""``create_agent``'s composing closures, and the cell of each that holds the outer wrapper."""


def _first_wrapper(wrapper: Any) -> Any:
    """The outermost of ``create_agent``'s composed wrappers, unwrapped from its tracing decorator."""
    while getattr(wrapper, "__name__", None) in _OUTER_CELL and wrapper.__closure__:
        wrapper = _cells(wrapper)[_OUTER_CELL[wrapper.__name__]].cell_contents
    return inspect.unwrap(wrapper)


def _unanswered_calls(state: Any) -> list[ModelToolCall]:
    """The tool calls of the last model response that no tool message answers yet."""
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)
    answered: set[str] = set()
    for message in reversed(messages or ()):
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
        elif isinstance(message, AIMessage):
            return [tc for tc in message.tool_calls if tc.get("id") is None or tc.get("id") not in answered]
    return []


def _node_run_id() -> UUID | None:
    """The id of the current node's run (the parent of the runs its callbacks would start)."""
    try:
        callbacks = get_config().get("callbacks")
    except RuntimeError:  # not inside a runnable context
        return None
    return getattr(callbacks, "parent_run_id", None)


def _turn_key(state: Any) -> str | None:
    return state.get("turnguard_turn") if isinstance(state, dict) else getattr(state, "turnguard_turn", None)


def _not_executed(request: Any, verdict: Verdict) -> ToolMessage:
    """``exit_behavior="end"``: the halted call is answered with an error instead of running."""
    return _not_executed_call(request.tool_call, verdict)


def _not_executed_call(tool_call: ModelToolCall, verdict: Verdict) -> ToolMessage:
    return ToolMessage(
        content=common.not_executed(verdict),
        tool_call_id=tool_call.get("id") or "",
        name=tool_call.get("name"),
        status="error",
    )


def _run_identity(runtime: Any) -> tuple[str | None, str | None]:
    """The LangGraph thread (the conversation) and ``create_agent(name=...)``, when known."""
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    try:
        metadata = get_config().get("metadata") or {}
    except RuntimeError:  # not inside a runnable context
        metadata = {}
    thread = thread if thread is not None else metadata.get("thread_id")
    name = metadata.get("lc_agent_name")
    return (str(thread) if thread is not None else None), (str(name) if name else None)


def _remind(result: Any, reminder: str | None) -> Any:
    if reminder and isinstance(result, ToolMessage) and isinstance(result.content, str):
        return result.model_copy(update={"content": common.with_reminder(result.content, reminder)})
    return result


def _outcome(result: Any) -> Outcome:
    if isinstance(result, ToolMessage):
        return Outcome.ERROR if result.status == "error" else Outcome.OK
    return Outcome.UNKNOWN  # a Command: the tool steered the graph; success is not known


def _result(result: Any) -> Any:
    """What a tool returned, for the stateful tools' progress: a ``ToolMessage``'s content (not
    the message, whose ids differ every call); ``None`` for a ``Command`` (no result)."""
    return result.content if isinstance(result, ToolMessage) else None


def _payload(verdict: Verdict) -> dict[str, Any]:
    event = verdict.event
    tool_name = event.tool_name if event else None
    return {**common.ask_payload(verdict), "tool_name": tool_name, "answers": ["continue", "stop", "redirect"]}


def _answer(value: Any) -> common.AskResult:
    if isinstance(value, dict):
        value = value.get("answer", value.get("type"))
    return {"approve": "continue", "reject": "stop", "edit": "redirect"}.get(str(value).lower(), value)
