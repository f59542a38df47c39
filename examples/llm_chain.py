"""simonw's llm + turnguard: the README's snippet (the tests run it with a scripted model plugin)."""

import llm

import turnguard as tg
from turnguard.integrations.llm_plugin import TurnGuardHalted, chain

guard = tg.Guard(tg.GuardConfig())


def read_file(path: str) -> str:
    """Read a file of the project."""
    raise FileNotFoundError(path)


def answer(prompt: str, model_id="gpt-5") -> str:
    try:
        return chain(guard, llm.get_model(model_id), prompt, tools=[read_file]).text()
    except TurnGuardHalted as stop:  # a tg.LoopDetected
        return f"stopped: {stop}"
