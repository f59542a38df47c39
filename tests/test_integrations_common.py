"""The decisions every adapter shares (turnguard.integrations._common), without a framework."""

from __future__ import annotations

import asyncio

import pytest

import turnguard as tg
from turnguard.integrations._common import (
    NO_ROUTE_SUFFIX,
    RunDriver,
    Step,
    TurnHalted,
    checked_ask,
    describe,
    not_executed,
    open_turn,
)

READ = ("read_file", {"path": "a.py"})


def identical(n: int) -> list[tg.ToolCall]:
    return [tg.ToolCall(*READ, call_id=f"c{i}") for i in range(n)]


def drive_failing(driver: RunDriver, n: int) -> list:
    """Check and fail ``n`` identical calls; the decisions in order (check, outcome, check, ...)."""
    decisions = []
    for call in identical(n):
        decisions.append(driver.check(call))
        if decisions[-1].step is not Step.RUN:
            break
        decisions.append(driver.outcome(call, tg.Outcome.ERROR))
        if decisions[-1].step is not Step.RUN:
            break
    return decisions


def test_promptable_defaults_to_whether_there_is_someone_to_ask():
    guard = tg.Guard()
    assert open_turn(guard, ask=None, promptable=None).turn.promptable is False
    assert open_turn(guard, ask=lambda v: "continue", promptable=None).turn.promptable is True
    assert open_turn(guard, ask=lambda v: "continue", promptable=False).turn.promptable is False


def test_a_frameworks_own_route_makes_the_turn_attended_but_is_not_a_callback():
    driver = open_turn(tg.Guard(), ask="approval", promptable=None)
    assert driver.turn.promptable is True and driver.ask is None
    raw = [driver.before(call) for call in identical(5)]
    assert [d.step for d in raw] == [Step.RUN] * 4 + [Step.ASK]  # attended: the warning asks
    assert driver.ask_user(raw[-1].verdict, None, before=True).step is Step.RUN  # no callback: observed


def test_an_ask_that_is_neither_a_callback_nor_the_route_is_refused_up_front():
    callback = lambda v: "continue"  # noqa: E731
    assert [checked_ask(a, "approval") for a in (None, callback, "approval")] == [None, callback, "approval"]
    with pytest.raises(ValueError, match="'aproval'"):
        checked_ask("aproval", "approval")


def test_stop_raises_on_a_halt_or_a_refusal_and_not_otherwise():
    driver = open_turn(tg.Guard(), ask=lambda verdict: "stop", promptable=None)
    decisions = [driver.check(call) for call in identical(5)]
    for decision in decisions[:4]:
        TurnHalted.stop(decision)
    with pytest.raises(TurnHalted, match="stopped by the user"):
        TurnHalted.stop(decisions[4])


def test_unattended_stop_halts_and_the_message_names_threshold_limit_and_counts():
    decisions = drive_failing(open_turn(tg.Guard(), ask=None, promptable=None), 20)
    assert decisions[-1].step is Step.HALT and len(decisions) == 16  # 8 checks + 8 outcomes
    text = describe(decisions[-1].verdict)
    assert text.startswith("turnguard stopped the run: threshold streak (stop, limit 8); 8 tool calls")
    assert "8 identical in a row, 8 failing" in text


def test_a_call_kept_from_running_tells_the_model_why_and_whether_the_user_is_asked_next():
    verdict = drive_failing(open_turn(tg.Guard(), ask=None, promptable=None), 20)[-1].verdict
    assert not_executed(verdict) == f"Not executed: {describe(verdict)}"
    assert not_executed(verdict, asked_next=True) == (f"Not executed: {describe(verdict)} "
                                                      "(the user is asked at the next call)")


def test_an_alternating_loop_halts_every_adapter_with_the_cycle_repeat_threshold_named():
    """The adapters' shared driver passes ``cycle_repeat`` through like any threshold."""
    guard = tg.Guard(tg.GuardConfig(cycle_repeat_warn_at=5, cycle_repeat_stop_at=8))
    driver = open_turn(guard, ask=None, promptable=None)
    steps = []
    for i in range(20):
        call = tg.ToolCall("read_file" if i % 2 else "list_dir", {"path": "a"}, call_id=f"c{i}")
        assert driver.check(call).step is Step.RUN
        steps.append(driver.outcome(call, tg.Outcome.OK))
        if steps[-1].step is not Step.RUN:
            break
    assert len(steps) == 16 and steps[-1].step is Step.HALT
    assert steps[-1].verdict.event.threshold == "cycle_repeat"
    with pytest.raises(TurnHalted, match=r"threshold cycle_repeat \(stop, limit 8\); 16 tool calls.*repeat a cycle"):
        TurnHalted.stop(steps[-1])


def test_an_ask_without_a_route_observes_the_warning_and_halts_at_the_stop_level():
    driver = open_turn(tg.Guard(), ask=None, promptable=True)
    decisions = drive_failing(driver, 20)
    assert decisions[-1].step is Step.HALT
    assert decisions[-1].verdict.message.endswith(NO_ROUTE_SUFFIX)
    assert driver.turn.ledger.tool_calls == 8


def test_answer_stop_refuses_the_call_and_records_it_as_denied():
    denied = []

    class Outcomes:
        @tg.hookimpl
        def turnguard_outcome_recorded(self, call, outcome):
            denied.append(outcome)

    guard = tg.Guard(plugins={"outcomes": Outcomes()})
    driver = open_turn(guard, ask=lambda verdict: "stop", promptable=None)
    decisions = [driver.check(call) for call in identical(5)]
    assert [d.step for d in decisions] == [Step.RUN] * 4 + [Step.REFUSE]
    assert denied == [tg.Outcome.DENIED]
    assert driver.turn.halted is not None


def test_async_callbacks_are_awaited_and_refused_where_the_host_is_synchronous():
    async def ask(verdict):
        return "continue"

    driver = open_turn(tg.Guard(), ask=ask, promptable=None)
    for call in identical(4):
        driver.check(call)
    with pytest.raises(TypeError, match="synchronous ask callback"):
        driver.check(identical(5)[4])

    driver = open_turn(tg.Guard(), ask=ask, promptable=None)
    steps = [asyncio.run(driver.acheck(call)).step for call in identical(6)]
    assert steps == [Step.RUN] * 6


def test_an_answer_that_is_not_one_of_the_three_is_a_programming_error():
    driver = open_turn(tg.Guard(), ask=lambda verdict: "maybe", promptable=None)
    for call in identical(4):
        driver.check(call)
    with pytest.raises(ValueError, match="continue"):
        driver.check(identical(5)[4])


def test_turn_halted_is_a_loop_detected_carrying_the_verdict():
    decisions = drive_failing(open_turn(tg.Guard(), ask=None, promptable=None), 20)
    error = TurnHalted(decisions[-1].verdict)
    assert isinstance(error, tg.LoopDetected) and error.verdict is decisions[-1].verdict
    assert str(error) == describe(decisions[-1].verdict)


def test_end_reports_how_the_run_finished():
    guard = tg.Guard()
    ok, halted, failed = (open_turn(guard, ask=None, promptable=None) for _ in range(3))
    ok.end()
    halted.end(TurnHalted(tg.Verdict(tg.Action.HALT, tg.Threshold.EXPLICIT)))
    failed.end(RuntimeError("the model provider is down"))
    assert [d.turn.summary.reason for d in (ok, halted, failed)] == ["completed", "halted", "error"]


# -- a question holds the calls after it -------------------------------------------------------


def test_a_deferred_question_holds_later_calls_unchecked_until_it_is_answered():
    driver = open_turn(tg.Guard(), ask="approval", promptable=None)
    *ran, asked = [driver.before(call) for call in identical(5)]
    assert [d.step for d in ran] == [Step.RUN] * 4 and asked.step is Step.ASK
    driver.defer(asked.verdict)
    held = [driver.before(call) for call in identical(3)]
    assert {d.step for d in held} == {Step.HOLD} and {d.verdict for d in held} == {asked.verdict}
    assert driver.turn.ledger.tool_calls == 5  # held calls are not counted
    driver.answer(asked.verdict, "continue", None, before=True)
    assert driver.question is None and driver.before(identical(1)[0]).step is Step.RUN


def test_a_thread_checking_while_another_is_asking_waits_for_the_answer():
    import threading
    import time

    order = []

    def ask(verdict: tg.Verdict) -> str:
        order.append("asked")
        time.sleep(0.2)
        order.append("answered")
        return "stop"

    driver = open_turn(tg.Guard(), ask=ask, promptable=None)
    calls = identical(6)
    for call in calls[:4]:
        driver.check(call)
    asking = threading.Thread(target=driver.check, args=(calls[4],))
    asking.start()
    while not order:
        time.sleep(0.01)
    decision = driver.check(calls[5])
    order.append(decision.step)
    asking.join()
    assert order == ["asked", "answered", Step.HALT]


def test_a_task_checking_while_another_awaits_the_answer_waits_for_it():
    order = []

    async def ask(verdict: tg.Verdict) -> str:
        order.append("asked")
        await asyncio.sleep(0.05)
        order.append("answered")
        return "stop"

    async def scenario() -> None:
        driver = open_turn(tg.Guard(), ask=ask, promptable=None)
        calls = identical(6)
        for call in calls[:4]:
            await driver.acheck(call)
        asking = asyncio.create_task(driver.acheck(calls[4]))
        await asyncio.sleep(0)
        order.append((await driver.acheck(calls[5])).step)
        assert (await asking).step is Step.REFUSE

    asyncio.run(scenario())
    assert order == ["asked", "answered", Step.HALT]


class Results:
    """The task results a guard saw: each turn's summary, and the statuses of results not taken in the turn."""

    def __init__(self) -> None:
        self.summaries: list[tg.TurnSummary] = []
        self.statuses: list[str] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary) -> None:
        self.summaries.append(summary)

    @tg.hookimpl
    def turnguard_turn_result(self, turn_id, summary, resolved, status, labels) -> None:
        self.statuses.append(status)


ENDINGS = {
    "completed": None,
    "halted": TurnHalted(tg.Verdict(tg.Action.HALT, tg.Threshold.EXPLICIT, "stop")),
    "cancelled": asyncio.CancelledError(),
    "error": RuntimeError("tool blew up"),
}


@pytest.mark.parametrize("reported", [None, True, False], ids=["none", "resolved", "unresolved"])
@pytest.mark.parametrize("ending", ENDINGS)
def test_the_hosts_own_result_in_the_turn_stands_and_the_run_adds_none_however_it_ends(ending, reported):
    """The adapter reports a run that died on an error as unresolved only when the host reported
    nothing in the turn: the host's result stands, no second result is counted (``duplicate``)."""
    results = Results()
    guard = tg.Guard(tg.GuardConfig())
    guard.register(results, "results")
    driver = open_turn(guard, ask=None, promptable=False)
    if reported is not None:
        assert driver.turn.report_result(reported)
    driver.end(ENDINGS[ending])
    driver.end(ENDINGS[ending])  # (idempotent)
    assert results.statuses == []
    expected = reported if reported is not None else (False if ending == "error" else None)
    assert [(s.reason, s.resolved) for s in results.summaries] == [(ending, expected)]
    assert driver.turn.resolved is expected
