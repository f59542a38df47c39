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

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

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


class UnsafeTarget(Exception):
    """What ``write`` refuses before writing anything: a symbolic link at ``DIR`` or under it (it
    would write outside ``DIR``, or through to another file), a file where a folder must be, a
    folder or special file where an asset goes, or a ``DIR`` that cannot be made. ``problems``
    names each path."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


class WriteFailed(OSError):
    """Writing failed part-way (``error``, at ``filename``): what was written is removed and what
    was replaced restored, except what ``left`` names (a failure while undoing)."""

    def __init__(self, error: OSError, left: Sequence[str]) -> None:
        super().__init__(error.errno, error.strerror or str(error), error.filename)
        self.error = error
        self.left = tuple(left)


def write(directory: Path, *, overwrite: bool = False,
          contents: Mapping[PurePosixPath, bytes] | None = None) -> list[Path]:
    """Write every asset (``contents``: relative path -> bytes; default, the shipped files) under
    ``directory``; the paths written.

    Every target is checked before any is written: a symbolic link on the way is refused
    (``UnsafeTarget``; ``directory`` itself included, even with ``overwrite``), and so is a file
    that would be replaced while ``overwrite`` is false (``FileExistsError``): an operator's edited
    copy is never clobbered silently. Each file is written beside its target and renamed over it
    (never through a link or a hard link into another file); if anything fails, the files written
    are removed, the ones replaced restored and the folders made removed (``WriteFailed``)."""
    if contents is None:
        contents = {path: entry.read_bytes() for path, entry in files().items()}
    problems, existing = _check(directory, list(contents), overwrite)
    if problems:
        raise UnsafeTarget(problems)
    if existing and not overwrite:
        shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
        raise FileExistsError(f"{len(existing)} of the files already exist in {directory} ({shown}); "
                              "use --force to replace them")
    with _Transaction(directory) as transaction:
        for path, data in contents.items():
            transaction.put(path, data)
    return [directory.joinpath(*path.parts) for path in contents]


def _check(directory: Path, paths: Sequence[PurePosixPath], overwrite: bool) -> tuple[list[str], list[str]]:
    """The problems with writing ``paths`` under ``directory`` (nothing is written), and the
    targets that exist already (as paths relative to ``directory``)."""
    problems: dict[str, None] = {}
    here = _kind(directory)
    if here == "link":
        problems[f"{directory} is a symbolic link (give the folder it points to)"] = None
    elif here not in ("dir", None):
        problems[f"{directory} is not a folder"] = None
    elif here is None:
        above = next((p for p in directory.parents if _kind(p) is not None), None)
        if above is not None and not above.is_dir():
            problems[f"{above} is not a folder"] = None
    existing = []
    for path in paths if here == "dir" else ():
        target = directory
        for depth, part in enumerate(path.parts, 1):
            target = target / part
            kind = _kind(target)
            last = depth == len(path.parts)
            if kind is None:
                break
            if kind == "link":
                problems[f"{target} is a symbolic link (turnguard assets never writes through one)"] = None
            elif not last and kind != "dir":
                problems[f"{target} is not a folder"] = None
            elif last and kind != "file":
                problems[f"{target} is not a regular file"] = None
            elif last:
                existing.append(path.as_posix())
            if kind != "dir":
                break
    return list(problems), existing


def _kind(path: Path) -> str | None:
    """``link``, ``dir``, ``file``, ``other``, or ``None`` when nothing is there (not following a link)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Transaction:
    """Writes files under one folder through folder descriptors opened without following links,
    and undoes them all if one fails."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.token = secrets.token_hex(4)
        self.folders: dict[PurePosixPath, int] = {}
        self.made: list[tuple[int | None, str]] = []
        """Folders created, in order: (parent's descriptor or ``None`` above ``directory``, name or path)."""
        self.written: list[tuple[int, str, str | None]] = []
        """Files put in place: (folder descriptor, name, the name the replaced file waits under)."""

    def __enter__(self) -> _Transaction:
        missing = [directory for directory in (self.directory, *self.directory.parents) if _kind(directory) is None]
        try:
            for folder in reversed(missing):
                os.mkdir(folder)
                self.made.append((None, str(folder)))
            self.folders[PurePosixPath()] = os.open(self.directory, _OPEN_DIR)
        except OSError as exc:
            self._undo()
            self._close()
            raise UnsafeTarget([f"cannot make {exc.filename or self.directory}: {exc.strerror or exc}"]) from None
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        try:
            if exc is None:
                for fd, _, replaced in self.written:
                    if replaced is not None:
                        with contextlib.suppress(OSError):  # (written: a stale copy is not a failure)
                            os.unlink(replaced, dir_fd=fd)
                return
            left = self._undo()
            if isinstance(exc, OSError):
                raise WriteFailed(exc, left) from exc
        finally:
            self._close()

    def put(self, path: PurePosixPath, data: bytes) -> None:
        fd, name = self._folder(path.parent), path.name
        new = f".{name}.{self.token}.new"
        out = os.open(new, _CREATE, 0o644, dir_fd=fd)
        try:
            try:
                before = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                before = None
            try:
                file = os.fdopen(out, "wb")
            except BaseException:
                os.close(out)
                raise
            with file as f:
                if before is not None:
                    os.fchmod(f.fileno(), stat.S_IMODE(before.st_mode))
                f.write(data)
            replaced = f".{name}.{self.token}.old" if before is not None else None
            if replaced is not None:
                os.rename(name, replaced, src_dir_fd=fd, dst_dir_fd=fd)
            try:
                os.rename(new, name, src_dir_fd=fd, dst_dir_fd=fd)
            except OSError:
                if replaced is not None:
                    os.rename(replaced, name, src_dir_fd=fd, dst_dir_fd=fd)
                raise
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new, dir_fd=fd)
            raise
        self.written.append((fd, name, replaced))

    def _folder(self, path: PurePosixPath) -> int:
        """The descriptor of folder ``path`` (made if missing, never through a link)."""
        fd = self.folders.get(path)
        if fd is None:
            parent = self._folder(path.parent)
            try:
                os.mkdir(path.name, dir_fd=parent)
                self.made.append((parent, path.name))
            except FileExistsError:
                pass
            fd = self.folders[path] = os.open(path.name, _OPEN_DIR, dir_fd=parent)
        return fd

    def _undo(self) -> list[str]:
        """Remove what was written and made, restore what was replaced: what could not be undone."""
        left = []
        for fd, name, replaced in reversed(self.written):
            try:
                if replaced is not None:
                    os.rename(replaced, name, src_dir_fd=fd, dst_dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError as exc:
                left.append(f"{name}: {exc.strerror or exc}")
        self.written.clear()
        for parent, name in reversed(self.made):
            try:
                os.rmdir(name, dir_fd=parent) if parent is not None else os.rmdir(name)
            except OSError as exc:
                left.append(f"{name}/: {exc.strerror or exc}")
        self.made.clear()
        return left

    def _close(self) -> None:
        for fd in self.folders.values():
            os.close(fd)
        self.folders.clear()
