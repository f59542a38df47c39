"""Every Python block in README.md and the docs pages runs as printed, each in a fresh process.

A block runs as a script in an empty temporary directory, with no ``TURNGUARD_*`` or ``OTEL_*``
variable of the test run's own and an OTLP receiver on loopback as the Collector a reader would
have. A block that cannot run here (say, it needs a real API key) is marked for the reader with a
paragraph right before it, exactly ``*Not run by the tests: <reason>.*``; it must still compile.
Anything that looks like a marker but is not exactly one, a marker with no Python block after it,
and a code fence without a language are errors, so a block cannot drop out of the tests unseen.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from turnguard.telemetry._receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
NOT_RUN = re.compile(r"\*Not run by the tests: (?P<reason>[^*\s][^*]*)\.\*")
NOT_RUNNABLE = re.compile(r"not\W+(run|runnable|executed)", re.I)
ITALIC = re.compile(r"([*_])(?![*_]).*(?<![*_])\1", re.S)
BLOCK_TIMEOUT_S = 120


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced Python block as a reader sees it (list indentation removed, as rendered)."""

    page: Path
    line: int
    source: str
    not_run: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path, text: str) -> tuple[list[Block], list[str]]:
    """The page's Python blocks and the markup problems that would let one escape the tests."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    blocks: list[Block] = []
    problems: list[str] = []
    for i, token in enumerate(tokens):
        where = f"{page.name}:{token.map[0] + 1}" if token.map else page.name
        if token.type == "inline" and tokens[i - 1].type == "paragraph_open":
            if NOT_RUN.fullmatch(token.content.strip()):
                following = tokens[i + 2] if i + 2 < len(tokens) else None
                if following is None or following.type != "fence" or language(following) != "python":
                    problems.append(f"{where}: the marker is not followed by a ```python block")
            elif looks_like_a_marker(token.content.strip()):
                problems.append(f"{where}: {token.content.strip()!r} looks like a not-run marker but is not "
                                "exactly '*Not run by the tests: <reason>.*'")
        elif token.type == "code_block" or (token.type == "fence" and not language(token)):
            problems.append(f"{where}: a code block without a language (write ```python, ```bash, ```text ...)")
        elif token.type == "fence" and language(token) != "python":
            if language(token).lower().startswith(("py", "ipy")):
                problems.append(f"{where}: ```{language(token)}: write ```python so the block runs in the tests")
        elif token.type == "fence":
            after_paragraph = tokens[i - 1].type == "paragraph_close"
            marker = NOT_RUN.fullmatch(tokens[i - 2].content.strip()) if after_paragraph else None
            reason = marker.group("reason") if marker else None
            if reason is not None:
                try:
                    compile(token.content, where, "exec")
                except SyntaxError as exc:
                    problems.append(f"{where}: a block marked not run does not compile: {exc}")
            blocks.append(Block(page, token.map[0] + 1, token.content, reason))
    return blocks, problems


def looks_like_a_marker(paragraph: str) -> bool:
    """An attempt at a marker: an italic line saying "not run", or a paragraph opening with it."""
    if ITALIC.fullmatch(paragraph) and NOT_RUNNABLE.search(paragraph):
        return True
    return NOT_RUNNABLE.match(paragraph.lstrip("*_ ")) is not None


def language(fence: Token) -> str:
    words = fence.info.split()
    return words[0] if words else ""


def all_blocks() -> tuple[list[Block], list[str]]:
    blocks: list[Block] = []
    problems: list[str] = []
    for page in PAGES:
        found, wrong = python_blocks(page, page.read_text(encoding="utf-8"))
        blocks += found
        problems += wrong
    return blocks, problems


BLOCKS, PROBLEMS = all_blocks()
RUNNABLE = [b for b in BLOCKS if b.not_run is None]


def block_environment(otlp_endpoint: str) -> dict[str, str]:
    """The test run's environment less its turnguard and OpenTelemetry settings, with a Collector."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNGUARD_", "OTEL_"))}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    return env


def run_block(source: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )


def failure(result: subprocess.CompletedProcess[str]) -> str | None:
    """Why a block's run failed, or ``None``: a non-zero exit, or a traceback on any thread."""
    if result.returncode != 0:
        return f"exit status {result.returncode}"
    if "Traceback (most recent call last)" in result.stderr:
        return "a traceback on stderr"
    return None


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def test_the_docs_mark_every_block_so_none_escapes_the_tests():
    assert PROBLEMS == []


def test_the_readme_and_every_docs_page_with_code_have_blocks_found():
    pages = {b.page.name for b in BLOCKS}
    assert {"README.md", "usage.md", "telemetry.md", "integrations.md", "stuck-signals.md"} <= pages


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_the_block_runs_as_printed(block: Block, tmp_path: Path, collector: OtlpReceiver):
    result = run_block(block.source, tmp_path, block_environment(collector.endpoint))
    why = failure(result)
    assert why is None, f"{block.name}: {why}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


# -- the collector itself: what counts as a block, a marker, a problem ------------------------------

def blocks_of(markdown: str) -> tuple[list[Block], list[str]]:
    return python_blocks(ROOT / "page.md", textwrap.dedent(markdown))


def test_blocks_inside_list_items_are_found_as_rendered():
    blocks, problems = blocks_of("""
        - a step:

          ```python
          x = 1
          ```
        """)
    assert problems == [] and [b.source for b in blocks] == ["x = 1\n"]


def test_a_marked_block_is_kept_with_its_reason_and_not_run():
    blocks, problems = blocks_of("""
        *Not run by the tests: it needs an OpenAI API key.*

        ```python
        client.call()
        ```
        """)
    assert problems == [] and [(b.not_run, b.line) for b in blocks] == [("it needs an OpenAI API key", 4)]


@pytest.mark.parametrize("marker", [
    "*Not run in the tests: needs a key.*",
    "*not run by the tests: needs a key.*",
    "*Not run by the tests: needs a key*",
    "*Not run by the tests.*",
    "*This block is not runnable here.*",
    "Not run by the tests: needs a key.",
])
def test_anything_short_of_the_exact_marker_is_a_problem(marker: str):
    blocks, problems = blocks_of(f"{marker}\n\n```python\nx = 1\n```\n")
    assert len(problems) == 1 and "marker" in problems[0]
    assert [b.not_run for b in blocks] == [None]  # the block still runs


@pytest.mark.parametrize("after", ["Some text.\n", "```bash\nls\n```\n", "## A heading\n", ""])
def test_a_marker_without_a_python_block_right_after_it_is_a_problem(after: str):
    _, problems = blocks_of(f"*Not run by the tests: needs a key.*\n\n{after}\n```python\nx = 1\n```\n"
                            if after else "*Not run by the tests: needs a key.*\n")
    assert any("not followed by a ```python block" in p for p in problems)


def test_a_marked_block_that_does_not_compile_is_a_problem():
    _, problems = blocks_of("*Not run by the tests: needs a key.*\n\n```python\ndef (:\n```\n")
    assert len(problems) == 1 and "does not compile" in problems[0]


@pytest.mark.parametrize("fence", ["```py\nx = 1\n```", "```python3\nx = 1\n```", "```\nx = 1\n```",
                                   "    x = 1"])
def test_a_python_block_the_tests_would_not_see_is_a_problem(fence: str):
    blocks, problems = blocks_of(f"Text.\n\n{fence}\n")
    assert blocks == [] and len(problems) == 1


@pytest.mark.parametrize(("source", "why"), [
    ("raise SystemExit(3)\n", "exit status 3"),
    ("assert 1 == 2\n", "exit status 1"),
    ("import threading\nt = threading.Thread(target=lambda: 1 / 0)\nt.start()\nt.join()\n", "a traceback on stderr"),
])
def test_a_block_that_fails_or_dies_on_a_thread_is_a_failure(source: str, why: str, tmp_path: Path):
    assert failure(run_block(source, tmp_path, dict(os.environ))) == why


def test_a_block_runs_in_its_own_directory_without_the_test_runs_settings(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TURNGUARD_SOFT_CAP", "7")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "leaked")
    source = ("import os, pathlib\nassert pathlib.Path.cwd() == pathlib.Path(__file__).parent\n"
              "assert not [k for k in os.environ if k.startswith(('TURNGUARD_', 'OTEL_SERVICE'))]\n")
    result = run_block(source, tmp_path, block_environment("http://127.0.0.1:1"))
    assert failure(result) is None, result.stderr


# -- the integrations page: its snippets are the example files the framework tests run -------------

INTEGRATIONS = ROOT / "docs" / "integrations.md"
EXAMPLE_REFERENCE = re.compile(r"\(`examples/(?P<file>[\w-]+\.py)`\)")


def integration_sections() -> dict[str, str]:
    """Each ``## `` section of the integrations page that names its example file, by that file."""
    sections = re.split(r"^(?=## )", INTEGRATIONS.read_text(encoding="utf-8"), flags=re.M)
    return {m.group("file"): section for section in sections if (m := EXAMPLE_REFERENCE.search(section))}


def test_every_example_file_is_shown_on_the_integrations_page_and_every_shown_one_exists():
    assert sorted(integration_sections()) == sorted(p.name for p in (ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize(("example", "section"), integration_sections().items())
def test_an_integration_snippet_is_the_tail_of_the_example_file_its_framework_test_runs(example, section):
    snippets = [b.source for b in python_blocks(INTEGRATIONS, section)[0]]
    source = (ROOT / "examples" / example).read_text(encoding="utf-8")
    assert len(snippets) == 1, f"the section showing examples/{example} has {len(snippets)} Python blocks"
    assert source.endswith(snippets[0]), f"the snippet differs from examples/{example}"
    assert len(snippets[0].splitlines()) >= 10
