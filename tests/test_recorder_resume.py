"""A turn suspended and resumed is recorded as one turn: the process that finishes it writes the
line the uninterrupted turn writes (every call with its outcome, the counts, the answers, the
policy and limits; times spanning the whole turn), so ``turnguard calibrate`` replays the turn
that ran. Checked by a differential over scripted turns cut at every point (in one process, and
across two OS processes with the default configuration), and by a fuzz of the recorder's section
of real snapshots: a tampered record is a ``tg.SnapshotError`` naming its field, or a turn that
goes on and writes its line; never an error at a later call or at the turn's end."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from test_resume_equivalence import MAIN, Player, Script, make_script
from turnguard._cli import main
from turnguard.telemetry import _recorder as rec

TESTS = Path(__file__).resolve().parent
CONFIGS: dict[str, dict[str, Any]] = {
    "small limits": {k: v for k, v in MAIN.items() if k != "name"},  # halts, streak stops, cycle caps
    "default": {},
    "4 calls kept": {k: v for k, v in MAIN.items() if k != "name"},  # and a recorder bound of 4 calls
    "results": {**{k: v for k, v in MAIN.items() if k != "name"}, "stateful_tools": ("build",),
                "recorder_results": True},  # result digests on the line (the polling tools' evidence)
}
BOUNDED = {"4 calls kept": 4}
CLOCKS_S = 0.001
"""How far the line's end (the wall-clock opening plus the monotonic duration) may stray from the wall
clock read beside it: float rounding and clock slew, never the machine's load."""


class Errors:
    """The plugin errors the guard isolated (a recorder failing at a call would only show here)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, BaseException]] = []

    @tg.hookimpl
    def turnguard_plugin_error(self, plugin, hook, error):
        self.seen.append((plugin, hook, error))


def recording_guard(path: Path, config: str = "default", errors: Errors | None = None) -> tg.Guard:
    options = CONFIGS[config]
    plugins: dict[str, Any] = {"errors": errors or Errors()}
    if config in BOUNDED:
        plugins["recorder"] = rec.Recorder(str(path), max_calls=BOUNDED[config])
        path_option = None
    else:
        path_option = str(path)
    return tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("otel",), recorder_path=path_option,
                                   **options), plugins=plugins, environ={})


def take_lines(path: Path) -> list[dict]:
    """The lines written since the last call (the file is emptied)."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("")
    return lines


def comparable(line: dict) -> dict:
    """A line without what differs between two runs of one turn: its id and times, and the digests'
    values (each turn has a key of its own), kept as which calls are the same call."""
    out = {k: v for k, v in line.items() if k not in ("id", "started_at", "ended_at")}
    names: dict[str, int] = {}
    results: dict[str, int] = {}
    out["calls"] = [{**call, "args": names.setdefault(call["args"], len(names)),
                     **({"result": results.setdefault(call["result"], len(results))} if "result" in call else {})}
                    for call in line["calls"]]
    return out


class ResultPlayer(Player):
    """Reports each outcome with a result (a status that changes every third call): the same in
    every run of a script, so the lines' result digests compare."""

    def step(self, turn: tg.Turn, op: tuple[Any, ...], fresh_before: int) -> tg.Verdict | None:
        if op[0] != "outcome":
            return super().step(turn, op, fresh_before)
        call = self.objects[op[1]]
        if op[1] < fresh_before:
            call = tg.ToolCall(call.name, call.args, call.call_id)
        return turn.record_outcome(call, op[2], result={"status": op[1] // 3})


def checks_before(script: Script, cut: int) -> int:
    return sum(1 for op in script.ops[:cut] if op[0] == "check")


@dataclass
class Bench:
    """The guards of one configuration, kept across runs (a guard is built once per process)."""

    whole: tg.Guard
    first: tg.Guard
    second: tg.Guard
    paths: tuple[Path, Path, Path]
    errors: Errors


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> dict[str, Bench]:
    made = {}
    for i, config in enumerate(CONFIGS):
        folder = tmp_path_factory.mktemp(f"bench{i}")
        paths = (folder / "whole.jsonl", folder / "first.jsonl", folder / "second.jsonl")
        errors = Errors()
        made[config] = Bench(*(recording_guard(p, config, errors) for p in paths), paths=paths, errors=errors)
    return made


def whole_line(bench: Bench, script: Script, promptable: bool) -> dict:
    player = ResultPlayer(script)
    turn = bench.whole.turn(durable=True, promptable=promptable)
    player.play(turn, script.ops)
    turn.end()
    (line,) = take_lines(bench.paths[0])
    return line


def cut_line(bench: Bench, script: Script, promptable: bool, cut: int, fresh: bool) -> tuple[dict, dict]:
    """The line of the turn suspended after ``cut`` operations and finished by another guard, and
    the recorder's section of its snapshot."""
    player = ResultPlayer(script)
    first = bench.first.turn(durable=True, promptable=promptable)
    player.play(first, script.ops[:cut])
    state = json.loads(json.dumps(first.suspend()))
    assert take_lines(bench.paths[1]) == []  # no line where the turn was put aside
    resumed = bench.second.resume(state)
    player.play(resumed, script.ops[cut:], fresh_before=checks_before(script, cut) if fresh else -1)
    resumed.end()
    (line,) = take_lines(bench.paths[2])
    assert line["id"] == first.turn_id
    return line, state["plugins"]["recorder"]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("seed", range(6))
def test_a_turn_resumed_at_any_cut_records_the_line_of_the_whole_turn(benches, config, promptable, seed):
    script = make_script(seed * 11 + len(config))
    bench = benches[config]
    whole = comparable(whole_line(bench, script, promptable))
    for cut in range(len(script.ops) + 1):
        for fresh in (False, True):
            line, _ = cut_line(bench, script, promptable, cut, fresh)
            assert comparable(line) == whole, (cut, fresh)
    assert bench.errors.seen == []


def test_the_cuts_fall_where_the_record_has_something_to_carry(benches):
    """Across the scripts the snapshots' records hold calls still waiting (settled after the
    resume), a request's start to roll back to, calls past the bound, answers, halted calls."""
    seen: set[str] = set()
    for config in CONFIGS:
        for seed in range(6):
            script = make_script(seed * 11 + len(config))
            for promptable in (False, True):
                for cut in range(len(script.ops) + 1):
                    line, section = cut_line(benches[config], script, promptable, cut, fresh=True)
                    seen.update(name for name in ("dropped", "cycle_mark", "escalations", "results")
                                if section.get(name))
                    outcomes = [call["outcome"] for call in line["calls"]]
                    for _, at in section.get("awaiting", ()):
                        seen.add("awaiting")
                        if at < len(outcomes) and outcomes[at] != "unknown":  # (unless a retry took it)
                            seen.add("settled after the resume")
                    seen.update(("halted",) if line["ended_by"] not in ("completed",) else ())
    assert {"awaiting", "settled after the resume", "dropped", "cycle_mark", "escalations", "results",
            "halted"} <= seen


def test_the_line_spans_the_whole_turn_and_the_pause(tmp_path):
    """Bracketed by the wall clock read around the opening and the end (no margin that a loaded
    machine could overrun): the line runs from the first opening to the end, and its span is the
    time the turn ran (``duration_s``, without the pause) plus the pause."""
    first, second = recording_guard(tmp_path / "a.jsonl"), recording_guard(tmp_path / "b.jsonl")
    opening = time.time()
    turn = first.turn(durable=True)
    opened = time.time()
    failing(turn, 3)
    state = json.loads(json.dumps(turn.suspend()))
    time.sleep(0.3)
    resumed = second.resume(state)
    failing(resumed, 2, start=3)
    ending = time.time()
    summary = resumed.end()
    closed = time.time()
    (line,) = take_lines(tmp_path / "b.jsonl")
    assert opening - CLOCKS_S <= line["started_at"] <= opened + CLOCKS_S
    assert ending - CLOCKS_S <= line["ended_at"] <= closed + CLOCKS_S
    assert line["ended_at"] - line["started_at"] >= summary.duration_s + 0.3 - CLOCKS_S  # the pause is in the span
    assert (line["tool_calls"], len(line["calls"])) == (5, 5) and "calls_unrecorded" not in line


def failing(turn: tg.Turn, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        call = tg.ToolCall("run_tests", {"target": "all"}, call_id=f"c{i}")
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.ERROR)


# -- a guard without a recorder, on either side ----------------------------------------------------------


def test_a_guard_without_a_recorder_writes_no_section(tmp_path):
    turn = tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={}).turn(durable=True)
    failing(turn, 3)
    assert "recorder" not in turn.suspend().get("plugins", {})


@pytest.mark.parametrize("retry", [False, True], ids=["", "retried"])
def test_a_snapshot_without_a_record_is_recorded_with_what_the_resume_has_and_says_so(tmp_path, retry):
    turn = tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={}).turn(durable=True)
    turn.begin_cycle()
    failing(turn, 3)
    turn.check_call(tg.ToolCall("read", {"p": 1}))  # waiting: its outcome comes after the resume
    resumed = recording_guard(tmp_path / "b.jsonl").resume(json.loads(json.dumps(turn.suspend())))
    assert resumed.record_outcome(tg.ToolCall("read", {"p": 1}), "ok").action is tg.Action.ALLOW
    failing(resumed, 2, start=3)
    if retry:  # the request began before the resume: its calls, the unrecorded ones too, are rolled back
        resumed.retry()
        resumed.begin_cycle()
        failing(resumed, 1, start=5)
    summary = resumed.end()
    (line,) = take_lines(tmp_path / "b.jsonl")
    assert summary.fresh_state == ("recorder",) and line["fresh_state"] == ["recorder"]
    counts = (line["tool_calls"], [c["outcome"] for c in line["calls"]], line.get("calls_unrecorded"))
    assert counts == ((1, ["error"], None) if retry else (6, ["error", "error"], 4))


def test_calls_before_a_resume_without_a_record_are_counted_unrecorded(tmp_path):
    turn = tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={}).turn(durable=True)
    failing(turn, 4)
    resumed = recording_guard(tmp_path / "b.jsonl").resume(json.loads(json.dumps(turn.suspend())))
    failing(resumed, 2, start=4)
    again = recording_guard(tmp_path / "c.jsonl").resume(json.loads(json.dumps(resumed.suspend())))
    failing(again, 1, start=6)
    again.end()
    (line,) = take_lines(tmp_path / "c.jsonl")
    assert (line["tool_calls"], len(line["calls"]), line["calls_unrecorded"]) == (7, 3, 4)  # said at every resume


# -- two OS processes, the default configuration --------------------------------------------------------

PROCESS = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[3])
    import turnguard as tg
    from test_resume_equivalence import Player, make_script
    phase, folder = sys.argv[1], sys.argv[2]
    plan = json.load(open(f"{folder}/plan.json"))
    guard = tg.Guard(tg.GuardConfig(recorder_path=f"{folder}/{phase}.jsonl"))  # the default configuration
    if phase == "first":
        states = {}
        for item in plan:
            script = make_script(item["seed"])
            turn = guard.turn(durable=True, promptable=item["promptable"], turn_id=item["id"])
            Player(script).play(turn, script.ops[:item["cut"]])
            states[item["id"]] = turn.suspend()
        json.dump(states, open(f"{folder}/states.json", "w"))
    else:
        states = json.load(open(f"{folder}/states.json"))
        for item in plan:
            script = make_script(item["seed"])
            player = Player(script)
            player.objects = {i: tg.ToolCall(*script.calls[i]) for i in range(item["checked"])}  # the host's own
            turn = guard.resume(states[item["id"]])
            player.play(turn, script.ops[item["cut"]:], fresh_before=item["checked"])
            turn.end()
    print(json.dumps({"at": time.time()}))
""")


def run_phase(phase: str, folder: Path) -> float:
    done = subprocess.run([sys.executable, "-c", PROCESS, phase, str(folder), str(TESTS)], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout)["at"]


def two_process_plan(seeds: range) -> list[dict]:
    """Every cut of the scripts, unattended, and attended where no question is outstanding at the
    cut (the host's pending question would travel with ``snapshot(pending=)``, not tested here)."""
    plan, guard = [], tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={})
    for seed in seeds:
        script = make_script(seed)
        for promptable in (False, True):
            for cut in range(len(script.ops) + 1):
                player = Player(script)
                player.play(guard.turn(promptable=promptable), script.ops[:cut])
                if not player.asks:
                    plan.append({"id": f"s{seed}-{'a' if promptable else 'u'}-{cut}", "seed": seed, "cut": cut,
                                 "promptable": promptable, "checked": checks_before(script, cut)})
    return plan


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[Path, Path, list[dict], tuple[float, float]]:
    """The same turns recorded uninterrupted here and suspended in one process, finished in another."""
    folder = tmp_path_factory.mktemp("two-processes")
    plan = two_process_plan(range(3))
    (folder / "plan.json").write_text(json.dumps(plan))
    whole = folder / "whole.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(whole)))
    for item in plan:
        script = make_script(item["seed"])
        turn = guard.turn(durable=True, promptable=item["promptable"], turn_id=item["id"])
        Player(script).play(turn, script.ops)
        turn.end()
    guard.pm.get_plugin("recorder").flush()
    first_done = run_phase("first", folder)
    second_done = run_phase("second", folder)
    return whole, folder / "second.jsonl", plan, (first_done, second_done)


def test_turns_suspended_in_one_process_and_finished_in_another_record_the_whole_turns(two_processes):
    whole, finished, plan, (first_done, second_done) = two_processes
    assert not (finished.parent / "first.jsonl").exists()  # nothing recorded where the turns were put aside
    lines = [json.loads(line) for line in finished.read_text().splitlines()]
    expected = {line["id"]: line for line in map(json.loads, whole.read_text().splitlines())}
    assert [line["id"] for line in lines] == [item["id"] for item in plan] and len(plan) > 150
    assert any(item["promptable"] for item in plan) and any(line["escalations"] for line in lines)
    for line in lines:
        assert comparable(line) == comparable(expected[line["id"]]), line["id"]
        assert line["started_at"] < first_done < line["ended_at"] <= second_done  # the span covers both


def calibrate_json(path: Path, out: Path) -> dict:
    assert main(["calibrate", str(path), "--json", str(out)]) == 0
    return json.loads(out.read_text())


TIME_SPAN = ("recording.first_started", "recording.last_ended", "recording.days")
"""What calibrate says of when the recording ran (and what it derives from its span)."""
READ = ("inputs[0]",)
"""The file read (each recording has its own)."""


def differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            yield from differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield path


def test_calibrate_on_the_two_process_recording_is_calibrate_on_the_uninterrupted_one(two_processes, tmp_path):
    whole, finished, _, _ = two_processes
    ours, theirs = calibrate_json(whole, tmp_path / "whole.json"), calibrate_json(finished, tmp_path / "two.json")
    assert set(differences(ours, theirs)) <= {*TIME_SPAN, *READ}
    # on the uninterrupted turns' clock, the two recordings are the same recording
    clock = {line["id"]: (line["started_at"], line["ended_at"])
             for line in map(json.loads, whole.read_text().splitlines())}
    retimed = tmp_path / "retimed.jsonl"
    with retimed.open("w") as out:
        for line in map(json.loads, finished.read_text().splitlines()):
            line["started_at"], line["ended_at"] = clock[line["id"]]
            out.write(json.dumps(line) + "\n")
    assert set(differences(calibrate_json(retimed, tmp_path / "retimed.json"), ours)) <= set(READ)
    assert ours["turns"] == len(clock)


# -- the recorder's section of real snapshots, fuzzed -----------------------------------------------------


def real_sections(tmp_path: Path) -> dict[str, tuple[str, dict]]:
    """Snapshots whose records hold waiting calls (with and without ids), an answer, a request's
    start past some calls, calls past the bound, a halted call."""
    made = {}
    turn = recording_guard(tmp_path / "taken.jsonl", "small limits").turn(durable=True, promptable=True)
    turn.begin_cycle()
    asked = None
    for i in range(3):
        call = tg.ToolCall("run", {"t": 1}, call_id=f"r{i}")
        for verdict in (turn.check_call(call), turn.record_outcome(call, tg.Outcome.ERROR)):
            asked = verdict if verdict.action is tg.Action.ASK else asked
    assert asked is not None
    turn.resolve(asked, "continue")
    turn.begin_cycle()
    turn.check_call(tg.ToolCall("ls", "a b", call_id="w1"))
    turn.check_call(tg.ToolCall("ls", "a b"))
    made["attended, waiting"] = ("small limits", turn.snapshot())
    turn = recording_guard(tmp_path / "taken.jsonl", "4 calls kept").turn(durable=True)
    for i in range(3):
        turn.begin_cycle()
        for j in range(3):
            turn.check_call(tg.ToolCall("read", {"f": i * 3 + j}, call_id=f"b{i}{j}"))
    made["bounded"] = ("4 calls kept", turn.snapshot())
    turn = recording_guard(tmp_path / "taken.jsonl", "small limits").turn(durable=True)
    batch = [tg.ToolCall("run", {"t": 1}, call_id=f"h{i}") for i in range(5)]
    assert [turn.check_call(call).action for call in batch][-1] is tg.Action.HALT  # refused at its check
    turn.record_outcome(batch[0], tg.Outcome.ERROR)
    made["halted"] = ("small limits", turn.snapshot())
    turn = recording_guard(tmp_path / "taken.jsonl", "results").turn(durable=True)
    for i in range(6):
        call = tg.ToolCall("build", {"t": 1}, call_id=f"p{i}")
        turn.check_call(call)
        if i < 4:
            turn.record_outcome(call, tg.Outcome.OK, result={"status": i // 2})
    made["results"] = ("results", turn.snapshot())
    return {name: (config, json.loads(json.dumps(state))) for name, (config, state) in made.items()}


def test_the_fuzzed_sections_hold_every_field(tmp_path):
    sections = {name: state["plugins"]["recorder"] for name, (_, state) in real_sections(tmp_path).items()}
    assert {"escalations", "awaiting", "cycle_mark"} <= set(sections["attended, waiting"])
    assert {"dropped", "cycle_mark", "awaiting"} <= set(sections["bounded"])
    assert sections["bounded"]["cycle_mark"][1] > 0
    assert [c[2] for c in sections["halted"]["calls"]][-1] == "denied"
    assert len(sections["results"]["results"]) == 2 and sections["results"]["awaiting"]


SECTION = "plugins.recorder"
CHECKED_AGAINST = {"tools": {"calls"}, "digests": {"calls"}, "results": {"calls"},
                   "calls": {"awaiting", "cycle_mark", "cycles", "retries"}, "dropped": {"cycle_mark"}}
"""A field another is checked against: a bad value there may be reported on the other one."""


def part(path: str) -> str:
    """The section's field a path is in (``calls`` for ``plugins.recorder.calls[3][1]``)."""
    rest = path[len(SECTION) + 1:]
    return rest.split("[")[0].split(".")[0]


def named(path: str, field: str | None) -> bool:
    if field is None or not field.startswith(SECTION):
        return False
    if path == SECTION or field == path or field.startswith((f"{path}.", f"{path}[")):
        return True
    return part(field) == part(path) or part(field) in CHECKED_AGAINST.get(part(path), ())


def paths(value: Any, prefix: str) -> Iterator[tuple[str, tuple[Any, ...]]]:
    yield prefix, ()
    if isinstance(value, dict):
        for key, item in value.items():
            for sub, keys in paths(item, f"{prefix}.{key}"):
                yield sub, (key, *keys)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            for sub, keys in paths(item, f"{prefix}[{i}]"):
                yield sub, (i, *keys)


def swaps(value: Any) -> list[Any]:
    out: list[Any] = [None, True, -1, 1.5, "1", [], {}, 2**60, [value], {"x": value}]
    if type(value) in (int, float):
        out += [value + 1, value - 1, value * 1000 + 7, str(value)]
    if type(value) is str:
        out += [value + "x", value[:-1], value.upper(), ""]
    if isinstance(value, list) and value:
        out += [value[:-1], [*value, value[-1]], list(reversed(value)), value[1:]]
    if isinstance(value, dict) and value:
        first = next(iter(value))
        out += [{k: v for k, v in value.items() if k != first}, {**value, "unknown": 1}]
    return out


def mutants(section: dict) -> Iterator[tuple[str, str, Any]]:
    """The section with each of its fields deleted, then swapped for each of ``swaps``."""
    for path, keys in list(paths(section, SECTION)):
        if keys:
            deleted = copy.deepcopy(section)
            holder = deleted
            for key in keys[:-1]:
                holder = holder[key]
            del holder[keys[-1]]
            yield path, "deleted", deleted
        value = section
        for key in keys:
            value = value[key]
        for new in swaps(value):
            if not keys:
                yield path, f"= {new!r}"[:60], new
                continue
            mutant = copy.deepcopy(section)
            holder = mutant
            for key in keys[:-1]:
                holder = holder[key]
            holder[keys[-1]] = new
            yield path, f"= {new!r}"[:60], mutant


def go_on(turn: tg.Turn, state: dict, guard: tg.Guard) -> tg.Turn:
    """Outcomes for the calls that waited, more calls (a retry, answers), a snapshot resumed again."""
    for _, name, call_id, _digest in state["awaiting"]:
        turn.record_outcome(tg.ToolCall(name, "a b", call_id), tg.Outcome.OK)
    for i in range(12):
        if i % 4 == 0:
            turn.begin_cycle()
        call = tg.ToolCall("run", {"t": i % 2}, call_id=f"more{i}")
        verdict = turn.check_call(call)
        if verdict.action is tg.Action.ASK:
            turn.resolve(verdict, "continue")
        if i % 3:
            turn.record_outcome(call, tg.Outcome.ERROR)
        if i == 6:
            turn.retry()
    again = guard.resume(json.loads(json.dumps(turn.suspend())))
    failing(again, 2, start=50)
    again.end()
    return again


@pytest.mark.parametrize("name", ["attended, waiting", "bounded", "halted", "results"])
def test_every_field_of_the_record_mutated_is_refused_by_name_or_recorded_whole(tmp_path, name):
    config, state = real_sections(tmp_path)[name]
    path, errors = tmp_path / "resumed.jsonl", Errors()
    guard = recording_guard(path, config, errors)
    refused = recorded = 0
    for where, how, section in mutants(state["plugins"]["recorder"]):
        mutant = {**copy.deepcopy(state), "plugins": {**state["plugins"], "recorder": section}}
        try:
            turn = guard.resume(mutant)
        except tg.SnapshotError as exc:
            assert named(where, exc.field), (where, how, exc.field, str(exc))
            assert exc.field in str(exc)
            refused += 1
            continue
        go_on(turn, mutant, guard)
        (line,) = take_lines(path)
        assert line["tool_calls"] >= 0 and isinstance(line["calls"], list), (where, how)
        assert errors.seen == [], (where, how, errors.seen)
        recorded += 1
    assert refused > 300 and recorded > 20, (refused, recorded)


def test_a_refused_record_leaves_the_snapshot_to_resume_and_writes_nothing(tmp_path):
    config, state = real_sections(tmp_path)["attended, waiting"]
    path = tmp_path / "resumed.jsonl"
    guard = recording_guard(path, config)
    bad = copy.deepcopy(state)
    bad["plugins"]["recorder"]["calls"][0][2] = "fine"
    with pytest.raises(tg.SnapshotError) as refused:
        guard.resume(bad)
    assert refused.value.field == "plugins.recorder.calls[0][2]"
    turn = guard.resume(state)  # the snapshot itself still resumes, under its own id
    turn.end()
    (line,) = take_lines(path)
    assert line["id"] == state["turn"]["turn_id"] and len(line["calls"]) == state["facts"]["tool_calls"]
