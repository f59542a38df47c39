"""Google ADK + turnguard (docs/integrations.md quotes this file; the tests run it with a scripted BaseLlm)."""

import asyncio
from pathlib import Path

from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.apps import App
from google.adk.runners import InMemoryRunner
from google.genai import types

import turnguard as tg
from turnguard.integrations.google_adk import TurnGuardPlugin

guard = tg.Guard(tg.GuardConfig())


def read_file(path: str) -> dict:
    """Read a file of the project."""
    if not Path(path).is_file():
        return {"error": f"{path}: no such file"}  # ADK's convention for a failed call
    return {"content": Path(path).read_text()}


async def answer(prompt: str, model="gemini-2.5-flash") -> str:
    agent = LlmAgent(name="coder", model=model, tools=[read_file])
    runner = InMemoryRunner(app=App(name="coding", root_agent=agent, plugins=[TurnGuardPlugin(guard)]))
    session = await runner.session_service.create_session(app_name="coding", user_id="me")
    message = types.Content(role="user", parts=[types.Part(text=prompt)])
    limits = RunConfig(max_llm_calls=1000)  # ADK's own budget (500 model calls) would end a long turn first
    text = ""
    async for event in runner.run_async(user_id="me", session_id=session.id, new_message=message, run_config=limits):
        if event.is_final_response() and event.content and event.content.parts:
            text = event.content.parts[0].text or ""  # turnguard's halt is a final text naming the threshold
    return text



def main(model="gemini-2.5-flash") -> None:
    print(asyncio.run(answer("Read README.md and say what this project does.", model)))


if __name__ == "__main__":
    main()
