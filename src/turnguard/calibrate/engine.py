"""The calibration loop: key each turn once per key mode, skip what cannot fire, replay the rest.

Per turn, each call's key is computed once per key mode (``Keyer.digest``, the live guard's
identity) and shared by every policy of that mode. ``equivalence.signature`` groups the policies
that would replay identically; one replay per group (``replay.replay_turn``) gives the result of
all of them. A turn no policy can fire on (``GridBounds.quiet``) costs only its keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from turnguard.calibrate.equivalence import (
    GridBounds,
    Traits,
    TurnFacts,
    earliest_call,
    signature,
    traits_signature,
    turn_facts,
)
from turnguard.calibrate.grid import Policy
from turnguard.calibrate.identity import call_keys
from turnguard.calibrate.inputs import RecordedTurn
from turnguard.calibrate.replay import CompiledPolicy, SharedPrefix, TurnResult, cycle_starts, replay_turn
from turnguard.calibrate.stats import HaltEffect, RunStats, halt_effect
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
        self.traits = [Traits.of(p) for p in policies]
        self._rows = [(i, cp, t, cp.config.key_mode)
                      for i, (cp, t) in enumerate(zip(self.compiled, self.traits, strict=True))]
        self.bounds = {
            m: GridBounds.of([p for p in policies if p.config.key_mode == m], attended=True) for m in self.keyers
        }
        self.stats = RunStats.empty([policy_info(p) for p in policies])

    def _quiet_under(self, key_mode: str, f: TurnFacts) -> bool:
        """No policy of ``key_mode`` can fire on a turn whose counts are at most ``f``."""
        if self.bounds[key_mode].quiet(f):
            return True
        return all(signature(cp.policy, f, promptable) is None
                   for cp in self.compiled if cp.config.key_mode == key_mode for _, promptable in MODES)

    def add_all(self, turns: Iterable[RecordedTurn]) -> RunStats:
        for turn in turns:
            self.add(turn)
        return self.stats

    def keys(self, turn: RecordedTurn, keyer: Keyer) -> list[bytes]:
        """Each call's ledger key under ``keyer``'s key mode (``call_keys``)."""
        return call_keys(turn.calls, keyer.mode)

    def results(self, turn: RecordedTurn) -> list[dict[str, TurnResult]]:
        """Each policy's results on ``turn`` by mode (``"unattended"``, ``"attended"``); a mode is
        missing when the policy cannot fire on the turn in it. Counts the replays run."""
        out: list[dict[str, TurnResult]] = [{} for _ in self.compiled]
        for idx, mode, result in self.fired(turn):
            out[idx][mode] = result
        return out

    def fired(self, turn: RecordedTurn) -> list[tuple[int, str, TurnResult]]:
        """(policy index, mode, result) for each policy and mode that can fire on ``turn`` (the
        others cannot: nothing to add); counts the replays run."""
        outcomes = [c.outcome for c in turn.calls]
        starts = cycle_starts(turn)
        digests: dict[str, list[bytes]] = {}
        facts = {}
        if self.group and len(self.keyers) > 1 and _plain_text_args(turn):
            # Every key mode partitions these calls alike (equivalence.py): key them once.
            shared = self.keys(turn, self.keyers["bytes" if "bytes" in self.keyers else next(iter(self.keyers))])
            shared_facts = turn_facts(shared, outcomes, starts)
            digests = dict.fromkeys(self.keyers, shared)
            facts = dict.fromkeys(self.keyers, shared_facts)
        coarsest = "canonical" if "canonical" in self.keyers and not _has_binary_args(turn) else None
        if coarsest is not None and coarsest not in digests:
            digests[coarsest] = self.keys(turn, self.keyers[coarsest])
            facts[coarsest] = turn_facts(digests[coarsest], outcomes, starts)
        classes = 0
        for m, keyer in self.keyers.items():
            if m in digests:
                continue
            if self.group and coarsest is not None and self._quiet_under(m, facts[coarsest]):
                continue  # finer identity, smaller counts: quiet too (equivalence.py)
            keys = self.keys(turn, keyer)
            if self.group and coarsest is not None:
                # A finer identity with as many distinct keys is the same partition of the calls:
                # the same counts and the same replays (equivalence.py).
                classes = classes or len(set(digests[coarsest]))
                if len(set(keys)) == classes:
                    digests[m], facts[m] = digests[coarsest], facts[coarsest]
                    continue
            digests[m] = keys
            facts[m] = turn_facts(keys, outcomes, starts)
        if self.group and all(self.bounds[m].quiet(f) for m, f in facts.items()):
            return []
        calls_by_mode: dict[str, list[Any]] = {}
        groups: dict[tuple[object, ...], tuple[int, CompiledPolicy, bool]] = {}
        members: list[tuple[int, str, tuple[object, ...]]] = []
        group = self.group
        for idx, cp, traits, key_mode in self._rows:
            f = facts.get(key_mode)
            if f is None:
                continue
            keyed = id(digests[key_mode])
            for mode, promptable in MODES:
                if group:
                    sig = traits_signature(traits, f, promptable)
                    if sig is None:
                        continue
                    sig = (keyed, *sig[1:])  # key modes that keyed this turn alike share replays
                    if sig not in groups:
                        groups[sig] = (earliest_call(cp.policy, f, promptable), cp, promptable)
                else:
                    sig = (idx, mode)
                    groups[sig] = (1, cp, promptable)
                members.append((idx, mode, sig))
        prefixes: dict[tuple[object, ...], SharedPrefix] = {}
        results: dict[tuple[object, ...], TurnResult] = {}
        for sig, (first, cp, promptable) in sorted(groups.items(), key=lambda item: item[1][0]):
            key_mode = cp.config.key_mode
            ledger = None
            if self.group and first > 1:
                # One prefix per keying and per setting the ledger's facts depend on (Ledger.fork).
                # A threshold the turn never reaches shapes no fact: those share one prefix.
                stuck = cp.config.stuck_repeat_threshold
                where = (id(digests[key_mode]), stuck if stuck <= facts[key_mode].max_repeat else 0,
                         cp.config.max_tracked_keys, cp.config.stuck_signal,
                         cp.config.streak_stop_on)
                prefix = prefixes.get(where)
                if prefix is None:
                    prefix = prefixes[where] = SharedPrefix(cp.config, turn, digests[key_mode], starts)
                ledger = prefix.fork_at(first, cp.config, promptable)
            calls = calls_by_mode.get(key_mode)
            if calls is None:
                calls = calls_by_mode[key_mode] = [None] * len(turn.calls)
            results[sig] = replay_turn(cp, turn, calls, digests[key_mode], starts,
                                       promptable=promptable, first_check=first, ledger=ledger)
            self.stats.replays += 1
        return [(idx, mode, results[sig]) for idx, mode, sig in members]

    def add(self, turn: RecordedTurn) -> None:
        n = len(turn.calls)
        stats = self.stats
        stats.add_turn(n, turn.resolved)
        modes = stats.modes
        turn_id, resolved = turn.id, turn.resolved
        effects: dict[int, HaltEffect | None] = {}  # by result: a group's policies share theirs
        for idx, mode, result in self.fired(turn):
            if result.halt_call or result.asks:
                key = id(result)
                effect = effects[key] if key in effects else effects.setdefault(key, halt_effect(result, n))
                modes[idx][mode].add_effect(turn_id, resolved, result, effect)


_JSON_STARTS = frozenset('{["-0123456789')
_JSON_WORDS = frozenset(("true", "false", "null"))


def _plain_text_args(turn: RecordedTurn) -> bool:
    """Every call has a recorded digest or text arguments that cannot be JSON (a shell command):
    such text is its own canonical form, so both key modes see the same repeats."""
    for call in turn.calls:
        if call.digest is not None:
            continue
        args = call.args
        if type(args) is not str:
            return False
        text = args.strip()
        if text and (text[0] in _JSON_STARTS or text in _JSON_WORDS):
            return False
    return True


def _has_binary_args(turn: RecordedTurn) -> bool:
    """Bytes arguments are where byte identity is not a refinement of canonical identity (bytes
    that are not UTF-8); JSON input never has them, hand-built turns might."""
    return any(isinstance(c.args, (bytes, bytearray, memoryview)) for c in turn.calls)
