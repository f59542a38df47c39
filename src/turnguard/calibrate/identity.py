"""The ledger keys of recorded calls in a replay: the live guard's call identity, without the hash.

The live guard counts ``Keyer.digest(name, args)``: a keyed BLAKE2b of ``name``, a NUL and the
canonical form of ``args`` under the key mode (``keys.canonical_bytes`` or ``keys.byte_identity``).
A replay only needs to know which calls are the same call, so it counts that pre-image itself:
equal pre-images are equal digests, and distinct pre-images are distinct calls (where the live
guard's 8-byte digest could, in principle, collide). The digest secret plays no part in identity.
Keying this way skips the hash and, for the common JSON-object text, ``json.loads``'s wrapper.

A recorded digest (the recorder's output, turnguard's spans) is already an identity: its key is
``0xFF``, the tool name, a NUL and the digest; no UTF-8 text starts with the byte ``0xFF``, so it
never equals the key of a call recorded with its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from turnguard.calibrate.inputs import RecordedCall
from turnguard.keys import _scan_json, byte_identity, canonical_bytes, canonical_text

Body = Callable[[Any], bytes]


def canonical_body(args: Any) -> bytes:
    """``keys.canonical_bytes(args)``, faster for text holding a JSON object: such text is parsed
    by ``json.loads``'s own scanner and its value canonicalized; anything else, including text the
    scanner refuses or that has more after the object, takes ``canonical_bytes`` itself."""
    if type(args) is str and args[:1] == "{" and args[-1:] == "}":
        try:
            value, end = _scan_json(args, 0)
        except (StopIteration, ValueError, RecursionError):
            return canonical_bytes(args)
        if end == len(args):
            return canonical_bytes(value)
    return canonical_bytes(args)


BODIES: dict[str, Body] = {"canonical": canonical_body, "bytes": byte_identity}
"""Each key mode's canonical form of the arguments (``keys.Keyer``'s ``_canonical``)."""


def call_key(tool: str, args: Any, digest: str | None, body: Body) -> bytes:
    """One call's ledger key: ``name NUL canonical-args`` as ``Keyer.digest`` hashes it."""
    name = (tool if type(tool) is str else str(tool)).encode("utf-8", "surrogatepass")
    if digest is not None:
        return b"\xff" + name + b"\x00" + digest.encode("utf-8", "surrogatepass")
    try:
        return name + b"\x00" + body(args)
    except Exception:  # the encoders never raise; Keyer.digest's last resort, kept identical
        return name + b"\x00\x00unencodable\x00" + type(args).__qualname__.encode("utf-8", "surrogatepass")


def call_keys(calls: Sequence[RecordedCall], mode: str) -> list[bytes]:
    """Each call's ledger key under ``mode`` (``call_key``). Under ``canonical``, identical
    JSON-object text is canonicalized once per turn (stuck turns repeat one call many times);
    everything else is cheaper to key again than to look up."""
    if mode != "canonical":
        body = BODIES[mode]
        return [(c[0] + "\x00" + c[1]).encode("utf-8", "surrogatepass")
                if c[2] is None and type(c[1]) is str and type(c[0]) is str
                else call_key(c[0], c[1], c[2], body) for c in calls]
    memo: dict[tuple[str, str], bytes] = {}
    keys: list[bytes] = []
    append, get, scan, text_of = keys.append, memo.get, _scan_json, canonical_text
    for call in calls:
        tool, args = call[0], call[1]
        if type(args) is not str or call[2] is not None or type(tool) is not str:
            append(call_key(tool, args, call[2], canonical_body))
        elif args[:1] != "{" or args[-1:] != "}":  # plain text (its JSON string) or other JSON
            append((tool + "\x00").encode("utf-8", "surrogatepass") + canonical_bytes(args))
        else:  # canonical_body, inlined: text holding a JSON object, the common case
            pair = (tool, args)
            key = get(pair)
            if key is None:
                try:
                    value, end = scan(args, 0)
                except (StopIteration, ValueError, RecursionError):
                    value, end = args, 0
                if end == len(args):
                    key = (tool + "\x00" + text_of(value)).encode("utf-8", "surrogatepass")
                else:  # not one JSON object after all: canonical_bytes says what it is
                    key = (tool + "\x00").encode("utf-8", "surrogatepass") + canonical_bytes(args)
                memo[pair] = key
            append(key)
    return keys


__all__ = ["BODIES", "call_key", "call_keys", "canonical_body"]
