"""Identical-call streaks (second seed): warn at N identical calls, stop at M identical failures.

The stop level counts failed identical calls (``streak_stop_on="error"``, the seed's) or, with
``streak_stop_on="any"``, identical calls with any outcome but ``DENIED`` (a loop whose call
"succeeds" with the same useless result every time); denials neither count nor reset either way.

Attended turns (``promptable``) reach the user (ASK) at both levels; unattended turns record the
warning (ALLOW, observed) and halt at the stop level. ``remind_model=True`` turns the warning into
a REMIND with a message the host may inject into the model's input. Each level fires once per
streak, when its count reaches the threshold; ``Turn.resolve`` resets the streak so it can fire
again.

Outcomes count in check order (``Ledger.record_outcome``, by ``ledger.count_outcome``). Identical
calls checked before the outcomes of the earlier ones (a parallel batch in one model response, or
behind a call whose outcome never comes) count those still waiting as failures, and those known
as they went, with their results (``Ledger.provisional_stop_count``): the stop level fires at
the check of the call that, run one at a time, would have come after ``streak_stop_at``
failures, so in an unattended turn at most ``streak_stop_at`` of them run. A streak that another
call of the same response ends still settles its calls' outcomes when they come
(``Ledger.ended_stop``): eight identical failing calls then a different one stop at the report
that completes the eight failures in check order, as one at a time.
(Replays are sequential: ``firing_rule`` needs no batch case.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from turnguard._firing import NEVER, Firing, Quiet, Triggers, TurnFacts
from turnguard._ledger import PolicyFacts
from turnguard._model import Action, Level, Outcome, Threshold, ToolCall, Verdict
from turnguard.hookspecs import hookimpl

if TYPE_CHECKING:
    from turnguard._config import GuardConfig


def reminder(tool: str, count: int) -> str:
    return (
        f"You have called {tool} {count} times in a row with identical arguments. "
        "It is not making progress: change the arguments, try another approach, or stop and report."
    )


_STOP = (str(Threshold.STREAK), str(Level.STOP))


@hookimpl
def turnguard_check_call(turn: PolicyFacts, call: ToolCall) -> Verdict | None:
    if turn.next_to_settle != turn.checks:  # hot path (slots of the ledger): earlier calls of the streak still wait
        return _batched(turn, call)
    warn_at = turn.warn_at
    if turn.streak_length != warn_at or not warn_at:
        return None
    return _warn(turn, call, warn_at)


def _warn(turn: PolicyFacts, call: ToolCall, warn_at: int) -> Verdict:
    if turn.config.remind_model:
        action = Action.REMIND
        message = reminder(call.name, warn_at)
    else:
        action = Action.ASK if turn.promptable else Action.ALLOW
        message = f"turnguard: {call.name} called {warn_at} times in a row with identical arguments"
    return turn.detect(Threshold.STREAK, action, Level.WARN, warn_at, call=call, message=message)


def _batched(turn: PolicyFacts, call: ToolCall) -> Verdict | None:
    """A call checked while earlier identical calls of its streak have no outcome yet (one model
    response's batch): those count as failures for the stop level, which fires here, before
    the call runs, if they would have reached it. Had the calls run one at a time, the stop
    level would have fired at the last of them and this one would not have run."""
    warn_at, stop_at = turn.warn_at, turn.stop_at
    if stop_at and not turn.provisional_stop_fired() and turn.provisional_stop_count() >= stop_at:
        waiting = turn.awaiting_in_streak
        action = Action.ASK if turn.promptable else Action.HALT
        return turn.detect(
            Threshold.STREAK, action, Level.STOP, stop_at, call=call,
            message=(f"turnguard: {call.name} called {turn.streak_length} times in a row with identical arguments, "
                     f"{waiting} of them still without an outcome: had they run one at a time, "
                     f"{stop_at} identical failures would have stopped it"),
        )
    if warn_at and turn.provisional_streak_length() == warn_at:
        return _warn(turn, call, warn_at)
    return None


@hookimpl
def turnguard_check_outcome(turn: PolicyFacts, call: ToolCall, outcome: Outcome) -> Verdict | None:
    stop_at = turn.stop_at
    ended = turn.ended_stop
    if ended is None and (turn.stop_count < stop_at or not stop_at or turn.fired_in_streak(*_STOP)):
        return None
    what = "was called" if turn.config.streak_stop_on == "any" else "failed"
    action = Action.ASK if turn.promptable else Action.HALT
    message = f"turnguard: {call.name} {what} {stop_at} times in a row with identical arguments"
    if ended is not None:  # a streak another call of the same response ended: its outcomes came after
        message += " (the calls of one response, whose outcomes came after the next call was checked)"
    return turn.detect(Threshold.STREAK, action, Level.STOP, stop_at, call=call, message=message, streak=ended)


def quiet_rule(turn: PolicyFacts) -> Quiet:
    """Where the hooks above answer ``None`` (``turnguard._firing.Quiet``): the call hook while
    the streak is shorter than either level (the batched stop count counts only the streak's
    earlier calls), the outcome hook while the stop count is under the stop level."""
    warn_at, stop_at = turn.warn_at or NEVER, turn.stop_at or NEVER
    return Quiet(streak=min(warn_at, stop_at), stop_count=stop_at)


def firing_rule(config: GuardConfig) -> StreakFiring:
    """When the streak can fire on a turn known in advance (``turnguard._firing``)."""
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
