"""The deployable files that ship inside the package: ``turnguard assets DIR`` writes them out.

An operator who only ran ``pip install turnguard`` gets the same Collector config, builder manifest,
Grafana boards and provisioning, Prometheus config and rules the repository tests against:

    collector/collector-config.yaml       the Collector pipeline (OTLP in; remote write, Tempo, Loki, file)
    collector/builder-config.yaml         the builder manifest of a Collector with exactly its components
    dashboards/*.json                     the Grafana boards (built by dashboards/build.py)
    provisioning/dashboards/turnguard.yaml, provisioning/datasources/turnguard.yaml
    prometheus/prometheus.yml             remote-write receiver, the Collector's scrape job, the rules
    rules/turnguard.rules.yaml            recording and alerting rules; rules/turnguard.rules.test.yaml
                                          their ``promtool test rules`` unit tests
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

DIRECTORIES = ("collector", "dashboards", "provisioning", "prometheus", "rules")
"""The asset folders, in the order they are listed."""


def files() -> dict[PurePosixPath, Traversable]:
    """Relative path -> packaged file, for every asset."""
    root = resources.files(__name__)
    return {path: entry for top in DIRECTORIES for path, entry in _walk(root / top, PurePosixPath(top))}


def _walk(entry: Traversable, path: PurePosixPath) -> Iterator[tuple[PurePosixPath, Traversable]]:
    if entry.is_file():
        yield path, entry
    elif entry.is_dir():
        for child in sorted(entry.iterdir(), key=lambda e: e.name):
            if child.name != "__pycache__":
                yield from _walk(child, path / child.name)


def write(directory: Path, *, overwrite: bool = False) -> list[Path]:
    """Copy every asset under ``directory`` (keeping its folder); the paths written.

    Refuses (``FileExistsError``, nothing written) when a file would be replaced and ``overwrite``
    is false: an operator's edited copy is never clobbered silently."""
    targets = {directory.joinpath(*path.parts): entry for path, entry in files().items()}
    existing = sorted(str(t) for t in targets if t.exists())
    if existing and not overwrite:
        raise FileExistsError(f"would overwrite {', '.join(existing)} (use --force)")
    for target, entry in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(entry.read_bytes())
    return list(targets)
