"""Alternating loops: the turn's latest calls repeat a cycle of 2 to
``cycle_repeat_max_period`` identical calls (read, list, read, list...) ``cycle_repeat_warn_at``
or ``cycle_repeat_stop_at`` times.

The levels are the streak's: the warning asks an attended turn, reminds the model with
``remind_model``, and is observed (ALLOW) in an unattended one; the stop asks an attended turn
and halts an unattended one. Each level fires once per cycle (a different call ends it; an
answer restarts the count, at its place in check order). A run of one call repeated is the
streak's, not a cycle; a cycle is reported at its shortest period. The counts are the ledger's
(``ledger.CycleRuns``): calls settle in check order at their outcome, so a level fires at the
outcome of the call that reaches it, as one at a time (one level per report: the others it
reached come with the next reports, or observed as the turn ends, ``unreported``); denials do not
count, and a stateful tool's changed result breaks the cycle. Off in ``seed``
(``cycle_repeat_warn_at = cycle_repeat_stop_at = 0``); the ledger then keeps no cycle facts and
this module is never called on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from turnguard._firing import Firing, Quiet, Triggers, TurnFacts
from turnguard._ledger import PolicyFacts
from turnguard._model import Action, Level, Outcome, Threshold, ToolCall, Verdict
from turnguard.hookspecs import hookimpl

if TYPE_CHECKING:
    from turnguard._config import GuardConfig


def reminder(period: int, times: int) -> str:
    return (
        f"Your last {period * times} tool calls repeat the same {period} calls {times} times over, with "
        "identical arguments and results. It is not making progress: try another approach, or stop and report."
    )


@hookimpl
def turnguard_check_outcome(turn: PolicyFacts, call: ToolCall, outcome: Outcome) -> Verdict | None:
    due = turn.cycle_due
    if due is None:
        return None
    level, period, matches = due
    config = turn.config
    if level is Level.STOP:
        action = Action.ASK if turn.promptable else Action.HALT
    else:
        action = Action.REMIND if config.remind_model else Action.ASK if turn.promptable else Action.ALLOW
    return _detect(turn, level, period, matches, action, call)


def unreported(turn: PolicyFacts) -> list[Verdict]:
    """The levels no outcome reported before the turn ended (``cycle_unreported``), each heard
    once as the turn ends, in the order later reports would have carried them: observed
    (``ALLOW``), since nothing is left to ask, remind or halt."""
    return [_detect(turn, level, period, matches, Action.ALLOW, None)
            for level, period, matches in turn.cycle_unreported]


def _detect(turn: PolicyFacts, level: Level, period: int, matches: int, action: Action,
            call: ToolCall | None) -> Verdict:
    times = matches // period + 1
    limit = turn.config.cycle_repeat_stop_at if level is Level.STOP else turn.config.cycle_repeat_warn_at
    if action is Action.REMIND:
        message = reminder(period, times)
    else:
        message = (f"turnguard: the last {period * times} calls repeat a cycle of {period} identical calls "
                   f"{times} times (cycle_repeat_{level}_at={limit})")
    return turn.detect(Threshold.CYCLE_REPEAT, action, level, limit, call=call, message=message)


def quiet_rule(turn: PolicyFacts) -> Quiet:
    """Quiet everywhere: the outcome hook is called only where the ledger says a level is due
    (``CycleRuns.due``: the outcome reports it, and the driver then asks every outcome hook)."""
    return Quiet()


def firing_rule(config: GuardConfig) -> CycleRepeatFiring:
    """When ``cycle_repeat`` can fire on a turn known in advance (``turnguard._firing``)."""
    return CycleRepeatFiring(config.cycle_repeat_warn_at, config.cycle_repeat_stop_at, config.remind_model,
                             config.cycle_repeat_max_period)


@dataclass(frozen=True, slots=True)
class CycleRepeatFiring:
    """Where the policy can change a replay's result: unattended, only the stop level (it halts;
    the warning is observed or a reminder). Attended, the warning's ASK (answered "continue", it
    restarts the count, so a stop at or above it never comes) or, with ``remind_model``, the stop's
    ASK. A cycle repeated ``r`` times has each of its calls seen ``r`` times: below the level in
    the repeat count the policy cannot fire, and no level is reached before the call where the
    count reaches it (the ledger's runs do not depend on the levels, so a replay may fork there)."""

    warn: int
    stop: int
    remind: bool
    period: int

    def level(self, promptable: bool) -> int:
        """The level that changes a result (0: none)."""
        if promptable and not self.remind and self.warn:
            return self.warn
        return self.stop

    def triggers(self, promptable: bool) -> Triggers:
        level = self.level(promptable)
        return Triggers(repeat=level) if level else Triggers()

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        level = self.level(promptable)
        if not level or facts.max_repeat < level:
            return None
        return Firing(("cycle_repeat", self.period, level, promptable), facts.reach_repeat[level - 1])
