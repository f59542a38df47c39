"""What a recording says about the policies in force and the traffic, by cohort and policy: the
caps the probe ran under (a row at or above them cannot be seen past), the live policy, and how
long the recording spans. At most ``MAX_POLICIES`` (cohort, policy, limits) are kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnguard._calibrate.bounds import COHORT_KEYS, Key, count, dump, load
from turnguard._calibrate.records import (
    FIRST_LIMIT_KEYS,
    LIMIT_KEYS,
    MAX_TIME,
    NAME_LIST_KEYS,
    Limits,
    RecordedTurn,
    read_limits,
)
from turnguard._model import MAX_ID_LENGTH

MAX_POLICIES = 100
"""Distinct (cohort, policy, limits) kept; past it, turns are counted in ``left_out``."""
SECONDS_PER_DAY = 86_400.0


@dataclass
class PolicySeen:
    """The turns of one cohort that ran under one policy and limits."""

    cohort: str
    policy: str | None
    limits: Limits | None
    turns: int = 0
    calls: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"cohort": self.cohort, "policy": self.policy,
                "limits": None if self.limits is None else self.limits.to_json(), "turns": self.turns,
                "calls": self.calls}


@dataclass
class Recording:
    """The policies, limits and times of the recorded turns."""

    seen: dict[tuple[str, str | None, Limits | None], PolicySeen] = field(default_factory=dict)
    left_out: int = 0
    """Turns of (cohort, policy, limits) past ``MAX_POLICIES``."""
    first_started: float | None = None
    last_ended: float | None = None
    timed: int = 0
    """Turns recorded with their start and end."""
    untimed: int = 0

    def add(self, turn: RecordedTurn, cohort: str) -> None:
        key = (cohort, turn.policy, turn.limits)
        entry = self.seen.get(key)
        if entry is None:
            if len(self.seen) >= MAX_POLICIES:
                self.left_out += 1
            else:
                entry = self.seen[key] = PolicySeen(cohort, turn.policy, turn.limits)
        if entry is not None:
            entry.turns += 1
            entry.calls += turn.needed_calls
        if turn.started_at is None or turn.ended_at is None:
            self.untimed += 1
            return
        self.timed += 1
        if self.first_started is None or turn.started_at < self.first_started:
            self.first_started = turn.started_at
        if self.last_ended is None or turn.ended_at > self.last_ended:
            self.last_ended = turn.ended_at

    @property
    def days(self) -> float | None:
        """How long the recording spans, in days (``None``: no turn times, or no time at all)."""
        if self.first_started is None or self.last_ended is None or self.last_ended <= self.first_started:
            return None
        return (self.last_ended - self.first_started) / SECONDS_PER_DAY

    def limits_of(self, cohort: str) -> list[tuple[Limits, int]]:
        """The limits the cohort's turns ran under, with their turn counts, most turns first."""
        found: dict[Limits, int] = {}
        for entry in self.seen.values():
            if entry.cohort == cohort and entry.limits is not None:
                found[entry.limits] = found.get(entry.limits, 0) + entry.turns
        return sorted(found.items(), key=lambda item: -item[1])

    def unlimited_turns(self, cohort: str) -> int:
        """The cohort's turns recorded without their limits (older recordings)."""
        return sum(e.turns for e in self.seen.values() if e.cohort == cohort and e.limits is None)

    def merge(self, other: Recording) -> None:
        for key, theirs in other.seen.items():
            mine = self.seen.get(key)
            if mine is None and len(self.seen) >= MAX_POLICIES:
                self.left_out += theirs.turns
                continue
            if mine is None:
                mine = self.seen[key] = PolicySeen(theirs.cohort, theirs.policy, theirs.limits)
            mine.turns += theirs.turns
            mine.calls += theirs.calls
        self.left_out += other.left_out
        self.timed += other.timed
        self.untimed += other.untimed
        if other.first_started is not None:
            self.first_started = other.first_started if self.first_started is None else min(self.first_started,
                                                                                           other.first_started)
        if other.last_ended is not None:
            self.last_ended = other.last_ended if self.last_ended is None else max(self.last_ended, other.last_ended)

    def to_json(self) -> dict[str, Any]:
        return dump(self, _RECORDING_KEYS)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recording:
        """A ``--json`` result's recording, checked like any input (``ValueError`` when not)."""
        r = cls(**load(data, _RECORDING_KEYS))
        if (r.first_started is None) != (r.last_ended is None) or (
                r.first_started is not None and r.last_ended is not None and r.last_ended < r.first_started):
            raise ValueError("the recording's first start and last end do not make a time span")
        return r


def _seen(policies: Any, what: str) -> dict[tuple[str, str | None, Limits | None], PolicySeen]:
    if not isinstance(policies, list) or len(policies) > MAX_POLICIES:
        raise ValueError(f"the recording's policies must be a list of at most {MAX_POLICIES}")
    return {(e.cohort, e.policy, e.limits): e for e in map(_policy_seen, policies)}


def _policy_seen(item: Any) -> PolicySeen:
    if not isinstance(item, dict) or item.get("cohort") not in COHORT_KEYS:
        raise ValueError(f"a recorded policy must have a cohort among {', '.join(COHORT_KEYS)}: {item!r:.80}")
    policy = item["policy"]
    if policy is not None and not (isinstance(policy, str) and len(policy) <= MAX_ID_LENGTH):
        raise ValueError(f"a recorded policy name must be a text of at most {MAX_ID_LENGTH} characters")
    raw = item["limits"]
    limits = None
    if raw is not None:
        if not isinstance(raw, dict) or not set(FIRST_LIMIT_KEYS) <= set(raw) <= {*LIMIT_KEYS, *NAME_LIST_KEYS}:
            raise ValueError(f"recorded limits must have {', '.join(FIRST_LIMIT_KEYS)} (and maybe "
                             f"{', '.join(k for k in (*LIMIT_KEYS, *NAME_LIST_KEYS) if k not in FIRST_LIMIT_KEYS)})"
                             f": {raw!r:.80}")
        limits = read_limits(raw)
    return PolicySeen(item["cohort"], policy, limits, count(item["turns"]), count(item["calls"]))


def time_or_none(value: Any, what: str = "a time") -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= MAX_TIME:
        raise ValueError(f"{what} must be Unix seconds, got {value!r:.40}")
    return float(value)


_RECORDING_KEYS = (
    Key("policies", "seen", lambda seen: [e.to_json() for e in seen.values()], _seen),
    Key("policies_left_out", "left_out"), Key("first_started", into=time_or_none),
    Key("last_ended", into=time_or_none), Key("turns_with_times", "timed"),
    Key("turns_without_times", "untimed"), Key("days", into=None),
)
