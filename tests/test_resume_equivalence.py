"""A resumed turn is the turn that never stopped: a differential harness over scripted turns.

Each script (model requests, batches of calls whose outcomes arrive shuffled and sometimes a batch
late, retries, answers to questions) runs once uninterrupted, then once for every cut point: the
first guard plays the script up to the cut, suspends the turn, and a second guard (another
process's, as far as the turn can tell: a durable turn's own key, the snapshot through JSON)
resumes it and plays the rest. Both runs must give the same verdicts, the same shadow and probe
detections, and the same summaries, live and shadow. Calls checked before the cut have their
outcomes reported after it on the original objects (the same process) or on new ones (another
process), without a ``call_id`` too: identical calls' outcomes then arrive in check order, which
is what matching by the call itself can tell apart.
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
            name, args, call_id = self.script.calls[op[1]]
            call = self.objects[op[1]] = tg.ToolCall(name, args, call_id)
            return turn.check_call(call)
        if kind == "outcome":
            call = self.objects[op[1]]
            if op[1] < fresh_before:
                call = tg.ToolCall(call.name, call.args, call.call_id)
            return turn.record_outcome(call, op[2])
        if kind == "retry":
            turn.retry()
            return None
        if not self.asks:
            return None
        return turn.resolve(self.asks.pop(), op[1])


def guard_for(config: str, heard: Heard) -> tg.Guard:
    options = CONFIGS[config]
    return tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False, **options),
                    plugins={"heard": heard}, environ={})


@dataclass
class Bench:
    """The guards a config's runs use, kept across the runs (a guard is built once per process)."""

    first: tg.Guard
    second: tg.Guard
    heard: Heard


@pytest.fixture(scope="module")
def benches() -> dict[str, Bench]:
    made = {}
    for config in CONFIGS:
        heard = Heard()
        made[config] = Bench(guard_for(config, heard), guard_for(config, heard), heard)
    return made


def uninterrupted(bench: Bench, script: Script, promptable: bool) -> list[tuple[Any, ...]]:
    bench.heard.said.clear()
    player = Player(script)
    turn = bench.first.turn(durable=True, promptable=promptable)
    player.play(turn, script.ops)
    turn.end()
    return player.out + bench.heard.said


def cut_at(bench: Bench, script: Script, promptable: bool, cut: int, *, fresh: bool) -> list[tuple[Any, ...]]:
    bench.heard.said.clear()
    player = Player(script)
    first = bench.first.turn(durable=True, promptable=promptable)
    player.play(first, script.ops[:cut])
    state = json.loads(json.dumps(first.suspend()))
    resumed = bench.second.resume(state)
    checked = sum(1 for op in script.ops[:cut] if op[0] == "check")
    player.play(resumed, script.ops[cut:], fresh_before=checked if fresh else -1)
    resumed.end()
    return player.out + bench.heard.said


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
