"""simonw's llm end to end: real chains (and the real CLI) with a scripted model from a test plugin."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys

import pytest

from conftest import (
    POLLING,
    POLLS,
    STOPPED_AT_THE_EIGHTH_FAILURE,
    CallOutcomes,
    assert_polled,
    cancel_once_started,
    ci_statuses,
    optional_dependency,
    wait_forever,
)

optional_dependency("llm")

import llm  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from llm.cli import cli  # noqa: E402
from llm.plugins import pm  # noqa: E402

import turnguard as tg  # noqa: E402
from turnguard.integrations.llm_plugin import (  # noqa: E402
    ChainGuard,
    GuardedChain,
    TurnGuardHalted,
    chain,
    turn_state,
)


class ScriptedSteps:
    """Plays one step per model request: a tool call ``(name, args)``, a list of them (one
    response), or final text."""

    supports_tools = True

    def __init__(self, model_id: str, steps) -> None:
        self.model_id = model_id
        self.steps = iter(steps)
        self.requests = 0
        self.tool_results_seen: list[str] = []

    def play(self, prompt, response) -> str:
        """The next step's text to yield; a tool call step is added to ``response`` and yields ""."""
        self.requests += 1
        self.tool_results_seen.extend(result.output for result in prompt.tool_results)
        step = next(self.steps, "done")
        if isinstance(step, str):
            return step
        if isinstance(step, list):  # several calls in one response
            for k, (name, args) in enumerate(step):
                response.add_tool_call(
                    llm.ToolCall(name=name, arguments=args, tool_call_id=f"call-{self.requests}-{k}")
                )
            return ""
        name, args = step
        response.add_tool_call(llm.ToolCall(name=name, arguments=args, tool_call_id=f"call-{self.requests}"))
        return ""


class ScriptedToolModel(ScriptedSteps, llm.Model):
    def execute(self, prompt, stream, response, conversation):
        yield self.play(prompt, response)


class ScriptedAsyncToolModel(ScriptedSteps, llm.AsyncModel):
    async def execute(self, prompt, stream, response, conversation):
        yield self.play(prompt, response)


def stuck_steps():
    return itertools.repeat(("read_file", {"path": "missing.py"}))


def distinct_steps(n: int):
    return [("read_file", {"path": f"f{i}.py"}) for i in range(n)]


@pytest.fixture
def ran() -> list:
    return []


@pytest.fixture
def read_file(ran):
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        if path.startswith("missing"):
            raise FileNotFoundError(path)
        return f"contents of {path}"

    return read_file


def test_unattended_identical_failing_calls_stop_at_the_eighth_and_the_ninth_never_runs(ran, read_file):
    model = ScriptedToolModel("scripted", stuck_steps())
    guarded = chain(tg.Guard(), model, "read it", tools=[read_file])
    with pytest.raises(TurnGuardHalted) as stopped:
        guarded.text()
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK
    assert "streak" in str(stopped.value) and "8 failing" in str(stopped.value)
    assert guarded.callbacks.turn.summary.reason == "halted"


def test_one_hundred_fifty_distinct_calls_complete_under_the_adaptive_cap(ran, read_file):
    model = ScriptedToolModel("scripted", distinct_steps(150))
    assert chain(tg.Guard(), model, "read them", tools=[read_file]).text() == "done"
    assert len(ran) == 150
    assert model.requests == 151


def test_explicit_cap_of_one_hundred_halts_call_one_hundred_one_before_its_body_runs(ran, read_file):
    model = ScriptedToolModel("scripted", distinct_steps(150))
    guard = tg.Guard(tg.GuardConfig(max_tool_calls_per_turn=100))
    with pytest.raises(TurnGuardHalted) as stopped:
        chain(guard, model, "read them", tools=[read_file]).text()
    assert len(ran) == 100
    assert stopped.value.verdict.threshold is tg.Threshold.EXPLICIT
    assert "explicit" in str(stopped.value) and "101 tool calls" in str(stopped.value)


def test_cycle_cap_is_checked_before_the_request_is_sent(ran, read_file):
    model = ScriptedToolModel("scripted", distinct_steps(150))
    with pytest.raises(TurnGuardHalted) as stopped:
        chain(tg.Guard(tg.GuardConfig(max_cycles_per_turn=3)), model, "read them", tools=[read_file]).text()
    assert stopped.value.verdict.threshold is tg.Threshold.CYCLE_CAP
    assert model.requests == 3 and len(ran) == 3


def test_attended_run_asks_the_callback_and_continue_lets_it_go_on(ran, read_file):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict)
        return "continue"

    model = ScriptedToolModel("scripted", [("read_file", {"path": "a.py"})] * 7)
    assert chain(tg.Guard(), model, "poll a.py", tools=[read_file], ask=ask).text() == "done"
    assert len(ran) == 7
    assert [(v.threshold, v.event.level, v.event.streak_length) for v in asked] == [
        (tg.Threshold.STREAK, tg.Level.WARN, 5)
    ]


def test_async_chains_are_stopped_the_same_way(ran, read_file):
    model = ScriptedAsyncToolModel("scripted-async", stuck_steps())
    with pytest.raises(TurnGuardHalted) as stopped:
        asyncio.run(chain(tg.Guard(), model, "read it", tools=[read_file]).atext())
    assert len(ran) == 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK


def test_async_chains_await_an_async_ask_and_continue(ran, read_file):
    asked = []

    async def ask(verdict):
        asked.append(verdict.event.streak_length)
        return "continue"

    model = ScriptedAsyncToolModel("scripted-async", [("read_file", {"path": "a.py"})] * 7)
    assert asyncio.run(chain(tg.Guard(), model, "poll", tools=[read_file], ask=ask).atext()) == "done"
    assert asked == [5] and len(ran) == 7


def test_callbacks_work_on_a_plain_llm_chain(ran, read_file):
    """``ChainGuard`` alone, for hosts that call ``model.chain`` themselves."""
    callbacks = ChainGuard(tg.Guard())
    model = ScriptedToolModel("scripted", stuck_steps())
    plain = model.chain(
        "read it", tools=[read_file], before_call=callbacks.before_call, after_call=callbacks.after_call
    )
    with pytest.raises(TurnGuardHalted):
        plain.text()
    callbacks.end()
    assert len(ran) == 8


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_hosts_own_callbacks_run_after_turnguards(ran, read_file, asynchronous):
    seen = []
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", distinct_steps(2))
    guarded = chain(tg.Guard(), model, "x", tools=[read_file], before_call=lambda tool, call: seen.append("before"),
                    after_call=lambda tool, call, result: seen.append(result.output))
    assert (asyncio.run(guarded.atext()) if asynchronous else guarded.text()) == "done"
    assert seen == ["before", "contents of f0.py", "before", "contents of f1.py"]


class ScriptedPlugin:
    """A test plugin giving llm a stuck scripted model and a failing tool."""

    def __init__(self, ran: list) -> None:
        self.ran = ran

    @llm.hookimpl
    def register_models(self, register):
        register(ScriptedToolModel("scripted-stuck", stuck_steps()))
        register(ScriptedToolModel("scripted-reader", distinct_steps(150)))
        register(FailingToolModel("scripted-failing", distinct_steps(5)))

    @llm.hookimpl
    def register_tools(self, register):
        ran = self.ran

        def read_file(path: str) -> str:
            """Read a file."""
            ran.append(path)
            raise FileNotFoundError(path)

        register(read_file)


@pytest.fixture
def scripted_plugin(ran):
    plugin = ScriptedPlugin(ran)
    pm.register(plugin, name="turnguard-test-scripted")
    yield plugin
    pm.unregister(name="turnguard-test-scripted")


def test_llm_guarded_command_stops_a_stuck_chain(ran, scripted_plugin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no turnguard.toml / pyproject: defaults
    result = CliRunner().invoke(cli, ["guarded", "read it", "-m", "scripted-stuck", "-T", "read_file"])
    assert result.exit_code == 2, result.output
    assert "threshold streak (stop, limit 8)" in result.output
    assert len(ran) == 8


CANNOT_START: dict[str, tuple[list[str], dict[str, str], dict[str, bytes], str]] = {
    "an unknown model": (["-m", "nosuchmodel"], {}, {}, "Unknown model: nosuchmodel"),
    "an unknown tool": (["-T", "no_such_tool"], {}, {}, "no_such_tool not found"),
    "a bad TURNGUARD_* value": ([], {"TURNGUARD_SOFT_CAP": "many"}, {}, "TURNGUARD_SOFT_CAP"),
    "a TURNGUARD_* variable that names no option": ([], {"TURNGUARD_SOFTCAP": "5"}, {}, "TURNGUARD_SOFTCAP"),
    "a digest key that is not UTF-8": ([], {"TURNGUARD_DIGEST_KEY": os.fsdecode(b"k\xff")}, {},
                                       "TURNGUARD_DIGEST_KEY"),
    "a plugin selection naming no plugin": ([], {"TURNGUARD_LOAD_PLUGINS": "bogus"}, {}, "TURNGUARD_LOAD_PLUGINS"),
    "a turnguard.toml that does not parse": ([], {}, {"turnguard.toml": b"soft_cap = [\n"}, "turnguard.toml"),
    "a turnguard.toml that is not UTF-8": ([], {}, {"turnguard.toml": b"# caf\xe9\n"}, "not UTF-8"),
    "a TURNGUARD_CONFIG naming no file": ([], {"TURNGUARD_CONFIG": "missing.toml"}, {}, "missing.toml"),
    "a cap too large to count": (["--max-tool-calls", str(2**70)], {}, {}, "max_tool_calls_per_turn"),
}
"""What keeps ``llm guarded`` from starting: extra arguments, environment, files in the working
folder, and what the one line must say."""


@pytest.mark.parametrize("case", list(CANNOT_START))
def test_llm_guarded_says_in_one_line_why_it_cannot_start_with_exit_status_2(case, ran, scripted_plugin, tmp_path,
                                                                              monkeypatch):
    """Through llm's own click command line: one ``Error:`` line as llm's commands say theirs, no
    traceback, exit status 2 (docs/usage.md: could not start), and no tool run."""
    arguments, env, files, says = CANNOT_START[case]
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, ["guarded", "read it", "-m", "scripted-stuck", "-T", "read_file", *arguments])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], result.output
    assert "Traceback" not in result.output and ran == []


def test_llm_guarded_says_in_one_line_that_the_model_failed_with_exit_status_1(scripted_plugin, tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LLM_RAISE_ERRORS", raising=False)
    result = CliRunner().invoke(cli, ["guarded", "read it", "-m", "scripted-failing", "-T", "read_file"])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "Error: the model is unreachable" and "Traceback" not in result.output


def test_installed_as_an_llm_plugin_through_the_entry_point_group():
    """A fresh process, as a user's ``llm`` would see it: the entry point is loaded by llm itself."""
    env = {k: v for k, v in os.environ.items() if k != "LLM_LOAD_PLUGINS"}
    command = [sys.executable, "-m", "llm", "plugins"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=True)
    plugins = {p["name"]: p for p in json.loads(out.stdout)}
    assert plugins["turnguard"]["hooks"] == ["register_commands"]
    assert plugins["turnguard"]["version"] == tg.__version__


def test_the_example_stops_a_model_stuck_on_a_missing_file_and_prints_why(scripted_plugin, run_example):
    printed = run_example("llm_chain", model_id="scripted-stuck")
    assert printed.startswith(STOPPED_AT_THE_EIGHTH_FAILURE) and "8 failing" in printed


def test_the_example_completes_a_long_productive_chain_past_llms_chain_limit(scripted_plugin, run_example):
    """150 tool rounds: llm's default ``chain_limit=10`` would have stopped it."""
    assert run_example("llm_chain", model_id="scripted-reader") == "done\n"


def test_the_chains_spans_and_loop_detected_events_are_recorded(ran, read_file, otel):
    model = ScriptedToolModel("scripted", stuck_steps())
    with pytest.raises(TurnGuardHalted):
        chain(tg.Guard(tg.GuardConfig(), **otel.providers()), model, "read it", tools=[read_file]).text()

    turn_span = otel.span("invoke_agent scripted")
    assert turn_span.attributes["turnguard.turn.outcome"] == "halted"
    tool_spans = [s for s in otel.spans() if s.name == "execute_tool read_file"]
    assert len(tool_spans) == 8
    records = otel.logs("turnguard.loop_detected")
    assert [r.attributes["turnguard.loop.level"] for r in records] == ["warn", "stop"]
    assert records[-1].attributes["turnguard.loop.failing_streak_length"] == 8
    assert records[-1].span_id == tool_spans[-1].context.span_id


def test_remind_model_appends_the_reminder_to_the_fifth_identical_result(ran, read_file):
    model = ScriptedToolModel("scripted", [("read_file", {"path": "a.py"})] * 6)
    guarded = chain(tg.Guard(tg.GuardConfig(remind_model=True)), model, "poll", tools=[read_file])
    assert guarded.text() == "done"
    outputs = model.tool_results_seen
    assert [("[turnguard] You have called read_file 5 times" in o) for o in outputs] == [False] * 4 + [True, False]


# -- the turn ends on every exit path ----------------------------------------------------------


def test_a_tool_that_raises_is_an_error_outcome_and_the_chain_goes_on_to_complete(ran, read_file, turn_ends):
    """llm hands a tool's exception to the model as the tool's result: the run does not die."""
    model = ScriptedToolModel("scripted", [("read_file", {"path": "missing.py"})])
    assert chain(turn_ends.guard(), model, "read it", tools=[read_file]).text() == "done"
    summary = turn_ends.assert_ended("completed")
    assert summary.tool_calls == 1 and ran == ["missing.py"]
    assert model.tool_results_seen and "missing.py" in model.tool_results_seen[0]


class StalledAsyncModel(ScriptedSteps, llm.AsyncModel):
    """An async model whose second request never answers (the host cancels the run)."""

    async def execute(self, prompt, stream, response, conversation):
        if self.requests:
            await wait_forever(self.stalled)
        yield self.play(prompt, response)


def test_a_cancelled_async_chain_ends_the_turn_as_cancelled(read_file, turn_ends):
    async def start(started):
        model = StalledAsyncModel("stalled", distinct_steps(5))
        model.stalled = started
        return await chain(turn_ends.guard(), model, "read", tools=[read_file]).atext()

    cancel_once_started(start)
    turn_ends.assert_ended("cancelled")


def test_llms_own_chain_limit_ends_the_turn_with_error(read_file, turn_ends):
    model = ScriptedToolModel("scripted", distinct_steps(10))
    with pytest.raises(ValueError, match="Chain limit of 3"):
        chain(turn_ends.guard(), model, "read them", tools=[read_file], chain_limit=3).text()
    turn_ends.assert_ended("error")


def test_a_consumer_that_stops_reading_ends_the_turn_as_cancelled(read_file, turn_ends):
    responses = chain(turn_ends.guard(), ScriptedToolModel("scripted", distinct_steps(10)), "read", tools=[read_file])
    stream = responses.responses()
    next(stream).text()
    stream.close()
    turn_ends.assert_ended("cancelled")


class FailingSteps(ScriptedSteps):
    """Plays its steps, then its model fails (the provider went away) on the next request."""

    def play(self, prompt, response) -> str:
        if self.requests >= self.fail_after:
            raise ConnectionError("the model is unreachable")
        return super().play(prompt, response)


class FailingToolModel(FailingSteps, llm.Model):
    fail_after = 2

    def execute(self, prompt, stream, response, conversation):
        yield self.play(prompt, response)


class FailingAsyncToolModel(FailingSteps, llm.AsyncModel):
    fail_after = 2

    async def execute(self, prompt, stream, response, conversation):
        yield self.play(prompt, response)


def read_through(guarded) -> None:
    """A host reading the chain itself: each response's chunks, as they stream."""
    for response in guarded.responses():
        for _chunk in response:
            pass


@pytest.mark.parametrize("read", [lambda g: g.text(), read_through], ids=["text", "responses"])
def test_a_model_that_raises_mid_chain_ends_the_turn_with_error_as_the_exception_leaves(read_file, turn_ends, read):
    guarded = chain(turn_ends.guard(), FailingToolModel("failing", distinct_steps(5)), "read", tools=[read_file])
    with pytest.raises(ConnectionError):
        read(guarded)
    summary = turn_ends.assert_ended("error")  # now, not at garbage collection, and resolved=False
    assert summary.tool_calls == 2


def test_an_async_model_that_raises_mid_chain_ends_the_turn_with_error(read_file, turn_ends):
    model = FailingAsyncToolModel("failing", distinct_steps(5))
    with pytest.raises(ConnectionError):
        asyncio.run(chain(turn_ends.guard(), model, "read", tools=[read_file]).atext())
    assert turn_ends.assert_ended("error").tool_calls == 2


def test_a_consumer_that_stops_in_the_middle_of_a_response_ends_the_turn_as_cancelled(read_file, turn_ends):
    class Chatty(ScriptedSteps, llm.Model):
        def execute(self, prompt, stream, response, conversation):
            yield from ("one ", "two ", "three")

    stream = chain(turn_ends.guard(), Chatty("chatty", []), "talk", tools=[read_file]).responses()
    for _chunk in next(stream):
        break
    stream.close()
    turn_ends.assert_ended("cancelled")


# -- identical calls in one response (the core's rule for a parallel batch) ----------------------


def test_of_ten_identical_failing_calls_in_one_response_at_most_eight_run_unattended(ran, read_file):
    model = ScriptedToolModel("scripted", [[("read_file", {"path": "missing.py"})] * 10])
    with pytest.raises(TurnGuardHalted) as stopped:
        chain(tg.Guard(), model, "read it", tools=[read_file]).text()
    assert len(ran) <= 8
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK


def test_ten_identical_calls_in_one_attended_response_ask_the_stop_level_once(ran, read_file):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(verdict.event.level)
        return "continue"

    model = ScriptedToolModel("scripted", [[("read_file", {"path": "missing.py"})] * 10])
    chain(tg.Guard(tg.GuardConfig(streak_warn_at=0)), model, "read it", tools=[read_file], ask=ask).text()
    assert asked == [tg.Level.STOP]


# -- a question holds the rest of its batch --------------------------------------------------------

FIRST_QUESTION = {"defaults": ({}, 4), "warn-off": ({"streak_warn_at": 0}, 8)}
"""Guard options, and how many of a batch of identical failing calls come before its first
question: the warn level at the 5th call, or (warn off) the stop level after the 8th failure."""


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("options", "before"), FIRST_QUESTION.values(), ids=FIRST_QUESTION.keys())
def test_a_question_holds_the_calls_after_it_until_the_user_refuses(ran, read_file, options, before, asynchronous):
    asked = []

    def ask(verdict: tg.Verdict) -> str:
        asked.append(len(ran))
        return "stop"

    batch = [[("read_file", {"path": "missing.py"})] * 30]
    guard = tg.Guard(tg.GuardConfig(**options))
    with pytest.raises(TurnGuardHalted, match="stopped by the user"):
        if asynchronous:
            asyncio.run(chain(guard, ScriptedAsyncToolModel("s", batch), "read", tools=[read_file], ask=ask).atext())
        else:
            chain(guard, ScriptedToolModel("s", batch), "read", tools=[read_file], ask=ask).text()
    assert asked == [before] and len(ran) == before


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("changing", [True, False])
def test_a_polling_tool_results_output_is_its_result_and_a_changed_one_is_progress(changing, asynchronous,
                                                                                   turn_ends):
    answers, polled = iter(ci_statuses(changing)), []

    def ci_status(run: int) -> str:
        """The CI run's status."""
        polled.append(run)
        return next(answers)

    steps = [("ci_status", {"run": 42})] * POLLS
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("scripted", steps)
    guarded = chain(turn_ends.guard(POLLING), model, "wait for CI", tools=[ci_status])

    def run() -> str:
        return asyncio.run(guarded.atext()) if asynchronous else guarded.text()

    if changing:
        assert run() == "done"
    else:
        with pytest.raises(TurnGuardHalted):
            run()
    assert_polled(turn_ends, changing, len(polled))


# -- calls llm answers without running them (it skips after_call): each gets its outcome -----------


class Outcomes:
    """The outcomes a guard records, and those it ignores (a report no check waited for)."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, tg.Outcome]] = []
        self.ignored: list[str] = []

    @tg.hookimpl
    def turnguard_outcome_recorded(self, turn, call, outcome, verdict) -> None:
        self.recorded.append((call.name, outcome))

    @tg.hookimpl
    def turnguard_outcome_ignored(self, turn, call, outcome, reason) -> None:
        self.ignored.append(reason)

    def guard(self, config: tg.GuardConfig | None = None) -> tg.Guard:
        guard = tg.Guard(config or tg.GuardConfig())
        guard.register(self, "outcomes")
        return guard


UNIMPLEMENTED = llm.Tool(name="deploy", description="Deploy.", input_schema={"type": "object", "properties": {}},
                         implementation=None)
NOT_RUN = {"unknown name": ("reed_file", {"path": "a.py"}), "no implementation": ("deploy", {})}
"""Calls llm answers with an error instead of running them: a tool the chain does not have, one it
has without an implementation (a sync chain raises on it; an async one answers it)."""


def run_chain(guarded, asynchronous: bool) -> str:
    return asyncio.run(guarded.atext()) if asynchronous else guarded.text()


def not_run_cases():
    return [pytest.param(step, asynchronous, id=f"{name}-{'async' if asynchronous else 'sync'}")
            for name, step in NOT_RUN.items() for asynchronous in (False, True)
            if asynchronous or name != "no implementation"]


@pytest.mark.parametrize(("step", "asynchronous"), not_run_cases())
def test_calls_llm_cannot_run_are_error_outcomes_and_the_eighth_in_a_row_stops_the_chain(
        ran, read_file, step, asynchronous):
    outcomes = Outcomes()
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", itertools.repeat(step, 40))
    guarded = chain(outcomes.guard(), model, "go", tools=[read_file, UNIMPLEMENTED])
    with pytest.raises(TurnGuardHalted) as stopped:
        run_chain(guarded, asynchronous)
    assert stopped.value.verdict.threshold is tg.Threshold.STREAK and "8 failing" in str(stopped.value)
    assert model.requests == 8 and ran == []
    assert outcomes.recorded == [(step[0], tg.Outcome.ERROR)] * 8 and outcomes.ignored == []
    summary = guarded.callbacks.turn.summary
    assert (summary.tool_calls, summary.max_failing_streak) == (8, 8)


@pytest.mark.parametrize(("step", "asynchronous"), not_run_cases())
def test_attended_calls_llm_cannot_run_are_asked_about_as_calls_of_a_failing_tool_are(
        read_file, step, asynchronous):
    def questions(step) -> list:
        asked = []

        def ask(verdict: tg.Verdict) -> str:
            asked.append((verdict.event.level, verdict.event.failing_streak_length))
            return "continue"

        model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", [step] * 20)
        guard = tg.Guard(tg.GuardConfig(streak_warn_at=0))  # (a "continue" at the warn level restarts the streak)
        assert run_chain(chain(guard, model, "go", tools=[read_file, UNIMPLEMENTED], ask=ask), asynchronous) == "done"
        return asked

    failing = questions(("read_file", {"path": "missing.py"}))
    assert failing[0] == (tg.Level.STOP, 8)
    assert questions(step) == failing


def test_a_sync_chain_that_dies_on_a_tool_without_implementation_recorded_its_call_failed(read_file):
    outcomes = Outcomes()
    model = ScriptedToolModel("s", [NOT_RUN["no implementation"]])
    guarded = chain(outcomes.guard(), model, "go", tools=[UNIMPLEMENTED])
    with pytest.raises(ValueError, match="No implementation"):
        guarded.text()
    assert outcomes.recorded == [("deploy", tg.Outcome.ERROR)] and guarded.callbacks.turn.summary.reason == "error"


def cancel(tool, tool_call) -> None:
    raise llm.CancelToolCall("the user said no")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_calls_the_hosts_before_call_cancels_are_denied_outcomes_and_never_wait(ran, read_file, asynchronous):
    outcomes = Outcomes()
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", [("read_file", {"path": "a"})] * 3)
    guarded = chain(outcomes.guard(), model, "go", tools=[read_file], before_call=cancel)
    assert run_chain(guarded, asynchronous) == "done"
    assert outcomes.recorded == [("read_file", tg.Outcome.DENIED)] * 3 and outcomes.ignored == [] and ran == []
    assert model.tool_results_seen == ["Cancelled: the user said no"] * 3


@pytest.mark.parametrize("through", ["GuardedChain", "end"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_calls_a_hook_wrapping_chainguards_cancels_are_denied_by_the_next_request_or_the_end(
        ran, read_file, asynchronous, through):
    """A host that wraps ``ChainGuard``'s callbacks in its own and cancels after them (llm skips
    ``after_call``): reported before the next request (``GuardedChain``), else when it ends."""
    outcomes = Outcomes()
    callbacks = ChainGuard(outcomes.guard())
    steps = [[("read_file", {"path": "a"}), ("read_file", {"path": "b"})], ("read_file", {"path": "c"})]
    if asynchronous:
        async def abefore(tool, tool_call):
            await callbacks.abefore_call(tool, tool_call)
            cancel(tool, tool_call)

        plain = ScriptedAsyncToolModel("s", steps).chain("go", tools=[read_file], before_call=abefore,
                                                          after_call=callbacks.aafter_call)
    else:
        def before(tool, tool_call):
            callbacks.before_call(tool, tool_call)
            cancel(tool, tool_call)

        plain = ScriptedToolModel("s", steps).chain("go", tools=[read_file], before_call=before,
                                                    after_call=callbacks.after_call)
    if through == "GuardedChain":
        guarded = GuardedChain(plain, callbacks)
        assert run_chain(guarded, asynchronous) == "done"
    else:
        assert (asyncio.run(plain.text()) if asynchronous else plain.text()) == "done"
        callbacks.end()
    assert outcomes.recorded == [("read_file", tg.Outcome.DENIED)] * 3 and outcomes.ignored == [] and ran == []
    assert callbacks.turn.summary.tool_calls == 3


# -- a chain a tool pauses (llm.PauseChain) is put aside, and the chain resuming it continues it -----


class Approval:
    """A tool that pauses the chain for a person the first time it is called, then is approved."""

    def __init__(self, asynchronous_tool: bool) -> None:
        self.paused = 0

        def approve(action: str) -> str:
            """Deploy, once a person approved."""
            if not self.paused:
                self.paused += 1
                raise llm.PauseChain("waiting for a person")
            return f"approved {action}"

        async def aapprove(action: str) -> str:
            """Deploy, once a person approved."""
            return approve(action)

        self.tool = aapprove if asynchronous_tool else approve
        self.tool.__name__ = "approve"


PAUSES = {
    "alone": [("approve", {"action": "deploy"})],
    "mid-batch": [
        [("read_file", {"path": "f0.py"}), ("approve", {"action": "deploy"}), ("read_file", {"path": "f1.py"})]
    ],
}
PAUSE_CASES = [pytest.param(batch, asynchronous, tool_kind, id=f"{name}-{chain_kind}-{tool_kind}")
               for name, batch in PAUSES.items()
               for asynchronous, chain_kind in ((False, "sync"), (True, "async"))
               for tool_kind in ("sync-tool", "async-tool") if asynchronous or tool_kind == "sync-tool"]


def paused_chain(turn_ends, outcomes, batch, asynchronous, tool_kind, read_file):
    """Run a chain to its pause: (the guard, the chain, the PauseChain, the last response)."""
    guard = turn_ends.guard()
    guard.register(outcomes, "outcomes")
    approval = Approval(tool_kind == "async-tool")
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", batch)
    guarded = chain(guard, model, "deploy", tools=[read_file, approval.tool])
    responses = []

    async def aread():
        async for response in guarded.aresponses():
            responses.append(response)
            await response.text()

    with pytest.raises(llm.PauseChain) as paused:
        if asynchronous:
            asyncio.run(aread())
        else:
            for response in guarded.responses():
                responses.append(response)
                response.text()
    return guard, guarded, paused.value, responses[-1], approval


@pytest.mark.parametrize(("batch", "asynchronous", "tool_kind"), PAUSE_CASES)
def test_a_chain_a_tool_pauses_is_put_aside_not_ended_and_nothing_is_recorded_for_the_paused_call(
        turn_ends, read_file, batch, asynchronous, tool_kind):
    outcomes = Outcomes()
    _, guarded, pause, _, _ = paused_chain(turn_ends, outcomes, batch, asynchronous, tool_kind, read_file)
    from turnguard.telemetry import _names as names

    assert turn_ends.summaries == [] and turn_ends.otel.points(names.METRIC_TURN_TOOL_CALLS[0]) == []
    summary = guarded.callbacks.turn.summary
    assert summary.reason == "suspended" and summary.resolved is None
    assert ("approve", tg.Outcome.OK) not in outcomes.recorded and all(o is tg.Outcome.OK for _, o in outcomes.recorded)
    state = turn_state(pause)
    assert state is not None and state["llm"] == {"paused": [pause.tool_call.tool_call_id]}
    assert json.loads(json.dumps(state)) == state


@pytest.mark.parametrize(("batch", "asynchronous", "tool_kind"), PAUSE_CASES)
def test_the_chain_resuming_a_paused_one_continues_its_turn_and_ends_it_once(
        turn_ends, read_file, batch, asynchronous, tool_kind):
    outcomes = Outcomes()
    guard, guarded, pause, last, approval = paused_chain(turn_ends, outcomes, batch, asynchronous, tool_kind,
                                                         read_file)
    checked = len(outcomes.recorded) + 1  # the calls reported before the pause, and the paused one
    state = json.loads(json.dumps(turn_state(pause)))  # kept with the messages, as a host would

    async def history():
        return last.prompt.messages + await last.messages()

    messages = asyncio.run(history()) if asynchronous else last.prompt.messages + last.messages()
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", ["deployed"])
    resumed = chain(guard, model, None, messages=messages, tools=[read_file, approval.tool], state=state)
    assert run_chain(resumed, asynchronous) == "deployed"
    assert ("approve", tg.Outcome.OK) in outcomes.recorded and outcomes.ignored == []
    from turnguard.telemetry import _names as names

    assert [s.reason for s in turn_ends.summaries] == ["completed"]
    points = turn_ends.otel.points(names.METRIC_TURN_TOOL_CALLS[0])
    assert [p.attributes[names.TURN_OUTCOME] for p in points] == ["completed"]  # one point: where it ended
    summary = turn_ends.summaries[0]
    assert summary.turn_id == guarded.callbacks.turn.turn_id
    # llm runs again every call of the paused response without a result: only the paused one was checked already
    pending = len(batch[0]) if isinstance(batch[0], list) else 1
    assert summary.tool_calls == checked + pending - 1


class Dies(Exception):
    """What a host hook raises that is not llm's ``CancelToolCall``: the chain dies on it."""


def stalled_tool(started_at: list):
    """An async tool that never returns (the host cancels the run while it runs)."""

    async def stall(path: str) -> str:
        """Stall."""
        await wait_forever(started_at[0])
        return "never"

    return stall


def cut_off_chain(way: str, asynchronous: bool, batch: int, book: CallOutcomes, read_file) -> str | None:
    """Run a chain whose ``batch`` calls of its first response are checked, the last one cut off
    ``way``; the reason the turn ended with."""
    guard = tg.Guard()
    guard.register(book, "book")
    step = [("read_file", {"path": f"f{k}.py"}) for k in range(batch)]
    last = f"f{batch - 1}.py"

    def before(tool, tool_call):
        if tool_call.arguments["path"] == last:
            raise {"host hook raises": Dies("no"), "host hook interrupted": KeyboardInterrupt()}[way]

    if way == "cancelled mid-tool":
        if not asynchronous:
            reads = read_file

            def read_file(path: str) -> str:  # (llm names a tool after its function)
                """Read, interrupted at the last file."""
                if path == last:
                    raise KeyboardInterrupt
                return reads(path)

            chain(guard, ScriptedToolModel("s", [step]), "go", tools=[read_file]).text()
        else:
            async def start(started):
                stall = stalled_tool([started])
                step_stalled = [("stall", {"path": "a"})] * batch
                model = ScriptedAsyncToolModel("s", [step_stalled])
                return await chain(guard, model, "go", tools=[stall]).atext()

            cancel_once_started(start)
        return book.ended
    model = (ScriptedAsyncToolModel if asynchronous else ScriptedToolModel)("s", [step])
    run_chain(chain(guard, model, "go", tools=[read_file], before_call=before), asynchronous)
    return book.ended


CUT_OFF = {
    "host hook raises": (Dies, "error", "error"),
    "host hook interrupted": (KeyboardInterrupt, "cancelled", "unknown"),
    "cancelled mid-tool": (KeyboardInterrupt, "cancelled", "unknown"),
}


def cut_off_cases():
    """Each way x sync/async x batch (an async chain is cancelled as a task, not by Ctrl-C)."""
    return [pytest.param(way, asynchronous, batch, id=f"{way}-{'async' if asynchronous else 'sync'}-{batch}")
            for way in CUT_OFF for asynchronous in (False, True) for batch in (1, 3)
            if not (asynchronous and way == "host hook interrupted")]


@pytest.mark.parametrize(("way", "asynchronous", "batch"), cut_off_cases())
def test_a_checked_call_the_chains_end_cuts_off_gets_one_outcome(read_file, way, asynchronous, batch):
    """Every checked call gets exactly one outcome, also one the chain died or was cancelled in:
    ``error`` when it died on an error, ``unknown`` when cancelled (as the other adapters settle theirs)."""
    raised, reason, cut = CUT_OFF[way]
    book = CallOutcomes()
    if way == "cancelled mid-tool" and asynchronous:
        ended = cut_off_chain(way, asynchronous, batch, book, read_file)
        expected = ["unknown"] * batch  # (the stalled calls run side by side: all cut off)
    else:
        with pytest.raises(raised):
            cut_off_chain(way, asynchronous, batch, book, read_file)
        ended = book.ended
        expected = ["ok"] * (batch - 1) + [cut]
    assert ended == reason
    assert book.each_once() == expected
