"""The provisioning assets (dashboards/provisioning/): what Grafana needs to load the
boards and their data sources from files."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import optional_dependency

yaml = optional_dependency("yaml")

ROOT = Path(__file__).resolve().parents[1]

optional_dependency("grafana_foundation_sdk")

from turnguard._boards import build, queries  # noqa: E402

PROVISIONING = queries.BOARDS / "provisioning"


@pytest.fixture(scope="module")
def providers():
    files = sorted((PROVISIONING / "dashboards").glob("*.yaml"))
    assert files, "no dashboard provider"
    return [p for f in files for p in yaml.safe_load(f.read_text())["providers"]]


@pytest.fixture(scope="module")
def datasources():
    files = sorted((PROVISIONING / "datasources").glob("*.yaml"))
    assert files, "no datasource file"
    documents = [yaml.safe_load(f.read_text()) for f in files]
    assert all(d["apiVersion"] == 1 for d in documents)
    return [ds for d in documents for ds in d["datasources"]]


def test_dashboards_load_from_files_and_stay_code_owned(providers):
    (provider,) = providers
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")
    assert provider["allowUiUpdates"] is False, "UI edits would be lost on the next build"
    assert provider["disableDeletion"] is True


def test_one_default_prometheus_datasource_matches_the_boards_variable(datasources):
    prometheus = [ds for ds in datasources if ds["type"] == "prometheus"]
    assert len(prometheus) == 1 and prometheus[0].get("isDefault") is True
    for board in queries.boards(ROOT / "dashboards").values():
        variable = next(v for v in board["templating"]["list"] if v["type"] == "datasource")
        assert variable["query"] == prometheus[0]["type"]


def test_the_whole_chain_has_datasources_with_unique_uids(datasources):
    assert {ds["type"] for ds in datasources} == {"prometheus", "tempo", "loki"}
    uids = [ds["uid"] for ds in datasources]
    assert len(set(uids)) == len(uids)
    linked = [ds["jsonData"]["tracesToLogsV2"]["datasourceUid"] for ds in datasources if ds["type"] == "tempo"]
    assert set(linked) <= set(uids)
    for ds in datasources:
        assert ds["url"].startswith("http://"), ds


def sdk_export_interval_s(monkeypatch) -> float:
    """The metric export interval ``turnguard.telemetry.configure()`` gives its reader by default."""
    from opentelemetry.sdk.metrics import export

    from turnguard.telemetry import configure

    intervals = []

    class Reader(export.PeriodicExportingMetricReader):
        def __init__(self, exporter, export_interval_millis=None, **options):
            intervals.append(export_interval_millis)
            super().__init__(exporter, export_interval_millis=export_interval_millis, **options)

    monkeypatch.setattr(export, "PeriodicExportingMetricReader", Reader)
    configure(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}).shutdown()
    (interval,) = intervals
    return interval / 1000


def grafana_rate_interval_s(interval_s: float, scrape_s: float) -> float:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
    return max(interval_s + scrape_s, 4 * scrape_s)


def test_rate_windows_hold_at_least_two_samples_at_the_export_interval(datasources, monkeypatch):
    optional_dependency("opentelemetry.sdk")
    prometheus = next(ds for ds in datasources if ds["type"] == "prometheus")
    time_interval = prometheus["jsonData"]["timeInterval"]
    assert time_interval.endswith("s")
    scrape = float(time_interval[:-1])
    export = sdk_export_interval_s(monkeypatch)
    assert scrape == export == build.EXPORT_INTERVAL_S
    # $__interval is never below the data source's time interval: the narrowest window Grafana asks for
    assert grafana_rate_interval_s(scrape, scrape) / export >= 2


def test_exemplars_link_to_the_provisioned_tempo(datasources):
    prometheus = next(ds for ds in datasources if ds["type"] == "prometheus")
    tempo = next(ds for ds in datasources if ds["type"] == "tempo")
    (link,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": tempo["uid"]}
