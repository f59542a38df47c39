"""The deployable files: ``turnguard assets DIR`` writes them out.

They have one copy, at the repository's top level, where a clone shows them; the wheel carries the
same files inside this package (the build's ``force-include``, in ``pyproject.toml``), so an operator
who only ran ``pip install turnguard`` gets the Collector config, builder manifest, Grafana boards
and provisioning, Prometheus config and rules the repository tests against, at the same paths:

    collector-config.yaml                 the Collector pipeline (OTLP in; remote write, Tempo, Loki, file)
    builder-config.yaml                   the builder manifest of a Collector with exactly its components
    dashboards/*.json                     the Grafana boards (built by turnguard.boards.build)
    dashboards/provisioning/dashboards/turnguard.yaml, dashboards/provisioning/datasources/turnguard.yaml
    prometheus/prometheus.yml             remote-write receiver, the Collector's scrape job, the rules
    rules/turnguard.rules.yaml            recording and alerting rules; rules/turnguard.rules.test.yaml
                                          their ``promtool test rules`` unit tests
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

ENTRIES = ("collector-config.yaml", "builder-config.yaml", "dashboards", "prometheus", "rules")
"""The top-level files and folders that are the assets, in the order they are listed; the wheel's
``force-include`` names the same ones."""
SUFFIXES = frozenset({".json", ".yaml", ".yml"})
"""What an asset file is; anything else in those folders (a stray ``__pycache__``) is not one."""


def root() -> Path:
    """Where the assets are: this package in an installed wheel, else the checkout's top level (an
    editable install, or ``src`` on the path), which holds the files the wheel is built from."""
    package = Path(__file__).resolve().parent
    for candidate in (package, package.parents[2]):
        if all((candidate / entry).exists() for entry in ENTRIES):
            return candidate
    raise FileNotFoundError(f"turnguard's assets are missing: neither {package} nor {package.parents[2]} "
                            f"holds {', '.join(ENTRIES)}")


def files() -> dict[PurePosixPath, Path]:
    """Relative path -> file, for every asset."""
    top_level = root()
    return {path: entry for top in ENTRIES for path, entry in _walk(top_level / top, PurePosixPath(top))}


def _walk(entry: Path, path: PurePosixPath) -> Iterator[tuple[PurePosixPath, Path]]:
    if entry.is_file():
        if entry.suffix in SUFFIXES:
            yield path, entry
    elif entry.is_dir():
        for child in sorted(entry.iterdir(), key=lambda e: e.name):
            yield from _walk(child, path / child.name)


def write(directory: Path, *, overwrite: bool = False) -> list[Path]:
    """Copy every asset under ``directory`` (keeping its path); the paths written.

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
