"""Every telemetry name in one module: our prefix, GenAI names only where the conventions have them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import turnguard as tg
from turnguard import Threshold
from turnguard.telemetry import _names as n
from turnguard.telemetry._metrics import Instruments

GENAI_CONVENTION_NAMES = {
    "gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.type",
    "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.agent.name", "gen_ai.conversation.id",
    "error.type",
}
"""Names the OpenTelemetry GenAI / general conventions define (research/ecosystem.md section 1)."""


def dotted_names() -> dict[str, str]:
    return {
        k: v for k, v in vars(n).items()
        if k.isupper() and isinstance(v, str) and "." in v
    }


def test_every_dotted_name_is_ours_or_a_convention_name():
    for constant, value in dotted_names().items():
        assert value.startswith("turnguard.") or value in GENAI_CONVENTION_NAMES, (constant, value)


def test_no_invented_gen_ai_names():
    invented = {v for v in dotted_names().values() if v.startswith("gen_ai.")} - GENAI_CONVENTION_NAMES
    assert invented == set()


def test_metric_names_units_and_attribute_lists():
    metrics = [v for k, v in vars(n).items() if k.startswith("METRIC_") and isinstance(v, tuple)]
    assert len(metrics) == 13
    for name, unit in metrics:
        assert name.startswith("turnguard.") and re.fullmatch(r"[a-z0-9_.]+", name)
        assert "total" not in name  # exporters add _total
        assert re.fullmatch(r"\{[a-z_]+\}", unit)  # UCUM annotations: dropped by the Prometheus translation
        assert name in n.METRIC_ATTRIBUTES
    for name, keys in n.METRIC_ATTRIBUTES.items():
        assert not set(keys) & n.FORBIDDEN_METRIC_ATTRIBUTES, name


def test_no_name_is_a_namespace_of_another_attribute():
    """An attribute name must not also be the prefix of another (semconv naming rule)."""
    attributes = set(dotted_names().values()) - {n.LOOP_DETECTED_EVENT, n.ESCALATION_RESOLVED_EVENT,
                                                 n.SHADOW_DETECTED_EVENT}
    for a in attributes:
        assert not any(b.startswith(a + ".") for b in attributes), a


def test_threshold_values_match_the_telemetry_contract():
    assert {t.value for t in Threshold} == {
        "explicit", "soft_stuck", "hard_backstop", "streak", "cycle_cap", "cycle_repeat",
    }
    assert n.NO_THRESHOLD not in {t.value for t in Threshold}


class RecordingMeter:
    """A meter that notes the name of every instrument created on it (a real SDK meter behind)."""

    def __init__(self, meter: Any) -> None:
        self.meter = meter
        self.created: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        create = getattr(self.meter, attr)
        if not attr.startswith("create_"):
            return create

        def record(name: str, *args: Any, **kwargs: Any) -> Any:
            self.created.append(name)
            return create(name, *args, **kwargs)
        return record


def documented_metrics() -> list[str]:
    text = (Path(__file__).resolve().parent.parent / "docs" / "telemetry.md").read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(turnguard\.[a-z_.]+)`", section, flags=re.MULTILINE)


def test_the_docs_metric_table_lists_every_instrument_turnguard_creates_once():
    from opentelemetry.sdk.metrics import MeterProvider

    meter = RecordingMeter(MeterProvider().get_meter("test"))
    Instruments(meter, tg.GuardConfig())
    documented = documented_metrics()
    assert sorted(documented) == sorted(set(documented))  # one row each
    assert set(documented) == set(meter.created) == set(n.METRIC_ATTRIBUTES)
