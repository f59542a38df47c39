"""Metrics: one set of instruments and attribute-value bounds per meter provider.

Every metric attribute takes its values from a closed set (``closed``: turnguard names each value,
anything else is ``_other``) or a bounded one (``BoundedValues``: _names.py's limits, past which a
third-party value folds into ``_other`` while turnguard's own values always pass), and none carries
ids, arguments or results, so a host's metric cardinality stays fixed whatever the model, a plugin
or a result token sends.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turnguard._config import GuardConfig
from turnguard._model import PLUGIN_ERROR_THRESHOLD, Action, Threshold
from turnguard._plugins import DEFAULT_PLUGINS, NON_POLICY_PLUGINS
from turnguard._probe import COHORTS
from turnguard.hookspecs import __all__ as HOOK_NAMES
from turnguard.telemetry import _buckets as buckets
from turnguard.telemetry import _names as n
from turnguard.telemetry._cardinality import BoundedValues, closed

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from opentelemetry import metrics
    from opentelemetry.context import Context

    from turnguard._model import LoopDetectedEvent, TurnSummary
    from turnguard._task_results import ResultLabels


BUILTIN_THRESHOLDS = frozenset((*(t.value for t in Threshold), PLUGIN_ERROR_THRESHOLD))
"""The thresholds turnguard's own policies give, and a failing plugin's halt (a closed set; a
third-party policy may add more)."""
BUILTIN_REASONS = frozenset((*n.BUILTIN_TURN_OUTCOMES, n.SHADOW_LIVE_HALTED))
BUILTIN_PLUGINS = frozenset((*DEFAULT_PLUGINS, *NON_POLICY_PLUGINS))
BUILTIN_HOOKS = frozenset(name for name in HOOK_NAMES if name.startswith("turnguard_"))
DEFAULT_POLICY = str(next(f.default for f in dataclasses.fields(GuardConfig) if f.name == "name"))
"""The policy name of a configuration not named (``GuardConfig.name``'s default)."""
COHORT_LABELS = frozenset(COHORTS)
CAP_MODE_LABELS = frozenset(n.CAP_MODES)
LEVEL_LABELS = frozenset(n.LEVELS)
ANSWER_LABELS = frozenset(n.ANSWERS)
HOST_ERROR_LABELS = frozenset(n.HOST_ERRORS)
STATUS_LABELS = frozenset(n.RESULT_STATUSES)


def _histogram(
    meter: metrics.Meter, metric: tuple[str, str], description: str, edges: Sequence[float]
) -> metrics.Histogram:
    """A histogram with the (name, unit) pair ``metric`` from _names.py, with advisory bucket edges."""
    name, unit = metric
    return meter.create_histogram(name, unit, description, explicit_bucket_boundaries_advisory=edges)


def _counter(meter: metrics.Meter, metric: tuple[str, str], description: str) -> metrics.Counter:
    """A counter with the (name, unit) pair ``metric`` from _names.py."""
    name, unit = metric
    return meter.create_counter(name, unit, description)


class Instruments:
    """turnguard's instruments on one meter provider, with the attribute-value bounds.

    Shared by every guard on that provider, so the bounds hold per process and provider, not per
    guard. The histograms' bucket edges come from the first guard's configuration (the SDK keeps
    the first advisory for a name); a user's View overrides them.
    """

    def __init__(self, meter: metrics.Meter, config: GuardConfig) -> None:
        tool_call_edges = buckets.tool_call_edges(config)
        self.turn_tool_calls = _histogram(
            meter, n.METRIC_TURN_TOOL_CALLS, "Tool calls checked per turn, by how the turn ended.", tool_call_edges
        )
        self.turn_cycles = _histogram(
            meter, n.METRIC_TURN_CYCLES, "Model requests per turn, by how the turn ended.", buckets.cycle_edges(config)
        )
        self.turn_max_key_repeat = _histogram(
            meter, n.METRIC_TURN_MAX_KEY_REPEAT,
            "The largest number of times one (tool, arguments) key was seen in a turn.", buckets.repeat_edges(config),
        )
        self.turn_max_failing_streak = _histogram(
            meter, n.METRIC_TURN_MAX_FAILING_STREAK,
            "The longest failing identical-call streak of a turn (its stop-level count).",
            buckets.failing_streak_edges(config),
        )
        self.turn_first_stuck_call = _histogram(
            meter, n.METRIC_TURN_FIRST_STUCK_CALL,
            "The call at which a turn first met the stuck signal (turns that met it only).", tool_call_edges,
        )
        self.detections = _counter(meter, n.METRIC_DETECTIONS, "Loop detections, by threshold, level and action.")
        self.escalation_answers = _counter(
            meter, n.METRIC_ESCALATION_ANSWERS, "Users' answers to turnguard's questions."
        )
        self.plugin_errors = _counter(
            meter, n.METRIC_PLUGIN_ERRORS, "turnguard plugins that raised (and were isolated)."
        )
        self.host_errors = _counter(
            meter, n.METRIC_HOST_ERRORS, "Outcomes the guard ignored: duplicates, or for calls it does not wait for."
        )
        self.shadow_detections = _counter(
            meter, n.METRIC_SHADOW_DETECTIONS,
            "Shadow policies' would-be detections (nothing acted on), by policy, threshold, level, action.",
        )
        self.shadow_turn_tool_calls = _histogram(
            meter, n.METRIC_SHADOW_TURN_TOOL_CALLS,
            "Per shadow policy: the calls of a turn it saw before its would-be halt (or all of them).", tool_call_edges,
        )
        self.turn_results = _counter(
            meter, n.METRIC_TURN_RESULTS,
            "Task results reported after their turn ended, and ignored results, by status.",
        )
        self.probe_calls_past_main = _counter(
            meter, n.METRIC_PROBE_CALLS_PAST_MAIN,
            "Calls probe turns made past the main configuration's would-be halt, by its threshold.",
        )
        self.result_restarts = _counter(
            meter, n.METRIC_STREAK_RESULT_RESTARTS,
            "Streaks of stateful tools restarted by a changed result (progress), by tool.",
        )
        self.tool_call_edges = tool_call_edges
        self.edge_buckets = frozenset(f"{edge:g}" for edge in tool_call_edges) | {"+Inf"}
        """The ``turnguard.turn.tool_calls_bucket`` values of this provider's own edges: a closed set."""
        self._bound_labels()

    def _bound_labels(self) -> None:
        """The label values each attribute may take, each set bounded (then ``_other``) beside the
        values turnguard itself gives, which always pass."""
        self.shadows = BoundedValues(n.SHADOW_POLICY_LIMIT)
        self.policies = BoundedValues(n.POLICY_LIMIT, {DEFAULT_POLICY})
        self.tools = BoundedValues(n.TOOL_NAME_LIMIT)
        self.agents = BoundedValues(n.AGENT_NAME_LIMIT)
        self.reasons = BoundedValues(n.TURN_OUTCOME_LIMIT, BUILTIN_REASONS)
        self.thresholds = BoundedValues(n.THRESHOLD_LIMIT, BUILTIN_THRESHOLDS)
        self.plugins = BoundedValues(n.PLUGIN_NAME_LIMIT, BUILTIN_PLUGINS)
        self.hooks = BoundedValues(n.HOOK_LIMIT, BUILTIN_HOOKS)
        self.error_types = BoundedValues(n.ERROR_TYPE_LIMIT)
        self.call_buckets = BoundedValues(n.CALLS_BUCKET_LIMIT, self.edge_buckets)

    # -- what each hook records ------------------------------------------------------------------

    def scope(self, policy: str) -> dict[str, Any]:
        """The attributes every point of one guard carries: its policy name, bounded."""
        return {n.POLICY: self.policies.fold(policy)}

    def loop_detected(self, event: LoopDetectedEvent, scope: dict[str, Any], context: Context | None = None) -> None:
        """``context`` (the offending call's span) makes the point's exemplar link to its trace."""
        self.detections.add(1, self.detection_metric_attributes(event, scope), context=context)

    def escalation_resolved(self, event: LoopDetectedEvent, answer: str, scope: dict[str, Any]) -> None:
        attrs: dict[str, Any] = {
            **scope,
            n.LOOP_THRESHOLD: self.threshold(event.threshold),
            n.LOOP_LEVEL: closed(event.level, LEVEL_LABELS),
            n.ESCALATION_ANSWER: closed(answer, ANSWER_LABELS),
        }
        if event.agent_name is not None:
            attrs[n.GEN_AI_AGENT_NAME] = self.agents.fold(event.agent_name)
        self.escalation_answers.add(1, attrs)

    def plugin_error(self, plugin: str, hook: str, error: BaseException, scope: dict[str, Any]) -> None:
        self.plugin_errors.add(
            1,
            {
                **scope,
                n.PLUGIN_NAME: self.plugins.fold(plugin),
                n.PLUGIN_HOOK: self.hooks.fold(hook),
                n.ERROR_TYPE: self.error_types.fold(type(error).__qualname__),
            },
        )

    def outcome_ignored(self, tool_name: str, agent_name: str | None, reason: str, scope: dict[str, Any]) -> None:
        reason = closed(reason, HOST_ERROR_LABELS)
        tool = n.NO_TOOL if reason == n.HOOK_FAILED else self.tools.fold(tool_name)
        attrs = {**scope, n.GEN_AI_TOOL_NAME: tool, n.HOST_ERROR: reason}
        if agent_name is not None:
            attrs[n.GEN_AI_AGENT_NAME] = self.agents.fold(agent_name)
        self.host_errors.add(1, attrs)

    def turn_result(self, labels: ResultLabels | None, resolved: bool | None, status: str,
                    scope: dict[str, Any]) -> None:
        """One reported result; a known turn adds its policy, cohort, call bucket and ending
        threshold (a probe turn also where the main configuration would have halted it), each
        bounded like any label: a value past a bound, or one the token had no room for, is the
        overflow value; from a token taken without a key, a value not shown already is ``_token``."""
        attrs: dict[str, Any] = {**scope, n.RESULT_STATUS: closed(status, STATUS_LABELS),
                                 n.TURN_RESOLVED: _resolved_label(resolved)}
        if labels is not None:
            attrs.update(self.result_labels(labels))
        self.turn_results.add(1, attrs)

    def result_labels(self, labels: ResultLabels) -> dict[str, Any]:
        """The labels of a late result (the results counter's and, but the bucket, its event's).

        A token taken without a ``digest_key`` (``labels.trusted`` false) could be anyone's, with
        any labels: it admits no value to a bound. Its cohort, policy, thresholds and call bucket are
        taken when they are among the values turnguard gives (``live``/``probe``, ``default``, the
        built-in thresholds, the buckets of this provider's edges) or shown already, its agent when
        shown already; any other value is ``_token``. A probe turn's repeat and failing-streak buckets come
        from fixed edges (``buckets.count_bucket``): a closed set, whoever made the token. So no
        number of forged tokens changes which values the boards show, and a real one still counts
        where its turn's labels are known here."""
        dropped = labels.dropped
        cohort = closed(labels.cohort, COHORT_LABELS)
        edges = (buckets.tool_call_edges_for(labels.edge_soft_cap, labels.edge_hard_cap) if labels.remote
                 else self.tool_call_edges)
        bucket = calls_bucket(edges, labels.tool_calls)
        policy: Callable[[Any], str]
        agent: Callable[[Any], str]
        threshold: Callable[[Any], str]
        if labels.trusted:
            policy, agent, threshold = self.policies.fold, self.agents.fold, self.threshold
            bucket = self.call_buckets.fold(bucket)
        else:
            policy, agent, threshold = self._shown(self.policies), self._shown(self.agents), self._shown_threshold
            if bucket not in self.edge_buckets:
                bucket = self.call_buckets.known(bucket) or n.TOKEN_VALUE
        attrs: dict[str, Any] = {
            n.POLICY: n.OVERFLOW_VALUE if labels.policy is None else policy(labels.policy),
            n.TURN_COHORT: cohort,
            n.TURN_CALLS_BUCKET: bucket,
            n.LOOP_THRESHOLD: n.OVERFLOW_VALUE if "threshold" in dropped else threshold(labels.threshold),
        }
        if cohort == "probe":
            attrs[n.PROBE_MAIN_THRESHOLD] = (n.OVERFLOW_VALUE if "main_threshold" in dropped
                                             else threshold(labels.main_threshold))
            attrs[n.TURN_MAX_KEY_REPEAT_BUCKET] = buckets.count_bucket(labels.max_key_repeat)
            attrs[n.TURN_MAX_FAILING_STREAK_BUCKET] = buckets.count_bucket(labels.max_failing_streak)
        if "agent_name" in dropped:
            attrs[n.GEN_AI_AGENT_NAME] = n.OVERFLOW_VALUE
        elif labels.agent_name is not None:
            attrs[n.GEN_AI_AGENT_NAME] = agent(labels.agent_name)
        return attrs

    @staticmethod
    def _shown(values: BoundedValues) -> Callable[[Any], str]:
        """A value as an untrusted token's label: shown already, else ``_token`` (admitting nothing)."""
        return lambda value: values.known(value) or n.TOKEN_VALUE

    def _shown_threshold(self, value: Any) -> str:
        return n.NO_THRESHOLD if value is None else self.thresholds.known(value) or n.TOKEN_VALUE

    def shadow_detected(self, policy: str, event: LoopDetectedEvent, scope: dict[str, Any]) -> None:
        attrs = self.detection_metric_attributes(event, scope)
        attrs[n.SHADOW_POLICY] = self.shadows.fold(policy)
        self.shadow_detections.add(1, attrs)

    def shadow_turn_ended(self, policy: str, summary: TurnSummary, scope: dict[str, Any]) -> None:
        attrs = self.turn_metric_attributes(summary, scope)
        attrs[n.SHADOW_POLICY] = self.shadows.fold(policy)
        self.shadow_turn_tool_calls.record(summary.tool_calls, attrs)

    def turn_ended(self, summary: TurnSummary, scope: dict[str, Any], *, past_soft_cap: bool,
                   context: Context | None = None, main_halt: MainHalt | None = None) -> None:
        """The five per-turn histograms; ``past_soft_cap`` (more calls than S, which only an adaptive
        cap has) lets the threshold-validation board look at long turns alone; ``context`` (the
        turn's span) links the tool-calls point's exemplar to the turn's trace. A probe turn also
        carries where the main configuration would have halted it (``main_halt``; ``none``), and the
        calls it made past that are counted."""
        attrs = self.turn_metric_attributes(summary, scope)
        attrs[n.TURN_PAST_SOFT_CAP] = past_soft_cap
        if summary.cohort == "probe":
            main = attrs[n.PROBE_MAIN_THRESHOLD] = self.threshold(main_halt.threshold if main_halt else None)
            if main_halt is not None:
                past: dict[str, Any] = {**scope, n.PROBE_MAIN_THRESHOLD: main}
                if summary.agent_name is not None:
                    past[n.GEN_AI_AGENT_NAME] = attrs[n.GEN_AI_AGENT_NAME]
                self.probe_calls_past_main.add(max(summary.tool_calls - main_halt.call, 0), past)
        self.turn_tool_calls.record(summary.tool_calls, attrs, context=context)
        self.turn_cycles.record(summary.cycles, attrs)
        self.turn_max_key_repeat.record(summary.max_key_repeat, attrs)
        self.turn_max_failing_streak.record(summary.max_failing_streak, attrs)
        if summary.first_stuck_call:
            self.turn_first_stuck_call.record(summary.first_stuck_call, attrs)
        if summary.result_restarts:
            self.streak_restarts(summary, scope)

    def streak_restarts(self, summary: TurnSummary, scope: dict[str, Any]) -> None:
        """The turn's streak restarts by a changed result, per tool (bounded names)."""
        base: dict[str, Any] = {**scope, n.TURN_COHORT: closed(summary.cohort, COHORT_LABELS)}
        if summary.agent_name is not None:
            base[n.GEN_AI_AGENT_NAME] = self.agents.fold(summary.agent_name)
        for tool, count in summary.result_restarts:
            self.result_restarts.add(count, {**base, n.GEN_AI_TOOL_NAME: self.tools.fold(tool)})

    # -- bounded attributes ----------------------------------------------------------------------

    def threshold(self, value: Any) -> str:
        """``turnguard.loop.threshold``: ``none``, a built-in threshold, or a bounded third-party one."""
        return n.NO_THRESHOLD if value is None else self.thresholds.fold(value)

    def detection_metric_attributes(self, event: LoopDetectedEvent, scope: dict[str, Any]) -> dict[str, Any]:
        """A (shadow) detection counter's attributes: ``scope`` and what fired, with the names bounded."""
        attrs: dict[str, Any] = {
            **scope,
            n.LOOP_THRESHOLD: self.threshold(event.threshold),
            n.LOOP_LEVEL: closed(event.level, LEVEL_LABELS),
            n.LOOP_ACTION: _action_label(event.action),
            n.CAP_MODE: closed(event.cap_mode, CAP_MODE_LABELS),
            n.TURN_PROMPTABLE: event.promptable is True,
        }
        if event.tool_name is not None:
            attrs[n.GEN_AI_TOOL_NAME] = self.tools.fold(event.tool_name)
        if event.agent_name is not None:
            attrs[n.GEN_AI_AGENT_NAME] = self.agents.fold(event.agent_name)
        return attrs

    def turn_metric_attributes(self, summary: TurnSummary, scope: dict[str, Any]) -> dict[str, Any]:
        """The attributes a (shadow) turn histogram shares: ``scope`` and how the turn ended, with the
        names bounded."""
        attrs: dict[str, Any] = {
            **scope,
            n.TURN_COHORT: closed(summary.cohort, COHORT_LABELS),
            n.TURN_RESOLVED: _resolved_label(summary.resolved),
            n.TURN_OUTCOME: self.reasons.fold(summary.reason),
            n.LOOP_THRESHOLD: self.threshold(summary.threshold),
            n.CAP_MODE: closed(summary.cap_mode, CAP_MODE_LABELS),
            n.TURN_STUCK: summary.stuck is True,
            n.TURN_PROMPTABLE: summary.promptable is True,
        }
        if summary.agent_name is not None:
            attrs[n.GEN_AI_AGENT_NAME] = self.agents.fold(summary.agent_name)
        return attrs


def _action_label(action: Any) -> str:
    """``turnguard.loop.action``: an ``Action``'s label; anything else (an event a plugin made) ``_other``."""
    return n.ACTION_LABELS[action] if type(action) is Action else n.OVERFLOW_VALUE


def _resolved_label(resolved: Any) -> str:
    """``turnguard.turn.resolved``: ``true``, ``false`` or ``unknown`` (anything but a bool)."""
    return n.RESOLVED_LABELS[resolved] if type(resolved) is bool else n.RESOLVED_LABELS[None]


@dataclass(frozen=True, slots=True)
class MainHalt:
    """Where the main configuration (a probe turn's shadow named after it) would have halted the
    turn: the threshold, and the call it would have halted at (the calls it let run)."""

    threshold: str
    call: int


def calls_bucket(edges: Sequence[float], calls: int) -> str:
    """The upper edge of the histogram bucket ``calls`` falls in (``"+Inf"`` past the last)."""
    at = bisect.bisect_left(edges, calls)
    return "+Inf" if at == len(edges) else f"{edges[at]:g}"


_instruments_lock = threading.Lock()
_instruments_by_provider: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()


def instruments_for(meter_provider: Any, config: GuardConfig, scope_version: str | None = None) -> Instruments:
    """The shared ``Instruments`` of ``meter_provider`` (created on first use, under the
    instrumentation scope ``turnguard`` of ``scope_version``)."""
    with _instruments_lock:
        try:
            found = _instruments_by_provider.get(meter_provider)
        except TypeError:  # not weak-referenceable: instruments (and bounds) per guard then
            return Instruments(meter_provider.get_meter(n.SCOPE, scope_version), config)
        if found is None:
            found = Instruments(meter_provider.get_meter(n.SCOPE, scope_version), config)
            _instruments_by_provider[meter_provider] = found
        return found
