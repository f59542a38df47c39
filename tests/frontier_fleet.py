"""Two planted fleets for the recommended values: one where the live thresholds are right, one where
every one of them is too low, each run through a real guard whose probe takes every turn.

The live configuration is the seed's at S = 20 (10x, D = 6, streak stop 8); the probe's is lenient
on every threshold (40x, D = 40 under the ``repeat`` signal, streak stop 30), so that it lets the
productive turns finish and halts the never-resolving ones at a limit of its own. Every turn's
planted *reach* per threshold (the largest value that halts it, with no limit at all) and whether
its task gets done are known by construction, so the truth's smallest safe value is computed from
them (``truth_safe``), and what the probe could see from the turns as the probe ran them
(``seen``).

- ``KEEP``: long turns need 8x to 9.5x S, edit-and-rerun turns repeat their test 4 to 5 times past
  S, retries succeed after 5 to 7 identical failures: 10x, D = 6 and 8 are right.
- ``RAISE``: long turns need 11x to 22x S, edit-and-rerun turns repeat their test 8 to 12 times,
  retries succeed after 9 to 12 failures: each live threshold halts turns that would succeed.

Both have runaways (distinct calls forever), turns stuck alternating two calls and calls that fail
forever: 40 of each, enough for the exact bound with none productive, ``1 - 0.025^(1/40)`` = 8.8%,
to be under a tolerance of 10%.

Two variants probe the soft cap and the cycle cap, which the main runs do not (they say "not
probed"): ``SOFT_PROBE`` raises the probe's soft cap to 3 S (10x and D = 6 held, the soft cap's
values in steps of ``SOFT_STEP`` calls), ``EXPLICIT_LIVE`` and ``EXPLICIT_PROBE`` put the live cap
at 10 S explicitly and the probe's at 40 S, and ``cycled`` runs each turn as model requests of
``PER_REQUEST`` calls under a live cycle cap (``CYCLE_LIVE``, right for ``KEEP``) and a probe's
of ``CYCLE_PROBE`` requests.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from pathlib import Path

import turnguard as tg

S = 20
LIVE = {"soft_cap": S, "hard_multiplier": 10, "stuck_repeat_threshold": 6, "streak_warn_at": 5, "streak_stop_at": 8}
PROBE = {"rate": 1.0, "hard_multiplier": 40, "stuck_repeat_threshold": 40, "streak_stop_at": 30}
FOREVER = 10**6
"""The reach of a turn that never stops on its own."""
SOFT_PROBE = {**PROBE, "soft_cap": 3 * S}
SOFT_STEP = S // 10
"""The soft cap ladder's unit (``ladder.value_step``)."""
EXPLICIT = 10 * S
"""The live explicit cap right for ``KEEP`` (its longest productive turn makes 190 calls)."""
EXPLICIT_STEP = EXPLICIT // 10
EXPLICIT_LIVE = {k: v for k, v in LIVE.items() if k != "soft_cap"} | {"max_tool_calls_per_turn": EXPLICIT}
EXPLICIT_PROBE = {"rate": 1.0, "max_tool_calls_per_turn": 4 * EXPLICIT, "streak_stop_at": 30}
PER_REQUEST = 5
CYCLE_LIVE = 38
"""The live cycle cap right for ``KEEP``: its longest productive turn, 190 calls, makes 38 requests."""
CYCLE_PROBE = 100
UNITS = {"soft": SOFT_STEP, "explicit": EXPLICIT_STEP}
"""The step between a threshold's values where it is not 1."""


def cycled(per_request: int = PER_REQUEST) -> tuple[dict, dict, int]:
    """The live and probe configurations with a cycle cap, and the calls per model request."""
    return {**LIVE, "max_cycles_per_turn": CYCLE_LIVE}, {**PROBE, "max_cycles_per_turn": CYCLE_PROBE}, per_request


class Work(enum.Enum):
    SHORT = "short"
    LONG = "long"
    EDIT_RERUN = "edit_rerun"
    RETRY = "retry"
    RUNAWAY = "runaway"
    STUCK = "stuck"
    FAILING = "failing"

    @property
    def productive(self) -> bool:
        return self not in (Work.RUNAWAY, Work.STUCK, Work.FAILING)


@dataclass(frozen=True)
class Design:
    """How much each productive kind needs (inclusive ranges)."""

    name: str
    long_calls: tuple[int, int]
    repeats: tuple[int, int]
    failures: tuple[int, int]
    right: bool
    """Whether the live thresholds are right for it."""


KEEP = Design("keep", (8 * S + 1, 9 * S + S // 2), (4, 5), (5, 7), right=True)
RAISE = Design("raise", (11 * S + 1, 22 * S), (8, 12), (9, 12), right=False)
MIX = {Work.SHORT: 60, Work.LONG: 40, Work.EDIT_RERUN: 20, Work.RETRY: 20, Work.RUNAWAY: 40, Work.STUCK: 40,
       Work.FAILING: 40}

Step = tuple[tg.ToolCall, tg.Outcome]


@dataclass(frozen=True)
class Planted:
    """One turn: its kind, its planted reach per threshold, and how the probe ran it."""

    work: Work
    reach: dict[str, int]
    """By threshold (``backstop``, ``stuck``, ``streak``, ``soft`` in calls, ``cycles``): the largest
    value that halts it with no limit."""
    calls: int
    """Calls the probe let it make."""
    seen: dict[str, int]
    """By threshold: the largest value that would halt it within the calls the probe let it make."""
    done: bool
    censored: bool
    """The probe halted it at a length limit (its backstop)."""


def _steps(work: Work, design: Design, rng: random.Random, tag: int) -> list[Step]:
    ok, error = tg.Outcome.OK, tg.Outcome.ERROR

    def distinct(n: int, tool: str = "read_file") -> list[Step]:
        return [(tg.ToolCall(tool, {"path": f"t{tag}/f{i}"}), ok) for i in range(n)]

    if work is Work.SHORT:
        return distinct(rng.randint(5, S - 2))
    if work is Work.LONG:
        return distinct(rng.randint(*design.long_calls))
    if work is Work.EDIT_RERUN:
        steps = distinct(S)
        for i in range(rng.randint(*design.repeats)):
            steps += [(tg.ToolCall("edit_file", {"patch": f"t{tag}-{i}"}), ok),
                      (tg.ToolCall("run_tests", {"cmd": "pytest"}), error)]
        return steps
    if work is Work.RETRY:
        flaky = tg.ToolCall("deploy", {"service": f"s{tag}"})
        return distinct(1) + [(flaky, error)] * rng.randint(*design.failures) + [(flaky, ok)]
    if work is Work.RUNAWAY:
        return distinct(60 * S, "http_get")
    if work is Work.STUCK:
        loop = [(tg.ToolCall("grep", {"q": "a"}), ok), (tg.ToolCall("grep", {"q": "b"}), ok)]
        return distinct(S) + loop * 60
    return [(tg.ToolCall("mvn", {"goal": f"t{tag}"}), error)] * 60


def _reach(work: Work, steps: list[Step], calls: int, requests: int = 1) -> dict[str, int]:
    """The largest value of each threshold that halts the first ``calls`` steps, made in
    ``requests`` model requests (repeat counts and failing streaks as the ledger counts them, each
    threshold alone; the soft cap with 10x and D = 6 held: a soft cap s halts a turn of more than
    10 s calls, or one whose most repeated call reaches 6 once past s, in steps of ``SOFT_STEP``)."""
    seen: dict[tuple[str, str], int] = {}
    most = failing = longest = 0
    stuck_at = None
    last = None
    for i, (call, outcome) in enumerate(steps[:calls], 1):
        key = (call.name, repr(sorted(call.args.items())))
        seen[key] = seen.get(key, 0) + 1
        most = max(most, seen[key])
        if most >= LIVE["stuck_repeat_threshold"] and stuck_at is None:
            stuck_at = i
        failing = (failing if key == last else 0) + 1 if outcome is tg.Outcome.ERROR else 0
        longest = max(longest, failing)
        last = key
    soft = calls - 1 if stuck_at is not None else (calls - 1) // LIVE["hard_multiplier"]
    return {"backstop": (calls - 1) // S, "stuck": most if calls > S else 0, "streak": longest,
            "soft": soft // SOFT_STEP * SOFT_STEP, "cycles": requests - 1,
            "explicit": (calls - 1) // EXPLICIT_STEP * EXPLICIT_STEP}


def run(path: Path, design: Design, seed: int = 5, live: dict | None = None, probe: dict | None = None,
        per_request: int | None = None) -> list[Planted]:
    """Run the design's mix through a guard whose probe takes every turn, recording ``path``;
    ``per_request``: each model request makes that many calls (``None``: one request)."""
    rng = random.Random(seed)
    work = [w for w, n in MIX.items() for _ in range(n)]
    rng.shuffle(work)
    config = tg.GuardConfig(name="prod", probe=dict(probe or PROBE), recorder_path=str(path), load_entrypoints=False,
                            disable_plugins=("otel", "shadow"), **(live or LIVE))
    guard = tg.Guard(config, environ={})
    out = []
    for i, kind in enumerate(work):
        steps = _steps(kind, design, rng, i)
        turn = guard.turn(turn_id=f"{design.name}-{i}", agent_name="coder")
        made = requests = 0
        for call, outcome in steps:
            if per_request and made % per_request == 0:
                requests += 1
                if turn.begin_cycle().halted:
                    break
            if turn.check_call(call).halted:
                break
            made += 1
            if turn.record_outcome(call, outcome).halted:
                break
        done = kind.productive and made == len(steps)
        turn.report_result(done)
        summary = turn.end()
        forever = {} if kind.productive else {"backstop": FOREVER, "stuck": FOREVER if kind is not Work.RUNAWAY else 1,
                                              "streak": FOREVER if kind is Work.FAILING else 0, "soft": FOREVER,
                                              "cycles": FOREVER, "explicit": FOREVER}
        reach = {**_reach(kind, steps, len(steps), -(-len(steps) // (per_request or len(steps)))), **forever}
        censored = str(summary.threshold) in ("hard_backstop", "cycle_cap", "explicit")
        out.append(Planted(kind, reach, made, _reach(kind, steps, made, requests or 1), done, censored))
    return out


def truth_safe(turns: list[Planted], threshold: str, tolerance: float) -> int | None:
    """The truth's smallest safe value (above 1): the share of the turns it halts that would have
    succeeded, every turn run with no limit, is below ``tolerance``."""
    unit = UNITS.get(threshold, 1)
    for v in range(2 * unit, 1000 * unit, unit):
        halted = [t for t in turns if t.reach[threshold] >= v]
        if not halted:
            return None
        if sum(t.work.productive for t in halted) / len(halted) < tolerance:
            return v
    return None


def smallest_within(turns: list[Planted], threshold: str, tolerance: float) -> int | None:
    """The smallest value (above 1) whose 95% upper bound, from the turns as the probe ran them
    (a turn the probe halted at its backstop counts as not done), is below ``tolerance``: the exact
    binomial bound with none done, else Wilson's."""
    z = 1.959963984540054
    unit = UNITS.get(threshold, 1)
    for v in range(2 * unit, 257 * unit, unit):
        halted = [t for t in turns if t.seen[threshold] >= v]
        n, x = len(halted), sum(t.done for t in halted)
        if not n:
            return None
        if x == 0:
            high = 1 - 0.025 ** (1 / n)
        else:
            p = x / n
            high = min(1.0, (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)))
                       / (1 + z * z / n)) if x < n else 1.0
        if high < tolerance:
            return v
    return None


def config_file(folder: Path, live: dict | None = None, probe: dict | None = None) -> Path:
    """The fleet's configuration as ``calibrate --config`` reads it (the default row is the live one)."""
    path = folder / "turnguard.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in (live or LIVE).items())
                    + "[probe]\n" + "".join(f"{k} = {v!r}\n" for k, v in (probe or PROBE).items()))
    return path
