"""The facts of a turn, declared once: ``LedgerFacts``, what every hook reads (the ``LedgerView``
hooks receive is generated from it), and ``PolicyFacts``, the few more the built-in policies read
of the ledger itself on the hot path. Both are typed protocols: a ``Ledger`` satisfies them
(mypy checks it where one is passed), and a policy reads no field that is not declared here."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn, Protocol

if TYPE_CHECKING:
    from turnguard._config import GuardConfig
    from turnguard._ledger._streaks import EndedStreak
    from turnguard._model import Action, Level, Outcome, Threshold, ToolCall, Verdict


def _declared(facts: object) -> NoReturn:
    """The body of a declaration: a protocol holds no facts (a ``Ledger`` or a view does)."""
    raise AttributeError(f"{type(facts).__name__} declares the turn's facts; read them from a ledger or its view")


class LedgerFacts(Protocol):
    """What every hook reads of a turn (``turn``): the facts, read-only, and the queries. The
    ``LedgerView`` hooks receive shows exactly these, each read through from the ledger."""

    __slots__ = ()

    @property
    def config(self) -> GuardConfig:
        """The configuration the turn is guarded by."""
        return _declared(self)

    @property
    def turn_id(self) -> str:
        """The turn's id."""
        return _declared(self)

    @property
    def cohort(self) -> str:
        """``live``, or ``probe`` when the probe configuration guards the turn (``tg.Probe``)."""
        return _declared(self)

    @property
    def conversation_id(self) -> str | None:
        """The host's conversation id, if it gave one."""
        return _declared(self)

    @property
    def agent_name(self) -> str | None:
        """The host's agent name, if it gave one."""
        return _declared(self)

    @property
    def resumed_from(self) -> str | None:
        """The turn id of the snapshot this turn was forked from (resumed twice in one guard), or ``None``."""
        return _declared(self)

    @property
    def fresh_state(self) -> tuple[str, ...]:
        """The plugins whose per-turn state started afresh at a resume (the snapshot had none for them)."""
        return _declared(self)

    @property
    def promptable(self) -> bool:
        """Whether a person is watching (attended): detections reach the user rather than halt."""
        return _declared(self)

    @property
    def cap_mode(self) -> str:
        """``explicit``, ``adaptive`` or ``disabled``."""
        return _declared(self)

    @property
    def soft_cap(self) -> int | None:
        """S under the adaptive cap, else ``None``."""
        return _declared(self)

    @property
    def hard_cap(self) -> int | None:
        """N (explicit) or S * m (adaptive): past it the turn halts whatever it does."""
        return _declared(self)

    @property
    def opened_ns(self) -> int:
        """When the turn opened, Unix ns, read once (a resumed turn's: the resume less the time it ran)."""
        return _declared(self)

    @property
    def started_at(self) -> float:
        """When the turn opened (``time.monotonic()``)."""
        return _declared(self)

    @property
    def tool_calls(self) -> int:
        """Calls checked in the turn, including the current one."""
        return _declared(self)

    @property
    def checks(self) -> int:
        """Calls checked in the turn, rolled back or not: the sequence number of the latest."""
        return _declared(self)

    @property
    def cycles(self) -> int:
        """Model requests begun in the turn (a re-sent request counts again)."""
        return _declared(self)

    @property
    def calls_this_cycle(self) -> int:
        """Calls checked since the current model request began."""
        return _declared(self)

    @property
    def cap_quiet_until(self) -> int | float:
        """The cap cannot fire while ``tool_calls`` is at most this (N, S, or infinity if off)."""
        return _declared(self)

    @property
    def max_key_repeat(self) -> int:
        """The largest number of times any one key has been seen in the turn."""
        return _declared(self)

    @property
    def max_stale_repeat(self) -> int:
        """The ``stale_repeat`` signal's count (0 unless that signal is configured): the largest
        number of times one key was seen with no never-seen-before key in between, so a re-run
        after an edit (a new key) starts afresh while a loop of 1 to k calls keeps counting."""
        return _declared(self)

    @property
    def distinct_keys(self) -> int:
        """Distinct call keys counted in the turn (at most ``max_tracked_keys``)."""
        return _declared(self)

    @property
    def keys_overflowed(self) -> bool:
        """True once a key went uncounted because ``max_tracked_keys`` was reached."""
        return _declared(self)

    @property
    def streak_length(self) -> int:
        """Consecutive checked calls with the current key."""
        return _declared(self)

    @property
    def failing_streak_length(self) -> int:
        """Consecutive identical calls of the current streak whose outcome was ``ERROR``."""
        return _declared(self)

    @property
    def settled_streak_length(self) -> int:
        """Consecutive identical calls of the current streak whose outcome was anything but
        ``DENIED`` (kept when ``streak_stop_on="any"``; 0 otherwise)."""
        return _declared(self)

    @property
    def stop_count(self) -> int:
        """The stop level's count for the current streak (``failing_streak_length``, or with
        ``streak_stop_on="any"`` ``settled_streak_length``), the largest it has been in the
        streak: it reaches ``streak_stop_at`` once per streak."""
        return _declared(self)

    @property
    def awaiting_in_streak(self) -> int:
        """Calls of the current streak, before the latest, whose outcome has not come yet (0 in
        a sequential run: each outcome came before the next call)."""
        return _declared(self)

    @property
    def streak_digest(self) -> bytes | None:
        """The current streak's call key digest (``None`` before the first call)."""
        return _declared(self)

    @property
    def last_tool_name(self) -> str | None:
        """The tool name of the latest checked call (``None`` before the first call)."""
        return _declared(self)

    @property
    def first_stuck_call(self) -> int:
        """The call at which the configured stuck signal first reached ``stuck_repeat_threshold``
        (0: never)."""
        return _declared(self)

    @property
    def detections(self) -> int:
        """Detections noted in the turn."""
        return _declared(self)

    @property
    def retries(self) -> int:
        """``retry()`` calls in the turn."""
        return _declared(self)

    @property
    def stuck_count(self) -> int:
        """The configured stuck signal's count (``stuck_signal``): ``max_stale_repeat`` under
        ``stale_repeat``, else ``max_key_repeat``. Whether it makes the turn stuck is the cap's
        rule (``turnguard._policies.cap.stuck``)."""
        return _declared(self)

    @property
    def result_restarts(self) -> int:
        """Streak restarts by a changed result (stateful tools) in the turn."""
        return _declared(self)

    @property
    def stuck_raised(self) -> bool:
        """Whether the outcome just recorded brought the stuck signal to ``stuck_repeat_threshold``
        (a stateful tool's call, whose repeat is counted with its result)."""
        return _declared(self)

    def polls(self, tool_name: str | None) -> bool:
        """Whether ``tool_name`` is one of the configuration's ``stateful_tools``."""
        return _declared(self)

    def restarts_by_tool(self) -> dict[str, int]:
        """``result_restarts`` by tool name (at most ``MAX_RESTART_TOOLS`` names; ``_other``)."""
        return _declared(self)

    def outcomes(self, outcome: Outcome) -> int:
        """How many outcomes of this kind were recorded."""
        return _declared(self)

    def repeats_of(self, digest: bytes) -> int:
        """How many times the key with this digest has been counted in the turn."""
        return _declared(self)

    def fired_in_streak(self, threshold: Threshold | str, level: Level | str) -> bool:
        """Whether a detection of ``threshold`` at ``level`` was noted in the current streak."""
        return _declared(self)

    def provisional_stop_fired(self) -> bool:
        """Whether the stop level fired in the part of the current streak that
        ``provisional_stop_count`` counts (a changed result restarts the streak there even while it
        waits for an earlier call's outcome; a stop that fired before it was the earlier part's)."""
        return _declared(self)

    def provisional_stop_count(self) -> int:
        """The stop level's count for the current streak if every earlier call of it still
        waiting for its outcome failed (counted up to ``streak_stop_at``): identical calls of one
        model response are all checked before any outcome, and past this many, had they run one
        at a time, the stop level would have fired before them."""
        return _declared(self)

    def detect(self, threshold: Threshold | str, action: Action, level: Level, limit: int, *,
               call: ToolCall | None = None, message: str = "", streak: EndedStreak | None = None) -> Verdict:
        """A verdict whose ``LoopDetectedEvent`` records this ledger's counts now (the streak's:
        ``streak``'s, an ended streak's, when given)."""
        return _declared(self)


class PolicyFacts(LedgerFacts, Protocol):
    """What the built-in policies read of the ledger itself (``turnguard._policies``): the hook
    facts and the thresholds and streak positions their hot paths compare, each a slot of the
    ledger (a plain attribute read)."""

    __slots__ = ()

    @property
    def stuck_at(self) -> int:
        """``stuck_repeat_threshold``."""
        return _declared(self)

    @property
    def warn_at(self) -> int:
        """``streak_warn_at`` (0: off)."""
        return _declared(self)

    @property
    def stop_at(self) -> int:
        """``streak_stop_at`` (0: off)."""
        return _declared(self)

    @property
    def next_to_settle(self) -> int:
        """The check whose outcome the current streak settles next: ``checks`` when every
        earlier call of the streak has its outcome (a sequential run)."""
        return _declared(self)

    @property
    def names_tools(self) -> bool:
        """Whether the configuration names tools (``stateful_tools``, ``streak_exempt_tools``)."""
        return _declared(self)

    @property
    def ended_stop(self) -> EndedStreak | None:
        """The ended streak whose stop count the latest outcome of it brought to ``streak_stop_at``,
        until that detection is noted."""
        return _declared(self)

    @property
    def cycle_due(self) -> tuple[Level, int, int] | None:
        """The ``cycle_repeat`` level the latest outcome brought a cycle to: (level, period,
        matches); ``None``: none, or the policy is off."""
        return _declared(self)

    @property
    def cycle_unreported(self) -> list[tuple[Level, int, int]]:
        """The ``cycle_repeat`` levels reached that no report carried yet (owed, or held for the
        next outcome), in the order later reports would carry them; empty when the policy is off."""
        return _declared(self)

    def provisional_streak_length(self) -> int:
        """``streak_length`` with the results of the streak's calls that wait for an earlier
        call's outcome counted where they stand (check order): the streak restarts at the latest
        call whose result changed, as it would have had the calls run one at a time."""
        return _declared(self)
