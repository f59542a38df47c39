"""collector-config.yaml, checked statically (the real Collector runs it in test_collector_chain.py).

The static checks are the project's rules, which ``validate`` cannot see: memory_limiter first,
every server bound to localhost unless ``OTELCOL_LISTEN_HOST`` says otherwise, every endpoint from
an environment variable with a default, no deprecated or unknown prometheus_remote_write key (that
exporter ignores unknown keys at v0.161, so a typo there would pass ``validate``), the Collector's
own metrics exported, and each signal routed where the dashboards and ``turnguard calibrate``
expect it. They also catch a removed component type or a dangling reference before a Collector is
built.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import optional_dependency

yaml = optional_dependency("yaml")

CONFIG_PATH = Path(__file__).resolve().parents[1] / "collector-config.yaml"
SECTIONS = ("receivers", "processors", "exporters", "connectors", "extensions")

CURRENT_TYPES: dict[str, frozenset[str]] = {
    # Types shipped in otelcol-contrib (distributions/otelcol-contrib/manifest.yaml), current names.
    "receivers": frozenset({"otlp", "prometheus", "hostmetrics", "filelog", "k8s_cluster", "kubeletstats"}),
    "processors": frozenset(
        {"memory_limiter", "batch", "resource", "attributes", "redaction", "transform", "filter",
         "resourcedetection", "k8sattributes"}
    ),
    "exporters": frozenset({"otlp_grpc", "otlp_http", "prometheus_remote_write", "prometheus", "file", "debug", "nop"}),
    "connectors": frozenset({"spanmetrics", "forward", "count"}),
    "extensions": frozenset({"health_check", "pprof", "zpages", "file_storage"}),
}
REMOVED_OR_DEPRECATED: dict[str, dict[str, str]] = {
    "exporters": {
        "otlp": "renamed otlp_grpc in v0.144.0",
        "otlphttp": "renamed otlp_http in v0.144.0",
        "loki": "removed in v0.131.0; send to Loki's /otlp endpoint with otlp_http",
        "logging": "removed; use debug",
        "prometheusremotewrite": "renamed prometheus_remote_write",
        "jaeger": "removed; Jaeger and Tempo take OTLP",
    },
    "receivers": {"prometheusremotewrite": "renamed prometheus_remote_write"},
}
PRW_KEYS = frozenset({
    # prometheusremotewriteexporter v0.161.0 Config's mapstructure keys, less the deprecated ones
    # (the flat HTTP client keys, add_metric_suffixes, resource_to_telemetry_conversion)
    "timeout", "retry_on_failure", "namespace", "remote_write_queue", "external_labels", "http",
    "max_batch_size_bytes", "max_batch_request_parallelism", "resource_constant_labels", "wal", "target_info",
    "disable_scope_info", "translation_strategy", "send_metadata", "protobuf_message", "include_metadata_keys",
    "convert_explicit_histograms_to_nhcb", "keep_classic_histograms",
})
LISTEN_HOST = "OTELCOL_LISTEN_HOST"
SERVER_ENDPOINTS = ("receivers.otlp.protocols.grpc", "receivers.otlp.protocols.http", "extensions.health_check")
PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
ENV_WITH_DEFAULT = re.compile(r"env:([A-Z_][A-Z0-9_]*):-(.+)")


def component_type(component_id: str) -> str:
    """``otlp_http/loki`` -> ``otlp_http``."""
    return component_id.split("/", 1)[0]


def expand(value: str, environ: dict[str, str] | None = None) -> str:
    """Resolve ``${env:NAME:-default}`` the way the Collector does (the variable, else the default)."""
    return PLACEHOLDER.sub(lambda m: _resolve(m.group(1), environ or {}), value)


def _resolve(placeholder: str, environ: dict[str, str]) -> str:
    match = ENV_WITH_DEFAULT.fullmatch(placeholder)
    if not match:
        raise ValueError(f"placeholder ${{{placeholder}}} is not ${{env:NAME:-default}}")
    return environ.get(match.group(1), match.group(2))


def placeholders(value: Any, path: str = "") -> list[tuple[str, str]]:
    """Every ``${...}`` in the config, with where it is."""
    if isinstance(value, str):
        return [(path, m.group(1)) for m in PLACEHOLDER.finditer(value)]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in placeholders(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in placeholders(v, f"{path}[{i}]")]
    return []


def problems(config: dict[str, Any]) -> list[str]:
    """What the Collector (or the project's rules) would reject in ``config``."""
    found: list[str] = []
    for section in SECTIONS:
        for component_id in config.get(section) or {}:
            kind = component_type(component_id)
            why = REMOVED_OR_DEPRECATED.get(section, {}).get(kind)
            if why:
                found.append(f"{section}.{component_id}: {why}")
            elif kind not in CURRENT_TYPES[section]:
                found.append(f"{section}.{component_id}: unknown component type {kind!r}")
    service = config.get("service") or {}
    for ext in service.get("extensions") or []:
        if ext not in (config.get("extensions") or {}):
            found.append(f"service.extensions: {ext!r} is not defined")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        found.append("service.pipelines: none defined")
    for name, pipeline in pipelines.items():
        for role in ("receivers", "processors", "exporters"):
            for ref in pipeline.get(role) or []:
                defined = config.get(role) or {}
                connectors = config.get("connectors") or {}
                if ref not in defined and not (role in ("receivers", "exporters") and ref in connectors):
                    found.append(f"pipeline {name}: {role[:-1]} {ref!r} is not defined")
        processors = pipeline.get("processors") or []
        if not processors or component_type(processors[0]) != "memory_limiter":
            found.append(f"pipeline {name}: memory_limiter must be the first processor, got {processors}")
        if not pipeline.get("receivers") or not pipeline.get("exporters"):
            found.append(f"pipeline {name}: needs receivers and exporters")
    for where, placeholder in placeholders(config):
        if not ENV_WITH_DEFAULT.fullmatch(placeholder):
            found.append(f"{where}: ${{{placeholder}}} has no default (use ${{env:NAME:-default}})")
    for where in SERVER_ENDPOINTS:
        endpoint = str(_at(config, where).get("endpoint", ""))
        if not endpoint.startswith(f"${{env:{LISTEN_HOST}:-localhost}}:"):
            found.append(f"{where}: binds {endpoint or 'the default'}, not ${{env:{LISTEN_HOST}:-localhost}}:PORT")
    for component_id, settings in (config.get("exporters") or {}).items():
        if component_type(component_id) == "prometheus_remote_write":
            unknown = set(settings or {}) - PRW_KEYS
            if unknown:
                found.append(f"exporters.{component_id}: deprecated or unknown keys {sorted(unknown)}")
    return found


def _at(config: dict[str, Any], dotted: str) -> dict[str, Any]:
    node: Any = config
    for part in dotted.split("."):
        node = (node or {}).get(part) or {}
    return node


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.safe_load(CONFIG_PATH.read_text())


def pipeline_exporter_types(config: dict[str, Any], signal: str) -> dict[str, str]:
    """Exporter id -> type for the pipelines carrying ``signal`` (``traces``, ``traces/x``...)."""
    out = {}
    for name, pipeline in config["service"]["pipelines"].items():
        if component_type(name) == signal:
            out.update({ref: component_type(ref) for ref in pipeline["exporters"]})
    return out


def test_shipped_config_has_no_problems(config):
    assert problems(config) == []


def test_every_server_binds_localhost_unless_the_listen_host_says_otherwise(config):
    telemetry = config["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    servers = {where: _at(config, where)["endpoint"] for where in SERVER_ENDPOINTS}
    servers["service.telemetry"] = f"{telemetry['host']}:{telemetry['port']}"
    for where, endpoint in servers.items():
        assert expand(endpoint).startswith("localhost:"), where
        assert expand(endpoint, {LISTEN_HOST: "0.0.0.0"}).startswith("0.0.0.0:"), where
    assert expand(servers["receivers.otlp.protocols.grpc"]) == "localhost:4317"
    assert expand(servers["receivers.otlp.protocols.http"]) == "localhost:4318"


def test_the_collectors_own_metrics_are_served_for_prometheus(config):
    (reader,) = config["service"]["telemetry"]["metrics"]["readers"]
    prometheus = reader["pull"]["exporter"]["prometheus"]
    assert expand(str(prometheus["port"])) == "8888"
    assert prometheus["without_type_suffix"] is False, "the boards and alerts query otelcol_*_total counters"


def test_metrics_go_to_prometheus_by_remote_write(config):
    exporters = pipeline_exporter_types(config, "metrics")
    assert "prometheus_remote_write" in exporters.values()
    prw = next(config["exporters"][e] for e, t in exporters.items() if t == "prometheus_remote_write")
    assert expand(prw["http"]["endpoint"]).endswith("/api/v1/write")
    assert prw["translation_strategy"] == "UnderscoreEscapingWithSuffixes", "the dashboards query _total/_bucket names"


def test_traces_go_to_tempo_over_otlp_grpc(config):
    exporters = pipeline_exporter_types(config, "traces")
    tempo = [e for e, t in exporters.items() if t == "otlp_grpc"]
    assert tempo, exporters
    assert expand(config["exporters"][tempo[0]]["endpoint"]) == "tempo:4317"


def test_logs_go_to_lokis_otlp_endpoint(config):
    exporters = pipeline_exporter_types(config, "logs")
    loki = [e for e, t in exporters.items() if t == "otlp_http"]
    assert loki, exporters
    endpoint = expand(config["exporters"][loki[0]]["endpoint"])
    assert endpoint.endswith("/otlp"), "otlp_http appends /v1/logs itself; Loki serves OTLP under /otlp"


def test_traces_are_written_as_otlp_json_lines_for_calibration(config):
    files = [e for e, t in pipeline_exporter_types(config, "traces").items() if t == "file"]
    assert files, "the traces pipeline has no file exporter"
    settings = config["exporters"][files[0]]
    assert settings.get("format", "json") == "json"
    assert expand(settings["path"]).endswith(".jsonl")


def test_spans_and_log_records_reach_the_calibration_file_and_metrics_do_not(config):
    """``turnguard calibrate`` reads ``resourceSpans`` lines (the turns) and ``resourceLogs`` lines
    (their late results, ``turnguard.turn.result``) from one file; metric lines would be bad input."""
    traces = {e for e, t in pipeline_exporter_types(config, "traces").items() if t == "file"}
    logs = {e for e, t in pipeline_exporter_types(config, "logs").items() if t == "file"}
    assert traces and logs == traces, (traces, logs)
    assert "file" not in pipeline_exporter_types(config, "metrics").values()


def test_every_endpoint_comes_from_an_env_var_with_a_default(config):
    """Each placeholder having a default is one of ``problems``; here: no endpoint is left hard-coded."""
    found = placeholders(config)
    assert found, "no ${env:...} placeholders at all"
    endpoint_keys = [
        f"{section}.{name}" + (".http" if "endpoint" in ((settings or {}).get("http") or {}) else "")
        for section in ("exporters", "extensions") for name, settings in (config.get(section) or {}).items()
        if "endpoint" in (settings or {}) or "endpoint" in ((settings or {}).get("http") or {})
    ]
    placed = {where.rsplit(".", 1)[0] for where, _ in found}
    assert set(endpoint_keys) <= placed, set(endpoint_keys) - placed


def _pipeline(config, name):
    return config["service"]["pipelines"][name]


def _undefined_exporter(c):
    _pipeline(c, "logs")["exporters"].append("otlp_http/nowhere")


def _memory_limiter_second(c):
    c["processors"]["batch"] = {}
    _pipeline(c, "traces")["processors"].insert(0, "batch")


def _removed_loki_exporter(c):
    c["exporters"]["loki"] = {"endpoint": "http://loki:3100/loki/api/v1/push"}


def _deprecated_otlphttp_name(c):
    c["exporters"]["otlphttp/x"] = {"endpoint": "http://x"}


def _unknown_type(c):
    c["processors"]["memorylimiter"] = {}


def _env_without_default(c):
    c["exporters"]["otlp_grpc/tempo"]["endpoint"] = "${env:TEMPO}"


def _receiver_on_every_interface(c):
    c["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = "0.0.0.0:4317"


def _health_check_without_listen_host(c):
    c["extensions"]["health_check"]["endpoint"] = "${env:OTELCOL_HEALTH_ENDPOINT:-localhost:13133}"


def _flat_remote_write_endpoint(c):
    c["exporters"]["prometheus_remote_write"]["endpoint"] = "http://prometheus:9090/api/v1/write"


def _deprecated_metric_suffixes(c):
    c["exporters"]["prometheus_remote_write"]["add_metric_suffixes"] = True


def _misspelt_remote_write_key(c):
    c["exporters"]["prometheus_remote_write"]["translation_stratgy"] = "NoTranslation"


def _undefined_extension(c):
    c["service"]["extensions"].append("pprof")


BROKEN_CONFIGS = {
    "undefined exporter in a pipeline": _undefined_exporter,
    "memory_limiter not first": _memory_limiter_second,
    "removed loki exporter": _removed_loki_exporter,
    "deprecated otlphttp name": _deprecated_otlphttp_name,
    "unknown component type": _unknown_type,
    "env var without a default": _env_without_default,
    "receiver on every interface by default": _receiver_on_every_interface,
    "health check without the listen host": _health_check_without_listen_host,
    "flat remote-write endpoint": _flat_remote_write_endpoint,
    "deprecated add_metric_suffixes": _deprecated_metric_suffixes,
    "misspelt remote-write key": _misspelt_remote_write_key,
    "undefined extension": _undefined_extension,
}


@pytest.mark.parametrize("name", sorted(BROKEN_CONFIGS))
def test_the_checks_reject_a_broken_config(config, name):
    broken = copy.deepcopy(config)
    BROKEN_CONFIGS[name](broken)
    assert problems(broken), f"{name} went unnoticed"
