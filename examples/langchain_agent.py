"""LangChain + turnguard: the README's snippet (the tests run it with a fake chat model)."""

from langchain.agents import create_agent
from langchain_core.tools import ToolException, tool

import turnguard as tg
from turnguard.integrations.langchain import TurnGuardHalted, TurnGuardMiddleware

guard = tg.Guard(tg.GuardConfig())


@tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    raise ToolException(f"{path}: no such file")


read_file.handle_tool_error = True  # the model sees the failure as an error ToolMessage


def answer(prompt: str, model="openai:gpt-5") -> str:
    agent = create_agent(model, tools=[read_file], middleware=[TurnGuardMiddleware(guard)])
    try:
        state = agent.invoke({"messages": [{"role": "user", "content": prompt}]}, {"recursion_limit": 1000})
    except TurnGuardHalted as stop:  # a tg.LoopDetected
        return f"stopped: {stop}"
    return state["messages"][-1].content
