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
from collections.abc import Callable
from typing import Any

import turnguard as tg
from turnguard.telemetry import configure
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


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(**extra: Any) -> tg.GuardConfig:
    return tg.GuardConfig(load_entrypoints=False, **extra)


def measure(make_guard: Callable[[], tg.Guard], turns: int) -> dict[str, float]:
    guard = make_guard()
    drive(guard, max(2, turns // 10))  # warm-up: imports, caches, first exports
    gc.collect()
    return stats(drive(guard, turns))


def run(calls: int = 60_000) -> dict[str, Any]:
    """Every setup's figures, the targets and whether they were met."""
    turns = max(4, calls // CALLS_PER_TURN)
    results: dict[str, Any] = {}
    results["core"] = measure(lambda: tg.Guard(config(disable_plugins=("otel",))), turns)
    results["no-sdk"] = measure(lambda: tg.Guard(config()), turns)

    with Sink() as sink:
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                                       "OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_SERVICE_NAME": "bench"})
        try:
            results["sdk"] = measure(lambda: tg.Guard(config(), **telemetry.providers()), turns)
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "turns.jsonl")
                results["sdk-recorder"] = measure(
                    lambda: tg.Guard(config(recorder_path=path), **telemetry.providers()), turns
                )
        finally:
            telemetry.force_flush(10_000)
            telemetry.shutdown()
    results["sdk"]["sink_payloads"] = sink.counts

    telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
                                   "OTEL_EXPORTER_OTLP_TIMEOUT": "300", "OTEL_BSP_SCHEDULE_DELAY": "100",
                                   "OTEL_BLRP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "200"})
    quiet = logging.getLogger("opentelemetry")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # every failed export logs an error; not the subject here
    try:
        results["sdk-down"] = measure(lambda: tg.Guard(config(), **telemetry.providers()), turns)
    finally:
        telemetry.shutdown()
        quiet.setLevel(level)

    results["targets"] = {
        "sdk_mean_us": TARGET_SDK_MEAN_US,
        "sdk_down_p999_us": TARGET_DOWN_P999_US,
        "sdk_mean_met": results["sdk"]["mean_us"] <= TARGET_SDK_MEAN_US,
        "sdk_down_p999_met": results["sdk-down"]["p999_us"] <= TARGET_DOWN_P999_US,
    }
    return results


def report(results: dict[str, Any], out: Any = sys.stdout) -> None:
    out.write(f"{'setup':<14}{'calls':>8}{'mean us':>10}{'p50':>9}{'p99':>9}{'p99.9':>9}{'max':>10}\n")
    for name in ("core", "no-sdk", "sdk", "sdk-recorder", "sdk-down"):
        r = results[name]
        out.write(f"{name:<14}{r['calls']:>8}{r['mean_us']:>10.1f}{r['p50_us']:>9.1f}{r['p99_us']:>9.1f}"
                  f"{r['p999_us']:>9.1f}{r['max_us']:>10.1f}\n")
    t = results["targets"]
    out.write(f"\nsdk mean {results['sdk']['mean_us']:.1f} us/call (target <= {t['sdk_mean_us']:.0f}): "
              f"{'met' if t['sdk_mean_met'] else 'MISSED'}\n")
    out.write(f"sdk-down p99.9 {results['sdk-down']['p999_us']:.1f} us/call (target <= {t['sdk_down_p999_us']:.0f}): "
              f"{'met' if t['sdk_down_p999_met'] else 'MISSED'}\n")
    out.write(f"sink received {results['sdk']['sink_payloads']} OTLP payloads\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60_000, help="calls measured per setup")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    results = run(args.calls)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        report(results)
    return 0 if results["targets"]["sdk_mean_met"] and results["targets"]["sdk_down_p999_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
