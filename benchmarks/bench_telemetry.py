"""Benchmark: the per-call cost of turnguard's OpenTelemetry reporting.

    .venv/bin/python benchmarks/bench_telemetry.py [--calls 60000] [--setups sdk,sdk-down] [--json]
    .venv/bin/python benchmarks/run.py telemetry [--quick]      # the same, as rows of the suite

One "call" is what a host pays per tool call: ``check_call`` + ``record_outcome`` (each turn's
open and close are spread over its calls). Turns of 50 calls (40 distinct, an identical-call
streak of 6 that fires a warning, 4 re-reads) are driven back to back through a real ``Guard``:

- ``core``: the policies only (otel plugin disabled): the floor.
- ``span-floor``: no guard, the OpenTelemetry SDK alone: one minimal ``execute_tool`` span per
  call, started and ended (the SDK's own cost on this machine, for reference).
- ``no-sdk``: the default guard, no SDK installed (the plugin reports to the no-op globals).
- ``recorder``: ``no-sdk`` plus the local JSONL recorder (one line appended per turn).
- ``sdk-noexport``: the SDK pipeline with exporters that discard their batches.
- ``sdk``: the SDK as ``turnguard.telemetry.configure()`` builds it: batch span processor, batch
  log processor and a periodic metric reader, all exporting over real OTLP/HTTP to a local sink
  (an OTLP receiver on loopback, in its own process, that decodes and counts the payloads).
- ``sdk-recorder``: ``sdk`` plus the local JSONL recorder.
- ``sdk-down``: the same, with the exporters pointed at a closed port (300 ms timeout).

Figures per call, in microseconds: ``host cpu`` (CPU time of the host's thread: what the call
costs, unaffected by other processes on a shared machine), ``process cpu`` (every thread of the
process, so the exporters' OTLP encoding too), and the wall time's mean, p50, p99, p99.9 and
max. Targets: ``sdk`` host cpu <= 40 us per call; ``sdk-down`` wall p99.9 <= 5 ms. Back-to-back
calls are the worst case for the wall figures: a real host's tool and model latency leaves the
exporter threads idle time to encode in, which here competes with the calls for the GIL.
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
TARGET_SDK_US = 40.0
TARGET_DOWN_P999_US = 5000.0


def workload(turn_index: int) -> list[tg.ToolCall]:
    """One turn's calls: 40 distinct, a streak of 6 identical calls, and 4 re-reads."""
    calls = [tg.ToolCall("read_file", {"path": f"src/m{turn_index}_{i}.py", "offset": 0}, call_id=f"c{i}")
             for i in range(40)]
    calls += [tg.ToolCall("bash", f"pytest -q tests/test_{turn_index}.py", call_id=f"s{i}") for i in range(6)]
    calls += [tg.ToolCall("read_file", {"path": f"src/m{turn_index}_{i}.py", "offset": 0}) for i in range(4)]
    return calls


def drive(guard: tg.Guard, turns: int) -> tuple[list[int], float]:
    """Per-call wall nanoseconds over ``turns`` turns, and the host thread's CPU seconds for them."""
    workloads = [workload(t) for t in range(turns)]  # built before the clocks start
    samples: list[int] = []
    clock = time.perf_counter_ns
    ok, err = tg.Outcome.OK, tg.Outcome.ERROR
    cpu = time.thread_time()
    for t, calls in enumerate(workloads):
        with guard.turn(agent_name="bench", conversation_id=f"conv-{t}") as turn:
            turn.begin_cycle()
            for i, call in enumerate(calls):
                start = clock()
                turn.check_call(call)
                turn.record_outcome(call, err if 40 <= i < 46 else ok)
                samples.append(clock() - start)
    return samples, time.thread_time() - cpu


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


def measure(make_guard: Callable[[], tg.Guard], turns: int, flush: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    guard = make_guard()
    drive(guard, max(2, turns // 10))  # warm-up: imports, caches, first exports
    flush()
    gc.collect()
    process = time.process_time()
    samples, host = drive(guard, turns)
    flush()  # the exporters' work for these calls belongs to them
    figures: dict[str, Any] = stats(samples)
    figures["host_cpu_us"] = host * 1e6 / len(samples)
    figures["process_cpu_us"] = (time.process_time() - process) * 1e6 / len(samples)
    return figures


def config(**extra: Any) -> tg.GuardConfig:
    return tg.GuardConfig(load_entrypoints=False, **extra)


# -- the sink, and SDK pipelines ----------------------------------------------------------------


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


# -- the setups ---------------------------------------------------------------------------------


def bench_core(turns: int) -> dict[str, Any]:
    return measure(lambda: tg.Guard(config(disable_plugins=("otel",))), turns)


def bench_span_floor(turns: int) -> dict[str, Any]:
    """One minimal ``execute_tool`` span (its two required attributes) per call, nothing else."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    telemetry = no_export_telemetry()
    tracer = telemetry.tracer_provider.get_tracer("floor")
    parent = trace.set_span_in_context(tracer.start_span("invoke_agent floor"))
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file"}
    clock = time.perf_counter_ns

    def spans(count: int) -> tuple[list[int], float]:
        samples = []
        cpu = time.thread_time()
        for _ in range(count):
            start = clock()
            tracer.start_span("execute_tool read_file", context=parent, kind=SpanKind.INTERNAL,
                              attributes=attributes).end()
            samples.append(clock() - start)
        return samples, time.thread_time() - cpu

    try:
        spans(turns * CALLS_PER_TURN // 10)
        gc.collect()
        process = time.process_time()
        samples, host = spans(turns * CALLS_PER_TURN)
        telemetry.force_flush(60_000)
        figures: dict[str, Any] = stats(samples)
        figures["host_cpu_us"] = host * 1e6 / len(samples)
        figures["process_cpu_us"] = (time.process_time() - process) * 1e6 / len(samples)
        return figures
    finally:
        telemetry.shutdown()


def bench_no_sdk(turns: int) -> dict[str, Any]:
    return measure(lambda: tg.Guard(config()), turns)


def bench_recorder(turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "turns.jsonl")
        return measure(lambda: tg.Guard(config(recorder_path=path)), turns)


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
    loggers = [logging.getLogger(name) for name in ("opentelemetry", "turnguard.telemetry")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:  # every failed export logs; not the subject here
        logger.setLevel(logging.CRITICAL)
    try:
        return measure(lambda: tg.Guard(config(), **telemetry.providers()), turns)
    finally:
        telemetry.shutdown()
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


SETUPS: dict[str, Callable[[int], dict[str, Any]]] = {
    "core": bench_core,
    "span-floor": bench_span_floor,
    "no-sdk": bench_no_sdk,
    "recorder": bench_recorder,
    "sdk-noexport": bench_sdk_noexport,
    "sdk": bench_sdk,
    "sdk-recorder": bench_sdk_recorder,
    "sdk-down": bench_sdk_down,
}


def measure_all(calls: int = 60_000, setups: Sequence[str] | None = None) -> dict[str, Any]:
    """The figures of each setup (all by default), the targets, and whether they were met."""
    turns = max(4, calls // CALLS_PER_TURN)
    results: dict[str, Any] = {name: SETUPS[name](turns) for name in (setups or SETUPS)}
    results["load_average"] = os.getloadavg()[0]
    targets: dict[str, Any] = {"sdk_host_cpu_us": TARGET_SDK_US, "sdk_down_p999_us": TARGET_DOWN_P999_US}
    if "sdk" in results:
        targets["sdk_met"] = results["sdk"]["host_cpu_us"] <= TARGET_SDK_US
    if "sdk-down" in results:
        targets["sdk_down_met"] = results["sdk-down"]["p999_us"] <= TARGET_DOWN_P999_US
    results["targets"] = targets
    return results


# -- output -------------------------------------------------------------------------------------


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run.py``."""
    results = measure_all(5_000 if quick else 60_000)
    core, floor = results["core"], results["span-floor"]
    rows: list[dict[str, Any]] = []

    def row(case: str, value: float, floor_value: float | None = None, **extra: Any) -> None:
        r: dict[str, Any] = {"benchmark": "telemetry", "case": case, "value": value, "unit": "us/call"}
        if floor_value:
            r.update(floor=floor_value, ratio=value / floor_value)
        r.update(extra)
        rows.append(r)

    sdk_floor = core["host_cpu_us"] + floor["host_cpu_us"]
    row("no SDK (default guard, no-op globals): host cpu", results["no-sdk"]["host_cpu_us"], core["host_cpu_us"],
        note="floors: the policies alone (otel plugin disabled); for SDK rows, plus one bare SDK span")
    row("local JSONL recorder, no SDK: host cpu", results["recorder"]["host_cpu_us"], results["no-sdk"]["host_cpu_us"])
    row("OpenTelemetry SDK alone, one minimal span (reference): host cpu", floor["host_cpu_us"])
    row("SDK, exporters discarding: host cpu", results["sdk-noexport"]["host_cpu_us"], sdk_floor)
    sdk = results["sdk"]
    row("SDK exporting OTLP/HTTP to a local sink: host cpu", sdk["host_cpu_us"], sdk_floor,
        target=f"<= {TARGET_SDK_US:.0f} us/call", met=results["targets"]["sdk_met"])
    row("SDK exporting OTLP/HTTP to a local sink: wall p50", sdk["p50_us"])
    row("SDK exporting OTLP/HTTP to a local sink: wall mean", sdk["mean_us"])
    row("SDK exporting OTLP/HTTP to a local sink: process cpu (OTLP encoding included)", sdk["process_cpu_us"],
        core["process_cpu_us"] + floor["process_cpu_us"])
    row("SDK + local JSONL recorder: host cpu", results["sdk-recorder"]["host_cpu_us"], sdk_floor)
    down = results["sdk-down"]
    row("OTLP exporter at a closed port: wall p99.9", down["p999_us"], core["p999_us"],
        target=f"<= {TARGET_DOWN_P999_US:.0f} us/call", met=results["targets"]["sdk_down_met"],
        note=f"load average {results['load_average']:.2f} on {os.cpu_count()} CPUs during the run")
    return rows


def report(results: dict[str, Any], out: Any = sys.stdout) -> None:
    out.write(f"{'setup':<14}{'calls':>8}{'host cpu':>10}{'proc cpu':>10}{'mean':>9}{'p50':>8}{'p99':>9}"
              f"{'p99.9':>9}{'max':>10}   (us per call)\n")
    for name in SETUPS:
        r = results.get(name)
        if r is None:
            continue
        out.write(f"{name:<14}{r['calls']:>8}{r['host_cpu_us']:>10.1f}{r['process_cpu_us']:>10.1f}{r['mean_us']:>9.1f}"
                  f"{r['p50_us']:>8.1f}{r['p99_us']:>9.1f}{r['p999_us']:>9.1f}{r['max_us']:>10.1f}\n")
    t = results["targets"]
    out.write("\n")
    if "sdk_met" in t:
        out.write(f"sdk: {results['sdk']['host_cpu_us']:.1f} us of host-thread CPU per call (target <= "
                  f"{TARGET_SDK_US:.0f}): {'met' if t['sdk_met'] else 'MISSED'}; "
                  f"{results['sdk']['sink_payloads']} OTLP payloads reached the sink\n")
    if "sdk_down_met" in t:
        out.write(f"sdk-down: wall p99.9 {results['sdk-down']['p999_us']:.1f} us per call "
                  f"(target <= {TARGET_DOWN_P999_US:.0f}): {'met' if t['sdk_down_met'] else 'MISSED'}\n")
    out.write(f"load average {results['load_average']:.2f} on {os.cpu_count()} CPUs (other processes inflate the "
              "wall figures, not the CPU ones)\n")


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
    results = measure_all(args.calls, setups)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        report(results)
    return 0 if all(v for k, v in results["targets"].items() if k.endswith("_met")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
