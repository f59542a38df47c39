"""The real telemetry chain in tests: a Prometheus and a Collector on loopback, started by pid.

Binaries: Debian's ``prometheus`` (2.42, on PATH), Prometheus 3 (``TG_PROMETHEUS3``) and the
Collector built from the shipped builder manifest (``TG_OTELCOL``); ``./dev.sh test`` builds
the last two once, caches them and sets the variables. Without one a test skips, and under CI
(``CI=true``, where ``.ci/run`` installs and builds all three) it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

ASSETS = Path(__file__).resolve().parents[1]
"""The repository's top level, where the deployable files live (``turnguard assets DIR`` writes them)."""
COLLECTOR_CONFIG = ASSETS / "collector-config.yaml"
RULES = ASSETS / "rules" / "turnguard.rules.yaml"


def require(binary: str | None, what: str) -> str:
    """``binary``, or a skip (a failure under CI) naming what is missing and how to get it."""
    if binary and Path(binary).is_file():
        return binary
    message = f"{what} is not available (./dev.sh test builds or installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " and CI=true")
    pytest.skip(message)


def prometheus2() -> str:
    return require(shutil.which("prometheus"), "Debian's prometheus")


def promtool() -> str:
    return require(shutil.which("promtool"), "Debian's promtool")


def promtool_of(which: str) -> str:
    """``promtool-2`` (Debian's Prometheus 2.42) or ``promtool-3`` (beside the Prometheus 3 binary)."""
    if which == "promtool-2":
        return promtool()
    return require(str(Path(prometheus3()).with_name("promtool")), "Prometheus 3's promtool")


def promtool_expressions(promtool: str, folder: Path, series: list[dict[str, str]], tests: list[dict[str, Any]],
                         rules: str = "groups: []\n") -> None:
    """``promtool test rules`` on ``tests`` (promql_expr_test cases) over ``series``, every minute."""
    import yaml

    (folder / "rules.yaml").write_text(rules)
    (folder / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    done = subprocess.run([promtool, "test", "rules", str(folder / "test.yaml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def prometheus3() -> str:
    return require(os.environ.get("TG_PROMETHEUS3"), "Prometheus 3 (TG_PROMETHEUS3)")


def collector() -> str:
    return require(os.environ.get("TG_OTELCOL"), "the turnguard Collector build (TG_OTELCOL)")


HTTP_TIMEOUT_S = 150
"""How long a request to a server here may take: longer than Prometheus's own 2-minute query
timeout, so that a slow answer on a loaded machine is an answer (a query that fails says why) and
only a hung server fails the test."""
WAIT_S = 120
"""How long ``wait_until`` polls by default: a hang guard, generous so that a loaded machine
(a 2-core CI machine at load 10 to 30) only slows a test down."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        return response.read()


def wait_until(what: str, ready: Callable[[], Any], alive: Callable[[], str | None], timeout: float = WAIT_S) -> Any:
    """Poll ``ready`` until it returns something truthy; fail if ``alive`` reports an exit or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = alive()
        if dead:
            raise AssertionError(f"{dead} waiting for {what}")
        try:
            value = ready()
        except (OSError, AssertionError):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


BIND_TRIES = 5
"""Starts of a server on freshly picked ports before a port taken meanwhile fails the test."""


def retrying(start: Callable[[], None], stop: Callable[[], None], *, given: bool) -> None:
    """``start`` a server; on ports picked free (not ``given``) that another socket took before the
    server bound them (an outgoing connection's ephemeral port), ``stop`` it and start it again."""
    for attempt in range(1, BIND_TRIES + 1):
        try:
            start()
            return
        except AssertionError as exc:
            if given or attempt == BIND_TRIES or "address already in use" not in str(exc):
                raise
            stop()


class Process:
    """A server process with its log in ``workdir``; ``stop`` ends it by pid."""

    def __init__(self, name: str, argv: Sequence[str], workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir,
                                        env=None if env is None else {**os.environ, **env})

    def exited(self) -> str | None:
        code = self.process.poll()
        return None if code is None else f"{self.name} exited with {code}: {self.log_tail()}"

    def log_tail(self, chars: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


class Prometheus(Process):
    """A Prometheus on loopback: remote-write (and, on 3.x, OTLP) receiver, ``config`` as its YAML."""

    def __init__(self, binary: str, workdir: Path, config: str, flags: Sequence[str] = (),
                 port: int | None = None) -> None:
        """``port``: a stopped Prometheus's, for a restart; without it, one picked free and, if
        it is taken before Prometheus binds it, another (as ``Collector``)."""
        retrying(lambda: self._start(binary, workdir, config, flags, port), self.stop, given=port is not None)

    def _start(self, binary: str, workdir: Path, config: str, flags: Sequence[str], port: int | None) -> None:
        self.port = port or free_port()  # a restart takes the port its clients write to
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(config)
        super().__init__("prometheus", [
            binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", "--web.enable-remote-write-receiver",
            "--web.enable-lifecycle", *flags], workdir)
        self.config_path = workdir / "prometheus.yml"
        wait_until("prometheus to be ready", lambda: http_get(f"{self.url}/-/ready"), self.exited)

    def reload(self, config: str) -> None:
        """Replace the config (e.g. a scrape target known only after start) and reload it."""
        self.config_path.write_text(config)
        request = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S):
            pass

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return self.api("query", query=expr, time=f"{at:.3f}")["result"]

    @property
    def remote_write_url(self) -> str:
        return f"{self.url}/api/v1/write"

    @property
    def otlp_metrics_url(self) -> str:
        return f"{self.url}/api/v1/otlp/v1/metrics"


class Collector(Process):
    """The shipped collector-config.yaml, run as-is; only its environment variables point it here."""

    def __init__(self, binary: str, workdir: Path, ports: Mapping[str, int] | None = None, **endpoints: str) -> None:
        """``ports``: a stopped Collector's, to restart it where its clients send (its queue is in ``workdir``).
        Without them, ports picked free may be taken before the Collector binds them (an outgoing
        connection's ephemeral port): it is started again on others, up to ``BIND_TRIES`` times."""
        retrying(lambda: self._start(binary, workdir, ports, dict(endpoints)), self.stop, given=bool(ports))

    def _start(self, binary: str, workdir: Path, ports: Mapping[str, int] | None, endpoints: dict[str, str]) -> None:
        self.ports = dict(ports) if ports else {name: free_port() for name in ("grpc", "http", "health", "telemetry",
                                                                              "queue")}
        self.otlp_file = workdir / "otlp.jsonl"
        self.queue_dir = workdir / "queue"
        env = {
            "OTELCOL_LISTEN_HOST": "127.0.0.1",
            "OTELCOL_OTLP_GRPC_PORT": str(self.ports["grpc"]),
            "OTELCOL_OTLP_HTTP_PORT": str(self.ports["http"]),
            "OTELCOL_HEALTH_PORT": str(self.ports["health"]),
            "OTELCOL_TELEMETRY_PORT": str(self.ports["telemetry"]),
            "OTELCOL_QUEUE_PORT": str(self.ports["queue"]),
            "OTELCOL_QUEUE_DIR": str(self.queue_dir),
            "OTELCOL_CALIBRATE_FILE": str(self.otlp_file),
            "TEMPO_OTLP_GRPC_ENDPOINT": endpoints.pop("tempo", f"127.0.0.1:{free_port()}"),
            "LOKI_OTLP_ENDPOINT": endpoints.pop("loki", f"http://127.0.0.1:{free_port()}/otlp"),
            "PROMETHEUS_REMOTE_WRITE_ENDPOINT": endpoints.pop("prometheus_remote_write"),
        }
        assert not endpoints, f"unknown endpoints {endpoints}"
        super().__init__("otelcol", [binary, f"--config={COLLECTOR_CONFIG}"], workdir, env)
        wait_until("the collector's health check", lambda: http_get(f"http://127.0.0.1:{self.ports['health']}/"),
                   self.exited)

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def telemetry_target(self) -> str:
        return f"127.0.0.1:{self.ports['telemetry']}"
