"""``Guard`` and ``Turn``: the host's lifecycle, combining verdicts, latching, isolation, threads."""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time

import pluggy
import pytest

import turnguard as tg
from conftest import core_guard, distinct_call, drive, with_repeats
from turnguard._plugins import NON_POLICY_PLUGINS

REPEATED = tg.ToolCall("bash", "npm run build")


def test_the_design_example_runs_as_written():
    guard = core_guard()
    with guard.turn(conversation_id="c1", agent_name="coder", promptable=False) as turn:
        assert turn.begin_cycle().action is tg.Action.ALLOW
        call = tg.ToolCall("read_file", {"path": "a.py"}, call_id="t1")
        assert turn.check_call(call).action is tg.Action.ALLOW
        v = turn.record_outcome(call, tg.Outcome.ERROR)
        assert v.action is tg.Action.ALLOW
        turn.retry()
    assert turn.summary.reason == "completed" and turn.summary.conversation_id == "c1"


class Ruling:
    """A plugin that returns a fixed verdict on every call (built with the ledger's ``detect``)."""

    def __init__(self, action: tg.Action, threshold: str, raises: bool = False) -> None:
        self.action, self.threshold, self.raises = action, threshold, raises

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        if self.raises:
            raise RuntimeError("plugin bug")
        return turn.detect(self.threshold, self.action, tg.Level.WARN, 1, call=call)


class Events:
    def __init__(self) -> None:
        self.detected: list[tg.LoopDetectedEvent] = []
        self.errors: list[tuple[str, str, BaseException]] = []
        self.ended: list[tg.TurnSummary] = []

    @tg.hookimpl
    def turnguard_loop_detected(self, event):
        self.detected.append(event)

    @tg.hookimpl
    def turnguard_plugin_error(self, plugin, hook, error):
        self.errors.append((plugin, hook, error))

    @tg.hookimpl
    def turnguard_turn_ended(self, summary):
        self.ended.append(summary)


def test_the_most_severe_verdict_wins_and_every_detection_is_reported():
    events = Events()
    guard = core_guard(max_tool_calls_per_turn=1)
    guard.register(Ruling(tg.Action.ASK, "asker"), name="asker")
    guard.register(events, name="events")
    turn = guard.turn()
    assert turn.check_call(distinct_call(1)).action is tg.Action.ASK
    halt = turn.check_call(distinct_call(2))
    assert (halt.action, halt.threshold) == (tg.Action.HALT, tg.Threshold.EXPLICIT)  # a plugin cannot allow a halt
    assert [e.threshold for e in events.detected] == ["asker", "asker", tg.Threshold.EXPLICIT]
    assert turn.ledger.detections == 3


def test_ties_go_to_the_first_detection_in_hook_order():
    guard = core_guard()
    guard.register(Ruling(tg.Action.ASK, "registered-first"), name="first")
    guard.register(Ruling(tg.Action.ASK, "registered-last"), name="last")  # pluggy calls it first
    assert guard.turn().check_call(distinct_call(1)).threshold == "registered-last"


def test_a_halt_latches_until_the_turn_ends():
    turn = core_guard(max_tool_calls_per_turn=2).turn()
    drive(turn, [distinct_call(1), distinct_call(2)])
    halt = turn.check_call(distinct_call(3))
    later = [turn.check_call(distinct_call(4)), turn.record_outcome(distinct_call(4), "ok"), turn.begin_cycle(),
             turn.check_call(distinct_call(5))]
    assert all(v is halt for v in later) and turn.halted is halt
    assert turn.ledger.tool_calls == 3  # latched checks are not counted
    summary = turn.end()
    assert summary.halted and summary.reason == "halted" and summary.threshold is tg.Threshold.EXPLICIT
    fresh = turn.guard.turn()
    assert fresh.check_call(distinct_call(6)).action is tg.Action.ALLOW


def test_retry_rolls_the_count_back_to_the_cycle_start_and_clears_repeats_and_streaks():
    turn = core_guard().turn()
    turn.begin_cycle()
    drive(turn, [distinct_call(i) for i in range(95)])
    turn.begin_cycle()
    drive(turn, [REPEATED] * 4 + [distinct_call(500 + i) for i in range(8)], tg.Outcome.ERROR)
    assert turn.ledger.tool_calls == 107 and turn.ledger.max_key_repeat == 4
    turn.retry()
    assert (turn.ledger.tool_calls, turn.ledger.max_key_repeat, turn.ledger.streak_length) == (95, 0, 0)
    turn.begin_cycle()
    # the repeats before the retry no longer count: two more are not stuck past the soft cap
    verdicts = drive(turn, with_repeats(20, REPEATED, at=(3, 9)))
    assert all(v.action is tg.Action.ALLOW for v in verdicts) and turn.ledger.tool_calls == 115


def _halt_at_backstop(turn: tg.Turn) -> None:
    turn.begin_cycle()
    verdicts = drive(turn, [distinct_call(i) for i in range(1001)])
    assert verdicts[-1].threshold is tg.Threshold.HARD_BACKSTOP and len(verdicts) == 1001


def _halt_explicit(turn: tg.Turn) -> None:
    turn.begin_cycle()
    assert drive(turn, [distinct_call(i) for i in range(4)])[-1].threshold is tg.Threshold.EXPLICIT


def _halt_streak(turn: tg.Turn) -> None:
    turn.begin_cycle()
    for _ in range(8):
        turn.check_call(REPEATED)
        verdict = turn.record_outcome(REPEATED, tg.Outcome.ERROR)
    assert verdict.threshold is tg.Threshold.STREAK and verdict.action is tg.Action.HALT


def _halt_cycles(turn: tg.Turn) -> None:
    for i in range(3):
        turn.begin_cycle()
        drive(turn, [distinct_call(i)])
    assert turn.begin_cycle().threshold is tg.Threshold.CYCLE_CAP


def _halt_by_the_user(turn: tg.Turn) -> None:
    turn.begin_cycle()
    asked = None
    for _ in range(5):
        asked = turn.check_call(REPEATED)
        turn.record_outcome(REPEATED, tg.Outcome.OK)
    assert asked.action is tg.Action.ASK
    assert turn.resolve(asked, "stop").action is tg.Action.HALT


def _halt_by_the_host(turn: tg.Turn) -> None:
    turn.begin_cycle()
    drive(turn, [distinct_call(i) for i in range(3)])
    turn.halt(turn.view.detect("host", tg.Action.ASK, tg.Level.STOP, 1))


HALTS = {
    "backstop": ({}, False, _halt_at_backstop),
    "explicit": ({"max_tool_calls_per_turn": 3}, False, _halt_explicit),
    "streak": ({}, False, _halt_streak),
    "cycle cap": ({"max_cycles_per_turn": 3}, False, _halt_cycles),
    "the user's stop": ({}, True, _halt_by_the_user),
    "the host's halt": ({}, False, _halt_by_the_host),
}


@pytest.mark.parametrize("kind", list(HALTS))
def test_a_retry_after_a_halt_keeps_the_halted_turns_counts(kind):
    """A halted turn is over: a retry there does not roll its counts back (a turn halted at the
    backstop ending with ``tool_calls=0`` would be a turn the probe and the boards never saw)."""
    options, promptable, halt = HALTS[kind]
    turn = core_guard(**options).turn(promptable=promptable)
    halt(turn)
    before = (turn.ledger.tool_calls, turn.ledger.max_key_repeat, turn.ledger.streak_length, turn.ledger.retries)
    turn.retry()
    assert (turn.ledger.tool_calls, turn.ledger.max_key_repeat, turn.ledger.streak_length,
            turn.ledger.retries) == before
    assert turn.check_call(distinct_call(5000)).action is tg.Action.HALT
    summary = turn.end()
    assert summary.halted and summary.tool_calls == before[0] > 0


def test_a_retry_after_a_probe_turns_halt_keeps_its_shadows_counts_too():
    heard = []

    class Shadows:
        @tg.hookimpl
        def turnguard_shadow_turn_ended(self, policy, summary):
            heard.append((policy, summary.tool_calls, summary.halted))

    config = tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False, name="main",
                            max_tool_calls_per_turn=5,
                            probe=tg.Probe(1.0, tg.GuardConfig(max_tool_calls_per_turn=8, name="lenient")))
    turn = tg.Guard(config, plugins={"shadows": Shadows()}, environ={}).turn()
    turn.begin_cycle()
    assert drive(turn, [distinct_call(i) for i in range(9)])[-1].threshold is tg.Threshold.EXPLICIT
    turn.retry()
    assert turn.end().tool_calls == 9
    assert heard == [("main", 6, True)]  # the main configuration's would-be halt at call 6 stands


def test_retry_is_reported_to_observers():
    seen = []

    class Watcher:
        @tg.hookimpl
        def turnguard_retry(self, turn):
            seen.append(turn.tool_calls)

    guard = core_guard()
    guard.register(Watcher(), name="watcher")
    turn = guard.turn()
    turn.begin_cycle()
    drive(turn, [distinct_call(1)])
    turn.retry()
    assert seen == [0]


def test_a_raising_plugin_is_isolated_and_reported_fail_open(caplog):
    events = Events()
    guard = core_guard(max_tool_calls_per_turn=2)
    guard.register(Ruling(tg.Action.HALT, "never", raises=True), name="buggy")
    guard.register(events, name="events")
    turn = guard.turn()
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        verdicts = drive(turn, [distinct_call(i) for i in range(5)])
    assert [v.action for v in verdicts] == [tg.Action.ALLOW, tg.Action.ALLOW, tg.Action.HALT]
    assert verdicts[-1].threshold is tg.Threshold.EXPLICIT  # the cap's verdict was not lost
    assert [(p, h) for p, h, _ in events.errors] == [("buggy", "turnguard_check_call")] * 3
    assert isinstance(events.errors[0][2], RuntimeError)
    assert "buggy" in caplog.text and "RuntimeError" in caplog.text
    assert "plugin bug" not in caplog.text  # its text can hold tool arguments: only with capture_content


def test_a_raising_plugin_halts_the_turn_fail_closed():
    guard = core_guard(fail_mode="closed")
    guard.register(Ruling(tg.Action.ALLOW, "x", raises=True), name="buggy")
    verdict = guard.turn().check_call(distinct_call(1))
    assert verdict.action is tg.Action.HALT and "buggy" in verdict.message and "fail_mode=closed" in verdict.message


def test_a_plugin_returning_something_else_than_a_verdict_is_isolated():
    class Confused:
        @tg.hookimpl
        def turnguard_check_call(self):
            return "halt"

    events = Events()
    guard = core_guard()
    guard.register(Confused(), name="confused")
    guard.register(events, name="events")
    assert guard.turn().check_call(distinct_call(1)).action is tg.Action.ALLOW
    assert isinstance(events.errors[0][2], TypeError) and "Verdict" in str(events.errors[0][2])


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_a_raising_observer_never_reaches_the_host_and_halts_its_call_when_failing_closed(fail_mode):
    class BrokenObserver:
        @tg.hookimpl
        def turnguard_call_checked(self, verdict):
            raise ValueError("observer bug")

    events = Events()
    guard = core_guard(fail_mode=fail_mode)
    guard.register(BrokenObserver(), name="broken")
    guard.register(events, name="events")
    turn = guard.turn()
    expected = tg.Action.HALT if fail_mode == "closed" else tg.Action.ALLOW
    assert turn.check_call(distinct_call(1)).action is expected  # the call it failed on, not only the next
    assert events.errors[0][:2] == ("broken", "turnguard_call_checked")
    assert (turn.halted is not None) is (fail_mode == "closed")


def test_hook_implementations_may_take_any_subset_of_the_arguments():
    seen = []

    class Picky:
        @tg.hookimpl
        def turnguard_check_call(self, call):
            seen.append(call.name)

        @tg.hookimpl
        def turnguard_check_outcome(self, outcome, turn):
            seen.append((outcome, turn.tool_calls))

    guard = core_guard()
    guard.register(Picky(), name="picky")
    drive(guard.turn(), [distinct_call(1)])
    assert seen == ["read_file", (tg.Outcome.OK, 1)]


def test_the_key_is_computed_once_per_call():
    class Counted:
        reprs = 0

        def __repr__(self) -> str:
            Counted.reprs += 1
            return "Counted()"

    turn = core_guard().turn()
    call = tg.ToolCall("tool", Counted())
    turn.check_call(call)
    turn.record_outcome(call, tg.Outcome.OK)
    assert Counted.reprs == 1


@pytest.mark.parametrize("name", ["", None, 5])
def test_an_empty_or_missing_tool_name_is_a_value_error(name):
    with pytest.raises(ValueError, match="non-empty string"):
        tg.ToolCall(name, {})


@pytest.mark.parametrize("bad", [None, "read_file", {"name": "read_file"}])
def test_passing_something_else_than_a_tool_call_is_a_type_error(guard, bad):
    turn = guard.turn()
    with pytest.raises(TypeError, match="ToolCall"):
        turn.check_call(bad)
    with pytest.raises(TypeError, match="ToolCall"):
        turn.record_outcome(bad, "ok")


@pytest.mark.parametrize("bad", ["fine", "", None, 1])
def test_an_unknown_outcome_is_a_value_error_naming_the_accepted_ones(guard, bad):
    with pytest.raises(ValueError, match="'ok', 'error', 'denied', 'unknown'"):
        guard.turn().record_outcome(distinct_call(1), bad)


def test_outcomes_may_be_given_as_strings(guard):
    turn = guard.turn()
    call = distinct_call(1)
    turn.check_call(call)
    turn.record_outcome(call, "ERROR")
    assert turn.ledger.outcomes(tg.Outcome.ERROR) == 1


def test_a_config_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="GuardConfig"):
        tg.Guard({"soft_cap": 5})


def test_raise_for_raises_loop_detected_on_halt_and_the_block_ends_the_turn_as_halted():
    guard = core_guard(max_tool_calls_per_turn=1)
    with pytest.raises(tg.LoopDetected) as caught, guard.turn() as turn:
        for i in range(3):
            turn.raise_for(turn.check_call(distinct_call(i)))
    assert caught.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert "max_tool_calls_per_turn=1" in str(caught.value)
    assert turn.summary.reason == "halted"


def test_an_exception_in_the_block_ends_the_turn_as_error_and_end_is_idempotent():
    events = Events()
    guard = core_guard()
    guard.register(events, name="events")
    with pytest.raises(KeyError), guard.turn() as turn:
        raise KeyError("host bug")
    assert turn.summary.reason == "error"
    assert turn.end("completed") is turn.summary
    assert [s.reason for s in events.ended] == ["error"]


def test_turn_started_and_configure_reach_plugins():
    seen = []

    class Lifecycle:
        @tg.hookimpl
        def turnguard_configure(self, config):
            seen.append(("configure", config.soft_cap))

        @tg.hookimpl
        def turnguard_turn_started(self, turn):
            seen.append(("started", turn.agent_name))

    guard = core_guard(soft_cap=42)
    guard.register(Lifecycle(), name="lifecycle")  # configure is historic: replayed on registration
    guard.turn(agent_name="coder")
    assert seen == [("configure", 42), ("started", "coder")]


# -- concurrency --------------------------------------------------------------------------------

THREADS, PER_THREAD = 8, 10_000
POOL = [tg.ToolCall("read_file", {"path": f"src/{i}.py"}) for i in range(40)]


class Journal:
    """Records, under the turn's lock, the order in which checks and outcomes were decided."""

    def __init__(self) -> None:
        self.order: list[tuple[str, tg.ToolCall, tg.Outcome | None]] = []
        self.threads: list[int] = []

    @tg.hookimpl(tryfirst=True)
    def turnguard_check_call(self, call):
        self.order.append(("call", call, None))
        self.threads.append(threading.get_ident())

    @tg.hookimpl(tryfirst=True)
    def turnguard_check_outcome(self, call, outcome):
        self.order.append(("outcome", call, outcome))
        self.threads.append(threading.get_ident())


def _plan(thread: int) -> list[tuple[tg.ToolCall, tg.Outcome]]:
    """Each thread's calls: runs of identical calls (so streaks form and break under contention)."""
    plan = []
    for i in range(PER_THREAD):
        base = POOL[(thread * 5 + i // 7) % len(POOL)]
        outcome = tg.Outcome.ERROR if (i // 3) % 4 else tg.Outcome.OK
        plan.append((tg.ToolCall(base.name, base.args), outcome))
    return plan


def _signature(verdict: tg.Verdict) -> tuple:
    event = verdict.event
    return (verdict.action, verdict.threshold, event and (event.level, event.tool_calls, event.streak_length,
                                                            event.failing_streak_length, event.max_key_repeat))


@pytest.fixture
def fast_switching():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: maximal interleaving
    yield
    sys.setswitchinterval(interval)


def test_eight_threads_get_exact_counts_and_the_verdicts_of_the_same_sequence_run_sequentially(fast_switching):
    options = {"max_tool_calls_per_turn": 0, "streak_warn_at": 5, "streak_stop_at": 8}
    guard, journal = core_guard(**options), Journal()
    guard.register(journal, name="journal")
    turn = guard.turn(promptable=True)  # attended: streaks ask instead of halting, so all calls run
    got: dict[tuple[int, tg.ToolCall], tg.Verdict] = {}
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        for i, (call, outcome) in enumerate(_plan(thread)):
            got["call", id(call)] = turn.check_call(call)
            if i % 16 == 0:
                time.sleep(0)  # give the GIL away between a check and its outcome, often
            got["outcome", id(call)] = turn.record_outcome(call, outcome)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    total = THREADS * PER_THREAD
    ledger = turn.ledger
    assert ledger.tool_calls == total and len(journal.order) == 2 * total
    assert ledger.distinct_keys == len(POOL)
    assert sum(ledger.outcomes(o) for o in tg.Outcome) == total
    errors = sum(o is tg.Outcome.ERROR for t in range(THREADS) for _, o in _plan(t))
    assert ledger.outcomes(tg.Outcome.ERROR) == errors

    replay_guard = core_guard(**options)
    replay = replay_guard.turn(promptable=True)
    switches = sum(a != b for a, b in zip(journal.threads, journal.threads[1:], strict=False))
    assert switches > 1000, "the threads did not interleave: the test would prove nothing"
    for kind, call, outcome in journal.order:
        expected = replay.check_call(call) if kind == "call" else replay.record_outcome(call, outcome)
        assert _signature(got[kind, id(call)]) == _signature(expected)
    assert replay.ledger.max_key_repeat == ledger.max_key_repeat
    assert collections.Counter(_signature(v)[0] for v in got.values())[tg.Action.ASK] > 0


def test_under_contention_exactly_call_n_plus_1_halts_and_every_later_call_gets_the_latched_halt(fast_switching):
    limit = THREADS * PER_THREAD // 2
    turn = core_guard(max_tool_calls_per_turn=limit).turn()
    verdicts: list[list[tg.Verdict]] = [[] for _ in range(THREADS)]

    def work(thread: int) -> None:
        for i in range(PER_THREAD):
            verdicts[thread].append(turn.check_call(distinct_call(thread * PER_THREAD + i)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [v for per in verdicts for v in per]
    actions = collections.Counter(v.action for v in flat)
    assert actions == {tg.Action.ALLOW: limit, tg.Action.HALT: limit}
    halts = {id(v) for v in flat if v.action is tg.Action.HALT}
    assert len(halts) == 1 and turn.halted.event.tool_calls == limit + 1
    assert turn.ledger.tool_calls == limit + 1


def test_a_plugin_manager_built_by_the_host_can_be_passed_in():
    from turnguard._plugins import plugin_manager

    config = tg.GuardConfig(disable_plugins=(*NON_POLICY_PLUGINS, "streak"), load_entrypoints=False)
    pm = plugin_manager(config, environ={})
    assert isinstance(pm, pluggy.PluginManager)
    guard = tg.Guard(config, plugin_manager=pm)
    assert guard.pm is pm and pm.get_plugin("streak") is None and pm.get_plugin("cap") is not None


class _RaisingConfigure:
    def __init__(self) -> None:
        self.errors: list[str] = []

    @tg.hookimpl
    def turnguard_configure(self, config):
        raise RuntimeError("set-up bug")

    @tg.hookimpl
    def turnguard_plugin_error(self, plugin, hook, error):
        self.errors.append(f"{plugin}:{hook}:{error}")


def test_a_plugin_raising_in_configure_is_reported_and_the_guard_still_works(caplog):
    plugin = _RaisingConfigure()
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        guard = tg.Guard(
            tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, load_entrypoints=False),
            plugins={"bad-setup": plugin},
            environ={},
        )
    assert plugin.errors == ["bad-setup:turnguard_configure:set-up bug"]
    assert "bad-setup" in caplog.text and "RuntimeError" in caplog.text and "set-up bug" not in caplog.text
    late = _RaisingConfigure()
    guard.register(late, name="late")  # a plugin registered later gets configure too, isolated
    assert late.errors[-1] == "late:turnguard_configure:set-up bug"
    with guard.turn() as turn:
        assert turn.check_call(distinct_call(1)).action is tg.Action.ALLOW


class _Returns:
    def __init__(self, verdict) -> None:
        self.verdict = verdict

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        return self.verdict


@pytest.mark.parametrize("bad", [tg.Verdict("halt", "x"), tg.Verdict(None), tg.Verdict(3), "halt", 3])
def test_a_verdict_without_a_real_action_is_a_plugin_error_not_a_host_crash(bad):
    guard = tg.Guard(
        tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, load_entrypoints=False, streak_warn_at=1),
        plugins={"odd": _Returns(bad)},
        environ={},
    )
    with guard.turn(promptable=True) as turn:
        verdict = turn.check_call(distinct_call(1))
    assert verdict.action is tg.Action.ASK and verdict.threshold is tg.Threshold.STREAK  # the streak's ASK stands


def test_a_bare_allow_from_another_plugin_does_not_hide_an_observed_detection():
    guard = tg.Guard(
        tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS, load_entrypoints=False),
        plugins={"bare": _Returns(tg.Verdict(tg.Action.ALLOW))},
        environ={},
    )
    call = tg.ToolCall("ls", {"path": "."})
    with guard.turn(promptable=False) as turn:
        verdicts = [turn.check_call(call) for _ in range(5)]
    assert verdicts[-1].action is tg.Action.ALLOW
    assert verdicts[-1].threshold is tg.Threshold.STREAK and verdicts[-1].event is not None


def test_a_host_halt_on_a_detection_latches_with_its_threshold():
    call = tg.ToolCall("build", {"target": "all"})
    with core_guard().turn(promptable=True) as turn:
        for _ in range(8):
            turn.check_call(call)
            verdict = turn.record_outcome(call, tg.Outcome.ERROR)
        assert verdict.action is tg.Action.ASK  # nobody to ask: the host halts instead
        halted = turn.halt(verdict, "nobody to ask")
        assert (halted.action, halted.threshold, halted.event) == (tg.Action.HALT, tg.Threshold.STREAK, verdict.event)
        assert turn.check_call(call) is halted
    assert turn.summary.halted and turn.summary.threshold is tg.Threshold.STREAK
