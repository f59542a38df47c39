"""Plain data shared by the guard, its plugins and its reports.

Everything here is immutable: a verdict or an event handed to a plugin or a host can be kept,
logged or compared without copying.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T", bound="DataclassInstance")

MAX_ID_LENGTH = 256
"""The one length limit, in characters, for turn ids, result tokens and every string turnguard
exports (span names, attributes, log records, metric labels): a longer one is cut or refused, so
nothing a model or a host sends can grow an export or a report without bound."""

CUT_MARK = "\u2026"
"""The last character of a string cut to ``MAX_ID_LENGTH`` (an ellipsis)."""


def cut_text(text: str) -> str:
    """``text`` within ``MAX_ID_LENGTH`` characters: a longer one is cut, its last character
    becoming ``CUT_MARK`` (as every exported string is, ``telemetry.text.export_text``)."""
    return text if len(text) <= MAX_ID_LENGTH else text[: MAX_ID_LENGTH - 1] + CUT_MARK


ALL_TOOLS = "*"
"""In ``GuardConfig.stateful_tools``: every tool."""
OTHER_TOOLS = "_other"
"""Where ``TurnSummary.result_restarts`` counts the tools past ``MAX_RESTART_TOOLS`` (as telemetry
folds names past its bound)."""
MAX_RESTART_TOOLS = 256
"""Tools a turn counts streak restarts for by name (``TurnSummary.result_restarts``)."""


def id_text(value: object) -> str | None:
    """The text of an id a host hands over: a string's own (a subclass's, without calling its
    methods), an integer's decimal digits (``bool`` is no id); ``None`` for anything else. It
    never raises: probe sampling and task results key turns by it, so ``12345`` and ``"12345"``
    are one id."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return int.__repr__(value)
        except ValueError:  # more digits than the interpreter converts (sys.get_int_max_str_digits)
            return None
    return None


def direct_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that sets each field through its slot's
    own setter: the generated one goes through ``object.__setattr__`` per field, which costs on
    the paths that build a verdict or an event per detection. Same parameters and defaults."""
    fields = dataclasses.fields(cls)
    namespace: dict[str, Any] = {}
    params, body = [], []
    for f in fields:
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]  # on purpose: the generated __init__ replaces the dataclass's
    return cls


class Outcome(enum.Enum):
    """What happened when the host executed a tool call."""

    OK = "ok"
    ERROR = "error"
    DENIED = "denied"
    """Permission refused by the user or a policy: never a failure, never a reset."""
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, value: Outcome | str) -> Outcome:
        """Accept an ``Outcome`` or its string value (``"ok"``, ``"error"``, ...)."""
        if isinstance(value, Outcome):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            accepted = ", ".join(repr(o.value) for o in cls)
            raise ValueError(f"unknown outcome {value!r}; pass an Outcome or one of {accepted}") from None


@enum.unique
class Action(enum.IntEnum):
    """What the host should do; ordered by severity so ``max()`` combines verdicts."""

    ALLOW = 0
    REMIND = 1
    ASK = 2
    HALT = 3

    @property
    def label(self) -> str:
        """The lower-case name used in telemetry (``allow``, ``remind``, ``ask``, ``halt``)."""
        return self.name.lower()

    def __str__(self) -> str:
        """The label, as ``Threshold`` and ``Level`` print theirs (``halt``, not ``3``)."""
        return self.label

    def __format__(self, spec: str) -> str:
        return format(self.label, spec)


class Threshold(enum.StrEnum):
    """Which detector fired. The string values are part of the telemetry contract."""

    EXPLICIT = "explicit"
    SOFT_STUCK = "soft_stuck"
    HARD_BACKSTOP = "hard_backstop"
    STREAK = "streak"
    CYCLE_CAP = "cycle_cap"
    CYCLE_REPEAT = "cycle_repeat"


PLUGIN_ERROR_THRESHOLD = "plugin_error"
"""The threshold of the HALT that stands in for a failing plugin under ``fail_mode="closed"``, and
of any HALT that names no threshold (``halt_threshold``). Part of the telemetry contract like
``Threshold``'s values, and no policy's."""


def halt_threshold(threshold: Threshold | str | None) -> Threshold | str:
    """What a HALT is labelled by: its threshold, or ``PLUGIN_ERROR_THRESHOLD`` when it names none
    (a plugin's own bare HALT, a halt latched before failing plugins' halts were named). A halted
    turn always names what halted it, whatever reason the host ends it with: "halted" means a
    threshold, in the summary, ``turnguard.loop.threshold``, the recorder's ``ended_by``, the
    boards (``turnguard._boards.series.HALTED``) and calibrate alike."""
    return PLUGIN_ERROR_THRESHOLD if threshold is None else threshold


class Level(enum.StrEnum):
    """How serious a detection is: a warning or a stop."""

    WARN = "warn"
    STOP = "stop"


class Answer(enum.StrEnum):
    """A user's answer to an ASK, passed to ``Turn.resolve``."""

    CONTINUE = "continue"
    STOP = "stop"
    REDIRECT = "redirect"


@dataclass(frozen=True, slots=True, eq=False, init=False)
class ToolCall:
    """One tool call as the host has it; ``args`` may be any object (dict, JSON text, bytes...).

    The guard computes the call's key once, in ``check_call``, and keeps it on the call (with
    which check of which turn it was) so that ``record_outcome`` for the same object neither
    canonicalizes the arguments again nor searches for the call it belongs to.

    Equality and hash are the object's identity: two ``ToolCall`` objects are two calls, even
    with the same name, arguments and ``call_id`` (a model may issue one call twice in a
    parallel batch, and each gets its own outcome, span and recorder line). Compare ``name``,
    ``args`` and ``call_id`` to compare what two calls ask for.

    A copy (``copy.copy``, ``copy.deepcopy``, a pickle round trip) is the call as the host has it,
    ``name``, ``args`` (deep-copied by ``deepcopy``) and ``call_id``, without the guard's cached
    key: a new object, so an outcome reported through it is matched by its ``call_id``, and
    checking it keys it afresh. A checked call copies and pickles as an unchecked one does.
    """

    name: str
    args: Any = None
    call_id: str | None = None
    key: Any = field(default=None, init=False, repr=False)
    """turnguard's own: the key the deciding guard cached on the call (a ``turnguard._keys.CallKey``),
    ``None`` until one keys it; read by turnguard's modules, written only by ``keys.store_key``.
    Not for hosts or plugins: its shape may change in any release."""

    def __init__(self, name: str, args: Any = None, call_id: str | None = None) -> None:
        # Written out (the slots' own setters): a host builds one per call, and the generated
        # frozen __init__ costs about a third more.
        if (type(name) is not str or not name) and (not isinstance(name, str) or not name):
            raise ValueError(f"ToolCall name must be a non-empty string (the tool's name), got {name!r}")
        _set_name(self, name)
        _set_args(self, args)
        _set_call_id(self, call_id)
        _set_key(self, None)

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles leave the cached key out: it belongs to the object the guard checked
        (and holds its ``Keyer``, which does not pickle)."""
        return type(self), (self.name, self.args, self.call_id)


_set_name = ToolCall.__dict__["name"].__set__
_set_args = ToolCall.__dict__["args"].__set__
_set_call_id = ToolCall.__dict__["call_id"].__set__
_set_key = ToolCall.__dict__["key"].__set__


class IgnoredOutcome(enum.StrEnum):
    """Why ``Turn.record_outcome`` ignored a report (a host error; the values are telemetry's)."""

    DUPLICATE = "duplicate"
    """An outcome for a ``ToolCall`` object this turn checked but no longer waits for: its outcome
    came already (or the turn gave up waiting for it, ``ledger.overdue``)."""
    UNKNOWN_CALL = "unknown_call"
    """An outcome for a call no check of this turn waits for: another object whose ``call_id``
    was never checked here, or was answered (or given up) already."""
    AFTER_END = "after_end"
    """An outcome reported once the turn had ended (or was suspended): it waits for no call any
    more, so even a call's first outcome comes too late."""


@direct_init
@dataclass(frozen=True, slots=True)
class LoopDetectedEvent:
    """One detection: which threshold fired, what it means for the host, and the counts then.

    It never holds tool arguments: ``key_digest`` identifies the call.
    """

    threshold: Threshold | str
    action: Action
    level: Level
    limit: int
    tool_calls: int
    cycles: int
    max_key_repeat: int
    streak_length: int
    failing_streak_length: int
    soft_cap: int | None
    hard_cap: int | None
    tool_name: str | None
    key_digest: str | None
    promptable: bool
    turn_id: str
    conversation_id: str | None
    agent_name: str | None
    event_id: str
    cap_mode: str = "adaptive"
    message: str = ""


@direct_init
@dataclass(frozen=True, slots=True)
class Verdict:
    """The guard's answer. ``threshold``/``event`` are set whenever a detector fired,
    even when ``action`` is ``ALLOW`` (the detection was observed, not acted on)."""

    action: Action
    threshold: Threshold | str | None = None
    message: str = ""
    event: LoopDetectedEvent | None = None

    @property
    def halted(self) -> bool:
        return self.action is Action.HALT


ALLOW = Verdict(Action.ALLOW)
"""The verdict when nothing fired (shared: verdicts are immutable)."""


@dataclass(frozen=True, slots=True)
class TurnSummary:
    """How a turn ended, handed to ``turnguard_turn_ended`` observers."""

    turn_id: str
    conversation_id: str | None
    agent_name: str | None
    promptable: bool
    reason: str
    tool_calls: int
    cycles: int
    max_key_repeat: int
    first_stuck_call: int
    """The call at which the stuck signal first held (0: never), wherever the soft cap was."""
    distinct_keys: int
    keys_overflowed: bool
    halted: bool
    threshold: Threshold | str | None
    cap_mode: str
    stuck: bool
    detections: int
    duration_s: float
    resolved: bool | None = None
    """The task's result as the host reported it before the turn ended (``Turn.report_result``),
    or ``None``; a later result goes to ``Guard.report_result``."""
    cohort: str = "live"
    """``live``, or ``probe`` when the turn was guarded by the probe configuration (``tg.Probe``)."""
    resumed_from: str | None = None
    """The turn id of the snapshot this turn was resumed from when it got an id of its own (the
    same snapshot resumed a second time by one guard: a fork); ``None`` otherwise."""
    fresh_state: tuple[str, ...] = ()
    """What started afresh when the turn was resumed: the names of the plugins (``shadow``) whose
    per-turn state the snapshot did not carry (a version 1 snapshot), so their evidence (shadow
    and probe detections) counts from the resume on."""
    result_restarts: tuple[tuple[str, int], ...] = ()
    """(tool name, count) by tool name: how often a call of a ``stateful_tools`` tool restarted its
    identical-call streak with a changed result (progress), in the turn."""
    max_failing_streak: int = 0
    """The longest failing identical-call streak of the turn (the largest stop-level count any
    streak reached; under ``streak_stop_on="any"``, the settled count): a streak stop at or below
    it would have halted the turn."""


class LoopDetected(Exception):
    """Raised by hosts that abort a turn by exception; carries the verdict that stopped it."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        super().__init__(verdict.message or f"turnguard: {verdict.threshold} ({verdict.action.label})")
