"""What a configuration fixes on the boards: the thresholds they mark, slice and explain.

PromQL cannot compute a bucket edge from a variable, so the what-if panels are built for one
configuration (``GuardConfig``, as ``turnguard assets --config`` or the defaults give it): its soft
cap S, backstop multiplier m, stuck threshold D, streak stop, ``cycle_repeat`` stop and cycle cap, the
thresholds it has in force (a probe row each), and its probe's own limits, past which the probe
sees nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnguard._config import GuardConfig
from turnguard._model import Threshold
from turnguard._probe import sees_past
from turnguard.telemetry import _buckets as buckets

THRESHOLD_ORDER = (Threshold.HARD_BACKSTOP, Threshold.SOFT_STUCK, Threshold.STREAK, Threshold.CYCLE_REPEAT,
                   Threshold.CYCLE_CAP, Threshold.EXPLICIT)
"""The order of the probe rows (one per threshold the main configuration has in force)."""


def thresholds_in_force(config: GuardConfig) -> tuple[Threshold, ...]:
    """The thresholds that can halt a turn under ``config``, in ``THRESHOLD_ORDER``."""
    mode = config.cap_mode
    on = {Threshold.HARD_BACKSTOP: mode == "adaptive", Threshold.SOFT_STUCK: mode == "adaptive",
          Threshold.STREAK: config.streak_stop_at > 0, Threshold.CYCLE_REPEAT: config.cycle_repeat_stop_at > 0,
          Threshold.CYCLE_CAP: config.max_cycles_per_turn > 0, Threshold.EXPLICIT: mode == "explicit"}
    return tuple(t for t in THRESHOLD_ORDER if on[t])


def _limits(config: GuardConfig) -> dict[Threshold, int]:
    """Per threshold in force: the count it halts past (calls, repeats, failures, repetitions of a
    cycle or requests)."""
    values = {Threshold.HARD_BACKSTOP: config.hard_cap, Threshold.SOFT_STUCK: config.stuck_repeat_threshold,
              Threshold.STREAK: config.streak_stop_at, Threshold.CYCLE_REPEAT: config.cycle_repeat_stop_at,
              Threshold.CYCLE_CAP: config.max_cycles_per_turn, Threshold.EXPLICIT: config.hard_cap}
    return {t: int(values[t] or 0) for t in thresholds_in_force(config)}


@dataclass(frozen=True)
class ProbeLimits:
    """The probe cohort's own configuration, as far as the boards need it."""

    name: str
    rate: float
    hard_cap: int | None
    """The probe's backstop (adaptive) or explicit cap: no probe turn is seen past it."""
    limits: tuple[tuple[Threshold, int], ...]
    soft_cap: int | None = None
    """The probe's soft cap S (``None``: its cap is explicit or disabled)."""
    stuck_repeat_threshold: int | None = None
    stuck_signal: str = GuardConfig.stuck_signal
    """Its stuck signal (its turns' ``stuck`` label is that signal at its D)."""

    def limit(self, threshold: Threshold) -> int | None:
        return dict(self.limits).get(threshold)


def _probe_limits(config: GuardConfig, rate: float) -> ProbeLimits:
    return ProbeLimits(config.name, rate, config.hard_cap, tuple(_limits(config).items()),
                       soft_cap=config.soft_cap if config.cap_mode == "adaptive" else None,
                       stuck_repeat_threshold=config.stuck_repeat_threshold,
                       stuck_signal=config.stuck_signal)


@dataclass(frozen=True)
class CapSettings:
    """S, the backstop multiplier m, the stuck threshold D, the streak stop and the probe the boards
    are built for. With no adaptive cap the bucket edges are the default S's (what the guard
    exports then) and the adaptive panels stay empty."""

    soft_cap: int
    hard_multiplier: float
    stuck_repeat_threshold: int
    streak_stop_at: int = GuardConfig.streak_stop_at
    cycle_repeat_stop_at: int = GuardConfig.cycle_repeat_stop_at
    thresholds: tuple[Threshold, ...] = (Threshold.HARD_BACKSTOP, Threshold.SOFT_STUCK, Threshold.STREAK)
    """The main configuration's thresholds in force: one probe row each."""
    probe: ProbeLimits | None = None
    policy: str = GuardConfig.name
    stuck_signal: str = GuardConfig.stuck_signal
    explicit_cap: int | None = None
    """The main configuration's explicit cap N (``None``: its cap is adaptive or disabled)."""
    cycle_cap: int | None = None
    """The main configuration's cycle cap M, ``max_cycles_per_turn`` (``None``: unbounded)."""

    @classmethod
    def from_config(cls, config: GuardConfig) -> CapSettings:
        adaptive = config.cap_mode == "adaptive"
        probe = config.probe_settings()
        return cls(
            soft_cap=buckets.soft_cap_of(config),
            hard_multiplier=config.hard_multiplier if adaptive else GuardConfig.hard_multiplier,
            stuck_repeat_threshold=config.stuck_repeat_threshold,
            streak_stop_at=config.streak_stop_at,
            cycle_repeat_stop_at=config.cycle_repeat_stop_at,
            thresholds=thresholds_in_force(config),
            probe=None if probe is None else _probe_limits(probe.config, probe.rate),
            policy=config.name,
            stuck_signal=config.stuck_signal,
            explicit_cap=config.hard_cap if config.cap_mode == "explicit" else None,
            cycle_cap=config.max_cycles_per_turn if config.max_cycles_per_turn > 0 else None,
        )

    @property
    def hard_cap(self) -> int:
        """The guard's own H (``100 x 1.15`` is 115, not 114): the bucket edge the what-if panels query."""
        return GuardConfig(soft_cap=self.soft_cap, hard_multiplier=self.hard_multiplier).hard_cap or 0

    def bands(self) -> list[tuple[int, int | None]]:
        """Tool-call bands (low, high]: 0-S, S-2S, 2S-3S, 3S-5S, ...-H, and past H (high None)."""
        h = self.hard_cap
        edges = [self.soft_cap * k for k in (1, 2, 3, 5) if self.soft_cap * k < h] + [h]
        lows = [0, *edges]
        return [*zip(lows, edges, strict=False), (h, None)]

    def probe_stops_at(self, threshold: Threshold) -> bool:
        """Whether the probe's own limit of ``threshold`` is not past the main configuration's
        (``sees_past``, calibrate's ``advice.row_cap``): it halts the turns the main one would halt
        there first, so no probe turn is seen past it, and its row of the probe evidence is never
        "within". ``False`` with no probe configured here (the board cannot say)."""
        p = self.probe
        if p is None:
            return False
        main, own = {
            Threshold.HARD_BACKSTOP: (self.hard_cap, p.hard_cap),
            Threshold.EXPLICIT: (self.explicit_cap, p.hard_cap),
            Threshold.SOFT_STUCK: (self.stuck_repeat_threshold, p.stuck_repeat_threshold),
            Threshold.STREAK: (self.streak_stop_at, p.limit(Threshold.STREAK)),
            Threshold.CYCLE_REPEAT: (self.cycle_repeat_stop_at, p.limit(Threshold.CYCLE_REPEAT)),
            Threshold.CYCLE_CAP: (self.cycle_cap, p.limit(Threshold.CYCLE_CAP)),
        }[threshold]
        return not sees_past(main, own)

    def probe_sees_past(self, calls: int) -> bool | None:
        """Whether the probe's cap lets its turns run past ``calls`` (``None``: no probe configured
        here, so the board cannot say)."""
        if self.probe is None:
            return None
        return sees_past(calls, self.probe.hard_cap)

    def probe_sees_past_cycles(self, requests: int) -> bool | None:
        """Whether the probe's cycle cap lets its turns make more than ``requests`` model requests
        (``None``: no probe configured here)."""
        if self.probe is None:
            return None
        limit = self.probe.limit(Threshold.CYCLE_CAP)
        return limit is None or limit > requests


DEFAULTS = CapSettings.from_config(GuardConfig())
