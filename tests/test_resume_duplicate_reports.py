"""Outcomes reported twice, resumed: a turn resumed in the same process ignores each for the reason
the turn that never stopped gives.

A host may report a call's outcome more than once: the same object again, a copy carrying its
``call_id`` (which settles the earliest check waiting with that id), or either after the check
settled. The turn that never stopped ignores a second report of an object it checked as a
``duplicate``; a turn resumed from its snapshot holds the objects the snapshot's turn checked, so
it must too (their keys name that turn's checks, which are its own), never ``unknown_call``, and
never take such a report for another call that shares the ``call_id``. The random scripts report
duplicates of every kind, some a request late, and are cut at every operation.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import turnguard as tg
from test_resume_equivalence import (
    CONFIGS,
    KEYS,
    OUTCOMES,
    Bench,
    HeardOutcomes,
    Player,
    Script,
    assert_resumes_anywhere_as_whole,
    make_benches,
)


class Duplicator(Player):
    """A player that also reports outcomes on copies (``("copy", index, outcome)``: a new object
    with the call's name, arguments and ``call_id``)."""

    def step(self, turn: tg.Turn, op: tuple[Any, ...], fresh_before: int) -> tg.Verdict | None:
        if op[0] == "copy":
            call = self.objects[op[1]]
            return turn.record_outcome(tg.ToolCall(call.name, call.args, call.call_id), op[2])
        return super().step(turn, op, fresh_before)


def make_duplicating_script(seed: int) -> Script:
    """Model requests of 1 to 5 calls, about half with a ``call_id`` (now and then an earlier
    call's: hosts reuse ids); after each batch its outcomes, shuffled, some held back a request,
    among them second reports: the same object again, or a copy of a call with a ``call_id``
    (before or after the object's own), of this batch's calls or of calls settled earlier."""
    rng = random.Random(seed)
    script, held = Script(), []
    for _ in range(rng.randint(3, 7)):
        script.ops.append(("cycle",))
        batch = []
        for _ in range(rng.choice((1, 2, 3, 5))):
            name, args = rng.choice(KEYS[: rng.choice((2, 4))])
            index = len(script.calls)
            ids = [call_id for _, _, call_id in script.calls if call_id is not None]
            call_id = (rng.choice(ids) if ids and rng.random() < 0.2 else f"id{index}") if rng.random() < 0.5 else None
            script.calls.append((name, args, call_id))
            script.ops.append(("check", index))
            batch.append(index)
        reports = [("outcome", i, rng.choice(OUTCOMES)) for i in held + batch]
        for i in rng.sample(range(len(script.calls)), k=rng.randint(0, min(3, len(script.calls)))):
            ways = ("outcome", "copy") if script.calls[i][2] is not None else ("outcome",)
            reports.append((rng.choice(ways), i, rng.choice(OUTCOMES)))
        rng.shuffle(reports)
        held = [i for i in batch if rng.random() < 0.3]
        late = {("outcome", i) for i in held}
        script.ops += [op for op in reports if op[:2] not in late or op[0] == "copy"]
        if rng.random() < 0.4:
            script.ops.append(("answer", rng.choice(("continue", "stop"))))
    script.ops += [("outcome", i, rng.choice(OUTCOMES)) for i in held]
    return script


@pytest.fixture(scope="module")
def benches() -> dict[str, Bench]:
    return make_benches(CONFIGS, HeardOutcomes)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("seed", range(10))
def test_second_reports_are_ignored_for_the_whole_turns_reasons_across_any_cut(benches, config, promptable, seed):
    """Verdicts, what each outcome settled, why each ignored one was ignored, detections and
    summaries are the whole turn's, wherever the turn was suspended and resumed (the same process)."""
    script = make_duplicating_script(seed * 13 + (config == "probe"))
    assert_resumes_anywhere_as_whole(benches[config], script, promptable, Duplicator)


def test_the_duplicating_scripts_cut_between_a_check_and_its_objects_second_report(benches):
    """Across the scripts, many cuts fall after an object was checked and before a report of it
    the whole turn ignores as a duplicate, of a check settled before the cut (by the object or a
    copy) and of one settled after it; and a report is ignored for each reason."""
    reasons: set[str] = set()
    settled_before = settled_after = 0
    for seed in range(10):
        for config in CONFIGS:
            script = make_duplicating_script(seed * 13 + (config == "probe"))
            bench = benches[config]
            ops = uninterrupted_reasons(bench, script)
            reasons.update(reason for _, reason in ops.values() if reason)
            for cut in range(len(script.ops) + 1):
                checked = {op[1] for op in script.ops[:cut] if op[0] == "check"}
                for position, (index, reason) in ops.items():
                    if position >= cut and reason == "duplicate" and index in checked:
                        first_report = min(p for p, (i, _) in ops.items() if i == index)
                        settled_before += first_report < cut
                        settled_after += first_report >= cut
    assert {"duplicate", "unknown_call"} <= reasons, reasons
    assert settled_before >= 50 and settled_after >= 20, (settled_before, settled_after)


def uninterrupted_reasons(bench: Bench, script: Script) -> dict[int, tuple[int, str | None]]:
    """By position in the script, each report of an object (not a copy): its call, and why the
    whole turn ignored it (``None``: it settled a check)."""
    player, turn, out = Duplicator(script), bench.first.turn(durable=True), {}
    for position, op in enumerate(script.ops):
        bench.heard.said.clear()
        player.play(turn, [op])
        if op[0] == "outcome":
            ignored = [entry[-1] for entry in bench.heard.said if entry[0] == "ignored"]
            out[position] = (op[1], ignored[0] if ignored else None)
    turn.end()
    return out


class IgnoredReasons:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    @tg.hookimpl
    def turnguard_outcome_ignored(self, reason):
        self.reasons.append(reason)


@pytest.mark.parametrize("cut", ["never", "after the check", "after the copy"])
def test_a_suspended_objects_second_report_is_a_duplicate_in_the_resumed_turn(cut):
    """The defect's case, no halt: a copy with the object's ``call_id`` settles its check, then
    the object reports again: a duplicate, resumed before, between or after the reports."""
    heard = IgnoredReasons()
    guard = tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False),
                     plugins={"heard": heard}, environ={})
    turn = guard.turn(durable=True)
    first = tg.ToolCall("build", {"target": "A"}, "first")
    turn.check_call(first)
    if cut == "after the check":
        turn = guard.resume(json.loads(json.dumps(turn.suspend())))
    turn.record_outcome(tg.ToolCall("build", {"target": "A"}, "first"), "ok")
    if cut == "after the copy":
        turn = guard.resume(json.loads(json.dumps(turn.suspend())))
    turn.record_outcome(first, "error")
    assert heard.reasons == ["duplicate"]
    assert turn.end().tool_calls == 1


@pytest.mark.parametrize("resumed", [False, True], ids=["new turn", "resumed turn"])
def test_another_turns_object_is_an_unknown_call_that_may_settle_its_call_id(resumed):
    """An object another turn checked and settled (of another id, or of this id but not resumed
    from it) names no check here: its report settles the call waiting with its ``call_id``, and
    a second one is an ``unknown_call``."""
    heard = IgnoredReasons()
    guard = tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False),
                     plugins={"heard": heard}, environ={})
    other = guard.turn(turn_id="other" if resumed else "same")
    stranger = tg.ToolCall("build", {"target": "A"}, "c")
    other.check_call(stranger)
    other.record_outcome(stranger, "ok")
    other.end()
    turn = guard.turn(durable=True, turn_id="same")
    if resumed:
        turn = guard.resume(json.loads(json.dumps(turn.suspend())))
    turn.check_call(tg.ToolCall("build", {"target": "B"}, "c"))
    turn.record_outcome(stranger, "error")
    turn.record_outcome(stranger, "error")
    assert heard.reasons == ["unknown_call"]
    assert turn.view.outcomes(tg.Outcome.ERROR) == 1
