"""The cycle cap (second seed): at most ``max_cycles_per_turn`` model requests; 0 is unbounded."""

from __future__ import annotations

from turnguard.hookspecs import hookimpl
from turnguard.ledger import Ledger
from turnguard.model import Action, Level, Threshold, Verdict


@hookimpl
def turnguard_check_cycle(turn: Ledger) -> Verdict | None:
    limit = turn.config.max_cycles_per_turn
    if limit and turn.cycles > limit:
        return turn.detect(
            Threshold.CYCLE_CAP, Action.HALT, Level.STOP, limit,
            message=f"turnguard: model request {turn.cycles} exceeds max_cycles_per_turn={limit}",
        )
    return None
