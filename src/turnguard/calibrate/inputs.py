"""What a calibration reads: the files the command line names, in stream order, and their lines,
each routed to its format's reader: the recorder's (``corpus``) or the Collector's
(``collector``); a file may mix them. Every reader streams: one turn is in memory at a time (for
the Collector's, the turns whose turn span has not arrived yet).
Which files make up a calibration's input, and in which order.

The Collector's file exporter rotates its file (``rotation: max_megabytes ...``): the full file is
renamed to a backup beside it, ``<name>-<UTC time>.<ext>`` (``otlp-2026-12-01T10-00-00.000.jsonl``
for ``otlp.jsonl``: the naming of the lumberjack library the exporter uses), and a new file is
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
from pathlib import Path
from typing import Any

from turnguard.calibrate import collector
from turnguard.calibrate.collector import OtlpAssembler, is_otlp_line
from turnguard.calibrate.corpus import corpus_line, corpus_turn
from turnguard.calibrate.records import (
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

BACKUP = re.compile(r"^(?P<prefix>.+)-(?P<time>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3})(?P<ext>\.[^.]*)?(?P<gz>\.gz)?$")
"""A rotated backup's name: the live file's name without its extension, ``-``, the rotation time
(``2006-01-02T15-04-05.000``, which sorts in time order), the extension (and ``.gz`` when
compressed afterwards)."""
GLOB_CHARS = frozenset("*?[")


def rotation_of(path: Path) -> tuple[str, str]:
    """``(live file's name, rotation time)`` of a backup; ``(name, "")`` for any other file
    (a live file sorts after its backups: ``""`` is read last, see ``_order_key``)."""
    return _rotation(path.name)


def _rotation(name: str) -> tuple[str, str]:
    found = BACKUP.match(name)
    if found is None:
        return name, ""
    return found["prefix"] + (found["ext"] or ""), found["time"]


def _order_key(path: Path) -> tuple[int, str]:
    _, time = rotation_of(path)
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
    """``files`` with each rotated set (a live file and its backups, in one directory) in rotation
    order, at the place of the set's first file; other files keep their order."""
    groups: dict[tuple[str, str], list[Path]] = {}
    for f in files:
        groups.setdefault((os.path.dirname(os.path.abspath(f)), rotation_of(f)[0]), []).append(f)
    return [f for group in groups.values() for f in sorted(group, key=_order_key)]


def missing_backups(files: Sequence[Path]) -> dict[Path, list[Path]]:
    """For each live file given, the rotated backups beside it that were not given. Each folder is
    listed once, its backups indexed by live file, so thousands of files in one folder cost one
    listing, not one per file."""
    given = {os.path.realpath(f) for f in files}
    backups: dict[str, dict[str, list[str]]] = {}
    out: dict[Path, list[Path]] = {}
    for f in files:
        name, time = rotation_of(f)
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
                name, time = _rotation(entry.name)
                if time and _is_file(entry):
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
