"""The repository's git hooks (``.githooks/``) and their installation by ``./dev.sh``: a commit whose
subject is longer than 72 characters is refused, with the subject shown cut at the limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / ".githooks" / "commit-msg"
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="needs git")


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run([sys.executable, str(HOOK), str(path)], capture_output=True, text=True, timeout=60)


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run([GIT or "git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                          cwd=repo, capture_output=True, text=True, timeout=60, env=env, check=check)


@pytest.mark.parametrize("message", [
    "x" * 72,
    "é" * 72 + "\n\nThe body may be as long as it needs: " + "y" * 200,
    "# Please enter the commit message\n\n" + "z" * 72 + "\n",
    "Merge branch 'wt-" + "m" * 80 + "'",
    'Revert "' + "r" * 80 + '"',
    "fixup! " + "f" * 80,
], ids=["72", "72-non-ascii-long-body", "comments-first", "merge", "revert", "fixup"])
def test_a_subject_within_72_characters_or_written_by_git_passes(tmp_path, message):
    result = run_hook(tmp_path, message)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("message", ["x" * 73, "\n\n" + "Add " + "w" * 69 + "\n\nbody"],
                         ids=["73", "blank-lines-first"])
def test_a_subject_over_72_characters_is_refused_and_cut_at_the_limit(tmp_path, message):
    result = run_hook(tmp_path, message)
    subject = message.strip().splitlines()[0]
    assert result.returncode == 1
    assert "the subject is 73 characters; at most 72" in result.stderr
    assert f"{subject[:72]}|{subject[72:]}" in result.stderr
    assert str(tmp_path / "COMMIT_EDITMSG") in result.stderr


@needs_git
def test_git_runs_the_hook_from_the_repository(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "core.hooksPath", str(HOOK.parent))
    refused = git(tmp_path, "commit", "-q", "--allow-empty", "-m", "a" * 73, check=False)
    assert refused.returncode != 0 and "at most 72" in refused.stderr
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "a" * 72)
    assert git(tmp_path, "log", "--format=%s").stdout.split() == ["a" * 72]


@needs_git
@pytest.mark.parametrize("before, after", [(None, ".githooks"), (".githooks", ".githooks"), ("mine", "mine")],
                         ids=["unset", "ours", "another-kept"])
def test_any_dev_sh_command_installs_the_hooks_unless_another_path_is_set(tmp_path, before, after):
    shutil.copy(ROOT / "dev.sh", tmp_path / "dev.sh")
    git(tmp_path, "init", "-q")
    if before:
        git(tmp_path, "config", "core.hooksPath", before)
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    help_ = subprocess.run(["bash", str(tmp_path / "dev.sh"), "help"], capture_output=True, text=True, timeout=60,
                           env=env)
    assert help_.returncode == 2 and "./dev.sh lint" in help_.stdout
    assert git(tmp_path, "config", "--get", "core.hooksPath").stdout.strip() == after
    assert ("not replaced" in help_.stderr) == (before == "mine")
