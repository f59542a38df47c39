"""LangChain + turnguard (docs/integrations.md quotes this file; the tests run it with a fake chat model)."""

from pathlib import Path

from langchain.agents import create_agent
from langchain_core.tools import ToolException, tool

import turnguard as tg
from turnguard.integrations.langchain import TurnGuardHalted, TurnGuardMiddleware

guard = tg.Guard(tg.GuardConfig())


@tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    if not Path(path).is_file():
        raise ToolException(f"{path}: no such file")
    return Path(path).read_text()


read_file.handle_tool_error = True  # the model sees the failure as an error ToolMessage


def answer(prompt: str, model="openai:gpt-5") -> str:
    middleware = TurnGuardMiddleware(guard)
    agent = middleware.watch(create_agent(model, tools=[read_file], middleware=[middleware]))
    try:  # LangGraph's own recursion_limit (25 steps) would end a long productive turn first
        state = agent.invoke({"messages": [{"role": "user", "content": prompt}]}, {"recursion_limit": 1000})
    except TurnGuardHalted as stop:  # a tg.LoopDetected
        return f"stopped: {stop}"
    return state["messages"][-1].content



def main(model="openai:gpt-5") -> None:
    print(answer("Read README.md and say what this project does.", model))


if __name__ == "__main__":
    main()
