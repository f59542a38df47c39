"""A host that traces: its turn span (a host span carrying ``turnguard.turn.id``) shares the host's
instrumentation scope, turnguard's tool spans are in turnguard's; the file exporter groups a batch
by scope, so the turn span may come before its tool spans in the same line. Calibrate rebuilds the
same turns from the spans as from the recorder, however the batches are cut."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import turnguard as tg
from collector_lines import collector_lines
from turnguard._calibrate import cli
from turnguard.telemetry._testing import InMemoryTelemetry


def hosted_turns(folder: Path, count: int, seed: int) -> tuple[Path, list]:
    """``count`` turns run inside host spans (the host's model requests traced too), recorded by
    the recorder; the spans, in the order they ended."""
    rng = random.Random(seed)
    telemetry = InMemoryTelemetry()
    providers = telemetry.providers()
    recorder = folder / "turns.jsonl"
    guard = tg.Guard(tg.GuardConfig(recorder_path=str(recorder), load_entrypoints=False, soft_cap=4,
                                    hard_multiplier=2), environ={}, **providers)
    host = providers["tracer_provider"].get_tracer(rng.choice(["my-host", "a-host"]))
    for n in range(count):
        with host.start_as_current_span(f"agent run {n}"), guard.turn(turn_id=f"t{n}", promptable=False) as turn:
            for _ in range(rng.randint(0, 12)):
                with host.start_as_current_span("chat gpt-4o"):
                    pass
                call = tg.ToolCall(rng.choice(["bash", "read"]), rng.choice(["make", "ls"]))
                if turn.check_call(call).halted:
                    break
                if turn.record_outcome(call, rng.choice([tg.Outcome.OK, tg.Outcome.ERROR])).halted:
                    break
    telemetry.tracer_provider.force_flush()
    return recorder, list(telemetry.spans())


def calibrate_json(path: Path) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    assert cli.main([str(path), "--json", "-", "--no-peers", "--progress", "never"], stdout=out, stderr=err) == 0
    data = json.loads(out.getvalue())
    data.pop("inputs", None)
    for key in ("first_started", "last_ended", "days"):  # the host's span times, not the turn's
        data["recording"].pop(key)
    return data, err.getvalue()


@pytest.mark.parametrize("seed", range(4))
def test_turns_whose_host_scope_comes_first_in_a_line_are_rebuilt_whole(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    recorder, spans = hosted_turns(tmp_path, 12, seed)
    cuts = sorted(rng.sample(range(1, len(spans)), k=min(len(spans) - 1, rng.randint(0, 6))))
    batches = [spans[a:b] for a, b in zip([0, *cuts], [*cuts, len(spans)], strict=True)]
    lines = tmp_path / "otlp.jsonl"
    lines.write_text("\n".join(collector_lines(batches)) + "\n")
    first = json.loads(collector_lines([spans])[0])["resourceSpans"][0]["scopeSpans"][0]["scope"]["name"]
    assert first != "turnguard", "the host's scope comes first in a line"
    from_spans, problems = calibrate_json(lines)
    assert problems == ""
    assert from_spans == calibrate_json(recorder)[0]
