"""``LedgerView`` declares its facts: each is a read-only property with the ledger's type and
documentation, so IDEs and type checkers see what hooks receive (plugin_isolation has the runtime
contract: read-only, no mutator, bound once)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import turnguard as tg
import typecheck
from test_docs_examples import Block
from turnguard._ledger import VIEW_FACTS, VIEW_QUERIES, Ledger, LedgerFacts, LedgerView

ROOT = Path(__file__).resolve().parent.parent


def declared_properties(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if isinstance(value, property)}


def test_the_view_declares_exactly_the_facts_as_properties():
    assert declared_properties(LedgerView) == set(VIEW_FACTS) == declared_properties(LedgerFacts)


@pytest.mark.parametrize("name", VIEW_FACTS)
def test_each_fact_has_the_declared_type_and_documentation(name: str):
    fact, declared = vars(LedgerView)[name], vars(LedgerFacts)[name]
    assert fact.fset is None and fact.fdel is None
    assert fact.fget.__annotations__["return"] == declared.fget.__annotations__["return"]
    assert fact.__doc__, f"LedgerFacts.{name} has no docstring"
    assert fact.__doc__ == declared.__doc__


@pytest.mark.parametrize("name", VIEW_FACTS)
def test_each_fact_reads_the_ledgers_own(name: str):
    ledger = Ledger(tg.GuardConfig(soft_cap=50), conversation_id="c1")
    for i in (1, 1, 2):
        ledger.record_outcome(ledger.count_call(bytes([i]) * 8, "t"), tg.Outcome.ERROR)
    assert getattr(LedgerView(ledger), name) == getattr(ledger, name)


@pytest.mark.parametrize("name", VIEW_QUERIES)
def test_each_query_takes_the_declared_arguments(name: str):
    ours, declared = vars(LedgerView)[name], vars(LedgerFacts)[name]
    assert str(inspect.signature(ours, follow_wrapped=False)) == str(inspect.signature(declared))
    assert str(inspect.signature(declared)) == str(inspect.signature(getattr(Ledger, name)))
    assert ours.__doc__ == declared.__doc__


def test_a_query_asks_the_ledger():
    ledger = Ledger(tg.GuardConfig())
    ledger.count_call(b"k" * 8, "t")
    view = LedgerView(ledger)
    assert view.repeats_of(b"k" * 8) == 1 and view.outcomes(tg.Outcome.OK) == 0 and not view.polls("t")
    verdict = view.detect(tg.Threshold.STREAK, tg.Action.ALLOW, tg.Level.WARN, 5)
    assert verdict.event.tool_calls == 1 and verdict.event.turn_id == ledger.turn_id


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
    assert errors == ['docs/page.md:8: error: Property "tool_calls" defined in "LedgerFacts" is read-only  [misc]']
