"""Polling tools (``stateful_tools``, ``streak_exempt_tools``): a changed result is progress.

The worked example of docs/polling.md, call for call; what a result costs and where it goes (only
its digest, once keyed, never its value); the streak and the stuck signal over (call, result)
pairs; exempt tools; batches settled out of order; snapshots; shadows.
"""

from __future__ import annotations

import json
import random

import pytest

import turnguard as tg
from conftest import CORE_ONLY, core_guard
from turnguard._keys import cached_result
from turnguard._policies import cap

OK, ERROR, DENIED = tg.Outcome.OK, tg.Outcome.ERROR, tg.Outcome.DENIED
HALT, ALLOW, ASK = tg.Action.HALT, tg.Action.ALLOW, tg.Action.ASK


def profile(name: str, **options: object) -> tg.Guard:
    return tg.Guard(tg.PROFILES[name].replace(**{**CORE_ONLY, **options}), environ={})


def poll(turn: tg.Turn, results: list[object], *, tool: str = "ci_status", args: object = None,
         outcome: tg.Outcome = OK) -> tuple[str, int, str | None] | None:
    """Poll ``tool`` once per result, one call at a time, as a host does; where the first HALT
    came: ("check" | "outcome", the call's 1-based number, the threshold), or ``None``."""
    args = {"run": 42} if args is None else args
    for n, result in enumerate(results, 1):
        call = tg.ToolCall(tool, args)
        verdict = turn.check_call(call)
        if verdict.action is HALT:
            return "check", n, str(verdict.threshold)
        verdict = turn.record_outcome(call, outcome, result=result)
        if verdict.action is HALT:
            return "outcome", n, str(verdict.threshold)
    return None


def changing_statuses() -> list[str]:
    """40 polls of a CI run that moves: queued, running 10% ... 100%, passed (at most 4 alike in a row)."""
    statuses = ["queued"] * 3 + [f"running {10 * (1 + i * 10 // 36)}%" for i in range(36)] + ["passed"]
    assert len(statuses) == 40 and len(set(statuses)) == 12
    return statuses


# -- the worked example ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["seed", "recommended"])
def test_forty_polls_whose_status_changes_complete_under_every_profile(name):
    turn = profile(name, stateful_tools=("ci_status",)).turn()
    assert poll(turn, changing_statuses()) is None
    summary = turn.end()
    assert not summary.halted and summary.tool_calls == 40
    assert dict(summary.result_restarts) == {"ci_status": 11}


def test_without_listing_the_tool_the_recommended_profile_halts_the_same_forty_polls():
    assert poll(profile("recommended").turn(), changing_statuses()) == ("outcome", 8, "streak")


def test_thirty_unchanged_polls_halt_at_the_eighth_under_recommended_and_complete_under_seed():
    results = ["running"] * 30 + ["passed"]
    assert poll(profile("recommended", stateful_tools=("ci_status",)).turn(), results) == ("outcome", 8, "streak")
    turn = profile("seed", stateful_tools=("ci_status",)).turn()
    assert poll(turn, results) is None
    assert turn.end().max_key_repeat == 30  # (ci_status, running) thirty times: stuck, but under the soft cap


@pytest.mark.parametrize("listed", [(), ("tail_log",)])
def test_a_log_polled_1500_times_with_one_answer_halts_at_the_streak_or_at_call_101(listed):
    answers = ["no new output"] * 1500
    recommended = profile("recommended", stateful_tools=("ci_status", *listed)).turn()
    assert poll(recommended, answers, tool="tail_log", args="tail -n 20 build.log") == ("outcome", 8, "streak")
    seed = profile("seed", stateful_tools=("ci_status", *listed)).turn()
    assert poll(seed, answers, tool="tail_log", args="tail -n 20 build.log") == ("check", 101, "soft_stuck")


@pytest.mark.parametrize("name", ["seed", "recommended"])
def test_a_true_wait_exempted_from_the_streak_is_still_bounded_by_the_caps(name):
    turn = profile(name, streak_exempt_tools=("ci_status",)).turn()
    assert poll(turn, ["running"] * 1500) == ("check", 101, "soft_stuck")
    turn = profile(name, streak_exempt_tools=("ci_status",)).turn()
    assert poll(turn, [f"running {i}" for i in range(1500)], args=None) == ("check", 101, "soft_stuck")  # no result
    # evidence: an exempt tool's calls still count as repeats of one call, so the soft cap stops them


def test_a_pending_job_reported_as_an_error_halts_at_the_eighth_unchanged_failure_only():
    listed = profile("seed", stateful_tools=("ci_status",))
    assert poll(listed.turn(), ["pending"] * 20, outcome=ERROR) == ("outcome", 8, "streak")
    assert poll(listed.turn(), [f"pending, {i} ahead" for i in range(20, 0, -1)], outcome=ERROR) is None
    assert poll(profile("seed").turn(), [f"pending, {i} ahead" for i in range(20, 0, -1)], outcome=ERROR) == (
        "outcome", 8, "streak")


# -- the rules ------------------------------------------------------------------------------------------


def test_calls_without_a_result_count_as_identical_calls_always_did():
    for name in ("seed", "recommended"):
        listed = profile(name, stateful_tools=("ci_status",)).turn()
        plain = profile(name).turn()
        assert poll(listed, [None] * 200) == poll(plain, [None] * 200) is not None
        for a, b in (("max_key_repeat", "max_key_repeat"), ("first_stuck_call", "first_stuck_call")):
            assert getattr(listed.end(), a) == getattr(plain.end(), b)


def test_a_missing_result_is_skipped_when_comparing_and_a_denied_calls_result_is_none():
    turn = core_guard(stateful_tools=("poll",), streak_stop_on="any").turn()
    sequence = [("a", OK), (None, OK), ("a", OK), ("zzz", DENIED), ("a", OK), ("b", OK)]
    lengths = []
    for result, outcome in sequence:
        call = tg.ToolCall("poll", {})
        turn.check_call(call)
        turn.record_outcome(call, outcome, result=result)
        lengths.append(turn.ledger.streak_length)
    assert lengths == [1, 2, 3, 4, 5, 1]  # only "b" differs from the latest result given
    assert turn.ledger.result_restarts == 1


def test_results_are_keyed_with_the_call_keying_rules():
    turn = core_guard(stateful_tools=("poll",)).turn()
    for result in ('{"status": "running", "eta": 3}', {"eta": 3, "status": "running"}, b'{"eta":3,"status":"running"}'):
        call = tg.ToolCall("poll", {"id": 1})
        turn.check_call(call)
        turn.record_outcome(call, OK, result=result)
    assert turn.ledger.streak_length == 3 and turn.ledger.result_restarts == 0
    assert turn.ledger.max_key_repeat == 3  # one (call, result) pair, whatever the result's JSON spelling


def test_the_stuck_signal_counts_call_and_result_pairs_and_stale_repeat_takes_a_new_result_as_news():
    for signal in ("repeat", "stale_repeat"):
        turn = core_guard(stateful_tools=("poll",), stuck_signal=signal, streak_warn_at=0, streak_stop_at=0).turn()
        for i in range(150):
            call = tg.ToolCall("poll", {})
            assert turn.check_call(call).action is ALLOW
            assert turn.record_outcome(call, OK, result=f"step {i // 5}").action is ALLOW
        assert turn.ledger.max_key_repeat == 5 and not cap.stuck(turn.ledger)
        assert turn.ledger.max_stale_repeat == (5 if signal == "stale_repeat" else 0)


@pytest.mark.parametrize("signal", ["repeat", "stale_repeat"])
def test_past_the_soft_cap_the_stuck_verdict_comes_at_the_outcome_that_makes_the_pair_stuck(signal):
    turn = core_guard(stateful_tools=("poll",), stuck_signal=signal, streak_warn_at=0, streak_stop_at=0).turn()
    results = [f"step {i}" for i in range(120)] + ["stuck"] * 6
    assert poll(turn, results, tool="poll") == ("outcome", 126, "soft_stuck")
    summary = turn.end()
    assert summary.first_stuck_call == 126 and summary.threshold == "soft_stuck"


def test_a_batch_of_identical_polls_past_the_soft_cap_halts_at_the_outcome_that_makes_it_stuck():
    turn = core_guard(stateful_tools=("poll",), streak_warn_at=0, streak_stop_at=0).turn()
    assert poll(turn, [f"step {i}" for i in range(110)], tool="poll") is None
    batch = [tg.ToolCall("poll", {"run": 42}, call_id=f"b{i}") for i in range(8)]
    assert all(turn.check_call(call).action is ALLOW for call in batch)  # no result known yet: not stuck
    verdicts = [turn.record_outcome(call, OK, result="same") for call in reversed(batch)]
    assert [v.action for v in verdicts] == [ALLOW] * 5 + [HALT] * 3
    assert verdicts[5].threshold is tg.Threshold.SOFT_STUCK


def test_a_stateful_call_whose_outcome_never_comes_counts_without_a_result():
    from turnguard._ledger import MAX_AWAITING

    turn = core_guard(stateful_tools=("poll",), soft_cap=0, streak_warn_at=0, streak_stop_at=0).turn()
    for _ in range(3 * MAX_AWAITING):
        turn.check_call(tg.ToolCall("poll", {}))
    assert turn.ledger.max_key_repeat >= MAX_AWAITING  # given up waiting: counted as the call alone
    assert len(turn.ledger._polled) <= 2 * MAX_AWAITING + 1024


@pytest.mark.parametrize("lost", ["every", "every_other", "random"])
def test_a_listed_tool_whose_outcomes_are_lost_halts_as_an_unlisted_one_within_the_wait(lost):
    """docs/polling.md: a call whose outcome never comes counts as the call alone. Its repeat, kept
    for its result, is counted without one once WAIT_BEHIND checks have passed it: the stuck signal
    halts the turn at most that many calls after it would with the tool not listed."""
    from turnguard._ledger._state import WAIT_BEHIND

    rng = random.Random(lost)
    report = {"every": lambda i: False, "every_other": lambda i: i % 4 == 1,
              "random": lambda i: rng.random() < 0.3}[lost]

    def halt(stateful: tuple[str, ...]) -> int | None:
        turn = core_guard(stateful_tools=stateful).turn()
        for i in range(1, 1200):
            call = tg.ToolCall("poll", {"job": 1}) if i % 2 else tg.ToolCall("read", {"i": i})
            if turn.check_call(call).action is tg.Action.HALT:
                return i
            if i % 2 == 0 or report(i):
                turn.record_outcome(call, OK, result="pending" if i % 2 else None)
        return None

    plain = halt(())
    assert plain is not None and plain <= (listed := halt(("poll",))) <= plain + 2 * WAIT_BEHIND, (plain, listed)


@pytest.mark.parametrize("stateful", [(), ("poll",)])
def test_one_lost_outcome_holds_the_later_outcomes_and_their_memory_for_a_bounded_number_of_checks(stateful):
    """Caps off, the streak on: the first poll's outcome never comes, 30,000 identical polls follow
    with theirs (their results change). The outcomes waiting behind the lost one stay bounded (the
    guard gives a call up 2 x MAX_AWAITING checks after its own), and the stop level still fires
    once the polls fail."""
    from turnguard._ledger import MAX_AWAITING

    turn = core_guard(stateful_tools=stateful, max_tool_calls_per_turn=0, streak_warn_at=0,
                      streak_stop_at=5).turn()
    turn.check_call(tg.ToolCall("poll", {}))
    for i in range(30_000):
        call = tg.ToolCall("poll", {})
        turn.check_call(call)
        turn.record_outcome(call, OK, result=str(i))
        assert len(turn.ledger._early) <= 2 * MAX_AWAITING + 1024
    verdicts = []
    for _ in range(6):
        call = tg.ToolCall("poll", {})
        verdicts.append(turn.check_call(call).action)
        verdicts.append(turn.record_outcome(call, ERROR, result="failed").action)
    assert tg.Action.HALT in verdicts


def test_an_exempt_tool_joins_no_streak_and_ends_the_one_it_interrupts():
    turn = core_guard(streak_exempt_tools=("wait",), streak_warn_at=3, streak_stop_at=4).turn(promptable=True)
    verdicts = []
    for name in ["build", "build", "wait", "build", "build", "wait", "wait", "wait", "wait", "wait"]:
        call = tg.ToolCall(name, {})
        verdicts.append(turn.check_call(call).action)
        verdicts.append(turn.record_outcome(call, ERROR).action)
        if name == "wait":
            assert (turn.ledger.streak_length, turn.ledger.failing_streak_length) == (0, 0)
    assert ASK not in verdicts and HALT not in verdicts
    assert turn.ledger.max_key_repeat == 6  # the caps still count them


def test_results_of_other_tools_are_not_keyed():
    guard = core_guard(stateful_tools=("poll",))
    turn = guard.turn()
    keyed = []
    real = turn._digest
    turn._digest = lambda name, value: keyed.append((name, value)) or real(name, value)
    for name in ("build", "poll"):
        call = tg.ToolCall(name, {})
        turn.check_call(call)
        turn.record_outcome(call, OK, result="x" * 4096)
        assert (cached_result(call) is not None) == (name == "poll")
    assert keyed == [("poll", "x" * 4096)]  # one keying of the stateful tool's result, none of the other's
    plain = core_guard().turn()
    assert plain.record_outcome.__code__ is turn.record_outcome.__code__  # one hot path
    call = tg.ToolCall("poll", {})
    plain.check_call(call)
    plain.record_outcome(call, OK, result="x")
    assert cached_result(call) is None


def test_a_shadow_listing_a_tool_gets_its_results_from_the_live_turn():
    guard = tg.Guard(tg.GuardConfig(shadow={"polling": {"stateful_tools": ["poll"]}}, streak_stop_on="any",
                                    disable_plugins=("otel", "recorder"), load_entrypoints=False), environ={})
    halted = {}

    class Listen:
        @tg.hookimpl
        def turnguard_shadow_turn_ended(self, policy, summary):
            halted[policy] = summary.threshold

    guard.register(Listen())
    assert guard.result_tools == frozenset({"poll"})
    turn = guard.turn()
    assert poll(turn, [f"step {i}" for i in range(20)], tool="poll") == ("outcome", 8, "streak")
    turn.end()
    assert halted == {"polling": None}  # the shadow saw the results change: no would-be halt


# -- batches ------------------------------------------------------------------------------------------


def test_a_batch_whose_outcomes_settle_together_stops_the_segment_that_reached_the_stop_count():
    """Attended, stop at 2: [r, r] then [s, s] in one response, outcomes in reverse: both segments
    reach 2 failures in the report that settles them; the stop asks once, then never again."""
    turn = core_guard(stateful_tools=("poll",), streak_warn_at=0, streak_stop_at=2).turn(promptable=True)
    calls = [tg.ToolCall("poll", {}, call_id=f"p{i}") for i in range(4)]
    for call in calls:
        turn.check_call(call)
    results = ["r", "r", "s", "s"]
    verdicts = [turn.record_outcome(calls[i], ERROR, result=results[i]).action for i in (3, 2, 1, 0)]
    assert verdicts == [ALLOW, ALLOW, ALLOW, ASK]
    more = tg.ToolCall("poll", {}, call_id="p4")
    turn.check_call(more)
    assert turn.record_outcome(more, OK, result="s").action is ALLOW  # the second segment's stop was noted with it


def test_an_identical_call_checked_before_an_earlier_result_came_counts_as_no_progress():
    """Warn at 3, one model response of three identical polls: the third is warned at its check
    (the results are not known yet, so no progress shows): the fail-safe side of a batch."""
    turn = core_guard(stateful_tools=("poll",), streak_warn_at=3).turn(promptable=True)
    calls = [tg.ToolCall("poll", {}, call_id=f"p{i}") for i in range(3)]
    assert [turn.check_call(c).action for c in calls] == [ALLOW, ALLOW, ASK]


@pytest.mark.parametrize("lost", [None, 0, 1])
@pytest.mark.parametrize("resume", [False, True])
def test_a_restart_behind_a_lost_outcome_lets_the_stop_fire_again_as_once_it_settles(lost, resume):
    """Attended, stop at 3: four identical polls in one response ask at the fourth check. Their
    results a, b, c, d (each a change) restart the streak at every call; with one outcome lost (or
    none), the next three polls' checks reach the stop again in the part the last restart began,
    as when every outcome came (and after a snapshot taken while the restarts wait)."""
    guard = core_guard(stateful_tools=("poll",), streak_warn_at=0, streak_stop_at=3, streak_stop_on="any")
    turn = guard.turn(promptable=True, durable=True)
    calls = [tg.ToolCall("poll", {}, call_id=f"p{i}") for i in range(4)]
    assert [turn.check_call(c).action for c in calls] == [ALLOW, ALLOW, ALLOW, ASK]
    for i, result in enumerate("abcd"):
        if i != lost:
            assert turn.record_outcome(calls[i], OK, result=result).action is ALLOW
    if resume:
        turn = guard.resume(turn.suspend())
    more = [tg.ToolCall("poll", {}, call_id=f"p{i}") for i in range(4, 7)]
    assert [turn.check_call(c).action for c in more] == [ALLOW, ALLOW, ASK]


def test_a_restart_the_stop_counted_with_keeps_it_from_firing_again():
    """Attended, stop at 3: the results of the first polls are known, and changed, when the stop
    fires at a check (it counted from that restart): the calls after it do not fire it again."""
    turn = core_guard(stateful_tools=("poll",), streak_warn_at=0, streak_stop_at=3,
                      streak_stop_on="any").turn(promptable=True)
    calls = [tg.ToolCall("poll", {}, call_id=f"p{i}") for i in range(7)]
    for c in calls[:3]:
        turn.check_call(c)
    turn.record_outcome(calls[1], OK, result="a")
    turn.record_outcome(calls[2], OK, result="b")  # a restart at the third, waiting behind the first
    assert [turn.check_call(c).action for c in calls[3:]] == [ALLOW, ALLOW, ASK, ALLOW]


# -- what is kept, exported and recorded -----------------------------------------------------------------


SECRET = "result-text-that-must-not-leak-7f3a"


def test_no_result_text_reaches_a_span_a_metric_a_log_a_record_or_a_snapshot(tmp_path):
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans, reader, logs = InMemorySpanExporter(), InMemoryMetricReader(), InMemoryLogRecordExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    logger = LoggerProvider()
    logger.add_log_record_processor(SimpleLogRecordProcessor(logs))
    path = tmp_path / "turns.jsonl"
    meter = MeterProvider(metric_readers=[reader])
    for capture in (False, True):
        guard = tg.Guard(tg.GuardConfig(stateful_tools=("poll",), recorder_path=str(path), recorder_results=True,
                                        capture_content=capture, load_entrypoints=False,
                                        shadow={"all": {"stateful_tools": ["*"]}}),
                         tracer_provider=tracer, meter_provider=meter, logger_provider=logger, environ={})
        turn = guard.turn(durable=True)
        for i in range(12):
            for name in ("poll", "build"):
                call = tg.ToolCall(name, {"q": 1})
                turn.check_call(call)
                turn.record_outcome(call, ERROR, result={"text": f"{SECRET} {i % 2}"})
        snapshot = json.dumps(turn.snapshot())
        turn.end()
        assert SECRET not in snapshot
    exported = [json.dumps(dict(s.attributes or {})) + s.name + json.dumps([dict(e.attributes or {})
                                                                             for e in s.events])
                for s in spans.get_finished_spans()]
    exported += [json.dumps(dict(r.log_record.attributes or {})) + str(r.log_record.body)
                 for r in logs.get_finished_logs()]
    exported.append(reader.get_metrics_data().to_json())
    exported.append(path.read_text())
    assert spans.get_finished_spans() and path.read_text()
    assert not [text for text in exported if SECRET in text]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(isinstance(c.get("result"), str) for line in lines for c in line["calls"])


# -- snapshots -------------------------------------------------------------------------------------------


def drive(turn: tg.Turn, steps: list[tuple[str, object]]) -> list[tuple[str, str | None]]:
    out = []
    for i, (name, result) in enumerate(steps):
        call = tg.ToolCall(name, {"i": 0}, call_id=f"s{i}")
        v = turn.check_call(call)
        out.append((v.action.label, str(v.threshold) if v.threshold else None))
        v = turn.record_outcome(call, ERROR, result=result)
        out.append((v.action.label, str(v.threshold) if v.threshold else None))
    return out


def test_a_resumed_polling_turn_gives_the_verdicts_it_would_have_given():
    steps = [("poll", f"r{i // 3}") for i in range(12)] + [("poll", "same")] * 9
    options = {"stateful_tools": ("poll",), "stuck_signal": "stale_repeat", "streak_stop_on": "any"}
    whole = drive(core_guard(**options).turn(), steps)
    for cut in (2, 5, 13, 16):
        guard = core_guard(**options)
        turn = guard.turn()
        first = drive(turn, steps[:cut])
        state = json.loads(json.dumps(turn.suspend()))
        assert first + drive(guard.resume(state), steps[cut:]) == whole, cut


def test_a_snapshot_holds_the_pairs_the_results_waiting_and_the_restarts():
    turn = core_guard(stateful_tools=("poll",)).turn()
    drive(turn, [("poll", "a"), ("poll", "b")])
    waiting = [tg.ToolCall("poll", {"i": 0}, call_id=f"w{i}") for i in range(3)]
    for call in waiting:
        turn.check_call(call)
    turn.record_outcome(waiting[2], OK, result="c")
    facts = turn.snapshot()["facts"]
    assert set(facts["polled"]) == {"3", "4"} and set(facts["results"]) == {"5"}
    assert facts["restarts"] == {"poll": 1} and len(facts["baseline"]) == 16
    assert {len(key) for key in facts["counts"]} == {32}  # (call, result) pairs: two digests
    resumed = core_guard(stateful_tools=("poll",)).resume(json.loads(json.dumps(turn.snapshot())))
    assert resumed.ledger.restarts_by_tool() == {"poll": 1}


@pytest.mark.parametrize(("field", "value"), [
    ("polled", {"99": ["00" * 8, 1]}), ("polled", {"3": ["00" * 8]}), ("polled", {"3": ["zz", 1]}),
    ("results", {"1": "00" * 8}), ("results", {"5": "00"}), ("baseline", "00" * 9), ("restarts", {"poll": 0}),
    ("restarts", {"": 1}), ("counts", {"00" * 12: 1}),
])
def test_a_bad_polling_field_in_a_snapshot_is_refused_by_name(field, value):
    turn = core_guard(stateful_tools=("poll",)).turn()
    drive(turn, [("poll", "a"), ("poll", "b")])
    for i in range(3):
        turn.check_call(tg.ToolCall("poll", {"i": 0}, call_id=f"w{i}"))
    state = turn.snapshot()
    state["facts"][field] = value
    with pytest.raises(tg.SnapshotError) as caught:
        core_guard(stateful_tools=("poll",)).resume(state)
    assert caught.value.field.startswith(f"facts.{field}")


def test_a_snapshot_resumes_only_under_the_same_tool_lists_and_older_ones_under_none():
    turn = core_guard(stateful_tools=("poll",)).turn()
    drive(turn, [("poll", "a")])
    with pytest.raises(tg.SnapshotError) as caught:
        core_guard().resume(turn.snapshot())
    assert caught.value.field == "config.stateful_tools"
    plain = core_guard().turn()
    drive(plain, [("poll", "a")])
    state = plain.snapshot()
    for key in ("stateful_tools", "streak_exempt_tools"):
        del state["config"][key]  # a snapshot from before the settings existed
    assert core_guard().resume(state).ledger.tool_calls == 1


# -- telemetry ---------------------------------------------------------------------------------------


def test_the_restarts_counter_says_which_listed_tools_really_poll():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    guard = tg.Guard(tg.GuardConfig(stateful_tools=("ci_status", "job_status", "read_file"), load_entrypoints=False,
                                    disable_plugins=("recorder", "shadow")),
                     meter_provider=MeterProvider(metric_readers=[reader]), environ={})
    for agent in ("ci-bot", "ci-bot"):
        turn = guard.turn(agent_name=agent)
        poll(turn, changing_statuses())  # 11 restarts
        poll(turn, ["same"] * 5, tool="read_file")  # listed, but never changes: no restart
        poll(turn, ["a", "b"], tool="job_status")
        turn.end()
    points = {}
    for metric in (m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                   for m in sm.metrics if m.name == "turnguard.streak.result_restarts"):
        for point in metric.data.data_points:
            points[point.attributes["gen_ai.tool.name"]] = (point.value, dict(point.attributes))
    assert {tool: value for tool, (value, _) in points.items()} == {"ci_status": 22, "job_status": 2}
    assert points["ci_status"][1] == {"turnguard.policy": "default", "turnguard.turn.cohort": "live",
                                      "gen_ai.tool.name": "ci_status", "gen_ai.agent.name": "ci-bot"}


def test_a_turn_counts_restarts_by_at_most_a_bounded_number_of_tool_names():
    from turnguard._model import MAX_RESTART_TOOLS, OTHER_TOOLS

    turn = core_guard(stateful_tools=("*",)).turn()
    for i in range(MAX_RESTART_TOOLS + 10):
        poll(turn, ["a", "b"], tool=f"tool{i}")
    restarts = dict(turn.end().result_restarts)
    assert len(restarts) == MAX_RESTART_TOOLS + 1 and restarts[OTHER_TOOLS] == 10
