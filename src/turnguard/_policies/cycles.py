"""The cycle cap (second seed): at most ``max_cycles_per_turn`` model requests; 0 is unbounded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from turnguard._firing import Firing, Triggers, TurnFacts
from turnguard._ledger import PolicyFacts
from turnguard._model import Action, Level, Threshold, Verdict
from turnguard.hookspecs import hookimpl

if TYPE_CHECKING:
    from turnguard._config import GuardConfig


@hookimpl
def turnguard_check_cycle(turn: PolicyFacts) -> Verdict | None:
    limit = turn.config.max_cycles_per_turn
    if limit and turn.cycles > limit:
        return turn.detect(
            Threshold.CYCLE_CAP, Action.HALT, Level.STOP, limit,
            message=f"turnguard: model request {turn.cycles} exceeds max_cycles_per_turn={limit}",
        )
    return None


def firing_rule(config: GuardConfig) -> CyclesFiring:
    """When the cycle cap can fire on a turn known in advance (``turnguard._firing``)."""
    return CyclesFiring(config.max_cycles_per_turn)


@dataclass(frozen=True, slots=True)
class CyclesFiring:
    """The hook above, read as a position: model request ``N + 1`` halts, before the call it
    precedes; what fires depends on the request count alone."""

    limit: int

    def triggers(self, promptable: bool) -> Triggers:
        return Triggers(cycles=self.limit + 1) if self.limit else Triggers()

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        limit = self.limit
        if not limit or facts.cycles <= limit:
            return None
        return Firing(("cycles", limit), facts.cycle_calls[limit], counts_only=True)
