"""Bounded attribute values for metrics: the first N distinct values pass, the rest fold.

Tool and agent names come from the host (and, through it, from the model), so a metric labelled
by them could grow without bound. ``BoundedValues`` admits the first ``limit`` distinct values
and maps every later one to ``names.OVERFLOW_VALUE``; a value once admitted stays admitted. Each
value is first made exportable (``telemetry.text.export_text``: encodable, bounded in length), so
the bound counts what reaches the metric. The values turnguard itself gives (``builtins``: the
built-in thresholds, end reasons, plugins...) always pass and never count, so no number of
third-party values folds them. A label whose every value turnguard names is ``closed`` instead.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from turnguard.telemetry._names import OVERFLOW_VALUE
from turnguard.telemetry._text import export_text

if TYPE_CHECKING:
    from collections.abc import Iterable


def closed(value: object, allowed: frozenset[str]) -> str:
    """``value``'s exported text when it is one of ``allowed`` (a label's closed set), else the
    overflow value: whoever made the value, the label has at most ``len(allowed) + 1`` values."""
    text = export_text(value)
    return text if text in allowed else OVERFLOW_VALUE


class BoundedValues:
    """A thread-safe admission set of at most ``limit`` distinct strings beside ``builtins``."""

    __slots__ = ("_lock", "_seen", "builtins", "limit")

    def __init__(self, limit: int, builtins: Iterable[str] = ()) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self.builtins = frozenset(builtins)
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def fold(self, value: object) -> str:
        """``value``'s exported text while it is (or fits among) the admitted values, else the
        overflow value."""
        value = export_text(value)
        seen = self._seen
        if value in seen or value in self.builtins:
            return value
        with self._lock:
            if value in seen:
                return value
            if len(seen) >= self.limit:
                return OVERFLOW_VALUE
            seen.add(value)
            return value

    def known(self, value: object) -> str | None:
        """``value``'s exported text when it was admitted already, else ``None``; it admits nothing
        (for values from untrusted input, which must not decide what is shown)."""
        value = export_text(value)
        return value if value in self._seen or value in self.builtins else None

    def __len__(self) -> int:
        """The third-party values admitted (the built-ins not counted)."""
        return len(self._seen)
