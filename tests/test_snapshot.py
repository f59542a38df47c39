"""Durable turns: a snapshot continued by ``guard.resume`` gives the verdicts of the turn that never stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import turnguard as tg
from conftest import CORE_ONLY
from turnguard._ledger import VIEW_FACTS

KEY = "durable-turns-test-key"


def guard(**options) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(**{**CORE_ONLY, "digest_key": KEY, **options}), environ={})


def script() -> list[tuple[str, dict, str, str]]:
    """A turn that exercises every fact: distinct reads, a failing streak (warn, then stop at the
    8th failure under 5/8), a success, a repeat past the soft cap's stuck threshold, denials."""
    steps = [("cycle", "", {}, "")]
    steps += [("call", "read_file", {"path": f"f{i}.py"}, "ok") for i in range(4)]
    steps += [("call", "run_tests", {"target": "suite-7f3a"}, "error")] * 6
    steps += [
        ("cycle", "", {}, ""),
        ("call", "edit", {"path": "a.py"}, "denied"),
        ("call", "read_file", {"path": "f1.py"}, "ok"),
    ]
    steps += [("call", "run_tests", {"target": "suite-7f3a"}, "error")] * 9
    return steps


def verdict_facts(v: tg.Verdict) -> tuple:
    e = v.event
    counts = (
        None
        if e is None
        else (e.level, e.tool_calls, e.cycles, e.max_key_repeat, e.streak_length, e.failing_streak_length)
    )
    return (v.action, v.threshold, counts)


def play(turn: tg.Turn, steps) -> list[tuple]:
    out = []
    for kind, name, args, outcome in steps:
        if kind == "cycle":
            out.append(verdict_facts(turn.begin_cycle()))
            continue
        call = tg.ToolCall(name, args, call_id=f"id-{len(out)}")
        out.append(verdict_facts(turn.check_call(call)))
        out.append(verdict_facts(turn.record_outcome(call, outcome)))
    return out


@pytest.mark.parametrize("promptable", [False, True])
def test_a_resumed_turn_gives_the_verdicts_of_the_turn_that_never_stopped(promptable):
    steps = script()
    with guard().turn(promptable=promptable) as whole:
        expected = play(whole, steps)
    for cut in range(len(steps) + 1):
        first = guard().turn(promptable=promptable)
        before = play(first, steps[:cut])
        state = json.loads(json.dumps(first.snapshot()))  # through JSON, as a checkpointer stores it
        resumed = guard().resume(state)
        assert before + play(resumed, steps[cut:]) == expected, f"cut after step {cut}"


def facts(turn: tg.Turn) -> dict:
    """What a plugin can read of the turn (its view), but its start (monotonic and wall clock), which
    the resume moves by the time between the snapshot and the resume."""
    view = turn.view
    return {**{name: getattr(view, name) for name in VIEW_FACTS if name not in ("started_at", "opened_ns")},
            **{f"outcomes {o.value}": view.outcomes(o) for o in tg.Outcome}}


def test_a_resumed_turn_holds_the_facts_of_the_turn_it_was_taken_from():
    steps = script()
    for cut in range(len(steps) + 1):
        first = guard().turn()
        play(first, steps[:cut])
        resumed = guard().resume(json.loads(json.dumps(first.snapshot())))
        assert facts(resumed) == facts(first), f"cut after step {cut}"
        play(first, steps[cut:])
        play(resumed, steps[cut:])
        assert facts(resumed) == facts(first), f"cut after step {cut}, then the rest"


def test_the_snapshot_is_versioned_json_with_digests_and_never_the_arguments():
    turn = guard().turn()
    play(turn, script()[:8])
    state = turn.snapshot()
    text = json.dumps(state)
    assert state["version"] == 2
    assert "f1.py" not in text and "suite-7f3a" not in text and KEY not in text
    assert all(len(d) == 16 for d in state["facts"]["counts"])  # 8-byte digests, as hex


def test_a_latched_halt_survives_the_resume():
    turn = guard(max_tool_calls_per_turn=2).turn()
    for i in range(3):
        turn.check_call(tg.ToolCall("read_file", {"path": f"{i}"}))
    resumed = guard(max_tool_calls_per_turn=2).resume(json.loads(json.dumps(turn.snapshot())))
    verdict = resumed.check_call(tg.ToolCall("read_file", {"path": "other"}))
    assert verdict.action is tg.Action.HALT and verdict.threshold is tg.Threshold.EXPLICIT
    assert resumed.begin_cycle().action is tg.Action.HALT


def test_an_outcome_for_a_call_checked_before_the_snapshot_is_credited_after_resume():
    turn = guard().turn()
    for i in range(7):
        call = tg.ToolCall("run_tests", {"target": "suite-7f3a"}, call_id=f"c{i}")
        turn.check_call(call)
        turn.record_outcome(call, "error")
    waiting = tg.ToolCall("run_tests", {"target": "suite-7f3a"}, call_id="c7")
    turn.check_call(waiting)
    resumed = guard().resume(json.loads(json.dumps(turn.snapshot())))
    verdict = resumed.record_outcome(tg.ToolCall("run_tests", None, call_id="c7"), "error")
    assert verdict.action is tg.Action.HALT and verdict.event.failing_streak_length == 8


def test_a_pending_escalation_is_handed_back_and_resolved_in_the_resumed_turn():
    turn = guard().turn(promptable=True)
    asked = None
    for i in range(5):
        call = tg.ToolCall("poll", {"job": 1}, call_id=f"p{i}")
        asked = turn.check_call(call)
        turn.record_outcome(call, "ok")
    assert asked.action is tg.Action.ASK
    state = json.loads(json.dumps(turn.snapshot(pending=asked)))
    resumed = guard().resume(state)
    pending = tg._snapshot.pending(state)
    assert pending.event.event_id == asked.event.event_id and pending.event.level is tg.Level.WARN
    assert resumed.resolve(pending, "stop").action is tg.Action.HALT


def test_the_turn_resumes_in_another_process_and_goes_on_to_the_same_stop(tmp_path):
    turn = guard().turn()
    for i in range(5):
        call = tg.ToolCall("run_tests", {"target": "suite-7f3a"}, call_id=f"c{i}")
        turn.check_call(call)
        turn.record_outcome(call, "error")
    (tmp_path / "turn.json").write_text(json.dumps(turn.snapshot()))
    program = textwrap.dedent(f"""
        import json
        import turnguard as tg
        config = tg.GuardConfig(digest_key={KEY!r}, **{CORE_ONLY!r})
        turn = tg.Guard(config, environ={{}}).resume(json.load(open({str(tmp_path / "turn.json")!r})))
        for i in range(5, 10):
            call = tg.ToolCall("run_tests", {{"target": "suite-7f3a"}}, call_id=f"c{{i}}")
            if turn.check_call(call).action is tg.Action.HALT:
                break
            verdict = turn.record_outcome(call, "error")
            if verdict.action is tg.Action.HALT:
                print(i + 1, verdict.threshold, verdict.event.failing_streak_length)
                break
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["8", "streak", "8"]


def test_a_guard_with_another_digest_key_refuses_the_snapshot():
    state = guard().turn().snapshot()
    with pytest.raises(tg.SnapshotError, match="another digest key") as refused:
        guard(digest_key="another").resume(state)
    assert refused.value.field == "key_check"
    with pytest.raises(tg.SnapshotError, match="another digest key"):
        tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).resume(state)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("streak_stop_at", 9),
        ("max_tool_calls_per_turn", 50),
        ("soft_cap", 20),
        ("key_mode", "bytes"),
        ("max_cycles_per_turn", 3),
    ],
)
def test_a_guard_that_decides_otherwise_refuses_the_snapshot_and_names_the_setting(setting, value):
    state = guard().turn().snapshot()
    with pytest.raises(tg.SnapshotError, match=setting):
        guard(**{setting: value}).resume(state)


def test_reporting_settings_do_not_stop_a_resume():
    state = guard().turn().snapshot()
    guard(capture_content=True, name="other").resume(state).end()


@pytest.mark.parametrize(
    "state",
    [None, [], {"version": 1}, {"kind": "turnguard.turn", "version": 99}, {"kind": "turnguard.turn", "version": "1"}],
)
def test_what_is_not_a_snapshot_of_a_known_version_is_refused_with_a_clear_error(state):
    with pytest.raises(tg.SnapshotError):
        guard().resume(state)


def test_a_snapshot_with_malformed_facts_is_refused():
    state = guard().turn().snapshot()
    state["facts"]["counts"] = {"not-hex": 1}
    with pytest.raises(tg.SnapshotError, match=r"facts\.counts\.not-hex") as refused:
        guard().resume(state)
    assert refused.value.field == "facts.counts.not-hex"
    assert isinstance(tg.SnapshotError("x"), ValueError)


def test_a_probe_turn_resumes_in_the_probe_cohort_under_the_probe_configuration():
    probe = {"probe": tg.Probe(1.0, tg.GuardConfig(max_tool_calls_per_turn=3, digest_key=KEY))}
    turn = guard(**probe).turn()
    for i in range(3):
        call = tg.ToolCall("read_file", {"path": f"{i}"}, call_id=f"r{i}")
        turn.check_call(call)
        turn.record_outcome(call, "ok")
    state = json.loads(json.dumps(turn.snapshot()))
    assert state["turn"]["cohort"] == "probe"
    for here in (guard(**probe), guard()):  # no probe here: still the probe's configuration decides
        resumed = here.resume(state)
        assert resumed.check_call(tg.ToolCall("read_file", {"path": "3"})).threshold is tg.Threshold.EXPLICIT
        assert resumed.end().cohort == "probe"


# -- durable turns: resumed in any process with the default configuration ----------------------------

RESUME_ELSEWHERE = textwrap.dedent("""
    import json, sys
    import turnguard as tg
    guard = tg.Guard()  # the default configuration
    try:
        turn = guard.resume(json.load(open(sys.argv[1])))
    except tg.SnapshotError as exc:
        print(json.dumps({"refused": str(exc), "field": exc.field}))
        raise SystemExit(0)
    out = {"turn_id": turn.turn_id}
    waiting = tg.ToolCall("run_tests", {"target": "suite-7f3a"})  # the host's new object, no call_id
    out["waiting"] = [turn.record_outcome(waiting, "error").action.label]
    for i in range(10):
        call = tg.ToolCall("run_tests", {"target": "suite-7f3a"}, call_id=f"later{i}")
        if turn.check_call(call).action is tg.Action.HALT:
            break
        verdict = turn.record_outcome(call, "error")
        out["waiting"].append(verdict.action.label)
        if verdict.action is tg.Action.HALT:
            out["halt"] = [str(verdict.threshold), verdict.event.failing_streak_length, verdict.event.tool_calls]
            break
    out["summary"] = [turn.end().tool_calls, turn.summary.turn_id]
    print(json.dumps(out))
""")


def resume_in_another_process(tmp_path, state: dict) -> dict:
    path = tmp_path / "turn.json"
    path.write_text(json.dumps(state))
    done = subprocess.run([sys.executable, "-c", RESUME_ELSEWHERE, str(path)], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def five_failures_and_one_waiting(turn: tg.Turn) -> None:
    for i in range(5):
        call = tg.ToolCall("run_tests", {"target": "suite-7f3a"}, call_id=f"c{i}")
        turn.check_call(call)
        turn.record_outcome(call, "error")
    turn.check_call(tg.ToolCall("run_tests", {"target": "suite-7f3a"}))  # waiting, without a call_id


def test_a_durable_turn_resumes_in_another_process_with_the_default_configuration(tmp_path):
    turn = tg.Guard().turn(durable=True)
    five_failures_and_one_waiting(turn)
    out = resume_in_another_process(tmp_path, turn.suspend())
    assert out["turn_id"] == turn.turn_id  # another process: the turn keeps its id
    assert out["halt"] == ["streak", 8, 8] and out["summary"] == [8, turn.turn_id]


def test_a_turn_not_opened_durable_is_refused_elsewhere_naming_durable_and_digest_key(tmp_path):
    turn = tg.Guard().turn()
    five_failures_and_one_waiting(turn)
    out = resume_in_another_process(tmp_path, turn.snapshot())
    assert "durable=True" in out["refused"] and "digest_key" in out["refused"] and out["field"] == "key_check"


def test_a_durable_turn_keys_its_calls_with_its_own_key_which_its_snapshot_carries():
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    one, two, plain = guard.turn(durable=True), guard.turn(durable=True), guard.turn()
    digests = []
    for turn in (one, two, plain):
        call = tg.ToolCall("read_file", {"path": "a.py"})
        turn.check_call(call)
        digests.append(tg._keys.cached_digest(call))
    assert len(set(digests)) == 3  # each durable turn's key is its own, and not the process's
    state = one.snapshot()
    assert state["keying"] == "turn" and len(bytes.fromhex(state["turn_key"])) == 32
    assert plain.snapshot()["keying"] == "process" and "turn_key" not in plain.snapshot()
    assert "a.py" not in json.dumps(state)


def test_a_durable_turn_of_a_guard_with_digest_key_is_keyed_by_it_and_carries_no_key():
    turn = guard().turn(durable=True)
    call = tg.ToolCall("read_file", {"path": "a.py"})
    turn.check_call(call)
    assert tg._keys.cached_digest(call) == guard().keyer.digest("read_file", {"path": "a.py"})
    state = turn.snapshot()
    assert state["keying"] == "digest_key" and "turn_key" not in state and KEY not in json.dumps(state)
    assert guard().resume(state).durable
    with pytest.raises(tg.SnapshotError, match="another digest key"):
        tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).resume(state)


def test_an_altered_turn_key_is_refused():
    state = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).turn(durable=True).snapshot()
    state["turn_key"] = "00" * 32
    with pytest.raises(tg.SnapshotError, match="turn_key") as refused:
        tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).resume(state)
    assert refused.value.field == "turn_key"


def test_a_durable_probe_turn_resumes_elsewhere_in_the_probe_cohort(tmp_path):
    probe = {"probe": tg.Probe(1.0, tg.GuardConfig(hard_multiplier=20))}
    turn = tg.Guard(tg.GuardConfig(**probe), environ={}).turn(durable=True)
    five_failures_and_one_waiting(turn)
    state = turn.suspend()
    assert state["turn"]["cohort"] == "probe"
    program = textwrap.dedent("""
        import json, sys
        import turnguard as tg
        guard = tg.Guard(tg.GuardConfig(probe=tg.Probe(1.0, tg.GuardConfig(hard_multiplier=20))))
        print(guard.resume(json.load(open(sys.argv[1]))).end().cohort)
    """)
    path = tmp_path / "turn.json"
    path.write_text(json.dumps(state))
    done = subprocess.run([sys.executable, "-c", program, str(path)], capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.split() == ["probe"]


# -- one snapshot resumed twice ----------------------------------------------------------------------


def test_a_second_resume_in_the_same_guard_gets_a_new_id_and_records_where_it_came_from():
    g = guard()
    turn = g.turn()
    play(turn, script()[:5])
    state = turn.suspend()
    first, second = g.resume(state), g.resume(state)
    assert first.turn_id == turn.turn_id and first.view.resumed_from is None
    assert second.turn_id != turn.turn_id and second.view.resumed_from == turn.turn_id
    first.end()
    third = g.resume(state)  # the first continuation ended: still taken
    assert third.turn_id not in (turn.turn_id, second.turn_id) and third.end().resumed_from == turn.turn_id
    assert second.end().resumed_from == turn.turn_id


def test_a_resumed_turn_suspended_again_resumes_under_the_same_id():
    g = guard()
    turn = g.turn()
    play(turn, script()[:5])
    again = g.resume(turn.suspend())
    play(again, script()[5:9])
    last = g.resume(again.suspend())
    assert last.turn_id == turn.turn_id and last.end().resumed_from is None


OTHERS = {
    "suspended": lambda g: g.turn(turn_id="x").suspend(),
    "open, snapshotted": lambda g: g.turn(turn_id="x").snapshot(),
    "ended, snapshotted": lambda g: (lambda t: (t.snapshot(), t.end()))(g.turn(turn_id="x")),
    "snapshotted once ended": lambda g: (lambda t: (t.end(), t.snapshot()))(g.turn(turn_id="x")),
    "resumed, open": lambda g: g.resume(g.turn(turn_id="x").suspend()),
    "resumed, suspended": lambda g: g.resume(g.turn(turn_id="x").suspend()).suspend(),
    "resumed, ended": lambda g: g.resume(g.turn(turn_id="x").suspend()).end(),
    "refused a resume": lambda g: refused_resume(g),
}
"""Another turn of the id ``x`` the host reused, and how it is used here; in use: open or ended."""
OTHERS_IN_USE = {"open, snapshotted", "ended, snapshotted", "snapshotted once ended", "resumed, open",
                 "resumed, ended"}


def refused_resume(g: tg.Guard) -> None:
    state = g.turn(turn_id="x").suspend()
    state["facts"]["seq"] = -1
    with pytest.raises(tg.SnapshotError):
        g.resume(state)


@pytest.mark.parametrize("others", [(), *((name,) for name in OTHERS), ("suspended", "suspended"),
                                    ("suspended", "open, snapshotted"), ("resumed, suspended", "suspended")],
                         ids=lambda others: " + ".join(others) or "alone")
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("way", ["went on", "suspended", "suspended, resumed twice"])
def test_a_snapshot_resumed_while_a_turn_of_its_id_is_in_use_here_forks(others, when, way):
    """The fork rule for a turn of a reused id, whatever the other turns of that id did, before its
    snapshot or after: its snapshot resumed while it goes on, or a second time, forks (an id of
    its own, ``resumed_from`` naming the snapshot's); resumed once it was put aside, it keeps the
    id unless another turn of the id is open or ended here (snapshotted or resumed)."""
    g = guard()
    if when == "before":
        for other in others:
            OTHERS[other](g)
    turn = g.turn(turn_id="x")
    play(turn, script()[:3])
    state = turn.snapshot() if way == "went on" else turn.suspend()
    if when == "after":
        for other in others:
            OTHERS[other](g)
    resumed = [g.resume(state) for _ in range(2 if way == "suspended, resumed twice" else 1)]
    keeps = way != "went on" and not OTHERS_IN_USE & set(others)
    assert [r.turn_id == "x" for r in resumed] == [keeps] + [False] * (len(resumed) - 1)
    assert [r.end().resumed_from for r in resumed] == [None if keeps else "x"] + ["x"] * (len(resumed) - 1)
    if way == "went on":
        play(turn, script()[3:5])
        assert turn.end().turn_id == "x"


def test_the_same_snapshot_resumed_in_two_processes_keeps_its_id_in_both(tmp_path):
    turn = tg.Guard().turn(durable=True)
    five_failures_and_one_waiting(turn)
    state = turn.suspend()
    ids = {resume_in_another_process(tmp_path, state)["turn_id"] for _ in range(2)}
    assert ids == {turn.turn_id}


# -- version 1 -----------------------------------------------------------------------------------------

V1 = Path(__file__).parent / "data" / "snapshot_v1.json"
"""A version 1 snapshot, written by turnguard at 6f7efd2 (before version 2): a turn of the guard
``guard()`` builds, conversation ``conv-v1``: a cycle, four reads, five failures of run_tests, then
two more run_tests checked and waiting (``t5``, and one without a call_id)."""


def v1_prefix() -> list[tuple[str, dict, str, str]]:
    steps = [("cycle", "", {}, "")]
    steps += [("call", "read_file", {"path": f"f{i}.py"}, "ok") for i in range(4)]
    return steps + [("call", "run_tests", {"target": "suite-7f3a"}, "error")] * 5


def test_a_version_1_snapshot_resumes_its_shadows_start_afresh_and_the_turn_says_so():
    state = json.loads(V1.read_text())
    assert state["version"] == 1
    shadows = {"shadow": {"lenient": {"streak_stop_at": 10}}, "disable_plugins": ("otel", "recorder")}
    resumed = guard(**shadows).resume(state)
    assert resumed.turn_id and resumed.view.fresh_state == ("shadow",)
    verdicts = [resumed.record_outcome(tg.ToolCall("run_tests", None, call_id="t5"), "error"),
                resumed.record_outcome(tg.ToolCall("run_tests", {"target": "suite-7f3a"}), "error")]
    last = tg.ToolCall("run_tests", {"target": "suite-7f3a"})
    verdicts += [resumed.check_call(last), resumed.record_outcome(last, "error")]
    assert [v.action for v in verdicts] == [tg.Action.ALLOW] * 3 + [tg.Action.HALT]  # failures 6, 7, 8
    assert verdicts[-1].event.failing_streak_length == 8
    summary = resumed.end()
    assert summary.fresh_state == ("shadow",) and summary.tool_calls == 12


def test_a_version_2_snapshot_of_a_guard_without_shadows_says_which_plugins_start_afresh():
    state = guard().turn().snapshot()
    resumed = guard(shadow={"lenient": {"streak_stop_at": 10}}, disable_plugins=("otel", "recorder")).resume(state)
    assert resumed.end().fresh_state == ("shadow",)
    with_shadows = guard(shadow={"lenient": {"streak_stop_at": 10}}, disable_plugins=("otel", "recorder"))
    assert with_shadows.resume(with_shadows.turn().snapshot()).end().fresh_state == ()


def test_a_setting_added_after_the_snapshot_was_taken_resumes_at_its_default():
    state = guard().turn().snapshot()
    del state["config"]["remind_model"]  # as if the snapshot predated the setting
    guard().resume(state).end()
    with pytest.raises(tg.SnapshotError, match="remind_model"):
        guard(remind_model=True).resume(state)


SHADOW_PROGRAM = textwrap.dedent("""
    import json, sys
    import turnguard as tg
    heard = []
    class Heard:
        @tg.hookimpl
        def turnguard_shadow_detected(self, policy, event):
            heard.append([policy, str(event.threshold), str(event.level), event.tool_calls])
    shadow = {"bytes": tg.GuardConfig(key_mode="bytes", streak_warn_at=2, streak_stop_at=3)}
    guard = tg.Guard(tg.GuardConfig(shadow=shadow), plugins={"heard": Heard()})
    turn = guard.resume(json.load(open(sys.argv[1])))
    for i in range(4):
        call = tg.ToolCall("bash", '{"b": 1, "a": 2}', call_id=f"late{i}")
        turn.check_call(call)
        turn.record_outcome(call, "error")
    turn.end()
    print(json.dumps(heard))
""")


def test_a_shadow_that_keys_calls_its_own_way_keeps_its_evidence_across_processes(tmp_path):
    """A shadow in another key mode keys a durable turn's calls under the turn's own key too: its
    streak goes on in the process that resumes the turn."""

    class Heard:
        def __init__(self) -> None:
            self.said: list[list] = []

        @tg.hookimpl
        def turnguard_shadow_detected(self, policy, event):
            self.said.append([policy, str(event.threshold), str(event.level), event.tool_calls])

    shadow = {"bytes": tg.GuardConfig(key_mode="bytes", streak_warn_at=2, streak_stop_at=3)}
    heard = {"whole": Heard(), "first": Heard()}
    whole, first = (tg.Guard(tg.GuardConfig(shadow=shadow), plugins={"heard": heard[name]}).turn(durable=True)
                    for name in ("whole", "first"))

    def failing(turn: tg.Turn, ids: range) -> None:
        for i in ids:
            call = tg.ToolCall("bash", '{"b": 1, "a": 2}', call_id=f"late{i}" if i >= 2 else f"c{i}")
            turn.check_call(call)
            turn.record_outcome(call, "error")

    failing(whole, range(6))
    failing(first, range(2))
    path = tmp_path / "turn.json"
    path.write_text(json.dumps(first.suspend()))
    done = subprocess.run([sys.executable, "-c", SHADOW_PROGRAM, str(path)], capture_output=True, text=True,
                          timeout=120, check=True)
    assert heard["whole"].said == [["bytes", "streak", "warn", 2], ["bytes", "streak", "stop", 3]]
    assert heard["first"].said + json.loads(done.stdout) == heard["whole"].said


def test_a_waiting_call_without_an_id_is_matched_after_a_resume_by_the_call_itself():
    """The host's new object for a call that waited without a ``call_id`` settles it; the original
    object (the same process) settles its own check; a duplicate of a call checked after the
    resume is still a duplicate, not the waiting call's outcome."""
    g = guard()
    turn = g.turn()
    first, second = tg.ToolCall("run", {"t": 1}), tg.ToolCall("run", {"t": 1})
    turn.check_call(first)
    turn.check_call(second)
    turn.check_call(tg.ToolCall("ls", "-l"))
    resumed = guard().resume(turn.suspend())
    after = tg.ToolCall("ls", "-l")
    resumed.check_call(after)
    resumed.record_outcome(after, "ok")
    assert resumed.record_outcome(after, "ok") is tg._guard.ALLOW and resumed.ledger.outcomes("ok") == 1
    assert [seq for seq in resumed._awaiting] == [1, 2, 3]  # the duplicate took no waiting call
    resumed.record_outcome(second, "error")  # the original object: its own check, the 2nd
    assert list(resumed._awaiting) == [1, 3]
    resumed.record_outcome(tg.ToolCall("run", {"t": 1}), "error")  # a new object: the earliest, the 1st
    resumed.record_outcome(tg.ToolCall("ls", "-l"), "ok")
    assert not resumed._awaiting and resumed.ledger.outcomes("error") == 2
    assert resumed.record_outcome(tg.ToolCall("run", {"t": 1}), "error").action is tg.Action.ALLOW  # a stray now
    assert resumed.ledger.outcomes("error") == 2


REUSE = dict(streak_warn_at=0, streak_stop_at=0, cycle_repeat_warn_at=2, cycle_repeat_stop_at=0,
             stateful_tools=("poll",))


def reused_poll_turn(resume: bool, call_id: str | None) -> list[str]:
    """Two objects for one call (``x`` checked twice, ``y`` between), beside ``list`` calls; ``x``'s
    results ``r1``, ``r1``, ``y``'s ``r2``, after a suspend and resume in this process or not: the
    verdicts and which checks the outcomes settled (as ignored reports say)."""
    said: list[str] = []

    class Ignored:
        @tg.hookimpl
        def turnguard_outcome_ignored(self, reason):
            said.append(reason)

    g = tg.Guard(tg.GuardConfig(**{**CORE_ONLY, "digest_key": KEY, **REUSE}), plugins={"ignored": Ignored()},
                 environ={})
    turn = g.turn(durable=True)
    x, y = tg.ToolCall("poll", {"job": 1}, call_id), tg.ToolCall("poll", {"job": 1})
    lists = [tg.ToolCall("list", {}, call_id=f"b{i}") for i in range(3)]
    for call in (x, lists[0], y, lists[1], x, lists[2]):
        turn.check_call(call)
    if resume:
        turn = g.resume(json.loads(json.dumps(turn.suspend())))
    for call, result in ((lists[0], None), (lists[1], None), (lists[2], None), (x, "r1"), (x, "r1"), (y, "r2"),
                         (x, "r1")):
        verdict = turn.record_outcome(call, "ok", result=result)
        said.append(f"{verdict.action.name}:{verdict.threshold}")
    return said


@pytest.mark.parametrize("call_id", [None, "x"], ids=["without id", "with id"])
def test_an_object_checked_twice_settles_its_own_checks_in_order_after_a_resume(call_id):
    """``x``'s second result settles ``x``'s second check, not ``y``'s, after a resume as before
    one: no cycle of ``list``/``poll`` repeats; ``x``'s third report is a duplicate both ways."""
    whole = reused_poll_turn(False, call_id)
    assert whole == ["ALLOW:None"] * 6 + ["duplicate", "ALLOW:None"]
    assert reused_poll_turn(True, call_id) == whole


def test_an_object_checked_before_and_after_a_resume_settles_the_earlier_check_first():
    """Checked before the snapshot and again after it, before either outcome: the first outcome
    settles the first check (its result the baseline), the second the second, as in a turn that
    never stopped."""
    def polls(resume: bool) -> list[tuple[int, int]]:
        g = guard(stateful_tools=("poll",), streak_warn_at=2, streak_stop_at=3)
        turn = g.turn(durable=True)
        x = tg.ToolCall("poll", {"job": 1})
        turn.check_call(x)
        if resume:
            turn = g.resume(json.loads(json.dumps(turn.suspend())))
        turn.check_call(tg.ToolCall("poll", {"job": 1}, call_id="other"))
        turn.check_call(x)
        seen = []
        for call, result in ((x, "a"), (tg.ToolCall("poll", {"job": 1}, call_id="other"), "a"), (x, "b")):
            turn.record_outcome(call, "error", result=result)
            seen.append((turn.view.result_restarts, turn.view.failing_streak_length))
        return seen

    assert polls(True) == polls(False) == [(0, 1), (0, 2), (1, 1)]


def test_a_snapshot_names_the_first_check_of_an_object_waiting_twice():
    """An ``awaiting`` entry's fifth element, written only for an object's later checks, names its
    earlier one; a bad one is refused naming it; without it (as an older turnguard wrote it) the
    snapshot resumes."""
    turn = guard().turn()
    x = tg.ToolCall("run", {"t": 1})
    for call in (x, tg.ToolCall("run", {"t": 1}), x, tg.ToolCall("ls", "-l"), x):
        turn.check_call(call)
    turn.record_outcome(x, "error")  # its first check settled: the key names its second
    state = json.loads(json.dumps(turn.snapshot()))
    assert [entry[0] for entry in state["awaiting"]] == [2, 3, 4, 5]
    assert [entry[4:] for entry in state["awaiting"]] == [[], [], [], [3]]
    for bad in (0, 6, "3", None, 2.0):
        damaged = json.loads(json.dumps(state))
        damaged["awaiting"][3][4] = bad
        with pytest.raises(tg.SnapshotError) as refused:
            guard().resume(damaged)
        assert refused.value.field == "awaiting[3][4]"
    damaged = json.loads(json.dumps(state))
    damaged["awaiting"][3].append(3)
    with pytest.raises(tg.SnapshotError) as refused:
        guard().resume(damaged)
    assert refused.value.field == "awaiting[3]"
    older = json.loads(json.dumps(state))
    del older["awaiting"][3][4]
    resumed = guard().resume(older)
    assert resumed.record_outcome(x, "error") is not None and list(resumed._awaiting) == [2, 4, 5]


def test_a_shadow_started_afresh_at_a_resume_counts_the_calls_after_it():
    """A version 1 snapshot's shadows start afresh; their streaks settle the outcomes of the calls
    checked after the resume (numbered as the live turn numbers them)."""
    said = []

    class Heard:
        @tg.hookimpl
        def turnguard_shadow_detected(self, policy, event):
            said.append((policy, str(event.level), event.tool_calls, event.failing_streak_length))

    config = tg.GuardConfig(digest_key=KEY, shadow={"eager": {"streak_warn_at": 2, "streak_stop_at": 3}},
                            disable_plugins=("otel", "recorder"), load_entrypoints=False)
    resumed = tg.Guard(config, plugins={"heard": Heard()}, environ={}).resume(json.loads(V1.read_text()))
    for i in range(3):
        call = tg.ToolCall("lint", {"path": "a.py"}, call_id=f"after{i}")
        resumed.check_call(call)
        resumed.record_outcome(call, "error")
    assert said == [("eager", "warn", 2, 1), ("eager", "stop", 3, 3)] and resumed.halted is None
    assert resumed.end().fresh_state == ("shadow",)


def test_more_waiting_calls_than_a_live_turn_keeps_are_refused_naming_awaiting():
    from turnguard._ledger import MAX_AWAITING
    from turnguard._snapshot import MAX_WAITING

    assert MAX_WAITING == 2 * MAX_AWAITING + 1024  # a live turn looks every 1,024 checks past twice the bound
    g = guard(soft_cap=0)
    turn = g.turn()
    for i in range(40):
        turn.check_call(tg.ToolCall("read", {"p": i}))
    state = turn.snapshot()
    waiting = state["awaiting"]  # (the calls the facts wait on keep their checks and digests)
    state["facts"]["seq"] = state["facts"]["tool_calls"] = MAX_WAITING + 1
    state["awaiting"] = [*waiting, *([i + 1, *waiting[-1][1:]] for i in range(len(waiting), MAX_WAITING + 1))]
    with pytest.raises(tg.SnapshotError, match="awaiting") as refused:
        guard(soft_cap=0).resume(state)
    assert refused.value.field == "awaiting"
    state["awaiting"] = state["awaiting"][:MAX_WAITING]
    state["facts"]["seq"] = state["facts"]["tool_calls"] = MAX_WAITING  # (every check of the streak waits)
    assert len(guard(soft_cap=0).resume(state)._awaiting) == MAX_WAITING
