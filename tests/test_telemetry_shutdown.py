"""Exit is bounded when the Collector is down: a closed port or a black hole (a listener that
never accepts nor answers), over HTTP and gRPC, with and without ``shutdown()``. Each case runs
in a fresh interpreter that reports when its work was done; the exit time is from then on. A
live receiver still gets everything at exit, so the bound drops nothing a Collector could take.
``Telemetry.force_flush(timeout)`` is bounded the same way, and says ``False`` when its data did
not leave (the SDK's batch processors ignore the timeout and answer ``True`` whatever happened)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from turnguard.telemetry import _setup as setup
from turnguard.telemetry._receiver import OtlpReceiver

CHILD = """
import sys, time
import turnguard as tg
from turnguard.telemetry import configure
telemetry = configure(set_global=True)
guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",)), **telemetry.providers())
for t in range(5):
    with guard.turn(turn_id=f"exit-{t}") as turn:
        turn.begin_cycle()
        for i in range(12):
            call = tg.ToolCall("bash", "make")
            if turn.check_call(call).action is tg.Action.HALT:
                break
            turn.record_outcome(call, tg.Outcome.ERROR)
if sys.argv[1] == "shutdown":
    telemetry.shutdown()
print(time.time(), flush=True)
"""
SLACK_S = 1.0
"""What exit may take beyond the bound: interpreter teardown on a loaded 2-core machine."""


@pytest.fixture(scope="module")
def black_hole() -> Iterator[int]:
    """A port that completes TCP handshakes (the kernel's backlog) and then never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture(scope="module")
def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def exit_seconds(endpoint: str, protocol: str, how: str, **env: str) -> float:
    environ = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_METRIC_EXPORT_INTERVAL": "60000", **env}
    environ.pop("OTEL_SDK_DISABLED", None)
    done = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, env=environ,
                          timeout=120)
    exited = time.time()
    assert done.returncode == 0, done.stderr
    return exited - float(done.stdout.split()[-1])


@pytest.mark.parametrize("how", ["at-exit", "shutdown"])
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("target", ["black hole", "closed port"])
def test_exit_is_bounded_when_the_collector_is_down(black_hole, closed_port, target, protocol, how):
    port = black_hole if target == "black hole" else closed_port
    took = exit_seconds(f"http://127.0.0.1:{port}", protocol, how)
    assert took < setup.DEFAULT_SHUTDOWN_TIMEOUT_MS / 1000 + SLACK_S  # was 13 to 21 s


@pytest.mark.parametrize("bound_ms", ["100", "3000"])
def test_the_bound_is_configurable(black_hole, bound_ms):
    took = exit_seconds(f"http://127.0.0.1:{black_hole}", "http/protobuf", "at-exit",
                        TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT=bound_ms)
    assert took < int(bound_ms) / 1000 + SLACK_S
    if bound_ms == "3000":
        assert took > 1.0  # it did wait for the black hole, longer than the default would


@pytest.mark.parametrize("how", ["at-exit", "shutdown"])
def test_a_live_collector_gets_everything_at_exit(how):
    with OtlpReceiver() as receiver:
        exit_seconds(receiver.endpoint, "http/protobuf", how)
        assert receiver.wait_for(lambda r: len(r.spans()) >= 5 and r.logs() and r.metrics(), timeout=10)
        turns = {kv.value.string_value for _, span in receiver.spans() for kv in span.attributes
                 if kv.key == "turnguard.turn.id"}
        assert turns == {f"exit-{t}" for t in range(5)}


def test_shutdown_reports_a_provider_that_did_not_finish_and_is_idempotent():
    import threading

    class Stuck:
        def __init__(self) -> None:
            self.release = threading.Event()

        def shutdown(self) -> None:
            self.release.wait()

    stuck = Stuck()
    telemetry = setup.Telemetry(stuck, None, None, shutdown_timeout_ms=50)
    assert telemetry.shutdown() is False
    assert telemetry.shutdown() is True  # already stopped
    stuck.release.set()


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon"])
def test_a_bad_shutdown_timeout_is_a_telemetry_config_error(value):
    with pytest.raises(setup.TelemetryConfigError, match=setup.SHUTDOWN_TIMEOUT_ENV):
        setup.configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                                 setup.SHUTDOWN_TIMEOUT_ENV: value})


FLUSH_CHILD = """
import json, sys, time
import turnguard as tg
from turnguard.telemetry import configure
telemetry = configure()
guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",)), **telemetry.providers())
for t in range(3):
    with guard.turn(turn_id=f"flush-{t}") as turn:
        turn.begin_cycle()
        for i in range(10):
            call = tg.ToolCall("bash", "make")
            if turn.check_call(call).action is tg.Action.HALT:
                break
            turn.record_outcome(call, tg.Outcome.ERROR)
began = time.monotonic()
flushed = telemetry.force_flush(int(sys.argv[1]))
print(json.dumps({"flushed": flushed, "took": time.monotonic() - began}), flush=True)
telemetry.shutdown(0)
"""


FLUSH_SLACK_S = 4.0
"""What ``force_flush(500)`` may take beyond its timeout on a loaded 2-core machine: far under one
signal's own 10 s export timeout, which an unbounded flush waits out."""


def force_flush_in_child(endpoint: str, protocol: str, timeout_ms: int, **env: str) -> dict[str, object]:
    environ = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_METRIC_EXPORT_INTERVAL": "60000", **env}
    environ.pop("OTEL_SDK_DISABLED", None)
    done = subprocess.run([sys.executable, "-c", FLUSH_CHILD, str(timeout_ms)], capture_output=True, text=True,
                          env=environ, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("target", ["black hole", "closed port"])
def test_force_flush_is_bounded_by_its_timeout_and_false_when_the_collector_is_down(black_hole, closed_port,
                                                                                    target, protocol):
    port = black_hole if target == "black hole" else closed_port
    result = force_flush_in_child(f"http://127.0.0.1:{port}", protocol, 500)
    assert result["flushed"] is False  # was True: nothing had left
    assert isinstance(result["took"], float) and result["took"] < 0.5 + FLUSH_SLACK_S  # was 20 s: 10 s per signal


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_force_flush_is_false_when_an_export_failed_within_the_timeout(closed_port, protocol):
    result = force_flush_in_child(f"http://127.0.0.1:{closed_port}", protocol, 60_000,
                                  OTEL_EXPORTER_OTLP_TIMEOUT="300")
    assert result["flushed"] is False


def test_force_flush_to_a_live_collector_is_true_and_delivers_every_signal():
    with OtlpReceiver() as receiver:
        assert force_flush_in_child(receiver.endpoint, "http/protobuf", 30_000)["flushed"] is True
        assert receiver.spans() and receiver.logs() and receiver.metrics()  # there when force_flush returned
        turns = {kv.value.string_value for _, span in receiver.spans() for kv in span.attributes
                 if kv.key == "turnguard.turn.id"}
        assert turns == {f"flush-{t}" for t in range(3)}


class Provider:
    """A provider whose ``force_flush`` answers ``answer``, raises it, or blocks until released."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.release = threading.Event()

    def force_flush(self, timeout_millis: float = 30_000) -> bool:
        if self.answer == "blocks":
            self.release.wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return bool(self.answer)


@pytest.mark.parametrize("odd", ["blocks", False, RuntimeError("reader failed"), None])
@pytest.mark.parametrize("at", [0, 1, 2])
def test_force_flush_is_false_when_any_provider_blocks_fails_or_raises(odd, at):
    providers = [Provider(True), Provider(True), Provider(True)]
    providers[at] = Provider(odd)
    telemetry = setup.Telemetry(*providers)
    answers: list[bool] = []
    caller = threading.Thread(target=lambda: answers.append(telemetry.force_flush(50)), daemon=True)
    caller.start()
    caller.join(30)  # (far beyond the 50 ms asked: only a flush that waits on the provider takes it)
    providers[at].release.set()
    assert answers == [False]


def test_force_flush_of_providers_that_flushed_is_true():
    assert setup.Telemetry(Provider(True), Provider(True), object()).force_flush(1000) is True
