"""docs/usage.md's "What is keyed alike" table says what the code does: rows with one entry in a
mode's column are one call in that mode, rows with different entries are not, and an entry that
spells the form (JSON text, the text, the bytes) is that form."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from turnguard._keys import identity_bytes

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
HEADER = "| argument | `canonical` (default) | `bytes` |"


def table_rows() -> list[tuple[str, str, str]]:
    lines = USAGE.read_text().splitlines()
    start = lines.index(HEADER) + 2  # past the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == 3, line
        rows.append((cells[0], cells[1], cells[2]))
    return rows


def argument(cell: str) -> object:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return eval(cell[1:-1], {"__builtins__": {}, "float": float, "frozenset": frozenset})  # the doc's own literals


def body(args: object, mode: str) -> bytes:
    return identity_bytes("tool", args, mode)[len(b"tool\x00"):]


def spelled(entry: str, mode: str) -> bytes | None:
    """The form an entry spells, if it spells one (others name a token: "the set {1, 2}")."""
    if mode == "canonical":
        if m := re.fullmatch(r"JSON `(.*)`", entry):
            return m.group(1).encode()
        if m := re.fullmatch(r"text `(.*)`", entry):
            return b"\x01" + ast.literal_eval(m.group(1)).encode()
        return None
    if m := re.fullmatch(r"`(b'.*')`", entry):
        return ast.literal_eval(m.group(1))
    return None


def test_the_table_is_there_and_covers_the_asked_cases():
    arguments = [row[0] for row in table_rows()]
    for asked in ("`1`", "`1.0`", "`True`", "`-0.0`", '`float("nan")`', '`"Infinity"`', '`"1"`', '`b"1"`'):
        assert asked in arguments


@pytest.mark.parametrize(("mode", "column"), [("canonical", 1), ("bytes", 2)])
def test_rows_with_one_entry_are_one_call_and_others_are_not(mode, column):
    rows = table_rows()
    for a in rows:
        for b in rows:
            same = body(argument(a[0]), mode) == body(argument(b[0]), mode)
            assert same == (a[column] == b[column]), (mode, a[0], b[0])


@pytest.mark.parametrize(("mode", "column"), [("canonical", 1), ("bytes", 2)])
def test_an_entry_that_spells_a_form_is_that_form(mode, column):
    checked = 0
    for row in table_rows():
        form = spelled(row[column], mode)
        if form is not None:
            assert body(argument(row[0]), mode) == form, row
            checked += 1
    assert checked >= 30
