"""`pip install turnguard` is the library alone (the OpenTelemetry API, no SDK): it guards turns, and
``telemetry.configure()`` says which extra brings the SDK instead of failing on an import deep inside.

Each case runs in a fresh interpreter whose import system refuses the hidden modules, as an
environment without them would.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

HIDE = """
import importlib.abc
import sys

HIDDEN = {hidden!r}


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in HIDDEN):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""
SDK = ("opentelemetry.sdk", "opentelemetry.exporter")


def run_without(hidden: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    script = HIDE.format(hidden=hidden) + textwrap.dedent(code)
    env = {"PATH": "/usr/bin:/bin", "OTEL_SDK_DISABLED": "false"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(("hidden", "missing"), [
    (SDK, "opentelemetry.sdk"),
    (("opentelemetry.exporter",), "opentelemetry.exporter.otlp.proto"),
])
def test_configure_without_the_sdk_names_the_extra_to_install(hidden, missing):
    result = run_without(hidden, """
        from turnguard.telemetry import configure

        try:
            configure()
        except ImportError as exc:
            print(type(exc).__name__, exc.name, str(exc), sep="|")
        """)
    assert result.returncode == 0, result.stderr
    kind, name, message = result.stdout.strip().split("|")
    assert kind == "ModuleNotFoundError" and name == missing
    assert 'pip install "turnguard[otlp]"' in message and missing in message


def test_the_library_alone_guards_a_turn_and_its_telemetry_is_a_no_op():
    result = run_without(SDK, """
        import sys

        import turnguard as tg

        guard = tg.Guard(tg.GuardConfig())
        with guard.turn() as turn:
            call = tg.ToolCall("bash", "pytest -q")
            for _ in range(8):
                turn.check_call(call)
                verdict = turn.record_outcome(call, tg.Outcome.ERROR)
        assert verdict.action is tg.Action.HALT and turn.summary.threshold == "streak"
        assert guard.pm.get_plugin("otel") is not None
        assert not [m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
        """)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_configure_without_the_sdk_still_honours_otel_sdk_disabled():
    result = run_without(SDK, """
        from turnguard.telemetry import configure

        telemetry = configure(environ={"OTEL_SDK_DISABLED": "true"})
        print(type(telemetry.tracer_provider).__name__)
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "NoOpTracerProvider"
