"""Benchmark: a coding agent's hook round trip, and parallel hooks' exact counts.

    .venv/bin/python benchmarks/bench_hooks.py [--quick]      (or via benchmarks/run.py hooks)

Round trip: the wall time from starting the command ``turnguard install`` writes (``python -S -P
-c LAUNCHER claude-code``, which runs ``.../turnguard/agents/client.py``, which asks the long-lived
local server) with one ``PreToolUse`` event on stdin to its exit (its answer read from stdout), over the ``PreToolUse``
events of 50-call turns (each call's ``PostToolUse`` runs too, untimed), p50 and p99. The floor,
measured in the same run and interleaved with it call by call: the same interpreter reading the
same JSON from stdin and printing ``{}``. Target: p50 at most 2x the floor. Beside it: the
server's own round trip (the event sent over its socket from a running process; target: p50 at
most 5 ms), and ``python -m turnguard hook claude-code``, the hook without a server (the
client's fallback), against the same floor (no target: what the server saves).

Parallel: 10 client processes (forked from this one: ``client.main``, the installed command
once its interpreter has started) at once on one turn with a ``PreToolUse`` each, then their
outcomes (sent to the server from this process), for many rounds, 50 rounds a turn; every round
the turn must count exactly 10 more calls (the session's lock serializes them) and every answer
must be the empty allow. Target: exact in every round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from run import format_rows
from turnguard.agents import client, install

TARGET_RATIO = 2.0
FLOOR_CODE = "import json,sys; json.load(sys.stdin); sys.stdout.write('{}\\n')"


def _event(name: str, i: int, session: str = "bench", **extra: Any) -> bytes:
    payload = {"hook_event_name": name, "session_id": session, "prompt_id": "p", "cwd": os.getcwd(),
               "transcript_path": "/dev/null", "permission_mode": "default", **extra}
    if name.startswith(("Pre", "Post")):
        payload.update(tool_name="Bash", tool_input={"command": f"echo {i}", "description": "step"},
                       tool_use_id=f"toolu_{i:04d}")
    if name == "PostToolUse":
        payload["tool_response"] = {"stdout": str(i), "stderr": "", "interrupted": False}
    return json.dumps(payload).encode()


def _run(argv: list[str], data: bytes, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, input=data, capture_output=True, env=env, check=False)
    spent = time.perf_counter() - start
    if done.returncode != 0 or not done.stdout.strip().startswith(b"{"):
        raise RuntimeError(f"{argv[-1]} answered {done.returncode}: {done.stdout[:200]!r} {done.stderr[:300]!r}")
    return spent


CLIENT = shlex.split(install.hook_command("claude-code"))
IN_PROCESS = [sys.executable, "-m", "turnguard", "hook", "claude-code"]


def round_trips(hook: list[str], events: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """``hook``'s PreToolUse round trips and the floor's, interleaved call by call (the turn's
    other events through the installed command)."""
    floor = [sys.executable, "-c", FLOOR_CODE]
    hooks: list[float] = []
    floors: list[float] = []
    i = 0
    while len(hooks) < events:
        _run(CLIENT, _event("UserPromptSubmit", 0, prompt="go"), env)
        for _ in range(50):
            i += 1
            pre = _event("PreToolUse", i)
            floors.append(_run(floor, pre, env))
            hooks.append(_run(hook, pre, env))
            _run(CLIENT, _event("PostToolUse", i), env)
        _run(CLIENT, _event("Stop", 0), env)
    return hooks[:events], floors[:events]


def server_round_trips(events: int, env: dict[str, str]) -> list[float]:
    """The server's answer time for PreToolUse events sent from this running process."""
    path = client.socket_path()
    with _environ(env):
        ask = client.ask_server
        ask(path, "claude-code", _event("UserPromptSubmit", 0, session="server", prompt="go"))
        spent = []
        for i in range(events):
            if i and i % 50 == 0:
                ask(path, "claude-code", _event("Stop", 0, session="server"))
                ask(path, "claude-code", _event("UserPromptSubmit", 0, session="server", prompt="go"))
            start = time.perf_counter()
            ask(path, "claude-code", _event("PreToolUse", i, session="server"))
            spent.append(time.perf_counter() - start)
            ask(path, "claude-code", _event("PostToolUse", i, session="server"))
        return spent


ROUNDS_PER_TURN = 50
"""Rounds of one turn: 500 distinct calls, under the backstop (10x the soft cap of 100), which
would halt a turn of all the rounds at its 1,001st call."""


def parallel_rounds(rounds: int, env: dict[str, str], width: int = 10) -> int:
    """Rounds whose count was exact (the turn's ``tool_calls`` read from the session's snapshot)
    and whose every answer was the empty allow. Each round's ``width`` ``PreToolUse`` events go to
    ``width`` client processes at once, forked from this one (``client.main``, as the installed
    command runs it once its interpreter has started: the start is the round trip's row, and
    10,000 of them took most of a run). Each call's ``PostToolUse``, and each turn's prompt and
    stop, go to the server straight from this process."""
    from turnguard.agents.store import SessionStore, state_root

    store = SessionStore(state_root(env), "claude-code")
    path = client.socket_path()
    exact = 0
    with _environ(env):
        for r in range(rounds):
            turn = f"p{r - r % ROUNDS_PER_TURN}"
            if r % ROUNDS_PER_TURN == 0:
                client.ask_server(path, "claude-code", _event("Stop", 0, session="par"))
                client.ask_server(path, "claude-code", _event("UserPromptSubmit", 0, session="par", prompt="go",
                                                              prompt_id=turn))
            ids = range(r * width, (r + 1) * width)
            started = [_forked_client(_event("PreToolUse", i, session="par", prompt_id=turn)) for i in ids]
            answers = [_answer(*child) for child in started]
            with store.locked("par") as session:
                calls = session.data["turn"]["facts"]["tool_calls"]
            exact += calls == (r % ROUNDS_PER_TURN + 1) * width and answers == [(b"{}\n", 0)] * width
            for i in ids:
                client.ask_server(path, "claude-code", _event("PostToolUse", i, session="par", prompt_id=turn))
    return exact


def _forked_client(event: bytes) -> tuple[int, int]:
    """A process running ``client.main(["claude-code"])`` with ``event`` on its stdin: its pid and
    the read end of its stdout."""
    event_r, event_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.dup2(event_r, 0)
            os.dup2(out_w, 1)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            for fd in (event_r, event_w, out_r, out_w, null):
                os.close(fd)
            code = client.main(["claude-code"])
            sys.stdout.flush()
        finally:
            os._exit(code)
    os.close(event_r)
    os.close(out_w)
    with open(event_w, "wb") as f:
        f.write(event)
    return pid, out_r


def _answer(pid: int, out: int) -> tuple[bytes, int]:
    with open(out, "rb") as f:
        stdout = f.read()
    return stdout, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` as this process's environment (what ``client.ask_server`` sends the server)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(quick: bool = False) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "TURNGUARD_STATE_DIR": state, "TURNGUARD_RECORDER_PATH": os.path.join(state, "t.jsonl")}
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        events = 50 if quick else 200
        _run(CLIENT, _event("UserPromptSubmit", 0, session="warm", prompt="go"), env)  # starts the server
        time.sleep(1.0)
        hooks, floors = round_trips(CLIENT, events, env)
        served = server_round_trips(events, env)
        alone, alone_floors = round_trips(IN_PROCESS, 50 if quick else 100, env)
        rounds = 20 if quick else 1000
        exact = parallel_rounds(rounds, env)
    p50, floor50 = statistics.median(hooks), statistics.median(floors)
    ratio = p50 / floor50
    alone50, alone_floor50 = statistics.median(alone), statistics.median(alone_floors)
    served50 = statistics.median(served)
    return [
        {"benchmark": "hooks", "case": f"PreToolUse round trip p50 ({len(hooks)} events, 50-call turns)",
         "value": p50 * 1000, "unit": "ms", "floor": floor50 * 1000, "ratio": ratio,
         "target": f"<= {TARGET_RATIO:g}x floor", "met": ratio <= TARGET_RATIO,
         "note": f"p99 {_percentile(hooks, 0.99) * 1000:.1f} ms (floor p99 {_percentile(floors, 0.99) * 1000:.1f} ms)"},
        {"benchmark": "hooks", "case": "the server's round trip p50 (socket, from a running process)",
         "value": served50 * 1000, "unit": "ms", "target": "<= 5 ms", "met": served50 <= 0.005,
         "note": f"server p99 {_percentile(served, 0.99) * 1000:.1f} ms"},
        {"benchmark": "hooks", "case": "python -m turnguard hook (no server) round trip p50",
         "value": alone50 * 1000, "unit": "ms", "floor": alone_floor50 * 1000, "ratio": alone50 / alone_floor50},
        {"benchmark": "hooks", "case": f"10 parallel PreToolUse processes, exact counts ({rounds} rounds)",
         "value": exact, "unit": "rounds", "target": f"{rounds} of {rounds}", "met": exact == rounds},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = run(args.quick)
    print(format_rows(rows))
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
