"""Results from any process: ``turn.result_token`` carries the turn id and its labels, and
``guard.report_result(token, resolved)`` on any guard, in any process, reports the result as the
turn's own guard would (the same results point, the same event, a recorder record calibrate
joins). Tokens and ids are untrusted: whatever they are, ``report_result`` counts and ignores
them, never raises."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from conftest import drive
from turnguard._calibrate import cli
from turnguard._model import MAX_ID_LENGTH
from turnguard._task_results import (
    MAX_RECENT_TURNS,
    TOKEN_VERSION,
    ResultBook,
    ResultLabels,
    _check,  # a version 1 token's check, as turnguard made it
    read_token,
    result_token,
)
from turnguard.telemetry import _names as n
from turnguard.telemetry._buckets import COUNT_BUCKETS, count_bucket
from turnguard.telemetry._cardinality import BoundedValues
from turnguard.telemetry._metrics import BUILTIN_THRESHOLDS, Instruments, instruments_for
from turnguard.telemetry._testing import InMemoryTelemetry

S = tg.ResultStatus
SRC = Path(__file__).resolve().parent.parent / "src"
SECRET = "SECRET-ARGUMENT-7731"


def make_guard(otel: InMemoryTelemetry | None = None, **config: Any) -> tg.Guard:
    options = {"load_entrypoints": False, "disable_plugins": () if otel else ("otel",), **config}
    return tg.Guard(tg.GuardConfig(**options), environ={}, **(otel.providers() if otel else {}))


def run_turn(guard: tg.Guard, calls: int, **kwargs: Any) -> tg.Turn:
    with guard.turn(**kwargs) as turn:
        for i in range(calls):
            if turn.check_call(tg.ToolCall("read", {"path": SECRET, "i": i})).halted:
                break
    return turn


def result_point(otel: InMemoryTelemetry, status: str = "accepted") -> dict[str, Any]:
    (point,) = [p for p in otel.points(n.METRIC_TURN_RESULTS[0]) if p.attributes[n.RESULT_STATUS] == status]
    return dict(point.attributes)


def event_attributes(otel: InMemoryTelemetry) -> dict[str, Any]:
    (record,) = otel.logs(n.TURN_RESULT_EVENT)
    return dict(record.attributes)


# -- the token ---------------------------------------------------------------------------------

def test_a_turn_has_a_token_once_it_ended_and_the_token_holds_no_arguments():
    guard = make_guard(name="prod")
    with guard.turn(agent_name="coder") as turn:
        drive(turn, [tg.ToolCall("read", {"path": SECRET})])
        assert turn.result_token is None
    token = turn.result_token
    assert isinstance(token, str) and token.isascii() and len(token) <= MAX_ID_LENGTH
    assert token.startswith(TOKEN_VERSION + ".") and turn.turn_id in token
    assert SECRET not in token and "read" not in token.split(".")
    assert turn.result_token is token  # made once
    labels = read_token(token)
    assert (labels.turn_id, labels.cohort, labels.policy, labels.tool_calls, labels.reason, labels.agent_name) == (
        turn.turn_id, "live", "prod", 1, "completed", "coder")


@pytest.mark.parametrize("text", ["plain", "", "dots.and~tildes*stars%", "é ü", "\udc80lone", "😀", "a/b c"])
def test_every_label_comes_back_exactly(text):
    labels = ResultLabels(turn_id=text or "t", cohort="probe", policy=text, tool_calls=2**62, threshold=text,
                          reason=text, agent_name=text, main_threshold=text, edge_soft_cap=0, edge_hard_cap=None)
    token = result_token(labels, "key")
    assert token is not None and token.isascii() and len(token) <= MAX_ID_LENGTH
    assert read_token(token, "key") == dataclasses.replace(labels, remote=True)
    assert read_token(token, None) is None and read_token(token, "other") is None


def test_labels_that_do_not_fit_are_dropped_agent_first_and_reported_as_the_overflow_value(otel):
    origin = make_guard(otel)
    turn = run_turn(origin, 3, agent_name="a" * 200, turn_id="t" * 40)
    token = turn.result_token
    assert len(token) <= MAX_ID_LENGTH and read_token(token).dropped == {"agent_name"}
    receiver_otel = InMemoryTelemetry()
    assert make_guard(receiver_otel).report_result(token, True) is True
    assert result_point(receiver_otel)[n.GEN_AI_AGENT_NAME] == n.OVERFLOW_VALUE
    assert event_attributes(receiver_otel)[n.GEN_AI_AGENT_NAME] == n.OVERFLOW_VALUE
    assert result_point(receiver_otel)[n.POLICY] == "default"  # the rest kept


def test_a_turn_whose_id_alone_does_not_fit_has_no_token_and_reports_by_id():
    guard = make_guard()
    turn = run_turn(guard, 1, turn_id="x" * (MAX_ID_LENGTH - 30))
    assert turn.result_token is None
    assert guard.report_result(turn.turn_id, True) is True
    non_ascii = run_turn(guard, 1, turn_id="é" * 40)  # 6 characters each in a token
    assert non_ascii.result_token is None


# -- the same late result from any process ----------------------------------------------------

RECEIVER = textwrap.dedent("""
    import json, sys
    import turnguard as tg
    from turnguard.telemetry._testing import InMemoryTelemetry
    token, record, digest_key = sys.argv[1], sys.argv[2], sys.argv[3] or None
    otel = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(name="ci", soft_cap=7, load_entrypoints=False, recorder_path=record,
                                    digest_key=digest_key), environ={}, **otel.providers())
    taken = [guard.report_result(token, True), guard.report_result(token, False)]
    points = [dict(p.attributes) | {"value": p.value} for p in otel.points("turnguard.turn.results")]
    events = [dict(r.attributes) for r in otel.logs("turnguard.turn.result")]
    print(json.dumps({"taken": taken, "points": points, "events": events,
                      "counts": {s.value: c for s, c in guard.results.counts.items() if c}}))
""")


def report_elsewhere(token: str, record: Path, digest_key: str | None = None) -> dict[str, Any]:
    """``report_result(token, True)`` then ``(token, False)`` in another OS process, on a guard of
    another configuration, with the real SDK's in-memory readers; what it reported."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", RECEIVER, token, str(record), digest_key or ""], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


PROBE = {"name": "prod", "soft_cap": 20, "hard_multiplier": 5, "probe": {"rate": 1.0, "hard_multiplier": 10}}


@pytest.mark.parametrize("digest_key", ["fleet-secret", None], ids=["keyed", "keyless"])
@pytest.mark.parametrize("config, calls", [({"name": "prod", "soft_cap": 20, "hard_multiplier": 5}, 500),
                                           (PROBE, 150), (PROBE, 30)], ids=["live-backstop", "probe-past-main",
                                                                            "probe-short"])
def test_a_token_reported_in_another_process_gives_the_same_point_and_event(tmp_path, config, calls, digest_key):
    otel = InMemoryTelemetry()
    origin = make_guard(otel, recorder_path=str(tmp_path / "turns.jsonl"), digest_key=digest_key, **config)
    here, there = (run_turn(origin, calls, agent_name="coder") for _ in range(2))
    assert here.summary.cohort == there.summary.cohort
    assert origin.report_result(here.turn_id, True) is True  # the in-process late result
    remote = report_elsewhere(there.result_token, tmp_path / "ci.jsonl", digest_key)
    assert remote["taken"] == [True, False] and remote["counts"] == {"accepted": 1, "duplicate": 1}
    accepted = [p for p in remote["points"] if p[n.RESULT_STATUS] == "accepted"]
    assert [p.pop("value") for p in accepted] == [1]
    expected = result_point(otel)  # the same labels: policy, cohort, bucket, thresholds, agent
    if digest_key is None:  # anyone's token: what the receiver ("ci", S=7, no turn yet) does not show is _token
        expected |= {n.POLICY: n.TOKEN_VALUE, n.GEN_AI_AGENT_NAME: n.TOKEN_VALUE, n.TURN_CALLS_BUCKET: n.TOKEN_VALUE}
    assert accepted == [expected]
    (event,) = remote["events"]
    local = event_attributes(otel)
    assert event.pop(n.TURN_ID) == there.turn_id and local.pop(n.TURN_ID) == here.turn_id
    assert event == local
    if here.summary.cohort == "probe":
        assert local[n.PROBE_MAIN_THRESHOLD] == ("hard_backstop" if calls > 100 else "none")


def test_calibrate_joins_a_late_result_from_another_process_to_its_turn(tmp_path):
    origin = make_guard(recorder_path=str(tmp_path / "turns.jsonl"), max_tool_calls_per_turn=20)
    turns = [run_turn(origin, 30) for _ in range(3)]
    for turn in turns[:2]:
        report_elsewhere(turn.result_token, tmp_path / "ci.jsonl")
    records = [json.loads(line) for line in (tmp_path / "ci.jsonl").read_text().splitlines()]
    assert [(r["result_for"], r["resolved"], r["from_token"], r["policy"], r["ended_by"]) for r in records] == [
        (t.turn_id, True, True, "default", "explicit") for t in turns[:2]]
    out = io.StringIO()
    assert cli.main([str(tmp_path / "turns.jsonl"), str(tmp_path / "ci.jsonl"), "--json", "-"], stdout=out,
                    stderr=io.StringIO()) == 0
    data = json.loads(out.getvalue())
    assert (data["turns"], data["resolved"], data["problems"]) == (3, 2, 0)


def test_a_token_is_taken_only_with_the_digest_key_it_was_checked_with(tmp_path):
    origin = make_guard(digest_key="fleet-secret")
    token = run_turn(origin, 2).result_token
    assert report_elsewhere(token, tmp_path / "a.jsonl")["counts"] == {"invalid_token": 2}  # no key there
    assert report_elsewhere(token, tmp_path / "b.jsonl", "other")["counts"] == {"invalid_token": 2}
    assert report_elsewhere(token, tmp_path / "c.jsonl", "fleet-secret")["counts"] == {"accepted": 1,
                                                                                       "duplicate": 1}


# -- in this process -------------------------------------------------------------------------

def test_a_plain_turn_id_keeps_working_and_a_token_back_home_is_the_same_turn():
    guard = make_guard()
    by_id, by_token = run_turn(guard, 2), run_turn(guard, 2)
    assert guard.report_result(by_id.turn_id, True) is True
    assert guard.report_result(by_id.result_token, True) is False  # the same turn: the first result stands
    assert guard.report_result(by_token.result_token, False) is True
    assert guard.report_result(by_token.turn_id, True) is False
    assert guard.results.counts[S.ACCEPTED] == 2 and guard.results.counts[S.DUPLICATE] == 2


@pytest.mark.parametrize("digest_key", ["fleet-secret", None], ids=["keyed", "keyless"])
def test_another_guard_in_this_process_takes_a_token(otel, digest_key):
    turn = run_turn(make_guard(name="agent-side", digest_key=digest_key), 3, agent_name="coder")
    other = make_guard(otel, name="reporter", digest_key=digest_key)
    assert other.report_result(turn.result_token, True) is True
    point = result_point(otel)
    shown = "agent-side" if digest_key else n.TOKEN_VALUE  # keyless: the provider never showed it
    assert (point[n.POLICY], point[n.GEN_AI_AGENT_NAME]) == (shown, "coder" if digest_key else n.TOKEN_VALUE)
    assert (point[n.TURN_CALLS_BUCKET], point[n.LOOP_THRESHOLD], point[n.TURN_COHORT]) == ("5", "none", "live")


def test_a_keyless_token_keeps_the_labels_its_receiver_shows_already(otel):
    """A keyless token is anyone's; its labels count when the metrics show those values already:
    here, another guard on the same provider ran the turn (a host's replica, the reporter in the
    agents' process), so its policy, agent, bucket and threshold are all shown."""
    origin = make_guard(otel, name="agent-side", max_tool_calls_per_turn=30)
    turn = run_turn(origin, 40, agent_name="coder")
    reporter = make_guard(otel, name="reporter")
    assert reporter.report_result(turn.result_token, True) is True
    point = result_point(otel)
    assert (point[n.POLICY], point[n.GEN_AI_AGENT_NAME], point[n.TURN_CALLS_BUCKET], point[n.LOOP_THRESHOLD]) == (
        "agent-side", "coder", "50", "explicit")


def test_a_turn_id_that_ends_twice_keeps_its_first_result():
    guard = make_guard()
    first = run_turn(guard, 1, turn_id="reused")
    assert guard.report_result("reused", True) is True
    second = run_turn(guard, 2, turn_id="reused")
    assert guard.report_result("reused", False) is False
    assert guard.report_result(second.result_token, False) is False
    with guard.turn(turn_id="reused") as third:
        third.report_result(False)  # in the turn: on its summary, but the id's first result stands
    assert guard.report_result(first.result_token, False) is False
    assert guard.results.counts[S.ACCEPTED] == 1 and guard.results.counts[S.DUPLICATE] == 4


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("digest_key", [None, "fleet-secret"])
def test_a_reused_turn_id_takes_one_result_whichever_way_and_order_it_comes(order, digest_key):
    """Two turns of one id: the first turn's token, the id and the second turn's token, in every
    order. With a key the first report stands and the others are duplicates; without one the
    first turn's token (anyone could have made it) never keeps the id's own turn from its result."""
    guard = make_guard(digest_key=digest_key)
    first, second = run_turn(guard, 1, turn_id="reused"), run_turn(guard, 2, turn_id="reused")
    reports = [first.result_token, "reused", second.result_token]
    accepted = [i for i in order if guard.report_result(reports[i], True)]
    if digest_key is not None:
        assert accepted == [order[0]]
    else:  # the id's own turn takes its first result; the earlier turn's token, only before any
        own = next(i for i in order if i != 0)
        assert accepted == ([0] if order.index(0) < order.index(own) else []) + [own]


def test_integer_turn_ids_are_reported_by_their_text():
    guard = make_guard()
    turn = run_turn(guard, 1, turn_id=12345)
    assert guard.report_result("12345", True) is True and guard.report_result(12345, True) is False
    assert read_token(turn.result_token).turn_id == "12345"


def test_keyed_token_labels_pass_the_receiving_guards_bounds(otel):
    """With a key a token is the fleet's own: its labels are admitted like the turns' own, within
    the same bounds (a value past one is _other)."""
    receiver = make_guard(otel, digest_key="fleet-secret")
    receiver.report_result(run_turn(make_guard(digest_key="fleet-secret"), 1).result_token, True)
    instruments = instruments_for(otel.meter_provider, receiver.config)
    instruments.agents.limit = len(instruments.agents) + 2
    instruments.policies.limit = len(instruments.policies) + 2
    for i in range(6):
        labels = ResultLabels(turn_id=f"keyed-{i}", cohort="beta" if i % 2 else "probe", policy=f"policy-{i}",
                              tool_calls=10**i, threshold=f"threshold-{i}", reason=f"reason-{i}",
                              agent_name=f"agent-{i}", main_threshold=f"main-{i}", edge_soft_cap=3 + i,
                              edge_hard_cap=None)
        assert receiver.report_result(result_token(labels, "fleet-secret"), True) is True
    points = [p.attributes for p in otel.points(n.METRIC_TURN_RESULTS[0])]
    assert {p[n.TURN_COHORT] for p in points} == {"live", "probe", n.OVERFLOW_VALUE}
    assert {p[n.GEN_AI_AGENT_NAME] for p in points if n.GEN_AI_AGENT_NAME in p} == {"agent-0", "agent-1",
                                                                                  n.OVERFLOW_VALUE}
    assert n.OVERFLOW_VALUE in {p[n.POLICY] for p in points} and "threshold-5" in {p[n.LOOP_THRESHOLD] for p in points}
    assert all(n.TURN_ID not in p for p in points)


# -- keyless tokens are anyone's: they never decide what the boards show, nor what the book holds ----

def bounded_sets(instruments: Instruments) -> dict[str, frozenset[str]]:
    """Every bounded label set of ``instruments``, by attribute, as it is now."""
    found = {name: frozenset(values._seen) for name, values in vars(instruments).items()
             if isinstance(values, BoundedValues)}
    assert len(found) >= 10  # every one of them: policies, agents, thresholds, buckets, tools, reasons...
    return found


def forged_labels(rng: random.Random, i: int, turn_ids: list[str]) -> ResultLabels:
    """Any labels: new values, built-in ones, values the receiver shows, a real turn's id."""
    def text(kind: str) -> str | None:
        return rng.choice([None, "", f"{kind}-{i}", f"{kind}-{rng.randrange(10**9)}", "explicit", "coder",
                           "default", "hard_backstop", "+Inf", "_other", "é\udc80" * rng.randrange(3), "x" * 90])
    return ResultLabels(
        turn_id=rng.choice(turn_ids) if turn_ids and i % 7 == 0 else f"forged-{i}-{rng.randrange(10**6)}",
        cohort=rng.choice(["live", "probe", "beta", f"c{i}"]), policy=text("policy"),
        tool_calls=rng.choice([0, 1, i, rng.randrange(2**62)]), threshold=text("threshold"), reason=text("reason"),
        agent_name=text("agent"), main_threshold=text("main"), edge_soft_cap=rng.choice([0, 1, 3 + i, 100]),
        edge_hard_cap=rng.choice([None, 7 + i, 1000]))


def test_forged_tokens_in_any_number_with_any_labels_leave_every_label_set_untouched(otel):
    host = make_guard(otel, max_tool_calls_per_turn=30, name="prod")
    ours = [run_turn(host, 40, agent_name="coder") for _ in range(3)]  # each halted by "explicit"
    instruments = instruments_for(otel.meter_provider, host.config)
    before = bounded_sets(instruments)
    rng = random.Random(7)
    builtins = [values.builtins for values in vars(instruments).values() if isinstance(values, BoundedValues)]
    shown = set().union(*before.values(), *builtins) | set(instruments.edge_buckets) | BUILTIN_THRESHOLDS
    turn_ids = [t.turn_id for t in ours]
    for i in range(1_200):  # past every bound: 100 thresholds and policies, 1,000 agents and buckets
        forged = result_token(forged_labels(rng, i, turn_ids))
        if forged is not None:
            host.report_result(forged, bool(i % 2))
    assert bounded_sets(instruments) == before
    for point in otel.points(n.METRIC_TURN_RESULTS[0]):
        for key in (n.POLICY, n.GEN_AI_AGENT_NAME, n.LOOP_THRESHOLD, n.PROBE_MAIN_THRESHOLD, n.TURN_CALLS_BUCKET):
            assert point.attributes.get(key, "none") in shown | {n.TOKEN_VALUE, n.OVERFLOW_VALUE, n.NO_THRESHOLD}
    after = run_turn(host, 40, agent_name="coder")  # the host's own labels are still its own
    assert after.summary.threshold == "explicit"
    detections = {p.attributes[n.LOOP_THRESHOLD] for p in otel.points(n.METRIC_DETECTIONS[0])}
    assert detections == {"explicit"}
    assert all(host.report_result(t.turn_id, True) for t in [*ours, after])
    results = [p.attributes for p in otel.points(n.METRIC_TURN_RESULTS[0]) if p.attributes[n.POLICY] == "prod"
               and p.attributes[n.RESULT_STATUS] == "accepted" and p.attributes.get(n.GEN_AI_AGENT_NAME) == "coder"
               and p.attributes[n.LOOP_THRESHOLD] == "explicit" and p.attributes[n.TURN_CALLS_BUCKET] == "50"]
    assert results


@pytest.mark.parametrize("limit", [3, MAX_RECENT_TURNS])
def test_forged_tokens_never_push_the_hosts_own_turns_out_of_the_book(limit):
    host = make_guard()
    if limit != MAX_RECENT_TURNS:
        host.results = ResultBook(limit=limit)
    ours = [run_turn(host, 1) for _ in range(limit)]
    held = list(host.results._ended)
    rng = random.Random(limit)
    turn_ids = [t.turn_id for t in ours]
    fresh = [result_token(forged_labels(rng, i, [])) for i in range(1, limit + 2)]  # more than the book holds
    naming_ours = [result_token(forged_labels(rng, 7 * i, turn_ids)) for i in range(20)]
    taken = [host.report_result(token, True) for token in fresh + naming_ours]
    assert sum(taken) > limit  # taken (anyone's token is), but elsewhere than the book
    assert list(host.results._ended) == held
    assert [host.report_result(t.turn_id, False) for t in ours] == [True] * limit
    assert all(t.summary.resolved is None for t in ours)


def test_a_keyless_token_naming_a_turn_of_this_guard_is_that_turn_only_when_it_is_its_token():
    host = make_guard()
    turn = run_turn(host, 2, agent_name="coder")
    genuine = read_token(turn.result_token)
    forged = [result_token(dataclasses.replace(genuine, remote=False, trusted=True, **other))
              for other in ({"agent_name": "intruder"}, {"tool_calls": 99}, {"threshold": "explicit"},
                            {"cohort": "probe"})]
    # anyone's result for that id, reported on its own labels, apart from the turn (then duplicates)
    assert [host.report_result(token, False) for token in forged] == [True, False, False, False]
    assert turn.summary.resolved is None and len(host.results) == 1
    assert host.report_result(turn.turn_id, True) is True  # the turn's own result is still the host's
    assert host.report_result(turn.result_token, True) is False


# -- hostile input: never raised, always counted ------------------------------------------------

class Raising:
    def __init__(self, where: str) -> None:
        self.where = where

    def __hash__(self) -> int:
        raise RuntimeError("hash")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __str__(self) -> str:
        raise RuntimeError("str")

    __repr__ = __format__ = __bool__ = __str__  # type: ignore[assignment]


class RaisingText(str):
    def __hash__(self) -> int:
        raise RuntimeError("hash")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __str__(self) -> str:
        raise RuntimeError("str")

    startswith = encode = isascii = __len__ = __str__  # type: ignore[assignment]


def mutations(token: str, rng: random.Random) -> list[str]:
    """Garbled, truncated, extended, re-versioned and oversized versions of a real token."""
    found = [token[:i] for i in range(len(token))]
    for i in range(len(token)):
        found.append(token[:i] + rng.choice("0aZ.%~*-_\udc80é") + token[i + 1:])
    found += [token + ".x", token + "0", "tg2" + token[3:], "tg1." + "a" * 10_000, token.replace(".", "..", 1),
              token[:-16] + "0" * 16, token.upper(), token + "\x00", "tg1.%ZZ" + token[7:], "tg1." * 12]
    return [m for m in found if m != token]


HOSTILE_IDS: list[Any] = [None, [1], {"a": 1}, {1}, Raising("id"), RaisingText("turn"), 1.5, float("nan"), b"bytes",
                          10**5000, True, object(), "x" * 16_000_000, "", "\udc80", ("t",)]
HOSTILE_RESULTS: list[Any] = [None, 1, "true", Raising("resolved"), [True], float("nan")]


def test_report_result_never_raises_and_counts_every_hostile_report(otel):
    guard = make_guard(otel, recorder_path=None)
    turn = run_turn(guard, 2)
    rng = random.Random(19)
    reports = [(turn_id, True) for turn_id in HOSTILE_IDS]
    reports += [(turn.turn_id, resolved) for resolved in HOSTILE_RESULTS]
    reports += [(text, True) for text in mutations(turn.result_token, rng)]
    reports += [("tg1." + "".join(rng.choice("abc.%09~*") for _ in range(rng.randrange(200))), False)
                for _ in range(300)]
    before = sum(guard.results.counts.values())
    for turn_id, resolved in reports:
        assert guard.report_result(turn_id, resolved) is False
    counts = guard.results.counts
    assert sum(counts.values()) - before == len(reports)
    assert counts[S.ACCEPTED] == 0 and turn.summary.resolved is None
    assert counts[S.INVALID_ID] >= 10 and counts[S.INVALID_TOKEN] >= len(turn.result_token) and counts[S.INVALID] >= 6
    total = sum(p.value for p in otel.points(n.METRIC_TURN_RESULTS[0]))
    assert total == len(reports)
    assert not otel.points(n.METRIC_PLUGIN_ERRORS[0])  # no observer failed on them either
    assert guard.report_result(turn.result_token, True) is True  # the real one still works


@pytest.mark.parametrize("turn_id", [[1], {"a": 1}, Raising("id"), RaisingText("t")], ids=["list", "dict", "raising",
                                                                                           "raising-str"])
def test_an_unhashable_or_raising_id_is_counted_as_invalid(turn_id):
    guard = make_guard()
    assert guard.report_result(turn_id, True) is False
    expected = S.UNKNOWN if isinstance(turn_id, str) else S.INVALID_ID
    assert guard.results.counts[expected] == 1


# -- the repeat and failing-streak counts (version 2) -----------------------------------------------

LOOPY_PROBE = {"name": "prod", "soft_cap": 20, "hard_multiplier": 5, "streak_stop_at": 0, "streak_warn_at": 0,
               "probe": {"rate": 1.0, "hard_multiplier": 10, "stuck_repeat_threshold": 40}}
"""Every turn a probe turn that may repeat a call up to 40 times past S, with no streak level."""


def run_loopy_turn(guard: tg.Guard, repeats: int, failing: int, other: int = 25) -> tg.Turn:
    """``other`` distinct calls, then ``repeats`` identical ones, the first ``failing`` of them failing."""
    with guard.turn(agent_name="coder") as turn:
        for i in range(other):
            call = tg.ToolCall("read", {"i": i})
            turn.check_call(call)
            turn.record_outcome(call, tg.Outcome.OK)
        for i in range(repeats):
            same = tg.ToolCall("test", {"path": "a"})
            turn.check_call(same)
            turn.record_outcome(same, tg.Outcome.ERROR if i < failing else tg.Outcome.OK)
    return turn


def test_a_token_carries_the_turns_largest_repeat_and_longest_failing_streak():
    turn = run_loopy_turn(make_guard(**LOOPY_PROBE), repeats=9, failing=7)
    assert (turn.summary.max_key_repeat, turn.summary.max_failing_streak) == (9, 7)
    token = turn.result_token
    assert token.startswith(f"{TOKEN_VERSION}.") and TOKEN_VERSION == "tg2"
    labels = read_token(token)
    assert labels is not None and (labels.max_key_repeat, labels.max_failing_streak) == (9, 7)


@pytest.mark.parametrize("count, bucket", [(None, "unknown"), (0, "1"), (1, "1"), (16, "16"), (17, "20"), (32, "32"),
                                           (33, "+Inf"), (10**9, "+Inf")])
def test_counts_fall_in_fixed_buckets_ending_in_an_overflow_one(count, bucket):
    assert count_bucket(count) == bucket and bucket in COUNT_BUCKETS


def _version_1(labels: ResultLabels, digest_key: str | None = None) -> str:
    """``labels`` as turnguard made tokens before version 2 (no counts)."""
    body = ".".join(["tg1", labels.turn_id, labels.cohort, labels.policy or "", str(labels.tool_calls),
                     str(labels.edge_soft_cap), str(labels.edge_hard_cap or ""), labels.threshold or "",
                     labels.reason or "", labels.agent_name or "", labels.main_threshold or ""])
    return f"{body}.{_check(body, digest_key)}"


V1 = ResultLabels(turn_id="t-old", cohort="probe", policy="prod-probe", tool_calls=150, threshold=None,
                  reason="completed", agent_name="coder", main_threshold="hard_backstop", edge_soft_cap=20,
                  edge_hard_cap=200)


@pytest.mark.parametrize("digest_key", ["fleet-secret", None], ids=["keyed", "keyless"])
def test_a_version_1_token_is_still_taken_its_counts_unknown(otel, digest_key):
    token = _version_1(V1, digest_key)
    labels = read_token(token, digest_key)
    assert labels is not None
    assert dataclasses.replace(labels, remote=False, trusted=True) == V1
    assert (labels.max_key_repeat, labels.max_failing_streak) == (None, None)
    assert read_token(token, "another-key") is None
    guard = make_guard(otel, **{**PROBE, "digest_key": digest_key})
    assert guard.report_result(token, True) is True
    point = result_point(otel)
    assert (point[n.TURN_MAX_KEY_REPEAT_BUCKET], point[n.TURN_MAX_FAILING_STREAK_BUCKET]) == ("unknown", "unknown")
    assert point[n.PROBE_MAIN_THRESHOLD] == "hard_backstop"
    event = event_attributes(otel)
    assert n.TURN_MAX_KEY_REPEAT not in event and n.TURN_MAX_FAILING_STREAK not in event


def test_a_version_1_token_with_a_count_field_too_many_is_refused():
    token = _version_1(V1)
    body = token.rpartition(".")[0].replace("tg1", "tg2", 1)
    assert read_token(f"{body}.{_check(body, None)}") is None  # tg2 needs 14 fields


def test_a_live_turns_late_result_carries_no_count_buckets(otel):
    turn = run_turn(make_guard(), 3)
    assert make_guard(otel, name="reporter").report_result(turn.result_token, True) is True
    point = result_point(otel)
    assert n.TURN_MAX_KEY_REPEAT_BUCKET not in point and n.TURN_MAX_FAILING_STREAK_BUCKET not in point


@pytest.mark.parametrize("digest_key", ["fleet-secret", None], ids=["keyed", "keyless"])
def test_a_late_result_from_another_process_carries_the_probe_turns_buckets(tmp_path, digest_key):
    """The turn's own guard and a guard of another configuration in another OS process give its
    late result the same repeat and failing-streak buckets (fixed edges: a closed set, so a keyless
    token shows them too)."""
    otel = InMemoryTelemetry()
    origin = make_guard(otel, digest_key=digest_key, **LOOPY_PROBE)
    here, there = run_loopy_turn(origin, 12, 12), run_loopy_turn(origin, 35, 18)
    assert here.summary.cohort == there.summary.cohort == "probe"
    assert (there.summary.max_key_repeat, there.summary.max_failing_streak) == (35, 18)
    assert origin.report_result(here.result_token, True) is True
    local = result_point(otel)
    assert (local[n.TURN_MAX_KEY_REPEAT_BUCKET], local[n.TURN_MAX_FAILING_STREAK_BUCKET]) == ("12", "12")
    remote = report_elsewhere(there.result_token, tmp_path / "ci.jsonl", digest_key)
    (accepted,) = [p for p in remote["points"] if p[n.RESULT_STATUS] == "accepted"]
    assert (accepted[n.TURN_MAX_KEY_REPEAT_BUCKET], accepted[n.TURN_MAX_FAILING_STREAK_BUCKET]) == ("+Inf", "20")
    (event,) = remote["events"]
    assert (event[n.TURN_MAX_KEY_REPEAT], event[n.TURN_MAX_FAILING_STREAK]) == (35, 18)
