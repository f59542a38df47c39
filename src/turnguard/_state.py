"""Reading a turn's state back from JSON data (``Guard.resume``): validated like any input.

A snapshot comes back from a checkpointer, a file, another process: anything may have happened
to it. ``Fields`` reads one JSON object at a path (``facts``, ``plugins.shadow.stale``): each read
checks one field's type and range and names the field when it is wrong, missing, or nested
differently, so a bad snapshot is a ``SnapshotError`` at the resume, never a ``KeyError`` there
or a ``TypeError`` at the next check. ``done()`` refuses a field no read asked for: state this
turnguard cannot honour (written by a newer one, or mistyped) is not silently dropped.

Integers are ``int`` and not ``bool`` (``True`` is not a count), between bounds; the largest is
``MAX_COUNT``, 2**53, the integers a JSON number carries exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NoReturn, overload

MAX_COUNT = 2**53
"""The largest count a snapshot may hold (a JSON number is exact up to here)."""
_MISSING: Any = object()
_SHOWN = 60


class SnapshotError(ValueError):
    """A snapshot a guard cannot continue (``Guard.resume``): the message says why, and ``field``
    names the part of the snapshot at fault (``facts.counts``) when one is."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def shown(value: Any) -> str:
    """A bad value as the message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}..."


def refuse(path: str, what: str, value: Any = _MISSING) -> NoReturn:
    """Raise the ``SnapshotError`` for field ``path``, which must be ``what``."""
    got = "it is missing" if value is _MISSING else f"got {shown(value)}"
    raise SnapshotError(f"the snapshot's field {path!r} must be {what}; {got}", path)


def integer(path: str, value: Any, low: int = 0, high: int = MAX_COUNT) -> int:
    if type(value) is not int or not low <= value <= high:
        refuse(path, f"an integer from {low} to {high}", value)
    return value


def boolean(path: str, value: Any) -> bool:
    if type(value) is not bool:
        refuse(path, "true or false", value)
    return value


def text(path: str, value: Any, *, optional: bool = False, nonempty: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) is not str or (nonempty and not value):
        refuse(path, ("a non-empty string" if nonempty else "a string") + (" or null" if optional else ""), value)
    return value


@overload
def digest(path: str, value: Any, size: int, *, optional: Literal[False] = False) -> bytes: ...
@overload
def digest(path: str, value: Any, size: int, *, optional: bool) -> bytes | None: ...
def digest(path: str, value: Any, size: int, *, optional: bool = False) -> bytes | None:
    """``size`` bytes written as lower-case hex (``None`` only when ``optional``)."""
    if value is None and optional:
        return None
    if type(value) is str and len(value) == 2 * size:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    refuse(path, f"{2 * size} hex digits" + (" or null" if optional else ""), value)


def choice(path: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if type(value) is not str or value not in choices:
        refuse(path, f"one of {', '.join(choices)}", value)
    return value


def number(path: str, value: Any, low: float, high: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not low <= value <= high:
        refuse(path, f"a number from {low:g} to {high:g}", value)
    return float(value)


class Fields:
    """One JSON object of a snapshot, read field by field (see the module docstring)."""

    __slots__ = ("_data", "_read", "path")

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            refuse(path, "an object", data)
        for key in data:
            if type(key) is not str:
                refuse(path, "an object whose keys are strings", key)
        self._data = data
        self._read: set[str] = set()
        self.path = path

    @property
    def entries(self) -> Mapping[str, Any]:
        """The whole object as it is, for a caller that reads its keys itself (``mapping``)."""
        return self._data

    def at(self, name: str) -> str:
        """The path of field ``name``."""
        return f"{self.path}.{name}" if self.path else name

    def __contains__(self, name: str) -> bool:
        return name in self._data

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """The raw value of ``name`` (``default`` when absent; without one, absent is refused)."""
        self._read.add(name)
        if name in self._data:
            return self._data[name]
        if default is _MISSING:
            raise SnapshotError(f"the snapshot has no field {self.at(name)!r}", self.at(name))
        return default

    def integer(self, name: str, low: int = 0, high: int = MAX_COUNT, default: Any = _MISSING) -> int:
        value = self.get(name, default)
        return value if value is default else integer(self.at(name), value, low, high)

    def boolean(self, name: str, default: Any = _MISSING) -> bool:
        value = self.get(name, default)
        return value if value is default else boolean(self.at(name), value)

    def text(self, name: str, *, optional: bool = False, nonempty: bool = False, default: Any = _MISSING) -> Any:
        value = self.get(name, default)
        return value if value is default else text(self.at(name), value, optional=optional, nonempty=nonempty)

    @overload
    def digest(self, name: str, size: int, *, optional: Literal[False] = False) -> bytes: ...
    @overload
    def digest(self, name: str, size: int, *, optional: bool) -> bytes | None: ...
    def digest(self, name: str, size: int, *, optional: bool = False) -> bytes | None:
        return digest(self.at(name), self.get(name), size, optional=optional)

    def choice(self, name: str, choices: Iterable[str], default: Any = _MISSING) -> str:
        value = self.get(name, default)
        return value if value is default else choice(self.at(name), value, choices)

    def number(self, name: str, low: float, high: float) -> float:
        return number(self.at(name), self.get(name), low, high)

    def object(self, name: str, default: Any = _MISSING) -> Fields:
        value = self.get(name, default)
        return Fields(value, self.at(name))

    def items(self, name: str, limit: int, default: Any = _MISSING) -> list[Any]:
        """A JSON array of at most ``limit`` items."""
        value = self.get(name, default)
        if not isinstance(value, list | tuple) or len(value) > limit:
            refuse(self.at(name), f"an array of at most {limit} items", value)
        return list(value)

    def mapping(self, name: str, limit: int, default: Any = _MISSING) -> dict[str, Any]:
        """A JSON object of at most ``limit`` entries, whatever its keys (the caller reads them)."""
        value = self.get(name, default)
        entries = Fields(value, self.at(name)).entries
        if len(entries) > limit:
            refuse(self.at(name), f"an object of at most {limit} entries", f"{len(entries)} entries")
        return dict(entries)

    def done(self) -> None:
        """Refuse any field no read asked for."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            where = self.at(unknown[0])
            raise SnapshotError(
                f"the snapshot's field {where!r} is not one this turnguard reads (a snapshot from a newer "
                "turnguard holding state this one cannot honour?)", where)
