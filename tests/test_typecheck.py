"""tools/typecheck.py, the type check ``./dev.sh lint`` runs (mypy over src/ and the docs' blocks):
every block is checked, and an error in one is named by its page and line."""

from __future__ import annotations

import shutil
from pathlib import Path

import typecheck
from test_docs_examples import BLOCKS, Block

ROOT = Path(__file__).resolve().parent.parent


def test_every_block_of_every_page_gets_a_module_of_its_own():
    names = [typecheck.module_name(block) for block in BLOCKS]
    assert len(set(names)) == len(BLOCKS) > 0
    assert all(name.isidentifier() for name in names)


def test_a_type_error_in_a_block_is_named_by_its_page_and_line(tmp_path):
    wrong = Block(ROOT / "docs" / "page.md", 10, "import os\n\nlimit: int = os.getcwd()\n")
    right = Block(ROOT / "README.md", 3, "import os\n\nhere: str = os.getcwd()\n")
    status, out, _ = typecheck.check([wrong, right], [], ["--cache-dir", str(tmp_path / "cache")], tmp_path / "blocks")
    assert status == 1
    (error,) = [line for line in out.splitlines() if ": error:" in line]
    assert error.startswith("docs/page.md:13: error: Incompatible types in assignment") and "[assignment]" in error
    assert "README.md" not in out and str(tmp_path) not in out


def test_blocks_in_the_repository_are_named_by_page_too(tmp_path):
    """mypy names a file under its working directory relative to it (the default place is there)."""
    block = Block(ROOT / "docs" / "page.md", 10, "import os\n\nlimit: int = os.getcwd()\n")
    directory = ROOT / ".mypy_cache" / f"test-blocks-{tmp_path.name}"
    try:
        status, out, _ = typecheck.check([block], [], ["--cache-dir", str(tmp_path / "cache")], directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert status == 1 and out.startswith("docs/page.md:13: error:") and ".mypy_cache" not in out


def test_blocks_without_errors_pass(tmp_path):
    block = Block(ROOT / "README.md", 3, "import os\n\nhere: str = os.getcwd()\n")
    status, out, _ = typecheck.check([block], [], ["--cache-dir", str(tmp_path / "cache")], tmp_path / "blocks")
    assert status == 0 and "Success" in out


def test_a_warm_cache_still_names_the_page_and_line(tmp_path):
    """mypy replays a cached module's errors at the path it had: the blocks' place must not move."""
    options = ["--cache-dir", str(tmp_path / "cache")]
    block = Block(ROOT / "docs" / "page.md", 10, "import os\n\nlimit: int = os.getcwd()\n")
    for _ in range(2):
        status, out, _ = typecheck.check([block], [], options, tmp_path / "blocks")
        assert status == 1 and out.startswith("docs/page.md:13: error:") and str(tmp_path) not in out


def test_lint_and_ci_run_the_type_check():
    """The gate is ``./dev.sh lint`` (CI's first step), not a test: mypy's first run takes minutes."""
    lint = [line for line in (ROOT / "dev.sh").read_text().splitlines() if line.strip().startswith("lint)")]
    assert len(lint) == 1 and "ruff\" check;" in lint[0] and lint[0].rstrip().endswith("tools/typecheck.py ;;")
    assert "./dev.sh lint" in (ROOT / ".ci" / "run").read_text().splitlines()
