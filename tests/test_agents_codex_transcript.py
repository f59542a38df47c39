"""A Codex call's outcome is read from its ``item_completed`` record in the session's transcript
however large the record is (a long command, output JSON-escaped) and however far back it lies, up to
``codex.TRANSCRIPT_LIMIT``: the transcript is read from its end back, ``TRANSCRIPT_CHUNK`` at a
time, so a record split across chunk edges, or longer than many chunks, is read whole. A record
past the limit, or a damaged one, is an unknown outcome; a loop of large failing calls stops at the
streak as small ones do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_events import Session, is_allow, outcome_halts
from turnguard.agents import codex

STOP_AT = 8
CHUNK = codex.TRANSCRIPT_CHUNK
LIMIT = codex.TRANSCRIPT_LIMIT
OLD_TAIL = 512 * 1024
"""How much of the transcript's end the hook once read: a larger record was not found."""


def record(call_id: str, *, exit_code: int | None = 1, status: str = "failed", output: str = "") -> bytes:
    """Codex's ``item_completed`` record of a shell call, as Codex 0.169.0 writes it (one line)."""
    item: dict[str, Any] = {
        "type": "CommandExecution", "id": call_id, "process_id": "58200",
        "command": ["/bin/bash", "-lc", "make test"], "cwd": "file:///project",
        "parsed_cmd": [{"type": "unknown", "cmd": "make test"}], "source": "unified_exec_startup",
        "status": status, "aggregated_output": output}
    if exit_code is not None:
        item["exit_code"] = exit_code
    item["duration"] = {"secs": 0, "nanos": 4939}
    line = {"timestamp": "2026-12-07T02:23:49.325Z", "ordinal": 11, "type": "event_msg", "payload": {
        "type": "item_completed", "thread_id": "01a24e50-81fe-7341-a9eb-db62978c4b82",
        "turn_id": "01a24e50-8238-7e93-84eb-391215a0f4b7", "item": item,
        "started_at_ms": 1796610229324, "completed_at_ms": 1796610229325}}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def record_of_size(call_id: str, size: int, exit_code: int = 1) -> bytes:
    """The call's record, newline included, exactly ``size`` bytes long."""
    bare = len(record(call_id, exit_code=exit_code))
    line = record(call_id, exit_code=exit_code, output="x" * (size - bare))
    assert len(line) == size
    return line


def function_call(call_id: str) -> bytes:
    """The model's call as Codex records it before running it."""
    line = {"timestamp": "2026-12-07T02:23:49.061Z", "ordinal": 9, "type": "response_item", "payload": {
        "type": "function_call", "status": "completed", "id": "fc_0002", "name": "exec_command",
        "arguments": json.dumps({"cmd": "make test"}), "call_id": call_id}}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def call_output(call_id: str, size: int = 100) -> bytes:
    """The output the model gets, written after the call's record."""
    line = {"timestamp": "2026-12-07T02:23:49.580Z", "ordinal": 12, "type": "response_item", "payload": {
        "type": "function_call_output", "id": "fco_1", "call_id": call_id,
        "output": "Process exited with code 1\nOutput:\n" + "y" * size}}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def outcome(path: Path, call_id: str) -> str:
    return codex.outcome_from_transcript(str(path), call_id, tries=(0.0,))


SIZES = [1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 17, OLD_TAIL - 1, OLD_TAIL, OLD_TAIL + 1,
         5 * 1024 * 1024, LIMIT - 3 * CHUNK, LIMIT - 2 * CHUNK]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("after", [0, 1, CHUNK // 2, CHUNK - 1, CHUNK, 2 * CHUNK + 5])
def test_a_record_of_any_size_under_the_limit_is_found(size: int, after: int, tmp_path: Path) -> None:
    """The record's size is swept around every edge (a chunk, several, the old 512 KiB tail),
    followed by ``after`` bytes of later records, so it ends on, before and past a chunk's edge."""
    size = max(size, len(record("call_7")))
    later = call_output("call_7", after) if after else b""
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(b"".join([function_call("call_8"), record("call_8", exit_code=0),
                                     function_call("call_7"), record_of_size("call_7", size), later]))
    assert outcome(transcript, "call_7") == ("error" if size + len(later) <= LIMIT else "unknown")
    assert outcome(transcript, "call_8") == ("ok" if size + len(later) + len(function_call("call_7"))
                                             + len(record("call_8", exit_code=0)) <= LIMIT else "unknown")


@pytest.mark.parametrize("size", [LIMIT + 1, LIMIT + CHUNK, LIMIT + 3 * 1024 * 1024])
def test_a_record_larger_than_the_limit_is_unknown_and_never_a_failure(size: int, tmp_path: Path) -> None:
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(function_call("call_7") + record_of_size("call_7", size))
    assert outcome(transcript, "call_7") == "unknown"


@pytest.mark.parametrize("distance", [0, 1, CHUNK])
def test_a_record_that_ends_past_the_limit_is_unknown_and_one_within_it_is_found(
        distance: int, tmp_path: Path) -> None:
    """Later records push the call's record back: whole within the limit it is read; a byte of it
    beyond the limit and it is not."""
    mine = function_call("call_7") + record("call_7")
    later = call_output("call_8", 0)
    later = call_output("call_8", LIMIT - len(record("call_7")) - len(later) + distance)
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(mine + later)
    assert outcome(transcript, "call_7") == ("error" if distance == 0 else "unknown")


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_a_record_split_at_every_place_across_chunk_edges_is_read_whole(
        chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codex, "TRANSCRIPT_CHUNK", chunk)
    mine = record("call_7", output="z" * 300)
    for shift in range(0, chunk + 1, max(1, chunk // 50)):
        transcript = tmp_path / f"rollout-{shift}.jsonl"
        transcript.write_bytes(function_call("call_7") + mine + call_output("call_8", shift) + record("call_8"))
        assert outcome(transcript, "call_7") == "error", shift


def test_many_calls_in_one_transcript_each_read_their_own_outcome(tmp_path: Path) -> None:
    """Small and large records, prefix-alike ids (``call_1`` of ``call_10``), failures and successes."""
    expected = {}
    parts = []
    for n in range(1, 121):
        call_id = f"call_{n}"
        code = 1 if n % 3 else 0
        size = OLD_TAIL + n if n % 10 == 0 else 0
        parts += [function_call(call_id), record(call_id, exit_code=code, output="o" * size), call_output(call_id)]
        expected[call_id] = "error" if code else "ok"
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(b"".join(parts))
    assert {call_id: outcome(transcript, call_id) for call_id in expected} == expected
    assert outcome(transcript, "call_121") == "unknown"


@pytest.mark.parametrize("tail", [
    b'{"timestamp":"2026-12-07T02:23:50.1Z","ordinal":13,"type":"event_msg","payload":{"type":"item_comp',
    b"\x00\xff\xfe garbage" * 1000,
    b"not json at all\n" * 5000,
    b"[" * 200_000,
], ids=["a record cut short", "binary", "lines not JSON", "deep"])
def test_a_damaged_tail_neither_hides_an_earlier_record_nor_makes_one(tail: bytes, tmp_path: Path) -> None:
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(function_call("call_7") + record("call_7", output="o" * OLD_TAIL) + tail)
    assert outcome(transcript, "call_7") == "error"
    cut = record("call_8", output="o" * OLD_TAIL)
    transcript.write_bytes(function_call("call_8") + cut[: len(cut) // 2])
    assert outcome(transcript, "call_8") == "unknown"
    transcript.write_bytes(function_call("call_8") + cut[:-40])  # its exit code cut off
    assert outcome(transcript, "call_8") == "unknown"


def test_a_record_of_the_same_id_before_the_calls_own_function_call_is_not_its_outcome(tmp_path: Path) -> None:
    """An id used again (an earlier turn's call): the search stops at this call's ``function_call``."""
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(function_call("call_7") + record("call_7") + call_output("call_7")
                           + function_call("call_7"))
    assert outcome(transcript, "call_7") == "unknown"
    with open(transcript, "ab") as f:
        f.write(record("call_7", exit_code=0, status="completed"))
    assert outcome(transcript, "call_7") == "ok"


@pytest.mark.parametrize("size", [OLD_TAIL + 1, 2 * 1024 * 1024])
def test_identical_failing_calls_that_print_a_lot_halt_at_the_streak(
        size: int, env: dict[str, str], tmp_path: Path) -> None:
    s = Session("codex", env, tmp_path)
    assert is_allow(s.start())
    for n in range(1, STOP_AT):
        step = s.call("make test", failed=True, output="f" * size)
        assert all(is_allow(a) for a in step.answers()), (n, step)
    eighth = s.call("make test", failed=True, output="f" * size)
    assert is_allow(eighth.pre)
    assert outcome_halts("codex", eighth), eighth
    assert s.snapshot()["turn"]["facts"]["outcomes"]["error"] == STOP_AT


def test_parallel_calls_records_after_a_calls_own_never_hide_it(tmp_path: Path) -> None:
    """One model step's calls, each recorded with the 64 KiB of output Codex keeps, all control
    characters (6 bytes each, escaped): the first call's record ends megabytes before the file's end."""
    ids = [f"call_{n:04}" for n in range(10)]
    printed = "\x01" * 64 * 1024
    transcript = tmp_path / "rollout.jsonl"
    transcript.write_bytes(b"".join([*map(function_call, ids),
                                     *(record(i, exit_code=n % 2, output=printed) for n, i in enumerate(ids)),
                                     *map(call_output, ids)]))
    assert transcript.stat().st_size > 7 * OLD_TAIL
    assert [outcome(transcript, i) for i in ids] == ["ok", "error"] * 5
