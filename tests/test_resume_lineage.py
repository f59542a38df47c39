"""Which objects a resumed turn knows as its own: those of its lineage, every one, and no other's.

A turn suspended and resumed, or forked (its snapshot resumed while a turn of its id is in use
here), and resumed again, continues one turn: an object any turn of that chain checked, reported
to the last one, is the same call of the same turn, so its second report is a ``duplicate`` and
never settles another call sharing its ``call_id``, as in the turn that never stopped. An object
of an unrelated turn, even one the host gave the same turn id, is no call of this turn: its
report is an ``unknown_call`` (or settles the call waiting with its ``call_id``), as it is there.
The random scripts report duplicates of every kind and are cut along chains of one to three
suspends, forks and sibling forks starting at every operation; the strangers' scripts mix in
reports of a same-id turn's objects. A snapshot written before lineages falls back to the
snapshot's turn id.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest

import turnguard as tg
from test_resume_duplicate_reports import Duplicator, make_duplicating_script
from test_resume_equivalence import CONFIGS, OUTCOMES, Bench, HeardOutcomes, Player, Script, make_benches

MAX_MARKERS = 32
"""``turnguard._snapshot.MAX_LINEAGE``."""
WAYS = ("suspend", "fork", "sibling")
"""How a turn of the chain is cut: suspended and resumed (same id); snapshotted and resumed while
it goes on (a fork, another id); suspended and resumed twice, the second resume playing on (a
sibling fork, while the first stays open)."""


class HeardAcrossForks(HeardOutcomes):
    """What ``HeardOutcomes`` hears, a summary's ``resumed_from`` left out (a fork names its parent)."""

    @tg.hookimpl
    def turnguard_shadow_turn_ended(self, policy, summary):
        super().turnguard_shadow_turn_ended(policy, dataclasses.replace(summary, resumed_from=None))

    @tg.hookimpl
    def turnguard_turn_ended(self, summary):
        super().turnguard_turn_ended(dataclasses.replace(summary, resumed_from=None))


@pytest.fixture(scope="module")
def benches() -> dict[str, Bench]:
    return make_benches(CONFIGS, HeardAcrossForks)


def without_lineage(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a turnguard from before lineages wrote it."""
    del state["turn"]["lineage"]
    state["turn"].pop("lineage_checks", None)
    return state


def cut(guard: tg.Guard, turn: tg.Turn, way: str, idle: list[tg.Turn], old_format: bool = False) -> tg.Turn:
    """The turn that continues ``turn`` after it was cut ``way``; turns left open go in ``idle``."""
    if way == "fork":
        idle.append(turn)
        state = json.loads(json.dumps(turn.snapshot()))
    else:
        state = json.loads(json.dumps(turn.suspend()))
    if old_format:
        state = without_lineage(state)
    if way == "sibling":
        idle.append(guard.resume(state))
    return guard.resume(state)


def play(bench: Bench, script: Script, promptable: bool, player: Player,
         chain: tuple[tuple[int, str], ...] = (), *, turn_id: str | None = None, old_format: bool = False
         ) -> list[tuple[Any, ...]]:
    """The script played on one turn cut along ``chain`` (``(op index, way)`` in order): verdicts,
    and what the observers heard."""
    bench.heard.said.clear()
    guard, idle = bench.first, []
    turn = guard.turn(durable=True, promptable=promptable, turn_id=turn_id)
    done = 0
    for at, way in chain:
        player.play(turn, script.ops[done:at])
        turn, done = cut(guard, turn, way, idle, old_format), at
    player.play(turn, script.ops[done:])
    turn.end()
    heard = player.out + bench.heard.said
    for left in idle:  # (a turn put aside reports no turn)
        left.suspend()
    return heard


def chains(script: Script, seed: int) -> list[tuple[tuple[int, str], ...]]:
    """From every op: one to three cuts, the first of each way in turn, the later ones at random
    ops after it."""
    rng, last = random.Random(seed), len(script.ops)
    made = []
    for first in range(last + 1):
        for length in (1, 2, 3):
            at = sorted([first] + [rng.randint(first, last) for _ in range(length - 1)])
            ways = [WAYS[(first + length) % len(WAYS)]] + [rng.choice(WAYS) for _ in range(length - 1)]
            made.append(tuple(zip(at, ways, strict=True)))
    return made


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("seed", range(6))
def test_reports_after_chains_of_resumes_and_forks_are_the_whole_turns(benches, config, promptable, seed):
    """Verdicts, what each outcome settled, why each ignored one was ignored, detections and
    summaries are the whole turn's, along any chain of suspends, forks and sibling forks (this
    process: the objects checked before each cut are reported after it)."""
    script = make_duplicating_script(seed * 17 + 3 + (config == "probe"))
    bench = benches[config]
    whole = play(bench, script, promptable, Duplicator(script))
    for chain in chains(script, seed):
        assert play(bench, script, promptable, Duplicator(script), chain) == whole, chain


def test_the_chains_reach_a_duplicate_of_an_object_checked_two_cuts_back(benches):
    """Across the scripts many chains of two or more cuts put a duplicate report of an object
    before the first cut after a fork or a sibling fork (the defect's ground)."""
    reached = 0
    for seed in range(6):
        for config in CONFIGS:
            script = make_duplicating_script(seed * 17 + 3 + (config == "probe"))
            for chain in chains(script, seed):
                if len(chain) < 2 or all(way == "suspend" for _, way in chain[:-1]):
                    continue
                checked = {op[1] for op in script.ops[:chain[0][0]] if op[0] == "check"}
                reached += any(op[0] == "outcome" and op[1] in checked for op in script.ops[chain[-1][0]:])
    assert reached >= 100, reached


class Stranger(Duplicator):
    """A player that also reports outcomes on the objects of another turn (``("stranger", index,
    outcome)``), which played the same script: the same names, arguments and ``call_id``s."""

    def __init__(self, script: Script, strangers: dict[int, tg.ToolCall]) -> None:
        super().__init__(script)
        self.strangers = strangers

    def step(self, turn: tg.Turn, op: tuple[Any, ...], fresh_before: int) -> tg.Verdict | None:
        if op[0] == "stranger":
            return turn.record_outcome(self.strangers[op[1]], op[2])
        return super().step(turn, op, fresh_before)


def with_strangers(script: Script, seed: int) -> Script:
    """``script`` with reports of the other turn's objects after a third of its ops, some twice."""
    rng, ops = random.Random(seed), []
    for op in script.ops:
        ops.append(op)
        if op[0] == "check" and rng.random() < 0.35:
            ops += [("stranger", rng.randint(0, op[1]), rng.choice(OUTCOMES))] * rng.choice((1, 2))
    return Script(script.calls, ops)


def strangers_of(bench: Bench, script: Script, how: str) -> dict[int, tg.ToolCall]:
    """The objects of an unrelated turn of id ``same`` that played ``script`` and then ended
    (``how``), was left open, or was resumed from its snapshot before it ended."""
    player = Duplicator(script)
    turn = bench.first.turn(turn_id="same", durable=True)
    player.play(turn, script.ops)
    if how == "resumed":
        turn = bench.first.resume(json.loads(json.dumps(turn.suspend())))
    if how != "open":
        turn.end()
    return player.objects


@pytest.mark.parametrize("how", ["ended", "open", "resumed"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("seed", range(4))
def test_objects_of_an_unrelated_turn_of_the_same_id_are_not_this_turns(benches, how, config, seed):
    """Reports on the objects of another turn the host gave the same id are unknown calls (or
    settle a call waiting with their ``call_id``) wherever this turn is cut, whichever way, as in
    the turn that never stopped: never duplicates, never the settling of a check of its own."""
    base = make_duplicating_script(seed * 11 + (config == "probe"))
    script, bench = with_strangers(base, seed), benches[config]
    strangers = strangers_of(bench, base, how)
    whole = play(bench, script, False, Stranger(script, strangers), turn_id="same")
    assert any(entry[:1] == ("ignored",) and entry[-1] == "unknown_call" for entry in whole)
    for chain in chains(script, seed)[::2]:
        assert play(bench, script, False, Stranger(script, strangers), chain, turn_id="same") == whole, chain


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_without_a_lineage_resumes_by_its_turn_id_as_before(benches, config, seed):
    """A snapshot written before lineages, suspended and resumed at every op (its id kept), knows
    its turn's objects by the turn's id: the reports are the whole turn's."""
    script = make_duplicating_script(seed * 19 + (config == "probe"))
    bench = benches[config]
    whole = play(bench, script, False, Duplicator(script))
    for at in range(len(script.ops) + 1):
        assert play(bench, script, False, Duplicator(script), ((at, "suspend"),), old_format=True) == whole, at


def lone_guard() -> tuple[tg.Guard, list[str]]:
    reasons: list[str] = []

    class Heard:
        @tg.hookimpl
        def turnguard_outcome_ignored(self, reason):
            reasons.append(reason)

    guard = tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False),
                     plugins={"heard": Heard()}, environ={})
    return guard, reasons


@pytest.mark.parametrize("chain", [("suspend", "suspend"), ("fork", "suspend"), ("sibling", "suspend"),
                                   ("fork", "fork"), ("sibling", "fork"), ("suspend", "sibling", "fork")])
def test_the_defects_case_a_first_turns_object_is_a_duplicate_at_the_chains_end(chain):
    """An object the first turn checked and settled, reported again to the turn at the end of a
    chain of resumes: a ``duplicate``, which leaves the call waiting with its ``call_id`` waiting."""
    guard, reasons = lone_guard()
    turn, idle = guard.turn(durable=True), []
    first = tg.ToolCall("build", {"target": "A"}, "c")
    turn.check_call(first)
    turn.record_outcome(first, "ok")
    for way in chain:
        resumed = cut(guard, turn, way, idle)
        assert (resumed.turn_id != turn.turn_id) is (way != "suspend")
        turn = resumed
    turn.check_call(tg.ToolCall("build", {"target": "B"}, "c"))
    turn.record_outcome(first, "error")
    assert reasons == ["duplicate"]
    assert turn.view.outcomes(tg.Outcome.ERROR) == 0


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("old_format", [False, True], ids=["lineage", "no lineage"])
def test_the_defects_case_a_same_id_turns_object_is_an_unknown_call(way, old_format):
    """An object of an unrelated turn the host gave the same id settles the call waiting with its
    ``call_id`` in a resumed turn, and its second report is an ``unknown_call``; a snapshot without
    a lineage falls back to the turn id (documented), so there it is the snapshot's turn's."""
    guard, reasons = lone_guard()
    other = guard.turn(turn_id="same")
    stranger = tg.ToolCall("build", {"target": "A"}, "c")
    other.check_call(stranger)
    other.record_outcome(stranger, "ok")
    other.end()
    turn = cut(guard, guard.turn(durable=True, turn_id="same"), way, [], old_format)
    turn.check_call(tg.ToolCall("build", {"target": "B"}, "c"))
    turn.record_outcome(stranger, "error")
    turn.record_outcome(stranger, "error")
    assert reasons == ["duplicate" if old_format else "unknown_call"]
    assert turn.view.outcomes(tg.Outcome.ERROR) == 1


def lineage_of(turn: tg.Turn) -> list[str]:
    return turn.snapshot()["turn"]["lineage"]


def lineage_checks_of(turn: tg.Turn) -> list[int | None] | None:
    return turn.snapshot()["turn"].get("lineage_checks")


def test_every_resume_adds_a_marker_and_where_it_continues_and_a_fresh_turn_draws_its_own():
    guard, _ = lone_guard()
    first = guard.turn(durable=True)
    lineage = lineage_of(first)
    assert len(lineage) == 1 and len(lineage[0]) == 32 and int(lineage[0], 16) >= 0
    assert lineage_checks_of(first) is None
    first.check_call(tg.ToolCall("build", {"target": "A"}))
    fork = guard.resume(first.snapshot())
    assert lineage_of(fork)[:1] == lineage and len(lineage_of(fork)) == 2 and lineage_checks_of(fork) == [1]
    fork.check_call(tg.ToolCall("build", {"target": "B"}))
    resumed = guard.resume(json.loads(json.dumps(fork.suspend())))
    assert resumed.turn_id == fork.turn_id
    assert lineage_of(resumed)[:2] == lineage_of(fork) and len(lineage_of(resumed)) == 3
    assert lineage_checks_of(resumed) == [1, 2]
    assert lineage_of(guard.turn(durable=True)) != lineage
    unmarked = guard.resume(without_lineage(resumed.suspend()))
    assert len(lineage_of(unmarked)) == 1 and lineage_of(unmarked)[0] not in lineage_of(resumed)


@pytest.mark.parametrize("way", ["fork", "suspend"])
def test_a_lineage_keeps_the_latest_markers_across_many_resumes(way):
    from turnguard._snapshot import MAX_LINEAGE

    assert MAX_LINEAGE == MAX_MARKERS
    guard, _ = lone_guard()
    turn, markers, checks = guard.turn(durable=True), [], []
    for i in range(MAX_LINEAGE + 3):
        turn.check_call(tg.ToolCall("build", {"target": i}))
        markers += lineage_of(turn)[-1:]
        checks.append(i + 1)
        turn = guard.resume(turn.snapshot() if way == "fork" else turn.suspend())
    assert lineage_of(turn)[:-1] == markers[-(MAX_LINEAGE - 1):]
    assert lineage_checks_of(turn) == checks[-(MAX_LINEAGE - 1):]


@pytest.mark.parametrize("value", [None, ["ab" * 16], ["ab" * 16, "cd" * 16], ["ab" * 16] * MAX_MARKERS])
@pytest.mark.parametrize("checks", ["absent", "null", "given"])
def test_a_snapshot_may_carry_a_lineage_or_null(value, checks):
    """With its ``lineage_checks`` (a count or null for each marker but the last) or without
    them (each turn of the lineage continued whole)."""
    guard, _ = lone_guard()
    turn = guard.turn(durable=True)
    turn.check_call(tg.ToolCall("build", {"target": "A"}))
    state = turn.suspend()
    state["turn"]["lineage"] = value
    ancestors = len(value) - 1 if value else 0
    if checks != "absent" and value is not None:
        state["turn"]["lineage_checks"] = [None if checks == "null" else 1] * ancestors
    resumed = guard.resume(state)
    assert resumed.turn_id == state["turn"]["turn_id"]
    if value is None:
        assert len(lineage_of(resumed)) == 1 and lineage_checks_of(resumed) is None
    else:
        assert lineage_of(resumed)[:-1] == value[-(MAX_MARKERS - 1):] and len(lineage_of(resumed)) == len(value) + (
            len(value) < MAX_MARKERS)
        written = [None if checks != "given" else 1] * ancestors + [1]
        assert lineage_checks_of(resumed) == written[-(len(lineage_of(resumed)) - 1):]


@pytest.mark.parametrize("value", ["ab" * 16, [], ["ab" * 15], ["zz" * 16], 7, "", [None],
                                   ["ab" * 16] * (MAX_MARKERS + 1)])
def test_a_malformed_lineage_is_refused_naming_it(value):
    guard, _ = lone_guard()
    state = guard.turn(durable=True).suspend()
    state["turn"]["lineage"] = value
    with pytest.raises(tg.SnapshotError, match=r"turn\.lineage") as refused:
        guard.resume(state)
    assert refused.value.field.startswith("turn.lineage")


@pytest.mark.parametrize("lineage, checks", [
    (["ab" * 16, "cd" * 16], []), (["ab" * 16, "cd" * 16], [1, 1]), (["ab" * 16], [1]), (None, [1]),
    (["ab" * 16, "cd" * 16], [2]), (["ab" * 16, "cd" * 16], [-1]), (["ab" * 16, "cd" * 16], ["1"]),
    (["ab" * 16, "cd" * 16], [True]), (["ab" * 16, "cd" * 16], 1), (["ab" * 16, "cd" * 16], [1.5])])
def test_malformed_lineage_checks_are_refused_naming_them(lineage, checks):
    """One check count (up to the snapshot's ``facts.seq``) or null for each marker but the last."""
    guard, _ = lone_guard()
    turn = guard.turn(durable=True)
    turn.check_call(tg.ToolCall("build", {"target": "A"}))
    state = turn.suspend()
    state["turn"]["lineage"] = lineage
    state["turn"]["lineage_checks"] = checks
    with pytest.raises(tg.SnapshotError, match=r"turn\.lineage_checks") as refused:
        guard.resume(state)
    assert refused.value.field.startswith("turn.lineage_checks")


def test_a_version_1_snapshot_carries_no_lineage_and_one_that_says_one_is_refused():
    """Version 1 predates lineages: it resumes as a lineage of its own, and a ``turn.lineage`` in
    it is a field that version does not have."""
    from test_snapshot import V1
    from test_snapshot import guard as v1_guard

    state = json.loads(V1.read_text())
    lineage = lineage_of(v1_guard().resume(json.loads(V1.read_text())))
    assert len(lineage) == 1
    state["turn"]["lineage"] = lineage
    with pytest.raises(tg.SnapshotError, match=r"turn\.lineage"):
        v1_guard().resume(state)


def forks_objects(bench: Bench, script: Script, at: int, parent: tg.Turn | None) -> dict[int, tg.ToolCall]:
    """The objects checked after op ``at`` by a turn that played ``script`` on from there: a fork of
    ``parent`` (which played the ops before), or, with no parent, an unrelated turn that played
    them all (the same checks, in the same states)."""
    player = Duplicator(script)
    if parent is None:
        turn = bench.first.turn(durable=True)
        player.play(turn, script.ops[:at])
    else:
        turn = bench.first.resume(json.loads(json.dumps(parent.snapshot())))
    player.objects.clear()
    later = {op[1] for op in script.ops[at:] if op[0] == "check"}
    player.play(turn, [op for op in script.ops[at:] if op[0] not in ("outcome", "copy") or op[1] in later])
    turn.suspend()
    return player.objects


def parents_reports(bench: Bench, script: Script, at: int, forked: bool) -> list[tuple[Any, ...]]:
    """What a turn that went on after op ``at`` gave, reports of the other turn's objects mixed in."""
    strangers_script = with_strangers(script, at)
    later = {op[1] for op in script.ops[at:] if op[0] == "check"}
    ops = [op for op in strangers_script.ops if op[0] != "stranger" or op[1] in later]
    player = Duplicator(script)
    turn = bench.first.turn(durable=True)
    player.play(turn, ops[:at])
    strangers = forks_objects(bench, script, at, turn if forked else None)
    bench.heard.said.clear()
    stranger = Stranger(script, strangers)
    stranger.objects = player.objects
    stranger.play(turn, [op for op in ops[at:] if op[0] != "stranger" or op[1] in strangers])
    turn.end()
    return stranger.out + bench.heard.said


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("seed", range(4))
def test_a_turn_that_went_on_does_not_take_its_forks_objects_for_its_own(benches, config, seed):
    """A fork's objects reported to the turn it was forked from, which went on, are what an
    unrelated turn's would be there (unknown calls, or the settling of a call with their
    ``call_id``), wherever the fork was made: a fork continues its parent, not the other way."""
    script = make_duplicating_script(seed * 23 + (config == "probe"))
    bench = benches[config]
    for at in range(len(script.ops) + 1):
        assert parents_reports(bench, script, at, True) == parents_reports(bench, script, at, False), at


RELATIVES = ("parent_went_on", "first_of_two_resumes", "second_of_two_resumes", "fork_beside_a_fork",
             "resumed_after_the_first_was_suspended")
"""How the turn that gets the reports (the receiver) and the other one both continue one snapshot's
turn, neither the other: the receiver a fork of a turn that went on after its snapshot; the first or
the second of two resumes of one suspended snapshot; one of two forks of a turn; a suspended
snapshot resumed again after its first resume played on and was suspended."""


def relatives(guard: tg.Guard, turn: tg.Turn, relation: str, other_plays: Any) -> tg.Turn:
    """The receiver, once the other one (made from ``turn``'s snapshot, or ``turn`` itself) played
    (``other_plays(other)``)."""
    went_on = relation in ("parent_went_on", "fork_beside_a_fork")
    state = json.loads(json.dumps(turn.snapshot() if went_on else turn.suspend()))
    if relation == "parent_went_on":
        other, receiver = turn, guard.resume(state)
    elif relation in ("fork_beside_a_fork", "first_of_two_resumes"):
        receiver, other = guard.resume(state), guard.resume(state)
    elif relation == "second_of_two_resumes":
        other, receiver = guard.resume(state), guard.resume(state)
    else:
        other = guard.resume(state)
        other_plays(other)
        other.suspend()
        return guard.resume(state)
    other_plays(other)
    return receiver


def relatives_reports(bench: Bench, script: Script, at: int, relation: str, related: bool) -> list[tuple[Any, ...]]:
    """What the receiver gave playing ``script`` on from op ``at``, reports of the other one's
    objects mixed in: a relative that played the ops from there too (reporting the objects checked
    before the snapshot as well), or, not ``related``, an unrelated turn that played them all."""
    guard, later = bench.first, {op[1] for op in script.ops[at:] if op[0] == "check"}
    prefix = Duplicator(script)
    turn = guard.turn(durable=True)
    prefix.play(turn, script.ops[:at])
    other = Duplicator(script)
    if related:
        other.objects = dict(prefix.objects)
    else:
        other.play(guard.turn(durable=True), script.ops)
    opened: list[tg.Turn] = [turn]

    def other_plays(relative: tg.Turn) -> None:
        opened.append(relative)
        if related:
            other.play(relative, script.ops[at:])

    receiver = relatives(guard, turn, relation, other_plays)
    rng, ops = random.Random(at), []
    for op in script.ops[at:]:
        ops.append(op)
        if op[0] == "check" and rng.random() < 0.5:
            ops += [("stranger", rng.choice(sorted(later)), rng.choice(OUTCOMES))] * rng.choice((1, 2))
    bench.heard.said.clear()
    player = Stranger(script, {i: other.objects[i] for i in later})
    player.objects = prefix.objects
    player.play(receiver, ops)
    receiver.end()
    heard = player.out + bench.heard.said
    for left in opened:
        if left.summary is None:
            left.suspend()
    return heard


@pytest.mark.parametrize("relation", RELATIVES)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("seed", range(3))
def test_a_resume_does_not_take_a_relatives_later_objects_for_its_own(benches, relation, config, seed):
    """Of two turns that continue one snapshot's turn, neither continuing the other (a fork and the
    turn that went on, two resumes of one snapshot in either order, two forks, a snapshot resumed
    again after its first resume was suspended), each takes the objects that turn checked before
    the snapshot as its own, even once the other settled them, and the other's later objects as an
    unrelated turn's: its verdicts, what each outcome settled and why each ignored one was ignored
    are those it gives beside an unrelated turn, wherever the snapshot was taken."""
    script = make_duplicating_script(seed * 29 + 5 + (config == "probe"))
    bench = benches[config]
    for at in range(len(script.ops) + 1):
        related = relatives_reports(bench, script, at, relation, True)
        assert related == relatives_reports(bench, script, at, relation, False), at


def test_the_relatives_scripts_report_each_others_objects_and_the_snapshots_turns(benches):
    """The scripts reach the defect's ground: reports of a relative's object sharing a ``call_id``
    with a call of the receiver, and reports of an object checked before the snapshot after it."""
    shared = before = 0
    for seed in range(3):
        for config in CONFIGS:
            script = make_duplicating_script(seed * 29 + 5 + (config == "probe"))
            ids = [call_id for _, _, call_id in script.calls]
            for at in range(len(script.ops) + 1):
                checked = {op[1] for op in script.ops[:at] if op[0] == "check"}
                later = [op[1] for op in script.ops[at:] if op[0] == "check"]
                shared += sum(ids[i] is not None and ids.count(ids[i]) > 1 for i in later)
                before += any(op[0] == "outcome" and op[1] in checked for op in script.ops[at:])
    assert shared >= 20 and before >= 20, (shared, before)


@pytest.mark.parametrize("relation", RELATIVES)
def test_the_defects_case_a_relatives_object_is_another_turns_and_the_snapshots_is_its_own(relation):
    """A relative's object sharing the ``call_id`` of the receiver's waiting call settles that call
    and its second report is an ``unknown_call``; the snapshot's turn's waiting object (no
    ``call_id``), settled by the relative, settles the receiver's wait for it too."""
    guard, reasons = lone_guard()
    turn = guard.turn(durable=True)
    waiting = tg.ToolCall("build", {"target": "A"})
    turn.check_call(waiting)
    theirs = tg.ToolCall("build", {"target": "B"}, "y")

    def other_plays(other: tg.Turn) -> None:
        other.record_outcome(waiting, "ok")
        other.check_call(theirs)
        other.record_outcome(theirs, "ok")

    receiver = relatives(guard, turn, relation, other_plays)
    reasons.clear()
    receiver.check_call(tg.ToolCall("build", {"target": "C"}, "y"))
    receiver.record_outcome(theirs, "error")
    receiver.record_outcome(theirs, "error")
    receiver.record_outcome(waiting, "error")
    assert reasons == ["unknown_call"]
    assert receiver.view.outcomes(tg.Outcome.ERROR) == 2
