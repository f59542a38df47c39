"""Calls checked after a turn's HALT, resumed: their outcomes settle nothing the whole turn's don't.

A call checked once the turn halted (by a policy, by the host's ``halt``, by a user's "stop",
by a plugin failing under ``fail_mode="closed"``) is not counted and waits for nothing. A host
that reports its outcome anyway makes a host error: the outcome is ignored (``unknown_call``),
unless it names a waiting call by ``call_id``. A turn suspended and resumed in the same process
must do the same, instead of taking the outcome for an identical call still waiting from before
the snapshot (and then ignoring that call's own). The random scripts (``test_resume_equivalence``'s
harness) halt at a random point, check calls after it and report every outcome in any order,
and are cut at every operation.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import turnguard as tg
from test_resume_equivalence import (
    KEYS,
    MAIN,
    OUTCOMES,
    SHADOWS,
    Bench,
    HeardOutcomes,
    Player,
    Script,
    assert_resumes_anywhere_as_whole,
    make_benches,
)

CONFIGS = {
    "shadows": dict(MAIN, shadow=SHADOWS),
    "probe": dict(MAIN, shadow=SHADOWS, probe=tg.Probe(1.0, tg.GuardConfig(hard_multiplier=6, streak_stop_at=6))),
}
HOST_HALT = tg.Verdict(tg.Action.ASK, tg.Threshold.STREAK, "nobody to ask")


class Halter(Player):
    """A player that also halts the turn itself (``("halt",)``: the host's ``halt``), and keeps
    the calls whose checks answered HALT (``refused``)."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.refused: set[int] = set()

    def step(self, turn: tg.Turn, op: tuple[Any, ...], fresh_before: int) -> tg.Verdict | None:
        if op[0] == "halt":
            return turn.halt(HOST_HALT, "the host stops")
        verdict = super().step(turn, op, fresh_before)
        if op[0] == "check" and verdict is not None and verdict.action is tg.Action.HALT:
            self.refused.add(op[1])
        return verdict


def make_halting_script(seed: int) -> Script:
    """Model requests of 1 to 5 calls (keys drawn from a few, so identical calls wait together);
    the host halts the turn at a random request (or a policy or a "stop" does first), and the
    requests after it check calls too; every outcome is reported, shuffled, some a request late,
    whatever the checks answered."""
    rng = random.Random(seed)
    script, held = Script(), []
    requests = rng.randint(3, 7)
    halt_at = rng.randrange(requests)
    for request in range(requests):
        script.ops.append(("cycle",))
        batch = []
        for _ in range(rng.choice((1, 2, 3, 5))):
            name, args = rng.choice(KEYS[: rng.choice((2, 4))])
            index = len(script.calls)
            script.calls.append((name, args, f"id{index}" if rng.random() < 0.3 else None))
            script.ops.append(("check", index))
            batch.append(index)
            if request == halt_at and rng.random() < 0.4:
                script.ops.append(("halt",))
        if request == halt_at:
            script.ops.append(("halt",))
        arriving = held + batch
        rng.shuffle(arriving)
        held = [i for i in arriving if rng.random() < 0.35]
        script.ops += [("outcome", i, rng.choice(OUTCOMES)) for i in arriving if i not in held]
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
def test_outcomes_of_calls_checked_after_the_halt_settle_the_same_checks_across_any_cut(
        benches, config, promptable, seed):
    """Verdicts, what each outcome settled or why it was ignored, detections and summaries are the
    whole turn's, wherever the turn was suspended and resumed (the same process: the objects)."""
    script = make_halting_script(seed * 11 + (config == "probe"))
    assert_resumes_anywhere_as_whole(benches[config], script, promptable, Halter)


def test_the_halting_scripts_cut_where_an_identical_call_waits_for_a_refused_calls_outcome(benches):
    """Across the scripts, some cut falls where a call checked after the halt (no ``call_id``) has
    its outcome still to come while an identical call from before the halt waits for its own:
    where the outcome could be taken for the waiting call's."""
    cases = 0
    for seed in range(10):
        for config in CONFIGS:
            script = make_halting_script(seed * 11 + (config == "probe"))
            for cut in range(len(script.ops) + 1):
                player = Halter(script)
                turn = benches[config].first.turn(durable=True)
                player.play(turn, script.ops[:cut])
                checks = [op[1] for op in script.ops[:cut] if op[0] == "check"]  # (no retry: check n is checks[n - 1])
                waiting = {same_call(script, checks[entry[0] - 1]) for entry in turn.suspend()["awaiting"]}
                reported = {op[1] for op in script.ops[:cut] if op[0] == "outcome"}
                cases += any(same_call(script, i) in waiting for i in player.refused - reported
                             if script.calls[i][2] is None)
    assert cases >= 20, cases


def same_call(script: Script, index: int) -> tuple[str, str]:
    name, args, _ = script.calls[index]
    return name, json.dumps(args, sort_keys=True)


def heard_guard(log: list[tuple[Any, ...]], **options: Any) -> tg.Guard:
    class Heard:
        @tg.hookimpl
        def turnguard_outcome_recorded(self, turn, call, outcome):
            log.append(("settled", call.call_id, outcome.value))

        @tg.hookimpl
        def turnguard_outcome_ignored(self, call, outcome, reason):
            log.append(("ignored", call.call_id, outcome.value, reason))

    config = tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False, **options)
    return tg.Guard(config, plugins={"heard": Heard()}, environ={})


class Failing:
    """A check hook that fails on the second call it sees (under ``fail_mode="closed"``: a HALT)."""

    def __init__(self) -> None:
        self.seen = 0

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        self.seen += 1
        if self.seen == 2:
            raise RuntimeError("plugin bug")


def halt_by(how: str, turn: tg.Turn) -> None:
    """Halt ``turn``, whose first call (``build`` A) waits for its outcome, in one of the ways a turn halts."""
    if how == "host":
        turn.halt(HOST_HALT)
    elif how == "user":
        turn.check_call(tg.ToolCall("list", {}, "failed"))
        turn.record_outcome(tg.ToolCall("list", {}, "failed"), "error")
        asked = turn.check_call(tg.ToolCall("list", {}, "asked"))
        assert asked.action is tg.Action.ASK
        turn.resolve(asked, "stop")
    elif how == "cap":
        for i in range(3):
            turn.check_call(tg.ToolCall("read", {"file": i}, f"cap{i}"))
    elif how == "plugin":
        turn.check_call(tg.ToolCall("read", {}, "failed"))
    assert turn.halted is not None, how


HOWS = {"host": {}, "user": {"streak_warn_at": 2, "streak_stop_at": 4}, "cap": {"soft_cap": 2, "hard_multiplier": 1},
        "plugin": {"fail_mode": "closed"}}


def refused_call(form: str) -> tg.ToolCall:
    """A call identical to the waiting one, checked after the halt: a new object, one keyed outside
    a turn (``Keyer.key_of``), or one with the waiting call's ``call_id`` or another."""
    call = tg.ToolCall("build", {"target": "A"}, {"same id": "first", "other id": "other"}.get(form))
    if form == "keyed":
        tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel", "recorder"))).keyer.key_of(call)
    return call


def play_halted(how: str, form: str, cut: str, order: str) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []
    options = HOWS[how]
    plugins = {"failing": Failing()} if how == "plugin" else {}
    first_guard, second_guard = heard_guard(log, **options), heard_guard(log, **options)
    for guard in (first_guard, second_guard):
        for name, plugin in plugins.items():
            guard.register(plugin, name=name)
    turn = first_guard.turn(durable=True, promptable=how == "user")
    first = tg.ToolCall("build", {"target": "A"}, "first" if form == "same id" else None)
    assert turn.check_call(first).action is not tg.Action.HALT

    def cut_here(point: str) -> None:
        nonlocal turn
        if cut == point:
            turn = second_guard.resume(json.loads(json.dumps(turn.suspend())))

    halt_by(how, turn)
    cut_here("after the halt")
    refused = refused_call(form)
    log.append(("checked", turn.check_call(refused).action.label))
    cut_here("after the refused check")
    reports = [(refused, "ok"), (first, "error")]
    for call, outcome in reports if order == "refused first" else reports[::-1]:
        log.append(("verdict", turn.record_outcome(call, outcome).action.label))
    summary = turn.end()
    log.append(("summary", summary.tool_calls, summary.halted, turn.view.outcomes(tg.Outcome.OK),
                turn.view.outcomes(tg.Outcome.ERROR)))
    return log


@pytest.mark.parametrize(("form", "order"), [
    (form, order) for form in ("new", "keyed", "other id", "same id") for order in ("refused first", "waiting first")])
@pytest.mark.parametrize("how", list(HOWS))
def test_a_refused_calls_outcome_never_settles_a_waiting_identical_call_after_a_resume(how, form, order):
    """Halted in any way, the refused call a new object, one keyed outside a turn or one with a
    ``call_id``, reported before or after the waiting call: the waiting call's own outcome settles
    its check (or the first with its ``call_id``), the refused call's is ignored, resumed or not."""
    whole = play_halted(how, form, "never", order)
    if form == "same id":  # it names the waiting call: the first outcome with that id settles it
        settled = ("settled", "first", "ok" if order == "refused first" else "error")
    else:
        settled = ("settled", None, "error")
        assert ("ignored", refused_call(form).call_id, "ok", "unknown_call") in whole
    assert settled in whole
    for cut in ("after the halt", "after the refused check"):
        assert play_halted(how, form, cut, order) == whole, cut
