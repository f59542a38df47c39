"""pydantic-ai + turnguard: the README's snippet (the tests run it with a FunctionModel)."""

from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolFailed

import turnguard as tg
from turnguard.integrations.pydantic_ai import TurnGuardCapability, TurnGuardHalted

guard = tg.Guard(tg.GuardConfig())  # streak: warn at 5 identical calls, stop at 8 identical failures


def read_file(path: str) -> str:
    """Read a file of the project."""
    raise ToolFailed(f"{path}: no such file")


def answer(prompt: str, model="openai:gpt-5") -> str:
    agent = Agent(model, tools=[read_file], capabilities=[TurnGuardCapability(guard)])
    try:
        return agent.run_sync(prompt).output
    except TurnGuardHalted as stop:  # also a pydantic_ai AgentRunError and a tg.LoopDetected
        return f"stopped: {stop}"
