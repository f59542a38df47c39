"""The shipped Collector config, run by the Collector built from the shipped builder manifest.

``validate`` proves structure (types, keys, references) with the deprecated settings made errors;
the runs prove behaviour: spans reach the file exporter in a form ``turnguard calibrate`` replays
to the same figures as the recorder's file of the same turns, and the Collector's own metrics,
scraped by Prometheus, tell a working pipeline from a broken one on the halts board's Collector
row and in the export-failure alert.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chain
from conftest import optional_dependency

yaml = optional_dependency("yaml")
optional_dependency("grafana_foundation_sdk")
optional_dependency("opentelemetry.exporter.otlp.proto.http")

import fleet  # noqa: E402
import turnguard as tg  # noqa: E402
from turnguard import _cli as cli  # noqa: E402
from turnguard._boards import build, halts, queries, rules, series  # noqa: E402
from turnguard.telemetry import configure  # noqa: E402

pytestmark = [pytest.mark.slow]

STRICT_GATES = ("exporter.prometheusremotewritexporter.removeTopLevelHTTPSettings,"
                "exporter.prometheusremotewrite.DisableResourceToTelemetryConversion")
"""Alpha gates that turn the deprecated prometheus_remote_write settings into start-up errors."""
SRC = Path(__file__).resolve().parent.parent / "src"
SECTIONS = ("receivers", "processors", "exporters", "extensions", "connectors")
MIX = fleet.FleetMix(short=40, long=8, soft_stuck=8, runaway=3, failing_unattended=8, ask_continue=6, ask_stop=6,
                     ask_late_continue=4, explicit=6)


@pytest.fixture(scope="module")
def otelcol() -> str:
    return chain.collector()


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.safe_load(chain.COLLECTOR_CONFIG.read_text())


def validate(binary: str, path: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, "validate", f"--config={path}", f"--feature-gates={STRICT_GATES}"],
                          capture_output=True, text=True, timeout=60, cwd=workdir,
                          env={"PATH": "/usr/bin:/bin", "OTELCOL_CALIBRATE_FILE": str(workdir / "otlp.jsonl")})


def test_the_build_has_exactly_the_components_the_config_uses(otelcol, config):
    listed = yaml.safe_load(subprocess.run([otelcol, "components"], capture_output=True, text=True, timeout=60,
                                           check=True).stdout)
    built = {section: {c["name"] for c in listed.get(section) or []} for section in SECTIONS}
    used = {section: {name.split("/", 1)[0] for name in config.get(section) or {}} for section in SECTIONS}
    assert built == used


def test_the_collector_validates_the_shipped_config_with_deprecated_settings_refused(otelcol, tmp_path):
    result = validate(otelcol, chain.COLLECTOR_CONFIG, tmp_path)
    assert result.returncode == 0, result.stderr


def _flat_remote_write_endpoint(c: dict[str, Any]) -> None:
    prw = c["exporters"]["prometheus_remote_write"]
    prw["endpoint"] = prw.pop("http")["endpoint"]


def _resource_to_telemetry(c: dict[str, Any]) -> None:
    c["exporters"]["prometheus_remote_write"]["resource_to_telemetry_conversion"] = {"enabled": True}


def _unknown_key(c: dict[str, Any]) -> None:
    # (prometheus_remote_write v0.161 ignores unknown keys: test_collector_config.py checks its keys)
    c["exporters"]["file/calibrate"]["rotate"] = {"max_megabytes": 100}


def _undefined_exporter(c: dict[str, Any]) -> None:
    c["service"]["pipelines"]["logs"]["exporters"].append("otlp_http/nowhere")


def _component_not_built(c: dict[str, Any]) -> None:
    c["processors"]["batch"] = {}
    c["service"]["pipelines"]["traces"]["processors"].append("batch")


@pytest.mark.parametrize("breakage", [_flat_remote_write_endpoint, _resource_to_telemetry, _unknown_key,
                                      _undefined_exporter, _component_not_built], ids=lambda f: f.__name__[1:])
def test_validate_rejects_what_the_shipped_config_avoids(otelcol, config, tmp_path, breakage):
    broken = json.loads(json.dumps(config))
    breakage(broken)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert validate(otelcol, path, tmp_path).returncode != 0


# -- spans through the Collector's file exporter, replayed by calibrate ---------------------------


@contextlib.contextmanager
def quiet_fleet() -> Iterator[None]:
    log = logging.getLogger("turnguard")
    level = log.level
    log.setLevel(logging.CRITICAL)  # the fleet's flaky plugin raises on purpose
    try:
        yield
    finally:
        log.setLevel(level)


def calibrate_json(path: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["calibrate", str(path), "--json", "-"]) == 0
    result = json.loads(out.getvalue())
    result.pop("inputs")
    return result


def calibrate_text(path: Path, *flags: str) -> str:
    """``--json`` as calibrate writes it for ``path`` read as ``in.jsonl`` from a folder of its own
    (a link beside it): two files' outputs then differ only where their turns do."""
    folder = path.parent / f"as-in-{path.stem}"
    folder.mkdir()
    (folder / "in.jsonl").symlink_to(path)
    out = io.StringIO()
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out):
            assert cli.main(["calibrate", "in.jsonl", *flags, "--progress", "never", "--json", "-"]) == 0
    finally:
        os.chdir(cwd)
    return out.getvalue()


def turn_spans(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip()
               for resource in json.loads(line).get("resourceSpans", ()) for scope in resource["scopeSpans"]
               for span in scope["spans"] if span["name"].startswith("invoke_agent"))


def result_records(path: Path) -> int:
    """The ``turnguard.turn.result`` log records (late results) in the Collector's file."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip()
               for resource in json.loads(line).get("resourceLogs", ()) for scope in resource["scopeLogs"]
               for record in scope["logRecords"] if record.get("eventName") == "turnguard.turn.result")


def test_the_collectors_span_file_calibrates_like_the_recorders_file(otelcol, tmp_path, caplog):
    """Byte-identical ``--json`` from both files of one fleet, its polling turns replayed with their
    ``stateful_tools`` and the default grid's D=3 rows included."""
    caplog.set_level(logging.WARNING, logger="turnguard.telemetry")  # a failed export, and the breaker's drops
    collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=f"http://127.0.0.1:{chain.free_port()}")
    try:
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                       "OTEL_SERVICE_NAME": "turnguard-chain", "OTEL_METRIC_EXPORT_INTERVAL": "600000",
                                       # every span of the fleet fits the queue: a loaded machine may not
                                       # export as fast as the fleet ends spans, and a full queue drops them
                                       "OTEL_BSP_MAX_QUEUE_SIZE": "100000", "OTEL_BLRP_MAX_QUEUE_SIZE": "100000",
                                       # nor answer an export within the default 10 s: a timed-out export
                                       # opens the breaker, which drops the next batches (by design)
                                       "OTEL_EXPORTER_OTLP_TIMEOUT": "60000"})
        recorded = tmp_path / "turns.jsonl"
        config = tg.GuardConfig(load_entrypoints=False, recorder_path=str(recorded))
        with quiet_fleet():
            tally = fleet.run_fleet(fleet.make_fleet(config, **telemetry.providers()), MIX)
        assert telemetry.force_flush(30_000)
        telemetry.shutdown()
        failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                    and r.name.startswith(("turnguard.telemetry", "opentelemetry"))]
        assert not failures, f"exports failed, so spans were dropped: {failures}\n{collector.log_tail()}"
        chain.wait_until("every turn span in the Collector's file",
                         lambda: turn_spans(collector.otlp_file) == len(tally.turns), collector.exited, timeout=60)
    finally:
        collector.stop()
    polling = tmp_path / "polling.toml"
    polling.write_text(f"stateful_tools = {json.dumps(list(fleet.POLL_TOOLS))}\n")
    from_collector = calibrate_text(collector.otlp_file, "--config", str(polling))
    assert from_collector == calibrate_text(recorded, "--config", str(polling))  # byte for byte
    result = json.loads(from_collector)
    assert result["turns"] == len(tally.turns) == MIX.turns
    assert {p["params"]["stuck_repeat"] for p in result["policies"]} >= {3}  # the D=3 rows too
    assert result["recording"]["policies"], "the turns' limits were read"


REPORTER = """
import sys
import turnguard as tg
from turnguard.telemetry import configure
endpoint, record, *reports = sys.argv[1:]
telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                               "OTEL_SERVICE_NAME": "ci-verdicts", "OTEL_EXPORTER_OTLP_TIMEOUT": "60000"})
guard = tg.Guard(tg.GuardConfig(name="ci", soft_cap=7, load_entrypoints=False, recorder_path=record),
                 **telemetry.providers())
taken = [guard.report_result(token, verdict == "true") for token, verdict in zip(reports[::2], reports[1::2])]
assert telemetry.force_flush(30_000)
telemetry.shutdown()
print(sum(taken))
"""


def test_late_results_from_another_process_reach_calibrate_through_the_collectors_file(otelcol, tmp_path):
    """Results reported in this process by turn id and in another OS process by result token
    travel as turnguard.turn.result log records through the Collector's file exporter, and
    calibrate on that file joins each to its turn: the same counts as the recorders' files."""
    collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=f"http://127.0.0.1:{chain.free_port()}")
    try:
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                       "OTEL_METRIC_EXPORT_INTERVAL": "600000", "OTEL_EXPORTER_OTLP_TIMEOUT": "60000"})
        recorded = tmp_path / "turns.jsonl"
        guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, recorder_path=str(recorded), soft_cap=10,
                                        hard_multiplier=3), **telemetry.providers())
        turns = []
        for i in range(12):
            with guard.turn(agent_name="coder") as turn:
                for k in range(5 + 4 * i):  # the longer ones reach the backstop (30)
                    if turn.check_call(tg.ToolCall("read", {"k": k})).halted:
                        break
            turns.append(turn)
        here = [guard.report_result(t.turn_id, True) for t in turns[:3]]
        assert telemetry.force_flush(30_000)
        telemetry.shutdown()
        verdicts = [(t.result_token, "true" if i < 3 else "false") for i, t in enumerate(turns[3:8])]
        verdicts.append(verdicts[0])  # a duplicate: the first result stands
        there = subprocess.run(
            [sys.executable, "-c", REPORTER, collector.otlp_http, str(tmp_path / "ci.jsonl"),
             *(part for pair in verdicts for part in pair)],
            capture_output=True, text=True, timeout=120, check=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        assert here == [True] * 3 and there.stdout.split() == ["5"]
        chain.wait_until("every turn span and late result in the Collector's file",
                         lambda: (turn_spans(collector.otlp_file), result_records(collector.otlp_file)) == (12, 8),
                         collector.exited, timeout=60)
    finally:
        collector.stop()
    from_collector = calibrate_json(collector.otlp_file)
    assert (from_collector["turns"], from_collector["resolved"], from_collector["unresolved"]) == (12, 6, 2)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["calibrate", str(recorded), str(tmp_path / "ci.jsonl"), "--json", "-"]) == 0
    from_recorders = json.loads(out.getvalue())
    from_recorders.pop("inputs")
    assert from_collector == from_recorders


def _spans(path: Path) -> list[dict[str, Any]]:
    return [span for line in path.read_text().splitlines() if line.strip()
            for resource in json.loads(line).get("resourceSpans", ()) for scope in resource["scopeSpans"]
            for span in scope["spans"]]


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    def value(v: dict[str, Any]) -> Any:
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", ())]
        return next(iter(v.values()), None)
    return {a["key"]: value(a["value"]) for a in span.get("attributes", ())}


def test_the_collectors_file_carries_the_recorders_result_digests_and_tool_lists(otelcol, tmp_path):
    """What calibrate needs to replay polling from the Collector's file as from the recorder's: each
    tool span's ``turnguard.call.result_digest`` is the recorder line's ``result`` of that call, and
    the turn span names the ``stateful_tools`` and ``streak_exempt_tools`` the line's ``limits`` do."""
    collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=f"http://127.0.0.1:{chain.free_port()}")
    try:
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                       "OTEL_METRIC_EXPORT_INTERVAL": "600000", "OTEL_EXPORTER_OTLP_TIMEOUT": "60000"})
        recorded = tmp_path / "turns.jsonl"
        guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, recorder_path=str(recorded),
                                        stateful_tools=("ci_status",), streak_exempt_tools=("sleep",)),
                         **telemetry.providers())
        for i in range(3):
            with guard.turn(agent_name="ci") as turn:
                calls = [("ci_status", "queued"), ("ci_status", "queued"), ("ci_status", f"done-{i}"),
                         ("sleep", "ok"), ("read", "text")]
                for tool, answer in calls:
                    c = tg.ToolCall(tool, {"job": i})
                    turn.check_call(c)
                    turn.record_outcome(c, tg.Outcome.OK, result={"state": answer})
        assert telemetry.force_flush(30_000)
        telemetry.shutdown()
        chain.wait_until("every turn span in the Collector's file", lambda: turn_spans(collector.otlp_file) == 3,
                         collector.exited, timeout=60)
    finally:
        collector.stop()
    spans = _spans(collector.otlp_file)
    turns = {_attrs(s)["turnguard.turn.id"]: s for s in spans if s["name"].startswith("invoke_agent")}
    for line in map(json.loads, recorded.read_text().splitlines()):
        turn = turns[line["id"]]
        calls = sorted((_attrs(s) for s in spans if s.get("parentSpanId") == turn["spanId"]),
                       key=lambda a: int(a["turnguard.call.index"]))
        assert [a.get("turnguard.call.result_digest") for a in calls] == [c.get("result") for c in line["calls"]]
        assert len({c.get("result") for c in line["calls"][:3]}) == 2  # the polled answer changed once
        limits = _attrs(turn)
        assert (limits["turnguard.loop.stateful_tools"], limits["turnguard.streak.exempt_tools"]) == (
            line["limits"]["stateful_tools"], line["limits"]["streak_exempt_tools"]) == (["ci_status"], ["sleep"])


# -- the Collector's own metrics on the halts board -------------------------------------------------


def _scrape(target: str) -> str:
    return ("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: {build.COLLECTOR_JOB}\n    static_configs: [{{targets: ['{target}']}}]\n")


def _collector_row(prometheus: chain.Prometheus, at: float) -> dict[tuple[int, str], float]:
    """Each Collector-row query over the last minute: (panel, ref) -> the sum of its series."""
    values = {"__range": "60s", "__rate_interval": "60s", "__rate_interval_ms": "60000", "agent": ".*"}
    board = queries.boards()[build.HALTS_UID]
    row = {p.build().id_val for p in build.collector_panels()}
    return {(q.panel_id, q.ref_id): sum(float(s["value"][1]) for s in prometheus.query(queries.resolve(q.expr, values),
                                                                                          at))
            for q in queries.panel_queries(board) if q.panel_id in row}


def _export_failure_alert() -> str:
    rules = yaml.safe_load(chain.RULES.read_text())
    return next(r["expr"] for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "TurnguardCollectorExportFailing")


PIPELINES = ("remote-write-up", "remote-write-refused", "prometheus-down")
"""Where the remote write sends: Prometheus's write path; a path Prometheus refuses (Cortex's push
path: 404, never retried); a port nothing listens on."""


def _sink(prometheus: chain.Prometheus, pipeline: str) -> str:
    return {"remote-write-up": prometheus.remote_write_url, "remote-write-refused": f"{prometheus.url}/api/v1/push",
            "prometheus-down": f"http://127.0.0.1:{chain.free_port()}/api/v1/write"}[pipeline]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_collector_row_tells_a_broken_pipeline_from_a_quiet_one_and_tries_from_drops(otelcol, tmp_path, pipeline):
    """A refused remote write (a wrong path) fails both legs of the metrics: the remote write's one try
    per request and the queue in front of it, which drops the request: panel 51's dropped points. An
    unreachable Prometheus only fails tries (the queue keeps the points): panel 51's failed tries, no
    drops, and no refusals on panel 52 though the loopback receiver between the legs refuses each
    failed try (the panel leaves it out). The agents' receiver refuses nothing either way."""
    prometheus = chain.Prometheus(chain.prometheus2(), tmp_path, "")
    collector = None
    try:
        collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=_sink(prometheus, pipeline))
        prometheus.reload(_scrape(collector.telemetry_target))
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                       "OTEL_METRIC_EXPORT_INTERVAL": "600000"})
        with quiet_fleet():
            fleet.run_fleet(fleet.make_fleet(tg.GuardConfig(load_entrypoints=False), **telemetry.providers()),
                            fleet.FleetMix(short=20, long=0, soft_stuck=2, runaway=0, failing_unattended=2,
                                           ask_continue=2, ask_stop=0, ask_late_continue=0, explicit=2))
        assert telemetry.force_flush(30_000)
        telemetry.shutdown()

        def settled() -> dict[tuple[int, str], float] | None:
            row = _collector_row(prometheus, time.time())
            failing = {"remote-write-up": True, "remote-write-refused": row[(51, "A")] > 0,
                       "prometheus-down": row[(51, "B")] > 0}[pipeline]
            refused = prometheus.query(f"sum({series.OTELCOL_REFUSED}{{receiver=\"{halts.QUEUE_RECEIVER}\"}})",
                                       time.time())
            internal = pipeline == "remote-write-up" or sum(float(r["value"][1]) for r in refused) > 0
            return row if row[(52, "A")] > 0 and failing and internal else None

        row = chain.wait_until("the Collector's metrics in Prometheus", settled, prometheus.exited)
        alert = prometheus.query(_export_failure_alert(), time.time())
        refused = prometheus.query(f'sum by (receiver) ({series.OTELCOL_REFUSED})', time.time())
    finally:
        if collector is not None:
            collector.stop()
        prometheus.stop()
    refusals = {r["metric"]["receiver"]: float(r["value"][1]) for r in refused}
    assert refusals["otlp"] == 0 and row[(52, "B")] == 0, "the agents' metric points were refused"
    dropped = sum(row[(53, ref)] for ref in "ABC")
    if pipeline == "remote-write-up":
        assert row[(51, "A")] == row[(51, "B")] == dropped == row[(53, "D")] == 0 and alert == []
        assert refusals[halts.QUEUE_RECEIVER] == 0
    elif pipeline == "remote-write-refused":
        assert row[(51, "A")] > 0 and dropped > 0 and row[(51, "B")] > 0 and row[(53, "D")] > 0
        assert sorted(a["metric"]["exporter"] for a in alert) == ["otlp_http/queue", "prometheus_remote_write"]
    else:
        assert row[(51, "A")] == 0 and dropped == 0, "failed tries counted as dropped points"
        assert row[(51, "B")] > 0 and row[(53, "D")] > 0
        assert [a["metric"]["exporter"] for a in alert] == ["prometheus_remote_write"]


# -- exemplars: a halt's point links to the trace of its turn ------------------------------------------


def span_ids(path: Path) -> dict[str, str]:
    """span id -> trace id of every span in the Collector's file (its log lines hold none)."""
    return {span["spanId"]: span["traceId"] for line in path.read_text().splitlines() if line.strip()
            for resource in json.loads(line).get("resourceSpans", ()) for scope in resource["scopeSpans"]
            for span in scope["spans"]}


def test_halts_reach_prometheus_with_exemplars_naming_the_halted_calls_span(otelcol, tmp_path):
    prometheus = chain.Prometheus(chain.prometheus2(), tmp_path, "", ["--enable-feature=exemplar-storage"])
    collector = None
    try:
        collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=prometheus.remote_write_url)
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                       "OTEL_METRIC_EXPORT_INTERVAL": "600000"})
        with quiet_fleet():
            tally = fleet.run_fleet(fleet.make_fleet(tg.GuardConfig(load_entrypoints=False), **telemetry.providers()),
                                    fleet.FleetMix(short=4, long=0, soft_stuck=2, runaway=2, failing_unattended=2,
                                                   ask_continue=0, ask_stop=0, ask_late_continue=0, explicit=0))
        assert telemetry.force_flush(30_000)
        telemetry.shutdown()

        def halt_exemplars() -> list[dict[str, str]]:
            now = time.time()
            found = prometheus.api("query_exemplars", query=f'{series.DETECTIONS}{{{series.ACTION}="halt"}}',
                                   start=f"{now - 600:.3f}", end=f"{now + 5:.3f}")
            return [e["labels"] for series in found for e in series["exemplars"]]

        exemplars = chain.wait_until("halt exemplars", halt_exemplars, prometheus.exited)
        chain.wait_until("the spans in the file", lambda: turn_spans(collector.otlp_file) == len(tally.turns),
                         collector.exited, timeout=60)
    finally:
        if collector is not None:
            collector.stop()
        prometheus.stop()
    spans = span_ids(collector.otlp_file)
    assert exemplars and all(spans.get(e["span_id"]) == e["trace_id"] for e in exemplars), exemplars


# -- a Prometheus outage mid-fleet: the records count every turn once -----------------------------------

OUTAGE_TILING = rules.Tiling(tile=2, lag=10)
"""The shipped rules with their tiling shortened: a 2-second tile, a 10-second lag."""
LOOKBACK_S, OUTAGE_S = 15, 35
"""Prometheus's lookback delta here (5 minutes by default) and the outage, longer than it: after it no
series has a sample within the lookback of the records' tile, as after a 10-minute outage in production."""
PHASE = fleet.FleetMix(short=24, long=3, soft_stuck=3, runaway=2, failing_unattended=3, ask_continue=2, ask_stop=2,
                       ask_late_continue=2, explicit=3)
WARM_UP_AGENT = "warm-up"
AUDITED = "turnguard:turns:audited"
BY = (series.AGENT, series.OUTCOME, series.THRESHOLD)


def _outage_rules(workdir: Path) -> str:
    """The shortened rules, and the audited form (the tile's two ends) recorded beside them for comparison."""
    (workdir / "turnguard.rules.yaml").write_text(rules.render(OUTAGE_TILING))
    m, t = series.TURNS, OUTAGE_TILING
    lag, start = rules.duration(t.lag), rules.duration(t.lag + t.tile)
    audited = f"sum by ({', '.join(BY)}) (({m} offset {lag} - {m} offset {start}) >= 0 or {m} offset {lag})"
    (workdir / "audited.rules.yaml").write_text(yaml.safe_dump({"groups": [{
        "name": "audited", "interval": rules.duration(OUTAGE_TILING.tile),
        "rules": [{"record": AUDITED, "expr": audited}]}]}))
    return "global: {evaluation_interval: 1s}\nrule_files: [turnguard.rules.yaml, audited.rules.yaml]\n"


def _counted(prometheus: chain.Prometheus, record: str, since: float) -> tuple[float, Counter[tuple[str, ...]]]:
    """The last evaluation, and what ``record`` counted since ``since`` up to it, by agent, outcome and threshold."""
    last = prometheus.query(f"timestamp({rules.HEARTBEAT})", time.time())
    assert last, "no evaluation of the records yet"
    at = float(last[0]["value"][1])
    span = rules.duration(at - since)
    found = prometheus.query(f'sum by ({", ".join(BY)}) (sum_over_time({record}{{{series.AGENT}!="{WARM_UP_AGENT}"}}'
                             f'[{span}])) != 0', at)
    return at, Counter({tuple(s["metric"].get(k, "") for k in BY): round(float(s["value"][1])) for s in found})


def _truth(tally: fleet.Tally) -> Counter[tuple[str, ...]]:
    return Counter((t.summary.agent_name or "", t.summary.reason,
                    str(t.summary.threshold) if t.summary.threshold is not None else "none")
                   for t in tally.turns if t.summary.agent_name != WARM_UP_AGENT)


ONE_SHOT_RESULTS = 3
"""Late results a one-shot process reports during the outage: its series' only samples are in the gap."""


def _report_late_results(collector: chain.Collector) -> None:
    """Another OS process reports late results by result token and exits (its export queued in the Collector)."""
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False))
    tokens = []
    for _ in range(ONE_SHOT_RESULTS):
        with guard.turn(agent_name="coder") as turn:
            turn.check_call(tg.ToolCall("read", {}))
        tokens += [turn.result_token, "true"]
    there = subprocess.run([sys.executable, "-c", REPORTER, collector.otlp_http, os.devnull, *tokens],
                           capture_output=True, text=True, timeout=120, check=True,
                           env={**os.environ, "PYTHONPATH": str(SRC)})
    assert there.stdout.split() == [str(ONE_SHOT_RESULTS)], there.stderr


def _results(prometheus: chain.Prometheus, at: float, since: float) -> dict[str, float]:
    """Accepted late results: the one-shot process's raw series, every raw series' last value, and the records'
    sum since ``since`` (every results series is born after the store's first state: counted from zero)."""
    accepted = '{turnguard_result_status="accepted"}'
    queries = {"one-shot": f'sum(last_over_time({series.RESULTS}{{job="ci-verdicts"}}[1h]))',
               "raw": f"sum(last_over_time({series.RESULTS}{accepted}[1h]))",
               "recorded": f"sum(sum_over_time({build.RECORDED[series.RESULTS]}{accepted}"
                           f"[{rules.duration(at - since)}]))"}
    return {name: sum(float(s["value"][1]) for s in prometheus.query(q, at)) for name, q in queries.items()}


@pytest.mark.parametrize("binary", ["prometheus2", "prometheus3"])
def test_the_records_count_every_turn_once_through_a_prometheus_outage(otelcol, tmp_path, binary):
    """Turns before, during and after a 35-second outage of Prometheus (its lookback shortened to 15 s,
    so the outage is a real gap), through the shipped Collector: the records count each turn once,
    by agent, outcome and threshold, and the late results of a one-shot process that exported only
    during the outage (its samples land when the Collector's queue delivers them, long before the
    records' window). The audited form, beside them, is wrong: it never counts the
    tiles whose evaluations the outage missed, and counts a series' whole value again where no sample
    is within the lookback of its tile's start (how far the Collector's retries refill the gap decides
    which way it errs)."""
    start_prometheus = getattr(chain, binary)
    config = _outage_rules(tmp_path)
    flags = [f"--query.lookback-delta={LOOKBACK_S}s"]
    prometheus = chain.Prometheus(start_prometheus(), tmp_path, config, flags)
    collector = telemetry = None
    try:
        collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=prometheus.remote_write_url)
        telemetry = configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                       "OTEL_SERVICE_NAME": "turnguard-outage", "OTEL_METRIC_EXPORT_INTERVAL": "1000"})
        fl = fleet.make_fleet(tg.GuardConfig(load_entrypoints=False), **telemetry.providers())
        with tg.Guard(tg.GuardConfig(load_entrypoints=False), **telemetry.providers()).turn(agent_name=WARM_UP_AGENT):
            pass  # the store's first record counts each series from its first sample: these, not the fleet's
        chain.wait_until("the records' first state", lambda: prometheus.query(rules.HEARTBEAT, time.time()),
                         prometheus.exited, timeout=60)
        since = time.time()
        with quiet_fleet():
            fleet.run_fleet(fl, PHASE, seed=11)
            before = _truth(fl.tally)
            chain.wait_until("the records of the turns before the outage",
                             lambda: _counted(prometheus, build.RECORDED[series.TURNS], since)[1] == before,
                             prometheus.exited, timeout=90)
            prometheus.stop()
            down = time.time()
            _report_late_results(collector)
            fleet.run_fleet(fl, PHASE, seed=12)
            time.sleep(max(0.0, down + OUTAGE_S - time.time()))
            restarting = time.time()  # the new Prometheus may evaluate before it answers ready
            prometheus = chain.Prometheus(start_prometheus(), tmp_path, config, flags, port=prometheus.port)
            fleet.run_fleet(fl, PHASE, seed=13)
        assert telemetry.force_flush(30_000)
        truth = _truth(fl.tally)
        assert sum(truth.values()) == 3 * PHASE.turns

        seen: list[Counter[tuple[str, ...]]] = []

        def counted() -> Counter[tuple[str, ...]] | None:
            seen.append(_counted(prometheus, build.RECORDED[series.TURNS], since)[1])
            return seen[-1] if seen[-1] == truth else None

        try:  # the Collector's retries deliver what queued up in the outage when they next try
            chain.wait_until("the records to hold every turn", counted, prometheus.exited, timeout=180)
        except AssertionError as exc:
            last = seen[-1] if seen else Counter()
            raise AssertionError(f"{exc}: missing {truth - last}, extra {last - truth}") from None
        settled = time.time()
        chain.wait_until("three more evaluations", lambda: _counted(prometheus, build.RECORDED[series.TURNS], since)[0]
                         - OUTAGE_TILING.lag > settled + 3 * OUTAGE_TILING.tile, prometheus.exited, timeout=60)
        at, recorded = _counted(prometheus, build.RECORDED[series.TURNS], since)
        _, audited = _counted(prometheus, AUDITED, since)
        results = _results(prometheus, at, since)
        evaluations = prometheus.query(f"count_over_time({rules.HEARTBEAT}[{rules.duration(restarting - down)}])",
                                       restarting)
    finally:
        if telemetry is not None:
            telemetry.shutdown()
        if collector is not None:
            collector.stop()
        prometheus.stop()
    assert recorded == truth, f"later evaluations changed it: missing {truth - recorded}, extra {recorded - truth}"
    assert results["one-shot"] == ONE_SHOT_RESULTS and results["recorded"] == results["raw"], results
    assert not evaluations, "the records were evaluated during the outage: no outage"
    print(f"\n{binary}: {sum(truth.values())} turns; the records counted {sum(recorded.values())}, "
          f"the audited form {sum(audited.values())}")
    assert audited != truth, "the outage did not show: the audited form counted every turn once too"


# -- a one-shot process's export during an outage: held and retried, not dropped ---------------------

ONE_SHOT_OUTAGE_S = 10
"""How long Prometheus stays down after the one-shot process exported: past exporterhelper's 5-second
default push timeout, which once ended the remote write's retries and dropped the export."""


def _go_seconds(duration: str) -> float:
    """A Go duration as the Collector's config writes it (``10m``, ``1m30s``, ``500ms``), in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?", str(duration))
    if str(duration) == "0":
        return 0
    assert parts and duration, f"not a duration this test reads: {duration!r}"
    h, m, sec, ms = (int(x or 0) for x in parts.groups())
    return 3600 * h + 60 * m + sec + ms / 1000


def test_metrics_wait_for_prometheus_in_a_queue_on_disk_that_never_gives_up(config):
    """prometheus_remote_write has no persistent queue: the metrics pass through otlp_http/queue,
    whose sending_queue is on a file_storage extension, delivered in order (one consumer) to the
    loopback receiver feeding the remote write, with retries that never give up. The remote write
    tries each request once, within the queue's own timeout, so its outcome reaches the queue and
    nothing else waits on a dead Prometheus (a Collector stopped in an outage exits at once)."""
    pipelines = config["service"]["pipelines"]
    assert pipelines["metrics"]["exporters"] == ["otlp_http/queue"]
    assert pipelines["metrics/remote_write"]["exporters"] == ["prometheus_remote_write"]
    queue = config["exporters"]["otlp_http/queue"]
    relay = config["receivers"][pipelines["metrics/remote_write"]["receivers"][0]]["protocols"]["http"]["endpoint"]
    assert queue["endpoint"] == f"http://{relay}" and relay.startswith("localhost:")
    sending = queue["sending_queue"]
    assert sending["storage"] in config["service"]["extensions"] and sending["storage"].startswith("file_storage")
    assert sending["num_consumers"] == 1 and "batch" not in sending
    assert queue["retry_on_failure"].get("enabled", True) and _go_seconds(queue["retry_on_failure"]
                                                                          ["max_elapsed_time"]) == 0
    remote = config["exporters"]["prometheus_remote_write"]
    assert remote["retry_on_failure"] == {"enabled": False} and remote["remote_write_queue"] == {"enabled": False}
    assert max(_go_seconds(remote["timeout"]), _go_seconds(remote["http"]["timeout"])) < _go_seconds(queue["timeout"])


def _exporter_points(collector: chain.Collector, outcome: str, exporter: str = "prometheus_remote_write") -> float:
    """``otelcol_exporter_<outcome>_metric_points`` of ``exporter``, from the Collector's own metrics."""
    text = chain.http_get(f"http://{collector.telemetry_target}/metrics").decode()
    name = f"otelcol_exporter_{outcome}_metric_points_total{{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and f'exporter="{exporter}"' in line)


def test_a_one_shot_processs_late_results_reach_prometheus_after_an_outage(otelcol, tmp_path):
    """Another OS process reports late results by result token while Prometheus is down, and exits
    as soon as the Collector took its export. Prometheus comes back on the same store and port 10 s
    later: the Collector's queue held the export (its remote write's tries failing meanwhile) and its
    retries deliver it, so the results counter shows each result, none dropped."""
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False))
    turns = []
    for _ in range(3):
        with guard.turn(agent_name="coder") as turn:
            turn.check_call(tg.ToolCall("read", {}))
        turns.append(turn)
    verdicts = [(turns[0].result_token, "true"), (turns[1].result_token, "true"), (turns[2].result_token, "false")]
    prometheus = chain.Prometheus(chain.prometheus3(), tmp_path, "global: {evaluation_interval: 1s}\n")
    collector = None
    try:
        collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=prometheus.remote_write_url)
        prometheus.stop()
        there = subprocess.run(
            [sys.executable, "-c", REPORTER, collector.otlp_http, str(tmp_path / "ci.jsonl"),
             *(part for pair in verdicts for part in pair)],
            capture_output=True, text=True, timeout=120, check=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        exited = time.time()
        assert there.stdout.split() == ["3"], there.stderr
        time.sleep(max(0.0, exited + ONE_SHOT_OUTAGE_S - time.time()))
        during = {outcome: _exporter_points(collector, outcome, "otlp_http/queue")
                  for outcome in ("sent", "send_failed")}
        tries = _exporter_points(collector, "send_failed")
        prometheus = chain.Prometheus(chain.prometheus3(), tmp_path, "global: {evaluation_interval: 1s}\n",
                                      port=prometheus.port)
        query = f'sum by (turnguard_turn_resolved) ({series.RESULTS}{{turnguard_result_status="accepted"}})'

        def counted() -> dict[str, float] | None:
            found = {s["metric"].get("turnguard_turn_resolved", ""): float(s["value"][1])
                     for s in prometheus.query(query, time.time())}
            return found or None

        try:
            found = chain.wait_until("the late results in Prometheus", counted, prometheus.exited)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the queue's points by the end of the outage: {during}, dropped by "
                                 f"now: {_exporter_points(collector, 'send_failed', 'otlp_http/queue')}") from None
        dropped = _exporter_points(collector, "send_failed", "otlp_http/queue")
    finally:
        if collector is not None:
            collector.stop()
        prometheus.stop()
    assert tries > 0 and during == {"sent": 0, "send_failed": 0}, f"no outage, or it dropped the export: {during}"
    assert (found, dropped) == ({"true": 2, "false": 1}, 0)


# -- a Collector stopped during an outage: its queue on disk, its shutdown bounded -------------------

SHUTDOWN_BOUND_S = 30
"""How long a stopped Collector may take to exit during an outage: the request in flight (the queue
exporter's 10-second timeout over the remote write's 5) and exiting, with room to spare. Before the
queue moved to disk the Collector drained its in-memory queue against the dead Prometheus for ~95 s,
its receivers already closed."""


def _queued(collector: chain.Collector) -> float:
    """Requests the Collector's metrics queue holds (``otelcol_exporter_queue_size`` of otlp_http/queue)."""
    text = chain.http_get(f"http://{collector.telemetry_target}/metrics").decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("otelcol_exporter_queue_size{") and 'exporter="otlp_http/queue"' in line)


def test_a_collector_restarted_during_an_outage_delivers_what_it_had_queued(otelcol, tmp_path):
    """A one-shot process reports late results while Prometheus is down and exits; the Collector
    queues its export on disk, is stopped (it exits promptly, with status 0) and started again on the
    same directory before Prometheus comes back: the export reaches Prometheus once, none dropped."""
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False))
    turns = []
    for _ in range(3):
        with guard.turn(agent_name="coder") as turn:
            turn.check_call(tg.ToolCall("read", {}))
        turns.append(turn)
    verdicts = [(turns[0].result_token, "true"), (turns[1].result_token, "false"), (turns[2].result_token, "true")]
    sink = f"http://127.0.0.1:{chain.free_port()}"
    collector = chain.Collector(otelcol, tmp_path, prometheus_remote_write=f"{sink}/api/v1/write")
    prometheus = None
    try:
        there = subprocess.run(
            [sys.executable, "-c", REPORTER, collector.otlp_http, str(tmp_path / "ci.jsonl"),
             *(part for pair in verdicts for part in pair)],
            capture_output=True, text=True, timeout=120, check=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        assert there.stdout.split() == ["3"], there.stderr
        chain.wait_until("the export in the Collector's queue", lambda: _queued(collector) >= 1, collector.exited)
        stopped = time.monotonic()
        collector.process.terminate()
        code = collector.process.wait(timeout=SHUTDOWN_BOUND_S)
        took = time.monotonic() - stopped
        collector.stop()
        assert code == 0, collector.log_tail()
        assert list(collector.queue_dir.iterdir()), "the queue left nothing on disk"

        collector = chain.Collector(otelcol, tmp_path, ports=collector.ports,
                                    prometheus_remote_write=f"{sink}/api/v1/write")
        assert _queued(collector) >= 1, "the restarted Collector lost the queue"
        prometheus = chain.Prometheus(chain.prometheus2(), tmp_path, "global: {evaluation_interval: 1s}\n",
                                      port=int(sink.rsplit(":", 1)[1]))
        query = f'sum by (turnguard_turn_resolved) ({series.RESULTS}{{turnguard_result_status="accepted"}})'

        def counted() -> dict[str, float] | None:
            found = {s["metric"].get("turnguard_turn_resolved", ""): float(s["value"][1])
                     for s in prometheus.query(query, time.time())}
            return found or None

        found = chain.wait_until("the queued results in Prometheus", counted, prometheus.exited)
        chain.wait_until("the queue to drain", lambda: _queued(collector) == 0, collector.exited)
        dropped = _exporter_points(collector, "send_failed", "otlp_http/queue")
        refusals = [line for line in prometheus.log_tail(100_000).splitlines() if "level=error" in line]
    finally:
        collector.stop()
        if prometheus is not None:
            prometheus.stop()
    print(f"\nthe Collector stopped during the outage exited in {took:.1f} s; {dropped:g} points refused")
    assert found == {"true": 2, "false": 1}
    # The restart puts the request that was in flight behind the one queued after it: Prometheus
    # refuses its older samples as out of order, and the later request carried the same counts on.
    assert all("out of order sample" in line for line in refusals), refusals
    assert bool(dropped) == bool(refusals), (dropped, refusals)
