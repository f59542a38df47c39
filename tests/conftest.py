"""Shared fixtures: a guard with only the core policies (no telemetry, no entry points), and
builders for the turns the seeds describe."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

import turnguard as tg
from turnguard._plugins import NON_POLICY_PLUGINS

SHARED_CORPUS = next(
    (p for p in (Path(__file__).resolve().parents[2] / "shared" / "corpus", Path("/work/shared/corpus")) if p.is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "corpus",
)
"""The development corpus: ``shared/corpus`` beside the checkout (as CI lays it out)."""


def corpus_files() -> list[Path]:
    """The corpus's JSONL files; skips without it, fails under CI (where it is always laid out)."""
    files = sorted(SHARED_CORPUS.glob("*.jsonl"))
    if not files:
        if os.environ.get("CI"):
            pytest.fail(f"the shared corpus is missing at {SHARED_CORPUS}")
        pytest.skip("the shared corpus is not here")
    return files


def optional_dependency(module: str) -> ModuleType:
    """``module`` (from an extra); skips without it, fails under CI (which installs ``[dev]``, so
    a missing one there is a broken install, not an optional feature)."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` imported as a module, so tests run the README's examples as written."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CORE_ONLY = {"disable_plugins": NON_POLICY_PLUGINS, "load_entrypoints": False}
"""The core policies alone: telemetry and shadow plugins (built by other modules) left out."""


def core_guard(**options: object) -> tg.Guard:
    """A ``Guard`` with the built-in policies only, configured with ``options``."""
    config = tg.GuardConfig(**{**CORE_ONLY, **options})
    return tg.Guard(config, environ={})


@pytest.fixture
def make_guard() -> Callable[..., tg.Guard]:
    return core_guard


@pytest.fixture
def guard() -> tg.Guard:
    return core_guard()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A coding-agent hook's environment (``agent_events.hook_env``). A turn's end hands its journal
    to the outbox but starts no exporter process (``export_now`` exports in this process): the tests
    that need the real one start it, or define their own ``env``."""
    from agent_events import hook_env
    from turnguard.agents import export

    monkeypatch.setattr(export, "start_exporter", lambda environ: None)
    return hook_env(tmp_path)


@pytest.fixture
def otel():
    """Real SDK providers exporting to memory; ``Guard(config, **otel.providers())`` reports there."""
    from turnguard.telemetry._testing import InMemoryTelemetry  # needs the SDK: imported by the tests that use it

    telemetry = InMemoryTelemetry()
    yield telemetry
    telemetry.shutdown()


def distinct_call(i: int, tool: str = "read_file") -> tg.ToolCall:
    """The i-th of a family of calls that are all different."""
    return tg.ToolCall(tool, {"path": f"src/module_{i}.py", "offset": 0})


def drive(turn: tg.Turn, calls: Iterable[tg.ToolCall], outcome: tg.Outcome = tg.Outcome.OK) -> list[tg.Verdict]:
    """Check each call and record its outcome, as a host does, until a HALT; the check verdicts."""
    verdicts = []
    for call in calls:
        verdict = turn.check_call(call)
        verdicts.append(verdict)
        if verdict.action is tg.Action.HALT:
            break
        turn.record_outcome(call, outcome)
    return verdicts


def first_detection(verdicts: Sequence[tg.Verdict]) -> tuple[int, tg.Verdict] | None:
    """(1-based call number, verdict) of the first verdict that carries a detection."""
    for n, verdict in enumerate(verdicts, start=1):
        if verdict.event is not None:
            return n, verdict
    return None


def productive_calls(n: int) -> list[tg.ToolCall]:
    """``n`` calls where every 7th repeats the call made 3 calls earlier: no call more than twice,
    never twice in a row (the seed's productive turns: at most 2 repeats of any call)."""
    return [distinct_call(i - 3 if i % 7 == 6 else i) for i in range(n)]


def with_repeats(n: int, repeat: tg.ToolCall, at: Iterable[int]) -> list[tg.ToolCall]:
    """``n`` distinct calls, with ``repeat`` at the given 1-based positions."""
    positions = set(at)
    return [repeat if i in positions else distinct_call(i) for i in range(1, n + 1)]


class TurnEnds:
    """Where the end of an adapter's turn shows: the summary observers get, the ``invoke_agent``
    span and the turn metric. ``guard()`` makes a guard that reports to all three."""

    def __init__(self, otel) -> None:
        self.otel = otel
        self.summaries: list[tg.TurnSummary] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary) -> None:
        self.summaries.append(summary)

    def guard(self, config: tg.GuardConfig | None = None) -> tg.Guard:
        guard = tg.Guard(config or tg.GuardConfig(), **self.otel.providers())
        guard.register(self, "turn-ends")
        return guard

    def assert_ended(self, reason: str) -> tg.TurnSummary:
        """Exactly one turn ended, with ``reason``, in its summary, its span and its metric point."""
        from turnguard.telemetry import _names as names

        assert [s.reason for s in self.summaries] == [reason]
        spans = [s for s in self.otel.spans() if s.name.startswith(names.OP_INVOKE_AGENT)]
        assert [s.attributes[names.TURN_OUTCOME] for s in spans] == [reason]
        points = self.otel.points(names.METRIC_TURN_TOOL_CALLS[0])
        assert [p.attributes[names.TURN_OUTCOME] for p in points] == [reason]
        # the adapter reports what it knows of the task: a run that died on an error did not do it
        resolved = False if reason == "error" else None
        assert self.summaries[0].resolved is resolved
        assert [p.attributes[names.TURN_RESOLVED] for p in points] == [names.RESOLVED_LABELS[resolved]]
        return self.summaries[0]


@pytest.fixture
def turn_ends(otel) -> TurnEnds:
    return TurnEnds(otel)


POLLING = tg.PROFILES["recommended"].replace(stateful_tools=("ci_status",))
"""The recommended profile with ``ci_status`` listed as a polling tool (docs/polling.md): the
adapters' tests poll it with the framework's own results."""
POLLS = 12


def ci_statuses(changing: bool) -> list[str]:
    """What a CI status tool answers to ``POLLS`` identical polls: a run that moves (queued, running
    10%, ... passed: at most three answers alike in a row), or one that says ``running`` each time."""
    if not changing:
        return ["running"] * POLLS
    return ["queued"] * 2 + [f"running {10 * (i // 3 + 1)}%" for i in range(POLLS - 3)] + ["passed"]


def assert_polled(turn_ends: TurnEnds, changing: bool, polled: int) -> None:
    """A run that polled ``ci_status`` under ``POLLING``: a moving run completes (every poll ran, the
    framework's results restarted the streak, the restarts counter says so); an unchanged one halts
    at its eighth poll."""
    from turnguard.telemetry import _names as names

    summary = turn_ends.summaries[-1]
    if changing:
        assert polled == POLLS and not summary.halted
        assert dict(summary.result_restarts) == {"ci_status": len(set(ci_statuses(True))) - 1}
        points = turn_ends.otel.points(names.METRIC_STREAK_RESULT_RESTARTS[0])
        assert [(p.attributes[names.GEN_AI_TOOL_NAME], p.value) for p in points] == [
            ("ci_status", len(set(ci_statuses(True))) - 1)]
    else:
        assert polled == 8 and summary.threshold == tg.Threshold.STREAK


def cancel_once_started(run: Callable[[asyncio.Event], Awaitable[object]]) -> None:
    """Run ``run(started)`` as a task, cancel it once it sets ``started``, and expect the cancellation
    to reach the caller (what a host does to an async agent run it gives up on)."""

    async def scenario() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(run(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


async def wait_forever(started: asyncio.Event) -> str:
    """A tool body that never returns (it tells ``started`` it is running)."""
    started.set()
    await asyncio.Event().wait()
    return "never"


STOPPED_AT_THE_EIGHTH_FAILURE = "stopped: turnguard stopped the run: threshold streak (stop, limit 8)"
"""How the examples' output starts when turnguard stopped a model stuck on one failing call."""


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """The directory the examples run in (the current directory): ``f0.py`` .. ``f149.py`` exist,
    ``missing.py`` does not."""
    monkeypatch.chdir(tmp_path)
    for i in range(150):
        (tmp_path / f"f{i}.py").write_text(f"# module {i}\n", encoding="utf-8")
    return tmp_path


@pytest.fixture
def run_example(project, capsys) -> Callable[..., str]:
    """``run_example(name, **model)``: ``examples/<name>.py``'s ``main`` run as its ``__main__``
    block runs it, with the given model; returns what it printed."""

    def run(name: str, **model: object) -> str:
        capsys.readouterr()
        load_example(name).main(**model)
        return capsys.readouterr().out

    return run


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout as it is (pip and build write into the tree they build)."""
    copy = tmp_path_factory.mktemp("source") / "turnguard"
    shutil.copytree(Path(__file__).resolve().parents[1], copy,
                    ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "site"))
    return copy


@pytest.fixture(scope="session")
def dists(source, tmp_path_factory) -> dict[str, Path]:
    """The sdist, and the wheel built from it (``python -m build``'s default: what a release uploads)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "-q", "--outdir", str(out), str(source)],
                   check=True, timeout=600, capture_output=True)
    (sdist,), (wheel,) = out.glob("turnguard-*.tar.gz"), out.glob("turnguard-*.whl")
    return {"sdist": sdist, "wheel": wheel}


def kept_result_token(state: Path, agent: str = "claude-code") -> Path:
    """A coding agent's ended turn in the hooks' state directory ``state``, as the exporter keeps
    it, for ``turnguard result``."""
    import turnguard as tg
    from turnguard.agents import export

    with tg.Guard(export.results_config(tg.GuardConfig(), state)).turn(agent_name=agent) as turn:
        pass
    export.keep_token(state, {"agent": agent, "session": "s"}, turn.result_token)
    return state


@pytest.fixture(params=["promtool-2", "promtool-3"])
def promtool(request) -> str:
    """Each promtool the rules and boards are checked with: Prometheus 2.42's and 3's."""
    import chain

    return chain.promtool_of(request.param)


class CallOutcomes:
    """A plugin that books every check a turn lets run and every outcome it records, by call id
    (a call checked again, as a retry outside the adapter re-runs it, counts each time)."""

    def __init__(self) -> None:
        self.checked: dict[str, int] = {}
        self.outcomes: dict[str, list[str]] = {}
        self.ended: str | None = None

    @tg.hookimpl
    def turnguard_call_checked(self, call: tg.ToolCall, verdict: tg.Verdict) -> None:
        if verdict.action is not tg.Action.HALT:
            self.checked[call.call_id] = self.checked.get(call.call_id, 0) + 1

    @tg.hookimpl
    def turnguard_outcome_recorded(self, call: tg.ToolCall, outcome: tg.Outcome) -> None:
        self.outcomes.setdefault(call.call_id, []).append(outcome.value)

    @tg.hookimpl
    def turnguard_turn_ended(self, summary: tg.TurnSummary) -> None:
        self.ended = summary.reason

    def each_once(self) -> list[str]:
        """The outcomes, by call in check order, asserting each check got exactly one."""
        assert {call_id: len(self.outcomes.get(call_id, ())) for call_id in self.checked} == self.checked
        assert set(self.outcomes) <= set(self.checked)
        return [outcome for call_id in self.checked for outcome in self.outcomes[call_id]]
