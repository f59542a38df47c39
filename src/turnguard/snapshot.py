"""Durable turns (DESIGN 9): a turn's state as versioned JSON, and a turn continued from it.

``turn.snapshot()`` returns plain JSON data: the ledger's facts (counts, key repeats as digests,
streaks, cycles, outcome totals, the levels that fired), the calls still waiting for their outcome
(by sequence number, name and ``call_id``), a latched HALT, a pending escalation the host passes
in, and the turn's identity. ``guard.resume(state)`` opens a turn in any process with those facts,
so every later verdict is the one the turn would have given had it never stopped.

The snapshot is refused (``SnapshotError``, a ``ValueError``) when the resuming guard could not
give those verdicts: another digest key (digests of the same call would differ; the default
per-process secret never matches another process, so durable turns need
``GuardConfig(digest_key=...)``), another value of a setting that decides verdicts (the cap, the
streak and cycle limits, the key mode, ...), or a version this module does not know. It never
holds tool arguments or the digest key: key repeats are digests, as in telemetry.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from turnguard.keys import store_key
from turnguard.model import Action, Level, LoopDetectedEvent, Outcome, Threshold, ToolCall, Verdict

if TYPE_CHECKING:
    from turnguard.config import GuardConfig

Guard = Turn = Any  # turnguard.guard calls in here; naming its classes would make an import cycle

VERSION = 1
KIND = "turnguard.turn"
NOT_DECIDING = frozenset(
    {"name", "digest_key", "capture_content", "disable_plugins", "load_entrypoints", "recorder_path", "shadow", "probe"}
)
"""GuardConfig settings that do not decide a turn's verdicts (reporting, plugin wiring, shadows,
whose state a snapshot does not carry, and the probe, whose cohort the snapshot names); every other
setting must be equal to resume."""
_PROBE_CALL = ("turnguard.snapshot", {"probe": 1})
"""A fixed call whose digest tells whether two guards share the digest key."""
_BYTE_FACTS = ("_last_key", "_news")
_COUNTERS = ("_counts", "_since_new")
_SCALAR_FACTS = (
    "_tool_calls",
    "_cycles",
    "_cycle_start",
    "_max_repeat",
    "_overflowed",
    "_last_tool",
    "_streak",
    "_failing",
    "_detections",
    "_retries",
    "_first_stuck",
    "_max_stale",
    "_looped",
    "_settled",
    "_seq",
    "_next",
    "_stop_peak",
)


class SnapshotError(ValueError):
    """A snapshot this guard cannot continue; the message says why."""


def snapshot(turn: Turn, pending: Verdict | None = None) -> dict[str, Any]:
    """``turn``'s state as JSON-serializable data (see the module docstring)."""
    with turn._lock:
        ledger = turn.ledger
        facts: dict[str, Any] = {name.lstrip("_"): getattr(ledger, name) for name in _SCALAR_FACTS}
        for name in _BYTE_FACTS:
            value = getattr(ledger, name)
            facts[name.lstrip("_")] = value.hex() if value is not None else None
        for name in _COUNTERS:
            facts[name.lstrip("_")] = {digest.hex(): n for digest, n in getattr(ledger, name).items()}
        facts["outcomes"] = ledger.outcome_counts()
        facts["early"] = {str(seq): outcome.value for seq, outcome in ledger._early.items()}
        facts["fired"] = sorted([list(pair) for pair in ledger._fired])
        awaiting = [[seq, call.name, call.call_id, call._key[0].hex()] for seq, call in turn._awaiting.items()]
        return {
            "version": VERSION,
            "kind": KIND,
            "turn": {
                "turn_id": ledger.turn_id,
                "conversation_id": ledger.conversation_id,
                "agent_name": ledger.agent_name,
                "promptable": ledger.promptable,
                "elapsed_s": time.monotonic() - ledger._started_at,
                "cohort": ledger.cohort,
            },
            "config": deciding_settings(turn.config),
            "key_check": _key_check(turn.guard),
            "facts": facts,
            "awaiting": awaiting,
            "halt": _verdict_data(turn._halt),
            "pending": _verdict_data(pending),
        }


def cohort_of(state: Any) -> str | None:
    """The cohort (``live`` or ``probe``) of the turn a snapshot was taken from, if it says."""
    identity = state.get("turn") if isinstance(state, Mapping) else None
    return identity.get("cohort") if isinstance(identity, Mapping) else None


def resume(guard: Guard, state: Any, open_turn: Any) -> Turn:
    """A turn of ``guard`` (opened by ``open_turn(**identity)``, without a new cohort draw)
    continuing the one ``state`` (a ``snapshot``) was taken from."""
    state = _checked(guard, state)
    identity = state["turn"]
    turn = open_turn(
        conversation_id=identity["conversation_id"],
        agent_name=identity["agent_name"],
        promptable=bool(identity["promptable"]),
        turn_id=identity["turn_id"],
    )
    try:
        _restore(turn, state)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        turn.end("abandoned")
        raise SnapshotError(f"the snapshot's facts are malformed ({type(exc).__name__}: {exc})") from exc
    return turn


def pending(state: Mapping[str, Any]) -> Verdict | None:
    """The escalation the snapshot was taken with (``turn.snapshot(pending=...)``), to resolve."""
    try:
        return _verdict(state.get("pending"))
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"the snapshot's pending escalation is malformed: {exc}") from exc


def deciding_settings(config: GuardConfig) -> dict[str, Any]:
    """The settings a resumed turn must share with the snapshot (JSON values)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in NOT_DECIDING}
    values["cap_mode"] = config.cap_mode  # whether the cap was set explicitly changes its semantics
    return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


# -- internals ---------------------------------------------------------------------------------


def _key_check(guard: Guard) -> str:
    return guard.keyer.digest(*_PROBE_CALL).hex()


def _checked(guard: Guard, state: Any) -> dict[str, Any]:
    if not isinstance(state, Mapping) or state.get("kind") != KIND:
        raise SnapshotError("not a turnguard turn snapshot (pass what turn.snapshot() returned)")
    version = state.get("version")
    if version != VERSION:
        raise SnapshotError(f"snapshot version {version!r} is not one this turnguard reads (version {VERSION})")
    if state.get("key_check") != _key_check(guard):
        raise SnapshotError(
            "the snapshot was taken by a guard with another digest key: its call digests would not match "
            "(give both guards the same GuardConfig(digest_key=...); the default is a per-process secret)"
        )
    ours, theirs = deciding_settings(guard.config), state.get("config")
    if not isinstance(theirs, Mapping):
        raise SnapshotError("the snapshot has no configuration")
    differing = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differing:
        detail = ", ".join(f"{k}: snapshot {theirs.get(k)!r}, guard {ours.get(k)!r}" for k in differing)
        raise SnapshotError(f"the snapshot was taken under another configuration ({detail})")
    return dict(state)


def _restore(turn: Turn, state: Mapping[str, Any]) -> None:
    ledger, facts = turn.ledger, state["facts"]
    with turn._lock:
        for name in _SCALAR_FACTS:
            setattr(ledger, name, facts[name.lstrip("_")])
        for name in _BYTE_FACTS:
            value = facts[name.lstrip("_")]
            setattr(ledger, name, bytes.fromhex(value) if value is not None else None)
        for name in _COUNTERS:
            setattr(ledger, name, {bytes.fromhex(d): int(n) for d, n in facts[name.lstrip("_")].items()})
        ledger.restore_outcome_counts(facts["outcomes"])
        ledger._early = {int(seq): Outcome(value) for seq, value in facts["early"].items()}
        ledger._fired = {(str(a), str(b)) for a, b in facts["fired"]}
        ledger._started_at = time.monotonic() - float(state["turn"]["elapsed_s"])
        for seq, name, call_id, digest in state["awaiting"]:
            call = ToolCall(name, None, call_id)  # the outcome finds it by call_id
            store_key(call, (bytes.fromhex(digest), turn._keyer, turn._token, int(seq)))
            turn._awaiting[int(seq)] = call
        turn._halt = _verdict(state["halt"]) or turn._halt  # (or the fail-closed halt of its opening)


def _verdict_data(verdict: Verdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    event = verdict.event
    return {
        "action": verdict.action.label,
        "threshold": str(verdict.threshold) if verdict.threshold is not None else None,
        "message": verdict.message,
        "event": None if event is None else {f.name: _plain(getattr(event, f.name)) for f in dataclasses.fields(event)},
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Action):
        return value.label
    return value.value if isinstance(value, Level | Threshold) else value


def _verdict(data: Any) -> Verdict | None:
    if data is None:
        return None
    event_data = data["event"]
    event = None
    if event_data is not None:
        fields = dict(event_data)
        fields["threshold"] = _threshold(fields["threshold"])
        fields["action"] = _action(fields["action"])
        fields["level"] = Level(fields["level"])
        event = LoopDetectedEvent(**fields)
    threshold = _threshold(data["threshold"]) if data["threshold"] is not None else None
    return Verdict(_action(data["action"]), threshold, data["message"], event)


def _action(value: Any) -> Action:
    for action in Action:
        if action.label == value:
            return action
    raise ValueError(f"unknown action {value!r}")


def _threshold(value: str) -> Threshold | str:
    try:
        return Threshold(value)
    except ValueError:
        return value  # a third-party plugin's threshold name
