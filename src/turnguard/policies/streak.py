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

from turnguard.hookspecs import hookimpl
from turnguard.ledger import Ledger
from turnguard.model import Action, Level, Outcome, Threshold, ToolCall, Verdict

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
