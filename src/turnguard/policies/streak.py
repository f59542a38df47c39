"""Identical-call streaks (second seed): warn at N identical calls, stop at M identical failures.

The stop level counts failed identical calls (``streak_stop_on="error"``, the seed's) or, with
``streak_stop_on="any"``, identical calls with any outcome but ``DENIED`` (a loop whose call
"succeeds" with the same useless result every time); denials neither count nor reset either way.

Attended turns (``promptable``) reach the user (ASK) at both levels; unattended turns record the
warning (ALLOW, observed) and halt at the stop level. ``remind_model=True`` turns the warning into
a REMIND with a message the host may inject into the model's input. Each level fires once, when
its count reaches the threshold; ``Turn.resolve`` resets the streak so it can fire again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from turnguard.firing import Firing, Triggers, TurnFacts
from turnguard.hookspecs import hookimpl
from turnguard.ledger import Ledger
from turnguard.model import Action, Level, Outcome, Threshold, ToolCall, Verdict

if TYPE_CHECKING:
    from turnguard.config import GuardConfig

_ERROR = Outcome.ERROR
_DENIED = Outcome.DENIED


def reminder(tool: str, count: int) -> str:
    return (
        f"You have called {tool} {count} times in a row with identical arguments. "
        "It is not making progress: change the arguments, try another approach, or stop and report."
    )


@hookimpl
def turnguard_check_call(turn: Ledger, call: ToolCall) -> Verdict | None:
    warn_at = turn._warn_at  # hot path: the ledger's fields, not its properties
    if turn._streak != warn_at or not warn_at:
        return None
    if turn.config.remind_model:
        action = Action.REMIND
        message = reminder(call.name, warn_at)
    else:
        action = Action.ASK if turn.promptable else Action.ALLOW
        message = f"turnguard: {call.name} called {warn_at} times in a row with identical arguments"
    return turn.detect(Threshold.STREAK, action, Level.WARN, warn_at, call=call, message=message)


@hookimpl
def turnguard_check_outcome(turn: Ledger, call: ToolCall, outcome: Outcome) -> Verdict | None:
    if turn._stop_any:
        if outcome is _DENIED:
            return None
        count, what = turn._settled, "was called"
    elif outcome is not _ERROR:
        return None
    else:
        count, what = turn._failing, "failed"
    stop_at = turn._stop_at
    if count != stop_at or not stop_at:
        return None
    action = Action.ASK if turn.promptable else Action.HALT
    return turn.detect(
        Threshold.STREAK, action, Level.STOP, stop_at, call=call,
        message=f"turnguard: {call.name} {what} {stop_at} times in a row with identical arguments",
    )


def firing_rule(config: GuardConfig) -> StreakFiring:
    """When the streak can fire on a turn known in advance (``turnguard.firing``)."""
    return StreakFiring(config.streak_warn_at, config.streak_stop_at, config.streak_stop_on != "error",
                        config.remind_model)


@dataclass(frozen=True, slots=True)
class StreakFiring:
    """The hooks above, read as positions in a turn whose counts are known.

    The stop level needs its count to reach ``stop_at``: failures inside one run of identical
    keys (``reach_failing``, an upper bound of the failing streak) or, with
    ``streak_stop_on="any"``, the run itself. Unattended, the warn level returns ALLOW (observed)
    and changes no ledger fact, so only the stop level matters. Attended, the warn level ASKs when
    a run reaches ``warn_at`` (the replay's "continue" resets the streak; an answer only resets
    counts, so the bounds hold after it), and a warn level at or below the stop level (without
    ``remind_model``) means the stop never fires: the warning's ASK, answered, restarts the streak
    before the count can exceed it. What the stop level counts matters only when it can fire.
    """

    warn: int
    stop: int
    stop_any: bool
    """The stop level counts every identical call but denials (``streak_stop_on="any"``)."""
    remind: bool

    def triggers(self, promptable: bool) -> Triggers:
        run = failing = float("inf")
        if self.stop:
            if self.stop_any:
                run = self.stop
            else:
                failing = self.stop
        if promptable and self.warn:
            run = min(run, self.warn)
        return Triggers(run=run, failing=failing)

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        stop_reach = facts.reach_run if self.stop_any else facts.reach_failing
        stop_at = self.stop
        first = facts.calls + 2
        stop = None
        if stop_at and len(stop_reach) >= stop_at:
            stop = (stop_at, self.stop_any)
            first = stop_reach[stop_at - 1]
        if not promptable:
            return None if stop is None else Firing(("unattended", stop), first)
        warn_at = self.warn
        warn = None
        if warn_at and len(facts.reach_run) >= warn_at:
            warn = warn_at
            first = min(first, facts.reach_run[warn_at - 1])
        if warn_at and not self.remind and stop_at >= warn_at:
            stop = None  # the warning's ASK, answered, restarts the streak before it can stop
        if warn is None and stop is None:
            return None
        return Firing(("attended", warn, stop, self.remind), first)
