"""The ``stale_repeat`` window a snapshot holds is made of counted keys (issue 20): ``facts.news``
is a key of ``since_new``, whose keys are keys of ``counts``, and so are each earlier stretch's
(``past``: a news call's key alone, or ``{"news", "counts"}`` whose news is a key of its table);
with ``past`` there is a ``news``; under the ``repeat`` signal there is no window at all. Each
relation broken either way (a key missing from the set that must hold it, or one added that it
lacks), in the live turn's facts and in a shadow's, is refused at the resume naming the field that
names the key. Resumed, a stretch of uncounted keys joined ``since_new`` when the window reached
back over it, and the turn's own next snapshot was refused. Every snapshot real turns write, with
stateful tools, the key table full or not, resumes, runs on, and its next snapshot resumes again."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import turnguard as tg
from random_snapshots import KEYS, facts_of, guard

UNCOUNTED = "00" * 8
STALE = {"stuck_signal": "stale_repeat", "stuck_repeat_threshold": 3}
GUARDS: dict[str, dict[str, Any]] = {
    "stale": STALE,
    "stale, polling": {**STALE, "stateful_tools": ("run",)},
    "stale, keys full": {**STALE, "max_tracked_keys": 5},
    "stale, polling, keys full": {**STALE, "stateful_tools": ("run",), "max_tracked_keys": 5},
    "shadow": {"shadow": {"sh": STALE}},
    "shadow, polling": {"stateful_tools": ("run",), "shadow": {"sh": {**STALE, "stateful_tools": ("run",)}}},
}
MORE_KEYS = (*KEYS, ("grep", "x"), ("grep", "y"))
"""Six keys: enough for news calls between the loops, and for the key table to fill (``keys full``)."""


def play(turn: tg.Turn, rng: random.Random, calls: int, waiting: list[tg.ToolCall]) -> Iterator[None]:
    """``calls`` random calls, their outcomes (a result for ``run``) in any order, some late;
    yields after each check."""
    for _ in range(calls):
        if rng.random() < 0.15:
            turn.begin_cycle()
        call = tg.ToolCall(*rng.choice(MORE_KEYS), call_id=f"c{rng.random()}" if rng.random() < 0.7 else None)
        turn.check_call(call)
        waiting.append(call)
        while waiting and rng.random() < 0.6:
            done = waiting.pop(rng.randrange(len(waiting)))
            result = rng.choice(("a", "b")) if done.name == "run" else None
            turn.record_outcome(done, rng.choice((tg.Outcome.OK, tg.Outcome.ERROR)), result=result)
        yield


def snapshots(options: dict[str, Any], seed: int) -> Iterator[dict[str, Any]]:
    """The snapshot after each check of a random turn."""
    rng = random.Random(seed)
    turn = guard(options).turn(durable=True)
    for _ in play(turn, rng, rng.randint(4, 24), []):
        yield json.loads(json.dumps(turn.snapshot()))
    turn.end()


def windows(kind: str, seeds: int = 40) -> Iterator[tuple[dict[str, Any], dict[str, Any], str]]:
    """Snapshots whose window holds earlier stretches (``past``), with their stale facts and path;
    a shadow's only while it has not halted (a halted shadow's facts are not resumed)."""
    for seed in range(seeds):
        for state in snapshots(GUARDS[kind], seed):
            facts, path = facts_of(state)
            if facts.get("past") and not (path != "facts" and state["plugins"]["shadow"]["runs"]["sh"]["halt"]):
                yield state, facts, path


def _refused(g: tg.Guard, mutant: dict[str, Any]) -> str:
    with pytest.raises(tg.SnapshotError) as refused:
        g.resume(mutant)
    assert refused.value.field in str(refused.value)
    return refused.value.field


def _naming(facts: dict[str, Any], path: str, key: str) -> list[str]:
    """The fields of the window that name ``key``, in the order they are checked."""
    out = [f"{path}.since_new.{key}"] if key in facts["since_new"] else []
    for i, stretch in enumerate(facts["past"]):
        if stretch == key:
            out.append(f"{path}.past[{i}]")
        elif isinstance(stretch, dict) and key in stretch["counts"]:
            out.append(f"{path}.past[{i}].counts.{key}")
    return out


@pytest.mark.parametrize("kind", list(GUARDS))
def test_a_window_key_missing_from_the_counts_is_refused_naming_the_first_field_that_names_it(kind):
    g = guard(GUARDS[kind])
    damaged = 0
    for state, facts, path in windows(kind):
        for key in facts["counts"]:
            naming = _naming(facts, path, key)
            if not naming:
                continue
            mutant = copy.deepcopy(state)
            del facts_of(mutant)[0]["counts"][key]
            damaged += 1
            streak = facts.get("last_key")  # (its key counted alone, or a stateful call's with its result)
            named_first = {f"{path}.last_key", naming[0]} if streak and key.startswith(streak) else {naming[0]}
            assert _refused(g, mutant) in named_first
        g.resume(state).suspend()
    assert damaged >= 30


Damage = Callable[[dict[str, Any]], "str | None"]
"""Breaks one relation in a snapshot's stale facts; returns the field (under the facts) refused
(``None``: the facts hold nothing it applies to)."""


def _uncounted_in_since_new(facts: dict[str, Any]) -> str:
    facts["since_new"][UNCOUNTED] = 1
    return f"since_new.{UNCOUNTED}"


def _uncounted_in_since_new_keys_full(facts: dict[str, Any]) -> str:
    facts["overflowed"] = True  # a key past max_tracked_keys is in no window either
    return _uncounted_in_since_new(facts)


def _news_not_in_since_new(facts: dict[str, Any]) -> str | None:
    if facts["news"] is None:
        return None
    del facts["since_new"][facts["news"]]
    return "news"


def _news_another_counted_key(facts: dict[str, Any]) -> str | None:
    facts["news"] = next((k for k in facts["counts"] if k not in facts["since_new"]), None)
    return "news" if facts["news"] is not None else None


def _past_without_news(facts: dict[str, Any]) -> str:
    facts["news"] = None
    return "past"


def _stretches(facts: dict[str, Any], table: bool) -> Iterator[tuple[int, Any]]:
    return ((i, s) for i, s in enumerate(facts["past"]) if isinstance(s, dict) == table)


def _uncounted_stretch_key(facts: dict[str, Any]) -> str | None:
    for i, _ in _stretches(facts, table=False):
        facts["past"][i] = UNCOUNTED
        return f"past[{i}]"
    return None


def _uncounted_in_a_stretch_table(facts: dict[str, Any]) -> str | None:
    """One of a table's keys (not its news) becomes an uncounted one: the table's cost, which
    ``max_tracked_keys`` bounds, stays as it was."""
    for i, stretch in _stretches(facts, table=True):
        table = stretch["counts"]
        for key in table:
            if key != stretch["news"]:
                table[UNCOUNTED] = table.pop(key)
                return f"past[{i}].counts.{UNCOUNTED}"
    return None


def _stretch_news_not_in_its_table(facts: dict[str, Any]) -> str | None:
    for i, stretch in _stretches(facts, table=True):
        if stretch["news"] is not None:
            del stretch["counts"][stretch["news"]]
            return f"past[{i}].news"
    return None


def _stretch_news_another_counted_key(facts: dict[str, Any]) -> str | None:
    for i, stretch in _stretches(facts, table=True):
        other = next((k for k in facts["counts"] if k not in stretch["counts"]), None)
        if other is not None:
            stretch["news"] = other
            return f"past[{i}].news"
    return None


DAMAGES: dict[str, Damage] = {
    "an uncounted key in since_new": _uncounted_in_since_new,
    "an uncounted key in since_new, keys full": _uncounted_in_since_new_keys_full,
    "news missing from since_new": _news_not_in_since_new,
    "news another counted key": _news_another_counted_key,
    "past without news": _past_without_news,
    "an uncounted stretch key": _uncounted_stretch_key,
    "an uncounted key in a stretch table": _uncounted_in_a_stretch_table,
    "a stretch's news missing from its table": _stretch_news_not_in_its_table,
    "a stretch's news another counted key": _stretch_news_another_counted_key,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("kind", list(GUARDS))
def test_a_window_relation_broken_is_refused_naming_the_field(kind, damage):
    g = guard(GUARDS[kind])
    damaged = 0
    for state, _, path in windows(kind, seeds=15):
        mutant = copy.deepcopy(state)
        field = DAMAGES[damage](facts_of(mutant)[0])
        if field is None:
            continue
        damaged += 1
        assert _refused(g, mutant) == f"{path}.{field}"
    assert damaged >= 3, damaged


REPEAT_WINDOWS: dict[str, Callable[[str], dict[str, Any]]] = {
    "since_new": lambda key: {"since_new": {key: 1}},
    "news": lambda key: {"since_new": {key: 1}, "news": key},
    "past": lambda key: {"past": [key]},
}
"""A stale window put in the facts of a turn under the ``repeat`` signal, whose turns keep none:
the field refused, and what is put there (of a counted key)."""


@pytest.mark.parametrize("field", list(REPEAT_WINDOWS))
@pytest.mark.parametrize("kind", ["repeat", "repeat, polling"])
def test_a_window_under_the_repeat_signal_is_refused_naming_it(kind, field):
    options = {"stateful_tools": ("run",)} if "polling" in kind else {}
    g = guard(options)
    damaged = 0
    for seed in range(10):
        for state in snapshots(options, seed):
            if not state["facts"]["counts"]:
                continue
            mutant = copy.deepcopy(state)
            mutant["facts"] |= REPEAT_WINDOWS[field](next(iter(state["facts"]["counts"])))
            damaged += 1
            assert _refused(g, mutant) == f"facts.{field}"
    assert damaged >= 30


def _run_on(g: tg.Guard, state: dict[str, Any], seed: int) -> None:
    """Resume ``state``, run 12 more calls, snapshotting and resuming after each: every snapshot
    the resumed turn writes resumes again."""
    rng = random.Random(seed)
    turn = g.resume(copy.deepcopy(state))
    waiting: list[tg.ToolCall] = []
    for _ in play(turn, rng, 12, waiting):
        again = json.loads(json.dumps(turn.suspend()))
        turn = g.resume(again)
    turn.end()


@pytest.mark.parametrize("kind", list(GUARDS))
def test_a_counts_key_deleted_is_refused_or_the_resumed_turn_snapshots_again(kind):
    """The issue's report, over every counted key: a snapshot missing one is refused, or the turn
    resumed from it writes snapshots that resume (the key was in no window)."""
    g = guard(GUARDS[kind])
    refused = resumed = 0
    for n, (state, _, _) in enumerate(windows(kind, seeds=8)):
        for key in facts_of(state)[0]["counts"]:
            mutant = copy.deepcopy(state)
            del facts_of(mutant)[0]["counts"][key]
            try:
                g.resume(copy.deepcopy(mutant)).suspend()
            except tg.SnapshotError:
                refused += 1
                continue
            _run_on(g, mutant, n)
            resumed += 1
    assert refused >= 10, (refused, resumed)


@pytest.mark.parametrize("kind", list(GUARDS))
def test_every_snapshot_a_turn_writes_holds_a_window_of_counted_keys_and_resumes_on(kind):
    """What the refusals rest on: the relations hold in every snapshot real turns write (the key
    table full or not, stateful tools), and each resumes into a turn whose snapshots resume."""
    g = guard(GUARDS[kind])
    seen = full = 0
    for seed in range(25):
        for n, state in enumerate(snapshots(GUARDS[kind], seed)):
            facts, _ = facts_of(state)
            counts, since, news = set(facts["counts"]), facts["since_new"], facts["news"]
            assert set(since) <= counts and (news is None or news in since)
            assert not facts.get("past") or news is not None
            for stretch in facts.get("past", []):
                table = {stretch} if isinstance(stretch, str) else set(stretch["counts"])
                assert table <= counts
                assert isinstance(stretch, str) or stretch["news"] is None or stretch["news"] in table
            seen += bool(facts.get("past"))
            full += facts["overflowed"]
            if n % 4 == 3:
                _run_on(g, state, seed)
    assert seen >= 20 and (full >= 20 or "full" not in kind), (seen, full)
