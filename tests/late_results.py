"""Another OS process reporting the probe fleet's late results by result token (a CI run's verdict).

``python tests/late_results.py < request.json`` reads one JSON object on stdin:

- ``results``: ``[[result token, resolved], ...]``, each reported with ``guard.report_result`` on a
  guard of the probe fleet's configuration that never saw the turns (a process of its own);
- ``recorder_path``: where that guard records the results (``null``: no recorder);
- ``digest_key``: the fleet's key (optional; ``null``: none), so that the tokens' labels are trusted;
- ``otlp_endpoint``: an OTLP/HTTP metrics endpoint (``null``: no telemetry), exported to once,
  after the last result, as the service instance ``instance``.

It prints one JSON object: ``taken`` (results the guard took), ``series`` (the Prometheus series
its export holds) and ``at`` (the export's points' time, in Unix seconds). A result the guard
refuses is an error (exit 1, the token on stderr).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()


def report(request: dict[str, Any]) -> dict[str, Any]:
    """Reports ``request``'s results in this process; what it exported."""
    import probe_fleet as pf

    endpoint = request.get("otlp_endpoint")
    options: dict[str, Any] = {"recorder_path": request.get("recorder_path"), "digest_key": request.get("digest_key")}
    if endpoint is None:
        options["disable_plugins"] = ("otel",)
        pf.in_another_guard(pf.probe_config(**options))(request["results"])
        return {"taken": len(request["results"]), "series": 0, "at": None}
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from board_runs import CountingExporter

    exporter = CountingExporter(endpoint)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    provider = MeterProvider(metric_readers=[reader],
                             resource=Resource.create({"service.instance.id": request["instance"]}))
    try:
        pf.in_another_guard(pf.probe_config(**options), meter_provider=provider)(request["results"])
        if not reader.force_flush(30_000):
            raise RuntimeError("the export did not finish")
        (nanos,) = exporter.times
        return {"taken": len(request["results"]), "series": exporter.series, "at": nanos // 1_000_000 / 1000}
    finally:
        provider.shutdown()


def in_another_process(request: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """Runs this script as a process of its own on ``request``; its answer."""
    done = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise AssertionError(f"the other process failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        answer = report(json.load(sys.stdin))
    except AssertionError as exc:  # a refused result (probe_fleet.in_another_guard asserts each)
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
