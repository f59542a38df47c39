"""The local recorder: corpus-format lines, digests not arguments, whole-line appends."""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import turnguard as tg
from turnguard._keys import KEY_CHECK, KEY_RESULT
from turnguard.telemetry import _recorder as rec

SECRET_ARG = "SECRET-ARGUMENT-55d1"


def make_guard(path: Path, **config) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(load_entrypoints=False, recorder_path=str(path), **config))


def read_lines(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n") or raw == b""
    return [json.loads(line) for line in raw.decode("utf-8").splitlines()]


def test_no_path_registers_no_recorder():
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False))
    assert guard.pm.get_plugin("recorder") is None
    assert rec.plugin_for(tg.GuardConfig(recorder_path=None)) is None


def test_one_corpus_format_line_per_turn_with_digests_not_arguments(tmp_path):
    path = tmp_path / "nested" / "turns.jsonl"
    guard = make_guard(path)
    with guard.turn(agent_name="coder", conversation_id="c1") as turn:
        turn.begin_cycle()
        as_json_text = '{"p": "' + SECRET_ARG + '"}'
        for args, outcome in (({"p": SECRET_ARG}, "ok"), (as_json_text, "error"), ({"q": 1}, "denied")):
            c = tg.ToolCall("read", args)
            turn.check_call(c)
            turn.record_outcome(c, outcome)
        turn.begin_cycle()
        turn_id = turn.turn_id
    (line,) = read_lines(path)
    assert SECRET_ARG not in path.read_text()
    assert line["source"] == "turnguard"
    assert line["id"] == turn_id
    assert line["cycles"] == 2
    assert line["resolved"] is None
    assert line["ended_by"] == "completed"
    assert [c["tool"] for c in line["calls"]] == ["read"] * 3
    assert [c["outcome"] for c in line["calls"]] == ["ok", "error", "denied"]
    digests = [c["args"] for c in line["calls"]]
    assert digests[0] == digests[1] != digests[2]  # the JSON text and the dict are one call
    assert all(len(d) == 16 for d in digests)
    assert line["agent"] == "coder" and line["tool_calls"] == 3 and line["calls_dropped"] == 0


def test_ended_by_is_the_threshold_that_halted_the_turn(tmp_path):
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, max_tool_calls_per_turn=2)
    with guard.turn() as turn:
        for i in range(3):
            c = tg.ToolCall(f"t{i}", None)
            if not turn.check_call(c).halted:
                turn.record_outcome(c, "ok")
    with pytest.raises(ValueError), guard.turn():
        raise ValueError("host failure")
    halted, failed = read_lines(path)
    assert halted["ended_by"] == "explicit"
    assert [c["outcome"] for c in halted["calls"]] == ["ok", "ok", "denied"]  # the halted call was refused
    assert failed["ended_by"] == "error"


def test_calls_whose_outcome_never_came_are_unfinished_and_a_reported_unknown_stays_unknown(tmp_path):
    """``unfinished`` (the tool span's word) is a call the guard was never told about, whichever
    place it has in the turn; ``unknown`` is an outcome the host reported."""
    path = tmp_path / "turns.jsonl"
    with make_guard(path).turn() as turn:
        calls = [tg.ToolCall("x", n) for n in range(4)]
        for call in calls:
            turn.check_call(call)
        turn.record_outcome(calls[1], "unknown")
        turn.record_outcome(calls[3], "ok")
    (line,) = read_lines(path)
    assert [c["outcome"] for c in line["calls"]] == ["unfinished", "unknown", "unfinished", "ok"]
    entry = line["calls"][0]
    assert (set(entry), entry["tool"]) == ({"tool", "args", "outcome"}, "x")
    assert len(entry["args"]) == 16  # the call's digest


@pytest.mark.parametrize("seed", range(20))
def test_an_object_checked_several_times_gets_each_outcome_on_its_own_checks_line_entry(tmp_path, seed):
    """One ToolCall object checked again while it waits (identical parallel calls), its outcomes
    reported through it, by its call_id or by another object, in any order: each entry gets the
    outcome (and result digest) the guard credited to that check, in check order."""
    rng = random.Random(seed)
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, recorder_results=True)
    credited = []

    class Credited:
        @tg.hookimpl
        def turnguard_check_outcome(self, turn, call, outcome):
            key = call.key  # the check it settles, the result digest kept
            credited.append((key[KEY_CHECK], (outcome.value, key[KEY_RESULT].hex())))

    guard.register(Credited(), name="credited")
    build, other = tg.ToolCall("bash", "make", call_id=rng.choice(("b", None))), tg.ToolCall("read", 1)
    with guard.turn() as turn:
        calls = [rng.choice((build, build, other)) for _ in range(8)]
        for call in calls:
            turn.check_call(call)
        reports = list(calls)
        rng.shuffle(reports)
        for call in reports:
            turn.record_outcome(call, rng.choice(("ok", "error", "denied")), result=rng.choice(("x", "y")))
    (line,) = read_lines(path)
    by_check = dict(credited)
    assert [(c["outcome"], c["result"]) for c in line["calls"]] == [by_check[seq] for seq in range(1, 9)]


def test_retry_drops_the_resent_requests_calls_like_the_ledger(tmp_path):
    path = tmp_path / "turns.jsonl"
    with make_guard(path).turn() as turn:
        turn.begin_cycle()
        turn.check_call(tg.ToolCall("kept", 1))
        turn.begin_cycle()
        a = tg.ToolCall("discarded", 2)
        turn.check_call(a)
        turn.retry()
        turn.record_outcome(a, "error")  # a late outcome of a discarded call changes nothing
        turn.begin_cycle()
        turn.check_call(tg.ToolCall("resent", 3))
    (line,) = read_lines(path)
    assert [c["tool"] for c in line["calls"]] == ["kept", "resent"]
    assert line["tool_calls"] == 2 and line["cycles"] == 3


def test_escalation_answers_are_recorded(tmp_path):
    path = tmp_path / "turns.jsonl"
    with make_guard(path, streak_warn_at=2, streak_stop_at=0).turn(promptable=True) as turn:
        for _ in range(2):
            v = turn.check_call(tg.ToolCall("same", 1))
        turn.resolve(v, "stop")
    (line,) = read_lines(path)
    assert line["escalations"] == [{"threshold": "streak", "level": "warn", "answer": "stop", "at_call": 2}]
    assert line["ended_by"] == "streak"


def test_the_call_list_is_bounded_and_the_rest_counted(tmp_path):
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, soft_cap=0)
    guard.pm.get_plugin("recorder").max_calls = 5
    with guard.turn() as turn:
        for i in range(12):
            c = tg.ToolCall("t", i)
            turn.check_call(c)
            turn.record_outcome(c, "ok")
    (line,) = read_lines(path)
    assert len(line["calls"]) == 5
    assert line["calls_dropped"] == 7 and line["tool_calls"] == 12


def test_the_default_bound_holds_a_whole_default_turn():
    default = tg.GuardConfig()
    assert default.hard_cap + 1 <= rec.MAX_RECORDED_CALLS


def test_an_unwritable_path_never_breaks_the_turn(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    guard = make_guard(blocker / "turns.jsonl")
    with guard.turn() as turn:
        assert turn.check_call(tg.ToolCall("x", 1)).action is tg.Action.ALLOW
    assert "could not append" in caplog.text


def test_a_failing_disk_is_warned_about_once_a_minute_not_once_a_turn(tmp_path, caplog, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder yet")
    guard = make_guard(blocker / "turns.jsonl")
    now = [1_000.0]
    monkeypatch.setattr(rec, "time", SimpleNamespace(monotonic=lambda: now[0]))  # its clock, not the machine's
    with caplog.at_level(logging.INFO, logger="turnguard.telemetry"):
        for _ in range(300):
            guard.turn().end()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "could not append" in warnings[0]
        now[0] += rec.WARN_EVERY_S  # a minute later
        for _ in range(3):
            guard.turn().end()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2 and "300 failed appends since the last warning" in warnings[1]
        blocker.unlink()
        guard.turn().end()
    assert len(read_lines(blocker / "turns.jsonl")) == 304  # every line kept was written once it could be
    assert "appending to" in caplog.records[-1].getMessage() and caplog.records[-1].levelno == logging.INFO


def _turn_line(i: int, calls: int) -> bytes:
    summary = tg.TurnSummary(
        turn_id=f"turn-{i}", conversation_id=None, agent_name=None, promptable=False, reason="completed",
        tool_calls=calls, cycles=1, max_key_repeat=1, first_stuck_call=0, distinct_keys=calls, keys_overflowed=False,
        halted=False, threshold=None, cap_mode="adaptive", stuck=False, detections=0, duration_s=0.0,
    )
    entries = [rec._Call(f"tool-{i}", f"{j:016x}") for j in range(calls)]
    return rec.turn_line(summary, entries)


def _write_many(path: str, writer: int, lines: int, calls: int, start=None) -> None:
    if start is not None:
        start.wait()  # every writer starts at once, so their writes overlap
    for k in range(lines):
        rec.append_line(path, _turn_line(writer * 1000 + k, calls))


def _check_whole_lines(path: Path, writers: int, lines: int, calls: int) -> None:
    parsed = read_lines(path)
    assert len(parsed) == writers * lines
    ids = sorted(p["id"] for p in parsed)
    assert ids == sorted(f"turn-{w * 1000 + k}" for w in range(writers) for k in range(lines))
    for p in parsed:  # a line is one writer's: its calls all carry its tool name
        assert len(p["calls"]) == calls
        assert {c["tool"] for c in p["calls"]} == {"tool-" + p["id"].removeprefix("turn-")}


def test_concurrent_threads_never_interleave_lines(tmp_path):
    path = tmp_path / "turns.jsonl"
    writers, lines, calls = 8, 25, 2000  # ~100 kB lines, far past any pipe/stdio buffer
    threads = [threading.Thread(target=_write_many, args=(str(path), w, lines, calls)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_whole_lines(path, writers, lines, calls)


def test_concurrent_processes_never_interleave_lines(tmp_path):
    path = tmp_path / "turns.jsonl"
    writers, lines, calls = 4, 40, 2000
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    start = ctx.Barrier(writers)
    procs = [ctx.Process(target=_write_many, args=(str(path), w, lines, calls, start)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    _check_whole_lines(path, writers, lines, calls)


def test_concurrent_turns_through_guards_in_threads(tmp_path):
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, streak_warn_at=0)
    per_thread, workers = 10, 6

    def work(w: int) -> None:
        for k in range(per_thread):
            with guard.turn(agent_name=f"w{w}", turn_id=f"w{w}-{k}") as turn:
                for i in range(k + 1):
                    c = tg.ToolCall(f"tool-w{w}", i)
                    turn.check_call(c)
                    turn.record_outcome(c, "ok")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parsed = read_lines(path)
    assert len(parsed) == per_thread * workers
    for line in parsed:
        w, k = line["id"].removeprefix("w").split("-")
        assert line["agent"] == f"w{w}"
        assert len(line["calls"]) == int(k) + 1
        assert {c["tool"] for c in line["calls"]} == {f"tool-w{w}"}


def test_lines_replay_through_the_corpus_reader_shape(tmp_path):
    """Every key the corpus README defines is there with its type."""
    path = tmp_path / "turns.jsonl"
    with make_guard(path).turn() as turn:
        c = tg.ToolCall("x", 1)
        turn.check_call(c)
        turn.record_outcome(c, "ok")
    (line,) = read_lines(path)
    assert isinstance(line["source"], str) and isinstance(line["id"], str)
    assert isinstance(line["cycles"], int) and line["resolved"] in (None, True, False)
    assert all(set(c) == {"tool", "args", "outcome"} for c in line["calls"])
    assert all(c["outcome"] in ("ok", "error", "denied", "unknown") for c in line["calls"])


def test_turns_never_ended_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(rec, "MAX_OPEN_TURNS", 3)
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path)
    turns = [guard.turn(turn_id=f"t{i}") for i in range(5)]  # opened, never ended (yet)
    recorder = guard.pm.get_plugin("recorder")
    assert len(recorder._turns) == 3
    turns[-1].end()
    (line,) = read_lines(path)
    assert line["id"] == "t4"


def test_odd_tool_names_still_give_one_valid_json_line(tmp_path):
    path = tmp_path / "turns.jsonl"
    names = ["multi\nline", "lone-surrogate-\udcff", "ünïcode", 'quote"s']
    with make_guard(path).turn() as turn:
        for name in names:
            c = tg.ToolCall(name, 1)
            turn.check_call(c)
            turn.record_outcome(c, "ok")
    raw = path.read_bytes()
    assert raw.count(b"\n") == 1
    (line,) = read_lines(path)
    assert [c["tool"] for c in line["calls"]] == names


# -- a full disk: never half a line, no finished turn lost once space frees ---------------------------

WIDE_TURN = 60
"""Calls per turn in the disk tests: a line of ~4 kB, so a nearly full disk cuts it short."""


def end_turns(guard: tg.Guard, first: int, count: int) -> None:
    for i in range(first, first + count):
        with guard.turn(turn_id=f"turn-{i}") as turn:
            turn.begin_cycle()
            for j in range(WIDE_TURN):
                call = tg.ToolCall("read_file", {"path": f"src/module_{i}_{j}.py"})
                turn.check_call(call)
                turn.record_outcome(call, tg.Outcome.OK)


def assert_whole_records(path: Path, ids: list[str]) -> None:
    """Every line of ``path`` is a whole record, and they are exactly ``ids``, in order."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert [json.loads(line)["id"] for line in lines] == ids
    assert all(len(json.loads(line)["calls"]) == WIDE_TURN for line in lines)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 kB tmpfs (needs root; under CI it must be there, so it fails rather than skips)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        message = f"cannot mount a tmpfs (root needed): {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler to delete when space should free."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (4096, 512, 64, 1):
            try:
                while True:
                    f.write(b"x" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_never_leaves_half_a_line_and_every_turn_is_written_once_space_frees(tiny_disk, caplog):
    path = tiny_disk / "turns.jsonl"
    guard = make_guard(path, streak_warn_at=0)
    end_turns(guard, 0, 3)
    filler = fill(tiny_disk)
    end_turns(guard, 3, 4)  # the disk is full: each fails, short or not at all
    assert "could not append" in caplog.text
    assert_whole_records(path, ["turn-0", "turn-1", "turn-2"])  # no half line left behind
    filler.unlink()
    end_turns(guard, 7, 1)
    assert_whole_records(path, [f"turn-{i}" for i in range(8)])


def test_a_turn_held_back_by_a_full_disk_is_written_at_exit(tiny_disk):
    import subprocess
    import sys

    path = tiny_disk / "turns.jsonl"
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from test_telemetry_recorder import end_turns, fill, make_guard
guard = make_guard(Path({str(path)!r}), streak_warn_at=0)
end_turns(guard, 0, 1)
filler = fill(Path({str(tiny_disk)!r}))
end_turns(guard, 1, 2)
filler.unlink()  # space frees, but no turn ends again before exit
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_whole_records(path, ["turn-0", "turn-1", "turn-2"])


SHORT_WRITES = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_telemetry_recorder import end_turns, make_guard
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write(2) is short, then EFBIG
path = Path({path!r})
guard = make_guard(path, streak_warn_at=0)
end_turns(guard, 0, 2)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 1000, hard))  # half a line more
end_turns(guard, 2, 3)
print(path.stat().st_size, flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
end_turns(guard, 5, 1)
"""


def test_a_short_write_is_cut_back_off_and_the_line_written_whole_later(tmp_path):
    """A real short ``write(2)``: the kernel's file-size limit stops it part-way, as a full disk does."""
    import subprocess
    import sys

    path = tmp_path / "turns.jsonl"
    script = SHORT_WRITES.format(tests=str(Path(__file__).parent), path=str(path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "short write" in done.stderr  # the kernel did cut the write short
    lines_at_limit = int(done.stdout.split()[0])
    assert lines_at_limit == len(b"".join(path.read_bytes().split(b"\n")[:2])) + 2  # cut back to two whole lines
    assert_whole_records(path, [f"turn-{i}" for i in range(6)])


def test_a_file_left_ending_mid_line_gets_its_newline_before_the_next_record(tmp_path):
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, streak_warn_at=0)
    end_turns(guard, 0, 1)
    with path.open("ab") as f:
        f.write(b'{"id": "cut-off-by-someth')
    end_turns(guard, 1, 1)
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"id": "cut-off-by-someth' and json.loads(lines[2])["id"] == "turn-1" and lines[3] == b""


def test_lines_waiting_for_the_disk_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(rec, "MAX_PENDING_BYTES", 10_000)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    recorder = rec.Recorder(str(blocker / "turns.jsonl"))
    for i in range(10):
        recorder.write(_turn_line(i, 100))
    kept = recorder.pending
    assert 0 < kept < 10 and recorder.lines_lost == 10 - kept
    assert sum(map(len, recorder._pending)) <= 10_000 + len(_turn_line(9, 100))


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_still_gets_every_line(tmp_path, monkeypatch, code):
    import fcntl

    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "turns.jsonl"
    end_turns(make_guard(path, streak_warn_at=0), 0, 3)
    assert_whole_records(path, ["turn-0", "turn-1", "turn-2"])


DEFAULT_LATER_LIMITS = {"stuck_signal": "repeat", "streak_stop_on": "error", "cycle_repeat_warn_at": 0,
                        "cycle_repeat_stop_at": 0, "cycle_repeat_max_period": 4, "remind_model": False,
                        "max_tracked_keys": 65536, "disabled_policies": []}
"""The limits besides the caps, the streak's levels and the cycle cap, at their defaults."""

LIMIT_CASES = {
    "adaptive": ({"soft_cap": 40, "hard_multiplier": 2.5, "stuck_repeat_threshold": 4, "streak_warn_at": 3,
                  "streak_stop_at": 7, "max_cycles_per_turn": 9, "stuck_signal": "stale_repeat",
                  "streak_stop_on": "any", "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 6,
                  "cycle_repeat_max_period": 5, "remind_model": True, "max_tracked_keys": 500,
                  "disable_plugins": ("shadow", "cycles", "cap")},
                 {"cap_mode": "adaptive", "soft_cap": 40, "hard_cap": 100, "stuck_repeat_threshold": 4,
                  "streak_warn_at": 3, "streak_stop_at": 7, "max_cycles": 9, "stateful_tools": [],
                  "streak_exempt_tools": [], "stuck_signal": "stale_repeat", "streak_stop_on": "any",
                  "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 6, "cycle_repeat_max_period": 5,
                  "remind_model": True, "max_tracked_keys": 500, "disabled_policies": ["cap", "cycles"]}),
    "explicit": ({"max_tool_calls_per_turn": 30, "soft_cap": 40, "stateful_tools": ("ci_status", "poll"),
                  "streak_exempt_tools": ("sleep",)},
                 {"cap_mode": "explicit", "soft_cap": None, "hard_cap": 30, "stuck_repeat_threshold": 6,
                  "streak_warn_at": 5, "streak_stop_at": 8, "max_cycles": 0, "stateful_tools": ["ci_status", "poll"],
                  "streak_exempt_tools": ["sleep"], **DEFAULT_LATER_LIMITS}),
    "disabled": ({"soft_cap": 0, "streak_warn_at": 0, "streak_stop_at": 0, "stateful_tools": ("*",)},
                 {"cap_mode": "disabled", "soft_cap": None, "hard_cap": None, "stuck_repeat_threshold": 6,
                  "streak_warn_at": 0, "streak_stop_at": 0, "max_cycles": 0, "stateful_tools": ["*"],
                  "streak_exempt_tools": [], **DEFAULT_LATER_LIMITS}),
}


@pytest.mark.parametrize("case", LIMIT_CASES)
def test_each_line_names_its_policy_the_limits_in_force_and_when_it_ran(tmp_path, case):
    options, limits = LIMIT_CASES[case]
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, name=f"policy-{case}", **options)
    before = time.time()
    with guard.turn() as turn:
        time.sleep(0.05)
        c = tg.ToolCall("read", {})
        turn.check_call(c)
        turn.record_outcome(c, "ok")
    after = time.time()
    (line,) = read_lines(path)
    assert line["policy"] == f"policy-{case}"
    assert line["limits"] == limits
    assert before <= line["started_at"] < line["ended_at"] <= after
    assert line["ended_at"] - line["started_at"] >= 0.05


def test_a_probe_turns_line_carries_the_probes_name_and_limits(tmp_path):
    path = tmp_path / "turns.jsonl"
    guard = make_guard(path, name="prod", soft_cap=50, probe={"rate": 1.0, "hard_multiplier": 20,
                                                              "streak_stop_at": 12})
    with guard.turn() as turn:
        turn.check_call(tg.ToolCall("read", {}))
    (line,) = read_lines(path)
    assert line["cohort"] == "probe" and line["policy"] == "prod-probe"
    assert line["limits"]["hard_cap"] == 1000 and line["limits"]["soft_cap"] == 50
    assert line["limits"]["streak_stop_at"] == 12 and line["limits"]["streak_warn_at"] == 5


def test_lines_without_the_new_keys_are_still_written_by_turn_line():
    """``turn_line`` without policy or limits leaves the keys out (older recordings have none)."""
    data = json.loads(_turn_line(0, 0))
    assert not {"policy", "limits", "started_at", "ended_at"} & data.keys()


FORKED = """
import os, signal, sys, threading
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_telemetry_recorder import end_turns, make_guard

folder = Path({folder!r})
folder.write_text("a file where the folder should be: every append fails, as on a full disk")
guard = make_guard(folder / "turns.jsonl", streak_warn_at=0)
recorder = guard.pm.get_plugin("recorder")
end_turns(guard, 0, 2)
assert recorder.pending == 2
folder.unlink()  # the disk has room again
how = sys.argv[1]
held, release = threading.Event(), threading.Event()
if how == "lock held":  # a thread of the parent is writing at the fork
    def write_slowly():
        with recorder._write_lock:
            held.set()
            release.wait()
    threading.Thread(target=write_slowly, daemon=True).start()
    held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(30)  # (a child that deadlocked is ended by the alarm, not waited for)
    end_turns(guard, 10, 1)
    if how == "exit":
        sys.exit(0)  # the interpreter's exit: the recorder's exit hook runs
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
end_turns(guard, 20, 1)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("how", ["os._exit", "exit", "lock held"])
def test_a_forked_child_writes_no_line_its_parent_held_back_and_never_waits_on_its_lock(tmp_path, how):
    """Lines a full disk held back are the parent's: a forked child wrote them too (the turns were
    on the file twice), and one forked while a thread wrote waited forever on the write lock."""
    import subprocess
    import sys

    folder = tmp_path / "recorded"
    script = FORKED.format(tests=str(Path(__file__).parent), folder=str(folder))
    done = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "0"  # the child ended by itself
    assert_whole_records(folder / "turns.jsonl", ["turn-10", "turn-0", "turn-1", "turn-20"])
