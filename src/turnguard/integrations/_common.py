"""What every framework adapter shares: the per-run driver, the ASK route and the halt message.

An adapter translates its framework's lifecycle into ``begin_cycle`` / ``check_call`` /
``record_outcome`` and the driver's decisions back into the framework's own mechanisms. The
decisions are the same everywhere:

- HALT: the call is not executed and the run stops, with a message naming the threshold and counts;
- ASK: the user is reached (the framework's approval path, else the ``ask`` callback); "continue"
  and "redirect" let the run go on, "stop" halts it (the refused call is recorded as ``DENIED``);
  with no way to reach anyone the documented fallback applies: the turn is treated as unattended
  (a warning is only observed, a stop halts);
- REMIND: the call runs; the reminder text is on the decision for adapters that can inject it.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from turnguard import _state as st
from turnguard._guard import Guard, Turn
from turnguard._model import Action, Answer, Level, LoopDetected, Outcome, ToolCall, Verdict
from turnguard._snapshot import MAX_WAITING, turn_snapshot
from turnguard._state import Fields

AskResult = Answer | str
Ask = Callable[[Verdict], AskResult | Awaitable[AskResult]]
"""The user's callback for an ASK: gets the verdict (its ``event`` holds the counts), returns
``"continue"``, ``"stop"`` or ``"redirect"`` (or an ``Answer``); may be async where the host is."""

NO_ROUTE_SUFFIX = " (nobody could be asked: halted as an unattended turn would be)"


def describe(verdict: Verdict) -> str:
    """One line for the user and the logs: which threshold fired, its limit, and the counts."""
    event = verdict.event
    if event is None:
        return verdict.message or f"turnguard: {verdict.action.label}"
    parts = [
        f"turnguard {'stopped the run' if verdict.action is Action.HALT else 'flagged the run'}: "
        f"threshold {event.threshold} ({event.level}, limit {event.limit})",
        f"{event.tool_calls} tool calls, {event.cycles} model requests",
        f"{event.tool_name}: {event.streak_length} identical in a row, {event.failing_streak_length} failing",
        f"max repeat {event.max_key_repeat}",
    ]
    text = "; ".join(parts)
    return f"{text}. {verdict.message}" if verdict.message else text


def not_executed(verdict: Verdict, *, asked_next: bool = False) -> str:
    """What the model reads in place of a call's result when turnguard kept the call from running;
    ``asked_next``: the user is asked at the batch's next call (the framework cannot ask at this one)."""
    return f"Not executed: {describe(verdict)}{' (the user is asked at the next call)' if asked_next else ''}"


class TurnHalted(LoopDetected):
    """The run was stopped by turnguard; ``verdict`` says why, ``str()`` names threshold and counts.

    Each adapter raises a subclass that is also its framework's own run-stopping exception.
    """

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict)
        self.args = (describe(verdict),)
        self.message = self.args[0]  # the attribute the frameworks' own run-stopping errors read

    def __str__(self) -> str:
        return str(self.args[0])

    @classmethod
    def stop(cls, decision: Decision, cause: BaseException | None = None) -> None:
        """Raise on a decision that stops the run (a HALT, or the user's refusal)."""
        if decision.step is Step.HALT or decision.step is Step.REFUSE:
            raise cls(decision.verdict) from cause


class Step(enum.Enum):
    """What the adapter does with the call (or the run) after a check."""

    RUN = "run"
    """Execute the call / go on."""
    ASK = "ask"
    """Reach the user before going on (``RunDriver.ask_user`` or the framework's approval path)."""
    REFUSE = "refuse"
    """The user refused: do not execute the call; the run halts."""
    HALT = "halt"
    """Do not execute the call; stop the run."""
    HOLD = "hold"
    """Do not execute the call yet: a question asked before it is still unanswered. The call waits
    for the answer (the framework's route defers it with the question) and is checked after it."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The driver's answer to an adapter: what to do, and the verdict behind it."""

    step: Step
    verdict: Verdict
    reminder: str | None = None
    """Set on REMIND: text the adapter may inject into the model's input."""


class RunDriver:
    """One run of a host agent = one turn: the turn, the route to the user, and the mapping.

    Adapters with their own approval path call ``before``/``after`` and route ``Step.ASK``
    themselves (then ``answer()``); the others call ``check``/``outcome`` (or the async
    ``acheck``/``aoutcome``), which resolve an ASK through the ``ask`` callback or the fallback.
    """

    def __init__(self, turn: Turn, *, ask: Ask | None = None) -> None:
        self.turn = turn
        self.ask = ask
        self.question: Verdict | None = None
        """The ASK put to the user through the framework's own route and not answered yet: calls
        after it are held (``Step.HOLD``), not checked."""
        self._asking = threading.RLock()
        """Held while a synchronous callback is asked: other threads' calls wait for the answer."""
        self._answered: asyncio.Event | None = None
        """Set while an async callback is asked; tasks checking calls meanwhile wait on it."""

    # -- raw checks (ASK left to the adapter) -------------------------------------------------

    def before(self, call: ToolCall) -> Decision:
        """Before executing ``call``; ``Step.HOLD`` (the call is not checked) while ``question`` waits."""
        question = self.question
        if question is not None:
            return Decision(Step.HOLD, question)
        return self._map(self.turn.check_call(call))

    def defer(self, verdict: Verdict) -> None:
        """The adapter put ``verdict`` (an ASK) to the user through its framework's route: until
        ``answer()``, later calls are held with it."""
        self.question = verdict

    def after(self, call: ToolCall, outcome: Outcome, result: Any = None) -> Decision:
        """After executing ``call``; ``result``: what the framework handed back for it (the
        stateful tools' results count: ``Turn.record_outcome``)."""
        return self._map(self.turn.record_outcome(call, outcome, result))

    # -- checks with the ASK resolved through the callback ------------------------------------

    def cycle(self) -> Decision:
        """Before a model request; an ASK here goes to the callback (or the fallback)."""
        decision = self._map(self.turn.begin_cycle())
        return self.ask_user(decision.verdict, None, before=False) if decision.step is Step.ASK else decision

    async def acycle(self) -> Decision:
        decision = self._map(self.turn.begin_cycle())
        return await self.aask_user(decision.verdict, None, before=False) if decision.step is Step.ASK else decision

    # A question holds the calls after it: a call checked while the user is being asked (another
    # thread's or task's call of the same batch) waits for the answer, then is checked.

    def check(self, call: ToolCall) -> Decision:
        with self._asking:
            decision = self.before(call)
            return self.ask_user(decision.verdict, call, before=True) if decision.step is Step.ASK else decision

    def outcome(self, call: ToolCall, outcome: Outcome, result: Any = None) -> Decision:
        with self._asking:
            decision = self.after(call, outcome, result)
            return self.ask_user(decision.verdict, call, before=False) if decision.step is Step.ASK else decision

    async def acheck(self, call: ToolCall) -> Decision:
        await self.unasked()
        decision = self.before(call)
        if decision.step is not Step.ASK:
            return decision
        return await self._asked(self.aask_user(decision.verdict, call, before=True))

    async def aoutcome(self, call: ToolCall, outcome: Outcome, result: Any = None) -> Decision:
        await self.unasked()
        decision = self.after(call, outcome, result)
        if decision.step is not Step.ASK:
            return decision
        return await self._asked(self.aask_user(decision.verdict, call, before=False))

    async def unasked(self) -> None:
        """Return once no async question of this run is waiting for the user."""
        while (answered := self._answered) is not None:
            await answered.wait()

    async def _asked(self, asking: Awaitable[Decision]) -> Decision:
        self._answered = answered = asyncio.Event()
        try:
            return await asking
        finally:
            self._answered = None
            answered.set()

    # -- the ASK route -----------------------------------------------------------------------

    def ask_user(self, verdict: Verdict, call: ToolCall | None, *, before: bool) -> Decision:
        """Route an ASK through the callback (sync), or apply the no-route fallback."""
        if self.ask is None:
            return self.fallback(verdict)
        answer = self.ask(verdict)
        if inspect.isawaitable(answer):
            close = getattr(answer, "close", None)
            if close is not None:
                close()
            raise TypeError("this host runs tools synchronously: pass a synchronous ask callback")
        return self.answer(verdict, answer, call, before=before)

    async def aask_user(self, verdict: Verdict, call: ToolCall | None, *, before: bool) -> Decision:
        """Route an ASK through the callback (sync or async), or apply the no-route fallback."""
        if self.ask is None:
            return self.fallback(verdict)
        answer = self.ask(verdict)
        if inspect.isawaitable(answer):
            answer = await answer
        return self.answer(verdict, answer, call, before=before)

    def answer(self, verdict: Verdict, answer: AskResult, call: ToolCall | None, *, before: bool) -> Decision:
        """Apply the user's answer: continue/redirect go on, stop halts (a refused call is DENIED)."""
        self.question = None
        resolved = self.turn.resolve(verdict, answer)
        if resolved.action is Action.HALT:
            if before and call is not None:
                self.turn.record_outcome(call, Outcome.DENIED)
            return Decision(Step.REFUSE if before else Step.HALT, resolved)
        return Decision(Step.RUN, verdict)

    def fallback(self, verdict: Verdict) -> Decision:
        """ASK with nobody to ask: act as an unattended turn would (a warning is observed, a stop halts)."""
        event = verdict.event
        if event is not None and event.level is Level.WARN:
            return Decision(Step.RUN, verdict)
        halted = self.turn.halt(verdict, (verdict.message or "turnguard") + NO_ROUTE_SUFFIX)
        return Decision(Step.HALT, halted)

    def end(self, exc: BaseException | None = None) -> None:
        """End the turn (idempotent) with the reason ``exc`` gives (see ``end_reason``).

        A run that died on an error did not do its task: the turn's result is reported as
        unresolved, unless the host reported one in the turn (it knows best; a second result would
        be counted a duplicate). Whether a completed run's answer did it, or what a halted or
        cancelled run left, only the host knows (``guard.report_result(turn_id, resolved)``)."""
        reason = end_reason(exc)
        if reason == ERROR and self.turn.summary is None and self.turn.resolved is None:
            self.turn.report_result(False)
        self.turn.end(reason)

    @staticmethod
    def _map(verdict: Verdict) -> Decision:
        action = verdict.action
        if action is Action.HALT:
            return Decision(Step.HALT, verdict)
        if action is Action.ASK:
            return Decision(Step.ASK, verdict)
        if action is Action.REMIND:
            return Decision(Step.RUN, verdict, reminder=verdict.message)
        return Decision(Step.RUN, verdict)


CANCELLED = "cancelled"
"""The turn's end reason when the run was cancelled (a task cancelled, Ctrl-C, a generator closed)."""
ERROR = "error"
"""The turn's end reason when the run died on an exception that is not turnguard's."""


def error_result(exc: BaseException) -> str:
    """A failed call's result, as its outcome is recorded with: the error's type and message (a
    status tool that reports "pending, 3 ahead" as an error makes progress when that changes)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an error whose __str__ raises
        return type(exc).__name__


def end_reason(exc: BaseException | None) -> str:
    """How a run that ended with ``exc`` ended: ``completed`` (the turn reports ``halted`` itself when
    it latched a HALT), ``halted`` (turnguard stopped it), ``cancelled`` or ``error`` (anything else,
    the framework's own step limit included)."""
    if exc is None:
        return "completed"
    if isinstance(exc, LoopDetected):
        return "halted"
    if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | GeneratorExit):
        return CANCELLED
    return ERROR


def unfinished_outcome(exc: BaseException | None) -> Outcome:
    """How a call checked and let run whose outcome never came settles as its run ends with
    ``exc``: ``ERROR`` when the run died on an exception (the tool raised, or what recovered it
    gave up and raised), else ``UNKNOWN``; so every checked call gets one outcome."""
    return Outcome.ERROR if end_reason(exc) == ERROR else Outcome.UNKNOWN


def open_turn(
    guard: Guard,
    *,
    ask: Ask | str | None,
    promptable: bool | None,
    conversation_id: str | None = None,
    agent_name: str | None = None,
    durable: bool = False,
) -> RunDriver:
    """Open the run's turn. ``ask`` is the callback, or the name of the framework's own route (which
    the adapter drives itself); ``promptable`` defaults to whether there is a way to reach the user.
    ``durable``: the adapter persists the run (a checkpoint, a run state, deferred calls), so the
    turn's snapshot must resume in another process with the default configuration."""
    attended = (ask is not None) if promptable is None else bool(promptable)
    turn = guard.turn(conversation_id=conversation_id, agent_name=agent_name, promptable=attended, durable=durable)
    return RunDriver(turn, ask=None if isinstance(ask, str) else ask)


def put_aside(turn: Turn, pending: Verdict | None = None) -> dict[str, Any] | None:
    """Close a paused run's turn this process will not finish as ``suspended`` (not reported here:
    the process that resumes it reports it, once); its snapshot, or ``None`` if it had ended."""
    try:
        return turn.suspend(pending)
    except ValueError:  # it ended meanwhile (another path finished it): nothing to put aside
        return None


def checked_ask(ask: Ask | str | None, route: str) -> Ask | str | None:
    """``ask`` as an adapter takes it: a callback, ``None``, or the name of its framework's own
    route (``route``); anything else is a host mistake, refused when the adapter is made."""
    if ask is None or callable(ask) or ask == route:
        return ask
    raise ValueError(f"ask must be a callback, None or {route!r}, got {ask!r}")


def make_call(name: str | None, args: Any, call_id: str | None) -> ToolCall:
    """The framework's call as a ``ToolCall`` (a nameless call still gets a name: ``"tool"``)."""
    return ToolCall(name or "tool", args, call_id)


def ask_payload(verdict: Verdict) -> dict[str, Any]:
    """What an adapter hands its framework's approval path with an ASK (never the arguments)."""
    event = verdict.event
    return {
        "message": describe(verdict),
        "threshold": str(verdict.threshold),
        "level": str(event.level) if event else None,
        "event_id": event.event_id if event else None,
    }


def with_reminder(result: Any, reminder: str | None) -> Any:
    """A text tool result with the REMIND text appended (what ``remind_model=True`` opts into);
    any other result is returned as it is (its type is the tool's contract with the model)."""
    if not reminder or not isinstance(result, str):
        return result
    return f"{result}\n\n[turnguard] {reminder}"


MAX_SECTION_CALLS = MAX_WAITING
"""The most calls an adapter's section of a turn state lists (asked about, held): calls a live turn
waits for, as many as its snapshot's ``awaiting`` may list."""


def adapter_section(state: Any, key: str) -> Fields | None:
    """The adapter's own section of a turn state (``state[key]``, beside the snapshot's fields),
    to read field by field before the turn is resumed: a bad one is a ``SnapshotError`` naming it
    with no turn opened, so resuming the right state afterwards keeps the turn's id. ``None``
    when the state has no such section."""
    state = turn_snapshot(state)
    return Fields(state[key], key) if key in state else None


def section_call_ids(section: Fields, name: str) -> list[str]:
    """The call ids (non-empty strings) a section lists at ``name`` (absent: none)."""
    path = section.at(name)
    return [st.text(f"{path}[{i}]", call_id, nonempty=True)
            for i, call_id in enumerate(section.items(name, MAX_SECTION_CALLS, default=[]))]
