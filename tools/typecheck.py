"""Type-check the package and every Python block of README.md and docs/*.md with mypy.

``./dev.sh lint`` runs it (so does CI). The blocks are the ones tests/test_docs_examples.py runs,
found by its own code; each is written to a module of its own, and mypy's messages about a block
name the page and line a reader sees. mypy's settings are in pyproject.toml ([tool.mypy]).

    python tools/typecheck.py [mypy options...]

Exits with mypy's status: 0 when it reports no error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_docs_examples import BLOCKS, Block  # noqa: E402  (the tests' own block finder)

PACKAGE = ROOT / "src" / "turnguard"
BLOCKS_DIR = ROOT / ".mypy_cache" / "docs-blocks"
"""Where the blocks are written as modules (beside mypy's default cache; git ignores both)."""


def module_name(block: Block) -> str:
    """A module name of its own for the block: its page's path and its line."""
    page = block.page.relative_to(ROOT).as_posix()
    return re.sub(r"\W", "_", page).lower() + f"_{block.line}"


def readers_lines(output: str, directory: Path, written: dict[str, Block]) -> str:
    """mypy's output with each block's file and line replaced by the page's (the fence's line + n)."""
    places = [str(directory)]  # mypy names a file under its working directory (ROOT) relative to it
    if directory.is_relative_to(ROOT):
        places.append(directory.relative_to(ROOT).as_posix())
    where = "|".join(re.escape(place + "/") for place in places)
    pattern = re.compile(rf"^(?:{where})(?P<file>[^:]+):(?P<line>\d+):", re.M)

    def page_line(match: re.Match[str]) -> str:
        block = written[match["file"]]
        return f"{block.page.relative_to(ROOT).as_posix()}:{block.line + int(match['line'])}:"

    return pattern.sub(page_line, output)


def check(blocks: Sequence[Block], paths: Sequence[Path], options: Sequence[str] = (),
          directory: Path = BLOCKS_DIR) -> tuple[int, str, str]:
    """mypy over ``paths`` and ``blocks`` with the project's settings: (exit status, stdout, stderr),
    the blocks' lines named as on their pages. The blocks are written to ``directory``, emptied
    first; it stays the same from run to run, because mypy's cache is by path (a cached module
    in a new place would report its errors at the old one)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    directory = directory.resolve()
    written = {module_name(block) + ".py": block for block in blocks}
    for name, block in written.items():
        (directory / name).write_text(block.source, encoding="utf-8")
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *options,
               *map(str, paths), *(str(directory / name) for name in sorted(written))]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    return result.returncode, readers_lines(result.stdout, directory, written), result.stderr


def main(options: list[str]) -> int:
    status, out, err = check(BLOCKS, [PACKAGE], options)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
