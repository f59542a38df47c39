"""The counts a ``--json`` result holds, checked as any input is when results are merged.

``calibrate merge`` reads results written elsewhere; a tampered one (a negative count, 10^30)
must be refused with a clear message, not summed into the report.
"""

from __future__ import annotations

from typing import Any

MAX_COUNT = 2**62
"""The largest count a result may hold: far past any real recording, so a larger one is tampering."""
COHORT_KEYS = ("live", "probe", "unrecorded")
"""How figures are split by cohort: the turn's cohort, ``unrecorded`` when the recording has none."""


def count(value: Any, what: str = "a count") -> int:
    """``value`` when it is a whole number from 0 to ``MAX_COUNT``, else ``ValueError``."""
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_COUNT:,}, got {shown(value)}")
    return value


def histogram(data: Any, what: str, keys: Any = None) -> dict[Any, int]:
    """A ``{key: count}`` object of a result; ``keys`` (a callable) checks and converts each key."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object, got {shown(data)}")
    return {(keys(k) if keys else str(k)): count(v, f"{what}[{shown(k)}]") for k, v in data.items()}


def call_count_key(key: Any) -> int:
    """A histogram key that is a number of calls (JSON keys are texts)."""
    try:
        value = int(key)
    except (TypeError, ValueError):
        value = -1
    if not 0 <= value <= MAX_COUNT or str(value) != str(key):
        raise ValueError(f"a call count must be a whole number from 0, got {shown(key)}")
    return value


def cohort_key(key: Any) -> str:
    if key not in COHORT_KEYS:
        raise ValueError(f"a cohort must be one of {', '.join(COHORT_KEYS)}, got {shown(key)}")
    return key


def shown(value: Any, width: int = 40) -> str:
    text = repr(value) if not isinstance(value, str) or len(value) <= width else repr(value[:width]) + "..."
    return text if len(text) <= width + 5 else text[:width] + "..."
