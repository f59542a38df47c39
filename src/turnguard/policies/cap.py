"""The per-turn tool-call cap (first seed): explicit hard cap, or adaptive soft cap + backstop.

Explicit ``max_tool_calls_per_turn=N``: call N+1 halts (``explicit``). Unset: past the soft cap S
the turn continues only while it is not stuck (``soft_stuck``), and never past S * m
(``hard_backstop``). The cap is always on, whatever other detectors are enabled.
"""

from __future__ import annotations

from turnguard.hookspecs import hookimpl
from turnguard.ledger import Ledger
from turnguard.model import Action, Level, Threshold, ToolCall, Verdict


@hookimpl
def turnguard_check_call(turn: Ledger, call: ToolCall) -> Verdict | None:
    n = turn._tool_calls  # hot path: the built-in reads the ledger's fields, not its properties
    if n <= turn._cap_quiet_until or (
        n <= turn._hard_cap and turn._max_repeat < turn._stuck_at
    ):  # under the cap, or past the soft cap and not stuck under any signal (every stuck signal's
        # count is bounded by the repeats: a stale repeat is a repeat); the common cases, first
        return None
    mode = turn.cap_mode
    if mode == "explicit":
        limit = turn.hard_cap
        return turn.detect(
            Threshold.EXPLICIT, Action.HALT, Level.STOP, limit, call=call,
            message=f"turnguard: tool-call cap reached: call {n} exceeds max_tool_calls_per_turn={limit}",
        )
    if n > turn.hard_cap:
        return turn.detect(
            Threshold.HARD_BACKSTOP, Action.HALT, Level.STOP, turn.hard_cap, call=call,
            message=(
                f"turnguard: hard backstop: call {n} exceeds {turn.hard_cap} "
                f"({turn.soft_cap} x {turn.config.hard_multiplier:g}), whatever the turn is doing"
            ),
        )
    if turn.stuck:  # the configured stuck signal (``GuardConfig.stuck_signal``) holds
        signal = turn.config.stuck_signal
        if signal == "repeat":
            how = f"one call was repeated {turn.max_key_repeat} times"
        else:
            how = f"one call was repeated {turn.max_stale_repeat} times with nothing new in between"
        return turn.detect(
            Threshold.SOFT_STUCK, Action.HALT, Level.STOP, turn.soft_cap, call=call,
            message=(
                f"turnguard: stuck past the soft cap: call {n} > {turn.soft_cap} and {how} "
                f"(stuck at {turn.config.stuck_repeat_threshold}, signal {signal})"
            ),
        )
    return None
