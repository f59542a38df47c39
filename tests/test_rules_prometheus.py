"""The start-times route for real: Prometheus 3.16 with created-timestamp zero ingestion, fed by the
SDK's OTLP exporter, running the start-times rules (their tiling shortened).

The rules' unit tests give the start's 0 as an input sample; these show that the store really
holds it, and what the rules make of it: a process restarted under the same identity whose count
comes back to the value before is seen; a store emptied while the processes run does not count
their history again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

import chain
from conftest import optional_dependency

optional_dependency("opentelemetry.exporter.otlp.proto.http")

import turnguard as tg  # noqa: E402
from turnguard._boards import rules, series  # noqa: E402
from turnguard.telemetry import configure  # noqa: E402

pytestmark = [pytest.mark.slow]

TILING = rules.Tiling(tile=2, lag=5, start_times=True)
"""The start-times rules with a 2-second tile and a 5-second lag."""
FLAGS = ["--web.enable-otlp-receiver", "--enable-feature=created-timestamp-zero-ingestion",
         "--query.lookback-delta=15s"]
TURNS, RECORD = series.TURNS, rules.RECORDED[series.TURNS]
SINCE = time.time()


CONFIG = "global: {evaluation_interval: 1s}\nrule_files: [rules.yaml]\n"


@pytest.fixture
def servers(tmp_path) -> Iterator[Callable[..., chain.Prometheus]]:
    """Starts Prometheus 3 with the start-times rules in ``tmp_path`` (again, on the same port, to
    restart it); stops every one it started."""
    (tmp_path / "rules.yaml").write_text(rules.render(TILING))
    started: list[chain.Prometheus] = []

    def start(flags: Sequence[str] = FLAGS, port: int | None = None) -> chain.Prometheus:
        started.append(chain.Prometheus(chain.prometheus3(), tmp_path, CONFIG, flags, port=port))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _environ(prometheus: chain.Prometheus, instance: str) -> dict[str, str]:
    """A process's telemetry settings: it exports every second (and when a test flushes)."""
    return {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": prometheus.otlp_metrics_url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "agents",
            "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={instance}",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_TRACES_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none"}


def _telemetry(prometheus: chain.Prometheus, instance: str):
    return configure(environ=_environ(prometheus, instance))


def _turns(telemetry, agent: str, count: int) -> None:
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **telemetry.providers())
    for i in range(count):
        with guard.turn(agent_name=agent, turn_id=f"{agent}-{time.time()}-{i}") as turn:
            turn.check_call(tg.ToolCall("read_file", {"path": f"f{i}"}))


def _recorded(prometheus: chain.Prometheus, agent: str, record: str = RECORD) -> float | None:
    """What ``record`` counted for ``agent`` up to the last evaluation, once it is 6 tiles past now."""
    now = time.time()
    last = prometheus.query(f"timestamp({rules.HEARTBEAT})", now)
    if not last or float(last[0]["value"][1]) - TILING.lag < now - 30:
        return None
    at = float(last[0]["value"][1])
    found = prometheus.query(f'sum(sum_over_time({record}{{gen_ai_agent_name="{agent}"}}[{int(at - SINCE) + 60}s]))',
                             at)
    return float(found[0]["value"][1]) if found else 0.0


def _settled(prometheus: chain.Prometheus, agent: str, expected: float, record: str = RECORD) -> float:
    """``record``'s count for ``agent`` once it equals ``expected`` (or the last seen, after a minute)."""
    seen: list[float | None] = []

    def done() -> bool:
        seen.append(_recorded(prometheus, agent, record))
        return seen[-1] == expected

    with contextlib.suppress(AssertionError):  # the caller compares: its message names the count
        chain.wait_until(f"the records to count {expected} turns of {agent}", done, prometheus.exited)
    return next((v for v in reversed(seen) if v is not None), -1.0)


def _first_values(prometheus: chain.Prometheus, agent: str) -> list[float]:
    series = prometheus.query(f'{TURNS}{{gen_ai_agent_name="{agent}"}}[10m]', time.time())
    return [float(v) for _, v in series[0]["values"]] if series else []


def test_the_store_keeps_a_start_as_0_and_the_records_see_a_restart_back_to_the_value_before(servers):
    """Five turns in one process, then it restarts under the same service.instance.id and does five
    more: the series goes 5, then 0 (the new start, kept by the store), then 5 again. The records
    count 10; without the 0 the restart would be invisible (a count from 5 to 5 is 0)."""
    prometheus = servers()
    first = _telemetry(prometheus, "host-1")
    _turns(first, "restarted", 5)
    assert first.force_flush(10_000)
    chain.wait_until("the first process's 5", lambda: _first_values(prometheus, "restarted")[-1:] == [5.0],
                     prometheus.exited)
    time.sleep(3 * TILING.tile)
    assert first.shutdown(30_000), "the first process's last export did not finish"  # as a process exits
    second = _telemetry(prometheus, "host-1")
    try:
        _turns(second, "restarted", 5)
        assert second.force_flush(10_000)
        values = chain.wait_until("the second process's 5", lambda: (v := _first_values(prometheus, "restarted"))
                                  and v[-1] == 5.0 and 0.0 in v[1:] and v, prometheus.exited)
        counted = _settled(prometheus, "restarted", 10.0)
    finally:
        second.shutdown()
    assert values[0] == 0.0, f"no 0 at the series' start: {values}"
    assert 0.0 in values[1:] and values[-1] == 5.0, values
    assert counted == 10.0


def test_an_emptied_store_does_not_count_the_history_of_running_processes_again(servers, tmp_path):
    """Turns, then Prometheus stopped, its data deleted, restarted: the process's counters are old.
    The records of the new store count only the turns after it began, for the old series and a new one."""
    prometheus = servers()
    telemetry = _telemetry(prometheus, "host-1")
    try:
        born = time.time()
        _turns(telemetry, "old", 7)
        assert telemetry.force_flush(10_000)
        assert _settled(prometheus, "old", 7.0) == 7.0
        # a store counts a series started just before it from its start's 0 (the headers say so): old
        # started longer ago than the first record's reach (its lookback and lag, its fresh window)
        time.sleep(max(0.0, born + 15 + TILING.lag + TILING.fresh_window - time.time()))
        prometheus.stop()
        shutil.rmtree(tmp_path / "data")
        emptied = servers(port=prometheus.port)
        chain.wait_until("the new store's first record",
                         lambda: emptied.query(rules.HEARTBEAT, time.time()), emptied.exited, timeout=60)
        _turns(telemetry, "old", 3)
        _turns(telemetry, "new", 4)
        assert telemetry.force_flush(10_000)
        old, new = _settled(emptied, "old", 3.0), _settled(emptied, "new", 4.0)
        held = _first_values(emptied, "old")
    finally:
        telemetry.shutdown()
    # the new store kept old's start (under an hour back) as a 0, then its first sample holds the history;
    # the start is older than the first record's fresh window (3 tiles), so the records count from that sample
    assert held[0] == 0.0 and held[1] >= 7.0, held
    assert (old, new) == (3.0, 4.0)


ONE_SHOT = """
import sys
import turnguard as tg
from turnguard.telemetry import configure

telemetry = configure()
guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **telemetry.providers())
with guard.turn(agent_name="one-shot", turn_id=sys.argv[1]) as turn:
    turn.check_call(tg.ToolCall("read_file", {"path": "f"}))
assert guard.report_result(turn.result_token, True)
if sys.argv[2] == "flush":
    assert telemetry.force_flush()
"""
"""A process that does one turn, reports its result late by its token, and exits: it flushes first
(as a serverless host does after each call) or leaves that to the exit hook."""


def test_series_flushed_as_they_start_are_counted_from_their_starts(servers):
    """New series whose only export comes right after they start: a one-shot process's (one turn,
    its result reported late by token, then exit, flushing first or by the exit hook) and a
    long-lived host's that flushes after each call (a serverless host). The store keeps each start's
    0 only if it is a millisecond older than the sample, else the records count that sample as nothing."""
    prometheus = servers()
    running = _telemetry(prometheus, "host-1")
    try:
        _turns(running, "long-lived", 1)
        assert running.force_flush(10_000)
        chain.wait_until("the store's first record", lambda: prometheus.query(rules.HEARTBEAT, time.time()),
                         prometheus.exited, timeout=60)
        for i, ending in enumerate(("flush", "exit")):
            env = {**os.environ, **_environ(prometheus, f"job-{i}")}
            done = subprocess.run([sys.executable, "-c", ONE_SHOT, f"job-{i}", ending], env=env,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        for i in range(5):
            _turns(running, f"call-{i}", 1)
            assert running.force_flush(10_000)
        turns = _settled(prometheus, "one-shot", 2.0)
        results = _settled(prometheus, "one-shot", 2.0, rules.RESULTS_RECORD)
        per_call = [_settled(prometheus, f"call-{i}", 1.0) for i in range(5)]
    finally:
        running.shutdown()
    assert (turns, results, per_call) == (2.0, 2.0, [1.0] * 5)


def test_without_the_flag_the_store_keeps_no_start(servers):
    """The start-times rules need the flag: without it the series' first sample is its count."""
    server = servers([f for f in FLAGS if "created" not in f])
    telemetry = _telemetry(server, "host-1")
    try:
        _turns(telemetry, "plain", 2)
        assert telemetry.force_flush(10_000)
        values = chain.wait_until("the series", lambda: _first_values(server, "plain"), server.exited)
    finally:
        telemetry.shutdown()
    assert values[0] == 2.0
