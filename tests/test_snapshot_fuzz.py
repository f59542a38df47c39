"""Snapshots are validated like any input: every field of real snapshots mutated (its type swapped,
its value out of range, deleted, nested once more), and each mutant either refused with a
``tg.SnapshotError`` naming the field (or one it is checked against), or resumed into a turn that
then runs 50 more calls, snapshots and resumes again without raising. Never a ``KeyError`` at the
resume, nor a ``TypeError`` at the next check."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg

KEY = "durable-turns-test-key"
SHADOWS = {"stale": {"stuck_signal": "stale_repeat", "stuck_repeat_threshold": 3},
           "capped": {"max_tool_calls_per_turn": 5},
           "bytes": tg.GuardConfig(key_mode="bytes", streak_warn_at=2, streak_stop_at=3)}
BASE = {"disable_plugins": ("otel", "recorder"), "load_entrypoints": False, "streak_warn_at": 3,
        "streak_stop_at": 5, "max_tracked_keys": 64, "shadow": SHADOWS}
PROBE = tg.Probe(1.0, tg.GuardConfig(max_tool_calls_per_turn=40))
V1 = Path(__file__).parent / "data" / "snapshot_v1.json"


def guard(**options: Any) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(**{**BASE, **options}), environ={})


GUARDS = {"durable": lambda: guard(), "keyed": lambda: guard(digest_key=KEY),
          "probe": lambda: guard(probe=PROBE), "polling": lambda: guard(stateful_tools=("run",)),
          "stale polling": lambda: guard(stateful_tools=("run",), stuck_signal="stale_repeat"),
          "v1": lambda: tg.Guard(tg.GuardConfig(
              digest_key=KEY, disable_plugins=("otel", "recorder"), load_entrypoints=False, shadow=SHADOWS),
              environ={})}


def play(turn: tg.Turn, seed: int, calls: int, *, finish: bool = True) -> list[tg.Verdict]:
    """Calls of a few keys in batches, some outcomes left waiting, a retry, answers."""
    rng = random.Random(seed)
    asks: list[tg.Verdict] = []
    waiting: list[tg.ToolCall] = []
    for i in range(calls):
        if i % 6 == 0:
            turn.begin_cycle()
        call = tg.ToolCall(*rng.choice((("run", {"t": 1}), ("run", {"t": 1}), ("run", {"t": 2}), ("ls", "a b"))),
                           call_id=f"{seed}-{i}" if rng.random() < 0.5 else None)
        verdict = turn.check_call(call)
        if verdict.action is tg.Action.ASK:
            asks.append(verdict)
        waiting.append(call)
        if rng.random() < 0.7:
            rng.shuffle(waiting)
            for done in waiting[: rng.randint(1, len(waiting))]:
                answered = turn.record_outcome(done, rng.choice(list(tg.Outcome)))
                if answered.action is tg.Action.ASK:
                    asks.append(answered)
                waiting.remove(done)
        if i == calls // 2 and rng.random() < 0.5:
            turn.retry()
        if asks and rng.random() < 0.3:
            turn.resolve(asks.pop(), rng.choice(("continue", "redirect")))
    if finish:
        for call in waiting[: len(waiting) // 2]:
            turn.record_outcome(call, tg.Outcome.ERROR)
    return asks


def real_snapshots() -> dict[str, tuple[str, dict]]:
    """Snapshots of turns that hold every section: calls waiting (with and without ids, one object
    twice), an ended
    streak, shadows (one halted), a pending question, a latched halt, a probe turn, version 1."""
    made = {}
    turn = GUARDS["durable"]().turn(durable=True, promptable=True, conversation_id="c", agent_name="a")
    turn.begin_cycle()
    for i in range(4):
        read = tg.ToolCall("read", {"p": i}, call_id=f"r{i}")
        turn.check_call(read)
        turn.record_outcome(read, tg.Outcome.OK)
    runs = [tg.ToolCall("run", {"t": 1}, call_id=f"x{i}" if i != 2 else None) for i in range(3)]
    asked = [turn.check_call(call) for call in runs][-1]
    assert asked.action is tg.Action.ASK
    turn.record_outcome(runs[0], tg.Outcome.ERROR)
    turn.record_outcome(runs[1], tg.Outcome.ERROR)
    turn.check_call(tg.ToolCall("ls", "a b", call_id="ls"))  # ends the run streak, whose third call waits
    again = tg.ToolCall("ls", "a b")
    turn.check_call(again)
    turn.check_call(again)  # one object waiting twice: its second entry names its first check
    made["durable, attended, pending"] = ("durable", turn.snapshot(pending=asked))
    turn = GUARDS["keyed"]().turn()
    turn.check_call(tg.ToolCall("ls", "a b"))  # never answered
    for i in range(5):
        run = tg.ToolCall("run", {"t": 1}, call_id=f"k{i}")
        turn.check_call(run)
        last = turn.record_outcome(run, tg.Outcome.ERROR)
    assert last.action is tg.Action.HALT
    made["keyed, halted"] = ("keyed", turn.snapshot())
    turn = GUARDS["probe"]().turn(durable=True)
    play(turn, 3, 45)
    made["probe"] = ("probe", turn.snapshot())
    made["polling"] = ("polling", polling_snapshot())
    made["stale polling"] = ("stale polling", stale_polling_snapshot())
    made["version 1"] = ("v1", json.loads(V1.read_text()))
    return {name: (g, json.loads(json.dumps(state))) for name, (g, state) in made.items()}


def polling_snapshot() -> dict:
    """A turn with a stateful tool (``run``): (call, result) repeats, a restart, results settling
    in the current streak and in one another call ended, calls whose repeat waits for the outcome."""
    turn = GUARDS["polling"]().turn(durable=True)
    turn.begin_cycle()
    for i, result in enumerate(["a", "a", "b"]):
        run = tg.ToolCall("run", {"t": 1}, call_id=f"p{i}")
        turn.check_call(run)
        turn.record_outcome(run, tg.Outcome.ERROR, result=result)
    batch = [tg.ToolCall("run", {"t": 1}, call_id=f"b{i}") for i in range(3)]
    for call in batch:
        turn.check_call(call)
    turn.record_outcome(batch[2], tg.Outcome.ERROR, result="c")
    turn.check_call(tg.ToolCall("ls", "a b", call_id="ls"))  # ends the streak: it settles where it was kept
    more = [tg.ToolCall("run", {"t": 2}, call_id=f"m{i}") for i in range(3)]
    for call in more:
        turn.check_call(call)
    turn.record_outcome(more[0], tg.Outcome.OK, result="x")
    turn.record_outcome(more[2], tg.Outcome.OK, result="y")
    state = turn.snapshot()
    facts = state["facts"]
    assert facts["polled"] and facts["results"] and facts["baseline"] and facts["restarts"]
    assert facts["ended"][0]["results"] and any(len(key) == 32 for key in facts["counts"])
    return state


def stale_polling_snapshot() -> dict:
    """A stateful tool under ``stale_repeat``: behind a poll whose outcome has not come, another
    tool's call and a later poll's (call, result) repeat wait to be counted in check order (``held``)."""
    turn = GUARDS["stale polling"]().turn(durable=True)
    turn.begin_cycle()
    batch = [tg.ToolCall("run", {"t": 1}, call_id="w"), tg.ToolCall("ls", "a b", call_id="ls"),
             tg.ToolCall("run", {"t": 1}, call_id="r")]
    for call in batch:
        turn.check_call(call)
    turn.record_outcome(batch[2], tg.Outcome.OK, result="done")
    state = turn.snapshot()
    held = state["facts"]["held"]
    assert state["facts"]["polled"] and sorted(len(key) for key, _ in held.values()) == [16, 32]
    return state


SNAPSHOTS = real_snapshots()


def test_the_snapshots_hold_every_section():
    durable, halted, probe = (SNAPSHOTS[k][1] for k in ("durable, attended, pending", "keyed, halted", "probe"))
    assert durable["pending"] and durable["turn_key"] and durable["facts"]["ended"]
    assert any(entry[2] is None for entry in durable["awaiting"]) and any(entry[2] for entry in durable["awaiting"])
    assert [entry[4] for entry in durable["awaiting"] if len(entry) == 5] == [durable["awaiting"][-2][0]]
    assert halted["halt"]["event"] and probe["turn"]["cohort"] == "probe" and probe["halt"]
    assert durable["plugins"]["shadow"]["runs"]["capped"]["halt"]
    assert {"stale", "capped", "bytes", "default"} <= set(probe["plugins"]["shadow"]["runs"])


def paths(value: Any, prefix: str = "") -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Every field's path as the errors write it (``facts.counts.<hex>``, ``awaiting[0][1]``)
    and its keys into the data."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path, (key,)
            for sub, keys in paths(item, path):
                yield sub, (key, *keys)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            path = f"{prefix}[{i}]"
            yield path, (i,)
            for sub, keys in paths(item, path):
                yield sub, (i, *keys)


def swaps(value: Any) -> list[Any]:
    """What a mutated field becomes: other types, out-of-range values, another level of nesting."""
    out: list[Any] = [None, True, -1, 1.5, "1", [], {}, 2**60, [value], {"x": value}]
    if type(value) is int:
        out += [value + 1, value - 1, value * 1000 + 7, str(value)]
    if type(value) is str:
        out += [value + "x", value[:-1]]
    if isinstance(value, list) and value:
        out += [value[:-1], [*value, value[-1]], list(reversed(value))]
    if isinstance(value, dict) and value:
        first = next(iter(value))
        out += [{k: v for k, v in value.items() if k != first}, {**value, "unknown": 1}]
    return out


def mutants(state: dict) -> Iterator[tuple[str, str, dict]]:
    """Each field deleted, then each of its ``swaps``. Of the shadows' runs (one structure each), two
    are mutated field by field: the first, and the first with a would-be halt."""
    runs = state.get("plugins", {}).get("shadow", {}).get("runs", {})
    halted = [name for name, run in runs.items() if run["halt"]]
    kept = {*list(runs)[:1], *halted[:1]}
    for path, keys in list(paths(state)):
        if keys[:3] == ("plugins", "shadow", "runs") and len(keys) > 4 and keys[3] not in kept:
            continue
        parent = state
        for key in keys[:-1]:
            parent = parent[key]
        value = parent[keys[-1]]
        deleted = copy.deepcopy(state)
        holder = deleted
        for key in keys[:-1]:
            holder = holder[key]
        del holder[keys[-1]]
        yield path, "deleted", deleted
        for new in swaps(value):
            mutant = copy.deepcopy(state)
            holder = mutant
            for key in keys[:-1]:
                holder = holder[key]
            holder[keys[-1]] = new
            yield path, f"= {new!r}"[:60], mutant


CROSS = {"version": "", "kind": "", "turn.cohort": "config", "facts.seq": "", "keying": "", "turn_key": "",
         "key_check": "", "awaiting": "facts."}
"""A field checked against another: a bad value of the key is reported on the value's field (a
waiting call on the fact that waits on it: ``facts.next``, ``facts.ended[0].next``)."""


REFERENCES = {"facts.counts": ("facts.since_new", "facts.past"), "facts.polled": ("facts.held",)}
"""A field others name entries of, at any depth (a shadow's facts too): its entry damaged is
reported on the entry that names it (a held repeat waits behind the first check ``polled`` lists;
the stale window's stretches are of counted keys)."""


def related(path: str, field: str | None) -> bool:
    if field is None:
        return False
    if field == path or field.startswith((f"{path}.", f"{path}[")) or path.startswith((f"{field}.", f"{field}[")):
        return True
    if _parent(field).startswith(_parent(path)) or _parent(path).startswith(_parent(field)):
        return True  # checked against a sibling (tool_calls against seq, next against last)
    if _parent(_parent(field)) == _parent(_parent(path)) and "[" in path:
        return True  # against a neighbour in a list (an ended streak's range against the next one's)
    for referred, referring in REFERENCES.items():
        at = path.find(referred)
        if at >= 0 and field.startswith(tuple(path[:at] + name for name in referring)):
            return True
    cross = next((v for k, v in CROSS.items() if path == k or path.startswith((f"{k}.", f"{k}["))), None)
    return cross is not None and field.startswith(cross)


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def run_on(turn: tg.Turn, state: dict) -> None:
    """50 more calls, outcomes for the calls that waited in the snapshot, the pending question
    answered, then a snapshot of the result resumed once more."""
    for entry in state.get("awaiting", ())[:5] if isinstance(state.get("awaiting"), list) else ():
        if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[1], str) and entry[1]:
            turn.record_outcome(tg.ToolCall(entry[1], {"t": 1}, entry[2] if isinstance(entry[2], str) else None),
                                tg.Outcome.ERROR)
    pending = tg._snapshot.pending(state)
    if pending is not None and pending.event is not None:
        turn.resolve(pending, "continue")
    play(turn, 99, 50)
    again = turn.guard.resume(json.loads(json.dumps(turn.suspend())))
    play(again, 98, 5)
    again.end()


@pytest.mark.parametrize("name", list(SNAPSHOTS))
def test_every_field_mutated_is_refused_by_name_or_resumes_into_a_working_turn(name):
    kind, state = SNAPSHOTS[name]
    g = GUARDS[kind]()
    run_on(g.resume(copy.deepcopy(state)), state)  # the snapshot itself resumes
    refused = resumed = 0
    for path, how, mutant in mutants(state):
        try:
            turn = g.resume(mutant)
        except tg.SnapshotError as exc:
            assert related(path, exc.field), (path, how, exc.field, str(exc))
            assert exc.field in str(exc), (path, str(exc))
            refused += 1
            continue
        run_on(turn, mutant)
        resumed += 1
    assert refused > 100 and resumed > 10, (refused, resumed)


@pytest.mark.parametrize("bad", [None, [], "x", 1, {"kind": "turnguard.turn"},
                                 {"kind": "turnguard.turn", "version": 2}, {"kind": "turnguard.turn", "version": True},
                                 {"kind": "turnguard.turn", "version": 2.0}])
def test_what_is_barely_a_snapshot_is_refused_by_name(bad):
    with pytest.raises(tg.SnapshotError) as refused:
        guard().resume(bad)
    assert refused.value.field and refused.value.field in str(refused.value)


# -- a field that names an entry of another: a dangling reference is refused, by name ------------

UNCOUNTED = "00" * 8


def stale_snapshot() -> dict:
    """A turn under the ``stale_repeat`` signal: its since-news table and the news key."""
    turn = guard(stuck_signal="stale_repeat").turn(durable=True)
    for args in ({"t": 1}, {"t": 2}, {"t": 1}):
        call = tg.ToolCall("run", args)
        turn.check_call(call)
        turn.record_outcome(call, tg.Outcome.ERROR)
    return json.loads(json.dumps(turn.snapshot()))


def cycling_snapshot() -> dict:
    """A turn under ``cycle_repeat`` whose first call waits in the cycle runs (the second's outcome
    came early), with no streak waiting on it (``streak_stop_at=0`` keeps no ended streak)."""
    turn = guard(cycle_repeat_warn_at=3, cycle_repeat_stop_at=4, streak_stop_at=0, streak_warn_at=0).turn(durable=True)
    first, second = tg.ToolCall("ls", "a", call_id="a"), tg.ToolCall("run", {"t": 1}, call_id="b")
    turn.check_call(first)
    turn.check_call(second)
    turn.record_outcome(second, tg.Outcome.OK)
    state = json.loads(json.dumps(turn.snapshot()))
    assert state["facts"]["cycle_runs"]["waiting"] and state["facts"]["next"] > state["facts"]["seq"]
    return state


def _without_waiting(check_of: Any) -> Any:
    def damage(state: dict) -> None:
        check = check_of(state)
        state["awaiting"] = [entry for entry in state["awaiting"] if entry[0] != check]
    return damage


def _other_digest_at_next(state: dict) -> None:
    for entry in state["awaiting"]:
        if entry[0] == state["facts"]["next"]:
            entry[3] = UNCOUNTED


def _uncounted_since_new(state: dict) -> None:
    state["facts"]["since_new"][UNCOUNTED] = 1


def _set(*keys: str, value: Any) -> Any:
    def damage(state: dict) -> None:
        holder = state
        for key in keys[:-1]:
            holder = holder[key]
        holder[keys[-1]] = value
    return damage


def _first_early_dropped(state: dict) -> None:
    del state["facts"]["early"][next(iter(state["facts"]["early"]))]


DANGLING = {
    "last_key not counted": (lambda: SNAPSHOTS["keyed, halted"], _set("facts", "last_key", value=UNCOUNTED),
                             "facts.last_key", "keyed"),
    "a stateful last_key neither counted nor polled": (
        lambda: SNAPSHOTS["polling"], _set("facts", "last_key", value=UNCOUNTED), "facts.last_key", "polling"),
    "news not in since_new": (stale_snapshot, _set("facts", "news", value=UNCOUNTED), "facts.news", "stale"),
    "since_new key not counted": (stale_snapshot, _uncounted_since_new, f"facts.since_new.{UNCOUNTED}", "stale"),
    "next not waiting": (lambda: SNAPSHOTS["polling"][1], _without_waiting(lambda s: s["facts"]["next"]),
                         "facts.next", "polling"),
    "next waiting as another call": (lambda: SNAPSHOTS["polling"][1], _other_digest_at_next, "facts.next",
                                     "polling"),
    "an early outcome of the streak lost": (lambda: SNAPSHOTS["polling"][1], _first_early_dropped, "facts.next",
                                            "polling"),
    "an ended streak's next not waiting": (
        lambda: SNAPSHOTS["durable, attended, pending"][1],
        _without_waiting(lambda s: s["facts"]["ended"][0]["next"]), "facts.ended[0].next", "durable"),
    "the cycle runs' next not waiting": (
        cycling_snapshot, _without_waiting(lambda s: s["facts"]["cycle_runs"]["next"]), "facts.cycle_runs.next",
        "cycling"),
}
RESUMERS = {**GUARDS, "stale": lambda: guard(stuck_signal="stale_repeat"),
            "cycling": lambda: guard(cycle_repeat_warn_at=3, cycle_repeat_stop_at=4, streak_stop_at=0,
                                     streak_warn_at=0)}


@pytest.mark.parametrize("case", DANGLING)
def test_a_dangling_reference_is_refused_naming_the_field_that_holds_it(case):
    """Each field that names an entry of another (the streak's key a counted key, the news a key
    of the since-news table and that table's keys counted ones, the checks the streaks and the
    cycle runs wait on calls ``awaiting`` lists): pointed at nothing, the snapshot is refused,
    naming the field, with no turn opened (the intact one then resumes under its id)."""
    make, damage, field, kind = DANGLING[case]
    state = make()
    state = copy.deepcopy(state[1] if isinstance(state, tuple) else state)
    g = RESUMERS[kind]()
    mutant = copy.deepcopy(state)
    damage(mutant)
    with pytest.raises(tg.SnapshotError) as refused:
        g.resume(mutant)
    assert refused.value.field == field, str(refused.value)
    turn = g.resume(state)
    assert turn.turn_id == state["turn"]["turn_id"] and turn.ledger.resumed_from is None
