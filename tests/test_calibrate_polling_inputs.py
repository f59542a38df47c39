"""Polling reads alike from the recorder's file and the Collector's: a stateful tool's result
digest (the recorder line's ``result``, the tool span's ``turnguard.call.result_digest``) reaches
the replay either way, so one fleet gives the same ``--json``; and the tool lists the turns ran
under (``stateful_tools``, ``streak_exempt_tools``) are recorded, so a ``--config`` that names
others is warned about, on stderr and in ``--json``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard.calibrate import cli
from turnguard.telemetry.testing import InMemoryTelemetry

LIVE = {"name": '"prod"', "soft_cap": 6, "hard_multiplier": 3, "stuck_repeat_threshold": 3,
        "stateful_tools": '["poll"]', "streak_exempt_tools": '["sleep"]'}
GRID = ["--soft-caps", "6", "--multipliers", "3,5", "--stuck-repeats", "3,4", "--no-peers", "--progress", "never"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """20 turns polling one job (its status changing every other poll, or never in every fourth
    turn), with a failing ``sleep`` between polls, in the recorder's file and the Collector's; and
    the live configuration as a file, and one without the tool lists."""
    folder = tmp_path_factory.mktemp("polling")
    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(name="prod", soft_cap=6, hard_multiplier=3, stuck_repeat_threshold=3,
                            stateful_tools=("poll",), streak_exempt_tools=("sleep",),
                            recorder_path=str(folder / "turns.jsonl"), load_entrypoints=False,
                            disable_plugins=("shadow",))
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    for t in range(20):
        turn = guard.turn(turn_id=f"t{t}", promptable=False)
        for i in range(8 + t):
            poll = tg.ToolCall("poll", {"job": 1})
            status = "running" if t % 4 == 0 else f"step {i // 2}"
            if turn.check_call(poll).halted or turn.record_outcome(poll, "ok", result={"status": status}).halted:
                break
            nap = tg.ToolCall("sleep", {"s": i})
            if turn.check_call(nap).halted or turn.record_outcome(nap, "error").halted:
                break
        turn.end("completed")
    telemetry.tracer_provider.force_flush()
    spans = telemetry.spans()
    paths = {"lines": folder / "turns.jsonl", "spans": folder / "otlp.jsonl",
             "live": folder / "live.toml", "other": folder / "other.toml"}
    paths["spans"].write_text("\n".join(collector_lines(spans[i:i + 20] for i in range(0, len(spans), 20))) + "\n")
    paths["live"].write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items()))
    paths["other"].write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items() if not k.endswith("_tools")))
    return paths


def run(path: Path, config: Path) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([str(path), "--config", str(config), *GRID, "--json", "-"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    result = json.loads(out.getvalue())
    result.pop("inputs")
    return result, err.getvalue()


def default_halted(result: dict) -> int:
    return next(p for p in result["policies"] if p["default"])["unattended"]["halted"]


def test_the_recorders_file_and_the_collectors_give_the_same_json_for_polling_turns(fleet):
    from_lines, _ = run(fleet["lines"], fleet["live"])
    from_spans, _ = run(fleet["spans"], fleet["live"])
    assert from_spans == from_lines
    limits = from_lines["recording"]["policies"][0]["limits"]
    assert (limits["stateful_tools"], limits["streak_exempt_tools"]) == (["poll"], ["sleep"])


def test_the_result_digests_decide_the_replay_of_polling(fleet):
    """Without the stateful tool, the replay halts the polls whose status changes: the digest
    read from either file is what spares them."""
    with_digests, _ = run(fleet["spans"], fleet["live"])
    without, _ = run(fleet["spans"], fleet["other"])
    assert default_halted(with_digests) < default_halted(without)


@pytest.mark.parametrize("source", ["lines", "spans"])
def test_a_config_naming_other_tool_lists_is_warned_about_once(fleet, source):
    result, err = run(fleet[source], fleet["other"])
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1 and len(result["warnings"]) == 1
    for text in (lines[0], result["warnings"][0]):
        assert "stateful_tools poll in 20 turns (--config: none)" in text
        assert "streak_exempt_tools sleep in 20 turns (--config: none)" in text
        assert "give --config the live configuration" in text


@pytest.mark.parametrize("source", ["lines", "spans"])
def test_a_config_naming_the_recorded_tool_lists_is_not_warned_about(fleet, source):
    result, err = run(fleet[source], fleet["live"])
    assert "warning" not in err and result["warnings"] == []
