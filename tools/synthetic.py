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


# -- the same turns as the Collector's file exporter writes turnguard's spans ----------------------

RESOURCE = {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}},
                           {"key": "service.instance.id", "value": {"stringValue": "3f2a6b9e-5c1d-4e8f-9a7b"}},
                           {"key": "telemetry.sdk.language", "value": {"stringValue": "python"}},
                           {"key": "telemetry.sdk.name", "value": {"stringValue": "opentelemetry"}},
                           {"key": "telemetry.sdk.version", "value": {"stringValue": "1.44.0"}}]}
SCOPE = {"name": "turnguard", "version": "0.9.0"}


def _attr(key: str, value: object) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _digest(tool: str, args: str) -> str:
    import hashlib

    return hashlib.blake2b(f"{tool}\0{args}".encode(), digest_size=8).hexdigest()


def turn_spans(record: dict, rng: random.Random, clock: list[int]) -> list[dict]:
    """A record's spans as turnguard's OpenTelemetry plugin makes them: an ``execute_tool`` span per
    call (ended before its turn's), then the ``invoke_agent`` turn span."""
    trace, root = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
    start = clock[0]
    spans, seen, streak, failing, last = [], {}, 0, 0, None
    for i, call in enumerate(record["calls"], 1):
        digest = _digest(call["tool"], call["args"])
        seen[digest] = seen.get(digest, 0) + 1
        streak = streak + 1 if digest == last else 1
        last = digest
        attrs = [_attr("turnguard.call.index", i), _attr("turnguard.call.key_digest", digest)]
        if seen[digest] > 1:  # the plugin leaves a count out at its default (1), in this order
            attrs.append(_attr("turnguard.call.repeat", seen[digest]))
        if streak > 1:
            attrs.append(_attr("turnguard.streak.length", streak))
        attrs += [_attr("gen_ai.tool.name", call["tool"]), _attr("gen_ai.operation.name", "execute_tool"),
                  _attr("turnguard.call.outcome", call["outcome"])]
        failing = failing + 1 if call["outcome"] == "error" and streak > 1 else int(call["outcome"] == "error")
        if call["outcome"] == "error":  # a failed call: its failing streak and error type follow
            attrs += [_attr("turnguard.streak.failing_length", failing), _attr("error.type", "_OTHER")]
        clock[0] += 1_000_000
        spans.append({"traceId": trace, "spanId": f"{rng.getrandbits(64):016x}", "parentSpanId": root, "flags": 256,
                      "name": f"execute_tool {call['tool']}", "kind": 1, "startTimeUnixNano": str(clock[0]),
                      "endTimeUnixNano": str(clock[0] + 500_000), "attributes": attrs, "status": {}})
    n = len(record["calls"])
    turn = [_attr("gen_ai.operation.name", "invoke_agent"), _attr("gen_ai.agent.name", "coder"),
            _attr("turnguard.turn.id", record["id"]), _attr("turnguard.turn.cohort", "live"),
            _attr("turnguard.turn.promptable", False), _attr("turnguard.cap.mode", "adaptive"),
            _attr("turnguard.policy", "default"), _attr("turnguard.loop.soft_cap", 100),
            _attr("turnguard.loop.hard_cap", 1000), _attr("turnguard.loop.stuck_repeat_threshold", 6),
            _attr("turnguard.loop.stuck_signal", "repeat"), _attr("turnguard.streak.warn_at", 5),
            _attr("turnguard.streak.stop_at", 8), _attr("turnguard.streak.stop_on", "error"),
            _attr("turnguard.loop.max_cycles", 0), _attr("turnguard.turn.outcome", "completed"),
            _attr("turnguard.turn.tool_calls", n), _attr("turnguard.turn.cycles", record["cycles"]),
            _attr("turnguard.turn.max_key_repeat", max(seen.values(), default=0)),
            _attr("turnguard.turn.stuck", False), _attr("turnguard.turn.detections", 0),
            _attr("turnguard.loop.threshold", "none"),
            _attr("turnguard.turn.resolved", {True: "true", False: "false", None: "unknown"}[record["resolved"]])]
    clock[0] += 1_000_000
    spans.append({"traceId": trace, "spanId": root, "flags": 256, "name": "invoke_agent coder", "kind": 1,
                  "startTimeUnixNano": str(start), "endTimeUnixNano": str(clock[0]), "attributes": turn, "status": {}})
    return spans


def write_otlp(folder: str, *, max_calls: int, seed: int = 7, mix: Mix = Mix(), batch: int = 512,
               file_bytes: int = 100 * 1024 * 1024) -> tuple[int, int, list[str]]:
    """Write generated turns as the Collector's file exporter writes their spans (one OTLP JSON
    document of ``batch`` spans per line, as the SDK's batch processor exports them), rotated as
    the exporter rotates (backups ``otlp-<time>.jsonl`` of ``file_bytes``, the live ``otlp.jsonl``
    last). Returns (turns, calls, files written, oldest first)."""
    import os

    rng = random.Random(seed + 1)
    clock = [1_764_633_600_000_000_000]
    pending: list[dict] = []
    files: list[str] = []
    out = None
    turns = calls = 0

    def flush() -> None:
        nonlocal out
        if out is None or out.tell() >= file_bytes:
            if out is not None:
                out.close()
            name = f"otlp-2026-12-01T{len(files) // 60:02d}-{len(files) % 60:02d}-00.000.jsonl"
            files.append(os.path.join(folder, name))
            out = open(files[-1], "w", encoding="utf-8")  # noqa: SIM115 - closed here or at the end
        line = {"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"scope": SCOPE, "spans": pending[:batch]}],
                                   "schemaUrl": "https://opentelemetry.io/schemas/1.28.0"}]}
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        del pending[:batch]

    for record in records(seed=seed, mix=mix, max_calls=max_calls):
        pending.extend(turn_spans(record, rng, clock))
        turns += 1
        calls += len(record["calls"])
        while len(pending) >= batch:
            flush()
    while pending:
        flush()
    assert out is not None
    out.close()
    live = os.path.join(folder, "otlp.jsonl")
    os.replace(files[-1], live)
    files[-1] = live
    return turns, calls, files
