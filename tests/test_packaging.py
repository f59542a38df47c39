"""What the wheel and the sdist tell a user: the license, the metadata, one version, a changelog,
and an sdist whose own tests collect and run (``dists``, ``source``: conftest)."""

from __future__ import annotations

import ast
import email.parser
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import turnguard

ROOT = Path(__file__).resolve().parents[1]
LICENSE = (ROOT / "LICENSE").read_text(encoding="utf-8")
SDIST_SELECTION = ("tests/test_assets.py", "tests/test_collector_config.py", "tests/test_dashboards_build.py",
                   "tests/test_tools.py", "tests/test_layering.py", "tests/test_keys.py")
"""Real tests run from the unpacked sdist: its deployable files, boards, tools, package and core."""


def wheel_metadata(wheel: Path) -> tuple[email.message.Message, dict[str, bytes]]:
    with zipfile.ZipFile(wheel) as archive:
        info = {n: archive.read(n) for n in archive.namelist() if ".dist-info/" in n}
    (metadata,) = [v for n, v in info.items() if n.endswith(".dist-info/METADATA")]
    return email.parser.BytesParser().parsebytes(metadata), info


def sdist_files(sdist: Path) -> dict[str, bytes]:
    with tarfile.open(sdist) as archive:
        return {m.name.split("/", 1)[1]: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def test_the_license_is_the_full_apache_2_text():
    assert LICENSE.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in LICENSE
    assert "END OF TERMS AND CONDITIONS" in LICENSE
    assert [int(n) for n in re.findall(r"^   (\d+)\. [A-Z]", LICENSE, re.M)] == list(range(1, 10))


@pytest.mark.slow
def test_the_wheel_and_the_sdist_carry_the_license_and_say_which_it_is(dists):
    metadata, info = wheel_metadata(dists["wheel"])
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    (licenses,) = [v for n, v in info.items() if n.endswith(".dist-info/licenses/LICENSE")]
    assert licenses.decode() == LICENSE
    files = sdist_files(dists["sdist"])
    assert files["LICENSE"].decode() == LICENSE
    assert email.parser.BytesParser().parsebytes(files["PKG-INFO"])["License-Expression"] == "Apache-2.0"


@pytest.mark.slow
def test_the_metadata_names_authors_classifiers_and_the_one_version(dists):
    metadata, _ = wheel_metadata(dists["wheel"])
    assert metadata["Version"] == turnguard.__version__
    assert metadata["Author"] or metadata["Author-email"]
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and (ROOT / "src" / "turnguard" / "py.typed").exists()
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression says it"
    lowest = tuple(int(n) for n in metadata["Requires-Python"].removeprefix(">=").split("."))
    pythons = [tuple(int(n) for n in c.rsplit(" ", 1)[1].split(".")) for c in classifiers
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert pythons and min(pythons) == lowest


def test_the_version_is_written_once():
    """``turnguard.__version__``; pyproject.toml reads it from there, and no other module sets one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "src/turnguard/__init__.py"
    setters = [path.relative_to(ROOT).as_posix() for path in (ROOT / "src").rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets)]
    assert setters == ["src/turnguard/__init__.py"]
    result = subprocess.run([sys.executable, "-m", "turnguard", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip() == f"turnguard {turnguard.__version__}"


def test_the_changelog_opens_with_unreleased_and_names_the_current_version():
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings[0] == "Unreleased"
    assert any(h.split()[0] == turnguard.__version__ for h in headings[1:])


@pytest.fixture(scope="module")
def unpacked(dists, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    with tarfile.open(dists["sdist"]) as archive:
        archive.extractall(out, filter="data")
    (top,) = out.iterdir()
    return top


def run_in(top: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter (its installed dependencies), with the sdist's own package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(top / "src")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900, cwd=top, env=env)


@pytest.mark.slow
def test_the_sdist_carries_what_its_tests_read(unpacked):
    for path in ("tests/conftest.py", "tests/chain.py", "tests/fleet.py", "tests/probe_fleet.py", "tools/synthetic.py",
                 "examples", "docs", "mkdocs.yml", "CHANGELOG.md", "LICENSE", "README.md", "collector-config.yaml"):
        assert (unpacked / path).exists(), path
    assert run_in(unpacked, "-c", "import turnguard; print(turnguard.__file__)").stdout.strip() == str(
        unpacked / "src" / "turnguard" / "__init__.py")


@pytest.mark.slow
def test_the_sdists_tests_collect_without_errors(unpacked):
    result = run_in(unpacked, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (summary,) = [line for line in result.stdout.splitlines() if " collected" in line]
    assert re.fullmatch(r"\d+ tests collected in .*", summary), summary


@pytest.mark.slow
def test_a_selection_of_the_sdists_tests_passes(unpacked):
    result = run_in(unpacked, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *SDIST_SELECTION)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?\d+ passed(, \d+ deselected)? in .*", summary), summary
