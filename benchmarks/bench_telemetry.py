"""Benchmark: the per-call cost of turnguard's OpenTelemetry reporting.

    .venv/bin/python benchmarks/bench_telemetry.py [--calls 60000] [--json]

One "call" is what a host pays per tool call: ``check_call`` + ``record_outcome``. Turns of 50
calls (mostly distinct, some repeated, one identical-call streak that fires a warning per turn)
are driven back to back through a real ``Guard`` in five setups:

- ``core``: the policies only (otel plugin disabled): the floor.
- ``no-sdk``: the default guard, no SDK installed (the plugin reports to the no-op globals).
- ``sdk``: the SDK active as ``turnguard.telemetry.configure()`` builds it: batch span processor,
  batch log processor and a periodic metric reader, all exporting over real OTLP/HTTP to a
  local sink (an OTLP receiver on loopback that decodes and counts the payloads).
- ``sdk-down``: the same, with the exporters pointed at a closed port (300 ms timeout), so
  every export fails while the calls run.
- ``sdk-recorder``: ``sdk`` plus the local JSONL recorder.
- ``sdk-noexport``: the same SDK pipeline with exporters that discard their batches: the cost
  on the host's thread alone, without the OTLP encoding the exporters do in the background.

Figures: mean and percentiles (p50, p99, p99.9, max) of the per-call time in microseconds.
Targets: ``sdk`` mean <= 40 us per call; ``sdk-down`` p99.9 <= 5 ms (5000 us).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import turnguard as tg
from turnguard.telemetry import Telemetry, configure
from turnguard.telemetry.receiver import OtlpReceiver

CALLS_PER_TURN = 50
TARGET_SDK_MEAN_US = 40.0
TARGET_DOWN_P999_US = 5000.0


def workload(turn_index: int) -> list[tg.ToolCall]:
    """One turn's calls: 40 distinct, a streak of 6 identical calls, and 4 re-reads."""
    calls = [tg.ToolCall("read_file", {"path": f"src/m{turn_index}_{i}.py", "offset": 0}, call_id=f"c{i}")
             for i in range(40)]
    calls += [tg.ToolCall("bash", f"pytest -q tests/test_{turn_index}.py", call_id=f"s{i}") for i in range(6)]
    calls += [tg.ToolCall("read_file", {"path": f"src/m{turn_index}_{i}.py", "offset": 0}) for i in range(4)]
    return calls


def drive(guard: tg.Guard, turns: int) -> list[int]:
    """Per-call nanoseconds over ``turns`` turns (check_call + record_outcome)."""
    samples: list[int] = []
    clock = time.perf_counter_ns
    ok, err = tg.Outcome.OK, tg.Outcome.ERROR
    for t in range(turns):
        calls = workload(t)
        with guard.turn(agent_name="bench", conversation_id=f"conv-{t}") as turn:
            turn.begin_cycle()
            for i, call in enumerate(calls):
                start = clock()
                turn.check_call(call)
                turn.record_outcome(call, err if 40 <= i < 46 else ok)
                samples.append(clock() - start)
    return samples


def stats(samples: list[int]) -> dict[str, float]:
    ordered = sorted(samples)
    count = len(ordered)

    def pct(p: float) -> float:
        return ordered[min(count - 1, int(p * count))] / 1000

    return {
        "calls": count,
        "mean_us": sum(ordered) / count / 1000,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "p999_us": pct(0.999),
        "max_us": ordered[-1] / 1000,
    }


def _sink_main(conn: Any) -> None:
    """The sink process: an OTLP receiver that counts payloads until told to stop."""
    with OtlpReceiver(keep=False) as sink:
        conn.send(sink.endpoint)
        conn.recv()
        conn.send(dict(sink.counts))


class Sink:
    """A local OTLP/HTTP sink in its own process, so decoding never competes with the measured calls."""

    def __enter__(self) -> Sink:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_sink_main, args=(child,), daemon=True)
        self._process.start()
        self.endpoint = self._conn.recv()
        self.counts: dict[str, int] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send("stop")
        self.counts = self._conn.recv()
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()


def no_export_telemetry() -> Telemetry:
    """The SDK pipeline ``configure()`` builds, with exporters that drop every batch."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Spans(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    class Logs(LogRecordExporter):
        def export(self, batch: Any) -> LogRecordExportResult:
            return LogRecordExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return True

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Spans(), max_queue_size=1_000_000))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(Logs(), max_queue_size=1_000_000))
    return Telemetry(tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()]), logger_provider)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(**extra: Any) -> tg.GuardConfig:
    return tg.GuardConfig(load_entrypoints=False, **extra)


def measure(make_guard: Callable[[], tg.Guard], turns: int, flush: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    """Wall-clock percentiles per call, and the process's CPU time per call (every thread,
    including the exporters' batch work up to a final flush), which other processes' load on a
    shared machine does not inflate."""
    guard = make_guard()
    drive(guard, max(2, turns // 10))  # warm-up: imports, caches, first exports
    flush()
    gc.collect()
    cpu = time.process_time()
    samples = drive(guard, turns)
    flush()
    figures: dict[str, Any] = stats(samples)
    figures["cpu_us_per_call"] = (time.process_time() - cpu) * 1e6 / len(samples)
    return figures


def bench_core(turns: int) -> dict[str, Any]:
    return measure(lambda: tg.Guard(config(disable_plugins=("otel",))), turns)


def bench_no_sdk(turns: int) -> dict[str, Any]:
    return measure(lambda: tg.Guard(config()), turns)


def bench_sdk_noexport(turns: int) -> dict[str, Any]:
    telemetry = no_export_telemetry()
    try:
        return measure(lambda: tg.Guard(config(), **telemetry.providers()), turns,
                       lambda: telemetry.force_flush(60_000))
    finally:
        telemetry.shutdown()


def _bench_sink(turns: int, **extra: Any) -> dict[str, Any]:
    with Sink() as sink:
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                                       "OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_SERVICE_NAME": "bench",
                                       "OTEL_BSP_MAX_QUEUE_SIZE": "1000000", "OTEL_BLRP_MAX_QUEUE_SIZE": "1000000"})
        try:
            figures = measure(lambda: tg.Guard(config(**extra), **telemetry.providers()), turns,
                              lambda: telemetry.force_flush(60_000))
        finally:
            telemetry.shutdown()
    figures["sink_payloads"] = sink.counts
    return figures


def bench_sdk(turns: int) -> dict[str, Any]:
    return _bench_sink(turns)


def bench_sdk_recorder(turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        return _bench_sink(turns, recorder_path=os.path.join(folder, "turns.jsonl"))


def bench_sdk_down(turns: int) -> dict[str, Any]:
    telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
                                   "OTEL_EXPORTER_OTLP_TIMEOUT": "300", "OTEL_BSP_SCHEDULE_DELAY": "100",
                                   "OTEL_BLRP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "200"})
    quiet = logging.getLogger("opentelemetry")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # every failed export logs an error; not the subject here
    try:
        return measure(lambda: tg.Guard(config(), **telemetry.providers()), turns)
    finally:
        telemetry.shutdown()
        quiet.setLevel(level)


SETUPS: dict[str, Callable[[int], dict[str, Any]]] = {
    "core": bench_core,
    "no-sdk": bench_no_sdk,
    "sdk-noexport": bench_sdk_noexport,
    "sdk": bench_sdk,
    "sdk-recorder": bench_sdk_recorder,
    "sdk-down": bench_sdk_down,
}


def run(calls: int = 60_000, setups: Sequence[str] | None = None) -> dict[str, Any]:
    """The figures of each setup (all by default), the targets, and whether they were met."""
    turns = max(4, calls // CALLS_PER_TURN)
    results: dict[str, Any] = {name: SETUPS[name](turns) for name in (setups or SETUPS)}
    results["load_average"] = os.getloadavg()[0]
    targets: dict[str, Any] = {"sdk_cpu_us_per_call": TARGET_SDK_MEAN_US, "sdk_down_p999_us": TARGET_DOWN_P999_US}
    if "sdk" in results:
        targets["sdk_met"] = results["sdk"]["cpu_us_per_call"] <= TARGET_SDK_MEAN_US
    if "sdk-down" in results:
        targets["sdk_down_met"] = results["sdk-down"]["p999_us"] <= TARGET_DOWN_P999_US
    results["targets"] = targets
    return results


def report(results: dict[str, Any], out: Any = sys.stdout) -> None:
    out.write(f"{'setup':<14}{'calls':>8}{'cpu us':>9}{'mean us':>9}{'p50':>8}{'p99':>9}{'p99.9':>9}{'max':>10}\n")
    for name in SETUPS:
        r = results.get(name)
        if r is None:
            continue
        out.write(f"{name:<14}{r['calls']:>8}{r['cpu_us_per_call']:>9.1f}{r['mean_us']:>9.1f}{r['p50_us']:>8.1f}"
                  f"{r['p99_us']:>9.1f}{r['p999_us']:>9.1f}{r['max_us']:>10.1f}\n")
    t = results["targets"]
    out.write("\n")
    if "sdk_met" in t:
        out.write(f"sdk: {results['sdk']['cpu_us_per_call']:.1f} us of CPU per call, exports included "
                  f"(target <= {TARGET_SDK_MEAN_US:.0f}): {'met' if t['sdk_met'] else 'MISSED'}; "
                  f"{results['sdk']['sink_payloads']} OTLP payloads reached the sink\n")
    if "sdk_down_met" in t:
        out.write(f"sdk-down: p99.9 {results['sdk-down']['p999_us']:.1f} us per call "
                  f"(target <= {TARGET_DOWN_P999_US:.0f}): {'met' if t['sdk_down_met'] else 'MISSED'}\n")
    out.write(f"load average {results['load_average']:.2f} on {os.cpu_count()} CPUs (other processes inflate the "
              "wall-clock figures, not the CPU ones)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60_000, help="calls measured per setup")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated subset of {', '.join(SETUPS)}")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        parser.error(f"unknown setup(s) {unknown}; choose from {list(SETUPS)}")
    results = run(args.calls, setups)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        report(results)
    return 0 if all(v for k, v in results["targets"].items() if k.endswith("_met")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
