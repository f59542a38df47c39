"""The plugin contract: every hook turnguard calls, documented where it is declared.

Hooks are called with keyword arguments; an implementation may accept any subset of them.
``turn`` is always a read-only view of the turn's ledger (``turnguard.Ledger``):
counts, max repeat, streaks, cycles, ``config`` and identifiers, plus ``turn.detect(...)`` to
build a verdict with a ``LoopDetectedEvent``.

Check hooks (``turnguard_check_*``) are decision hooks: every implementation is called, each in
isolation (one that raises is reported and, by default, ignored), and the most severe verdict
wins. Observer hooks return nothing. Wrappers are not supported on check hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from turnguard.config import GuardConfig
    from turnguard.ledger import Ledger
    from turnguard.model import LoopDetectedEvent, Outcome, ToolCall, TurnSummary, Verdict

PROJECT_NAME = "turnguard"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(historic=True)
def turnguard_configure(config: GuardConfig) -> None:
    """Called once per guard with its configuration, for each plugin in isolation (one that
    raises is reported, never fatal); a plugin added later with ``Guard.register`` gets it then."""


@hookspec
def turnguard_turn_started(turn: Ledger) -> None:
    """A turn opened (``Guard.turn``). Observers start spans or per-turn records here."""


@hookspec
def turnguard_check_cycle(turn: Ledger) -> Verdict | None:
    """Decide on a model request. ``turn.cycles`` already counts it.

    Return a ``Verdict`` (use ``turn.detect``) or ``None`` when nothing fired.
    """


@hookspec
def turnguard_check_call(turn: Ledger, call: ToolCall) -> Verdict | None:
    """Decide on a tool call before the host executes it.

    The ledger has already counted the call: ``turn.tool_calls`` includes it, and its key's
    repeat count and the streak are up to date. Return a ``Verdict`` or ``None``.
    """


@hookspec
def turnguard_check_outcome(turn: Ledger, call: ToolCall, outcome: Outcome) -> Verdict | None:
    """Decide after a call's outcome was recorded (the failing streak is up to date)."""


@hookspec
def turnguard_loop_detected(turn: Ledger, event: LoopDetectedEvent) -> None:
    """A detector fired (whether or not its verdict won): telemetry, UIs, audit logs.

    Called after the decision, outside the turn's lock, in the thread of the offending call.
    """


@hookspec
def turnguard_escalation_resolved(turn: Ledger, event: LoopDetectedEvent, response: str) -> None:
    """The user answered an ASK (``continue``, ``stop`` or ``redirect``): the ground truth for
    false positives."""


@hookspec
def turnguard_retry(turn: Ledger) -> None:
    """The current model request is being re-sent; its calls were rolled back."""


@hookspec
def turnguard_turn_ended(turn: Ledger, summary: TurnSummary) -> None:
    """The turn closed; ``summary`` says how (reason, counts, the threshold that ended it)."""


@hookspec
def turnguard_cycle_checked(turn: Ledger, verdict: Verdict) -> None:
    """Observer: a model request was decided (the combined verdict)."""


@hookspec
def turnguard_call_checked(turn: Ledger, call: ToolCall, verdict: Verdict) -> None:
    """Observer: a tool call was decided (the combined verdict). Spans start here."""


@hookspec
def turnguard_outcome_recorded(turn: Ledger, call: ToolCall, outcome: Outcome, verdict: Verdict) -> None:
    """Observer: a call's outcome was recorded and decided. Spans end here."""


@hookspec
def turnguard_plugin_error(turn: Ledger | None, plugin: str, hook: str, error: BaseException) -> None:
    """Observer: a plugin raised in ``hook``; the guard isolated it (``fail_mode`` decided how)."""


@hookspec
def turnguard_shadow_detected(turn: Ledger, policy: str, event: LoopDetectedEvent) -> None:
    """Observer: shadow policy ``policy`` (a name of ``GuardConfig.shadow``) would have fired on
    the live turn ``turn``; ``event`` carries the shadow's own counts and the action it would
    have taken. Nothing was acted on. Called in the thread of the call, while the guard holds
    the turn's (re-entrant) lock: keep it quick, and do not wait on other threads there."""


@hookspec
def turnguard_shadow_turn_ended(turn: Ledger, policy: str, summary: TurnSummary) -> None:
    """Observer: the live turn ``turn`` closed; ``summary`` is what shadow policy ``policy``
    made of it (``halted``/``threshold``: its would-be halt; ``tool_calls``: the calls it saw
    before that halt, or all of them)."""
