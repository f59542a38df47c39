"""Rotated Collector files are one stream: a file and its backups, a glob or a directory are read
oldest first through one span assembler, so a turn whose spans straddle a rotation is one turn,
wherever the files are cut and in whatever order they are named."""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chain import require
from collector_lines import collector_lines, run_turns
from turnguard._calibrate import cli
from turnguard._calibrate.inputs import expand_inputs, in_stream_order, missing_backups, read_turns, rotation_of
from turnguard._calibrate.records import InputError

TIMES = ("2026-11-30T23-59-59.999", "2026-12-01T08-00-00.000", "2026-12-01T10-30-00.250")


def backup(name: str, time: str, style: str = "timberjack") -> str:
    """A backup's name as the pinned Collector's file exporter writes it (``timberjack``, reason
    ``size``), or with the reason ``time``, the time after the extension (``after-ext``), or as
    Collectors before v0.130 wrote it (``lumberjack``: no reason)."""
    stem, dot, ext = name.rpartition(".")
    stem, ext = (stem, f".{ext}") if dot else (name, "")
    return {"timberjack": f"{stem}-{time}-size{ext}", "time": f"{stem}-{time}-time{ext}",
            "after-ext": f"{stem}{ext}-{time}-size", "lumberjack": f"{stem}-{time}{ext}"}[style]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """Collector lines of 40 turns of 3 to 60 calls (some halted), a few spans per line, so that
    most turns' spans spread over several lines."""
    rng = random.Random(5)
    specs = []
    for t in range(40):
        n = rng.randint(3, 60)
        repeat = rng.random() < 0.3
        specs.append((f"turn-{t}", [("read", {"p": 1 if repeat and i > 20 else i}, "error" if repeat else "ok")
                                    for i in range(n)]))
    spans = run_turns(specs, soft_cap=10, hard_multiplier=4).spans()
    batches, i = [], 0
    while i < len(spans):
        k = rng.randint(1, 9)
        batches.append(spans[i:i + k])
        i += k
    return collector_lines(batches)


def figures(*arguments: str | Path, jobs: int = 1) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, arguments), "--json", "-", "--jobs", str(jobs), "--soft-caps", "10", "--multipliers",
                     "2,4", "--stuck-repeats", "3", "--no-peers", "--explicit-caps", "20"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    result = json.loads(out.getvalue())
    for key in ("inputs", "replays"):
        result.pop(key)
    return result, err.getvalue()


def write_rotated(folder: Path, lines: list[str], cuts: list[int], name: str = "otlp.jsonl") -> list[Path]:
    """``lines`` cut at ``cuts`` into backups (oldest first) and the live file."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]
    paths = [folder / backup(name, t) for t in TIMES[: len(parts) - 1]] + [folder / name]
    for path, part in zip(paths, parts, strict=True):
        path.write_text("".join(line + "\n" for line in part))
    return paths


@pytest.fixture(scope="module")
def whole(lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("whole") / "all.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    result, err = figures(path)
    assert result["turns"] == 40 and result["problems"] == 0, err
    return result


def test_a_directory_a_glob_and_files_in_any_order_read_a_rotated_set_as_one_stream(lines, whole, tmp_path):
    paths = write_rotated(tmp_path / "otel", lines, [len(lines) // 4, len(lines) // 2, 3 * len(lines) // 4])
    shuffled = [paths[2], paths[3], paths[0], paths[1]]
    for arguments in ([tmp_path / "otel"], [str(tmp_path / "otel" / "otlp*.jsonl")], shuffled):
        result, err = figures(*arguments)
        assert result == whole, arguments
        assert "note:" not in err


@pytest.mark.parametrize("seed", range(6))
def test_a_turn_straddling_any_rotation_is_one_turn(lines, whole, tmp_path, seed):
    """Cut the stream at random lines (a cut in a turn's spans is the usual case): every reading
    gives the figures of the uncut file, serially and with worker processes."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(lines)), rng.randint(1, 3)))
    write_rotated(tmp_path, lines, cuts)
    for jobs in (1, 2):
        result, _ = figures(tmp_path, jobs=jobs)
        assert result == whole, (cuts, jobs)


def test_gzipped_backups_are_part_of_the_stream(lines, whole, tmp_path):
    paths = write_rotated(tmp_path, lines, [len(lines) // 3])
    zipped = paths[0].with_name(paths[0].name + ".gz")
    zipped.write_bytes(gzip.compress(paths[0].read_bytes()))
    paths[0].unlink()
    assert in_stream_order([paths[1], zipped]) == [zipped, paths[1]]
    assert figures(tmp_path)[0] == whole


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_zstd_backup_stops_the_command_with_its_name_rather_than_lose_its_turns(lines, tmp_path, jobs):
    """Python reads gzip, not zstd: read as text its lines would be problems and its turns lost
    with exit 0. The command stops before reading, naming the file to decompress."""
    zstd = require(shutil.which("zstd"), "Debian's zstd")
    paths = write_rotated(tmp_path, lines, [len(lines) // 3])
    subprocess.run([zstd, "-q", "--rm", str(paths[0])], check=True)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([str(tmp_path), "--json", "-", "--jobs", str(jobs)], stdout=out, stderr=err)
    assert code != 0 and out.getvalue() == ""
    assert f"{paths[0]}.zst: compressed with zstd" in err.getvalue() and "Traceback" not in err.getvalue()


def test_the_live_file_alone_is_read_and_the_backups_left_out_are_named(lines, tmp_path):
    paths = write_rotated(tmp_path, lines, [len(lines) // 2])
    result, err = figures(paths[-1])
    assert result["turns"] < 40
    assert f"note: {paths[-1]} has 1 rotated backup(s) beside it that are not read ({paths[0].name})" in err
    assert missing_backups(paths) == {}


def test_rotation_names_sort_in_time_order_the_live_file_last_and_sets_apart(tmp_path):
    names = ["otlp.jsonl", backup("otlp.jsonl", TIMES[2]), "other.jsonl", backup("otlp.jsonl", TIMES[0]),
             backup("other.jsonl", TIMES[1]), backup("otlp.jsonl", TIMES[1]), "turns.jsonl"]
    ordered = [p.name for p in in_stream_order([tmp_path / n for n in names])]
    assert ordered == [*(backup("otlp.jsonl", t) for t in TIMES), "otlp.jsonl", backup("other.jsonl", TIMES[1]),
                       "other.jsonl", "turns.jsonl"]
    assert rotation_of(Path(backup("traces", TIMES[0])))[:2] == ("traces", TIMES[0])
    assert rotation_of(Path("otlp-final.jsonl"))[:2] == ("otlp-final.jsonl", "")


def test_an_argument_that_names_no_file_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    for argument, message in ((tmp_path / "empty", "a directory without input files"),
                              (str(tmp_path / "none*.jsonl"), "no file matches")):
        with pytest.raises(InputError, match=message):
            expand_inputs([argument])
    err = io.StringIO()
    assert cli.main([str(tmp_path / "empty")], stdout=io.StringIO(), stderr=err) == 2
    assert "a directory without input files" in err.getvalue()


def test_a_file_named_twice_is_read_once(lines, whole, tmp_path):
    path = tmp_path / "otlp.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    assert expand_inputs([path, tmp_path, str(tmp_path / "*.jsonl")]) == [path]


def test_read_turns_joins_the_files_it_is_given(lines, tmp_path):
    paths = write_rotated(tmp_path, lines, [len(lines) // 2])
    problems: list = []
    turns = list(read_turns(paths, problems.append))
    assert problems == [] and len(turns) == 40


def test_the_benchmarks_collector_files_read_as_one_stream_of_their_turns(tmp_path):
    """tools/synthetic.py's rotated OTLP set (the speed benchmark's input) holds its turns whole."""
    from synthetic import write_otlp

    turns, calls, files = write_otlp(str(tmp_path), max_calls=6000, file_bytes=1 << 20)
    assert len(files) > 2 and files[-1].endswith("otlp.jsonl")
    result, err = figures(tmp_path)
    assert (result["turns"], result["calls"], result["problems"]) == (turns, calls, 0), err


class Listings:
    """Counts the directory listings made while it is installed (``os.scandir``, ``os.listdir``,
    ``Path.iterdir``, which ``glob`` and ``pathlib`` list through)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for owner, name in ((os, "scandir"), (os, "listdir"), (Path, "iterdir")):
            monkeypatch.setattr(owner, name, self._counted(getattr(owner, name)))

    def _counted(self, function):
        def counted(*args, **kwargs):
            self.count += 1
            return function(*args, **kwargs)
        return counted


CORPUS_LINE = json.dumps({"id": "t", "calls": [{"tool": "read", "args": {"p": 1}, "outcome": "ok"}], "cycles": 1})


def one_line_files(folder: Path, n: int, *, backups: int = 0) -> list[Path]:
    """``n`` one-line corpus files in ``folder`` (and ``backups`` rotated backups of the first)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"turns-{i:05}.jsonl" for i in range(n)]
    paths += [folder / backup(paths[0].name, t) for t in TIMES[:backups]]
    for path in paths:
        path.write_text(CORPUS_LINE + "\n")
    return paths


def listings_of(monkeypatch: pytest.MonkeyPatch, arguments: list[str]) -> int:
    with monkeypatch.context() as patch:
        listings = Listings(patch)
        out, err = io.StringIO(), io.StringIO()
        assert cli.main([*arguments, "--json", "-", "--jobs", "1", "--soft-caps", "10", "--multipliers", "2",
                         "--stuck-repeats", "3", "--no-peers", "--explicit-caps", "20"], stdout=out, stderr=err) == 0
        return listings.count


@pytest.mark.parametrize("named", ["directory", "glob", "each file"])
def test_the_folders_are_listed_a_fixed_number_of_times_whatever_the_number_of_files(tmp_path, monkeypatch, named):
    """Reading a folder of n files (given as the folder, a glob or each file by name, with or
    without backups beside one) lists each folder a fixed number of times, not once per file:
    3,000 one-line files took 53 s when the backups were looked for by listing the folder again
    for every file."""
    counts = []
    for n in (20, 80):
        folder = tmp_path / f"n{n}"
        paths = one_line_files(folder, n, backups=2)
        arguments = {"directory": [str(folder)], "glob": [str(folder / "turns-*.jsonl")],
                     "each file": [str(p) for p in paths if not rotation_of(p)[1]]}[named]
        counts.append(listings_of(monkeypatch, arguments))
    assert counts[0] == counts[1] <= 3, counts


def test_files_in_several_folders_list_each_folder_a_fixed_number_of_times(tmp_path, monkeypatch):
    counts = []
    for folders in (2, 6):
        paths = [p for k in range(folders) for p in one_line_files(tmp_path / f"{folders}" / f"f{k}", 10)]
        counts.append(listings_of(monkeypatch, [str(p) for p in paths]))
    assert counts[1] <= 3 * counts[0], counts
    assert counts[1] <= 2 * 6, counts


def test_missing_backups_lists_a_folder_once_for_all_its_files(tmp_path, monkeypatch):
    paths = one_line_files(tmp_path, 50, backups=3)
    live = [p for p in paths if not rotation_of(p)[1]]
    with monkeypatch.context() as patch:
        listings = Listings(patch)
        missing = missing_backups(live)
    assert listings.count == 1
    assert missing == {live[0]: sorted(paths[50:], key=lambda p: rotation_of(p).time)}
    assert missing_backups(paths) == {}


# -- rotated sets as the pinned Collector names them, given in any order and any directories ---------


@pytest.mark.parametrize(("name", "live", "time"), [
    ("otlp-2026-12-04T19-36-19.852-size.jsonl", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("otlp-2026-12-04T19-36-19.852-time.jsonl", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("otlp-2026-12-04T19-36-19.852-size.jsonl.gz", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("otlp-2026-12-04T19-36-19.852-size.jsonl.zst", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("otlp.jsonl-2026-12-04T19-36-19.852-size", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("otlp.jsonl-2026-12-04T19-36-19.852-size.gz", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("otlp-2026-12-04T19-36-19.852.jsonl", "otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("my-otlp-2026-12-04T19-36-19.852-size.jsonl", "my-otlp.jsonl", "2026-12-04T19-36-19.852"),
    ("traces-2026-12-04T19-36-19.852-size", "traces", "2026-12-04T19-36-19.852"),
    ("otlp.jsonl", "otlp.jsonl", ""),
    ("otlp-final.jsonl", "otlp-final.jsonl", ""),
    ("turns-2026-12-04.jsonl", "turns-2026-12-04.jsonl", ""),
])
def test_a_backups_name_gives_its_live_file_and_rotation_time_in_every_form_the_exporter_writes(name, live, time):
    assert rotation_of(Path(name)) == (live, time, True)


STYLES = ("timberjack", "time", "after-ext", "lumberjack")


@pytest.mark.parametrize("style", STYLES)
def test_every_order_of_a_rotated_sets_files_and_folders_reads_oldest_backup_first_live_file_last(tmp_path, style):
    """Backups in the folder of the live file and in an archive folder, named as files, as their
    folders or both, in every order: the stream is always the backups by time, then the live file."""
    live_dir, archive = tmp_path / "live", tmp_path / "archive"
    live_dir.mkdir(), archive.mkdir()
    names = [backup("otlp.jsonl", t, style) for t in TIMES]
    expected = [archive / names[0], archive / names[1], live_dir / names[2], live_dir / "otlp.jsonl"]
    for path in expected:
        path.write_text("{}\n")
    for order in itertools.permutations(expected):
        assert expand_inputs(list(order)) == expected, order
    arguments = [live_dir, archive, *expected[1:3]]
    for order in itertools.permutations(arguments):
        assert [p.resolve() for p in expand_inputs(list(order))] == [p.resolve() for p in expected], order


def test_two_collectors_files_of_one_name_are_two_streams_each_in_its_own_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    sets = {}
    for folder, times in ((a, TIMES[:2]), (b, TIMES[1:])):
        folder.mkdir()
        sets[folder] = [folder / backup("otlp.jsonl", t) for t in times] + [folder / "otlp.jsonl"]
        for path in sets[folder]:
            path.write_text("{}\n")
    for order in itertools.permutations([*sets[a], *sets[b]]):
        read = expand_inputs(list(order))
        assert [p for p in read if p.parent == a] == sets[a] and [p for p in read if p.parent == b] == sets[b]


def test_a_backup_that_cannot_be_placed_in_time_is_named(tmp_path):
    """A backup's name with no date in it, or a backup beside none of several live files of its
    name, is refused with its name, not read at a guessed place."""
    undated = tmp_path / "otlp-2026-13-41T25-00-00.000-size.jsonl"
    undated.write_text("{}\n")
    (tmp_path / "otlp.jsonl").write_text("{}\n")
    with pytest.raises(InputError, match=f"{undated}: cannot place this file in time: .* is no date"):
        expand_inputs([tmp_path])
    undated.unlink()
    for folder in ("a", "b", "archive"):
        (tmp_path / folder).mkdir()
    for live in (tmp_path / "a" / "otlp.jsonl", tmp_path / "b" / "otlp.jsonl"):
        live.write_text("{}\n")
    orphan = tmp_path / "archive" / backup("otlp.jsonl", TIMES[0])
    orphan.write_text("{}\n")
    with pytest.raises(InputError, match=f"{orphan}: cannot place this file in time: .* beside none of them"):
        expand_inputs([tmp_path / "a", tmp_path / "b", orphan])
    err = io.StringIO()
    assert cli.main([str(tmp_path / "a"), str(tmp_path / "b"), str(orphan)], stdout=io.StringIO(), stderr=err) == 2
    assert "cannot place this file in time" in err.getvalue()


@pytest.mark.parametrize("style", STYLES)
def test_a_rotated_set_named_as_the_collector_names_it_reads_as_the_uncut_file_in_any_order(lines, whole, tmp_path,
                                                                                          style, monkeypatch):
    """The figures of the uncut file, whatever order the files are named in (the live file first
    once split two turns at a rotation when the backups' names carried a reason)."""
    monkeypatch.setattr(sys.modules[__name__], "backup", functools.partial(backup, style=style))
    paths = write_rotated(tmp_path / "otel", lines, [len(lines) // 4, len(lines) // 2, 3 * len(lines) // 4])
    for order in ([paths[3], paths[1], paths[0], paths[2]], [paths[2], paths[0], paths[3], paths[1]],
                  [paths[3], tmp_path / "otel"]):
        result, err = figures(*order)
        assert result == whole, (style, order)
        assert "note:" not in err
