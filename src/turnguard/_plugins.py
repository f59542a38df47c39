"""The plugin manager: built-in plugins registered by name, then third-party entry points.

Built-ins can be blocked by name (``GuardConfig.disable_plugins`` or
``TURNGUARD_DISABLE_PLUGINS=streak,otel``). Entry points in the ``turnguard`` group load unless
``GuardConfig.load_entrypoints`` is false or ``TURNGUARD_LOAD_PLUGINS`` says otherwise: empty,
``0``, ``none``, ``false`` or ``off`` loads none; a comma-separated list loads only those
entry-point names; unset, ``1`` or ``all`` loads every one. A name in that list that no installed
entry point has (a typo, ``bogus``) is a ``ConfigError``, as a bad value of any setting is: the
guard would otherwise run without the plugin it was asked for.

A plugin that cannot be imported or started is left out: it never stops the guard (or the host)
from working. It is logged once per process in one line (the traceback at DEBUG), not once per
``Guard``, and ``describe`` lists it as failed. The names turnguard registers plugins under itself
(``builtin_names``) are its own: an entry point that takes one is not imported, left out and
listed as failed alike, and the built-in keeps the name (else one installed package could replace
the cap, or crash every guard). Disabling a plugin that is not installed is a normal fleet
setting: one WARNING per process, and ``describe`` lists it as not found.
"""

from __future__ import annotations

import enum
import importlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from turnguard import hookspecs
from turnguard._config import ConfigError
from turnguard.hookspecs import PROJECT_NAME

if TYPE_CHECKING:
    from turnguard._config import GuardConfig

log = logging.getLogger("turnguard")

ENTRYPOINT_GROUP = PROJECT_NAME
PASSTHROUGH: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)
"""What a plugin may raise through the guard; any other ``BaseException`` is the plugin's failure
(``GeneratorExit`` or a class of its own included)."""
LOAD_PLUGINS_ENV = "TURNGUARD_LOAD_PLUGINS"

DEFAULT_PLUGINS: dict[str, str] = {
    "cap": "turnguard._policies.cap",
    "streak": "turnguard._policies.streak",
    "cycles": "turnguard._policies.cycles",
    "cycle_repeat": "turnguard._policies.cycle_repeat",
}
"""Built-in policy modules by name, in hook order among themselves (the cap's detection wins ties
over the streak's). Plugins given to ``Guard(plugins=)`` or ``Guard.register`` run before them (and win
ties); entry-point plugins run after them."""

PluginFactory = Callable[..., Any]
"""``factory(config, plugin_manager=pm, **providers)``: a built-in plugin for one guard, where
``pm`` is the manager being built (for a plugin that calls hooks itself); it may return ``None``
when the plugin has nothing to do under ``config``."""

NON_POLICY_PLUGINS: tuple[str, ...] = ("otel", "recorder", "shadow")
"""The built-in plugins that are not policies, in hook order: they hold state per guard and
report, record, or evaluate other configurations without acting. Disable these
(``policies_only``) and what is left of the built-ins decides and nothing else."""

FACTORY_PLUGINS: dict[str, PluginFactory | None] = dict.fromkeys(NON_POLICY_PLUGINS)
"""Each non-policy built-in's ``PluginFactory``. Their modules sit above this one (the shadows
above the guard, telemetry above the shadows), so this module only names them: the package
registers each factory from above (``register_factory``, in ``turnguard/__init__.py``, which runs
before any of its modules is used). A name without a factory is skipped."""


MAIN_HALTS_PLUGIN = "turnguard-main-halts"
"""The name of the plugin a probe guard notes the main configuration's halts with (``_guard``)."""


def builtin_names() -> frozenset[str]:
    """Every name turnguard registers a plugin under itself; no entry point may take one."""
    return frozenset((*DEFAULT_PLUGINS, *FACTORY_PLUGINS, MAIN_HALTS_PLUGIN))


def register_factory(name: str, factory: PluginFactory) -> None:
    """Build the built-in plugin ``name`` with ``factory`` in every manager made from now on
    (registered from the modules above this one, which this one never imports)."""
    if not callable(factory):
        raise TypeError(f"the factory of the built-in plugin {name!r} must be callable, got {type(factory).__name__}")
    FACTORY_PLUGINS[name] = factory


def disabled_policies(config: GuardConfig) -> tuple[str, ...]:
    """The built-in policies ``config`` turns off (``disable_plugins``), sorted: what a replay of
    its turns must turn off too (calibrate reads them from the recording)."""
    return tuple(sorted(name for name in set(config.disable_plugins) if name in DEFAULT_PLUGINS))


def policies_only(config: GuardConfig) -> GuardConfig:
    """``config`` with every built-in plugin that is not a policy disabled and no entry points:
    the guard a replay, a shadow or a test of the policies needs."""
    disabled = tuple(dict.fromkeys((*config.disable_plugins, *NON_POLICY_PLUGINS)))
    return config.replace(disable_plugins=disabled, load_entrypoints=False)


class PluginStatus(enum.StrEnum):
    """What ``describe`` says of a plugin besides its hooks."""

    LOADED = "loaded"
    DISABLED = "disabled"
    NOT_FOUND = "not found"
    FAILED = "failed"


_LEFT_OUT: weakref.WeakKeyDictionary[pluggy.PluginManager, dict[str, tuple[str, str]]] = (
    weakref.WeakKeyDictionary())
"""For each manager, the plugins left out because they failed: name -> (source, why)."""
_SAID: set[tuple[str, ...]] = set()
_SAID_LOCK = threading.Lock()
MAX_REASON_LENGTH = 200
"""Characters of a plugin's error text that a log line or ``describe`` keeps."""


def _first_time(*problem: str) -> bool:
    """Whether ``problem`` is met for the first time in this process (each is logged once)."""
    with _SAID_LOCK:
        if problem in _SAID:
            return False
        _SAID.add(problem)
        return True


def _reason(exc: BaseException) -> str:
    """An exception as one bounded line: ``Type: text``."""
    try:
        text = " ".join(str(exc).split())
    except PASSTHROUGH:
        raise
    except BaseException:  # (an exception whose text raises: its type is what can be said)
        text = ""
    if len(text) > MAX_REASON_LENGTH:
        text = text[: MAX_REASON_LENGTH - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _left_out(pm: pluggy.PluginManager, name: str, source: str, why: str, kind: str,
              exc: BaseException | None = None) -> None:
    """``name`` failed and is left out of ``pm``: noted for ``describe``, logged once per process."""
    _LEFT_OUT.setdefault(pm, {})[name] = (source, why)
    if _first_time(kind, name, why):
        log.error("turnguard: %s %r left out: %s", kind, name, why)
    if exc is not None:
        log.debug("turnguard: %s %r left out", kind, name, exc_info=exc)


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
    for name, factory in reversed(FACTORY_PLUGINS.items()):
        if factory is None or pm.is_blocked(name):
            continue
        plugin = _create(name, factory, config, {**(providers or {}), "plugin_manager": pm})
        if plugin is not None:
            pm.register(plugin, name=name)
    if config.load_entrypoints:
        selection = environ.get(LOAD_PLUGINS_ENV)
        others = [name for name in config.disable_plugins if not _builtin(name)]
        if entrypoint_selection(selection) != frozenset() or others:  # (else nothing to scan for)
            installed = installed_entrypoints()
            _load_entrypoints(pm, selection, installed)
            _warn_not_installed(others, installed)
    for name, module in reversed(DEFAULT_PLUGINS.items()):
        if not pm.is_blocked(name):
            pm.register(importlib.import_module(module), name=name)
    _check_pending(pm)
    return pm


def installed_entrypoints() -> dict[str, str]:
    """The installed entry points of the ``turnguard`` group: name -> the distribution (``name
    version``) that declares it."""
    import importlib.metadata  # here: importing it costs ~0.1 s at start-up, and most runs scan for none

    found: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRYPOINT_GROUP):
        dist = getattr(ep, "dist", None)
        found.setdefault(ep.name, f"{dist.name} {dist.version}" if dist is not None else "entry point")
    return found


def _warn_not_installed(disabled: Iterable[str], installed: Mapping[str, str]) -> None:
    """Disabling a plugin that is not installed (a normal fleet setting; ``disabled``: the names
    that are not built-ins): one WARNING per process."""
    for name in disabled:
        if name not in installed and _first_time("not installed", name):
            log.warning("turnguard: disabled plugin %r is not installed (no built-in or entry-point plugin has "
                        "that name)", name)


def _check_pending(pm: pluggy.PluginManager) -> None:
    """``pm.check_pending()``; a loaded plugin implementing an unknown hook is reported and
    unregistered (a typo in a third-party package must not stop the guard)."""
    dists = {id(plugin): f"{dist.project_name} {dist.version}" for plugin, dist in pm.list_plugin_distinfo()}
    for _ in range(len(pm.get_plugins()) + 1):
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or repr(exc.plugin)
            _left_out(pm, name, dists.get(id(exc.plugin), "code"), _reason(exc), "plugin", exc)
            pm.unregister(exc.plugin)


def _create(name: str, factory: PluginFactory, config: GuardConfig, providers: Mapping[str, Any]) -> object | None:
    """Build a factory plugin; one that cannot be imported (a factory imports its module when
    first called) or fails to start is left out (and logged): it must not stop the guard."""
    try:
        return factory(config, **dict(providers))
    except PASSTHROUGH:
        raise
    except BaseException as exc:  # a broken built-in plugin must not stop the guard
        _left_out(providers["plugin_manager"], name, "built-in", _reason(exc), "built-in plugin", exc)
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


def check_selection(selection: str | None, installed: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """``entrypoint_selection``, refusing a name that no installed entry point has
    (``ConfigError`` naming ``TURNGUARD_LOAD_PLUGINS``, the value and what it accepts)."""
    wanted = entrypoint_selection(selection)
    if not wanted:
        return wanted
    installed = installed_entrypoints() if installed is None else installed
    unknown = sorted(wanted - set(installed))
    if unknown:
        names = ", ".join(sorted(installed)) or "none is installed"
        raise ConfigError(LOAD_PLUGINS_ENV, selection, f"1/all, 0/none, or names of installed entry-point plugins, "
                                                       f"comma-separated ({names}); {', '.join(unknown)} is not one",
                          source=LOAD_PLUGINS_ENV)
    return wanted


TAKEN_NAME = "its name is a built-in plugin's, which keeps it: rename the entry point"
"""Why an entry point named like a built-in plugin is left out."""


def _load_entrypoints(pm: pluggy.PluginManager, selection: str | None, installed: Mapping[str, str]) -> None:
    """Load the ``turnguard`` entry points one by one, so that one broken distribution is
    reported and skipped instead of stopping the guard."""
    wanted = check_selection(selection, installed)
    if wanted is not None and not wanted:
        return
    builtins = builtin_names()
    for name in sorted(installed):
        if wanted is not None and name not in wanted:
            continue
        if name in builtins:
            _left_out(pm, name, installed[name], TAKEN_NAME, "entry-point plugin")
            continue
        try:
            pm.load_setuptools_entrypoints(ENTRYPOINT_GROUP, name=name)
        except PASSTHROUGH:
            raise
        except BaseException as exc:  # a third-party plugin that cannot load is left out
            _left_out(pm, name, installed[name], _reason(exc), "entry-point plugin", exc)


def describe(pm: pluggy.PluginManager) -> list[dict[str, Any]]:
    """Each plugin ``pm`` knows of: name, where it comes from (built-in, a distribution, code),
    its ``status`` (a ``PluginStatus``: loaded; disabled; not found, for a disabled name nothing
    installed has; failed, with ``why``), and its hooks (loaded plugins only)."""
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    failed = _LEFT_OUT.get(pm, {})
    installed: dict[str, str] | None = None
    rows: list[dict[str, Any]] = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked
            if installed is None:
                installed = installed_entrypoints()
            found = _builtin(name) or name in installed
            rows.append({"name": name, "source": "built-in" if _builtin(name) else installed.get(name, "-"),
                         "status": PluginStatus.DISABLED if found else PluginStatus.NOT_FOUND, "hooks": []})
            continue
        dist = dists.get(id(plugin))
        source = f"{dist.project_name} {dist.version}" if dist else "built-in" if _builtin(name) else "code"
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or ())
        rows.append({"name": name, "source": source, "status": PluginStatus.LOADED, "hooks": hooks})
    listed = {(row["name"], row["source"]) for row in rows}
    for name, (source, why) in failed.items():
        if (name, source) not in listed:
            rows.append({"name": name, "source": source, "status": PluginStatus.FAILED, "why": why, "hooks": []})
    return rows


def _builtin(name: str) -> bool:
    return name in builtin_names()
