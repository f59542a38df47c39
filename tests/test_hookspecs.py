"""The plugin contract: the hooks of docs/usage.md's hook table, documented, under the project name."""

from __future__ import annotations

import inspect

import pluggy

import turnguard as tg
from turnguard import hookspecs

LIFECYCLE_HOOKS = {
    "turnguard_configure": ["config"],
    "turnguard_turn_started": ["turn"],
    "turnguard_check_cycle": ["turn"],
    "turnguard_check_call": ["turn", "call"],
    "turnguard_check_outcome": ["turn", "call", "outcome"],
    "turnguard_loop_detected": ["turn", "event"],
    "turnguard_escalation_resolved": ["turn", "event", "response"],
    "turnguard_retry": ["turn"],
    "turnguard_turn_ended": ["turn", "summary"],
}
OBSERVER_HOOKS = {
    "turnguard_cycle_checked": ["turn", "verdict"],
    "turnguard_call_checked": ["turn", "call", "verdict"],
    "turnguard_outcome_recorded": ["turn", "call", "outcome", "verdict"],
    "turnguard_plugin_error": ["turn", "plugin", "hook", "error"],
    "turnguard_outcome_ignored": ["turn", "call", "outcome", "reason"],
    "turnguard_shadow_detected": ["turn", "policy", "event"],
    "turnguard_shadow_turn_ended": ["turn", "policy", "summary"],
    "turnguard_turn_result": ["turn_id", "summary", "resolved", "status", "labels"],
    "turnguard_turn_suspended": ["turn", "summary"],
    "turnguard_turn_snapshot": ["turn"],
    "turnguard_turn_resumed": ["turn", "state"],
}


def specs() -> dict[str, object]:
    return {n: f for n, f in vars(hookspecs).items() if n.startswith("turnguard_") and callable(f)}


def test_every_lifecycle_and_check_hook_and_every_observer_hook_is_specified_with_its_arguments():
    found = {name: list(inspect.signature(fn).parameters) for name, fn in specs().items()}
    assert found == {**LIFECYCLE_HOOKS, **OBSERVER_HOOKS}


def test_every_spec_has_a_docstring():
    assert all(inspect.getdoc(fn) for fn in specs().values())


def test_the_project_name_is_turnguard_and_the_markers_are_exported():
    assert hookspecs.PROJECT_NAME == "turnguard"
    assert tg.hookimpl is hookspecs.hookimpl and tg.hookspec is hookspecs.hookspec
    pm = pluggy.PluginManager("turnguard")
    pm.add_hookspecs(hookspecs)
    assert set(LIFECYCLE_HOOKS) | set(OBSERVER_HOOKS) <= {n for n in dir(pm.hook) if n.startswith("turnguard_")}


def test_configure_is_historic():
    pm = pluggy.PluginManager("turnguard")
    pm.add_hookspecs(hookspecs)
    pm.hook.turnguard_configure.call_historic(kwargs={"config": tg.GuardConfig(soft_cap=3)})
    seen = []

    class Late:
        @tg.hookimpl
        def turnguard_configure(self, config):
            seen.append(config.soft_cap)

    pm.register(Late())
    assert seen == [3]
