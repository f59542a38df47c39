"""How a session's turn ends in its stored state: one rule for every way a hook turn ends.

An agent's stop does not end the turn at once: another hook of the agent (a user's own ``Stop``
hook answering ``decision: "block"``) can refuse the stop, and the agent then goes on with the
same turn. So the stop is only noted (``stopped``: when, and how the agent said it ended), and the
turn ends later, with that time and reason, when something confirms it: the session's next prompt,
the session's end, or a later hook run finding the session stale (``stale``). An event of the same
turn before that takes the note back: the turn goes on, its counts and halts with it.

Ending writes the end into the turn's journal, hands the journal to the outbox (``export``), and
leaves the state with no turn: each agent turn is one turnguard turn, ended once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

MAX_EARLIER = 64
"""The ids of the session's ended turns kept: an event of one of them counts in the open turn."""
TRANSIENT = ("ask", "asked", "waiting", "remind", "answered", "stopped")
"""The state's fields that belong to the open turn only."""
ASKED = "asked"
"""The state's field for the questions asked at calls that ran beside a later call's check (Claude
Code checks a step's reads and searches at once): each open until its own call's outcome answers it."""
UNSEEN = "unseen"
"""A pending question's mark while the person has not seen it (another hook denied the call it was
asked at): the turn's end leaves it unanswered, where it answers a question they saw ``stop``."""
STOPPED = "stopped"
"""The state's field for a turn the agent stopped: ``[time_ns, reason]``."""


def note_stop(data: dict[str, Any], reason: str, at_ns: int | None = None) -> None:
    """The agent stopped the session's turn (``reason``: how it says it ended); the turn ends
    when the stop is confirmed (``end_turn``), or goes on (``went_on``)."""
    if data.get("turn") is not None:
        data[STOPPED] = [time.time_ns() if at_ns is None else at_ns, reason]


def went_on(data: dict[str, Any]) -> None:
    """An event of the stopped turn came: its stop was refused, the turn goes on."""
    data.pop(STOPPED, None)


def stop_of(data: dict[str, Any]) -> tuple[int, str] | None:
    """When and how the session's turn stopped, when it did (a note of another shape is none)."""
    stopped = data.get(STOPPED)
    if (isinstance(stopped, list) and len(stopped) == 2 and isinstance(stopped[0], int)
            and not isinstance(stopped[0], bool) and isinstance(stopped[1], str)):
        return stopped[0], stopped[1]
    return None


def last_event_ns(data: dict[str, Any]) -> int | None:
    """The time of the turn's last journal entry (its last event turnguard heard of)."""
    journal = data.get("journal") or []
    return journal[-1][1] if journal and isinstance(journal[-1], list) and len(journal[-1]) > 1 else None


def end_turn(data: dict[str, Any], agent: str, environ: Mapping[str, str], reason: str,
             at_ns: int | None = None) -> None:
    """End the session's turn: a stopped turn with its stop's time and reason, any other with
    ``reason`` at ``at_ns`` (now when ``None``). A question still pending is answered ``stop``
    (nobody went on with the call), the journal handed to the outbox, the turn's id kept among
    the session's earlier ones, and the open turn's fields dropped."""
    from turnguard.agents import export

    stopped = stop_of(data)
    if stopped is not None:
        at_ns, reason = stopped
    at = time.time_ns() if at_ns is None else at_ns
    ref = data.get("ref")
    if ref is not None:
        earlier = data.setdefault("earlier", [])
        if ref not in earlier:
            earlier.append(ref)
            del earlier[:-MAX_EARLIER]
    journal = data.get("journal") or []
    for ask in [*(data.get(ASKED) or ()), data.get("ask")]:
        if journal and ask is not None and not ask.get(UNSEEN):
            journal.append(["a", at, "stop", ask["at"]])
    if journal:
        journal.append(["e", at, reason])
        export.hand_over(agent, data, environ)
    data["turn"] = None
    data["journal"] = []
    for transient in TRANSIENT:
        data.pop(transient, None)
