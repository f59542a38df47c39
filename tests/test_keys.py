"""Call identity (docs/usage.md "What is keyed alike"): canonical keys, byte keys, and bad arguments
that never raise."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import pathlib
import random
import re
import time

import pytest

import turnguard as tg
from turnguard._keys import Keyer, cached_digest, canonical_bytes
from turnguard._plugins import NON_POLICY_PLUGINS

KEYER = Keyer()


def key(args: object, name: str = "tool", keyer: Keyer = KEYER) -> bytes:
    return keyer.digest(name, args)


def fresh_key(args: object) -> bytes:
    """The key through the public path (a new ToolCall each time, nothing cached)."""
    return KEYER.key_of(tg.ToolCall("tool", args))


# -- canonical identity ---------------------------------------------------------------------------

def test_key_order_does_not_matter_at_any_level():
    a = {"b": 1, "a": {"y": [1, {"q": 1, "p": 2}], "x": None}}
    b = {"a": {"x": None, "y": [1, {"p": 2, "q": 1}]}, "b": 1}
    assert key(a) == key(b)
    assert canonical_bytes(a) == b'{"a":{"x":null,"y":[1,{"p":2,"q":1}]},"b":1}'


def test_array_order_and_values_matter():
    assert key([1, 2]) != key([2, 1])
    assert key({"a": 1}) != key({"a": "1"})
    assert key({"path": "a.py"}) != key({"path": "a.py "})


def test_the_tool_name_is_part_of_the_key():
    assert key({"a": 1}, "read") != key({"a": 1}, "write")


@pytest.mark.parametrize("text", ['{"b":1,"a":2}', '  {"a": 2,\n "b": 1}  ', b'{"b": 1, "a": 2}',
                                  bytearray(b'{"a":2,"b":1}')])
def test_a_json_string_or_bytes_is_the_same_call_as_the_dict(text):
    assert key(text) == key({"a": 2, "b": 1})


def test_json_scalars_in_text_and_plain_text():
    assert key("42") == key(42) and key("true") == key(True) and key("null") == key(None)
    assert key("ls -la") == key('"ls -la"')  # JSON text of a string is that string
    assert key("ls -la") != key("ls  -la")
    assert key("{not json") != key("{not  json")  # text that looks like JSON but is not


@pytest.mark.parametrize("text", ["ls -la", '"ls -la"', b"ls -la", b'"ls -la"', " ls -la", "trueish", "{not json"])
def test_text_is_its_utf8_after_a_marker_byte_that_no_json_starts_with(text):
    plain = text.strip('"') if isinstance(text, str) else text.decode().strip('"')
    assert canonical_bytes(text) == b"\x01" + plain.encode()
    assert key(text) == key(plain) != key([plain])
    assert canonical_bytes([plain]).startswith(b"[") and canonical_bytes({"t": plain}).startswith(b"{")


def test_text_with_a_lone_surrogate_is_the_same_call_as_its_json_escaped_form():
    assert key("ls \ud800") == key('"ls \\ud800"') != key("ls \ud801")


def test_tuples_are_arrays_and_lists_inside_are_canonical():
    assert key((1, 2)) == key([1, 2])
    assert key({"a": (1, {"b": 2, "a": 1})}) == key('{"a":[1,{"a":1,"b":2}]}')


def test_a_dict_needing_the_fallback_keeps_the_canonical_form_of_its_json_parts():
    assert canonical_bytes({"b": [1.5, "x"], "a": {"s": {3}}}) == b'{"a":{"s":\x02s3:1:3},"b":[1.5,"x"]}'


# -- byte identity ---------------------------------------------------------------------------------

BYTES = Keyer("bytes")


def test_bytes_mode_compares_strings_byte_for_byte():
    assert key('{"b":1,"a":2}', keyer=BYTES) != key('{"a":2,"b":1}', keyer=BYTES)
    assert key("ls -la", keyer=BYTES) != key('"ls -la"', keyer=BYTES)
    assert key(b"raw", keyer=BYTES) == key("raw", keyer=BYTES)


def test_bytes_mode_still_canonicalizes_objects():
    assert key({"b": 1, "a": 2}, keyer=BYTES) == key({"a": 2, "b": 1}, keyer=BYTES)


def test_bytes_mode_through_the_guard_config():
    guard = tg.Guard(tg.GuardConfig(key_mode="bytes", disable_plugins=NON_POLICY_PLUGINS))
    turn = guard.turn()
    for args in ('{"cmd":"ls"}', '{"cmd": "ls"}', '{"cmd":"ls"}'):
        turn.check_call(tg.ToolCall("bash", args))
    assert turn.ledger.distinct_keys == 2 and turn.ledger.max_key_repeat == 2


def test_an_unknown_key_mode_is_refused():
    with pytest.raises(ValueError, match="canonical"):
        Keyer("fuzzy")


# -- digests ---------------------------------------------------------------------------------------

def test_the_digest_is_short_hex_and_never_the_arguments():
    call = tg.ToolCall("write_file", {"content": "secret-token-123"})
    hex_digest = KEYER.key_of(call).hex()
    assert len(hex_digest) == 16
    guessed = hashlib.blake2b(b"write_file\x00" + canonical_bytes(call.args), digest_size=8).hexdigest()
    assert hex_digest != guessed  # keyed: hashing guessed arguments does not reproduce it


def test_digests_are_stable_for_one_secret_and_differ_across_secrets():
    assert key({"a": 1}, keyer=Keyer(secret="s1")) == key({"a": 1}, keyer=Keyer(secret=b"s1"))
    assert key({"a": 1}, keyer=Keyer(secret="s1")) != key({"a": 1}, keyer=Keyer(secret="s2"))
    assert key({"a": 1}) == key({"a": 1})


def test_a_key_is_cached_per_keyer():
    call = tg.ToolCall("tool", {"a": 1})
    assert cached_digest(call) is None
    first = KEYER.key_of(call)
    assert KEYER.key_of(call) is first and cached_digest(call) is first
    other = Keyer(secret="other")
    theirs = other.key_of(call)
    assert theirs != first and cached_digest(call) is theirs  # the cache follows the last keyer
    assert KEYER.key_of(call) == first


# -- bad arguments: never raise, deterministic -----------------------------------------------------

def test_sets_get_an_order_independent_key():
    assert fresh_key({"tags": {"b", "a", "c"}}) == fresh_key({"tags": {"c", "b", "a"}})
    assert fresh_key({3, 1, 2}) == fresh_key(frozenset({1, 2, 3}))
    assert fresh_key({1, 2}) != fresh_key([1, 2])


class Plain:
    def __init__(self, x: object) -> None:
        self.x = x


class Shown:
    def __init__(self, x: object) -> None:
        self.x = x

    def __repr__(self) -> str:
        return f"Shown({self.x!r})"


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Color(enum.Enum):
    RED = "r"


@dataclasses.dataclass
class Point:
    x: int
    y: object


def test_custom_objects_get_keys_from_their_content_not_their_address():
    assert fresh_key({"o": Plain(1)}) == fresh_key({"o": Plain(1)})
    assert fresh_key(Plain(1)) != fresh_key(Plain(2))
    assert fresh_key(Shown([1])) == fresh_key(Shown([1])) != fresh_key(Shown([2]))
    assert fresh_key(BrokenRepr()) == fresh_key(BrokenRepr())
    assert fresh_key(Color.RED) == fresh_key(Color.RED)
    assert fresh_key(Point(1, {2})) == fresh_key(Point(1, {2})) != fresh_key(Point(1, {3}))
    assert fresh_key(lambda: 0) == fresh_key(lambda: 0)  # same repr once the address is removed


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinities_get_a_deterministic_key(value):
    assert fresh_key({"x": value}) == fresh_key({"x": value})
    assert fresh_key({"x": value}) != fresh_key({"x": 0.0})
    assert fresh_key(value) == fresh_key(value)


def test_nan_and_infinities_are_distinct():
    assert len({fresh_key(float(v)) for v in ("nan", "inf", "-inf")}) == 3


def _self_referencing_dict() -> dict:
    d: dict = {"name": "loop", "items": [1, 2]}
    d["self"] = d
    d["items"].append(d["items"])
    return d


def test_self_referencing_structures_get_a_deterministic_key():
    a, b = _self_referencing_dict(), _self_referencing_dict()
    assert fresh_key(a) == fresh_key(b)
    c = _self_referencing_dict()
    c["name"] = "other"
    assert fresh_key(a) != fresh_key(c)
    lst: list = [1]
    lst.append(lst)
    assert fresh_key(lst) == fresh_key(lst)


def test_a_50_mb_string_gets_a_deterministic_key_quickly():
    big = "x" * (50 * 1024 * 1024)
    started = time.perf_counter()
    first = fresh_key(big)
    assert fresh_key(big) == first
    assert fresh_key(big[:-1] + "y") != first
    assert time.perf_counter() - started < 10


def test_a_50_mb_string_that_starts_like_json_but_is_not_is_keyed_as_text():
    big = "{" + "x" * (50 * 1024 * 1024)
    assert fresh_key(big) == fresh_key(big) != fresh_key("{" + "x" * 10)


def _nested(depth: int, leaf: object, as_dict: bool) -> object:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


@pytest.mark.parametrize("as_dict", [False, True])
def test_10000_deep_nesting_gets_a_deterministic_key(as_dict):
    a, b = _nested(10_000, 1, as_dict), _nested(10_000, 1, as_dict)
    assert fresh_key(a) == fresh_key(b)
    assert fresh_key(a) != fresh_key(_nested(10_000, 2, as_dict))
    assert fresh_key(a) != fresh_key(_nested(9_999, 1, as_dict))


def test_10000_deep_json_text_gets_a_deterministic_key():
    text = "[" * 10_000 + "]" * 10_000
    assert fresh_key(text) == fresh_key(text) != fresh_key("[" * 9_999 + "]" * 9_999)


def test_a_huge_integer_gets_a_deterministic_key():
    assert fresh_key({"n": 10**5000}) == fresh_key({"n": 10**5000}) != fresh_key({"n": 10**5000 + 1})


def test_mixed_key_types_and_lone_surrogates_do_not_raise():
    assert fresh_key({1: "a", "b": 2, None: 3}) == fresh_key({"b": 2, None: 3, 1: "a"})
    assert fresh_key({"s": "\ud800"}) == fresh_key({"s": "\ud800"})
    assert fresh_key(b"\xff\xfe not utf-8") == fresh_key(b"\xff\xfe not utf-8")
    assert tg.ToolCall("\ud800", {}) and KEYER.key_of(tg.ToolCall("\ud800", {}))


def test_bad_arguments_never_raise_through_the_turn():
    turn = tg.Guard(tg.GuardConfig(disable_plugins=NON_POLICY_PLUGINS)).turn()
    for args in ({1, 2}, Plain(1), float("nan"), _self_referencing_dict(), _nested(10_000, 0, True), BrokenRepr(),
                 object(), 10**5000, b"\xff"):
        call = tg.ToolCall("tool", args)
        assert turn.check_call(call).action is tg.Action.ALLOW
        assert turn.record_outcome(call, tg.Outcome.OK).action is tg.Action.ALLOW


@pytest.mark.parametrize("value", [{10: "a", 9: "b"}, {"b": 1, "a": {2: 3, 1: [1.5, None, True, "é"]}},
                                   {1.5: 1, 0.5: 2}, [{"z": 1, "y": (1, 2)}, "x"]])
def test_the_fallback_encoder_writes_what_json_writes(value):
    # a value with one odd part is encoded by the fallback; its JSON parts must read the same, or
    # adding a set to a call's arguments would change the key of everything else in them
    from turnguard._keys import _encode, _fallback

    assert _fallback(value) == _encode(value)


@pytest.mark.parametrize(
    ("text", "same_as"),
    [
        ('  {"b": 1, "a": 2}\n', {"a": 2, "b": 1}),  # surrounding JSON whitespace is insignificant
        ("[1, 2]", [1, 2]),
        ("42", 42),
        ('{"a": 1} trailing', '{"a": 1} trailing'),  # more after the value: not JSON, the text itself
        ('{"a": 1', '{"a": 1'),  # unterminated: the text itself
        ("tail -f log", "tail -f log"),
    ],
)
def test_text_is_keyed_as_the_json_value_it_holds_and_only_when_it_is_all_json(text, same_as):
    if isinstance(same_as, str):  # not all JSON: keyed as the text itself
        assert canonical_bytes(text) == b"\x01" + same_as.encode()
    else:
        assert canonical_bytes(text) == canonical_bytes(same_as)
        assert canonical_bytes(text) != canonical_bytes(text.strip() + " x")


# -- the identity bytes ----------------------------------------------------------------------------

IDENTITY_ARGS = [{"a": 1}, {"b": [1, 2], "a": {"c": None}}, "ls -la", '{"b": 1, "a": 2}', "42", b"\xff", {3, 1},
                 {"n": 10**5000}, {"x": float("nan")}, "x" * 5000, {"big": "y" * 5000}, "ls \ud800", None, [1, "a"]]


@pytest.mark.parametrize("mode", ["canonical", "bytes"])
@pytest.mark.parametrize("args", IDENTITY_ARGS)
def test_identity_bytes_are_what_the_digest_hashes(mode, args):
    from turnguard._keys import identity_bytes

    secret = b"s" * 32
    expected = hashlib.blake2b(identity_bytes("tool", args, mode), digest_size=8, key=secret).digest()
    assert Keyer(mode, secret).digest("tool", args) == expected


def test_identity_bytes_refuse_an_unknown_mode():
    from turnguard._keys import identity_bytes

    with pytest.raises(ValueError, match="canonical"):
        identity_bytes("tool", {}, "fuzzy")


# -- memory addresses in reprs ----------------------------------------------------------------------


class Quoted:
    """A custom repr that quotes its text, as most do."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Quoted({self.text!r})"


class Bare:
    """A custom repr that writes its text as it is, in angle brackets."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<Bare {self.text}>"


REPR_MAKERS = {
    "Path": pathlib.Path,
    "PurePosixPath": pathlib.PurePosixPath,
    "PureWindowsPath": pathlib.PureWindowsPath,
    "re.Pattern": re.compile,  # (the texts below hold no regex syntax)
    "a quoting repr": Quoted,
    "a bare repr": Bare,
}


def address_like_texts(rng: random.Random) -> tuple[str, str]:
    """Two different texts, at least one holding something a default repr's address looks like."""
    stem = rng.choice(["build", "rm", "a", "<x", "<X object", "<function f", ""])
    hex_digits = "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randint(1, 16)))
    address = rng.choice([f" at 0x{hex_digits}", f" at 0x{hex_digits}>", f" at 0x{int(hex_digits, 16) + 1:x}"])
    tail = rng.choice(["", ">", "/x", " at 0x1", "'"])
    other = rng.choice([f"{stem}{tail}", f"{stem} at 0x{int(hex_digits, 16) ^ 1:x}{tail}", f"{stem}{address}"])
    text = f"{stem}{address}{tail}"
    return (text, other) if text != other else (text, other + "~")


@pytest.mark.parametrize("mode", ["canonical", "bytes"])
@pytest.mark.parametrize("maker", REPR_MAKERS)
def test_text_that_looks_like_an_address_inside_a_repr_is_content(maker, mode):
    keyer = Keyer(mode)
    make = REPR_MAKERS[maker]
    rng = random.Random(f"{maker}-{mode}")
    for _ in range(200):
        a, b = address_like_texts(rng)
        nest = rng.choice([lambda v: v, lambda v: {"p": v}, lambda v: [1, v], lambda v: {"x": [{"y": (v,)}]}])
        assert key(nest(make(a)), keyer=keyer) != key(nest(make(b)), keyer=keyer), (a, b)
        assert key(nest(make(a)), keyer=keyer) == key(nest(make(a)), keyer=keyer)


class Child:
    """Default repr: ``<...Child object at 0x...>``."""


class Holder:
    """A custom repr holding its children's default reprs, and its own."""

    def __init__(self, *children: object) -> None:
        self.children = list(children)

    def __repr__(self) -> str:
        return f"Holder({self.children!r}, self={object.__repr__(self)})"

    def method(self) -> None:
        pass


ADDRESSED = {
    "a default repr inside a custom one": lambda: Holder(Child()),
    "several, nested": lambda: Holder(Child(), [Child(), {"c": Child()}]),
    "a function": lambda: (lambda: 0),
    "a bound method": lambda: Holder(Child()).method,
    "a partial": lambda: functools.partial(lambda x: x, Child()),
    "a generator": lambda: (x for x in ()),
}


@pytest.mark.parametrize("mode", ["canonical", "bytes"])
@pytest.mark.parametrize("kind", ADDRESSED)
def test_objects_alike_but_for_their_addresses_are_one_call(kind, mode):
    keyer = Keyer(mode)
    make = ADDRESSED[kind]
    kept = [make() for _ in range(5)]  # alive together: five addresses
    assert " at 0x" in repr(kept[0])
    assert len({key(value, keyer=keyer) for value in kept}) == 1
    assert len({key({"v": [value]}, keyer=keyer) for value in kept}) == 1


LONG_DIGITS = (4_301, 5_000, 12_345)
"""Integer lengths past ``sys.get_int_max_str_digits()`` (4,300 by default)."""


def long_int_texts(rng: random.Random, digits: int) -> tuple[int, str, list[str]]:
    """A long integer, its decimal text, and JSON texts holding it, spaced differently."""
    text = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(digits - 1))
    value = 0
    for at in range(0, digits, 1000):  # (int reads at most 4,300 decimal digits at once)
        value = value * 10 ** len(text[at:at + 1000]) + int(text[at:at + 1000])
    if rng.random() < 0.5:
        text, value = "-" + text, -value
    return value, text, [f"[{text}]", f"[ {text} ]", f"\n[{text}]\t"]


@pytest.mark.parametrize("digits", LONG_DIGITS)
@pytest.mark.parametrize("mode", ["canonical", "bytes"])
def test_json_text_with_integers_of_any_length_is_keyed_as_its_value(digits: int, mode: str) -> None:
    """RFC 8259 sets no bound on a number's digits: JSON text holding an integer longer than
    ``int`` reads in decimal is the JSON value it holds, as a shorter one is (canonical mode:
    respaced text, object key order and the equal Python value are one call; bytes mode: the
    text as given), and a different integer is a different call."""
    rng = random.Random(digits)
    keyer = Keyer(mode)
    value, text, texts = long_int_texts(rng, digits)
    keys = {keyer.digest("t", t) for t in texts}
    if mode == "canonical":
        assert keys == {keyer.digest("t", [value])}
        assert keyer.digest("t", f'{{"a":{text},"b":1}}') == keyer.digest("t", f'{{"b": 1, "a": {text}}}')
    else:
        assert len(keys) == len(texts)
    other = text[:-1] + str((int(text[-1]) + 1) % 10)
    assert keyer.digest("t", f"[{other}]") not in keys
    assert keyer.digest("t", f"[{text}, 1]") not in keys


def test_respaced_json_text_with_a_long_integer_is_one_call_in_a_turn() -> None:
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=NON_POLICY_PLUGINS,
                                    streak_warn_at=0, streak_stop_at=0))
    _, _, texts = long_int_texts(random.Random(7), 5_000)
    with guard.turn(promptable=False) as turn:
        for text in texts * 2:
            call = tg.ToolCall("submit", text)
            turn.check_call(call)
            turn.record_outcome(call, "error")
    assert (turn.ledger.max_key_repeat, turn.ledger.streak_length) == (len(texts) * 2, len(texts) * 2)
