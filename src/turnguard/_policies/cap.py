"""The per-turn tool-call cap (first seed): explicit hard cap, or adaptive soft cap + backstop.

Explicit ``max_tool_calls_per_turn=N``: call N+1 halts (``explicit``). Unset: past the soft cap S
the turn continues only while it is not stuck (``soft_stuck``), and never past S * m
(``hard_backstop``). The cap is always on, whatever other detectors are enabled.

A ``stateful_tools`` tool's call has its repeat counted when its outcome (and result) is
recorded, so the stuck verdict it brings about past S is taken there (``turnguard_check_outcome``):
the turn halts after that call rather than before the next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnguard._firing import Firing, Quiet, Triggers, TurnFacts
from turnguard._ledger import LedgerFacts, PolicyFacts
from turnguard._model import Action, Level, Outcome, Threshold, ToolCall, Verdict
from turnguard.hookspecs import hookimpl

if TYPE_CHECKING:
    from turnguard._config import GuardConfig


@hookimpl
def turnguard_check_call(turn: PolicyFacts, call: ToolCall) -> Verdict | None:
    n = turn.tool_calls  # hot path: slots of the ledger (PolicyFacts)
    if n <= turn.cap_quiet_until:  # under the cap (always, when it is off): the common case, first
        return None
    hard_cap = turn.hard_cap
    assert hard_cap is not None  # on, and past where it is quiet: N, or S * m
    if n <= hard_cap and turn.max_key_repeat < turn.stuck_at:
        # past the soft cap and not stuck under any signal (every stuck signal's count is bounded
        # by the repeats: a stale repeat is a repeat)
        return None
    mode = turn.cap_mode
    if mode == "explicit":
        return turn.detect(
            Threshold.EXPLICIT, Action.HALT, Level.STOP, hard_cap, call=call,
            message=f"turnguard: tool-call cap reached: call {n} exceeds max_tool_calls_per_turn={hard_cap}",
        )
    if n > hard_cap:
        return turn.detect(
            Threshold.HARD_BACKSTOP, Action.HALT, Level.STOP, hard_cap, call=call,
            message=(
                f"turnguard: hard backstop: call {n} exceeds {hard_cap} "
                f"({turn.soft_cap} x {turn.config.hard_multiplier:g}), whatever the turn is doing"
            ),
        )
    if stuck(turn):
        return _stuck(turn, call, n)
    return None


def stuck(turn: LedgerFacts) -> bool:
    """The stuck signal's rule: whether the configured signal's count (``stuck_signal``, the
    ledger's ``stuck_count``) has reached ``stuck_repeat_threshold``."""
    return turn.stuck_count >= turn.config.stuck_repeat_threshold


def summary_stuck(turn: LedgerFacts) -> bool:
    """What a turn's summary reports as ``stuck``: the adaptive cap's stuck signal holds (an
    explicit or disabled cap has none)."""
    return turn.cap_mode == "adaptive" and stuck(turn)


def _stuck(turn: PolicyFacts, call: ToolCall, n: int) -> Verdict:
    signal = turn.config.stuck_signal
    if signal == "repeat":
        how = f"one call was repeated {turn.max_key_repeat} times"
    else:
        how = f"one call was repeated {turn.max_stale_repeat} times with nothing new in between"
    if turn.names_tools:
        how += " (a stateful tool's calls counted with their results)"
    soft_cap = turn.soft_cap
    assert soft_cap is not None  # stuck past the soft cap: the adaptive cap's S
    return turn.detect(
        Threshold.SOFT_STUCK, Action.HALT, Level.STOP, soft_cap, call=call,
        message=(
            f"turnguard: stuck past the soft cap: call {n} > {soft_cap} and {how} "
            f"(stuck at {turn.config.stuck_repeat_threshold}, signal {signal})"
        ),
    )


@hookimpl
def turnguard_check_outcome(turn: PolicyFacts, call: ToolCall, outcome: Outcome) -> Verdict | None:
    """A stateful tool's outcome that made the turn stuck past the soft cap (its repeat is counted
    with its result, so only now) halts there; nothing else can make the cap fire at an outcome."""
    if not turn.stuck_raised:
        return None
    n = turn.tool_calls
    if turn.cap_mode != "adaptive" or n <= turn.cap_quiet_until:
        return None
    hard_cap = turn.hard_cap
    assert hard_cap is not None  # adaptive: S * m
    if n > hard_cap or not stuck(turn):
        return None
    return _stuck(turn, call, n)


def quiet_rule(turn: PolicyFacts) -> Quiet:
    """Where the call hook above answers ``None`` (``turnguard._firing.Quiet``): up to the cap, and
    past the soft cap up to the backstop while no call has been repeated ``stuck_at`` times. The
    outcome hook answers only where ``record_polled`` says so (the guard then asks every outcome
    hook), so it is quiet everywhere else (``stop_count`` never reached)."""
    if turn.tool_calls <= turn.cap_quiet_until or turn.cap_mode != "adaptive":
        return Quiet(calls=turn.cap_quiet_until)
    hard_cap = turn.hard_cap
    assert hard_cap is not None  # adaptive: S * m
    return Quiet(calls=hard_cap, repeat=turn.stuck_at)


def firing_rule(config: GuardConfig) -> CapFiring:
    """When the cap can fire on a turn known in advance (``turnguard._firing``)."""
    return CapFiring(config)


class CapFiring:
    """The hook above, read as positions in a turn whose counts are known.

    Explicit ``N``: only call ``N + 1`` halts. Adaptive ``S``/``H``/``D``: nothing fires while
    ``n <= S``; past ``S`` the stuck verdict needs the signal's count to reach ``D``, and every
    stuck signal's count is bounded by the turn's largest repeat (a stale repeat is a repeat), so
    a larger ``D`` never fires; the backstop needs ``n > H``. When the ledger counts every key
    (the turn's distinct keys fit in ``max_tracked_keys``) and the signal's count is known call by
    call (``reach_repeat``; ``reach_stale`` for ``stale_repeat``), the stuck verdict comes at
    ``max(S + 1, the call the count reaches D)``, and the backstop at ``H + 1`` if that is earlier:
    the cap is then only what it does and where, and configurations that halt at the same call
    share a replay.
    """

    __slots__ = ("adaptive", "explicit", "hard", "limit", "max_keys", "signal", "stale", "stuck")

    def __init__(self, config: GuardConfig) -> None:
        mode = config.cap_mode
        self.explicit = mode == "explicit"
        self.adaptive = mode == "adaptive"
        self.limit = (config.max_tool_calls_per_turn if self.explicit else config.soft_cap) or 0
        self.hard = config.hard_cap or 0
        self.stuck = config.stuck_repeat_threshold
        self.signal = config.stuck_signal
        self.stale = self.signal == "stale_repeat"
        self.max_keys = config.max_tracked_keys

    def triggers(self, promptable: bool) -> Triggers:
        return Triggers(calls=self.limit + 1) if self.explicit or self.adaptive else Triggers()

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        limit = self.limit
        if facts.calls <= limit or not (self.explicit or self.adaptive):
            return None
        if self.explicit:
            return Firing(("explicit", limit), limit + 1, limit + 1, counts_only=True)
        return self._past_soft_cap(facts)

    def _past_soft_cap(self, facts: TurnFacts) -> Firing | None:
        """The adaptive cap on a turn longer than ``S``: the backstop, the stuck verdict, or both."""
        calls, hard = facts.calls, self.hard
        stuck_at = self.stuck_call(facts)
        backstop = hard + 1 if hard < calls else None
        first = calls + 2 if backstop is None else backstop
        if stuck_at is not None and stuck_at < first:
            first = stuck_at
        if facts.distinct <= self.max_keys and (not self.stale or facts.reach_stale is not None):
            # Exact counts: the stuck verdict comes at a known call (or never).
            if backstop is not None and (stuck_at is None or hard < stuck_at):
                return Firing(("hard_backstop", backstop), first, backstop, counts_only=True)
            if stuck_at is not None:
                return Firing(("soft_stuck", stuck_at), first, stuck_at)
            return None
        if self.stuck <= facts.max_repeat:
            return Firing(("adaptive", self.limit, self.signal, self.stuck, None if backstop is None else hard), first)
        if backstop is not None:  # the signal cannot fire: which one is moot
            return Firing(("hard_backstop", backstop), first, backstop, counts_only=True)
        return None

    def stuck_call(self, facts: TurnFacts) -> int | None:
        """The first call past the soft cap at which the stuck signal can hold, or ``None``: never.
        Exact while the ledger counts every key; otherwise a lower bound (an uncounted key only
        lowers the count)."""
        reach = facts.reach_stale if self.stale and facts.reach_stale is not None else facts.reach_repeat
        if self.stuck > len(reach):
            return None
        return max(self.limit + 1, reach[self.stuck - 1])
