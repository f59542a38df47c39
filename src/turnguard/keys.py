"""The identity of a tool call: a canonical form of its arguments and a keyed digest of it.

Two calls are "the same call" when their tool names and canonical arguments are equal. The
canonical form is JSON with object keys sorted at every level, array order kept and no
insignificant whitespace; a ``str``/``bytes`` argument that parses as JSON is canonicalized as
the value it encodes, so ``'{"b":1,"a":2}'`` and ``{"a": 2, "b": 1}`` are one call.

Nothing here raises because of the arguments. Values that JSON cannot encode get a deterministic
fallback encoding (see ``_fallback``): sets are sorted, NaN and infinities are written as tokens,
self-references become a ``"<cycle>"`` marker, nesting of any depth is walked iteratively, and
other objects are encoded by type name and ``repr``.

The digest is a keyed BLAKE2b (an HMAC-equivalent keyed hash) with a per-process random secret
unless one is configured, so that a digest cannot be reversed by hashing guessed arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import secrets
from collections.abc import Mapping
from typing import Any

KEY_MODES = ("canonical", "bytes")
"""``canonical``: JSON-canonical identity (default). ``bytes``: strings and bytes compared as given."""

DIGEST_SIZE = 8
_PROCESS_SECRET = secrets.token_bytes(32)
_JSON_STARTS = frozenset('{["-0123456789')
_JSON_WORDS = frozenset(("true", "false", "null"))

_dumps = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True, check_circular=True
).encode
_loads = json.loads


@dataclasses.dataclass(frozen=True, slots=True)
class CallKey:
    """A call's identity within one keyer: the digest is what the ledger counts."""

    digest: bytes
    keyer: Keyer

    @property
    def hex(self) -> str:
        return self.digest.hex()


class Keyer:
    """Computes call keys for one guard (one key mode, one digest secret)."""

    __slots__ = ("mode", "_secret", "_canonical")

    def __init__(self, mode: str = "canonical", secret: bytes | str | None = None) -> None:
        if mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {mode!r}")
        self.mode = mode
        if isinstance(secret, str):
            secret = secret.encode()
        self._secret = (secret or _PROCESS_SECRET)[:64]
        self._canonical = canonical_bytes if mode == "canonical" else byte_identity

    def digest(self, name: str, args: Any) -> bytes:
        """The keyed digest of (name, canonical args)."""
        h = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE, key=self._secret)
        h.update(b"\x00")
        h.update(self._canonical(args))
        return h.digest()

    def key_of(self, call: Any) -> CallKey:
        """The key of a ``ToolCall``, computed once and cached on the call for this keyer."""
        cached = call._key
        if cached is not None and cached.keyer is self:
            return cached
        key = CallKey(self.digest(call.name, call.args), self)
        object.__setattr__(call, "_key", key)
        return key


def canonical_bytes(args: Any) -> bytes:
    """Canonical JSON of ``args`` as UTF-8; JSON text in ``str``/``bytes`` is parsed first."""
    if isinstance(args, (bytes, bytearray, memoryview)):
        raw = bytes(args)
        try:
            args = raw.decode("utf-8")
        except UnicodeDecodeError:
            return b"\x00bytes\x00" + raw
    if isinstance(args, str):
        args = _parse_json_text(args)
    return canonical_text(args).encode("utf-8", "surrogatepass")


def byte_identity(args: Any) -> bytes:
    """The second seed's identity: strings and bytes byte for byte, other values canonical JSON."""
    if isinstance(args, str):
        return args.encode("utf-8", "surrogatepass")
    if isinstance(args, (bytes, bytearray, memoryview)):
        return bytes(args)
    return canonical_text(args).encode("utf-8", "surrogatepass")


def canonical_text(value: Any) -> str:
    """Canonical JSON text of any value; never raises."""
    try:
        return _dumps(value)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return _fallback(value)


def _parse_json_text(text: str) -> Any:
    """The JSON value ``text`` encodes, or ``text`` itself when it is not JSON (or too deep)."""
    stripped = text.strip()
    if not stripped:
        return text
    if stripped[0] not in _JSON_STARTS and stripped not in _JSON_WORDS:
        return text
    try:
        return _loads(stripped)
    except (ValueError, RecursionError):
        return text


def _scalar(value: Any) -> str | None:
    """Canonical text of a leaf value, or ``None`` for containers."""
    if value is None or value is True or value is False or isinstance(value, str):
        return _dumps(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _dumps({"__bytes__": bytes(value).hex()})
    if isinstance(value, enum.Enum):
        return _dumps({"__enum__": f"{type(value).__qualname__}.{value.name}"})
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return None
    return _dumps({"__object__": type(value).__qualname__, "repr": _safe_repr(value)})


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break the key
        return "<unrepresentable>"
    return text if len(text) <= 4096 else text[:4096] + f"...<{len(text)}>"


def _children(value: Any) -> tuple[str, list[tuple[Any, Any]]]:
    """A container's kind and its (key, child) pairs; keys are ``None`` for sequences."""
    if isinstance(value, Mapping):
        return "object", list(value.items())
    if isinstance(value, (list, tuple)):
        return "array", [(None, v) for v in value]
    if isinstance(value, (set, frozenset)):
        return "set", [(None, v) for v in value]
    fields = dataclasses.fields(value)
    items = [(f.name, getattr(value, f.name, None)) for f in fields]
    return "object", [("__dataclass__", type(value).__qualname__), *items]


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else canonical_text(key)


def _finish(kind: str, keys: list[Any], parts: list[str]) -> str:
    if kind == "object":
        pairs = sorted(zip((_key_text(k) for k in keys), parts, strict=True))
        return "{" + ",".join(_dumps(k) + ":" + v for k, v in pairs) + "}"
    if kind == "set":
        return "{\"__set__\":[" + ",".join(sorted(parts)) + "]}"
    return "[" + ",".join(parts) + "]"


def _fallback(root: Any) -> str:
    """Iterative canonical encoder for what ``json`` refuses: any depth, cycles, odd types."""
    leaf = _scalar(root)
    if leaf is not None:
        return leaf
    # Each frame: [kind, pending (key, child) pairs reversed, done keys, done texts, id]
    kind, items = _children(root)
    stack: list[list[Any]] = [[kind, items[::-1], [], [], id(root)]]
    on_path = {id(root)}
    while True:
        frame = stack[-1]
        pending = frame[1]
        if not pending:
            stack.pop()
            on_path.discard(frame[4])
            text = _finish(frame[0], frame[2], frame[3])
            if not stack:
                return text
            stack[-1][3].append(text)
            continue
        key, child = pending.pop()
        stack[-1][2].append(key)
        leaf = _scalar(child)
        if leaf is not None:
            frame[3].append(leaf)
        elif id(child) in on_path:
            frame[3].append('"<cycle>"')
        else:
            kind, items = _children(child)
            on_path.add(id(child))
            stack.append([kind, items[::-1], [], [], id(child)])
