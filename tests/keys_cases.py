"""Arguments for the identity tests (test_keys_identity, test_calibrate_identity): values that
spell each other's old in-band markers, and values whose methods raise."""

from __future__ import annotations

import dataclasses
import decimal
import enum
from typing import Any


class Plain:
    def __init__(self, x: object) -> None:
        self.x = x


class Slotted:
    __slots__ = ("__hidden", "a", "b")

    def __init__(self, a: object, b: object = None) -> None:
        self.a, self.b = a, b


class SlottedChild(Slotted):
    __slots__ = ("c",)


class BrokenRepr:
    def __init__(self, x: object = None) -> None:
        self.x = x

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class OtherBrokenRepr(BrokenRepr):
    pass


class Color(enum.Enum):
    RED = "r"
    BLUE = "b"


@dataclasses.dataclass
class Point:
    x: object
    y: object = None


def cyclic_dict() -> dict:
    d: dict = {"k": 1}
    d["self"] = d
    return d


def _cyclic_list() -> list:
    lst: list = [1]
    lst.append(lst)
    return lst


def _deeper_cycle() -> dict:
    d: dict = {"k": 1}
    d["self"] = {"inner": d}
    return d


def _shallow_cycle() -> dict:
    d: dict = {"k": 1}
    inner: dict = {}
    inner["inner"] = inner
    d["self"] = inner
    return d


DISTINCT_PAIRS = [
    ({1, 2}, {"__set__": [1, 2]}),
    (frozenset({"a"}), {"__set__": ["a"]}),
    ({1, 2}, [1, 2]),
    ({"s": {1}}, {"s": {"__set__": [1]}}),
    (b"\xff\xfe", {"__bytes__": "fffe"}),
    ({"b": b"ab"}, {"b": {"__bytes__": "6162"}}),
    ({"b": b"ab"}, {"b": "ab"}),
    (b"\xff", "\x00bytes\x00\xff"),
    (cyclic_dict(), {"k": 1, "self": "<cycle>"}),
    (_cyclic_list(), [1, "<cycle>"]),
    (_deeper_cycle(), _shallow_cycle()),
    ({"n": 10**5000}, {"n": {"__int__": hex(10**5000)}}),
    (10**5000, 10**5000 + 1),
    (BrokenRepr(1), BrokenRepr(2)),
    (BrokenRepr(1), OtherBrokenRepr(1)),
    (BrokenRepr(), "<unrepresentable>"),
    (BrokenRepr(), {"__object__": "BrokenRepr", "repr": "<unrepresentable>"}),
    (Slotted(1), Slotted(2)),
    (Slotted(1, 2), Slotted(1, 3)),
    (Slotted(None), Slotted.__new__(Slotted)),  # a slot set to None is not an unset slot
    (SlottedChild(1), Slotted(1)),
    (Plain(1), {"__object__": "Plain", "x": 1}),
    (Plain(1), Plain("1")),
    (Point(1, 2), {"__dataclass__": "Point", "x": 1, "y": 2}),
    (Color.RED, {"__enum__": "Color.RED"}),
    (Color.RED, Color.BLUE),
    ({1, 23}, {12, 3}),  # members are length-prefixed: they never run together
    ({1: 23, "a": 1}, {12: 3, "a": 1}),
    (Slotted(12, 3), Slotted(1, 23)),
    (float("nan"), "NaN"),
    (float("nan"), "nan"),
    (float("inf"), "inf"),
    (float("inf"), "Infinity"),
    (float("-inf"), "-Infinity"),
    ({"x": float("nan")}, '{"x": NaN}'),
    ({"x": float("nan")}, {"x": "NaN"}),
    ({1: "a", "1": "b"}, {1: "b", "1": "a"}),  # two keys json writes alike: kept apart by type
    ({(1, 2): "a"}, {"[1,2]": "a"}),
    ({decimal.Decimal("1.5"): 1}, {"Decimal('1.5')": 1}),
    ("\x02s1:1", {1}),
    ({"x": "\x02s3:1:1"}, {"x": {1}}),
    ("ls \ud800", b"ls \xed\xa0\x80"),
]



class RaisingLt:
    def __init__(self, n: int) -> None:
        self.n = n

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no order")

    __gt__ = __lt__


class RaisingEq:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no equality")

    __hash__ = object.__hash__


class RaisingHash:
    armed = False

    def __hash__(self) -> int:
        if RaisingHash.armed:
            raise RuntimeError("no hash")
        return 7


class RaisingEverything:
    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError(name)

    def __repr__(self) -> str:
        raise RuntimeError("repr")


class LyingClass:
    @property
    def __class__(self):
        raise RuntimeError("class")

    @property
    def __dict__(self):
        raise RuntimeError("dict")


class RaisingItems(dict):
    def items(self):
        raise RuntimeError("items")


class RaisingIter(list):
    def __iter__(self):
        raise RuntimeError("iter")


class RaisingStr(str):
    def __str__(self) -> str:
        raise RuntimeError("str")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    __hash__ = str.__hash__


class RaisingBytes(bytes):
    def __bytes__(self) -> bytes:
        raise RuntimeError("bytes")


@dataclasses.dataclass
class RaisingField:
    x: int = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "x":
            raise RuntimeError("field")
        return object.__getattribute__(self, name)


def _released_view() -> memoryview:
    view = memoryview(b"abc")
    view.release()
    return view


def hostile_values() -> list[Any]:
    RaisingHash.armed = False
    hashed = {RaisingHash(): 1, "k": {RaisingHash()}}
    RaisingHash.armed = True
    return [
        {decimal.Decimal("NaN"): 1, decimal.Decimal("NaN"): 2},
        {decimal.Decimal("NaN"): 1, decimal.Decimal(1): 2, "a": 3},
        {RaisingLt(1): "a", RaisingLt(2): "b"},
        {RaisingEq(): 1, RaisingEq(): 2},
        {1: "a", "b": 2, None: 3, (1, 2): 4, 1.5: 5, b"x": 6, frozenset({1}): 7, float("nan"): 8},
        hashed,
        RaisingEverything(),
        [RaisingEverything(), {"x": RaisingEverything()}],
        LyingClass(),
        RaisingItems(a=1),
        {"nested": RaisingItems(a=1)},
        RaisingIter([1, 2]),
        {"x": RaisingIter([1])},
        RaisingStr("ls -la"),
        {RaisingStr("k"): RaisingStr("v")},
        RaisingBytes(b'{"a": 1}'),
        RaisingField(),
        _released_view(),
        {"view": _released_view()},
        {RaisingLt(1): {decimal.Decimal("NaN"): RaisingEverything()}},
    ]
