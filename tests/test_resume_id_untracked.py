"""The fork rule knows only the turns a guard snapshotted or resumed (docs/usage.md, "One snapshot,
two resumes"): an open or ended turn of the same id it never snapshotted cannot be the one a
snapshot continues, so the resume keeps the id, and the two turns keep their own objects."""

from __future__ import annotations

import pytest

import turnguard as tg

CONFIG = tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False)


def snapshot_elsewhere(turn_id: str) -> dict:
    turn = tg.Guard(CONFIG, environ={}).turn(turn_id=turn_id, durable=True)
    turn.check_call(tg.ToolCall("build", {"target": "A"}))
    return turn.suspend()


@pytest.mark.parametrize("state_of_local", ["open", "ended", "snapshotted", "resumed"])
def test_a_resume_forks_only_beside_a_turn_the_guard_snapshotted_or_resumed(state_of_local):
    guard, reasons = tg.Guard(CONFIG, environ={}), []

    class Heard:
        @tg.hookimpl
        def turnguard_outcome_ignored(self, reason):
            reasons.append(reason)

    guard.register(Heard())
    state = snapshot_elsewhere("t")
    local = guard.resume(snapshot_elsewhere("t")) if state_of_local == "resumed" else guard.turn(turn_id="t")
    obj = tg.ToolCall("build", {"target": "A"})
    local.check_call(obj)
    if state_of_local == "ended":
        local.end()
    elif state_of_local == "snapshotted":
        local.snapshot()
    resumed = guard.resume(state)
    forks = state_of_local in ("snapshotted", "resumed")
    assert (resumed.turn_id != "t") == forks
    resumed.record_outcome(obj, "ok")
    assert reasons == ["unknown_call"]  # the local turn's object is never the resumed turn's
    assert resumed.view.outcomes(tg.Outcome.OK) == 0
