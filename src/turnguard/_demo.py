"""Simulated agent turns, run through the real guard: the ``turnguard demo`` scenarios.

A scenario is a script of model requests and tool calls (with their outcomes) that a host would
drive, a configuration, whether a person is watching, and what that person answers when asked.
``run_scenario`` drives one through a real ``Guard`` exactly as a host would: ``begin_cycle``
before each request, ``check_call`` before each call (a HALT ends the turn; the call is not
executed), ``record_outcome`` after it, ``resolve`` for every ASK.

The step generators are public so that other tools (tests, a host's own simulations) can build
turns of any length from them.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnguard._config import GuardConfig
from turnguard._guard import Guard, Turn
from turnguard._model import Action, Answer, Outcome, ToolCall, TurnSummary, Verdict


class StepKind(enum.Enum):
    CYCLE = "cycle"
    """A model request (``begin_cycle``)."""
    CALL = "call"
    """A tool call (``check_call``, then ``record_outcome`` unless it was halted)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One thing a simulated host does."""

    kind: StepKind
    tool: str = ""
    args: Any = None
    outcome: Outcome = Outcome.OK


CYCLE = Step(StepKind.CYCLE)


def call(tool: str, args: Any, outcome: Outcome = Outcome.OK) -> Step:
    return Step(StepKind.CALL, tool, args, outcome)


# -- step generators -----------------------------------------------------------------------------

_FILES = ("src/app.py", "src/cli.py", "src/_model.py", "src/store.py", "tests/test_app.py", "README.md")


def productive_calls(n: int, *, seed: int = 0, per_cycle: int = 4) -> Iterator[Step]:
    """A productive turn of ``n`` calls: reads, edits, searches and test runs, all different
    except that some calls are made exactly twice (the seed's productive turns repeat at most 2)."""
    rng = random.Random(seed)
    made: list[Step] = []
    for i in range(n):
        if i % per_cycle == 0:
            yield CYCLE
        if made and i % 7 == 6 and rng.random() < 0.7:
            step = made.pop(rng.randrange(len(made)))  # its second (and last) time
        else:
            step = _productive_call(i, rng)
            made.append(step)
        yield step


def _productive_call(i: int, rng: random.Random) -> Step:
    path = f"{rng.choice(_FILES)[:-3]}_{i}{rng.choice(_FILES)[-3:]}"
    kind = i % 4
    if kind == 0:
        return call("read_file", {"path": path, "offset": 0, "limit": 200})
    if kind == 1:
        return call("edit_file", {"path": path, "old": f"line {i}", "new": f"line {i} fixed"})
    if kind == 2:
        return call("grep", {"pattern": f"def handler_{i}", "path": "src"})
    return call("bash", f"pytest -q tests/test_{i}.py", rng.choice((Outcome.OK, Outcome.OK, Outcome.ERROR)))


def soft_stuck_calls(n: int, *, repeat: Step | None = None, times: int = 6, last_at: int | None = None,
                     seed: int = 0) -> Iterator[Step]:
    """``n`` distinct calls among which one call is repeated ``times`` times, never twice in a row;
    its last repeat is call ``last_at`` (default: spread over the first 60 calls)."""
    repeat = repeat or call("bash", "npm run build", Outcome.ERROR)
    last_at = last_at or min(n, 60)
    gap = max(2, last_at // times)
    at = {last_at - k * gap for k in range(times)}
    if min(at) < 1:
        raise ValueError(f"cannot place {times} repeats before call {last_at}")
    for i, step in enumerate(_distinct_calls(n, seed=seed), start=1):
        if i % 5 == 1:
            yield CYCLE
        yield repeat if i in at else step


def _distinct_calls(n: int, *, seed: int = 0) -> Iterator[Step]:
    rng = random.Random(seed)
    for i in range(n):
        yield _productive_call(i, rng)


def runaway_calls(n: int, *, per_cycle: int = 10) -> Iterator[Step]:
    """A runaway that changes its arguments on every call (no repetition signal catches it)."""
    for i in range(n):
        if i % per_cycle == 0:
            yield CYCLE
        yield call("web_search", {"query": f"how to fix the build, attempt {i}"}, Outcome.ERROR)


def failing_streak_calls(length: int, *, lead: int = 3, tool: str = "bash",
                         args: Any = "mvn -q test -Dtest=AppTest") -> Iterator[Step]:
    """A few distinct calls, then the same failing call ``length`` times in a row."""
    yield CYCLE
    yield from _distinct_calls(lead, seed=1)
    for _ in range(length):
        yield CYCLE
        yield call(tool, args, Outcome.ERROR)


def cycle_calls(cycles: int, *, calls_per_cycle: int = 1) -> Iterator[Step]:
    """A turn of many short model requests (one call each), as a chatty agent makes."""
    rng = random.Random(7)
    for i in range(cycles):
        yield CYCLE
        for _ in range(calls_per_cycle):
            yield _productive_call(i, rng)


# -- scenarios -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    """A simulated turn: its steps, its configuration, and the simulated user's answers."""

    name: str
    description: str
    steps: Callable[[], Iterable[Step]]
    config: Mapping[str, Any] = field(default_factory=dict)
    promptable: bool = False
    answers: tuple[Answer, ...] = ()
    """The user's answers to successive ASKs (attended turns); ``stop`` once they run out."""


@dataclass(frozen=True, slots=True)
class Detection:
    """One row of the demo table: a detector fired at a call (or a model request)."""

    call: int
    cycle: int
    threshold: str
    level: str
    action: Action
    message: str
    answer: Answer | None = None


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    scenario: Scenario
    detections: tuple[Detection, ...]
    summary: TurnSummary
    executed_calls: int
    """Calls the host executed (a halted call is not executed)."""
    unrecorded: int = 0
    """Lines the guard's recorder could not write (``GuardConfig.recorder_path``; 0 without one)."""


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("productive-long", "400 varied calls, none repeated more than twice (default cap)",
                 lambda: productive_calls(400)),
        Scenario("explicit-cap", "the same 400-call turn with max_tool_calls_per_turn=100",
                 lambda: productive_calls(400), {"max_tool_calls_per_turn": 100}),
        Scenario("soft-stuck", "one failing build repeated 6 times among 300 distinct calls",
                 lambda: soft_stuck_calls(300)),
        Scenario("runaway", "every call different, forever (the hard backstop at 10x the soft cap)",
                 lambda: runaway_calls(2000)),
        Scenario("failing-streak-unattended", "the same failing test run 12 times in a row, nobody watching",
                 lambda: failing_streak_calls(12)),
        Scenario("failing-streak-attended", "the same failing test run 12 times in a row, a user watching",
                 lambda: failing_streak_calls(12), promptable=True,
                 answers=(Answer.CONTINUE, Answer.STOP)),
        Scenario("cycle-capped", "60 model requests with max_cycles_per_turn=50",
                 lambda: cycle_calls(60), {"max_cycles_per_turn": 50}),
    )
}
"""The built-in demo scenarios, in the order ``turnguard demo`` runs them."""


def run_scenario(
    scenario: Scenario,
    *,
    guard: Guard | None = None,
    base: GuardConfig | None = None,
    conversation_id: str | None = None,
    agent_name: str = "demo-agent",
) -> ScenarioResult:
    """Drive ``scenario`` through a real guard, as a host would, and collect what fired."""
    if guard is None:
        config = (base or GuardConfig()).replace(**dict(scenario.config))
        guard = Guard(config)
    answers = list(scenario.answers)
    detections: list[Detection] = []
    executed = 0
    with guard.turn(
        conversation_id=conversation_id or f"demo-{scenario.name}",
        agent_name=agent_name,
        promptable=scenario.promptable,
    ) as turn:
        for step in scenario.steps():
            if step.kind is StepKind.CYCLE:
                if _note(turn, turn.begin_cycle(), detections, answers):
                    break
                continue
            tool_call = ToolCall(step.tool, step.args)
            if _note(turn, turn.check_call(tool_call), detections, answers):
                break
            executed += 1
            if _note(turn, turn.record_outcome(tool_call, step.outcome), detections, answers):
                break
    assert turn.summary is not None
    recorder = guard.pm.get_plugin("recorder")
    unrecorded = recorder.pending + recorder.lines_lost if recorder is not None else 0
    return ScenarioResult(scenario, tuple(detections), turn.summary, executed, unrecorded)


def _note(turn: Turn, verdict: Verdict, detections: list[Detection], answers: list[Answer]) -> bool:
    """Record a detection (and the simulated user's answer to an ASK); True when the turn must end."""
    event = verdict.event
    if event is None:
        return verdict.action is Action.HALT
    answer = None
    if verdict.action is Action.ASK:
        answer = answers.pop(0) if answers else Answer.STOP
        verdict = turn.resolve(event, answer)
    detections.append(
        Detection(event.tool_calls, event.cycles, str(event.threshold), str(event.level), event.action,
                  event.message, answer)
    )
    return verdict.action is Action.HALT


def run_all(names: Sequence[str] | None = None, *, base: GuardConfig | None = None) -> list[ScenarioResult]:
    """Run the named scenarios (default: all) with ``base`` under each scenario's own settings."""
    chosen = list(SCENARIOS) if not names else list(names)
    unknown = [n for n in chosen if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    return [run_scenario(SCENARIOS[n], base=base) for n in chosen]
