"""Polling reads alike from the recorder's file and the Collector's: a stateful tool's result
digest (the recorder line's ``result``, the tool span's ``turnguard.call.result_digest``) reaches
the replay either way, and so does each call's identity (the recorder line's ``args`` is the key
digest the span carries, whatever it looks like), so one fleet gives byte-identical ``--json``;
and the tool lists the turns ran under (``stateful_tools``, ``streak_exempt_tools``) are recorded,
so a ``--config`` that names others is warned about, on stderr and in ``--json``."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli
from turnguard._calibrate.inputs import read_turns
from turnguard._keys import Keyer
from turnguard.telemetry._testing import InMemoryTelemetry

LIVE = {"name": '"prod"', "soft_cap": 6, "hard_multiplier": 3, "stuck_repeat_threshold": 3,
        "stateful_tools": '["poll"]', "streak_exempt_tools": '["sleep"]'}
GRID = ["--soft-caps", "6", "--multipliers", "3,5", "--stuck-repeats", "3,4", "--no-peers", "--progress", "never"]
DIGEST_KEY = "polling-fleet-key"
NUMBER_DIGEST = re.compile(r"[1-9][0-9]{0,12}e[0-9]{3,}")
"""A key digest's hex that is JSON text, a number past a float's range: read as arguments, the
``canonical`` key mode parses it to ``inf``, so all such calls of a tool look like one call."""


def number_digest_args(tool: str, count: int) -> list[dict[str, str]]:
    """Arguments of ``count`` distinct calls of ``tool`` whose key digests (under ``DIGEST_KEY``)
    match ``NUMBER_DIGEST`` (about one in 5,000)."""
    keyer = Keyer("canonical", DIGEST_KEY)
    candidates = ({"path": f"src/{i}.py"} for i in itertools.count())
    found = (args for args in candidates if NUMBER_DIGEST.fullmatch(keyer.digest(tool, args).hex()))
    return list(itertools.islice(found, count))


def _number_digest_turn(turn: tg.Turn) -> None:
    """Ten distinct reads, three of whose digests read as ``inf`` (calls 5, 7 and 9, past S = 6:
    a D = 3 replay that took them for one call would halt the turn stuck at 9)."""
    odd = iter(number_digest_args("read", 3))
    for i in range(10):
        call = tg.ToolCall("read", next(odd) if i in (4, 6, 8) else {"path": f"notes/{i}.md"})
        turn.check_call(call)
        turn.record_outcome(call, "ok")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """20 turns polling one job (its status changing every other poll, or never in every fourth
    turn), with a failing ``sleep`` between polls, and a turn of distinct calls three of whose
    digests read as JSON numbers, in the recorder's file and the Collector's, each named
    ``in.jsonl`` in a folder of its own (``lines``, ``spans``: the outputs' ``inputs`` are alike);
    and the live configuration as a file, and one without the tool lists."""
    folder = tmp_path_factory.mktemp("polling")
    (folder / "lines").mkdir()
    (folder / "spans").mkdir()
    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(name="prod", soft_cap=6, hard_multiplier=3, stuck_repeat_threshold=3,
                            stateful_tools=("poll",), streak_exempt_tools=("sleep",), digest_key=DIGEST_KEY,
                            recorder_path=str(folder / "lines" / "in.jsonl"), load_entrypoints=False,
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
    with guard.turn(turn_id="numbers", promptable=False) as turn:
        _number_digest_turn(turn)
    telemetry.tracer_provider.force_flush()
    spans = telemetry.spans()
    paths = {"lines": folder / "lines" / "in.jsonl", "spans": folder / "spans" / "in.jsonl",
             "live": folder / "live.toml", "other": folder / "other.toml"}
    paths["spans"].write_text("\n".join(collector_lines(spans[i:i + 20] for i in range(0, len(spans), 20))) + "\n")
    paths["live"].write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items()))
    paths["other"].write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items() if not k.endswith("_tools")))
    return paths


def run_text(path: Path, config: Path) -> tuple[str, str]:
    """``--json`` as calibrate writes it, run from the input's folder (``inputs`` names ``in.jsonl``)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path.parent)
        code = cli.main([path.name, "--config", str(config), *GRID, "--json", "-"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def run(path: Path, config: Path) -> tuple[dict, str]:
    text, err = run_text(path, config)
    return json.loads(text), err


def default_halted(result: dict) -> int:
    return next(p for p in result["policies"] if p["default"])["unattended"]["halted"]


def test_the_recorders_file_and_the_collectors_give_byte_identical_json_for_polling_turns(fleet):
    from_lines, _ = run_text(fleet["lines"], fleet["live"])
    from_spans, _ = run_text(fleet["spans"], fleet["live"])
    assert from_spans == from_lines
    result = json.loads(from_lines)
    limits = result["recording"]["policies"][0]["limits"]
    assert (limits["stateful_tools"], limits["streak_exempt_tools"]) == (["poll"], ["sleep"])
    d3 = [p for p in result["policies"] if p["params"]["stuck_repeat"] == 3]
    assert d3 and all(p["unattended"]["halted"] for p in d3)  # the rows replay, and halt some polling


def test_a_recorded_digest_that_reads_as_a_number_is_a_digest_not_arguments(fleet):
    """The recorder line's ``args`` is the call's key digest, as on its tool span: three distinct
    calls whose digests are JSON number text are three calls, not one ``inf`` repeated (which a
    D = 3 row would halt stuck)."""
    for source in ("lines", "spans"):
        turn = next(t for t in read_turns([fleet[source]], pytest.fail) if t.id == "numbers")
        digests = [c.digest for c in turn.calls]
        assert [c.args for c in turn.calls] == [None] * 10 and len(set(digests)) == 10, source
        assert sum(1 for d in digests if NUMBER_DIGEST.fullmatch(d)) == 3, source
    lines = [json.loads(line) for line in fleet["lines"].read_text().splitlines()]
    numbers = next(line for line in lines if line.get("id") == "numbers")
    assert [c["args"] for c in numbers["calls"]] == digests
    one = fleet["lines"].parent.parent / "numbers" / "in.jsonl"
    one.parent.mkdir(exist_ok=True)
    checked = {**numbers, "id": "checked", "calls": [{**c, "cycle": 1} for c in numbers["calls"]]}  # the long path
    one.write_text(json.dumps(numbers) + "\n" + json.dumps(checked) + "\n")
    for turn in read_turns([one], pytest.fail):
        assert [c.digest for c in turn.calls] == digests and {c.args for c in turn.calls} == {None}, turn.id
    result, _ = run(one, fleet["live"])
    d3 = [p["unattended"]["halted"] for p in result["policies"] if p["params"]["stuck_repeat"] == 3]
    assert d3 and set(d3) == {0}


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
        assert "stateful_tools poll in 21 turns (--config: none)" in text
        assert "streak_exempt_tools sleep in 21 turns (--config: none)" in text
        assert "give --config the live configuration" in text


@pytest.mark.parametrize("source", ["lines", "spans"])
def test_a_config_naming_the_recorded_tool_lists_is_not_warned_about(fleet, source):
    result, err = run(fleet[source], fleet["live"])
    assert "warning" not in err and result["warnings"] == []
