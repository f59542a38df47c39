"""Outcomes tied to their call: a differential test of ``Turn`` against a reference written from
the streak rules (docs/usage.md, "Parallel batches"), and the behaviours it pins down (parallel
batches, late, duplicate and stray outcomes, identical calls in one model response, a streak that
another call of the batch ended).

The reference recomputes everything from scratch after each operation (lists of calls per streak,
outcomes by call), so it shares no code and no incremental state with the ledger.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import pytest

import turnguard as tg
from conftest import core_guard
from turnguard._ledger import MAX_AWAITING

KEYS = ("A", "B", "C")
OUTCOMES = (tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.OK, tg.Outcome.DENIED,
            tg.Outcome.UNKNOWN)


def call_of(key: str, call_id: str | None = None) -> tg.ToolCall:
    return tg.ToolCall("build", {"target": key}, call_id=call_id)


@dataclass
class Streak:
    key: str
    calls: list[int] = field(default_factory=list)
    fired: set[str] = field(default_factory=set)
    closed: bool = False
    """Ended by an answer or a retry: its outcomes count nowhere (another call ending it does not
    close it: its outcomes still settle its stop level)."""


class Reference:
    """The streak rules as plain lists: streaks on check order, each outcome its own call's."""

    def __init__(self, *, promptable: bool, warn_at: int, stop_at: int, stop_on: str) -> None:
        self.promptable, self.warn_at, self.stop_at, self.any = promptable, warn_at, stop_at, stop_on == "any"
        self.streaks: list[Streak] = []
        self.current: Streak | None = None
        self.streak_of: dict[int, Streak] = {}
        self.outcomes: dict[int, tg.Outcome] = {}
        self.halted: tuple[tg.Action, str | None] | None = None

    def _step(self, count: int, outcome: tg.Outcome | None) -> int:
        if outcome is None or outcome is tg.Outcome.ERROR:
            return count + 1
        if outcome is tg.Outcome.DENIED:
            return count
        return count + 1 if self.any else 0

    def _counts(self, streak: Streak, upto: int, unknown_fails: bool) -> list[int]:
        """The stop count after each of the streak's first ``upto`` calls, in check order; without
        ``unknown_fails`` it stops at the first call whose outcome has not come."""
        counts, count = [], 0
        for index in streak.calls[:upto]:
            outcome = self.outcomes.get(index)
            if outcome is None and not unknown_fails:
                break
            count = self._step(count, outcome)
            counts.append(count)
        return counts

    def _stop(self, streak: Streak) -> tuple[tg.Action, str, str]:
        streak.fired.add("stop")
        return (tg.Action.ASK if self.promptable else tg.Action.HALT), "streak", "stop"

    def _latch(self, verdict: tuple[tg.Action, str | None, str | None]) -> tuple:
        if verdict[0] is tg.Action.HALT:
            self.halted = verdict[:2]
        return verdict

    def check(self, index: int, key: str) -> tuple:
        if self.halted:
            return (*self.halted, "latched")
        if self.current is None or self.current.key != key:
            self.current = Streak(key)
            self.streaks.append(self.current)
        streak = self.current
        streak.calls.append(index)
        self.streak_of[index] = streak
        position = len(streak.calls)
        earlier = self._counts(streak, position - 1, unknown_fails=True)
        if self.stop_at and "stop" not in streak.fired and earlier and earlier[-1] >= self.stop_at:
            return self._latch(self._stop(streak))
        if self.warn_at and position == self.warn_at:
            return tg.Action.ASK if self.promptable else tg.Action.ALLOW, "streak", "warn"
        return tg.Action.ALLOW, None, None

    def outcome(self, index: int, outcome: tg.Outcome) -> tuple:
        if index not in self.streak_of or index in self.outcomes:
            return (*self.halted, "latched") if self.halted else (tg.Action.ALLOW, None, "ignored")
        self.outcomes[index] = outcome
        if self.halted:
            return (*self.halted, "latched")
        streak = self.streak_of[index]
        if streak.closed or not self.stop_at or "stop" in streak.fired:
            return tg.Action.ALLOW, None, None
        if max(self._counts(streak, len(streak.calls), unknown_fails=False), default=0) >= self.stop_at:
            return self._latch(self._stop(streak))
        return tg.Action.ALLOW, None, None

    def reset(self) -> None:
        """``resolve(.., "continue")`` or ``retry()``: the next call starts a new streak, and no
        earlier streak counts any more."""
        self.current = None
        for streak in self.streaks:
            streak.closed = True

    def facts(self) -> tuple[int, int]:
        """(streak_length, failing_streak_length): the failing count over the calls in check order,
        up to the first whose outcome has not come."""
        streak = self.current
        if streak is None:
            return 0, 0
        failing = 0
        for index in streak.calls:
            outcome = self.outcomes.get(index)
            if outcome is None:
                break
            failing = failing + 1 if outcome is tg.Outcome.ERROR else failing if outcome is tg.Outcome.DENIED else 0
        return len(streak.calls), failing


def observed(verdict: tg.Verdict, *, ignored: bool = False, latched: bool = False) -> tuple:
    level = verdict.event.level.value if verdict.event is not None and not latched else None
    threshold = str(verdict.threshold) if verdict.threshold is not None else None
    tail = "latched" if latched else "ignored" if ignored else level
    return verdict.action, threshold, tail


def run_random_turn(seed: int, *, promptable: bool, stop_on: str) -> int:
    """One random turn through the guard and the reference side by side; returns the operations."""
    rng = random.Random(seed)
    warn_at, stop_at = rng.choice([(0, 3), (2, 3), (3, 4), (2, 2)])
    guard = core_guard(streak_warn_at=warn_at, streak_stop_at=stop_at, streak_stop_on=stop_on)
    turn = guard.turn(promptable=promptable)
    ref = Reference(promptable=promptable, warn_at=warn_at, stop_at=stop_at, stop_on=stop_on)
    calls: list[tg.ToolCall] = []
    waiting: list[int] = []
    operations = 0
    asks: list[tg.Verdict] = []

    def compare_facts() -> None:
        length, failing = ref.facts()
        assert (turn.ledger.streak_length, turn.ledger.failing_streak_length) == (length, failing), (seed, operations)

    def report(index: int) -> None:
        outcome = rng.choice(OUTCOMES)
        call = calls[index]
        if call.call_id is not None and rng.random() < 0.5:  # reported by call_id, on another object
            call = tg.ToolCall(call.name, call.args, call_id=call.call_id)
        verdict = turn.record_outcome(call, outcome)
        expected = ref.outcome(index, outcome)
        assert observed(verdict, ignored=expected[2] == "ignored", latched=expected[2] == "latched") == expected, (
            seed, operations, index)
        if verdict.action is tg.Action.ASK:
            asks.append(verdict)

    for _ in range(rng.randint(3, 14)):  # model responses
        turn.begin_cycle()
        batch = rng.choice([1, 1, 1, 2, 3, 4, 6])
        for _ in range(batch):
            key = rng.choice(KEYS[: rng.choice([1, 2, 3])])
            index = len(calls)
            call = call_of(key, call_id=f"c{index}" if rng.random() < 0.6 else None)
            calls.append(call)
            verdict = turn.check_call(call)
            expected = ref.check(index, key)
            assert observed(verdict, latched=expected[2] == "latched") == expected, (seed, operations, index)
            operations += 1
            if verdict.action is tg.Action.ASK:
                asks.append(verdict)
            if verdict.action is not tg.Action.HALT:
                waiting.append(index)
            compare_facts()
        rng.shuffle(waiting)
        if rng.random() < 0.15 and waiting:  # re-sent before some outcomes came: they come late
            turn.retry()
            if not ref.halted:  # a halted turn is over: a retry changes nothing there
                ref.reset()
            compare_facts()
        while waiting:
            report(waiting.pop())
            operations += 1
            compare_facts()
            if rng.random() < 0.1:  # a duplicate, or an outcome for a call never checked
                index = rng.randrange(len(calls)) if rng.random() < 0.7 else -1  # -1: a call never checked
                stray = calls[index] if index >= 0 else call_of("A", call_id="never-checked")
                outcome = rng.choice(OUTCOMES)
                verdict = turn.record_outcome(stray, outcome)
                expected = ref.outcome(index, outcome) if index >= 0 else (
                    (*ref.halted, "latched") if ref.halted else (tg.Action.ALLOW, None, "ignored"))
                assert observed(verdict, ignored=expected[2] == "ignored", latched=expected[2] == "latched") == (
                    expected), (seed, operations)
                compare_facts()
        while asks:
            event = asks.pop().event
            if rng.random() < 0.5 and turn.halted is None:
                turn.resolve(event, "continue")
                ref.reset()
                compare_facts()
    return operations


@pytest.mark.parametrize("stop_on", ["error", "any"])
@pytest.mark.parametrize("promptable", [False, True])
def test_the_turn_agrees_with_the_reference_on_random_turns_with_parallel_batches(promptable, stop_on):
    operations = sum(run_random_turn(seed, promptable=promptable, stop_on=stop_on) for seed in range(400))
    assert operations > 5000  # the turns were long enough to exercise batches, retries and answers


# -- the behaviours, one by one -----------------------------------------------------------------


def batch(turn: tg.Turn, keys: str, prefix: str = "") -> list[tg.ToolCall]:
    calls = [call_of(k, call_id=f"{prefix}{i}") for i, k in enumerate(keys)]
    for call in calls:
        turn.check_call(call)
    return calls


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)])
def test_a_parallel_batch_credits_each_outcome_to_its_own_call_whatever_the_order(order):
    """[A, B, A]: the first A fails, the last succeeds; 7 more failing As are the streak's 7 failures."""
    turn = core_guard().turn(promptable=False)
    calls = batch(turn, "ABA")
    outcomes = [tg.Outcome.ERROR, tg.Outcome.OK, tg.Outcome.OK]
    for i in order:
        turn.record_outcome(calls[i], outcomes[i])
    verdicts = []
    for i in range(7):
        call = call_of("A", call_id=f"next{i}")
        verdicts.append(turn.check_call(call))
        verdicts.append(turn.record_outcome(call, tg.Outcome.ERROR))
    assert turn.halted is None and turn.ledger.failing_streak_length == 7
    assert all(v.action is not tg.Action.HALT for v in verdicts)
    call = call_of("A")
    turn.check_call(call)
    assert turn.record_outcome(call, tg.Outcome.ERROR).action is tg.Action.HALT  # the 8th of its own


def test_outcomes_arriving_in_reverse_give_the_verdicts_of_the_sequential_run():
    sequential = core_guard().turn()
    for _ in range(8):
        call = call_of("A")
        sequential.check_call(call)
        last = sequential.record_outcome(call, tg.Outcome.ERROR)
    parallel = core_guard(streak_stop_at=8).turn()
    calls = batch(parallel, "A" * 8)
    verdicts = [parallel.record_outcome(call, tg.Outcome.ERROR) for call in reversed(calls)]
    assert last.action is tg.Action.HALT
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * 7 + [tg.Action.HALT]
    assert (parallel.ledger.failing_streak_length, parallel.halted.threshold) == (8, tg.Threshold.STREAK)


def test_a_late_outcome_of_an_ended_streak_is_not_the_current_streaks():
    turn = core_guard().turn()
    early = batch(turn, "AA", prefix="early")
    turn.check_call(call_of("B"))
    current = batch(turn, "A", prefix="now")[0]
    for call in early:
        turn.record_outcome(call, tg.Outcome.ERROR)
    assert turn.ledger.failing_streak_length == 0
    turn.record_outcome(current, tg.Outcome.ERROR)
    assert turn.ledger.failing_streak_length == 1  # its own outcome was not dropped


@pytest.mark.parametrize("ender", ["retry", "resolve"])
def test_outcomes_of_calls_before_a_retry_or_an_answer_change_no_later_streak(ender):
    turn = core_guard(streak_warn_at=2).turn(promptable=True)
    turn.begin_cycle()
    first = batch(turn, "AA", prefix="first")
    if ender == "retry":
        turn.retry()
        turn.begin_cycle()
    else:
        turn.resolve(turn.ledger.detect("streak", tg.Action.ASK, tg.Level.WARN, 2), "continue")
    again = call_of("A", call_id="again")
    turn.check_call(again)
    for call in first:
        assert turn.record_outcome(call, tg.Outcome.ERROR).action is tg.Action.ALLOW  # accepted, not a stray
    assert turn.ledger.failing_streak_length == 0 and turn.ledger.outcomes(tg.Outcome.ERROR) == 2
    turn.record_outcome(again, tg.Outcome.ERROR)
    assert turn.ledger.failing_streak_length == 1


# -- duplicate and stray outcomes -----------------------------------------------------------------


class Ignored:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @tg.hookimpl
    def turnguard_outcome_ignored(self, call, outcome, reason):
        self.seen.append((call.call_id, reason))


@pytest.mark.parametrize("promptable", [True, False])
def test_a_duplicate_outcome_changes_nothing_returns_allow_and_is_reported(promptable):
    ignored = Ignored()
    guard = core_guard(streak_stop_at=3, streak_warn_at=2)
    guard.register(ignored, name="ignored")
    turn = guard.turn(promptable=promptable)
    calls = [call_of("A", call_id=f"t{i}") for i in range(3)]
    for call in calls[:2]:
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.ERROR)
    turn.check_call(calls[2])
    stop = turn.record_outcome(calls[2], tg.Outcome.ERROR)
    assert stop.event is not None and stop.event.level is tg.Level.STOP
    before = (turn.ledger.failing_streak_length, turn.ledger.outcomes(tg.Outcome.ERROR), turn.ledger.detections)
    again = [turn.record_outcome(calls[2], tg.Outcome.ERROR),  # the same object
             turn.record_outcome(call_of("A", call_id="t2"), tg.Outcome.ERROR),  # its call_id, another object
             turn.record_outcome(calls[0], tg.Outcome.OK)]
    expected = tg.Action.HALT if not promptable else tg.Action.ALLOW  # unattended: the stop latched a HALT
    assert [v.action for v in again] == [expected] * 3
    assert all(v.event is None or v is turn.halted for v in again)  # no second stop
    after = (turn.ledger.failing_streak_length, turn.ledger.outcomes(tg.Outcome.ERROR), turn.ledger.detections)
    assert after == before
    assert ignored.seen == [("t2", "duplicate"), ("t2", "unknown_call"), ("t0", "duplicate")]


def test_an_outcome_for_a_call_never_checked_is_ignored_and_reported():
    ignored = Ignored()
    guard = core_guard()
    guard.register(ignored, name="ignored")
    turn = guard.turn(promptable=True)
    verdicts = [turn.record_outcome(call_of("A", call_id=f"x{i}"), tg.Outcome.ERROR) for i in range(10)]
    assert verdicts == [tg.Verdict(tg.Action.ALLOW)] * 10
    assert turn.ledger.outcomes(tg.Outcome.ERROR) == 0 and turn.ledger.detections == 0
    assert [r for _, r in ignored.seen] == ["unknown_call"] * 10


def test_each_level_fires_once_per_streak_even_when_failures_resume():
    turn = core_guard(streak_warn_at=2, streak_stop_at=3).turn(promptable=True)
    outcomes = [tg.Outcome.ERROR] * 3 + [tg.Outcome.OK] + [tg.Outcome.ERROR] * 4
    levels = []
    for outcome in outcomes:
        call = call_of("A")
        for verdict in (turn.check_call(call), turn.record_outcome(call, outcome)):
            if verdict.event is not None:
                levels.append(verdict.event.level)
    assert levels == [tg.Level.WARN, tg.Level.STOP]  # no user answer: the streak goes on, nothing re-fires


def test_an_answer_starts_a_new_streak_whose_levels_fire_again():
    turn = core_guard(streak_warn_at=2, streak_stop_at=3).turn(promptable=True)
    levels = []
    for _ in range(2):
        for _ in range(3):
            call = call_of("A")
            for verdict in (turn.check_call(call), turn.record_outcome(call, tg.Outcome.ERROR)):
                if verdict.event is not None:
                    levels.append(verdict.event.level)
                    last = verdict
        turn.resolve(last, "continue")
    assert levels == [tg.Level.WARN, tg.Level.STOP] * 2


# -- identical calls in one model response -------------------------------------------------------


@pytest.mark.parametrize("outcome", [tg.Outcome.ERROR, tg.Outcome.OK])
def test_of_ten_identical_calls_in_one_response_at_most_streak_stop_at_run_unattended(outcome):
    turn = core_guard().turn(promptable=False)  # defaults: warn at 5, stop at 8
    turn.begin_cycle()
    calls = [call_of("A", call_id=f"t{i}") for i in range(10)]
    verdicts = [turn.check_call(call) for call in calls]
    allowed = [call for call, v in zip(calls, verdicts, strict=True) if v.action is not tg.Action.HALT]
    assert len(allowed) == 8
    stop = verdicts[8]
    assert (stop.threshold, stop.event.level, stop.event.limit) == (tg.Threshold.STREAK, tg.Level.STOP, 8)
    assert verdicts[4].event.level is tg.Level.WARN
    for call in allowed:  # what ran reports; the halt stands whatever the outcomes
        assert turn.record_outcome(call, outcome).action is tg.Action.HALT


def test_ten_identical_calls_in_an_attended_response_ask_once_for_the_stop_level():
    turn = core_guard().turn(promptable=True)
    calls = [call_of("A", call_id=f"t{i}") for i in range(10)]
    verdicts = [turn.check_call(call) for call in calls]
    events = [(i, v.event.level) for i, v in enumerate(verdicts) if v.event is not None]
    assert events == [(4, tg.Level.WARN), (8, tg.Level.STOP)]
    assert verdicts[8].action is tg.Action.ASK
    outcomes = [turn.record_outcome(call, tg.Outcome.ERROR) for call in calls]
    assert all(v.event is None for v in outcomes)  # the stop level fired for this streak already


def test_identical_calls_in_a_batch_after_known_successes_run():
    turn = core_guard().turn(promptable=False)
    for _ in range(7):  # seven successes: none of them can fail any more
        call = call_of("A")
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.OK)
    verdicts = [turn.check_call(call_of("A", call_id=f"t{i}")) for i in range(8)]
    assert all(v.action is not tg.Action.HALT for v in verdicts)
    assert turn.check_call(call_of("A", call_id="t9")).action is tg.Action.HALT  # 8 waiting: the 9th would not run


def test_a_stop_level_of_zero_never_halts_a_batch():
    turn = core_guard(streak_warn_at=0, streak_stop_at=0).turn()
    assert all(turn.check_call(call_of("A")).action is tg.Action.ALLOW for _ in range(30))


def test_one_call_object_checked_twice_in_a_batch_settles_in_check_order():
    turn = core_guard(streak_stop_at=3, streak_warn_at=0).turn()
    call = call_of("A")
    turn.check_call(call)
    turn.check_call(call)
    turn.record_outcome(call, tg.Outcome.OK)  # the first check's
    turn.record_outcome(call, tg.Outcome.ERROR)  # the second check's
    assert turn.ledger.failing_streak_length == 1
    assert turn.record_outcome(call, tg.Outcome.ERROR) == tg.Verdict(tg.Action.ALLOW)  # a third: a duplicate
    assert turn.ledger.failing_streak_length == 1


def test_a_turn_waits_for_a_bounded_number_of_outcomes_and_ignores_those_it_gave_up_on():
    ignored = Ignored()
    guard = core_guard(max_tool_calls_per_turn=0)
    guard.register(ignored, name="ignored")
    turn = guard.turn()
    calls = [tg.ToolCall("read_file", {"path": f"f{i}"}, call_id=f"t{i}") for i in range(3 * MAX_AWAITING)]
    for call in calls:  # a host that never reports outcomes
        turn.check_call(call)
    assert turn.record_outcome(calls[0], tg.Outcome.OK).action is tg.Action.ALLOW
    turn.record_outcome(calls[-1], tg.Outcome.OK)
    assert ignored.seen == [("t0", "duplicate")]  # the oldest was given up on; the newest still waited
    assert turn.ledger.outcomes(tg.Outcome.OK) == 1


def test_outcomes_reported_from_threads_settle_in_check_order():
    """A batch run by a thread pool: outcomes arrive concurrently, in whatever order the threads
    finish; the streak is counted as the sequence in check order."""
    turn = core_guard(streak_stop_at=0, streak_warn_at=0).turn()
    outcomes = [tg.Outcome.ERROR] * 5 + [tg.Outcome.OK] + [tg.Outcome.ERROR] * 3
    calls = [call_of("A", call_id=f"t{i}") for i in range(len(outcomes))]
    for call in calls:
        turn.check_call(call)
    start = threading.Barrier(len(calls))

    def report(call: tg.ToolCall, outcome: tg.Outcome) -> None:
        start.wait()
        turn.record_outcome(tg.ToolCall(call.name, call.args, call_id=call.call_id), outcome)

    threads = [threading.Thread(target=report, args=pair) for pair in zip(calls, outcomes, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (turn.ledger.streak_length, turn.ledger.failing_streak_length, turn.ledger.stop_count) == (9, 3, 5)
    assert turn.ledger.awaiting_in_streak == 0


# -- a streak that another call of the same response ended ----------------------------------------


def _eight_then_other(promptable: bool = False, **options) -> tuple[tg.Turn, list[tg.ToolCall]]:
    turn = core_guard(**options).turn(promptable=promptable)
    turn.begin_cycle()
    calls = batch(turn, "A" * 8, prefix="a")
    other = call_of("B", call_id="b")
    assert turn.check_call(other).action is tg.Action.ALLOW
    return turn, [*calls, other]


@pytest.mark.parametrize("seed", range(60))
def test_eight_failures_then_another_call_in_one_response_stop_at_the_report_completing_them(seed):
    """The outcomes arrive after all nine checks, in any order: the report after which the eight
    failures are all in, in check order, halts (``streak``), as the calls run one at a time would
    have halted at the eighth failure."""
    turn, calls = _eight_then_other()
    order = list(range(9))
    random.Random(seed).shuffle(order)
    outcomes = {i: tg.Outcome.ERROR for i in range(8)} | {8: rng_outcome(seed)}
    arrived: set[int] = set()
    for i in order:
        verdict = turn.record_outcome(calls[i], outcomes[i])
        arrived.add(i)
        complete = set(range(8)) <= arrived
        if complete and turn.halted is verdict:
            break
        assert verdict.action is tg.Action.ALLOW, (order, i)
    assert complete and verdict.action is tg.Action.HALT and verdict.threshold is tg.Threshold.STREAK
    event = verdict.event
    assert (event.level, event.failing_streak_length, event.streak_length, event.tool_name) == (
        tg.Level.STOP, 8, 8, "build")
    assert event.key_digest == tg._keys.cached_digest(calls[0]).hex()


def rng_outcome(seed: int) -> tg.Outcome:
    return random.Random(-seed).choice(list(tg.Outcome))


def test_the_ended_streaks_stop_asks_once_when_attended_and_the_current_streak_is_untouched():
    turn, calls = _eight_then_other(promptable=True)
    verdicts = [turn.record_outcome(call, tg.Outcome.ERROR) for call in reversed(calls)]
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * 8 + [tg.Action.ASK]
    assert verdicts[-1].event.level is tg.Level.STOP and turn.halted is None
    assert (turn.ledger.streak_length, turn.ledger.failing_streak_length) == (1, 1)  # B's own streak
    more = call_of("B", call_id="b2")
    turn.check_call(more)
    assert turn.record_outcome(more, tg.Outcome.ERROR).action is tg.Action.ALLOW  # B's 2nd failure


@pytest.mark.parametrize("stop_on", ["error", "any"])
def test_a_success_among_the_eight_lets_the_ended_streak_go_unstopped(stop_on):
    turn, calls = _eight_then_other(streak_stop_on=stop_on)
    outcomes = [tg.Outcome.ERROR] * 3 + [tg.Outcome.OK] + [tg.Outcome.ERROR] * 4 + [tg.Outcome.OK]
    verdicts = [turn.record_outcome(calls[i], outcomes[i]) for i in (8, 7, 6, 5, 4, 3, 2, 1, 0)]
    expected = tg.Action.HALT if stop_on == "any" else tg.Action.ALLOW  # "any" counts the success too
    assert verdicts[-1].action is expected and all(v.action is tg.Action.ALLOW for v in verdicts[:-1])


@pytest.mark.parametrize("ender", ["retry", "resolve"])
def test_a_streak_ended_by_an_answer_or_a_retry_does_not_stop_later(ender):
    turn, calls = _eight_then_other(promptable=True)
    if ender == "retry":
        turn.retry()
    else:  # the answer to the eight calls' own warning (asked at the fifth)
        turn.resolve(turn.ledger.detect("streak", tg.Action.ASK, tg.Level.WARN, 5, call=calls[0]), "continue")
    assert all(turn.record_outcome(call, tg.Outcome.ERROR).action is tg.Action.ALLOW for call in calls)


def test_an_answer_about_another_call_leaves_the_ended_streak_stopping():
    turn, calls = _eight_then_other(promptable=True)
    turn.resolve(turn.ledger.detect("streak", tg.Action.ASK, tg.Level.WARN, 5, call=calls[-1]), "continue")
    verdicts = [turn.record_outcome(call, tg.Outcome.ERROR).action for call in calls[:8]]
    assert verdicts == [tg.Action.ALLOW] * 7 + [tg.Action.ASK]


def test_ended_streaks_kept_are_bounded():
    from turnguard._ledger import MAX_ENDED_STREAKS

    turn = core_guard(soft_cap=0).turn()
    for i in range(MAX_ENDED_STREAKS + 50):
        assert turn.check_call(call_of("AB"[i % 2], call_id=f"x{i}")).action is tg.Action.ALLOW
    assert len(turn.ledger._ended) == MAX_ENDED_STREAKS
