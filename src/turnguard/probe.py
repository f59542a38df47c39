"""The probe cohort: a deterministic fraction of turns guarded by a more lenient configuration.

A threshold is validated by what happens past it, and every turn that reaches it is stopped
there; so ``GuardConfig(probe=Probe(0.01, lenient))`` (``Probe`` is in ``turnguard.config``)
lets one turn in a hundred run under
``lenient`` (e.g. ``hard_multiplier=20``), with the main configuration beside it as a shadow, so
that its would-be detections are recorded where they would have fired while the turn goes on.

Sampling hashes the conversation id, else the turn id (BLAKE2b: the same answer in every
process and on every run), so a conversation stays in one cohort and the cost is one hash per
turn, nothing per call.
"""

from __future__ import annotations

import enum
import hashlib


class Cohort(enum.StrEnum):
    """Which configuration guarded a turn live (``TurnSummary.cohort``, ``turnguard.turn.cohort``)."""

    LIVE = "live"
    PROBE = "probe"


_SCALE = float(1 << 64)


def sample_point(key: str) -> float:
    """Where ``key`` falls in [0, 1): the same for the same key in every process."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") / _SCALE


_PERSON = b"turnguard-probe"


def selects(rate: float, conversation_id: str | None, turn_id: str) -> bool:
    """Whether a turn is in the probe cohort at ``rate`` (by its conversation, so a conversation
    stays in one cohort)."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    return sample_point(conversation_id if conversation_id is not None else turn_id) < rate


COHORTS: tuple[str, ...] = tuple(c.value for c in Cohort)
