"""dashboards/provisioning/: what Grafana needs to load the boards and their data sources from files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import optional_dependency

yaml = optional_dependency("yaml")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboards import queries  # noqa: E402

PROVISIONING = ROOT / "dashboards" / "provisioning"


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


def test_rate_interval_hint_is_set(datasources):
    prometheus = next(ds for ds in datasources if ds["type"] == "prometheus")
    assert prometheus["jsonData"]["timeInterval"].endswith("s")
