"""The README's integrations snippets are the example files the framework tests run, verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "pydantic-ai": "pydantic_ai_agent.py",
    "openai-agents": "openai_agents_agent.py",
    "LangChain": "langchain_agent.py",
    "simonw's llm": "llm_chain.py",
}


def integrations_section() -> str:
    text = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- section:integrations -->(.*?)<!-- /section:integrations -->", text, re.S)
    assert match, "docs/integrations.md has no integrations section"
    return match.group(1)


@pytest.mark.parametrize(("framework", "example"), EXAMPLES.items())
def test_readme_snippet_is_the_tested_example_file(framework: str, example: str):
    section = integrations_section()
    heading = section.index(f"## {framework}\n")
    snippet = re.search(r"```python\n(.*?)\n```", section[heading:], re.S).group(1)
    source = (ROOT / "examples" / example).read_text(encoding="utf-8")
    assert f"(`examples/{example}`)" in section[heading : heading + 400]
    assert source.rstrip("\n").endswith(snippet), f"README snippet for {framework} differs from examples/{example}"
    assert len(snippet.splitlines()) >= 10
