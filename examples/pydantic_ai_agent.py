"""pydantic-ai + turnguard (docs/integrations.md quotes this file; the tests run it with a FunctionModel)."""

from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.usage import UsageLimits

import turnguard as tg
from turnguard.integrations.pydantic_ai import TurnGuardCapability, TurnGuardHalted

guard = tg.Guard(tg.GuardConfig())  # streak: warn at 5 identical calls, stop at 8 identical failures


def read_file(path: str) -> str:
    """Read a file of the project."""
    if not Path(path).is_file():
        raise ToolFailed(f"{path}: no such file")
    return Path(path).read_text()


def answer(prompt: str, model="openai:gpt-5") -> str:
    agent = Agent(model, tools=[read_file], capabilities=[TurnGuardCapability(guard)])
    try:  # pydantic-ai's own budget (50 requests) would end a long productive turn first
        return agent.run_sync(prompt, usage_limits=UsageLimits(request_limit=1000)).output
    except TurnGuardHalted as stop:  # also a pydantic_ai AgentRunError and a tg.LoopDetected
        return f"stopped: {stop}"



def main(model="openai:gpt-5") -> None:
    print(answer("Read README.md and say what this project does.", model))


if __name__ == "__main__":
    main()
