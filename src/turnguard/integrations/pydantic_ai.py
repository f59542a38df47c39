"""pydantic-ai: a capability that bounds each agent run (one run = one turn).

Tested with pydantic-ai-slim 2.68 (the ``pydantic-ai`` extra installs ``>=2.68,<3``). pydantic-ai's
own ``request_limit`` (50 by default) ends a long productive run before turnguard's cap: raise it
(``usage_limits=UsageLimits(request_limit=1000)``) and let turnguard bound the turn.

``Agent(model, capabilities=[TurnGuardCapability(guard)])``. Each model request is a cycle
(``before_model_request``); each tool call is checked in ``wrap_tool_execute``, inside
pydantic-ai's own tool span when the agent is instrumented, before the tool body runs. A tool that
raises (including ``ModelRetry`` and ``ToolFailed``) is an ``ERROR`` outcome.

HALT raises ``TurnGuardHalted``, an ``AgentRunError`` (pydantic-ai's run-stopping family, like
``UsageLimitExceeded``) and a ``turnguard.LoopDetected``. ASK goes through pydantic-ai's deferred
tool approval when ``ask="approval"``: the call raises ``ApprovalRequired`` (metadata under
``"turnguard"``), so a ``HandleDeferredToolCalls`` capability or a ``DeferredToolRequests`` output
reaches the user; approving the call answers "continue", denying it answers "stop". With a
callable ``ask`` the callback answers inline. ``promptable`` defaults to whether ``ask`` is set.

A run ended by a ``DeferredToolRequests`` output can resume in another process: store
``turn_state(result)`` (the turn's snapshot, JSON) beside ``result.all_messages()`` and pass it back
as run metadata, ``agent.run(message_history=..., deferred_tool_results=...,
metadata={"turnguard": state})``: the resumed run continues the same turn (both guards need the
same ``GuardConfig(digest_key=...)``).
A REMIND (``GuardConfig(remind_model=True)``) is appended to the call's text result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import AgentRunError, ApprovalRequired, CallDeferred
from pydantic_ai.tools import DeferredToolRequests

from turnguard.guard import Guard
from turnguard.integrations._common import (
    Ask,
    Decision,
    RunDriver,
    Step,
    TurnHalted,
    ask_payload,
    checked_ask,
    open_turn,
    with_reminder,
)
from turnguard.model import Outcome, ToolCall, Verdict
from turnguard.snapshot import SnapshotError
from turnguard.snapshot import pending as pending_verdict

APPROVAL = "approval"
"""``ask=APPROVAL``: reach the user through pydantic-ai's deferred tool approval."""
METADATA_KEY = "turnguard"
"""The key of turnguard's entry in a deferred call's metadata and in a resumed run's metadata."""
STATE_KEY = "turn"
"""A deferred call's ``metadata["turnguard"]["turn"]``: the turn's snapshot (``turn_state``)."""
ASKED_KEY = "pydantic_ai"
MAX_PARKED = 1024


class TurnGuardHalted(TurnHalted, AgentRunError):
    """turnguard stopped the run; an ``AgentRunError`` as well as a ``turnguard.LoopDetected``."""


@dataclass
class _Pending:
    verdict: Verdict
    call: ToolCall
    driver: RunDriver


@dataclass
class TurnGuardCapability(AbstractCapability[Any]):
    """Bounds every run of the agent it is given to; per-run state lives in the ``for_run`` copy."""

    guard: Guard
    ask: Ask | Literal["approval"] | None = None
    promptable: bool | None = None
    _driver: RunDriver | None = field(default=None, init=False, repr=False)
    _pending: dict[str, _Pending] = field(default_factory=dict, init=False, repr=False)
    _ask_next: Verdict | None = field(default=None, init=False, repr=False)
    _parked: dict[str, _Pending] = field(default_factory=dict, init=False, repr=False)
    """Questions a finished run left open (shared by the per-run copies): the resumed run reports the
    user's answer to the turn that asked. Bounded: the oldest unanswered are dropped."""

    def __post_init__(self) -> None:
        checked_ask(self.ask, APPROVAL)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def for_run(self, ctx: Any) -> TurnGuardCapability:
        run = TurnGuardCapability(self.guard, self.ask, self.promptable)
        run._parked = self._parked
        return run

    # -- run lifecycle -------------------------------------------------------------------------

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        # Opened here, where pydantic-ai's own run span (if instrumented) is current.
        driver = self._open(ctx)
        try:
            result = await handler()
        except BaseException as exc:
            driver.end(exc)
            raise
        if self._pending and isinstance(getattr(result, "output", None), DeferredToolRequests):
            # The user answers in a resumed run (a new run, so a new turn): keep the question.
            self._parked.update(self._pending)
            for stale in list(self._parked)[:-MAX_PARKED]:
                del self._parked[stale]
            self._attach_state(driver, result.output)
            driver.turn.end("deferred")
        else:
            driver.end()
        return result

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        driver = self._open(ctx)
        for call_id, pending in list(self._pending.items()):
            # An approval that did not come back approved was denied by the user.
            del self._pending[call_id]
            TurnGuardHalted.stop(pending.driver.answer(pending.verdict, "stop", pending.call, before=True))
        for call_id in _answered_ids(ctx, self._parked):
            # Denied when resumed: the call never reached wrap_tool_execute.
            parked = self._parked.pop(call_id)
            TurnGuardHalted.stop(parked.driver.answer(parked.verdict, "stop", None, before=True))
        TurnGuardHalted.stop(await driver.acycle())
        return request_context

    # -- tools ---------------------------------------------------------------------------------

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        call_id = call.tool_call_id
        driver = self._open(ctx)
        pending = self._pending.pop(call_id, None)
        parked = self._parked.pop(call_id, None)
        if pending is not None and ctx.tool_call_approved:
            # The user approved the call turnguard asked about in this run: "continue".
            tool_call = pending.call
            driver.answer(pending.verdict, "continue", tool_call, before=True)
            reminder = None
        else:
            if parked is not None and ctx.tool_call_approved:
                # Approved in a resumed run: the answer belongs to the turn that asked.
                parked.driver.answer(parked.verdict, "continue", None, before=True)
            tool_call = ToolCall(call.tool_name, args, call_id)
            decision = driver.before(tool_call)
            if decision.step is Step.RUN and self._ask_next is not None:  # set only with APPROVAL
                decision = Decision(Step.ASK, self._ask_next)
            self._ask_next = None
            if decision.step is Step.ASK:
                if self.ask == APPROVAL:
                    self._pending[call_id] = _Pending(decision.verdict, tool_call, driver)
                    raise ApprovalRequired(metadata={METADATA_KEY: ask_payload(decision.verdict)})
                decision = await driver.aask_user(decision.verdict, tool_call, before=True)
            TurnGuardHalted.stop(decision)
            reminder = decision.reminder
        try:
            result = await handler(args)
        except (ApprovalRequired, CallDeferred):
            raise
        except Exception as exc:
            await self._outcome(driver, tool_call, Outcome.ERROR, cause=exc)
            raise
        await self._outcome(driver, tool_call, Outcome.OK)
        return with_reminder(result, reminder)

    # -- internals -----------------------------------------------------------------------------

    def _open(self, ctx: Any) -> RunDriver:
        if self._driver is None:
            state = (getattr(ctx, "metadata", None) or {}).get(METADATA_KEY)
            if state is not None:
                self._driver = self._resumed(state)
                return self._driver
            agent = getattr(ctx, "agent", None)
            self._driver = open_turn(
                self.guard,
                ask=self.ask,
                promptable=self.promptable,
                conversation_id=getattr(ctx, "conversation_id", None),
                agent_name=getattr(agent, "name", None),
            )
        return self._driver

    def _resumed(self, state: Any) -> RunDriver:
        """The driver of a turn another run left deferred (``turn_state``), its questions pending again."""
        if not isinstance(state, dict):
            kind = type(state).__name__
            raise SnapshotError(f"run metadata {METADATA_KEY!r} must be a turn_state() dict, got {kind}")
        driver = RunDriver(self.guard.resume(state), ask=None if isinstance(self.ask, str) else self.ask)
        verdict = pending_verdict(state)
        asked = (state.get(ASKED_KEY) or {}).get("asked") or {}
        if verdict is not None and isinstance(asked, dict):
            for call_id, name in asked.items():
                # Already counted before it was asked about: the answer resolves it, its outcome follows.
                self._pending[call_id] = _Pending(verdict, ToolCall(name, None, call_id), driver)
        return driver

    def _attach_state(self, driver: RunDriver, requests: DeferredToolRequests) -> None:
        """Put the turn's snapshot on each call turnguard asked about, for ``turn_state``."""
        asked = {call_id: p.call.name for call_id, p in self._pending.items() if p.driver is driver}
        if not asked:
            return
        verdict = next(p.verdict for p in self._pending.values() if p.driver is driver)
        state = driver.turn.snapshot(pending=verdict)
        state[ASKED_KEY] = {"asked": asked}
        for call_id in asked:
            entry = requests.metadata.setdefault(call_id, {}).setdefault(METADATA_KEY, {})
            entry[STATE_KEY] = state

    async def _outcome(
        self, driver: RunDriver, call: ToolCall, outcome: Outcome, cause: Exception | None = None
    ) -> None:
        decision = driver.after(call, outcome)
        if decision.step is Step.ASK:
            if self.ask == APPROVAL:
                self._ask_next = decision.verdict  # the model's next call waits for the user
                return
            decision = await driver.aask_user(decision.verdict, call, before=False)
        TurnGuardHalted.stop(decision, cause)


def _answered_ids(ctx: Any, parked: dict[str, _Pending]) -> list[str]:
    """Parked calls that have a tool return in this run's history (so they were answered)."""
    if not parked:
        return []
    found = []
    for message in getattr(ctx, "messages", None) or ():
        for part in getattr(message, "parts", ()):
            if getattr(part, "part_kind", None) == "tool-return" and part.tool_call_id in parked:
                found.append(part.tool_call_id)
    return found


def turn_state(result: Any) -> dict[str, Any] | None:
    """The JSON state of the turn a deferred run left open (``Turn.snapshot()`` with the calls
    turnguard asked about), for ``metadata={"turnguard": state}`` on the resumed run; ``None`` when
    turnguard asked nothing."""
    requests = getattr(result, "output", result)
    if not isinstance(requests, DeferredToolRequests):
        return None
    for entry in requests.metadata.values():
        state = (entry or {}).get(METADATA_KEY, {}).get(STATE_KEY)
        if state is not None:
            return state
    return None


def approval_requests(requests: DeferredToolRequests) -> Sequence[Any]:
    """The deferred calls that turnguard (not the tool itself) asked the user about."""
    return [call for call in requests.approvals if METADATA_KEY in (requests.metadata.get(call.tool_call_id) or {})]
