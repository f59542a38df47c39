"""turnguard._boards: the committed JSON is what the code builds, the build follows the configuration, and
``turnguard assets DIR --config`` renders it for the operator's."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from conftest import optional_dependency

yaml = optional_dependency("yaml")

optional_dependency("grafana_foundation_sdk")

from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.cog.plugins import register_default_plugins  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard  # noqa: E402

from turnguard import _assets as assets  # noqa: E402
from turnguard import _cli as cli  # noqa: E402
from turnguard._boards import (  # noqa: E402
    build,
    queries,
    rules,
    series,
    thresholds,
)
from turnguard._boards import promql as q  # noqa: E402
from turnguard._boards.settings import CapSettings  # noqa: E402
from turnguard._config import GuardConfig  # noqa: E402
from turnguard._model import Threshold  # noqa: E402
from turnguard.telemetry import _buckets as buckets  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
BUCKET_MATCHER = re.compile(r"\bturnguard[_:](\w+?)_bucket(?::increase5m)?\{[^}]*le=~([`\"])([^`\"]+)\2")
"""A bucket selector, raw (``turnguard_x_bucket``) or recorded (``turnguard:x_bucket:increase5m``): x and its
``le`` matcher (one edge, or several ``|``-separated, each as ``<edge>(\\.0)?``)."""


BUCKETS_OF = {"turn_tool_calls_fate": "turn_tool_calls"}
"""Records that keep another histogram's buckets (``rules.fates``: the tool-call buckets by fate)."""


def bucket_edges(board: dict) -> list[tuple[str, float]]:
    """(histogram, edge) for every edge every bucket selector of ``board`` matches (``+Inf``, the
    bucket every histogram has, left out)."""
    found = [(BUCKETS_OF.get(m.group(1), m.group(1)), float(edge.split("(")[0].replace("\\", "")))
             for pq in queries.panel_queries(board) for m in BUCKET_MATCHER.finditer(pq.expr)
             for edge in m.group(3).split("|")]
    return [(metric, le) for metric, le in found if le != math.inf]


def test_committed_json_matches_a_fresh_build():
    for name, text in build.build_all().items():
        committed = build.OUT / name
        assert committed.exists(), f"{name} is not committed: run python -m turnguard._boards.build"
        assert committed.read_text() == text, f"{name} is stale: run python -m turnguard._boards.build"


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
    config = tmp_path / "turnguard.toml"
    config.write_text("soft_cap = 250\nhard_multiplier = 8\nstuck_repeat_threshold = 4\n")
    assert build.main(["--out", str(tmp_path), "--config", str(config)]) == 0
    board = json.loads((tmp_path / build.FILES[build.THRESHOLDS_UID]).read_text())
    exprs = {(pq.panel_id, pq.ref_id): pq.expr for pq in queries.panel_queries(board)}
    assert "le=~`500(\\.0)?`" in exprs[(12, "A")]  # 2 x 250
    assert "le=~`1250(\\.0)?`" in exprs[(12, "C")]  # 5 x 250, the last k at or below the backstop (8x)
    assert (12, "D") not in exprs  # 10 x 250 is past it: live turns say nothing there
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
    edges = {series.TOOL_CALLS.removeprefix("turnguard_"): buckets.tool_call_edges(config),
             series.MAX_REPEAT.removeprefix("turnguard_"): buckets.repeat_edges(config)}
    board = thresholds.threshold_validation_dashboard(CapSettings.from_config(config))
    queried = bucket_edges(json.loads(build.render(board)))
    assert {metric for metric, _ in queried} == set(edges)
    for metric, le in queried:
        assert le in edges[metric], f"{metric} has no bucket le={le:g}"
    assert (series.TOOL_CALLS.removeprefix("turnguard_"), config.hard_cap) in queried  # the backstop band's edge


def test_every_request_bucket_the_cycle_frontier_queries_is_an_edge_the_guard_exports():
    """Panel 49's cycle cap rows read the request histogram at the live cap (41: an edge only because
    it is the cap) and beside it, never past the probe's own cycle cap."""
    config = GuardConfig(max_cycles_per_turn=41, probe={"rate": 0.1, "max_cycles_per_turn": 400})
    board = json.loads(build.for_config(config)[build.FILES[build.THRESHOLDS_UID]])
    queried = {le for metric, le in bucket_edges(board) if metric == series.CYCLES.removeprefix("turnguard_")}
    assert 41 in queried and queried <= set(buckets.cycle_edges(config)) and max(queried) < 400
    assert not any(metric == series.CYCLES.removeprefix("turnguard_") for metric, _ in bucket_edges(
        json.loads(build.for_config(config.replace(probe={"rate": 0.1}))[build.FILES[build.THRESHOLDS_UID]])))


def test_a_fractional_multiplier_keeps_bands_ordered():
    cap = CapSettings(soft_cap=100, hard_multiplier=2.5, stuck_repeat_threshold=6)
    assert cap.bands() == [(0, 100), (100, 200), (200, 250), (250, None)]


def test_shadow_policy_panels_land_in_their_own_row_with_reserved_ids(monkeypatch):
    from grafana_foundation_sdk.builders import stat

    shipped = len(thresholds.shadow_policy_panels(build.DEFAULTS))
    panel = stat.Panel().id(thresholds.SHADOW_PANEL_IDS[1]).title("Shadow halts").unit("short")
    monkeypatch.setattr(thresholds, "shadow_policy_panels", lambda cap: [panel])
    board = json.loads(build.render(thresholds.threshold_validation_dashboard()))
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert rows[-1]["title"] == "Shadow policies" and rows[-1]["id"] == thresholds.SHADOW_PANEL_IDS[0]
    assert board["panels"][-1]["id"] == thresholds.SHADOW_PANEL_IDS[1]
    committed = json.loads((build.OUT / build.FILES[build.THRESHOLDS_UID]).read_text())
    shadow_ids = [p["id"] for p in queries.panels(committed) if p["id"] in thresholds.SHADOW_PANEL_IDS]
    assert shadow_ids == [p["id"] for p in committed["panels"][-len(shadow_ids):]]  # the row comes last
    assert shadow_ids[0] == thresholds.SHADOW_PANEL_IDS[0] and len(shadow_ids) == 1 + shipped


@pytest.mark.parametrize("edge", [1, 100, 200, 1000, 2000, 250.5])
def test_bucket_matcher_accepts_both_exporters_formats_of_an_edge(edge):
    """The Python pull exporter writes ``le="200.0"``, the Collector's remote write ``le="200"``."""
    matcher = re.search(r"le=~`([^`]*)`", q.le_sel(edge)).group(1)
    python_format = f"{float(edge)}"
    go_format = f"{edge:g}" if float(edge).is_integer() else repr(float(edge))
    assert re.fullmatch(matcher, python_format) and re.fullmatch(matcher, go_format)
    for neighbour in (edge * 10, edge + 1, float(edge) * 10):
        assert not re.fullmatch(matcher, f"{neighbour:g}") and not re.fullmatch(matcher, f"{float(neighbour)}")


@pytest.mark.parametrize("bad", ["soft_cap = 'many'", "hard_multiplier = 0.5", "stuck_repeat_threshold = 'zero'",
                                 "soft_cap = [", "no_such_option = 1"])
def test_build_refuses_a_configuration_it_cannot_load(tmp_path, bad, capsys):
    config = tmp_path / "turnguard.toml"
    config.write_text(bad + "\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        build.main(["--out", str(out), "--config", str(config)])
    assert exit_info.value.code == 2
    assert not out.exists()
    assert "error:" in capsys.readouterr().err


# -- turnguard assets DIR --config: the boards rendered for the operator's configuration ----------------


def _written(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


SHIPPED = {path.as_posix(): entry.read_bytes() for path, entry in assets.files().items()}
RULES = "rules/turnguard.rules.yaml"


def test_assets_without_a_config_writes_the_shipped_files_byte_for_byte(tmp_path, monkeypatch, capsys):
    (tmp_path / "turnguard.toml").write_text("soft_cap = 250\n")  # found by the search, not asked for
    monkeypatch.chdir(tmp_path)
    assert cli.main(["assets", "deploy"]) == 0
    assert _written(tmp_path / "deploy") == SHIPPED


def test_assets_for_the_default_configuration_is_the_shipped_files(tmp_path, capsys):
    config = tmp_path / "turnguard.toml"
    config.write_text("# every option at its default\n")
    assert cli.main(["assets", str(tmp_path / "deploy"), "--config", str(config)]) == 0
    assert _written(tmp_path / "deploy") == SHIPPED


def test_assets_renders_the_boards_for_the_configuration_and_its_probe(tmp_path, monkeypatch, capsys):
    config = tmp_path / "turnguard.toml"
    config.write_text('name = "prod"\nsoft_cap = 200\nhard_multiplier = 8\nmax_cycles_per_turn = 40\n'
                      "[probe]\nrate = 0.02\nhard_multiplier = 20\nstreak_stop_at = 16\n")
    monkeypatch.setenv("TURNGUARD_STUCK_REPEAT_THRESHOLD", "5")  # as GuardConfig loads it: TOML, then TURNGUARD_*
    assert cli.main(["assets", str(tmp_path / "deploy"), "--config", str(config)]) == 0
    written = _written(tmp_path / "deploy")
    assert set(written) == set(SHIPPED)
    assert {name for name in written if written[name] != SHIPPED[name]} == {  # the halts board has no threshold
        "dashboards/turnguard-threshold-validation.json"}
    board = json.loads(written["dashboards/turnguard-threshold-validation.json"])
    assert board == json.loads(build.for_config(GuardConfig.load(config, environ={
        "TURNGUARD_STUCK_REPEAT_THRESHOLD": "5"}))[build.FILES[build.THRESHOLDS_UID]])
    texts = json.dumps(board, ensure_ascii=False)
    assert "backstop S×8 = 1600" in texts and "D = 5" in texts
    exprs = [pq.expr for pq in queries.panel_queries(board) if pq.panel_id == 44]
    assert all('"cycle_cap"' in e and '"streak"' in e for e in exprs if "turnguard_probe_main_threshold" in e)
    past = next(p for p in queries.panels(board) if p["id"] == 41)
    names = past["fieldConfig"]["overrides"][0]["properties"][0]["value"][0]["options"]
    assert "censored" in names["20"]["text"] and "censored" not in names["10"]["text"]  # the probe's cap: 20 x 200


UNUSUAL = {"soft_cap": 137, "hard_multiplier": 9, "stuck_repeat_threshold": 9, "streak_warn_at": 4,
           "streak_stop_at": 13, "max_cycles_per_turn": 41,
           "probe": {"rate": 0.03, "hard_multiplier": 23, "streak_stop_at": 29, "stuck_repeat_threshold": 11}}
"""A configuration whose every threshold is a number none of the rules' own constants (windows, ratios)
is: any of them in a rule came from the configuration."""


def _thresholds(config: GuardConfig, *, small: bool) -> set[int]:
    """The call counts the configuration (its probe too) fixes: S, the backstop, the bucket edges the
    survival estimate needs; with ``small``, its repeat, failure and request counts too."""
    probe = config.probe_settings()
    found: set[int] = set()
    for c in (config, *((probe.config,) if probe else ())):
        found |= {c.soft_cap, c.hard_cap or 0, *(c.soft_cap * k for k in (15, 20, 30))}
        if small:
            found |= {c.stuck_repeat_threshold, c.streak_warn_at, c.streak_stop_at, c.max_cycles_per_turn}
    return found - {0}


def _rule_numbers(text: str) -> set[int]:
    """The integers in the rules' expressions, annotations and labels (not in the header's prose)."""
    exprs = " ".join(r["expr"] + str(r.get("annotations", "")) + str(r.get("labels", ""))
                     for g in yaml.safe_load(text)["groups"] for r in g["rules"])
    assert not re.search(r"\ble\s*=", exprs)
    return {int(n) for n in re.findall(r"(?<![\w.])(\d+)(?![\w.])", exprs)}


@pytest.mark.parametrize("options", [{}, {"soft_cap": 250}, {"hard_multiplier": 4, "probe": {"rate": 0.1,
                                                                                              "hard_multiplier": 12}},
                                     UNUSUAL], ids=["default", "S=250", "x4 with a probe", "unusual"])
def test_the_rules_are_rendered_for_every_configuration_with_none_of_its_thresholds(options):
    """``--config`` renders the rules with their generator, for the configuration as GuardConfig loads
    it, probe included; they read every threshold from the labels and keep every bucket, so the
    rendering is the shipped files byte for byte and holds none of the configuration's numbers (the
    boards' figures for those numbers come from the board rendered beside them)."""
    config = GuardConfig(**options)
    written = build.assets_for(config)
    generated = {PurePosixPath(path.as_posix()): text.encode() for path, text in rules.written(Path()).items()}
    assert generated and all(written[path] == text == SHIPPED[path.as_posix()] for path, text in generated.items())
    files = [path for path in generated if path.name in rules.FILES.values()]
    assert len(files) == 2
    for path in files:
        clash = _rule_numbers(written[path].decode()) & _thresholds(config, small=options is UNUSUAL)
        assert not clash, (path, sorted(clash))


def test_the_rendering_check_sees_a_threshold_or_a_bucket_in_a_rule(monkeypatch):
    config = GuardConfig(**UNUSUAL)
    hard_coded = {"record": "turnguard:hard_coded", "expr": f"sum(turnguard:turns:increase5m) > {config.hard_cap}"}
    monkeypatch.setattr(rules, "DERIVED", [*rules.DERIVED, hard_coded])
    assert _rule_numbers(rules.render()) & _thresholds(config, small=True) == {config.hard_cap}
    monkeypatch.setattr(rules, "DERIVED", [*rules.DERIVED, {"record": "b", "expr": 'x{le="+Inf"}'}])
    with pytest.raises(AssertionError):
        _rule_numbers(rules.render())


def test_assets_with_a_config_names_the_extra_it_needs_when_it_is_missing(tmp_path):
    config = tmp_path / "turnguard.toml"
    config.write_text("soft_cap = 200\n")
    blocker = ("import sys\nclass Blocked:\n    def find_spec(self, name, path=None, target=None):\n"
               "        if name.partition('.')[0] == 'grafana_foundation_sdk':\n"
               "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
               "sys.meta_path.insert(0, Blocked())\nfrom turnguard import _cli as cli\n"
               "sys.exit(cli.main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", blocker, "assets", str(tmp_path / "deploy"), "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and 'pip install "turnguard[dashboards]"' in done.stderr, done.stderr
    assert not (tmp_path / "deploy").exists()
    plain = subprocess.run([sys.executable, "-c", blocker, "assets", str(tmp_path / "plain")], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert plain.returncode == 0 and _written(tmp_path / "plain") == SHIPPED  # the shipped files need no extra


def test_assets_refuses_a_configuration_it_cannot_load(tmp_path, capsys):
    config = tmp_path / "turnguard.toml"
    config.write_text("hard_multiplier = 0.5\n")
    assert cli.main(["assets", str(tmp_path / "deploy"), "--config", str(config)]) == 2
    assert "hard_multiplier" in capsys.readouterr().err
    assert not (tmp_path / "deploy").exists()


def test_the_probe_evidence_has_a_cycle_repeat_row_where_the_policy_stops_turns():
    """Like the streak stop's: a row when ``cycle_repeat_stop_at`` is in force, named with its value
    and the probe's, whose queries select the probe turns the main policy would have halted there."""
    main = GuardConfig(cycle_repeat_warn_at=5, cycle_repeat_stop_at=8, probe={"rate": 0.1, "cycle_repeat_stop_at": 16})
    cap = CapSettings.from_config(main)
    assert cap.probe is not None and cap.probe.limit(Threshold.CYCLE_REPEAT) == 16
    assert thresholds.threshold_row_names(cap)["cycle_repeat"] == (
        "cycle repeat stop (8 repetitions of a cycle); the probe's: 16")
    panel = next(p for p in queries.panels(json.loads(build.render(thresholds.threshold_validation_dashboard(cap))))
                 if p["id"] == 44)
    assert all("cycle_repeat" in t["expr"] for t in panel["targets"])
    for off in (GuardConfig(), GuardConfig(cycle_repeat_warn_at=5)):  # a warning alone halts nothing
        assert "cycle_repeat" not in thresholds.threshold_row_names(CapSettings.from_config(off))
