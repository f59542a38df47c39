"""Plain-text tables that fit a terminal: the width every ``turnguard`` command prints to.

Output fits ``DEFAULT_WIDTH`` (80) columns, the classic terminal's and what a pipe or a file gets,
or the terminal's width when it is wider (``shutil.get_terminal_size``, which also honours
``$COLUMNS``); ``--wide`` lifts the limit. Narrower terminals get 80 all the same: below it, tables
of numbers break into a word per line. A
table too wide for it wraps its wrappable columns at spaces (a cell may take several lines), and
a free-text last column that still does not fit moves to indented lines under its row.

Text that came from outside (a file name, a turn's id) is printed through ``shown``: a file name
that is not UTF-8 reaches Python with its bytes as lone surrogates (PEP 383), which no UTF-8
output can encode, and a control character in a name would break a one-line message or reach the
terminal as an escape sequence.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import textwrap
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_WIDTH = 80
UNLIMITED = 1 << 30
GAP = "  "
MIN_BESIDE = 24
"""The narrowest a free-text last column may be wrapped beside its row; narrower, it goes under."""
UNDER_INDENT = "    "
MIN_BROKEN = 16
"""The narrowest a column whose words may break (``breakable``) is made."""


STDOUT = "-"
"""An output path that means standard output: every command's output options take it, in place of
the table the command prints."""
STDOUT_HELP = "'-': standard output, in place of the table"


def color_allowed(stream: Any) -> bool:
    """Whether ``stream`` may get ANSI escapes (bold): a terminal, and no ``NO_COLOR`` set to a
    non-empty value (https://no-color.org: then no escape at all, bold included)."""
    return not os.environ.get("NO_COLOR") and bool(getattr(stream, "isatty", lambda: False)())


def output_width(wide: bool = False) -> int:
    """Columns to fit: unlimited with ``wide``, else the terminal's width but at least 80."""
    if wide:
        return UNLIMITED
    return max(DEFAULT_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def add_wide_argument(parser: Any) -> None:
    """The ``--wide`` flag every command that prints a table has."""
    parser.add_argument("--wide", action="store_true",
                        help=f"do not fit the output to {DEFAULT_WIDTH} columns (or the terminal's width)")


class EmptyPath(Exception):
    """An argument naming a file or folder was given as ``""`` (an unset shell variable): the
    command's one-line refusal, prefixed ``turnguard COMMAND:``, in ``str()``."""


@dataclass(frozen=True)
class PathArgument:
    """The ``type`` of an argument that names a file or folder (``add_path_argument``): ``""``
    raises ``EmptyPath``, which argparse lets through (it turns only ``ValueError``,
    ``TypeError`` and ``ArgumentTypeError`` into a usage message), so that the command refuses it
    in one line before any work, where it would be taken for no output or the current folder."""

    command: str
    option: str

    def __call__(self, text: str) -> str:
        if not text:
            raise EmptyPath(f"{self.command}: {self.option}: an empty path names no file or folder; give one")
        return text


def add_path_argument(parser: Any, *names: str, group: Any = None, **options: Any) -> None:
    """``parser.add_argument`` (or its argument ``group``'s) for an argument that names a file or
    folder (``PathArgument``)."""
    option = "/".join(names) if names[0].startswith("-") else options.get("metavar") or names[0]
    (group or parser).add_argument(*names, type=PathArgument(parser.prog, option), **options)


def shown(text: str | os.PathLike[str] | bytes) -> str:
    """``text`` (a path, a message naming one) as any output can carry it, on one line: a byte that
    is not UTF-8 (a lone surrogate of ``os.fsdecode``) as ``\\xff``, any other lone surrogate as
    ``\\ud800``, a control character as ``\\n``, ``\\x1b``, ..."""
    text = os.fsdecode(text)
    if text.isascii() and text.isprintable():
        return text
    with contextlib.suppress(UnicodeEncodeError):  # (a surrogate no file name decodes to: escaped below)
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _ESCAPED else ch
                   for ch in text)


_ESCAPED = frozenset({"Cc", "Cs"})
"""Unicode categories ``shown`` writes as escapes: control characters and surrogates."""


def wrap_items(prefix: str, items: Sequence[str], width: int, sep: str = ", ") -> list[str]:
    """``items`` joined by ``sep`` and wrapped to ``width`` between items only (a name never breaks);
    the items start on the next line when the prefix leaves no room for the longest."""
    if items and len(prefix) + max(map(len, items)) + len(sep) > width > len(prefix.strip()):
        lead = " " * (len(prefix) - len(prefix.lstrip()))
        return [prefix.rstrip(), *wrap_items(lead + UNDER_INDENT, items, width, sep)]
    glued = sep.join(i.replace(" ", "\xa0") for i in items)
    lines = textwrap.wrap(glued, width, initial_indent=prefix, subsequent_indent=" " * len(prefix),
                          break_on_hyphens=False, break_long_words=False) or [prefix]
    return [line.replace("\xa0", " ") for line in lines]


def wrap_text(text: str, width: int, indent: str = "", subsequent: str | None = None) -> list[str]:
    """Prose wrapped to ``width`` (never inside a word)."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent if subsequent is None
                         else subsequent, break_on_hyphens=False, break_long_words=False) or [indent]


@dataclass(frozen=True, slots=True)
class Layout:
    """Column widths that fit a table to a width, and how to print its lines."""

    widths: tuple[int, ...]
    right: frozenset[int]
    width: int
    under: bool = False
    breakable: frozenset[int] = frozenset()
    """The free-text last column goes on indented lines under its row."""

    def header(self, names: Sequence[str], *, rule: bool = True) -> list[str]:
        """The column names (the under-row column's on its own indented line), then a rule."""
        lines = self.row(names)
        return [*lines, GAP.join("-" * w for w in self._shown)] if rule else lines

    def row(self, cells: Sequence[str], *, under: bool | None = None) -> list[str]:
        """One row's lines: wrapped cells side by side, then the last column's under it."""
        cells = [str(c) for c in cells]
        shown = self._shown
        parts = [_wrap_cell(c, w, i in self.breakable) if len(c) > w else [c]
                 for i, (c, w) in enumerate(zip(cells, shown, strict=False))]
        lines = []
        for k in range(max(len(p) for p in parts)):
            lines.append(GAP.join((p[k] if k < len(p) else "").rjust(w) if i in self.right
                                  else (p[k] if k < len(p) else "").ljust(w)
                                  for i, (p, w) in enumerate(zip(parts, shown, strict=False))).rstrip())
        if (self.under if under is None else under) and len(cells) > len(shown) and cells[-1]:
            lines += wrap_text(cells[-1], self.width, UNDER_INDENT)
        return lines

    @property
    def _shown(self) -> tuple[int, ...]:
        return self.widths[:-1] if self.under else self.widths


def layout(header: Sequence[str], rows: Sequence[Sequence[str]], width: int, *, right: Sequence[int] = (),
           wrap: Sequence[int] = (), free_last: bool = False, breakable: Sequence[int] = ()) -> Layout:
    """Widths for ``rows`` under ``header`` within ``width`` columns, when the words allow.

    ``right``: the columns aligned right (numbers). ``wrap``: the columns that may wrap at spaces,
    the widest first, down to their longest word. ``breakable``: wrapping columns whose words may
    break too (paths, long reprs), down to ``MIN_BROKEN``. Any other column whose header is wider
    than its values may wrap the header at its spaces, down to its widest value (``calls past``
    over ``3,530``). ``free_last``: the last column is prose; when it cannot sit beside its row at
    least ``MIN_BESIDE`` wide, it is printed under the row.
    """
    n = len(header)
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(header[i]), *(len(r[i]) for r in cells)]) for i in range(n)]
    floors = [_floor(i, header, cells, widths, wrap, breakable) for i in range(n)]
    headed = [i for i in range(n) if i not in wrap and i not in breakable and floors[i] < widths[i]]
    wrap = [*wrap, *(i for i in breakable if i not in wrap), *headed]
    under = False
    if free_last and _total(widths, n) > width:
        beside = width - _total(widths, n - 1) - len(GAP)
        if beside >= max(MIN_BESIDE, _longest_word(header[-1]), *(_longest_word(r[-1]) for r in cells)):
            widths[-1] = beside
        else:
            under = True
    _shrink(widths, floors, cells, wrap, n - 1 if under else n, width)
    return Layout(tuple(widths), frozenset(right), width, under, frozenset(breakable))


def _total(widths: list[int], columns: int) -> int:
    """The width of the first ``columns`` columns with the gaps between them."""
    return sum(widths[:columns]) + len(GAP) * (columns - 1)


def _floor(i: int, header: Sequence[str], cells: list[list[str]], widths: list[int], wrap: Sequence[int],
           breakable: Sequence[int]) -> int:
    """How narrow column ``i`` may become: ``MIN_BROKEN`` if its words may break, its longest word
    if it wraps, else its widest value (its header wraps at spaces, its values never)."""
    if i in breakable:
        return min(widths[i], MIN_BROKEN)
    if i in wrap:
        return max([_longest_word(header[i]), *(_longest_word(r[i]) for r in cells)])
    return max([_longest_word(header[i]), *(len(r[i]) for r in cells)])


def _shrink(widths: list[int], floors: list[int], cells: list[list[str]], wrap: Sequence[int], shown: int,
            width: int) -> None:
    """Narrow the wrapping columns among the first ``shown`` until they fit ``width`` or reach their
    floors: first a header wider than its column's values, then the widest column, one at a time."""
    for i in wrap:  # a header wider than its column's values wraps first ("asks (turns)" over "3 (1)")
        if i < shown and _total(widths, shown) > width:
            data = max([floors[i], *(len(r[i]) for r in cells)])
            widths[i] -= min(widths[i] - data, _total(widths, shown) - width)
    while _total(widths, shown) > width:
        shrinkable = [i for i in wrap if i < shown and widths[i] > floors[i]]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i])] -= 1


def fit_table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int, *, right: Sequence[int] = (),
              wrap: Sequence[int] = (), free_last: bool = False, breakable: Sequence[int] = ()) -> list[str]:
    """``rows`` under ``header`` and a rule, as lines fitted by ``layout`` (same options)."""
    fitted = layout(header, rows, width, right=right, wrap=wrap, free_last=free_last, breakable=breakable)
    out = fitted.header(header)
    for row in rows:
        out += fitted.row(row)
    return out


def _wrap_cell(cell: str, width: int, breakable: bool = False) -> list[str]:
    """A cell's lines; continuation lines keep the cell's own indent (the ``* `` marker's room)."""
    indent = " " * (len(cell) - len(cell.lstrip(" ")))
    return textwrap.wrap(cell, width, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=breakable) or [""]


def _longest_word(text: str) -> int:
    return max((len(word) for word in str(text).split()), default=0)
