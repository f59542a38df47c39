"""Policy grids: which configurations a calibration run compares. A ``Policy`` is a name, a
``GuardConfig`` and optional extra rules (plugins beside the built-ins): the peers' explicit cap
of 100, and their halt on the 5th identical call in a row (``HaltOnIdenticalCalls``)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from turnguard._config import STREAK_STOP_ON, STUCK_SIGNALS, ConfigError, GuardConfig
from turnguard._keys import KEY_MODES
from turnguard._plugins import DEFAULT_PLUGINS
from turnguard._policies.identical import IdenticalCallsRule
from turnguard.telemetry._recorder import turn_limits

DEFAULT_SOFT_CAPS = (20, 50, 100)
DEFAULT_MULTIPLIERS = (2, 3, 5, 10, 20)
DEFAULT_STUCK_REPEATS = (3, 6)
DEFAULT_STREAKS = ((3, 5), (5, 8), (5, 0), (0, 0))
DEFAULT_EXPLICIT_CAPS = (30, 50, 100)
DEFAULT_CYCLE_CAPS = (0,)
DEFAULT_CYCLE_REPEATS = ((5, 6), (5, 8), (5, 10), (0, 0))
"""``cycle_repeat`` (warn, stop) pairs: a row per stop value at the warning of 5 (attended, the
warning asks first: the stop matters unattended), and the policy off."""
DEFAULT_KEY_MODES = KEY_MODES
DEFAULT_STUCK_SIGNALS = STUCK_SIGNALS
DEFAULT_STOP_ON = STREAK_STOP_ON
DEFAULT_STATEFUL_TOOLS: tuple[tuple[str, ...], ...] = ()
"""No ``stateful_tools`` variant unless asked (``--stateful-tools``): the grid is the base's."""
PEER_CAP = 100
PEER_IDENTICAL = 5
MAX_POLICIES = 2000
"""The most policies one run compares (every turn is replayed under each): a larger grid is a
``ConfigError`` raised before any policy is built."""


ExtraRule = IdenticalCallsRule


@dataclass(frozen=True, slots=True)
class Policy:
    """One point of the grid."""

    name: str
    config: GuardConfig
    extras: tuple[ExtraRule, ...] = ()
    is_default: bool = False
    family: str = "turnguard"
    """``turnguard`` for turnguard's configurations, ``peer`` for the peers' rules."""

    def describe(self) -> dict[str, object]:
        """The parameters that define this policy, for tables and JSON; ``limits`` in a recorder
        line's words, to tell whether the turns ran under it."""
        c = self.config
        return {
            "cap": _cap_text(c),
            "cap_mode": c.cap_mode,
            "soft_cap": c.soft_cap if c.cap_mode == "adaptive" else None,
            "hard_cap": c.hard_cap,
            "multiplier": c.hard_multiplier if c.cap_mode == "adaptive" else None,
            "stuck_repeat": c.stuck_repeat_threshold if c.cap_mode == "adaptive" else None,
            "streak": f"{c.streak_warn_at}/{c.streak_stop_at}" + ("" if c.streak_stop_on == "error" else " any"),
            "streak_stop_at": c.streak_stop_at,
            "cycles": c.max_cycles_per_turn,
            "cycle_repeat": f"{c.cycle_repeat_warn_at}/{c.cycle_repeat_stop_at}",
            "key_mode": c.key_mode,
            "stateful_tools": list(c.stateful_tools),
            "streak_exempt_tools": list(c.streak_exempt_tools),
            "extras": [e.label for e in self.extras],
            "limits": turn_limits(c),
        }


def _cap_text(c: GuardConfig) -> str:
    mode = c.cap_mode
    if mode == "explicit":
        return f"explicit {c.max_tool_calls_per_turn}"
    if mode == "disabled":
        return "off"
    signal = "" if c.stuck_signal == "repeat" else f" {c.stuck_signal}"
    return f"S={c.soft_cap} x{c.hard_multiplier:g} D={c.stuck_repeat_threshold}{signal}"


@dataclass(frozen=True, slots=True)
class GridSpec:
    """The axes, as given on the command line."""

    soft_caps: tuple[int, ...] = DEFAULT_SOFT_CAPS
    multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS
    stuck_repeats: tuple[int, ...] = DEFAULT_STUCK_REPEATS
    streaks: tuple[tuple[int, int], ...] = DEFAULT_STREAKS
    explicit_caps: tuple[int, ...] = DEFAULT_EXPLICIT_CAPS
    cycle_caps: tuple[int, ...] = DEFAULT_CYCLE_CAPS
    cycle_repeats: tuple[tuple[int, int], ...] = DEFAULT_CYCLE_REPEATS
    key_modes: tuple[str, ...] = DEFAULT_KEY_MODES
    stuck_signals: tuple[str, ...] = DEFAULT_STUCK_SIGNALS
    stop_on: tuple[str, ...] = DEFAULT_STOP_ON
    stateful_tools: tuple[tuple[str, ...], ...] = DEFAULT_STATEFUL_TOOLS
    """``stateful_tools`` values to try (each a tuple of tool names; ``("*",)``: every tool)."""
    peers: bool = True
    cross: bool = False
    """``False``: the cap axes crossed, every other axis varied alone around the default.
    ``True``: the full cross product of every axis."""
    base: GuardConfig = field(default_factory=GuardConfig)

    @property
    def size(self) -> int:
        """How many policies ``build_grid`` considers (before duplicates are removed)."""
        n = 1 + (2 if self.peers else 0)
        if self.cross:
            tools = max(1, len(self.stateful_tools))
            return n + len(self.cycle_repeats) + tools * (math.prod(map(len, (
                self.soft_caps, self.multipliers, self.stuck_repeats, self.stuck_signals, self.streaks, self.stop_on,
                self.cycle_caps, self.key_modes))) + math.prod(map(len, (
                    self.explicit_caps, self.streaks, self.stop_on, self.key_modes))))
        caps = len(self.soft_caps) * len(self.stuck_repeats)
        return (n + caps * len(self.multipliers) + caps * len(self.stuck_signals)
                + sum(map(len, (self.stop_on, self.streaks, self.cycle_caps, self.cycle_repeats, self.key_modes,
                                self.explicit_caps, self.stateful_tools))))


def build_grid(spec: GridSpec) -> list[Policy]:
    """The policies of ``spec``, the default configuration first, duplicates removed; a grid of
    more than ``MAX_POLICIES`` is a ``ConfigError``."""
    if spec.size > MAX_POLICIES:
        raise ConfigError("grid", f"{spec.size:,} policies", f"at most {MAX_POLICIES:,} policies (fewer values "
                          "per axis, or no --cross)")
    base = spec.base.replace(
        disable_plugins=tuple(name for name in spec.base.disable_plugins if name in DEFAULT_PLUGINS),
        load_entrypoints=False, recorder_path=None, shadow=(), capture_content=False
    )
    candidates: list[Policy] = [Policy("default", base, is_default=True)]
    if spec.cross:
        candidates += _crossed(spec, base)
    else:
        varied: list[dict[str, Any]] = [
            *(dict(soft_cap=s, hard_multiplier=m, stuck_repeat_threshold=d)
              for s, m, d in itertools.product(spec.soft_caps, spec.multipliers, spec.stuck_repeats)),
            *(dict(soft_cap=s, stuck_repeat_threshold=d, stuck_signal=sig)  # other stuck signals: at each S and D
              for sig in spec.stuck_signals for s, d in itertools.product(spec.soft_caps, spec.stuck_repeats)),
            *(dict(streak_stop_on=on) for on in spec.stop_on),
            *(dict(streak_warn_at=w, streak_stop_at=st) for w, st in spec.streaks),
            *(dict(max_cycles_per_turn=n) for n in spec.cycle_caps),
            *_cycle_repeats(spec),
            *(dict(key_mode=k) for k in spec.key_modes),
            *(dict(max_tool_calls_per_turn=cap) for cap in spec.explicit_caps),
            *(dict(stateful_tools=tools) for tools in spec.stateful_tools),
        ]
        candidates += [_named(base.replace(**changes), base) for changes in varied]
    if spec.peers:
        quiet = base.replace(streak_warn_at=0, streak_stop_at=0)
        candidates.append(Policy(f"peer: explicit cap {PEER_CAP} only",
                                 quiet.replace(max_tool_calls_per_turn=PEER_CAP), family="peer"))
        candidates.append(Policy(f"peer: halt at {PEER_IDENTICAL} identical calls",
                                 quiet.replace(max_tool_calls_per_turn=0),
                                 (IdenticalCallsRule(PEER_IDENTICAL),), family="peer"))
    return dedupe(candidates)


def _crossed(spec: GridSpec, base: GuardConfig) -> list[Policy]:
    """``--cross``: every axis crossed (the ``stateful_tools`` values too, when given)."""
    out = []
    for tools in spec.stateful_tools or (base.stateful_tools,):
        for s, m, d, sig, (w, st), on, n, k in itertools.product(
            spec.soft_caps, spec.multipliers, spec.stuck_repeats, spec.stuck_signals, spec.streaks, spec.stop_on,
            spec.cycle_caps, spec.key_modes,
        ):
            out.append(_named(base.replace(soft_cap=s, hard_multiplier=m, stuck_repeat_threshold=d, stuck_signal=sig,
                                           streak_warn_at=w, streak_stop_at=st, streak_stop_on=on,
                                           max_cycles_per_turn=n, key_mode=k, stateful_tools=tools), base))
        for cap, (w, st), on, k in itertools.product(spec.explicit_caps, spec.streaks, spec.stop_on, spec.key_modes):
            out.append(_named(base.replace(max_tool_calls_per_turn=cap, streak_warn_at=w, streak_stop_at=st,
                                           streak_stop_on=on, key_mode=k, stateful_tools=tools), base))
    return out + [_named(base.replace(**changes), base) for changes in _cycle_repeats(spec)]


def _cycle_repeats(spec: GridSpec) -> list[dict[str, int]]:
    """``cycle_repeat`` varied alone around the base, in both kinds of grid: it fires on few turns,
    and crossing it with every other axis would multiply the grid for them."""
    return [dict(cycle_repeat_warn_at=w, cycle_repeat_stop_at=st) for w, st in spec.cycle_repeats]


def _named(cfg: GuardConfig, base: GuardConfig) -> Policy:
    return Policy(_name(cfg, base), cfg)


def dedupe(policies: list[Policy]) -> list[Policy]:
    """Drop repeated (config, extras), keeping the first occurrence (so ``default`` keeps its name)."""
    seen: set[tuple[GuardConfig, tuple[ExtraRule, ...]]] = set()
    out = []
    for p in policies:
        ident = (p.config, p.extras)
        if ident in seen:
            continue
        seen.add(ident)
        out.append(p)
    return out


_ADAPTIVE_NAME_PARTS = (
    (("soft_cap",), "S={}"),
    (("hard_multiplier",), "x{:g}"),
    (("stuck_repeat_threshold",), "D={}"),
    (("stuck_signal",), "{}"),
)
_NAME_PARTS = (
    (("streak_warn_at", "streak_stop_at"), "streak {}/{}"),
    (("streak_stop_on",), "stop on {}"),
    (("max_cycles_per_turn",), "cycles {}"),
    (("cycle_repeat_warn_at", "cycle_repeat_stop_at"), "cycle repeat {}/{}"),
    (("key_mode",), "key {}"),
)
"""(config fields, how to show them) for ``_name``: shown when any of the fields differs."""


def _name(cfg: GuardConfig, base: GuardConfig) -> str:
    """Only what differs from the default configuration (the adaptive cap's settings only
    without an explicit cap)."""
    parts = []
    shown: tuple[tuple[tuple[str, ...], str], ...]
    if cfg.max_tool_calls_per_turn is not None:
        parts.append(f"explicit {cfg.max_tool_calls_per_turn}")
        shown = _NAME_PARTS
    else:
        shown = _ADAPTIVE_NAME_PARTS + _NAME_PARTS
    for fields, text in shown:
        values = [getattr(cfg, f) for f in fields]
        if values != [getattr(base, f) for f in fields]:
            parts.append(text.format(*values))
    if cfg.stateful_tools != base.stateful_tools:
        parts.append(f"stateful {','.join(cfg.stateful_tools) or 'none'}")
    return " ".join(parts) or "default"


def parse_ints(text: str, *, minimum: int = 0) -> tuple[int, ...]:
    """``"50,100,200"`` -> ``(50, 100, 200)``; raises ``ValueError`` saying what is accepted."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise ValueError(f"expected comma-separated integers >= {minimum}, got {text!r}")
    return values


def parse_floats(text: str, *, minimum: float = 1) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v >= minimum for v in values):
        raise ValueError(f"expected comma-separated numbers >= {minimum:g}, got {text!r}")
    return tuple(int(v) if v.is_integer() else v for v in values)


def parse_streaks(text: str) -> tuple[tuple[int, int], ...]:
    """``"5:8,3:5"`` -> ``((5, 8), (3, 5))`` (warn:stop; 0 disables a level)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        warn, sep, stop = part.partition(":")
        try:
            pair = (int(warn), int(stop)) if sep else (int(warn), 0)
        except ValueError:
            raise ValueError(f"expected warn:stop pairs such as 5:8, got {part!r}") from None
        if min(pair) < 0 or (pair[0] and pair[1] and pair[0] > pair[1]):
            raise ValueError(f"streak {part!r}: levels must be >= 0 and warn <= stop when both are set")
        out.append(pair)
    if not out:
        raise ValueError(f"expected warn:stop pairs such as 5:8, got {text!r}")
    return tuple(out)


def parse_tool_sets(text: str) -> tuple[tuple[str, ...], ...]:
    """``"none;ci_status,job_status;*"`` -> ``((), ("ci_status", "job_status"), ("*",))``: the
    ``stateful_tools`` values to try, separated by ``;`` (``none``: no tool)."""
    sets = []
    for part in text.split(";"):
        names = tuple(sorted({n.strip() for n in part.split(",") if n.strip()}))
        if not names:
            raise ValueError(f"expected tool lists separated by ';' ('none' for no tool, '*' for every tool), "
                             f"got {text!r}")
        sets.append(() if names == ("none",) else names)
    return tuple(dict.fromkeys(sets))


def parse_choices(text: str, choices: tuple[str, ...], what: str) -> tuple[str, ...]:
    values = tuple(m.strip() for m in text.split(",") if m.strip())
    if not values or any(v not in choices for v in values):
        raise ValueError(f"{what} must be among {choices}, got {text!r}")
    return values


def parse_key_modes(text: str) -> tuple[str, ...]:
    return parse_choices(text, KEY_MODES, "key modes")
