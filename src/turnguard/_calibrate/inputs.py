"""What a calibration reads: the files the command line names, in stream order, and their lines,
each routed to its format's reader: the recorder's (``corpus``) or the Collector's
(``collector``); a file may mix them. Every reader streams: one turn is in memory at a time (for
the Collector's, the turns whose turn span has not arrived yet).
Which files make up a calibration's input, and in which order.

The Collector's file exporter rotates its file (``rotation: max_megabytes ...``): the full file is
renamed to a backup beside it, ``<name>-<UTC time>.<ext>`` (``otlp-2026-12-01T10-00-00.000-size.jsonl``
for ``otlp.jsonl``: the naming of the timberjack library the exporter uses, ``ROTATED``), and a new file is
started. A turn's tool spans may be in a backup and its turn span in the next file, so the files
of one rotated set are one stream: read oldest backup first, the live file last, through one span
assembler (``collector.OtlpAssembler``), never as separate files.

``expand_inputs`` turns the command line's arguments into files: a directory stands for the files
in it, a quoted glob (``'otlp*.jsonl'``) for the files it matches, a file for itself; files of one
rotated set are put in rotation order wherever they were named. ``missing_backups`` names the
backups beside a given file that were not given (the command says so: a report on the live file
alone leaves out most of the turns).
"""

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
from turnguard._calibrate.corpus import corpus_line, corpus_turn
from turnguard._calibrate.records import (
    MAX_LINE_BYTES,
    UNREADABLE,
    InputError,
    InputProblem,
    Limits,
    LineSource,
    ProblemSink,
    RecordedCall,
    RecordedTurn,
    parse_line,
    too_costly,
)

__all__ = ["InputError", "InputProblem", "Limits", "RecordedCall", "RecordedTurn", "corpus_turn", "expand_inputs",
           "missing_backups", "read_source", "read_turns"]
"""``RecordedCall``, ``RecordedTurn``, ``Limits``, ``InputProblem`` and ``InputError`` are
``records``'s, named here too for the modules that read turns."""

ROTATED = re.compile(r"^(?P<stem>.+?)-(?P<time>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3})(?:-(?P<reason>[a-z0-9_]+))?"
                     r"(?P<ext>\.(?!(?:gz|zst)$)[^.]+)?(?P<packed>\.gz|\.zst)?$")
"""A rotated backup's name, as the Collector's file exporter names it through the timberjack
library (``backupNameWithResolved``): the live file's name without its extension, ``-``, the
rotation time (``2006-01-02T15-04-05.000``, UTC unless the exporter's ``localtime``; it sorts in
time order), ``-`` and the reason (``size`` or ``time``), then the extension
(``otlp-2026-12-04T19-36-19.852-size.jsonl`` for ``otlp.jsonl``); or the extension first
(``otlp.jsonl-2026-12-04T19-36-19.852-size``, timberjack's ``AppendTimeAfterExt``); or without a
reason (``otlp-2026-12-04T19-36-19.852.jsonl``, the lumberjack library of Collectors before
v0.130); each with ``.gz`` or ``.zst`` when compressed afterwards."""
TIME_FORMAT = "%Y-%m-%dT%H-%M-%S.%f"
GLOB_CHARS = frozenset("*?[")


class Rotation(NamedTuple):
    """Where a file stands in its rotated set: the live file's name, and the rotation time of a
    backup (``""`` for a live file or any other file); ``dated`` is false for a backup's name whose
    time is no date (``2026-13-01T...``), which cannot be placed in time."""

    live: str
    time: str
    dated: bool = True


def rotation_of(path: Path) -> Rotation:
    """The rotated set ``path`` belongs to and its place in it (``ROTATED``)."""
    return _rotation(path.name)


def _rotation(name: str) -> Rotation:
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
    """The input files the arguments name, each once, rotated sets in rotation order.

    A directory gives its regular files (not hidden ones, not its subdirectories); an argument
    that is not an existing path but holds ``*``, ``?`` or ``[`` is a glob; anything else is a
    file. ``InputError`` names an argument that gives no readable file."""
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
    """``files`` with each rotated set in rotation order (its backups oldest first, its live file
    last), at the place of the set's first file; other files keep their order.

    A set is the files of one live file's name, in whatever directories they are (backups moved to
    an archive folder are still its backups). Live files of one name in several directories are
    several Collectors' files: each directory's backups go with its own live file. ``InputError``
    names a file that cannot be placed in time: a backup whose name holds no date, or a backup in
    a directory of its own when several live files of its name were given."""
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
    """For each live file given, the rotated backups beside it that were not given. Each folder is
    listed once, its backups indexed by live file, so thousands of files in one folder cost one
    listing, not one per file."""
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
                name, time, dated = _rotation(entry.name)
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


# -- lines to turns --------------------------------------------------------------------------------



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
    """The turns of one file: corpus lines and OTLP lines may even be mixed in one file. With
    ``spans``, an assembler shared by the files of one stream, tool spans still waiting for their
    turn span at the end of the file wait on (the caller finishes it); without, they are released
    at the end of this file."""
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
    if not is_otlp_line(line):
        turn = corpus_line(line, path, lineno, on_problem, max_line_bytes)
        if turn is not None:
            yield turn
        return
    if too_costly(line, max_line_bytes) is None:
        document = collector.decode(line)
        if document is not None:
            yield from spans.add_decoded(document, lineno)
            return
    obj = parse_line(line, path, lineno, on_problem, max_line_bytes)
    if obj is UNREADABLE:
        return
    if isinstance(obj, dict) and "resourceSpans" in obj:
        yield from spans.add(obj, lineno)
        return
    turn = corpus_turn(obj, path, lineno, on_problem, max_line_bytes)
    if turn is not None:
        yield turn
