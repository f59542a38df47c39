"""When a policy can fire on a turn whose calls are known in advance (a recorded turn).

Calibration replays recorded turns under many policies; most of them cannot fire on most turns,
and many behave alike. Each policy module says, next to its hooks, what its hooks can do on a
turn given the turn's ``TurnFacts`` (``firing_rule(config)``), so calibrate states no rule of its
own: it only combines what the policies say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

NEVER = math.inf
"""A trigger no turn reaches."""


@dataclass(frozen=True, slots=True)
class TurnFacts:
    """Upper bounds of the ledger's counts over one turn under one key mode, and the first call
    (1-based) at which each bound reaches each value: ``reach_repeat[r - 1]`` is the first call at
    which some key has been seen ``r`` times, and so on."""

    calls: int
    cycles: int
    reach_repeat: tuple[int, ...]
    """By repeat count: the first call at which one key occurs that many times."""
    reach_run: tuple[int, ...]
    """By run length: the first call ending a run of that many consecutive identical keys."""
    reach_failing: tuple[int, ...]
    """By count: the first call ending a run holding that many ``ERROR`` outcomes (an upper bound of
    the failing streak, which also resets on ``OK``/``UNKNOWN``)."""
    cycle_calls: tuple[int, ...]
    """By model request number: the call it begins before (``calls + 1``: after the last call)."""
    distinct: int = 0
    """Distinct keys in the turn: at most ``max_tracked_keys`` means the ledger's counts are exact."""
    reach_stale: tuple[int, ...] | None = None
    """By count: the first call at which the ``stale_repeat`` signal's count (``Ledger.max_stale_repeat``,
    read from a ledger driven through the turn) reaches it; ``None``: not computed (``reach_repeat``
    bounds it)."""

    @property
    def max_repeat(self) -> int:
        return len(self.reach_repeat)

    @property
    def max_run(self) -> int:
        return len(self.reach_run)

    @property
    def max_failing(self) -> int:
        return len(self.reach_failing)


@dataclass(frozen=True, slots=True)
class Triggers:
    """The least value of each of a turn's counts at which a policy can fire: a turn below every
    one of them is quiet (four comparisons, no per-turn work for the policy)."""

    calls: float = NEVER
    run: float = NEVER
    failing: float = NEVER
    cycles: float = NEVER
    repeat: float = NEVER
    """The repeat count (``TurnFacts.max_repeat``): a cycle repeated ``r`` times has each of its
    calls seen ``r`` times."""

    def quiet(self, f: TurnFacts) -> bool:
        """True when nothing these triggers stand for can fire on a turn with these facts."""
        return f.calls < self.calls and f.max_run < self.run and f.max_failing < self.failing and (
            f.cycles < self.cycles and len(f.reach_repeat) < self.repeat
        )

    @staticmethod
    def lowest(triggers: list[Triggers]) -> Triggers:
        """The triggers of a set of policies: the least of each kind."""
        return Triggers(
            min((t.calls for t in triggers), default=NEVER),
            min((t.run for t in triggers), default=NEVER),
            min((t.failing for t in triggers), default=NEVER),
            min((t.cycles for t in triggers), default=NEVER),
            min((t.repeat for t in triggers), default=NEVER),
        )


@dataclass(frozen=True, slots=True)
class Quiet:
    """Where a policy's live check hooks answer ``None`` whatever else the turn holds, in the
    ledger's counts: ``turnguard_check_call`` while ``tool_calls <= calls``, ``streak_length <
    streak`` and ``max_key_repeat < repeat``; ``turnguard_check_outcome`` while ``stop_count <
    stop_count``.

    A policy says it with ``quiet_rule(turn)``, given what its hooks get (a built-in policy module
    the turn's ``Ledger``, any other plugin the read-only ``LedgerView``): at the turn's start,
    and again once ``tool_calls`` passes ``calls`` (so a policy can name the region that fits the
    turn as it is then; every region it names must hold for any turn). The dispatcher does not
    call its hooks there, which is most calls of most turns (``Dispatcher.quiet``). A plugin that
    says nothing is called on every check."""

    calls: float = NEVER
    streak: float = NEVER
    repeat: float = NEVER
    stop_count: float = NEVER


class Firing(NamedTuple):
    """What one policy can still do on one turn.

    ``part`` holds only what can still change a verdict there: two configurations with equal parts
    on a turn give identical verdicts on it. ``first_call`` is the first call (1-based; a check of
    a model request counts for the call it precedes) at which a check can return anything that
    changes the replay's result. ``halt_call`` is the call the policy halts at when that is known
    exactly (and nothing else of it can fire); ``counts_only``: what fires depends on call counts
    alone, not on which calls are the same call (the same under any key identity). A named tuple:
    calibrate makes one per policy and turn, where a frozen dataclass costs several times more."""

    part: tuple[object, ...]
    first_call: int
    halt_call: int | None = None
    counts_only: bool = False


class FiringRule(Protocol):
    """What a policy module's ``firing_rule(config)`` returns (computed once per configuration)."""

    def triggers(self, promptable: bool) -> Triggers:
        """The least counts at which the policy can fire in an attended (``promptable``) or
        unattended turn."""
        ...

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        """What the policy can do on a turn with these facts; ``None``: it cannot fire there."""
        ...


class Silent:
    """The rule of a built-in policy a configuration does not load (``disable_plugins``): its hooks
    never run, so it never fires and shapes no plan."""

    __slots__ = ()

    def triggers(self, promptable: bool) -> Triggers:
        return Triggers()

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        return None


SILENT = Silent()
