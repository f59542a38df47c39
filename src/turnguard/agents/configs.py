"""The configuration of a hook event, and the long-lived server's memory of it (``Configs``).

An event's configuration is that of the folder the agent ran the hook in (``turnguard.toml``, or
a ``pyproject.toml`` with ``[tool.turnguard]``, there or in the nearest folder above; or
``$TURNGUARD_CONFIG``) and of its ``TURNGUARD_*`` variables. Reading it parses TOML (a project's
whole ``pyproject.toml``, to learn whether it configures turnguard) and builds the configuration
twice over, which cost the server more than the rest of an event. So the server keeps it per
folder and variables, with the identity of every file the search looks at, and reads it again
when any of them changed, appeared or went.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnguard._config import CONFIG_ENV, ENV_PREFIX, GuardConfig

CONFIG_FILES = ("turnguard.toml", "pyproject.toml")
"""The names ``GuardConfig.load`` looks for in each folder from the event's up."""


@dataclass(frozen=True, slots=True)
class Settings:
    """``config``: what the user set (``fail_mode``, ``key_mode``, the exporter's settings);
    ``live``: the hook's guard's, with the policies only (and the entry points' plugins when a
    distribution declares one)."""

    config: GuardConfig
    live: GuardConfig


def read(environ: Mapping[str, str], search: str, hooks_dir: Path) -> Settings:
    """The event's settings, read now. ``ConfigError`` when the configuration is bad."""
    config = GuardConfig.load(environ=environ, search=search)
    return Settings(config, live_config(config, hooks_dir))


def live_config(config: GuardConfig, hooks_dir: Path) -> GuardConfig:
    from turnguard._plugins import policies_only

    scan = config.load_entrypoints and plugins_installed(hooks_dir)
    return policies_only(config).replace(load_entrypoints=scan)


class Configs:
    """The settings of the events a process answered, by folder and ``TURNGUARD_*`` variables,
    each with the identity of the files it was read from. Bounded; thread-safe."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._kept: OrderedDict[Any, tuple[Any, Settings]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, environ: Mapping[str, str], search: str, hooks_dir: Path) -> Settings:
        variables = tuple(sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX)))
        key = (os.path.abspath(search), variables, str(hooks_dir))
        stamp = (files_stamp(environ, search), _path_stamp())
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        settings = read(environ, search, hooks_dir)
        with self._lock:
            self._kept[key] = (stamp, settings)
            self._kept.move_to_end(key)
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)
        return settings


def files_stamp(environ: Mapping[str, str], search: str) -> tuple[Any, ...]:
    """The identity of each file ``GuardConfig.load`` would look at for this event."""
    explicit = environ.get(CONFIG_ENV)
    if explicit:
        return (_identity(os.path.abspath(explicit)),)
    folder = Path(os.path.abspath(search))
    return tuple(_identity(str(place / name)) for place in (folder, *folder.parents) for name in CONFIG_FILES)


def _identity(path: str) -> Any:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return ("unreadable", exc.errno)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _path_stamp() -> list[list[Any]]:
    """The import path's folders with their modification times (installing or removing a
    distribution changes its folder's): whether one declares an entry point may have changed."""
    return [[p, _mtime_ns(p)] for p in sys.path if p]


def plugins_installed(directory: Path) -> bool:
    """Whether any distribution declares a ``turnguard`` entry point: the answer of the last scan,
    kept in ``directory/entrypoints.json`` with ``_path_stamp``, scanned again when it differs.
    Scanning every distribution's metadata costs a hook more than the rest of its work."""
    key = _path_stamp()
    cache = directory / "entrypoints.json"
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved.get("key") == key and isinstance(saved.get("installed"), bool):
            return bool(saved["installed"])
    except (OSError, ValueError, AttributeError, RecursionError):  # (damaged: scanned again)
        pass
    from turnguard._plugins import installed_entrypoints

    installed = bool(installed_entrypoints())
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = directory / f".entrypoints.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps({"key": key, "installed": installed}), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError:
        pass
    return installed


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
