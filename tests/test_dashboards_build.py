"""turnguard.boards.build: the committed JSON is what the code builds, and the build follows the config."""

from __future__ import annotations

import json
import re

import pytest

from conftest import optional_dependency

optional_dependency("grafana_foundation_sdk")

from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.cog.plugins import register_default_plugins  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard  # noqa: E402

from turnguard.boards import build, queries  # noqa: E402
from turnguard.config import GuardConfig  # noqa: E402
from turnguard.telemetry import buckets  # noqa: E402

BUCKET_MATCHER = re.compile(r"\bturnguard[_:](\w+?)_bucket(?::increase5m)?\{[^}]*le=~`([^`(]+)\(")
"""A bucket selector, raw (``turnguard_x_bucket``) or recorded (``turnguard:x_bucket:increase5m``): x and le."""


def test_committed_json_matches_a_fresh_build():
    for name, text in build.build_all().items():
        committed = build.OUT / name
        assert committed.exists(), f"{name} is not committed: run python -m turnguard.boards.build"
        assert committed.read_text() == text, f"{name} is stale: run python -m turnguard.boards.build"


def test_every_committed_board_is_built_by_the_code():
    assert set(queries.boards(build.OUT)) == set(build.BOARDS)


def test_check_flag_fails_on_a_stale_or_missing_board(tmp_path, capsys):
    assert build.main(["--out", str(tmp_path)]) == 0
    assert build.main(["--check", "--out", str(tmp_path)]) == 0
    halts = tmp_path / build.FILES[build.HALTS_UID]
    halts.write_text(halts.read_text().replace('"editable": false', '"editable": true'))
    assert build.main(["--check", "--out", str(tmp_path)]) == 1
    assert "turnguard-halts.json is stale" in capsys.readouterr().err
    halts.unlink()
    assert build.main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("name", sorted(build.FILES.values()))
def test_boards_round_trip_through_the_sdk_models(name):
    register_default_plugins()
    original = json.loads((build.OUT / name).read_text())
    again = json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(original)))
    assert again["uid"] == original["uid"]
    assert [(p["id"], p["type"]) for p in again["panels"]] == [(p["id"], p["type"]) for p in original["panels"]]
    assert list(queries.panel_queries(again)) == list(queries.panel_queries(original))


def test_a_different_guard_config_moves_the_what_if_buckets(tmp_path):
    assert build.main(["--out", str(tmp_path), "--soft-cap", "250", "--hard-multiplier", "8",
                       "--stuck-repeat-threshold", "4"]) == 0
    board = json.loads((tmp_path / build.FILES[build.THRESHOLDS_UID]).read_text())
    exprs = {(q.panel_id, q.ref_id): q.expr for q in queries.panel_queries(board)}
    assert "le=~`500(\\.0)?`" in exprs[(12, "A")]  # 2 x 250
    assert "le=~`5000(\\.0)?`" in exprs[(12, "E")]  # 20 x 250
    assert "le=~`2000(\\.0)?`" in exprs[(4, "F")]  # past the backstop 250 x 8
    assert "- 250 *" in exprs[(23, "A")]
    assert "le=~`2(\\.0)?`" in exprs[(31, "A")]  # below D - 1 = 3
    titles = {p["id"]: p["title"] for p in queries.panels(board)}
    assert titles[2] == "Tool calls per turn (soft cap 250, backstop 2000)"


@pytest.mark.parametrize(("soft_cap", "multiplier", "d"),
                         [(100, 10, 6), (250, 8, 4), (100, 1.15, 6), (40, 2.5, 3), (100, 10, 15)])
def test_every_bucket_a_panel_queries_is_an_edge_the_guard_exports(soft_cap, multiplier, d):
    """A ``le`` that is not a bucket edge matches no series: the panel would be silently empty."""
    config = GuardConfig(soft_cap=soft_cap, hard_multiplier=multiplier, stuck_repeat_threshold=d)
    edges = {build.TOOL_CALLS.removeprefix("turnguard_"): buckets.tool_call_edges(config),
             build.MAX_REPEAT.removeprefix("turnguard_"): buckets.repeat_edges(config)}
    board = build.threshold_validation_dashboard(build.CapSettings.from_config(config))
    queried = [(m.group(1), float(m.group(2).replace("\\", "")))
               for q in queries.panel_queries(json.loads(build.render(board))) for m in BUCKET_MATCHER.finditer(q.expr)]
    assert {metric for metric, _ in queried} == set(edges)
    for metric, le in queried:
        assert le in edges[metric], f"{metric} has no bucket le={le:g}"
    assert (build.TOOL_CALLS.removeprefix("turnguard_"), config.hard_cap) in queried  # the backstop band's edge


def test_a_fractional_multiplier_keeps_bands_ordered():
    cap = build.CapSettings(soft_cap=100, hard_multiplier=2.5, stuck_repeat_threshold=6)
    assert cap.bands() == [(0, 100), (100, 200), (200, 250), (250, None)]


def test_shadow_policy_panels_land_in_their_own_row_with_reserved_ids(monkeypatch):
    from grafana_foundation_sdk.builders import stat

    shipped = len(build.shadow_policy_panels(build.DEFAULTS))
    panel = stat.Panel().id(build.SHADOW_PANEL_IDS[1]).title("Shadow halts").unit("short")
    monkeypatch.setattr(build, "shadow_policy_panels", lambda cap: [panel])
    board = json.loads(build.render(build.threshold_validation_dashboard()))
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert rows[-1]["title"] == "Shadow policies" and rows[-1]["id"] == build.SHADOW_PANEL_IDS[0]
    assert board["panels"][-1]["id"] == build.SHADOW_PANEL_IDS[1]
    committed = json.loads((build.OUT / build.FILES[build.THRESHOLDS_UID]).read_text())
    shadow_ids = [p["id"] for p in queries.panels(committed) if p["id"] in build.SHADOW_PANEL_IDS]
    assert shadow_ids == [p["id"] for p in committed["panels"][-len(shadow_ids):]]  # the row comes last
    assert shadow_ids[0] == build.SHADOW_PANEL_IDS[0] and len(shadow_ids) == 1 + shipped


@pytest.mark.parametrize("edge", [1, 100, 200, 1000, 2000, 250.5])
def test_bucket_matcher_accepts_both_exporters_formats_of_an_edge(edge):
    """The Python pull exporter writes ``le="200.0"``, the Collector's remote write ``le="200"``."""
    matcher = re.search(r"le=~`([^`]*)`", build.le_sel(edge)).group(1)
    python_format = f"{float(edge)}"
    go_format = f"{edge:g}" if float(edge).is_integer() else repr(float(edge))
    assert re.fullmatch(matcher, python_format) and re.fullmatch(matcher, go_format)
    for neighbour in (edge * 10, edge + 1, float(edge) * 10):
        assert not re.fullmatch(matcher, f"{neighbour:g}") and not re.fullmatch(matcher, f"{float(neighbour)}")


@pytest.mark.parametrize("bad", [["--soft-cap", "0"], ["--soft-cap", "-5"], ["--hard-multiplier", "0.5"],
                                 ["--stuck-repeat-threshold", "zero"]])
def test_build_refuses_thresholds_it_cannot_chart(tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build.main(["--out", str(tmp_path), *bad])
    assert exit_info.value.code == 2
    assert not list(tmp_path.iterdir())
    assert "error:" in capsys.readouterr().err
