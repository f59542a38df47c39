"""The identity of a tool call: the bytes that say which calls are "the same call", and a keyed
digest of them.

Two calls are the same call when their identity bytes (``identity_bytes``) are equal: the tool
name, then the arguments' canonical form under the key mode.

The name comes first, ended by a NUL (no tool name has one). A name that does have one is
written length-prefixed after the byte ``0xFE`` instead, which no UTF-8 text starts with.

``canonical`` mode (the default). Plain JSON (what ``json.dumps`` writes without a ``default``
hook: dicts, lists and tuples, strings, finite numbers, booleans, ``None``) is written as canonical
JSON: object keys sorted at every level (in ``json``'s own order), array order kept, no
insignificant whitespace, non-ASCII as is. A ``str``/``bytes`` argument that is JSON text (RFC
8259: ``NaN`` and ``Infinity`` are not JSON; only space, tab, newline and carriage return around
it are insignificant) is canonicalized as the value it holds, so ``'{"b":1,"a":2}'`` and
``{"a": 2, "b": 1}`` are one call. Any other text (a shell command, a path), and JSON text of a
string, is the byte ``0x01`` and its UTF-8: no JSON text starts with that byte.

``bytes`` mode (the second seed's identity): a ``str``/``bytes`` argument is its bytes as given
(UTF-8 for text); any other argument is its canonical JSON, as above.

Everything else is written as a type-tagged, length-prefixed token: the byte ``0x02``, a tag
letter, the payload's length and ``:``, then the payload (see ``_fallback``). Canonical JSON
never holds a raw control character (``json`` escapes them inside strings), so a token never
meets JSON text and no value can spell another's token: a set is never a dict that says
``"__set__"``. In ``bytes`` mode, where text can be any bytes, text that starts with ``0x02`` and
values that are not plain JSON are each written as their own token, and bytes that are not UTF-8
as in canonical mode.

Nothing here raises because of the arguments: dict keys that do not compare, objects whose
``__repr__``, ``__eq__``, ``__hash__`` or attributes raise, cycles, nesting of any depth and odd
types all get a deterministic identity (one that does not depend on memory addresses, nor on how
deep the caller's stack is: JSON text too deep for json's recursive scanner is read by
``_scan_deep``, and a value whose own method runs out of stack is encoded again on a fresh one,
``_on_fresh_stack``).

The digest is a keyed 64-bit hash of the identity bytes, so that a digest cannot be reversed by
hashing guessed arguments: BLAKE2b (an HMAC-equivalent keyed hash) under the configured secret;
without one, the interpreter's own SipHash, keyed by the seed it drew at random for this process
(BLAKE2b under a random per-process secret where the seed is fixed by ``PYTHONHASHSEED``). Both
are per-process secrets; SipHash costs a third as much. SipHash takes the identity bytes in two
parts, the name's (with a text's ``0x01``) and the rest, as the hash of the pair
(``siphash_of``): the name's part is hashed once per keyer, and an ASCII text's rest is the
text itself, hashed where it lies (``hash(str)`` of ASCII is ``hash()`` of its bytes).

This module is on the hot path (every ``check_call``): the common cases (a dict of JSON values,
text that is not JSON) take one C-level encoder call and one hash update, from a hash state that
has already taken the secret and the tool name.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import re
import secrets
import struct
import sys
import threading
from _thread import allocate_lock, start_new_thread
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring as _quote
from math import isfinite
from operator import itemgetter
from typing import Any, TypeAlias

from turnguard._model import ToolCall

try:  # the C accelerator: one call encodes a whole value, without json.dumps's per-call setup
    # (typeshed does not declare CPython's C encoder: mypy is wrong that it is missing)
    from json.encoder import c_make_encoder as _c_make_encoder  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - every CPython build has it
    _c_make_encoder = None

KEY_MODES = ("canonical", "bytes")
"""``canonical``: JSON-canonical identity (default). ``bytes``: strings and bytes compared as given."""

DIGEST_SIZE = 8
_PROCESS_SECRET = secrets.token_bytes(32)
_JSON_SPACE = " \t\n\r"
"""JSON's insignificant whitespace (RFC 8259); nothing else around JSON text is insignificant."""
_JSON_STARTS = frozenset('{["-0123456789')
_JSON_WORDS = frozenset(("true", "false", "null"))
_WORD_STARTS = frozenset("tfn")
_SPACE = frozenset(_JSON_SPACE)
_MAYBE_JSON = _JSON_STARTS | _WORD_STARTS | _SPACE | {""}
"""First characters of text that may be JSON; "" is the empty text."""
_REPR_LIMIT = 4096
_ADDRESS = re.compile(r" at 0x([0-9a-fA-F]+)")
_REACH_LIMIT = 4096
"""The objects a repr's addresses are looked up among (``_without_addresses``)."""
_NAME_CACHE_LIMIT = 1024
"""Tool names whose hash states a keyer keeps (tool names are few; beyond this, none are kept)."""


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _scan_long(text: str) -> tuple[Any, int]:
    """``_scan_long_json``, or ``_scan_deep`` where it runs out of this stack."""
    try:
        return _scan_long_json(text, 0)
    except RecursionError:
        return _scan_deep(text)


def _long_int(digits: str) -> int:
    """``int(digits)`` for JSON's integer text of any length: past ``sys.get_int_max_str_digits()``
    (4,300 by default) ``int`` refuses decimal text, so it is read in parts within the limit."""
    try:
        return int(digits)
    except ValueError:
        sign, digits = (-1, digits[1:]) if digits[:1] == "-" else (1, digits)
        value = 0
        for at in range(0, len(digits), _INT_PART):
            part = digits[at:at + _INT_PART]
            value = value * 10 ** len(part) + int(part)
        return sign * value


_INT_PART = 4000
"""Digits read at once by ``_long_int`` (within any limit Python allows: at least 640)."""

# (every JSONDecoder has scan_once, set by its __init__; typeshed does not declare it)
_scan_json = json.JSONDecoder(parse_constant=_refuse_constant).scan_once  # type: ignore[attr-defined]
"""``json.loads``'s own scanner, strict: ``NaN`` and ``Infinity`` are refused like any non-JSON."""
_scan_long_json = json.JSONDecoder(parse_constant=_refuse_constant,
                                   parse_int=_long_int).scan_once  # type: ignore[attr-defined]
"""``_scan_json`` for text whose integers are longer than ``int`` reads (one Python call per
integer: taken only after ``_scan_json`` refused one)."""

if _c_make_encoder is not None:
    # No circular-reference markers: a self-reference ends in RecursionError like deep nesting,
    # and the encoder keeps no state between calls (markers left behind by an error would make
    # a later, unrelated value look circular). NaN and infinities are refused (not JSON).
    _encode_chunks = _c_make_encoder(None, _refuse, _quote, None, ":", ",", True, False, False)

    def _encode(value: Any) -> str:
        return _join(_encode_chunks(value, 0))

else:  # pragma: no cover
    _python_encoder = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
    )

    def _encode(value: Any) -> str:
        return _python_encoder.encode(value)

    def _encode_chunks(value: Any, _level: int) -> list[str]:
        return [_python_encoder.encode(value)]

_join = "".join
CallKey: TypeAlias = tuple[Any, ...]
"""What a guard caches on a ``ToolCall`` (``call.key``) when it keys the call: a plain tuple
``(digest, keyer, token, check)``, and ``result`` fifth once an outcome with a kept result is
recorded, read through the named positions below. A plain tuple, not a ``NamedTuple`` or a slotted
class: the hot path builds one per check, and building either costs about three times a tuple's
(a tenth of ``check_call`` + ``record_outcome``); a position read through a module constant costs
what a literal index does."""

KEY_DIGEST = 0
"""The call's key digest (``key_digest``, as bytes)."""
KEY_KEYER = 1
"""The ``Keyer`` that computed the digest: a call keyed by another keyer is keyed again."""
KEY_TOKEN = 2
"""The token of the turn whose check stored the key (``None``: keyed outside a check, ``Keyer.key_of``)."""
KEY_CHECK = 3
"""That turn's check number of the call (``NO_CHECK``: none)."""
NO_CHECK = 0
"""The check number of a key that names no check: one stored outside a check (``unchecked_key``),
or by a check the turn refused after its HALT, which counted nothing."""
KEY_RESULT = 4
"""The digest of the result recorded with the call's outcome, when one was keyed (``cached_result``);
absent otherwise (the key is then four long)."""

store_key = ToolCall.__dict__["key"].__set__
"""Set a ``ToolCall``'s cached key (a ``CallKey``): the slot's own setter (the dataclass is frozen,
and this is cheaper than ``object.__setattr__`` on the hot path)."""


def unchecked_key(digest: bytes, keyer: Any) -> CallKey:
    """The key of a call keyed outside any turn's check: no turn's token, no check."""
    return (digest, keyer, None, NO_CHECK)

_TEXT = b"\x01"
"""Starts a text's canonical form (see the module docstring)."""
_TOKEN = "\x02"
"""Starts a type-tagged token (see the module docstring)."""
_ODD_NAME = b"\xfe"
"""Starts a tool name that holds a NUL (written length-prefixed)."""


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def name_bytes(name: Any) -> bytes:
    """The tool name's part of ``identity_bytes``: its UTF-8 and a NUL, or (a name with a NUL in
    it) ``0xFE``, its length, ``:`` and its UTF-8. A name that is not text is written as its ``str``."""
    if type(name) is not str:
        try:
            name = str.__str__(name) if issubclass(type(name), str) else str(name)
        except Exception:
            name = f"<{type(name).__qualname__}>"
        if type(name) is not str:  # pragma: no cover - str() returns a str
            name = str.__str__(name)
    raw = _utf8(name)
    if b"\x00" not in raw:
        return raw + b"\x00"
    return _ODD_NAME + str(len(raw)).encode() + b":" + raw


# -- text that may be JSON --------------------------------------------------------------------------

_NOT_JSON = object()
_WORD_VALUES = {"true": True, "false": False, "null": None}


def _json_value(text: str) -> Any:
    """The JSON value ``text`` holds (JSON whitespace around it allowed), or ``_NOT_JSON``."""
    stripped = text.strip(_JSON_SPACE) if text[:1] in _SPACE or text[-1:] in _SPACE else text
    first = stripped[:1]
    if first in _JSON_STARTS:
        try:
            try:
                value, end = _scan_json(stripped, 0)
            except RecursionError:  # nested deeper than this stack lets json's scanner go
                value, end = _scan_deep(stripped)
            except ValueError as exc:
                if type(exc) is not ValueError:  # a JSONDecodeError: not JSON
                    raise
                value, end = _scan_long(stripped)  # an integer past int's digits (or a NaN: refused again)
        except (StopIteration, ValueError):
            return _NOT_JSON
        return value if end == len(stripped) else _NOT_JSON
    if first in _WORD_STARTS and stripped in _JSON_WORDS:
        return _WORD_VALUES[stripped]
    return _NOT_JSON


_number_at = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?").match
"""A JSON number where json's scanner reads one (ASCII digits only, as its C scanner)."""
_space_run = re.compile(r"[ \t\n\r]*").match


def _past_space(text: str, at: int) -> int:
    """Where the JSON whitespace from ``at`` ends."""
    return _space_run(text, at).end()  # type: ignore[union-attr]  # (a run of none matches too)


_string_at = json.decoder.scanstring  # type: ignore[attr-defined]
_WORDS_AT = tuple(_WORD_VALUES.items())


def _scan_deep(text: str) -> tuple[Any, int]:
    """``_scan_json`` without recursion: the same values and the same refusals (``ValueError``)
    at any depth. json's scanner recurses, so how deep it can go depends on how deep the caller's
    stack already is; taken where it runs out, this keeps whether a text is JSON (and so its key)
    independent of where it is keyed from."""
    stack: list[list[Any]] = []  # [container, key pending in it]
    value: Any
    at = 0
    while True:
        first = text[at:at + 1]
        if first == "[" or first == "{":
            at = _past_space(text, at + 1)
            if text[at:at + 1] != ("]" if first == "[" else "}"):
                key, at = (None, at) if first == "[" else _key_at(text, at)
                stack.append([[] if first == "[" else {}, key])
                continue
            value, at = ([] if first == "[" else {}), at + 1
        elif first == '"':
            value, at = _string_at(text, at + 1, True)
        else:
            value, at = _scalar_at(text, at)
        while stack:
            frame = stack[-1]
            container = frame[0]
            if type(container) is list:
                container.append(value)
            else:
                container[frame[1]] = value
            at = _past_space(text, at)
            after = text[at:at + 1]
            if after == ",":
                at = _past_space(text, at + 1)
                if type(container) is dict:
                    frame[1], at = _key_at(text, at)
                break
            if after != ("]" if type(container) is list else "}"):
                raise ValueError(f"expected ',' or the container's end at {at}")
            value, at = container, at + 1
            stack.pop()
        else:
            return value, at


def _key_at(text: str, at: int) -> tuple[str, int]:
    """An object's key at ``at`` and where its value starts (past the ``:``)."""
    if text[at:at + 1] != '"':
        raise ValueError(f"expected a key at {at}")
    key, at = _string_at(text, at + 1, True)
    at = _past_space(text, at)
    if text[at:at + 1] != ":":
        raise ValueError(f"expected ':' at {at}")
    return key, _past_space(text, at + 1)


def _scalar_at(text: str, at: int) -> tuple[Any, int]:
    """A JSON word or number at ``at`` and where it ends (``NaN`` and ``Infinity`` refused)."""
    for word, value in _WORDS_AT:
        if text.startswith(word, at):
            return value, at + len(word)
    number = _number_at(text, at)
    if number is None:
        raise ValueError(f"expected a JSON value at {at}")
    digits = number.group()
    return float(digits) if number.group(1) or number.group(2) else _long_int(digits), number.end()


def is_json_text(text: str) -> bool:
    """Whether canonical mode keys ``text`` as the JSON value it holds; when not, it keys the text
    itself, as ``bytes`` mode does, so the two modes tell such texts apart alike (calibrate keys a
    turn of them once for both)."""
    return text[:1] in _MAYBE_JSON and _json_value(text) is not _NOT_JSON


def _text_body(text: str) -> bytes:
    """Canonical mode's form of text: the JSON value it holds, or ``0x01`` and the text."""
    value = _json_value(text)
    if value is _NOT_JSON:
        return _TEXT + _utf8(text)
    if type(value) is str:  # JSON text of a string is that string
        return _TEXT + _utf8(value)
    return _utf8(canonical_text(value))


def _raw_bytes(value: Any) -> bytes:
    """The bytes of a bytes-like value, through the buffer (no ``__bytes__`` of a subclass)."""
    return value if type(value) is bytes else memoryview(value).tobytes()


def _token(tag: str, payload: str) -> str:
    return f"{_TOKEN}{tag}{len(payload)}:{payload}"


def _token_bytes(tag: bytes, payload: bytes) -> bytes:
    return b"\x02" + tag + str(len(payload)).encode() + b":" + payload


def canonical_bytes(args: Any) -> bytes:
    """The canonical-mode form of ``args`` (``identity_bytes`` without the name)."""
    cls = type(args)
    if cls is str:
        return _text_body(args)
    if cls is dict or cls is list:
        return _utf8(canonical_text(args))
    if issubclass(cls, str):
        return _text_body(str.__str__(args))
    if issubclass(cls, (bytes, bytearray, memoryview)):
        raw = _raw_bytes(args)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _utf8(_token("b", raw.hex()))
        return _text_body(text)
    return _utf8(canonical_text(args))


def byte_identity(args: Any) -> bytes:
    """The ``bytes``-mode form of ``args``: text and UTF-8 bytes as given, other bytes as in
    canonical mode, other values as in ``canonical_text`` (one that is not plain JSON inside its
    own token)."""
    cls = type(args)
    if issubclass(cls, str):
        raw = _utf8(args if cls is str else str.__str__(args))
    elif issubclass(cls, (bytes, bytearray, memoryview)):
        raw = _raw_bytes(args)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:  # not text (and never the bytes of text with lone surrogates)
            return _utf8(_token("b", raw.hex()))
    else:
        try:
            return _utf8(_encode(args))
        except Exception:
            text = _fallback(args)
        return _utf8(text) if _TOKEN not in text else _token_bytes(b"v", _utf8(text))
    return raw if raw[:1] != b"\x02" else _token_bytes(b"t", raw)


_BODIES: dict[str, Callable[[Any], bytes]] = {"canonical": canonical_bytes, "bytes": byte_identity}


def identity_bytes(name: str, args: Any, mode: str = "canonical") -> bytes:
    """The exact bytes ``Keyer(mode).digest(name, args)`` hashes: two calls are the same call
    exactly when these are equal, whatever the digest secret. For code that must agree with the
    guard on identity without hashing (calibrate) or without reaching into this module."""
    if type(args) is str and type(name) is str and "\x00" not in name:  # text: the common case, inlined
        if mode == "canonical":
            first = args[:1]
            if first not in _MAYBE_JSON or (first in _WORD_STARTS and args.rstrip(_JSON_SPACE) not in _JSON_WORDS):
                try:
                    return (name + "\x00\x01" + args).encode()
                except UnicodeEncodeError:  # lone surrogates: the general way
                    pass
            elif first == "{" and args[-1:] == "}":  # a JSON object's text (as _text_body reads it)
                try:
                    value, end = _scan_json(args, 0)
                except (StopIteration, ValueError, RecursionError):
                    end = -1
                if end == len(args):
                    return _utf8(name + "\x00" + canonical_text(value))
        elif mode == "bytes" and args[:1] != _TOKEN:
            try:
                return (name + "\x00" + args).encode()
            except UnicodeEncodeError:
                pass
    body = _BODIES.get(mode)
    if body is None:
        raise ValueError(f"key_mode must be one of {KEY_MODES}, got {mode!r}")
    try:
        data = body(args)
    except Exception:  # a bytes-like that refuses its buffer (a released memoryview)
        data = _token_bytes(b"x", _utf8(_type_name(type(args))))
    return name_bytes(name) + data


def canonical_text(value: Any) -> str:
    """The canonical text of any value (plain JSON as canonical JSON, the rest as tokens); never raises."""
    try:
        return _encode(value)
    except Exception:  # whatever a value's methods raise (a key's __lt__, a subclass's items())
        return _fallback(value)


# -- the keyer ---------------------------------------------------------------------------------------


HASHES = ("blake2b", "siphash")
"""The keyed hashes a keyer can take (``Keyer(hash=...)``)."""


def _seeded_siphash() -> bool:
    """Whether ``hash()`` of bytes is a 64-bit SipHash keyed by a seed drawn at random for this
    process: then it is the per-process secret keyed hash a guard without ``digest_key`` needs."""
    info = sys.hash_info
    return (info.algorithm.startswith("siphash") and info.hash_bits == 64 and bool(sys.flags.hash_randomization)
            and os.environ.get("PYTHONHASHSEED", "random") == "random")


DEFAULT_HASH = "siphash" if _seeded_siphash() else "blake2b"
"""The hash of a keyer without a secret: the interpreter's SipHash when its seed is random (about a
third of BLAKE2b's cost on short arguments), else BLAKE2b under ``_PROCESS_SECRET``."""
_pack_hash = struct.Struct("<q").pack
_hash = hash


def siphash_of(name_part: bytes, rest: bytes) -> bytes:
    """The SipHash digest of the identity bytes ``name_part + rest`` (``name_part`` is
    ``name_bytes``): the hash of the pair (name part, rest), with a text's ``0x01`` moved into
    the name part. The pair's hash (CPython's xxHash-style mix of its items' keyed hashes) is
    one-to-one in the rest's for a given name part: as unpredictable as SipHash itself, and no
    more colliding. Every keyer path
    splits the bytes this way, so equal identity bytes get one digest whichever path keys them."""
    if rest[:1] == _TEXT:
        return _pack_hash(_hash((name_part + _TEXT, rest[1:])))
    return _pack_hash(_hash((name_part, rest)))


def _ascii_hashes_as_bytes() -> bool:
    """Whether ``hash()`` of ASCII text is that of its bytes here (CPython's is: both hash the
    same buffer), so that a text's rest can be hashed without encoding it."""
    probes = ("", "a", "ls -la", "grep -rn 'def f' src/ | head -20", "x" * 300)
    return all(_hash(text) == _hash(text.encode()) for text in probes)


_ASCII_AS_BYTES = _ascii_hashes_as_bytes()


class Keyer:
    """Computes call keys for one guard (one key mode, one digest secret).

    The digest is a keyed 64-bit hash of ``identity_bytes``: BLAKE2b under the secret when one is
    given (digests then agree across processes: durable turns, a fleet's records); without one, a
    per-process secret hash (``DEFAULT_HASH``), whose digests mean nothing in another process."""

    __slots__ = ("_blank", "_canonical", "_named", "_texts", "digest", "hash", "mode", "turn_key")

    def __init__(self, mode: str = "canonical", secret: bytes | str | None = None, *, hash: str | None = None) -> None:
        if mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {mode!r}")
        if hash is None:
            hash = "blake2b" if secret else DEFAULT_HASH
        elif hash not in HASHES or (hash == "siphash" and secret):
            raise ValueError(f"hash must be one of {HASHES} (siphash only without a secret), got {hash!r}")
        self.mode, self.hash = mode, hash
        self.turn_key: bytes | None = None
        """The key of the durable turn this keyer is for (``turn_keyer``); ``None`` for a guard's keyer."""
        if isinstance(secret, str):
            secret = secret.encode()
        self._blank = hashlib.blake2b(digest_size=DIGEST_SIZE, key=(secret or _PROCESS_SECRET)[:64])
        self._canonical = _BODIES[mode]
        self._named: dict[str, Any] = {}
        """By tool name: what the name's part leaves for each call to do. BLAKE2b: a hash state that
        has taken the secret and the name (copying it skips re-keying and hashing the name);
        SipHash: the name's bytes."""
        self._texts: dict[str, Any] = {}
        """The same, past the text marker too (canonical mode's text)."""
        self.digest: Callable[[str, Any], bytes] = (
            self._canonical_digest() if mode == "canonical" else self._bytes_digest())
        """``digest(name, args)``: the keyed digest of ``identity_bytes(name, args, mode)``."""

    def _states(self, name: str) -> tuple[Any, Any]:
        """The name's states (see ``_named``; kept for the first ``_NAME_CACHE_LIMIT`` names)."""
        if self.hash == "siphash":
            named: Any = name_bytes(name)
            text: Any = named + _TEXT
        else:
            named = self._blank.copy()
            named.update(name_bytes(name))
            text = named.copy()
            text.update(_TEXT)
        if len(self._named) < _NAME_CACHE_LIMIT:
            self._named[name], self._texts[name] = named, text
        return named, text

    def _general(self) -> Callable[[str, Any], bytes]:
        """The digest of any call: the hash of ``identity_bytes``, computed in two parts."""
        blank, body, siphash = self._blank, self._canonical, self.hash == "siphash"

        def general(name: str, args: Any) -> bytes:
            try:
                data = body(args)
            except Exception:  # a bytes-like that refuses its buffer (as identity_bytes)
                data = _token_bytes(b"x", _utf8(_type_name(type(args))))
            if siphash:
                return siphash_of(name_bytes(name), data)
            h = blank.copy()
            h.update(name_bytes(name))
            h.update(data)
            return h.digest()

        return general

    # The two digests below are closures (locals, not attribute lookups, on the hot path) with the
    # common cases inlined; anything else, including text with lone surrogates, takes ``general``.

    def _canonical_digest(self) -> Callable[[str, Any], bytes]:
        named, texts, states, general = self._named.get, self._texts.get, self._states, self._general()
        maybe_json, word_starts, words, space, encode_chunks, join = (
            _MAYBE_JSON, _WORD_STARTS, _JSON_WORDS, _JSON_SPACE, _encode_chunks, _join)
        siphash, pack, hashed = self.hash == "siphash", _pack_hash, _hash

        def ascii_text(name: str, args: Any) -> bytes:
            """SipHash of an ASCII text that cannot be JSON (most shell commands and paths): the
            text itself is the pair's rest (``siphash_of``); of a dict of JSON values, ``digest``'s
            own case, inlined (most calls' arguments: a call saved); anything else takes ``digest``."""
            cls = type(args)
            if cls is str:
                if args and args.isascii() and type(name) is str:
                    first = args[0]  # (not args[:1]: on 3.11 a slice is built per call)
                    if first not in maybe_json or (first in word_starts and args.rstrip(space) not in words):
                        return pack(hashed((texts(name) or states(name)[1], args)))
            elif cls is dict and type(name) is str:
                try:
                    text = join(encode_chunks(args, 0))
                    data = text if text.isascii() else text.encode()  # (ASCII: hashed as its bytes would be)
                except Exception:  # not plain JSON, or lone surrogates: digest's general case
                    pass
                else:
                    return pack(hashed((named(name) or states(name)[0], data)))
            return digest(name, args)

        def digest(name: str, args: Any) -> bytes:
            cls, state = type(args), None
            if cls is str:
                first = args[:1]
                if (first not in maybe_json or (first in word_starts and args.rstrip(space) not in words)) \
                        and type(name) is str:  # text that cannot be JSON (a shell command, a path)
                    try:
                        data = args.encode()
                    except UnicodeEncodeError:
                        pass
                    else:
                        state = texts(name) or states(name)[1]
            elif cls is dict and type(name) is str:
                try:  # a dict of JSON values
                    data = join(encode_chunks(args, 0)).encode()
                except Exception:  # not plain JSON, or lone surrogates
                    pass
                else:
                    state = named(name) or states(name)[0]
            if state is None:
                return general(name, args)
            if siphash:  # the text's 0x01 is in its state: the rest is the text's UTF-8, or the JSON
                return pack(hashed((state, data)))
            h = state.copy()
            h.update(data)
            return h.digest()

        return ascii_text if siphash and _ASCII_AS_BYTES else digest

    def _bytes_digest(self) -> Callable[[str, Any], bytes]:
        named, states, general, encode_chunks, join = (
            self._named.get, self._states, self._general(), _encode_chunks, _join)
        siphash = self.hash == "siphash"

        def digest(name: str, args: Any) -> bytes:
            if type(name) is str:
                cls = type(args)
                try:
                    if cls is str:  # text as given
                        data = args.encode()
                    elif cls is dict:  # a dict of JSON values
                        data = join(encode_chunks(args, 0)).encode()
                    else:
                        data = b"\x02"
                except Exception:  # lone surrogates, or not plain JSON
                    data = b"\x02"
                if data[:1] != b"\x02":  # (text that starts with 0x02 has its own token)
                    if siphash:
                        return siphash_of(named(name) or states(name)[0], data)
                    h = (named(name) or states(name)[0]).copy()
                    h.update(data)
                    return h.digest()
            return general(name, args)

        return digest

    def key_of(self, call: Any) -> bytes:
        """The digest of a ``ToolCall``, computed once and cached on the call for this keyer
        (as ``call.key``, with no turn's token: ``unchecked_key``)."""
        cached: CallKey | None = call.key
        if cached is not None and cached[KEY_KEYER] is self:
            return cached[KEY_DIGEST]
        digest = self.digest(call.name, call.args)
        store_key(call, unchecked_key(digest, self))
        return digest


TURN_KEY_SIZE = 32
"""Bytes of a durable turn's own digest key."""


def turn_keyer(mode: str, key: bytes | None = None) -> Keyer:
    """The keyer of one durable turn (``guard.turn(durable=True)``): BLAKE2b under a key of the
    turn's own, drawn here or read back from its snapshot, which carries it. A process holding the
    snapshot gets the same digests without sharing any setting (the host's checkpointer holds the
    turn's messages already: the key tells it nothing new), and no other turn's digests are
    keyed by it."""
    key = secrets.token_bytes(TURN_KEY_SIZE) if key is None else bytes(key)
    keyer = Keyer(mode, key)
    keyer.turn_key = key
    return keyer


def cached_result(call: Any) -> bytes | None:
    """The digest of the result recorded with ``call``'s outcome, when the guard keyed it (a
    ``stateful_tools`` tool's, or every tool's with ``recorder_results``); ``None`` otherwise. The
    result itself is never kept."""
    key: CallKey | None = call.key
    return key[KEY_RESULT] if key is not None and len(key) > KEY_RESULT else None


def cached_digest(call: Any) -> bytes | None:
    """The digest the guard deciding on ``call`` cached on it (``None`` before any guard keyed it);
    for plugins that report a call (spans, records) or count it (shadows)."""
    key: CallKey | None = call.key
    return key[KEY_DIGEST] if key is not None else None


# -- what JSON does not write: tokens ----------------------------------------------------------------
#
# Tags: b bytes (hex), f a float that is not finite, i an int too long for decimal text (hex),
# s a set (its members' forms, sorted), d a dict that JSON cannot write (pairs sorted by form),
# a a dataclass (its fields), o an object by its attributes (its __dict__ and its slots), r an
# object by its repr (enum members too), c a reference to a container on the path (a cycle: how
# many levels up), n an unset slot or field, x an object nothing could be read from (its type).
# In bytes mode only, at the top: t text (or bytes) starting with 0x02, v a value that is not
# plain JSON.
# Inside a token, every part is length-prefixed: "<len>:<text>".

Rope = str | list[Any]
"""Text as nested lists of pieces: a container's form refers to its children's without copying
them, so encoding N levels of nesting costs O(N), not O(N**2); joined once at the end."""
Part = tuple[Rope, int]
"""A finished form: its rope and its length."""


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


def _prefixed(part: Part) -> Part:
    rope, n = part
    head = f"{n}:"
    return [head, rope], len(head) + n


def _tagged(tag: str, parts: list[Part]) -> Part:
    """A token whose payload is ``parts``, each length-prefixed."""
    prefixed = [_prefixed(p) for p in parts]
    n = sum(p[1] for p in prefixed)
    head = f"{_TOKEN}{tag}{n}:"
    return [head, *(p[0] for p in prefixed)], len(head) + n


def _leaf_token(tag: str, payload: str) -> Part:
    text = _token(tag, payload)
    return text, len(text)


def _type_name(cls: type) -> str:
    """``module.qualname`` (read from the class itself: a property cannot intervene)."""
    module = cls.__dict__.get("__module__")
    return f"{module}.{cls.__qualname__}" if type(module) is str else cls.__qualname__


def _int_text(value: int) -> str:
    try:
        return int.__repr__(value)
    except ValueError:  # more digits than sys.get_int_max_str_digits() allows in decimal
        return _token("i", hex(value))


def _scalar(value: Any) -> str | None:
    """The form of a leaf value, or ``None`` for a container."""
    cls = type(value)
    if cls is str:
        return _quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if issubclass(cls, str):
        return _quote(value)
    if issubclass(cls, int):
        return _int_text(value)
    if issubclass(cls, float):
        text = float.__repr__(value)
        return text if isfinite(value) else _token("f", text)
    if issubclass(cls, (bytes, bytearray, memoryview)):
        return _token("b", _raw_bytes(value).hex())
    return None


def _json_key(key: Any) -> str | None:
    """A dict key as ``json`` writes it (quoted), or ``None`` for keys JSON does not write."""
    if issubclass(type(key), str):
        return _quote(key)
    text = _scalar(key)  # null, true, false, numbers: written as text, quoted
    return None if text is None or text[:1] == _TOKEN else f'"{text}"'


def _mapping_items(value: Any) -> list[tuple[Any, Any]]:
    if type(value) is dict:
        return list(value.items())
    try:  # what json's encoder reads from a dict subclass, and a Mapping's own items
        return list(value.items())
    except Exception as exc:
        _stack_bound(exc)
        if issubclass(type(value), dict):
            return list(dict.items(value))
        raise


def _slots(cls: type) -> list[tuple[str, Any]]:
    """(owner-qualified name, descriptor) of every slot of ``cls``, in MRO and declaration order."""
    out = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if not isinstance(slot, str) or slot in ("__dict__", "__weakref__"):
                continue
            stored = f"_{klass.__name__.lstrip('_')}{slot}" if slot.startswith("__") and not slot.endswith("__") \
                else slot
            descriptor = klass.__dict__.get(stored)
            if descriptor is not None and hasattr(type(descriptor), "__get__"):
                out.append((f"{klass.__qualname__}.{slot}", descriptor))
    return out


_UNSET = object()
"""An unset slot or dataclass field, as a child (written as the ``n`` token)."""


class _Open:
    """A container being encoded: its kind, the children still to encode, the finished ones."""

    __slots__ = ("done", "extra", "kind", "pending", "value")

    def __init__(self, kind: str, children: list[Any], extra: Any, value: Any) -> None:
        self.kind, self.extra, self.value = kind, extra, value  # the value kept: its id stays its own
        self.pending = children[::-1]
        self.done: list[Part] = []


def _object_children(value: Any, cls: type) -> tuple[str, list[Any], Any]:
    """An object by its state: a dataclass by its fields, others by ``__dict__`` and slots."""
    if dataclasses.is_dataclass(cls):
        names, children = [], []
        for f in dataclasses.fields(cls):
            names.append(f.name)
            try:
                children.append(object.__getattribute__(value, f.name))
            except Exception as exc:
                _stack_bound(exc)
                children.append(_UNSET)
        return "a", children, names
    try:
        state = object.__getattribute__(value, "__dict__")
    except Exception as exc:
        _stack_bound(exc)
        state = None
    names, children = ["__dict__"], [state if isinstance(state, dict) else _UNSET]
    for name, descriptor in _slots(cls):
        names.append(name)
        try:
            children.append(descriptor.__get__(value, cls))
        except Exception as exc:
            _stack_bound(exc)
            children.append(_UNSET)
    return "o", children, names


def _open(value: Any) -> tuple[str, list[Any], Any]:
    """A container's kind, its children (in the order they are written) and what its finish needs."""
    cls = type(value)
    if issubclass(cls, (list, tuple)):
        return "array", list(list.__iter__(value) if issubclass(cls, list) else tuple.__iter__(value)), None
    if issubclass(cls, (set, frozenset)):
        return "s", list(set.__iter__(value) if issubclass(cls, set) else frozenset.__iter__(value)), None
    if issubclass(cls, (dict, Mapping)):
        try:
            items = _mapping_items(value)
        except Exception as exc:
            _stack_bound(exc)
            return _object_children(value, cls)
        keys = [_json_key(k) for k, _ in items]
        if None not in keys:
            try:  # json's own order: its encoder sorts the (key, value) pairs
                items.sort()
            except Exception as exc:
                _stack_bound(exc)
            else:
                return "object", [v for _, v in items], [_json_key(k) for k, _ in items]
        return "d", [x for pair in items for x in pair], None
    if dataclasses.is_dataclass(cls) or cls.__repr__ is object.__repr__:
        return _object_children(value, cls)
    try:
        text = _without_addresses(repr(value), value)
    except Exception as exc:  # a broken __repr__: the object's state instead
        _stack_bound(exc)
        return _object_children(value, cls)
    if len(text) > _REPR_LIMIT:
        tail = hashlib.blake2b(_utf8(text), digest_size=16).hexdigest()
        text = f"{text[:_REPR_LIMIT]}...<{len(text)}:{tail}>"
    return "r", [], text


def _without_addresses(text: str, value: Any) -> str:
    """``value``'s repr ``text`` without the memory addresses default reprs put in it (``<Child
    object at 0x7f...>``, ``<function f at 0x7f...>``): an `` at 0x...`` whose number is the id
    of ``value`` or of an object it reaches. Text that only looks like one (a path named
    ``build at 0x1f``) is content, and stays."""
    if " at 0x" not in text:
        return text
    ids = _reachable_ids(value)
    return _ADDRESS.sub(lambda m: "" if int(m[1], 16) in ids else m[0], text)


def _reachable_ids(value: Any) -> set[int]:
    """The ids of ``value`` and of the objects it refers to, breadth first, as the garbage
    collector sees them (no code of the value's runs), at most ``_REACH_LIMIT`` of them."""
    ids, queue, at = {id(value)}, [value], 0
    while at < len(queue) and len(ids) < _REACH_LIMIT:
        for ref in gc.get_referents(queue[at]):
            if id(ref) not in ids:
                ids.add(id(ref))
                queue.append(ref)
        at += 1
    return ids


def _finish(frame: _Open, type_name: str) -> Part:
    kind, done = frame.kind, frame.done
    if kind == "array" or kind == "object":
        rope: list[Any] = ["[" if kind == "array" else "{"]
        n = 2 + max(len(done) - 1, 0)
        for i, (part, size) in enumerate(done):
            if i:
                rope.append(",")
            if kind == "object":
                key = frame.extra[i]
                rope += (key, ":")
                n += len(key) + 1
            rope.append(part)
            n += size
        rope.append("]" if kind == "array" else "}")
        return rope, n
    if kind == "s":
        if len(done) > 1:
            done = sorted(((_flat(r), n) for r, n in done), key=itemgetter(0))
        return _tagged("s", done)
    if kind == "d":
        pairs = [(_flat(done[i][0]), done[i], done[i + 1]) for i in range(0, len(done), 2)]
        if len({form for form, _, _ in pairs}) == len(pairs):
            pairs.sort(key=itemgetter(0))
        else:  # keys of one form (two objects alike): by their values' forms too
            pairs.sort(key=lambda pair: (pair[0], _flat(pair[2][0])))
        return _tagged("d", [part for _, k, v in pairs for part in (k, v)])
    if kind == "r":
        return _tagged("r", [(type_name, len(type_name)), (frame.extra, len(frame.extra))])
    # "a" (dataclass fields) and "o" (object state): the type, then each name and its value
    parts: list[Part] = [(type_name, len(type_name))]
    for name, value in zip(frame.extra, done, strict=True):
        parts += ((name, len(name)), value)
    return _tagged(kind, parts)


def _fallback(root: Any) -> str:
    """Iterative encoder for what ``json`` refuses: any depth, cycles, odd types."""
    try:
        return _flat(_encode_tree(root)[0])
    except RecursionError:  # a value's own method ran out of this stack (``_stack_bound``)
        return _on_fresh_stack(root)


_FRESH = threading.local()
"""``on`` is true on the thread ``_on_fresh_stack`` started: a RecursionError there is final."""


def _stack_bound(exc: Exception) -> None:
    """Re-raise ``exc`` if it is a RecursionError met on the caller's stack. A value's own method
    (``__repr__``, ``items``, ``__lt__``, a property) may recurse: whether it runs out of stack
    depends on how deep the caller already is, so the value is encoded again on a fresh stack
    (``_on_fresh_stack``) and what it can or cannot read there decides, wherever it is keyed from."""
    if isinstance(exc, RecursionError) and not getattr(_FRESH, "on", False):
        raise exc


def _on_fresh_stack(root: Any) -> str:
    """``_fallback(root)`` on a new thread, whose stack is shallower than any caller's here (a bare
    ``_thread``: ``threading``'s start-up frames would make it deeper than some). Only a value
    whose own method raised RecursionError comes here."""
    result: list[Any] = []
    done = allocate_lock()
    done.acquire()

    def run() -> None:
        _FRESH.on = True
        try:
            result.append(_flat(_encode_tree(root)[0]))
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)
        finally:
            done.release()

    try:
        start_new_thread(run, ())
    except RuntimeError:  # no thread to be had (interpreter shutdown): this stack decides
        done.release()
        was, _FRESH.on = getattr(_FRESH, "on", False), True
        try:
            return _flat(_encode_tree(root)[0])
        finally:
            _FRESH.on = was
    done.acquire()
    if isinstance(result[0], BaseException):
        raise result[0]
    return str(result[0])


def _leaf_or_open(value: Any) -> tuple[Part | None, _Open | None, str]:
    """A finished leaf, or an open container (with its type name); what cannot be read is ``x``."""
    cls = type(value)
    try:
        if value is _UNSET:
            return _leaf_token("n", ""), None, ""
        leaf = _scalar(value)
        if leaf is not None:
            return (leaf, len(leaf)), None, ""
        kind, children, extra = _open(value)
        return None, _Open(kind, children, extra, value), _type_name(cls)
    except Exception as exc:  # an object that refuses to be read at all: its type only
        _stack_bound(exc)
        return _leaf_token("x", _type_name(cls)), None, ""


def _encode_tree(root: Any) -> Part:
    leaf, frame, type_name = _leaf_or_open(root)
    if frame is None:
        assert leaf is not None  # _leaf_or_open gives a leaf or an open container
        return leaf
    stack: list[tuple[_Open, str]] = [(frame, type_name)]
    depth = {id(root): 0}
    while True:
        frame, type_name = stack[-1]
        if not frame.pending:
            stack.pop()
            del depth[id(frame.value)]
            part = _finish(frame, type_name)
            if not stack:
                return part
            stack[-1][0].done.append(part)
            continue
        child = frame.pending.pop()
        level = depth.get(id(child))
        if level is not None:  # a container on the path: a cycle, written as how far up it is
            frame.done.append(_leaf_token("c", str(len(stack) - level)))
            continue
        leaf, opened, child_type = _leaf_or_open(child)
        if opened is None:
            assert leaf is not None  # _leaf_or_open gives a leaf or an open container
            frame.done.append(leaf)
        else:
            depth[id(child)] = len(stack)
            stack.append((opened, child_type))


__all__ = ["DIGEST_SIZE", "KEY_CHECK", "KEY_DIGEST", "KEY_KEYER", "KEY_MODES", "KEY_RESULT", "KEY_TOKEN", "NO_CHECK",
           "CallKey", "Keyer", "cached_digest", "cached_result", "canonical_text", "identity_bytes", "is_json_text",
           "name_bytes", "store_key"]
