"""Call identity without collisions (issue 11, defects 3-5): plain JSON keeps its digests, every
other value has a form no other value can spell, and no argument makes keying raise."""

from __future__ import annotations

import collections
import decimal
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from keys_cases import (
    DISTINCT_PAIRS,
    BrokenRepr,
    LyingClass,
    Plain,
    Point,
    RaisingEverything,
    RaisingItems,
    RaisingLt,
    RaisingStr,
    Slotted,
    cyclic_dict,
    hostile_values,
)
from turnguard import _keys as keys
from turnguard._keys import Keyer, byte_identity, canonical_bytes, identity_bytes, name_bytes

MODES = ("canonical", "bytes")
FIXTURE = Path(__file__).parent / "data" / "keys_plain_json_digests.json"


def digest(args: Any, mode: str = "canonical", name: str = "tool") -> bytes:
    return Keyer(mode, b"s" * 32).digest(name, args)


SIPHASH = {m: Keyer(m, hash="siphash") for m in MODES}
"""The keyers of a guard without ``digest_key`` where the interpreter's hash seed is random."""


def same_call(a: Any, b: Any, mode: str, name_a: str = "tool", name_b: str = "tool") -> bool:
    """Whether the identity bytes agree, checked against the live digests of both hashes (so all
    must agree)."""
    same = identity_bytes(name_a, a, mode) == identity_bytes(name_b, b, mode)
    assert same == (digest(a, mode, name_a) == digest(b, mode, name_b))
    assert same == (SIPHASH[mode].digest(name_a, a) == SIPHASH[mode].digest(name_b, b))
    return same


def siphash_of(name: Any, data: bytes) -> bytes:
    """What ``Keyer(hash="siphash")`` makes of a call's identity bytes: the interpreter's keyed
    hash of the pair (the name's part with a text's 0x01, the rest), 8 bytes."""
    head = name_bytes(name)
    assert data.startswith(head)
    rest = data[len(head):]
    if rest.startswith(b"\x01"):
        head, rest = head + b"\x01", rest[1:]
    return hash((head, rest)).to_bytes(8, "little", signed=True)


# -- plain JSON: the same digests as before ------------------------------------------------------


def test_plain_json_and_text_keep_the_digests_they_had():
    """The fixture holds digests computed by _keys.py on main before this change (commit a2a5092)
    for a fixed secret: plain JSON values, JSON text and plain text, in both modes."""
    rows = json.loads(FIXTURE.read_text())
    assert len(rows) > 500
    keyers = {m: Keyer(m, b"turnguard-plain-json-fixture") for m in MODES}
    changed = [row for row in rows if keyers[row["mode"]].digest(row["name"], row["args"]).hex() != row["digest"]]
    assert changed == []


# -- defect 4: values that used to share a key through in-band markers ----------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("a", "b"), DISTINCT_PAIRS, ids=[f"pair{i}" for i in range(len(DISTINCT_PAIRS))])
def test_values_that_spell_each_others_markers_are_different_calls(a, b, mode):
    assert not same_call(a, b, mode)
    assert same_call(a, a, mode) and same_call(b, b, mode)


@pytest.mark.parametrize("mode", MODES)
def test_text_that_spells_a_token_is_not_that_value_in_bytes_mode(mode):
    for value in ({1, 2}, [1, {2}], {"s": {1}}, b"\xff", float("nan"), Plain(1)):
        spelled = identity_bytes("t", value, mode)[2:]  # what the value writes, as text or bytes
        assert not same_call(value, spelled, mode)
        assert not same_call(value, spelled.decode("utf-8", "surrogateescape"), mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name_a", "args_a", "name_b", "args_b"), [
    ("a", "b\x00\x01c", "a\x00\x01b", "c"),
    ("a", "\x00b", "a\x00", "b"),
    ("a", '{"x":1}', "a\x00{", '"x":1}'),
    ("a\x00b", "c", "a", "b\x00c"),
    ("\xfe", "x", "\xfe1:", "x"),
])
def test_a_tool_name_and_argument_text_sharing_separator_bytes_are_different_calls(
        mode, name_a, args_a, name_b, args_b):
    assert not same_call(args_a, args_b, mode, name_a, name_b)


def test_a_name_holding_a_nul_is_still_one_call_with_itself():
    assert same_call({"a": 1}, {"a": 1}, "canonical", "re\x00ad", "re\x00ad")
    assert not same_call({"a": 1}, {"a": 1}, "canonical", "re\x00ad", "read")


@pytest.mark.parametrize("mode", MODES)
def test_equal_values_of_odd_types_are_one_call(mode):
    pairs = [({3, 1, 2}, frozenset({2, 3, 1})), (Plain([1]), Plain([1])), (Slotted(1, {2}), Slotted(1, {2})),
             (BrokenRepr({"a": 1}), BrokenRepr({"a": 1})), (Point(1, {2}), Point(1, {2})),
             (cyclic_dict(), cyclic_dict()), ({decimal.Decimal("NaN"): 1}, {decimal.Decimal("NaN"): 1}),
             ({"b": b"x", "a": {1}}, {"a": {1}, "b": bytearray(b"x")}), ({1: "a", "b": 2}, {"b": 2, 1: "a"})]
    for a, b in pairs:
        assert same_call(a, b, mode), (a, b)


# -- the property: distinct meanings, distinct keys; equal meanings, equal keys ---------------------
#
# ``meaning`` is a reference written apart from _keys.py: a value's meaning is the JSON that
# ``json.dumps`` writes for it when it writes one, and otherwise a structural tuple. A top-level
# str/bytes in canonical mode means the JSON value it holds when it is RFC 8259 JSON text with
# only JSON whitespace around it, and otherwise its text; in bytes mode it means its bytes.


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _no_constants(name: str) -> Any:
    raise ValueError(name)


def _json_text_value(text: str) -> tuple[bool, Any]:
    stripped = text.strip(" \t\n\r")
    if not stripped:
        return False, None
    try:
        return True, json.loads(stripped, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return False, None


def _sorted(items: list[Any]) -> tuple[Any, ...]:
    return tuple(sorted(items, key=repr))


def meaning(value: Any) -> Any:
    try:
        return ("json", _dumps(value))
    except Exception:  # what json.dumps raises, including a key comparison's own error
        pass
    if isinstance(value, float):
        return ("nonfinite", repr(value))
    if isinstance(value, int):
        return ("bigint", hex(value))
    if isinstance(value, (bytes, bytearray)):
        return ("bytes", bytes(value))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(meaning(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", _sorted([meaning(v) for v in value]))
    if isinstance(value, dict):
        try:  # keys json.dumps(sort_keys=True) writes: the dict is a JSON object
            _dumps(dict.fromkeys(value, 0))
        except Exception:
            return ("dict", _sorted([(meaning(k), meaning(v)) for k, v in value.items()]))
        return ("object", _sorted([(_dumps({k: 0})[1:-3], meaning(v)) for k, v in value.items()]))
    if isinstance(value, Slotted):
        state = [getattr(value, s, "<unset>") for s in ("a", "b", "_Slotted__hidden")]
        return ("slotted", type(value).__qualname__, tuple(meaning(v) for v in state))
    if isinstance(value, decimal.Decimal):
        return ("decimal", repr(value))
    return ("object", type(value).__qualname__, meaning(vars(value)))


def top_meaning(args: Any, mode: str) -> Any:
    if mode == "bytes":
        if isinstance(args, str):
            return ("raw", args.encode("utf-8", "surrogatepass"))
        if isinstance(args, (bytes, bytearray)):
            try:
                bytes(args).decode()
            except UnicodeDecodeError:
                return ("bytes", bytes(args))
            return ("raw", bytes(args))
        m = meaning(args)
        return ("raw", m[1].encode("utf-8", "surrogatepass")) if m[0] == "json" else ("value", m)
    if isinstance(args, (bytes, bytearray)):
        try:
            args = bytes(args).decode()
        except UnicodeDecodeError:
            return ("bytes", bytes(args))
    if isinstance(args, str):
        is_json, value = _json_text_value(args)
        if not is_json:
            return ("text", args)
        return ("text", value) if isinstance(value, str) else meaning(value)
    return meaning(args)


TRICKY_TEXT = ["", "a", "1", "__set__", "<cycle>", "__bytes__", "\x00", "\x01", "\x02", "\x02s1:1", "s3:", "{",
               '"', "\\", "é", "\ud800", "NaN", "nan", "inf", "true", " ", "\x0c", "12", "3"]


class Generator:
    """Seeded random values across types, and equal-meaning variants of them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def text(self) -> str:
        return "".join(self.rng.choice(TRICKY_TEXT) for _ in range(self.rng.randint(0, 3)))

    def scalar(self) -> Any:
        rng = self.rng
        return rng.choice([
            lambda: None, lambda: True, lambda: False, lambda: rng.randint(-3, 3), lambda: 2**70,
            lambda: 10**4400, lambda: rng.choice([0.0, -0.0, 1.0, 1.5, float("nan"), float("inf"), float("-inf")]),
            self.text, lambda: self.text().encode("utf-8", "surrogatepass"), lambda: decimal.Decimal("NaN"),
            lambda: decimal.Decimal(rng.randint(0, 2)),
        ])()

    def hashable(self, depth: int) -> Any:
        if depth <= 0 or self.rng.random() < 0.6:
            value = self.scalar()
            return value if not isinstance(value, float) or value == value else 0.5  # a NaN is unequal to itself
        return tuple(self.hashable(depth - 1) for _ in range(self.rng.randint(0, 2)))

    def value(self, depth: int) -> Any:
        rng = self.rng
        r = rng.random()
        if depth <= 0 or r < 0.35:
            return self.scalar()
        kids = rng.randint(0, 3)
        if r < 0.5:
            return [self.value(depth - 1) for _ in range(kids)]
        if r < 0.55:
            return tuple(self.value(depth - 1) for _ in range(kids))
        if r < 0.7:
            return {self.text(): self.value(depth - 1) for _ in range(kids)}
        if r < 0.75:
            return {rng.choice([rng.randint(0, 3), rng.choice([0.5, 2.5])]): self.value(depth - 1) for _ in range(kids)}
        if r < 0.8:
            return {self.hashable(1): self.value(depth - 1) for _ in range(kids)}
        if r < 0.87:
            return rng.choice([set, frozenset])(self.hashable(2) for _ in range(kids))
        if r < 0.92:
            return rng.choice([Plain, BrokenRepr])(self.value(depth - 1))
        return rng.choice([lambda: Slotted(self.value(depth - 1), self.value(depth - 1)),
                           lambda: Slotted.__new__(Slotted)])()

    def variant(self, value: Any) -> Any:
        """A value with the same meaning, built differently."""
        rng = self.rng
        if isinstance(value, dict):
            items = [(k, self.variant(v)) for k, v in value.items()]
            rng.shuffle(items)
            return (dict if rng.random() < 0.7 else collections.OrderedDict)(items)
        if isinstance(value, (list, tuple)):
            return rng.choice([list, tuple])(self.variant(v) for v in value)
        if isinstance(value, (set, frozenset)):
            items = list(value)
            rng.shuffle(items)
            return rng.choice([set, frozenset])(items)
        if isinstance(value, bytes) and rng.random() < 0.5:
            return bytearray(value)
        if type(value) in (Plain, BrokenRepr):
            return type(value)(self.variant(value.x))
        if type(value) is Slotted and hasattr(value, "a"):
            return Slotted(self.variant(value.a), self.variant(value.b))
        return value

    def as_text(self, value: Any) -> Any:
        """JSON text of a plain JSON value, respaced with JSON whitespace (as str or bytes)."""
        space = lambda: "".join(self.rng.choice(" \t\n\r") for _ in range(self.rng.randint(0, 2)))  # noqa: E731
        text = json.dumps(value, ensure_ascii=self.rng.random() < 0.5, allow_nan=False,
                          separators=(space() + "," + space(), space() + ":" + space()))
        text = space() + text + space()
        return text.encode("utf-8", "surrogatepass") if self.rng.random() < 0.3 else text


def _population(seed: int, size: int) -> list[Any]:
    gen = Generator(seed)
    values: list[Any] = []
    for _ in range(size):
        value = gen.value(3)
        values += (value, gen.variant(value))
        try:
            _dumps(value)
        except Exception:
            continue
        values.append(gen.as_text(value))
    values += ["true\n", "false ", "null\t", " 5\n", "\x0ctrue", "\xa05", "5\xa0", "ls -la", " ls", "-Infinity"]
    return values


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_distinct_meanings_get_distinct_keys_and_equal_meanings_equal_keys(mode, seed):
    values = _population(seed, 400)
    by_meaning: dict[Any, set[bytes]] = collections.defaultdict(set)
    by_key: dict[bytes, set[Any]] = collections.defaultdict(set)
    for value in values:
        m, key = top_meaning(value, mode), identity_bytes("tool", value, mode)
        by_meaning[m].add(key)
        by_key[key].add(m)
    split = {m: keys for m, keys in by_meaning.items() if len(keys) > 1}
    merged = {k: ms for k, ms in by_key.items() if len(ms) > 1}
    assert not split, "one meaning, several keys"
    assert not merged, "several meanings, one key"
    assert 200 < len(by_meaning) < len(values) * 0.5  # many distinct values, and real variants of them
    kinds = {part for m in by_meaning for part in _kinds(m)}
    assert kinds >= {"json", "set", "dict", "object", "slotted", "bytes", "nonfinite", "bigint", "decimal", "array",
                     *(("text",) if mode == "canonical" else ("raw", "value"))}


def _kinds(m: Any) -> set[str]:
    """The kinds of meaning inside one (what a population covers)."""
    if not isinstance(m, tuple):
        return set()
    out = {m[0]} if m and isinstance(m[0], str) else set()
    for part in m:
        out |= _kinds(part)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_the_live_digest_hashes_the_identity_bytes(mode):
    secret = b"k" * 32
    keyer = Keyer(mode, secret)
    for value in _population(7, 200):
        for name in ("read_file", "re\x00ad", "\ud800"):
            expected = hashlib.blake2b(identity_bytes(name, value, mode), digest_size=8, key=secret).digest()
            assert keyer.digest(name, value) == expected


@pytest.mark.parametrize("mode", MODES)
def test_without_a_secret_the_digest_is_the_interpreters_keyed_hash_of_the_identity_bytes(mode):
    keyer = SIPHASH[mode]
    for value in [*_population(7, 200), "ls -la", "true", '"quoted"', b"ls -la", "ls \ud800", "\x02t", ""]:
        for name in ("read_file", "re\x00ad", "\ud800"):
            assert keyer.digest(name, value) == siphash_of(name, identity_bytes(name, value, mode)), (name, value)


@pytest.mark.parametrize("mode", MODES)
def test_the_siphash_digest_stays_right_past_the_tool_names_a_keyer_keeps(mode):
    keyer = SIPHASH[mode]
    for i in range(1500):
        for args in (f"ls {i}", {"i": i}):
            assert keyer.digest(f"tool{i}", args) == siphash_of(f"tool{i}", identity_bytes(f"tool{i}", args, mode))


TEXTS = ["ls -la", "", " ", "x", "true", "true ", "tru", "nulls", "5", "-", "{", "[1", '"q', "caf\u00e9", "\u00ff",
         "\u4e2d\u6587", "\U0001f600", "\x01ls", "\x02t", "\x7f", "a\x00b", "grep -rn 'def f' src/ | head -20",
         "x" * 5000]
"""Text arguments around every edge of the ASCII shortcut: JSON-looking, non-ASCII in each width, markers."""


@pytest.mark.parametrize("mode", MODES)
def test_hashing_ascii_text_in_place_keys_it_as_its_encoded_bytes(mode, monkeypatch):
    """A guard keys an ASCII text without encoding it; one where ``hash(str)`` might differ from
    ``hash(bytes)`` encodes every text: both give every call the same digest."""
    in_place = Keyer(mode, hash="siphash")
    monkeypatch.setattr(keys, "_ASCII_AS_BYTES", False)
    encoded = Keyer(mode, hash="siphash")
    for text in [*TEXTS, *(t.upper() for t in TEXTS), *(f"{t} {i}" for i, t in enumerate(TEXTS))]:
        for name in ("bash", "re\x00ad", "n\u00e9"):
            assert in_place.digest(name, text) == encoded.digest(name, text), (name, text)
            assert in_place.digest(name, text) == siphash_of(name, identity_bytes(name, text, mode)), (name, text)


@pytest.mark.parametrize("mode", MODES)
def test_a_text_and_a_str_subclass_holding_it_are_one_call_under_siphash(mode):
    class Text(str):
        pass

    for text in TEXTS:
        assert SIPHASH[mode].digest("bash", text) == SIPHASH[mode].digest("bash", Text(text)), text


def test_a_guard_without_a_secret_keys_with_siphash_only_where_the_hash_seed_is_random():
    """PYTHONHASHSEED fixes the seed (anyone can compute the digests): then BLAKE2b under the
    random per-process secret; with a secret, always BLAKE2b (digests agree across processes)."""
    probe = "import turnguard as tg; print(tg.Guard(tg.GuardConfig(), environ={}).keyer.hash)"
    seen = {}
    for seed in ("random", "0", "1234", None):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        if seed is not None:
            env["PYTHONHASHSEED"] = seed
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen[seed] = done.stdout.strip()
    assert seen == {"random": "siphash", None: "siphash", "0": "blake2b", "1234": "blake2b"}
    assert Keyer("canonical", b"secret").hash == "blake2b"
    with pytest.raises(ValueError, match="siphash"):
        Keyer("canonical", b"secret", hash="siphash")
    with pytest.raises(ValueError, match="blake2b"):
        Keyer("canonical", hash="md5")


def test_siphash_digests_differ_between_processes():
    """The seed is per process: the same call gets another digest in another process, like the
    per-process BLAKE2b secret (a durable turn needs ``digest_key``)."""
    probe = "from turnguard._keys import Keyer; print(Keyer(hash='siphash').digest('bash', 'ls -la').hex())"
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    digests = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                              env=env).stdout.strip() for _ in range(3)}
    assert len(digests) == 3 and all(len(d) == 16 for d in digests)


@pytest.mark.parametrize("mode", MODES)
def test_digests_stay_right_past_the_tool_names_a_keyer_keeps_hash_states_for(mode):
    secret = b"k" * 32
    keyer = Keyer(mode, secret)
    for i in range(1500):  # more names than the keyer keeps states for
        for args in (f"ls {i}", {"i": i}):
            expected = hashlib.blake2b(identity_bytes(f"tool{i}", args, mode), digest_size=8, key=secret).digest()
            assert keyer.digest(f"tool{i}", args) == expected


@pytest.mark.parametrize("mode", MODES)
def test_the_inlined_cases_of_identity_bytes_change_nothing(mode):
    body = canonical_bytes if mode == "canonical" else byte_identity
    texts = ["ls -la", "tail -f x", "true\n", '{"b": 1, "a": [2]}', '{"a": 1} x', "{}", "{", "\x02s1:1", "ls \ud800",
             '{"s": "\ud800"}', "", "null"]
    for value in [*_population(11, 100), *texts]:
        for name in ("read_file", "re\x00ad", "\ud800"):
            assert identity_bytes(name, value, mode) == name_bytes(name) + body(value)


# -- defect 3: nothing raises ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_no_argument_makes_keying_raise_and_keys_are_deterministic(mode):
    for first, again in zip(hostile_values(), hostile_values(), strict=True):
        key = identity_bytes("tool", first, mode)
        assert key == identity_bytes("tool", first, mode)
        if type(first) not in (RaisingEverything, LyingClass):  # nothing readable: keyed by type
            assert key == identity_bytes("tool", again, mode), first
        assert Keyer(mode).digest("tool", first) == Keyer(mode).digest("tool", first)


@pytest.mark.parametrize("mode", MODES)
def test_check_call_never_raises_on_hostile_arguments(mode):
    turn = tg.Guard(tg.GuardConfig(key_mode=mode, disable_plugins=("otel", "recorder", "shadow"))).turn()
    for args in hostile_values():
        call = tg.ToolCall("tool", args)
        assert turn.check_call(call).action is tg.Action.ALLOW
        assert turn.record_outcome(call, tg.Outcome.OK).action is tg.Action.ALLOW


def test_hostile_values_that_differ_in_what_can_be_read_get_different_keys():
    assert not same_call({RaisingLt(1): "a"}, {RaisingLt(1): "b"}, "canonical")
    assert not same_call({decimal.Decimal("NaN"): 1}, {decimal.Decimal("NaN"): 2}, "canonical")
    assert not same_call(RaisingItems(a=1), RaisingItems(a=2), "canonical")
    assert not same_call(RaisingStr("ls -la"), RaisingStr("ls -l"), "canonical")


# -- defect 5: only JSON's whitespace is insignificant ---------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("true\n", True), ("false ", False), ("null\t", None), ("\ttrue", True), (" true", True), ("5\n", 5),
    ("\r\n[1, 2]\n", [1, 2]), ('  {"b": 1, "a": 2}\r', {"a": 2, "b": 1}), ("-0.5 ", -0.5), ('"x" ', "x"),
    (b"true\n", True), (b" 7", 7),
])
def test_text_holding_a_json_value_between_json_whitespace_is_that_value(text, value):
    assert same_call(text, value, "canonical")


@pytest.mark.parametrize("text", ["\x0ctrue", "true\x0c", "\xa05", "5\xa0", "\u2028{}", "\x0b[1]", "true\x85",
                                  "\u3000null", "NaN", "Infinity", "-Infinity", "[NaN]", '{"a": Infinity}'])
def test_text_with_other_whitespace_or_non_json_numbers_is_text(text):
    assert identity_bytes("t", text) == b"t\x00\x01" + text.encode()
    stripped = text.strip()
    assert not same_call(text, stripped, "canonical") or text == stripped
    for value in (True, None, 5, [1], {}, float("nan"), float("inf"), float("-inf")):
        assert not same_call(text, value, "canonical")


@pytest.mark.parametrize("text", ["tail -f log", "true story", "nullable", "false-positive", "t", "n", "f"])
def test_text_starting_like_a_json_word_is_text(text):
    assert identity_bytes("t", text) == b"t\x00\x01" + text.encode()
