"""Durable turns: a turn's state as versioned JSON, and a turn continued from it.

``turn.snapshot()`` returns plain JSON data (version 2):

- ``turn``: the turn's identity (``turn_id``, ``conversation_id``, ``agent_name``, ``promptable``,
  ``cohort``, ``durable``, ``elapsed_s``; ``resolved`` when a result was reported already;
  ``lineage``, the turn's markers, 32 random hex digits each: its own, drawn when it opened or
  was resumed, after those of the turns it continues; ``lineage_checks``, for each of those, the
  last of its checks this turn continues (``null``: all of them); see ``TurnState.lineage``);
- ``config``: the settings that decide verdicts, which the resuming guard must share;
- ``keying`` (``process``, ``digest_key`` or ``turn``) and ``key_check``, a digest of a fixed
  call that tells whether the resuming guard keys calls the same way; ``turn_key``: a durable
  turn's own digest key (hex), when it has one;
- ``facts``: the ledger's facts (``Ledger.state``: counts, key repeats as digests, streaks,
  cycles, outcome totals, the levels that fired, the ended streaks still settling; with
  ``stateful_tools``, written only when they hold something: ``polled``, the stateful calls
  whose repeat waits for their outcome, ``results`` and ``baseline``, result digests not
  settled yet and the streak's latest, ``restarts`` by tool; a repeat's key may then be a
  (call, result) pair's two digests);
- ``awaiting``: the calls still waiting for their outcome, ``[check number, tool name, call_id,
  digest]`` in check order, and fifth, for a call object checked more than once, the check its
  key names when that is another (the object's earlier check: its other checks are the entries
  naming the same one, so the object's outcomes settle them in order after a resume in the same
  process);
- ``halt`` and ``pending``: a latched HALT, and an escalation the host is waiting on the user for;
- ``plugins``: the plugins' per-turn state by plugin name (``turnguard_turn_snapshot``), such as
  the shadow policies' and the probe's main-configuration shadow's (``shadow``).

``guard.resume(state)`` opens a turn with those facts, in any process that can honour them, so
every later verdict, and every shadow's, is the one the turn would have given had it never
stopped. Keying decides where that is: a turn opened with ``guard.turn(durable=True)`` keys its
calls under a key of its own that its snapshot carries (``keys.turn_keyer``), and resumes in any
process with the default configuration; a turn keyed by the guard's ``digest_key`` resumes where
the same ``digest_key`` is set; any other turn is keyed by its process's own secret and resumes
only in that process.

Every field is read back like any input (``turnguard._state``): type, range, the bounds a live turn
keeps, and a field that names an entry of another finds it there (``facts.last_key`` a counted key,
the checks the streaks and cycle runs wait on calls ``awaiting`` lists); a bad one is a
``SnapshotError`` naming it. So is a snapshot of another configuration (a probe turn's resumes
under the settings it was decided with: ``Guard.resume``), one the keys do not match, or an
unknown version. Version 1 snapshots (before ``plugins``,
``keying`` and ended streaks) still resume: their plugins' state starts afresh, which the
resumed turn says (``TurnSummary.fresh_state``). A snapshot without ``turn.lineage`` (written
before it, as every version 1 one) resumes under a marker of its own, and counts as the turns
it continues those of this process of the snapshot's ``turn_id`` (and of its ``resumed_from``);
one without ``turn.lineage_checks`` continues the whole of each turn its lineage names.

Extending version 2 (the format's rule, so that a version bump is needed only for a change of
meaning): a field added later goes into a section (``turn``, ``facts``, ``plugins.<name>``), is
optional, written only when it holds something other than its default, and read as its default
when absent (so is an ``awaiting`` entry's fifth element). Inside the sections a reader refuses a
field it does not know, naming it, so a snapshot holding state an older turnguard cannot honour
fails there instead of resuming with that state lost (an older reader refuses a five-element
``awaiting`` entry alike). The top level is open to hosts and adapters, which may keep their own data there
beside turnguard's (under names turnguard does not use); a plugin's section is its own, and one
for a plugin the resuming guard does not have is dropped.

The snapshot never holds tool arguments, tool results or the guard's digest key: key repeats and
results are digests, as in telemetry.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from turnguard import _state as st
from turnguard._config import GuardConfig
from turnguard._keys import DIGEST_SIZE, TURN_KEY_SIZE, turn_keyer
from turnguard._ledger import GIVE_UP_AFTER, GIVE_UP_EVERY, Ledger, LedgerView
from turnguard._model import Action, Level, LoopDetectedEvent, Threshold, Verdict
from turnguard._state import Fields, SnapshotError
from turnguard._task_results import MAX_RECENT_TURNS

if TYPE_CHECKING:
    from turnguard._dispatch import Dispatcher
    from turnguard._keys import Keyer

Guard: TypeAlias = Any  # turnguard._guard calls in here; naming its classes would make an import cycle

__all__ = ["KIND", "LINEAGE_SIZE", "MAX_LINEAGE", "VERSION", "Lineage", "SnapshotError", "TurnState", "Waiting",
           "cohort_of", "continued_checks", "decided_config", "deciding_settings", "lineage_of", "pending",
           "plugin_states", "read_verdict", "restore", "resume_plugins", "resumed_lineage", "turn_snapshot",
           "verdict_data", "write"]

VERSION = 2
READS = (1, 2)
"""The versions ``restore`` reads."""
KIND = "turnguard.turn"
NOT_DECIDING = frozenset(
    {"name", "digest_key", "capture_content", "disable_plugins", "load_entrypoints", "recorder_path",
     "recorder_results", "shadow", "probe"}
)
"""GuardConfig settings that do not decide a turn's verdicts (reporting, plugin wiring, the shadows,
whose state is theirs, and the probe, whose cohort the snapshot names); every other setting must
be equal to resume."""
KEYINGS = ("process", "digest_key", "turn")
"""How a turn's calls were keyed: by its process's own secret, by ``digest_key``, by its own key."""
MAX_WAITING = GIVE_UP_AFTER + GIVE_UP_EVERY
"""The most calls a live turn keeps waiting for an outcome (``ledger.overdue``: ``GIVE_UP_AFTER``,
looked at every ``GIVE_UP_EVERY`` checks), so the most a snapshot may list."""
MAX_EVENT_LIMIT = 2**63
_PROBE_CALL = ("turnguard.snapshot", {"probe": 1})
"""A fixed call whose digest tells whether two keyers agree."""
_ELAPSED_MAX = 1e10
LINEAGE_SIZE = 16
"""The bytes of a lineage marker (``TurnState.lineage``): random, so no two turns draw one alike."""
MAX_LINEAGE = 32
"""The most markers a lineage keeps: a resume's beyond, the oldest is dropped (its turn's objects,
that many resumes back, are then no longer known as the turn's own)."""
_ACTIONS = {action.label: action for action in Action}
_LEVELS = tuple(level.value for level in Level)


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A call still waiting for its outcome, as a snapshot lists it."""

    seq: int
    """Its check number."""
    name: str
    call_id: str | None
    digest: bytes
    """Its key digest."""
    named: int
    """The check the call object's key names: ``seq``, or the earlier check of an object checked
    more than once (the entries naming one check are one object's)."""


@dataclasses.dataclass(frozen=True)
class TurnState:
    """What a snapshot holds of a turn beyond the guard's settings: the record a ``Turn`` builds of
    itself, under its lock, for ``write``, and the one ``restore`` reads back for a turn to continue
    from. The boundary between a turn and its snapshot: this module reads no part of a ``Turn``."""

    ledger: Ledger
    """The turn's facts (its identity, counts and streaks; ``Ledger.state``)."""
    keyer: Keyer
    """How the turn keys its calls (a durable turn's own key, or its guard's)."""
    durable: bool
    resolved: bool | None
    """The task's result, when the host reported it during the turn."""
    awaiting: list[Waiting]
    """The calls still waiting for their outcome, in check order."""
    halt: Verdict | None
    """The latched HALT."""
    plugins: dict[str, Any]
    """The plugins' per-turn state by plugin name (``plugin_states``)."""
    lineage: tuple[bytes, ...] | None
    """The markers of the turns this one continues, its own last (``lineage_of``): a turn opened
    fresh draws one, and so does every resume (``resumed_lineage``), under the snapshot's id or
    another, so each marker is one ``Turn``'s. A turn in the process where the turns it continues
    checked calls knows their objects' keys as naming its own checks, up to where it continues
    them (``until``), and no other turn's: not an unrelated one's of the same id, nor a fork's,
    nor a sibling's (another resume of the same snapshot), nor what the snapshot's turn checked
    after it. ``None``: read from a snapshot written without one."""
    until: tuple[int | None, ...] = ()
    """For each marker of ``lineage`` but the last, the last check of that turn this one continues
    (the check count of the snapshot it was resumed from); ``None``: the whole turn (read from a
    snapshot written before these bounds)."""


def lineage_of(restored: TurnState | None) -> tuple[tuple[bytes, ...], tuple[int | None, ...]]:
    """A turn's lineage and its ``until`` (``TurnState.lineage``): those ``restore`` gave a resumed
    turn, else (a turn opened fresh, or resumed from a snapshot without a lineage) a marker of its own."""
    if restored is not None and restored.lineage:
        return restored.lineage, restored.until
    return (secrets.token_bytes(LINEAGE_SIZE),), ()


def resumed_lineage(lineage: tuple[bytes, ...], until: tuple[int | None, ...], checks: int
                    ) -> tuple[tuple[bytes, ...], tuple[int | None, ...]]:
    """The lineage (and its ``until``) of a turn resumed from a snapshot of a turn whose are
    ``lineage`` and ``until``, taken after its ``checks``-th check: a marker of its own after
    those, the snapshot's turn continued up to there; the latest ``MAX_LINEAGE`` markers."""
    markers = (*lineage, secrets.token_bytes(LINEAGE_SIZE))[-MAX_LINEAGE:]
    return markers, (*until, checks)[1 - len(markers):]


def continued_checks(lineage: tuple[bytes, ...], until: tuple[int | None, ...]) -> dict[bytes, int]:
    """The last check a turn continues of each turn of its lineage before it, by marker (``None``
    in ``until``: the whole turn)."""
    return {marker: st.MAX_COUNT if last is None else last for marker, last in zip(lineage, until, strict=False)}


def write(turn: TurnState, config: GuardConfig, pending: Verdict | None = None) -> dict[str, Any]:
    """``turn``'s state as JSON-serializable data (see the module docstring); ``config`` is its guard's."""
    ledger, keyer = turn.ledger, turn.keyer
    identity: dict[str, Any] = {
        "turn_id": ledger.turn_id,
        "conversation_id": ledger.conversation_id,
        "agent_name": ledger.agent_name,
        "promptable": ledger.promptable,
        "cohort": ledger.cohort,
        "durable": turn.durable,
        "elapsed_s": time.monotonic() - ledger.started_at,
    }
    if turn.resolved is not None:
        identity["resolved"] = turn.resolved
    if turn.lineage is not None:
        identity["lineage"] = [marker.hex() for marker in turn.lineage]
    if turn.until:
        identity["lineage_checks"] = list(turn.until)
    data: dict[str, Any] = {
        "version": VERSION,
        "kind": KIND,
        "turn": identity,
        "config": deciding_settings(config),
        "keying": keying_of(config, keyer),
        "key_check": _key_check(keyer),
        "facts": ledger.state(),
        "awaiting": [[w.seq, w.name, w.call_id, w.digest.hex(), *((w.named,) if w.named != w.seq else ())]
                     for w in turn.awaiting],
        "halt": verdict_data(turn.halt),
        "pending": verdict_data(pending),
    }
    if keyer.turn_key is not None:
        data["turn_key"] = keyer.turn_key.hex()
    if turn.plugins:
        data["plugins"] = turn.plugins
    return data


def keying_of(config: GuardConfig, keyer: Keyer) -> str:
    if keyer.turn_key is not None:
        return "turn"
    return "digest_key" if config.digest_key else "process"


def cohort_of(state: Any) -> str | None:
    """The cohort (``live`` or ``probe``) of the turn a snapshot was taken from, if it says."""
    identity = state.get("turn") if isinstance(state, Mapping) else None
    return identity.get("cohort") if isinstance(identity, Mapping) else None


def restore(guard: Guard, state: Any) -> TurnState:
    """What a turn of ``guard`` continuing the one ``state`` (a ``snapshot``) was taken from starts
    with: its ledger under the snapshot's turn id (an id of its own, ``resumed_from`` the
    snapshot's, where ``guard`` holds a turn of that id already: a fork), taken in the guard's
    ``lineage``; the rest for the turn to take back (``Turn`` does, opened without a new cohort
    draw)."""
    restored = _read(guard, state)
    identity = restored.identity
    turn_id, resumed_from = identity["turn_id"], None
    if not guard.lineage.claim(turn_id):  # this guard holds a turn of that id already: a fork
        resumed_from, turn_id = turn_id, uuid.uuid4().hex
        guard.lineage.claim(turn_id)
    try:
        ledger = Ledger.from_state(
            guard.config, restored.facts, elapsed_s=identity["elapsed_s"], turn_id=turn_id,
            conversation_id=identity["conversation_id"], agent_name=identity["agent_name"],
            promptable=identity["promptable"], cohort=guard.cohort, resumed_from=resumed_from,
            fresh_state=restored.fresh)
        _check_waiting(ledger, restored.awaiting)
    except SnapshotError:
        guard.lineage.closed(turn_id, suspended=True)  # no turn took the id
        raise
    lineage: tuple[bytes, ...] | None = identity["lineage"]
    until: tuple[int | None, ...] = ()
    if lineage is not None:
        lineage, until = resumed_lineage(lineage, identity["lineage_checks"], ledger.checks)
    return TurnState(ledger, restored.keyer, identity["durable"], identity.get("resolved"), restored.awaiting,
                     restored.halt, restored.plugins, lineage, until)


def pending(state: Any) -> Verdict | None:
    """The escalation the snapshot was taken with (``turn.snapshot(pending=...)``), to resolve."""
    fields = Fields(state, "")
    return read_verdict(fields.get("pending", None), "pending")


def deciding_settings(config: GuardConfig) -> dict[str, Any]:
    """The settings a resumed turn must share with the snapshot (JSON values)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in NOT_DECIDING}
    values["cap_mode"] = config.cap_mode  # whether the cap was set explicitly changes its semantics
    return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


def decided_config(config: GuardConfig, settings: Any) -> GuardConfig:
    """``config`` with the deciding settings a snapshot was taken under (``deciding_settings``'
    values; one it does not name at its default): a turn resumed under it decides as it did,
    whatever the configuration became since. ``SnapshotError`` when they are not settings this
    version can take."""
    from turnguard._config import ConfigError

    ours = deciding_settings(config)
    if not isinstance(settings, Mapping):
        st.refuse("config", "an object (the settings the turn was decided under)", settings)
    unknown = sorted(map(str, set(settings) - set(ours)))
    if unknown:
        raise SnapshotError(f"the snapshot's field 'config' names settings this version does not have: "
                            f"{', '.join(unknown)}", "config")
    changes = {k: v for k, v in {**_DEFAULTS, **settings}.items() if k in ours and k != "cap_mode"}
    try:
        decided = config.replace(**changes)
    except (ConfigError, TypeError) as exc:
        raise SnapshotError(f"the snapshot's field 'config' holds settings that cannot be taken: {exc}",
                            "config") from None
    if settings.get("cap_mode", decided.cap_mode) != decided.cap_mode:
        raise SnapshotError(f"the snapshot's field 'config' gives cap_mode {st.shown(settings['cap_mode'])}, "
                            "which is not its settings'", "config")
    return decided


class Lineage:
    """The turn ids a guard's snapshots and resumes have used (the most recent ``MAX_RECENT_TURNS``):
    a snapshot resumes under its turn's id unless a turn of that id is in use here, open or ended
    (a second resume of one snapshot, or one of a turn that went on, whatever other turns of that
    id were put aside): then the resumed turn gets an id of its own and records ``resumed_from``. A
    suspended turn's id is free for its one continuation."""

    def __init__(self, limit: int = MAX_RECENT_TURNS) -> None:
        self._ids: OrderedDict[str, tuple[int, bool]] = OrderedDict()
        """By turn id: how many turns of it this guard knows open (snapshotted or resumed), and
        whether one ended (not put aside)."""
        self._limit = limit
        self._lock = threading.Lock()

    def opened(self, turn_id: str) -> None:
        """A turn of this id is open here (its first snapshot was taken); ``closed`` when it ends."""
        with self._lock:
            open_turns, ended = self._ids.get(turn_id, (0, False))
            self._keep(turn_id, open_turns + 1, ended)

    def claim(self, turn_id: str) -> bool:
        """Take ``turn_id`` for a resumed turn (open, until ``closed``): ``False`` when a turn of
        that id is in use here."""
        with self._lock:
            open_turns, ended = self._ids.get(turn_id, (0, False))
            if open_turns or ended:
                return False
            self._keep(turn_id, 1, False)
            return True

    def closed(self, turn_id: str, suspended: bool) -> None:
        """A turn ``opened`` or ``claim``-ed here ended, or was put aside (its id stays in use when
        it ended, and while other turns of that id are open)."""
        with self._lock:
            if turn_id in self._ids:
                open_turns, ended = self._ids[turn_id]
                self._ids[turn_id] = (max(open_turns - 1, 0), ended or not suspended)

    def _keep(self, turn_id: str, open_turns: int, ended: bool) -> None:
        self._ids[turn_id] = (open_turns, ended)
        self._ids.move_to_end(turn_id)
        if len(self._ids) > self._limit:
            self._ids.popitem(last=False)


# -- reading a snapshot back ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Restored:
    identity: dict[str, Any]
    keyer: Keyer
    facts: Any
    awaiting: list[Waiting]
    halt: Verdict | None
    plugins: dict[str, Any]
    fresh: tuple[str, ...]


def turn_snapshot(state: Any) -> Mapping[str, Any]:
    """``state`` when it is a turn snapshot (an object whose ``kind`` is ``KIND``), else the
    ``SnapshotError`` naming ``kind``: what an adapter checks before it reads its own section."""
    if not isinstance(state, Mapping) or state.get("kind") != KIND:
        raise SnapshotError(f"not a turnguard turn snapshot: its field 'kind' must be {KIND!r} (pass what "
                            "turn.snapshot() returned)", "kind")
    return state


def _read(guard: Guard, state: Any) -> _Restored:
    state = turn_snapshot(state)
    version = state.get("version")
    if type(version) is not int or version not in READS:
        raise SnapshotError(f"the snapshot's field 'version' is {st.shown(version)}, not one this turnguard reads "
                            f"(versions {', '.join(map(str, READS))})", "version")
    f = Fields(state, "")
    f.get("kind")
    f.get("version")
    facts = f.get("facts")
    if not isinstance(facts, Mapping):
        st.refuse("facts", "an object", facts)
    seq = Fields(facts, "facts").integer("seq")
    identity = _identity(f.object("turn"), version, seq)
    _check_config(guard.config, f.get("config"))
    keyer = _keyer(guard, f, version)
    awaiting = _awaiting(f, seq)
    halt = read_verdict(f.get("halt"), "halt")
    if halt is not None and halt.action is not Action.HALT:
        st.refuse("halt.action", "halt (the latched verdict)", halt.action.label)
    read_verdict(f.get("pending"), "pending")
    plugins = f.mapping("plugins", 1024, default={}) if version >= 2 else {}
    # (no f.done() here: the top level is open to hosts, which keep their own data beside turnguard's)
    names = [observer.plugin for observer in guard.dispatcher.observers("turnguard_turn_snapshot")]
    fresh = tuple(dict.fromkeys(name for name in names if name not in plugins))
    return _Restored(identity, keyer, facts, awaiting, halt, plugins, fresh)


def _check_config(config: GuardConfig, theirs: Any) -> None:
    """The snapshot's deciding settings are this guard's; one it does not name (a setting added
    since it was taken) must be at its default, which decides as before the setting existed."""
    ours = deciding_settings(config)
    if not isinstance(theirs, Mapping):
        st.refuse("config", "an object (the settings the turn was decided under)", theirs)
    theirs = {**{k: v for k, v in _DEFAULTS.items() if k in ours}, **theirs}
    differing = sorted(str(k) for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)
                       or isinstance(ours.get(k), bool) is not isinstance(theirs.get(k), bool))  # 1 is not True
    if differing:
        detail = "; ".join(f"config.{k} is {st.shown(theirs.get(k))} in the snapshot, {ours.get(k)!r} here"
                           for k in differing)
        raise SnapshotError(f"the snapshot was taken under another configuration: {detail}", f"config.{differing[0]}")


def _defaults() -> dict[str, Any]:
    return {f.name: (list(f.default) if isinstance(f.default, tuple) else f.default)
            for f in dataclasses.fields(GuardConfig) if f.default is not dataclasses.MISSING}


_DEFAULTS = _defaults()


def _keyer(guard: Guard, f: Fields, version: int) -> Keyer:
    """The keyer the resumed turn keys its calls with, once the snapshot's key check agrees."""
    keying = f.choice("keying", KEYINGS) if version >= 2 else "digest_key" if guard.config.digest_key else None
    check = f.text("key_check", nonempty=True)
    if keying == "turn":
        keyer = turn_keyer(guard.config.key_mode, f.digest("turn_key", TURN_KEY_SIZE))
        if _key_check(keyer) != check:
            raise SnapshotError("the snapshot's field 'turn_key' does not give its key_check (the key was altered)",
                                "turn_key")
        return keyer
    if _key_check(guard.keyer) == check:
        return guard.keyer
    if keying == "digest_key":
        why = ("it was taken by a guard with another digest key: its call digests would not match here (give every "
               "guard the same GuardConfig(digest_key=...), or open the turn with guard.turn(durable=True) and "
               "no digest_key)")
    else:
        why = ("its turn was opened without durable=True and without digest_key, so its call digests are those of "
               "the process that took it (a per-process secret) and mean nothing here; open turns that must resume "
               "in another process with guard.turn(durable=True), or give every guard the same "
               "GuardConfig(digest_key=...)")
    raise SnapshotError(f"this guard cannot continue the snapshot (its field 'key_check' does not match): {why}",
                        "key_check")


def _identity(f: Fields, version: int, seq: int) -> dict[str, Any]:
    identity = {
        "turn_id": f.text("turn_id", nonempty=True),
        "conversation_id": f.text("conversation_id", optional=True),
        "agent_name": f.text("agent_name", optional=True),
        "promptable": f.boolean("promptable"),
        "cohort": f.choice("cohort", ("live", "probe")),
        "elapsed_s": f.number("elapsed_s", 0, _ELAPSED_MAX),
        "durable": f.boolean("durable") if version >= 2 else False,
    }
    resolved = f.get("resolved", None) if version >= 2 else None
    if resolved is not None:
        identity["resolved"] = st.boolean(f.at("resolved"), resolved)
    identity["lineage"] = _lineage(f) if version >= 2 else None
    identity["lineage_checks"] = _lineage_checks(f, identity["lineage"], seq)
    f.done()
    return identity


def _lineage(f: Fields) -> tuple[bytes, ...] | None:
    """``turn.lineage``: 1 to ``MAX_LINEAGE`` markers, or ``None`` when absent (or null)."""
    if f.get("lineage", None) is None:
        return None
    markers = f.items("lineage", MAX_LINEAGE)
    if not markers:
        st.refuse(f.at("lineage"), f"an array of 1 to {MAX_LINEAGE} markers", markers)
    return tuple(st.digest(f"{f.at('lineage')}[{i}]", marker, LINEAGE_SIZE) for i, marker in enumerate(markers))


def _lineage_checks(f: Fields, lineage: tuple[bytes, ...] | None, seq: int) -> tuple[int | None, ...]:
    """``turn.lineage_checks``: a check count up to the snapshot's ``facts.seq``, or null, for each
    marker of the lineage but the last (``TurnState.until``); absent, each null (a lineage written
    before them)."""
    ancestors = len(lineage) - 1 if lineage is not None else 0
    if f.get("lineage_checks", None) is None:
        return (None,) * ancestors
    path = f.at("lineage_checks")
    bounds = f.items("lineage_checks", MAX_LINEAGE)
    if len(bounds) != ancestors:
        st.refuse(path, f"an array of {ancestors} check counts, one for each marker of turn.lineage but the last",
                  bounds)
    return tuple(None if bound is None else st.integer(f"{path}[{i}]", bound, 0, seq)
                 for i, bound in enumerate(bounds))


def _awaiting(f: Fields, seq: int) -> list[Waiting]:
    """The waiting calls: each a check number up to the snapshot's ``facts.seq``, in check order;
    the check an entry's key names (its fifth element, else its own) is one of those too."""
    entries: list[Waiting] = []
    low, last = 1, max(seq, 0)
    for i, entry in enumerate(f.items("awaiting", MAX_WAITING)):
        path = f"awaiting[{i}]"
        if not isinstance(entry, list | tuple) or len(entry) not in (4, 5):
            st.refuse(path, "a [check number, tool name, call_id, digest] entry (and the check its key names)",
                      entry)
        number = st.integer(f"{path}[0]", entry[0], low, last)
        named = st.integer(f"{path}[4]", entry[4], 1, last) if len(entry) == 5 else number
        entries.append(Waiting(number, st.text(f"{path}[1]", entry[1], nonempty=True),
                               st.text(f"{path}[2]", entry[2], optional=True),
                               st.digest(f"{path}[3]", entry[3], DIGEST_SIZE), named))
        low = number + 1
    return entries


def _check_waiting(ledger: Ledger, awaiting: list[Waiting]) -> None:
    """Each check the facts wait for an outcome of (``Ledger.waiting_checks``) is a call ``awaiting``
    lists, of the digest they say: else its outcome would never come (or come for another call),
    and what waits on it would never settle."""
    waiting = {entry.seq: entry.digest for entry in awaiting}
    for checks in ledger.waiting_checks():
        first, last, early = checks.first, checks.last, checks.early
        if (first not in waiting or checks.digest not in (None, waiting[first])
                or last - first + 1 > len(waiting) + len(early)
                or any(check not in waiting and check not in early for check in range(first, last + 1))):
            st.refuse(f"facts.{checks.field}", f"the first of checks up to {last} each listed in awaiting (waiting "
                      "for its outcome) or settled early, the first with the digest the facts give it", first)


def read_verdict(data: Any, path: str) -> Verdict | None:
    """A verdict ``verdict_data`` wrote, at ``path`` (``None`` for null)."""
    if data is None:
        return None
    f = Fields(data, path)
    action = _ACTIONS[f.choice("action", tuple(_ACTIONS))]
    threshold = f.text("threshold", optional=True)
    message = f.text("message")
    event_data = f.get("event")
    f.done()
    event = None if event_data is None else _event(Fields(event_data, f.at("event")))
    return Verdict(action, _threshold(threshold) if threshold is not None else None, message, event)


_EVENT_COUNTS = ("tool_calls", "cycles", "max_key_repeat", "streak_length", "failing_streak_length")
_EVENT_TEXTS = ("tool_name", "key_digest", "conversation_id", "agent_name")


def _event(f: Fields) -> LoopDetectedEvent:
    fields: dict[str, Any] = {name: f.integer(name) for name in _EVENT_COUNTS}
    fields.update({name: f.text(name, optional=True) for name in _EVENT_TEXTS})
    fields["limit"] = f.integer("limit", 0, MAX_EVENT_LIMIT)
    for name in ("soft_cap", "hard_cap"):
        value = f.get(name)
        fields[name] = None if value is None else st.integer(f.at(name), value, 0, MAX_EVENT_LIMIT)
    fields["threshold"] = _threshold(f.text("threshold", nonempty=True))
    fields["action"] = _ACTIONS[f.choice("action", tuple(_ACTIONS))]
    fields["level"] = Level(f.choice("level", _LEVELS))
    fields["promptable"] = f.boolean("promptable")
    fields["turn_id"] = f.text("turn_id", nonempty=True)
    fields["event_id"] = f.text("event_id", nonempty=True)
    fields["cap_mode"] = f.text("cap_mode", nonempty=True)
    fields["message"] = f.text("message")
    f.done()
    return LoopDetectedEvent(**fields)


def _threshold(value: str) -> Any:
    try:
        return Threshold(value)
    except ValueError:
        return value  # a third-party plugin's threshold name


# -- writing one -------------------------------------------------------------------------------------


def _key_check(keyer: Keyer) -> str:
    return keyer.digest(*_PROBE_CALL).hex()


def verdict_data(verdict: Verdict | None) -> dict[str, Any] | None:
    """A verdict (and its event) as JSON data; ``read_verdict`` reads it back."""
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
    return str(value) if isinstance(value, str) else value  # a Level or Threshold as its string


# -- plugins' per-turn state ---------------------------------------------------------------------------


def plugin_states(dispatch: Dispatcher, view: LedgerView) -> dict[str, Any]:
    """``turnguard_turn_snapshot``'s answers by plugin name: a plugin that raises, or answers what
    is not JSON data (a set, an object, ``NaN``, a cycle), is reported and left out (its state is
    its own: the snapshot goes on without it, whatever the fail mode, and stays JSON)."""
    hook = "turnguard_turn_snapshot"
    states = dispatch.call_each(hook, dispatch.observers(hook), view, {"turn": view})[0]
    for name, state in list(states.items()):
        try:
            json.dumps(state, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            del states[name]
            dispatch.failed(name, hook, TypeError(f"its state is not JSON data ({type(exc).__name__})"), view)
    return states


def resume_plugins(dispatch: Dispatcher, view: LedgerView, states: Mapping[str, Any]) -> Verdict | None:
    """``turnguard_turn_resumed`` for each plugin with its own state: the first failure's stand-in
    (reported; a HALT under ``fail_mode="closed"``), else ``None``; a ``SnapshotError`` refuses
    the resume."""
    hook = "turnguard_turn_resumed"
    return dispatch.call_each(hook, dispatch.observers(hook), view, {"turn": view}, own={"state": states},
                              refusals=(SnapshotError,))[1]
