"""What a calibration reads: the files the command line names, in stream order, each line routed
to its format's reader (``corpus`` or ``collector``; a file may mix them).

The Collector's file exporter rotates its file to a dated backup beside it (``ROTATED``). A
turn's tool spans may be in a backup and its turn span in the next file, so a rotated set is one
stream: oldest backup first, the live file last, through one ``collector.OtlpAssembler``."""

from __future__ import annotations

import glob
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from turnguard._calibrate import collector
from turnguard._calibrate.collector import OtlpAssembler, is_otlp_line
from turnguard._calibrate.corpus import corpus_turn
from turnguard._calibrate.records import (
    MAX_LINE_BYTES,
    UNREADABLE,
    InputError,
    InputProblem,
    LineSource,
    ProblemSink,
    RecordedTurn,
    parse_line,
    too_costly,
)

ROTATED = re.compile(r"^(?P<stem>.+?)-(?P<time>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3})(?:-(?P<reason>[a-z0-9_]+))?"
                     r"(?P<ext>\.(?!(?:gz|zst)$)[^.]+)?(?P<packed>\.gz|\.zst)?$")
"""A rotated backup's name (timberjack's ``backupNameWithResolved``): ``<stem>-<time>[-<reason>]<ext>``,
or the extension before the time (``AppendTimeAfterExt``), or without a reason (lumberjack,
Collectors before v0.130); maybe ``.gz`` or ``.zst``. The time sorts in time order."""
TIME_FORMAT = "%Y-%m-%dT%H-%M-%S.%f"
GLOB_CHARS = frozenset("*?[")


class Rotation(NamedTuple):
    """A file's rotated set (the live file's name) and a backup's rotation time (``""``: not a
    backup); ``dated`` false for a time that is no date."""

    live: str
    time: str
    dated: bool = True


def rotation_of(path: Path | str) -> Rotation:
    """The rotated set a file (a path, or a name) belongs to and its place in it (``ROTATED``)."""
    name = path if isinstance(path, str) else path.name
    found = ROTATED.match(name)
    if found is None:
        return Rotation(name, "")
    try:
        datetime.strptime(found["time"], TIME_FORMAT)
    except ValueError:
        return Rotation(found["stem"] + (found["ext"] or ""), found["time"], dated=False)
    return Rotation(found["stem"] + (found["ext"] or ""), found["time"])


def _order_key(path: Path) -> tuple[int, str]:
    time = rotation_of(path).time
    return (1, "") if not time else (0, time)


def expand_inputs(arguments: Sequence[str | Path]) -> list[Path]:
    """The input files the arguments name (a directory: its regular, unhidden files; a missing
    path with ``*?[``: a glob), each once, rotated sets in order; ``InputError`` when none is found."""
    files: list[Path] = []
    for argument in arguments:
        files.extend(_files_of(str(argument)))
    return in_stream_order(_unique(files))


def _files_of(argument: str) -> list[Path]:
    path = Path(argument)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
        if not found:
            raise InputError(f"{argument}: a directory without input files")
        return found
    if not os.path.lexists(argument) and GLOB_CHARS & set(argument):
        matched = sorted(Path(p) for p in glob.glob(argument) if os.path.isfile(p))
        if not matched:
            raise InputError(f"{argument}: no file matches")
        return matched
    return [path]


def _unique(files: Iterable[Path]) -> list[Path]:
    seen: set[str] = set()
    out = []
    for f in files:
        key = os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def in_stream_order(files: Sequence[Path]) -> list[Path]:
    """``files`` with each rotated set in rotation order at the place of its first file. Live files
    of one name in several directories are several Collectors': each folder's backups go with its own
    live file. ``InputError`` names a backup that cannot be placed in time."""
    sets: dict[str, list[Path]] = {}
    for f in files:
        sets.setdefault(rotation_of(f).live, []).append(f)
    return [f for name, group in sets.items() for f in _set_in_order(name, group)]


def _set_in_order(name: str, group: list[Path]) -> list[Path]:
    for f in group:
        if not rotation_of(f).dated:
            raise InputError(f"{f}: cannot place this file in time: its name has the form of a rotated backup of "
                             f"{name}, but {rotation_of(f).time} is no date; rename it or leave it out")
    lives = [f for f in group if not rotation_of(f).time]
    if len(lives) <= 1:
        return sorted(group, key=_order_key)
    folders: dict[str, list[Path]] = {}
    for f in group:
        folders.setdefault(_folder(f), []).append(f)
    live_folders = {_folder(f) for f in lives}
    for folder, members in folders.items():
        if folder not in live_folders:
            raise InputError(f"{members[0]}: cannot place this file in time: a rotated backup of {name}, but "
                             f"{len(lives)} live files of that name were given ({', '.join(map(str, lives[:3]))}) "
                             "and it is beside none of them; calibrate each Collector's files on their own, or "
                             "put the backups beside their live file")
    return [f for members in folders.values() for f in sorted(members, key=_order_key)]


def _folder(path: Path) -> str:
    return os.path.dirname(os.path.realpath(path))


def missing_backups(files: Sequence[Path]) -> dict[Path, list[Path]]:
    """For each live file given, the rotated backups beside it that were not (one listing per folder)."""
    given = {os.path.realpath(f) for f in files}
    backups: dict[str, dict[str, list[str]]] = {}
    out: dict[Path, list[Path]] = {}
    for f in files:
        name, time, _ = rotation_of(f)
        if time:
            continue
        folder = os.path.abspath(f.parent)
        if folder not in backups:
            backups[folder] = _backups_in(folder)
        beside = (f.parent / n for n in backups[folder].get(name, ()) if n != f.name)
        left = sorted((p for p in beside if os.path.realpath(p) not in given), key=_order_key)
        if left:
            out[f] = left
    return out


def _backups_in(folder: str) -> dict[str, list[str]]:
    """The names of the rotated backups (regular files) in ``folder``, by their live file's name."""
    found: dict[str, list[str]] = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name, time, dated = rotation_of(entry.name)
                if time and dated and _is_file(entry):
                    found.setdefault(name, []).append(entry.name)
    except OSError:
        pass
    return found


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def read_turns(paths: Iterable[str | Path], on_problem: ProblemSink, *,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[RecordedTurn]:
    """Every turn of every file, in file order, the files one stream (a turn's spans may be in
    two files of a rotated set: ``expand_inputs``); each file's format is detected per line."""
    spans = OtlpAssembler(on_problem, max_line_bytes=max_line_bytes)
    for path in paths:
        with LineSource(path, on_problem, max_line_bytes=max_line_bytes) as source:
            yield from read_source(source, on_problem, spans)
    yield from spans.finish()


def read_source(source: LineSource, on_problem: ProblemSink,
                spans: OtlpAssembler | None = None) -> Iterator[RecordedTurn]:
    """The turns of one file. With ``spans`` (shared by a stream's files) tool spans still waiting at
    its end wait on; without, they are released at its end."""
    label, limit = source.path, source.max_line_bytes
    own = spans is None
    if spans is None:
        spans = OtlpAssembler(on_problem, max_line_bytes=limit)
    spans.path = label
    try:
        for lineno, line in source:
            yield from read_line(line, label, lineno, on_problem, limit, spans)
    except (OSError, EOFError, zlib.error) as exc:
        on_problem(InputProblem(label, 0, f"file ends badly: {exc}"))
    if own:
        yield from spans.finish()


def read_line(line: bytes, path: str, lineno: int, on_problem: ProblemSink, max_line_bytes: int,
              spans: OtlpAssembler) -> Iterator[Any]:
    """The turns one line gives: a corpus line's turn, or those an OTLP line completes in
    ``spans`` (decoded by msgspec when it can, ``collector.decode``; else parsed by ``json``)."""
    otlp = is_otlp_line(line)
    if otlp and too_costly(line, max_line_bytes) is None:
        document = collector.decode(line)
        if document is not None:
            yield from spans.add_decoded(document, lineno)
            return
    obj = parse_line(line, path, lineno, on_problem, max_line_bytes)
    if obj is UNREADABLE:
        return
    if otlp and isinstance(obj, dict) and "resourceSpans" in obj:
        yield from spans.add(obj, lineno)
        return
    turn = corpus_turn(obj, path, lineno, on_problem, max_line_bytes)
    if turn is not None:
        yield turn
