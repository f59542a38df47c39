"""Halt on the n-th consecutive identical call: the peers' rule (qwen-code's and gemini-cli's
consecutive-identical detectors), which calibrate compares with turnguard's own streak.

Not a built-in: turnguard's streak only warns at its warn level, so a grid policy that halts
there registers ``HaltOnIdenticalCalls`` next to the built-ins (``IdenticalCallsRule.plugin``,
``calibrate.grid``). It reads the same ledger streak as ``_policies/streak.py``, and its
``firing`` says, as the built-ins' ``firing_rule`` do, where it can fire on a turn known in
advance (``turnguard._firing``).
"""

from __future__ import annotations

from dataclasses import dataclass

from turnguard._firing import Firing, Triggers, TurnFacts
from turnguard._ledger import PolicyFacts
from turnguard._model import Action, Level, Threshold, ToolCall, Verdict
from turnguard.hookspecs import hookimpl


class HaltOnIdenticalCalls:
    """HALT on the ``n``-th consecutive identical call, attended or not."""

    def __init__(self, n: int) -> None:
        self.n = n

    @hookimpl
    def turnguard_check_call(self, turn: PolicyFacts, call: ToolCall) -> Verdict | None:
        if turn.streak_length >= self.n:
            return turn.detect(
                Threshold.STREAK, Action.HALT, Level.STOP, self.n, call=call,
                message=f"peer rule: {call.name} called {turn.streak_length} times in a row",
            )
        return None


@dataclass(frozen=True, slots=True)
class IdenticalCallsRule:
    """The data of ``HaltOnIdenticalCalls`` (a grid's policies stay plain, hashable data)."""

    n: int

    @property
    def label(self) -> str:
        return f"halt@{self.n} identical"

    def plugin(self) -> HaltOnIdenticalCalls:
        return HaltOnIdenticalCalls(self.n)

    def triggers(self, promptable: bool) -> Triggers:
        """The rule's ``turnguard._firing.FiringRule``: a run of ``n`` identical calls, attended or not."""
        return Triggers(run=self.n)

    def firing(self, facts: TurnFacts, promptable: bool) -> Firing | None:
        n = self.n
        return Firing(("identical", n), facts.reach_run[n - 1]) if n <= facts.max_run else None
