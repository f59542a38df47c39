"""Text from the model never breaks an export: every string turnguard puts on a span, a log record
or a metric point encodes through the real OTLP encoders (lone surrogates become U+FFFD) and is at
most ``MAX_ID_LENGTH`` characters, whatever the host passes for tool names, agent names,
conversation, turn and call ids, end reasons, thresholds, plugin names, error types and arguments."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

import turnguard as tg
from turnguard._config import valid_name
from turnguard._model import MAX_ID_LENGTH, id_text
from turnguard.telemetry import _names as n
from turnguard.telemetry._testing import InMemoryTelemetry
from turnguard.telemetry._text import CUT_MARK, export_text


class Text(str):
    """A str subclass whose methods all raise: only its text may be used."""

    def _no(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("hostile str method")

    __str__ = __repr__ = __format__ = encode = isascii = strip = _no  # type: ignore[assignment]


class Opaque:
    """An id of no known type whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


def lone(code: int) -> str:
    return json.loads(f'"\\u{code:04x}"')


def hostile_texts() -> list[str]:
    """Strings a model or a JSON decoder can hand a host, each one a case."""
    low, high = lone(0xDC80), lone(0xD83D)
    rng = random.Random(21)
    fuzz = ["".join(chr(rng.choice([rng.randrange(0xD800, 0xE000), rng.randrange(0x20, 0x7F),
                                    rng.randrange(0x80, 0x10FFFF), rng.randrange(0, 0x20)]))
                    for _ in range(rng.randrange(1, 400)))
            for _ in range(12)]
    return [
        low, high, f"read{low}", f"{high}file", "pair\ud83d\ude00spelled", "😀 emoji", "nul\x00byte",
        "\x1b[31mred\x1b[0m", "line\nbreak\ttab", "\u202eevil", "ǅ̸͇", "x" * 300, "é" * 300,
        "a" * (MAX_ID_LENGTH - 1) + high + low, "a" * (MAX_ID_LENGTH - 1) + low, "{0}%s%n", '"quoted\\"',
        Text("subclassed"), *fuzz,
    ]


HOSTILE = hostile_texts()
NOT_TEXT: list[Any] = [12345, 10**5000, Opaque(), ("a", 1), 1.5]


class Thresholds:
    """A third-party policy whose threshold name is the hostile text, and which raises once."""

    def __init__(self, text: str) -> None:
        self.text = str.__str__(text)  # a plugin is code: the text is hostile, the object is not
        self.raised = False

    @tg.hookimpl
    def turnguard_check_call(self, turn, call):
        if turn.tool_calls == 2:
            return turn.detect(self.text, tg.Action.ALLOW, tg.Level.WARN, 2, call=call)
        if turn.tool_calls == 3 and not self.raised:
            self.raised = True
            raise type(str.__str__(self.text), (Exception,), {})("boom " + self.text)
        return None


def run_turns(otel: InMemoryTelemetry, text: Any) -> None:
    """Every path that exports host text, with ``text`` in each place it can go."""
    name = text if isinstance(text, str) else "tool"
    policy = str.__str__(text)[:64] if isinstance(text, str) and valid_name(text[:64]) else "pé-😀"
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",), capture_content=True,
                                    streak_warn_at=3, streak_stop_at=5, soft_cap=20, hard_multiplier=2,
                                    name=policy, shadow={f"{policy[:60]}-alt": {"streak_warn_at": 2}}),
                     environ={}, **otel.providers())
    if isinstance(text, str):
        guard.register(Thresholds(text), name=str.__str__(text))
    with guard.turn(agent_name=text, conversation_id=text, turn_id=text, promptable=True) as turn:
        turn.begin_cycle()
        same = tg.ToolCall(name, {"arg": text}, call_id=text)
        for i in range(6):
            call = same if i < 5 else tg.ToolCall(name, text if isinstance(text, str) else b"\xff\xfe", call_id=i)
            verdict = turn.check_call(call)
            if verdict.action is tg.Action.ASK:
                turn.resolve(verdict, "continue")
            if not verdict.halted:
                turn.record_outcome(call, "error")
        turn.record_outcome(tg.ToolCall(name, {}, call_id="never-checked"), "ok")  # a host error
        turn.end(text if isinstance(text, str) else "completed")
    guard.report_result(turn.turn_id, True)
    with guard.turn(agent_name=text) as runaway:  # to the backstop: a halt and its event
        while not runaway.check_call(tg.ToolCall(name, {"i": runaway.ledger.tool_calls})).halted:
            pass


def strings_in(message: Any) -> Iterator[str]:
    """Every string field of a protobuf message, recursively."""
    for field, value in message.ListFields():
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        values = value if repeated else [value]
        for item in values:
            if field.type == field.TYPE_MESSAGE:
                yield from strings_in(item)
            elif field.type == field.TYPE_STRING:
                yield item


def encoded(otel: InMemoryTelemetry) -> list[Any]:
    """What the OTLP exporters would send, encoded and serialized as they do."""
    messages = [encode_spans(otel.spans()), encode_logs(otel.log_exporter.get_finished_logs())]
    data = otel.metric_reader.get_metrics_data()
    messages.append(encode_metrics(data))
    for message in messages:
        message.SerializeToString()
    return messages


def case_id(text: Any) -> str:
    return f"{type(text).__name__}-{len(str.__str__(text)) if isinstance(text, str) else 0}"


@pytest.mark.parametrize("text", HOSTILE + NOT_TEXT, ids=case_id)
def test_every_signal_encodes_through_otlp_whatever_the_text(text, caplog):
    otel = InMemoryTelemetry()
    run_turns(otel, text)
    messages = encoded(otel)
    dropped = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert not dropped  # the encoders drop (and log) an attribute they cannot encode
    found = [s for m in messages for s in strings_in(m)]
    assert all(len(s) <= MAX_ID_LENGTH for s in found), max(found, key=len)[:80]
    assert all(c < "\ud800" or c > "\udfff" for s in found for c in s)
    names = {s.name for s in otel.spans()}
    assert any(name.startswith("invoke_agent") for name in names) and any(name.startswith("execute_tool")
                                                                         for name in names)
    assert otel.logs(n.LOOP_DETECTED_EVENT)
    assert bool(otel.logs(n.TURN_RESULT_EVENT)) == (id_text(text) is not None)  # an id with no text: no result
    assert otel.points(n.METRIC_HOST_ERRORS[0]) and otel.points(n.METRIC_DETECTIONS[0])
    assert otel.points(n.METRIC_SHADOW_DETECTIONS[0]) and otel.logs(n.SHADOW_DETECTED_EVENT)
    if isinstance(text, str):
        assert otel.points(n.METRIC_PLUGIN_ERRORS[0])
        expected = export_text(text)
        tools = {p.attributes[n.GEN_AI_TOOL_NAME] for p in otel.points(n.METRIC_DETECTIONS[0])}
        assert expected in tools  # the same clean text on every signal
        assert expected in {s.attributes.get(n.GEN_AI_TOOL_NAME) for s in otel.spans()}
        assert expected in {r.attributes.get(n.LOOP_THRESHOLD) for r in otel.logs(n.LOOP_DETECTED_EVENT)}


def test_lone_surrogates_become_the_replacement_character_and_long_text_is_cut():
    low = lone(0xDC80)
    assert export_text(f"a{low}b") == "a\ufffdb"
    assert export_text("pair\ud83d\ude00") == "pair😀"
    cut = export_text("é" * 1000)
    assert len(cut) == MAX_ID_LENGTH and cut.endswith(CUT_MARK)
    assert export_text("a" * (MAX_ID_LENGTH - 1) + "\ud83d\ude00") == "a" * (MAX_ID_LENGTH - 1) + CUT_MARK
    assert export_text("plain") == "plain" and export_text(12345) == "12345"
    assert export_text(Opaque()) == "<Opaque>" and export_text(10**5000) == "<int>"
    assert export_text(Text("sub")) == "sub" and type(export_text(Text("sub"))) is str


def test_a_batch_with_hostile_names_exports_whole_and_so_does_the_next(otel):
    """The audit's case: 40 turns whose tool and agent names hold lone surrogates, then clean ones."""
    guard = tg.Guard(tg.GuardConfig(load_entrypoints=False, disable_plugins=("recorder",)), environ={},
                     **otel.providers())
    for i in range(40):
        with guard.turn(agent_name=f"agent{lone(0xDC80 + i)}") as turn:
            call = tg.ToolCall(f"tool{lone(0xD800 + i)}", {"i": i})
            turn.check_call(call)
            turn.record_outcome(call, "ok")
    hostile = encode_spans(otel.spans())
    assert len([s for r in hostile.resource_spans for sc in r.scope_spans for s in sc.spans]) == 80
    assert len(hostile.SerializeToString()) > 0
