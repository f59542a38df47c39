"""Google ADK: a runner plugin that bounds each invocation (one invocation = one turn).

Tested with google-adk 2.13 (the ``google-adk`` extra installs ``>=2.13,<3``).

``Runner(agent=..., plugins=[TurnGuardPlugin(guard)])`` (or ``InMemoryRunner``). ``before_run``
opens the invocation's turn, ``before_model`` is a cycle, ``before_tool`` checks each call before
the tool runs, ``after_tool`` / ``on_tool_error`` record its outcome, ``after_run`` /
``on_run_error`` end the turn (``completed``, ``halted``, ``error``, ``cancelled``).

- A call fails when the tool raises (whether or not another plugin, e.g. ADK's
  ``ReflectAndRetryToolPlugin``, then recovers it) or returns a dict with an ``"error"`` key (the
  convention of ADK's own tools). Every call checked gets one outcome, whatever the plugins'
  order: one listed before turnguard's that answers the call's ``on_tool_error`` or ``after_tool``
  itself (ADK then skips turnguard's) leaves it to the tool response ADK emits (the retry plugin's
  answer is a failure), and a call whose response never comes (the retry plugin gave up and
  raised) is recorded as the turn ends: ``error`` when the run died on an exception, else ``unknown``.
- HALT ends the invocation ADK's way (ADK turns an exception from a plugin into a ``RuntimeError``):
  the halted call is answered with an ``{"error": "Not executed: ..."}`` response instead of
  running, and the next model request is answered by turnguard itself with a final text naming the
  threshold and the counts (``turnguard stopped the run: threshold streak (stop, limit 8); ...``),
  so the model is not called again and ``run_async`` finishes; the turn ends ``halted``. That
  final event carries ``custom_metadata["turnguard"]`` (message, threshold, level, event id):
  ``halt_of(events)`` finds it for a host that wants to tell a halt from an answer.
- ASK: ``ask="confirmation"`` uses ADK's tool confirmation: the call is not run, the invocation
  pauses with an ``adk_request_confirmation`` call whose ``toolConfirmation.payload`` holds
  ``{"turnguard": {...}}``, and the user's ``ToolConfirmation`` (a ``FunctionResponse`` to it in
  the next ``run_async``, which ADK resumes as the same invocation, so the same turn) answers:
  ``confirmed`` is "continue", not confirmed is "stop". The calls of the batch after it pause with
  it, unchecked, each with a confirmation marked ``"held"``: ``confirmation_answer(events,
  confirmed)`` answers them all alike. After a "stop" none of them runs; after a "continue" each is
  checked as ADK re-runs it, up to the next question, which ADK cannot pause a resuming batch for:
  that call and the rest answer "Not executed" and the question comes with the next call. A
  stop-level ASK (recorded after a call ran) is asked on the next call. Answers that come one by
  one, in several messages (ADK resumes the invocation at each and asks the model again): a
  refused call never runs, a held call whose confirmation comes after the model was asked again
  does not run (the run went on without it), a halted invocation stays halted whatever answer
  resumes it, and a call paused in an ended turn runs in no later one. The pausing event puts the
  turn's snapshot (``durable``) in the session state (``STATE_PREFIX``), the invocation's last one
  how it ended (a resumed run that ends with no such event, on an error or closed by the host,
  appends a state-only event of its own): with a persistent session service the answer may come
  in another process or through a fresh plugin, and resumes the same turn there. A callable
  ``ask`` answers inline (the calls checked meanwhile wait for its answer). ``promptable`` defaults to whether
  ``ask`` is set; without a route the fallback applies (a warning is observed, a stop halts).
- REMIND (``GuardConfig(remind_model=True)``) is added to a dict result as ``"turnguard"`` and
  appended to a text result.
- ``run_async`` closed early by the host (``aclose()``, or a ``break`` out of it) ends the turn
  ``cancelled`` (ADK itself calls it a clean completion). A cancellation that lands in a tool call
  is reported by ADK (``on_tool_error`` with ``CancelledError``); one that lands in a model request
  is not, so the plugin also ends a turn still open when the asyncio task that ran it finishes
  (``cancelled``: the run neither completed nor failed).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from google.adk.events import Event, EventActions
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.plugins.reflect_retry_tool_plugin import REFLECT_AND_RETRY_RESPONSE_TYPE as RETRY_RESPONSE_TYPE
from google.genai import types

from turnguard import _state as st
from turnguard._guard import Guard
from turnguard._model import Action, Outcome, ToolCall, Verdict
from turnguard._snapshot import SnapshotError, read_verdict, verdict_data
from turnguard._snapshot import pending as pending_verdict
from turnguard.integrations import _common as common

__all__ = ["TurnGuardPlugin", "confirmation_answer", "confirmation_requests", "halt_of"]

CONFIRMATION = "confirmation"
"""``ask=CONFIRMATION``: reach the user through ADK's tool confirmation (``request_confirmation``)."""
PAYLOAD_KEY = "turnguard"
STATE_PREFIX = "turnguard:"
"""An invocation's entry in the session state is ``STATE_PREFIX + invocation_id``: the snapshot of
its turn paused on a confirmation (with ``SECTION_KEY``), or ``{"ended": ...}`` once that turn ended."""
SECTION_KEY = "google_adk"
MAX_OPEN_TURNS = 1024
"""Invocations held open at once (running, or paused on a confirmation); past it the oldest is
ended as ``abandoned``, or put aside as ``suspended`` when paused (its resume goes on from the
session's state). As many ended invocations are remembered (``_Ended``)."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Ended:
    """What an invocation's ended turn leaves for a later resume of it (ADK resumes an invocation
    whenever a confirmation of one of its calls comes back, in any later message)."""

    halt: Verdict | None
    """The HALT the turn latched (the user's stop included): it holds for the rest of the
    invocation, so a resume runs no call and asks the model nothing."""
    paused: frozenset[str]
    """The calls the turn paused on a confirmation: they belonged to it and run in no other."""


@dataclass
class _Run:
    """One invocation's turn and what it is waiting on."""

    driver: common.RunDriver
    calls: dict[str, ToolCall] = field(default_factory=dict)
    """Calls checked and not finished, by function call id."""
    asked: dict[str, tuple[Verdict, ToolCall]] = field(default_factory=dict)
    """Calls waiting on the user's confirmation, by function call id."""
    held: set[str] = field(default_factory=set)
    """Calls paused with the question (not checked yet): their confirmation, once the question is
    answered, lets them be checked and run."""
    paused: set[str] = field(default_factory=set)
    """Every call turnguard paused on a confirmation in this turn (asked about or held), by function
    call id, answered or not: ADK re-runs one whenever its confirmation comes back, in any later
    message. One held still when the model is asked again (``before_model`` lets it go) no longer
    runs: the run went on without it."""
    closed: frozenset[str] = frozenset()
    """Calls paused in an earlier turn of this invocation (it ended before they were answered):
    none of them runs in this one."""
    ask_next: Verdict | None = None
    """A stop-level ASK raised by an outcome: the next call asks the user."""
    reminders: dict[str, str] = field(default_factory=dict)
    """REMIND texts for calls that are running, by function call id."""
    stale: bool = False
    """The session's entry for the invocation is older than the turn: it resumed, and no event of
    it has stored the turn since. Its run ending with no such event stores it (``_store``)."""

    def entry(self) -> dict[str, Any] | None:
        """What the session's state keeps for the invocation: the snapshot of its turn while calls
        wait on a confirmation (and it has not ended), else how its turn ended (once it paused or
        halted), else nothing."""
        if (self.asked or self.held) and self.driver.turn.summary is None:
            return _paused_state(self, self.driver.turn.snapshot(pending=self.driver.question))
        if self.paused or self.closed or self.driver.turn.halted is not None:
            return _ended_state(self.driver.turn.halted, self.paused | self.closed)
        return None


class TurnGuardPlugin(BasePlugin):
    """Bounds every invocation of the runner it is given to (one plugin may serve many)."""

    def __init__(
        self,
        guard: Guard,
        *,
        ask: common.Ask | Literal["confirmation"] | None = None,
        promptable: bool | None = None,
        name: str = "turnguard",
    ) -> None:
        super().__init__(name)
        self.guard = guard
        self.ask = common.checked_ask(ask, CONFIRMATION)
        self.promptable = promptable
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        self._by_task: weakref.WeakKeyDictionary[asyncio.Task[Any], set[str]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- invocation lifecycle ------------------------------------------------------------------

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        key = invocation_context.invocation_id
        with self._lock:
            if key in self._runs:
                self._runs.move_to_end(key)
            else:
                self._open(key, invocation_context)
            run = self._runs.get(key)
            if run is not None and (run.paused or run.closed):  # resumed: the session's entry is now behind
                run.stale = True
        self._watch_task(key)
        return None

    def _open(self, key: str, invocation_context: Any) -> None:
        """(Under the lock.) The turn of an invocation not running here: the one it paused in,
        resumed from the session's state (ADK resumes an invocation when a confirmation comes back,
        in another process or plugin, or after this one put it aside); none after a halt (it stays
        halted); else a new one, in which the calls an ended turn of the invocation paused do not run."""
        ended = self._ended.get(key)
        state = None
        if ended is None:
            state = getattr(getattr(invocation_context, "session", None), "state", {}).get(STATE_PREFIX + key)
        run = None
        if state is not None:
            try:
                if isinstance(state, dict) and "ended" in state:
                    ended = _read_ended(state)
                else:
                    run = self._resumed(state)
            except SnapshotError as exc:
                _log.warning("turnguard: invocation %s's stored turn cannot be resumed here (%s); a new turn "
                             "starts", key, exc)
        if ended is not None:
            self._ended[key] = ended
            self._ended.move_to_end(key)
        if run is None:
            if ended is not None and ended.halt is not None:
                return
            agent = getattr(invocation_context, "agent", None)
            session = getattr(invocation_context, "session", None)
            driver = common.open_turn(
                self.guard,
                ask=self.ask,
                promptable=self.promptable,
                conversation_id=getattr(session, "id", None),
                agent_name=getattr(agent, "name", None),
                durable=self.ask == CONFIRMATION,  # its snapshot goes into the session: any process resumes it
            )
            run = _Run(driver, closed=ended.paused if ended is not None else frozenset())
        self._runs[key] = run
        while len(self._runs) > MAX_OPEN_TURNS:
            stale_key, stale = self._runs.popitem(last=False)
            if stale.asked or stale.held:  # paused: its resume, here or elsewhere, goes on from the session
                common.put_aside(stale.driver.turn, stale.driver.question)
            else:
                self._remember(stale_key, stale)
                stale.driver.turn.end("abandoned")

    def _resumed(self, state: Any) -> _Run:
        """The run of a turn put aside on a confirmation (its snapshot, with the calls it paused),
        its question pending again; every field is read before the turn is resumed."""
        section = common.adapter_section(state, SECTION_KEY)
        if section is None:
            raise SnapshotError(f"the turn state has no {SECTION_KEY!r} section", SECTION_KEY)
        path = section.at("asked")
        asked = {st.text(f"{path}.{call_id}", call_id, nonempty=True): st.text(f"{path}.{call_id}", name, nonempty=True)
                 for call_id, name in section.mapping("asked", common.MAX_SECTION_CALLS).items()}
        held, paused, closed = (common.section_call_ids(section, name) for name in ("held", "paused", "closed"))
        ask_next = read_verdict(section.get("ask_next", None), section.at("ask_next"))
        section.done()
        question = pending_verdict(state)
        if asked and question is None:
            raise SnapshotError("the turn state lists calls asked about but no pending question", "pending")
        driver = common.RunDriver(self.guard.resume(state), ask=None if isinstance(self.ask, str) else self.ask)
        run = _Run(driver, held=set(held), paused=set(paused), closed=frozenset(closed), ask_next=ask_next)
        if question is not None:
            driver.defer(question)
            run.asked = {call_id: (question, ToolCall(name, None, call_id)) for call_id, name in asked.items()}
        return run

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        key = invocation_context.invocation_id
        run = self._runs.get(key)
        if run is None:
            return
        if not run.asked and not run.held:  # paused: goes on when the user answers
            self._end(key, _closing_early())
        await _store(invocation_context, run)

    async def on_event_callback(self, *, invocation_context: Any, event: Any) -> None:
        """The event that pauses an invocation on turnguard's confirmation carries its turn's
        snapshot into the session state, and the final one of an invocation that paused (or halted)
        says how its turn ended: a fresh plugin, in this process or another, resumes from it."""
        actions = event.actions
        key = invocation_context.invocation_id
        run = self._runs.get(key)
        if run is not None and run.calls:
            await self._answered(run, event)
        if not actions.requested_tool_confirmations and not event.is_final_response():
            return None
        if run is None:
            return None
        entry = run.entry()
        if entry is not None:
            actions.state_delta[STATE_PREFIX + key] = entry
            run.stale = False
        return None

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        run = self._run(invocation_context)
        self._end(invocation_context.invocation_id, error)
        if run is not None:
            run.stale = True  # its turn ended after every event of the run
            await _store(invocation_context, run)

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> LlmResponse | None:
        run = self._run(callback_context)
        if run is None:
            halt = self._halt_of(callback_context)
            return None if halt is None else _final(halt)
        run.held.clear()  # held calls whose confirmation never came back: the model goes on without them
        halted = run.driver.turn.halted
        if halted is None:
            decision = await run.driver.acycle()
            halted = decision.verdict if decision.step is not common.Step.RUN else None
        return None if halted is None else _final(halted)

    # -- tools ---------------------------------------------------------------------------------

    async def before_tool_callback(self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any) -> Any:
        run = self._run(tool_context)
        if run is None:
            halt = self._halt_of(tool_context)
            return None if halt is None else _not_executed(halt)
        call_id = tool_context.function_call_id
        asked = run.asked.pop(call_id, None) if call_id is not None else None
        decision: common.Decision | dict[str, Any] | None
        if call_id is not None and call_id in run.closed:  # paused by a turn that has ended
            return {"error": "Not executed: the turn it was paused in has ended."}
        if asked is not None:  # resumed: the user answered the confirmation turnguard asked for
            verdict, call = asked
            confirmation = tool_context.tool_confirmation
            answer = "continue" if confirmation is not None and confirmation.confirmed else "stop"
            decision = run.driver.answer(verdict, answer, call, before=True)
        else:
            call = common.make_call(getattr(tool, "name", None), dict(tool_args), call_id)
            confirmation = tool_context.tool_confirmation
            if call_id is not None and call_id in run.held:  # resumed: held with the question
                run.held.discard(call_id)
                decision = self._released(run, call, confirmation)
            elif call_id is not None and call_id in run.paused:  # its confirmation came after the model went on
                return {"error": "Not executed: the run went on without it."}
            elif (payload := _asked_payload(tool_context)) is not None:  # paused by a turn of which nothing is left
                decision = self._unrecorded(run, call, confirmation, payload)
            else:
                decision = await self._check(run, call)
            if isinstance(decision, dict):  # not executed: the model is told
                return decision
            if decision is None:  # put to the user: the question, or a call held with it
                held, question = call_id in run.held, run.driver.question
                assert question is not None  # (_check put one to the user)
                return _request_confirmation(tool_context, question, held=held)
        if decision.step is not common.Step.RUN:
            return _not_executed(decision.verdict)
        if call_id is not None:
            run.calls[call_id] = call
            if decision.reminder:
                run.reminders[call_id] = decision.reminder
        return None

    def _released(self, run: _Run, call: ToolCall, confirmation: Any) -> common.Decision | dict[str, Any]:
        """A call held with the question, resumed: a confirmed one is checked now that the question
        is answered (it is answered first; still waiting, it was not confirmed: the user's stop). A
        second question cannot pause the resuming batch (ADK asks for no confirmation there): that
        call and the rest of the batch do not run, and the question is asked on the next call."""
        if confirmation is None or not confirmation.confirmed:
            return {"error": "Not executed: the user declined it."}
        question = run.driver.question
        if question is not None:
            for call_id, (verdict, asked) in list(run.asked.items()):
                del run.asked[call_id]
                return _not_executed(run.driver.answer(verdict, "stop", asked, before=True).verdict)
        if run.ask_next is not None:
            return _not_executed(run.ask_next, asked_next=True)
        decision = run.driver.before(call)
        if decision.step is not common.Step.ASK:
            return decision
        run.driver.after(call, Outcome.DENIED)
        run.ask_next = decision.verdict
        return _not_executed(decision.verdict, asked_next=True)

    def _unrecorded(self, run: _Run, call: ToolCall, confirmation: Any,
                    payload: dict[str, Any]) -> common.Decision | dict[str, Any]:
        """The answer to a confirmation turnguard asked for (``payload``) in a turn of which nothing
        is left here (its stored state was lost, or could not be resumed): a refused question is the
        user's stop; any other answer is taken as one to a call held with a question (``_released``)."""
        if confirmation.confirmed or payload.get("held"):
            return self._released(run, call, confirmation)
        threshold, message = payload.get("threshold"), payload.get("message")
        asked = Verdict(Action.ASK, threshold if isinstance(threshold, str) else None,
                        message if isinstance(message, str) else "")
        return _not_executed(run.driver.turn.halt(asked, "turnguard: stopped by the user"))

    async def _check(self, run: _Run, call: ToolCall) -> common.Decision | None:
        """The decision on ``call``; ``None`` when it is put to the user through a confirmation (the
        call turnguard asks about, or one held with it)."""
        if self.ask != CONFIRMATION or call.call_id is None:
            return await run.driver.acheck(call)
        decision = run.driver.before(call)
        if decision.step is common.Step.RUN and run.ask_next is not None:
            decision = common.Decision(common.Step.ASK, run.ask_next)
        if decision.step is not common.Step.HOLD:
            run.ask_next = None
        if decision.step is common.Step.HOLD:
            run.held.add(call.call_id)
            run.paused.add(call.call_id)
            return None
        if decision.step is common.Step.ASK:
            run.asked[call.call_id] = (decision.verdict, call)
            run.paused.add(call.call_id)
            run.driver.defer(decision.verdict)
            return None
        return decision

    async def after_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, result: Any
    ) -> Any:
        reminder = await self._settle(tool_context, _outcome_of(result), result=result)
        return _remind(result, reminder) if reminder else None

    async def on_tool_error_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, error: BaseException
    ) -> None:
        await self._settle(tool_context, Outcome.ERROR, error, result=common.error_result(error))
        return None  # the error goes on to the other plugins and, unhandled, ends the invocation

    # -- internals -----------------------------------------------------------------------------

    async def _settle(self, tool_context: Any, outcome: Outcome, error: BaseException | None = None, *,
                      result: Any = None) -> str | None:
        """Record the outcome of the call turnguard checked for this tool call (nothing if it checked
        none), with its ``result`` (the tool's response, or the error), and return the REMIND text
        waiting for its result; a cancelled tool ends the run."""
        found = self._checked(tool_context)
        if found is None:
            return None
        run, call, reminder = found
        if isinstance(error, asyncio.CancelledError):
            run.driver.turn.record_outcome(call, Outcome.UNKNOWN)
            self._end(tool_context.invocation_id, error)
            return None
        await self._outcome(run, call, outcome, result)
        return reminder

    async def _answered(self, run: _Run, event: Any) -> None:
        """The tool responses ``event`` carries for calls turnguard checked whose outcome no tool
        callback of turnguard's recorded: another plugin listed before it answered the call's
        ``on_tool_error`` or ``after_tool`` itself (ADK stops at the first answer), e.g. a retry
        plugin recovering the error. Each is recorded by its response, once."""
        for response in event.get_function_responses():
            call = run.calls.pop(response.id, None) if response.id is not None else None
            if call is not None:
                run.reminders.pop(response.id, None)
                await self._outcome(run, call, _outcome_of(response.response), response.response)

    def _checked(self, tool_context: Any) -> tuple[_Run, ToolCall, str | None] | None:
        """The run and the checked call this tool call's outcome belongs to, with the reminder
        waiting for its result (both taken off the run); ``None`` when turnguard did not check it."""
        run = self._run(tool_context)
        call = run.calls.pop(tool_context.function_call_id, None) if run is not None else None
        if run is None or call is None:
            return None
        return run, call, run.reminders.pop(tool_context.function_call_id, None)

    async def _outcome(self, run: _Run, call: ToolCall, outcome: Outcome, result: Any) -> None:
        """Record the outcome; a HALT (or the user's stop) latches and ends the run at the next model
        request."""
        if self.ask != CONFIRMATION:
            await run.driver.aoutcome(call, outcome, result)
            return
        decision = run.driver.after(call, outcome, result)
        if decision.step is common.Step.ASK:
            run.ask_next = decision.verdict

    def _run(self, context: Any) -> _Run | None:
        with self._lock:
            return self._runs.get(context.invocation_id)

    def _halt_of(self, context: Any) -> Verdict | None:
        """The HALT an ended turn of this invocation latched, if any (a resume after it)."""
        with self._lock:
            ended = self._ended.get(context.invocation_id)
        return ended.halt if ended is not None else None

    def _end(self, key: str, exc: BaseException | None) -> None:
        with self._lock:
            run = self._runs.pop(key, None)
        if run is not None:
            # Calls let run whose outcome never came (what answered their error raised, say): one each.
            outcome = common.unfinished_outcome(exc)
            for call in run.calls.values():
                run.driver.turn.record_outcome(call, outcome)
            run.calls.clear()
            run.driver.end(exc)
            with self._lock:
                self._remember(key, run)

    def _remember(self, key: str, run: _Run) -> None:
        """Keep what a later resume of the ended invocation needs (under the lock): its halt and the
        calls it paused; the oldest are forgotten past ``MAX_OPEN_TURNS``."""
        halt, paused = run.driver.turn.halted, run.paused | run.closed
        if halt is None and not paused:
            self._ended.pop(key, None)
            return
        self._ended[key] = _Ended(halt, frozenset(paused))
        self._ended.move_to_end(key)
        while len(self._ended) > MAX_OPEN_TURNS:
            self._ended.popitem(last=False)

    def _watch_task(self, key: str) -> None:
        """End the invocation's turn, if still open, when the task that ran it finishes."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if task is None:
            return
        with self._lock:
            keys = self._by_task.get(task)
            if keys is None:
                keys = self._by_task[task] = set()
                task.add_done_callback(self._task_done)
            keys.add(key)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """A turn still open when the task that drove it finishes was neither completed nor failed
        by the run (ADK reports those): the host stopped driving it, so it ends ``cancelled``."""
        with self._lock:
            keys = self._by_task.pop(task, set())
        for key in keys:
            run = self._runs.get(key)
            if run is not None and not run.asked and not run.held:
                self._end(key, asyncio.CancelledError())


async def _store(invocation_context: Any, run: _Run) -> None:
    """A resumed invocation whose run ends with no event that stored its turn (an error, a close by
    the host): its entry in the session's state is stored by an event of its own, so a later answer
    resumes the turn as it is, not as it was paused before (nor a turn that has ended)."""
    entry = run.entry() if run.stale else None
    run.stale = False
    service = getattr(invocation_context, "session_service", None)
    session = getattr(invocation_context, "session", None)
    if entry is None or service is None or session is None:
        return
    key = invocation_context.invocation_id
    author = getattr(getattr(invocation_context, "agent", None), "name", None) or "turnguard"
    event = Event(invocation_id=key, author=author, actions=EventActions(state_delta={STATE_PREFIX + key: entry}))
    try:
        await service.append_event(session=session, event=event)
    except Exception as exc:  # the run's own ending goes on: a later answer finds the older entry
        _log.warning("turnguard: invocation %s's turn could not be stored in its session (%s)", key, exc)


def _paused_state(run: _Run, snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` of ``run``'s turn with the calls it paused on a confirmation (``SECTION_KEY``)."""
    section: dict[str, Any] = {
        "asked": {call_id: call.name for call_id, (_, call) in run.asked.items()},
        "held": sorted(run.held),
        "paused": sorted(run.paused),
        "closed": sorted(run.closed),
    }
    if run.ask_next is not None:
        section["ask_next"] = verdict_data(run.ask_next)
    return {**snapshot, SECTION_KEY: section}


def _ended_state(halt: Verdict | None, paused: set[str] | frozenset[str]) -> dict[str, Any]:
    """How an invocation's turn ended, for a later resume of the invocation (``_Ended``)."""
    return {"ended": {"halt": verdict_data(halt), "paused": sorted(paused)}}


def _read_ended(state: Any) -> _Ended:
    fields = st.Fields(state, "")
    ended = st.Fields(fields.get("ended"), "ended")
    halt = read_verdict(ended.get("halt", None), "ended.halt")
    paused = common.section_call_ids(ended, "paused")
    ended.done()
    fields.done()
    return _Ended(halt, frozenset(paused))


def _asked_payload(tool_context: Any) -> dict[str, Any] | None:
    """turnguard's payload on the confirmation ADK resumes this call with, if turnguard asked for it:
    the user's answer carries only ``confirmed``, so the request is looked up in the session."""
    confirmation = tool_context.tool_confirmation
    if confirmation is None:
        return None
    found = _payload_of(confirmation)
    call_id = tool_context.function_call_id
    session = getattr(tool_context, "session", None)
    for event in reversed(getattr(session, "events", None) or ()) if found is None else ():
        requested = (event.actions.requested_tool_confirmations or {}).get(call_id)
        if requested is not None:
            return _payload_of(requested)
    return found


def _payload_of(confirmation: Any) -> dict[str, Any] | None:
    payload = getattr(confirmation, "payload", None)
    found = payload.get(PAYLOAD_KEY) if isinstance(payload, dict) else None
    return found if isinstance(found, dict) else None


def _closing_early() -> BaseException | None:
    """The ``GeneratorExit`` (or the caller's early-close cancellation) ADK's runner is closing
    ``run_async`` with when it calls ``after_run_callback``: it runs the callback from a ``finally``
    while the host's early close is in flight, and treats that as a clean completion."""
    in_flight = sys.exc_info()[1]
    return in_flight if isinstance(in_flight, GeneratorExit | asyncio.CancelledError) else None


def _final(verdict: Verdict) -> LlmResponse:
    """turnguard's answer in place of the model's: a final text, so the invocation ends."""
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=common.describe(verdict))]),
        custom_metadata={PAYLOAD_KEY: common.ask_payload(verdict)},
    )


def _not_executed(verdict: Verdict, *, asked_next: bool = False) -> dict[str, Any]:
    """The call's answer in place of its result (``common.not_executed``), as ADK takes a tool's error."""
    return {"error": common.not_executed(verdict, asked_next=asked_next)}


def halt_of(events: Any) -> dict[str, Any] | None:
    """turnguard's halt payload if it ended the invocation whose ``events`` these are, else None."""
    for event in reversed(list(events)):
        metadata = getattr(event, "custom_metadata", None) or {}
        if PAYLOAD_KEY in metadata:
            return metadata[PAYLOAD_KEY]
    return None


def _request_confirmation(tool_context: Any, verdict: Verdict, *, held: bool = False) -> dict[str, Any]:
    """Pause the invocation on ADK's tool confirmation; the call does not run (yet). A call ``held``
    with the question carries the question's payload, marked ``held``."""
    payload = {PAYLOAD_KEY: {**common.ask_payload(verdict), "held": held}}
    tool_context.request_confirmation(hint=common.describe(verdict), payload=payload)
    tool_context.actions.skip_summarization = True  # wait for the user, not for the model
    return {"error": f"Not executed yet: the user is asked first. {common.describe(verdict)}"}


def _outcome_of(result: Any) -> Outcome:
    """A tool response's outcome: ``ERROR`` for a dict with an ``"error"`` key (ADK's own tools'
    convention) or ``ReflectAndRetryToolPlugin``'s answer for a tool that raised, else ``OK``."""
    failed = isinstance(result, dict) and ("error" in result or result.get("response_type") == RETRY_RESPONSE_TYPE)
    return Outcome.ERROR if failed else Outcome.OK


def _remind(result: Any, reminder: str) -> Any:
    if isinstance(result, dict):
        return {**result, PAYLOAD_KEY: reminder}
    return common.with_reminder(result, reminder)


def confirmation_requests(events: Any) -> list[Any]:
    """The ``adk_request_confirmation`` calls in ``events`` that turnguard (not a tool) asked for."""
    found = []
    for event in events:
        for call in event.get_function_calls() if hasattr(event, "get_function_calls") else ():
            confirmation = (call.args or {}).get("toolConfirmation") or {}
            if call.name == "adk_request_confirmation" and PAYLOAD_KEY in (confirmation.get("payload") or {}):
                found.append(call)
    return found


def confirmation_answer(events: Any, confirmed: bool) -> types.Content:
    """The user's answer to turnguard's question as the message that resumes the invocation
    (``run_async(..., new_message=...)``): one confirmation response for each call turnguard
    paused in ``events``, the call it asked about and the calls held with it."""
    answer = {"confirmed": confirmed}
    responses = [types.FunctionResponse(name=c.name, id=c.id, response=answer) for c in confirmation_requests(events)]
    return types.Content(role="user", parts=[types.Part(function_response=r) for r in responses])
