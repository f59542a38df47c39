"""Generated turns, for the benchmark and the tests: a seeded mix of the shapes calibration must
tell apart, written in the corpus format.

- healthy: short turns that re-run their tests between edits (repeats, never back to back);
- long productive: past the soft caps, almost no repeats;
- stuck: a healthy start, then one failing call repeated;
- runaway: arguments varied on every call, for thousands of calls (only the backstop stops it).

Half the turns use JSON-text arguments (as tau-bench records them), half shell commands (as
SWE-agent's), so both key modes have work to do.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

SHELL_TOOLS = ("cat", "grep", "ls", "python", "sed", "find", "mvn", "git")
JSON_TOOLS = ("read_file", "search", "get_user_details", "list_dir", "edit_file", "run_tests")


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares of the turn shapes and their sizes."""

    healthy: float = 0.80
    long: float = 0.10
    stuck: float = 0.09
    runaway: float = 0.01
    long_calls: tuple[int, int] = (100, 1500)
    runaway_calls: tuple[int, int] = (500, 3000)
    stuck_run: tuple[int, int] = (5, 80)


SMALL = Mix(long_calls=(20, 120), runaway_calls=(60, 200), stuck_run=(3, 30))
"""Shorter turns of the same shapes, for tests."""


def _args(rng: random.Random, tool: str, i: int, spacing: bool) -> str:
    if tool in SHELL_TOOLS:
        return f"{tool} src/pkg{rng.randrange(50)}/module_{i}.py -n {rng.randrange(1000)}\n"
    value = {"path": f"src/pkg{rng.randrange(50)}/module_{i}.py", "offset": rng.randrange(0, 4000, 100),
             "options": {"limit": 200, "follow": bool(i & 1)}}
    # The same value written two ways: equal under the canonical key, different as bytes.
    return json.dumps(value, indent=1 if spacing else None, sort_keys=spacing)


def _tool(rng: random.Random, shell: bool) -> str:
    return rng.choice(SHELL_TOOLS if shell else JSON_TOOLS)


def turn_record(rng: random.Random, n: int, mix: Mix = Mix()) -> dict:
    """One generated turn (a corpus-format record) of a shape drawn from ``mix``."""
    shell = rng.random() < 0.5
    kind = rng.random()
    calls: list[tuple[str, str, str]] = []
    test_cmd = ("python", "python -m pytest tests/test_x.py -q\n") if shell else ("run_tests", '{"target": "all"}')
    if kind < mix.healthy:
        length = max(1, min(400, int(rng.lognormvariate(2.5, 0.9))))
        resolved: bool | None = rng.random() < 0.5
        for i in range(length):
            if i % 7 == 6:
                calls.append((*test_cmd, "error" if rng.random() < 0.5 else "ok"))
            else:
                tool = _tool(rng, shell)
                calls.append((tool, _args(rng, tool, i, False), "error" if rng.random() < 0.1 else "ok"))
    elif kind < mix.healthy + mix.long:
        resolved = rng.random() < 0.6
        for i in range(rng.randint(*mix.long_calls)):
            tool = _tool(rng, shell)
            calls.append((tool, _args(rng, tool, i, False), "error" if rng.random() < 0.1 else "ok"))
    elif kind < mix.healthy + mix.long + mix.stuck:
        resolved = rng.random() < 0.05
        for i in range(rng.randint(3, 40)):
            tool = _tool(rng, shell)
            calls.append((tool, _args(rng, tool, i, False), "ok"))
        tool = _tool(rng, shell)
        seed = rng.random()
        for _ in range(rng.randint(*mix.stuck_run)):
            # Same value; JSON text respaced now and then (one key under canonical, two as bytes),
            # outcomes mostly errors with a denial or an unknown thrown in.
            respaced = not shell and rng.random() < 0.2
            outcome = rng.choices(("error", "denied", "unknown", "ok"), (0.85, 0.05, 0.05, 0.05))[0]
            calls.append((tool, _args(random.Random(seed), tool, 9999, respaced), outcome))
    else:
        resolved = None if rng.random() < 0.5 else False
        for i in range(rng.randint(*mix.runaway_calls)):
            tool = _tool(rng, shell)
            calls.append((tool, _args(rng, tool, i, False), "ok"))
    return {
        "source": "generated",
        "id": f"gen-{n}",
        "calls": [{"tool": t, "args": a, "outcome": o} for t, a, o in calls],
        "cycles": len(calls) + rng.choice((0, 1, 1, 3)),
        "resolved": resolved,
        "ended_by": "generated",
    }


def records(count: int | None = None, *, seed: int = 7, mix: Mix = Mix(), max_calls: int | None = None
            ) -> Iterator[dict]:
    """``count`` records, or records until ``max_calls`` calls (the last one trimmed)."""
    rng = random.Random(seed)
    n = calls = 0
    while (count is None or n < count) and (max_calls is None or calls < max_calls):
        record = turn_record(rng, n, mix)
        if max_calls is not None:
            record["calls"] = record["calls"][: max_calls - calls]
            if not record["calls"]:
                break
        calls += len(record["calls"])
        n += 1
        yield record


def write_corpus(path: str, *, count: int | None = None, max_calls: int | None = None, seed: int = 7,
                 mix: Mix = Mix()) -> tuple[int, int]:
    """Write generated records as JSONL; returns (turns, calls)."""
    turns = calls = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in records(count, seed=seed, mix=mix, max_calls=max_calls):
            f.write(json.dumps(record) + "\n")
            turns += 1
            calls += len(record["calls"])
    return turns, calls
