"""The ``turnguard`` command: ``demo``, ``plugins`` (and more subcommands registered below).

Each subcommand is one ``Subcommand``: a name, a one-line help, a function that adds its
arguments to an ``argparse`` parser, and a function that runs it and returns the exit status.
To add one, write those two functions and add it to ``SUBCOMMANDS`` (see the end of this module).

Every subcommand behaves alike: no flag abbreviations, an unknown flag reported by the
subcommand's own parser, and the configuration loaded once, the same way, before it runs
(``GuardConfig.load``: ``--config`` or ``$TURNGUARD_CONFIG`` or the nearest ``turnguard.toml`` /
``pyproject.toml`` with ``[tool.turnguard]`` from the current folder up, then ``TURNGUARD_*``, and
``TURNGUARD_LOAD_PLUGINS`` checked against the installed entry points, and
``TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT``), handed over as ``args.guard_config``; a bad value ends
every command with the same message and exit status 2. So does a bad ``OTEL_*`` value
(``TelemetryConfigError``) in a command that exports (``demo``, ``result``), before its work.

Exit status: 0 done; 1 the command ran and failed (calibrate's bad input under ``--strict``, turns
the demo could not record, files ``assets`` refused to replace, an output that failed while being
written); 2 it could not start (a bad flag, configuration, input, or an output that cannot be
written, all checked before any work; an empty path, ``terminal.PathArgument``). Every failure is
said in one line on stderr, prefixed ``turnguard COMMAND:``, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from turnguard._config import ConfigError, GuardConfig
from turnguard._terminal import (
    DEFAULT_WIDTH,
    STDOUT,
    STDOUT_HELP,
    EmptyPath,
    add_path_argument,
    add_wide_argument,
    fit_table,
    output_width,
    shown,
)

DEFAULT_RECORDER_PATH = ".turnguard/turns.jsonl"


@dataclass(frozen=True, slots=True)
class Subcommand:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    title: str = ""
    """What the command is called in its usage line and messages, when not ``name`` (``calibrate
    merge``, typed as two words, is the ``calibrate-merge`` subcommand)."""

    @property
    def called(self) -> str:
        return self.title or self.name


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], out: TextIO, *, width: int = DEFAULT_WIDTH,
          wrap: Sequence[int] = (), right: Sequence[int] = (), free_last: bool = True,
          breakable: Sequence[int] = ()) -> None:
    """Print ``rows`` as an aligned plain-text table fitted to ``width`` (``terminal.fit_table``)."""
    for line in fit_table(header, [[str(c) for c in row] for row in rows], width, wrap=wrap, right=right,
                          free_last=free_last, breakable=breakable):
        out.write(line + "\n")


# -- demo -----------------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from turnguard._demo import SCENARIOS

    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"scenarios to run (default: all): {', '.join(SCENARIOS)}")
    add_path_argument(parser, "--record", default=DEFAULT_RECORDER_PATH, metavar="PATH",
                      help="append one JSON line per turn to this file, after the turns earlier runs left there "
                           f"(calibrate reads them all) (default: {DEFAULT_RECORDER_PATH}; {STDOUT_HELP})")
    parser.add_argument("--no-record", action="store_true", help="do not record the turns")
    add_wide_argument(parser)
    _config_argument(parser)


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
    except ImportError as exc:
        say(f"turnguard: OTLP export not available ({exc})")
        return None


def _shutdown_telemetry(telemetry: Any) -> None:
    """Flush and stop the providers ``_configure_telemetry`` made (a dead collector costs at most
    the exporters' timeout here, never during the turns)."""
    if telemetry is not None:
        telemetry.shutdown()


def _demo(args: argparse.Namespace) -> int:
    from turnguard._demo import SCENARIOS

    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        say(f"turnguard demo: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
        return 2
    if not args.no_record and args.record == STDOUT:  # the turns file, then copied to standard output
        with tempfile.TemporaryDirectory(prefix="turnguard-demo-") as folder:
            return _run_demo(args, os.path.join(folder, "turns.jsonl"), to_stdout=True)
    return _run_demo(args, None if args.no_record else args.record)


def _run_demo(args: argparse.Namespace, recorder_path: str | None, *, to_stdout: bool = False) -> int:
    from turnguard._demo import run_all

    if recorder_path is not None:
        problem = writable_file(recorder_path)
        if problem:
            say(f"turnguard demo: cannot write the turns file {recorder_path}: {problem}")
            return 2
    telemetry = _configure_telemetry()  # (a bad OTEL_* value: exit 2 in _run)
    try:
        base = args.guard_config.replace(recorder_path=recorder_path)
        results = run_all(args.scenarios or None, base=base)
    finally:
        _shutdown_telemetry(telemetry)
    out = sys.stdout
    lost = sum(result.unrecorded for result in results) if recorder_path is not None else 0
    if to_stdout and recorder_path is not None:
        with open(recorder_path, encoding="utf-8", errors="backslashreplace") as turns:
            out.write(turns.read())
    else:
        _demo_table(results, out, output_width(args.wide))
    if lost:
        where = "standard output" if to_stdout else recorder_path
        say(f"turnguard demo: {lost} of {len(results)} turns could not be written to {where} "
            "(the recorder's warning says why)")
        return 1
    if recorder_path is not None and not to_stdout:
        out.write(f"\nturns appended to {shown(recorder_path)}\n")
    return 0


def _demo_table(results: Sequence[Any], out: TextIO, width: int) -> None:
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
    table(rows, ("scenario", "calls", "fired", "at", "action", "why"), out, width=width, right=(1,), wrap=(2, 4))


def say(message: str) -> None:
    """A message on one line of stderr, the file names in it printable (``terminal.shown``)."""
    print(shown(message), file=sys.stderr)


def writable_file(path: str) -> str | None:
    """Why ``path`` cannot be appended to (its folders are made first), or ``None`` when it can:
    the turns file is checked before any turn runs, not found unwritable turn after turn."""
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "ab"):
            pass
    except FileExistsError:  # makedirs: a part of the folder path is a file
        return "a part of its folder path is a file"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


# -- plugins --------------------------------------------------------------------------------------


def _plugins_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_wide_argument(parser)
    _config_argument(parser)


def _plugins(args: argparse.Namespace) -> int:
    from turnguard._guard import Guard
    from turnguard._plugins import describe

    guard = Guard(args.guard_config)
    rows = describe(guard.pm)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table([(r["name"], r["source"], f"{r['status']}: {r['why']}" if "why" in r else r["status"],
            ", ".join(r["hooks"]) or "-") for r in rows], ("plugin", "source", "status", "hooks"),
          sys.stdout, width=output_width(args.wide), wrap=(1, 2))
    return 0


# -- config ---------------------------------------------------------------------------------------


CONFIG_FOUND = ("$TURNGUARD_CONFIG, else the first turnguard.toml, or pyproject.toml with [tool.turnguard], in the "
                "current folder or the nearest one above it")
"""Where a command finds its configuration without ``--config`` (``GuardConfig.load``)."""


def _config_argument(parser: argparse.ArgumentParser, *aliases: str) -> None:
    add_path_argument(parser, "--config", *aliases, metavar="TOML", dest="config",
                      help=f"a turnguard.toml or pyproject.toml (default: {CONFIG_FOUND})")


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    _config_argument(parser, "--file")
    add_wide_argument(parser)


def _config(args: argparse.Namespace) -> int:
    import dataclasses

    config, sources = args.guard_config, args.guard_config_sources
    rows = [(f.name, repr(getattr(config, f.name)), shown(sources[f.name])) for f in dataclasses.fields(config)]
    rows.append(("cap_mode", repr(config.cap_mode), "derived"))
    table(rows, ("option", "value", "from"), sys.stdout, width=output_width(args.wide), breakable=(1, 2),
          free_last=False)
    return 0


def load_config(args: argparse.Namespace) -> tuple[GuardConfig, dict[str, str]]:
    """The configuration every subcommand runs with, and where each value came from; a
    ``TURNGUARD_LOAD_PLUGINS`` naming no installed plugin is refused here too."""
    from turnguard._plugins import LOAD_PLUGINS_ENV, check_selection
    from turnguard.telemetry._setup import shutdown_timeout_from

    config, sources = GuardConfig.load_with_sources(getattr(args, "config", None))
    if config.load_entrypoints:
        check_selection(os.environ.get(LOAD_PLUGINS_ENV))
    shutdown_timeout_from(os.environ)
    return config, sources


# -- subcommands whose module loads only when they run --------------------------------------------


def _later(module: str, name: str) -> Callable[[Any], Any]:
    """``module.name``, imported when first called, not with this module: ``turnguard hook AGENT``,
    which the agent runs before every tool call, is answered in ``main`` before any parsing (it
    reads its configuration per event, and fails open) and loads no other subcommand's module."""

    def call(arg: Any) -> Any:
        return getattr(importlib.import_module(module), name)(arg)

    return call


# -- assets (turnguard._assets) --------------------------------------------------------------------


def _assets_arguments(parser: argparse.ArgumentParser) -> None:
    add_path_argument(parser, "directory", metavar="DIR", help="where to write them (created if missing; not '-': "
                      "they are several files)")
    parser.add_argument("--force", action="store_true", help="replace files that already exist")
    add_path_argument(parser, "--config", metavar="TOML", dest="config",
                      help="render the boards and rules for this turnguard.toml or pyproject.toml (its thresholds "
                           "and probe, TURNGUARD_* applied) instead of writing the shipped ones; needs the dashboards "
                           "extra")
    add_wide_argument(parser)


DASHBOARDS_EXTRA = 'pip install "turnguard[dashboards]"'


def _rendered_assets(args: argparse.Namespace) -> dict[Any, bytes] | None:
    """With ``--config``: every asset, the boards rendered for the configuration as it loaded."""
    if args.config is None:
        return None
    try:
        from turnguard._boards.build import assets_for
    except ImportError as exc:
        raise MissingExtra(f"--config renders the boards with grafana-foundation-sdk ({exc.name or exc}), "
                           f"from the dashboards extra: {DASHBOARDS_EXTRA}") from None
    return assets_for(args.guard_config)


class MissingExtra(Exception):
    """An optional dependency a command needs is not installed (the message names the extra)."""


def _assets(args: argparse.Namespace) -> int:
    from pathlib import Path

    from turnguard import _assets as assets

    if args.directory == STDOUT:
        say("turnguard assets: DIR is '-', standard output, which cannot hold the files and folders the assets "
            "are: give a directory")
        return 2
    directory = Path(args.directory)
    try:
        written = assets.write(directory, overwrite=args.force, contents=_rendered_assets(args))
    except MissingExtra as exc:
        say(f"turnguard assets: {exc}")
        return 2
    except assets.UnsafeTarget as exc:  # checked before writing anything
        say(f"turnguard assets: {exc}; nothing written")
        return 2
    except assets.WriteFailed as exc:
        undone = f"could not undo {'; '.join(exc.left)}" if exc.left else "nothing left behind"
        say(f"turnguard assets: {exc.filename or directory}: {exc.strerror} ({undone})")
        return 1
    except OSError as exc:  # files that exist (without --force), or the package's assets missing
        say(f"turnguard assets: {exc}")
        return 1
    print(f"{shown(directory)}/")
    for path in written:
        print(f"  {shown(path.relative_to(directory).as_posix())}")
    return 0


# -- the command ----------------------------------------------------------------------------------

SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in (
        Subcommand("demo", "run simulated turns through the real guard and show what fired", _demo_arguments, _demo),
        Subcommand("plugins", "list the loaded plugins: name, source, hooks", _plugins_arguments, _plugins),
        Subcommand("config", "show the configuration loaded from TOML and TURNGUARD_* variables",
                   _config_arguments, _config),
        Subcommand("calibrate", "replay recorded turns against a grid of thresholds ('calibrate merge' merges "
                   "--json results)", _later("turnguard._calibrate.cli", "add_arguments"),
                   _later("turnguard._calibrate.cli", "run")),
        Subcommand("assets", "write the Collector config and builder manifest, Grafana boards and provisioning, "
                   "Prometheus config and rules to DIR", _assets_arguments, _assets),
        Subcommand("install", "guard a coding agent: merge turnguard's hooks into its settings (claude-code, "
                   "codex, gemini)", _later("turnguard.agents.install", "install_arguments"),
                   _later("turnguard.agents.install", "run_install")),
        Subcommand("uninstall", "take turnguard's hooks out of a coding agent's settings again",
                   _later("turnguard.agents.install", "uninstall_arguments"),
                   _later("turnguard.agents.install", "run_uninstall")),
        Subcommand("result", "report whether a coding agent's last turn did its task (resolved, unresolved)",
                   _later("turnguard.agents.result", "arguments"),
                   _later("turnguard.agents.result", "run")),
        Subcommand("calibrate-merge", "merge the --json results of calibrate runs over parts of the input "
                   "(also 'calibrate merge')", _later("turnguard._calibrate.cli", "add_merge_arguments"),
                   _later("turnguard._calibrate.cli", "run_merge"), "calibrate merge"),
    )
}
"""Subcommands by name, in ``--help`` order. Add new ones here."""


def parser() -> argparse.ArgumentParser:
    from turnguard import __version__

    root = argparse.ArgumentParser(prog="turnguard", description="Bound an AI agent's turn without killing its "
                                   "productive long turns.", allow_abbrev=False)
    root.add_argument("--version", action="version", version=f"turnguard {__version__}")
    subs = root.add_subparsers(dest="command", metavar="COMMAND")
    for sub in SUBCOMMANDS.values():
        p = subs.add_parser(sub.name, help=sub.help, description=sub.help, allow_abbrev=False,
                            prog=f"turnguard {sub.called}")
        sub.arguments(p)
    return root


TWO_WORD_COMMANDS: dict[tuple[str, ...], str] = {("calibrate", "merge"): "calibrate-merge"}
"""Commands typed as two words, and the subcommand each is: argparse cannot nest ``merge`` under a
``calibrate`` that takes files as positional arguments, so the two words are read as one first."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hook"]:  # before every tool call of an agent: no parser, no configuration here
        from turnguard.agents.hook import main as hook_main

        return hook_main(argv[1:])
    root = parser()
    if tuple(argv[:2]) in TWO_WORD_COMMANDS:
        argv = [TWO_WORD_COMMANDS[tuple(argv[:2])], *argv[2:]]  # (a file named merge: ./merge)
    try:
        args, unknown = root.parse_known_args(argv)
    except EmptyPath as exc:
        say(str(exc))
        return 2
    before = argv[: argv.index(args.command)] if args.command else argv
    if any(u in before for u in unknown):
        root.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        root.print_help()
        return 2
    if unknown:  # said by the subcommand's own parser, with its usage line
        _subparser(root, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    from turnguard.telemetry._setup import TelemetryConfigError

    try:
        args.guard_config, args.guard_config_sources = load_config(args)
    except (ConfigError, TelemetryConfigError) as exc:
        say(f"turnguard {SUBCOMMANDS[args.command].called}: {exc}")
        return 2
    return _run(SUBCOMMANDS[args.command], args)


def _run(command: Subcommand, args: argparse.Namespace) -> int:
    """Run ``command``; a failure of its environment (standard output, a file) is one line, and
    so is an ``OTEL_*`` value its telemetry cannot use (exit 2: it could not start)."""
    from turnguard.telemetry._setup import TelemetryConfigError

    stdout = sys.stdout
    sys.stdout = _Output(stdout)
    try:
        status = command.run(args)
        sys.stdout.flush()
    except TelemetryConfigError as exc:
        say(f"turnguard {command.called}: {exc}")
        return 2
    except OutputFailed as failed:
        _discard_stdout(stdout)
        if not isinstance(failed.error, BrokenPipeError):  # (a reader that went away, `| head`: nothing to say)
            say(f"turnguard {command.called}: cannot write to standard output: {_why(failed.error)}")
        return 1
    except OSError as exc:  # the environment failed the command (a full disk, a file gone): one line
        where = f"{exc.filename}: " if exc.filename else ""
        say(f"turnguard {command.called}: {where}{_why(exc)}")
        return 1
    finally:
        sys.stdout = stdout
    return status


class OutputFailed(Exception):
    """Writing standard output failed (``error``): not an ``OSError``, so that a command's own
    handling of its files does not take it for one of theirs."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _Output:
    """Standard output while a command runs: a failed write or flush is an ``OutputFailed``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise OutputFailed(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise OutputFailed(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _discard_stdout(stdout: TextIO) -> None:
    """Point standard output at /dev/null, so the interpreter's last flush at exit cannot fail
    again with a traceback (Python's advice for a broken pipe)."""
    try:
        fd = stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _subparser(root: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
