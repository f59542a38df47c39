"""Running over files: worker processes agree with one process, --strict stops, memory does not
grow with the number of turns, and the progress bar appears on a terminal only."""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import queue
import random
import threading
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from synthetic import SMALL, records, write_corpus, write_otlp
from turnguard._calibrate import parallel
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.parallel import AHEAD, TAIL_SPLIT, plan
from turnguard._calibrate.records import InputProblem
from turnguard._calibrate.run import Progress, StrictError, calibrate
from turnguard.telemetry import _names as names

POLICIES = build_grid(GridSpec(soft_caps=(5, 20), stuck_repeats=(3, 6), explicit_caps=(15,)))


@pytest.fixture
def mixed_input(tmp_path: Path) -> list[Path]:
    corpus = tmp_path / "a.jsonl"
    lines = [json.dumps(r) for r in records(400, seed=4, mix=SMALL)]
    lines.insert(100, "{broken")
    corpus.write_text("\n".join(lines) + "\n")
    attrs = lambda d: [{"key": k, "value": {"stringValue": v} if isinstance(v, str) else {"intValue": str(v)}}  # noqa: E731
                       for k, v in d.items()]
    spans = [{"spanId": f"c{i}", "parentSpanId": "t0", "name": "execute_tool read",
              "attributes": attrs({names.GEN_AI_TOOL_NAME: "read", names.CALL_INDEX: i,
                                   names.CALL_KEY_DIGEST: "same", names.CALL_OUTCOME: "error"})}
             for i in range(1, 12)]
    spans.append({"spanId": "t0", "name": "invoke_agent a", "attributes": attrs({names.TURN_ID: "otlp-turn"})})
    otlp = tmp_path / "b.json"
    otlp.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")
    return [corpus, otlp]


def test_worker_processes_give_the_figures_of_one_process(mixed_input: list[Path]) -> None:
    results = []
    for jobs in (1, 2):
        problems: list[InputProblem] = []
        stats = calibrate(mixed_input, POLICIES, on_problem=problems.append, jobs=jobs).to_json()
        stats.pop("replays")
        results.append((stats, [str(p) for p in problems]))
    assert results[0] == results[1]
    stats, problems = results[0]
    assert stats["turns"] == 401 and stats["problems"] == 1
    assert problems == [f"{mixed_input[0]}:101: not JSON: Expecting property name enclosed in double quotes: "
                        "line 1 column 2 (char 1)"]


@pytest.mark.parametrize("seed", range(8))
def test_the_plan_reads_every_byte_once_in_stream_order_and_finer_at_the_end(tmp_path: Path, seed: int) -> None:
    """Whatever the files' sizes, the ranges and jobs: every byte of every plain file is in one
    range, in order; gzip files are whole; the stream's last ``jobs`` ranges' bytes (up to a gzip
    file) are in ranges cut ``TAIL_SPLIT`` times finer, so that the workers finish together."""
    rng = random.Random(seed)
    range_bytes, jobs = rng.choice((7, 100, 4096)), rng.choice((1, 2, 3))
    paths, sizes = [], []
    for i in range(rng.randint(1, 4)):
        path = tmp_path / f"f{i}"
        if rng.random() < 0.2:
            path.write_bytes(gzip.compress(b"x" * rng.randint(0, 5000)))
        else:
            path.write_bytes(b"x" * rng.choice((0, 1, range_bytes, rng.randint(1, 20 * range_bytes))))
        paths.append(path)
        sizes.append(path.stat().st_size)
    tasks = plan(paths, sizes, range_bytes, jobs)
    for path, size in zip(paths, sizes, strict=True):
        mine = [(kind, start, end) for kind, label, start, end in tasks if label == str(path)]
        if path.read_bytes()[:2] == b"\x1f\x8b":
            assert mine == [("file", 0, size)]
        else:
            assert [start for _, start, _ in mine] == [0, *(end for _, _, end in mine[:-1])][:len(mine)]
            assert (mine[-1][2] if mine else 0) == size and all(start < end for _, start, end in mine)
    assert [label for _, label, _, _ in tasks] == sorted((t[1] for t in tasks), key=lambda p: paths.index(Path(p)))
    finer, left = max(1, range_bytes // TAIL_SPLIT), jobs * range_bytes if jobs > 1 else 0
    for kind, _, start, end in reversed(tasks):
        if kind == "file" or left <= 0:
            break
        assert end - start <= finer
        left -= end - start
    assert all(end - start <= range_bytes for kind, _, start, end in tasks if kind == "range")


class ThreadWorkers:
    """``parallel.Workers`` with threads running the real ``serve`` loop, counting the ranges each
    worker holds: from the read sent until the range's figures are back (or it is dropped)."""

    def __init__(self, jobs: int, setup: parallel.Setup) -> None:
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.inboxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(jobs)]
        self.load = [0] * jobs
        self.holding, self.most, self.joins = [0] * jobs, 0, {}
        self.threads = [threading.Thread(target=parallel.serve, args=(inbox, _Tagged(self.outbox, w), setup),
                                         daemon=True) for w, inbox in enumerate(self.inboxes)]
        for thread in self.threads:
            thread.start()
        HELD.append(self)

    def send(self, worker: int, command: tuple[Any, ...]) -> None:
        if command[0] == "read":
            self.holding[worker] += 1
            self.most = max(self.most, self.holding[worker])
        elif command[0] == "drop":
            self.holding[worker] -= 1
        elif command[0] == "join":
            self.joins[command[2]] = worker
        self.inboxes[worker].put(command)

    idlest = parallel.Workers.idlest

    def answer(self) -> tuple[Any, ...]:
        worker, message = self.outbox.get(timeout=60)
        assert message[0] != "failed", message[2]
        if (message[0] == "read" and message[4] is not None) or (message[0] == "replayed" and
                                                                  self.joins.pop(message[1], None) is not None):
            self.holding[worker] -= 1
        return message

    def close(self, *, wait: bool) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=60)


class _Tagged:
    def __init__(self, box: queue.Queue[Any], worker: int) -> None:
        self.box, self.worker = box, worker

    def put(self, message: Any) -> None:
        self.box.put((self.worker, message))


HELD: list[ThreadWorkers] = []


def test_a_worker_holds_at_most_ahead_ranges_until_their_figures_are_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory bound of ``--jobs``: a range's turns stay in its worker from its reading until
    its replay is done, and no worker is ever given more than ``AHEAD`` of them at once, however
    the worker orders its commands; the figures are those of one process."""
    paths = write_otlp(str(tmp_path), max_calls=12_000, mix=SMALL, file_bytes=3 << 20)[2]
    expected = calibrate(paths, POLICIES, on_problem=lambda p: None, jobs=1).to_json()
    monkeypatch.setattr("turnguard._calibrate.run.RANGE_BYTES", 20_000)
    monkeypatch.setattr(parallel, "Workers", ThreadWorkers)
    HELD.clear()
    got = calibrate(paths, POLICIES, on_problem=lambda p: None, jobs=2).to_json()
    for figures in (expected, got):
        figures.pop("replays")
    assert got == expected
    [workers] = HELD
    assert workers.most == AHEAD and workers.holding == [0, 0] and not workers.joins


def test_a_worker_reads_before_it_replays_and_keeps_every_other_order() -> None:
    """A read goes before the replays (joins, turns, drops) waiting ahead of it, since the stream's
    joins wait on reads; it never goes before the results it needs, a scan or the end, and the
    rest keep the order they were sent in."""
    inbox: queue.Queue[Any] = queue.Queue()
    sent = [("scan", 0), ("results", 1), ("join", 2), ("turns", 3), ("read", 4), ("drop", 5), ("read", 6),
            ("results", 7), ("read", 8), ("join", 9), None, ("read", 10)]
    for command in sent:
        inbox.put(command)
    backlog: deque[Any] = deque()
    taken = []
    while (command := parallel.next_command(inbox, backlog)) is not None:
        taken.append(command[1])
    assert taken == [0, 1, 4, 6, 2, 3, 5, 7, 8, 9]
    assert list(backlog) == [("read", 10)]


def serial_and_in_ranges(path: Path, monkeypatch: pytest.MonkeyPatch, **options: int) -> list[tuple[dict, list]]:
    """(figures, problems) of one process, then of two workers reading ranges of 997 bytes."""
    monkeypatch.setattr("turnguard._calibrate.run.RANGE_BYTES", 997)
    results = []
    for jobs in (1, 2):
        problems: list[InputProblem] = []
        stats = calibrate([path], POLICIES, on_problem=problems.append, jobs=jobs, **options).to_json()
        stats.pop("replays")
        results.append((stats, problems))
    return results


def test_byte_ranges_read_by_workers_keep_every_line_and_its_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut a file into ranges that split lines anywhere: no line lost or read twice, problems
    and id-less turns still carry their true line numbers."""
    lines = [json.dumps({k: v for k, v in r.items() if k != "id"}) for r in records(120, seed=6, mix=SMALL)]
    lines[37] = "{broken"
    lines.insert(90, "")
    path = tmp_path / "plain.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results = [(stats, sorted(map(str, problems))) for stats, problems in serial_and_in_ranges(path, monkeypatch)]
    assert results[0] == results[1]
    assert results[0][0]["turns"] == 119
    assert results[0][1] == [f"{path}:38: not JSON: Expecting property name enclosed in double quotes: "
                             "line 1 column 2 (char 1)"]
    ids = {i for p in results[0][0]["policies"] for i in p["unattended"]["resolved_ids"]}
    assert ids and all(i.startswith(f"{path}:") for i in ids)


@pytest.mark.parametrize("long_at", [0, 40, 119])
def test_a_line_longer_than_the_limit_and_many_ranges_is_one_problem_whoever_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_at: int
) -> None:
    """A line spanning many byte ranges is skipped once, by the range it starts in; the ranges
    inside it stop at their own end instead of each reading the rest of the line."""
    lines = [json.dumps(r) for r in records(120, seed=2, mix=SMALL)]
    lines[long_at] = '{"calls": [' + " " * 50_000 + "]}"
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results = [(stats, [(p.line, "longer than the limit" in p.message) for p in problems])
               for stats, problems in serial_and_in_ranges(path, monkeypatch, max_line_bytes=45_000)]
    assert results[0] == results[1]
    assert results[0][0]["turns"] == 119
    assert results[0][1] == [(long_at + 1, True)]


def test_a_range_inside_a_long_line_reads_no_further_than_its_own_end(tmp_path: Path) -> None:
    from turnguard._calibrate import parallel

    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"calls": [' + b" " * 5_000_000 + b"]}\n")
    read = [0]

    class Counting(io.FileIO):
        def readline(self, size: int = -1) -> bytes:
            line = super().readline(size)
            read[0] += len(line)
            return line

    problems: list[InputProblem] = []
    with Counting(str(path), "r") as f:
        lines = list(parallel.range_lines(f, 1_000_000, 1_002_000, 2, str(path), problems.append, 10_000_000))
    assert (lines, problems) == ([], [])
    assert read[0] <= 2_001  # not the 4 MB left of the line


@pytest.mark.parametrize("jobs", [1, 2])
def test_strict_stops_at_the_first_problem(mixed_input: list[Path], jobs: int) -> None:
    with pytest.raises(StrictError, match=r"a\.jsonl:101: not JSON"):
        calibrate(mixed_input, POLICIES, on_problem=lambda p: None, strict=True, jobs=jobs)


def _peak(path: Path) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        calibrate([path], POLICIES, on_problem=lambda p: None)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_number_of_turns(tmp_path: Path) -> None:
    """The same turns 3 times and 15 times: every histogram holds the same keys after the first
    pass (no resolved turns, so no false-positive ids either); only the count of turns differs."""
    block = [json.dumps({**r, "resolved": False}) for r in records(50, seed=9, mix=SMALL)]
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    small.write_text("\n".join(block * 3) + "\n")
    large.write_text("\n".join(block * 15) + "\n")
    _peak(small)  # warm caches (imports, compiled policies) before measuring
    peak_small, peak_large = _peak(small), _peak(large)
    # Five times the turns; what a turn leaves behind (a few kB each) would be megabytes here. The
    # margin covers what the garbage collector has not yet freed when the peak is taken.
    assert peak_large < peak_small * 1.6, (peak_small, peak_large)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_is_drawn_on_a_terminal_only(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    write_corpus(str(path), count=60, mix=SMALL)
    size = os.path.getsize(path)
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        calibrate([path], POLICIES, on_problem=lambda p: None, progress=Progress(size, stream, delay=0, interval=0))
    assert "calibrate: " in terminal.getvalue() and "100%" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")
    assert pipe.getvalue() == ""


def test_a_real_pty_counts_as_a_terminal() -> None:
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as stream:
            assert Progress(1, stream).enabled
        assert not Progress(1, io.StringIO()).enabled
    finally:
        os.close(master)
        os.close(slave)
