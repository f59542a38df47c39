"""openai-agents + turnguard: the README's snippet (the tests run it with the SDK's ScriptedModel)."""

from agents import Agent, function_tool

import turnguard as tg
from turnguard.integrations.openai_agents import TurnGuardHalted, run_sync

guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))  # explicit cap: call 101 halts


@function_tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    raise FileNotFoundError(path)


def answer(prompt: str, model="gpt-5", **runner_options) -> str:
    agent = Agent(name="coder", model=model, tools=[read_file])
    try:
        return run_sync(guard, agent, prompt, max_turns=1000, **runner_options).final_output
    except TurnGuardHalted as stop:  # also an agents AgentsException and a tg.LoopDetected
        return f"stopped: {stop}"
