"""One plugin loop: only the dispatcher calls plugins, in one loop per way of calling (the check
hooks' and the hot observers' arity, keyword hooks), each handling a failed plugin the one way
(``Dispatcher.failed``). Read from the source (``ast``), so a loop written anywhere else, in any
shape, is found: one over compiled implementations, over pluggy's ``get_hookimpls()``, or a hook
called through pluggy itself."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import turnguard as tg
from conftest import CORE_ONLY
from turnguard import _dispatch as dispatch
from turnguard._dispatch import BoundChecks, BoundImpl, Dispatcher, Impl, Observer

SRC = Path(__file__).resolve().parent.parent / "src" / "turnguard"
DISPATCHER = SRC / "_dispatch.py"
CALLABLE_FIELDS = frozenset({"fn", "function"})
"""The fields that hold a plugin's function: ``Impl``/``BoundImpl``/``Observer.fn``, pluggy's ``HookImpl.function``."""

ALLOWED: dict[tuple[str, str], frozenset[str]] = {
    ("_shadow.py", "apply_pending"): frozenset({"op"}),  # queued ledger operations (a retry, an answer)
    ("_shadow.py", "turnguard_check_call"): frozenset({"collect", "count", "own_digest"}),  # per shadow run
    ("_shadow.py", "turnguard_check_outcome"): frozenset({"collect", "polls", "record"}),  # per shadow run
    ("_boards/build.py", "build_all"): frozenset({"make"}),  # the board builders
    ("agents/hook.py", "state_damage"): frozenset({"sound"}),  # each stored field's check
}
"""Loops outside the dispatcher that call what they iterate over, and are no plugin loop: (file,
function) -> the names they call. A shadow run's loop is its ``Driver``'s steps inlined (held
equal by tests/test_driver.py): ``collect`` is its dispatcher's loop."""


def _bound(target: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(target) if isinstance(node, ast.Name)}


def _called(names: set[str], nodes: list[ast.AST]) -> set[str]:
    """What the ``nodes`` call that comes from the loop: a loop name (``fn(...)``), a loop item's
    function field (``impl.fn(...)``, ``impl.function(...)``) or an item of it (``impl[1](...)``)."""
    found = set()
    for node in nodes:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            func = call.func
            if isinstance(func, ast.Name) and func.id in names:
                found.add(func.id)
            elif (isinstance(func, ast.Attribute) and func.attr in CALLABLE_FIELDS
                  and isinstance(func.value, ast.Name) and func.value.id in names):
                found.add(f"{func.value.id}.{func.attr}")
            elif isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in names:
                found.add(f"{func.value.id}[]")
    return found


def calling_loops(source: str) -> list[tuple[str, int, frozenset[str]]]:
    """Every loop (``for``, or a comprehension) that calls what it iterates over: (enclosing
    function, line, what it calls)."""
    tree = ast.parse(source)
    owner: dict[int, str] = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                owner[id(node)] = function.name  # the innermost function wins: it is walked later
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            called = _called(_bound(node.target), list(node.body))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            parts: list[ast.AST] = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            parts += [test for generator in node.generators for test in generator.ifs]
            called = _called(set().union(*(_bound(g.target) for g in node.generators)), parts)
        else:
            continue
        if called:
            found.append((owner.get(id(node), "<module>"), node.lineno, frozenset(called)))
    return found


def pluggy_calls(source: str) -> list[int]:
    """Lines that call a hook through pluggy (``pm.hook.turnguard_x(...)``: pluggy's own loop,
    which stops at the first exception) or read its implementations (``get_hookimpls``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        through_hook = (func.attr.startswith("turnguard_") and isinstance(func.value, ast.Attribute)
                        and func.value.attr == "hook")
        if through_hook or func.attr == "get_hookimpls":
            lines.append(node.lineno)
    return lines


def package_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p != DISPATCHER)


def test_no_module_but_the_dispatcher_loops_over_plugins():
    found, seen = [], set()
    for path in package_files():
        name = path.relative_to(SRC).as_posix()
        for function, line, called in calling_loops(path.read_text(encoding="utf-8")):
            if ALLOWED.get((name, function)) == called or called < ALLOWED.get((name, function), frozenset()):
                seen.add((name, function))
                continue
            found.append(f"{name}:{line} ({function}) calls {sorted(called)}")
    assert found == [], "plugin loops outside the dispatcher (call Dispatcher.collect*/notify*/call_each):\n" + (
        "\n".join(found))
    assert seen == set(ALLOWED), f"ALLOWED names loops that are gone: {sorted(set(ALLOWED) - seen)}"


def test_no_module_but_the_dispatcher_calls_a_hook_through_pluggy():
    found = [f"{path.relative_to(SRC).as_posix()}:{line}" for path in package_files()
             for line in pluggy_calls(path.read_text(encoding="utf-8"))]
    assert found == []


OLD_SHAPES = {
    "the guard's inlined check loop": """
        def check_call(call):
            for name, fn, arg in impls:
                try:
                    verdict = fn(arg, call)
                except PASSTHROUGH:
                    raise
                except BaseException as exc:
                    verdict = turn._dispatch.failed(name, "turnguard_check_call", exc, turn.view)
        """,
    "a snapshot's keyword loop": """
        def states(turn):
            return {name: fn(**{n: turn.view for n in argnames})
                    for name, fn, argnames in turn._dispatch.observers("turnguard_turn_snapshot")}
        """,
    "a loop over named tuples": """
        def observe(impls, call, verdict):
            for impl in impls:
                impl.fn(impl.turn, call, verdict)
        """,
    "a loop over pluggy's implementations, unisolated": """
        def configure(pm, config):
            for impl in pm.hook.turnguard_configure.get_hookimpls():
                impl.function(config=config)
        """,
    "a loop by index": """
        def observe(impls, call):
            for impl in impls:
                impl[1](impl[2], call)
        """,
}


@pytest.mark.parametrize("shape", OLD_SHAPES)
def test_a_plugin_loop_of_any_shape_is_found(shape: str):
    assert calling_loops(textwrap.dedent(OLD_SHAPES[shape]))


def test_a_hook_called_through_pluggy_is_found():
    source = "def end(pm, turn, summary):\n    pm.hook.turnguard_turn_ended(turn=turn, summary=summary)\n"
    assert pluggy_calls(source) == [2]
    assert pluggy_calls("def f(pm):\n    return pm.hook.turnguard_configure.get_hookimpls()\n") == [2]


def _dispatcher_loops() -> dict[str, ast.For]:
    """The dispatcher's plugin loops, by method."""
    tree = ast.parse(DISPATCHER.read_text(encoding="utf-8"))
    loops = {}
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(function):
            if isinstance(node, ast.For) and _called(_bound(node.target), list(node.body)):
                assert function.name not in loops, f"{function.name} holds two plugin loops"
                loops[function.name] = node
    return loops


def test_the_dispatcher_writes_one_loop_per_way_of_calling():
    """Checks by arity (``collect0``..``collect2``: ``fn(turn, *N arguments)``), the hot observers
    (``notify2``, ``notify3``), keyword hooks (``call_each``)."""
    loops = _dispatcher_loops()
    assert set(loops) == {"collect0", "collect1", "collect2", "notify2", "notify3", "call_each"}
    for name, loop in loops.items():
        calls = [n for n in ast.walk(loop) if isinstance(n, ast.Call)
                 and (n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)) == "fn"]
        assert len(calls) == 1, name
        if name != "call_each":
            assert len(calls[0].args) == 1 + int(name[-1]), f"{name} calls fn with the turn and {name[-1]} more"


def _handlers(loop: ast.For) -> list[ast.ExceptHandler]:
    tries = [node for node in ast.walk(loop) if isinstance(node, ast.Try)]
    assert len(tries) == 1
    return tries[0].handlers


@pytest.mark.parametrize("method", ["collect0", "collect1", "collect2", "notify2", "notify3", "call_each"])
def test_every_loop_lets_interrupts_through_and_hands_any_other_failure_to_failed(method: str):
    passthrough, isolation = _handlers(_dispatcher_loops()[method])
    assert isinstance(passthrough.type, ast.Name) and passthrough.type.id in ("PASSTHROUGH", "passthrough")
    assert [type(n) for n in passthrough.body] == [ast.Raise] and passthrough.body[0].exc is None  # type: ignore[attr-defined]
    assert isinstance(isolation.type, ast.Name) and isolation.type.id == "BaseException"
    failed = [n for n in ast.walk(isolation) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr == "failed"]
    assert len(failed) == 1


# -- the tuples the loops take ----------------------------------------------------------------------


def test_compiled_bound_and_observer_implementations_are_named_tuples():
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    d: Dispatcher = guard.dispatcher
    assert d.check_call and all(isinstance(impl, Impl) for impl in (*d.check_cycle, *d.check_call, *d.check_outcome))
    assert [impl.plugin for impl in d.check_call] == ["cap", "streak"]
    assert all(impl.trusted and callable(impl.quiet_rule) for impl in d.check_call)
    checks = d.bind(guard.turn().ledger)
    assert isinstance(checks, BoundChecks)
    assert all(isinstance(impl, BoundImpl) for impl in (*checks.cycle, *checks.call, *checks.outcome))

    class Observing:
        @tg.hookimpl
        def turnguard_turn_ended(self, summary):
            pass

    guard.register(Observing(), name="observing")
    (observer,) = guard.dispatcher.observers("turnguard_turn_ended")
    assert isinstance(observer, Observer) and (observer.plugin, observer.argnames) == ("observing", ("summary",))
    assert Impl._fields == ("plugin", "fn", "trusted", "quiet_rule")
    assert BoundImpl._fields == ("plugin", "fn", "turn") and Observer._fields == ("plugin", "fn", "argnames")


def test_the_dispatcher_module_says_which_loops_there_are():
    for name in ("collect0", "collect1", "collect2", "notify2", "notify3", "call_each"):
        assert f"``{name}``" in (dispatch.__doc__ or "")
