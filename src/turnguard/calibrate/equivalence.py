"""Which policies can share one replay of a turn, and which cannot fire on it at all.

A replay is expensive; most policies of a grid behave identically on most turns. The rules here
are derived from what each built-in policy reads (``policies/cap.py``, ``streak.py``,
``cycles.py``) and from ``TurnFacts``, upper bounds of the ledger's counts over the whole turn.
A policy's ``signature`` on a turn keeps only the parameters that can still change a verdict;
equal signatures give identical replays, and ``None`` means no verdict other than ALLOW can
occur (the replay is skipped: it would add nothing to the figures). The rules:

- cap, explicit ``N``: only ``n > N`` fires, so a turn of ``L <= N`` calls never reaches it.
  Explicit ``N <= 0`` and adaptive ``S <= 0``: disabled.
- cap, adaptive ``S``/``H``/``D``: nothing fires while ``n <= S``, so ``L <= S`` is quiet. Past
  ``S`` the stuck verdict needs the signal's count to reach ``D``; for ``repeat`` and
  ``stale_repeat`` that count never exceeds the turn's largest repeat, so a larger ``D`` collapses
  to "never"; the backstop needs ``n > H``, impossible when ``H >= L`` (``H`` collapses to
  "never"); both never: quiet. Other stuck signals: no collapse, checks from ``S + 1``.
- cap, exactly: when the ledger counts every key (the turn's distinct keys fit in
  ``max_tracked_keys``) and the signal's count is known call by call (``repeat``: the largest
  repeat; ``stale_repeat``: read from a ledger driven through the turn, ``stale_reach``), the stuck
  verdict comes at ``max(S + 1, the call the count reaches D)``, and the backstop at ``H + 1``
  if that is earlier. The cap is then only what it does and where (``("soft_stuck", call)``,
  ``("hard_backstop", call)``): policies with other ``S``, ``H``, ``D`` or signal that halt at the
  same call share a replay.
- streak, unattended: the warn level returns ALLOW (observed) and changes no ledger fact, so only
  the stop level matters; it needs ``failing_streak_length == stop_at``, bounded by the most
  ``ERROR`` outcomes inside one run of identical keys (with ``streak_stop_on="any"`` it counts
  every outcome but a denial: bounded by the run itself). Attended: the warn level ASKs (and the
  replay's "continue" resets the streak), so it matters when ``stop``/``warn`` can be reached:
  ``streak_length <= `` the longest run of identical keys. An answer only resets counts, so the
  bounds hold after it. Attended and unattended replays of a policy whose streak cannot fire are
  identical (``promptable`` is read by the streak policy only), so they share one signature.
  Attended, a warning level at or below the stop level (and no ``remind_model``) means the stop
  never fires: the warning's ASK, answered, restarts the streak, and the failing (or settled)
  count never exceeds the streak.
- what a collapsed threshold was attached to does not matter either: with ``D`` collapsed, which
  bounded stuck signal the policy uses is left out of its signature; with the stop level unable to
  fire, so is what it counts (``streak_stop_on``).
- cycle cap ``N``: fires only when the turn has more than ``N`` model requests.
- extra rules: each says when it can fire (``HaltOnIdenticalCalls(n)``: a run of ``n``).
- key modes: byte identity refines canonical identity (two calls with byte-identical arguments
  have identical canonical arguments, for every argument that is not ``bytes``), so a turn's
  counts under ``bytes`` are at most its counts under ``canonical``: when the ``bytes`` policies
  are quiet on the canonical facts, the turn's ``bytes`` keys are not even computed. And when
  every argument of a turn is text that cannot be JSON (its first character is none of
  ``{["-0-9`` and it is not ``true``/``false``/``null``: a shell command) or a recorded digest,
  the canonical form of each is the text itself (DESIGN 3.1), so both modes count the same
  repeats and the turn is keyed once. Otherwise, a finer identity with as many distinct keys as
  the coarser one is the same partition of the calls: same counts, same replays.
- a signature whose parts cannot depend on identity (``identity_free``: an explicit cap, a
  backstop, a cycle cap) is the same under a finer identity: those turns are not keyed again.
- replays that differ only in a cap halting at a known call (``cap_call``) agree until that call:
  one that halted earlier for another reason is the result of the others, and one that went past
  it hands them its state there (``replay.Snapshot``): each runs its own checks only from its cap's
  call (``engine.py``).

``tests/test_calibrate_equivalence.py`` replays random turns with and without grouping and
requires identical results, so a change in a policy that breaks a rule fails there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from turnguard.calibrate.grid import Policy
from turnguard.config import GuardConfig
from turnguard.ledger import Ledger
from turnguard.model import Outcome

Signature = tuple[object, ...]
NEVER = None


@dataclass(frozen=True, slots=True)
class TurnFacts:
    """Upper bounds of the ledger's counts over one turn under one key mode, and the first call
    (1-based) at which each bound reaches each value: ``reach_repeat[r - 1]`` is the first call at
    which some key has been seen ``r`` times, and so on."""

    calls: int
    cycles: int
    reach_repeat: tuple[int, ...]
    """By repeat count: the first call at which one key occurs that many times."""
    reach_run: tuple[int, ...]
    """By run length: the first call ending a run of that many consecutive identical keys."""
    reach_failing: tuple[int, ...]
    """By count: the first call ending a run holding that many ``ERROR`` outcomes (an upper bound of
    the failing streak, which also resets on ``OK``/``UNKNOWN``)."""
    cycle_calls: tuple[int, ...]
    """By model request number: the call it begins before (``calls + 1``: after the last call)."""
    distinct: int = 0
    """Distinct keys in the turn: at most ``max_tracked_keys`` means the ledger's counts are exact."""
    reach_stale: tuple[int, ...] | None = None
    """By count: the first call at which the ``stale_repeat`` signal's count (``Ledger.max_stale_repeat``,
    read from a ledger driven through the turn: ``stale_reach``) reaches it; ``None``: not computed
    (``reach_repeat`` bounds it)."""

    @property
    def max_repeat(self) -> int:
        return len(self.reach_repeat)

    @property
    def max_run(self) -> int:
        return len(self.reach_run)

    @property
    def max_failing(self) -> int:
        return len(self.reach_failing)


def turn_facts(digests: Sequence[bytes], outcomes: Sequence[Outcome], starts: Sequence[int]) -> TurnFacts:
    """The facts of one turn (one pass over its keys); ``starts`` as ``replay.cycle_starts``.
    ``reach_stale`` is left out: it costs a ledger pass (``stale_reach``), made only when needed."""
    reach_repeat: list[int] = []
    reach_run: list[int] = []
    reach_failing: list[int] = []
    counts: dict[bytes, int] = {}
    get = counts.get
    last = None
    run = errors = most_seen = most_run = most_failing = 0
    error = Outcome.ERROR
    if len(digests) != len(outcomes):
        raise ValueError("one outcome per key")
    for k, digest, outcome in zip(itertools.count(1), digests, outcomes):
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
        if outcome is error:
            errors += 1
            if errors > most_failing:
                most_failing = errors
                reach_failing.append(k)
    cycle_calls = []
    for slot, n in enumerate(starts):
        cycle_calls.extend([slot + 1] * n)
    return TurnFacts(len(digests), len(cycle_calls), tuple(reach_repeat), tuple(reach_run), tuple(reach_failing),
                     tuple(cycle_calls), len(counts))


def stale_reach(config: GuardConfig, digests: Sequence[bytes]) -> tuple[int, ...]:
    """By count, the first call at which ``Ledger.max_stale_repeat`` reaches it: the ledger itself
    counts (its ``stale_repeat`` semantics are not restated here). The count depends on the keys
    alone (not on outcomes, model requests or answered asks), so one pass serves every replay."""
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


BOUNDED_SIGNALS = frozenset(("repeat", "stale_repeat"))
"""Stuck signals whose count never exceeds a key's repeats in the turn (``max_key_repeat``): the
``repeat`` count is that number; ``stale_repeat`` counts a key's repeats since the last new key,
a part of them. For these, a threshold D above the turn's largest repeat never fires."""


@dataclass(frozen=True, slots=True)
class Traits:
    """What the rules read from a policy, as plain values (read once per policy, not per turn)."""

    cap: int  # 0: off, 1: explicit, 2: adaptive
    limit: int  # explicit N, or adaptive S
    hard: int  # H (adaptive)
    stuck: int  # D (adaptive)
    bounded_signal: bool
    signal: str
    exact_signal: bool
    """The stuck signal's count is in the facts (``repeat``: ``reach_repeat``; ``stale_repeat``:
    ``reach_stale`` when computed), so the call at which it reaches D is known, not only bounded."""
    stale: bool
    max_keys: int
    warn: int
    stop: int
    stop_any: bool
    """The stop level counts every identical call but denials (``streak_stop_on="any"``), not
    only failures: bounded by the run, not by the errors in it."""
    remind: bool
    cycles: int
    extras: tuple[int, ...]
    prefix: tuple[object, ...]

    @classmethod
    def of(cls, policy: Policy) -> Traits:
        c = policy.config
        mode = c.cap_mode
        cap = {"explicit": 1, "adaptive": 2}.get(mode, 0)
        limit = c.max_tool_calls_per_turn if cap == 1 else c.soft_cap
        stop_on = c.streak_stop_on
        return cls(cap, limit or 0, c.hard_cap or 0, c.stuck_repeat_threshold, c.stuck_signal in BOUNDED_SIGNALS,
                   c.stuck_signal, c.stuck_signal in ("repeat", "stale_repeat"),
                   c.stuck_signal == "stale_repeat", c.max_tracked_keys, c.streak_warn_at,
                   c.streak_stop_at, stop_on != "error", c.remind_model,
                   c.max_cycles_per_turn, tuple(r.n for r in policy.extras),
                   (c.key_mode, c.max_tracked_keys, c.fail_mode))


def signature(policy: Policy, f: TurnFacts, promptable: bool) -> Signature | None:
    """Equal signatures replay identically on this turn; ``None``: the policy cannot fire.
    (``traits_signature`` with traits computed once, for loops over many turns.)"""
    return traits_signature(Traits.of(policy), f, promptable)


def traits_signature(t: Traits, f: TurnFacts, promptable: bool) -> Signature | None:
    calls = f.calls
    cap: Signature | None = None
    if t.cap == 1:
        if calls > t.limit:
            cap = ("explicit", t.limit)
    elif t.cap == 2 and calls > t.limit:
        if t.exact_signal and f.distinct <= t.max_keys and (not t.stale or f.reach_stale is not None):
            # Exact counts: the stuck verdict comes at a known call (or never). The cap is then
            # just what it does and where: S, D and H matter only through that.
            stuck_at = stuck_call(t, f)
            if t.hard < calls and (stuck_at is NEVER or t.hard < stuck_at):
                cap = ("hard_backstop", t.hard + 1)
            elif stuck_at is not NEVER:
                cap = ("soft_stuck", stuck_at)
        elif not t.bounded_signal or t.stuck <= len(f.reach_repeat):
            cap = ("adaptive", t.limit, t.signal, t.stuck, t.hard if t.hard < calls else NEVER)
        elif t.hard < calls:
            cap = ("hard_backstop", t.hard + 1)  # the signal cannot fire: which one is moot
    stop_reach = f.reach_run if t.stop_any else f.reach_failing
    stop = t.stop if t.stop and len(stop_reach) >= t.stop else NEVER
    streak: Signature | None = None
    if stop is not NEVER:
        stop = (stop, t.stop_any)  # what the stop level counts matters only when it can fire
    if not promptable:
        if stop is not NEVER:
            streak = ("unattended", stop)
    else:
        warn = t.warn if t.warn and len(f.reach_run) >= t.warn else NEVER
        if t.warn and not t.remind and t.stop >= t.warn:
            stop = NEVER  # the warning's ASK, answered, restarts the streak before it can stop
        if warn is not NEVER or stop is not NEVER:
            streak = ("attended", warn, stop, t.remind)
    cycles = ("cycles", t.cycles) if t.cycles and f.cycles > t.cycles else NEVER
    extras = tuple(("identical", n) for n in t.extras if len(f.reach_run) >= n) if t.extras else ()
    if cap is None and streak is None and cycles is None and not extras:
        return None
    return (*t.prefix, cap, streak, cycles, extras)


def stuck_call(t: Traits, f: TurnFacts) -> int | None:
    """The first call past the soft cap at which an adaptive cap's bounded stuck signal can hold,
    or ``None``: never. For ``repeat`` while the ledger counts every key (``distinct <=
    max_tracked_keys``) it is the call the signal holds at; otherwise a lower bound (an
    uncounted key, or a signal that counts only some repeats, only lowers the count)."""
    reach = f.reach_stale if t.stale and f.reach_stale is not None else f.reach_repeat
    if t.stuck > len(reach):
        return NEVER
    return max(t.limit + 1, reach[t.stuck - 1])


_CAP = 3
"""Where the cap's part sits in a signature: after the prefix (key mode, tracked keys, fail mode)."""


def cap_call(sig: Signature) -> float | None:
    """The call at which the signature's cap halts (``inf``: never), when the signature says
    exactly: an explicit cap, a stuck verdict at a known call, a backstop. ``None`` otherwise.

    Two replays whose signatures differ only there behave alike until the earlier of the two
    calls: one that halted before both (for another reason) is the result of both."""
    cap = sig[_CAP]
    if cap is None:
        return math.inf
    kind = cap[0]
    if kind == "explicit":
        return cap[1] + 1
    if kind in ("soft_stuck", "hard_backstop"):
        return cap[1]
    return None


def identity_free(sig: Signature) -> bool:
    """Nothing in the signature depends on which calls are the same call: only an explicit cap,
    a backstop (call counts) or a cycle cap can fire. Under a finer identity (smaller counts) such
    a signature stays the same, and so does the replay."""
    cap = sig[_CAP]
    return (cap is None or cap[0] in ("explicit", "hard_backstop")) and sig[_CAP + 1] is None and not sig[_CAP + 3]


def without_cap(sig: Signature) -> Signature:
    return (*sig[:_CAP], *sig[_CAP + 1:])


def earliest_call(policy: Policy, f: TurnFacts, promptable: bool) -> int:
    """The first call (1-based) at which any of the policy's checks can return a verdict that
    changes the replay's result (a cycle check counts for the call it precedes); a replay may run
    the ledger alone before it. The same rules as ``signature``, read as positions."""
    return traits_earliest_call(Traits.of(policy), f, promptable)


def traits_earliest_call(t: Traits, f: TurnFacts, promptable: bool) -> int:
    """``earliest_call`` with the policy's traits computed once."""
    first = f.calls + 2
    if t.cap == 1:
        if f.calls > t.limit:
            first = t.limit + 1
    elif t.cap == 2 and f.calls > t.limit:
        if t.hard < f.calls:
            first = t.hard + 1
        if not t.bounded_signal:
            first = min(first, t.limit + 1)
        else:
            stuck_at = stuck_call(t, f)
            if stuck_at is not NEVER:
                first = min(first, stuck_at)
    stop_reach = f.reach_run if t.stop_any else f.reach_failing
    if t.stop and t.stop <= len(stop_reach):
        first = min(first, stop_reach[t.stop - 1])
    if promptable and t.warn and t.warn <= len(f.reach_run):
        first = min(first, f.reach_run[t.warn - 1])
    if t.cycles and f.cycles > t.cycles:
        first = min(first, f.cycle_calls[t.cycles])
    for n in t.extras:
        if n <= len(f.reach_run):
            first = min(first, f.reach_run[n - 1])
    return first


@dataclass(frozen=True, slots=True)
class GridBounds:
    """The smallest trigger of each kind over a grid: a turn below all of them is quiet for
    every policy, checked with four comparisons instead of a signature per policy."""

    calls: float
    run: float
    failing: float
    cycles: float

    @classmethod
    def of(cls, policies: Sequence[Policy], attended: bool) -> GridBounds:
        inf = float("inf")
        calls = run = failing = cycles = inf
        for p in policies:
            c = p.config
            mode = c.cap_mode
            if mode == "explicit":
                calls = min(calls, c.max_tool_calls_per_turn)
            elif mode == "adaptive":
                calls = min(calls, c.soft_cap)
            if c.streak_stop_at:
                if c.streak_stop_on == "error":
                    failing = min(failing, c.streak_stop_at - 1)
                else:
                    run = min(run, c.streak_stop_at - 1)
            if attended and c.streak_warn_at:
                run = min(run, c.streak_warn_at - 1)
            if c.max_cycles_per_turn:
                cycles = min(cycles, c.max_cycles_per_turn)
            for rule in p.extras:
                run = min(run, rule.n - 1)
        return cls(calls, run, failing, cycles)

    def quiet(self, f: TurnFacts) -> bool:
        """True when no policy of the grid can fire on a turn with these facts."""
        return f.calls <= self.calls and f.max_run <= self.run and f.max_failing <= self.failing and (
            f.cycles <= self.cycles
        )
