"""simonw's llm + turnguard (docs/integrations.md quotes this file; the tests run it with a scripted model plugin)."""

from pathlib import Path

import llm

import turnguard as tg
from turnguard.integrations.llm_plugin import TurnGuardHalted, chain

guard = tg.Guard(tg.GuardConfig())


def read_file(path: str) -> str:
    """Read a file of the project."""
    return Path(path).read_text()  # a missing file raises: llm shows the model the error


def answer(prompt: str, model_id="gpt-5") -> str:
    try:  # turnguard's chain() lifts llm's chain_limit (10 tool rounds): turnguard is the bound
        return chain(guard, llm.get_model(model_id), prompt, tools=[read_file]).text()
    except TurnGuardHalted as stop:  # a tg.LoopDetected
        return f"stopped: {stop}"



def main(model_id="gpt-5") -> None:
    print(answer("Read README.md and say what this project does.", model_id))


if __name__ == "__main__":
    main()
