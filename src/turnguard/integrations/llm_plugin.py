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
  ``cancelled`` when the reading stops early.
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

__all__ = ["ChainGuard", "GuardedChain", "TurnGuardHalted", "chain"]


class TurnGuardHalted(common.TurnHalted):
    """turnguard stopped the chain; a ``turnguard.LoopDetected`` whose message names threshold and counts."""


class ChainGuard:
    """``before_call``/``after_call`` callbacks holding one chain's turn (use one per chain)."""

    def __init__(
        self,
        guard: Guard,
        *,
        ask: common.Ask | None = None,
        promptable: bool | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
    ) -> None:
        self.driver: common.RunDriver = common.open_turn(
            guard, ask=ask, promptable=promptable, conversation_id=conversation_id, agent_name=agent_name
        )
        self._calls: dict[int, ToolCall] = {}
        self._reminders: dict[int, str] = {}

    @property
    def turn(self):
        return self.driver.turn

    def begin_cycle(self) -> None:
        """Before a model request: raises ``TurnGuardHalted`` past the cycle cap."""
        TurnGuardHalted.stop(self.driver.cycle())

    def before_call(self, tool: Any, tool_call: Any) -> None:
        self._checked(tool_call, self.driver.check(self._start(tool_call)))

    def after_call(self, tool: Any, tool_call: Any, result: Any) -> None:
        call, outcome, output = self._finish(tool_call, result)
        TurnGuardHalted.stop(self.driver.outcome(call, outcome, output))

    async def abefore_call(self, tool: Any, tool_call: Any) -> None:
        """``before_call`` for async chains: an async ``ask`` callback is awaited."""
        self._checked(tool_call, await self.driver.acheck(self._start(tool_call)))

    async def aafter_call(self, tool: Any, tool_call: Any, result: Any) -> None:
        call, outcome, output = self._finish(tool_call, result)
        TurnGuardHalted.stop(await self.driver.aoutcome(call, outcome, output))

    def _start(self, tool_call: Any) -> ToolCall:
        self._calls[id(tool_call)] = call = _call(tool_call)
        return call

    def _checked(self, tool_call: Any, decision: common.Decision) -> None:
        TurnGuardHalted.stop(decision)
        if decision.reminder:
            self._reminders[id(tool_call)] = decision.reminder

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
        self.driver.end(exc)


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
                self.callbacks.begin_cycle()
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
    **chain_kwargs: Any,
) -> GuardedChain:
    """``model.chain(prompt, ...)`` (or ``conversation.chain``) with turnguard's callbacks.

    ``chain_limit`` defaults to 0 (unbounded): turnguard is the bound; pass one to keep llm's too.
    """
    if "before_call" in chain_kwargs or "after_call" in chain_kwargs:
        raise TypeError("turnguard supplies before_call/after_call; wrap yours with ChainGuard instead")
    conversation = model_or_conversation
    if callable(getattr(conversation, "conversation", None)):  # a model: chain in a new conversation
        conversation = conversation.conversation()
    callbacks = ChainGuard(
        guard,
        ask=ask,
        promptable=promptable,
        conversation_id=conversation_id if conversation_id is not None else getattr(conversation, "id", None),
        agent_name=getattr(getattr(conversation, "model", None), "model_id", None),
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
