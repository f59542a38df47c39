"""The same turn read twice is one turn: from a copy of a file, from the recorder's and the
Collector's file of one fleet, twice in one file, serially or with workers; a different turn under
an id already read is a named problem; ``calibrate merge`` refuses results that counted a turn
twice."""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli
from turnguard._calibrate.duplicates import SKETCH, TurnPrints
from turnguard.telemetry._testing import InMemoryTelemetry

TURNS = 24


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """24 turns (some halted by the backstop or the streak stop, half of them probe turns, a third
    with a task result) in the recorder's file, the Collector's file, copies of each, and the
    recorder's file with every line twice."""
    folder = tmp_path_factory.mktemp("fleet")
    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(name="prod", soft_cap=10, hard_multiplier=3, recorder_path=str(folder / "turns.jsonl"),
                            load_entrypoints=False, disable_plugins=("shadow",),
                            probe=tg.Probe(0.5, tg.GuardConfig(hard_multiplier=5)))
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    for t in range(TURNS):
        turn = guard.turn(turn_id=f"t{t}", promptable=False)
        for i in range(4 + 2 * t):
            call = tg.ToolCall("run", {"i": 0 if t % 4 == 0 else i})
            if turn.check_call(call).halted or turn.record_outcome(call, "error" if t % 3 else "ok").halted:
                break
        if t % 3 == 0:
            turn.report_result(t % 2 == 0)
        turn.end("completed")
    telemetry.tracer_provider.force_flush()
    spans = telemetry.spans()
    paths = {"lines": folder / "turns.jsonl", "spans": folder / "otlp.jsonl"}
    paths["spans"].write_text("\n".join(collector_lines(spans[i:i + 20] for i in range(0, len(spans), 20))) + "\n")
    copies = folder / "copies"
    copies.mkdir()
    for name in ("lines", "spans"):
        paths[f"{name} copy"] = Path(shutil.copy(paths[name], copies / paths[name].name))
    twice = folder / "twice.jsonl"
    twice.write_text("".join(line + "\n" + line + "\n" for line in paths["lines"].read_text().splitlines()))
    paths["twice"] = twice
    return paths


def run(*arguments: str | Path, jobs: int = 1, strict: bool = False) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, arguments), "--json", "-", "--jobs", str(jobs), "--soft-caps", "10", "--multipliers",
                     "2,3", "--stuck-repeats", "3", "--no-peers", *(["--strict"] if strict else [])],
                    stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if code == 0 else {}, err.getvalue()


def figures(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("inputs", "replays", "duplicates")}


@pytest.fixture(scope="module")
def once(fleet) -> dict:
    code, result, err = run(fleet["lines"])
    assert code == 0 and result["turns"] == TURNS and result["duplicates"] == 0 and "note:" not in err, err
    return result


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("inputs", [("lines", "lines copy"), ("spans", "spans copy"), ("lines", "spans"),
                                    ("spans", "lines"), ("twice",), ("lines", "spans", "twice", "spans copy")])
def test_a_turn_read_twice_from_any_files_is_counted_once(fleet, once, inputs, jobs):
    code, result, err = run(*(fleet[name] for name in inputs), jobs=jobs)
    assert code == 0, err
    readings = sum(2 if name == "twice" else 1 for name in inputs)
    assert result["duplicates"] == (readings - 1) * TURNS
    assert figures(result) == figures(once)
    assert f"note: {(readings - 1) * TURNS:,} reading(s) of turns already read" in err


def _changed(line: dict, field: str) -> dict:
    """``line`` (a recorder line) made another turn by one field."""
    other = json.loads(json.dumps(line))
    call = other["calls"][1]
    if field == "resolved":
        other["resolved"] = not other["resolved"]
    elif field == "cohort":
        other["cohort"] = "live" if other["cohort"] == "probe" else "probe"
    elif field == "calls":
        other["calls"] = other["calls"][:2]
        other["tool_calls"] = 2
    elif field == "outcome":
        call["outcome"] = "ok" if call["outcome"] == "error" else "error"
    else:
        call[field] = call[field] + "0"  # "args": the recorder's key digest
    return other


@pytest.mark.parametrize("field", ["args", "tool", "outcome", "resolved", "cohort", "calls"])
@pytest.mark.parametrize("changed_first", [False, True])
def test_different_turns_under_one_id_are_each_a_named_problem_whatever_their_order(
    fleet, once, tmp_path, field, changed_first
):
    lines = fleet["lines"].read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)["id"] == "t3")
    t3 = json.loads(lines[at])
    assert t3["resolved"] is False and t3["cohort"] in ("live", "probe")
    other = json.dumps(_changed(t3, field))
    path = tmp_path / "clash.jsonl"
    path.write_text("\n".join([other, *lines] if changed_first else [*lines, other]) + "\n")
    without = tmp_path / "without.jsonl"
    without.write_text("\n".join(line for i, line in enumerate(lines) if i != at) + "\n")
    _, alone, _ = run(without)
    places = f"{path}:1 and {path}:{at + 2}" if changed_first else f"{path}:{at + 1} and {path}:{TURNS + 1}"
    for jobs in (1, 2):
        code, result, err = run(path, jobs=jobs)
        assert code == 0, err
        for line in places.replace(f"{path}:", "").split(" and "):
            assert f"{path}:{line}: turn 't3': different turns under one id (at {places}); none of them is read" in err
        assert (result["turns"], result["problems"], result["duplicates"]) == (TURNS - 1, 2, 0)
        assert figures(result) == {**figures(alone), "problems": 2}
    code, _, err = run(path, strict=True)
    assert code == 1 and "different turns under one id" in err


def test_the_recorders_and_the_collectors_reading_of_a_turn_are_one_turn_with_results_and_cohorts(fleet, once):
    lines = [json.loads(line) for line in fleet["lines"].read_text().splitlines()]
    assert {line["cohort"] for line in lines} == {"live", "probe"}
    assert {line["resolved"] for line in lines} == {True, False, None}
    code, result, err = run(fleet["spans"], fleet["lines"])
    assert code == 0 and result["duplicates"] == TURNS and result["problems"] == 0, err
    assert figures(result) == figures(once)


def merge(*paths: Path) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.merge_main([*map(str, paths), "--json", "-"], stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if code == 0 else {}, err.getvalue()


def test_merge_refuses_results_that_counted_the_same_turns(fleet, once, tmp_path):
    lines = fleet["lines"].read_text().splitlines()
    halves = []
    for i, part in enumerate((lines[: TURNS // 2], lines[TURNS // 2:])):
        source = tmp_path / f"part{i}.jsonl"
        source.write_text("\n".join(part) + "\n")
        code, result, err = run(source)
        assert code == 0, err
        halves.append(tmp_path / f"part{i}.json")
        halves[-1].write_text(json.dumps(result))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(once))
    code, merged, err = merge(*halves)
    assert code == 0, err
    assert merged["turns"] == TURNS and merged["turn_sketch"] == once["turn_sketch"]
    for overlapping in ((halves[0], halves[0]), (whole, halves[1]), (halves[1], whole), (*halves, whole)):
        code, _, err = merge(*overlapping)
        assert code == 2 and "overlaps" in err and "both counted the same turns" in err, overlapping


def _caught(rng: random.Random, larger: int, smaller: int, shared: int) -> bool:
    """Whether merge's check refuses two results of ``larger`` and ``smaller`` turns sharing ``shared``."""
    ids = [f"t{rng.getrandbits(64):016x}" for _ in range(larger + smaller - shared)]
    parts = (ids[:larger], ids[:shared] + ids[larger:])
    sketches = []
    for part in parts:
        prints = TurnPrints()
        for turn_id in part:
            prints.add(SimpleNamespace(id=turn_id, in_part=False))  # type: ignore[arg-type]
        sketches.append(SimpleNamespace(sketch=prints.sketch()))
    counted: dict[str, str] = {}
    cli._refuse_overlap(sketches[0], "a.json", counted)
    try:
        cli._refuse_overlap(sketches[1], "b.json", counted)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize(("larger", "smaller", "shared"), [(400, 400, 400), (1000, 200, 200), (400, 400, 200),
                                                           (400, 400, 40), (400, 400, 4), (1000, 1000, 1)])
def test_merge_catches_an_overlap_as_often_as_documented(larger, smaller, shared):
    """docs/calibration.md: about 1 - (1 - f)^64, f the shared turns' share of the larger result."""
    rng = random.Random(larger * 7 + shared)
    trials = 300
    rate = sum(_caught(rng, larger, smaller, shared) for _ in range(trials)) / trials
    documented = 1 - (1 - shared / larger) ** SKETCH
    assert abs(rate - documented) < 0.08 + 3 * (documented * (1 - documented) / trials) ** 0.5
    if shared == smaller:
        assert rate > 0.99
