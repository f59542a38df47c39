"""A resumed turn is the turn that never stopped: a differential harness over scripted turns.

Each script (model requests, batches of calls whose outcomes arrive shuffled and sometimes a batch
late, retries, answers to questions) runs once uninterrupted, then once for every cut point: the
first guard plays the script up to the cut, suspends the turn, and a second guard (another
process's, as far as the turn can tell: a durable turn's own key, the snapshot through JSON)
resumes it and plays the rest. Both runs must give the same verdicts, the same shadow and probe
detections, and the same summaries, live and shadow. Calls checked before the cut have their
outcomes reported after it on the original objects (the same process) or on new ones (another
process), without a ``call_id`` too: identical calls' outcomes then arrive in check order, which
is what matching by the call itself can tell apart. In the scripts with reused objects, one
object is checked up to three times before its outcomes come, each settling its own next check
(the same process: the objects are the ones checked before the cut).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

import turnguard as tg

KEYS: tuple[tuple[str, Any], ...] = (
    ("build", {"target": "A"}),
    ("build", {"target": "A"}),
    ("build", {"target": "B"}),
    ("bash", "make test"),
    ("bash", '{"b": 1, "a": 2}'),  # canonical: the dict below; bytes: another call
    ("bash", {"a": 2, "b": 1}),
)
OUTCOMES = (tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.ERROR, tg.Outcome.OK, tg.Outcome.DENIED,
            tg.Outcome.UNKNOWN)
SHADOWS = {"stale": {"stuck_signal": "stale_repeat", "stuck_repeat_threshold": 3},
           "bytes": tg.GuardConfig(key_mode="bytes", streak_warn_at=2, streak_stop_at=3),
           "any": {"streak_stop_on": "any", "streak_stop_at": 4}}
MAIN = {"name": "main", "soft_cap": 6, "hard_multiplier": 3, "stuck_repeat_threshold": 3, "streak_warn_at": 3,
        "streak_stop_at": 4, "max_cycles_per_turn": 9}
CONFIGS = {
    "shadows": dict(MAIN, shadow=SHADOWS),
    "probe": dict(MAIN, shadow=SHADOWS, probe=tg.Probe(1.0, tg.GuardConfig(hard_multiplier=6,
                                                                             streak_stop_at=6))),
}
POLLING = dict(stateful_tools=("poll",), cycle_repeat_warn_at=2, cycle_repeat_stop_at=4)
REUSE_CONFIGS = {
    "shadows": dict(CONFIGS["shadows"], soft_cap=20, stuck_repeat_threshold=8),
    "polling": dict(MAIN, soft_cap=20, stuck_repeat_threshold=8, **POLLING,
                    shadow={"cycles": dict(POLLING, cycle_repeat_stop_at=3), **SHADOWS}),
}
REUSE_KEYS: tuple[tuple[str, Any], ...] = (
    ("poll", {"job": 1}),
    ("poll", {"job": 1}),
    ("poll", {"job": 2}),
    ("list", {}),
    ("build", {"target": "A"}),
)
MOST_CHECKS_WAITING = 3
"""The most checks of one object in the reuse scripts waiting for their outcomes at once."""


@dataclass
class Script:
    calls: list[tuple[str, Any, str | None]] = field(default_factory=list)
    ops: list[tuple[Any, ...]] = field(default_factory=list)


def make_script(seed: int) -> Script:
    """Model requests of 1 to 5 calls (keys drawn from a few, so streaks and repeats form); the
    outcomes come shuffled after the batch, some (of calls with a ``call_id``) held back until
    after the next one; now and then a retry, and answers to the questions asked so far."""
    rng = random.Random(seed)
    script, held = Script(), []
    for _ in range(rng.randint(4, 9)):
        script.ops.append(("cycle",))
        batch = []
        for _ in range(rng.choice((1, 1, 2, 3, 5))):
            name, args = rng.choice(KEYS[: rng.choice((2, 4, 6))])
            index = len(script.calls)
            script.calls.append((name, args, f"id{index}" if rng.random() < 0.5 else None))
            script.ops.append(("check", index))
            batch.append(index)
        arriving = held + batch
        rng.shuffle(arriving)
        held = [i for i in arriving if script.calls[i][2] is not None and rng.random() < 0.25]
        ordered = in_check_order_among_the_same(script, [i for i in arriving if i not in held])
        script.ops += [("outcome", i, rng.choice(OUTCOMES)) for i in ordered]
        if rng.random() < 0.15:
            script.ops.append(("retry",))
        if rng.random() < 0.5:
            script.ops.append(("answer", rng.choice(("continue", "redirect", "continue", "stop"))))
    script.ops += [("outcome", i, rng.choice(OUTCOMES)) for i in in_check_order_among_the_same(script, held)]
    return script


def make_reuse_script(seed: int) -> Script:
    """Model requests of 1 to 6 checks, each of a new object or, now and then, of an object checked
    before (still waiting for up to two outcomes, or settled); the outcomes come shuffled after the
    batch, a polling tool's with a result, some held back until after a later batch (so an object
    waits across requests, and is checked again there); retries and answers as in ``make_script``."""
    rng = random.Random(seed)
    script, waiting = Script(), {}
    for _ in range(rng.randint(4, 9)):
        script.ops.append(("cycle",))
        for _ in range(rng.choice((1, 2, 3, 5, 6))):
            again = [i for i in range(len(script.calls)) if waiting.get(i, 0) < MOST_CHECKS_WAITING]
            if again and rng.random() < 0.45:
                index = rng.choice(again)
            else:
                name, args = rng.choice(REUSE_KEYS)
                index = len(script.calls)
                script.calls.append((name, args, f"id{index}" if rng.random() < 0.2 else None))
            waiting[index] = waiting.get(index, 0) + 1
            script.ops.append(("check", index))
        reports = [i for i, n in waiting.items() for _ in range(n) if rng.random() < 0.75]
        rng.shuffle(reports)
        script.ops += [outcome_op(script, i, rng) for i in reports]
        for i in reports:
            waiting[i] -= 1
        if rng.random() < 0.15:
            script.ops.append(("retry",))
        if rng.random() < 0.5:
            script.ops.append(("answer", rng.choice(("continue", "redirect", "continue", "stop"))))
    script.ops += [outcome_op(script, i, rng) for i, n in waiting.items() for _ in range(n)]
    return script


def outcome_op(script: Script, index: int, rng: random.Random) -> tuple[Any, ...]:
    """An outcome for object ``index``, with a result when it is a polling tool's."""
    result = rng.choice(("r1", "r1", "r2")) if script.calls[index][0] == "poll" else None
    return ("outcome", index, rng.choice(OUTCOMES), result)


def in_check_order_among_the_same(script: Script, order: list[int]) -> list[int]:
    """``order`` with the calls that have no ``call_id`` and the same key put in check order (each
    keeps the positions the group had): a new object for such a call names its earliest check."""
    groups: dict[Any, list[int]] = {}
    for i in order:
        name, args, call_id = script.calls[i]
        if call_id is None:
            groups.setdefault((name, json.dumps(args, sort_keys=True)), []).append(i)
    taken = {key: iter(sorted(indices)) for key, indices in groups.items()}
    out = []
    for i in order:
        name, args, call_id = script.calls[i]
        out.append(i if call_id is not None else next(taken[(name, json.dumps(args, sort_keys=True))]))
    return out


class Heard:
    """What the shadows said and how each turn ended, the moving parts left out (ids, digests, times)."""

    def __init__(self) -> None:
        self.said: list[tuple[Any, ...]] = []

    @tg.hookimpl
    def turnguard_shadow_detected(self, turn, policy, event):
        self.said.append(("shadow", policy, *event_facts(event), turn.tool_calls))

    @tg.hookimpl
    def turnguard_shadow_turn_ended(self, policy, summary):
        self.said.append(("shadow summary", policy, *summary_facts(summary)))

    @tg.hookimpl
    def turnguard_turn_ended(self, summary):
        self.said.append(("summary", *summary_facts(summary)))


class HeardOutcomes(Heard):
    """Also what each outcome settled, and the outcomes ignored."""

    @tg.hookimpl
    def turnguard_outcome_recorded(self, turn, call, outcome, verdict):
        self.said.append(("outcome", call.name, call.call_id, outcome, *verdict_facts(verdict), *turn_facts(turn)))

    @tg.hookimpl
    def turnguard_outcome_ignored(self, call, outcome, reason):
        self.said.append(("ignored", call.name, call.call_id, outcome, reason))


def turn_facts(turn: tg.LedgerView) -> tuple[Any, ...]:
    """What an outcome settled: the streak's counts, the stale repeats, the results' restarts, the totals."""
    return (turn.streak_length, turn.failing_streak_length, turn.settled_streak_length, turn.stop_count,
            turn.awaiting_in_streak, turn.max_stale_repeat, turn.result_restarts, turn.stuck_count,
            *(turn.outcomes(outcome) for outcome in tg.Outcome))


def event_facts(event: tg.LoopDetectedEvent | None) -> tuple[Any, ...]:
    if event is None:
        return ()
    return (str(event.threshold), event.level, event.action, event.limit, event.tool_calls, event.cycles,
            event.max_key_repeat, event.streak_length, event.failing_streak_length, event.tool_name, event.message)


def summary_facts(summary: tg.TurnSummary) -> tuple[Any, ...]:
    return (summary.reason, summary.tool_calls, summary.cycles, summary.max_key_repeat, summary.first_stuck_call,
            summary.distinct_keys, summary.halted, str(summary.threshold), summary.stuck, summary.detections,
            summary.cohort, summary.resumed_from, summary.fresh_state)


def verdict_facts(verdict: tg.Verdict) -> tuple[Any, ...]:
    return (verdict.action, str(verdict.threshold), verdict.message, *event_facts(verdict.event))


class Player:
    """Plays a script's operations on a turn, keeping the calls and the questions asked."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.objects: dict[int, tg.ToolCall] = {}
        self.asks: list[tg.Verdict] = []
        self.out: list[tuple[Any, ...]] = []

    def play(self, turn: tg.Turn, ops: list[tuple[Any, ...]], *, fresh_before: int = -1) -> None:
        """``fresh_before``: calls checked before this index are reported on new objects."""
        for op in ops:
            verdict = self.step(turn, op, fresh_before)
            if verdict is not None:
                self.out.append((op[0], *verdict_facts(verdict)))
                if verdict.action is tg.Action.ASK:
                    self.asks.append(verdict)

    def step(self, turn: tg.Turn, op: tuple[Any, ...], fresh_before: int) -> tg.Verdict | None:
        kind = op[0]
        if kind == "cycle":
            return turn.begin_cycle()
        if kind == "check":
            call = self.objects.get(op[1]) or self.objects.setdefault(op[1], tg.ToolCall(*self.script.calls[op[1]]))
            return turn.check_call(call)
        if kind == "outcome":
            call = self.objects[op[1]]
            if op[1] < fresh_before:
                call = tg.ToolCall(call.name, call.args, call.call_id)
            return turn.record_outcome(call, op[2], *op[3:])
        if kind == "retry":
            turn.retry()
            return None
        if not self.asks:
            return None
        return turn.resolve(self.asks.pop(), op[1])


class Host(Player):
    """A player that runs only the calls it was not told to halt: an outcome is reported for each
    check of an object that did not answer HALT, none for the others."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.runs: dict[int, int] = {}

    def step(self, turn: tg.Turn, op: tuple[Any, ...], fresh_before: int) -> tg.Verdict | None:
        if op[0] == "outcome":
            if not self.runs.get(op[1]):
                return None
            self.runs[op[1]] -= 1
        verdict = super().step(turn, op, fresh_before)
        if op[0] == "check" and verdict is not None and verdict.action is not tg.Action.HALT:
            self.runs[op[1]] = self.runs.get(op[1], 0) + 1
        return verdict


def guard_for(options: dict[str, Any], heard: Heard) -> tg.Guard:
    return tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False, **options),
                    plugins={"heard": heard}, environ={})


@dataclass
class Bench:
    """The guards a config's runs use, kept across the runs (a guard is built once per process)."""

    first: tg.Guard
    second: tg.Guard
    heard: Heard


def make_benches(configs: dict[str, dict[str, Any]], heard_type: type[Heard] = Heard) -> dict[str, Bench]:
    made = {}
    for config, options in configs.items():
        heard = heard_type()
        made[config] = Bench(guard_for(options, heard), guard_for(options, heard), heard)
    return made


@pytest.fixture(scope="module")
def benches() -> dict[str, Bench]:
    return make_benches(CONFIGS)


@pytest.fixture(scope="module")
def reuse_benches() -> dict[str, Bench]:
    return make_benches(REUSE_CONFIGS, HeardOutcomes)


def uninterrupted(bench: Bench, script: Script, promptable: bool, host: type[Player] = Player
                  ) -> list[tuple[Any, ...]]:
    bench.heard.said.clear()
    player = host(script)
    turn = bench.first.turn(durable=True, promptable=promptable)
    player.play(turn, script.ops)
    turn.end()
    return player.out + bench.heard.said


def cut_at(bench: Bench, script: Script, promptable: bool, cut: int, *, fresh: bool, host: type[Player] = Player
           ) -> list[tuple[Any, ...]]:
    bench.heard.said.clear()
    player = host(script)
    first = bench.first.turn(durable=True, promptable=promptable)
    player.play(first, script.ops[:cut])
    state = json.loads(json.dumps(first.suspend()))
    resumed = bench.second.resume(state)
    checked = sum(1 for op in script.ops[:cut] if op[0] == "check")
    player.play(resumed, script.ops[cut:], fresh_before=checked if fresh else -1)
    resumed.end()
    return player.out + bench.heard.said


def assert_resumes_anywhere_as_whole(bench: Bench, script: Script, promptable: bool, host: type[Player]) -> None:
    """Suspended at every op and resumed in the same process (the objects kept), the turn plays as
    the one never suspended."""
    whole = uninterrupted(bench, script, promptable, host)
    for cut in range(len(script.ops) + 1):
        assert cut_at(bench, script, promptable, cut, fresh=False, host=host) == whole, cut


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("seed", range(8))
def test_a_turn_resumed_at_any_cut_gives_the_verdicts_detections_and_summaries_of_the_whole(
        benches, config, promptable, seed):
    script = make_script(seed * 7 + (config == "probe"))
    bench = benches[config]
    whole = uninterrupted(bench, script, promptable)
    assert any(entry[0] == "shadow" for entry in whole) or seed % 2  # the scripts do reach the shadows
    for cut in range(len(script.ops) + 1):
        for fresh in (False, True):
            assert cut_at(bench, script, promptable, cut, fresh=fresh) == whole, (cut, fresh)


def test_the_scripts_hold_what_the_harness_is_for(benches):
    """Across the scripts the cuts fall on calls still waiting (with and without a ``call_id``),
    on ended streaks still settling, on shadows' would-be halts and on the live turn's halt."""
    seen = set()
    for seed in range(8):
        for config in CONFIGS:
            script = make_script(seed * 7 + (config == "probe"))
            for cut in range(len(script.ops) + 1):
                player = Player(script)
                turn = benches[config].first.turn(durable=True)
                player.play(turn, script.ops[:cut])
                state = turn.suspend()
                seen.update(f"waiting{'' if entry[2] else ' without id'}" for entry in state["awaiting"])
                seen.update(("ended streak",) if state["facts"].get("ended") else ())
                seen.update(("live halt",) if state["halt"] else ())
                runs = state["plugins"]["shadow"]["runs"]
                seen.update(f"{name} halt" for name, run in runs.items() if run["halt"])
    assert {"waiting", "waiting without id", "ended streak", "live halt", "stale halt", "bytes halt"} <= seen


@pytest.mark.parametrize("config", list(REUSE_CONFIGS))
@pytest.mark.parametrize("promptable", [False, True], ids=["unattended", "attended"])
@pytest.mark.parametrize("seed", range(8))
def test_reused_objects_settle_their_own_checks_in_order_across_any_cut(reuse_benches, config, promptable, seed):
    """An object checked up to three times before its outcomes, resumed in the same process at any
    point (between its checks, between its outcomes): each outcome settles the check it settles in
    the turn that never stopped, so verdicts, detections, what each outcome settled and the
    summaries are the whole turn's."""
    assert_resumes_anywhere_as_whole(reuse_benches[config], make_reuse_script(seed * 5 + (config == "polling")),
                                     promptable, Host)


def test_the_reuse_scripts_hold_what_the_harness_is_for(reuse_benches):
    """Across the reuse scripts the cuts fall on objects waiting for two and for three checks
    (with and without a ``call_id``), and the turns restart polls, repeat cycles and stop streaks."""
    seen = set()
    for seed in range(8):
        for config in REUSE_CONFIGS:
            script = make_reuse_script(seed * 5 + (config == "polling"))
            bench = reuse_benches[config]
            player = Host(script)
            turn = bench.first.turn(durable=True)
            player.play(turn, script.ops)
            seen.update(("restart",) if turn.view.result_restarts else ())
            seen.update(entry[2] for entry in player.out)
            turn.end()
            for cut in range(len(script.ops) + 1):
                player = Host(script)
                turn = bench.first.turn(durable=True)
                player.play(turn, script.ops[:cut])
                awaiting = turn.suspend()["awaiting"]
                objects = [entry[4] if len(entry) == 5 else entry[0] for entry in awaiting]
                seen.update(f"object waiting {objects.count(entry[4])} times{'' if entry[2] else ' without id'}"
                            for entry in awaiting if len(entry) == 5)
    assert {"object waiting 2 times", "object waiting 2 times without id", "object waiting 3 times without id",
            "restart", "cycle_repeat", "streak"} <= seen, seen
