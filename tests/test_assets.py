"""``turnguard assets DIR``: the deployable files, one copy at the repository's top level.

From a checkout (the package finds the top-level files), from a wheel built through the sdist and
installed in a fresh virtual environment (what an operator who ran ``pip install turnguard`` has),
and from an editable install (which must follow the checkout's files as they are edited).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import chain
from turnguard import _assets as assets
from turnguard import _cli as cli

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {
    "collector-config.yaml", "builder-config.yaml",
    "dashboards/turnguard-halts.json", "dashboards/turnguard-threshold-validation.json",
    "dashboards/provisioning/dashboards/turnguard.yaml", "dashboards/provisioning/datasources/turnguard.yaml",
    "prometheus/prometheus.yml", "rules/turnguard.rules.yaml", "rules/turnguard.rules.test.yaml",
    "prometheus/prometheus-start-times.yml", "rules/turnguard.start-times.rules.yaml",
    "rules/turnguard.start-times.rules.test.yaml",
}
"""Every deployable file, by its path in the repository and in the directory ``turnguard assets`` writes."""


def tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def shipped() -> dict[str, bytes]:
    return {str(path): entry.read_bytes() for path, entry in assets.files().items()}


def repository(root: Path = ROOT) -> dict[str, bytes]:
    return {path: (root / path).read_bytes() for path in EXPECTED}


def test_the_package_ships_every_deployable_file():
    assert {str(p) for p in assets.files()} == EXPECTED


def test_the_assets_are_the_repositorys_top_level_files():
    assert shipped() == repository()


def test_every_file_in_the_asset_folders_is_an_asset():
    """Nothing lies beside the assets that the wheel would carry and ``turnguard assets`` not write."""
    paths = (p for entry in assets.ENTRIES for p in [ROOT / entry, *(ROOT / entry).rglob("*")])
    found = {p.relative_to(ROOT).as_posix() for p in paths if p.is_file() and "__pycache__" not in p.parts}
    assert found == EXPECTED


def test_the_wheel_carries_exactly_the_asset_files_inside_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    forced = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert forced == {path: f"turnguard/_assets/{path}" for path in EXPECTED}
    assert {path.split("/")[0] for path in EXPECTED} == set(assets.ENTRIES)


def test_assets_writes_every_file_as_shipped(tmp_path, capsys):
    assert cli.main(["assets", str(tmp_path / "deploy")]) == 0
    written = tree(tmp_path / "deploy")
    assert written == shipped()
    directory, *files = capsys.readouterr().out.splitlines()
    assert directory == f"{tmp_path / 'deploy'}/" and sorted(f.strip() for f in files) == sorted(EXPECTED)


def test_assets_never_overwrites_an_edited_copy_without_force(tmp_path, capsys):
    assert cli.main(["assets", str(tmp_path)]) == 0
    edited = tmp_path / "collector-config.yaml"
    edited.write_text("# my edits\n")
    capsys.readouterr()
    assert cli.main(["assets", str(tmp_path)]) == 1
    assert "use --force" in capsys.readouterr().err and edited.read_text() == "# my edits\n"
    assert cli.main(["assets", str(tmp_path), "--force"]) == 0
    assert edited.read_bytes() == shipped()["collector-config.yaml"]


def test_assets_reports_a_directory_it_cannot_write(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["assets", str(blocker / "deploy")]) == 2
    assert capsys.readouterr().err == f"turnguard assets: {blocker} is not a folder; nothing written\n"


# -- staying in DIR: links, and failures part-way -------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str | None]]:
    """Everything under ``root`` (links not followed): path -> (kind, bytes or link target)."""
    found: dict[str, tuple[str, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir", None)
        else:
            found[rel] = ("file", path.read_bytes())
    return found


@pytest.fixture
def place(tmp_path) -> dict[str, Path]:
    """DIR (``deploy``) and a folder outside it with a file an attacker would like overwritten."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.yaml").write_bytes(b"operator's own file\n")
    return {"dir": tmp_path / "deploy", "outside": outside, "root": tmp_path}


def link(at: Path, to: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(to)


LINK_SHAPES = {
    "dangling link at a target": lambda p: link(p["dir"] / "collector-config.yaml", p["outside"] / "new.yaml"),
    "link at a target to a file outside": lambda p: link(p["dir"] / "builder-config.yaml",
                                                          p["outside"] / "precious.yaml"),
    "link at a folder to a folder outside": lambda p: link(p["dir"] / "rules", p["outside"]),
    "link at an intermediate folder": lambda p: link(p["dir"] / "dashboards" / "provisioning", p["outside"]),
    "dangling link at an intermediate folder": lambda p: link(p["dir"] / "dashboards", p["outside"] / "gone"),
    "DIR itself a link to a folder": lambda p: link(p["dir"], p["outside"]),
    "DIR itself a dangling link": lambda p: link(p["dir"], p["outside"] / "gone"),
}


@pytest.mark.parametrize("force", [False, True], ids=["", "--force"])
@pytest.mark.parametrize("shape", list(LINK_SHAPES))
def test_assets_never_writes_through_a_link_and_names_it(place, shape, force, capsys):
    LINK_SHAPES[shape](place)
    before = snapshot(place["root"])
    status = cli.main(["assets", str(place["dir"]), *(["--force"] if force else [])])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "is a symbolic link" in err and err.endswith("nothing written\n")
    linked = next(p for p in [place["dir"], *place["dir"].rglob("*")] if p.is_symlink())
    assert f"{linked} is a symbolic link" in err
    assert snapshot(place["root"]) == before  # not a byte written, inside DIR or out


def test_assets_replaces_a_hard_linked_file_without_writing_into_the_other_name(place):
    assets.write(place["dir"])
    target = place["dir"] / "prometheus" / "prometheus.yml"
    target.unlink()
    os.link(place["outside"] / "precious.yaml", target)
    assets.write(place["dir"], overwrite=True)
    assert (place["outside"] / "precious.yaml").read_bytes() == b"operator's own file\n"
    assert target.read_bytes() == shipped()["prometheus/prometheus.yml"]


def test_assets_keeps_the_mode_of_a_file_it_replaces(place):
    assets.write(place["dir"])
    target = place["dir"] / "rules" / "turnguard.rules.yaml"
    target.chmod(0o600)
    assets.write(place["dir"], overwrite=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


class HalfWritten:
    """A file whose write stores half of what it is given, then finds the disk full."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, data: bytes) -> int:
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


FAILING_STEPS = {
    "making a folder": ("mkdir", lambda args: "dir_fd" in args[1]),
    "creating the new file": ("open", lambda args: bool(args[0][1] & os.O_CREAT)),
    "writing it": ("fdopen", lambda args: True),
    "moving the old one aside": ("rename", lambda args: str(args[0][1]).endswith(".old")),
    "renaming the new one into place": ("rename", lambda args: str(args[0][0]).endswith(".new")),
}
"""Where a write can fail for each file: (the ``os`` function, which of its calls)."""


def fail_at(monkeypatch, step: str, index: int) -> None:
    """The ``index``-th call of ``step``'s kind fails with ENOSPC (``fdopen``: half way through the write)."""
    name, matches = FAILING_STEPS[step]
    real, seen = getattr(os, name), []

    def failing(*args, **kwargs):
        if not matches((args, kwargs)):
            return real(*args, **kwargs)
        seen.append(args)
        if len(seen) != index + 1:
            return real(*args, **kwargs)
        if name == "fdopen":
            return HalfWritten(real(*args, **kwargs))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))

    monkeypatch.setattr(os, name, failing)
    return seen


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "--force over a copy"])
@pytest.mark.parametrize("step", list(FAILING_STEPS))
@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_a_failure_at_any_file_leaves_dir_as_it_was(place, monkeypatch, capsys, index, step, existing):
    if existing:
        assets.write(place["dir"])
        for path in (place["dir"] / "rules").iterdir():
            path.write_bytes(b"# the operator's edits\n")
    before = snapshot(place["root"])
    seen = fail_at(monkeypatch, step, index)
    status = cli.main(["assets", str(place["dir"]), *(["--force"] if existing else [])])
    monkeypatch.undo()
    err = capsys.readouterr().err
    if len(seen) <= index:  # fewer steps of this kind than files (folders; nothing set aside when fresh)
        assert status == 0 and snapshot(place["root"]) != before
        return
    assert status == 1 and err.count("\n") == 1 and "No space left on device (nothing left behind)" in err, err
    assert snapshot(place["root"]) == before
    assert len(seen) == index + 1  # nothing was tried after the failure


def test_a_disk_that_fills_part_way_leaves_dir_as_it_was(tiny_disk, capsys):
    before = snapshot(tiny_disk)
    assert cli.main(["assets", str(tiny_disk / "deploy")]) == 1
    assert "No space left on device (nothing left behind)" in capsys.readouterr().err
    assert snapshot(tiny_disk) == before


@pytest.fixture
def tiny_disk(tmp_path):
    """A 96 kB tmpfs: the first assets fit, the last board does not (needs root; under CI it must
    be there, so it fails rather than skips)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        message = f"cannot mount a tmpfs (root needed): {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_assets_says_where_it_looked_when_the_files_are_missing(tmp_path, monkeypatch, capsys):
    package = tmp_path / "src" / "turnguard" / "_assets"
    package.mkdir(parents=True)
    (tmp_path / "collector-config.yaml").write_text("")  # a partial checkout is not one
    monkeypatch.setattr(assets, "__file__", str(package / "__init__.py"))
    assert cli.main(["assets", str(tmp_path / "deploy")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("turnguard assets: turnguard's assets are missing") and str(package) in err
    assert not (tmp_path / "deploy").exists()


def test_the_written_prometheus_config_finds_the_written_rules(tmp_path):
    """The files reference each other by relative path: written out, they still do."""
    assets.write(tmp_path)
    result = subprocess.run([chain.promtool(), "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


# -- installed: a wheel built through the sdist, and an editable install (conftest: source, dists) --


@pytest.fixture(scope="module")
def python(dists, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel's dependencies (each test installs what it tests)."""
    env = tmp_path_factory.mktemp("env")
    venv.create(env, with_pip=True)
    install(env / "bin" / "python", dists["wheel"])
    return env / "bin" / "python"


def isolated() -> dict[str, str]:
    """This process's environment without the path that would put the checkout's package first."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def install(python: Path, *args: str | Path) -> None:
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--force-reinstall", *args],
                   check=True, timeout=600, capture_output=True, env=isolated())


def assets_root(python: Path) -> Path:
    script = "from turnguard import _assets as assets; print(assets.root())"
    return Path(subprocess.run([python, "-c", script], check=True, capture_output=True, text=True, timeout=60,
                               env=isolated(), cwd=python.parent).stdout.strip())


def run_assets(python: Path, out: Path) -> dict[str, bytes]:
    result = subprocess.run([python.parent / "turnguard", "assets", str(out)], capture_output=True, text=True,
                            timeout=120, cwd=out.parent, env=isolated())
    assert result.returncode == 0, result.stderr
    return tree(out)


@pytest.mark.slow
def test_the_sdist_carries_the_assets_at_the_top_level(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        top, *_ = sdist.getnames()[0].split("/")
        members = {m.name.removeprefix(f"{top}/"): m for m in sdist.getmembers() if m.isfile()}
        assert set(members) >= EXPECTED
        assert {path: sdist.extractfile(members[path]).read() for path in EXPECTED} == repository()
        assert not {name for name in members if name.startswith("src/turnguard/_assets/")} - {
            "src/turnguard/_assets/__init__.py"}, "a second copy of the assets in the package sources"


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_environment_writes_the_repositorys_files(dists, python, tmp_path):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        prefix = "turnguard/_assets/"
        packaged = {n.removeprefix(prefix) for n in wheel.namelist() if n.startswith(prefix)}
    assert packaged == EXPECTED | {"__init__.py"}
    install(python, dists["wheel"])
    assert assets_root(python).is_relative_to(python.parents[1] / "lib"), "not the installed package's files"
    assert run_assets(python, tmp_path / "deploy") == repository()


@pytest.mark.slow
def test_an_editable_install_writes_the_checkouts_files_as_edited(source, python, tmp_path):
    install(python, "--no-deps", "-e", source)
    assert assets_root(python) == source
    rules = source / "rules" / "turnguard.rules.yaml"
    rules.write_bytes(rules.read_bytes() + b"# an edit after the install\n")
    try:
        written, expected = run_assets(python, tmp_path / "deploy"), repository(source)
    finally:
        rules.write_bytes((ROOT / "rules" / "turnguard.rules.yaml").read_bytes())
    assert written == expected and written["rules/turnguard.rules.yaml"].endswith(b"after the install\n")


STRAYS = ("dashboards/draft.json", "dashboards/provisioning/dashboards/old.yaml", "rules/notes.txt",
          "prometheus/prometheus.yml.bak", "rules/extra.rules.yaml")
"""What an operator's or a contributor's working tree may hold beside the assets."""


@pytest.mark.slow
def test_a_wheel_built_beside_stray_files_carries_only_the_assets(source, tmp_path):
    tree_copy = tmp_path / "turnguard"
    shutil.copytree(source, tree_copy)
    for stray in STRAYS:
        (tree_copy / stray).write_text("a file that is not an asset\n")
    subprocess.run([sys.executable, "-m", "build", "-q", "--wheel", "--outdir", str(tmp_path / "dist"), str(tree_copy)],
                   check=True, timeout=600, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("turnguard-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        prefix = "turnguard/_assets/"
        packaged = {n.removeprefix(prefix) for n in archive.namelist() if n.startswith(prefix)}
    assert packaged == EXPECTED | {"__init__.py"}


@pytest.mark.parametrize("generator", ["build", "rules"])
def test_a_generator_of_an_installed_package_writes_nothing_there_without_out(generator, monkeypatch, tmp_path,
                                                                             capsys):
    """Run from a wheel install, the generators would rewrite the package's own files (and pip's
    record of them): they refuse, and name the command that renders an operator's files."""
    from turnguard._boards import build, rules

    main = {"build": build.main, "rules": rules.main}[generator]
    before = shipped()
    monkeypatch.setattr(assets, "installed", lambda: True)
    with pytest.raises(SystemExit) as exit:
        main([])
    assert exit.value.code == 2 and "turnguard assets DIR --config" in capsys.readouterr().err
    assert shipped() == before
    assert main(["--check"]) == 0  # reading is fine
    out = tmp_path / "out"
    out.mkdir()
    assert main(["--out", str(out)]) == 0 and any(out.rglob("*.*"))


@pytest.mark.slow
def test_the_rules_generator_of_a_wheel_install_leaves_the_package_as_installed(dists, python, tmp_path):
    install(python, dists["wheel"])
    package = assets_root(python)
    before = tree(package)
    result = subprocess.run([python, "-m", "turnguard._boards.rules"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=isolated())
    assert result.returncode == 2 and "turnguard assets DIR --config" in result.stderr
    assert tree(package) == before
