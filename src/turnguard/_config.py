"""``GuardConfig``: the thresholds, with validation and loading from code, env and TOML.

Precedence when loading (``GuardConfig.load``): defaults < TOML file < ``TURNGUARD_*``
environment variables < keyword arguments. Every invalid input raises ``ConfigError`` naming the
key, the value, what is accepted and where the value came from (the file, the variable); an
unknown option name is answered with the closest known one ("did you mean 'soft_cap'?").
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import functools
import logging
import math
import os
import select
import stat
import time
import tomllib
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeAlias

from turnguard._keys import KEY_MODES
from turnguard._model import ALL_TOOLS
from turnguard._probe import selects

STUCK_SIGNALS: tuple[str, ...] = ("repeat", "stale_repeat")
"""Names of the stuck signals the adaptive cap can use past the soft cap; the default first.

``repeat``: some key seen ``stuck_repeat_threshold`` times anywhere in the turn (the seed's).
``stale_repeat``: some key seen that many times since the latest call whose key is seen only
once in the turn (a re-run after an edit does not count; a loop, whose calls all come round, does).
"""
STREAK_STOP_ON: tuple[str, ...] = ("error", "any")
"""What the streak's stop level counts: identical calls that failed (the seed's), or identical
calls with any outcome but ``DENIED`` (loops whose call "succeeds" uselessly every time)."""

FAIL_MODES = ("open", "closed")
ENV_PREFIX = "TURNGUARD_"
log = logging.getLogger("turnguard")


class ConfigError(ValueError):
    """An invalid configuration value: ``key``, ``value``, what is ``accepted``, and the ``source``
    it came from (a file path, an environment variable; ``None``: code)."""

    def __init__(self, key: str, value: Any, accepted: str, *, source: str | None = None) -> None:
        self.key, self.value, self.accepted, self.source = key, value, accepted, source
        super().__init__(key, value, accepted)

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source and self.source != self.key else ""
        return f"{where}{self.key!r}: got {_short(self.value)}; expected {self.accepted}"

    def within(self, source: str) -> ConfigError:
        """This error, said to come from ``source`` (kept when it already names one)."""
        if self.source is None:
            self.source = source
        return self


class UnknownOptionError(ConfigError):
    """A key that names no option, with the closest option names (``suggestions``, ``closest``).

    ``prefix`` is what the key and the known names share and is no part of a typo (``TURNGUARD_``,
    ``probe.``); ``aliases`` maps words people use for an option to it (``fraction``: ``rate``)."""

    def __init__(self, key: str, value: Any, known: Iterable[str], *, source: str | None = None, prefix: str = "",
                 aliases: Mapping[str, str] | None = None) -> None:
        known = sorted(known)
        typed = key.removeprefix(prefix)
        alias = (aliases or {}).get(_normal(typed))
        self.suggestions = (alias,) if alias in known else closest(typed, known, prefix=prefix)
        super().__init__(key, value, f"one of {', '.join(known)}", source=source)

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source and self.source != self.key else ""
        if self.suggestions:
            return f"{where}unknown option {self.key!r}: did you mean {self.suggestions[0]!r}?"
        return f"{where}unknown option {self.key!r}; expected {self.accepted}"


def closest(typed: str, known: Iterable[str], *, prefix: str = "", n: int = 3) -> tuple[str, ...]:
    """The ``known`` names nearest to ``typed`` by edit distance (insertions, deletions, substitutions,
    swaps of two neighbours; case, ``-`` and ``_`` aside, ``prefix`` left out of both), among the
    ones close enough to be a typo of it: one edit away, or ``difflib``'s similarity at least 0.6."""
    word = _normal(typed.removeprefix(prefix))
    ranked = []
    for name in known:
        other = _normal(name.removeprefix(prefix))
        distance = _edits(word, other)
        similarity = difflib.SequenceMatcher(None, word, other).ratio()
        if distance <= 1 or similarity >= 0.6:
            ranked.append((distance, -similarity, name))
    return tuple(name for *_, name in sorted(ranked)[:n])


def _normal(name: str) -> str:
    return name.lower().replace("-", "_")


def _edits(a: str, b: str) -> int:
    """The optimal-string-alignment distance between ``a`` and ``b`` (Damerau-Levenshtein without
    edits of a swapped pair): what a typo costs."""
    before: list[int] = []
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, previous = previous, current
    return previous[-1]


class ConfigFileError(ConfigError):
    """A configuration file that cannot be read or parsed: ``key`` is its path."""

    def __str__(self) -> str:
        return f"{self.key}: {self.value} (expected {self.accepted})"


def _short(value: Any, width: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a bad value's own repr must not hide what was wrong with it
        text = f"a {type(value).__qualname__} (its repr raised)"
    if type(text) is not str:  # (a repr returning a str subclass)
        text = str.__str__(text)
    return text if len(text) <= width else text[: width - 3] + "..."


ShadowPolicies: TypeAlias = (
    "Mapping[str, GuardConfig | Mapping[str, Any]] | Sequence[tuple[str, GuardConfig | Mapping[str, Any]]]"
)
"""What ``GuardConfig.shadow`` takes: shadow policies by name, as a mapping or as (name, policy) pairs,
each a ``GuardConfig`` or a mapping of options; it keeps them as a tuple of pairs."""


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """Thresholds and switches of a guard. Defaults are the two seeds' values.

    A configuration remembers which options its caller set (``given``): keyword arguments, the
    keys of a mapping, TOML table or ``TURNGUARD_*`` variables it was loaded from, and what
    ``replace`` changed. A whole ``GuardConfig`` given as a probe's configuration means those
    options over the main configuration, so a probe differs from it only where the operator
    said so.
    """

    name: str = "default"
    """The policy's name: ``turnguard.policy`` on every metric point and span, so a threshold change
    under a new name is a new series, not a mix (bounded like tool names, at most 64 characters, no
    control characters or surrogates: ``NAME_ACCEPTED``)."""
    max_tool_calls_per_turn: int | None = None
    """Explicit hard cap N (call N+1 halts). ``None``: the adaptive cap. ``<= 0``: no cap."""
    soft_cap: int = 100
    """S: past S calls the turn continues only while it is not stuck. ``<= 0`` disables the cap."""
    hard_multiplier: float = 10
    """H = S * m: the absolute backstop of the adaptive cap."""
    stuck_repeat_threshold: int = 6
    """D: a key seen D times in the turn marks it stuck (the ``repeat`` signal)."""
    stuck_signal: str = "repeat"
    """Which stuck signal gates the adaptive cap; one of ``STUCK_SIGNALS``."""
    streak_warn_at: int = 5
    """Warn when this many identical calls come in a row (0 disables)."""
    streak_stop_at: int = 8
    """Stop when this many identical calls in a row have failed (0 disables)."""
    streak_stop_on: str = "error"
    """``error``: the stop level counts failed identical calls; ``any``: identical calls with any
    outcome but ``DENIED`` (denials neither count nor reset)."""
    max_cycles_per_turn: int = 0
    """Model requests allowed per turn; request N+1 halts. 0: unbounded."""
    cycle_repeat_warn_at: int = 0
    """Warn when the turn's last calls repeat a cycle of 2 to ``cycle_repeat_max_period`` calls
    this many times (A,B,A,B... ; 0 disables; ``recommended``: 5)."""
    cycle_repeat_stop_at: int = 0
    """Stop when a cycle has been repeated this many times (0 disables; ``recommended``: 8)."""
    cycle_repeat_max_period: int = 4
    """The longest cycle ``cycle_repeat`` looks for, in calls (2 to 16)."""
    key_mode: str = "canonical"
    """``canonical`` (JSON-canonical arguments) or ``bytes`` (as given, the second seed's)."""
    remind_model: bool = False
    """Opt in to ``REMIND`` (a message for the model) at the streak warn level."""
    fail_mode: str = "open"
    """A plugin that raises is ignored (``open``) or halts the turn (``closed``)."""
    max_tracked_keys: int = 65536
    """Bound on distinct keys counted per turn; keys first seen past it are not counted."""
    digest_key: str | None = None
    """Secret for call-key digests (keyed BLAKE2b: the same digests in every process); ``None``: a
    per-process secret (the interpreter's randomly seeded SipHash, see ``turnguard._keys``). UTF-8
    text: a ``TURNGUARD_DIGEST_KEY`` holding a byte that is not UTF-8 is a ``ConfigError``."""
    capture_content: bool = False
    """Opt in to exporting tool arguments and results in telemetry."""
    disable_plugins: tuple[str, ...] = ()
    """Names of plugins (built-in or third-party) not to load."""
    load_entrypoints: bool = True
    """Load third-party plugins from the ``turnguard`` entry-point group."""
    recorder_path: str | None = None
    """Write one JSON line per finished turn here (the local recorder); ``None``: off."""
    shadow: ShadowPolicies = ()
    """Other configurations evaluated side by side on live traffic without acting: (name,
    ``GuardConfig`` or mapping of options) pairs; a mapping of options is applied on top of this
    configuration (see ``shadow_configs``). Given as a mapping, a list or a tuple of pairs."""

    probe: Any = None
    """A probe cohort (``turnguard.Probe(rate, config)``): that share of turns is guarded live by
    ``config``'s options over this configuration (only the ones its caller set, ``given``), this
    configuration running beside it as a shadow. Also a mapping ``{"rate": 0.01, <options>}``,
    the same (``probe_settings``)."""
    stateful_tools: tuple[str, ...] = ()
    """Tools that poll (a CI status, a job, a task board): for these, an identical call whose result
    (``Turn.record_outcome(..., result=)``) differs from the previous identical call's is progress,
    and the stuck signal counts (call, result) pairs. ``"*"`` names every tool (measured to catch
    fewer degenerate runs: ``docs/polling.md``). Stored sorted, each name once."""
    streak_exempt_tools: tuple[str, ...] = ()
    """Tools taken out of the identical-call streak (where results cannot be given); never out of
    the caps or the stuck signal. Stored sorted, each name once."""
    recorder_results: bool = False
    """The recorder keeps the result digest of every call whose result the host passes (each is
    keyed); off, only the ``stateful_tools``' results, keyed anyway, are kept."""

    def __post_init__(self) -> None:
        # Lists are accepted where tuples are stored (TOML and hosts hand over lists).
        if isinstance(self.disable_plugins, list):
            object.__setattr__(self, "disable_plugins", tuple(self.disable_plugins))
        for key in _TOOL_LIST_FIELDS:
            value = getattr(self, key)
            if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(t, str) for t in value):
                object.__setattr__(self, key, tuple(sorted({str.__str__(t) for t in value})))
        if isinstance(self.shadow, list):
            object.__setattr__(self, "shadow", tuple(self.shadow))
        elif isinstance(self.shadow, Mapping):
            object.__setattr__(self, "shadow", tuple(self.shadow.items()))
        if isinstance(self.probe, Mapping):
            object.__setattr__(self, "probe", tuple(self.probe.items()))
        _validate(self)

    @property
    def explicit_cap(self) -> bool:
        """Whether ``max_tool_calls_per_turn`` was set (it changes the cap's semantics)."""
        return self.max_tool_calls_per_turn is not None

    @property
    def cap_mode(self) -> str:
        """``explicit``, ``adaptive`` or ``disabled``."""
        if self.max_tool_calls_per_turn is not None:
            return "explicit" if self.max_tool_calls_per_turn > 0 else "disabled"
        return "adaptive" if self.soft_cap > 0 else "disabled"

    @property
    def hard_cap(self) -> int | None:
        """The call count past which the turn halts whatever it does, or ``None`` (no cap)."""
        mode = self.cap_mode
        if mode == "explicit":
            return self.max_tool_calls_per_turn
        if mode == "adaptive":
            return _exact_product(self.soft_cap, self.hard_multiplier)
        return None

    def shadow_configs(self) -> tuple[tuple[str, GuardConfig], ...]:
        """The shadow policies as (name, ``GuardConfig``) pairs: a mapping of options becomes this
        configuration (without its shadows) with those options changed."""
        if not self.shadow:
            return ()
        base = _replace(self, {"shadow": ()})
        shadow = self.shadow
        assert isinstance(shadow, tuple)  # (pairs, once made: ``__post_init__``, validated)
        return tuple((name, _shadow_config(name, value, base)) for name, value in shadow)

    def probe_settings(self) -> Probe | None:
        """The probe cohort, its configuration resolved: the options it was given (a mapping's, or
        those a whole ``GuardConfig``'s caller set, ``given``) apply over this configuration
        (without its probe and shadows); every other option is this one's. A probe configuration
        that kept this one's name is named ``<name>-probe``, so its figures are a series of their
        own."""
        return _probe_settings(self)

    def replace(self, **changes: Any) -> GuardConfig:
        """A copy with ``changes`` applied (validated); they join the options it was given."""
        return _replace(self, changes)

    @property
    def given(self) -> frozenset[str]:
        """The options this configuration's caller set (see the class docstring); a
        configuration built some other way (``dataclasses.replace``, unpickled from an older
        version) counts every option as given."""
        return getattr(self, "_given", _field_names())

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: GuardConfig | None = None) -> GuardConfig:
        """Build from a mapping of option names (as in TOML; ``soft-cap`` is read as ``soft_cap``);
        unknown keys are errors, and so is an option given in both spellings (which one wins
        would be left to the order of the keys)."""
        if not isinstance(data, Mapping):
            raise ConfigError("<config>", data, "a mapping of option names to values")
        names = _field_names()
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = key.replace("-", "_") if isinstance(key, str) else key
            if name not in names:
                raise UnknownOptionError(str(key), value, names)
            if name in values:
                first = next(k for k in data if k != key and k.replace("-", "_") == name)
                raise ConfigError(key, value, f"one spelling of {name!r}: {first!r} sets it too")
            values[name] = value
        return _replace(base, values) if base else cls(**values)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, base: GuardConfig | None = None, strict: bool = True
    ) -> GuardConfig:
        """Build from ``TURNGUARD_<OPTION>`` variables (e.g. ``TURNGUARD_SOFT_CAP=200``).

        A ``TURNGUARD_*`` variable that names no option is a ``ConfigError`` naming it (a typo must
        not silently leave a threshold at its default); ``strict=False`` logs and ignores it
        instead. A bad value of a known option is always a ``ConfigError``.
        """
        environ = os.environ if environ is None else environ
        values = _env_values(environ, strict)
        try:
            return cls.from_mapping(values, base=base)
        except ConfigError as exc:
            var = ENV_PREFIX + exc.key.upper()
            raise exc.within(var if var in environ else "TURNGUARD_* variables") from None

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], *, base: GuardConfig | None = None) -> GuardConfig:
        """Read ``[tool.turnguard]`` from a ``pyproject.toml``, or a ``turnguard.toml``
        (its top level, or a ``[turnguard]`` table with nothing beside it). A file that cannot be
        read, or whose ``tool``, ``tool.turnguard`` or ``turnguard`` is not a table, is a
        ``ConfigError`` naming it."""
        return cls._from_toml_options(Path(path), base)[0]

    @classmethod
    def _from_toml_options(cls, path: Path, base: GuardConfig | None) -> tuple[GuardConfig, Mapping[str, Any]]:
        """``from_toml``, and the options the file set: read once, as a pipe can be read only once."""
        try:
            options = _toml_options(path)
            return cls.from_mapping(options, base=base), options
        except ConfigError as exc:
            raise exc.within(str(path)) from None

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        search: str | os.PathLike[str] | None = ".",
        **overrides: Any,
    ) -> GuardConfig:
        """Defaults < TOML (``path``, else ``$TURNGUARD_CONFIG``, else ``turnguard.toml`` or a
        ``pyproject.toml`` with ``[tool.turnguard]`` in ``search`` or the nearest folder above it
        that has one; ``search=None``: no file) < environment < ``overrides``."""
        return cls.load_with_sources(path, environ=environ, search=search, **overrides)[0]

    @classmethod
    def load_with_sources(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        search: str | os.PathLike[str] | None = ".",
        **overrides: Any,
    ) -> tuple[GuardConfig, dict[str, str]]:
        """``load``, and where each option's value came from: ``default``, the TOML file's path,
        the ``TURNGUARD_*`` variable, or ``argument``."""
        env = os.environ if environ is None else environ
        sources = dict.fromkeys(_field_names(), DEFAULT_SOURCE)
        config = cls()
        if path is None and env.get(CONFIG_ENV):
            path = env[CONFIG_ENV]
        toml_path = Path(path) if path is not None else _find_toml(search)
        if toml_path is not None:
            config, options = cls._from_toml_options(toml_path, config)
            for key in options:
                sources[key.replace("-", "_")] = str(toml_path)
        config = cls.from_env(env, base=config)
        for key in _env_values(env, strict=True):
            sources[key] = ENV_PREFIX + key.upper()
        if overrides:
            config = cls.from_mapping(overrides, base=config)
            sources.update(dict.fromkeys(overrides, ARGUMENT_SOURCE))
        return config, sources


DEFAULT_SOURCE = "default"
ARGUMENT_SOURCE = "argument"


def _env_values(environ: Mapping[str, str], strict: bool) -> dict[str, Any]:
    """The options the ``TURNGUARD_*`` variables set, parsed (``GuardConfig.from_env``)."""
    names = _field_names()
    values: dict[str, Any] = {}
    for var, text in environ.items():
        if not var.startswith(ENV_PREFIX) or var in _NON_OPTION_VARS or var.startswith(OTEL_PASSTHROUGH):
            continue
        key = var[len(ENV_PREFIX):].lower()
        if key not in names:
            if strict:
                raise UnknownOptionError(var, text, (*(ENV_PREFIX + n.upper() for n in names), *_NON_OPTION_VARS),
                                         prefix=ENV_PREFIX)
            log.warning("turnguard: ignoring %s: not a turnguard option", var)
            continue
        values[key] = _parse_env(var, key, text)
    return values


def _toml_options(path: Path) -> Mapping[str, Any]:
    """The options a TOML file sets: ``[tool.turnguard]`` of a ``pyproject.toml``; a
    ``turnguard.toml``'s ``[turnguard]`` table or its top level."""
    try:
        data: Mapping[str, Any] = tomllib.loads(_config_bytes(path).decode("utf-8"))
    except OSError as exc:
        raise ConfigFileError(str(path), exc.strerror or str(exc), "a readable TOML file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigFileError(str(path), f"not UTF-8 text (byte {exc.start})", "a UTF-8 TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(str(path), str(exc), "a valid TOML file") from exc
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigFileError(str(path), "nested too deeply", "a valid TOML file") from None
    if path.name == "pyproject.toml":
        return _table(_table(data, "tool"), "turnguard", "tool.")
    return _own_options(data)


MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""The largest configuration file read (a project's whole ``pyproject.toml`` is tens of kB): a path
that names a device (``/dev/zero``) or a file past it is refused, not read into memory without end."""


PIPE_WAIT_SECONDS = 3.0
"""How long reading a pipe (``--config <(cmd)``, a named pipe) waits for its writer to write and
close it. ``open`` of a named pipe nobody writes, and ``read`` of one its writer keeps open, would
wait for ever: a hook must never block its agent, nor a command hang on its configuration."""


def read_head(path: str | os.PathLike[str], limit: int) -> bytes:
    """The file's bytes up to one past ``limit`` (a device's or a growing file's ``stat`` size says
    nothing). A pipe is read until its writer closes it, for ``PIPE_WAIT_SECONDS`` at most: past
    that, ``OSError`` (``ETIMEDOUT``) saying whether anything came."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            return _read_pipe(fd, limit, time.monotonic() + PIPE_WAIT_SECONDS)
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _read_pipe(fd: int, limit: int, deadline: float) -> bytes:
    """A pipe's bytes up to one past ``limit``, read as they come until end of file or ``deadline``.
    (A named pipe opened with no writer polls as nothing to read, not as its end, until one came.)"""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            said = (f"a pipe whose writer did not close it within {PIPE_WAIT_SECONDS:g} s" if size
                    else f"a pipe nothing was written to within {PIPE_WAIT_SECONDS:g} s (no writer?)")
            raise OSError(errno.ETIMEDOUT, said)
        try:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 16))
        except BlockingIOError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _config_head(path: Path) -> bytes:
    """The file's bytes up to one past ``MAX_CONFIG_BYTES``."""
    return read_head(path, MAX_CONFIG_BYTES)


def _config_bytes(path: Path) -> bytes:
    """The file's bytes; ``ConfigFileError`` past ``MAX_CONFIG_BYTES``."""
    data = _config_head(path)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigFileError(str(path), f"larger than {MAX_CONFIG_BYTES:,} bytes", "a TOML file")
    return data


def _table(data: Mapping[str, Any], key: str, within: str = "") -> Mapping[str, Any]:
    """``data[key]``, a TOML table (empty when absent): any other value there is a ``ConfigError``
    naming it, where reading on into it would fail with an ``AttributeError``."""
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(within + key, value, f"a table ([{within}{key}])")
    return value


def _own_options(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ``turnguard.toml``'s options: its top level, or its ``[turnguard]`` table with nothing
    beside it. An option at top level beside the table is a ``ConfigError`` naming both places,
    and any other key an unknown option: either would otherwise be dropped unseen, leaving a
    threshold at its default."""
    if "turnguard" not in data:
        return data
    table = _table(data, "turnguard")
    for key, value in data.items():
        if key == "turnguard":
            continue
        if key.replace("-", "_") in _field_names():
            raise ConfigError(key, value, "options all at top level or all under [turnguard], not both: "
                                          f"move {key!r} into [turnguard]")
        raise UnknownOptionError(key, value, _field_names())
    return table


CONFIG_ENV = "TURNGUARD_CONFIG"
"""A TOML file ``GuardConfig.load`` reads when it is given no path."""
OTEL_PASSTHROUGH = "TURNGUARD_OTEL_"
"""``TURNGUARD_OTEL_X`` is ``OTEL_X`` for the coding agents' hooks (Claude Code passes no ``OTEL_*``
variable to its hooks); not an option."""
_NON_OPTION_VARS = frozenset({"TURNGUARD_LOAD_PLUGINS", "TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT", CONFIG_ENV,
                              "TURNGUARD_STATE_DIR", "TURNGUARD_ATTENDED"})
"""``TURNGUARD_*`` variables that are not options: plugin loading, the telemetry shutdown bound, the
configuration file, and the coding-agent hooks' state directory and attended override."""


@functools.cache
def _field_names() -> frozenset[str]:
    return frozenset(_field_order())


@functools.cache
def _field_order() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(GuardConfig))


def _replace(config: GuardConfig, changes: Mapping[str, Any]) -> GuardConfig:
    """``dataclasses.replace``, keeping what ``config`` was given and adding ``changes``."""
    copy = dataclasses.replace(config, **changes)
    object.__setattr__(copy, "_given", config.given | changes.keys())
    return copy


def _find_toml(search: str | os.PathLike[str] | None) -> Path | None:
    """The configuration file for a program run in ``search``: in that folder or the nearest one
    above it, the first ``turnguard.toml``, or ``pyproject.toml`` with a ``[tool.turnguard]`` table
    (a ``pyproject.toml`` without one is passed over), as ruff and pytest find theirs. A
    ``pyproject.toml`` that does not parse is taken when it names ``tool.turnguard``, and one whose
    ``tool`` is not a table is taken, so that ``load`` says what is wrong with it instead of
    reading a file further up."""
    if search is None:
        return None
    folder = Path(search)
    for place in (folder, *folder.absolute().parents):  # (the folder as given: ./turnguard.toml is shown so)
        try:
            own = place / "turnguard.toml"
            if own.is_file():
                return own
            pyproject = place / "pyproject.toml"
            if pyproject.is_file() and _configures_turnguard(pyproject):
                return pyproject
        except OSError:  # a folder on the way that cannot be looked into: go on above it
            continue
    return None


def _configures_turnguard(pyproject: Path) -> bool:
    """Whether ``pyproject`` has a ``[tool.turnguard]`` table, or may have meant one: its ``tool``
    is not a table (``tool = "turnguard"``), so ``load`` says what is wrong with it."""
    text = _config_head(pyproject)
    if len(text) > MAX_CONFIG_BYTES:  # (taken when it names the table: ``load`` says it is too large)
        return b"tool.turnguard" in text
    try:
        tool = tomllib.loads(text.decode("utf-8")).get("tool", {})
    except (ValueError, RecursionError):  # (tomllib's errors and UnicodeDecodeError are ValueErrors)
        return b"tool.turnguard" in text
    return not isinstance(tool, Mapping) or "turnguard" in tool


_INT_FIELDS = (
    "soft_cap",
    "stuck_repeat_threshold",
    "streak_warn_at",
    "streak_stop_at",
    "max_cycles_per_turn",
    "max_tracked_keys",
    "cycle_repeat_warn_at",
    "cycle_repeat_stop_at",
    "cycle_repeat_max_period",
)
_BOOL_FIELDS = ("remind_model", "capture_content", "load_entrypoints", "recorder_results")
_TOOL_LIST_FIELDS = ("stateful_tools", "streak_exempt_tools")

_CHOICES = {
    "stuck_signal": STUCK_SIGNALS,
    "streak_stop_on": STREAK_STOP_ON,
    "key_mode": KEY_MODES,
    "fail_mode": FAIL_MODES,
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_env(var: str, key: str, text: str) -> Any:
    text = text.strip()
    if key in _BOOL_FIELDS:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(var, text, "a boolean (1/0, true/false, yes/no, on/off)")
    if key in _INT_FIELDS or key == "max_tool_calls_per_turn":
        if key == "max_tool_calls_per_turn" and text.lower() in ("", "none", "unset"):
            return None
        try:
            return int(text)
        except ValueError:
            raise ConfigError(var, text, "an integer") from None
    if key == "hard_multiplier":
        try:
            return float(text)
        except ValueError:
            raise ConfigError(var, text, "a number >= 1") from None
    if key == "disable_plugins" or key in _TOOL_LIST_FIELDS:
        return tuple(p.strip() for p in text.split(",") if p.strip())
    if key in ("shadow", "probe"):
        raise ConfigError(var, text, f"{key} set in code or TOML, not in the environment")
    if key in ("digest_key", "recorder_path"):
        return text or None
    return text


MAX_CALLS = 2**62
"""The largest cap a configuration may express (a larger one is a ``ConfigError``, not an overflow)."""


def _exact_product(soft_cap: int, multiplier: float) -> int:
    """S * m without float rounding: ``100 * 1.15`` is 115, not 114 (the product of the shortest
    decimal that reads back as ``m``, read through ``float``'s own methods, not a subclass's)."""
    if isinstance(multiplier, int):
        return soft_cap * int.__int__(multiplier)
    if float.is_integer(multiplier):
        return soft_cap * int(float.__float__(multiplier))
    return int(Fraction(soft_cap) * Fraction(float.__repr__(multiplier)))


_NUMBER_FIELDS = ("max_tool_calls_per_turn", *_INT_FIELDS, "hard_multiplier")


def _plain_number(value: Any) -> Any:
    """An int or float subclass's value as a plain ``int`` or ``float``, anything else as given:
    its own ``__repr__``, comparisons or ``is_integer`` may say otherwise (numpy's ``float64(1.15)``
    reprs as ``np.float64(1.15)``; an ``IntEnum`` member as ``<Cap.LOW: 50>``)."""
    cls = type(value)
    if cls is int or cls is float or cls is bool:
        return value
    if issubclass(cls, int):
        return int.__int__(value)
    if issubclass(cls, float):
        return float.__float__(value)
    return value


def _init_checking_names(init: Any) -> Any:
    """Wrap the dataclass ``__init__`` so an unknown option is a ``ConfigError``, not a ``TypeError``."""

    @functools.wraps(init)
    def __init__(self: GuardConfig, *args: Any, **kwargs: Any) -> None:
        names = _field_names()
        for key in kwargs:
            if key not in names:
                raise UnknownOptionError(key, kwargs[key], names)
        if len(args) > len(names):
            raise ConfigError("<positional>", args, f"at most {len(names)} positional options")
        init(self, *args, **kwargs)
        object.__setattr__(self, "_given", frozenset((*_field_order()[:len(args)], *kwargs)))

    return __init__


MAX_NAME_LENGTH = 64
NAME_ACCEPTED = (f"a non-empty string of at most {MAX_NAME_LENGTH} characters, without control characters "
                 "or surrogates")
_REFUSED_IN_NAMES = frozenset({"Cc", "Cs"})
"""Unicode categories a policy or shadow name may not hold: control characters (tab, newline, NUL,
...) and surrogates, which no telemetry backend can encode or show."""


def valid_name(name: Any) -> bool:
    """Whether ``name`` can name a policy or a shadow (``NAME_ACCEPTED``): it is exported on every
    metric point and span, so it must encode and print everywhere."""
    if not isinstance(name, str):
        return False
    name = str.__str__(name)
    if not name.strip() or len(name) > MAX_NAME_LENGTH:
        return False
    return (name.isascii() and name.isprintable()) or not any(
        unicodedata.category(ch) in _REFUSED_IN_NAMES for ch in name)


def _validate(c: GuardConfig) -> None:
    if isinstance(c.name, str) and type(c.name) is not str:
        object.__setattr__(c, "name", str.__str__(c.name))  # the text, not a subclass's behaviour
    for key in _NUMBER_FIELDS:  # the numbers, not a subclass's behaviour
        object.__setattr__(c, key, _plain_number(getattr(c, key)))
    if not valid_name(c.name):
        raise ConfigError("name", c.name, NAME_ACCEPTED)
    _validate_counts(c)
    _validate_cap(c)
    if c.streak_warn_at and c.streak_stop_at and c.streak_warn_at > c.streak_stop_at:
        raise ConfigError(
            "streak_warn_at", c.streak_warn_at, f"at most streak_stop_at ({c.streak_stop_at}) when both are set"
        )
    _validate_cycle_repeat(c)
    _validate_kinds(c)
    _validate_shadow(c)
    if c.probe is not None:
        _probe_settings(c)


def _validate_cycle_repeat(c: GuardConfig) -> None:
    """The cycle levels count repetitions (a cycle seen once is no loop) of cycles of 2 to 16 calls."""
    for key in ("cycle_repeat_warn_at", "cycle_repeat_stop_at"):
        value = getattr(c, key)
        if value == 1 or value < 0 or value > MAX_CALLS:
            raise ConfigError(key, value, f"0 (disabled) or an integer from 2 to {MAX_CALLS}")
    if not 2 <= c.cycle_repeat_max_period <= 16:
        raise ConfigError("cycle_repeat_max_period", c.cycle_repeat_max_period, "an integer from 2 to 16")
    warn, stop = c.cycle_repeat_warn_at, c.cycle_repeat_stop_at
    if warn and stop and warn > stop:
        raise ConfigError("cycle_repeat_warn_at", warn, f"at most cycle_repeat_stop_at ({stop}) when both are set")


def _validate_counts(c: GuardConfig) -> None:
    """The integer options: integers, each in its range."""
    for key in _INT_FIELDS:
        value = getattr(c, key)
        if not _is_int(value):
            raise ConfigError(key, value, "an integer")
    if c.stuck_repeat_threshold < 1:
        raise ConfigError("stuck_repeat_threshold", c.stuck_repeat_threshold, "an integer >= 1")
    for key in ("streak_warn_at", "streak_stop_at", "max_cycles_per_turn"):
        if getattr(c, key) < 0:
            raise ConfigError(key, getattr(c, key), "an integer >= 0 (0 disables)")
    if c.max_tracked_keys < 1:
        raise ConfigError("max_tracked_keys", c.max_tracked_keys, "an integer >= 1")
    if c.max_tool_calls_per_turn is not None and not _is_int(c.max_tool_calls_per_turn):
        raise ConfigError("max_tool_calls_per_turn", c.max_tool_calls_per_turn, "an integer or None (unset)")


def _validate_cap(c: GuardConfig) -> None:
    """The multiplier, and every call count below ``MAX_CALLS`` (the backstop S x m included)."""
    m = c.hard_multiplier
    if isinstance(m, bool) or not isinstance(m, (int, float)) or m != m or m < 1 or m == float("inf"):
        raise ConfigError("hard_multiplier", m, "a finite number >= 1")
    for key in ("soft_cap", "max_tool_calls_per_turn", "max_cycles_per_turn", "streak_warn_at", "streak_stop_at"):
        value = getattr(c, key)
        if value is not None and value > MAX_CALLS:
            raise ConfigError(key, value, f"an integer <= {MAX_CALLS}")
    if c.soft_cap > 0 and _exact_product(c.soft_cap, m) > MAX_CALLS:
        raise ConfigError("hard_multiplier", m, f"a value with soft_cap * hard_multiplier <= {MAX_CALLS}")


def _validate_kinds(c: GuardConfig) -> None:
    """The other options: choices, booleans, strings, the plugin names and the shadows' container."""
    for key, choices in _CHOICES.items():
        if getattr(c, key) not in choices:
            raise ConfigError(key, getattr(c, key), f"one of {choices}")
    for key in _BOOL_FIELDS:
        if not isinstance(getattr(c, key), bool):
            raise ConfigError(key, getattr(c, key), "a boolean")
    for key in ("digest_key", "recorder_path"):
        value = getattr(c, key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(key, value, "a string or None")
    if c.digest_key is not None:
        _validate_secret("digest_key", c.digest_key)
    if not isinstance(c.disable_plugins, tuple) or not all(isinstance(p, str) for p in c.disable_plugins):
        raise ConfigError("disable_plugins", c.disable_plugins, "a tuple of plugin names")
    _validate_tools(c)
    if not isinstance(c.shadow, tuple):
        raise ConfigError("shadow", c.shadow, "a tuple of (name, GuardConfig or mapping) pairs")


def _validate_tools(c: GuardConfig) -> None:
    """The tool lists: tuples of non-empty tool names (``"*"``, every tool, in ``stateful_tools`` only)."""
    for key in _TOOL_LIST_FIELDS:
        value = getattr(c, key)
        accepted = "a list of tool names" + (' (or "*": every tool)' if key == "stateful_tools" else "")
        if not isinstance(value, tuple):
            raise ConfigError(key, value, accepted + (", not one string" if isinstance(value, str) else ""))
        for name in value:
            if not isinstance(name, str) or not name:
                raise ConfigError(key, name, accepted + ": each a non-empty string")
    if ALL_TOOLS in c.streak_exempt_tools:
        raise ConfigError("streak_exempt_tools", ALL_TOOLS, "tool names (to turn the streak off for every tool, "
                          "set streak_warn_at=0 and streak_stop_at=0)")


class _Withheld:
    """A secret in an error message: what is wrong with it, never its text."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"a secret (not shown) {self.why}"


def _validate_secret(key: str, value: str) -> None:
    """A secret is hashed as UTF-8 bytes: one that cannot be (a byte of an environment variable that
    is not UTF-8 reaches Python as a lone surrogate) is refused here, not at the first call keyed."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        what = "a byte that is not UTF-8" if "\udc80" <= value[exc.start] <= "\udcff" else "a lone surrogate"
        raise ConfigError(key, _Withheld(f"whose character {exc.start + 1} is {what}"), "UTF-8 text") from None


_SHADOW_ACCEPTED = "(name, GuardConfig or mapping of options) pairs, or a mapping of name to either"


def _validate_shadow(c: GuardConfig) -> None:
    """Every shadow is a uniquely named pair whose configuration is valid and has no shadows of
    its own; mappings are resolved once here so that a bad option fails at construction."""
    names: set[str] = set()
    base = _replace(c, {"shadow": ()}) if c.shadow else c
    for pair in c.shadow:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ConfigError("shadow", pair, _SHADOW_ACCEPTED)
        name, value = pair
        if not valid_name(name):
            raise ConfigError("shadow", name, f"a name for the shadow policy: {NAME_ACCEPTED}")
        if name in names:
            raise ConfigError(f"shadow.{name}", value, "one configuration per shadow name (this name is repeated)")
        names.add(name)
        _shadow_config(name, value, base)


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """A probe cohort: ``rate`` (0 to 1) of the turns are guarded live by ``config``, the main
    configuration running beside it as a shadow (``turnguard._probe`` has the sampling). Under a
    main configuration, ``config`` stands for the options its caller set (``GuardConfig.given``:
    ``Probe(0.01, GuardConfig(hard_multiplier=20))`` changes the multiplier and nothing else)."""

    rate: float
    config: GuardConfig

    def __post_init__(self) -> None:
        rate = _plain_number(self.rate)
        object.__setattr__(self, "rate", rate)
        number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
        if not number or not math.isfinite(rate) or not 0 <= rate <= 1:
            raise ConfigError("probe.rate", rate, "a number from 0 to 1 (the share of turns probed)")
        if not isinstance(self.config, GuardConfig):
            raise ConfigError("probe.config", self.config, "a GuardConfig (in a mapping: options over the main one)")
        if self.config.probe is not None:
            raise ConfigError("probe.config.probe", self.config.probe, "no probe inside a probe configuration")

    def selects(self, conversation_id: object, turn_id: object) -> bool:
        """Whether the turn is a probe turn (hashed from the conversation id, else the turn id:
        ``turnguard._probe.selects``)."""
        return selects(self.rate, conversation_id, turn_id)


PROBE_ALIASES = {word: "rate" for word in ("fraction", "share", "ratio", "percent", "percentage", "probability",
                                            "sample", "sampling", "sample_rate", "sampling_rate", "probe_rate")}
"""Words a probe table may use for its ``rate`` (an unknown key among them suggests it)."""


class _Missing:
    def __repr__(self) -> str:
        return "nothing (the key is missing)"


MISSING: Any = _Missing()
"""A required key that is not there, as a ``ConfigError``'s value."""


def _probe_settings(c: GuardConfig) -> Probe | None:
    """The probe with its configuration resolved: the options it was given (a mapping's keys, or
    what a whole ``GuardConfig``'s caller set: ``GuardConfig.given``) over ``c`` without its probe
    and shadows, named ``<name>-probe`` unless it names itself otherwise."""
    probe = c.probe
    if probe is None:
        return None
    if isinstance(probe, tuple):
        options = dict(probe)
        known = {"rate", *_field_names()}
        for key in options:
            if not isinstance(key, str) or key.replace("-", "_") not in known:
                raise UnknownOptionError(f"probe.{key}", options[key], known, prefix="probe.", aliases=PROBE_ALIASES)
        if "rate" not in options:
            raise ConfigError("probe.rate", MISSING, "a number from 0 to 1 (the share of turns probed)")
        rate = options.pop("rate")
        for key in ("probe", "shadow"):
            if key in options:
                raise ConfigError(f"probe.{key}", options[key], f"no {key} inside a probe configuration")
    elif isinstance(probe, Probe):
        if probe.config.shadow:
            raise ConfigError("probe.config.shadow", probe.config.shadow, "no shadows inside a probe configuration "
                              "(the main configuration's shadows run on probe turns too)")
        rate = probe.rate
        options = {key: getattr(probe.config, key) for key in probe.config.given if key not in ("probe", "shadow")}
    else:
        raise ConfigError("probe", probe, "a turnguard.Probe(rate, config) or a mapping {'rate': ..., <options>}")
    try:
        config = GuardConfig.from_mapping(options, base=_replace(c, {"probe": None, "shadow": ()}))
    except ConfigError as exc:
        raise ConfigError(f"probe.{exc.key}", exc.value, exc.accepted) from None
    if config.name == c.name:
        config = config.replace(name=f"{c.name[:MAX_NAME_LENGTH - 6]}-probe")
    return Probe(rate, config)


def _shadow_config(name: str, value: Any, base: GuardConfig) -> GuardConfig:
    if isinstance(value, GuardConfig):
        config = value
    elif isinstance(value, Mapping):
        if "shadow" in value:
            raise ConfigError(f"shadow.{name}.shadow", value["shadow"], "no shadows inside a shadow policy")
        try:
            config = GuardConfig.from_mapping(value, base=base)
        except ConfigError as exc:
            exc.key = f"shadow.{name}.{exc.key}"
            raise exc from None
    else:
        raise ConfigError(f"shadow.{name}", value, "a GuardConfig or a mapping of options")
    if config.shadow:
        raise ConfigError(f"shadow.{name}.shadow", config.shadow, "no shadows inside a shadow policy")
    return config



# On purpose: the dataclass's own __init__, wrapped (mypy refuses assigning over a method at all).
GuardConfig.__init__ = _init_checking_names(GuardConfig.__init__)  # type: ignore[method-assign]
