"""Turns no event will end: handed to the outbox by a later hook run of any session on the machine.

A run killed in the middle of a turn (a CI time limit, SIGKILL to the agent) never sends the
turn's stop or its session's end, and a stopped turn waits for the event that confirms the stop
(``ending``), which an idle session may never send. So every hook run, at most once every
``SWEEP_EVERY_S`` (a marker file's time says when the last sweep began), looks through the
sessions of every agent and ends the turn of each session untouched for long enough:

- a stopped turn after ``STOPPED_STALE_S``, with its stop's time and reason: a refused stop's
  next event comes within one model request;
- an open turn after ``OPEN_STALE_S``, as ``abandoned`` (a reason the boards and ``turnguard
  calibrate`` censor) at the time of its last event: a tool call may run for hours.

A session whose lock is held is in use, not stale. Never raises for a session it cannot end (a
damaged file, a full disk): that session's turn stays, and ``SessionStore.clean`` keeps a file that
holds a turn, so no turn is deleted unexported.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

from turnguard.agents.ending import end_turn, last_event_ns, stop_of
from turnguard.agents.store import SessionStore, StoreError, state_root

STOPPED_STALE_S = 30 * 60
OPEN_STALE_S = 24 * 3600
SWEEP_EVERY_S = 60.0
ABANDONED = "abandoned"
AGENTS = ("claude-code", "codex", "gemini")
"""The agents whose sessions are swept (``hook.PROTOCOLS``' names: their folders under ``hooks/``)."""
MARKER = "swept"


def sweep(environ: Mapping[str, str], now: float | None = None, *, force: bool = False) -> int:
    """End the turns of the stale sessions of every agent (see the module); returns how many.
    Without ``force``, does nothing when a sweep began less than ``SWEEP_EVERY_S`` ago."""
    root = state_root(dict(environ))
    now = time.time() if now is None else now
    if not force and not _due(root / "hooks" / MARKER, now):
        return 0
    ended = 0
    for agent in AGENTS:
        store = SessionStore(root, agent)
        for name in store.session_names():
            with contextlib.suppress(Exception):  # (one session's trouble is not the sweep's)
                ended += _end_if_stale(store, agent, name, environ, now)
    return ended


def _due(marker: Any, now: float) -> bool:
    """Whether a sweep is due, and if so the marker says it began now. A marker from the future
    (the clock was set back since) is no recent sweep: it would hold every sweep off as long."""
    try:
        if 0 <= now - marker.stat().st_mtime < SWEEP_EVERY_S:
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600))
        os.utime(marker, (now, now))
    except OSError:
        return False
    return True


def _end_if_stale(store: SessionStore, agent: str, name: str, environ: Mapping[str, str], now: float) -> int:
    path = store.directory / f"{name}.json"
    if now - path.stat().st_mtime < STOPPED_STALE_S:
        return 0
    try:
        with store.locked_file(name, timeout_s=0) as session:
            age = now - path.stat().st_mtime  # (again, under the lock)
            data = session.data
            bound = OPEN_STALE_S if stop_of(data) is None else STOPPED_STALE_S
            if data.get("turn") is None or age < bound:
                return 0
            end_turn(data, agent, environ, ABANDONED, last_event_ns(data))
            session.save()
            return 1
    except StoreError:
        return 0  # in use (or unreadable: set aside by the next event of its own)
