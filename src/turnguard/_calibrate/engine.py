"""The calibration loop: key each turn once per key mode, skip what cannot fire, replay the rest.

Keys (``replay.call_keys``) are shared by every policy of a mode, and by the other mode when it
partitions the calls alike. ``equivalence`` groups the policies that replay identically; one
replay per group gives all their results, and groups differing only in where a cap halts share
what they have in common. A turn no policy can fire on costs only its keys."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from turnguard._calibrate.advice import in_force
from turnguard._calibrate.duplicates import id_hash
from turnguard._calibrate.equivalence import Plan, PolicyRules, as_failing, grid_triggers, stale_reach, turn_facts
from turnguard._calibrate.evidence import LIVE, PROBE
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import RecordedTurn
from turnguard._calibrate.replay import (
    CompiledPolicy,
    Managers,
    SharedPrefix,
    Snapshot,
    TurnResult,
    call_keys,
    cycle_starts,
    replay_turn,
    retry_points,
    unfinished_calls,
)
from turnguard._calibrate.stats import HaltEffect, RunStats, halt_effect, halt_ended
from turnguard._config import GuardConfig
from turnguard._firing import FiringRule, TurnFacts
from turnguard._guard import SUSPENDED
from turnguard._keys import Keyer, is_json_text
from turnguard._ledger import Ledger
from turnguard._model import Outcome, ToolCall

MODES = (("unattended", False), ("attended", True))
Keyed = dict[str, tuple[list[bytes], TurnFacts]]
"""By key mode: a turn's keys and their facts (modes that key a turn alike share one list)."""
GroupKey = tuple[object, ...]
"""A plan's signature under one keying of the turn: the policies whose replays are identical."""


def policy_info(policy: Policy) -> dict[str, Any]:
    return {"name": policy.name, "default": policy.is_default, "family": policy.family, "params": policy.describe()}


class Calibrator:
    """Accumulates the results of every policy on every turn it is given (one process)."""

    def __init__(self, policies: list[Policy], *, group: bool = True,
                 results: Mapping[int, bool] | None = None) -> None:
        if not policies:
            raise ValueError("the grid is empty")
        self.policies = policies
        self.late_results = results or {}
        """Late task results by ``duplicates.id_hash`` of the turn id, for turns recorded without one."""
        self.group = group
        self.keyers = {m: Keyer(m) for m in dict.fromkeys(p.config.key_mode for p in policies)}
        managers: Managers = {}
        self.compiled = [CompiledPolicy(p, self.keyers[p.config.key_mode], managers) for p in policies]
        shared: dict[tuple[FiringRule, ...], tuple[FiringRule, ...]] = {}
        self.rules = [PolicyRules(p, shared) for p in policies]
        self.triggers = {
            m: grid_triggers([p for p in policies if p.config.key_mode == m], attended=True) for m in self.keyers
        }
        """By key mode: a turn below these counts is quiet for every policy of that mode."""
        self.stats = RunStats.empty([policy_info(p) for p in policies])
        self._default = next((i for i, p in enumerate(policies) if p.is_default), None)
        """The policy probe turns are measured against (``evidence.ProbeEvidence``)."""
        self._stale = _stale_counting(self.compiled)
        self._repeat_signal = self._default is None or policies[self._default].config.stuck_signal == "repeat"

    def add_all(self, turns: Iterable[RecordedTurn]) -> RunStats:
        for turn in turns:
            self.add(turn)
        return self.stats

    def add(self, turn: RecordedTurn) -> None:
        stats = self.stats
        if turn.ended_by == SUSPENDED:
            stats.suspended_parts += 1  # a part of a turn: the span that ends the turn counts it
            return
        stats.prints.add(turn)
        n = turn.needed_calls  # the true count: halts save calls the recording may not list
        turn_id, resolved = turn.id, turn.resolved
        if resolved is None and self.late_results:
            resolved = self.late_results.get(id_hash(turn_id))
        stats.add_turn(n, resolved)
        modes = stats.modes
        effects: dict[int, HaltEffect | None] = {}  # by result: a group's policies share theirs
        main = None
        cohort = turn.cohort or "unrecorded"
        at_halt = halt_ended(turn.ended_by)
        cut, short = _censoring(stats, turn, cohort, at_halt)
        source = "attended" if cohort == "live" and turn.continued else cohort
        for idx, mode, result in [] if turn.in_part else self.fired(turn):
            if idx == self._default and mode == "unattended":
                main = result
            if result.halt_call or result.asks:
                key = id(result)
                effect = effects[key] if key in effects else effects.setdefault(key, halt_effect(result, n))
                modes[idx][mode].add_effect(turn_id, resolved, result, effect, cut, source, short)
        stats.recording.add(turn, cohort)
        stats.survival.add(n, turn.ended_by)
        if turn.cohort == PROBE:
            untold = turn.in_part or turn.cut_short
            stats.probe.add(n, resolved, main, turn.ended_by if at_halt else None, untold=untold,
                            facts=None if untold else self._main_facts(turn), repeat_signal=self._repeat_signal,
                            limits=turn.limits)
        elif turn.cohort == LIVE:
            stats.probe.live_turns += 1

    def _main_facts(self, turn: RecordedTurn) -> TurnFacts | None:
        """The probe turn's counts under the default policy's keys, for its ladders (``evidence.py``)."""
        if self._default is None:
            return None
        keys = self.keys(turn, self.keyers[self.compiled[self._default].config.key_mode])
        outcomes = list(map(_OUTCOME, turn.calls))
        return turn_facts(keys, as_failing(outcomes, unfinished_calls(outcomes)), cycle_starts(turn))

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
        starts = cycle_starts(turn)
        outcomes = list(map(_OUTCOME, turn.calls))
        lost = unfinished_calls(outcomes)
        keyed = self._keyed(turn, as_failing(outcomes, lost), starts)
        if self.group and all(self.triggers[m].quiet(f) for m, (_, f) in keyed.items()):
            return []  # (a retry only lowers counts: still quiet)
        retries = retry_points(turn)
        groups, members = self._groups(keyed, grouped=not retries)
        results = _TurnReplays(self, turn, keyed, starts, lost, retries).run(groups)
        return [(idx, mode, results[key]) for idx, mode, key in members]

    # -- keying a turn -------------------------------------------------------------------------

    def keys(self, turn: RecordedTurn, keyer: Keyer) -> list[bytes]:
        """Each call's ledger key under ``keyer``'s key mode (``call_keys``)."""
        return call_keys(turn.calls, keyer.mode)

    def _keyed(self, turn: RecordedTurn, outcomes: Sequence[Outcome], starts: list[int]) -> Keyed:
        """Each key mode's keys of ``turn`` and their facts, computed as few times as the modes
        allow; a mode is missing when its policies cannot fire on the turn."""
        keyed: Keyed = {}
        if self.group and len(self.keyers) > 1 and _plain_text_args(turn):
            # Every key mode partitions these calls alike (equivalence.py): key them once.
            shared = self.keys(turn, self.keyers["bytes" if "bytes" in self.keyers else next(iter(self.keyers))])
            keyed = dict.fromkeys(self.keyers, (shared, self._facts(shared, outcomes, starts)))
        coarsest = "canonical" if "canonical" in self.keyers and not _has_binary_args(turn) else None
        if coarsest is not None and coarsest not in keyed:
            keys = self.keys(turn, self.keyers[coarsest])
            keyed[coarsest] = (keys, self._facts(keys, outcomes, starts))
        coarse = keyed.get(coarsest) if coarsest is not None else None
        for mode in self.keyers:
            if mode not in keyed:
                found = self._finer(mode, turn, coarse, outcomes, starts)
                if found is not None:
                    keyed[mode] = found
        return keyed

    def _finer(self, mode: str, turn: RecordedTurn, coarse: tuple[list[bytes], TurnFacts] | None,
               outcomes: Sequence[Outcome], starts: list[int]) -> tuple[list[bytes], TurnFacts] | None:
        """A finer key mode's keys and facts (the coarser mode's when they partition the calls
        alike), or ``None`` when its policies cannot fire on the turn."""
        if self.group and coarse is not None:
            under = self._under_coarser(mode, coarse[1])
            if under == "quiet":
                return None  # finer identity, smaller counts: quiet too (equivalence.py)
            if under == "same":
                return coarse
        keys = self.keys(turn, self.keyers[mode])
        if self.group and coarse is not None and len(set(keys)) == len(set(coarse[0])):
            # A finer identity with as many distinct keys is the same partition of the calls:
            # the same counts and the same replays (equivalence.py).
            return coarse
        return keys, self._facts(keys, outcomes, starts)

    def _facts(self, keys: list[bytes], outcomes: Sequence[Outcome], starts: list[int]) -> TurnFacts:
        """``turn_facts``, with the ``stale_repeat`` count's reach when a policy may need it."""
        facts = turn_facts(keys, outcomes, starts)
        if self.group and self._stale is not None:
            config, soft_cap, threshold = self._stale
            if facts.calls > soft_cap and facts.max_repeat >= threshold:
                facts = dataclasses.replace(facts, reach_stale=stale_reach(config, keys))
        return facts

    def _under_coarser(self, key_mode: str, f: TurnFacts) -> str:
        """What ``key_mode``'s policies (a finer identity) do on a turn whose coarser counts are ``f``:
        ``"quiet"``, ``"same"`` (none depends on identity: the coarser keys serve) or ``"own"``."""
        if self.triggers[key_mode].quiet(f):
            return "quiet"
        if f.reach_stale is not None:
            # The ``stale_repeat`` count is not monotone under a finer identity (a call new to it
            # restarts the count, but may earn a loop's credit): only its bound, the repeats, is.
            f = dataclasses.replace(f, reach_stale=None)
        plans = [rules.plan(f, promptable)
                 for cp, rules in zip(self.compiled, self.rules, strict=True) if cp.config.key_mode == key_mode
                 for _, promptable in MODES]
        if all(plan is None for plan in plans):
            return "quiet"
        return "same" if all(plan is None or plan.identity_free for plan in plans) else "own"

    # -- grouping ------------------------------------------------------------------------------

    def _groups(self, keyed: Keyed, *, grouped: bool = True) -> tuple[dict[GroupKey, _Group],
                                                                       list[tuple[int, str, GroupKey]]]:
        """The replays to run on the turn (one per group of identical plans; without grouping or
        not ``grouped``, one per policy and mode, from the first call: a turn with a ``retry()``,
        whose facts do not see the rollbacks, so plans cannot say where its replays differ) and
        which one answers for each policy and mode."""
        groups: dict[GroupKey, _Group] = {}
        members: list[tuple[int, str, GroupKey]] = []
        group = self.group and grouped
        memos: dict[int, dict[tuple[int, bool], Any]] = {}
        for idx, (cp, rules) in enumerate(zip(self.compiled, self.rules, strict=True)):
            found = keyed.get(cp.config.key_mode)
            if found is None:
                continue
            keys, f = found
            memo = memos.setdefault(id(f), {})
            unattended: tuple[Any, GroupKey | None] | None = None  # (what the other rules say, the plan's key)
            for mode, promptable in MODES:
                if not group or (rules.named and _can_fire(rules, f, promptable)):
                    key: GroupKey = (idx, mode)
                    groups[key] = _Group(cp, promptable, 1, None, None)
                elif rules.named or rules.triggers[promptable].quiet(f):
                    continue
                else:
                    others = rules.others_on(f, promptable, memo)
                    if unattended is not None and unattended[0] == others:
                        planned = unattended[1]  # the same plan (``PolicyRules.plan_at``)
                    else:
                        planned = _plan_group(groups, id(keys), cp, promptable,
                                              rules.plan_at(f, others, rules.cap.firing(f, promptable)))
                        unattended = (others, planned)
                    if planned is None:
                        continue
                    key = planned
                members.append((idx, mode, key))
        return groups, members


def _plan_group(groups: dict[GroupKey, _Group], keying: int, cp: CompiledPolicy, promptable: bool,
                plan: Plan | None) -> GroupKey | None:
    """The key of the group ``plan`` replays in (made if new), or ``None``: the policy cannot fire.
    ``keying`` is the turn's keys' id: key modes that keyed this turn alike share replays."""
    if plan is None:
        return None
    key = (keying, *plan.signature[1:])
    if key not in groups:
        family = None if plan.cap_call is None else (keying, *plan.family[1:])
        groups[key] = _Group(cp, promptable, plan.first_call, plan.cap_call, family)
    return key


def _censoring(stats: RunStats, turn: RecordedTurn, cohort: str, at_halt: bool) -> tuple[str | None, str | None]:
    """Count the turn's censoring by cohort and say which applies to its replay: ``(cut, short)``."""
    if turn.in_part:
        stats.add_in_part(turn.id, cohort)
        return None, None
    if at_halt:
        stats.halt_ended[cohort] = stats.halt_ended.get(cohort, 0) + 1
        return cohort, None
    if turn.cut_short:
        stats.cut_short[cohort] = stats.cut_short.get(cohort, 0) + 1
        return None, cohort
    return None, None


def _can_fire(rules: PolicyRules, f: TurnFacts, promptable: bool) -> bool:
    """Whether a policy naming tools can fire on a turn whose counts by call are ``f`` (its own
    counts are at most those; ``stale_repeat`` is not monotone, so only its bound is used)."""
    if rules.triggers[promptable].quiet(f):
        return False
    if f.reach_stale is not None:
        f = dataclasses.replace(f, reach_stale=None)
    return rules.plan(f, promptable) is not None


_Stale = tuple[GuardConfig, int, int]


def _stale_counting(compiled: list[CompiledPolicy]) -> _Stale | None:
    """For ``reach_stale``: a ledger configuration counting ``stale_repeat`` for every adaptive policy
    using it, and their smallest soft cap and threshold; ``None`` when there is none."""
    stale = [cp for cp in compiled if cp.config.stuck_signal == "stale_repeat" and cp.config.soft_cap
             and cp.config.cap_mode == "adaptive"]
    if not stale:
        return None
    config = stale[0].prefix_config.replace(max_tracked_keys=max(cp.config.max_tracked_keys for cp in stale))
    return (config, min(cp.config.soft_cap for cp in stale), min(cp.config.stuck_repeat_threshold for cp in stale))


@dataclasses.dataclass(frozen=True, slots=True)
class _Group:
    """One replay to run: the first policy of its group, the mode, and its plan's positions."""

    policy: CompiledPolicy
    promptable: bool
    first_call: int
    cap_call: float | None
    family: GroupKey | None

    def capped(self) -> tuple[GroupKey, float]:
        """A family member's family and cap call (``_groups`` sets both or neither)."""
        family, cap_call = self.family, self.cap_call
        assert family is not None and cap_call is not None
        return family, cap_call


class _TurnReplays:
    """The replays of one turn's groups, sharing what they can: in a family of groups differing only
    in a cap's call, one that halted earlier stands for the others, and one going past another's cap
    hands it its state there. The latest cap goes first; a late first check forks a shared prefix."""

    def __init__(self, calibrator: Calibrator, turn: RecordedTurn, keyed: Keyed, starts: list[int],
                 lost: tuple[int, ...], retries: frozenset[int] = frozenset()) -> None:
        self.calibrator = calibrator
        self.turn, self.keyed, self.starts, self.lost, self.retries = turn, keyed, starts, lost, retries
        self.calls: dict[str, list[ToolCall | None]] = {}
        """By key mode: the ``ToolCall`` objects the hooks receive (made on first use)."""
        self.prefixes: dict[tuple[object, ...], SharedPrefix] = {}
        self.results: dict[GroupKey, TurnResult] = {}
        self.donors: dict[GroupKey, list[tuple[float, TurnResult]]] = {}
        """By family: the replays run so far with their cap's call."""
        self.snapshots: dict[GroupKey, Snapshot] = {}
        self.families: dict[GroupKey, list[GroupKey]] = {}

    def run(self, groups: dict[GroupKey, _Group]) -> dict[GroupKey, TurnResult]:
        for key, g in groups.items():
            if g.family is not None:
                self.families.setdefault(g.family, []).append(key)
        for key, g in sorted(groups.items(), key=lambda item: (item[1].first_call, -(item[1].cap_call or 0))):
            if g.family is None:
                self.results[key] = self._replay(g, self._prefix_ledger(g), None)
                continue
            shared = self._shared(key, g)
            if shared is not None:
                self.results[key] = shared
                continue
            result = self.results[key] = self._replay(g, self._prefix_ledger(g), self._snapshots_for(g, groups))
            family, cap_call = g.capped()
            self.donors.setdefault(family, []).append((cap_call, result))
        return self.results

    def _shared(self, key: GroupKey, g: _Group) -> TurnResult | None:
        """The group's result from its family, when it has one: a replay that halted before both
        caps (for another reason), or a replay from the state another one left at this cap."""
        family, at = g.capped()
        donor = next((r for c, r in self.donors.get(family, ()) if 0 < r.halt_call < min(c, at)), None)
        if donor is not None:
            return donor
        snap = self.snapshots.pop(key, None)
        if snap is None or snap.taken is None:
            return None
        # Its checks agreed with an earlier replay's until its cap: go on from there.
        ledger, asks = snap.taken
        return self._replay(g, ledger, None, first_check=int(at), asks_before=asks)

    def _snapshots_for(self, g: _Group, groups: dict[GroupKey, _Group]) -> dict[int, list[Snapshot]] | None:
        """The states this replay is to hand to the others of its family whose cap comes first
        (0-based call index before which each is taken)."""
        wanted: dict[int, list[Snapshot]] | None = None
        family, cap_call = g.capped()
        for other in self.families[family]:
            c = groups[other].capped()[1]
            if other not in self.results and other not in self.snapshots and g.first_call <= c < cap_call:
                snap = self.snapshots[other] = Snapshot(groups[other].policy.config, groups[other].promptable)
                wanted = wanted or {}
                wanted.setdefault(int(c) - 1, []).append(snap)
        return wanted

    def _prefix_ledger(self, g: _Group) -> Ledger | None:
        """A ledger holding the calls before the group's first check, forked from a prefix shared per
        keying and per setting the facts depend on; ``None``: count from the first call."""
        first, config = g.first_call, g.policy.config
        if not self.calibrator.group or first <= 1:
            return None
        keys, facts = self.keyed[config.key_mode]
        stuck = config.stuck_repeat_threshold
        reach = facts.reach_repeat
        reached = stuck <= len(reach) and reach[stuck - 1] < first
        cycling = config.cycle_repeat_max_period if in_force("cycle_repeat_max_period", config.__getattribute__) else 0
        where = (id(keys), stuck if reached else 0, config.max_tracked_keys, config.stuck_signal,
                 config.streak_stop_on, cycling)
        prefix = self.prefixes.get(where)
        if prefix is None:
            prefix = self.prefixes[where] = SharedPrefix(config if reached else g.policy.prefix_config, self.turn,
                                                         keys, self.starts, self.lost)
        return prefix.fork_at(first, config, g.promptable)

    def _replay(self, g: _Group, ledger: Ledger | None, snapshots: dict[int, list[Snapshot]] | None, *,
                first_check: int | None = None, asks_before: tuple[int, ...] = ()) -> TurnResult:
        key_mode = g.policy.config.key_mode
        calls = self.calls.get(key_mode)
        if calls is None:
            calls = self.calls[key_mode] = [None] * len(self.turn.calls)
        self.calibrator.stats.replays += 1
        return replay_turn(g.policy, self.turn, calls, self.keyed[key_mode][0], self.starts,
                           promptable=g.promptable, first_check=g.first_call if first_check is None else first_check,
                           ledger=ledger, asks_before=asks_before, snapshots=snapshots, lost=self.lost,
                           retries=self.retries)

def _plain_text_args(turn: RecordedTurn) -> bool:
    """Every call has a recorded digest or text arguments that are not JSON (a shell command):
    both key modes key such text as itself, so they see the same repeats (``keys.is_json_text``)."""
    if None not in map(_DIGEST, turn.calls):
        return True
    for call in turn.calls:
        if call[2] is not None:  # call.digest
            continue
        args = call[1]  # call.args
        if type(args) is not str or is_json_text(args):
            return False
    return True


def _has_binary_args(turn: RecordedTurn) -> bool:
    """Bytes arguments are where byte identity is not a refinement of canonical identity (bytes
    that are not UTF-8); JSON input never has them, hand-built turns might."""
    return any(issubclass(t, _BINARY) for t in set(map(type, map(_ARGS, turn.calls))))


_BINARY = (bytes, bytearray, memoryview)
_ARGS = operator.itemgetter(1)  # RecordedCall.args
_DIGEST = operator.itemgetter(2)  # RecordedCall.digest
_OUTCOME = operator.itemgetter(3)  # RecordedCall.outcome
