"""Which policies can share one replay of a turn, and which cannot fire on it at all.

Each policy says what it can do on a turn (its ``firing_rule``) from the turn's ``TurnFacts``:
upper bounds of the ledger's counts over the whole turn. Here they are combined into a ``Plan`` per
policy, turn and mode: equal ``signature``s give identical replays, ``None`` means only ALLOW can
occur (the replay is skipped). Why the engine's shortcuts hold:

- byte identity refines canonical identity, so counts under ``bytes`` are at most those under
  ``canonical``: quiet there, quiet here; and a finer identity with as many distinct keys is the
  same partition of the calls;
- a plan on call counts alone (``identity_free``) is the same under any identity;
- replays differing only in where a cap halts (``cap_call``) agree until that call.

``tests/test_calibrate_equivalence.py`` replays random turns with and without grouping and
requires identical results."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple, cast

from turnguard._calibrate.grid import Policy
from turnguard._calibrate.records import Unreported
from turnguard._config import GuardConfig
from turnguard._firing import SILENT, Firing, FiringRule, Triggers, TurnFacts
from turnguard._ledger import Ledger, count_outcome
from turnguard._model import Outcome
from turnguard._policies import cap, cycle_repeat, cycles, streak

Signature = tuple[object, ...]


def turn_facts(digests: Sequence[bytes], settled: Sequence[Outcome], starts: Sequence[int]) -> TurnFacts:
    """The facts of one turn (one pass over its keys); ``starts`` as ``replay.cycle_starts``,
    ``settled`` the calls' outcomes with each unfinished one failing (``as_failing``).
    ``reach_stale`` is left out: it costs a ledger pass (``stale_reach``), made only when needed."""
    reach_repeat: list[int] = []
    reach_run: list[int] = []
    reach_failing: list[int] = []
    counts: dict[bytes, int] = {}
    get = counts.get
    last = None
    run = errors = most_seen = most_run = most_failing = 0
    error, settle = Outcome.ERROR, count_outcome
    if len(digests) != len(settled):
        raise ValueError("one outcome per key")
    cycle_calls = []
    for slot, n in enumerate(starts):
        cycle_calls.extend([slot + 1] * n)
    if len(set(digests)) == len(digests):  # no call repeats (most calls of long turns): the loop's answer, in C
        failing = (settled.index(error) + 1,) if error in settled else ()
        first = (1,) if digests else ()
        return TurnFacts(len(digests), len(cycle_calls), first, first, failing, tuple(cycle_calls), len(digests))
    for k, digest, outcome in zip(itertools.count(1), digests, settled):
        seen = counts[digest] = get(digest, 0) + 1
        if seen > most_seen:
            most_seen = seen
            reach_repeat.append(k)
        if digest == last:
            run += 1
            if run > most_run:
                most_run = run
                reach_run.append(k)
        else:
            last, run, errors = digest, 1, 0
            if not most_run:
                most_run = 1
                reach_run.append(k)
        errors = settle(outcome, errors, 0, 0, False)[0]  # the ledger's rule: the failing count in check order
        if errors > most_failing:
            most_failing = errors
            reach_failing.append(k)
    return TurnFacts(len(digests), len(cycle_calls), tuple(reach_repeat), tuple(reach_run), tuple(reach_failing),
                     tuple(cycle_calls), len(counts))


def as_failing(outcomes: Sequence[Outcome | Unreported], lost: Sequence[int]) -> Sequence[Outcome]:
    """``outcomes`` as ``turn_facts`` takes them: each unfinished one (``lost``, from
    ``replay.unfinished_calls``) an ``ERROR``. The live guard counts a call still waiting as a
    failure of its streak, so that is as far as its streak can reach."""
    if not lost:
        return cast(Sequence[Outcome], outcomes)
    return [o if isinstance(o, Outcome) else Outcome.ERROR for o in outcomes]


def stale_reach(config: GuardConfig, digests: Sequence[bytes]) -> tuple[int, ...]:
    """The first call at which ``Ledger.max_stale_repeat`` reaches it, counted by the ledger itself;
    it depends on the keys alone, so one pass serves every replay."""
    ledger = Ledger(config, turn_id="facts")
    count = ledger.count_call
    reach: list[int] = []
    most = 0
    for k, digest in enumerate(digests, 1):
        count(digest, "")
        stale = ledger.max_stale_repeat
        if stale > most:
            reach.extend([k] * (stale - most))  # a loop coming round credits several at once
            most = stale
    return tuple(reach)


class Plan(NamedTuple):
    """What one policy can do on one turn in one mode (a named tuple, like ``Firing``: one is made
    per policy and turn)."""

    signature: Signature
    """Equal signatures (under one keying of the turn) replay identically."""
    first_call: int
    """The first call at which any of its checks can change the replay's result; a replay may run
    the ledger alone before it."""
    cap_call: float | None
    """The call its cap halts at (``inf``: cannot fire) when known exactly, else ``None``."""
    identity_free: bool
    """Nothing fires that depends on which calls are the same call (an explicit cap, a backstop, a
    cycle cap): under a finer identity (smaller counts) the plan, and the replay, stay the same."""

    @property
    def family(self) -> Signature:
        """The signature without the cap: the plans whose replays differ only in ``cap_call``."""
        return (*self.signature[:_CAP], *self.signature[_CAP + 1:])


class PolicyRules:
    """The firing rules of one policy's checks (read once per policy, not per turn): the cap, the
    streak, the cycle cap and ``cycle_repeat``, then its extra rules."""

    __slots__ = ("cap", "named", "others", "prefix", "triggers")

    def __init__(self, policy: Policy, shared: dict[tuple[FiringRule, ...], tuple[FiringRule, ...]] | None = None):
        config = policy.config
        off = set(config.disable_plugins)
        self.cap: FiringRule = SILENT if "cap" in off else cap.firing_rule(config)
        """The rule whose halts are known exactly (``Firing.halt_call``): plans that differ only
        there share what they have in common."""
        others: tuple[FiringRule, ...] = (
            *(SILENT if name in off else module.firing_rule(config)
              for name, module in (("streak", streak), ("cycles", cycles), ("cycle_repeat", cycle_repeat))),
            *policy.extras)
        self.others: tuple[FiringRule, ...] = others if shared is None else shared.setdefault(others, others)
        """The other rules (equal ones shared through ``shared``: grids vary the cap most, and
        ``plan``'s memo then reads the others once per turn)."""
        self.prefix = (config.key_mode, config.max_tracked_keys, config.fail_mode)
        self.named = bool(config.stateful_tools or config.streak_exempt_tools)
        """The policy names tools: its counts are by (call, result), with restarts, and a plan on
        the counts by call only bounds them (``engine``: it replays alone where it can fire)."""
        rules = (self.cap, *others)
        self.triggers = tuple(Triggers.lowest([r.triggers(promptable) for r in rules]) for promptable in (False, True))
        """By ``promptable``: the least counts at which any of the rules can fire."""

    def plan(self, f: TurnFacts, promptable: bool, memo: dict[tuple[int, bool], _Others] | None = None) -> Plan | None:
        """What the policy can do on a turn with facts ``f``; ``None``: nothing. ``memo`` keeps
        what the rules other than the cap say on ``f``, for the policies that share them."""
        return self.plan_at(f, self.others_on(f, promptable, memo), self.cap.firing(f, promptable))

    def others_on(self, f: TurnFacts, promptable: bool, memo: dict[tuple[int, bool], _Others] | None) -> _Others:
        """What the rules other than the cap say on ``f``, kept in ``memo`` (see ``plan``)."""
        key = (id(self.others), promptable)
        found = memo.get(key) if memo is not None else None
        if found is None:
            found = self._others(f, promptable)
            if memo is not None:
                memo[key] = found
        return found

    def plan_at(self, f: TurnFacts, others: _Others, at_cap: Firing | None) -> Plan | None:
        """``plan`` from the other rules and the cap on ``f`` (the cap ignores ``promptable``)."""
        parts, first, identity_free = others
        if at_cap is None:
            return None if not parts else Plan((*self.prefix, None, *parts), first, math.inf, identity_free)
        return Plan((*self.prefix, at_cap.part, *parts), min(first, at_cap.first_call), at_cap.halt_call,
                    identity_free and at_cap.counts_only)

    def _others(self, f: TurnFacts, promptable: bool) -> _Others:
        parts: list[object] = []
        first = f.calls + 2
        identity_free = True
        for rule in self.others:
            firing = rule.firing(f, promptable)
            if firing is not None:
                parts.append(firing.part)
                first = min(first, firing.first_call)
                identity_free = identity_free and firing.counts_only
        return tuple(parts), first, identity_free


_Others = tuple[tuple[object, ...], int, bool]
"""What the rules other than the cap say on a turn: their parts, the first call, identity-free."""
_CAP = 3
"""Where the cap's part sits in a signature: after the prefix (key mode, tracked keys, fail mode)."""


def signature(policy: Policy, f: TurnFacts, promptable: bool) -> Signature | None:
    """Equal signatures replay identically on this turn; ``None``: the policy cannot fire."""
    plan = PolicyRules(policy).plan(f, promptable)
    return None if plan is None else plan.signature


def earliest_call(policy: Policy, f: TurnFacts, promptable: bool) -> int:
    """The first call (1-based) at which any of the policy's checks can change the replay's result
    (a cycle check counts for the call it precedes); before it the ledger may run alone."""
    plan = PolicyRules(policy).plan(f, promptable)
    return f.calls + 2 if plan is None else plan.first_call


def grid_triggers(policies: Sequence[Policy], *, attended: bool) -> Triggers:
    """The least trigger of each kind over a grid: a turn below all of them is quiet for every
    policy (attended: for both modes, since the attended triggers include the unattended ones)."""
    return Triggers.lowest([PolicyRules(p).triggers[attended] for p in policies])
