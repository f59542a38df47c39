"""The replay's call keys are the live guard's identity: two calls get the same ledger key exactly
when ``Keyer.digest`` gives them the same digest, in both key modes, whatever the arguments."""

from __future__ import annotations

import itertools

import pytest

from keys_cases import DISTINCT_PAIRS, hostile_values
from turnguard._calibrate.records import RecordedCall
from turnguard._calibrate.replay import call_keys
from turnguard._keys import Keyer
from turnguard._model import Outcome


def call_key(tool: str, args: object, digest: str | None, mode: str) -> bytes:
    """One call's key, as ``call_keys`` gives it in a turn."""
    return call_keys([RecordedCall(tool, args, digest)], mode)[0]


# Bad and odd inputs tried: JSON-object text that is respaced, reordered, has trailing data, is
# broken, nests deeply, holds NaN, huge integers, lone surrogates, duplicate keys; text that only
# looks like JSON; JSON words and numbers with JSON and non-JSON whitespace around them; empty
# text; non-text arguments; tool names with a NUL; plain text (also as bytes, as JSON text of a
# string, past 4 KB, with a lone surrogate, starting with the 0x01 or 0x02 marker); the values
# that spell each other's markers (test_keys_identity's pairs) and arguments whose methods raise.
ARGS = [
    '{"a": 1, "b": 2}', '{"b":2,"a":1}', '{"a":1,"b":2}', {"a": 1, "b": 2}, '{"a": 1} ', ' {"a": 1}',
    '{"a": 1}{"b": 2}', '{"a": 1} x', '{"a": ', '{broken}', '{}', "{", "}", '{"a": NaN}', '{"a": Infinity}',
    '{"n": 123456789012345678901234567890}', '{"n": 123456789012345678901234567891}', '{"s": "\\ud800"}',
    '{"a": 1, "a": 2}', '{"a": 2}', "[" * 50 + "]" * 50, "{" + '"a":{' * 3000 + "}" * 3001, '{"a": [1, 2]}',
    "grep x\n", '"grep x\\n"', "true", "true\n", "\x0ctrue", "null\t", "5\xa0", " 5\n", "null", "", "   ", "1", 1,
    1.0, True, None, ["a"], b'{"a": 1}', b"\xff\xfe", b"\xed\xa0\x80", "\u00a0{}", "{\u00a0}", "ls -la", '"ls -la"',
    b"ls -la", "trueish", "ls \ud800", '"ls \\ud800"', "x" * 5000, "\x01ls -la", b"\x01ls -la", "\x02s1:1",
    b"\x02s1:1", float("nan"), "NaN", "nan", {1, 2}, {"__set__": [1, 2]},
    *itertools.chain.from_iterable(DISTINCT_PAIRS), *hostile_values(),
]
TOOLS = ["read", "re\x00ad", "read\x00", "\xfe1:read"]


@pytest.mark.parametrize("mode", ["canonical", "bytes"])
def test_equal_keys_exactly_when_the_live_digests_are_equal(mode: str) -> None:
    keyer = Keyer(mode)
    calls = [(t, a) for t in TOOLS for a in ARGS]
    digests = [keyer.digest(t, a) for t, a in calls]
    keys = call_keys([RecordedCall(t, a, None, Outcome.OK) for t, a in calls], mode)
    assert keys == [call_key(t, a, None, mode) for t, a in calls]  # the memo changes nothing
    for (d1, k1), (d2, k2) in itertools.combinations(zip(digests, keys, strict=True), 2):
        assert (d1 == d2) == (k1 == k2)


@pytest.mark.parametrize("mode", ["canonical", "bytes"])
def test_a_recorded_digest_never_equals_a_call_keyed_from_its_arguments(mode: str) -> None:
    """The recorder's digests and raw arguments may meet in one turn: different identities."""
    recorded = call_key("read", None, "ab12", mode)
    assert recorded == call_key("read", {"x": 1}, "ab12", mode)  # the digest is the identity
    assert recorded != call_key("read", None, "ab13", mode)
    assert call_key("re\x00ad", None, "x", mode) != call_key("re", None, "ad\x00x", mode)
    assert all(recorded != call_key(t, a, None, mode) for t in [*TOOLS, "\xffread"] for a in
               ["ab12", '"ab12"', {"ab12": None}, b"\xffread\x00ab12", *ARGS])


def test_identical_calls_of_a_turn_get_one_key_object() -> None:
    """Stuck turns repeat one call: it is canonicalized once, and its repeats share the key."""
    call = RecordedCall("read", '{"b": 2, "a": 1}', None, Outcome.ERROR)
    keys = call_keys([call] * 5 + [RecordedCall("read", '{"a":1,"b":2}', None, Outcome.OK)], "canonical")
    assert len({id(k) for k in keys[:5]}) == 1
    assert keys[0] == keys[5]
