"""Polling tools: a differential test of ``Turn`` against a reference of the result-aware rules.

The reference is written from the rules as the docs state them (docs/polling.md), recomputed from
scratch after every operation, and shares no code or incremental state with the ledger:

- a streak is a run of identical calls in check order (a ``streak_exempt_tools`` call is in none,
  and ends the one it interrupts); a ``stateful_tools`` call whose result differs from the latest
  result given earlier in its streak starts a new segment there (progress), but a result counts
  only once every earlier call of the streak has its outcome (check order), and a ``DENIED``
  call's result is no result (the tool did not run); at a check, a call whose outcome has not
  come counts as a failure without a result, and the calls behind it count as they went, with
  their results;
- the warn level fires at the check whose position in its segment is ``streak_warn_at``; the
  stop level fires once per segment: at a check, when the calls before it in its segment would
  reach ``streak_stop_at`` had every outcome still missing been a failure, or at the report after
  which the segment's settled calls reach it;
- ``resolve`` ends the current streak (its later outcomes change nothing) and those of the call
  the answered detection was about; streaks other calls ended go on settling theirs; ``retry``
  ends every streak;
- the stuck signal's count is the largest number of times one key was counted: other tools' calls
  at their check, a stateful tool's at its outcome as (call, result), or (call) without a result.

Random turns mix stateful and other tools, results given, missing and repeated, parallel batches
with outcomes in any order, outcomes that never come, retries, answers given while other
streaks still wait for outcomes, strays and resumes from a snapshot.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

import turnguard as tg
from conftest import core_guard
from turnguard._keys import KEY_DIGEST

WAIT_BEHIND = 32
"""docs/polling.md: a stateful call whose outcome never comes counts as the call alone, once 32
checks have passed it."""

ERROR, OK, DENIED, UNKNOWN = tg.Outcome.ERROR, tg.Outcome.OK, tg.Outcome.DENIED, tg.Outcome.UNKNOWN
OUTCOMES = (ERROR, ERROR, ERROR, OK, DENIED, UNKNOWN)
TOOLS = {"build": (False, False), "poll": (True, False), "wait": (False, True), "tail": (True, True)}
"""Tool -> (stateful, exempt)."""
RESULTS = ("queued", "queued", "running", None, {"status": "done", "n": [1, 2]})


@dataclass
class Call:
    key: tuple[str, str]
    stateful: bool
    exempt: bool
    streak: Streak | None = None
    outcome: tg.Outcome | None = None
    result: object = None
    counted: bool = False
    """Its repeat counted (a stateful call's, at its outcome; a retry voids the ones still waiting)."""


@dataclass
class Streak:
    key: tuple[str, str]
    calls: list[int] = field(default_factory=list)
    fired: set[int] = field(default_factory=set)
    """The segments (by the position they start at) whose stop level fired."""
    closed: bool = False


class Reference:
    def __init__(self, *, promptable: bool, warn_at: int, stop_at: int, stop_on: str) -> None:
        self.promptable, self.warn_at, self.stop_at, self.any = promptable, warn_at, stop_at, stop_on == "any"
        self.calls: list[Call] = []
        self.streaks: list[Streak] = []
        self.current: Streak | None = None
        self.halted: tuple[tg.Action, str] | None = None
        self.counts: dict[object, int] = {}
        self.max_repeat = 0

    def _step(self, count: int, outcome: tg.Outcome | None) -> int:
        if outcome is None or outcome is ERROR:
            return count + 1
        if outcome is DENIED:
            return count
        return count + 1 if self.any else 0

    def _segments(self, streak: Streak, upto: int, unknown_fails: bool) -> list[tuple[int, list[int]]]:
        """(start position, stop count after each call) of each segment of the streak's first
        ``upto`` calls; without ``unknown_fails`` only up to the first call without an outcome."""
        segments: list[tuple[int, list[int]]] = [(0, [])]
        count, baseline = 0, None
        for position, index in enumerate(streak.calls[:upto]):
            call = self.calls[index]
            if call.outcome is None and not unknown_fails:
                break
            if call.result is not None:
                if baseline is not None and call.result != baseline:
                    segments.append((position, []))
                    count = 0
                baseline = call.result
            count = self._step(count, call.outcome)
            segments[-1][1].append(count)
        return segments

    def _count(self, key: object) -> None:
        self.counts[key] = seen = self.counts.get(key, 0) + 1
        self.max_repeat = max(self.max_repeat, seen)

    def _stop(self) -> tuple:
        verdict = (tg.Action.ASK if self.promptable else tg.Action.HALT), "streak", "stop"
        if verdict[0] is tg.Action.HALT:
            self.halted = verdict[:2]
        return verdict

    def check(self, index: int, tool: str, target: str) -> tuple:
        if self.halted:
            return (*self.halted, "latched")
        stateful, exempt = TOOLS[tool]
        call = Call((tool, target), stateful, exempt)
        self.calls.append(call)
        if not stateful:
            self._count(call.key)
        for late in self.calls[:max(0, index - WAIT_BEHIND + 1)]:  # docs/polling.md: counted alone 32 checks on
            if late.stateful and not late.counted:
                late.counted = True
                self._count((late.key, repr(None)))
        if exempt:
            self.current = None
            return tg.Action.ALLOW, None, None
        if self.current is None or self.current.key != call.key:
            self.current = Streak(call.key)
            self.streaks.append(self.current)
        streak = call.streak = self.current
        streak.calls.append(index)
        position = len(streak.calls) - 1
        start, earlier = self._segments(streak, position, unknown_fails=True)[-1]
        if self.stop_at and earlier and earlier[-1] >= self.stop_at and start not in streak.fired:
            streak.fired.add(start)
            return self._stop()
        if self.warn_at and position - start + 1 == self.warn_at:
            return tg.Action.ASK if self.promptable else tg.Action.ALLOW, "streak", "warn"
        return tg.Action.ALLOW, None, None

    def outcome(self, index: int, outcome: tg.Outcome, result: object) -> tuple:
        if index < 0 or index >= len(self.calls) or self.calls[index].outcome is not None:
            return (*self.halted, "latched") if self.halted else (tg.Action.ALLOW, None, "ignored")
        call = self.calls[index]
        call.outcome = outcome
        if call.stateful and outcome is not DENIED:
            call.result = result
        if call.stateful and not call.counted:
            call.counted = True
            self._count((call.key, repr(call.result)))  # (repr: the results here are small JSON values)
        if self.halted:
            return (*self.halted, "latched")
        streak = call.streak
        if streak is None or streak.closed or not self.stop_at:
            return tg.Action.ALLOW, None, None
        fired = False
        for start, counts in self._segments(streak, len(streak.calls), unknown_fails=False):
            if counts and max(counts) >= self.stop_at and start not in streak.fired:
                streak.fired.add(start)
                fired = True
        return self._stop() if fired else (tg.Action.ALLOW, None, None)

    def reset(self, *, retry: bool, key: tuple[str, str] | None = None) -> None:
        """A retry ends every streak; an answer the current one, and those of the call it was about (``key``)."""
        if self.current is not None:
            self.current.closed = True
        self.current = None
        for streak in self.streaks:
            if retry or streak.key == key:
                streak.closed = True
        if retry:
            self.counts.clear()
            self.max_repeat = 0
            for call in self.calls:
                if call.stateful:
                    call.counted = True  # a retry clears the repeats: the ones still to come count nowhere

    def facts(self) -> tuple[int, int, int]:
        """(streak_length, failing_streak_length, max_key_repeat)."""
        streak = self.current
        if streak is None:
            return 0, 0, self.max_repeat
        start = self._segments(streak, len(streak.calls), unknown_fails=False)[-1][0]
        failing = 0
        for index in streak.calls[start:]:
            outcome = self.calls[index].outcome
            if outcome is None:
                break
            failing = failing + 1 if outcome is ERROR else failing if outcome is DENIED else 0
        return len(streak.calls) - start, failing, self.max_repeat


def observed(verdict: tg.Verdict, tail: str | None) -> tuple:
    """(action, threshold, level), or the reference's ``latched`` / ``ignored`` in place of the level."""
    level = verdict.event.level.value if verdict.event is not None else None
    if tail in ("latched", "ignored"):
        level = tail
    return verdict.action, str(verdict.threshold) if verdict.threshold is not None else None, level


class RandomTurn:
    """One random turn through the guard and the reference side by side."""

    def __init__(self, seed: int, *, promptable: bool, stop_on: str) -> None:
        self.rng = rng = random.Random(seed)
        self.seed = seed
        warn_at, stop_at = rng.choice([(0, 3), (2, 3), (3, 4), (2, 2), (3, 5)])
        self.guard = core_guard(streak_warn_at=warn_at, streak_stop_at=stop_at, streak_stop_on=stop_on,
                                stateful_tools=("poll", "tail"), streak_exempt_tools=("wait", "tail"),
                                max_tool_calls_per_turn=0)  # (the streak alone: the reference knows no cap)
        self.turn = self.guard.turn(promptable=promptable)
        self.ref = Reference(promptable=promptable, warn_at=warn_at, stop_at=stop_at, stop_on=stop_on)
        self.calls: list[tg.ToolCall] = []
        self.waiting: list[int] = []
        self.asks: list[tg.Verdict] = []
        self.operations = 0
        self.lost = rng.choice([0.0, 0.0, 0.05, 0.2])
        """The share of outcomes that never come."""

    def compare(self, verdict: tg.Verdict, expected: tuple) -> None:
        assert observed(verdict, expected[2]) == expected, (self.seed, self.operations)
        ledger = self.turn.ledger
        facts = (ledger.streak_length, ledger.failing_streak_length, ledger.max_key_repeat)
        assert facts == self.ref.facts(), (self.seed, self.operations)
        self.operations += 1
        if verdict.action is tg.Action.ASK:
            self.asks.append(verdict)

    def check(self, same: tuple[str, str] | None = None) -> None:
        rng = self.rng
        tool = rng.choice(list(TOOLS))
        target = rng.choice("AB"[: rng.choice([1, 1, 2])])
        if same is not None and rng.random() < 0.8:
            tool, target = same
        index = len(self.calls)
        call = tg.ToolCall(tool, {"target": target}, call_id=f"c{index}" if rng.random() < 0.6 else None)
        self.calls.append(call)
        verdict = self.turn.check_call(call)
        self.compare(verdict, self.ref.check(index, tool, target))
        if verdict.action is not tg.Action.HALT:
            self.waiting.append(index)

    def report(self, index: int) -> None:
        rng = self.rng
        outcome, result = rng.choice(OUTCOMES), rng.choice(RESULTS)
        call = self.calls[index] if index >= 0 else tg.ToolCall("poll", {"target": "A"}, call_id="never")
        if call.call_id is not None and rng.random() < 0.5:  # reported by call_id, on another object
            call = tg.ToolCall(call.name, call.args, call_id=call.call_id)
        verdict = self.turn.record_outcome(call, outcome, result=result)
        self.compare(verdict, self.ref.outcome(index, outcome, result))

    def run(self) -> int:
        rng = self.rng
        for _ in range(rng.randint(3, 16)):  # model responses
            self.turn.begin_cycle()
            same = (rng.choice(["poll", "build"]), "A") if rng.random() < 0.4 else None  # one call, repeated
            for _ in range(rng.choice([1, 1, 1, 2, 3, 4, 6, 9, 12])):
                self.check(same)
            rng.shuffle(self.waiting)
            if rng.random() < 0.12 and self.waiting:  # re-sent before some outcomes came
                self.turn.retry()
                if not self.ref.halted:
                    self.ref.reset(retry=True)
            while self.waiting:
                index = self.waiting.pop()
                if rng.random() < self.lost:  # its outcome never comes
                    continue
                self.report(index)
                if rng.random() < 0.1:  # a duplicate, or an outcome for a call never checked
                    self.report(self.stray())
                if rng.random() < 0.05:
                    self.resume()
                if rng.random() < 0.3:  # an answer while other calls still wait
                    self.answer()
            self.answer()
        return self.operations

    def answer(self) -> None:
        while self.asks:
            event = self.asks.pop().event
            if self.rng.random() < 0.5 and self.turn.halted is None:
                self.turn.resolve(event, "continue")
                about = [c for c in self.calls if c.key is not None and c.key[KEY_DIGEST].hex() == event.key_digest]
                self.ref.reset(retry=False, key=(about[0].name, about[0].args["target"]) if about else None)

    def stray(self) -> int:
        """A call reported already (or one whose outcome was lost: it comes late), or -1: one
        never checked. After a resume, a call without a ``call_id`` is matched by its name and
        arguments (``Turn._claim_restored``): a second report of one would be taken for an
        identical call still waiting, so only calls with an id are reported twice then."""
        if self.rng.random() < 0.3:
            return -1
        candidates = [i for i, c in enumerate(self.calls)
                      if i not in self.waiting and (not self.resumed or c.call_id is not None)]
        return self.rng.choice(candidates) if candidates else -1

    resumed = False

    def resume(self) -> None:
        """Put the turn aside and go on from its snapshot (waiting calls and all)."""
        state = self.turn.suspend()
        self.turn = self.guard.resume(state)
        self.resumed = True


@pytest.mark.parametrize("stop_on", ["error", "any"])
@pytest.mark.parametrize("promptable", [False, True])
def test_the_turn_agrees_with_the_reference_on_random_polling_turns(promptable, stop_on):
    operations = sum(RandomTurn(seed, promptable=promptable, stop_on=stop_on).run() for seed in range(1200))
    assert operations > 24000  # long enough to exercise batches, restarts, retries, answers and resumes
