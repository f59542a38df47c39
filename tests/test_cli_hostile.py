"""Every ``turnguard`` subcommand against hostile inputs, run as a user runs it (``python -m
turnguard`` in a fresh process): unusable configuration files, bad settings, broken and missing
plugins, paths that cannot be written or read, an output that fails. Each run must end with the
documented exit status and say what went wrong in one line prefixed ``turnguard COMMAND:``,
never in a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from config_pipes import PIPE_KINDS, SAYS_WHEN_NOT_READ, given_pipe
from conftest import kept_result_token
from turnguard import _cli as cli
from turnguard._terminal import PathArgument

SRC = Path(__file__).resolve().parent.parent / "src"

COMMANDS: dict[str, list[str]] = {
    "demo": ["demo", "soft-stuck", "--no-record"],
    "plugins": ["plugins"],
    "config": ["config"],
    "calibrate": ["calibrate", "{corpus}", "--jobs", "1", "--progress", "never"],
    "calibrate-merge": ["calibrate-merge", "{result}"],
    "assets": ["assets", "{fresh}/deploy"],
    "install": ["install", "claude-code", "--dry-run"],
    "uninstall": ["uninstall", "claude-code", "--dry-run"],
    "result": ["result", "claude-code", "resolved", "--state-dir", "{state}"],
}
"""How each subcommand runs when nothing is wrong (``{corpus}``: a recorded turn, ``{result}``: a
``calibrate --json`` result, ``{fresh}``: an empty folder)."""


@dataclass(frozen=True)
class Done:
    status: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.splitlines()


@dataclass(frozen=True)
class Case:
    """A hostile input: extra environment, files to put in the working folder, and the outcome."""

    env: dict[str, str]
    files: dict[str, bytes | str | None]  # None: a folder; a str: a symbolic link to that path
    status: int
    says: str = ""
    """Text the command's one line holds (lower case compared)."""
    stdout_to: str | None = None


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("inputs")
    corpus = root / "turns.jsonl"
    corpus.write_text(json.dumps({"id": "t", "calls": [{"tool": "a", "args": 1, "outcome": "ok"}]}) + "\n")
    result = root / "result.json"
    assert cli.main(["calibrate", str(corpus), "--json", str(result), "--progress", "never"]) == 0
    (root / "linked").symlink_to(root)
    broken = root / "site"
    (broken / "tg_broken_plugin-1.0.dist-info").mkdir(parents=True)
    (broken / "tg_broken_plugin.py").write_text("raise RuntimeError('cannot import me')\n")
    (broken / "tg_broken_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tg-broken-plugin\nVersion: 1.0\n")
    (broken / "tg_broken_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[turnguard]\nbroken = tg_broken_plugin\n")
    return {"corpus": str(corpus), "result": str(result), "site": str(broken), "linked": str(root / "linked")}


def run_command(argv: list[str], cwd: Path, env: dict[str, str], stdout_to: str | None = None,
                pass_fds: tuple[int, ...] = ()) -> Done:
    """``python -m turnguard ARGV`` in ``cwd`` with only ``env`` beyond the basics (no TURNGUARD_*
    or OTEL_* of the machine running the tests), inheriting ``pass_fds``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TURNGUARD_", "OTEL_", "PYTHON"))}
    path = os.pathsep.join(p for p in (env.pop("PYTHONPATH", ""), str(SRC)) if p)
    full = {**base, "HOME": str(cwd), "PYTHONPATH": path, **env}
    command = [sys.executable, "-m", "turnguard", *argv]
    if stdout_to is None:
        done = subprocess.run(command, cwd=cwd, env=full, timeout=120, capture_output=True, text=True,
                              pass_fds=pass_fds)
        return Done(done.returncode, done.stdout, done.stderr)
    with open(stdout_to, "w") as out:
        done = subprocess.run(command, cwd=cwd, env=full, timeout=120, stdout=out, stderr=subprocess.PIPE, text=True)
    return Done(done.returncode, "", done.stderr)


NOT_UTF8 = b"soft_cap = 3\n# caf\xe9 au lait\n"
DEEP = b"x = " + b"[" * 50_000 + b"]" * 50_000 + b"\n"
CONFIG_BOUND = 4 * 1024 * 1024
"""The documented bound of a configuration file (usage.md; ``turnguard._config.MAX_CONFIG_BYTES``)."""
OVERSIZED = b"soft_cap = 3\n" + b"# padding\n" * (CONFIG_BOUND // 10 + 1)
"""A configuration file one line past the bound, well formed (so only its size can refuse it)."""

CONFIGURATION_CASES: dict[str, Case] = {
    "a turnguard.toml that is not UTF-8": Case({}, {"turnguard.toml": NOT_UTF8}, 2, "not utf-8"),
    "a TOML file that does not parse": Case({"TURNGUARD_CONFIG": "bad.toml"}, {"bad.toml": b"soft_cap = [\n"}, 2,
                                            "bad.toml"),
    "a TOML file nested too deeply": Case({"TURNGUARD_CONFIG": "deep.toml"}, {"deep.toml": DEEP}, 2, "deep"),
    "a configuration path naming a device without end": Case({"TURNGUARD_CONFIG": "zero.toml"},
                                                             {"zero.toml": "/dev/zero"}, 2, "larger than"),
    "a configuration path naming a device of random bytes": Case({"TURNGUARD_CONFIG": "random.toml"},
                                                                 {"random.toml": "/dev/urandom"}, 2, "larger than"),
    "a turnguard.toml past the size bound": Case({}, {"turnguard.toml": OVERSIZED}, 2, "larger than"),
    "a pyproject.toml past the size bound naming tool.turnguard": Case(
        {}, {"pyproject.toml": b"[tool.turnguard]\n" + OVERSIZED}, 2, "larger than"),
    "a pyproject.toml past the size bound not naming turnguard (passed over)": Case(
        {}, {"pyproject.toml": b"[tool.other]\n" + OVERSIZED}, 0),
    "a configuration path that is a folder": Case({"TURNGUARD_CONFIG": "folder"}, {"folder": None}, 2,
                                                  "is a directory"),
    "a configuration path through a file": Case({"TURNGUARD_CONFIG": "afile/turnguard.toml"}, {"afile": b"x"}, 2,
                                                "not a directory"),
    "a bad boolean setting": Case({"TURNGUARD_CAPTURE_CONTENT": "bogus"}, {}, 2, "turnguard_capture_content"),
    "a digest key holding a byte that is not UTF-8": Case({"TURNGUARD_DIGEST_KEY": os.fsdecode(b"secret\xff")}, {}, 2,
                                                         "turnguard_digest_key"),
    "a plugin selection naming no installed plugin": Case({"TURNGUARD_LOAD_PLUGINS": "bogus"}, {}, 2,
                                                          "turnguard_load_plugins"),
    "a pyproject.toml whose tool is not a table": Case({}, {"pyproject.toml": b'tool = "turnguard"\n'}, 2,
                                                       "pyproject.toml: 'tool': got 'turnguard'; expected a table"),
    "a pyproject.toml whose tool.turnguard is not a table": Case(
        {}, {"pyproject.toml": b"[tool]\nturnguard = 5\n"}, 2, "pyproject.toml: 'tool.turnguard': got 5"),
    "a turnguard.toml whose turnguard is not a table": Case(
        {}, {"turnguard.toml": b'turnguard = ["x"]\n'}, 2, "turnguard.toml: 'turnguard': got ['x']"),
    "a turnguard.toml with options at top level and in [turnguard]": Case(
        {}, {"turnguard.toml": b"soft_cap = 4\n\n[turnguard]\nstreak_warn_at = 2\n"}, 2,
        "turnguard.toml: 'soft_cap': got 4; expected options all at top level or all under [turnguard]"),
}
"""Hostile inputs every command shares (the configuration is loaded alike before any runs)."""


def prepare(root: Path, case: Case) -> None:
    for name, content in case.files.items():
        path = root / name
        if content is None:
            path.mkdir()
        elif isinstance(content, str):
            path.symlink_to(content)
        else:
            path.write_bytes(content)


def argv_of(command: str, inputs: dict[str, str], fresh: Path) -> list[str]:
    state = kept_result_token(fresh / "state") if command == "result" else fresh  # (a turn takes one result)
    return [a.format(fresh=fresh, state=state, **inputs) for a in COMMANDS[command]]


def assert_fails_cleanly(done: Done, command: str, case: Case) -> None:
    assert "Traceback" not in done.err, done.err
    assert done.status == case.status, done.err
    if case.status == 0:
        return
    called = cli.SUBCOMMANDS[command].called if command in cli.SUBCOMMANDS else command
    said = [line for line in done.lines if line.startswith(f"turnguard {called}: ")]
    assert len(said) == 1 and said == done.lines[-1:], done.err
    assert case.says.lower() in said[0].lower(), said[0]


def test_every_subcommand_is_in_the_matrix():
    assert set(COMMANDS) == set(cli.SUBCOMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(CONFIGURATION_CASES))
def test_every_command_fails_cleanly_on_a_hostile_configuration(command, case, inputs, tmp_path):
    hostile = CONFIGURATION_CASES[case]
    prepare(tmp_path, hostile)
    done = run_command(argv_of(command, inputs, tmp_path), tmp_path, dict(hostile.env))
    assert_fails_cleanly(done, command, hostile)
    assert len(done.lines) == (1 if hostile.status else 0), done.err


WITH_CONFIG = [name for name in COMMANDS if "--config" in cli._subparser(cli.parser(), name)._option_string_actions]
"""The commands that take ``--config TOML``."""
NOT_A_TABLE_AT = {"tool": ("pyproject.toml", b'tool = "turnguard"\n'),
                  "tool.turnguard": ("pyproject.toml", b"[tool]\nturnguard = [1]\n"),
                  "turnguard": ("custom.toml", b"turnguard = 1.5\n")}


@pytest.mark.parametrize("level", list(NOT_A_TABLE_AT))
@pytest.mark.parametrize("command", WITH_CONFIG)
def test_every_command_given_a_file_whose_table_path_is_not_a_table_says_so_in_one_line(command, level, inputs,
                                                                                        tmp_path):
    name, text = NOT_A_TABLE_AT[level]
    given = tmp_path / "given" / name
    given.parent.mkdir()
    given.write_bytes(text)
    done = run_command([*argv_of(command, inputs, tmp_path), "--config", str(given)], tmp_path, {})
    assert_fails_cleanly(done, command, Case({}, {}, 2, f"{given}: {level!r}: got "))
    assert len(done.lines) == 1, done.err


PIPED_CONFIG = b"soft_cap = 7\n"


def pipe_outcome(kind: str) -> Case:
    """A pipe's documented outcome: read like a file, or refused in one line (2) once it gave no end."""
    return Case({}, {}, 0) if PIPE_KINDS[kind] else Case({}, {}, 2, SAYS_WHEN_NOT_READ[kind])


@pytest.mark.parametrize("kind", list(PIPE_KINDS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_given_a_pipe_as_turnguard_config_reads_it_or_says_in_one_line_it_gave_no_end(
        command, kind, inputs, tmp_path):
    with given_pipe(kind, tmp_path, PIPED_CONFIG) as pipe:
        done = run_command(argv_of(command, inputs, tmp_path), tmp_path, {"TURNGUARD_CONFIG": pipe.path},
                           pass_fds=pipe.pass_fds)
    assert_fails_cleanly(done, command, pipe_outcome(kind))
    assert len(done.lines) == (0 if PIPE_KINDS[kind] else 1), done.err


@pytest.mark.parametrize("kind", list(PIPE_KINDS))
@pytest.mark.parametrize("command", WITH_CONFIG)
def test_every_command_given_a_pipe_as_config_option_reads_it_or_says_in_one_line_it_gave_no_end(
        command, kind, inputs, tmp_path):
    with given_pipe(kind, tmp_path, PIPED_CONFIG) as pipe:
        done = run_command([*argv_of(command, inputs, tmp_path), "--config", pipe.path], tmp_path, {},
                           pass_fds=pipe.pass_fds)
    assert_fails_cleanly(done, command, pipe_outcome(kind))
    assert len(done.lines) == (0 if PIPE_KINDS[kind] else 1), done.err


@pytest.mark.parametrize("kind", [kind for kind, read in PIPE_KINDS.items() if read])
def test_config_shows_a_piped_configuration_as_the_source_of_what_it_set(kind, tmp_path):
    with given_pipe(kind, tmp_path, PIPED_CONFIG) as pipe:
        given = os.path.relpath(pipe.path, tmp_path) if pipe.path.startswith(str(tmp_path)) else pipe.path  # (short)
        done = run_command(["config", "--config", given], tmp_path, {}, pass_fds=pipe.pass_fds)
    assert done.status == 0, done.err
    assert done.out.count(given) == 1, done.out  # (read once: a pipe gives its bytes only once)
    assert [line.split() for line in done.out.splitlines() if line.startswith("soft_cap ")] == [
        ["soft_cap", "7", given]]


@pytest.mark.parametrize("name", ["turnguard.toml", "pyproject.toml"])
@pytest.mark.parametrize("kind", [kind for kind in PIPE_KINDS if kind.startswith("a named pipe")])
def test_the_search_passes_over_a_configuration_file_that_is_a_pipe(kind, name, tmp_path):
    with given_pipe(kind, tmp_path, b"[tool.turnguard]\nsoft_cap = 7\n", name):
        done = run_command(["config"], tmp_path, {})
    assert (done.status, done.err) == (0, ""), done.err
    assert [line.split() for line in done.out.splitlines() if line.startswith("soft_cap ")] == [
        ["soft_cap", "100", "default"]]


@pytest.mark.parametrize("kind", list(PIPE_KINDS))
def test_calibrate_merge_given_a_pipe_reads_it_or_says_in_one_line_it_gave_no_end(kind, inputs, tmp_path):
    result = Path(inputs["result"]).read_bytes()
    with given_pipe(kind, tmp_path, result) as pipe:
        done = run_command(["calibrate-merge", pipe.path, "--json", str(tmp_path / "merged.json")], tmp_path, {},
                           pass_fds=pipe.pass_fds)
    assert_fails_cleanly(done, "calibrate-merge", pipe_outcome(kind))
    merged = tmp_path / "merged.json"
    assert merged.exists() == PIPE_KINDS[kind]
    if PIPE_KINDS[kind]:
        assert json.loads(merged.read_text())["turns"] == json.loads(result)["turns"]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_says_in_one_line_that_its_output_cannot_be_written(command, inputs, tmp_path):
    done = run_command(argv_of(command, inputs, tmp_path), tmp_path, {}, stdout_to="/dev/full")
    assert_fails_cleanly(done, command, Case({}, {}, 1, "cannot write to standard output: no space left"))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_broken_plugin_is_said_once_and_the_command_still_runs(command, inputs, tmp_path):
    done = run_command(argv_of(command, inputs, tmp_path), tmp_path, {"PYTHONPATH": inputs["site"]})
    assert (done.status, "Traceback" in done.err) == (0, False), done.err
    builds_a_guard = command in ("demo", "plugins", "result")
    expected = ["turnguard: entry-point plugin 'broken' left out: RuntimeError: cannot import me"]
    assert done.lines == (expected if builds_a_guard else []), done.err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_disabling_a_plugin_that_is_not_installed_warns_once_per_process(command, inputs, tmp_path):
    done = run_command(argv_of(command, inputs, tmp_path), tmp_path, {"TURNGUARD_DISABLE_PLUGINS": "retired"})
    assert (done.status, "Traceback" in done.err) == (0, False), done.err
    warned = 1 if command in ("demo", "plugins", "result") else 0  # (demo builds a guard per scenario: said once)
    assert len(done.lines) == warned and all("'retired' is not installed" in line for line in done.lines)


def test_plugins_lists_a_broken_plugin_as_failed_and_a_missing_one_as_not_found(inputs, tmp_path):
    env = {"PYTHONPATH": inputs["site"], "TURNGUARD_DISABLE_PLUGINS": "retired"}
    done = run_command(["plugins", "--json"], tmp_path, env)
    assert done.status == 0
    rows = {r["name"]: r for r in json.loads(done.out)}
    assert (rows["broken"]["status"], rows["broken"]["why"]) == ("failed", "RuntimeError: cannot import me")
    assert rows["retired"]["status"] == "not found"


PATH_CASES: dict[str, tuple[list[str], Case]] = {
    "demo: turns file in an unwritable place": (
        ["demo", "soft-stuck", "--record", "/proc/turnguard-test/turns.jsonl"], Case({}, {}, 2, "cannot write")),
    "demo: turns file through a file": (
        ["demo", "soft-stuck", "--record", "afile/turns.jsonl"], Case({}, {"afile": b"x"}, 2, "afile/turns.jsonl")),
    "demo: turns file is a folder": (
        ["demo", "soft-stuck", "--record", "folder"], Case({}, {"folder": None}, 2, "is a directory")),
    "calibrate: input missing": (["calibrate", "nosuch.jsonl"], Case({}, {}, 2, "nosuch.jsonl")),
    "calibrate: input through a file": (["calibrate", "afile/turns.jsonl"], Case({}, {"afile": b"x"}, 2, "afile")),
    "calibrate: input is a folder": (["calibrate", "folder"], Case({}, {"folder": None}, 2, "folder")),
    "calibrate: --json through a file": (
        ["calibrate", "{corpus}", "--json", "afile/r.json"], Case({}, {"afile": b"x"}, 2, "afile/r.json")),
    "calibrate: --html in an unwritable place": (
        ["calibrate", "{corpus}", "--html", "/proc/turnguard-test/r.html"], Case({}, {}, 2, "r.html")),
    "calibrate-merge: input missing": (["calibrate-merge", "nosuch.json"], Case({}, {}, 2, "nosuch.json")),
    "calibrate-merge: input is a folder": (["calibrate-merge", "folder"], Case({}, {"folder": None}, 2, "folder")),
    "calibrate-merge: input a device without end": (["calibrate-merge", "/dev/zero"], Case({}, {}, 2, "larger than")),
    "calibrate-merge: input not UTF-8": (["calibrate-merge", "r.json"], Case({}, {"r.json": NOT_UTF8}, 2, "r.json")),
    "calibrate-merge: --json through a file": (
        ["calibrate-merge", "{result}", "--json", "afile/m.json"], Case({}, {"afile": b"x"}, 2, "afile/m.json")),
    "assets: DIR through a file": (["assets", "afile/deploy"], Case({}, {"afile": b"x"}, 2, "afile is not a folder")),
    "assets: DIR is a file": (["assets", "afile"], Case({}, {"afile": b"x"}, 2, "afile is not a folder")),
    "assets: DIR in an unwritable place": (["assets", "/proc/turnguard-test"], Case({}, {}, 2, "cannot make")),
    "assets: DIR a link": (["assets", "{linked}"], Case({}, {}, 2, "is a symbolic link")),
}
"""Each command's own paths, where they cannot be read or written: said before any work (2)."""


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_every_command_fails_cleanly_on_a_path_it_cannot_use(case, inputs, tmp_path):
    argv, hostile = PATH_CASES[case]
    prepare(tmp_path, hostile)
    command = argv[0]
    done = run_command([a.format(**inputs) for a in argv], tmp_path, dict(hostile.env))
    assert_fails_cleanly(done, command, hostile)
    assert len(done.lines) == 1, done.err


def test_the_demo_says_when_turns_could_not_be_written_after_all(tmp_path):
    done = run_command(["demo", "--record", "/dev/full"], tmp_path, {})
    assert "Traceback" not in done.err and done.status == 1
    *warned, said = done.lines
    assert said.startswith("turnguard demo: 7 of 7 turns could not be written to /dev/full")
    assert len(warned) == 1 and "could not append to /dev/full" in warned[0]  # one warning, not one per turn


def _actions(command: str) -> list:
    return cli._subparser(cli.parser(), command)._actions


def _takes_text(action) -> bool:
    """An argument whose value is text taken as given (no conversion, no list of choices)."""
    return action.nargs != 0 and action.choices is None and (action.type is None or isinstance(action.type,
                                                                                               PathArgument))


PATH_OPTIONS = [(command, action.dest) for command in COMMANDS for action in _actions(command)
                if isinstance(action.type, PathArgument)]
"""Every argument of every command that names a file or folder, as the parsers declare them."""
NOT_PATHS = {("demo", "scenarios"): "scenario names", ("result", "session"): "a session id"}
"""The arguments taking text as given that name no file or folder."""


def test_every_argument_taking_text_as_given_is_a_path_or_known_not_to_be_one():
    texts = {(command, action.dest) for command in COMMANDS for action in _actions(command) if _takes_text(action)}
    assert texts - set(PATH_OPTIONS) == set(NOT_PATHS)
    assert {command for command, _ in PATH_OPTIONS} == {"demo", "plugins", "config", "calibrate", "calibrate-merge",
                                                        "assets", "result"}


def _files(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")}


@pytest.mark.parametrize(("command", "dest"), PATH_OPTIONS, ids=[f"{c}-{d}" for c, d in PATH_OPTIONS])
def test_an_empty_path_is_refused_in_one_line_naming_it_and_nothing_is_written(command, dest, inputs, tmp_path):
    argv = argv_of(command, inputs, tmp_path)
    action = next(a for a in _actions(command) if a.dest == dest)
    if action.option_strings:
        argv += [action.option_strings[-1], ""]
    else:  # a positional argument: the one the command runs with, emptied
        given = getattr(cli._subparser(cli.parser(), command).parse_args(argv[1:]), dest)
        argv[argv.index(given[0] if isinstance(given, list) else given)] = ""
    before = _files(tmp_path)
    done = run_command(argv, tmp_path, {})
    said = f"{'/'.join(action.option_strings) or action.metavar}: an empty path"
    assert_fails_cleanly(done, command, Case({}, {}, 2, said))
    assert len(done.lines) == 1 and done.out == "", done.err
    assert _files(tmp_path) == before
