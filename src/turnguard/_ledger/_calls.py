"""Call counts and repeats: the calls and model requests of a turn, how often each key was
seen (bounded by ``max_tracked_keys``), the stuck signals' counts, and the outcomes by kind."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, TypeAlias

from turnguard._ledger._state import fact
from turnguard._model import Outcome

if TYPE_CHECKING:
    from turnguard._config import GuardConfig

_OK = Outcome.OK  # enum members looked up once: class attribute access costs on the hot path
_OTHER_OUTCOMES = tuple(o.value for o in Outcome if o is not _OK)
"""The outcomes a ledger counts by value (``OK``'s count is a field of its own)."""

Stretch: TypeAlias = "bytes | tuple[bytes | None, dict[bytes, int]]"
"""The calls from one news call up to the next, kept for the ``stale_repeat`` count to reach back
over (``CallCounts._reach_back``): the news call's key alone when the stretch is that one call (most
are), else its key and the stretch's counts by key (``None``: the stretch reaches the turn's
start, or as far back as the bound kept)."""

TABLE_COST = 3
"""What a stretch's table costs beyond its keys, counted in keys against ``max_tracked_keys``
(a small dict and its pair take about as much as three counted keys): the stretches' memory
stays within the key table's, whatever their sizes."""


def stretch_cost(table: dict[bytes, int]) -> int:
    return len(table) + TABLE_COST


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
        "_past",
        "_past_size",
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
        """The key of the first call the ``stale_repeat`` count counts from (``_since_new``'s):
        the latest call whose key is seen once in the turn (``None``: the turn's first call)."""
        self._past: deque[Stretch] = deque()
        """The stretches before that call, oldest first (``_reach_back``)."""
        self._past_size = 0
        """What ``_past``'s tables cost, in keys (``stretch_cost``): at most ``max_tracked_keys``
        (the oldest go first)."""
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
        number of times one key was seen since the latest call whose key is seen only once in the
        turn, so a re-run after an edit (a key never made again) starts afresh, while a loop of 1
        to k calls, whose calls all come round, keeps counting from its first round.""",
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
        self._past.clear()
        self._past_size = 0
        self._max_stale = 0
        self._looped = False
        self._news = None

    def _count_stale(self, digest: bytes, seen: int, at: int = 0) -> None:
        """The ``stale_repeat`` count of a key seen before (``seen > 1``; a key first seen now is
        news, handled in ``count_call``; ``seen`` 0: a key past ``max_tracked_keys``, neither news
        nor counted, so tracked keys count on as if it were not there): its occurrences since the
        latest call whose key is seen only once in the turn (the window's first call, ``_news``).
        An edit made once keeps separating the re-runs around it; a loop's first round is news, and
        when the window's first call comes round it is a loop's call, not progress: the count
        reaches back (``_reach_back``), so a loop of k calls, once each of them has come round,
        counts every key as the seed's ``repeat`` count does. ``at``: the call it counts (0: the
        latest, ``tool_calls``)."""
        if not seen:
            return
        since = self._since_new
        stale = since.get(digest, 0) + 1
        since[digest] = stale
        if stale > self._max_stale:
            self._raise_stale(stale, at)
        if digest == self._news:
            self._reach_back(at)

    def _reach_back(self, at: int) -> None:
        """The window's first call came round: the window reaches back over the stretches before
        it (``_past``) to the latest call whose key is still seen once (or as far as they go), and
        their counts join it. Each table is merged into the larger (amortized O(log n) per call);
        only a key in both has a new count, so only those can raise the running maximum."""
        since, past, counts = self._since_new, self._past, self._counts
        top, news = 0, None
        first: bytes | None
        while past:
            stretch = past.pop()
            if isinstance(stretch, bytes):
                first = stretch
                n = since.get(first, 0) + 1
                since[first] = n
                top = max(top, n)
            else:
                first, older = stretch
                self._past_size -= stretch_cost(older)
                if len(older) > len(since):
                    since, older = older, since
                for key, n in older.items():
                    both = since.get(key)
                    if both is not None:
                        n += both
                        top = max(top, n)
                    since[key] = n
            if first is not None and counts.get(first) == 1:
                news = first
                break
        self._since_new = since
        self._news = news
        self._looped = True
        if top > self._max_stale:
            self._raise_stale(top, at)

    def _shelve(self) -> dict[bytes, int]:
        """A new stretch begins (news) after one that holds more than its news call: its table
        goes on ``_past`` (the oldest dropped past ``max_tracked_keys``, ``stretch_cost``: the
        count then reaches back no further); returns the new stretch's empty table."""
        since = self._since_new
        if since:
            past = self._past
            past.append((self._news, since))
            self._past_size += stretch_cost(since)
            while self._past_size > self._max_keys:
                oldest = past.popleft()
                if not isinstance(oldest, bytes):
                    self._past_size -= stretch_cost(oldest[1])
            since = self._since_new = {}
        return since

    def _raise_stale(self, stale: int, at: int = 0) -> None:
        self._max_stale = stale
        if stale >= self.stuck_at and not self._first_stuck:
            self._first_stuck = at or self.tool_calls
