"""The probe cohort: a deterministic fraction of turns guarded by a more lenient configuration.

A threshold is validated by what happens past it, and every turn that reaches it is stopped
there; so ``GuardConfig(probe=Probe(0.01, lenient))`` (``Probe`` is in ``turnguard._config``)
lets one turn in a hundred run under
``lenient`` (e.g. ``hard_multiplier=20``), with the main configuration beside it as a shadow, so
that its would-be detections are recorded where they would have fired while the turn goes on.

Sampling hashes the conversation id, else the turn id (BLAKE2b: the same answer in every
process and on every run), so a conversation stays in one cohort and the cost is one hash per
turn, nothing per call. A string or an integer id is hashed as its text (``12345`` and
``"12345"`` land in one cohort); an id of any other type (``None``, a UUID object, ...) leaves
the choice to the turn id.
"""

from __future__ import annotations

import enum
import hashlib

from turnguard._model import PLUGIN_ERROR_THRESHOLD, Threshold, id_text


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


sample_text = id_text
"""The text an id is sampled on (``turnguard._model.id_text``): ``None`` for an id that has none."""


def selects(rate: float, conversation_id: object, turn_id: object) -> bool:
    """Whether a turn is in the probe cohort at ``rate``: by its conversation's id (so a
    conversation stays in one cohort), else by its turn id (``sample_text`` says which ids count);
    a turn with neither is live."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    key = sample_text(conversation_id)
    if key is None:
        key = sample_text(turn_id)
    return key is not None and sample_point(key) < rate


COHORTS: tuple[str, ...] = tuple(c.value for c in Cohort)


def sees_past(main: int | None, own: int | None) -> bool:
    """Whether probe turns can be seen past the main configuration's limit ``main`` (falsy: none)
    when the probe's own limit of the same threshold is ``own`` (``None``: it has none): not when its
    own is no higher, where it halts them first. A threshold's probe evidence there is never "within"
    the tolerance, whatever its counts say (calibrate's ``advice.row_cap``, the threshold board's
    ``CapSettings.probe_stops_at``)."""
    return own is None or not main or own > main


LOOP_DETECTORS: tuple[str, ...] = (Threshold.SOFT_STUCK.value, Threshold.STREAK.value)
"""The probe's own halts that say a turn was looping: a failure only where the probe ran that detector
at ``SEEN_LOOPING`` times the main configuration's value or more, else ``cut`` (fate unknown)."""
SEEN_LOOPING = 2
"""A probe that halts at less than twice the main's D or streak stop halts turns that may need no
more than that to succeed (a retry that succeeds after 15 failures, halted by the probe's stop at 13
or at the main's 8), so its fate past the halt is unknown."""
CENSORING_HALTS: tuple[str, ...] = (*(t.value for t in Threshold if t.value not in LOOP_DETECTORS),
                                    PLUGIN_ERROR_THRESHOLD)
"""The probe's own halts that cut short a turn that might have gone on to succeed: a probe turn one of
them halted, with no result saying it succeeded, is censored there. The one list calibrate's
``ProbeEvidence.fate_of`` and the threshold board's selectors (``_boards.evidence.ProbeHalts``) both
read. A third-party threshold is not in it: a recording cannot tell its name from a host's own end
reason (the recorder's ``ended_by``), so both count such a turn by its result."""


def judged(value: int, live: int | None, unit: int = 1) -> bool:
    """Whether a threshold's probe frontier judges and shows ``value`` (its ladder's steps are ``unit``
    apart): above the first step (D = 1, a backstop of 1x, a cap of one step is no loop guard to move
    to), or the live value, which the operator runs and may keep. The one rule calibrate's
    ``Frontier.settable`` and the threshold board's frontier rows (panels 41 and 50) both read."""
    return value > unit or value == live
