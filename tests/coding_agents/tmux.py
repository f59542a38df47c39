"""An interactive CLI in a terminal of its own: a tmux session on a private tmux server.

The test reads the screen (``capture-pane``) and types keys, as a person would. Nothing waits a
fixed time: ``wait_for`` polls the screen until what the test expects is there, up to a generous
deadline, and says what the screen showed when it is not."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

DEADLINE_S = 240.0
"""How long a step may take on a loaded machine before the test fails (never an assertion on speed)."""


def require() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing under CI, where ./dev.sh test installs it")
        pytest.skip("tmux is not installed")
    return tmux


class Terminal:
    """``argv`` running in a ``width`` x ``height`` terminal in ``cwd`` with exactly ``env``."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: dict[str, str], socket: Path,
                 width: int = 200, height: int = 50) -> None:
        self.tmux = [require(), "-S", str(socket)]
        self.target = "agent"
        subprocess.run([*self.tmux, "-f", "/dev/null", "new-session", "-d", "-s", self.target, "-x", str(width),
                        "-y", str(height), "-c", str(cwd), *argv], env=env, check=True, timeout=60)

    def screen(self) -> str:
        done = subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.target], capture_output=True, text=True,
                              timeout=60, check=False)
        return done.stdout

    def type(self, text: str) -> None:
        """Keys as text (no key names), then waits until the screen shows them."""
        subprocess.run([*self.tmux, "send-keys", "-t", self.target, "-l", text], check=True, timeout=60)
        self.wait_for(lambda screen: text in screen, f"the typed text {text!r}")

    def press(self, key: str) -> None:
        """One key by tmux's name (``Enter``, ``Escape``, ``2``)."""
        subprocess.run([*self.tmux, "send-keys", "-t", self.target, key], check=True, timeout=60)

    def wait_for(self, condition: Callable[[str], bool], what: str, deadline_s: float = DEADLINE_S) -> str:
        """The screen once ``condition`` holds for it; fails with the last screen after ``deadline_s``."""
        deadline = time.monotonic() + deadline_s
        while True:
            screen = self.screen()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} on the screen in {deadline_s:g} s; it shows:\n{screen}")
            time.sleep(0.3)

    def close(self) -> None:
        """Ends this private tmux server and what runs in it."""
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, timeout=60, check=False)
