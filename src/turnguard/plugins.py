"""The plugin manager: built-in plugins registered by name, then third-party entry points.

Built-ins can be blocked by name (``GuardConfig.disable_plugins`` or
``TURNGUARD_DISABLE_PLUGINS=streak,otel``). Entry points in the ``turnguard`` group load unless
``GuardConfig.load_entrypoints`` is false or ``TURNGUARD_LOAD_PLUGINS`` says otherwise: empty,
``0``, ``none``, ``false`` or ``off`` loads none; a comma-separated list loads only those
entry-point names; unset, ``1`` or ``all`` loads every one. A plugin that cannot be imported or
started is logged and left out: it never stops the guard (or the host) from working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from turnguard import hookspecs
from turnguard.hookspecs import PROJECT_NAME

if TYPE_CHECKING:
    from turnguard.config import GuardConfig

log = logging.getLogger("turnguard")

ENTRYPOINT_GROUP = PROJECT_NAME
LOAD_PLUGINS_ENV = "TURNGUARD_LOAD_PLUGINS"

DEFAULT_PLUGINS: dict[str, str] = {
    "cap": "turnguard.policies.cap",
    "streak": "turnguard.policies.streak",
    "cycles": "turnguard.policies.cycles",
}
"""Built-in policy modules by name, in hook order among themselves (the cap's detection wins ties
over the streak's). Plugins given to ``Guard(plugins=)`` or ``Guard.register`` run before them (and win
ties); entry-point plugins run after them."""

PluginFactory = Callable[..., Any]
FACTORY_PLUGINS: dict[str, str] = {
    "otel": "turnguard.telemetry.otel:plugin_for",
    "recorder": "turnguard.telemetry.recorder:plugin_for",
    "shadow": "turnguard.shadow:plugin_for",
}
"""Built-in plugins that hold state per guard, none of them a policy (they report, record, or
evaluate other configurations without acting): ``module:factory(config, plugin_manager=pm,
**providers)``, where ``pm`` is the manager being built (for a plugin that calls hooks itself);
a factory may return ``None`` when the plugin has nothing to do under ``config``."""

NON_POLICY_PLUGINS: tuple[str, ...] = tuple(FACTORY_PLUGINS)
"""The built-in plugins that are not policies: disable these (``policies_only``) and what is
left of the built-ins decides and nothing else."""


def policies_only(config: GuardConfig) -> GuardConfig:
    """``config`` with every built-in plugin that is not a policy disabled and no entry points:
    the guard a replay, a shadow or a test of the policies needs."""
    disabled = tuple(dict.fromkeys((*config.disable_plugins, *NON_POLICY_PLUGINS)))
    return config.replace(disable_plugins=disabled, load_entrypoints=False)


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
        plugin = _create(name, target, config, {**(providers or {}), "plugin_manager": pm})
        if plugin is not None:
            pm.register(plugin, name=name)
    if config.load_entrypoints:
        _load_entrypoints(pm, environ.get(LOAD_PLUGINS_ENV))
    for name, module in reversed(DEFAULT_PLUGINS.items()):
        if not pm.is_blocked(name):
            pm.register(importlib.import_module(module), name=name)
    _check_pending(pm)
    return pm


def _check_pending(pm: pluggy.PluginManager) -> None:
    """``pm.check_pending()``; a loaded plugin implementing an unknown hook is reported and
    unregistered (a typo in a third-party package must not stop the guard)."""
    for _ in range(len(pm.get_plugins()) + 1):
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or repr(exc.plugin)
            log.error("turnguard: plugin %r left out: %s", name, exc)
            pm.unregister(exc.plugin)


def _create(name: str, target: str, config: GuardConfig, providers: Mapping[str, Any]) -> object | None:
    """Build a factory plugin; one that is not installed or fails is left out (and logged)."""
    module, _, attr = target.partition(":")
    try:
        factory: PluginFactory = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            log.debug("turnguard: built-in plugin %r not available (%s)", name, exc)
        else:
            log.warning("turnguard: built-in plugin %r left out: %r", name, exc)
        return None
    except Exception as exc:  # a broken optional plugin must not stop the guard
        log.warning("turnguard: built-in plugin %r left out: %r", name, exc, exc_info=exc)
        return None
    try:
        return factory(config, **dict(providers))
    except Exception as exc:  # nor one that fails to start
        log.warning("turnguard: built-in plugin %r failed to start: %r", name, exc, exc_info=exc)
        return None


_ALL = frozenset({"1", "all", "true", "yes", "on", "*"})
_NONE = frozenset({"", "0", "none", "false", "no", "off"})


def entrypoint_selection(value: str | None) -> frozenset[str] | None:
    """What ``TURNGUARD_LOAD_PLUGINS`` asks for: ``None`` = all entry points, else these names."""
    if value is None or value.strip().lower() in _ALL:
        return None
    if value.strip().lower() in _NONE:
        return frozenset()
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _load_entrypoints(pm: pluggy.PluginManager, selection: str | None) -> None:
    """Load the ``turnguard`` entry points one by one, so that one broken distribution is
    reported and skipped instead of stopping the guard."""
    wanted = entrypoint_selection(selection)
    if wanted is not None and not wanted:
        return
    names = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRYPOINT_GROUP)})
    for name in names:
        if wanted is not None and name not in wanted:
            continue
        try:
            pm.load_setuptools_entrypoints(ENTRYPOINT_GROUP, name=name)
        except Exception as exc:  # a third-party plugin that cannot load is left out
            log.error("turnguard: entry-point plugin %r could not be loaded: %r", name, exc, exc_info=exc)


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
