"""openai-agents + turnguard (docs/integrations.md quotes this file; the tests run it with the SDK's ScriptedModel)."""

from pathlib import Path

from agents import Agent, function_tool

import turnguard as tg
from turnguard.integrations.openai_agents import TurnGuardHalted, run_sync

guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))  # explicit cap: call 101 halts


@function_tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    return Path(path).read_text()  # a missing file raises: the SDK shows the model an error


def answer(prompt: str, model="gpt-5", **runner_options) -> str:
    agent = Agent(name="coder", model=model, tools=[read_file])
    try:  # the SDK's own max_turns (10) would end a long productive turn first
        return run_sync(guard, agent, prompt, max_turns=1000, **runner_options).final_output
    except TurnGuardHalted as stop:  # also an agents AgentsException and a tg.LoopDetected
        return f"stopped: {stop}"



def main(model="gpt-5") -> None:
    print(answer("Read README.md and say what this project does.", model))


if __name__ == "__main__":
    main()
