"""The identity of a tool call: a canonical form of its arguments and a keyed digest of it.

Two calls are "the same call" when their tool names and canonical arguments are equal. The
canonical form is JSON with object keys sorted at every level, array order kept and no
insignificant whitespace; a ``str``/``bytes`` argument that parses as JSON is canonicalized as
the value it encodes, so ``'{"b":1,"a":2}'`` and ``{"a": 2, "b": 1}`` are one call. Text that is
not JSON (a shell command, a path), or JSON text of a string, is its own canonical form: the byte
``0x01`` and the text's UTF-8. No JSON text starts with that byte, so text never meets a value,
and hashing text needs no JSON escaping.

Nothing here raises because of the arguments. Values that JSON cannot encode get a deterministic
fallback encoding (see ``_fallback``): sets are sorted, NaN and infinities are written as tokens,
self-references become a ``"<cycle>"`` marker, nesting of any depth is walked iteratively, plain
objects are encoded by type name and attributes, other objects by type name and ``repr`` (with
memory addresses removed, so that equal objects made at different times get one key).

The digest is a keyed BLAKE2b (an HMAC-equivalent keyed hash) with a per-process random secret
unless one is configured, so that a digest cannot be reversed by hashing guessed arguments.

This module is on the hot path (every ``check_call``): the common cases (a dict of JSON values, a
string that is not JSON) take at most one C-level encoder call and one hash update each.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
import secrets
from collections.abc import Mapping
from json.encoder import encode_basestring as _quote
from typing import Any

from turnguard.model import ToolCall

try:  # the C accelerator: one call encodes a whole value, without json.dumps's per-call setup
    from json.encoder import c_make_encoder as _c_make_encoder
except ImportError:  # pragma: no cover - every CPython build has it
    _c_make_encoder = None

KEY_MODES = ("canonical", "bytes")
"""``canonical``: JSON-canonical identity (default). ``bytes``: strings and bytes compared as given."""

DIGEST_SIZE = 8
_PROCESS_SECRET = secrets.token_bytes(32)
_JSON_STARTS = frozenset('{["-0123456789')
_JSON_WORDS = frozenset(("true", "false", "null"))
_SPACE = frozenset(" \t\r\n")
_MAYBE_JSON = _JSON_STARTS | _SPACE | {""}
"""First characters of text that may be JSON (after optional whitespace); "" is the empty text."""
_REPR_LIMIT = 4096
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

_scan_json = json.JSONDecoder().scan_once


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


if _c_make_encoder is not None:
    # No circular-reference markers: a self-reference ends in RecursionError like deep nesting,
    # and the encoder keeps no state between calls (markers left behind by an error would make
    # a later, unrelated value look circular).
    _encode_chunks = _c_make_encoder(None, _refuse, _quote, None, ":", ",", True, False, True)

    def _encode(value: Any) -> str:
        return _join(_encode_chunks(value, 0))

else:  # pragma: no cover
    _python_encoder = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True, check_circular=False
    )
    _encode = _python_encoder.encode

    def _encode_chunks(value: Any, _level: int) -> list[str]:
        return [_python_encoder.encode(value)]

_join = "".join
store_key = ToolCall.__dict__["_key"].__set__
"""Set a ``ToolCall``'s cached key: the slot's own setter (the dataclass is frozen, and this is
cheaper than ``object.__setattr__`` on the hot path)."""


_TEXT = "\x01"
"""Marks a text's canonical form (see the module docstring)."""
_TEXT_BYTES = _TEXT.encode()


class Keyer:
    """Computes call keys for one guard (one key mode, one digest secret)."""

    __slots__ = ("_blank", "_canonical", "_plain_text", "_secret", "mode")

    def __init__(self, mode: str = "canonical", secret: bytes | str | None = None) -> None:
        if mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {mode!r}")
        self.mode = mode
        if isinstance(secret, str):
            secret = secret.encode()
        self._secret = (secret or _PROCESS_SECRET)[:64]
        self._canonical = canonical_bytes if mode == "canonical" else byte_identity
        self._plain_text = mode == "canonical"
        # Keying BLAKE2b costs a compression; copying a keyed state is cheaper than re-keying.
        self._blank = hashlib.blake2b(digest_size=DIGEST_SIZE, key=self._secret)

    def digest(self, name: str, args: Any) -> bytes:
        """The keyed digest of (name, canonical args)."""
        h = self._blank.copy()
        text = None
        try:
            cls = type(args)
            if cls is str:
                if self._plain_text and args[:1] not in _MAYBE_JSON and (len(args) > 5 or args not in _JSON_WORDS):
                    # inlined: text that cannot be JSON (a shell command, a path), marked
                    h.update((name + "\x00" + _TEXT + args).encode())
                    return h.digest()
            elif cls is dict:
                try:  # inlined too: a dict of JSON values (both modes)
                    text = _join(_encode_chunks(args, 0))
                except (TypeError, ValueError, RecursionError, OverflowError):
                    text = None
                else:
                    if len(text) < 4096:  # one encode for the common, small case
                        h.update((name + "\x00" + text).encode())
                        return h.digest()
        except (UnicodeEncodeError, TypeError):  # lone surrogates (kept: surrogatepass), an odd name
            pass
        try:  # large bodies are hashed without joining them to the name
            body = _utf8(text) if text is not None else self._canonical(args)
        except Exception:  # the encoders never raise; this is the last resort
            body = b"\x00unencodable\x00" + _utf8(type(args).__qualname__)
        h.update(_utf8(str(name)) + b"\x00")
        h.update(body)
        return h.digest()

    def key_of(self, call: Any) -> bytes:
        """The digest of a ``ToolCall``, computed once and cached on the call for this keyer
        (as ``call._key``: the pair ``(digest, keyer)``, the cheapest record to build per call)."""
        cached = call._key
        if cached is not None and cached[1] is self:
            return cached[0]
        digest = self.digest(call.name, call.args)
        store_key(call, (digest, self))
        return digest


def identity_bytes(name: str, args: Any, mode: str = "canonical") -> bytes:
    """The exact bytes ``Keyer(mode).digest(name, args)`` hashes: two calls are the same call
    exactly when these are equal, whatever the digest secret. For code that must agree with the
    guard on identity without hashing (calibrate) or without reaching into this module."""
    if mode not in KEY_MODES:
        raise ValueError(f"key_mode must be one of {KEY_MODES}, got {mode!r}")
    try:
        body = (canonical_bytes if mode == "canonical" else byte_identity)(args)
    except Exception:  # the encoders never raise; Keyer.digest's last resort, kept identical
        body = b"\x00unencodable\x00" + _utf8(type(args).__qualname__)
    return _utf8(str(name)) + b"\x00" + body


def cached_digest(call: Any) -> bytes | None:
    """The digest the guard deciding on ``call`` cached on it (``None`` before any guard keyed it);
    for plugins that report a call (spans, records) or count it (shadows)."""
    key = call._key
    return key[0] if key is not None else None


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def canonical_bytes(args: Any) -> bytes:
    """The canonical form of ``args`` as bytes: its canonical JSON as UTF-8, JSON text in
    ``str``/``bytes`` parsed first; text, and JSON text of a string, as ``0x01`` and its UTF-8."""
    cls = type(args)
    if cls is dict or cls is list:
        try:
            return _encode(args).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError, RecursionError, OverflowError):
            return _fallback(args).encode("utf-8", "surrogatepass")
    if cls is str:
        if args[:1] not in _MAYBE_JSON and (len(args) > 5 or args not in _JSON_WORDS):  # as in Keyer.digest
            return _TEXT_BYTES + args.encode("utf-8", "surrogatepass")  # plain text: a shell command, a path
        args = _parse_json_text(args)
    elif isinstance(args, (bytes, bytearray, memoryview)):
        raw = bytes(args)
        try:
            args = _parse_json_text(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return b"\x00bytes\x00" + raw
    elif isinstance(args, str):
        args = _parse_json_text(str(args))
    if isinstance(args, str):  # text that is not JSON, or JSON text of a string
        return _TEXT_BYTES + str(args).encode("utf-8", "surrogatepass")
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
        return _encode(value)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return _fallback(value)


def _is_json_word(text: str) -> bool:
    return len(text) <= 5 and text in _JSON_WORDS


def _parse_json_text(text: str) -> Any:
    """The JSON value ``text`` encodes, or ``text`` itself when it is not JSON (or too deep)."""
    stripped = text.strip() if text and (text[0] in _SPACE or text[-1] in _SPACE) else text
    if not stripped or (stripped[0] not in _JSON_STARTS and not _is_json_word(stripped)):
        return text
    try:  # json.loads's own scanner, without its wrapper: same values, same refusals
        value, end = _scan_json(stripped, 0)
    except (StopIteration, ValueError, RecursionError):
        return text
    return value if end == len(stripped) else text


def _int_text(value: int) -> str:
    try:
        return int.__repr__(value)
    except ValueError:  # more digits than sys.get_int_max_str_digits() allows in decimal
        return _encode({"__int__": hex(value)})


def _scalar(value: Any) -> str | None:
    """Canonical text of a leaf value, or ``None`` for containers."""
    cls = type(value)
    if cls is dict or cls is list or cls is tuple:
        return None
    if cls is str:
        return _quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int):
        return _int_text(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _encode({"__bytes__": bytes(value).hex()})
    if isinstance(value, enum.Enum):
        return _encode({"__enum__": f"{type(value).__qualname__}.{value.name}"})
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return None
    if _plain_object(value):
        return None
    return _encode({"__object__": type(value).__qualname__, "repr": _safe_repr(value)})


def _plain_object(value: Any) -> bool:
    """An instance with attributes and the default ``repr`` (which would show its address)."""
    return type(value).__repr__ is object.__repr__ and isinstance(getattr(value, "__dict__", None), dict)


def _safe_repr(value: Any) -> str:
    try:
        text = _ADDRESS.sub("", repr(value))
    except Exception:  # a broken __repr__ must not break the key
        return "<unrepresentable>"
    if len(text) <= _REPR_LIMIT:
        return text
    tail = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return f"{text[:_REPR_LIMIT]}...<{len(text)}:{tail}>"


def _children(value: Any) -> tuple[str, list[tuple[Any, Any]]]:
    """A container's kind and its (key, child) pairs; keys are ``None`` for sequences."""
    cls = type(value)
    if cls is dict:
        return "object", list(value.items())
    if cls is list or cls is tuple:
        return "array", [(None, v) for v in value]
    if isinstance(value, Mapping):
        try:
            return "object", list(value.items())
        except Exception:  # a broken mapping is encoded by its repr
            return "object", [("__object__", type(value).__qualname__), ("repr", _safe_repr(value))]
    if isinstance(value, (list, tuple)):
        return "array", [(None, v) for v in value]
    if isinstance(value, (set, frozenset)):
        return "set", [(None, v) for v in value]
    if dataclasses.is_dataclass(value):
        items = [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
        return "object", [("__dataclass__", type(value).__qualname__), *items]
    return "object", [("__object__", type(value).__qualname__), *vars(value).items()]


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else canonical_text(key)


Rope = str | list[Any]
"""Text as nested lists of pieces: a container's encoding refers to its children's without
copying them, so encoding N levels of nesting costs O(N), not O(N**2); joined once at the end."""


def _flat(rope: Rope) -> str:
    """The text of a rope (iteratively: ropes nest as deep as the value did)."""
    if isinstance(rope, str):
        return rope
    out: list[str] = []
    stack = [iter(rope)]
    while stack:
        for piece in stack[-1]:
            if isinstance(piece, str):
                out.append(piece)
            else:
                stack.append(iter(piece))
                break
        else:
            stack.pop()
    return "".join(out)


def _finish(kind: str, keys: list[Any], parts: list[Rope]) -> Rope:
    rope: list[Any]
    if kind == "object":
        texts = [_key_text(k) for k in keys]
        try:  # the order json's encoder uses (by the keys themselves), so both paths agree
            order = sorted(range(len(keys)), key=keys.__getitem__)
            pairs = [(texts[i], parts[i]) for i in order]
        except TypeError:  # keys that do not compare (1 and "a"): by their text
            pairs = list(zip(texts, parts, strict=True))
            if len(set(texts)) == len(texts):
                pairs.sort(key=lambda pair: pair[0])
            else:  # keys such as 1 and "1" write the same text: order such pairs by value too
                pairs.sort(key=lambda pair: (pair[0], _flat(pair[1])))
        rope = ["{"]
        for n, (k, v) in enumerate(pairs):
            rope += ("," if n else "", _quote(k), ":", v)
        rope.append("}")
        return rope
    if kind == "set":
        return '{"__set__":[' + ",".join(sorted(_flat(p) for p in parts)) + "]}"
    rope = ["["]
    for n, v in enumerate(parts):
        rope += ("," if n else "", v)
    rope.append("]")
    return rope


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
                return _flat(text)
            stack[-1][3].append(text)
            continue
        key, child = pending.pop()
        frame[2].append(key)
        leaf = _scalar(child)
        if leaf is not None:
            frame[3].append(leaf)
        elif id(child) in on_path:
            frame[3].append('"<cycle>"')
        else:
            kind, items = _children(child)
            on_path.add(id(child))
            stack.append([kind, items[::-1], [], [], id(child)])
