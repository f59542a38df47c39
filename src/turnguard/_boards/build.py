"""turnguard's Grafana dashboards, as code (grafana-foundation-sdk, Grafana 11 schema): the output.

    python -m turnguard._boards.build             # regenerate the committed JSON (dashboards/)
    python -m turnguard._boards.build --check     # exit 1 if the committed JSON is stale
    python -m turnguard._boards.build --config turnguard.toml --out /tmp/boards

Two boards: **Halts** (``halts``: what fired, where, how often, what users answered) and
**Threshold validation** (``thresholds``: are the thresholds right for this traffic, with the
probe cohort's evidence past each). Their PromQL is written in ``promql`` and ``evidence``; what a
configuration fixes on them (bucket edges of the what-if panels, the thresholds in force, the
probe's limits) in ``settings``. The committed boards are built for ``GuardConfig()``; operators
render theirs with ``turnguard assets DIR --config turnguard.toml``.

Panel ids are stable: Halts uses 1-99; Threshold validation uses 1-99 and reserves 100-199 for
the shadow-policies row (``thresholds.shadow_policy_panels``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from turnguard import _assets as assets
from turnguard._boards import halts, rules, thresholds
from turnguard._boards.halts import collector_panels
from turnguard._boards.promql import RECORD_TILE, RECORDED
from turnguard._boards.settings import DEFAULTS, CapSettings
from turnguard._config import ConfigError, GuardConfig

__all__ = [  # the boards' names that the rules' and the Collector chain's tests read from here
    "BOARDS",
    "COLLECTOR_JOB",
    "EXPORT_INTERVAL_S",
    "FILES",
    "HALTS_UID",
    "OUT",
    "RECORDED",
    "RECORD_TILE",
    "THRESHOLDS_UID",
    "assets_for",
    "build_all",
    "collector_panels",
    "for_config",
    "main",
    "render",
    "stale",
]

OUT = assets.root() / "dashboards"
"""Where the JSON lives: the assets' ``dashboards/`` (``turnguard assets DIR`` writes it out)."""
HALTS_UID, THRESHOLDS_UID = halts.UID, thresholds.UID
FILES = {HALTS_UID: "turnguard-halts.json", THRESHOLDS_UID: "turnguard-threshold-validation.json"}
EXPORT_INTERVAL_S = 60
"""The SDK's metric export interval (OTEL_METRIC_EXPORT_INTERVAL's default), one sample per series per
interval: the provisioned ``timeInterval``, so Grafana's ``$__rate_interval`` holds at least four."""
COLLECTOR_JOB = "otelcol"
"""The scrape job of the Collector's own metrics (the shipped prometheus.yml's)."""

BOARDS: dict[str, Callable[[CapSettings], Dashboard]] = {
    HALTS_UID: halts.halts_dashboard,
    THRESHOLDS_UID: thresholds.threshold_validation_dashboard,
}

SCHEMA_VERSION = 42
"""Grafana's last schema version of the v1 dashboard JSON (its DashboardMigrator stops at 42)."""
DATASOURCE_VARIABLE_NOISE = ("auto", "auto_count", "auto_min")
"""Interval-variable fields the SDK writes on every variable; meaningless on a datasource variable."""


def render(board: Dashboard) -> str:
    """Stable JSON text (sorted keys, two-space indent, trailing newline)."""
    data = json.loads(JSONEncoder().encode(board.build()))
    data["schemaVersion"] = SCHEMA_VERSION
    for variable in data["templating"]["list"]:
        if variable["type"] != "interval":
            for key in DATASOURCE_VARIABLE_NOISE:
                variable.pop(key, None)
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def build_all(cap: CapSettings = DEFAULTS) -> dict[str, str]:
    """File name -> JSON text, for every board."""
    return {FILES[uid]: render(make(cap)) for uid, make in BOARDS.items()}


def for_config(config: GuardConfig) -> dict[str, str]:
    """File name -> JSON text of every board, built for ``config`` (its probe included)."""
    return build_all(CapSettings.from_config(config))


def assets_for(config: GuardConfig) -> dict[PurePosixPath, bytes]:
    """Every file ``turnguard assets`` writes, for ``config``: the shipped files, with the boards built
    for it and the rules (their unit tests, the Prometheus configs that load them) rendered by their
    generator. The rules hold no threshold: they read each from the labels (the threshold that
    halted a turn, the one the main configuration would have halted a probe turn at) and keep every
    bucket, so one rendering serves every configuration and the boards pick what theirs needs."""
    contents = {path: entry.read_bytes() for path, entry in assets.files().items()}
    rendered = {PurePosixPath(OUT.name, name): text for name, text in for_config(config).items()}
    rendered.update({PurePosixPath(path.as_posix()): text for path, text in rules.written(Path()).items()})
    for path, text in rendered.items():
        if path not in contents:
            raise FileNotFoundError(f"the shipped assets have no {path}")
        contents[path] = text.encode()
    return contents


def stale(built: dict[str, str], directory: Path) -> list[str]:
    """The files of ``built`` that ``directory`` lacks or holds differently."""
    return [name for name, text in built.items()
            if not (directory / name).exists() or (directory / name).read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON files (default: dashboards/)")
    parser.add_argument("--config", metavar="TOML", help="build for this turnguard.toml (default: GuardConfig())")
    parser.add_argument("--check", action="store_true", help="fail if the files in --out differ from a fresh build")
    args = parser.parse_args(argv)
    try:
        config = GuardConfig.load(args.config, environ={}) if args.config else GuardConfig()
    except (ConfigError, OSError) as exc:
        parser.error(str(exc))
    built = for_config(config)
    if args.out is None:
        if assets.installed() and not args.check:
            parser.error(assets.INSTALLED)
        args.out = OUT
    if args.check:
        for name in stale(built, args.out):
            print(f"{args.out / name} is stale: run python -m turnguard._boards.build", file=sys.stderr)
        return 1 if stale(built, args.out) else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in built.items():
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
