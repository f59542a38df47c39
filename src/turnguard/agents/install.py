"""``turnguard install AGENT`` / ``turnguard uninstall AGENT``: turnguard's hook entries merged into
the agent's own settings file, and taken out again.

Where each agent reads command hooks (checked against Claude Code 2.1.328, Codex 0.169.0 and
Gemini CLI 0.61.0):

- Claude Code: ``.claude/settings.json`` of the project it starts in (``--project``) or
  ``$CLAUDE_CONFIG_DIR/settings.json``, default ``~/.claude/settings.json`` (``--user``). A
  ``timeout`` is in seconds (default 600). The file must be plain JSON: with a ``//`` comment
  Claude Code ignores the whole file.
- Codex: ``hooks.json`` beside a config layer: the project's ``.codex/hooks.json`` (read only in
  a project the user trusted) or ``$CODEX_HOME/hooks.json``, default ``~/.codex``. ``timeout``
  in seconds (default 600). Codex runs a new or changed hook only once the user has trusted it
  (``/hooks`` in codex; ``codex exec`` skips an untrusted hook without a word). The ``hooks``
  feature is on by default in 0.169.0; ``[features] hooks = true`` is set in the layer's
  ``config.toml`` all the same (earlier versions had it off, and a user may have turned it off).
- Gemini CLI: ``.gemini/settings.json`` of the project or ``~/.gemini/settings.json``
  (``$GEMINI_CLI_HOME`` in place of ``~``). ``timeout`` in milliseconds (default 60000). It reads
  JSON with comments, which this module refuses to rewrite (they would be lost). Its hooks run
  only in a trusted folder when folder trust is on.

Each file is changed as a whole or not at all (a temporary file beside it, then ``os.replace``,
keeping its mode). A file that is a link (a dotfiles checkout), or in a linked folder, is written,
made and removed at the link's target, the link left as it is, so that ``uninstall`` leaves the
link as it found it. Before the first change the original is recorded beside the file
(``NAME.turnguard-backup``, JSON: the original text or that there was none, the folders made, and
for Codex's ``config.toml`` what the feature line was), so that ``uninstall`` can give back the
very bytes that were there when nothing else changed since, and otherwise take out only
turnguard's entries. The hook command names this interpreter by its absolute path, so the agent's
``PATH`` does not matter; thresholds stay in ``turnguard.toml`` / ``TURNGUARD_*``.

The file is written back as JSON that a strict parser reads (Node's, Claude Code's): a number too
large for a float (``1e400``) as it was written, not as ``Infinity``, and a lone surrogate escape
(``"\\ud800"``) as an escape, not as text UTF-8 cannot hold.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import json
import math
import os
import re
import secrets
import shlex
import stat
import sys
import tempfile
import textwrap
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

AGENTS: tuple[str, ...] = ("claude-code", "codex", "gemini")
BACKUP_SUFFIX = ".turnguard-backup"
BACKUP_FORMAT = 1
FEATURE_LINE = "hooks = true"


class Scope(Enum):
    PROJECT = "project"
    USER = "user"


class SettingsError(Exception):
    """A file that cannot be changed safely: nothing is written, the command says why in one line."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HookEvent:
    name: str
    matcher: str | None = None
    """Tool events only: which tools (every one here); the other events take no matcher."""


@dataclass(frozen=True, slots=True)
class AgentHooks:
    """Where one agent reads its command hooks and which of its events turnguard answers."""

    agent: str
    folder: str
    """The folder in the project, and the user folder's name under the home directory."""
    file: str
    events: tuple[HookEvent, ...]
    timeout: int
    """In the agent's unit: seconds for Claude Code and Codex, milliseconds for Gemini CLI."""
    user_env: str
    """The variable that moves the user folder (it names the folder itself, or for Gemini CLI the
    home directory the folder is in)."""
    user_env_is_home: bool = False
    feature_flag: bool = False
    """Codex: ``[features] hooks = true`` in ``config.toml`` beside the hooks file."""
    trust: str = ""
    """What the user has to do before the agent runs new hooks, said after an install."""
    project_trust: str = ""
    """The same, for hooks in a project's folder."""
    off_switch: tuple[tuple[str, ...], object] | None = None
    """The setting (its path of keys) and the value with which the agent runs no hooks at all."""
    local_file: str | None = None
    """The project's own settings file beside ``file`` that the agent also reads (Claude Code's)."""


_TOOL = "*"
"""Every tool, in Claude Code's and Codex's matchers (Gemini CLI's are regular expressions: ``.*``)."""
AGENT_HOOKS: dict[str, AgentHooks] = {
    "claude-code": AgentHooks(
        "claude-code", ".claude", "settings.json",
        (HookEvent("UserPromptSubmit"), HookEvent("PreToolUse", _TOOL), HookEvent("PostToolUse", _TOOL),
         HookEvent("PostToolUseFailure", _TOOL), HookEvent("PostToolBatch"), HookEvent("Stop"),
         HookEvent("StopFailure"), HookEvent("SessionEnd")),
        timeout=30, user_env="CLAUDE_CONFIG_DIR", off_switch=(("disableAllHooks",), True),
        local_file="settings.local.json"),
    "codex": AgentHooks(
        "codex", ".codex", "hooks.json",
        (HookEvent("UserPromptSubmit"), HookEvent("PreModelRequest"), HookEvent("PreToolUse", _TOOL),
         HookEvent("PostToolUse", _TOOL), HookEvent("Stop"), HookEvent("SessionEnd")),
        timeout=30, user_env="CODEX_HOME", feature_flag=True,
        trust="Codex runs a new or changed hook only once you trust it: review turnguard's with /hooks in codex "
              "(codex exec skips untrusted hooks silently; --dangerously-bypass-hook-trust runs them)",
        project_trust="Codex reads a project's .codex/ only in a trusted project: trust it when Codex asks, or run "
                      "codex exec --trust in it"),
    "gemini": AgentHooks(
        "gemini", ".gemini", "settings.json",
        (HookEvent("BeforeAgent"), HookEvent("BeforeModel"), HookEvent("BeforeTool", ".*"),
         HookEvent("AfterTool", ".*"), HookEvent("AfterAgent"), HookEvent("SessionEnd")),
        timeout=30_000, user_env="GEMINI_CLI_HOME", user_env_is_home=True,
        off_switch=(("hooksConfig", "enabled"), False),
        trust="Gemini CLI runs hooks only in a trusted folder when its folder trust is on"),
}
"""Each agent's hooks, by the name ``turnguard hook AGENT`` takes: the events its module in this
package reads (``KINDS``; tests/test_agents_install.py holds the two equal)."""


# -- the hook entries -----------------------------------------------------------------------------

_AGENT_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_CLIENT_TAIL = ("turnguard", "agents", "client.py")


def hook_command(agent: str, executable: str | None = None) -> str:
    """The command the agent runs: this interpreter by its absolute path (so the agent's ``PATH``
    does not matter) running ``client.py`` with ``-S``: a process that imports only the standard
    library and asks the long-lived local server, which answers as ``turnguard hook AGENT`` does
    (see ``client``). The client is run through ``LAUNCHER``, not by its path: Python exits 2 when
    it cannot open a script, the status with which every agent blocks the event, so a client gone
    (turnguard uninstalled, its environment rebuilt on another Python) would refuse every prompt
    and tool call."""
    client = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.py")
    launcher = LAUNCHER.replace(_CLIENT, json.dumps(client))
    return shlex.join([executable or sys.executable, "-S", "-P", "-c", launcher, agent])


_CLIENT = "{client}"
LAUNCHER = ('import os,sys;p={client};os.path.isfile(p) or sys.exit("turnguard hook: "+p+" is gone '
            '(turnguard uninstalled or moved: install it again, or remove its hooks); allowed");'
            'exec(compile(open(p,"rb").read(),p,"exec"),{"__name__":"__main__","__file__":p})')
"""The code of ``hook_command`` (``-c``; ``-P`` keeps the agent's folder off the import path): it
runs the client at ``{client}`` (a JSON string, which Python reads alike) as its script would
run, or, the client gone, says so in one line on stderr and exits 1, which all three agents show
as a hook error and go on."""
_LAUNCHER_HEAD, _, _LAUNCHER_TAIL = LAUNCHER.partition(_CLIENT)


def launched_client(code: str) -> str | None:
    """The client's path in ``LAUNCHER`` code as ``hook_command`` writes it, else ``None``."""
    if not (code.startswith(_LAUNCHER_HEAD) and code.endswith(_LAUNCHER_TAIL)):
        return None
    try:
        path = ast.literal_eval(code[len(_LAUNCHER_HEAD):len(code) - len(_LAUNCHER_TAIL)])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return path if isinstance(path, str) else None


def is_turnguard_command(command: object) -> bool:
    """Whether a hook's command is, word for word, one turnguard writes or documents: ``PYTHON
    [-FLAGS] -c LAUNCHER AGENT`` (``hook_command``), ``PYTHON [-FLAGS] …/turnguard/agents/client.py
    AGENT`` (as written before), ``PYTHON [-FLAGS] -m turnguard hook AGENT`` or ``[…/]turnguard hook
    AGENT``. A command that only mentions turnguard is the user's own."""
    if not isinstance(command, str):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if len(words) < 3 or not _AGENT_WORD.fullmatch(words[-1]):
        return False
    head, rest = words[0], words[1:-1]
    if os.path.basename(head) == "turnguard":
        return rest == ["hook"]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
        rest = rest[1:]
    if rest == ["-m", "turnguard", "hook"]:
        return True
    if len(rest) == 2 and rest[0] == "-c":
        client = launched_client(rest[1])
        return client is not None and tuple(Path(client).parts[-3:]) == _CLIENT_TAIL
    return len(rest) == 1 and tuple(Path(rest[0]).parts[-3:]) == _CLIENT_TAIL


def hook_entry(spec: AgentHooks, event: HookEvent, command: str) -> dict[str, Any]:
    """One matcher group holding turnguard's one handler, in the shape all three agents read."""
    handler = {"type": "command", "command": command, "timeout": spec.timeout}
    if event.matcher is None:
        return {"hooks": [handler]}
    return {"matcher": event.matcher, "hooks": [handler]}


def _is_turnguard_handler(handler: object) -> bool:
    return isinstance(handler, dict) and is_turnguard_command(handler.get("command"))


def _without_turnguard(groups: list[Any]) -> tuple[list[Any], int | None]:
    """``groups`` without turnguard's handlers (a group left empty goes), and where the first of
    them was, so that a new entry takes its place."""
    kept: list[Any] = []
    first = None
    for group in groups:
        handlers = group.get("hooks") if isinstance(group, dict) else None
        if not isinstance(handlers, list) or not any(_is_turnguard_handler(h) for h in handlers):
            kept.append(group)
            continue
        if first is None:
            first = len(kept)
        others = [h for h in handlers if not _is_turnguard_handler(h)]
        if others:
            kept.append({**group, "hooks": others})
    return kept, first


def _hooks_table(settings: dict[str, Any], path: Path) -> dict[str, Any] | None:
    hooks = settings.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise SettingsError(path, '"hooks" is not a JSON object; fix it first (nothing was changed)')
    return hooks


def contains_turnguard(settings: dict[str, Any]) -> bool:
    """Whether any event of ``settings`` holds a turnguard handler."""
    hooks = settings.get("hooks")
    return isinstance(hooks, dict) and any(
        isinstance(groups, list) and _without_turnguard(groups)[1] is not None for groups in hooks.values())


def install_hooks(settings: dict[str, Any], spec: AgentHooks, command: str,
                  path: Path = Path("settings")) -> dict[str, Any]:
    """``settings`` with turnguard's entries in place: the user's other hooks and settings stay, in
    order; a turnguard entry already there is replaced where it is, so installing twice is installing once."""
    result = copy.deepcopy(settings)
    hooks = _hooks_table(result, path)
    if hooks is None:
        hooks = result["hooks"] = {}
    places: dict[str, int | None] = {}
    for name, groups in list(hooks.items()):
        if isinstance(groups, list):
            kept, places[name] = _without_turnguard(groups)
            hooks[name] = kept
            if not kept and places[name] is not None and name not in {e.name for e in spec.events}:
                del hooks[name]
    for event in spec.events:
        groups = hooks.setdefault(event.name, [])
        if not isinstance(groups, list):
            raise SettingsError(path, f'"hooks.{event.name}" is not a JSON array; fix it first (nothing was changed)')
        place = places.get(event.name)
        groups.insert(len(groups) if place is None else place, hook_entry(spec, event, command))
    return result


def remove_hooks(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without turnguard's entries; an event list or ``hooks`` table that only they
    filled goes with them, anything else stays as it is."""
    hooks = settings.get("hooks")
    if not isinstance(hooks, dict):
        return copy.deepcopy(settings)
    result = copy.deepcopy(settings)
    table = result["hooks"]
    removed = False
    for name, groups in list(table.items()):
        if not isinstance(groups, list):
            continue
        kept, first = _without_turnguard(groups)
        if first is None:
            continue
        removed = True
        if kept:
            table[name] = kept
        else:
            del table[name]
    if removed and not table:
        del result["hooks"]
    return result


# -- JSON text ------------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def _bad_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _without_comments(text: str) -> str:
    """``text`` with ``//`` and ``/* */`` comments outside strings taken out."""
    out: list[str] = []
    i, in_string = 0, False
    while i < len(text):
        char = text[i]
        if in_string:
            out.append(text[i:i + 2] if char == "\\" else char)
            in_string = char != '"'
            i += 2 if char == "\\" else 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
        else:
            out.append(char)
            in_string = char == '"'
            i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class RawNumber:
    """A number as the file wrote it, where a float cannot hold it (``1e400``): written back so,
    since ``json.dumps`` would write ``Infinity``, which is not JSON (Node's parser rejects it)."""

    text: str


def _number(text: str) -> float | RawNumber:
    value = float(text)
    return value if math.isfinite(value) else RawNumber(text)


def parse_settings(text: str, path: Path = Path("settings")) -> dict[str, Any]:
    """The settings object in ``text``; anything turnguard could not write back whole is refused."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_bad_constant,
                           parse_float=_number)
    except ValueError as exc:
        if _without_comments(text) != text:
            raise SettingsError(path, "has comments, which turnguard would lose in rewriting it (and Claude "
                                      "Code rejects); take them out or add the hooks by hand (nothing was "
                                      "changed)") from None
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise SettingsError(path, f"is not valid JSON ({reason}{where}); fix it first (nothing was changed)") from None
    if not isinstance(value, dict):
        raise SettingsError(path, "is not a JSON object; fix it first (nothing was changed)")
    return value


def _indent_of(text: str | None) -> int | str:
    """The indentation ``text`` uses (its first indented line's), else 2."""
    found = re.search(r"\n([ \t]+)\S", text or "")
    if found is None:
        return 2
    return "\t" if "\t" in found.group(1) else len(found.group(1))


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def render_settings(settings: dict[str, Any], like: str | None = None) -> str:
    """JSON as people read it (the indentation and line ends of ``like``, the file it replaces), keys
    in order. Only JSON that UTF-8 can hold: a ``RawNumber`` as it was written, a lone surrogate
    (``"\\ud800"`` in the file) as its escape."""
    raws: list[str] = []
    token = f"turnguard-raw-number-{secrets.token_hex(8)}-"

    def raw(value: object) -> str:
        if not isinstance(value, RawNumber):
            raise TypeError(f"{type(value).__name__} is not JSON")
        raws.append(value.text)
        return f"{token}{len(raws) - 1}"

    text = json.dumps(settings, indent=_indent_of(like), ensure_ascii=False, allow_nan=False, default=raw) + "\n"
    if raws:
        text = re.sub(f'"{token}([0-9]+)"', lambda m: raws[int(m.group(1))], text)
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text.replace("\n", "\r\n") if like and "\r\n" in like else text


def _canonical(settings: dict[str, Any]) -> str:
    return json.dumps(settings, default=lambda raw: {"turnguard-raw-number": raw.text})


# -- Codex's config.toml --------------------------------------------------------------------------

_TABLE = re.compile(r"^\s*\[(?!\[)\s*(?P<name>[^\]]*?)\s*\]\s*(?:#.*)?$")
_ANY_TABLE = re.compile(r"^\s*\[\[?[^\]]*\]\]?\s*(?:#.*)?$")
_HOOKS_KEY = re.compile(r"""^(?P<indent>\s*)(?:hooks|"hooks"|'hooks')\s*=""")


@dataclass(frozen=True, slots=True)
class FeatureEdit:
    """What turnguard changed in ``config.toml``, so that uninstall can put it back."""

    line: str
    """The line written (without its indentation and line end)."""
    previous: str | None = None
    """The ``hooks = …`` line it replaced, or None when the key was added."""
    appended: str = ""
    """The text appended to the file (a new ``[features]`` table), when there was no table."""


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(path, f"is not valid TOML ({exc}); fix it first (nothing was changed)") from None


def _features_header(lines: list[str]) -> int | None:
    for number, line in enumerate(lines):
        table = _TABLE.match(line.rstrip("\r\n"))
        if table and table.group("name") == "features":
            return number
    return None


def _hooks_line(lines: list[str], header: int) -> int | None:
    for number in range(header + 1, len(lines)):
        line = lines[number].rstrip("\r\n")
        if _ANY_TABLE.match(line):
            return None
        if _HOOKS_KEY.match(line):
            return number
    return None


def _with_feature(parsed: dict[str, Any], value: object, path: Path) -> dict[str, Any]:
    """``parsed`` with ``features.hooks`` set to ``value`` (``None``: taken out)."""
    expected = copy.deepcopy(parsed)
    features = expected.setdefault("features", {})
    if not isinstance(features, dict):
        raise SettingsError(path, '"features" is not a table; fix it first (nothing was changed)')
    if value is None:
        features.pop("hooks", None)
    else:
        features["hooks"] = value
    return expected


def enable_hooks_feature(text: str, path: Path = Path("config.toml")) -> tuple[str, FeatureEdit | None]:
    """``text`` with ``hooks = true`` under ``[features]``, changing no other line (None: already so).
    The result is checked by parsing it: it must say what the original said, and that."""
    parsed = _parse_toml(text, path)
    features = parsed.get("features")
    if isinstance(features, dict) and features.get("hooks") is True:
        return text, None
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    header = _features_header(lines)
    if header is None:
        lead = "" if not text else (newline if text.endswith("\n") else newline * 2)
        edit = FeatureEdit(FEATURE_LINE, appended=f"{lead}[features]{newline}{FEATURE_LINE}{newline}")
        new_text = text + edit.appended
    else:
        key = _hooks_line(lines, header)
        if key is None:
            if not lines[header].endswith("\n"):
                lines[header] += newline
            lines.insert(header + 1, FEATURE_LINE + newline)
            edit = FeatureEdit(FEATURE_LINE)
        else:
            old = lines[key].rstrip("\r\n")
            indent = _HOOKS_KEY.match(old)
            lines[key] = (indent.group("indent") if indent else "") + FEATURE_LINE + lines[key][len(old):]
            edit = FeatureEdit(FEATURE_LINE, previous=old)
        new_text = "".join(lines)
    if _parse_toml_or_none(new_text) != _with_feature(parsed, True, path):
        raise SettingsError(path, "turnguard cannot set hooks = true under [features] without touching anything "
                                  "else here; add it by hand (nothing was changed)")
    return new_text, edit


def _parse_toml_or_none(text: str) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def disable_hooks_feature(text: str, edit: FeatureEdit, path: Path = Path("config.toml")) -> str | None:
    """``text`` with turnguard's ``hooks = true`` taken back out (the line it replaced put back), or
    None when that line is no longer turnguard's (the user changed it: it is theirs now)."""
    parsed = _parse_toml(text, path)
    if edit.appended and text.endswith(edit.appended):
        candidate = text[: len(text) - len(edit.appended)]
        expected = copy.deepcopy(parsed)
        expected.pop("features", None)
    else:
        lines = text.splitlines(keepends=True)
        header = _features_header(lines)
        key = None if header is None else _hooks_line(lines, header)
        if key is None or lines[key].strip() != edit.line:
            return None
        ending = lines[key][len(lines[key].rstrip("\r\n")):]
        if edit.previous is None:
            del lines[key]
        else:
            lines[key] = edit.previous + ending
        candidate = "".join(lines)
        previous = None if edit.previous is None else _parse_toml_or_none(edit.previous.strip())
        expected = _with_feature(parsed, None if previous is None else previous.get("hooks"), path)
    return candidate if _parse_toml_or_none(candidate) == expected else None


# -- the backup -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backup:
    """A file as it was before turnguard first changed it."""

    content: str | None
    """Its text, or None: there was no file."""
    made_dirs: tuple[str, ...] = ()
    """The folders install made for it (uninstall removes them when they are empty again)."""
    feature: FeatureEdit | None = None

    def to_text(self) -> str:
        feature = None if self.feature is None else {
            "line": self.feature.line, "previous": self.feature.previous, "appended": self.feature.appended}
        record = {"turnguard_backup": BACKUP_FORMAT, "existed": self.content is not None, "content": self.content,
                  "made_dirs": list(self.made_dirs), "feature": feature}
        return json.dumps(record, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_text(cls, text: str, path: Path) -> Backup:
        try:
            record = json.loads(text)
            content, feature = record["content"], record.get("feature")
            if record["turnguard_backup"] != BACKUP_FORMAT or not isinstance(content, str | None):
                raise ValueError(record)
            edit = None if feature is None else FeatureEdit(
                str(feature["line"]), feature["previous"], str(feature.get("appended", "")))
            return cls(content, tuple(str(d) for d in record.get("made_dirs", ())), edit)
        except (ValueError, KeyError, TypeError, RecursionError):
            raise SettingsError(path, "is not a backup turnguard wrote; move it away first (nothing was changed)") \
                from None


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def read_backup(path: Path) -> Backup | None:
    """The backup of ``path`` (the settings file), if install left one."""
    text = _read(backup_path(path))
    return None if text is None else Backup.from_text(text, backup_path(path))


# -- reading and writing files --------------------------------------------------------------------


def _read(path: Path) -> str | None:
    """The text of ``path``, or None when there is no file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SettingsError(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SettingsError(path, "is not UTF-8 text; fix it first (nothing was changed)") from None


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` whole with ``text`` (a link is followed: its target is replaced), keeping the
    file's mode; a failure at any point leaves the old file as it was and no temporary file behind."""
    real = Path(os.path.realpath(path))
    try:
        mode = stat.S_IMODE(real.stat().st_mode)
    except FileNotFoundError:
        mode = _default_mode()
    fd, temporary = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".turnguard-tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, real)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _target(path: Path) -> Path:
    """The file ``path`` names once its links are followed (a link's target, made or not): what
    is written, removed and has its folders made, so that a link is left as it was."""
    return Path(os.path.realpath(path))


def _missing_dirs(folder: Path) -> tuple[Path, ...]:
    """The folders from the first missing one down to ``folder``, that writing into it would make."""
    missing: list[Path] = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return tuple(reversed(missing))


# -- plans ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One file's planned change, computed from what is on disk and written by ``apply``."""

    path: Path
    before: str | None
    after: str | None
    """The new text, or None: the file is removed."""
    what: str
    """What was done, said in the line printed once it is written."""
    backup: str | None = None
    """The backup record to write first (None: there is one already, or nothing changes)."""
    drop_backup: bool = False
    make_dirs: tuple[Path, ...] = ()
    remove_dirs: tuple[Path, ...] = ()
    """Folders install made, removed after the file when they are empty."""

    @property
    def writes(self) -> bool:
        return self.before != self.after or self.backup is not None or self.drop_backup


def agent_folder(spec: AgentHooks, scope: Scope, environ: Mapping[str, str], cwd: Path) -> Path:
    """The folder of the agent's settings for ``scope``: in ``cwd``, or the user's."""
    if scope is Scope.PROJECT:
        return cwd / spec.folder
    home = Path(environ.get("HOME") or Path.home())
    moved = environ.get(spec.user_env)
    if not moved:
        return home / spec.folder
    moved_path = cwd / Path(moved).expanduser()
    return moved_path / spec.folder if spec.user_env_is_home else moved_path


def _new_backup(path: Path, before: str | None, feature: FeatureEdit | None = None) -> str | None:
    """The backup record to write before the first change (None: one is there already, kept as it is)."""
    if read_backup(path) is not None:
        return None
    return Backup(before, tuple(str(d) for d in _missing_dirs(_target(path).parent)), feature).to_text()


def _install_settings(path: Path, spec: AgentHooks, command: str) -> Change:
    before = _read(path)
    settings = {} if before is None else parse_settings(before, path)
    after = render_settings(install_hooks(settings, spec, command, path), before)
    if after == before:
        return Change(path, before, after, "turnguard's hooks are in place already; nothing changed")
    events = len(spec.events)
    what = (f"updated turnguard's hooks ({events} events)" if contains_turnguard(settings)
            else f"added turnguard's hooks ({events} events)")
    backup = _new_backup(path, before)
    if backup is not None:
        what += f"; the original is kept in {backup_path(path).name}" if before is not None \
            else f"; the file is new ({backup_path(path).name} records that)"
    return Change(path, before, after, what, backup, make_dirs=_missing_dirs(_target(path).parent))


def _install_feature(path: Path) -> Change:
    before = _read(path)
    after, edit = enable_hooks_feature(before or "", path)
    if edit is None:
        return Change(path, before, before, "[features] hooks is true already; nothing changed")
    what = "set hooks = true under [features]" if edit.previous is None else f"replaced {edit.previous.strip()!r} " \
        "with hooks = true under [features]"
    return Change(path, before, after, what, _new_backup(path, before, edit),
                  make_dirs=_missing_dirs(_target(path).parent))


def plan_install(agent: str, scope: Scope, *, environ: Mapping[str, str], cwd: Path,
                 executable: str | None = None) -> tuple[Change, ...]:
    """What ``turnguard install AGENT`` changes, file by file; raises ``SettingsError`` before any write."""
    spec = AGENT_HOOKS[agent]
    folder = agent_folder(spec, scope, environ, cwd)
    changes = [_install_settings(folder / spec.file, spec, hook_command(agent, executable))]
    if spec.feature_flag:
        changes.append(_install_feature(folder / "config.toml"))
    return tuple(changes)


def installed_elsewhere(agent: str, scope: Scope, *, environ: Mapping[str, str], cwd: Path) -> Path | None:
    """The agent's settings file of the other scope when it holds turnguard's hooks already
    (``None``: it does not, it is this one, or it cannot be read). The agent runs the hooks of
    both, so each event would reach turnguard twice."""
    spec = AGENT_HOOKS[agent]
    other = Scope.USER if scope is Scope.PROJECT else Scope.PROJECT
    path = agent_folder(spec, other, environ, cwd) / spec.file
    if _target(path) == _target(agent_folder(spec, scope, environ, cwd) / spec.file):
        return None
    try:
        text = _read(path)
        return path if text is not None and contains_turnguard(parse_settings(text, path)) else None
    except SettingsError:
        return None


def hooks_switched_off(agent: str, *, environ: Mapping[str, str], cwd: Path) -> tuple[Path, str] | None:
    """The settings file whose setting switches all of the agent's hooks off, turnguard's included,
    with the setting as written there (``None``: the hooks run). The nearest file that sets it
    decides: the project's local file, the project's, the user's (a file that cannot be read sets
    nothing). Install writes the hooks all the same and says so: the agent would never run them."""
    spec = AGENT_HOOKS[agent]
    if spec.off_switch is None:
        return None
    keys, off = spec.off_switch
    project, user = (agent_folder(spec, s, environ, cwd) for s in (Scope.PROJECT, Scope.USER))
    nearest = [project / name for name in (spec.local_file, spec.file) if name] + [user / spec.file]
    for path in dict.fromkeys(map(_target, nearest)):
        try:
            text = _read(path)
            value: Any = parse_settings(text, path) if text is not None else None
        except SettingsError:
            continue
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            return (path, f"{'.'.join(keys)}: {json.dumps(off)}") if value is off else None
    return None


def _restored(spec: AgentHooks, before: str, backup: Backup, path: Path) -> tuple[str | None, str]:
    """The settings file after uninstall, given its backup: the original bytes when nothing but
    turnguard's entries changed since; else the current settings without turnguard's entries."""
    stripped = remove_hooks(parse_settings(before, path))
    if backup.content is None:
        if not stripped:
            return None, "removed (there was no file before install)"
        return render_settings(stripped, before), "took out turnguard's hooks; kept your other settings"
    original = parse_settings(backup.content, backup_path(path))
    as_installed = remove_hooks(install_hooks(original, spec, hook_command(spec.agent), path))
    if not contains_turnguard(original) and _canonical(stripped) == _canonical(as_installed):
        return backup.content, "restored as it was before install"
    return render_settings(stripped, before), "took out turnguard's hooks; kept your other changes"


def _uninstall_settings(path: Path, spec: AgentHooks) -> Change:
    before = _read(path)
    backup = read_backup(path)
    if backup is None:
        if before is None:
            return Change(path, None, None, "no file; nothing to take out")
        settings = parse_settings(before, path)
        if not contains_turnguard(settings):
            return Change(path, before, before, "no turnguard hooks; nothing changed")
        return Change(path, before, render_settings(remove_hooks(settings), before),
                      "took out turnguard's hooks (there was no backup to restore)")
    made = tuple(Path(d) for d in backup.made_dirs)
    if before is None:
        return Change(path, None, None, "the file is gone since install; dropped its backup", drop_backup=True,
                      remove_dirs=made)
    after, what = _restored(spec, before, backup, path)
    return Change(path, before, after, what, drop_backup=True, remove_dirs=made if after is None else ())


def _uninstall_feature(path: Path) -> Change:
    before = _read(path)
    backup = read_backup(path)
    if backup is None or backup.feature is None:
        if before is not None:
            _parse_toml(before, path)
        return Change(path, before, before, "install did not change it; left as it is")
    made = tuple(Path(d) for d in backup.made_dirs)
    if before is None:
        return Change(path, None, None, "the file is gone since install; dropped its backup", drop_backup=True,
                      remove_dirs=made)
    _parse_toml(before, path)
    if before == enable_hooks_feature(backup.content or "", backup_path(path))[0]:
        what = "restored as it was before install" if backup.content is not None \
            else "removed (there was no file before install)"
        return Change(path, before, backup.content, what, drop_backup=True,
                      remove_dirs=made if backup.content is None else ())
    undone = disable_hooks_feature(before, backup.feature, path)
    if undone is None:
        return Change(path, before, before, "[features] hooks was changed since install: it is yours now, left as "
                                            "it is", drop_backup=True)
    return Change(path, before, undone, "took out hooks = true; kept your other changes", drop_backup=True)


def plan_uninstall(agent: str, scope: Scope, *, environ: Mapping[str, str], cwd: Path) -> tuple[Change, ...]:
    """What ``turnguard uninstall AGENT`` changes, file by file; raises ``SettingsError`` before any write."""
    spec = AGENT_HOOKS[agent]
    folder = agent_folder(spec, scope, environ, cwd)
    changes = [_uninstall_settings(folder / spec.file, spec)]
    if spec.feature_flag:
        changes.append(_uninstall_feature(folder / "config.toml"))
    return tuple(changes)


def apply(change: Change) -> None:
    """Write one planned change: the backup first, then the file, then what uninstall leaves behind."""
    if not change.writes:
        return
    for folder in change.make_dirs:
        folder.mkdir(exist_ok=True)
    if change.backup is not None:
        write_atomically(backup_path(change.path), change.backup)
    if change.after is None:
        _target(change.path).unlink(missing_ok=True)
    elif change.after != change.before:
        write_atomically(change.path, change.after)
    if change.drop_backup:
        backup_path(change.path).unlink(missing_ok=True)
    for folder in reversed(change.remove_dirs):
        with suppress(OSError):
            folder.rmdir()


# -- the commands ---------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent", choices=AGENTS, metavar="AGENT", help=f"the coding agent: {', '.join(AGENTS)}")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--project", dest="scope", action="store_const", const=Scope.PROJECT.value,
                       help="the current project's settings: .claude/, .codex/ or .gemini/ here (the default)")
    where.add_argument("--user", dest="scope", action="store_const", const=Scope.USER.value,
                       help="the user's settings: $CLAUDE_CONFIG_DIR or ~/.claude, $CODEX_HOME or ~/.codex, "
                            "~/.gemini")
    parser.set_defaults(scope=Scope.PROJECT.value)
    from turnguard._terminal import add_wide_argument

    add_wide_argument(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the changes as a diff and write nothing")


def install_arguments(parser: argparse.ArgumentParser) -> None:
    _arguments(parser)


def uninstall_arguments(parser: argparse.ArgumentParser) -> None:
    _arguments(parser)


def _shown(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def _diff(change: Change, cwd: Path) -> Iterator[str]:
    name = _shown(change.path, cwd)
    before = [] if change.before is None else change.before.splitlines(keepends=True)
    after = [] if change.after is None else change.after.splitlines(keepends=True)
    for line in difflib.unified_diff(before, after, "/dev/null" if change.before is None else name,
                                     "/dev/null" if change.after is None else name):
        yield line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def _say(text: str, wide: bool = False) -> None:
    """A line of what was done, wrapped to the terminal (at least 80 columns; not with ``--wide``),
    paths unbroken."""
    from turnguard._terminal import output_width

    print(textwrap.fill(text, width=output_width(wide), subsequent_indent="  ", break_long_words=False,
                        break_on_hyphens=False))


def _dry_run(verb: str, changes: tuple[Change, ...], cwd: Path, wide: bool) -> None:
    for change in changes:
        shown = _shown(change.path, cwd)
        if change.before == change.after:
            _say(f"turnguard {verb}: {shown}: {change.what} (dry run)", wide)
            continue
        doing = "would remove" if change.after is None else "would write"
        _say(f"turnguard {verb}: {doing} {shown}: {change.what}", wide)
        sys.stdout.write("".join(_diff(change, cwd)))
    _say(f"turnguard {verb}: dry run, nothing written", wide)


def _run(verb: str, args: argparse.Namespace, plan: Callable[..., tuple[Change, ...]]) -> int:
    cwd = Path.cwd()
    try:
        changes = plan(args.agent, Scope(args.scope), environ=os.environ, cwd=cwd)
    except SettingsError as exc:
        print(f"turnguard {verb}: {_shown(exc.path, cwd)}: {exc.reason}", file=sys.stderr)
        return 2
    if verb == "install":
        _say_if_installed_elsewhere(args, cwd)
        _say_if_hooks_switched_off(args, cwd)
    if args.dry_run:
        _dry_run(verb, changes, cwd, args.wide)
        return 0
    for change in changes:
        try:
            apply(change)
        except OSError as exc:
            print(f"turnguard {verb}: {_shown(change.path, cwd)}: cannot write it: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
        _say(f"turnguard {verb}: {_shown(change.path, cwd)}: {change.what}", args.wide)
    spec = AGENT_HOOKS[args.agent]
    if verb == "install" and any(c.before != c.after for c in changes):
        notes = (spec.trust, spec.project_trust if args.scope == Scope.PROJECT.value else "")
        for note in filter(None, notes):
            _say(f"turnguard install: note: {note}", args.wide)
    return 0


def _say_if_installed_elsewhere(args: argparse.Namespace, cwd: Path) -> None:
    other = installed_elsewhere(args.agent, Scope(args.scope), environ=os.environ, cwd=cwd)
    if other is not None:
        flag = "--user" if args.scope == Scope.PROJECT.value else "--project"
        _say(f"turnguard install: note: {_shown(other, cwd)} has turnguard's hooks too, and {args.agent} runs "
             f"both: keep one (turnguard uninstall {args.agent} {flag}); a call reported twice without a call "
             f"id (Gemini CLI sends none) counts twice", args.wide)


def _say_if_hooks_switched_off(args: argparse.Namespace, cwd: Path) -> None:
    found = hooks_switched_off(args.agent, environ=os.environ, cwd=cwd)
    if found is not None:
        path, setting = found
        _say(f"turnguard install: note: {_shown(path, cwd)} sets {setting}: {args.agent} runs no hooks at all, "
             f"turnguard's included, until it is taken out", args.wide)


def run_install(args: argparse.Namespace) -> int:
    """``turnguard install AGENT``: merge turnguard's hook entries into the agent's settings."""
    return _run("install", args, plan_install)


def run_uninstall(args: argparse.Namespace) -> int:
    """``turnguard uninstall AGENT``: take them out again, giving back the original when nothing else changed."""
    return _run("uninstall", args, plan_uninstall)
