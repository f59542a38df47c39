"""OTLP JSON attribute values as Python values, as calibrate reads them.

``[{"key": k, "value": {"stringValue": ...}}]`` is a span's (or a log record's) attributes; a
value is the first of its fields present, in ``any_value``'s order. One definition for both
readings of the Collector's lines: the ``json`` module's dicts (``attributes``, ``any_value``)
and msgspec's typed decoding (``span_decoding.value``, which hands arrays to ``array_value``).
"""

from __future__ import annotations

from typing import Any

MAX_ARRAY_DEPTH = 8
"""Arrays in arrays nested deeper than this read as ``None`` (no hostile value recurses further)."""


def attributes(items: Any) -> dict[str, Any]:
    """OTLP JSON ``[{"key": k, "value": {"stringValue": ...}}]`` as a plain dict (the last of
    duplicate keys wins; items that are not ``{"key": text, ...}`` are left out)."""
    out: dict[str, Any] = {}
    if not isinstance(items, list):
        return out
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            out[item["key"]] = any_value(item.get("value"))
    return out


def any_value(value: Any, depth: int = 0) -> Any:
    """An attribute's value: the first of its fields present, in this order (an ``intValue``
    that is no integer, and any other kind, read as ``None``)."""
    if not isinstance(value, dict):
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:  # int64 is a string in OTLP JSON
        return int_value(value["intValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "doubleValue" in value:
        return value["doubleValue"]
    if "arrayValue" in value:
        return array_value(value["arrayValue"], depth)
    return None


def int_value(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError, OverflowError):
        return None


def array_value(array: Any, depth: int = 0) -> list[Any] | None:
    """An ``arrayValue``: its ``values`` converted (an empty list without a list of them), or
    ``None`` past ``MAX_ARRAY_DEPTH`` levels of arrays in arrays."""
    if depth >= MAX_ARRAY_DEPTH:
        return None
    items = array.get("values") if isinstance(array, dict) else None
    return [any_value(v, depth + 1) for v in items] if isinstance(items, list) else []
