"""The hooks' outbox: a journal leaves it only after an export that succeeded, for every signal.

The turns are made by the real hooks (``Session``, in this process, with no exporter started);
the exporter is the real ``python -m turnguard.agents.export`` process, run here against a real
OTLP/HTTP receiver, or against a collector that is down, silent, or refuses what it is sent.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent_events import AGENTS, TIMEOUT_S, Session, hook_env, outbox, recorded, wait_for
from turnguard.agents import export, hook
from turnguard.telemetry._receiver import OtlpReceiver

SRC = Path(__file__).resolve().parent.parent / "src"
SIGNALS = ("traces", "metrics", "logs")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The hooks' environment; a turn's end starts no exporter (the tests run it)."""
    monkeypatch.setattr(export, "start_exporter", lambda environ: None)
    return hook_env(tmp_path, PYTHONPATH=str(SRC), TURNGUARD_OTEL_EXPORTER_OTLP_TIMEOUT="500")


def halted_turn(agent: str, env: dict[str, str], root: Path) -> Session:
    """A turn whose repeated failures halt it: a turn span, call spans, metrics and a loop event."""
    s = Session(agent, env, root)
    s.start()
    for _ in range(10):
        s.call("make test", failed=True)
    s.finish()
    return s


def journals(env: dict[str, str]) -> list[Path]:
    box = outbox(env)
    return sorted(box.glob("*.json")) if box.is_dir() else []


def exporter(env: dict[str, str], endpoint: str, **signal_endpoints: str) -> subprocess.Popen[bytes]:
    """The exporter process the hooks start, exporting to ``endpoint`` (or per signal)."""
    environ = {**env, "TURNGUARD_OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    for name, url in signal_endpoints.items():
        environ[f"TURNGUARD_OTEL_EXPORTER_OTLP_{name.upper()}_ENDPOINT"] = f"{url}/v1/{name}"
    return subprocess.Popen([sys.executable, "-m", "turnguard.agents.export"], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_exporter(env: dict[str, str], endpoint: str, **signal_endpoints: str) -> str:
    done = exporter(env, endpoint, **signal_endpoints)
    _, err = done.communicate(timeout=TIMEOUT_S)
    assert done.returncode == 0, err
    return err.decode()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


class Silent:
    """A collector that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:
                return

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


class Refusing:
    """A collector that answers every export with ``400 Bad Request``."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(params=["down", "silent", "refusing"])
def broken(request: pytest.FixtureRequest) -> Iterator[str]:
    """The endpoint of a collector that is down, silent, or refusing every export."""
    if request.param == "down":
        yield closed_port()
        return
    collector = Silent() if request.param == "silent" else Refusing()
    try:
        yield collector.endpoint
    finally:
        collector.close()


def turn_spans(rx: OtlpReceiver, agent: str) -> list[Any]:
    return [span for _, span in rx.spans() if span.name == f"invoke_agent {agent}"]


def assert_exported_once(env: dict[str, str], rx: OtlpReceiver, agent: str) -> None:
    assert journals(env) == [], "the journal left the outbox after its export"
    assert [line["agent"] for line in recorded(env)] == [agent], "the recorder holds the turn once"
    assert rx.wait_for(lambda r: bool(turn_spans(r, agent)) and bool(r.metrics()) and bool(r.logs()))


@pytest.mark.parametrize("failing", ["every signal", *SIGNALS])
def test_a_journal_stays_until_every_signal_is_exported_then_leaves_once(env, tmp_path, broken, receiver,
                                                                        failing) -> None:
    agent = AGENTS[(SIGNALS.index(failing) + 1) % len(AGENTS) if failing in SIGNALS else 0]
    halted_turn(agent, env, tmp_path)
    [journal] = journals(env)
    if failing == "every signal":
        err = run_exporter(env, broken)
    else:
        err = run_exporter(env, receiver.endpoint, **{failing: broken})
    assert journals(env) == [journal], f"a failed {failing} export removed the journal: {err}"
    assert json.loads(journal.read_text())[export.RECORDED] is True
    assert [line["agent"] for line in recorded(env)] == [agent]

    run_exporter(env, broken)  # a second failure: still there, still recorded once
    assert journals(env) == [journal] and len(recorded(env)) == 1

    run_exporter(env, receiver.endpoint)
    assert_exported_once(env, receiver, agent)


@pytest.mark.parametrize("agent", AGENTS)
def test_an_exporter_killed_while_it_waits_on_a_silent_collector_loses_no_turn(env, tmp_path, receiver,
                                                                               agent) -> None:
    halted_turn(agent, env, tmp_path)
    [journal] = journals(env)
    silent = Silent()
    try:
        waiting = exporter({**env, "TURNGUARD_OTEL_EXPORTER_OTLP_TIMEOUT": "60000"}, silent.endpoint)
        wait_for(lambda: bool(silent.accepted), "the exporter to reach the silent collector")
        waiting.send_signal(signal.SIGKILL)
        waiting.communicate(timeout=TIMEOUT_S)
    finally:
        silent.close()
    assert journals(env) == [journal]
    run_exporter(env, receiver.endpoint)
    assert_exported_once(env, receiver, agent)


def test_the_journals_after_a_failed_export_wait_for_the_next_exporter(env, tmp_path, receiver) -> None:
    for agent in AGENTS:
        halted_turn(agent, env, tmp_path)
    kept = journals(env)
    assert len(kept) == len(AGENTS)
    run_exporter(env, closed_port())
    assert journals(env) == kept
    assert len(recorded(env)) == 1, "the exporter stops at its first failed export"
    run_exporter(env, receiver.endpoint)
    assert journals(env) == []
    assert sorted(line["agent"] for line in recorded(env)) == sorted(AGENTS)
    assert receiver.wait_for(lambda r: all(turn_spans(r, agent) for agent in AGENTS))


def test_the_outbox_keeps_the_newest_journals_up_to_its_limit(env, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(export, "OUTBOX_LIMIT", 2)
    sessions = [halted_turn(agent, env, tmp_path) for agent in AGENTS]
    newest = journals(env)[-2:]
    export.export_outbox(env)  # (no endpoint in ``env``: only the recorder, in this process)
    assert journals(env) == []
    assert [line["agent"] for line in recorded(env)] == [s.agent for s in sessions][-2:]
    assert all(not path.exists() for path in newest)


def test_the_exporters_queues_hold_a_whole_journal() -> None:
    assert export.REPLAY_QUEUE > hook.MAX_JOURNAL


STREAK_4 = "streak_warn_at = 3\nstreak_stop_at = 4\n"


@pytest.mark.parametrize(("before", "after"), [(STREAK_4, ""), ("", STREAK_4), (STREAK_4, None)])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_journal_is_replayed_under_the_settings_its_turn_was_decided_under(
        agent: str, before: str, after: str | None, env: dict[str, str], tmp_path: Path) -> None:
    """``turnguard.toml`` edited (``None``: removed) after the turn ended, before its export: the
    recorder says what the hooks did."""
    s = Session(agent, env, tmp_path)
    settings = s.events.project / "turnguard.toml"
    settings.write_text(before)
    s.start()
    for _ in range(10):
        s.call("make test", failed=True)
    live = s.snapshot()["turn"]["facts"]["tool_calls"]
    s.finish()
    if after is None:
        settings.unlink()
    else:
        settings.write_text(after)
    subprocess.run([sys.executable, "-m", "turnguard.agents.export"], env=env, capture_output=True,
                   timeout=TIMEOUT_S, check=True)
    [turn] = recorded(env)
    assert turn["tool_calls"] == live == (4 if before else 8), turn
