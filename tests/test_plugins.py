"""Plugins: built-ins by name, third-party policies in code and through a real entry point,
blocking, the entry-point switch, isolation of broken plugins, and ``describe``."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pluggy
import pytest

import turnguard as tg
from conftest import CORE_ONLY, distinct_call, drive
from turnguard import _plugins as plugins
from turnguard._plugins import DEFAULT_PLUGINS, NON_POLICY_PLUGINS, PluginStatus, describe, entrypoint_selection
from turnguard.hookspecs import PROJECT_NAME

NO_TELEMETRY = NON_POLICY_PLUGINS
SRC = Path(__file__).resolve().parent.parent / "src"
DANGEROUS = tg.ToolCall("bash", "rm -rf /")

POLICY_SOURCE = '''
import turnguard as tg

@tg.hookimpl
def turnguard_check_call(turn, call):
    """A third-party rule: never run a recursive forced delete."""
    if call.name == "bash" and "rm -rf" in str(call.args):
        return turn.detect("dangerous_command", tg.Action.HALT, tg.Level.STOP, 1, call=call,
                           message="example policy: refusing rm -rf")
    return None
'''


class DangerousCommands:
    """The same rule as a plugin object registered in code."""

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        if call.name == "bash" and "rm -rf" in str(call.args):
            return turn.detect("dangerous_command", tg.Action.HALT, tg.Level.STOP, 1, call=call)
        return None


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no plugin problem said yet."""
    monkeypatch.setattr(plugins, "_SAID", set())


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A temporary sys.path entry where ``install`` writes a module and a dist-info whose
    ``entry_points.txt`` declares it in the ``turnguard`` group (what pip would install)."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    modules: list[str] = []

    def install(dist: str, entry: str, module: str, source: str) -> None:
        (root / f"{module}.py").write_text(textwrap.dedent(source))
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[turnguard]\n{entry} = {module}\n")
        modules.append(module)
        importlib.invalidate_caches()

    yield install
    for module in modules:
        sys.modules.pop(module, None)


def guard_with_entrypoints(environ: dict[str, str] | None = None, **options: object) -> tg.Guard:
    config = tg.GuardConfig(**{"disable_plugins": NO_TELEMETRY, **options})
    return tg.Guard(config, environ={} if environ is None else environ)


def test_builtins_are_registered_by_name_and_called_cap_first():
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    for name in DEFAULT_PLUGINS:
        assert guard.pm.get_plugin(name) is not None
    order = [impl.plugin_name for impl in reversed(guard.pm.hook.turnguard_check_call.get_hookimpls())]
    assert order == ["cap", "streak"]


def test_a_third_party_policy_registered_in_code_halts_on_its_own_rule():
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), plugins={"dangerous": DangerousCommands()}, environ={})
    turn = guard.turn()
    assert turn.check_call(distinct_call(1)).action is tg.Action.ALLOW
    verdict = turn.check_call(DANGEROUS)
    assert (verdict.action, verdict.threshold) == (tg.Action.HALT, "dangerous_command")
    assert turn.check_call(distinct_call(2)) is verdict
    assert {"name": "dangerous", "source": "code", "status": "loaded", "hooks": ["turnguard_check_call"]} in describe(
        guard.pm)


def test_a_third_party_policy_loads_from_a_real_entry_point(site):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    guard = guard_with_entrypoints()
    verdict = guard.turn().check_call(DANGEROUS)
    assert (verdict.action, verdict.threshold, verdict.message) == (
        tg.Action.HALT, "dangerous_command", "example policy: refusing rm -rf")
    row = next(r for r in describe(guard.pm) if r["name"] == "example")
    assert row == {"name": "example", "source": "turnguard-example 1.0", "status": "loaded",
                   "hooks": ["turnguard_check_call"]}


@pytest.mark.parametrize(("value", "loaded"), [("0", False), ("none", False), ("", False), ("off", False),
                                               ("example", True), ("example, other", True), ("other", False),
                                               ("1", True), ("all", True), ("TRUE", True), ("No", False)])
def test_turnguard_load_plugins_selects_entry_points(site, value, loaded):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    site("turnguard-other", "other", "tg_other_policy", "")
    guard = guard_with_entrypoints({"TURNGUARD_LOAD_PLUGINS": value})
    assert (guard.pm.get_plugin("example") is not None) is loaded
    assert (guard.turn().check_call(DANGEROUS).action is tg.Action.HALT) is loaded


@pytest.mark.parametrize("value", ["bogus", "ture", "example,bogus", "exampel", "yes please"])
def test_turnguard_load_plugins_naming_no_installed_plugin_is_a_configuration_error(site, value):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    with pytest.raises(tg.ConfigError) as error:
        guard_with_entrypoints({"TURNGUARD_LOAD_PLUGINS": value})
    message = str(error.value)
    assert message.startswith(f"'TURNGUARD_LOAD_PLUGINS': got {value!r}; expected ") and "(example)" in message


def test_the_real_environment_variable_turns_entry_point_loading_off(site, monkeypatch):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    monkeypatch.setenv("TURNGUARD_LOAD_PLUGINS", "0")
    assert tg.Guard(tg.GuardConfig(disable_plugins=NO_TELEMETRY)).pm.get_plugin("example") is None
    monkeypatch.delenv("TURNGUARD_LOAD_PLUGINS")
    assert tg.Guard(tg.GuardConfig(disable_plugins=NO_TELEMETRY)).pm.get_plugin("example") is not None


def test_load_entrypoints_false_loads_none(site):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    assert guard_with_entrypoints(load_entrypoints=False).pm.get_plugin("example") is None


def test_a_builtin_can_be_blocked_by_name():
    guard = tg.Guard(tg.GuardConfig(disable_plugins=(*NO_TELEMETRY, "streak"), load_entrypoints=False), environ={})
    assert guard.pm.get_plugin("streak") is None and guard.pm.is_blocked("streak")
    turn = guard.turn(promptable=True)
    verdicts = drive(turn, [tg.ToolCall("bash", "make")] * 20, tg.Outcome.ERROR)
    assert all(v.event is None for v in verdicts)  # no streak detector
    row = next(r for r in describe(guard.pm) if r["name"] == "streak")
    assert row == {"name": "streak", "source": "built-in", "status": "disabled", "hooks": []}


def test_blocking_through_the_environment():
    config = tg.GuardConfig.from_env({"TURNGUARD_DISABLE_PLUGINS": ",".join((*NON_POLICY_PLUGINS, "cycles")),
                                      "TURNGUARD_MAX_CYCLES_PER_TURN": "1"})
    turn = tg.Guard(config, environ={}).turn()
    assert all(turn.begin_cycle().action is tg.Action.ALLOW for _ in range(5))


def test_an_entry_point_plugin_can_be_blocked_by_name(site):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    guard = guard_with_entrypoints(disable_plugins=(*NO_TELEMETRY, "example"))
    assert guard.pm.get_plugin("example") is None
    assert guard.turn().check_call(DANGEROUS).action is tg.Action.ALLOW


BROKEN_SOURCES = {
    "raises": "raise RuntimeError('cannot import me')\n",
    "syntax": "def broken(:\n",
    "missing-import": "import tg_no_such_module_anywhere\n",
    "long-message": "raise ValueError('line one\\nline two ' + 'x' * 5000)\n",
    "base-exception": "class Odd(BaseException):\n    pass\n\nraise Odd('not an Exception')\n",
    "generator-exit": "raise GeneratorExit('at import')\n",
    "unprintable": ("class Unprintable(BaseException):\n    def __str__(self):\n"
                    "        raise GeneratorExit('str')\n\nraise Unprintable()\n"),
}


@pytest.mark.parametrize("source", list(BROKEN_SOURCES.values()), ids=list(BROKEN_SOURCES))
def test_a_broken_entry_point_is_said_once_per_process_in_one_line_and_listed_as_failed(site, caplog, source):
    site("turnguard-broken", "broken", "tg_broken_policy", source)
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        guards = [guard_with_entrypoints() for _ in range(3)]
    assert all(g.pm.get_plugin("broken") is None and g.pm.get_plugin("example") is not None for g in guards)
    said = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(said) == 1 and said[0].exc_info is None  # no traceback, not once per Guard
    line = said[0].getMessage()
    assert "\n" not in line and "'broken'" in line and len(line) < 300
    row = next(r for r in describe(guards[-1].pm) if r["name"] == "broken")
    assert (row["source"], row["status"], row["hooks"]) == ("turnguard-broken 1.0", PluginStatus.FAILED, [])
    assert row["why"] in line


def test_disabling_a_plugin_that_is_not_installed_warns_once_per_process_and_lists_it_not_found(site, caplog):
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    with caplog.at_level(logging.WARNING, logger="turnguard"):
        guards = [guard_with_entrypoints(disable_plugins=(*NO_TELEMETRY, "retired", "example")) for _ in range(3)]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "'retired'" in warned[0] and "not installed" in warned[0]
    rows = {r["name"]: r for r in describe(guards[-1].pm)}
    assert rows["retired"] == {"name": "retired", "source": "-", "status": "not found", "hooks": []}
    assert rows["example"] == {"name": "example", "source": "turnguard-example 1.0", "status": "disabled",
                               "hooks": []}
    assert guards[-1].turn().check_call(DANGEROUS).action is tg.Action.ALLOW


def test_an_entry_point_implementing_an_unknown_hook_is_left_out(site, caplog):
    site("turnguard-typo", "typo", "tg_typo_policy",
         "import turnguard as tg\n\n@tg.hookimpl\ndef turnguard_chek_call(turn, call):\n    return None\n")
    with caplog.at_level(logging.ERROR, logger="turnguard"):
        guard = guard_with_entrypoints()
    assert guard.pm.get_plugin("typo") is None and "turnguard_chek_call" in caplog.text
    row = next(r for r in describe(guard.pm) if r["name"] == "typo")
    assert row["status"] == "failed" and "turnguard_chek_call" in row["why"]
    assert guard.turn().check_call(distinct_call(1)).action is tg.Action.ALLOW


IMPOSTOR_SOURCE = """
import turnguard as tg

@tg.hookimpl
def turnguard_check_call(turn, call):
    return turn.detect("impostor", tg.Action.HALT, tg.Level.STOP, 1, call=call, message="impostor")
"""
"""An entry point that would halt every call: loaded under any name, it shows."""

BUILTIN_NAMES = sorted(plugins.builtin_names())


def _install_impostors(site, names: list[str]) -> None:
    for i, name in enumerate(names):
        site(f"turnguard-impostor-{i}", name, f"tg_impostor_{i}", IMPOSTOR_SOURCE)


@pytest.mark.parametrize("disabled", [False, True], ids=["enabled", "disabled"])
@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_an_entry_point_named_like_a_builtin_is_left_out_and_the_builtin_keeps_the_name(site, caplog, name,
                                                                                        disabled):
    _install_impostors(site, [name])
    site("turnguard-example", "example", "tg_example_policy", POLICY_SOURCE)
    config = tg.GuardConfig(probe={"rate": 1.0}, disable_plugins=(name,) if disabled else ())  # a probe guard too
    for environ in ({}, {"TURNGUARD_LOAD_PLUGINS": f"{name},example"}):
        with caplog.at_level(logging.ERROR, logger="turnguard"):
            guard = tg.Guard(config, environ=environ)
        assert "tg_impostor_0" not in sys.modules
        turn = guard.turn()
        assert turn.check_call(distinct_call(1)).action is tg.Action.ALLOW
        assert turn.check_call(DANGEROUS).threshold == "dangerous_command"  # other entry points still load
        if name in DEFAULT_PLUGINS and not disabled:
            assert guard.pm.get_plugin(name) is importlib.import_module(DEFAULT_PLUGINS[name])
        rows = [r for r in describe(guard.pm) if r["name"] == name and r["source"] == "turnguard-impostor-0 1.0"]
        assert rows == [{"name": name, "source": "turnguard-impostor-0 1.0", "status": PluginStatus.FAILED,
                         "why": plugins.TAKEN_NAME, "hooks": []}]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert said == [f"turnguard: entry-point plugin {name!r} left out: {plugins.TAKEN_NAME}"]


def test_turnguard_plugins_lists_entry_points_named_like_builtins_as_failed(site, tmp_path):
    _install_impostors(site, BUILTIN_NAMES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNGUARD_", "OTEL_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path / "site"), str(SRC)))
    said: dict[str, str] = {}
    for argv in (["plugins", "--json"], ["plugins", "--wide"]):
        done = subprocess.run([sys.executable, "-m", "turnguard", *argv], cwd=tmp_path, env=env, timeout=120,
                              capture_output=True, text=True)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert all(f"entry-point plugin {name!r} left out: {plugins.TAKEN_NAME}" in done.stderr
                   for name in BUILTIN_NAMES)
        said[argv[1]] = done.stdout
    rows = json.loads(said["--json"])
    failed = {r["name"]: r for r in rows if r["source"].startswith("turnguard-impostor-")}
    assert sorted(failed) == BUILTIN_NAMES
    assert all(r["status"] == "failed" and r["why"] == plugins.TAKEN_NAME for r in failed.values())
    assert {r["name"] for r in rows if r["source"] == "built-in" and r["status"] == "loaded"} >= set(DEFAULT_PLUGINS)
    assert said["--wide"].count(f"failed: {plugins.TAKEN_NAME}") == len(BUILTIN_NAMES)


def test_a_code_plugin_implementing_an_unknown_hook_is_a_host_error():
    class Typo:
        @tg.hookimpl
        def turnguard_chek_call(self, call):
            return None

    with pytest.raises(pluggy.PluginValidationError):
        tg.Guard(tg.GuardConfig(**CORE_ONLY), plugins={"typo": Typo()}, environ={})
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    with pytest.raises(pluggy.PluginValidationError):
        guard.register(Typo(), name="typo")
    assert guard.pm.get_plugin("typo") is None


def test_a_wrapper_on_a_check_hook_is_refused_when_registered():
    class Wrapper:
        @tg.hookimpl(wrapper=True)
        def turnguard_check_call(self, call):
            return (yield)

    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    with pytest.raises(pluggy.PluginValidationError, match="wrappers are not supported"):
        guard.register(Wrapper(), name="wrapper")
    assert guard.turn().check_call(distinct_call(1)).action is tg.Action.ALLOW


def test_a_factory_plugin_that_fails_to_start_is_left_out(monkeypatch, caplog):
    import turnguard._plugins as plugins

    monkeypatch.setitem(plugins.FACTORY_PLUGINS, "flaky", _failing_factory)
    with caplog.at_level(logging.WARNING, logger="turnguard"):
        guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
        tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    assert guard.pm.get_plugin("flaky") is None and "flaky" in caplog.text
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None
    assert {"name": "flaky", "source": "built-in", "status": "failed", "why": "RuntimeError: cannot start",
            "hooks": []} in describe(guard.pm)


def test_a_factory_plugin_whose_module_cannot_be_imported_is_left_out(monkeypatch, caplog):
    """The built-ins above the guard import their module when first built (``turnguard/__init__.py``):
    one that cannot be imported is left out as one that fails to start is, never the guard's end."""
    import turnguard._plugins as plugins

    monkeypatch.setitem(plugins.FACTORY_PLUGINS, "missing", _unimportable_factory)
    with caplog.at_level(logging.WARNING, logger="turnguard"):
        guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    assert guard.pm.get_plugin("missing") is None
    assert guard.turn().check_call(distinct_call(1)).action is tg.Action.ALLOW
    row = next(r for r in describe(guard.pm) if r["name"] == "missing")
    assert row["status"] == "failed" and row["why"].startswith("ModuleNotFoundError")


@pytest.mark.parametrize("error", [GeneratorExit("at start"), type("Odd", (BaseException,), {})("at start")],
                         ids=lambda e: type(e).__name__)
def test_a_factory_plugin_that_raises_a_base_exception_is_left_out(monkeypatch, error):
    import turnguard._plugins as plugins

    def factory(config, **providers):
        raise error

    monkeypatch.setitem(plugins.FACTORY_PLUGINS, "flaky", factory)
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    assert guard.pm.get_plugin("flaky") is None
    row = next(r for r in describe(guard.pm) if r["name"] == "flaky")
    assert (row["status"], row["why"]) == ("failed", f"{type(error).__name__}: at start")


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(2)], ids=lambda e: type(e).__name__)
def test_keyboard_interrupt_and_system_exit_propagate_from_a_factory_plugin(monkeypatch, error):
    import turnguard._plugins as plugins

    def factory(config, **providers):
        raise error

    monkeypatch.setitem(plugins.FACTORY_PLUGINS, "flaky", factory)
    with pytest.raises(type(error)):
        tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})


def _failing_factory(config, **providers):
    raise RuntimeError("cannot start")


def _unimportable_factory(config, **providers):
    import turnguard_no_such_module  # type: ignore[import-not-found]  # noqa: F401

    raise AssertionError("unreachable")


def test_the_built_ins_above_the_guard_are_registered_by_the_package_in_hook_order():
    """``plugins`` names them; their modules (above it) give the factories, from ``turnguard``."""
    from turnguard import _shadow as shadow

    assert tuple(plugins.FACTORY_PLUGINS)[:3] == plugins.NON_POLICY_PLUGINS == ("otel", "recorder", "shadow")
    assert all(callable(plugins.FACTORY_PLUGINS[name]) for name in plugins.NON_POLICY_PLUGINS)
    assert plugins.FACTORY_PLUGINS["shadow"] is shadow.plugin_for
    guard = tg.Guard(tg.GuardConfig(shadow={"s": {}}, recorder_path=None, load_entrypoints=False), environ={})
    order = [name for name, _ in reversed(guard.pm.list_name_plugin()) if name in plugins.NON_POLICY_PLUGINS]
    assert order == ["otel", "shadow"]  # the recorder has nothing to do without a path


def test_a_factory_must_be_callable():
    with pytest.raises(TypeError, match="must be callable"):
        plugins.register_factory("shadow", "turnguard._shadow:plugin_for")  # type: ignore[arg-type]
    assert callable(plugins.FACTORY_PLUGINS["shadow"])


@pytest.mark.parametrize(("value", "selection"), [(None, None), ("all", None), ("0", frozenset()),
                                                  (" a , b ", frozenset({"a", "b"}))])
def test_entrypoint_selection(value, selection):
    assert entrypoint_selection(value) == selection


def test_describe_lists_name_source_and_hooks():
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY), environ={})
    rows = {r["name"]: r for r in describe(guard.pm)}
    # the cap takes a stateful tool's stuck verdict at its outcome (issue 23), so it has an outcome hook
    assert rows["cap"] == {"name": "cap", "source": "built-in", "status": "loaded",
                           "hooks": ["turnguard_check_call", "turnguard_check_outcome"]}
    assert rows["streak"]["hooks"] == ["turnguard_check_call", "turnguard_check_outcome"]
    assert rows["cycles"]["hooks"] == ["turnguard_check_cycle"]


def _marked_hooks(plugin: object) -> list[str]:
    """The names of ``plugin``'s attributes marked as turnguard hook implementations."""
    return sorted(name for name in dir(plugin)
                  if getattr(getattr(plugin, name, None), f"{PROJECT_NAME}_impl", None) is not None)


def test_describe_lists_exactly_the_hooks_each_loaded_plugin_implements():
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False), environ={})
    rows = [r for r in describe(guard.pm) if r["status"] is PluginStatus.LOADED]
    assert {r["name"] for r in rows} >= set(DEFAULT_PLUGINS)
    for row in rows:
        assert row["hooks"] == _marked_hooks(guard.pm.get_plugin(row["name"])), row["name"]


# -- a host that already has a pluggy plugin system (the README's example) --------------------------

host_hookspec = pluggy.HookspecMarker("myhost")
host_hookimpl = pluggy.HookimplMarker("myhost")


class HostSpecs:
    @host_hookspec
    def myhost_before_tool(self, tool: str, args: dict) -> None:
        """The host's own hook, called before each tool runs."""


class Budget:
    """One object, plugged into the host's manager and into turnguard's."""

    def __init__(self) -> None:
        self.halts: list[str] = []

    @host_hookimpl
    def myhost_before_tool(self, tool, args):
        pass

    @tg.hookimpl
    def turnguard_loop_detected(self, event):
        if event.action is tg.Action.HALT:
            self.halts.append(str(event.threshold))


def test_a_host_with_its_own_pluggy_manager_can_plug_into_turnguard():
    host_pm = pluggy.PluginManager("myhost")
    host_pm.add_hookspecs(HostSpecs)
    budget = Budget()
    host_pm.register(budget, name="budget")
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=2, **CORE_ONLY), plugins={"budget": budget}, environ={})
    turn = guard.turn()
    for i in range(3):
        call = distinct_call(i)
        host_pm.hook.myhost_before_tool(tool=call.name, args=call.args)
        turn.check_call(call)
    assert budget.halts == ["explicit"]


def test_the_usage_page_names_every_plugin_name_turnguard_keeps():
    page = (SRC.parent / "docs" / "usage.md").read_text(encoding="utf-8")
    said = page[page.index("the\nnames of turnguard's own plugins"):].split(":", 1)[0]
    assert all(f"`{name}`" in said for name in BUILTIN_NAMES)
