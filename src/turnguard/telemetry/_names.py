"""Every telemetry name turnguard emits, in one place (span names, attributes, metrics).

GenAI semantic-convention names are used where they exist; everything of ours carries the
``turnguard.`` prefix. Metric attributes never include conversation ids, call ids or arguments.
"""

from __future__ import annotations

from turnguard._model import Action, Answer, IgnoredOutcome, Level, Outcome
from turnguard._task_results import ResultStatus

# -- GenAI semantic conventions (Development status; kept as plain strings on purpose) ---------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"  # opt-in only (capture_content)
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"  # opt-in only (capture_content)
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
ERROR_TYPE = "error.type"
ERROR_TYPE_OTHER = "_OTHER"
"""``error.type`` of a tool call whose outcome was ``ERROR`` (the host gives no error class)."""
OP_INVOKE_AGENT = "invoke_agent"
OP_EXECUTE_TOOL = "execute_tool"

# -- ours ------------------------------------------------------------------------------------
SCOPE = "turnguard"
LOOP_DETECTED_EVENT = "turnguard.loop_detected"
ESCALATION_RESOLVED_EVENT = "turnguard.escalation_resolved"

TURN_ID = "turnguard.turn.id"
TURN_RESOLVED = "turnguard.turn.resolved"
"""The task's result: ``true``, ``false`` or ``unknown`` (turn metrics and spans, the results counter)."""
TURN_COHORT = "turnguard.turn.cohort"
"""``live`` or ``probe`` (``tg.Probe``): which configuration guarded the turn live."""
PROBE_MAIN_THRESHOLD = "turnguard.probe.main_threshold"
"""On a probe turn's metrics and late results: the threshold at which the main configuration (the
shadow named after it) would have halted the turn, or ``none``; absent on live turns. Bounded like
``turnguard.loop.threshold``. It counts the live thresholds' false halts: probe turns they would
have ended that went on to be resolved."""
TURN_CALLS_BUCKET = "turnguard.turn.tool_calls_bucket"
"""On the results counter: the upper edge of the turn's tool-call bucket (the histogram's edges:
``"1000"`` = 1000 calls or fewer, ``"+Inf"`` past the last), so late results line up with it."""
TURN_MAX_KEY_REPEAT_BUCKET = "turnguard.turn.max_key_repeat_bucket"
"""On a probe turn's late results: the bucket of the turn's largest repeat count of one call (the
upper edge of ``buckets.COUNT_EDGES``'s bucket, ``"+Inf"`` past the last, ``"unknown"`` from a
version 1 token), so the threshold board places the result against D."""
TURN_MAX_FAILING_STREAK_BUCKET = "turnguard.turn.max_failing_streak_bucket"
"""Likewise for the turn's longest failing identical-call streak: against the streak stop."""
RESULT_STATUS = "turnguard.result.status"
"""accepted | duplicate | unknown | expired | after_shutdown | invalid | invalid_id | invalid_token
(``tg.ResultStatus``)."""
TURN_RESULT_EVENT = "turnguard.turn.result"
"""Log event of a result reported after the turn ended."""
RESOLVED_LABELS = {True: "true", False: "false", None: "unknown"}
TURN_RESUMED_FROM = "turnguard.turn.resumed_from"
"""On the turn span: the turn id of the snapshot a resumed turn was forked from (a second resume)."""
TURN_FRESH_STATE = "turnguard.turn.fresh_state"
"""On the turn span: the plugins whose per-turn state restarted at a resume (a version 1 snapshot)."""
TURN_OUTCOME = "turnguard.turn.outcome"  # completed | halted | error | suspended | <host reason> | abandoned (spans)
TURN_PROMPTABLE = "turnguard.turn.promptable"
TURN_STUCK = "turnguard.turn.stuck"
TURN_PAST_SOFT_CAP = "turnguard.turn.past_soft_cap"
"""On turn metrics: the turn's tool calls exceeded the soft cap S (adaptive mode only; always false with an
explicit or disabled cap, which have no S). It lets a panel keep long turns apart from short ones."""
CAP_MODE = "turnguard.cap.mode"  # explicit | adaptive | disabled
TURN_TOOL_CALLS = "turnguard.turn.tool_calls"  # span attribute (same name as the histogram)
TURN_CYCLES = "turnguard.turn.cycles"
TURN_MAX_KEY_REPEAT = "turnguard.turn.max_key_repeat"
TURN_MAX_FAILING_STREAK = "turnguard.turn.max_failing_streak"
TURN_FIRST_STUCK_CALL = "turnguard.turn.first_stuck_call"
TURN_DETECTIONS = "turnguard.turn.detections"

# On ``execute_tool`` spans a fact at its default value is left out (each attribute costs on
# every call): no ``turnguard.call.repeat`` means 1, no ``turnguard.streak.length`` means 1, no
# ``turnguard.streak.failing_length`` means 0, no ``turnguard.verdict.action`` means ``allow``.
CALL_INDEX = "turnguard.call.index"
CALL_KEY_DIGEST = "turnguard.call.key_digest"
CALL_REPEAT = "turnguard.call.repeat"
CALL_CYCLE = "turnguard.call.cycle"
"""The model requests begun in the turn when the call was checked (the recorder line's ``cycle``),
written on the first call of each request only: absent, the previous call's (0 before any)."""
CALL_RETRIES = "turnguard.call.retries"
"""``retry()`` calls in the turn before the call was checked (the recorder line's ``retries``),
absent when 0: a rolled-back call's span and its successor's share an index, and the later one
(more retries) is the turn's."""
CALL_OUTCOME = "turnguard.call.outcome"
CALL_RESULT_DIGEST = "turnguard.call.result_digest"
"""The keyed digest (hex) of the result the host passed with the outcome, when the guard keyed it (a
``stateful_tools`` tool's, or every tool's with ``recorder_results``): the recorder line's ``result``,
never the result itself. Absent when not keyed."""
STREAK_LENGTH = "turnguard.streak.length"
FAILING_STREAK_LENGTH = "turnguard.streak.failing_length"
VERDICT_ACTION = "turnguard.verdict.action"
VERDICT_THRESHOLD = "turnguard.verdict.threshold"

LOOP_THRESHOLD = "turnguard.loop.threshold"
LOOP_LEVEL = "turnguard.loop.level"
LOOP_ACTION = "turnguard.loop.action"
LOOP_LIMIT = "turnguard.loop.limit"
LOOP_TOOL_CALLS = "turnguard.loop.tool_calls"
LOOP_CYCLES = "turnguard.loop.cycles"
LOOP_MAX_KEY_REPEAT = "turnguard.loop.max_key_repeat"
LOOP_STREAK_LENGTH = "turnguard.loop.streak_length"
LOOP_FAILING_STREAK_LENGTH = "turnguard.loop.failing_streak_length"
LOOP_SOFT_CAP = "turnguard.loop.soft_cap"
LOOP_HARD_CAP = "turnguard.loop.hard_cap"
LOOP_EVENT_ID = "turnguard.loop.event_id"

ESCALATION_ANSWER = "turnguard.escalation.answer"  # continue | stop | redirect
POLICY = "turnguard.policy"
"""The live configuration's ``GuardConfig.name``, on every metric point and on turn spans."""
POLICY_STUCK_REPEAT = "turnguard.loop.stuck_repeat_threshold"
POLICY_STUCK_SIGNAL = "turnguard.loop.stuck_signal"
POLICY_STREAK_WARN_AT = "turnguard.streak.warn_at"
POLICY_STREAK_STOP_AT = "turnguard.streak.stop_at"
POLICY_STREAK_STOP_ON = "turnguard.streak.stop_on"
POLICY_MAX_CYCLES = "turnguard.loop.max_cycles"
POLICY_CYCLE_REPEAT_WARN_AT = "turnguard.cycle_repeat.warn_at"
POLICY_CYCLE_REPEAT_STOP_AT = "turnguard.cycle_repeat.stop_at"
POLICY_CYCLE_REPEAT_MAX_PERIOD = "turnguard.cycle_repeat.max_period"
"""The thresholds in force, on turn spans beside ``turnguard.loop.soft_cap`` / ``hard_cap``."""
POLICY_STATEFUL_TOOLS = "turnguard.loop.stateful_tools"
POLICY_STREAK_EXEMPT_TOOLS = "turnguard.streak.exempt_tools"
"""The tool lists in force (``GuardConfig.stateful_tools``, ``streak_exempt_tools``), on turn spans:
string arrays, empty when none is listed (``"*"``: every tool)."""
POLICY_REMIND_MODEL = "turnguard.loop.remind_model"
POLICY_MAX_TRACKED_KEYS = "turnguard.loop.max_tracked_keys"
POLICY_DISABLED = "turnguard.loop.disabled_policies"
"""The other settings a replay decides by, on turn spans: ``GuardConfig.remind_model``,
``max_tracked_keys``, and the built-in policies turned off (``disable_plugins``: a string array,
sorted, empty when none is)."""
SHADOW_POLICY = "turnguard.shadow.policy"
"""The name of a shadow policy (``GuardConfig.shadow``) on its would-be detections and turns."""
SHADOW_DETECTED_EVENT = "turnguard.shadow.loop_detected"
"""Log event of a shadow policy's would-be detection (INFO: nothing was acted on)."""
HOST_ERROR = "turnguard.host_error"
"""What the host got wrong (``turnguard.IgnoredOutcome``): ``duplicate`` (a second outcome for a
checked call), ``unknown_call`` (an outcome no check of the turn waits for) or ``after_end`` (an
outcome once the turn had ended); or ``hook_failed``:
a coding agent's hook failed open (bad input, a broken state; ``turnguard.agents``). A closed set."""
HOOK_FAILED = "hook_failed"
NO_TOOL = "-"
"""``gen_ai.tool.name`` on ``turnguard.host.errors`` for a failed hook (no tool call)."""
PLUGIN_NAME = "turnguard.plugin.name"
PLUGIN_HOOK = "turnguard.plugin.hook"
TURN_ABANDONED = "abandoned"
"""``turnguard.turn.outcome`` of a turn span closed because too many turns were open and it was the oldest."""
CALL_UNFINISHED = "unfinished"
"""``turnguard.call.outcome`` of a call span still open when its turn ended."""

BUILTIN_TURN_OUTCOMES = ("completed", "halted", "error")
"""The ``turnguard.turn.outcome`` values the guard itself gives; a host's own reasons are bounded."""
SHADOW_LIVE_HALTED = "live_halted"
"""A shadow turn's ``turnguard.turn.outcome`` when the live guard halted the turn first."""
CAP_MODES = ("explicit", "adaptive", "disabled")
LEVELS = tuple(level.value for level in Level)
"""``turnguard.loop.level`` on metrics: ``warn`` or ``stop``; any other level (a third-party policy's
own, or an event changed before ``Turn.resolve``) is ``OVERFLOW_VALUE`` there."""
ANSWERS = tuple(answer.value for answer in Answer)
HOST_ERRORS = (*(reason.value for reason in IgnoredOutcome), HOOK_FAILED)
RESULT_STATUSES = tuple(status.value for status in ResultStatus)
ACTION_LABELS = {action: action.label for action in Action}
"""``turnguard.verdict.action`` / ``turnguard.loop.action`` per ``Action``, looked up once (an enum
property costs on the per-call path)."""
OUTCOME_VALUES = {outcome: outcome.value for outcome in Outcome}
"""``turnguard.call.outcome`` per ``Outcome``, likewise."""

NO_THRESHOLD = "none"
"""The value of ``turnguard.loop.threshold`` on a turn metric when nothing ended the turn."""
OVERFLOW_VALUE = "_other"
"""What a tool or agent name beyond the cardinality bound is folded into."""
TOKEN_VALUE = "_token"
"""On a late result from a result token taken without a ``digest_key`` (anyone can make one): a
label whose value the metrics do not show already (a policy, agent, threshold or call bucket no
turn of this process had), so that untrusted tokens never decide which values are shown."""

# -- limits ----------------------------------------------------------------------------------
# Cardinality bounds on metric attribute values (distinct values per meter provider): past one,
# a value is folded into ``OVERFLOW_VALUE``.
TOOL_NAME_LIMIT = 10_000
AGENT_NAME_LIMIT = 1_000
TURN_OUTCOME_LIMIT = 100
"""Host-given end reasons (``Turn.end(reason)``) beyond the built-in ones."""
PLUGIN_NAME_LIMIT = 1_000
SHADOW_POLICY_LIMIT = 100
POLICY_LIMIT = 100
"""Live policy names (``GuardConfig.name``) per meter provider."""
ERROR_TYPE_LIMIT = 1_000
THRESHOLD_LIMIT = 100
"""Threshold names (``turnguard.loop.threshold``): the built-in ones and any a third-party policy adds."""
HOOK_LIMIT = 100
"""Hook names on ``turnguard.plugin.errors``."""
CALLS_BUCKET_LIMIT = 1_000
"""``turnguard.turn.tool_calls_bucket`` values on the results counter: a result token carries the
soft cap and backstop its bucket edges come from, untrusted, so its buckets are bounded too."""
MAX_OPEN_TURNS = 10_000
"""Turns the span reporter tracks at once per plugin; past it the oldest is abandoned (its spans end,
marked ``turnguard.turn.outcome=abandoned``), so a host that opens turns and never ends them cannot
grow memory without bound."""

# -- metrics (name, unit) --------------------------------------------------------------------
METRIC_TURN_TOOL_CALLS = ("turnguard.turn.tool_calls", "{tool_call}")
METRIC_TURN_CYCLES = ("turnguard.turn.cycles", "{cycle}")
METRIC_TURN_MAX_KEY_REPEAT = ("turnguard.turn.max_key_repeat", "{tool_call}")
METRIC_TURN_MAX_FAILING_STREAK = ("turnguard.turn.max_failing_streak", "{tool_call}")
"""The longest failing identical-call streak per turn (``TurnSummary.max_failing_streak``)."""
METRIC_TURN_FIRST_STUCK_CALL = ("turnguard.turn.first_stuck_call", "{tool_call}")
METRIC_DETECTIONS = ("turnguard.loop.detections", "{detection}")
METRIC_ESCALATION_ANSWERS = ("turnguard.escalation.answers", "{answer}")
METRIC_PLUGIN_ERRORS = ("turnguard.plugin.errors", "{error}")
METRIC_HOST_ERRORS = ("turnguard.host.errors", "{error}")
"""Reports the guard ignored (``Turn.record_outcome`` for a call it does not wait for)."""
METRIC_SHADOW_DETECTIONS = ("turnguard.shadow.detections", "{detection}")
METRIC_TURN_RESULTS = ("turnguard.turn.results", "{result}")
"""Results reported after their turn ended, and every ignored result, by status."""
METRIC_PROBE_CALLS_PAST_MAIN = ("turnguard.probe.calls_past_main_threshold", "{tool_call}")
"""Per probe turn the main configuration would have halted: the calls it made past that halt (the
cost of raising the threshold), by ``turnguard.probe.main_threshold``."""
METRIC_STREAK_RESULT_RESTARTS = ("turnguard.streak.result_restarts", "{restart}")
"""Identical-call streaks of ``stateful_tools`` restarted by a changed result (progress), by tool:
which listed tools really poll (counted when the turn ends)."""
METRIC_SHADOW_TURN_TOOL_CALLS = ("turnguard.shadow.turn.tool_calls", "{tool_call}")
"""Per shadow policy and turn: the calls it saw before its would-be halt (or all of them)."""

# -- which attributes each metric carries (never ids, arguments or results) ------------------
_TURN_ATTRIBUTES = (POLICY, TURN_COHORT, TURN_RESOLVED, GEN_AI_AGENT_NAME, TURN_OUTCOME, LOOP_THRESHOLD, CAP_MODE,
                    TURN_STUCK, TURN_PROMPTABLE)
TURN_METRIC_ATTRIBUTES = (*_TURN_ATTRIBUTES, TURN_PAST_SOFT_CAP, PROBE_MAIN_THRESHOLD)
"""On the five per-turn histograms; ``turnguard.loop.threshold`` is ``none`` when nothing ended the turn;
``turnguard.probe.main_threshold`` on probe turns only."""
DETECTION_METRIC_ATTRIBUTES = (
    POLICY, TURN_COHORT, GEN_AI_AGENT_NAME, GEN_AI_TOOL_NAME, LOOP_THRESHOLD, LOOP_LEVEL, LOOP_ACTION, CAP_MODE,
    TURN_PROMPTABLE,
)
ESCALATION_METRIC_ATTRIBUTES = (POLICY, TURN_COHORT, GEN_AI_AGENT_NAME, LOOP_THRESHOLD, LOOP_LEVEL, ESCALATION_ANSWER)
PLUGIN_ERROR_METRIC_ATTRIBUTES = (POLICY, PLUGIN_NAME, PLUGIN_HOOK, ERROR_TYPE)
HOST_ERROR_METRIC_ATTRIBUTES = (POLICY, GEN_AI_AGENT_NAME, GEN_AI_TOOL_NAME, HOST_ERROR)
RESULT_METRIC_ATTRIBUTES = (POLICY, RESULT_STATUS, TURN_RESOLVED, TURN_COHORT, TURN_CALLS_BUCKET, LOOP_THRESHOLD,
                            PROBE_MAIN_THRESHOLD, TURN_MAX_KEY_REPEAT_BUCKET, TURN_MAX_FAILING_STREAK_BUCKET,
                            GEN_AI_AGENT_NAME)
"""The turn's facts (cohort, bucket, the threshold that ended it, agent) only when the turn is known;
``turnguard.probe.main_threshold`` and the repeat and failing-streak buckets only for a known probe
turn (the live cohort's results, most of them, keep the counter's cardinality as it was)."""
PROBE_CALLS_PAST_MAIN_ATTRIBUTES = (POLICY, PROBE_MAIN_THRESHOLD, GEN_AI_AGENT_NAME)
RESULT_RESTART_METRIC_ATTRIBUTES = (POLICY, TURN_COHORT, GEN_AI_TOOL_NAME, GEN_AI_AGENT_NAME)
SHADOW_DETECTION_METRIC_ATTRIBUTES = (SHADOW_POLICY, *DETECTION_METRIC_ATTRIBUTES)
SHADOW_TURN_METRIC_ATTRIBUTES = (SHADOW_POLICY, *_TURN_ATTRIBUTES)
"""``turnguard.turn.outcome`` there is the shadow's: ``halted`` (its would-be halt), the live
turn's reason, or ``live_halted`` (the live guard ended the turn first). No
``turnguard.turn.past_soft_cap`` there: a shadow's turn is cut at its own would-be halt."""
METRIC_ATTRIBUTES = {
    METRIC_TURN_TOOL_CALLS[0]: TURN_METRIC_ATTRIBUTES,
    METRIC_TURN_CYCLES[0]: TURN_METRIC_ATTRIBUTES,
    METRIC_TURN_MAX_KEY_REPEAT[0]: TURN_METRIC_ATTRIBUTES,
    METRIC_TURN_MAX_FAILING_STREAK[0]: TURN_METRIC_ATTRIBUTES,
    METRIC_TURN_FIRST_STUCK_CALL[0]: TURN_METRIC_ATTRIBUTES,
    METRIC_DETECTIONS[0]: DETECTION_METRIC_ATTRIBUTES,
    METRIC_ESCALATION_ANSWERS[0]: ESCALATION_METRIC_ATTRIBUTES,
    METRIC_PLUGIN_ERRORS[0]: PLUGIN_ERROR_METRIC_ATTRIBUTES,
    METRIC_HOST_ERRORS[0]: HOST_ERROR_METRIC_ATTRIBUTES,
    METRIC_SHADOW_DETECTIONS[0]: SHADOW_DETECTION_METRIC_ATTRIBUTES,
    METRIC_SHADOW_TURN_TOOL_CALLS[0]: SHADOW_TURN_METRIC_ATTRIBUTES,
    METRIC_STREAK_RESULT_RESTARTS[0]: RESULT_RESTART_METRIC_ATTRIBUTES,
    METRIC_TURN_RESULTS[0]: RESULT_METRIC_ATTRIBUTES,
    METRIC_PROBE_CALLS_PAST_MAIN[0]: PROBE_CALLS_PAST_MAIN_ATTRIBUTES,
}
"""The attribute keys each metric may carry (optional ones are left out when unknown, e.g. no agent name);
``turnguard.policy`` is on every point (the shadow metrics' is the live policy's, beside the shadow's name)."""
FORBIDDEN_METRIC_ATTRIBUTES = frozenset(
    {GEN_AI_CONVERSATION_ID, GEN_AI_TOOL_CALL_ID, GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT, TURN_ID,
     LOOP_EVENT_ID, CALL_KEY_DIGEST, CALL_RESULT_DIGEST}
)
"""Never on a metric point: per-conversation/per-call identifiers and content."""
