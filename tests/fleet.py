"""A simulated fleet of agent turns with a known mix, driven through the real guard.

The dashboards are proven against what this fleet does: every kind of turn an operator should
see on them (short and long productive turns, turns stuck past the soft cap, runaways the
backstop ends, failing streaks attended and unattended, asks answered "continue" and "stop", an
explicit cap, a plugin that raises, tools that poll). The fleet is deterministic for a seed, so running it twice
produces the same metric series (the Prometheus test relies on that).

``Tally`` is the ground truth, taken from the guard's own observer hooks (not from the
OpenTelemetry plugin under test): every turn summary, detection, answer and plugin error, and
every shadow policy's would-be detection and per-turn summary (the guards run ``SHADOWS``).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import turnguard as tg
from turnguard.hookspecs import hookimpl

AGENTS = ("coder", "reviewer", "support")
TOOLS = ("read_file", "grep", "edit_file", "run_tests", "search_kb", "http_get", "shell", "book_flight")
EXPLICIT_AGENT = "batch-bot"
EXPLICIT_CAP = 50
CYCLE_AGENT = "chatty-bot"
CYCLE_CAP = 12
"""A guard with ``max_cycles_per_turn``: its halts are of a model request, which no tool call tripped."""
POLL_TOOLS = ("ci_status", "job_status")
"""Tools the polling turns call identically while their answer changes (the polling guard's ``stateful_tools``)."""
SHADOWS: dict[str, dict[str, Any]] = {
    "stale_repeat": {"stuck_signal": "stale_repeat"},
    "stop_on_any": {"streak_stop_on": "any"},
    "backstop_5x": {"hard_multiplier": 5},
}
"""Shadow policies the fleet's guards evaluate next to the live one (the dashboards' shadow row)."""
FLAKY_TOOL = "flaky_probe"
"""Calls to this tool make the fleet's third-party plugin raise (the guard isolates it)."""


class Kind(enum.Enum):
    """The kinds of turn in the mix."""

    SHORT = "short"  # 1-40 distinct calls; every tenth calls the flaky tool once
    LONG = "long"  # past the soft cap, keys repeated < D times, completes on its own
    SOFT_STUCK = "soft_stuck"  # a productive prefix, then two calls alternating: stuck, halted past S
    RUNAWAY = "runaway"  # distinct calls forever: only the backstop ends it
    FAILING_UNATTENDED = "failing_unattended"  # identical failing call, nobody watching: warn observed, halt at 8
    ASK_CONTINUE = "ask_continue"  # attended, identical failing call: asked at 5, user says continue, then fixed
    ASK_STOP = "ask_stop"  # attended, identical failing call: asked at 5, user says stop
    ASK_LATE_CONTINUE = "ask_late_continue"  # attended, first ask unanswered, asked again at 8 failures: continue
    EXPLICIT = "explicit"  # a guard with max_tool_calls_per_turn=50
    CYCLE_CAP = "cycle_cap"  # a guard with max_cycles_per_turn=12: model requests until the cap halts one
    POLLING = "polling"  # a guard with stateful_tools: one status call polled while its answer changes


@dataclass(frozen=True)
class FleetMix:
    """How many turns of each kind; the default is the proof's mix (1,047 turns)."""

    short: int = 600
    long: int = 120
    soft_stuck: int = 60
    runaway: int = 12
    failing_unattended: int = 80
    ask_continue: int = 50
    ask_stop: int = 40
    ask_late_continue: int = 20
    explicit: int = 30
    cycle_cap: int = 15
    polling: int = 20

    def counts(self) -> dict[Kind, int]:
        return {kind: getattr(self, kind.value) for kind in Kind}

    @property
    def turns(self) -> int:
        return sum(self.counts().values())


@dataclass(frozen=True)
class TurnRecord:
    """One finished turn as the guard summarised it, with the kind the fleet meant it to be."""

    kind: Kind
    summary: tg.TurnSummary


@dataclass
class Tally:
    """What the guard decided during a fleet run (ground truth for the dashboards' queries)."""

    turns: list[TurnRecord] = field(default_factory=list)
    detections: list[tg.LoopDetectedEvent] = field(default_factory=list)
    answers: list[tuple[tg.LoopDetectedEvent, str]] = field(default_factory=list)
    plugin_errors: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    planned: dict[str, Kind] = field(default_factory=dict)
    """Turn id -> the kind of turn the fleet meant it to be."""
    shadow_detections: list[tuple[str, tg.LoopDetectedEvent]] = field(default_factory=list)
    shadow_turns: list[tuple[str, tg.TurnSummary]] = field(default_factory=list)
    """(shadow policy, what it made of a turn) for every shadow and turn."""

    @hookimpl
    def turnguard_shadow_detected(self, policy: str, event: tg.LoopDetectedEvent) -> None:
        self.shadow_detections.append((policy, event))

    @hookimpl
    def turnguard_shadow_turn_ended(self, policy: str, summary: tg.TurnSummary) -> None:
        self.shadow_turns.append((policy, summary))

    @hookimpl
    def turnguard_loop_detected(self, event: tg.LoopDetectedEvent) -> None:
        self.detections.append(event)

    @hookimpl
    def turnguard_escalation_resolved(self, event: tg.LoopDetectedEvent, response: str) -> None:
        self.answers.append((event, str(response)))

    @hookimpl
    def turnguard_plugin_error(self, plugin: str, hook: str, error: BaseException) -> None:
        self.plugin_errors[(plugin, hook, type(error).__qualname__)] += 1

    @hookimpl
    def turnguard_turn_ended(self, summary: tg.TurnSummary) -> None:
        self.turns.append(TurnRecord(self.planned[summary.turn_id], summary))


class FlakyPlugin:
    """A third-party plugin with a bug: it raises whenever the flaky tool is checked."""

    @hookimpl
    def turnguard_check_call(self, call: tg.ToolCall) -> None:
        if call.name == FLAKY_TOOL:
            raise RuntimeError("flaky plugin: unexpected tool")


@dataclass(frozen=True)
class Fleet:
    """Guards sharing the providers, and the tally that watches them."""

    adaptive: tg.Guard
    explicit: tg.Guard
    cycles: tg.Guard
    polling: tg.Guard
    tally: Tally

    def guard(self, kind: Kind) -> tuple[tg.Guard, str | None]:
        """The guard a kind of turn runs under, and its agent (``None``: any of ``AGENTS``)."""
        if kind is Kind.EXPLICIT:
            return self.explicit, EXPLICIT_AGENT
        if kind is Kind.CYCLE_CAP:
            return self.cycles, CYCLE_AGENT
        if kind is Kind.POLLING:
            return self.polling, None
        return self.adaptive, None


def make_fleet(config: tg.GuardConfig | None = None, **providers: Any) -> Fleet:
    """Four guards (the adaptive default, an explicit cap, a cycle cap, polling tools listed as
    ``stateful_tools``) reporting into ``providers``."""
    config = config or tg.GuardConfig(load_entrypoints=False, shadow=SHADOWS)
    tally = Tally()
    adaptive = tg.Guard(config, plugins={"fleet-tally": tally, "flaky": FlakyPlugin()}, **providers)
    explicit = tg.Guard(
        config.replace(max_tool_calls_per_turn=EXPLICIT_CAP), plugins={"fleet-tally": tally}, **providers
    )
    cycles = tg.Guard(config.replace(max_cycles_per_turn=CYCLE_CAP), plugins={"fleet-tally": tally}, **providers)
    polling = tg.Guard(config.replace(stateful_tools=POLL_TOOLS), plugins={"fleet-tally": tally}, **providers)
    return Fleet(adaptive, explicit, cycles, polling, tally)


def run_fleet(fleet: Fleet, mix: FleetMix = FleetMix(), seed: int = 4, *, sample: Callable[[], object] | None = None,
              sample_every: int = 250) -> Tally:
    """Run every turn of ``mix`` (interleaved, deterministic for ``seed``); returns the tally.
    ``sample`` is called after every ``sample_every`` turns: a test lets the metrics so far reach
    its server, so the fleet's series grow over several samples, not in one step."""
    rng = random.Random(seed)
    plan = [kind for kind, count in mix.counts().items() for _ in range(count)]
    rng.shuffle(plan)
    for index, kind in enumerate(plan):
        if sample is not None and index and index % sample_every == 0:
            sample()
        guard, agent = fleet.guard(kind)
        agent = agent or AGENTS[index % len(AGENTS)]
        answers = FAILING_ANSWERS.get(kind)
        promptable = index % 2 == 0 if answers is None else bool(answers)
        turn_id = f"{seed}-{index}"
        fleet.tally.planned[turn_id] = kind
        opened = guard.turn(agent_name=agent, promptable=promptable, conversation_id=f"c{index}", turn_id=turn_id)
        with contextlib.suppress(tg.LoopDetected, HostStopped), opened as turn:
            _DRIVERS[kind](turn, rng, guard.config)
    return fleet.tally


# -- drivers: each plays one kind of turn the way a host would --------------------------------

Driver = Callable[[tg.Turn, random.Random, tg.GuardConfig], None]


HALT_EXITS = ("break", "raise_for", "own_exception", "end_cancelled", "end_custom")
"""How a host leaves a halted turn: out of its loop (the turn ends ``halted``), by ``raise_for``
(``halted``), by raising an exception of its own (``error``), ``turn.end("cancelled")``, or
``turn.end`` with a reason of its own (``HOST_REASON``). The stuck and runaway turns take each in
turn, so a halted turn is not always ``halted`` by outcome. (The adapters' ``end(exc)`` maps to
``halted``, ``cancelled`` or ``error``: among these.)"""
HOST_REASON = "budget"
"""A host's own end reason for a turn turnguard halted (calibrate censors it by its threshold)."""


class HostStopped(Exception):
    """The exception a host raises on its own when turnguard halts its turn."""


def _leave_halted(turn: tg.Turn, verdict: tg.Verdict) -> None:
    """End a halted turn by one of ``HALT_EXITS``, chosen by the turn's index in the plan."""
    way = HALT_EXITS[int(turn.turn_id.rsplit("-", 1)[1]) % len(HALT_EXITS)]
    if way == "raise_for":
        turn.raise_for(verdict)
    elif way == "own_exception":
        raise HostStopped(verdict.message)
    elif way == "end_cancelled":
        turn.end("cancelled")
    elif way == "end_custom":
        turn.end(HOST_REASON)


def _step(turn: tg.Turn, call: tg.ToolCall, outcome: str = "ok") -> tg.Verdict:
    """Check a call; execute it (record ``outcome``) unless the guard halts it."""
    verdict = turn.check_call(call)
    if verdict.action is tg.Action.HALT:
        return verdict
    return turn.record_outcome(call, outcome)


def _distinct(tool: str, n: int, start: int = 0) -> Iterator[tg.ToolCall]:
    for i in range(start, start + n):
        yield tg.ToolCall(tool, {"path": f"src/module_{i}.py", "line": i})


def _short(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    n = rng.randint(1, 40)
    tool = rng.choice(TOOLS)
    flaky = rng.random() < 0.1
    for i, call in enumerate(_distinct(tool, n)):
        if i % 3 == 0:
            turn.begin_cycle()
        if flaky and i == 0:
            _step(turn, tg.ToolCall(FLAKY_TOOL, {"probe": True}))
        _step(turn, call)


LONG_LENGTHS = ((101, 200), (201, 300), (301, 500), (501, 1000))
"""Long productive turns are spread over these bands of tool calls (S = 100 multiples)."""


def _long(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    s = config.soft_cap
    low, high = LONG_LENGTHS[rng.randrange(len(LONG_LENGTHS))]
    n = rng.randint(low * s // 100, high * s // 100)
    repeat = rng.randint(2, config.stuck_repeat_threshold - 1)  # below D: never stuck
    distinct = -(-n // repeat)
    tool = rng.choice(TOOLS)
    for i in range(n):
        if i % 5 == 0:
            turn.begin_cycle()
        # key i % distinct: each key comes back every `distinct` calls, at most `repeat` times
        verdict = _step(turn, tg.ToolCall(tool, {"page": i % distinct}))
        if verdict.action is tg.Action.HALT:
            raise AssertionError(f"a productive long turn was halted at call {i + 1}: {verdict}")


def _soft_stuck(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    prefix = rng.choice((10, 40, 80, 95, 120, 200, 350))
    for i, call in enumerate(_distinct("read_file", prefix)):
        if i % 4 == 0:
            turn.begin_cycle()
        _step(turn, call)
    a, b = tg.ToolCall("run_tests", {"suite": "all"}), tg.ToolCall("edit_file", {"path": "fix.py", "patch": "x"})
    for i in range(10 * config.hard_cap):
        verdict = _step(turn, (a, b)[i % 2], "error" if i % 2 == 0 else "ok")
        if verdict.action is tg.Action.HALT:
            _leave_halted(turn, verdict)
            return
    raise AssertionError("a stuck turn was never halted")


def _runaway(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    turn.begin_cycle()
    for call in _distinct("http_get", 10 * config.hard_cap):
        verdict = _step(turn, call)
        if verdict.action is tg.Action.HALT:
            _leave_halted(turn, verdict)
            return
    raise AssertionError("a runaway turn outran the backstop")


def _failing(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig, answers: tuple[str, ...]) -> None:
    """Some good calls, then one call failing again and again; ``answers`` go to each ASK in turn."""
    turn.begin_cycle()
    for call in _distinct("grep", rng.randint(0, 10)):
        _step(turn, call)
    broken = tg.ToolCall("shell", {"cmd": "mvn -q test"})
    pending = list(answers)
    for _ in range(4 * config.streak_stop_at):
        verdict = turn.check_call(broken)
        if verdict.action is tg.Action.ASK:
            answer = pending.pop(0)
            if answer == "stop":
                turn.resolve(verdict, "stop")
                return
            if answer == "continue":
                turn.resolve(verdict, "continue")
                break
            # "unanswered": the host shows the question without blocking, and goes on
        if verdict.action is tg.Action.HALT:
            return
        verdict = turn.record_outcome(broken, "error")
        if verdict.action is tg.Action.ASK:
            turn.resolve(verdict, pending.pop(0))
            break
        if verdict.action is tg.Action.HALT:
            return
    for call in _distinct("edit_file", 3):  # the user's go-ahead helped: the turn finishes
        _step(turn, call)


FAILING_ANSWERS: dict[Kind, tuple[str, ...]] = {
    Kind.FAILING_UNATTENDED: (),
    Kind.ASK_CONTINUE: ("continue",),
    Kind.ASK_STOP: ("stop",),
    Kind.ASK_LATE_CONTINUE: ("unanswered", "continue"),
}
"""What the user answers to each ASK of a failing-streak turn ("unanswered": shown, not waited for); a
turn nobody answers is unattended (not promptable). Other kinds are attended every other turn."""


def _explicit(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    cap = config.max_tool_calls_per_turn or 0
    n = rng.randint(10, cap) if rng.random() < 0.5 else 2 * cap
    turn.begin_cycle()
    for call in _distinct("search_kb", n):
        if _step(turn, call).action is tg.Action.HALT:
            return


def _cycle_cap(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    """Model requests of a few calls each, past the cycle cap: the request over it is halted."""
    for cycle in range(2 * config.max_cycles_per_turn):
        if turn.begin_cycle().action is tg.Action.HALT:
            return
        for call in _distinct("search_kb", rng.randint(1, 3), start=10 * cycle):
            _step(turn, call)
    raise AssertionError("a turn outran the cycle cap")


def poll_answers(rng: random.Random) -> list[str]:
    """What one status call answers, poll after poll: a new state every 1 to 3 polls (never 5 alike in
    a row, the streak's warn level), 4 to 9 states."""
    states = [f"running {10 * i}%" for i in range(rng.randint(3, 8))] + ["passed"]
    return [state for state in states for _ in range(rng.randint(1, 3))]


def _polling(turn: tg.Turn, rng: random.Random, config: tg.GuardConfig) -> None:
    """A status call polled while its answer changes (each change restarts its streak), then done."""
    turn.begin_cycle()
    poll = tg.ToolCall(rng.choice(POLL_TOOLS), {"run": rng.randint(1, 10**6)})
    for answer in poll_answers(rng):
        if turn.check_call(poll).action is tg.Action.HALT:
            raise AssertionError(f"a poll whose answer changes was halted: {poll}")
        turn.record_outcome(poll, "ok", result={"state": answer})
    for call in _distinct("read_file", 2):
        _step(turn, call)


_DRIVERS: dict[Kind, Driver] = {
    Kind.SHORT: _short,
    Kind.LONG: _long,
    Kind.SOFT_STUCK: _soft_stuck,
    Kind.RUNAWAY: _runaway,
    Kind.EXPLICIT: _explicit,
    Kind.CYCLE_CAP: _cycle_cap,
    Kind.POLLING: _polling,
    **{kind: functools.partial(_failing, answers=answers) for kind, answers in FAILING_ANSWERS.items()},
}
