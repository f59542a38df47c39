"""Pipes given as a configuration file or a ``calibrate merge`` input, in every way a user can give
one: a named pipe nobody writes, one whose writer writes and closes it, one whose writer never
closes it, and an unnamed pipe as the shell's ``<(cmd)`` passes it (``/dev/fd/N``, written and
closed). ``open`` of the first, and reading the third, would wait for ever; the reader waits
``turnguard._config.PIPE_WAIT_SECONDS`` at most. A run that hangs all the same fails on the
caller's subprocess timeout, not on a measured time."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PIPE_KINDS: dict[str, bool] = {
    "a named pipe with no writer": False,
    "a named pipe whose writer writes and closes it": True,
    "a named pipe whose writer never closes it": False,
    "an unnamed pipe as <(cmd) passes it": True,
}
"""Each way, and whether its content is read (else the run says the pipe gave no end of file)."""
SAYS_WHEN_NOT_READ = {
    "a named pipe with no writer": "a pipe nothing was written to within",
    "a named pipe whose writer never closes it": "a pipe whose writer did not close it within",
}
"""What the one line says about a pipe that was not read."""

@dataclass(frozen=True)
class GivenPipe:
    """The path to give (``--config``, ``TURNGUARD_CONFIG``, a merge input) and the descriptors the
    run must inherit for it (an unnamed pipe's read end)."""

    path: str
    pass_fds: tuple[int, ...] = ()


@contextlib.contextmanager
def given_pipe(kind: str, folder: Path, content: bytes, name: str = "config.pipe") -> Iterator[GivenPipe]:
    """A pipe of ``kind`` holding ``content`` (where it has a writer), for one run (a named one:
    ``folder / name``). The writer is a
    thread of this process, writing as soon as the run opens the pipe (a writer process might
    start later than the run's wait), released and joined after the run."""
    release = threading.Event()
    if kind == "an unnamed pipe as <(cmd) passes it":
        read_end, write_end = os.pipe()
        writer = _writer(write_end, content, None)
        try:
            yield GivenPipe(f"/dev/fd/{read_end}", (read_end,))
        finally:
            os.close(read_end)
            writer.join()
        return
    path = folder / name
    os.mkfifo(path)
    if kind == "a named pipe with no writer":
        yield GivenPipe(str(path))
        return
    hold = release if kind == "a named pipe whose writer never closes it" else None
    writer = _writer(path, content, hold)
    try:
        yield GivenPipe(str(path))
    finally:
        release.set()
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # (a writer the run never met waits in open)
        writer.join()


def _writer(target: Path | int, content: bytes, hold: threading.Event | None) -> threading.Thread:
    """A thread writing ``content`` into ``target`` (a named pipe, or a pipe's write end, closed
    after), and closing it at once or when ``hold`` is set."""

    def write() -> None:
        try:
            with open(target, "wb") as pipe:
                pipe.write(content)
                pipe.flush()
                if hold is not None:
                    hold.wait()
        except BrokenPipeError:  # (the run stopped reading)
            pass

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread
