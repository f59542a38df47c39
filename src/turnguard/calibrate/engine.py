"""The calibration loop: key each turn once per key mode, skip what cannot fire, replay the rest.

Per turn, each call's key is computed once per key mode (``Keyer.digest``, the live guard's
identity) and shared by every policy of that mode. ``equivalence.signature`` groups the policies
that would replay identically; one replay per group (``replay.replay_turn``) gives the result of
all of them. A turn no policy can fire on (``GridBounds.quiet``) costs only its keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from turnguard.calibrate.equivalence import GridBounds, earliest_call, signature, turn_facts
from turnguard.calibrate.grid import Policy
from turnguard.calibrate.inputs import RecordedTurn
from turnguard.calibrate.replay import CompiledPolicy, TurnResult, cycle_starts, replay_turn
from turnguard.calibrate.stats import RunStats
from turnguard.keys import Keyer

MODES = (("unattended", False), ("attended", True))


def policy_info(policy: Policy) -> dict[str, Any]:
    return {"name": policy.name, "default": policy.is_default, "family": policy.family, "params": policy.describe()}


class Calibrator:
    """Accumulates the results of every policy on every turn it is given (one process)."""

    def __init__(self, policies: list[Policy], *, group: bool = True) -> None:
        if not policies:
            raise ValueError("the grid is empty")
        self.policies = policies
        self.group = group
        self.keyers = {m: Keyer(m) for m in dict.fromkeys(p.config.key_mode for p in policies)}
        self.compiled = [CompiledPolicy(p, self.keyers[p.config.key_mode]) for p in policies]
        self.bounds = GridBounds.of(policies, attended=True)
        self.stats = RunStats.empty([policy_info(p) for p in policies])

    def add_all(self, turns: Iterable[RecordedTurn]) -> RunStats:
        for turn in turns:
            self.add(turn)
        return self.stats

    def keys(self, turn: RecordedTurn, keyer: Keyer) -> list[bytes]:
        """Each call's ledger key under ``keyer``; a recorded digest stands for itself."""
        memo: dict[tuple[str, str], bytes] = {}
        out = []
        digest = keyer.digest
        for call in turn.calls:
            if call.digest is not None:
                out.append(b"\x01" + call.tool.encode("utf-8", "surrogatepass") + b"\x00" + call.digest.encode())
                continue
            args = call.args
            if type(args) is str:
                key = (call.tool, args)
                d = memo.get(key)
                if d is None:
                    d = memo[key] = digest(call.tool, args)
                out.append(d)
            else:
                out.append(digest(call.tool, args))
        return out

    def results(self, turn: RecordedTurn) -> list[dict[str, TurnResult | None]]:
        """Each policy's result per mode on ``turn`` (``None``: it cannot fire); counts replays."""
        outcomes = [c.outcome for c in turn.calls]
        starts = cycle_starts(turn)
        digests = {m: self.keys(turn, k) for m, k in self.keyers.items()}
        facts = {m: turn_facts(d, outcomes, starts) for m, d in digests.items()}
        out: list[dict[str, TurnResult | None]] = [{} for _ in self.compiled]
        if self.group and all(self.bounds.quiet(f) for f in facts.values()):
            return out
        calls_by_mode: dict[str, list[Any]] = {m: [None] * len(turn.calls) for m in digests}
        cache: dict[tuple[object, ...], TurnResult] = {}
        for idx, cp in enumerate(self.compiled):
            mode_key = cp.config.key_mode
            f = facts[mode_key]
            for mode, promptable in MODES:
                sig = signature(cp.policy, f, promptable) if self.group else (idx, mode)
                if sig is None:
                    continue
                result = cache.get(sig)
                if result is None:
                    first = earliest_call(cp.policy, f, promptable) if self.group else 1
                    result = replay_turn(cp, turn, calls_by_mode[mode_key], digests[mode_key], starts,
                                         promptable=promptable, first_check=first)
                    cache[sig] = result
                    self.stats.replays += 1
                out[idx][mode] = result
        return out

    def add(self, turn: RecordedTurn) -> None:
        n = len(turn.calls)
        self.stats.add_turn(n, turn.resolved)
        for idx, per_mode in enumerate(self.results(turn)):
            modes = self.stats.modes[idx]
            for mode, result in per_mode.items():
                if result is not None and (result.halted or result.asks):
                    modes[mode].add(turn.id, n, turn.resolved, result)
