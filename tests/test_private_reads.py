"""No module of ``src/`` reads a private attribute of another object (``turn._halt``,
``call._key``, ``hooks._asked``): what one object takes from another has a public name, so a
field can change without a search through the package. An object's own (``self._x``), its
class's (``cls._x``, ``super()._x``), dunders and enum's sunder names (``_value_``) are no such
read. What is left is ``ALLOWED``, each with why: other libraries' privates turnguard cannot do
without, and the ledger package reading its own class's fields on another instance (a fork, a
ledger read back from a snapshot, ``count_settled``'s pass)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

ALLOWED = {
    ("turnguard/_cli.py", "root._actions"): "argparse lists a parser's subparsers nowhere else",
    ("turnguard/_cli.py", "argparse._SubParsersAction"): "the type of that action: argparse has no public name",
    ("turnguard/telemetry/_starts.py", "inner._preferred_temporality"):
        "OpenTelemetry's MetricExporter keeps it private; a wrapping exporter must pass it on",
    ("turnguard/telemetry/_starts.py", "inner._preferred_aggregation"): "as _preferred_temporality",
    ("turnguard/integrations/llm_plugin.py", "response._iter_events"):
        "llm has no hook for a failed response: the stream a Response drives its model through",
    ("turnguard/integrations/llm_plugin.py", "response._generator"): "the same, an AsyncResponse's",
    ("turnguard/integrations/llm_plugin.py", "response._ensure_async_generator"): "where an AsyncResponse makes it",
    ("turnguard/integrations/langchain.py", "node._wrap_tool_call"):
        "LangGraph's ToolNode keeps the composed tool wrappers private: whether ours is the outermost",
    ("turnguard/integrations/langchain.py", "node._awrap_tool_call"): "the same, asynchronous",
    ("turnguard/integrations/openai_agents.py", "state._context"):
        "a RunState's context object, which RunState.from_json takes back and nothing public returns",
    ("turnguard/integrations/openai_agents.py", "invoker._on_handled_error"):
        "the Agents SDK's tool invoker reports a handled failure only there",
    ("turnguard/integrations/openai_agents.py", "target._agent_ref"):
        "a handoff() object names the agent it hands off to only there (the SDK's RunState reads it too)",
    ("turnguard/integrations/openai_agents.py", "observed._agent_ref"):
        "the observed handoff's copy names the observed agent there, for the SDK's RunState to find it",
}
"""(file under ``src/``, expression) -> why it is read."""

OWN_CLASS = {
    ("turnguard/_ledger/__init__.py", "twin"): "Ledger.fork's copy, a Ledger",
    ("turnguard/_ledger/__init__.py", "ledger"): "Ledger.from_state's and count_settled's Ledger",
    ("turnguard/_ledger/_cycles.py", "twin"): "CycleRuns.copy's copy, a CycleRuns",
}
"""(file, the name read through) -> the instance of the file's own class it names: every field."""


def private_reads(source: str) -> list[tuple[int, str, str]]:
    """(line, expression, the name read through) for each underscored attribute of an object other
    than ``self``/``cls``/``super()``; dunders and sunders are not private fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if len(node.attr) > 2 and node.attr.endswith("_"):  # _value_, _missing_: enum's own API
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append((node.lineno, ast.unparse(node), owner.id if isinstance(owner, ast.Name) else ""))
    return found


def reads() -> dict[str, list[tuple[int, str, str]]]:
    return {path.relative_to(SRC).as_posix(): private_reads(path.read_text("utf-8"))
            for path in sorted(SRC.rglob("*.py"))}


def test_no_module_reads_another_objects_private_attribute():
    unexplained = [f"{name}:{line}: {expression}" for name, found in reads().items()
                   for line, expression, owner in found
                   if (name, expression) not in ALLOWED and (name, owner) not in OWN_CLASS]
    assert unexplained == [], "give what another object reads a public name (or a method)"


def test_every_allowed_read_is_still_there():
    found = {(name, expression) for name, reads_here in reads().items() for _, expression, _ in reads_here}
    owners = {(name, owner) for name, reads_here in reads().items() for _, _, owner in reads_here}
    assert set(ALLOWED) - found == set()
    assert set(OWN_CLASS) - owners == set()


def test_the_scan_finds_other_objects_privates_and_leaves_self_alone():
    source = (
        "class C:\n"
        "    def m(self, turn):\n"
        "        self._x = turn._halt\n"
        "        super()._y, cls._z, turn.__class__, turn._value_\n"
        "        return make()._key, turn.ledger._late\n"
    )
    assert private_reads(source) == [(3, "turn._halt", "turn"), (5, "make()._key", ""),
                                     (5, "turn.ledger._late", "")]
