"""How the ledger's facts are written into a turn's snapshot and read back: the helpers the
fact classes (``ledger._calls``, ``ledger._streaks``, ``ledger._polled``, ``ledger._cycles``) share,
each field checked as it is read (``turnguard._state``)."""

from __future__ import annotations

import operator
from typing import Any

from turnguard import _state as st
from turnguard._keys import DIGEST_SIZE
from turnguard._model import Level, Outcome
from turnguard._state import Fields

MAX_AWAITING = 4096
"""Checked calls a turn waits for an outcome of: once more than twice this many wait, the oldest
this many are given up (``overdue``): their streak goes on as if they had been denied, and a late
outcome for one is ignored."""
GIVE_UP_AFTER = 2 * MAX_AWAITING
"""Checks after its own past which a call still waiting is given up (``overdue``)."""
GIVE_UP_EVERY = 1024
"""Checks between two looks at the calls still waiting (each ``GIVE_UP_EVERY``-th check)."""
MAX_POLLED = GIVE_UP_AFTER + GIVE_UP_EVERY
"""Calls a ledger keeps waiting for their outcome, in a stateful tool's repeats and in the cycle
runs (the calls a live turn waits for); past it, in the repeats, the oldest counts without a result."""


def overdue(waiting: list[int], checks: int) -> int:
    """How many of the oldest calls still waiting (``waiting``: their check numbers, oldest first)
    a turn gives up at check ``checks`` (one of each ``GIVE_UP_EVERY``): the oldest
    ``MAX_AWAITING`` when more than ``GIVE_UP_AFTER`` wait, and every one ``GIVE_UP_AFTER``
    checks old. So one lost outcome cannot hold its streak's later outcomes, and their memory,
    for good; the live turn (``Turn``) and calibrate's replay give up the same calls."""
    old = checks - GIVE_UP_AFTER
    shed = MAX_AWAITING if len(waiting) > GIVE_UP_AFTER else 0
    while shed < len(waiting) and waiting[shed] <= old:
        shed += 1
    return shed


WAIT_BEHIND = 32
"""How far behind its turn's checks a call's outcome is waited for where waiting holds later calls
back (the cycle runs, in check order) or leaves the call uncounted (a stateful tool's repeat, keyed
with its result): once the check this many after it has come (the cycle runs: has its outcome),
the call counts as it stands (as having run; its repeat without a result). So one lost outcome (a
call never reported, a subagent's call that outlasts its own calls) costs at most this many calls;
a batch of fewer calls settles exactly as one at a time."""


def fact(attr: str, doc: str | None = None) -> Any:
    """A read-only fact: a property whose getter is ``operator.attrgetter(attr)`` (C-level; the
    policies read these on every call)."""
    return property(operator.attrgetter(attr), doc=doc)


def hex_or_none(digest: bytes | None) -> str | None:
    return digest.hex() if digest is not None else None


def early_state(early: dict[int, Outcome]) -> dict[str, str]:
    return {str(seq): outcome.value for seq, outcome in early.items()}


def key_size(text: Any) -> int:
    """The size of a counted key written as hex: a call's digest, or a (call, result) pair's two."""
    return 2 * DIGEST_SIZE if isinstance(text, str) and len(text) == 4 * DIGEST_SIZE else DIGEST_SIZE


def digest_counts(f: Fields, name: str, limit: int, most: int, *, pairs: bool = False) -> dict[bytes, int]:
    """A table of digests (hex) to counts from 1 to ``most``, at most ``limit`` of them (``pairs``:
    a key may be a (call, result) pair's two digests)."""
    path = f.at(name)
    return {st.digest(f"{path}.{key}", key, key_size(key) if pairs else DIGEST_SIZE):
            st.integer(f"{path}.{key}", n, 1, most) for key, n in f.mapping(name, limit).items()}


def check_number(path: str, key: str, low: int, high: int) -> int:
    seq = int(key) if key.isdigit() and key == str(int(key)) else -1
    if not low <= seq <= high:
        st.refuse(path, f"keyed by a check number from {low} to {high}", key)
    return seq


def results_state(results: dict[int, bytes]) -> dict[str, str]:
    return {str(seq): digest.hex() for seq, digest in results.items()}


def result_digests(f: Fields, name: str, low: int, high: int) -> dict[int, bytes]:
    """Result digests waiting to settle, by check number from ``low`` to ``high`` (absent: none)."""
    path = f.at(name)
    return {check_number(f"{path}.{key}", key, low, high): st.digest(f"{path}.{key}", value, DIGEST_SIZE)
            for key, value in f.mapping(name, max(high - low + 1, 0), default={}).items()}


def early_outcomes(f: Fields, name: str, low: int, high: int) -> dict[int, Outcome]:
    """Outcomes waiting for an earlier call's, by check number (written as decimal text) from
    ``low`` to ``high``."""
    path = f.at(name)
    early = {}
    for key, value in f.mapping(name, max(high - low + 1, 0)).items():
        seq = int(key) if key.isdigit() and key == str(int(key)) else -1
        if not low <= seq <= high:
            st.refuse(f"{path}.{key}", f"keyed by a check number from {low} to {high}", key)
        early[seq] = Outcome(st.choice(f"{path}.{key}", value, OUTCOME_VALUES))
    return early


OUTCOME_VALUES = tuple(o.value for o in Outcome)


def fired_pair(path: str, pair: Any) -> tuple[str, str]:
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        st.refuse(path, "a [threshold, level] pair", pair)
    return st.text(path, pair[0], nonempty=True), st.choice(path, pair[1], tuple(level.value for level in Level))

