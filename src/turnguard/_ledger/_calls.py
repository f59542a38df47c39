"""Call counts and repeats: the calls and model requests of a turn, how often each key was
seen (bounded by ``max_tracked_keys``), the stuck signals' counts, and the outcomes by kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnguard._ledger._state import fact
from turnguard._model import Outcome

if TYPE_CHECKING:
    from turnguard._config import GuardConfig

_OK = Outcome.OK  # enum members looked up once: class attribute access costs on the hot path
_OTHER_OUTCOMES = tuple(o.value for o in Outcome if o is not _OK)
"""The outcomes a ledger counts by value (``OK``'s count is a field of its own)."""


class CallCounts:
    """The counting facts of a turn: ``Streaks`` builds on them (the ledger's classes form one
    chain, so that each fact is a slot read on the hot path)."""

    __slots__ = (
        "__weakref__",
        "_counts",
        "_cycle_start",
        "_cycles",
        "_first_stuck",
        "_looped",
        "_max_keys",
        "_max_stale",
        "_news",
        "_ok",
        "_outcomes",
        "_overflowed",
        "_retries",
        "_since_new",
        "_stale",
        "max_key_repeat",
        "stuck_at",
        "tool_calls",
    )

    def __init__(self, config: GuardConfig) -> None:
        self.tool_calls = 0
        self._cycles = 0
        self._cycle_start = 0
        self._counts: dict[bytes, int] = {}
        self.max_key_repeat = 0
        self._overflowed = False
        self._first_stuck = 0
        self._max_keys = config.max_tracked_keys
        self.stuck_at = config.stuck_repeat_threshold
        self._stale = config.stuck_signal == "stale_repeat"
        self._since_new: dict[bytes, int] = {}
        self._max_stale = 0
        self._looped = False
        self._news: bytes | None = None
        self._retries = 0
        self._ok = 0
        self._outcomes = dict.fromkeys(_OTHER_OUTCOMES, 0)
        """The other outcomes' counts, by value (``OK``'s is ``_ok``: most outcomes are)."""

    cycles: int = fact("_cycles", "Model requests begun in the turn (a re-sent request counts again).")

    @property
    def calls_this_cycle(self) -> int:
        return self.tool_calls - self._cycle_start

    max_stale_repeat: int = fact(
        "_max_stale",
        """The ``stale_repeat`` signal's count (0 unless that signal is configured): the largest
        number of times one key was seen with no never-seen-before key in between, so a re-run
        after an edit (a new key) starts afresh while a loop of 1 to k calls keeps counting.""",
    )

    @property
    def distinct_keys(self) -> int:
        return len(self._counts)

    keys_overflowed: bool = fact(
        "_overflowed", "True once a key went uncounted because ``max_tracked_keys`` was reached."
    )

    first_stuck_call: int = fact(
        "_first_stuck",
        """The call at which the configured stuck signal first reached ``stuck_repeat_threshold``
        (0: never).""",
    )

    retries: int = fact("_retries")

    @property
    def stuck_count(self) -> int:
        """The configured stuck signal's count (``stuck_signal``): ``max_stale_repeat`` under
        ``stale_repeat``, else ``max_key_repeat``. Whether it makes the turn stuck is the cap's
        rule (``turnguard._policies.cap.stuck``)."""
        return self._max_stale if self._stale else self.max_key_repeat

    def outcomes(self, outcome: Outcome) -> int:
        """How many outcomes of this kind were recorded."""
        outcome = Outcome.parse(outcome)
        return self._ok if outcome is _OK else self._outcomes[outcome.value]

    def outcome_counts(self) -> dict[str, int]:
        """How many outcomes of each kind were recorded, by value (``"ok"``, ``"error"``, ...)."""
        return {_OK.value: self._ok, **self._outcomes}

    def repeats_of(self, digest: bytes) -> int:
        """How many times the key with this digest has been counted in the turn."""
        return self._counts.get(digest, 0)

    def begin_cycle(self) -> None:
        self._cycles += 1
        self._cycle_start = self.tool_calls

    def forget_repeats(self) -> None:
        """The current model request is re-sent (``retry``): its calls are discarded and the
        repeats forgotten."""
        self._retries += 1
        self.tool_calls = self._cycle_start
        self._counts.clear()
        self.max_key_repeat = 0
        self._overflowed = False
        self._first_stuck = 0
        self._since_new.clear()
        self._max_stale = 0
        self._looped = False
        self._news = None

    def _count_stale(self, digest: bytes, seen: int, at: int = 0) -> None:
        """The ``stale_repeat`` count of a key seen before (``seen > 1``; a key first seen now is
        news, handled in ``count_call``): its occurrences since the last call whose key was never
        seen before ("news"), plus one, once the news call itself has come round again, for keys
        also seen before the news. A loop's first round is news, so the news call coming round
        shows the loop, and its first round then counts: a loop of k calls reaches each count at
        the same call as the seed's ``repeat`` count. A plain re-run (``edit, test, edit, test,
        test``) gets no such credit: the news (the edit) never recurs.

        The table holds only keys seen since the last news (cleared at each news: amortized O(1)
        per call). ``at``: the call it counts (0: the latest, ``tool_calls``)."""
        since = self._since_new
        raw = since.get(digest, 0) + 1
        since[digest] = raw
        if digest == self._news and not self._looped:  # the news call came round: a loop
            self._looped = True
            counts = self._counts
            credited = max((n + 1 for key, n in since.items() if counts.get(key, 0) > n), default=0)
            if credited > self._max_stale:
                self._raise_stale(credited, at)
        stale = raw + 1 if self._looped and seen > raw else raw
        if stale > self._max_stale:
            self._raise_stale(stale, at)

    def _raise_stale(self, stale: int, at: int = 0) -> None:
        self._max_stale = stale
        if stale >= self.stuck_at and not self._first_stuck:
            self._first_stuck = at or self.tool_calls
