"""``turnguard calibrate`` end to end, through the ``turnguard`` command: the table, --json,
--strict, the merge command, bad flags."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED_CORPUS, corpus_files
from synthetic import SMALL, write_corpus
from turnguard._cli import main

CORPUS = SHARED_CORPUS
SMALL_GRID = ["--soft-caps", "5,20", "--multipliers", "2,10", "--stuck-repeats", "3"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "turns.jsonl"
    write_corpus(str(path), count=80, seed=3, mix=SMALL)
    return path


def test_table_marks_the_default_and_shows_each_policy(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(corpus), *SMALL_GRID, "--wide"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("80 turns, ")
    rows = [line for line in out.splitlines() if line.startswith(("* ", "  S=", "  peer", "  explicit"))]
    assert rows[0].startswith("* default ")
    assert any(r.startswith("  peer: halt at 5 identical calls") for r in rows)
    assert any(r.startswith("  S=5 x2 D=3") for r in rows)


def test_the_table_comes_right_after_the_summary_and_its_legend_after_it(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", str(corpus), *SMALL_GRID, "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    assert lines[header - 1] == "" and lines[0].startswith("80 turns, ")
    assert all(not line.startswith("halted: ") for line in lines[:header])
    legend = next(i for i, line in enumerate(lines) if line.startswith("halted: turns halted unattended"))
    last_row = max(i for i, line in enumerate(lines) if line.startswith("* default "))
    assert legend > last_row


def test_json_result_and_the_merge_command_agree_with_one_run(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = corpus.read_text().splitlines(keepends=True)
    part1, part2 = tmp_path / "p1.jsonl", tmp_path / "p2.jsonl"
    part1.write_text("".join(lines[:30]))
    part2.write_text("".join(lines[30:]))
    for src, out in ((corpus, "whole.json"), (part1, "r1.json"), (part2, "r2.json")):
        assert main(["calibrate", str(src), *SMALL_GRID, "--json", str(tmp_path / out)]) == 0
    assert main(["calibrate", "merge", str(tmp_path / "r1.json"), str(tmp_path / "r2.json"),
                 "--json", str(tmp_path / "merged.json")]) == 0
    capsys.readouterr()
    assert main(["calibrate-merge", str(tmp_path / "r1.json"), str(tmp_path / "r2.json"), "--json", "-"]) == 0
    printed = json.loads(capsys.readouterr().out)
    whole = json.loads((tmp_path / "whole.json").read_text())
    merged = json.loads((tmp_path / "merged.json").read_text())
    for data in (whole, merged, printed):
        data.pop("replays"), data.pop("inputs")
    assert merged == whole == printed


def test_strict_exits_1_on_a_bad_line_and_lenient_counts_it(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(corpus.read_text() + '{"calls": "nope"}\n')
    assert main(["calibrate", str(bad), *SMALL_GRID, "--strict"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:81: 'calls' is missing or not a list" in err
    assert main(["calibrate", str(bad), *SMALL_GRID]) == 0
    captured = capsys.readouterr()
    assert "1 input problems" in " ".join(captured.out.split()) and f"{bad}:81:" in captured.err


@pytest.mark.parametrize("argv", [["--soft-caps", "x"], ["--streaks", "9:3"], ["--key-modes", "sha1"],
                                  ["--stateful-tools", ";"], ["--stateful-tools", "a;;b"]])
def test_bad_grid_flags_exit_2(corpus: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", str(corpus), *argv])
    assert exc.value.code == 2


def test_missing_file_and_bad_merge_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "nope.jsonl")]) == 2
    (tmp_path / "x.json").write_text('{"format": "something else"}')
    assert main(["calibrate", "merge", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "not a turnguard calibrate --json result" in err
    assert f"{tmp_path / 'nope.jsonl'}: cannot open: " in err  # the file named, not a bare OSError


def test_console_script_on_the_shared_corpus_without_a_terminal_draws_no_progress(tmp_path: Path) -> None:
    files = corpus_files()
    done = subprocess.run([sys.executable, "-m", "turnguard._cli", "calibrate", *map(str, files)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "648 turns, 10,449 tool calls" in done.stdout
    assert "calibrate [" not in done.stderr and done.stderr == ""


# -- hostile input and bad outputs ------------------------------------------------------------------

GOOD = json.dumps({"id": "good", "calls": [{"tool": "read", "args": {"p": 1}, "outcome": "ok"}], "cycles": 1})
GOOD_TOO = GOOD.replace('"good"', '"good-too"')
"""Another turn (one id read twice is one turn)."""


def run_cli(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``turnguard ARGV`` in a fresh interpreter (a RecursionError or a crash cannot hide in the
    test's own stack); the timeout only keeps a hang from stalling the suite."""
    return subprocess.run([sys.executable, "-m", "turnguard._cli", *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


NO_TURN_INPUTS = {
    "empty": b"",
    "blank lines": b"\n  \n\t\n",
    "binary": bytes(range(256)) * 40,
    "every line bad": b'{"calls": "x"}\n{not json\nnull\n[1]\n',
    "nulls": b"null\nnull\n",
    "gzip of nothing": gzip.compress(b""),
    "nested too deep": ("[" * 50_000 + "]" * 50_000 + "\n").encode(),
}


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("kind", list(NO_TURN_INPUTS))
def test_input_without_a_single_readable_turn_says_so_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, jobs: str
) -> None:
    path = tmp_path / "input.jsonl"
    path.write_bytes(NO_TURN_INPUTS[kind])
    assert main(["calibrate", str(path), *SMALL_GRID, "--jobs", jobs, "--json", str(tmp_path / "r.json")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"no turn could be read from {path}" in captured.err
    assert not (tmp_path / "r.json").exists()  # nothing written, no empty file left by the output check


def skipped_lines() -> list[str]:
    """One of every kind of line the reader skips."""
    return [
        "null", "17", '"text"', "[]", "true", "{not json", '{"calls": 5}', "\udcff".encode("utf-8", "surrogatepass")
        .decode("latin-1"), '{"calls": [], "cycles": ' + "1" + "0" * 30 + "}",
        '{"calls": [{"tool": "t", "args": 1, "cycle": -3}]}', '{"calls": [], "cycles": true}',
        '{"calls": [{"tool": "t", "args": ' + "[" * 20_000 + "]" * 20_000 + "}]}",
        '{"resourceSpans": 5}', '"resourceSpans"', '{"id": "long", "calls": [' + " " * 70_000 + "]}",
    ]


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("strict", [False, True])
def test_every_skipped_line_is_counted_never_a_traceback_with_or_without_strict(
    tmp_path: Path, jobs: str, strict: bool
) -> None:
    bad = skipped_lines()
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([GOOD, *bad, GOOD_TOO]) + "\n", encoding="latin-1")
    result = tmp_path / "r.json"
    done = run_cli("calibrate", str(path), *SMALL_GRID, "--jobs", jobs, "--max-line-bytes", "65536",
                   "--json", str(result), *(["--strict"] if strict else []))
    assert "Traceback" not in done.stderr and "Error" not in done.stderr.replace("InputError", "")
    if strict:
        assert done.returncode == 1 and "(--strict)" in done.stderr  # at the first bad line a worker met
        return
    assert done.returncode == 0, done.stderr
    stats = json.loads(result.read_text())
    assert (stats["turns"], stats["problems"]) == (2, len(bad))
    reported = [line for line in done.stderr.splitlines() if line.startswith(f"turnguard calibrate: {path}:")]
    assert sorted(int(line.split(":")[2]) for line in reported) == list(range(2, len(bad) + 2))


def test_a_200_mb_line_is_skipped_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.write(GOOD.encode() + b"\n" + b'{"calls": [' + b" " * (200 << 20) + b"]}\n" + GOOD_TOO.encode() + b"\n")
    probe = ("import resource, sys; from turnguard._cli import main; status = main(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr); sys.exit(status)")
    runs = {}
    for name, file in (("small", tmp_path / "small.jsonl"), ("huge", path)):
        if name == "small":
            file.write_text(GOOD + "\n")
        done = subprocess.run([sys.executable, "-c", probe, "calibrate", str(file), *SMALL_GRID, "--json", "-"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        runs[name] = (json.loads(done.stdout), int(done.stderr.splitlines()[-1]))
    (huge, huge_rss), (_, small_rss) = runs["huge"], runs["small"]
    assert (huge["turns"], huge["problems"]) == (2, 1)
    from turnguard._calibrate.records import MAX_LINE_BYTES

    assert huge_rss - small_rss < 3 * MAX_LINE_BYTES  # not the 200 MB line (x4 when it was parsed)


@pytest.mark.parametrize("flag", ["--json", "--html"])
@pytest.mark.parametrize("target", ["missing-folder/out", "a-folder", "/proc/version"])
def test_an_output_that_cannot_be_written_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, target: str
) -> None:
    (tmp_path / "a-folder").mkdir()
    path = tmp_path / "turns.jsonl"
    path.write_text(GOOD + "\n{bad line\n")
    out = target if target.startswith("/") else str(tmp_path / target)
    assert main(["calibrate", str(path), *SMALL_GRID, flag, out]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {out}: " in err
    assert "bad line" not in err and f"{path}:2" not in err  # the input was not even read
    result = tmp_path / "r.json"
    assert main(["calibrate", str(path), *SMALL_GRID, "--json", str(result)]) == 0
    assert main(["calibrate", "merge", str(result), flag, out]) == 2
    assert f"cannot write {out}: " in capsys.readouterr().err


def test_the_output_check_keeps_an_existing_file_until_the_new_one_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, result = tmp_path / "turns.jsonl", tmp_path / "r.json"
    result.write_text("previous")
    path.write_text("{bad\n")
    assert main(["calibrate", str(path), *SMALL_GRID, "--json", str(result)]) == 1
    assert result.read_text() == "previous"
    path.write_text(GOOD + "\n")
    assert main(["calibrate", str(path), *SMALL_GRID, "--json", str(result)]) == 0
    assert json.loads(result.read_text())["turns"] == 1


@pytest.mark.parametrize("argv", [
    ["--jobs", "-1"], ["--jobs", "100000"], ["--jobs", "two"], ["--jobs", "1.5"],
    ["--max-line-bytes", "0"], ["--max-line-bytes", "1" + "0" * 30], ["--max-line-bytes", "-5"],
    ["--soft-caps", "1" + "0" * 30], ["--soft-caps", "1" * 5000], ["--explicit-caps", "1" + "0" * 30],
    ["--cycle-caps", "1" + "0" * 30], ["--streaks", "1" + "0" * 30 + ":" + "1" + "0" * 30],
    ["--cycle-repeats", "1" + "0" * 30],
    ["--multipliers", "1e308"], ["--multipliers", "inf"], ["--multipliers", "nan"], ["--stuck-repeats", "-3"],
    ["--soft-caps", ",".join(map(str, range(1, 80))), "--multipliers", ",".join(map(str, range(1, 30))), "--cross"],
])
def test_a_flag_that_sizes_the_work_out_of_range_is_a_usage_error(
    corpus: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    try:
        status = main(["calibrate", str(corpus), *argv])
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "expected" in err


def test_the_default_row_is_the_configuration_turnguard_config_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "turns.jsonl"
    path.write_text(GOOD + "\n")
    monkeypatch.chdir(tmp_path)

    def default_row() -> dict:
        assert main(["calibrate", str(path), *SMALL_GRID, "--json", "-"]) == 0
        policies = json.loads(capsys.readouterr().out)["policies"]
        return next(p["params"] for p in policies if p["default"])

    assert default_row()["soft_cap"] == 100
    (tmp_path / "turnguard.toml").write_text("soft_cap = 70\nstuck_repeat_threshold = 4\n")
    assert (default_row()["soft_cap"], default_row()["stuck_repeat"]) == (70, 4)
    monkeypatch.setenv("TURNGUARD_SOFT_CAP", "80")
    assert default_row()["soft_cap"] == 80
    other = tmp_path / "other.toml"
    other.write_text("soft_cap = 90\n")
    assert main(["calibrate", str(path), *SMALL_GRID, "--config", str(other), "--json", "-"]) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    assert next(p["params"] for p in policies if p["default"])["soft_cap"] == 80  # the variable still wins


def test_the_recorders_result_digests_are_replayed_for_the_stateful_tools_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A live guard listing ``ci_status`` records its results; calibrate tries the recommended
    profile with no tool listed and with it listed: the moving CI run is halted only without."""
    import turnguard as tg

    recorded = tmp_path / "turns.jsonl"
    live = tg.Guard(tg.GuardConfig(stateful_tools=("ci_status",), recorder_path=str(recorded),
                                   disable_plugins=("otel", "shadow"), load_entrypoints=False), environ={})
    for answers in ([f"running {i // 3}" for i in range(30)], ["running"] * 30):
        with live.turn() as turn:
            for answer in answers:
                call = tg.ToolCall("ci_status", {"run": 42})
                turn.check_call(call)
                turn.record_outcome(call, "ok", result=answer)
    lines = [json.loads(line) for line in recorded.read_text().splitlines()]
    assert all(len(c["result"]) == 16 for line in lines for c in line["calls"])  # digests, never the text
    (tmp_path / "turnguard.toml").write_text('stuck_signal = "stale_repeat"\nstreak_stop_on = "any"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", str(recorded), "--soft-caps", "100", "--multipliers", "10", "--stuck-repeats", "6",
                 "--streaks", "5:8", "--explicit-caps", "0", "--stuck-signals", "stale_repeat", "--streak-stop-on",
                 "any", "--key-modes", "canonical", "--no-peers", "--stateful-tools", "none;ci_status",
                 "--json", "-"]) == 0
    policies = {p["name"]: p for p in json.loads(capsys.readouterr().out)["policies"]}
    assert policies["default"]["unattended"]["halted"] == 2
    assert policies["stateful ci_status"]["unattended"]["halted"] == 1
    assert policies["stateful ci_status"]["params"]["stateful_tools"] == ["ci_status"]


def test_calibrates_own_entry_points_refuse_an_empty_path_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from turnguard._calibrate import cli as calibrate
    from turnguard._terminal import PathArgument

    path, result = tmp_path / "turns.jsonl", tmp_path / "r.json"
    path.write_text(GOOD + "\n")
    assert main(["calibrate", str(path), *SMALL_GRID, "--json", str(result)]) == 0
    merge = argparse.ArgumentParser(prog="turnguard calibrate merge")
    calibrate.add_merge_arguments(merge)
    entries = ((calibrate.main, calibrate.build_parser(), str(path)), (calibrate.merge_main, merge, str(result)))
    capsys.readouterr()
    for entry, parser, given in entries:
        options = [a for a in parser._actions if isinstance(a.type, PathArgument)]
        assert options
        for action in options:
            argv = [given, action.option_strings[-1], ""] if action.option_strings else [given, ""]
            assert entry(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(f"{parser.prog}: {action.type.option}: an empty path")
    assert sorted(tmp_path.iterdir()) == [result, path]


@pytest.mark.parametrize("flag", ["json", "html"])
def test_the_output_check_refuses_an_empty_path_given_in_code(flag: str) -> None:
    from turnguard._calibrate.cli import outputs_problem

    assert (outputs_problem(**{flag: ""}) or "").startswith("cannot write : ")
