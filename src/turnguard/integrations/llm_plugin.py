"""simonw's ``llm``: an ``llm`` plugin (entry point ``turnguard`` in the ``llm`` group) and chain callbacks.

Tested with llm 0.36 (the ``llm`` extra installs ``>=0.36,<1``).

llm 0.36 has no tool-call hook, so the guard rides on ``chain(before_call=, after_call=)``:

- ``ChainGuard`` holds one chain's turn; its ``before_call`` checks each tool call before llm runs
  it, its ``after_call`` records the outcome (a ``ToolResult`` with an ``exception`` is ``ERROR``).
- ``chain(guard, model_or_conversation, prompt, ...)`` returns a ``GuardedChain`` whose
  ``responses()``/``text()`` (``aresponses()``/``atext()`` for async models, whose ``ask`` may be
  async) also count each model request as a cycle (llm creates a chain's
  responses lazily, so the check runs before the request is sent) and end the turn: ``error``
  (``resolved=False``) when the model raises, as its exception leaves the response being read;
  ``cancelled`` when the reading stops early. A chain a tool pauses (``llm.PauseChain``) is not
  ended: its turn is put aside, its state on the exception (``turn_state(pause)``), and the chain
  that resumes it (``chain(..., state=)``) continues it.
- A call llm answers without running it gets its outcome all the same, as the other adapters'
  frameworks report theirs: ``ERROR`` for a tool that does not exist or has no implementation
  (llm calls ``before_call`` for it, never ``after_call``), ``DENIED`` for one a hook of the
  host's cancelled (``llm.CancelToolCall``), found before the next request; a call the chain
  died or was cancelled in gets one as the turn ends (``ERROR`` for an error, else ``UNKNOWN``).
- HALT raises ``TurnGuardHalted`` from the callback, which ends llm's chain (llm only turns
  ``CancelToolCall`` into a tool result; any other exception stops the chain). ASK goes to the
  ``ask`` callback, the same route llm's own ``--ta`` approval takes (a ``before_call``); a "stop"
  answer refuses the call and stops the chain. Without a callback the fallback applies. A REMIND
  (``GuardConfig(remind_model=True)``) is appended to the call's result text.

As a plugin it adds ``llm guarded PROMPT -m MODEL -T TOOL`` (a guarded tool chain on the command
line, configured like any turnguard host: ``turnguard.toml``, ``[tool.turnguard]``, ``TURNGUARD_*``;
exit status 2 when turnguard stops it, or when it cannot start: an unknown model or tool, a bad
setting, each said in one line as llm's own commands say theirs; 1 when the model fails). llm's
``prompt`` command cannot be given callbacks by a plugin, and llm 0.36 defines no tool-call hook
to implement, hence the separate command.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

import llm

from turnguard._config import ConfigError, GuardConfig
from turnguard._guard import Guard
from turnguard._model import Outcome, ToolCall
from turnguard._terminal import shown
from turnguard.integrations import _common as common

__all__ = ["ChainGuard", "GuardedChain", "TurnGuardHalted", "chain", "turn_state"]

PAUSED_KEY = "llm"
"""The adapter's section of a paused chain's turn state: the ids of the calls that paused it
(checked, without an outcome: the resumed chain runs them again, unchecked, and reports them)."""
STATE_ATTR = "turnguard_state"
"""The attribute of an ``llm.PauseChain`` that holds its chain's turn state (``turn_state``)."""


class TurnGuardHalted(common.TurnHalted):
    """turnguard stopped the chain; a ``turnguard.LoopDetected`` whose message names threshold and counts."""


class ChainGuard:
    """``before_call``/``after_call`` callbacks holding one chain's turn (use one per chain).

    ``before_call``/``after_call``: the host's own (an approval like llm's ``--ta``, a log), run
    after turnguard's; a call the host's ``before_call`` cancels (``llm.CancelToolCall``) is
    recorded ``DENIED``. ``state``: the ``turn_state`` of a chain a tool paused, to continue its
    turn (its paused calls, which llm runs first, are not checked twice); ``durable``: such a state
    resumes in any process (``Guard.turn(durable=True)``), not only in this one."""

    def __init__(
        self,
        guard: Guard,
        *,
        ask: common.Ask | None = None,
        promptable: bool | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        durable: bool = False,
        state: Any = None,
        before_call: Callable[..., Any] | None = None,
        after_call: Callable[..., Any] | None = None,
    ) -> None:
        self._calls: dict[int, ToolCall] = {}
        self._reminders: dict[int, str] = {}
        self._host_before = before_call
        self._host_after = after_call
        self._paused: set[str] = set()
        """Call ids of the resumed state's paused calls: checked before the pause, reported now."""
        self.driver: common.RunDriver
        if state is None:
            self.driver = common.open_turn(
                guard, ask=ask, promptable=promptable, conversation_id=conversation_id, agent_name=agent_name,
                durable=durable,
            )
            return
        section = common.adapter_section(state, PAUSED_KEY)  # a bad one is refused before the turn resumes
        if section is not None:
            self._paused.update(common.section_call_ids(section, "paused"))
        self.driver = common.RunDriver(guard.resume(state), ask=ask)

    @property
    def turn(self):
        return self.driver.turn

    def begin_cycle(self) -> None:
        """Before a model request: raises ``TurnGuardHalted`` past the cycle cap. Calls of the last
        response still without an outcome were cancelled by a hook around these callbacks (llm
        skips ``after_call`` then): they are recorded ``DENIED`` first."""
        if self._calls:
            for call in self._unreported():
                TurnGuardHalted.stop(self.driver.outcome(call, Outcome.DENIED))
        TurnGuardHalted.stop(self.driver.cycle())

    async def abegin_cycle(self) -> None:
        """``begin_cycle`` for async chains: an async ``ask`` callback is awaited."""
        if self._calls:
            for call in self._unreported():
                TurnGuardHalted.stop(await self.driver.aoutcome(call, Outcome.DENIED))
        TurnGuardHalted.stop(await self.driver.acycle())

    def before_call(self, tool: Any, tool_call: Any) -> None:
        call = self._start(tool_call)
        if not self._paused or not self._was_paused(call):
            self._checked(tool_call, self.driver.check(call))
        if self._host_before is not None:
            try:
                _synchronously(self._host_before(tool, tool_call), "before_call")
            except llm.CancelToolCall as cancel:
                denied = self._not_run(tool_call, Outcome.DENIED, f"Cancelled: {cancel}")
                TurnGuardHalted.stop(self.driver.outcome(*denied), cancel)
                raise
        if tool is None or not tool.implementation:
            failed = self._not_run(tool_call, Outcome.ERROR, _missing(tool, tool_call))
            TurnGuardHalted.stop(self.driver.outcome(*failed))

    def after_call(self, tool: Any, tool_call: Any, result: Any) -> None:
        call, outcome, output = self._finish(tool_call, result)
        decision = self.driver.outcome(call, outcome, output)
        if self._host_after is not None:
            _synchronously(self._host_after(tool, tool_call, result), "after_call")
        TurnGuardHalted.stop(decision)

    async def abefore_call(self, tool: Any, tool_call: Any) -> None:
        """``before_call`` for async chains: an async ``ask`` callback (or hook of the host's) is awaited."""
        call = self._start(tool_call)
        if not self._paused or not self._was_paused(call):
            self._checked(tool_call, await self.driver.acheck(call))
        if self._host_before is not None:
            try:
                await _awaited(self._host_before(tool, tool_call))
            except llm.CancelToolCall as cancel:
                denied = self._not_run(tool_call, Outcome.DENIED, f"Cancelled: {cancel}")
                TurnGuardHalted.stop(await self.driver.aoutcome(*denied), cancel)
                raise
        if tool is None or not tool.implementation:
            failed = self._not_run(tool_call, Outcome.ERROR, _missing(tool, tool_call))
            TurnGuardHalted.stop(await self.driver.aoutcome(*failed))

    async def aafter_call(self, tool: Any, tool_call: Any, result: Any) -> None:
        call, outcome, output = self._finish(tool_call, result)
        decision = await self.driver.aoutcome(call, outcome, output)
        if self._host_after is not None:
            await _awaited(self._host_after(tool, tool_call, result))
        TurnGuardHalted.stop(decision)

    def _start(self, tool_call: Any) -> ToolCall:
        self._calls[id(tool_call)] = call = _call(tool_call)
        return call

    def _was_paused(self, call: ToolCall) -> bool:
        """Whether ``call`` is one the resumed chain's pause left checked (once: a later call
        reusing its id is checked)."""
        if call.call_id in self._paused:
            self._paused.discard(call.call_id)
            return True
        return False

    def _checked(self, tool_call: Any, decision: common.Decision) -> None:
        try:
            TurnGuardHalted.stop(decision)
        except TurnGuardHalted:
            self._calls.pop(id(tool_call), None)  # not run, and the chain stops: nothing to report
            raise
        if decision.reminder:
            self._reminders[id(tool_call)] = decision.reminder

    def _not_run(self, tool_call: Any, outcome: Outcome, answer: str) -> tuple[ToolCall, Outcome, str]:
        """A checked call llm answers without running it, and never reports (cancelled by the host,
        no such tool, none to run): its outcome, with the answer llm gives the model as its result."""
        self._reminders.pop(id(tool_call), None)
        call = self._calls.pop(id(tool_call), None) or _call(tool_call)
        return call, outcome, answer

    def _unreported(self) -> list[ToolCall]:
        """The checked calls still without an outcome, taken off."""
        calls = list(self._calls.values())
        self._calls.clear()
        self._reminders.clear()
        return calls

    def _finish(self, tool_call: Any, result: Any) -> tuple[ToolCall, Outcome, Any]:
        """The checked call, its outcome and its result (the tool result's ``output``, as the tool
        gave it: before a reminder is added to what the model reads)."""
        call = self._calls.pop(id(tool_call), None) or _call(tool_call)
        reminder = self._reminders.pop(id(tool_call), None)
        output = getattr(result, "output", None)
        if reminder and isinstance(output, str):
            result.output = common.with_reminder(output, reminder)  # what the model reads next
        return call, Outcome.ERROR if getattr(result, "exception", None) is not None else Outcome.OK, output

    def end(self, exc: BaseException | None = None) -> None:
        """End the turn with the reason ``exc`` gives; a chain paused by ``llm.PauseChain`` is put
        aside instead (``turn_state(exc)``), for the chain that resumes it to continue.

        Checked calls still without an outcome get one, as in the other adapters: ``DENIED`` when
        the chain completed (a hook around these callbacks cancelled them), else the outcome of a
        call the run's end cut off (``common.unfinished_outcome``: ``ERROR`` when it died on an
        error, such as a host hook that raised, ``UNKNOWN`` when it was cancelled mid-tool)."""
        if isinstance(exc, llm.PauseChain):
            self._put_aside(exc)
            return
        if self._calls:
            outcome = Outcome.DENIED if exc is None else common.unfinished_outcome(exc)
            for call in self._unreported():
                self.driver.after(call, outcome)
        self.driver.end(exc)

    def _put_aside(self, pause: llm.PauseChain) -> None:
        """The paused calls (checked, not reported: the resumed chain runs and reports them) go in
        the turn's state, set on ``pause``; nothing is recorded for them here."""
        paused = [call.call_id for call in self._unreported() if call.call_id]
        state = common.put_aside(self.driver.turn, self.driver.question)
        if state is not None:
            state[PAUSED_KEY] = {"paused": paused[: common.MAX_SECTION_CALLS]}
        setattr(pause, STATE_ATTR, state)


def _missing(tool: Any, tool_call: Any) -> str:
    """What llm answers a call to ``tool`` it cannot run (``None``: no tool of that name)."""
    return f'Error: tool "{tool_call.name}" {"does not exist" if tool is None else "has no implementation"}'


def _synchronously(result: Any, hook: str) -> None:
    """A sync chain's host hook must not return an awaitable: llm would refuse ours for it."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise TypeError(f"a synchronous chain cannot await the host's {hook}: pass a synchronous one")


async def _awaited(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


def turn_state(pause: BaseException) -> dict[str, Any] | None:
    """The turn state of the chain ``pause`` (an ``llm.PauseChain``) paused: JSON data to keep with
    the chain's messages and pass as ``chain(..., state=)`` to the chain that resumes it. ``None``
    for an exception turnguard did not put a turn aside for."""
    state = getattr(pause, STATE_ATTR, None)
    return state if isinstance(state, dict) else None


def _call(tool_call: Any) -> ToolCall:
    return common.make_call(tool_call.name, tool_call.arguments, tool_call.tool_call_id)


class GuardedChain:
    """An llm chain under turnguard: iterate ``responses()`` or call ``text()``."""

    def __init__(self, chain: Any, callbacks: ChainGuard) -> None:
        self.chain = chain
        self.callbacks = callbacks

    def responses(self) -> Iterator[Any]:
        try:
            for response in self.chain.responses():
                self.callbacks.begin_cycle()  # the response is lazy: its request is not sent yet
                yield _watched(response, self.callbacks)
        except BaseException as exc:
            self.callbacks.end(exc)
            raise
        self.callbacks.end()

    def text(self) -> str:
        return "".join(response.text() for response in self.responses())

    async def aresponses(self) -> AsyncIterator[Any]:
        """``responses()`` for an async model or conversation."""
        try:
            async for response in self.chain.responses():
                await self.callbacks.abegin_cycle()
                yield _watched(response, self.callbacks)
        except BaseException as exc:
            self.callbacks.end(exc)
            raise
        self.callbacks.end()

    async def atext(self) -> str:
        return "".join([await response.text() async for response in self.aresponses()])


def _watched(response: Any, callbacks: ChainGuard) -> Any:
    """``response``, its model's stream set to end the turn with the exception it raises, when it
    raises it: the consumer reads the response (and meets the exception) outside the chain's
    generator, which would otherwise only be closed later, as if the reading had stopped.

    llm has no hook for a failed response: this wraps the stream each response drives its model
    through (``_iter_events``; ``_generator`` for an async one), once per response."""
    if isinstance(response, llm.AsyncResponse):
        ensure = response._ensure_async_generator

        def ensure_watched() -> None:
            if not hasattr(response, "_generator"):
                ensure()
                response._generator = _aended_on_failure(response._generator, callbacks)

        # (a wrapper of llm's own method, on this response only: mypy refuses assigning over a method)
        response._ensure_async_generator = ensure_watched  # type: ignore[method-assign]
    else:
        events = response._iter_events
        response._iter_events = lambda: _ended_on_failure(events(), callbacks)
    return response


def _ended_on_failure(chunks: Iterator[Any], callbacks: ChainGuard) -> Iterator[Any]:
    try:
        yield from chunks
    except Exception as exc:
        callbacks.end(exc)
        raise


async def _aended_on_failure(chunks: AsyncIterator[Any], callbacks: ChainGuard) -> AsyncGenerator[Any, None]:
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:
        callbacks.end(exc)
        raise


def chain(
    guard: Guard,
    model_or_conversation: Any,
    prompt: str | None = None,
    *,
    ask: common.Ask | None = None,
    promptable: bool | None = None,
    conversation_id: str | None = None,
    durable: bool = False,
    state: Any = None,
    **chain_kwargs: Any,
) -> GuardedChain:
    """``model.chain(prompt, ...)`` (or ``conversation.chain``) with turnguard's callbacks.

    ``chain_limit`` defaults to 0 (unbounded): turnguard is the bound; pass one to keep llm's too.
    ``state``: the ``turn_state`` of a paused chain this one resumes (with its ``messages=``), to
    continue its turn; ``durable=True`` lets a paused chain's state resume in another process.
    ``before_call``/``after_call`` of the host's run after turnguard's (``ChainGuard``).
    """
    conversation = model_or_conversation
    if callable(getattr(conversation, "conversation", None)):  # a model: chain in a new conversation
        conversation = conversation.conversation()
    callbacks = ChainGuard(
        guard,
        ask=ask,
        promptable=promptable,
        conversation_id=conversation_id if conversation_id is not None else getattr(conversation, "id", None),
        agent_name=getattr(getattr(conversation, "model", None), "model_id", None),
        durable=durable,
        state=state,
        before_call=chain_kwargs.pop("before_call", None),
        after_call=chain_kwargs.pop("after_call", None),
    )
    chain_kwargs.setdefault("chain_limit", 0)
    before: Callable[..., Any]
    after: Callable[..., Any]
    if isinstance(conversation, llm.AsyncConversation):
        before, after = callbacks.abefore_call, callbacks.aafter_call
    else:
        before, after = callbacks.before_call, callbacks.after_call
    underlying = conversation.chain(prompt, before_call=before, after_call=after, **chain_kwargs)
    return GuardedChain(underlying, callbacks)


# -- the llm plugin -----------------------------------------------------------------------------


@llm.hookimpl
def register_commands(cli: Any) -> None:
    import click

    class CannotStart(click.ClickException):
        """What keeps ``llm guarded`` from starting (a model, a tool, a turnguard setting): said in one
        line, as llm's own commands say theirs, with the exit status of a bad setting."""

        exit_code = 2

    @cli.command(name="guarded")
    @click.argument("prompt")
    @click.option("-m", "--model", "model_id", help="Model to use")
    @click.option("-T", "--tool", "tools", multiple=True, help="Name of a registered tool to offer the model")
    @click.option("--max-tool-calls", type=int, default=None, help="Explicit per-turn tool-call cap (call N+1 halts)")
    def guarded(prompt: str, model_id: str | None, tools: tuple[str, ...], max_tool_calls: int | None) -> None:
        """Run PROMPT as a tool chain under turnguard (unattended: a stuck chain is stopped)."""
        try:
            model = llm.get_model(model_id)
        except llm.UnknownModelError as exc:
            raise CannotStart(str(exc.args[0]) if exc.args else "Unknown model") from None
        registered = llm.get_tools()
        missing = [name for name in tools if name not in registered]
        if missing:
            raise CannotStart(f"Tool(s) {', '.join(missing)} not found. Available: {', '.join(registered)}")
        overrides: dict[str, Any] = {} if max_tool_calls is None else {"max_tool_calls_per_turn": max_tool_calls}
        try:
            guard = Guard(GuardConfig.load(**overrides))  # turnguard.toml / pyproject / TURNGUARD_* apply
        except ConfigError as exc:
            raise CannotStart(shown(f"turnguard: {exc}")) from None
        guarded_chain = chain(guard, model, prompt, tools=[registered[name] for name in tools])
        try:
            for response in guarded_chain.responses():
                for chunk in response:
                    click.echo(chunk, nl=False)
            click.echo()
        except TurnGuardHalted as stop:
            click.echo(f"\n{stop}", err=True)
            sys.exit(2)
        except Exception as exc:  # the model or a tool failed: one line, as `llm prompt` says it
            if os.environ.get("LLM_RAISE_ERRORS"):
                raise
            raise click.ClickException(shown(str(exc) or type(exc).__name__)) from None
