"""The processes above a hook: which agent process started it, read from ``/proc`` (Linux).

An agent's hook events say nothing of the process that sent them, but the hook is that process's
child (through a shell, and turnguard's own client): its ancestors tell, for instance, whether a
Gemini CLI run is headless (one prompt per process). Where ``/proc`` cannot be read (another
system, a process gone) nothing is found, and the caller keeps to what the events alone say.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

MAX_ANCESTORS = 6
"""How far up a hook's ancestors are searched: the agent is its parent or grandparent (a shell
between them), one or two more with turnguard's client and its fallback process between."""


@dataclass(frozen=True, slots=True)
class Process:
    """One running process, as ``/proc`` shows it. ``started`` is when it started (clock ticks
    after boot): with ``pid``, it names the process even once its pid is reused."""

    pid: int
    parent: int
    started: int
    argv: tuple[str, ...]

    @property
    def identity(self) -> str:
        return f"{self.pid}:{self.started}"


def read_process(pid: int) -> Process | None:
    """The process ``pid``, or ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read().decode("utf-8", "surrogateescape")
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
            cmdline = cmdline_file.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # (after the name, which may hold spaces and parentheses)
    try:
        parent, started = int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
    argv = tuple(part.decode("utf-8", "surrogateescape") for part in cmdline.split(b"\0")[:-1])
    return Process(pid, parent, started, argv)


def ancestors(pid: int, limit: int = MAX_ANCESTORS) -> Iterator[Process]:
    """The parents of ``pid``, nearest first, at most ``limit`` of them."""
    current = read_process(pid)
    for _ in range(limit):
        if current is None or current.parent <= 1:
            return
        current = read_process(current.parent)
        if current is not None:
            yield current
