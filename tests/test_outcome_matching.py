"""Which check an outcome settles: the reported object, a copy of it, or another with its call_id."""

from __future__ import annotations

import copy
import pickle
import random
from collections.abc import Callable

import pytest

import turnguard as tg
from conftest import core_guard

REPORTS: dict[str, Callable[[tg.ToolCall], tg.ToolCall]] = {
    "same object": lambda call: call,
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle round trip": lambda call: pickle.loads(pickle.dumps(call)),
    "new ToolCall": lambda call: tg.ToolCall(call.name, call.args, call.call_id),
}
"""Every way a host reports an outcome: ``same object`` is the checked call, the others new objects."""
POOL = [("bash", "make"), ("bash", "make test"), ("poll", {"run": 7}), ("read", {"p": 1})]


class Ignored:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    @tg.hookimpl
    def turnguard_outcome_ignored(self, reason):
        self.reasons.append(reason)


class Reference:
    """The documented matching (docs/usage.md): the reported object's own earliest waiting check;
    for another object, the earliest waiting check with its call_id (none without one); nothing
    once that check was settled. Each matched report reaches the reference guard once, through
    the reference's own copy of the checked object."""

    def __init__(self, guard: tg.Guard) -> None:
        self.turn = guard.turn()
        self.waiting: list[tg.ToolCall] = []  # checked objects, one entry per waiting check, in check order
        self.mirror: dict[tg.ToolCall, tg.ToolCall] = {}  # (a ToolCall hashes by identity)

    def check(self, call: tg.ToolCall) -> tg.Verdict:
        counted = self.turn.halted is None
        own = self.mirror.setdefault(call, tg.ToolCall(call.name, call.args, call.call_id))
        verdict = self.turn.check_call(own)
        if counted:
            self.waiting.append(call)
        return verdict

    def report(self, reported: tg.ToolCall, original: tg.ToolCall, outcome: str, result: object) -> tg.Verdict | None:
        """The reference's verdict, or ``None`` when the report is ignored."""
        if reported is original:
            at = next((i for i, c in enumerate(self.waiting) if c is original), None)
        elif reported.call_id is None:
            at = None
        else:
            at = next((i for i, c in enumerate(self.waiting) if c.call_id == reported.call_id), None)
        if at is None:
            return None
        checked = self.waiting.pop(at)
        return self.turn.record_outcome(self.mirror[checked], outcome, result=result)


def seen(verdict: tg.Verdict) -> tuple:
    """A verdict as two turns can agree on it (the event's ids are each turn's own)."""
    e = verdict.event
    counts = (e.threshold, e.level, e.limit, e.tool_calls, e.streak_length, e.failing_streak_length) if e else None
    return verdict.action, verdict.threshold, verdict.message, counts


def facts(turn: tg.Turn) -> tuple:
    ledger = turn.ledger
    return (ledger.tool_calls, ledger.failing_streak_length, ledger.longest_stop_count, ledger.streak_length,
            ledger.detections, ledger.stop_count, tuple(ledger.outcomes(o) for o in tg.Outcome),
            turn.halted.threshold if turn.halted else None)


@pytest.mark.parametrize("seed", range(200))
def test_every_report_settles_the_check_the_docs_name_on_random_turns(seed):
    """Random unattended turns: batches with calls of unique, shared or no call_ids, one object
    checked several times in a batch, outcomes in any order through the checked object, a copy,
    a deep copy, a pickle round trip or a new ToolCall, repeated reports and lost ones, and
    outcomes after a HALT. Each verdict, each ignored report and the ledger's counts are those of
    a guard told only the outcomes the docs say each report carries."""
    rng = random.Random(seed)
    options = {"streak_warn_at": 2, "streak_stop_at": rng.choice((3, 4)), "soft_cap": 12,
               "stuck_repeat_threshold": 4, "max_cycles_per_turn": 0,
               "stateful_tools": rng.choice(((), ("poll",))), "streak_stop_on": rng.choice(("error", "any"))}
    ignored = Ignored()
    guard = core_guard(**options)
    guard.register(ignored, name="ignored")
    reference = Reference(core_guard(**options))
    ids = rng.choice(("unique", "shared", "none", "mixed"))
    n = 0
    with guard.turn() as turn:
        while n < 40 and turn.halted is None:
            turn.begin_cycle()
            reference.turn.begin_cycle()
            batch: list[tg.ToolCall] = []
            for _ in range(rng.choice((1, 2, 3))):
                if batch and rng.random() < 0.3:
                    call = rng.choice(batch)  # one object checked again in the batch
                else:
                    n += 1
                    name, args = rng.choice(POOL)
                    mode = rng.choice(("unique", "shared", "none")) if ids == "mixed" else ids
                    call_id = {"unique": f"c{n}", "shared": name, "none": None}[mode]
                    call = tg.ToolCall(name, args, call_id)
                verdict = turn.check_call(call)
                assert seen(verdict) == seen(reference.check(call))
                if verdict.action is not tg.Action.HALT:
                    batch.append(call)
            reports = [c for c in batch if rng.random() > 0.05]  # a lost outcome now and then
            reports += rng.sample(batch, k=min(len(batch), rng.choice((0, 0, 1, 2))))  # repeated reports
            rng.shuffle(reports)
            for original in reports:
                form = rng.choice(list(REPORTS))
                reported = REPORTS[form](original)
                outcome = rng.choice(("ok", "error", "error", "denied"))
                result = rng.choice(("pending", "done", None))
                before = len(ignored.reasons)
                verdict = turn.record_outcome(reported, outcome, result=result)
                expected = reference.report(reported, original, outcome, result)
                if expected is None:
                    assert len(ignored.reasons) == before + 1, (form, original, reported)
                    assert seen(verdict) == seen(turn.halted or tg.Verdict(tg.Action.ALLOW))
                else:
                    assert len(ignored.reasons) == before, (form, original, reported)
                    assert seen(verdict) == seen(expected)
                assert facts(turn) == facts(reference.turn)
    reference.turn.end()  # (both ended: the calls whose outcome was lost are given up in each)
    assert facts(turn) == facts(reference.turn)


@pytest.mark.parametrize("form", [f for f in REPORTS if f != "same object"])
@pytest.mark.parametrize("call_id", ["c1", None])
def test_a_stray_report_through_another_object_never_takes_the_checked_calls_outcome(form, call_id):
    """The report through another object is matched by call_id (none: ignored); the checked
    object's own report then settles its check, or is a duplicate when the first took it."""
    ignored = Ignored()
    guard = core_guard()
    guard.register(ignored, name="ignored")
    with guard.turn() as turn:
        call = tg.ToolCall("read_file", {"path": "a.txt"}, call_id)
        turn.check_call(call)
        turn.record_outcome(REPORTS[form](call), "error")
        turn.record_outcome(call, "error")
    assert turn.ledger.outcomes(tg.Outcome.ERROR) == 1
    assert ignored.reasons == (["duplicate"] if call_id else ["unknown_call"])


@pytest.mark.parametrize("form", list(REPORTS))
def test_a_second_report_of_a_settled_call_is_never_credited_to_a_call_sharing_its_call_id(form):
    ignored = Ignored()
    guard = core_guard()
    guard.register(ignored, name="ignored")
    with guard.turn() as turn:
        first, second = tg.ToolCall("bash", "make", call_id="bash"), tg.ToolCall("bash", "make", call_id="bash")
        turn.check_call(first)
        turn.check_call(second)
        turn.record_outcome(first, "error")
        turn.record_outcome(REPORTS[form](first), "ok")  # a new object: the id's next waiting call
        turn.record_outcome(first, "ok")  # the checked object again: a duplicate
        turn.record_outcome(second, "error")
    taken = 1 if form == "same object" else 0
    assert turn.ledger.outcomes(tg.Outcome.ERROR) == 1 + taken
    assert turn.ledger.outcomes(tg.Outcome.OK) == 1 - taken
    assert ignored.reasons == ["duplicate", "duplicate"]


def test_an_object_carrying_another_checked_calls_key_neither_takes_nor_loses_its_check():
    """Whatever copies a call slot by slot (its cached key too) reports by its call_id; the check
    it names keeps waiting for its own call."""
    ignored = Ignored()
    guard = core_guard()
    guard.register(ignored, name="ignored")
    with guard.turn() as turn:
        calls = [tg.ToolCall("bash", "make", call_id=None) for _ in range(3)]
        for call in calls:
            turn.check_call(call)
        twin = tg.ToolCall("bash", "make")
        object.__setattr__(twin, "key", calls[1].key)
        turn.record_outcome(twin, "error")
        for call in calls:
            turn.record_outcome(call, "error")
    assert turn.ledger.outcomes(tg.Outcome.ERROR) == 3 and len(ignored.reasons) == 1


CONFIGS = {"default": {}, "digest_key": {"digest_key": "k" * 32}, "bytes": {"key_mode": "bytes"},
           "stateful": {"stateful_tools": ("bash",)}}


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("form", [f for f in REPORTS if f != "same object"])
def test_a_checked_call_copies_and_pickles_as_the_call_the_host_has(form, config, durable):
    args = {"cmd": ["ls", "-l"], "env": {"A": "1"}}
    call = tg.ToolCall("bash", args, call_id="c1")
    with core_guard(**CONFIGS[config]).turn(durable=durable) as turn:
        turn.check_call(call)
        turn.record_outcome(call, "ok", result="listing")  # a kept result too
        other = REPORTS[form](call)
        assert (other.name, other.args, other.call_id, other.key) == ("bash", args, "c1", None)
        assert other is not call and other != call
        if form == "copy.deepcopy":
            assert other.args is not args
        assert pickle.loads(pickle.dumps(call)).key is None


def test_an_outcome_after_the_turn_ended_is_ignored_as_after_end():
    ignored = Ignored()
    guard = core_guard()
    guard.register(ignored, name="ignored")
    turn = guard.turn()
    waiting, settled = tg.ToolCall("bash", "ls", call_id="a"), tg.ToolCall("bash", "make", call_id="b")
    turn.check_call(waiting)
    turn.check_call(settled)
    turn.record_outcome(settled, "ok")
    summary = turn.end()
    late = [turn.record_outcome(waiting, "error"), turn.record_outcome(settled, "error"),
            turn.record_outcome(tg.ToolCall("bash", "ls", call_id="a"), "error")]
    assert late == [tg.Verdict(tg.Action.ALLOW)] * 3
    assert ignored.reasons == ["after_end"] * 3
    assert turn.end() is summary and turn.ledger.outcomes(tg.Outcome.ERROR) == 0
