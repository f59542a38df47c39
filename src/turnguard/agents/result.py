"""``turnguard result AGENT resolved|unresolved [--session ID]``: how a coding agent's task went.

A hook turn's result token is kept when its turn is exported (``export.keep_token``: each
session's last ended turn). This command reports it as any late result is reported
(``Guard.report_result``): the ``turnguard.turn.results`` metric and the ``turnguard.turn.result``
event, with the turn's labels (``gen_ai.agent.name`` the agent), exported over OTLP where an
``OTEL_EXPORTER_OTLP_*ENDPOINT`` (or ``TURNGUARD_OTEL_*``) variable is set. A person, a test run
or CI can say so after the agent stopped: ``turnguard result claude-code resolved``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from turnguard.agents.export import RESULTS, results_config, telemetry_from_env
from turnguard.agents.store import session_file_name, state_root

AGENTS = ("claude-code", "codex", "gemini")
ANSWERS = {"resolved": True, "unresolved": False}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent", choices=AGENTS, metavar="AGENT", help=f"the agent: {', '.join(AGENTS)}")
    parser.add_argument("outcome", choices=tuple(ANSWERS), metavar="OUTCOME",
                        help="resolved (the task succeeded) or unresolved")
    parser.add_argument("--session", metavar="ID", help="the session (default: the last turn any session ended)")
    from turnguard._terminal import add_path_argument, add_wide_argument

    add_wide_argument(parser)  # (one line: as wide as it is either way)
    add_path_argument(parser, "--state-dir", metavar="DIR", help="the hooks' state directory (default: "
                      "$TURNGUARD_STATE_DIR, else $XDG_STATE_HOME/turnguard, else ~/.local/state/turnguard)")


def token_file(root: Path, agent: str, session: str | None) -> Path | None:
    """The kept token of ``session``'s last turn, or of the last turn of the agent's sessions."""
    folder = root / "hooks" / RESULTS / agent
    if session is not None:
        path = folder / f"{session_file_name(session)}.json"
        return path if path.is_file() else None
    kept = [p for p in folder.glob("*.json") if p.is_file()] if folder.is_dir() else []
    return max(kept, key=lambda p: p.stat().st_mtime_ns, default=None)


def run(args: argparse.Namespace) -> int:
    from turnguard._guard import Guard

    root = Path(args.state_dir) if args.state_dir is not None else state_root()
    path = token_file(root, args.agent, args.session)
    which = f"session {args.session}" if args.session else "any session"
    if path is None:
        print(f"turnguard result: no ended {args.agent} turn of {which} under {root / 'hooks' / RESULTS}",
              file=sys.stderr)
        return 1
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        token = kept["token"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        print(f"turnguard result: cannot read {path}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return 1
    if kept.get("reported") is not None:
        print(f"turnguard result: the last {args.agent} turn of {which} was reported {kept['reported']} "
              "already: each turn takes one result", file=sys.stderr)
        return 1
    try:
        telemetry = telemetry_from_env(os.environ)  # (a bad OTEL_* value: exit 2, said by the command)
    except ModuleNotFoundError as exc:  # an OTLP endpoint is set, the SDK is not installed: nowhere to report
        print(f"turnguard result: {exc}", file=sys.stderr)
        return 2
    try:
        guard = Guard(results_config(args.guard_config, root))
        taken = guard.report_result(token, ANSWERS[args.outcome])
        counts = {status.value: n for status, n in guard.results.counts.items() if n}
    finally:
        if telemetry is not None:
            telemetry.shutdown()
    if not taken:
        print(f"turnguard result: not taken ({', '.join(counts) or 'ignored'}): each turn takes one result",
              file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        path.write_text(json.dumps({**kept, "reported": args.outcome}), encoding="utf-8")
    print(f"{args.agent}: {args.outcome}")
    return 0
