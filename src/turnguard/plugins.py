"""The plugin manager: built-in plugins registered by name, then third-party entry points.

Built-ins can be blocked by name (``GuardConfig.disable_plugins`` or
``TURNGUARD_DISABLE_PLUGINS=streak,otel``). Entry points in the ``turnguard`` group load unless
``GuardConfig.load_entrypoints`` is false or ``TURNGUARD_LOAD_PLUGINS`` says otherwise: empty,
``0`` or ``none`` loads none; a comma-separated list loads only those entry-point names.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from turnguard import hookspecs
from turnguard.hookspecs import PROJECT_NAME

if TYPE_CHECKING:
    from turnguard.config import GuardConfig

ENTRYPOINT_GROUP = PROJECT_NAME
LOAD_PLUGINS_ENV = "TURNGUARD_LOAD_PLUGINS"

DEFAULT_PLUGINS: dict[str, str] = {
    "cap": "turnguard.policies.cap",
    "streak": "turnguard.policies.streak",
    "cycles": "turnguard.policies.cycles",
}
"""Built-in policy modules by name, in hook order (the cap's detection wins ties)."""

PluginFactory = Callable[..., Any]
FACTORY_PLUGINS: dict[str, str] = {
    "otel": "turnguard.telemetry.otel:plugin_for",
    "recorder": "turnguard.telemetry.recorder:plugin_for",
    "shadow": "turnguard.policies.shadow:plugin_for",
}
"""Built-in plugins that hold state per guard: ``module:factory(config, **providers)``;
a factory may return ``None`` when the plugin has nothing to do under ``config``."""


def plugin_manager(
    config: GuardConfig,
    *,
    providers: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> pluggy.PluginManager:
    """A fresh manager with turnguard's specs, built-ins, and (if allowed) entry-point plugins."""
    environ = os.environ if environ is None else environ
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in config.disable_plugins:
        pm.set_blocked(name)
    for name, target in reversed(FACTORY_PLUGINS.items()):
        if pm.is_blocked(name):
            continue
        plugin = _factory(target)(config, **dict(providers or {}))
        if plugin is not None:
            pm.register(plugin, name=name)
    if config.load_entrypoints:
        _load_entrypoints(pm, environ.get(LOAD_PLUGINS_ENV))
    for name, module in reversed(DEFAULT_PLUGINS.items()):
        if not pm.is_blocked(name):
            pm.register(importlib.import_module(module), name=name)
    pm.check_pending()
    return pm


def _factory(target: str) -> PluginFactory:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        return lambda config, **_: None


def _load_entrypoints(pm: pluggy.PluginManager, selection: str | None) -> None:
    if selection is None:
        pm.load_setuptools_entrypoints(ENTRYPOINT_GROUP)
        return
    names = [n.strip() for n in selection.split(",") if n.strip()]
    if not names or names in (["0"], ["none"]):
        return
    for name in names:
        pm.load_setuptools_entrypoints(ENTRYPOINT_GROUP, name=name)


def describe(pm: pluggy.PluginManager) -> list[dict[str, Any]]:
    """Each loaded plugin: name, where it comes from (built-in or distribution), its hooks."""
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        source = f"{dist.project_name} {dist.version}" if dist else "built-in" if _builtin(name) else "code"
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or ())
        rows.append({"name": name, "source": source, "hooks": hooks})
    return rows


def _builtin(name: str) -> bool:
    return name in DEFAULT_PLUGINS or name in FACTORY_PLUGINS
