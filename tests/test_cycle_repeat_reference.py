"""``cycle_repeat`` against a plain reference written from the documented rules (docs/usage.md's
"what fires" table, docs/stuck-signals.md), on random turns: any levels, periods, stateful tools
with results that change, stay or are not given, denials, an exempt tool's calls, outcomes that
never come, answers, reminders, batches with outcomes in any order, and a turn paused into a
durable snapshot and resumed on another guard.

The reference shares nothing with the ledger: it keeps the whole sequence of calls seen since the
last answer and looks at its tail. A cycle of ``k`` calls (2 to the maximum period, not itself a
shorter cycle repeated: that one is the shorter cycle's, and one call repeated is the streak's)
reaches a level of ``L`` repetitions at the call that makes the last ``L * k`` calls that cycle
repeated ``L`` times and not one call sooner; a stop before a warning, a shorter period first."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

import turnguard as tg
from turnguard._ledger import _cycles as cycles

POOL = ("read", "list", "grep", "status", "edit", "sleep")
STATEFUL = ("status",)
"""A polling tool: its calls are compared with their result (a changed one is progress)."""
EXEMPT = ("sleep",)
"""A tool out of the streak (``streak_exempt_tools``): its call is a call no other is, so it ends
every cycle (as it ends the streak)."""
WAIT_BEHIND = 32
"""docs/usage.md: a call whose outcome never comes is seen as having run once the call 32 checks
after it has its outcome."""


@dataclass(frozen=True)
class Call:
    name: str
    arg: int
    outcome: tg.Outcome | None
    """``None``: its outcome never comes."""
    result: str | None

    def identity(self, latest: dict[tuple[str, int], str]) -> object:
        """What the documented rules compare: the call, and a stateful tool's result (when not
        given, the latest its call had: ``latest``, which this updates); an exempt tool's call
        equals no other."""
        if self.name in EXEMPT:
            return object()
        if self.name not in STATEFUL:
            return (self.name, self.arg, None)
        if self.result is not None and self.outcome is not None:  # (no outcome: no result either)
            latest[self.name, self.arg] = self.result
        return (self.name, self.arg, latest.get((self.name, self.arg)))

    def tool_call(self) -> tg.ToolCall:
        return tg.ToolCall(self.name, {"arg": self.arg})


@dataclass(frozen=True)
class Settings:
    warn: int
    stop: int
    period: int
    promptable: bool
    remind: bool

    def config(self) -> tg.GuardConfig:
        return tg.GuardConfig(cycle_repeat_warn_at=self.warn, cycle_repeat_stop_at=self.stop,
                              cycle_repeat_max_period=self.period, remind_model=self.remind,
                              streak_warn_at=0, streak_stop_at=0, stateful_tools=STATEFUL,
                              streak_exempt_tools=EXEMPT)

    def action(self, level: tg.Level) -> tg.Action:
        if level is tg.Level.STOP:
            return tg.Action.ASK if self.promptable else tg.Action.HALT
        if self.remind:
            return tg.Action.REMIND
        return tg.Action.ASK if self.promptable else tg.Action.ALLOW


def random_settings(rng: random.Random) -> Settings:
    warn = rng.choice((0, 2, 3, 4, 5))
    stop = rng.choice([s for s in (0, 2, 3, 4, 5, 6, 8) if not warn or not s or s >= warn])
    if not warn and not stop:
        stop = 3
    return Settings(warn, stop, rng.randint(2, 4), rng.random() < 0.5, rng.random() < 0.3)


def random_turn(rng: random.Random, n: int = 90, lost: float = 0.0) -> list[Call]:
    """Loops of 1 to 4 calls repeated 1 to 9 times between stray calls (under the soft cap, so
    nothing but the cycles can fire); a polling tool's result now and then changes or is not given;
    a share ``lost`` of the outcomes never comes."""
    calls: list[Call] = []
    while len(calls) < n:
        loop = [(rng.choice(POOL), rng.randrange(3)) for _ in range(rng.choice((1, 2, 2, 3, 4)))]
        results = {i: rng.choice(("r1", "r2")) for i in range(len(loop))}
        for _ in range(rng.randint(1, 9)):
            for i, (name, arg) in enumerate(loop):
                if rng.random() < 0.08:
                    results[i] = rng.choice(("r1", "r2", "r3"))
                outcome = None if rng.random() < lost else rng.choices(list(tg.Outcome), (0.6, 0.25, 0.1, 0.05))[0]
                result = None if rng.random() < 0.1 else results[i]
                calls.append(Call(name, arg, outcome, result))
        calls.extend(Call(rng.choice(POOL), 5, tg.Outcome.OK, None) for _ in range(rng.choice((0, 0, 1))))
    return calls[:n]


def primitive(cycle: list[object]) -> bool:
    k = len(cycle)
    return not any(cycle == cycle[:d] * (k // d) for d in range(1, k) if k % d == 0)


def reached(seen: list[object], times: int, k: int) -> bool:
    """Whether the call just seen makes the last ``times * k`` calls one cycle of ``k`` repeated
    ``times`` times, and the call before it did not already."""
    w = times * k
    if times < 2 or len(seen) < w:
        return False
    tail = seen[-w:]
    if tail != tail[:k] * times or not primitive(tail[:k]):
        return False
    return len(seen) == w or seen[-w - 1] != seen[-w - 1 + k]


def settlings(calls: list[Call]) -> list[tuple[int, list[int]]]:
    """One call at a time, each outcome reported after its check: (the call whose outcome was
    reported, the calls that outcome settles, in check order). Calls settle in check order, so one
    whose outcome never comes holds the later ones back until the call ``WAIT_BEHIND`` checks after
    it has its outcome: then it is seen as having run."""
    steps: list[tuple[int, list[int]]] = []
    reported: set[int] = set()
    first = 0
    for i, call in enumerate(calls):
        if call.outcome is None:
            continue
        reported.add(i)
        settled = []
        while first <= i - WAIT_BEHIND or first in reported:
            settled.append(first)
            first += 1
        steps.append((i, settled))
    return steps


def reference(calls: list[Call], s: Settings, answer: bool = True) -> list[tuple[int, tg.Action, tg.Level, int]]:
    """(call index, action, level, period) of each detection, one call at a time; a HALT ends the
    turn. One outcome that settles several calls gives one verdict: the first level among them
    that asks or halts (a stop; attended without reminders, a warning too), else the first; the
    others are reported, oldest first, by the next outcomes that reach none. An ASK answered
    "continue" (when ``answer``) starts the count afresh after the call that reached its level:
    the calls settled after it are counted again, and the level they reach (the first that asks
    or halts, else the first) is the next outcome's to report, with any that outcome reaches. A
    level reported by a later outcome than the one that reached it (the others) restarts the
    count after the calls settled so far. An answer drops the levels owed from calls after its
    place, not those before it."""
    seen: list[object] = []
    settled_so_far: list[tuple[int, object]] = []
    latest: dict[tuple[str, int], str] = {}
    owed: list[tuple[int, tg.Level, int]] = []
    held: list[tuple[int, tg.Level, int]] = []
    fired = []

    def acts(level: tg.Level) -> bool:
        return level is tg.Level.STOP or (s.promptable and not s.remind)

    def see(entries: list[tuple[int, object]]) -> list[tuple[int, tg.Level, int]]:
        hits = []
        for j, identity in entries:
            seen.append(identity)
            hit = next(((level, k) for level, times in ((tg.Level.STOP, s.stop), (tg.Level.WARN, s.warn))
                        for k in range(2, s.period + 1) if reached(seen, times, k)), None)
            if hit is not None:
                hits.append((j, *hit))
        return hits

    def choose(found: list[tuple[int, tg.Level, int]]) -> tuple[int, tg.Level, int]:
        return next((h for h in found if acts(h[1])), found[0])

    for i, settled in settlings(calls):
        entries = [(j, calls[j].identity(latest)) for j in settled if calls[j].outcome is not tg.Outcome.DENIED]
        settled_so_far += entries
        found = held + see(entries)
        held = []
        if found:
            pick, fresh = choose(found), True
            owed += [h for h in found if h is not pick]
        elif owed:
            pick, fresh = owed.pop(0), False
        else:
            continue
        action = s.action(pick[1])
        fired.append((i, action, pick[1], pick[2]))
        if action is tg.Action.HALT:
            break
        if action is tg.Action.ASK and answer:
            seen = []
            if fresh:  # (the owed levels of calls after it were reached in the count it restarts)
                owed = [h for h in owed if h[0] < pick[0]]
                again = see([(j, identity) for j, identity in settled_so_far if j > pick[0]])
                if again:
                    held = [choose(again)]
                    owed += [h for h in again if h is not held[0]]
    return fired


def period_of(verdict: tg.Verdict) -> int:
    """The period the detection names: "a cycle of K identical calls" / "the same K calls"."""
    words = verdict.event.message.split()
    return int(words[words.index("of") + 1] if "cycle" in words else words[words.index("same") + 1])


def one_at_a_time(calls: list[Call], s: Settings, pause_at: frozenset[int] = frozenset()):
    """The live guard, one call at a time, every ASK answered "continue"; before each call in
    ``pause_at`` the turn is snapshotted and resumed on a new guard."""
    turn = tg.Guard(s.config()).turn(promptable=s.promptable, durable=True)
    fired = []
    for i, call in enumerate(calls):
        if i in pause_at:
            turn = tg.Guard(s.config()).resume(turn.snapshot())
        tool_call = call.tool_call()
        turn.check_call(tool_call)
        if call.outcome is None:
            continue
        verdict = turn.record_outcome(tool_call, call.outcome, call.result)
        if verdict.threshold is not tg.Threshold.CYCLE_REPEAT:
            continue
        fired.append((i, verdict.action, verdict.event.level, period_of(verdict)))
        if verdict.action is tg.Action.HALT:
            break
        if verdict.action is tg.Action.ASK:
            turn.resolve(verdict, "continue")
    return fired


@pytest.mark.parametrize("seed", range(300))
def test_one_at_a_time_the_levels_fire_where_the_documented_rules_say(seed):
    """Every other turn has outcomes that never come."""
    rng = random.Random(seed)
    s, calls = random_settings(rng), random_turn(rng, lost=0.03 if seed % 2 else 0.0)
    assert one_at_a_time(calls, s) == reference(calls, s)


@pytest.mark.parametrize("seed", range(100))
def test_a_turn_paused_and_resumed_fires_where_it_would_have(seed):
    rng = random.Random(1000 + seed)
    s, calls = random_settings(rng), random_turn(rng, lost=0.03 if seed % 2 else 0.0)
    pauses = frozenset(rng.sample(range(1, len(calls)), 4))
    assert one_at_a_time(calls, s, pauses) == reference(calls, s)


@pytest.mark.parametrize("seed", range(150))
def test_batches_with_outcomes_in_any_order_fire_the_one_at_a_time_levels(seed):
    """Calls checked in batches of 1 to 6, their outcomes reported shuffled, no ASK answered (an
    answer mid-batch comes after the batch's later outcomes may have settled): the levels and
    periods of one at a time, up to the first halt. One outcome that settles several calls (those
    reported before it waited for it) returns one verdict: the first stop reached in that settling,
    else its first warning; so the first stop is always the one-at-a-time run's, and unattended
    it is the halt, period included."""
    rng = random.Random(2000 + seed)
    s, calls = random_settings(rng), random_turn(rng)
    turn = tg.Guard(s.config()).turn(promptable=s.promptable)
    fired: list[tuple[tg.Action, tg.Level, int]] = []
    i = 0
    while i < len(calls) and not (fired and fired[-1][0] is tg.Action.HALT):
        batch = [(c, c.tool_call()) for c in calls[i:i + rng.randint(1, 6)]]
        i += len(batch)
        for _, tool_call in batch:
            turn.check_call(tool_call)
        rng.shuffle(batch)
        for call, tool_call in batch:
            verdict = turn.record_outcome(tool_call, call.outcome, call.result)
            if verdict.threshold is tg.Threshold.CYCLE_REPEAT:
                fired.append((verdict.action, verdict.event.level, period_of(verdict)))
            if verdict.action is tg.Action.HALT:
                break  # (the halt latches: later outcomes repeat it)
    expected = [(action, level, k) for _, action, level, k in reference(calls, s, answer=False)]
    rest = iter(expected)
    assert all(any(f == e for e in rest) for f in fired), (fired, expected)
    stops = [e for e in expected if e[1] is tg.Level.STOP]
    assert next((f for f in fired if f[1] is tg.Level.STOP), None) == (stops[0] if stops else None)
    assert bool(fired) == bool(expected)


def test_the_reference_sees_the_documented_examples():
    """docs/usage.md: at 5, 8, A,B asks attended at call 10 and halts unattended at call 16, a
    period of 3 at call 24; the reference itself must say so, or it proves nothing."""
    def alternating(names: str, times: int) -> list[Call]:
        return [Call(n, 0, tg.Outcome.OK, None) for n in names] * times
    unattended, attended = Settings(5, 8, 4, False, False), Settings(5, 8, 4, True, False)
    assert reference(alternating("ab", 10), unattended) == [
        (9, tg.Action.ALLOW, tg.Level.WARN, 2), (15, tg.Action.HALT, tg.Level.STOP, 2)]
    assert reference(alternating("ab", 6), attended)[0] == (9, tg.Action.ASK, tg.Level.WARN, 2)
    assert reference(alternating("abc", 10), unattended)[-1] == (23, tg.Action.HALT, tg.Level.STOP, 3)
    assert reference(alternating("abab", 10), unattended)[-1][3] == 2
    assert reference(alternating("a", 40), unattended) == []


@pytest.mark.parametrize("promptable", [False, True])
def test_of_two_stops_settled_by_one_outcome_the_first_is_reported(promptable):
    """A,B,A,A,B,A then B: the period-3 cycle stops at call 6, the period-2 one at call 7. Their
    outcomes in reverse order settle all seven at the first call's: the verdict is the period-3
    stop, as one at a time (unattended, the period-2 stop would never have come)."""
    s = Settings(0, 2, 4, promptable, False)
    calls = [Call(name, 0, tg.Outcome.OK, None) for name in "abaabab"]
    assert [e[3] for e in reference(calls, Settings(0, 2, 4, True, False), answer=False)] == [3, 2]
    turn = tg.Guard(s.config()).turn(promptable=promptable)
    tool_calls = [c.tool_call() for c in calls]
    for tool_call in tool_calls:
        turn.check_call(tool_call)
    verdicts = [turn.record_outcome(t, tg.Outcome.OK) for t in reversed(tool_calls)]
    assert [v.action for v in verdicts[:-1]] == [tg.Action.ALLOW] * 6
    assert (verdicts[-1].action, verdicts[-1].event.level, period_of(verdicts[-1])) == (
        s.action(tg.Level.STOP), tg.Level.STOP, 3)


@pytest.mark.parametrize("lost_at", [0, 7, 40])
def test_an_outcome_that_never_comes_holds_the_cycles_back_by_a_bounded_number_of_calls(lost_at):
    """Unattended at 5, 8: A,B alternating halts at call 16, and with one outcome lost anywhere
    before it at most ``WAIT_BEHIND`` calls later; what waits stays bounded however long the turn
    runs, and its snapshot resumes."""
    assert WAIT_BEHIND == cycles.WAIT_BEHIND  # (what docs/usage.md says is what the ledger does)
    s = Settings(5, 8, 4, False, False)
    lost = [Call("bash", 9, None, None)]
    calls = [Call("read" if i % 2 else "list", 0, tg.Outcome.OK, None) for i in range(lost_at)]
    calls += lost + [Call("read" if i % 2 else "list", 0, tg.Outcome.OK, None) for i in range(200)]
    fired = one_at_a_time(calls, s)
    assert fired == reference(calls, s)
    halt = fired[-1][0]
    assert fired[-1][1] is tg.Action.HALT and halt <= max(lost_at, 15) + 1 + WAIT_BEHIND
    config = s.config().replace(hard_multiplier=1000)
    turn = tg.Guard(config).turn(durable=True)
    for call in [Call("bash", 9, None, None)] + [Call(f"t{i % 7}", i, tg.Outcome.OK, None) for i in range(12_000)]:
        tool_call = call.tool_call()
        turn.check_call(tool_call)
        if call.outcome is not None:
            turn.record_outcome(tool_call, call.outcome)
    waiting = turn.snapshot()["facts"]["cycle_runs"]["waiting"]
    assert len(waiting) <= 1
    assert turn.halted is None and tg.Guard(config).resume(turn.snapshot()).summary is None


def test_a_stateful_calls_latest_result_is_kept_across_a_snapshot():
    """A poll reported with a result, then its repeats without one: they have that result, in the
    turn resumed from a snapshot as in the one that ran on."""
    s = Settings(3, 0, 4, False, False)
    calls = [Call("status", 0, tg.Outcome.OK, "r1"), Call("read", 0, tg.Outcome.OK, None)]
    calls += [Call("status", 0, tg.Outcome.OK, None), Call("read", 0, tg.Outcome.OK, None)] * 3
    expected = reference(calls, s)
    assert expected and one_at_a_time(calls, s) == expected
    assert one_at_a_time(calls, s, frozenset({2})) == expected
