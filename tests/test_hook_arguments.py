"""Hook arguments are matched by name (pluggy's rule): every hook hands each argument under its
spec name, whatever subset and order an implementation lists, and the dispatcher's positional
orders are the specs' own. The names themselves are frozen in ``tests/test_hookspecs.py``."""

from __future__ import annotations

import inspect
from typing import Any

import pluggy

import turnguard as tg
from test_hookspecs import LIFECYCLE_HOOKS, OBSERVER_HOOKS, specs
from test_plugin_isolation import HOOKS, Raising, drive_every_hook
from turnguard import hookspecs
from turnguard._dispatch import CHECK_HOOKS, HOT_OBSERVERS, PLUGIN_ERROR
from turnguard._ledger import LedgerView
from turnguard._task_results import ResultLabels

EXPECTED: dict[str, tuple[type, ...]] = {
    "turn": (LedgerView,),
    "config": (tg.GuardConfig,),
    "call": (tg.ToolCall,),
    "outcome": (tg.Outcome,),
    "verdict": (tg.Verdict,),
    "event": (tg.LoopDetectedEvent,),
    "response": (str,),
    "summary": (tg.TurnSummary,),
    "plugin": (str,),
    "hook": (str,),
    "error": (BaseException,),
    "policy": (str,),
    "turn_id": (str,),
    "resolved": (bool,),
    "status": (str,),
    "labels": (ResultLabels,),
    "state": (dict,),
    "reason": (str,),
}
"""What each argument name carries in ``drive_every_hook`` (every hook fires there, with a value)."""


def test_the_dispatchers_positional_orders_are_the_specs_argument_names():
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for hook, order in {**CHECK_HOOKS, **HOT_OBSERVERS}.items():
        spec = getattr(pm.hook, hook).spec
        assert spec is not None and tuple(spec.argnames) == order, hook
    assert PLUGIN_ERROR in specs()


def test_every_argument_name_has_an_expected_value():
    assert {n for names in (*LIFECYCLE_HOOKS.values(), *OBSERVER_HOOKS.values()) for n in names} == set(EXPECTED)


class Everything:
    """Implements every hook, taking all its arguments by name in reverse order, and keeps them
    (``turnguard_turn_snapshot`` answers a state, so that ``turnguard_turn_resumed`` gets one)."""

    def __init__(self) -> None:
        self.heard: dict[str, list[dict[str, Any]]] = {}
        for hook, spec in specs().items():
            names = list(reversed(inspect.signature(spec).parameters))
            setattr(self, hook, tg.hookimpl(specname=hook)(self._recorder(hook, names)))

    def _recorder(self, hook: str, names: list[str]) -> Any:
        """A function whose parameters are ``names`` (pluggy reads them from its code)."""
        heard = self.heard

        def record(kwargs: dict[str, Any]) -> Any:
            heard.setdefault(hook, []).append(kwargs)
            return {"kept": True} if hook == "turnguard_turn_snapshot" else None

        namespace: dict[str, Any] = {}
        exec(f"def {hook}({', '.join(names)}):\n    return record({{{', '.join(f'{n!r}: {n}' for n in names)}}})",
             {"record": record}, namespace)
        return namespace[hook]


def test_every_hook_hands_each_argument_by_its_name_in_any_order():
    everything = Everything()
    drive_every_hook("open", {"everything": everything, "trigger": Raising("turnguard_turn_ended", RuntimeError())})
    assert set(everything.heard) == set(HOOKS)
    wrong = [f"{hook}({name}={type(value).__name__})" for hook, calls in everything.heard.items()
             for kwargs in calls for name, value in kwargs.items() if not isinstance(value, EXPECTED[name])]
    assert wrong == []
    resumed = everything.heard["turnguard_turn_resumed"]
    assert resumed and all(kwargs["state"] == {"kept": True} for kwargs in resumed)  # its own state, by name
