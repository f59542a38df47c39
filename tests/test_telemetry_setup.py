"""``turnguard.telemetry.configure()``: SDK providers from the OTEL_* variables, no globals by default."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

import turnguard as tg
from turnguard.telemetry import Telemetry, TelemetryConfigError, configure
from turnguard.telemetry._breaker import BreakerSpanExporter
from turnguard.telemetry._metrics import instruments_for
from turnguard.telemetry._setup import resolve

SRC = Path(__file__).resolve().parent.parent / "src"
LOCAL = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "200"}


@pytest.fixture
def configured():
    made: list[Telemetry] = []

    def build(**kwargs):
        telemetry = configure(**kwargs)
        made.append(telemetry)
        return telemetry

    yield build
    for telemetry in made:
        telemetry.shutdown()


def test_http_endpoints_get_the_signal_paths_and_per_signal_variables_win():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://loki:3100/otlp/v1/logs",
    }
    assert resolve("traces", env).endpoint == "http://collector:4318/v1/traces"
    assert resolve("metrics", env).endpoint == "http://collector:4318/v1/metrics"
    assert resolve("logs", env).endpoint == "http://loki:3100/otlp/v1/logs"
    assert resolve("logs", env, endpoint="http://arg:1").endpoint == "http://arg:1/v1/logs"  # an argument wins


def test_defaults_follow_the_otlp_spec():
    traces = resolve("traces", {})
    assert (traces.protocol, traces.endpoint, traces.timeout_s, traces.exporter) == (
        "http/protobuf", "http://localhost:4318/v1/traces", 10.0, "otlp",
    )
    grpc = resolve("traces", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc.endpoint == "http://localhost:4317"


def test_grpc_endpoint_is_used_as_given():
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    assert resolve("metrics", env).endpoint == "http://collector:4317"


def test_headers_are_parsed_and_url_decoded_per_signal_overriding():
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc, x-tenant = t1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-tenant=traces-tenant",
    }
    assert dict(resolve("traces", env).headers) == {"authorization": "Bearer abc", "x-tenant": "traces-tenant"}
    assert dict(resolve("logs", env).headers) == {"authorization": "Bearer abc", "x-tenant": "t1"}


def test_timeout_is_milliseconds():
    assert resolve("traces", {"OTEL_EXPORTER_OTLP_TIMEOUT": "1500"}).timeout_s == 1.5
    assert resolve("traces", {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "250"}).timeout_s == 0.25
    both = {"OTEL_EXPORTER_OTLP_TIMEOUT": "1500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1"}
    assert resolve("traces", both).timeout_s == 0.001  # the per-signal value wins when set


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "no-equals-sign"}, "OTEL_EXPORTER_OTLP_HEADERS"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "localhost:4318"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ],
)
def test_bad_variables_are_rejected_with_their_name(env, names):
    with pytest.raises(TelemetryConfigError, match=names):
        configure(environ=env)


def test_builds_sdk_providers_without_touching_the_globals(configured):
    before = (trace.get_tracer_provider(), metrics.get_meter_provider(), get_logger_provider())
    telemetry = configured(environ={**LOCAL, "OTEL_SERVICE_NAME": "svc", "OTEL_RESOURCE_ATTRIBUTES": "team=core"})
    assert (trace.get_tracer_provider(), metrics.get_meter_provider(), get_logger_provider()) == before
    assert isinstance(telemetry.tracer_provider, TracerProvider)
    assert isinstance(telemetry.meter_provider, MeterProvider)
    assert isinstance(telemetry.logger_provider, LoggerProvider)
    resource = telemetry.tracer_provider.resource.attributes
    assert resource["service.name"] == "svc" and resource["team"] == "core"
    assert [s.endpoint for s in telemetry.settings] == [
        "http://127.0.0.1:9/v1/traces", "http://127.0.0.1:9/v1/metrics", "http://127.0.0.1:9/v1/logs",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        telemetry.tracer_provider = None  # type: ignore[misc]


def test_service_name_argument_wins(configured):
    telemetry = configured(environ={**LOCAL, "OTEL_SERVICE_NAME": "from-env"}, service_name="from-arg")
    assert telemetry.tracer_provider.resource.attributes["service.name"] == "from-arg"


def test_guard_accepts_the_providers(configured):
    telemetry = configured(environ=LOCAL)
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **telemetry.providers())
    plugin = guard.pm.get_plugin("otel")
    # the plugin reports into these providers, not the (no-op proxy) globals
    assert plugin.tracer.resource is telemetry.tracer_provider.resource
    assert plugin.logger.resource is telemetry.logger_provider.resource
    assert plugin.instruments is instruments_for(telemetry.meter_provider, guard.config)
    with guard.turn() as turn:
        assert turn.check_call(tg.ToolCall("x", 1)).action is tg.Action.ALLOW


def test_grpc_protocol_builds_grpc_exporters(configured):
    telemetry = configured(environ={**LOCAL, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    processors = telemetry.tracer_provider._active_span_processor._span_processors
    exporter = processors[0]._batch_processor._exporter
    assert isinstance(exporter, BreakerSpanExporter)
    assert type(exporter.inner).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")


def test_none_exporters_export_nothing(configured):
    env = {**LOCAL, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    telemetry = configured(environ=env)
    assert telemetry.tracer_provider._active_span_processor._span_processors == ()
    assert telemetry.force_flush(1000)


def test_sdk_disabled_gives_no_op_providers(configured):
    telemetry = configured(environ={"OTEL_SDK_DISABLED": "true"})
    assert not isinstance(telemetry.tracer_provider, TracerProvider)
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), **telemetry.providers())
    with guard.turn() as turn:
        assert turn.check_call(tg.ToolCall("x", 1)).action is tg.Action.ALLOW
    telemetry.shutdown()


def test_shutdown_is_idempotent(configured):
    telemetry = configured(environ=LOCAL)
    telemetry.shutdown()
    telemetry.shutdown()


def test_batch_processor_sizes_come_from_the_environment(configured):
    telemetry = configured(environ={**LOCAL, "OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_SCHEDULE_DELAY": "250"})
    batch = telemetry.tracer_provider._active_span_processor._span_processors[0]._batch_processor
    assert (batch._max_queue_size, batch._max_export_batch_size, batch._schedule_delay) == (100, 100, 0.25)


@pytest.mark.parametrize(
    "env",
    [{"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, {"OTEL_BLRP_MAX_EXPORT_BATCH_SIZE": "99999"}, {"OTEL_BSP_SCHEDULE_DELAY": "x"},
     {"OTEL_BSP_MAX_QUEUE_SIZE": "1.5"}, {"OTEL_BLRP_MAX_QUEUE_SIZE": "abc"}],
)
def test_bad_batch_settings_are_rejected(env):
    with pytest.raises(TelemetryConfigError, match=next(iter(env))) as error:
        configure(environ={**LOCAL, **env})
    assert "milliseconds" not in str(error.value) or "SCHEDULE_DELAY" in str(error.value)  # sizes are counts


DURATION_VARS = ["OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                 "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT",
                 "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BLRP_SCHEDULE_DELAY"]


@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", "1e400", "nan", "NaN", "-1", "-0.5", "1e300",
                                   str(10**30), "86400001", "0x10", "10ms", " "])
@pytest.mark.parametrize("var", DURATION_VARS)
def test_a_duration_variable_out_of_range_is_a_telemetry_config_error_naming_it(var, value):
    if not value.strip():
        configure(environ={**LOCAL, var: value}).shutdown()  # blank: unset, the default
        return
    with pytest.raises(TelemetryConfigError, match=var):
        configure(environ={**LOCAL, var: value})


@pytest.mark.parametrize(("value", "seconds"), [("1", 0.001), ("86400000", 86400), ("2500.9", 2.5), ("1e3", 1)])
def test_durations_up_to_a_day_are_taken_as_milliseconds(value, seconds):
    settings = resolve("traces", {"OTEL_EXPORTER_OTLP_TIMEOUT": value})
    assert settings.timeout_s == seconds


NUMERIC_VARS = [*DURATION_VARS, *(f"{prefix}{what}" for prefix in ("OTEL_BSP_", "OTEL_BLRP_")
                                  for what in ("MAX_QUEUE_SIZE", "MAX_EXPORT_BATCH_SIZE"))]
"""Every number ``configure()`` reads from an ``OTEL_*`` variable."""


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("value", ["0", "0.0", "0.5", "-1", "-0", "x", "", "1e400", "1e30", str(10**30), "nan",
                                   "-inf", "0x10", "1_000"])
@pytest.mark.parametrize("var", NUMERIC_VARS)
def test_every_numeric_otel_variable_gives_providers_or_a_telemetry_config_error_naming_it(var, value, protocol,
                                                                                          monkeypatch):
    """0, a fraction below one, negative, non-numeric and huge values: ``configure()`` builds working
    providers or raises ``TelemetryConfigError`` naming the variable, never a bare ``ValueError`` or
    ``OverflowError`` from the SDK (``OTEL_METRIC_EXPORT_INTERVAL=0`` and ``OTEL_BSP_SCHEDULE_DELAY=0``
    were). The SDK reads some variables itself, so the process environment holds them too."""
    env = {**LOCAL, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, var: value}
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    try:
        telemetry = configure(environ=env)
    except TelemetryConfigError as exc:
        assert str(exc).startswith(f"{var}="), str(exc)
        return
    assert not value.strip() or float(value) >= 1, "a value below 1 was taken"
    telemetry.shutdown()


@pytest.mark.parametrize("var", NUMERIC_VARS)
def test_the_smallest_and_largest_accepted_values_build_working_providers(var, monkeypatch, configured):
    largest = {"MAX_QUEUE_SIZE": "2147483647", "MAX_EXPORT_BATCH_SIZE": "2048"}.get(var.split("_", 2)[2], "86400000")
    for value in ("1", largest):
        monkeypatch.setenv(var, value)
        configured(environ={**LOCAL, var: value})
    with pytest.raises(TelemetryConfigError, match=f"^{var}="):
        configure(environ={**LOCAL, var: str(int(largest) + 1)})


@pytest.mark.parametrize(("var", "value"), [
    ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-1"), ("OTEL_ATTRIBUTE_COUNT_LIMIT", "x"),
    ("OTEL_SPAN_EVENT_COUNT_LIMIT", "1.5"), ("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", "1e400"),
    ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-5"), ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "nan"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip"), ("OTEL_EXPORTER_OTLP_LOGS_COMPRESSION", "0"),
    ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "brotli"), ("OTEL_METRICS_EXEMPLAR_FILTER", "sometimes"),
])
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_value_the_sdk_refuses_for_a_variable_it_reads_itself_names_that_variable(var, value, protocol,
                                                                                  monkeypatch):
    env = {**LOCAL, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, var: value}
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    threads = set(threading.enumerate())
    with pytest.raises(TelemetryConfigError, match=var) as caught:
        configure(environ=env)
    assert not isinstance(caught.value.__cause__, TelemetryConfigError)
    assert set(threading.enumerate()) <= threads  # refused before any processor or reader started


def test_an_sdk_that_refuses_a_variable_as_it_is_imported_is_a_telemetry_config_error_in_a_fresh_process(tmp_path):
    """The SDK reads the span limits when ``opentelemetry.sdk.trace`` is first imported."""
    code = ("from turnguard.telemetry import configure, TelemetryConfigError\n"
            "try:\n    configure()\nexcept TelemetryConfigError as exc:\n    print(exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TURNGUARD_"))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, **LOCAL, "OTEL_SPAN_EVENT_COUNT_LIMIT": "-3", "PYTHONPATH": str(SRC)})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("OTEL_SPAN_EVENT_COUNT_LIMIT='-3': the OpenTelemetry SDK refused it"), done.stdout


@pytest.mark.parametrize(("argument", "value"), [("timeout_ms", 0), ("timeout_ms", -1), ("timeout_ms", True),
                                                 ("timeout_ms", 86_400_001), ("timeout_ms", 2.5)])
def test_a_timeout_argument_out_of_range_is_a_telemetry_config_error(argument, value):
    with pytest.raises(TelemetryConfigError, match=f"^{argument}="):
        configure(environ=LOCAL, **{argument: value})


@pytest.mark.parametrize(("env", "named"), [
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"),
    ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "loki:3100"}, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT: OTLP endpoint"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector"}, "OTEL_EXPORTER_OTLP_ENDPOINT: OTLP endpoint"),
])
def test_a_protocol_or_endpoint_names_the_variable_it_came_from(env, named):
    with pytest.raises(TelemetryConfigError) as caught:
        configure(environ=env)
    assert str(caught.value).startswith(named), str(caught.value)


COMPRESSION_VARS = ["OTEL_EXPORTER_OTLP_COMPRESSION"] + [f"OTEL_EXPORTER_OTLP_{s}_COMPRESSION"
                                                         for s in ("TRACES", "METRICS", "LOGS")]


@pytest.mark.parametrize("value", ["none", "deflate", "gzip", " GZip ", ""])
@pytest.mark.parametrize("var", COMPRESSION_VARS)
def test_every_compression_the_http_exporter_can_send_with_builds_providers(var, value, monkeypatch, configured):
    monkeypatch.setenv(var, value)
    configured(environ={**LOCAL, var: value})


@pytest.mark.parametrize("value", ["zip", "0", "brotli", "gzip,deflate", "snappy"])
@pytest.mark.parametrize("var", COMPRESSION_VARS)
def test_an_http_compression_the_exporter_cannot_use_is_refused_naming_the_variable_whatever_the_sdk(
        var, value, monkeypatch):
    """SDK 1.44's HTTP exporter raised on such a value, 1.45's sends uncompressed with a warning."""
    monkeypatch.setenv(var, value)
    with pytest.raises(TelemetryConfigError, match=f"^{var}={value!r}: expected one of") as caught:
        configure(environ={**LOCAL, var: value})
    assert caught.value.__cause__ is None


@pytest.mark.parametrize("own_is_wrong", [False, True])
@pytest.mark.parametrize("signal", ["traces", "metrics", "logs"])
def test_a_signals_own_compression_wins_over_the_generic_one_for_that_signal_only(signal, own_is_wrong):
    own, generic = f"OTEL_EXPORTER_OTLP_{signal.upper()}_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"
    env = {own: "zip", generic: "gzip"} if own_is_wrong else {own: "gzip", generic: "zip"}
    for each in ("traces", "metrics", "logs"):
        reads = own if each == signal else generic
        if env[reads] == "zip":
            with pytest.raises(TelemetryConfigError, match=f"^{reads}='zip'"):
                resolve(each, env)
        else:
            assert resolve(each, env).protocol == "http/protobuf"
