"""The plugin contract: every hook turnguard calls, documented where it is declared.

Hooks are called with keyword arguments; an implementation may accept any subset of them.
``turn`` is a read-only view of the turn's ledger (:class:`turnguard._ledger.LedgerView`):
counts, max repeat, streaks, cycles, ``config`` and identifiers, plus ``turn.detect(...)`` to
build a verdict with a ``LoopDetectedEvent``; no mutator, no private field. (Only turnguard's
own policy modules get the ``Ledger`` itself, for speed.) One view per turn: key per-turn state
by it. The view keeps a plugin from changing the counts by mistake; it is not a sandbox (see
``LedgerView``).

Check hooks (``turnguard_check_*``) are decision hooks: every implementation is called, each in
isolation, and the most severe verdict wins. A check answer is ``None`` or a ``Verdict`` holding
an ``Action``, a text threshold or none, a text message, and no event or a ``LoopDetectedEvent``
of its declared types (``turn.detect`` builds one); anything else is a plugin error, and a
``str`` or ``int`` subclass in it stands as its plain value. A plugin's detection is noted as a
detection, but one named like a built-in threshold (``streak``, ...) never counts as that
threshold's level having fired: the built-in policy still fires. Observer hooks return nothing. Every hook, check or
observer, is called through the guard's dispatcher (``turnguard._dispatch``), so a plugin that
raises is treated one way whichever hook it raised in: it is logged and reported through
``turnguard_plugin_error``; under ``fail_mode="open"`` (the default) nothing else happens; under
``fail_mode="closed"`` the host call it happened in returns HALT, and the turn stays halted.
The hooks with no call to halt say in their docstrings what ``fail_mode="closed"`` does there:
``turnguard_configure`` (every turn the guard opens afterwards starts halted),
``turnguard_turn_ended`` and ``turnguard_shadow_turn_ended`` (the turn is over: its summary
stands), ``turnguard_turn_result`` (the result stands) and ``turnguard_plugin_error`` (a failing
reporter is only logged; the failure it reported decides). Wrappers are not supported on check
hooks. ``KeyboardInterrupt`` and ``SystemExit`` raised by a plugin propagate from every hook; any
other exception (``BaseException`` included) is a plugin error.

Locking: the check hooks, and ``turnguard_shadow_detected`` and ``turnguard_plugin_error`` when
called from a check hook, run while the guard holds the turn's (re-entrant) lock, one call at a
time per turn, in check order: keep them quick and never wait there on another thread that uses
the turn. Every other hook runs outside the lock, in the thread of the host's call, possibly
concurrently with other calls of the same turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from turnguard._config import GuardConfig
    from turnguard._ledger import LedgerView
    from turnguard._model import LoopDetectedEvent, Outcome, ToolCall, TurnSummary, Verdict
    from turnguard._task_results import ResultLabels

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "turnguard_call_checked",
    "turnguard_check_call",
    "turnguard_check_cycle",
    "turnguard_check_outcome",
    "turnguard_configure",
    "turnguard_cycle_checked",
    "turnguard_escalation_resolved",
    "turnguard_loop_detected",
    "turnguard_outcome_ignored",
    "turnguard_outcome_recorded",
    "turnguard_plugin_error",
    "turnguard_retry",
    "turnguard_shadow_detected",
    "turnguard_shadow_turn_ended",
    "turnguard_turn_ended",
    "turnguard_turn_result",
    "turnguard_turn_resumed",
    "turnguard_turn_snapshot",
    "turnguard_turn_started",
    "turnguard_turn_suspended",
]

PROJECT_NAME = "turnguard"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(historic=True)
def turnguard_configure(config: GuardConfig) -> None:
    """Called once per guard with its configuration, for each plugin in isolation (one that
    raises is reported, never fatal); a plugin added later with ``Guard.register`` gets it then.

    No call is under way: under ``fail_mode="closed"`` a plugin that raises here makes every turn
    the guard opens afterwards start halted (a plugin that could not set itself up is not
    trusted to guard); under ``"open"`` it stays in, reported."""


@hookspec
def turnguard_turn_started(turn: LedgerView) -> None:
    """A turn opened (``Guard.turn``). Observers start spans or per-turn records here."""


@hookspec
def turnguard_check_cycle(turn: LedgerView) -> Verdict | None:
    """Decide on a model request (under the turn's lock). ``turn.cycles`` already counts it.

    Return a ``Verdict`` (use ``turn.detect``) or ``None`` when nothing fired.
    """


@hookspec
def turnguard_check_call(turn: LedgerView, call: ToolCall) -> Verdict | None:
    """Decide on a tool call before the host executes it. Runs under the turn's lock.

    The ledger has already counted the call: ``turn.tool_calls`` includes it, and its key's
    repeat count and the streak are up to date. Return a ``Verdict`` or ``None``.
    """


@hookspec
def turnguard_check_outcome(turn: LedgerView, call: ToolCall, outcome: Outcome) -> Verdict | None:
    """Decide after a call's outcome was recorded. Runs under the turn's lock.

    ``call`` is the checked call (the object the host passed to ``check_call``, also when the
    host reported by ``call_id``). The streak counts are those in check order: an outcome that
    arrived before an earlier identical call's is counted once that one's has come. Called only
    for the first outcome of a checked call (see ``turnguard_outcome_ignored``), also once the
    turn has halted, for a call checked before the HALT (the shadows see what the ledger counts):
    its answer is then dropped, the host gets the latched HALT.
    """


@hookspec
def turnguard_outcome_ignored(turn: LedgerView, call: ToolCall, outcome: Outcome, reason: str) -> None:
    """Observer: the host reported an outcome the guard ignored (a host error): ``reason`` is
    ``duplicate`` (a second outcome for a checked call), ``unknown_call`` (no check of this
    turn waits for it) or ``after_end`` (the turn had ended: it waits for no call). Nothing
    changed; the host got ALLOW (or the latched HALT)."""


@hookspec
def turnguard_loop_detected(turn: LedgerView, event: LoopDetectedEvent) -> None:
    """A detector fired (whether or not its verdict won): telemetry, UIs, audit logs.

    Called after the decision, outside the turn's lock, in the thread of the offending call. A
    ``cycle_repeat`` level no report carried before the turn ended is told as it ends (before
    ``turnguard_turn_ended``, in the thread ending it), observed: ``ALLOW``, no call.
    """


@hookspec
def turnguard_escalation_resolved(turn: LedgerView, event: LoopDetectedEvent, response: str) -> None:
    """The user answered an ASK (``continue``, ``stop`` or ``redirect``): the ground truth for
    false positives."""


@hookspec
def turnguard_retry(turn: LedgerView) -> None:
    """The current model request is being re-sent; its calls were rolled back."""


@hookspec
def turnguard_turn_ended(turn: LedgerView, summary: TurnSummary) -> None:
    """The turn closed; ``summary`` says how (reason, counts, the threshold that ended it).

    Nothing is left to halt: an observer that raises here is reported under either
    ``fail_mode``, and the summary ``Turn.end`` returns stands."""


@hookspec
def turnguard_turn_suspended(turn: LedgerView, summary: TurnSummary) -> None:
    """The turn was put aside (``Turn.suspend``: its snapshot is to be resumed, here or in another
    process), not ended: ``summary.reason`` is ``suspended``. Release what the turn holds (spans,
    records) without reporting it as a turn: the process that finishes it reports it once, at
    ``turnguard_turn_ended``. ``turnguard_turn_ended`` is not called for it here."""


@hookspec
def turnguard_turn_snapshot(turn: LedgerView) -> object | None:
    """A plugin's per-turn state for the turn's snapshot (``Turn.snapshot``), as JSON data, or
    ``None`` when it has none. Runs under the turn's lock, so the state agrees with the ledger's
    facts. What a plugin returns is given back to it at ``turnguard_turn_resumed``."""


@hookspec
def turnguard_turn_resumed(turn: LedgerView, state: object | None) -> None:
    """The turn ``turn`` continues a snapshot (``Guard.resume``; ``turnguard_turn_started`` came
    first, with the restored facts): ``state`` is what this plugin returned for it at
    ``turnguard_turn_snapshot``, or ``None`` when the snapshot holds none (a version 1 snapshot, or
    the plugin was not there); then the turn's ``fresh_state`` names the plugin. Runs under the
    turn's lock. Raise ``turnguard.SnapshotError`` (naming the field) to refuse a state the plugin
    cannot continue: the resume fails with it; any other exception is a plugin error."""


@hookspec
def turnguard_cycle_checked(turn: LedgerView, verdict: Verdict) -> None:
    """Observer: a model request was decided (the combined verdict)."""


@hookspec
def turnguard_call_checked(turn: LedgerView, call: ToolCall, verdict: Verdict) -> None:
    """Observer: a tool call was decided (the combined verdict). Spans start here."""


@hookspec
def turnguard_outcome_recorded(turn: LedgerView, call: ToolCall, outcome: Outcome, verdict: Verdict) -> None:
    """Observer: a call's outcome was recorded and decided. Spans end here."""


@hookspec
def turnguard_plugin_error(turn: LedgerView | None, plugin: str, hook: str, error: BaseException) -> None:
    """Observer: a plugin raised in ``hook``; the guard isolated it (``fail_mode`` decided how).

    An implementation that raises here is logged, never reported through this hook again (no
    recursion), and the other implementations are still called; under either ``fail_mode`` it
    changes no verdict: the failure it was reporting already decided the call's."""


@hookspec
def turnguard_shadow_detected(turn: LedgerView, policy: str, event: LoopDetectedEvent) -> None:
    """Observer: shadow policy ``policy`` (a name of ``GuardConfig.shadow``) would have fired on
    the live turn ``turn``; ``event`` carries the shadow's own counts and the action it would
    have taken. Nothing was acted on. Called in the thread of the call, while the guard holds
    the turn's (re-entrant) lock: keep it quick, and do not wait on other threads there. Under
    ``fail_mode="closed"`` an implementation that raises halts that live call."""


@hookspec
def turnguard_shadow_turn_ended(turn: LedgerView, policy: str, summary: TurnSummary) -> None:
    """Observer: the live turn ``turn`` closed; ``summary`` is what shadow policy ``policy``
    made of it (``halted``/``threshold``: its would-be halt; ``tool_calls``: the calls it saw
    before that halt, or all of them). As for ``turnguard_turn_ended``, an implementation that
    raises here is reported and the live turn's summary stands."""


@hookspec
def turnguard_turn_result(turn_id: str, summary: TurnSummary | None, resolved: bool | None, status: str,
                          labels: ResultLabels | None) -> None:
    """Observer: a task result was reported after the turn ended (``status`` ``accepted``:
    ``summary`` is the turn's as it ended, as the guard keeps it for late results: any text longer
    than ``MAX_ID_LENGTH`` characters cut, as exported text is, and its tuples to their first items,
    ``task_results.kept_summary``; ``None`` for a result reported with a result token for a turn
    this guard does not hold: another process's, or one it forgot), or a result was ignored
    (``duplicate``, ``unknown``, ``expired``, ``after_shutdown``, ``invalid``, ``invalid_id``,
    ``invalid_token``; ``summary`` is the turn's when it is known). ``turn_id`` is the turn's id,
    cut like the summary's. ``labels`` (``turnguard._task_results.ResultLabels``) are the facts the
    result is reported with, from the summary or the token, whenever the turn is known
    (``labels.trusted`` is false for a token taken without a ``digest_key``: anyone could make it,
    with any labels). A result reported before the turn ended is ``summary.resolved`` at
    ``turnguard_turn_ended``.

    No call is under way: an implementation that raises is reported under either ``fail_mode``,
    and the result stands (``report_result`` returns whether it was taken)."""
