"""``turnguard assets DIR``: the deployable files, from the installed package.

From the checkout's package (its resources) and from a wheel built from the checkout and installed
in a fresh virtual environment (what an operator who ran ``pip install turnguard`` has).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import chain
from turnguard import assets, cli

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {
    "collector/collector-config.yaml", "collector/builder-config.yaml",
    "dashboards/turnguard-halts.json", "dashboards/turnguard-threshold-validation.json",
    "provisioning/dashboards/turnguard.yaml", "provisioning/datasources/turnguard.yaml",
    "prometheus/prometheus.yml", "rules/turnguard.rules.yaml", "rules/turnguard.rules.test.yaml",
}


def tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def shipped() -> dict[str, bytes]:
    return {str(path): entry.read_bytes() for path, entry in assets.files().items()}


def test_the_package_ships_every_deployable_file():
    assert {str(p) for p in assets.files()} == EXPECTED


def test_assets_writes_every_file_as_shipped(tmp_path, capsys):
    assert cli.main(["assets", str(tmp_path / "deploy")]) == 0
    written = tree(tmp_path / "deploy")
    assert written == shipped()
    directory, *files = capsys.readouterr().out.splitlines()
    assert directory == f"{tmp_path / 'deploy'}/" and sorted(f.strip() for f in files) == sorted(EXPECTED)


def test_assets_never_overwrites_an_edited_copy_without_force(tmp_path, capsys):
    assert cli.main(["assets", str(tmp_path)]) == 0
    edited = tmp_path / "collector" / "collector-config.yaml"
    edited.write_text("# my edits\n")
    capsys.readouterr()
    assert cli.main(["assets", str(tmp_path)]) == 1
    assert "would overwrite" in capsys.readouterr().err and edited.read_text() == "# my edits\n"
    assert cli.main(["assets", str(tmp_path), "--force"]) == 0
    assert edited.read_bytes() == shipped()["collector/collector-config.yaml"]


def test_assets_reports_a_directory_it_cannot_write(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["assets", str(blocker / "deploy")]) == 1
    assert "turnguard assets:" in capsys.readouterr().err


def test_the_written_prometheus_config_finds_the_written_rules(tmp_path):
    """The files reference each other by relative path: written out, they still do."""
    assets.write(tmp_path)
    result = subprocess.run([chain.promtool(), "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_environment_writes_the_same_files(tmp_path):
    source, wheels = tmp_path / "source", tmp_path / "wheels"  # a copy: pip builds in the source tree
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
                   check=True, timeout=600, capture_output=True)
    (wheel,) = wheels.glob("turnguard-*.whl")
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    subprocess.run([env / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=600, capture_output=True)
    out = tmp_path / "deploy"
    result = subprocess.run([env / "bin" / "turnguard", "assets", str(out)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert tree(out) == shipped() and set(tree(out)) == EXPECTED
