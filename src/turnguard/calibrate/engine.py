"""The calibration loop: key each turn once per key mode, skip what cannot fire, replay the rest.

Per turn, each call's ledger key is computed once per key mode (``identity.call_keys``: the
pre-image of the live guard's ``Keyer.digest``) and shared by every policy of that mode, and by
the other mode too when it partitions the calls alike or no policy of it depends on identity.
``equivalence.signature`` groups the policies that would replay identically; one replay per group
(``replay.replay_turn``) gives the result of all of them, and groups that differ only in where a
cap halts share what they have in common (``equivalence.cap_call``). A turn no policy can fire on
(``GridBounds.quiet``) costs only its keys.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping
from typing import Any

from turnguard.calibrate.equivalence import (
    GridBounds,
    Traits,
    TurnFacts,
    cap_call,
    identity_free,
    stale_reach,
    traits_earliest_call,
    traits_signature,
    turn_facts,
    without_cap,
)
from turnguard.calibrate.evidence import LIVE, PROBE
from turnguard.calibrate.grid import Policy
from turnguard.calibrate.identity import call_keys
from turnguard.calibrate.inputs import RecordedTurn
from turnguard.calibrate.replay import (
    CompiledPolicy,
    SharedPrefix,
    Snapshot,
    TurnResult,
    cycle_starts,
    replay_turn,
)
from turnguard.calibrate.stats import HaltEffect, RunStats, halt_effect
from turnguard.config import GuardConfig
from turnguard.keys import _JSON_STARTS, _JSON_WORDS, Keyer
from turnguard.keys import _MAYBE_JSON as _KEYS_MAYBE_JSON

MODES = (("unattended", False), ("attended", True))


def policy_info(policy: Policy) -> dict[str, Any]:
    return {"name": policy.name, "default": policy.is_default, "family": policy.family, "params": policy.describe()}


class Calibrator:
    """Accumulates the results of every policy on every turn it is given (one process)."""

    def __init__(self, policies: list[Policy], *, group: bool = True,
                 results: Mapping[str, bool] | None = None) -> None:
        if not policies:
            raise ValueError("the grid is empty")
        self.policies = policies
        self.late_results = results or {}
        """Late task results by turn id (``results.late_results``), for turns recorded without one."""
        self.group = group
        self.keyers = {m: Keyer(m) for m in dict.fromkeys(p.config.key_mode for p in policies)}
        self.compiled = [CompiledPolicy(p, self.keyers[p.config.key_mode]) for p in policies]
        self.traits = [Traits.of(p) for p in policies]
        self._rows = [(i, cp, t, cp.config.key_mode, (GridBounds.of([cp.policy], attended=False).quiet,
                                                     GridBounds.of([cp.policy], attended=True).quiet))
                      for i, (cp, t) in enumerate(zip(self.compiled, self.traits, strict=True))]
        """Each policy with its traits and key mode, and its own quiet test by mode (unattended,
        attended): four comparisons that settle most policies of a short turn before a signature."""
        self.bounds = {
            m: GridBounds.of([p for p in policies if p.config.key_mode == m], attended=True) for m in self.keyers
        }
        self.stats = RunStats.empty([policy_info(p) for p in policies])
        self._default = next((i for i, p in enumerate(policies) if p.is_default), None)
        """The policy probe turns are measured against (``evidence.ProbeEvidence``)."""
        stale = [cp for cp in self.compiled if cp.config.stuck_signal == "stale_repeat" and cp.config.soft_cap
                 and cp.config.cap_mode == "adaptive"]
        self._stale: tuple[GuardConfig, int, int] | None = None
        """For ``reach_stale``: a ledger configuration counting the ``stale_repeat`` signal for every
        such policy (the most tracked keys), and the smallest soft cap and threshold among them."""
        if stale:
            config = stale[0].prefix_config.replace(max_tracked_keys=max(cp.config.max_tracked_keys for cp in stale))
            self._stale = (config, min(cp.config.soft_cap for cp in stale),
                           min(cp.config.stuck_repeat_threshold for cp in stale))

    def _facts(self, keys: list[bytes], outcomes: list[Any], starts: list[int]) -> TurnFacts:
        """``turn_facts``, with the ``stale_repeat`` count's reach when a policy may need it."""
        facts = turn_facts(keys, outcomes, starts)
        if self.group and self._stale is not None:
            config, soft_cap, threshold = self._stale
            if facts.calls > soft_cap and facts.max_repeat >= threshold:
                facts = dataclasses.replace(facts, reach_stale=stale_reach(config, keys))
        return facts

    def _under_coarser(self, key_mode: str, f: TurnFacts) -> str:
        """What the policies of ``key_mode`` (a finer identity) do on a turn whose counts under the
        coarser identity are ``f``: ``"quiet"``, none can fire (finer identity, smaller counts);
        ``"same"``, none depends on identity (``identity_free``), so the coarser keys serve;
        ``"own"``: they need their own keys."""
        if self.bounds[key_mode].quiet(f):
            return "quiet"
        if f.reach_stale is not None:
            # The ``stale_repeat`` count is not monotone under a finer identity (a call new to it
            # restarts the count, but may earn a loop's credit): only its bound, the repeats, is.
            f = dataclasses.replace(f, reach_stale=None)
        sigs = [traits_signature(t, f, promptable)
                for cp, t in zip(self.compiled, self.traits, strict=True) if cp.config.key_mode == key_mode
                for _, promptable in MODES]
        if all(sig is None for sig in sigs):
            return "quiet"
        return "same" if all(sig is None or identity_free(sig) for sig in sigs) else "own"

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
        outcomes = list(map(_OUTCOME, turn.calls))
        starts = cycle_starts(turn)
        digests: dict[str, list[bytes]] = {}
        facts = {}
        if self.group and len(self.keyers) > 1 and _plain_text_args(turn):
            # Every key mode partitions these calls alike (equivalence.py): key them once.
            shared = self.keys(turn, self.keyers["bytes" if "bytes" in self.keyers else next(iter(self.keyers))])
            shared_facts = self._facts(shared, outcomes, starts)
            digests = dict.fromkeys(self.keyers, shared)
            facts = dict.fromkeys(self.keyers, shared_facts)
        coarsest = "canonical" if "canonical" in self.keyers and not _has_binary_args(turn) else None
        if coarsest is not None and coarsest not in digests:
            digests[coarsest] = self.keys(turn, self.keyers[coarsest])
            facts[coarsest] = self._facts(digests[coarsest], outcomes, starts)
        classes = 0
        for m, keyer in self.keyers.items():
            if m in digests:
                continue
            under = self._under_coarser(m, facts[coarsest]) if self.group and coarsest is not None else "own"
            if under == "quiet":
                continue  # finer identity, smaller counts: quiet too (equivalence.py)
            if under == "same":
                digests[m], facts[m] = digests[coarsest], facts[coarsest]
                continue
            keys = self.keys(turn, keyer)
            if self.group and coarsest is not None:
                # A finer identity with as many distinct keys is the same partition of the calls:
                # the same counts and the same replays (equivalence.py).
                classes = classes or len(set(digests[coarsest]))
                if len(set(keys)) == classes:
                    digests[m], facts[m] = digests[coarsest], facts[coarsest]
                    continue
            digests[m] = keys
            facts[m] = self._facts(keys, outcomes, starts)
        if self.group and all(self.bounds[m].quiet(f) for m, f in facts.items()):
            return []
        calls_by_mode: dict[str, list[Any]] = {}
        groups: dict[tuple[object, ...], tuple[int, CompiledPolicy, bool]] = {}
        members: list[tuple[int, str, tuple[object, ...]]] = []
        group = self.group
        for idx, cp, traits, key_mode, quiet in self._rows:
            f = facts.get(key_mode)
            if f is None:
                continue
            keyed = id(digests[key_mode])
            for mode, promptable in MODES:
                if group:
                    if quiet[promptable](f):
                        continue
                    sig = traits_signature(traits, f, promptable)
                    if sig is None:
                        continue
                    sig = (keyed, *sig[1:])  # key modes that keyed this turn alike share replays
                    if sig not in groups:
                        groups[sig] = (traits_earliest_call(traits, f, promptable), cp, promptable)
                else:
                    sig = (idx, mode)
                    groups[sig] = (1, cp, promptable)
                members.append((idx, mode, sig))
        prefixes: dict[tuple[object, ...], SharedPrefix] = {}
        results: dict[tuple[object, ...], TurnResult] = {}
        # Replays that differ only in a cap halting at a known call: one that halted earlier for
        # another reason stands for the others (equivalence.cap_call). Within a first call, the
        # latest cap goes first: it is the likeliest to have halted for another reason.
        caps = {sig: cap_call(sig) if group else None for sig in groups}
        families: dict[tuple[object, ...], list[tuple[object, ...]]] = {}
        for sig, at in caps.items():
            if at is not None:
                families.setdefault(without_cap(sig), []).append(sig)
        donors: dict[tuple[object, ...], list[tuple[float, TurnResult]]] = {}
        snapshots: dict[tuple[object, ...], Snapshot] = {}
        order = sorted(groups.items(), key=lambda item: (item[1][0], -(caps[item[0]] or 0)))
        for sig, (first, cp, promptable) in order:
            at = caps[sig]
            key_mode = cp.config.key_mode
            calls = calls_by_mode.get(key_mode)
            if calls is None:
                calls = calls_by_mode[key_mode] = [None] * len(turn.calls)
            wanted: dict[int, list[Snapshot]] | None = None
            if at is not None:
                family = without_cap(sig)
                shared = next((r for c, r in donors.get(family, ()) if 0 < r.halt_call < min(c, at)), None)
                if shared is not None:
                    results[sig] = shared
                    continue
                snap = snapshots.pop(sig, None)
                if snap is not None and snap.taken is not None:
                    # Its checks agreed with an earlier replay's until its cap: go on from there.
                    ledger, asks = snap.taken
                    result = results[sig] = replay_turn(cp, turn, calls, digests[key_mode], starts,
                                                        promptable=promptable, first_check=int(at), ledger=ledger,
                                                        asks_before=asks)
                    self.stats.replays += 1
                    continue
                for other in families[family]:
                    c = caps[other]
                    if other not in results and other not in snapshots and first <= c < at:
                        snapshots[other] = Snapshot(groups[other][1].config, groups[other][2])
                        wanted = wanted or {}
                        wanted.setdefault(int(c) - 1, []).append(snapshots[other])
            ledger = None
            if group and first > 1:
                # One prefix per keying and per setting the ledger's facts depend on (Ledger.fork).
                # A stuck threshold not reached before the fork shapes no fact there: those share
                # a prefix whose threshold is never reached (Ledger.fork refuses a wrong fork).
                stuck = cp.config.stuck_repeat_threshold
                reach = facts[key_mode].reach_repeat
                reached = stuck <= len(reach) and reach[stuck - 1] < first
                where = (id(digests[key_mode]), stuck if reached else 0, cp.config.max_tracked_keys,
                         cp.config.stuck_signal, cp.config.streak_stop_on)
                prefix = prefixes.get(where)
                if prefix is None:
                    prefix = prefixes[where] = SharedPrefix(cp.config if reached else cp.prefix_config, turn,
                                                            digests[key_mode], starts)
                ledger = prefix.fork_at(first, cp.config, promptable)
            result = results[sig] = replay_turn(cp, turn, calls, digests[key_mode], starts, promptable=promptable,
                                                first_check=first, ledger=ledger, snapshots=wanted)
            self.stats.replays += 1
            if at is not None:
                donors.setdefault(family, []).append((at, result))
        return [(idx, mode, results[sig]) for idx, mode, sig in members]

    def add(self, turn: RecordedTurn) -> None:
        n = len(turn.calls)
        stats = self.stats
        turn_id, resolved = turn.id, turn.resolved
        if resolved is None and self.late_results:
            resolved = self.late_results.get(turn_id)
        stats.add_turn(n, resolved)
        modes = stats.modes
        effects: dict[int, HaltEffect | None] = {}  # by result: a group's policies share theirs
        main = None
        for idx, mode, result in self.fired(turn):
            if idx == self._default and mode == "unattended":
                main = result
            if result.halt_call or result.asks:
                key = id(result)
                effect = effects[key] if key in effects else effects.setdefault(key, halt_effect(result, n))
                modes[idx][mode].add_effect(turn_id, resolved, result, effect)
        if turn.cohort == PROBE:
            stats.probe.add(n, resolved, main)
        elif turn.cohort == LIVE:
            stats.probe.live_turns += 1


_MAYBE_JSON = _KEYS_MAYBE_JSON | frozenset("tfn")
"""``keys``' first characters of text that may be JSON, and those of its JSON words."""


def _plain_text_args(turn: RecordedTurn) -> bool:
    """Every call has a recorded digest or text arguments that cannot be JSON (a shell command):
    such text is its own canonical form, so both key modes see the same repeats."""
    maybe = _MAYBE_JSON
    for call in turn.calls:
        if call[2] is not None:  # call.digest
            continue
        args = call[1]  # call.args
        if type(args) is not str:
            return False
        if args[:1] not in maybe:  # the common case: neither JSON nor space first, not a JSON word
            continue
        text = args.strip()
        if text and (text[0] in _JSON_STARTS or text in _JSON_WORDS):
            return False
    return True


def _has_binary_args(turn: RecordedTurn) -> bool:
    """Bytes arguments are where byte identity is not a refinement of canonical identity (bytes
    that are not UTF-8); JSON input never has them, hand-built turns might."""
    return any(issubclass(t, _BINARY) for t in set(map(type, map(_ARGS, turn.calls))))


_BINARY = (bytes, bytearray, memoryview)
_ARGS = operator.itemgetter(1)  # RecordedCall.args
_OUTCOME = operator.itemgetter(3)  # RecordedCall.outcome
