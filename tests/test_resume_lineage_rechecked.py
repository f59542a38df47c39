"""An object checked before a snapshot stays each continuing turn's, whichever of them checks it again.

A ``ToolCall`` holds one key. A turn that checks an object again after its outcome gives it a key
of its own; before, when that object had been checked before a snapshot, the key left the
snapshot's lineage, and a relative continuing the same snapshot (the other resume of it, a fork
beside it, or the turn that went on after it) took the object for another turn's call: its report
was an ``unknown_call`` instead of a ``duplicate``, or of the outcome of the call waiting there. The
relative's handling must be the one it gives when the other turn never touched the object:
swept over every relation, the object settled or waiting at the snapshot, with or without a
``call_id``, and every way the other turn checks and reports it again.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import turnguard as tg
from test_resume_lineage import RELATIVES, lone_guard, relatives

OTHER_PLAYS = {
    "none": (),
    "check": ("check",),
    "check_report": ("check", "report"),
    "check_report_report": ("check", "report", "report"),
    "check_check_report": ("check", "check", "report"),
    "check_report_check": ("check", "report", "check"),
    "report_check_report": ("report", "check", "report"),
}
"""What the other turn does with the object checked before the snapshot ("none": the oracle)."""
RECEIVER_PLAYS = (("report",), ("report", "report"), ("check", "report", "report"), ("report", "check", "report"))


def receiver_heard(relation: str, settled: bool, call_id: str | None, other_ops: tuple[str, ...],
                   receiver_ops: tuple[str, ...]) -> tuple[Any, ...]:
    guard, reasons = lone_guard()
    turn = guard.turn(durable=True)
    obj = tg.ToolCall("build", {"target": "A"}, call_id)
    turn.check_call(obj)
    if settled:
        turn.record_outcome(obj, "ok")

    def other_plays(other: tg.Turn) -> None:
        for op in other_ops:
            other.check_call(obj) if op == "check" else other.record_outcome(obj, "ok")

    receiver = relatives(guard, turn, relation, other_plays)
    reasons.clear()
    for op in receiver_ops:
        receiver.check_call(obj) if op == "check" else receiver.record_outcome(obj, "error")
    return tuple(reasons), receiver.view.outcomes(tg.Outcome.ERROR), receiver.ledger.tool_calls


@pytest.mark.parametrize("relation", RELATIVES)
@pytest.mark.parametrize("settled", [True, False], ids=["settled", "waiting"])
@pytest.mark.parametrize("call_id", [None, "x"], ids=["no-id", "id"])
def test_a_relatives_second_check_leaves_the_object_the_receivers(relation, settled, call_id):
    for receiver_ops in RECEIVER_PLAYS:
        oracle = receiver_heard(relation, settled, call_id, (), receiver_ops)
        for name, other_ops in OTHER_PLAYS.items():
            got = receiver_heard(relation, settled, call_id, other_ops, receiver_ops)
            assert got == oracle, (name, receiver_ops, got, oracle)


@pytest.mark.parametrize(("relation", "settled"), list(itertools.product(RELATIVES, (True, False))))
def test_the_defects_case_the_receivers_report_is_a_duplicate_or_settles_its_wait(relation, settled):
    reasons, errors, _ = receiver_heard(relation, settled, None, ("check", "report"), ("report",))
    assert (reasons, errors) == ((("duplicate",), 0) if settled else ((), 1))


def test_the_turn_checking_again_settles_its_own_new_check():
    """The turn that checked the object again settles its new check with it, then calls a third
    report a duplicate, as the turn that never stopped does."""
    guard, reasons = lone_guard()
    turn = guard.turn(durable=True)
    obj = tg.ToolCall("build", {"target": "A"})
    turn.check_call(obj)
    turn.record_outcome(obj, "ok")
    state = turn.suspend()
    first, second = guard.resume(state), guard.resume(state)
    for resumed in (first, second):
        reasons.clear()
        resumed.check_call(obj)
        resumed.record_outcome(obj, "error")
        resumed.record_outcome(obj, "error")
        assert (reasons, resumed.view.outcomes(tg.Outcome.ERROR)) == (["duplicate"], 1)
