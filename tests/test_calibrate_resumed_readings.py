"""A resumed turn read from the recorder's file and the Collector's of one fleet (the first example in
docs/calibration.md) is one turn. The recorder's line lists the whole turn; the resumed part's span
lists only the calls since the resume (recorded in part). Compared whole, the two readings were
"different turns under one id", and neither was read: every resumed turn was lost. A reading
recorded in part is now compared on what it carries, and the complete reading is the one counted."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli

LIVE = {"soft_cap": 10, "hard_multiplier": 3, "stuck_repeat_threshold": 4, "streak_warn_at": 3, "streak_stop_at": 5}
PROBE = {"rate": 0.5, "hard_multiplier": 6, "stuck_repeat_threshold": 8, "streak_warn_at": 6, "streak_stop_at": 10}
FLEET = 24
UNCOMPARED = ("duplicates", "inputs", "suspended_parts")
"""What reading the Collector's file beside the recorder's adds: the readings dropped, the inputs
named, the spans of suspended parts."""


def _steps(rng: random.Random, i: int) -> list[tuple[tg.ToolCall, str]]:
    kind = i % 4
    if kind == 0:
        return [(tg.ToolCall("read", {"p": f"{i}/{n}"}), "ok") for n in range(rng.randint(2, 40))]
    if kind == 1:
        return [(tg.ToolCall("get", {"u": i}), "error")] * rng.randint(2, 12) + [(tg.ToolCall("get", {"u": i}), "ok")]
    if kind == 2:
        return [(tg.ToolCall("test", {}), "error"), (tg.ToolCall("edit", {"p": i}), "ok")] * rng.randint(3, 20)
    return [(tg.ToolCall("read", {"p": f"{i}/{n % 5}"}), "ok") for n in range(rng.randint(5, 30))]


def _run(turn: tg.Turn, steps: list[tuple[tg.ToolCall, str]]) -> bool:
    for call, outcome in steps:
        if turn.check_call(call).halted or turn.record_outcome(call, outcome).halted:
            return False
    return True


def _fleet(folder: Path, seed: int) -> tuple[Path, Path]:
    """``FLEET`` turns, each put aside and resumed 0 to 3 times at random calls (before its first,
    after a halt, after its last), results in the turn or none; the recorder's file and the
    Collector's."""
    from turnguard.telemetry._testing import InMemoryTelemetry

    rng = random.Random(seed)
    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(load_entrypoints=False, recorder_path=str(folder / "lines.jsonl"), probe=PROBE, **LIVE)
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    for i in range(FLEET):
        steps = _steps(rng, i)
        cuts = sorted(rng.randint(0, len(steps)) for _ in range(rng.choice((0, 1, 1, 2, 3))))
        turn = guard.turn(turn_id=f"t{i}", durable=True, promptable=False, agent_name="coder")
        done, at = True, 0
        for cut in [*cuts, len(steps)]:
            done = done and _run(turn, steps[at:cut])
            at = cut
            if cut != len(steps) or cut in cuts:
                turn = guard.resume(json.loads(json.dumps(turn.suspend())))
        if rng.random() < 0.7:
            turn.report_result(done)
        turn.end()
    telemetry.tracer_provider.force_flush()
    spans = telemetry.spans()
    otlp = folder / "otlp.jsonl"
    otlp.write_text("\n".join(collector_lines(spans[j:j + 7] for j in range(0, len(spans), 7))) + "\n")
    return folder / "lines.jsonl", otlp


def _calibrate(*paths: Path) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, paths), "--soft-caps", "10", "--multipliers", "3,6", "--stuck-repeats", "4",
                     "--streaks", "3:5", "--no-peers", "--progress", "never", "--json", "-"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()


def _figures(result: dict) -> dict:
    """The result without ``UNCOMPARED``, its lists of turn ids sorted (they list turns in the order read)."""
    def ids_sorted(node):
        if isinstance(node, dict):
            return {k: sorted(v) if k.endswith("_ids") else ids_sorted(v) for k, v in node.items()}
        return [ids_sorted(v) for v in node] if isinstance(node, list) else node
    return ids_sorted({k: v for k, v in result.items() if k not in UNCOMPARED})


@pytest.mark.parametrize("seed", range(4))
def test_the_recorders_and_the_collectors_file_of_one_fleet_count_each_resumed_turn_once(tmp_path, seed):
    lines, otlp = _fleet(tmp_path, seed)
    alone, _ = _calibrate(lines)
    for order in ((lines, otlp), (otlp, lines)):
        both, err = _calibrate(*order)
        assert "different turns" not in err and both["problems"] == 0
        assert (both["turns"], both["duplicates"]) == (FLEET, FLEET)
        assert _figures(both) == _figures(alone)  # the complete readings are the ones counted


def _edited(otlp: Path, turn_id: str, edit) -> None:
    """The Collector's file with ``edit`` applied to the attributes of ``turn_id``'s resumed part."""
    text = otlp.read_text()
    data = [json.loads(line) for line in text.splitlines()]
    for line in data:
        for resource in line["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    edit(span)
    otlp.write_text("\n".join(json.dumps(line) for line in data) + "\n")


def _attrs(span: dict) -> dict:
    return {a["key"]: a["value"] for a in span.get("attributes", [])}


def _resumed_fleet(tmp_path: Path) -> tuple[Path, Path, str, int]:
    """One turn resumed after 4 of its 9 calls, beside one never put aside: the files, the resumed
    turn's id and its first call past the resume."""
    from turnguard.telemetry._testing import InMemoryTelemetry

    telemetry = InMemoryTelemetry()
    config = tg.GuardConfig(load_entrypoints=False, recorder_path=str(tmp_path / "lines.jsonl"), digest_key="k")
    guard = tg.Guard(config, environ={}, **telemetry.providers())
    turn = guard.turn(turn_id="resumed", durable=True, agent_name="coder")
    _run(turn, [(tg.ToolCall("read", {"p": n}), "ok") for n in range(4)])
    turn = guard.resume(json.loads(json.dumps(turn.suspend())))
    _run(turn, [(tg.ToolCall("read", {"p": n}), "ok") for n in range(4, 9)])
    turn.report_result(True)
    turn.end()
    with guard.turn(turn_id="plain", agent_name="coder") as other:
        _run(other, [(tg.ToolCall("read", {"p": n}), "ok") for n in range(3)])
    telemetry.tracer_provider.force_flush()
    otlp = tmp_path / "otlp.jsonl"
    otlp.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    return tmp_path / "lines.jsonl", otlp, "resumed", 5


def _in_resumed_part(span: dict, index: int | None = None) -> bool:
    """Whether ``span`` is a tool span of the resumed part (numbered past the resume), call
    ``index`` if given."""
    number = _attrs(span).get("turnguard.call.index", {}).get("intValue")
    return number is not None and int(number) >= 5 and (index is None or int(number) == index)


def _rename_tool(span: dict) -> None:
    if _in_resumed_part(span, 7):
        span["name"] = "execute_tool write"
        for a in span["attributes"]:
            if a["key"] == "gen_ai.tool.name":
                a["value"] = {"stringValue": "write"}


def _flip_result(span: dict) -> None:
    attrs = _attrs(span)
    if attrs.get("turnguard.turn.id") == {"stringValue": "resumed"} and "turnguard.turn.resolved" in attrs and \
            attrs.get("turnguard.turn.outcome") != {"stringValue": "suspended"}:
        for a in span["attributes"]:
            if a["key"] == "turnguard.turn.resolved":
                a["value"] = {"boolValue": False}


def _other_digest(span: dict) -> None:
    if _in_resumed_part(span, 9):
        for a in span["attributes"]:
            if a["key"] == "turnguard.call.key_digest":
                a["value"] = {"stringValue": "0" * 16}


@pytest.mark.parametrize("edit", [_rename_tool, _flip_result, _other_digest])
def test_a_reading_recorded_in_part_that_is_another_turn_is_still_refused(tmp_path, edit):
    """The resumed part's span says something the recorder's line does not (another tool at call 7,
    another result, another call at 9): two turns under one id, neither read, in either order."""
    lines, otlp, turn_id, _ = _resumed_fleet(tmp_path)
    untouched, err = _calibrate(lines, otlp)
    assert (untouched["turns"], untouched["duplicates"], untouched["problems"]) == (2, 2, 0), err
    _edited(otlp, turn_id, edit)
    for order in ((lines, otlp), (otlp, lines)):
        result, err = _calibrate(*order)
        assert f"turn {turn_id!r}: different turns under one id" in err
        assert (result["turns"], result["duplicates"]) == (1, 1)
