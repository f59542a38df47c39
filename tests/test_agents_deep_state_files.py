"""Every JSON file the hooks read back from disk (the outbox's journals, the entry-point scan's
cache, a kept result token, a Codex transcript's record, an install backup: the last in
test_agents_install.py), nested deeper than the parser can go, as a damaged or tampered file is:
each reader takes it as it takes any file that is not JSON (its documented fallback), never a
``RecursionError`` that stops an exporter at every run, fails a hook at every event, or ends a
command in a traceback (the session's own state file is read so already)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_events import Session, hook_env, is_allow
from turnguard.agents import codex, export

DEEP = b"[" * 200_000 + b"]" * 200_000
"""JSON nested far past any process's recursion limit (the parser raises ``RecursionError``)."""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return hook_env(tmp_path)


def ended_turn(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One turn of one call, ended: its journal in the outbox (the exporter not started)."""
    monkeypatch.setattr(export, "start_exporter", lambda environ: None)
    s = Session("claude-code", env, tmp_path)
    s.start()
    s.call("make test", failed=False)
    s.finish()


@pytest.mark.parametrize("content", [DEEP, b"not json", b"[1, 2]"], ids=["deep", "not JSON", "not an object"])
def test_a_damaged_journal_in_the_outbox_never_holds_back_the_turns_after_it(
        content: bytes, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = export.outbox_dir(Path(env["TURNGUARD_STATE_DIR"]))
    box.mkdir(parents=True)
    (box / f"{0:020d}-damaged.json").write_bytes(content)  # (the oldest: replayed first)
    ended_turn(env, tmp_path, monkeypatch)
    assert export.export_outbox(env) == 1
    assert len(Path(env["TURNGUARD_RECORDER_PATH"]).read_text().splitlines()) == 1
    assert export.export_outbox(env) == 0


@pytest.mark.parametrize("content", [DEEP, b"not json", b"[]"], ids=["deep", "not JSON", "not an object"])
def test_a_damaged_entry_point_cache_is_scanned_again_and_no_event_fails(
        content: bytes, env: dict[str, str], tmp_path: Path) -> None:
    env["TURNGUARD_LOAD_PLUGINS"] = "1"  # (the cache is read only where entry points are scanned)
    s = Session("claude-code", env, tmp_path)
    assert is_allow(s.start())
    caches = list(Path(env["TURNGUARD_STATE_DIR"]).rglob("entrypoints.json"))
    assert len(caches) == 1
    caches[0].write_bytes(content)
    for _ in range(3):
        assert all(is_allow(a) for a in s.call("make test", failed=False).answers())
    assert json.loads(caches[0].read_text())["installed"] is False
    assert not (Path(env["TURNGUARD_STATE_DIR"]) / "hooks" / "errors.log").exists()


@pytest.mark.parametrize("content", [DEEP, b"not json", b"[]", b'{"no": "token"}'],
                         ids=["deep", "not JSON", "not an object", "no token"])
def test_a_damaged_kept_result_token_is_one_line_and_exit_1(content: bytes, tmp_path: Path) -> None:
    kept = tmp_path / "state" / "hooks" / export.RESULTS / "claude-code"
    kept.mkdir(parents=True)
    (kept / "x.json").write_bytes(content)
    argv = [sys.executable, "-m", "turnguard", "result", "claude-code", "resolved", "--state-dir", str(kept.parents[2])]
    done = subprocess.run(argv, capture_output=True, text=True, env=hook_env(tmp_path), timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("turnguard result: cannot read ") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("record", [DEEP, b"not json", b"[]", b"{}"],
                         ids=["deep", "not JSON", "not an object", "empty"])
def test_a_damaged_codex_transcript_record_is_an_unknown_outcome(record: bytes, tmp_path: Path) -> None:
    """A record naming the call that cannot be read is passed over: the outcome is that of the
    record before it, or unknown."""
    transcript = tmp_path / "rollout.jsonl"
    named = b'{"type":"item_completed","id":"call_1","payload":' + record + b"}"
    transcript.write_bytes(named + b"\n")
    assert codex.outcome_from_transcript(str(transcript), "call_1", tries=(0.0,)) == "unknown"
    done = b'{"type":"event_msg","payload":{"type":"item_completed","item":{"id":"call_1","exit_code":0}}}'
    transcript.write_bytes(done + b"\n" + named + b"\n")
    assert codex.outcome_from_transcript(str(transcript), "call_1", tries=(0.0,)) == "ok"
