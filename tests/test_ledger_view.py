"""``LedgerView`` declares its facts: each is a read-only property with the ledger's type and
documentation, so IDEs and type checkers see what hooks receive (plugin_isolation has the runtime
contract: read-only, no mutator, bound once)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import typecheck
from test_docs_examples import Block
from turnguard.ledger import VIEW_FACTS, Ledger, LedgerView

ROOT = Path(__file__).resolve().parent.parent


def ledger_class(name: str) -> type:
    """The class of the ledger's chain (``Ledger.__mro__``) that declares the fact."""
    return next(cls for cls in Ledger.__mro__ if name in vars(cls))


def ledger_type(name: str) -> str:
    """The fact's declared type on the ledger: its annotation, or its property's return type."""
    cls = ledger_class(name)
    declared = cls.__annotations__.get(name)
    return declared if declared is not None else vars(cls)[name].fget.__annotations__["return"]


def declared_properties(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if isinstance(value, property)}


def test_the_view_declares_exactly_the_facts_as_properties():
    assert declared_properties(LedgerView) == set(VIEW_FACTS)


@pytest.mark.parametrize("name", VIEW_FACTS)
def test_each_fact_has_the_ledgers_type_and_documentation(name: str):
    fact = vars(LedgerView)[name]
    assert fact.fset is None and fact.fdel is None
    assert fact.fget.__annotations__["return"] == ledger_type(name)
    assert fact.__doc__, f"LedgerView.{name} has no docstring"
    theirs = vars(ledger_class(name))[name].__doc__
    if theirs and not theirs.startswith("attrgetter("):  # (a ledger fact without a docstring of its own)
        assert inspect.cleandoc(fact.__doc__) == inspect.cleandoc(theirs)


def test_detect_takes_the_ledgers_arguments():
    ours, theirs = inspect.signature(LedgerView.detect, follow_wrapped=False), inspect.signature(Ledger.detect)
    assert str(ours) == str(theirs)


def test_a_type_checker_sees_the_facts_and_refuses_to_set_one(tmp_path):
    source = (
        "import turnguard as tg\n\n\n"
        "def plugin(turn: tg.LedgerView) -> int:\n"
        "    calls: int = turn.tool_calls\n"
        "    cap: int | None = turn.hard_cap\n"
        "    turn.tool_calls = 3\n"
        "    return calls + turn.cycles + (cap or 0) + turn.repeats_of(b'') + len(turn.turn_id)\n"
    )
    _, out, _ = typecheck.check([Block(ROOT / "docs" / "page.md", 1, source)], [],
                                ["--cache-dir", str(tmp_path / "cache")], tmp_path / "blocks")
    errors = [line for line in out.splitlines() if line.startswith("docs/page.md")]
    assert errors == ['docs/page.md:8: error: Property "tool_calls" defined in "LedgerView" is read-only  [misc]']
