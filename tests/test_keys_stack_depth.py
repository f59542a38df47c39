"""A call's identity does not depend on how deep the caller's Python stack is: JSON text nested
deeper than json's recursive scanner can go from there, plain values nested as deep, and objects
whose own methods recurse get one key from a shallow stack, a deep one and one near the
recursion limit."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

import turnguard as tg
from conftest import CORE_ONLY
from turnguard import _keys as keys
from turnguard._keys import Keyer, identity_bytes

MODES = ("canonical", "bytes")


def _stack_depth() -> int:
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def _at_depth(extra: int, work: Callable[[], Any]) -> Any:
    """``work()`` called ``extra`` frames deeper than here."""
    return work() if extra <= 0 else _at_depth(extra - 1, work)


def _depths() -> list[int]:
    """Extra frames to key from: none, half the room left, and within a few dozen frames of the
    recursion limit."""
    room = sys.getrecursionlimit() - _stack_depth()
    return [0, room // 2, room - 120, room - 80, room - 60, room - 45]


def _keys_from_every_depth(work: Callable[[], Any]) -> set[Any]:
    return {_at_depth(extra, work) for extra in _depths()}


def _nested_list(n: int) -> Any:
    value: Any = [1]
    for _ in range(n - 1):
        value = [value]
    return value


def _nested_dict(n: int) -> Any:
    value: Any = {"z": 1, "a": None}
    for i in range(n - 1):
        value = {"k": value, "b": i}
    return value


def _text_of(build: Callable[[int], Any], n: int) -> str:
    """The JSON text of ``build(n)``, keys unsorted (written by hand: ``json.dumps`` recurses)."""
    if build is _nested_list:
        return "[" * n + "1" + "]" * n
    return '{"k":' * (n - 1) + '{"z":1,"a":null}' + "".join(f',"b":{i}}}' for i in range(n - 1))


NESTS = [300, 700, 1_500]
"""How deeply the arguments nest: from what any stack parses to what none does recursively."""


@pytest.mark.parametrize("nest", NESTS)
@pytest.mark.parametrize("build", [_nested_list, _nested_dict], ids=["arrays", "objects"])
def test_json_text_and_its_value_get_one_key_from_any_stack_depth(nest, build):
    value = build(nest)
    text = _text_of(build, nest)
    spaced = text.replace(",", " ,\n").replace(":", ": ").replace("[", "[\t")
    variants = {"text": text, "spaced": f" \n{spaced}\t", "bytes": spaced.encode(), "value": value}
    keyer = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).keyer
    for label, args in variants.items():
        seen = _keys_from_every_depth(lambda args=args: identity_bytes("tool", args))
        assert seen == {identity_bytes("tool", value)}, label
        digests = _keys_from_every_depth(lambda args=args: keyer.digest("tool", args))
        assert digests == {keyer.digest("tool", value)}, label


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nest", NESTS)
def test_a_nested_python_value_gets_one_key_from_any_stack_depth(mode, nest):
    for value in (_nested_list(nest), _nested_dict(nest), {"set": {frozenset({1})}, "deep": _nested_list(nest)}):
        first = identity_bytes("tool", value, mode)
        assert _keys_from_every_depth(lambda value=value: identity_bytes("tool", value, mode)) == {first}
        keyer = Keyer(mode)
        digest = keyer.digest("tool", value)
        assert _keys_from_every_depth(lambda value=value, keyer=keyer: keyer.digest("tool", value)) == {digest}


def test_deep_json_text_is_one_call_when_checked_from_a_shallow_and_a_deep_stack():
    room = sys.getrecursionlimit() - _stack_depth()
    for nest in (400, 1_500):
        text = "[ " * nest + "]" * nest
        turn = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={}).turn()
        turn.check_call(tg.ToolCall("t", text))
        _at_depth(room - 80, lambda turn=turn, text=text: turn.check_call(tg.ToolCall("t", text)))
        turn.check_call(tg.ToolCall("t", text.replace(" ", "\n")))
        assert turn.ledger.max_key_repeat == 3, nest


def _recurse(n: int) -> str:
    return "end" if n <= 0 else _recurse(n - 1)


def _room() -> int:
    return sys.getrecursionlimit() - _stack_depth()


class DeepRepr:
    """A ``__repr__`` that needs most of the stack (it works from a shallow one)."""

    def __init__(self, frames: int) -> None:
        self.frames = frames

    def __repr__(self) -> str:
        return f"DeepRepr({_recurse(self.frames)})"


class EndlessRepr:
    """A ``__repr__`` that never returns (it works from no stack)."""

    def __init__(self) -> None:
        self.state = 1

    def __repr__(self) -> str:
        return repr(self)


class DeepItems(Mapping):
    """A mapping whose ``items()`` needs most of the stack."""

    def __init__(self, frames: int) -> None:
        self.frames = frames

    def __getitem__(self, key: str) -> int:
        return 1

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1

    def items(self) -> Any:
        return [(_recurse(self.frames), 1)]


class DeepLt(str):
    """A key whose ``<`` needs most of the stack (dict keys are sorted)."""

    frames = 0

    def __lt__(self, other: object) -> bool:
        return _recurse(self.frames) == "end" and str.__lt__(self, other)  # type: ignore[operator]


class DeepProperty:
    """A slot read through a descriptor that needs most of the stack."""

    __slots__ = ("frames",)

    def __init__(self, frames: int) -> None:
        self.frames = frames

    @property
    def derived(self) -> str:
        return _recurse(self.frames)


def _deep_lt_dict(frames: int) -> dict[str, int]:
    key_class = type("DeepLtKey", (DeepLt,), {"frames": frames})
    return {key_class("b"): 1, key_class("a"): 2}


HOSTILE: dict[str, Callable[[int], Any]] = {
    "deep __repr__": DeepRepr,
    "endless __repr__": lambda frames: EndlessRepr(),
    "deep Mapping.items": DeepItems,
    "endless Mapping.items": lambda frames: DeepItems(10 * sys.getrecursionlimit()),
    "deep key __lt__": _deep_lt_dict,
    "endless key __lt__": lambda frames: _deep_lt_dict(10 * sys.getrecursionlimit()),
}
"""Values whose own methods recurse: some as deep as a shallow stack allows, some without end."""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_value_whose_methods_recurse_gets_one_key_from_any_stack_depth(kind, mode):
    value = HOSTILE[kind](_room() - 60)
    shallow = identity_bytes("tool", [value], mode)
    assert _keys_from_every_depth(lambda: identity_bytes("tool", [value], mode)) == {shallow}
    if kind == "deep __repr__":
        assert b"DeepRepr(end)" in shallow  # what the method returns, read on every stack
    if kind == "deep Mapping.items":
        assert b'"end"' in shallow


# -- the scanner that takes over where json's runs out of stack --------------------------------------


EDGES = ["[1,]", '{"a":1,}', "01", "1.", "1e", "1e+", "-", "-0", "-Infinity", "NaN", "[NaN]", "Infinity", "\u0661",
         "1\u0661", '["\\ud800"]', '"\x01"', '"\\x"', '{"a" 1}', '{"a":}', "{1:2}", "[1 2]", " [1]", "nul", "truex",
         "1e400", "-1e400", "0.0e-0", "1" * 5000, "[" + "1" * 5000 + "]", '{"a":1,"a":2}', "[]", "{}", "[[]]",
         '{"":{}}', '"\\u00e9\\n"', "2.5E+3", "[true,false,null]", "[true ,\n false\t]", "{ }", "[ ]", "[", "{",
         '{"a"', '{"a":', "[1,", "", "]", "}", ",", "tru", '"abc', "[1]]", '{"a":1}}', "-01", "1.5.5", "[-]"]
"""Texts at json's edges: what it reads, where it stops, what it refuses."""


def _scan(scan: Callable[[str, int], tuple[Any, int]], text: str) -> Any:
    try:
        value, end = scan(text, 0) if scan is keys._scan_long_json else scan(text)  # type: ignore[call-arg]
    except (StopIteration, ValueError):
        return "refused"
    return _typed(value), end


def _typed(value: Any) -> Any:
    """``value`` with every scalar's type beside it (``1 == 1.0 == True`` otherwise)."""
    if isinstance(value, list):
        return ["list", *(_typed(v) for v in value)]
    if isinstance(value, dict):
        return ["dict", *((k, _typed(v)) for k, v in value.items())]
    return (type(value).__name__, hex(value) if type(value) is int else repr(value))  # (hex: any length)


def _random_json(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(9 if depth else 6)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.randrange(-10**6, 10**6) * rng.choice([1, 10**rng.randrange(30)])
    if pick == 2:
        return rng.choice([0.0, -0.0, 1.5, 1e-300, 2.5e300, rng.random() * 10**rng.randrange(-20, 20)])
    if pick in (3, 4, 5):
        return "".join(rng.choice('ab"\\/\n\t\x00 é€\U0001f600\u2028') for _ in range(rng.randrange(6)))
    if pick in (6, 7):
        return [_random_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {_random_json(rng, 0) if rng.random() < 0.2 else str(rng.randrange(5)): _random_json(rng, depth - 1)
            for _ in range(rng.randrange(4))}


def _texts(seed: int, count: int) -> Iterator[str]:
    """Random JSON texts written every way json writes them, and mutations of them (a character
    of JSON's syntax put in, taken out or swapped)."""
    rng = random.Random(seed)
    for _ in range(count):
        value = _random_json(rng, 5)
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 0, 2, "\t", " \r\n"]),
                          separators=rng.choice([None, (",", ":"), (" , ", " : ")]), default=str)
        yield text
        for _ in range(3):
            at = rng.randrange(len(text) + 1)
            piece = rng.choice([*'[]{},:"\\ -+.eE01tfn\x01', "true", "null", "NaN", "\\u12", "1e5"])
            yield rng.choice([text[:at] + piece + text[at:], text[:at] + text[at + 1:],
                              text[:at] + piece + text[at + 1:]])


@pytest.mark.parametrize("text", EDGES)
def test_the_deep_scanner_reads_exactly_what_json_reads_at_its_edges(text):
    """``_scan_long_json``: json's own scanner, reading integers of any length."""
    assert _scan(keys._scan_deep, text) == _scan(keys._scan_long_json, text)


@pytest.mark.parametrize("seed", range(4))
def test_the_deep_scanner_reads_exactly_what_json_reads_on_random_texts(seed):
    for text in _texts(seed, 500):
        assert _scan(keys._scan_deep, text) == _scan(keys._scan_long_json, text), text


def test_the_deep_scanner_reads_any_depth_without_recursion():
    text = _text_of(_nested_dict, 20_000)
    value, end = _at_depth(_room() - 45, lambda: keys._scan_deep(text))
    assert end == len(text) and keys.canonical_text(value) == keys.canonical_text(_nested_dict(20_000))
