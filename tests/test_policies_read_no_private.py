"""The built-in policies read a turn through ``PolicyFacts`` (``turnguard._ledger``): no policy
module reads an underscored attribute of another object (``turn._streak``, ``call._key``). Its
own instance's (``self._x``) and a class's own (``cls._x``) are its business."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

POLICIES = Path(__file__).resolve().parent.parent / "src" / "turnguard" / "_policies"


def private_reads(source: str) -> list[str]:
    """``name._attr`` for every attribute access on an object other than ``self``/``cls``, as
    ``line: expression``; dunders (``__name__``) are no private field."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.py")), ids=lambda p: p.name)
def test_a_policy_reads_no_private_attribute_of_another_object(path: Path):
    assert private_reads(path.read_text()) == []


def test_the_scan_finds_a_private_read_and_leaves_self_alone():
    source = "def hook(turn):\n    self._x = turn._streak\n    return turn.ledger._late.__class__\n"
    assert private_reads(source) == ["2: turn._streak", "3: turn.ledger._late"]
