"""The OpenTelemetry plugin: spans, the loop-detected event and metrics, wired to the hooks.

It depends on ``opentelemetry-api`` only. Providers are injected (``Guard(tracer_provider=...,
meter_provider=..., logger_provider=...)``) or taken from the globals, which are no-op proxies
until the host installs an SDK: the plugin is always registered and costs next to nothing then,
and a host that has an SDK gets turnguard's telemetry with no extra code.

Each signal has its module: ``spans`` (the turn and call spans, the per-call hooks), ``events``
(log records) and ``metrics`` (instruments shared per meter provider); every name and limit is
in ``names``. Tool arguments are exported (``gen_ai.tool.call.arguments``) only with
``GuardConfig(capture_content=True)``; a result the host passes with an outcome is exported as its
keyed digest only (``turnguard.call.result_digest``), when the guard keyed it.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger_provider

from turnguard._plugins import disabled_policies
from turnguard.hookspecs import hookimpl
from turnguard.telemetry import _names as n
from turnguard.telemetry._cardinality import closed
from turnguard.telemetry._events import EventLog
from turnguard.telemetry._metrics import COHORT_LABELS, Instruments, MainHalt, instruments_for
from turnguard.telemetry._spans import SpanReporter
from turnguard.telemetry._text import export_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from turnguard._config import GuardConfig
    from turnguard._ledger import Ledger
    from turnguard._model import LoopDetectedEvent, ToolCall, TurnSummary
    from turnguard._task_results import ResultLabels

T = TypeVar("T")
Facts = TypeVarTuple("Facts")


class OtelPlugin(SpanReporter):
    """Observes every decision and reports it as spans, log-record events and metrics.

    The per-call hooks concern spans only and are ``SpanReporter``'s own (inherited, so the hot
    path pays no delegation); the hooks below report one fact on each signal it concerns.
    """

    def __init__(self, config: GuardConfig, tracer: trace.Tracer, logger: Any, instruments: Instruments) -> None:
        super().__init__(tracer, capture_content=config.capture_content, policy=policy_attributes(config))
        self.config = config
        self.logger = logger
        self.events = EventLog(logger)
        self.instruments = instruments
        self.scope = instruments.scope(config.name)
        """What every metric point of this guard carries (``turnguard.policy``)."""
        self.main_policy = config.shadow_configs()[0][0] if config.shadow else None
        """On a probe guard, the main configuration's shadow (``probe_guard_config`` puts it first)."""
        self._main_halts: weakref.WeakKeyDictionary[Any, MainHalt] = weakref.WeakKeyDictionary()
        """Open probe turns the main configuration would have halted (the shadow reports end first;
        a late result has it in its ``ResultLabels``)."""

    @hookimpl
    def turnguard_loop_detected(self, turn: Ledger, event: LoopDetectedEvent) -> None:
        with Signals() as signals:
            span = signals.run(lambda: self.detection_span(turn, event))
            signals.run(lambda: self.instruments.loop_detected(event, self.in_turn(turn), exemplar_context(span)))
            signals.run(lambda: self.events.loop_detected(event, span))

    @hookimpl
    def turnguard_escalation_resolved(self, turn: Ledger, event: LoopDetectedEvent, response: str) -> None:
        self.metric_and_log(turn, self.instruments.escalation_resolved, self.events.escalation_resolved,
                            event, response)

    @hookimpl
    def turnguard_plugin_error(self, plugin: str, hook: str, error: BaseException) -> None:
        self.instruments.plugin_error(plugin, hook, error, self.scope)

    @hookimpl
    def turnguard_outcome_ignored(self, turn: Ledger, call: ToolCall, reason: str) -> None:
        self.instruments.outcome_ignored(call.name, turn.agent_name, reason, self.scope)

    # -- shadow policies: what they would have done ---------------------------------------------

    @hookimpl
    def turnguard_shadow_detected(self, turn: Ledger, policy: str, event: LoopDetectedEvent) -> None:
        self.metric_and_log(turn, self.instruments.shadow_detected, self.events.shadow_detected, policy, event)

    @hookimpl
    def turnguard_shadow_turn_ended(self, turn: Ledger, policy: str, summary: TurnSummary) -> None:
        if summary.halted and policy == self.main_policy and turn.cohort == "probe":
            self._main_halts[turn] = MainHalt(str(summary.threshold), summary.tool_calls)
        self.instruments.shadow_turn_ended(policy, dataclasses.replace(summary, cohort=turn.cohort), self.scope)

    @hookimpl
    def turnguard_turn_ended(self, turn: Ledger, summary: TurnSummary) -> None:
        """The turn's metric points and the end of its span, each reported whether the other fails."""
        soft_cap = turn.soft_cap
        past_soft_cap = soft_cap is not None and summary.tool_calls > soft_cap
        main_halt = self._main_halts.pop(turn, None) if summary.cohort == "probe" else None
        with Signals() as signals:
            signals.run(lambda: self.instruments.turn_ended(summary, self.scope, past_soft_cap=past_soft_cap,
                                                            context=exemplar_context(self.turn_span(turn)),
                                                            main_halt=main_halt))
            signals.run(lambda: self.end_turn(turn, summary))

    @hookimpl
    def turnguard_turn_suspended(self, turn: Ledger, summary: TurnSummary) -> None:
        """Put aside to be resumed: its span ends (``turnguard.turn.outcome`` ``suspended``), no
        metric point (the process that finishes the turn records it, once)."""
        self._main_halts.pop(turn, None)
        self.end_turn(turn, summary)

    @hookimpl
    def turnguard_turn_result(self, resolved: bool | None, status: str, labels: ResultLabels | None) -> None:
        with Signals() as signals:
            signals.run(lambda: self.instruments.turn_result(labels, resolved, status, self.scope))
            if status == "accepted" and labels is not None:
                signals.run(lambda: self.events.turn_result(labels, bool(resolved)))

    def in_turn(self, turn: Ledger) -> dict[str, Any]:
        """``scope`` with the turn's cohort: the attributes of a point about one turn."""
        return {**self.scope, n.TURN_COHORT: closed(turn.cohort, COHORT_LABELS)}

    def metric_and_log(self, turn: Ledger, metric: Callable[[*Facts, dict[str, Any]], None],
                       log: Callable[[*Facts, Any], None], *facts: *Facts) -> None:
        """One fact of ``turn`` as a metric point in the turn's scope and a log record under the turn
        span, each reported whether the other fails."""
        with Signals() as signals:
            signals.run(lambda: metric(*facts, self.in_turn(turn)))
            signals.run(lambda: log(*facts, self.turn_span(turn)))


class Signals:
    """The reports of one hook on several signals (spans, metrics, logs), each run whether another
    failed: a metric the SDK refuses must not leave the turn span open or drop the log record.
    The first failure is raised when the block ends, so the guard still reports it as this
    plugin's error (``turnguard.plugin.errors``)."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: Exception | None = None

    def __enter__(self) -> Signals:
        return self

    def run(self, report: Callable[[], T]) -> T | None:
        """``report()``'s value, or ``None`` when it raised (kept to raise at the end)."""
        try:
            return report()
        except Exception as exc:
            if self.error is None:
                self.error = exc
            return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.error is not None and kind is None:
            raise self.error


def policy_attributes(config: GuardConfig) -> dict[str, Any]:
    """The policy's name and the thresholds in force, for the turn span (the caps are added there
    per turn: ``turnguard.loop.soft_cap`` / ``hard_cap``; ``turnguard.loop.max_cycles`` is 0 when
    unbounded; ``cycle_repeat``'s levels are 0 when off), the tool lists that change how calls
    count, and the other settings a replay decides by: every limit the recorder line's ``limits``
    has (``turn_limits``), so calibrate can tell when ``--config`` is not what the turns ran under."""
    attrs: dict[str, Any] = {
        n.POLICY: config.name,
        n.POLICY_STUCK_REPEAT: config.stuck_repeat_threshold,
        n.POLICY_STUCK_SIGNAL: config.stuck_signal,
        n.POLICY_STREAK_WARN_AT: config.streak_warn_at,
        n.POLICY_STREAK_STOP_AT: config.streak_stop_at,
        n.POLICY_STREAK_STOP_ON: config.streak_stop_on,
        n.POLICY_MAX_CYCLES: config.max_cycles_per_turn,
        n.POLICY_CYCLE_REPEAT_WARN_AT: config.cycle_repeat_warn_at,
        n.POLICY_CYCLE_REPEAT_STOP_AT: config.cycle_repeat_stop_at,
        n.POLICY_CYCLE_REPEAT_MAX_PERIOD: config.cycle_repeat_max_period,
        n.POLICY_STATEFUL_TOOLS: [export_text(tool) for tool in config.stateful_tools],
        n.POLICY_STREAK_EXEMPT_TOOLS: [export_text(tool) for tool in config.streak_exempt_tools],
        n.POLICY_REMIND_MODEL: config.remind_model,
        n.POLICY_MAX_TRACKED_KEYS: config.max_tracked_keys,
        n.POLICY_DISABLED: list(disabled_policies(config)),
    }
    return attrs


def plugin_for(
    config: GuardConfig,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
    scope_version: str | None = None,
    **_: Any,
) -> OtelPlugin:
    """The plugin for one guard; providers default to the (possibly no-op) globals.
    ``scope_version``: the instrumentation scope's version (turnguard's, given by the package)."""
    tracer_provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    meter_provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    logger_provider = logger_provider if logger_provider is not None else get_logger_provider()
    return OtelPlugin(
        config,
        tracer_provider.get_tracer(n.SCOPE, scope_version),
        logger_provider.get_logger(n.SCOPE, scope_version),
        instruments_for(meter_provider, config, scope_version),
    )


def exemplar_context(span: Any) -> Any:
    """A context holding ``span``, for a metric point's exemplar (its trace and span id); ``None``
    (the current context) without a span."""
    return None if span is None else trace.set_span_in_context(span)
