"""Task results: ``turn.report_result`` before the end, ``guard.report_result`` after it, with
bounded memory; every other report ignored and counted, never raised; and where results go
(summary, recorder, turn metrics and spans, the late-result counter and event, calibrate)."""

from __future__ import annotations

import dataclasses
import gc
import io
import json
import random
import sys
import tracemalloc
import uuid
from pathlib import Path

import pytest

import turnguard as tg
from conftest import CORE_ONLY, distinct_call, drive
from turnguard._calibrate import cli
from turnguard._model import MAX_ID_LENGTH, TurnSummary, cut_text
from turnguard._task_results import (
    _TEXT_FIELDS,
    MAX_KEPT_ITEMS,
    MAX_RECENT_TURNS,
    Remembered,
    ResultBook,
    kept_summary,
)
from turnguard.telemetry import _names as n

S = tg.ResultStatus


def guard(**config) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(**{**CORE_ONLY, **config}), environ={})


def ended_turn(g: tg.Guard, calls: int = 3, **kwargs) -> tg.Turn:
    with g.turn(**kwargs) as turn:
        drive(turn, [distinct_call(i) for i in range(calls)])
    return turn


def test_a_result_before_the_end_is_on_the_summary():
    g = guard()
    with g.turn() as turn:
        assert turn.report_result(True) is True
    assert turn.summary.resolved is True
    assert ended_turn(g).summary.resolved is None


def test_a_result_after_the_end_reaches_the_recent_turn_once():
    g = guard()
    turn = ended_turn(g)
    assert g.report_result(turn.turn_id, False) is True
    assert g.report_result(turn.turn_id, True) is False  # the first one stands
    assert turn.report_result(True) is False  # an ended turn's report_result is the guard's
    assert g.results.counts[S.ACCEPTED] == 1 and g.results.counts[S.DUPLICATE] == 2


@pytest.mark.parametrize(("report", "status"), [
    (lambda g, t: t.report_result(True), S.DUPLICATE),
    (lambda g, t: g.report_result(t.turn_id, True), S.DUPLICATE),
    (lambda g, t: g.report_result("no-such-turn", True), S.UNKNOWN),
    (lambda g, t: g.report_result(t.turn_id, "yes"), S.INVALID),
    (lambda g, t: g.report_result(None, True), S.INVALID_ID),
])
def test_every_other_report_is_ignored_counted_and_never_raises(report, status):
    g = guard()
    with g.turn() as turn:
        turn.report_result(False)
    before = dict(g.results.counts)
    assert report(g, turn) is False
    assert g.results.counts[status] == before[status] + 1
    assert turn.summary.resolved is False


def test_a_non_bool_before_the_end_is_ignored_too():
    g = guard()
    with g.turn() as turn:
        assert turn.report_result(1) is False
        assert turn.report_result(None) is False
    assert turn.summary.resolved is None and g.results.counts[S.INVALID] == 2


def test_memory_of_ended_turns_is_bounded_and_forgotten_turns_are_expired_then_unknown():
    g = guard()
    g.results = book = ResultBook(limit=3)
    turns = [ended_turn(g, 1) for _ in range(8)]
    assert len(book) == 3
    assert [g.report_result(t.turn_id, True) for t in turns[-3:]] == [True] * 3
    assert g.report_result(turns[3].turn_id, True) is False and book.counts[S.EXPIRED] == 1
    assert g.report_result(turns[0].turn_id, True) is False and book.counts[S.UNKNOWN] == 1


def test_after_shutdown_results_are_counted_and_ignored():
    g = guard()
    turn = ended_turn(g)
    g.shutdown()
    assert g.report_result(turn.turn_id, True) is False
    assert g.results.counts[S.AFTER_SHUTDOWN] == 1


class Recorded:
    """The ``turnguard_turn_result`` notes a guard's observers get: (status, resolved)."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, bool | None]] = []

    @tg.hookimpl
    def turnguard_turn_result(self, turn_id, summary, resolved, status, labels) -> None:
        self.notes.append((status, resolved))


REPORT_WAYS = ("in_turn", "in_turn_non_bool", "turn_after_end", "guard_by_id", "guard_by_int_id", "guard_by_token",
               "token_from_another_guard")


def _report(g: tg.Guard, way: str, turn_id: int, *, shut: bool) -> tuple[tg.Turn, bool]:
    """Report a result for a turn of ``g`` one way; ``shut``: after ``g.shutdown()`` (before the turn
    opens, for a report in the turn; once it ended, for a later one)."""
    resolved = "yes" if way == "in_turn_non_bool" else True
    if way.startswith("in_turn"):
        if shut:
            g.shutdown()
        with g.turn(turn_id=turn_id) as turn:
            drive(turn, [distinct_call(0)])
            accepted = turn.report_result(resolved)
        return turn, accepted
    other = guard(probe={"rate": 1.0}) if way == "token_from_another_guard" else g
    turn = ended_turn(other, turn_id=turn_id)
    if shut:
        g.shutdown()
    if way == "turn_after_end":
        return turn, turn.report_result(resolved)
    if way in ("guard_by_token", "token_from_another_guard"):
        return turn, g.report_result(turn.result_token, resolved)
    return turn, g.report_result(turn_id if way == "guard_by_int_id" else str(turn_id), resolved)


@pytest.mark.parametrize("probe", [False, True], ids=["live", "probe"])
@pytest.mark.parametrize("way", REPORT_WAYS)
def test_every_result_after_shutdown_is_refused_and_counted_as_after_shutdown(way, probe):
    """However it is reported (in the turn, through the ended turn, by id, by token) and in either
    cohort: after ``guard.shutdown()`` a result returns False, is counted (and noted to the
    observers) as ``after_shutdown``, and reaches no summary."""
    recorded = Recorded()
    g = guard(**({"probe": {"rate": 1.0}} if probe else {}))
    g.register(recorded, name="recorded")
    turn, accepted = _report(g, way, 7, shut=True)
    assert turn.summary.cohort == ("probe" if probe or way == "token_from_another_guard" else "live")
    assert accepted is False
    assert turn.summary.resolved is None
    assert {k: v for k, v in g.results.counts.items() if v} == {S.AFTER_SHUTDOWN: 1}
    assert [status for status, _ in recorded.notes] == ["after_shutdown"]


@pytest.mark.parametrize("probe", [False, True], ids=["live", "probe"])
@pytest.mark.parametrize("way", [w for w in REPORT_WAYS if w != "in_turn_non_bool"])
def test_every_result_before_shutdown_is_accepted(way, probe):
    g = guard(**({"probe": {"rate": 1.0}} if probe else {}))
    turn, accepted = _report(g, way, 7, shut=False)
    assert accepted is True
    assert g.results.counts[S.ACCEPTED] == 1 and sum(g.results.counts.values()) == 1
    if way == "in_turn":
        assert turn.summary.resolved is True


def test_a_result_taken_in_the_turn_before_shutdown_stands_when_the_turn_ends_after_it():
    g = guard()
    with g.turn() as turn:
        assert turn.report_result(False) is True
        g.shutdown()
        assert turn.report_result(True) is False
    assert turn.summary.resolved is False
    assert {k: v for k, v in g.results.counts.items() if v} == {S.ACCEPTED: 1, S.AFTER_SHUTDOWN: 1}


class Zero(int):
    """An ``int`` subclass equal to 0 (an enum member, a numpy-like scalar)."""


FALSY_IDS = [0, "", Zero(0)]


@pytest.mark.parametrize("probe", [False, True], ids=["live", "probe"])
@pytest.mark.parametrize("turn_id", FALSY_IDS, ids=repr)
def test_a_falsy_turn_id_with_text_is_kept_and_reached_by_that_text(turn_id, probe):
    """Only ``turn_id=None`` gets a random id: 0, "" and an int equal to 0 are ids like any
    other, counted by their text, reached by a late result (by the id, its text, or the token)."""
    text = str(int(turn_id)) if isinstance(turn_id, int) else turn_id
    for reach in (turn_id, text, "token"):
        g = guard(**({"probe": {"rate": 0.5}} if probe else {}))
        turn = ended_turn(g, turn_id=turn_id)
        assert turn.turn_id is turn_id and turn.summary.turn_id is turn_id
        assert g.report_result(turn.result_token if reach == "token" else reach, True) is True, reach
        assert g.report_result(text, False) is False
        assert {k: v for k, v in g.results.counts.items() if v} == {S.ACCEPTED: 1, S.DUPLICATE: 1}


def test_a_turn_without_an_id_gets_a_random_one():
    g = guard(probe={"rate": 0.5})
    ids = {ended_turn(g).turn_id for _ in range(20)} | {ended_turn(guard()).turn_id for _ in range(20)}
    assert len(ids) == 40 and all(isinstance(i, str) and len(i) == 32 for i in ids)


@pytest.mark.parametrize("turn_id", [*FALSY_IDS, False, 0.0, ()], ids=repr)
def test_probe_sampling_of_a_falsy_turn_id_is_the_same_every_time(turn_id):
    """Sampling hashes an id's text, so a falsy id with text lands in the cohort its text does in
    every process; an id without text (``False`` is no id) is live, as any such id is."""
    from turnguard._probe import Cohort, sample_point, sample_text

    for rate in (0.1, 0.5, 0.9):
        g = guard(probe={"rate": rate})
        cohorts = {ended_turn(g, turn_id=turn_id).summary.cohort for _ in range(12)}
        text = sample_text(turn_id)
        expected = Cohort.LIVE if text is None or sample_point(text) >= rate else Cohort.PROBE
        assert cohorts == {expected}, (rate, cohorts)


def test_turn_metrics_and_spans_carry_the_result(otel):
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",)), environ={},
                 **otel.providers())
    for resolved in (True, False, None):
        with g.turn(agent_name="coder") as turn:
            turn.check_call(tg.ToolCall("read", {}))
            if resolved is not None:
                turn.report_result(resolved)
    labels = sorted(p.attributes[n.TURN_RESOLVED] for p in otel.points(n.METRIC_TURN_TOOL_CALLS[0]))
    assert labels == ["false", "true", "unknown"]
    spans = [s for s in otel.spans() if s.name == "invoke_agent coder"]
    assert sorted(s.attributes[n.TURN_RESOLVED] for s in spans) == ["false", "true", "unknown"]


def test_a_late_result_is_an_event_and_a_counter_with_the_turns_bucket_and_threshold(otel):
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), name="p1",
                                max_tool_calls_per_turn=150), environ={}, **otel.providers())
    with g.turn(agent_name="coder") as turn:
        drive(turn, [distinct_call(i) for i in range(200)])
    assert turn.summary.threshold == "explicit" and turn.summary.tool_calls == 151
    assert g.report_result(turn.turn_id, True) is True
    assert g.report_result("nope", False) is False
    points = {p.attributes[n.RESULT_STATUS]: p for p in otel.points(n.METRIC_TURN_RESULTS[0])}
    assert dict(points["accepted"].attributes) == {
        n.POLICY: "p1", n.RESULT_STATUS: "accepted", n.TURN_RESOLVED: "true", n.TURN_COHORT: "live",
        n.TURN_CALLS_BUCKET: "200", n.LOOP_THRESHOLD: "explicit", n.GEN_AI_AGENT_NAME: "coder",
    }
    assert dict(points["unknown"].attributes) == {n.POLICY: "p1", n.RESULT_STATUS: "unknown",
                                                  n.TURN_RESOLVED: "false"}
    (record,) = otel.logs(n.TURN_RESULT_EVENT)
    attrs = record.attributes
    assert (attrs[n.TURN_ID], attrs[n.TURN_RESOLVED], attrs[n.TURN_TOOL_CALLS], attrs[n.LOOP_THRESHOLD]) == (
        turn.turn_id, True, 151, "explicit")


def test_the_recorder_writes_results_and_calibrate_reads_them_back(tmp_path: Path):
    path = tmp_path / "turns.jsonl"
    g = guard(disable_plugins=("otel", "shadow"), recorder_path=str(path), max_tool_calls_per_turn=20)
    with g.turn() as early:
        drive(early, [distinct_call(i) for i in range(30)])
        early.report_result(True)
    late = ended_turn(g, 30)
    never = ended_turn(g, 30)
    assert g.report_result(late.turn_id, False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line.get("id"), line.get("result_for"), line["resolved"]) for line in lines] == [
        (early.turn_id, None, True), (late.turn_id, None, None), (never.turn_id, None, None),
        (None, late.turn_id, False)]
    out = io.StringIO()
    assert cli.main([str(path), "--json", "-"], stdout=out, stderr=io.StringIO()) == 0
    data = json.loads(out.getvalue())
    assert (data["turns"], data["resolved"], data["unresolved"]) == (3, 1, 1)
    assert data["problems"] == 0


# -- the first result stands, however long ago its turn left the book ---------------------------

def reporters(g: tg.Guard, **config) -> list[tg.Guard]:
    """Where a turn's result may come from: the guard that ran it, another of the same key."""
    return [g, guard(**config)]


@pytest.mark.parametrize(("digest_key", "where"), [(None, 0), ("fleet-secret", 1)],
                         ids=["keyless-own-guard", "keyed-another-guard"])
def test_round_robin_tokens_over_more_turns_than_the_book_holds_are_taken_once(digest_key, where):
    g = guard(digest_key=digest_key)
    turns = [ended_turn(g, 0) for _ in range(MAX_RECENT_TURNS + 1)]
    tokens = [t.result_token for t in turns]
    to = reporters(g, digest_key=digest_key)[where]
    taken = [to.report_result(token, i % 2 == 0) for i in range(3) for token in tokens]
    assert taken == [True] * len(tokens) + [False] * 2 * len(tokens)
    assert to.results.counts[S.ACCEPTED] == len(tokens) and to.results.counts[S.DUPLICATE] == 2 * len(tokens)


@pytest.mark.parametrize("first", ["in-turn", "by-id", "by-token"])
@pytest.mark.parametrize("then", ["by-id", "by-token", "by-token-elsewhere", "ended-again"])
def test_a_turn_that_left_the_book_keeps_its_first_result(first, then):
    g = guard()
    g.results = book = ResultBook(limit=3)
    with g.turn(turn_id="t-first") as turn:
        if first == "in-turn":
            turn.report_result(True)
    token = turn.result_token
    if first == "by-id":
        assert g.report_result("t-first", True) is True
    elif first == "by-token":
        assert g.report_result(token, True) is True
    others = [ended_turn(g, 1) for _ in range(2 * book.limit + 1)]  # it leaves the book, then its expired ids
    assert all(g.report_result(t.turn_id, True) for t in others[-book.limit:])
    before = dict(book.counts)
    if then == "by-id":
        assert g.report_result("t-first", False) is False
    elif then == "by-token":
        assert g.report_result(token, False) is False
    elif then == "ended-again":  # a host reusing the id, its first result long gone from the book
        with g.turn(turn_id="t-first") as again:
            again.report_result(False)
        assert g.report_result("t-first", False) is False and g.report_result(again.result_token, False) is False
    else:
        other = guard()
        other.results = elsewhere = ResultBook(limit=3)
        assert other.report_result(token, True) is True  # a book of its own: it never saw the first
        for t in others:
            other.report_result(t.result_token, True)
        assert other.report_result(token, False) is False
        assert elsewhere.counts[S.DUPLICATE] == 1
        return
    assert book.counts[S.ACCEPTED] == before[S.ACCEPTED]
    assert book.counts[S.DUPLICATE] > before[S.DUPLICATE]


@pytest.mark.parametrize("digest_key", [None, "fleet-secret"], ids=["keyless", "keyed"])
@pytest.mark.parametrize("then", ["by-id", "by-token", "ended-again-in-turn", "ended-again-late"])
def test_a_token_taken_after_its_turn_left_the_book_stands_as_a_keyed_tokens_first_result(digest_key, then):
    """The token's result comes once the turn has left the book (it is remembered apart, by its
    digest); every later result for the id, by any way, is a duplicate when tokens are checked by a
    key. Without one the token could be anyone's, so it never keeps the id's own turn from its result."""
    g = guard(digest_key=digest_key)
    g.results = book = ResultBook(limit=3, digest_key=digest_key)
    token = ended_turn(g, 1, turn_id="t-first").result_token
    for _ in range(book.limit):
        ended_turn(g, 1)
    assert g.report_result(token, True) is True
    before = dict(book.counts)
    if then == "by-id":
        taken = [g.report_result("t-first", False)]
    elif then == "by-token":
        taken = [g.report_result(token, False)]
    else:  # a host reusing the id: its result in the turn, or after the turn
        with g.turn(turn_id="t-first") as again:
            again.report_result(False) if then == "ended-again-in-turn" else None
        taken = [] if then == "ended-again-in-turn" else [g.report_result("t-first", False)]
    accepted = book.counts[S.ACCEPTED] - before[S.ACCEPTED]
    own_turn = then.startswith("ended-again") and digest_key is None
    assert accepted == (1 if own_turn else 0), dict(book.counts)
    assert book.counts[S.DUPLICATE] - before[S.DUPLICATE] == (0 if own_turn else 1)
    assert taken == ([True] if own_turn and taken else [False] * len(taken))


def test_results_are_remembered_for_at_least_the_bound_and_memory_stays_bounded():
    g = guard()
    g.results = book = ResultBook(limit=2, remembered=64)
    turns = [ended_turn(g, 0) for _ in range(64 * 5)]
    tokens = [t.result_token for t in turns]
    assert all(g.report_result(token, True) for token in tokens)
    recent = tokens[-64:]  # the last `remembered` results are all still there, in any order
    assert not any(g.report_result(token, False) for token in reversed(recent))
    assert 64 <= len(book._token_results) <= 128 and len(book._results) == book.limit  # the last in the book


@pytest.mark.parametrize("limit", [1, 2, 5, 64, 1000])
def test_remembered_holds_the_last_limit_digests_and_at_most_twice_as_many(limit):
    seen = Remembered(limit)
    digests = [random.Random(i * 7919 + limit).getrandbits(64) for i in range(10 * limit)] + [0, 2**64 - 1]
    for i, digest in enumerate(digests):
        seen.add(digest)
        assert digest in seen
        if limit <= 64 or i % (limit // 4) == 0:
            assert all(d in seen for d in digests[max(0, i + 1 - limit):i + 1])
        assert len(seen) <= 2 * limit
    assert sum(d in seen for d in digests) <= 2 * limit
    slots = 16
    while slots < 2 * limit:
        slots *= 2
    assert sys.getsizeof(seen._newer) + sys.getsizeof(seen._older) <= 2 * (slots * 8 + 100)


# -- what the book keeps of a turn is bounded, whatever its ids and names ---------------------------

MIB = 2**20
HUGE = ["x" * MIB, "é" * MIB, "\U0001f600" * MIB, "\udc80" * MIB]
"""Text of a mebibyte of characters, of each width a string can have (a lone surrogate too)."""
TEXT_BYTES = 4 * MAX_ID_LENGTH + 100
"""The most a kept text takes: 256 characters of up to 4 bytes each, and the string's header."""
ENTRY_BYTES = 1024
"""What the book keeps per turn besides its texts: the summary, the entry, the book's slot."""


def deep_size(value: object, seen: set[int] | None = None) -> int:
    """``sys.getsizeof`` of ``value`` and of every object it holds (a dataclass's fields, a tuple's items)."""
    seen = set() if seen is None else seen
    if id(value) in seen or value is None or isinstance(value, (bool, type)):
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if dataclasses.is_dataclass(value):
        size += sum(deep_size(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    elif isinstance(value, (tuple, list, frozenset, set)):
        size += sum(deep_size(item, seen) for item in value)
    return size


def huge_summary(text: str) -> TurnSummary:
    """A summary with ``text`` in every field that can hold text, a tuple of many of them in every
    tuple field: whatever a host, a model or a plugin could put there, and any field added later."""
    values = {}
    for f in dataclasses.fields(TurnSummary):
        kind = str(f.type)
        if "tuple[tuple" in kind:
            values[f.name] = tuple((f"{text}{i}", i) for i in range(300))
        elif "tuple" in kind:
            values[f.name] = tuple(f"{text}{i}" for i in range(300))
        elif "str" in kind:
            values[f.name] = text
        elif "bool" in kind:
            values[f.name] = False
        elif "float" in kind:
            values[f.name] = 1.0
        else:
            values[f.name] = 1
    return TurnSummary(**values)


@pytest.mark.parametrize("text", HUGE, ids=["ascii", "latin", "emoji", "surrogate"])
def test_a_kept_summary_is_bounded_in_every_field(text):
    summary = huge_summary(text)
    kept = kept_summary(summary)
    tuples = sum(isinstance(getattr(summary, name), tuple) for name in _TEXT_FIELDS)
    texts = len(_TEXT_FIELDS) - tuples + tuples * MAX_KEPT_ITEMS  # a text in each field, or a tuple of them
    assert deep_size(kept) <= texts * TEXT_BYTES + ENTRY_BYTES  # under 20 kB, whatever a host or model sends
    for f in dataclasses.fields(TurnSummary):
        value = getattr(kept, f.name)
        if isinstance(value, str):
            assert len(value) <= MAX_ID_LENGTH and value == cut_text(getattr(summary, f.name))
        elif isinstance(value, tuple):
            assert len(value) <= MAX_KEPT_ITEMS
    assert (kept.tool_calls, kept.halted, kept.resolved, kept.duration_s) == (1, False, False, 1.0)
    assert kept.result_restarts[:2] == ((cut_text(text + "0"), 0), (cut_text(text + "1"), 1))


def test_a_summary_within_the_bounds_is_kept_as_it_is():
    g = guard()
    plain = ended_turn(g, 3, agent_name="coder", conversation_id=12345, turn_id=10**200).summary
    assert kept_summary(plain) is plain
    enum_threshold = dataclasses.replace(plain, threshold=tg.Threshold.EXPLICIT, fresh_state=("shadow",),
                                         result_restarts=(("ci", 2),))
    assert kept_summary(enum_threshold) is enum_threshold
    conversation = uuid.uuid4()
    with_uuid = dataclasses.replace(plain, conversation_id=conversation)
    assert kept_summary(with_uuid) is with_uuid
    long_int = dataclasses.replace(plain, turn_id=10**300, conversation_id=b"b" * MIB, agent_name=HostObject())
    kept = kept_summary(long_int)
    assert (kept.turn_id, kept.conversation_id) == (cut_text(str(10**300)), cut_text(str(b"b" * MIB)))
    assert kept.agent_name == "<HostObject>"


class HostObject:
    """An object a host might hand over as an id: huge, and whose text fails."""

    payload = "p" * MIB

    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("text", HUGE[:3], ids=["ascii", "latin", "emoji"])
def test_turns_with_huge_ids_add_a_bounded_entry_each(text):
    g = guard()
    ended_turn(g, 1, turn_id="warm-up", agent_name="a", conversation_id="c")
    gc.collect()
    turns = 100
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(turns):
            with g.turn(turn_id=f"{i}{text}", conversation_id=f"{i}{text}", agent_name=f"{i}{text}") as turn:
                drive(turn, [distinct_call(0)])
                turn.end(f"{i}{text}")
            del turn
            if i % 10 == 0:
                gc.collect()
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(g.results) == turns + 1
    bound = 4 * TEXT_BYTES + ENTRY_BYTES  # four texts cut (ids, agent, reason): 5.5 kB; 3 to 5 kB measured
    assert used / turns <= bound, f"{used / turns:.0f} bytes per ended turn, more than {bound}"


def test_a_turn_with_a_huge_id_is_still_reported_by_it_exactly():
    g = guard()
    g.results = ResultBook(limit=4)
    same_start = ["x" * MIB + "a", "x" * MIB + "b", "x" * (MAX_ID_LENGTH - 1) + "\u2026"]  # one is another's cut
    turns = [ended_turn(g, 1, turn_id=turn_id) for turn_id in same_start]
    assert [t.result_token for t in turns[:2]] == [None, None]  # no room in a token: reported by id
    assert g.report_result(same_start[0], True) is True and g.report_result(same_start[0], True) is False
    assert g.report_result(same_start[1], False) is True
    assert g.report_result(same_start[2], False) is True
    assert g.report_result("x" * MIB + "c", True) is False and g.results.counts[S.UNKNOWN] == 1
    for _ in range(4):
        ended_turn(g, 1)
    assert g.report_result(same_start[1], True) is False  # its first result stands, gone from the book
    assert all((isinstance(key, bytes) and len(key) == 16) or len(key) <= MAX_ID_LENGTH
               for key in [*g.results._ended, *g.results._expired])


def test_the_late_result_of_a_huge_id_reports_it_cut_as_exported(otel):
    g = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",)), environ={},
                 **otel.providers())
    seen: list[tuple[str, tg.TurnSummary | None]] = []

    class Results:
        @tg.hookimpl
        def turnguard_turn_result(self, turn_id, summary):
            seen.append((turn_id, summary))

    g.register(Results())
    huge = "é" * MIB
    with g.turn(turn_id=huge, agent_name=huge) as turn:
        turn.check_call(tg.ToolCall("read", {}))
    assert g.report_result(huge, True) is True
    ((turn_id, summary),) = seen
    assert turn_id == summary.turn_id == summary.agent_name == cut_text(huge)
    (record,) = otel.logs(n.TURN_RESULT_EVENT)
    assert record.attributes[n.TURN_ID] == cut_text(huge)
