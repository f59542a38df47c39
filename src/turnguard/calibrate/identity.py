"""The ledger keys of recorded calls in a replay: the live guard's call identity, without the hash.

The live guard counts ``Keyer.digest(name, args)``, a keyed BLAKE2b of ``keys.identity_bytes(name,
args, mode)``. A replay only needs to know which calls are the same call, so it counts those bytes
themselves: equal bytes are equal digests, and distinct bytes are distinct calls (where the live
guard's 8-byte digest could, in principle, collide). The digest secret plays no part in identity.

A recorded digest (the recorder's output, turnguard's spans) is already an identity: its key is
``0xFF``, the name's part of the identity bytes (``keys.name_bytes``) and the digest; no identity bytes start with
``0xFF`` (no UTF-8 text does, and an odd name starts with ``0xFE``), so it never equals the key
of a call recorded with its arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnguard.calibrate.inputs import RecordedCall
from turnguard.keys import identity_bytes, name_bytes

_RECORDED = b"\xff"


def call_key(tool: str, args: Any, digest: str | None, mode: str) -> bytes:
    """One call's ledger key: ``identity_bytes`` under ``mode``, or its recorded digest's key."""
    if digest is None:
        return identity_bytes(tool, args, mode)
    return _RECORDED + name_bytes(tool) + digest.encode("utf-8", "surrogatepass")


def call_keys(calls: Sequence[RecordedCall], mode: str) -> list[bytes]:
    """Each call's ledger key under ``mode`` (``call_key``). A tool's part of a recorded digest's
    key is made once per turn (a turn has few tools). Under ``canonical``, identical JSON-object
    text is canonicalized once per turn (stuck turns repeat one call many times) and its repeats
    share the key; everything else is cheaper to key again than to look up."""
    prefixes: dict[str, bytes] = {}
    memo: dict[tuple[str, str], bytes] = {}
    keys: list[bytes] = []
    append, get, canonical = keys.append, memo.get, mode == "canonical"
    for call in calls:
        tool, args, digest = call[0], call[1], call[2]
        if digest is not None:
            prefix = prefixes.get(tool)
            if prefix is None:
                prefix = prefixes[tool] = _RECORDED + name_bytes(tool)
            append(prefix + digest.encode("utf-8", "surrogatepass"))
        elif not canonical or type(args) is not str or args[:1] != "{":
            append(identity_bytes(tool, args, mode))
        else:
            pair = (tool, args)
            key = get(pair)
            if key is None:
                key = memo[pair] = identity_bytes(tool, args, mode)
            append(key)
    return keys


__all__ = ["call_key", "call_keys"]
