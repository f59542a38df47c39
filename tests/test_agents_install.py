"""``turnguard install AGENT`` / ``uninstall AGENT``: turnguard's hooks merged into an agent's own
settings without disturbing anything else, written atomically, and taken out again so that an
untouched file gets its very bytes back."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shlex
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from turnguard.agents import install as ins

AGENTS = ins.AGENTS
EXE = "/opt/py/bin/python3"
VARS = ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "GEMINI_CLI_HOME")


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder as the current directory, and an empty home beside it."""
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(project)
    return tmp_path


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes without ``fsync``: durability is not what the tests of hundreds of random settings test."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def cli(capsys: pytest.CaptureFixture[str], verb: str, *argv: str) -> tuple[int, str, str]:
    """The command through its real argparse path: the subcommand's ``arguments``, then ``run``."""
    parser = argparse.ArgumentParser(prog=f"turnguard {verb}", allow_abbrev=False)
    (ins.install_arguments if verb == "install" else ins.uninstall_arguments)(parser)
    args = parser.parse_args(list(argv))
    status = (ins.run_install if verb == "install" else ins.run_uninstall)(args)
    out, err = capsys.readouterr()
    return status, out.replace("\n  ", " "), err  # (messages are wrapped to the terminal: unwrapped here)


def settings_file(agent: str, root: Path, scope: str = "project") -> Path:
    spec = ins.AGENT_HOOKS[agent]
    folder = root / "project" / spec.folder if scope == "project" else root / "home" / spec.folder
    return folder / spec.file


def project_settings(root: Path, agent: str) -> Path:
    """The agent's project settings file under ``root``."""
    return root / ins.AGENT_HOOKS[agent].folder / ins.AGENT_HOOKS[agent].file


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def turnguard_commands(settings: dict[str, Any]) -> list[tuple[str, str]]:
    return [(event, handler["command"]) for event, groups in settings.get("hooks", {}).items()
            if isinstance(groups, list) for group in groups for handler in group.get("hooks", [])
            if ins.is_turnguard_command(handler.get("command"))]


# -- what is installed ----------------------------------------------------------------------------


def test_the_command_names_this_interpreter_and_is_recognised_however_it_is_spelled() -> None:
    client = str(Path(ins.__file__).with_name("client.py"))
    launcher = ins.LAUNCHER.replace("{client}", json.dumps(client))
    assert ins.hook_command("codex", "/a b/python") == shlex.join(["/a b/python", "-S", "-P", "-c", launcher, "codex"])
    assert shlex.split(ins.hook_command("gemini"))[:2] == [sys.executable, "-S"]
    for command in ("'/a b/python' -m turnguard hook codex", "turnguard hook gemini", "/usr/bin/turnguard hook x",
                    "python3 -m turnguard hook claude-code", ins.hook_command("codex", "/a b/python"),
                    "/usr/bin/python3 -S '/x y/site-packages/turnguard/agents/client.py' gemini"):
        assert ins.is_turnguard_command(command), command
    for command in ("turnguard-hook", "echo myturnguard hook", "turnguard hooks", "turnguard demo", None, 3):
        assert not ins.is_turnguard_command(command), command


@pytest.mark.parametrize("agent", AGENTS)
def test_install_into_a_project_without_settings_then_uninstall_leaves_nothing(where, capsys, agent) -> None:
    before = files_under(where)
    status, out, err = cli(capsys, "install", agent)
    assert (status, err) == (0, "")
    path = settings_file(agent, where)
    settings = json.loads(path.read_text())
    spec = ins.AGENT_HOOKS[agent]
    assert list(settings["hooks"]) == [e.name for e in spec.events]
    for event in spec.events:
        (group,) = settings["hooks"][event.name]
        assert group.get("matcher") == event.matcher
        assert group["hooks"] == [{"type": "command", "command": ins.hook_command(agent), "timeout": spec.timeout}]
    assert path.read_text().startswith('{\n  "hooks": {\n') and path.read_text().endswith("}\n")
    assert f"{spec.folder}/{spec.file}: added turnguard's hooks" in out
    assert cli(capsys, "uninstall", agent)[0] == 0
    assert files_under(where) == before
    assert not (where / "project" / spec.folder).exists()


def test_the_timeouts_are_in_each_agents_unit() -> None:
    assert ins.AGENT_HOOKS["claude-code"].timeout == 30  # seconds
    assert ins.AGENT_HOOKS["codex"].timeout == 30  # seconds
    assert ins.AGENT_HOOKS["gemini"].timeout == 30_000  # milliseconds
    gemini_tools = [e.matcher for e in ins.AGENT_HOOKS["gemini"].events if e.matcher]
    assert gemini_tools == [".*", ".*"]


@pytest.mark.parametrize(("agent", "variable", "expected"), [
    ("claude-code", "CLAUDE_CONFIG_DIR", "cfg/settings.json"),
    ("codex", "CODEX_HOME", "cfg/hooks.json"),
    ("gemini", "GEMINI_CLI_HOME", "cfg/.gemini/settings.json"),
])
def test_user_scope_follows_the_variable_each_agent_reads(where, capsys, monkeypatch, agent, variable,
                                                          expected) -> None:
    assert cli(capsys, "install", agent, "--user")[0] == 0
    assert settings_file(agent, where, "user").is_file()
    monkeypatch.setenv(variable, str(where / "cfg"))
    assert cli(capsys, "install", agent, "--user")[0] == 0
    assert (where / expected).is_file()
    assert not (where / "project" / ins.AGENT_HOOKS[agent].folder).exists()


def test_project_and_user_are_one_choice_and_project_is_the_default(capsys) -> None:
    parser = argparse.ArgumentParser()
    ins.install_arguments(parser)
    assert parser.parse_args(["codex"]).scope == "project"
    assert parser.parse_args(["codex", "--user"]).scope == "user"
    with pytest.raises(SystemExit):
        parser.parse_args(["codex", "--user", "--project"])
    with pytest.raises(SystemExit):
        parser.parse_args(["cursor"])
    capsys.readouterr()


# -- merging --------------------------------------------------------------------------------------


USER_SETTINGS = {
    "model": "opus",
    "hooks": {
        "Notification": [{"hooks": [{"type": "command", "command": "notify-send hi"}]}],
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./check.sh", "timeout": 5}]}],
    },
    "permissions": {"allow": ["Bash(ls:*)"]},
    "env": {"GREETING": "grüß dich"},
}


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("first", ["--user", "--project"])
def test_install_says_when_the_other_scope_has_turnguards_hooks_already(where, capsys, agent, first) -> None:
    """The agents run the hooks of every settings layer: installed in both, each event reaches
    turnguard twice. Install says so (also as a dry run), and stops saying it once one is removed."""
    second = "--project" if first == "--user" else "--user"
    other = settings_file(agent, where, first.removeprefix("--"))
    assert cli(capsys, "install", agent, first)[0] == 0
    for dry in ([], ["--dry-run"]):
        status, out, _ = cli(capsys, "install", agent, second, *dry)
        assert status == 0 and f"has turnguard's hooks too, and {agent} runs both" in out
        assert other.name in out and f"turnguard uninstall {agent} {first}" in out
    assert "runs both" in cli(capsys, "install", agent, first)[1]  # (installed there already: the other has it too)
    assert cli(capsys, "uninstall", agent, first)[0] == 0
    assert "runs both" not in cli(capsys, "install", agent, second)[1]


def test_install_in_the_home_folder_is_one_settings_file_for_both_scopes(where, capsys, monkeypatch) -> None:
    monkeypatch.chdir(where / "home")
    assert cli(capsys, "install", "claude-code", "--user")[0] == 0
    status, out, _ = cli(capsys, "install", "claude-code", "--project")
    assert status == 0 and "runs both" not in out


def test_install_keeps_the_users_hooks_of_the_same_and_other_events_and_their_settings(where, capsys) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    path.write_text(json.dumps(USER_SETTINGS, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert cli(capsys, "install", "claude-code")[0] == 0
    settings = json.loads(path.read_text(encoding="utf-8"))
    assert list(settings) == ["model", "hooks", "permissions", "env"]
    assert {k: settings[k] for k in ("model", "permissions", "env")} == {
        k: USER_SETTINGS[k] for k in ("model", "permissions", "env")}
    hooks = settings["hooks"]
    assert list(hooks)[:2] == ["Notification", "PreToolUse"]
    assert hooks["Notification"] == USER_SETTINGS["hooks"]["Notification"]
    assert hooks["PreToolUse"][0] == USER_SETTINGS["hooks"]["PreToolUse"][0]
    assert hooks["PreToolUse"][1]["matcher"] == "*"
    assert len(turnguard_commands(settings)) == len(ins.AGENT_HOOKS["claude-code"].events)
    assert "grüß dich" in path.read_text(encoding="utf-8")


def test_an_old_turnguard_entry_is_replaced_where_it_stands(where, capsys) -> None:
    old = {"type": "command", "command": "turnguard hook claude-code", "timeout": 9}
    settings = {"hooks": {
        "PreToolUse": [{"matcher": "*", "hooks": [old]}, {"matcher": "Bash", "hooks": [{"command": "mine"}]}],
        "Stop": [{"hooks": [{"command": "before"}, old, {"command": "after"}]}],
        "Notification": [{"hooks": [old]}],
    }}
    result = ins.install_hooks(settings, ins.AGENT_HOOKS["claude-code"], "NEW -m turnguard hook claude-code")
    pre = result["hooks"]["PreToolUse"]
    assert pre[0]["hooks"][0]["command"] == "NEW -m turnguard hook claude-code"
    assert pre[1] == {"matcher": "Bash", "hooks": [{"command": "mine"}]}
    assert result["hooks"]["Stop"][0]["hooks"][0]["command"] == "NEW -m turnguard hook claude-code"
    assert result["hooks"]["Stop"][1] == {"hooks": [{"command": "before"}, {"command": "after"}]}
    assert "Notification" not in result["hooks"]  # an event turnguard no longer answers
    assert len(turnguard_commands(result)) == len(ins.AGENT_HOOKS["claude-code"].events)
    assert settings["hooks"]["PreToolUse"][0]["hooks"] == [old]  # the input is not changed
    assert ins.install_hooks(result, ins.AGENT_HOOKS["claude-code"], "NEW -m turnguard hook claude-code") == result


@pytest.mark.parametrize("agent", AGENTS)
def test_a_second_install_changes_nothing_byte_for_byte(where, capsys, agent) -> None:
    path = settings_file(agent, where)
    path.parent.mkdir()
    path.write_text(json.dumps(USER_SETTINGS, indent=4) + "\n")
    if agent == "codex":
        (path.parent / "config.toml").write_text('model = "o3"\n')
    assert cli(capsys, "install", agent)[0] == 0
    first = files_under(where)
    status, out, _ = cli(capsys, "install", agent)
    assert status == 0 and "nothing changed" in out
    assert files_under(where) == first
    assert path.read_text().startswith('{\n    "model"')  # the file's own indentation


# -- uninstall ------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("text", [
    '{"model":"opus","hooks":{"PreToolUse":[{"matcher":"Bash","hooks":[{"type":"command","command":"x"}]}]}}',
    '{\r\n\t"hooks": {},\r\n\t"b": [1.5e+300, -0.0, "\\u00e9"]\r\n}\r\n',
    "{}",
    '{ "hooks": { "Stop": [] } }\n\n',
])
def test_uninstall_gives_back_the_very_bytes_that_were_there(where, capsys, agent, text) -> None:
    path = settings_file(agent, where, "user")
    path.parent.mkdir()
    path.write_bytes(text.encode())
    os.chmod(path, 0o640)
    assert cli(capsys, "install", agent, "--user")[0] == 0
    assert cli(capsys, "install", agent, "--user")[0] == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    status, out, _ = cli(capsys, "uninstall", agent, "--user")
    assert status == 0 and "restored as it was before install" in out
    assert path.read_bytes() == text.encode()
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_a_reinstall_with_another_interpreter_still_restores_the_original(where, capsys, monkeypatch) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    path.write_text('{"model": "opus"}')
    assert cli(capsys, "install", "claude-code")[0] == 0
    monkeypatch.setattr(ins.sys, "executable", "/elsewhere/python")
    assert cli(capsys, "install", "claude-code")[0] == 0
    assert ("UserPromptSubmit", ins.hook_command("claude-code", "/elsewhere/python")) in turnguard_commands(
        json.loads(path.read_text()))
    assert cli(capsys, "uninstall", "claude-code")[0] == 0
    assert path.read_text() == '{"model": "opus"}'


def test_the_users_edits_after_install_survive_uninstall(where, capsys) -> None:
    path = settings_file("gemini", where)
    path.parent.mkdir()
    path.write_text(json.dumps(USER_SETTINGS) + "\n")
    assert cli(capsys, "install", "gemini")[0] == 0
    edited = json.loads(path.read_text())
    edited["hooks"]["BeforeTool"].append({"matcher": "run_shell_command", "hooks": [{"command": "audit"}]})
    edited["theme"] = "dark"
    path.write_text(json.dumps(edited, indent=2) + "\n")
    status, out, _ = cli(capsys, "uninstall", "gemini")
    assert status == 0 and "kept your other changes" in out
    expected = json.loads(json.dumps(USER_SETTINGS))
    expected["hooks"]["BeforeTool"] = [{"matcher": "run_shell_command", "hooks": [{"command": "audit"}]}]
    expected["theme"] = "dark"
    assert json.loads(path.read_text()) == expected
    assert list(json.loads(path.read_text())["hooks"]) == ["Notification", "PreToolUse", "BeforeTool"]
    assert not ins.backup_path(path).exists()


def test_a_file_created_by_install_and_then_edited_by_the_user_stays(where, capsys) -> None:
    path = settings_file("claude-code", where)
    assert cli(capsys, "install", "claude-code")[0] == 0
    settings = json.loads(path.read_text())
    settings["model"] = "sonnet"
    path.write_text(json.dumps(settings))
    assert cli(capsys, "uninstall", "claude-code")[0] == 0
    assert json.loads(path.read_text()) == {"model": "sonnet"}


def test_uninstall_without_a_backup_takes_out_only_turnguards_entries(where, capsys) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    settings = ins.install_hooks(USER_SETTINGS, ins.AGENT_HOOKS["claude-code"], "turnguard hook claude-code")
    path.write_text(json.dumps(settings))
    status, out, _ = cli(capsys, "uninstall", "claude-code")
    assert status == 0 and "no backup" in out
    assert json.loads(path.read_text()) == USER_SETTINGS
    text = path.read_text()
    assert cli(capsys, "uninstall", "claude-code")[:2] == (0, "turnguard uninstall: .claude/settings.json: no "
                                                              "turnguard hooks; nothing changed\n")
    assert path.read_text() == text


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "said"), [
    ('{"model": "opus",}', "is not valid JSON"),
    ('{\n  // why: reviewed\n  "model": "opus"\n}\n', "has comments"),
    ('{"a": 1, /* no */ "b": 2}', "has comments"),
    ("[1, 2]", "is not a JSON object"),
    ('{"a": 1, "a": 2}', "appears twice"),
    ('{"a": NaN}', "NaN is not JSON"),
    ('{"hooks": [1]}', '"hooks" is not a JSON object'),
    ('{"hooks": {"Stop": {"x": 1}}}', '"hooks.Stop" is not a JSON array'),
    ("", "is not valid JSON"),
    (b"\xff\xfe{}", "is not UTF-8"),
])
def test_a_file_turnguard_cannot_write_back_whole_is_refused_untouched(where, capsys, text, said) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    data = text if isinstance(text, bytes) else text.encode()
    path.write_bytes(data)
    before = files_under(where)
    for verb in ("install", "uninstall"):
        status, out, err = cli(capsys, verb, "claude-code")
        if verb == "uninstall" and said.startswith('"hooks'):
            continue  # uninstall has no hooks of turnguard's to find there, and changes nothing
        assert (status, out) == (2, "")
        assert err.startswith(f"turnguard {verb}: .claude/settings.json: ") and said in err
        assert err.count("\n") == 1
    assert files_under(where) == before


@pytest.mark.parametrize("content", ["my notes\n", "[" * 200_000 + "]" * 200_000],
                         ids=["not JSON", "nested deeper than the parser goes"])
def test_a_backup_that_is_not_turnguards_is_refused(where, capsys, content) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    ins.backup_path(path).write_text(content)
    status, _, err = cli(capsys, "install", "claude-code")
    assert status == 2 and "is not a backup turnguard wrote" in err
    assert not path.exists()


# -- dry run and atomic writes --------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_dry_run_prints_the_diff_and_writes_nothing(where, capsys, agent) -> None:
    path = settings_file(agent, where)
    path.parent.mkdir()
    path.write_text('{"model": "opus"}\n')
    before = files_under(where)
    status, out, _ = cli(capsys, "install", agent, "--dry-run")
    assert status == 0
    assert f"+++ {ins.AGENT_HOOKS[agent].folder}/{ins.AGENT_HOOKS[agent].file}" in out
    assert '-{"model": "opus"}' in out and "+  \"model\": \"opus\"," in out
    assert out.endswith("dry run, nothing written\n")
    assert files_under(where) == before
    assert cli(capsys, "install", agent)[0] == 0
    installed = files_under(where)
    status, out, _ = cli(capsys, "uninstall", agent, "--dry-run")
    assert status == 0 and "would write" in out and '+{"model": "opus"}' in out
    assert files_under(where) == installed


def test_no_temporary_file_is_left_and_a_link_stays_a_link(where, capsys) -> None:
    dotfiles = where / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "claude.json").write_text("{}")
    path = settings_file("claude-code", where, "user")
    path.parent.mkdir()
    path.symlink_to(dotfiles / "claude.json")
    assert cli(capsys, "install", "claude-code", "--user")[0] == 0
    assert path.is_symlink() and turnguard_commands(json.loads(path.read_text()))
    assert sorted(os.listdir(dotfiles)) == ["claude.json"]
    assert sorted(os.listdir(path.parent)) == ["settings.json", "settings.json.turnguard-backup"]
    assert cli(capsys, "uninstall", "claude-code", "--user")[0] == 0
    assert path.is_symlink() and (dotfiles / "claude.json").read_text() == "{}"


def test_a_failure_in_os_replace_leaves_the_original_intact(where, capsys, monkeypatch) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    path.write_text('{"model": "opus"}')
    real_replace = os.replace

    def failing(src: str, dst: str | Path) -> None:
        if Path(dst).name == "settings.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(ins.os, "replace", failing)
    status, out, err = cli(capsys, "install", "claude-code")
    assert status == 1 and out == ""
    assert err == "turnguard install: .claude/settings.json: cannot write it: No space left on device\n"
    assert path.read_text() == '{"model": "opus"}'
    assert sorted(os.listdir(path.parent)) == ["settings.json", "settings.json.turnguard-backup"]
    monkeypatch.setattr(ins.os, "replace", real_replace)
    assert cli(capsys, "uninstall", "claude-code")[0] == 0
    assert sorted(os.listdir(path.parent)) == ["settings.json"]
    assert path.read_text() == '{"model": "opus"}'


def test_write_atomically_keeps_the_mode_and_makes_new_files_by_the_umask(tmp_path) -> None:
    path = tmp_path / "f.json"
    ins.write_atomically(path, "{}\n")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    os.chmod(path, 0o600)
    ins.write_atomically(path, "{}\n\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["f.json"]


# -- Codex's config.toml --------------------------------------------------------------------------


CONFIG = """\
# my Codex
model = "o3"  # the one I like

[features]
# experiments
web_search = true

[projects."/src/app"]
trust_level = "trusted"
"""


@pytest.mark.parametrize(("original", "expected"), [
    (CONFIG, CONFIG.replace("[features]\n", "[features]\nhooks = true\n")),
    (CONFIG.replace("web_search = true", "hooks = false  # off for now"), CONFIG.replace("web_search", "hooks")),
    ('model = "o3"', 'model = "o3"\n\n[features]\nhooks = true\n'),
    ('model = "o3"\n', 'model = "o3"\n\n[features]\nhooks = true\n'),
    ("", "[features]\nhooks = true\n"),
    (None, "[features]\nhooks = true\n"),
    ('a = 1\r\n[features]\r\n  "hooks" = false\r\n', 'a = 1\r\n[features]\r\n  hooks = true\r\n'),
])
def test_the_hooks_feature_is_set_and_uninstall_gives_back_the_bytes(where, capsys, original, expected) -> None:
    folder = where / "home" / ".codex"
    config = folder / "config.toml"
    if original is not None:
        folder.mkdir()
        config.write_bytes(original.encode())
    status, out, _ = cli(capsys, "install", "codex", "--user")
    assert status == 0 and "hooks = true under [features]" in out
    assert config.read_bytes() == expected.encode()
    assert tomllib.loads(expected)["features"]["hooks"] is True
    assert cli(capsys, "install", "codex", "--user")[0] == 0
    assert config.read_bytes() == expected.encode()
    assert cli(capsys, "uninstall", "codex", "--user")[0] == 0
    if original is None:
        assert not folder.exists()
    else:
        assert config.read_bytes() == original.encode()
        assert sorted(os.listdir(folder)) == ["config.toml"]


def test_a_feature_already_on_is_left_alone_and_stays_on_after_uninstall(where, capsys) -> None:
    folder = where / "project" / ".codex"
    folder.mkdir()
    text = "[features]\nhooks = true\n"
    (folder / "config.toml").write_text(text)
    status, out, _ = cli(capsys, "install", "codex")
    assert status == 0 and "hooks is true already" in out
    assert "trusted project" in out  # the note for a project's .codex/
    assert not ins.backup_path(folder / "config.toml").exists()
    assert cli(capsys, "uninstall", "codex")[0] == 0
    assert (folder / "config.toml").read_text() == text
    assert sorted(os.listdir(folder)) == ["config.toml"]


def test_the_users_config_changes_after_install_survive_uninstall(where, capsys) -> None:
    config = where / "home" / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    assert cli(capsys, "install", "codex", "--user")[0] == 0
    config.write_text(config.read_text() + '\n[mcp_servers.docs]\ncommand = "docs-mcp"\n')
    status, out, _ = cli(capsys, "uninstall", "codex", "--user")
    assert status == 0 and "took out hooks = true" in out
    assert config.read_text() == CONFIG + '\n[mcp_servers.docs]\ncommand = "docs-mcp"\n'


def test_an_appended_features_table_the_user_added_to_keeps_their_key(where, capsys) -> None:
    config = where / "home" / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('model = "o3"\n')
    assert cli(capsys, "install", "codex", "--user")[0] == 0
    config.write_text(config.read_text() + "web_search = true\n")
    assert cli(capsys, "uninstall", "codex", "--user")[0] == 0
    assert tomllib.loads(config.read_text()) == {"model": "o3", "features": {"web_search": True}}


def test_a_hooks_feature_the_user_changed_after_install_is_theirs(where, capsys) -> None:
    config = where / "home" / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    assert cli(capsys, "install", "codex", "--user")[0] == 0
    mine = config.read_text().replace("hooks = true", "hooks = false")
    config.write_text(mine)
    status, out, _ = cli(capsys, "uninstall", "codex", "--user")
    assert status == 0 and "it is yours now" in out
    assert config.read_text() == mine
    assert not ins.backup_path(config).exists()


@pytest.mark.parametrize(("text", "said"), [
    ("model = \n", "is not valid TOML"),
    ("features.hooks = false\n", "add it by hand"),
    ("features = { web_search = true }\n", "add it by hand"),
    ("features = 3\n", '"features" is not a table'),
])
def test_a_config_turnguard_cannot_edit_safely_is_refused_and_nothing_is_written(where, capsys, text, said) -> None:
    config = where / "home" / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(text)
    before = files_under(where)
    status, out, err = cli(capsys, "install", "codex", "--user")
    assert (status, out) == (2, "") and said in err and err.count("\n") == 1
    assert files_under(where) == before  # not even hooks.json


def test_enable_and_disable_are_pure_and_checked_by_parsing() -> None:
    text, edit = ins.enable_hooks_feature(CONFIG)
    assert edit == ins.FeatureEdit("hooks = true")
    assert ins.disable_hooks_feature(text, edit) == CONFIG
    assert ins.enable_hooks_feature(text) == (text, None)
    assert ins.disable_hooks_feature(CONFIG, edit) is None  # no line of turnguard's there


# -- properties over random settings --------------------------------------------------------------


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return rng.choice([0.5, -1e300, 3.14159, 1e-7])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return "".join(rng.choice("ab é\"\\/\n日𝄞") for _ in range(rng.randrange(6)))
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{rng.randrange(9)}{i}": random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def random_hooks(rng: random.Random, agent: str) -> dict[str, Any]:
    names = [e.name for e in ins.AGENT_HOOKS[agent].events] + ["Notification", "PreCompact", "SessionStart"]
    hooks: dict[str, Any] = {}
    for name in rng.sample(names, rng.randrange(len(names))):
        groups = []
        for _ in range(rng.randrange(3)):
            handlers = [{"type": "command", "command": rng.choice(["./a.sh", "make lint", "echo 'turnguard'"]),
                         **({"timeout": rng.randrange(100)} if rng.random() < 0.5 else {})}
                        for _ in range(rng.randrange(3))]
            group: dict[str, Any] = {"hooks": handlers}
            if rng.random() < 0.5:
                group = {"matcher": rng.choice(["Bash", "*", ".*", "Edit|Write"]), **group}
            groups.append(group)
        hooks[name] = groups
    if agent == "gemini" and rng.random() < 0.3:
        hooks["enabled"] = True
    return hooks


def random_settings(rng: random.Random, agent: str) -> dict[str, Any]:
    settings = {f"s{i}": random_value(rng) for i in range(rng.randrange(5))}
    if rng.random() < 0.8:
        settings["hooks"] = random_hooks(rng, agent)
        items = list(settings.items())
        rng.shuffle(items)
        settings = dict(items)
    return settings


def random_text(rng: random.Random, settings: dict[str, Any]) -> str:
    indent = rng.choice([None, 2, 4, "\t"])
    text = json.dumps(settings, indent=indent, ensure_ascii=rng.random() < 0.5)
    return text + rng.choice(["", "\n", "\n\n"])


def without_empty_hooks(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without empty event lists and an empty hooks table (which uninstall may drop)."""
    result = json.loads(json.dumps(settings))
    hooks = result.get("hooks")
    if isinstance(hooks, dict):
        for name in [n for n, groups in hooks.items() if groups == []]:
            del hooks[name]
        if not hooks:
            del result["hooks"]
    return result


@pytest.mark.parametrize("seed", range(3))
def test_install_then_uninstall_is_the_identity_and_install_twice_is_install_once(tmp_path, no_fsync,
                                                                                   seed) -> None:
    rng = random.Random(seed)
    for case in range(120):
        agent = AGENTS[case % len(AGENTS)]
        root = tmp_path / f"case{case}"
        path = project_settings(root, agent)
        settings = random_settings(rng, agent)
        text = random_text(rng, settings)
        exists = rng.random() < 0.9
        if exists:
            path.parent.mkdir(parents=True)
            path.write_text(text, encoding="utf-8")
        else:
            root.mkdir()
        plan = {"environ": {"HOME": str(root / "home")}, "cwd": root}
        for change in ins.plan_install(agent, ins.Scope.PROJECT, executable="/x y/python", **plan):
            ins.apply(change)
        installed = files_under(root)
        merged = json.loads(path.read_text(encoding="utf-8"))
        assert len(turnguard_commands(merged)) == len(ins.AGENT_HOOKS[agent].events)
        assert not any(c.writes for c in ins.plan_install(agent, ins.Scope.PROJECT, executable="/x y/python", **plan))
        assert files_under(root) == installed
        assert without_empty_hooks(ins.remove_hooks(merged)) == without_empty_hooks(settings if exists else {})
        for change in ins.plan_uninstall(agent, ins.Scope.PROJECT, **plan):
            ins.apply(change)
        if exists:
            assert files_under(root) == {str(path.relative_to(root)): text.encode("utf-8")}
        else:
            assert list(root.iterdir()) == []


@pytest.mark.parametrize("seed", range(2))
def test_the_users_edits_between_install_and_uninstall_are_kept(tmp_path, no_fsync, seed) -> None:
    rng = random.Random(100 + seed)
    for case in range(100):
        agent = AGENTS[case % len(AGENTS)]
        root = tmp_path / f"case{case}"
        path = project_settings(root, agent)
        settings = random_settings(rng, agent)
        path.parent.mkdir(parents=True)
        path.write_text(random_text(rng, settings), encoding="utf-8")
        plan = {"environ": {"HOME": str(root / "home")}, "cwd": root}
        for change in ins.plan_install(agent, ins.Scope.PROJECT, **plan):
            ins.apply(change)
        edited = json.loads(path.read_text(encoding="utf-8"))
        edit = {f"mine{case}": random_value(rng)}
        edited.update(edit)
        path.write_text(json.dumps(edited), encoding="utf-8")
        for change in ins.plan_uninstall(agent, ins.Scope.PROJECT, **plan):
            ins.apply(change)
        result = json.loads(path.read_text(encoding="utf-8"))
        assert without_empty_hooks(result) == without_empty_hooks({**settings, **edit})
        assert not ins.backup_path(path).exists()


@pytest.mark.parametrize("agent", AGENTS)
def test_install_hooks_exactly_the_events_the_agents_hook_reads(agent) -> None:
    import importlib

    from turnguard.agents.hook import PROTOCOLS

    kinds = importlib.import_module(PROTOCOLS[agent]).KINDS
    assert {e.name for e in ins.AGENT_HOOKS[agent].events} == set(kinds)


# -- settings reached through a link ----------------------------------------------------------------


def tree(root: Path) -> dict[str, str | bytes]:
    """Every file's bytes and every link's target under ``root`` (links not followed)."""
    found: dict[str, str | bytes] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
            elif path.is_file():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


LINKS = {
    "file link, target not made yet": ("file", False, True),
    "file link into a folder not made yet": ("file", False, False),
    "file link to an existing file": ("file", True, True),
    "folder link, folder not made yet": ("folder", False, False),
    "folder link to an existing folder": ("folder", True, True),
}
"""How the agent's settings can be a link (a dotfiles checkout): what is linked, whether the
target exists, whether its folder does."""


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("layout", list(LINKS))
@pytest.mark.parametrize("scope", ["project", "user"])
def test_a_linked_settings_file_is_written_through_its_link_and_uninstall_gives_back_the_tree(
        where, capsys, agent, layout, scope) -> None:
    linked, exists, folder_exists = LINKS[layout]
    path = settings_file(agent, where, scope)
    dotfiles = where / "dotfiles" / "sub"
    if folder_exists or exists:
        dotfiles.mkdir(parents=True)
    if linked == "file":
        path.parent.mkdir(parents=True, exist_ok=True)
        target = dotfiles / "agent.json"
        if exists:
            target.write_text('{"model": "opus"}\n')
        path.symlink_to(target)
    else:
        target = dotfiles / path.name
        if exists:
            target.write_text('{"model": "opus"}\n')
        path.parent.symlink_to(dotfiles, target_is_directory=True)
    before = tree(where)
    flags = ["--user"] if scope == "user" else []
    assert cli(capsys, "install", agent, *flags)[0] == 0
    assert path.is_symlink() or path.parent.is_symlink()
    assert len(turnguard_commands(json.loads(target.read_text()))) == len(ins.AGENT_HOOKS[agent].events)
    status, out, err = cli(capsys, "uninstall", agent, *flags)
    assert (status, err) == (0, "")
    assert tree(where) == before, out


# -- numbers and strings a strict JSON parser reads ----------------------------------------------------

STRICT_LITERALS = ["1e400", "-1e400", "1E+999", "-0.5e99999", "123456789012345678901234567890123", "1e-400",
                   '"\\ud800"', '"a\\udfffb"', '"\\uD83D"', '"\\ud83d\\ude00"', '{"\\udc00": 1}']
"""JSON a settings file may hold that Python reads into values ``json.dumps`` would not write back
as JSON (an overflowing number: ``Infinity``; a lone surrogate: not UTF-8)."""


def strict_json(data: bytes) -> Any:
    """``data`` read as a strict parser (Node's ``JSON.parse``) does: UTF-8, no ``Infinity`` or
    ``NaN``; a number too large for a float kept as its text."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(data.decode("utf-8"), parse_constant=refuse,
                      parse_float=lambda s: float(s) if abs(float(s)) != float("inf") else f"number {s}")


def literal_value(literal: str) -> Any:
    return strict_json(literal.encode())


def with_literals(rng: random.Random, agent: str, literals: list[str]) -> str:
    """Random settings text with each literal somewhere in it (a setting, in a list, in an object,
    a user's hook's timeout)."""
    settings = random_settings(rng, agent)
    for n, _ in enumerate(literals):
        place = rng.randrange(4)
        mark = f"@@literal{n}@@"
        if place == 0:
            settings[f"lit{n}"] = mark
        elif place == 1:
            settings[f"lit{n}"] = [1, mark, "x"]
        elif place == 2:
            settings[f"lit{n}"] = {"deep": {"er": mark}}
        else:
            hooks = settings.setdefault("hooks", {})
            hooks.setdefault("Notification", []).append({"hooks": [{"type": "command", "command": "./a.sh",
                                                                    "timeout": mark}]})
    text = random_text(rng, settings)
    for n, literal in enumerate(literals):
        text = text.replace(f'"@@literal{n}@@"', literal)
    return text


def values_of(literals: list[str]) -> list[Any]:
    return [literal_value(literal) for literal in literals]


def found_values(value: Any) -> list[Any]:
    """Every leaf of ``value``, keys included (where the literals can be)."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in (k, *found_values(v))]
    if isinstance(value, list):
        return [leaf for v in value for leaf in found_values(v)]
    return [value]


@pytest.mark.parametrize("seed", range(2))
def test_what_json_allows_is_written_back_as_json_with_the_same_values(tmp_path, no_fsync, seed) -> None:
    rng = random.Random(200 + seed)
    for case in range(60):
        agent = AGENTS[case % len(AGENTS)]
        literals = [STRICT_LITERALS[case % len(STRICT_LITERALS)], *rng.sample(STRICT_LITERALS, rng.randrange(3))]
        root = tmp_path / f"case{case}"
        path = project_settings(root, agent)
        path.parent.mkdir(parents=True)
        text = with_literals(rng, agent, literals)
        path.write_text(text, encoding="utf-8")
        original = strict_json(text.encode())
        plan = {"environ": {"HOME": str(root / "home")}, "cwd": root}
        for change in ins.plan_install(agent, ins.Scope.PROJECT, **plan):
            ins.apply(change)
        merged = strict_json(path.read_bytes())
        assert len(turnguard_commands(merged)) == len(ins.AGENT_HOOKS[agent].events)
        leaves = found_values(merged)
        assert all(any(v == leaf for leaf in leaves) for v in found_values(values_of(literals))), text
        assert without_empty_hooks(ins.remove_hooks(merged)) == without_empty_hooks(original)

        edited = path.read_text(encoding="utf-8").replace("{", '{"mine": true, ', 1)  # the user's edit
        path.write_text(edited, encoding="utf-8")
        for change in ins.plan_uninstall(agent, ins.Scope.PROJECT, **plan):
            ins.apply(change)
        assert without_empty_hooks(strict_json(path.read_bytes())) == without_empty_hooks({"mine": True, **original})
        path.write_text(text, encoding="utf-8")
        for verb in (ins.plan_install, ins.plan_uninstall):
            for change in verb(agent, ins.Scope.PROJECT, **plan):
                ins.apply(change)
        assert files_under(root) == {str(path.relative_to(root)): text.encode("utf-8")}


@pytest.mark.parametrize("literal", STRICT_LITERALS)
def test_the_cli_keeps_an_overflowing_number_or_a_lone_surrogate_as_json(where, capsys, literal) -> None:
    path = settings_file("claude-code", where)
    path.parent.mkdir()
    text = f'{{"x": {literal}}}\n'
    path.write_text(text)
    status, _, err = cli(capsys, "install", "claude-code")
    assert (status, err) == (0, "")
    assert strict_json(path.read_bytes())["x"] == literal_value(literal)
    assert cli(capsys, "uninstall", "claude-code")[0] == 0
    assert path.read_text() == text


# -- the user's own commands ------------------------------------------------------------------------

USERS_COMMANDS = [
    "logger 'turnguard hook fired'",
    'notify-send done; echo "see turnguard hook docs"',
    "echo turnguard hook codex",
    "turnguard hook codex | tee -a /tmp/log",
    "turnguard hook gemini && ./after.sh",
    "sh -c 'turnguard hook claude-code'",
    "FOO=1 turnguard hook codex",
    "/usr/bin/turnguard-wrapper hook codex",
    "python3 -m turnguard hook",
    "python3 -m turnguard demo codex",
    "python3 ./turnguard/agents/client.py.bak codex",
    "cat turnguard/agents/client.py",
    "# turnguard hook claude-code",
    "turnguard hook 'two words'",
]
"""Commands of the user's own that mention turnguard, its hook or its client, in no shape turnguard writes."""


def test_only_the_command_shapes_turnguard_writes_are_turnguards() -> None:
    rng = random.Random(7)
    for _ in range(200):
        exe = "".join(rng.choice("ab /'\"$é-_.") for _ in range(rng.randrange(1, 12))).strip() or "p"
        agent = rng.choice(AGENTS)
        assert ins.is_turnguard_command(ins.hook_command(agent, exe)), exe
        assert ins.is_turnguard_command(shlex.join([exe, "-m", "turnguard", "hook", agent])), exe
    for command in USERS_COMMANDS:
        assert not ins.is_turnguard_command(command), command


@pytest.mark.parametrize("agent", AGENTS)
def test_the_users_hooks_that_mention_turnguard_are_kept_by_install_and_uninstall(where, capsys, agent) -> None:
    spec = ins.AGENT_HOOKS[agent]
    events = [e.name for e in spec.events]
    hooks: dict[str, list[Any]] = {}
    for n, command in enumerate(USERS_COMMANDS):
        hooks.setdefault(events[n % len(events)], []).append({"hooks": [{"type": "command", "command": command}]})
    settings = {"hooks": hooks}
    path = settings_file(agent, where)
    path.parent.mkdir()
    text = json.dumps(settings, indent=2) + "\n"
    path.write_text(text)
    assert cli(capsys, "install", agent)[0] == 0
    merged = json.loads(path.read_text())
    commands = [h["command"] for groups in merged["hooks"].values() for g in groups for h in g["hooks"]]
    assert sorted(c for c in commands if c in USERS_COMMANDS) == sorted(USERS_COMMANDS)
    assert len(turnguard_commands(merged)) == len(spec.events)
    assert cli(capsys, "uninstall", agent)[0] == 0
    assert path.read_text() == text


OFF_SWITCHES = {agent: spec.off_switch for agent, spec in ins.AGENT_HOOKS.items() if spec.off_switch}


def _with_setting(keys: tuple[str, ...], value: object) -> dict[str, Any]:
    settings: dict[str, Any] = {keys[-1]: value}
    for key in reversed(keys[:-1]):
        settings = {key: settings}
    return settings


def _layer(root: Path, agent: str, layer: str) -> Path:
    spec = ins.AGENT_HOOKS[agent]
    if layer == "local":
        assert spec.local_file is not None
        return root / "project" / spec.folder / spec.local_file
    return settings_file(agent, root, layer)


def _layers(agent: str) -> list[str]:
    return (["local"] if ins.AGENT_HOOKS[agent].local_file else []) + ["project", "user"]


def test_the_off_switches_are_claude_codes_and_gemini_clis_own() -> None:
    assert OFF_SWITCHES == {"claude-code": (("disableAllHooks",), True), "gemini": (("hooksConfig", "enabled"), False)}


@pytest.mark.parametrize("agent", sorted(OFF_SWITCHES))
@pytest.mark.parametrize("scope", ["--project", "--user"])
def test_install_says_when_the_nearest_setting_switches_every_hook_off(where, capsys, agent, scope) -> None:
    """Every combination of layers setting the switch on, off or not at all: install writes the
    hooks either way, and names the nearest layer's setting exactly when that one switches them off."""
    keys, off = OFF_SWITCHES[agent]
    layers = _layers(agent)
    for values in itertools.product((None, off, not off), repeat=len(layers)):
        for layer in layers:
            _layer(where, agent, layer).unlink(missing_ok=True)
        for layer, value in zip(layers, values, strict=True):
            if value is not None:
                path = _layer(where, agent, layer)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"model": "x", **_with_setting(keys, value)}))
        for dry in ([], ["--dry-run"]):
            status, out, _ = cli(capsys, "install", agent, scope, *dry)
            deciding = next(((layer, v) for layer, v in zip(layers, values, strict=True) if v is not None), None)
            said = "runs no hooks at all" in out
            assert status == 0 and said == (deciding is not None and deciding[1] is off), (values, out)
            if said:
                assert deciding is not None and _layer(where, agent, deciding[0]).name in out
                assert f"sets {'.'.join(keys)}: {json.dumps(off)}" in out
        settings = json.loads(settings_file(agent, where, scope.removeprefix("--")).read_text())
        assert turnguard_commands(settings)  # (installed all the same)


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("text", ["{not json", "[1]", '{"disableAllHooks": "true"}', '{"hooksConfig": []}',
                                  '{"hooksConfig": {"enabled": 0}}', '{"disableAllHooks": 1}'])
def test_a_setting_that_is_not_the_switch_says_nothing(where, capsys, agent, text) -> None:
    """Only the agent's own switch, written as the boolean the agent reads, counts: another value,
    a file that is not JSON or not an object, or another agent's switch says nothing."""
    path = settings_file(agent, where, "user")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    status, out, _ = cli(capsys, "install", agent, "--project")
    assert status == 0 and "runs no hooks at all" not in out


def test_codex_has_no_off_switch_to_report(where, capsys) -> None:
    """Codex's hooks are switched on by install's ``[features] hooks = true`` itself."""
    assert ins.hooks_switched_off("codex", environ=os.environ, cwd=where / "project") is None
