"""The ``turnguard`` command: ``demo``, ``plugins`` (and more subcommands registered below).

Each subcommand is one ``Subcommand``: a name, a one-line help, a function that adds its
arguments to an ``argparse`` parser, and a function that runs it and returns the exit status.
To add one, write those two functions and add it to ``SUBCOMMANDS`` (see the end of this module).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from turnguard.config import ConfigError, GuardConfig

DEFAULT_RECORDER_PATH = ".turnguard/turns.jsonl"


@dataclass(frozen=True, slots=True)
class Subcommand:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], out: TextIO) -> None:
    """Print ``rows`` as an aligned plain-text table (the last column is not padded)."""
    text = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in text) for i in range(len(header))]
    for n, row in enumerate(text):
        out.write("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)) + "  " + row[-1] + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


# -- demo -----------------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from turnguard.demo import SCENARIOS

    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"scenarios to run (default: all): {', '.join(SCENARIOS)}")
    parser.add_argument("--record", default=DEFAULT_RECORDER_PATH, metavar="PATH",
                        help=f"write one JSON line per turn here (default: {DEFAULT_RECORDER_PATH})")
    parser.add_argument("--no-record", action="store_true", help="do not write the turns file")


def _configure_telemetry() -> Any:
    """OTLP export when the standard ``OTEL_EXPORTER_OTLP_*`` variables are set: SDK providers
    from ``turnguard.telemetry.configure()``, installed as this process's globals (the CLI is the
    application here), so every guard the demo makes reports through them. Returns the
    ``Telemetry`` to shut down, or ``None``; without it the OpenTelemetry plugin reports to the
    global no-op providers.
    """
    if not any(k.startswith("OTEL_EXPORTER_OTLP_") for k in os.environ):
        return None
    try:
        from turnguard.telemetry import configure

        return configure(service_name=os.environ.get("OTEL_SERVICE_NAME") or "turnguard-demo", set_global=True)
    except (ImportError, ValueError) as exc:
        print(f"turnguard: OTLP export not available ({exc})", file=sys.stderr)
        return None


def _shutdown_telemetry(telemetry: Any) -> None:
    """Flush and stop the providers ``_configure_telemetry`` made (a dead collector costs at most
    the exporters' timeout here, never during the turns)."""
    if telemetry is not None:
        telemetry.shutdown()


def _demo(args: argparse.Namespace) -> int:
    from turnguard.demo import SCENARIOS, run_all

    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        print(f"turnguard demo: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    recorder_path = None if args.no_record else args.record
    if recorder_path:
        os.makedirs(os.path.dirname(os.path.abspath(recorder_path)), exist_ok=True)
    telemetry = _configure_telemetry()
    try:
        base = GuardConfig(recorder_path=recorder_path)
        results = run_all(args.scenarios or None, base=base)
    finally:
        _shutdown_telemetry(telemetry)
    out = sys.stdout
    rows = []
    for result in results:
        name = result.scenario.name
        if not result.detections:
            rows.append((name, result.summary.tool_calls, "-", "-", f"none ({result.summary.reason})",
                         result.scenario.description))
        for d in result.detections:
            at = f"request {d.cycle}" if d.threshold == "cycle_cap" else f"call {d.call}"
            action = d.action.label + (f" -> user: {d.answer}" if d.answer is not None else "")
            if d.action.label == "allow":
                action = "allow (observed)"
            rows.append((name, result.summary.tool_calls, f"{d.threshold} ({d.level})", at, action, d.message))
    table(rows, ("scenario", "calls", "fired", "at", "action", "why"), out)
    if recorder_path:
        out.write(f"\nturns recorded in {recorder_path}\n")
    return 0


# -- plugins --------------------------------------------------------------------------------------


def _plugins_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _plugins(args: argparse.Namespace) -> int:
    from turnguard.guard import Guard
    from turnguard.plugins import describe

    try:
        guard = Guard(GuardConfig.load())
    except ConfigError as exc:
        print(f"turnguard plugins: {exc}", file=sys.stderr)
        return 2
    rows = describe(guard.pm)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table([(r["name"], r["source"], ", ".join(r["hooks"])) for r in rows], ("plugin", "source", "hooks"),
          sys.stdout)
    return 0


# -- config ---------------------------------------------------------------------------------------


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", metavar="TOML", help="a turnguard.toml or pyproject.toml (default: search .)")


def _config(args: argparse.Namespace) -> int:
    import dataclasses

    try:
        config = GuardConfig.load(args.file)
    except ConfigError as exc:
        print(f"turnguard config: {exc}", file=sys.stderr)
        return 2
    rows = [(f.name, repr(getattr(config, f.name))) for f in dataclasses.fields(config)]
    rows.append(("cap_mode", f"{config.cap_mode} (derived)"))
    table(rows, ("option", "value"), sys.stdout)
    return 0


# -- calibrate (turnguard.calibrate.cli) ------------------------------------------------------------


def _calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    from turnguard.calibrate.cli import add_arguments

    add_arguments(parser)


def _calibrate(args: argparse.Namespace) -> int:
    from turnguard.calibrate.cli import run

    return run(args)


def _calibrate_merge_arguments(parser: argparse.ArgumentParser) -> None:
    from turnguard.calibrate.cli import add_merge_arguments

    add_merge_arguments(parser)


def _calibrate_merge(args: argparse.Namespace) -> int:
    from turnguard.calibrate.cli import run_merge

    return run_merge(args)


# -- the command ----------------------------------------------------------------------------------

SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in (
        Subcommand("demo", "run simulated turns through the real guard and show what fired", _demo_arguments, _demo),
        Subcommand("plugins", "list the loaded plugins: name, source, hooks", _plugins_arguments, _plugins),
        Subcommand("config", "show the configuration loaded from TOML and TURNGUARD_* variables",
                   _config_arguments, _config),
        Subcommand("calibrate", "replay recorded turns against a grid of thresholds ('calibrate merge' merges "
                   "--json results)", _calibrate_arguments, _calibrate),
        Subcommand("calibrate-merge", "merge the --json results of calibrate runs over parts of the input",
                   _calibrate_merge_arguments, _calibrate_merge),
    )
}
"""Subcommands by name, in ``--help`` order. Add new ones here."""


def parser() -> argparse.ArgumentParser:
    from turnguard import __version__

    root = argparse.ArgumentParser(prog="turnguard", description="Bound an AI agent's turn without killing its "
                                   "productive long turns.")
    root.add_argument("--version", action="version", version=f"turnguard {__version__}")
    subs = root.add_subparsers(dest="command", metavar="COMMAND")
    for sub in SUBCOMMANDS.values():
        p = subs.add_parser(sub.name, help=sub.help, description=sub.help)
        sub.arguments(p)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    root = parser()
    args = root.parse_args(argv)
    if args.command is None:
        root.print_help()
        return 2
    return SUBCOMMANDS[args.command].run(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
