"""``Turn.check_call`` and ``Turn.record_outcome`` are each turn's own closures: declared on the
class as attributes (with their docs and types), never methods that the instance's closures
would shadow."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import turnguard as tg
from conftest import core_guard
from turnguard import _guard as guard_module

GUARD_SOURCE = Path(guard_module.__file__).read_text(encoding="utf-8")
HOT_PATHS = ("check_call", "record_outcome")


def attribute_docs(cls: str) -> dict[str, str]:
    """The docstrings written under ``cls``'s annotated attributes in _guard.py."""
    tree = ast.parse(GUARD_SOURCE)
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    docs = {}
    for here, after in zip(node.body, node.body[1:], strict=False):
        if (isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[here.target.id] = inspect.cleandoc(after.value.value)
    return docs


def test_the_hot_paths_are_no_methods_of_the_class():
    for name in HOT_PATHS:
        assert name not in vars(tg.Turn), f"Turn.{name} is defined on the class: the turn's closure would shadow it"
        assert name in tg.Turn.__annotations__


def test_each_turn_has_its_own_closures_documented_as_the_class_says():
    docs = attribute_docs("Turn")
    one, two = core_guard().turn(), core_guard().turn()
    for name in HOT_PATHS:
        mine, theirs = getattr(one, name), getattr(two, name)
        assert inspect.isfunction(mine) and mine is not theirs and mine.__closure__
        assert inspect.getdoc(mine) == docs[name]


def test_the_closures_take_what_the_declared_types_say():
    turn = core_guard().turn()
    assert list(inspect.signature(turn.check_call).parameters) == ["call"]
    assert list(inspect.signature(turn.record_outcome).parameters) == ["call", "outcome", "result"]
    for name, protocol in (("check_call", guard_module.CheckCall), ("record_outcome", guard_module.RecordOutcome)):
        declared = inspect.signature(protocol.__call__)
        assert list(declared.parameters)[1:] == list(inspect.signature(getattr(turn, name)).parameters)


def test_no_type_ignore_is_left_for_assigning_over_a_method():
    assert "method-assign" not in GUARD_SOURCE
