"""One turn driven through its policies: count, quiet-region test, collect, combine, record.

Every evaluation of a configuration on a turn takes the same steps: the ledger counts the call
(or the model request, or records the outcome), the quiet region (``Dispatcher.quiet``, from each
policy's ``quiet_rule``) says which check hooks can fire there, the dispatcher's loop collects
their answers, and ``Dispatcher.combine`` keeps the winner and notes each detection in the
ledger. A ``Driver`` holds those steps for one ledger, so ``Turn`` (``turnguard._guard``), each
shadow run (``turnguard._shadow``) and calibrate's replay (``_calibrate/replay.py``) drive a turn
the same way; what differs is only what the caller does with the answer (a live turn latches and
tells observers, a shadow reports, a replay answers an ASK). The quiet region is tested here, in
``call`` and ``outcome``; ``Turn``'s hot-path closures keep one inlined copy of those two tests
(``benchmarks/run.py core`` showed the method calls), and so do the shadows' per-call loops
(``TurnShadows``: ``benchmarks/run.py shadow``), each held equal by ``tests/test_driver.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from turnguard._dispatch import BoundChecks, Dispatcher, Found, QuietRegion
from turnguard._ledger import Ledger, LedgerView
from turnguard._model import LoopDetectedEvent, Outcome, ToolCall, TurnSummary, Verdict
from turnguard._policies import cap, cycle_repeat

CHECK_CYCLE = "turnguard_check_cycle"
CHECK_CALL = "turnguard_check_call"
CHECK_OUTCOME = "turnguard_check_outcome"


class Driver:
    """One ledger's turn through one dispatcher's check hooks.

    ``report``: the turn named in ``turnguard_plugin_error`` (``None``: a shadow's or a replay's
    own policies, whose failures reach no live observer). ``checks``: the bound hooks when the
    caller leaves some out (a replay without stateful tools skips the cap's outcome hook);
    ``dispatcher.bind`` by default."""

    __slots__ = ("checks", "collect0", "collect1", "collect2", "count", "dispatcher", "ledger", "polls", "quiet",
                 "report")

    def __init__(self, dispatcher: Dispatcher, ledger: Ledger, view: LedgerView | None = None, *,
                 report: LedgerView | None = None, checks: BoundChecks | None = None) -> None:
        view = view if view is not None else LedgerView(ledger)
        self.dispatcher, self.ledger, self.report = dispatcher, ledger, report
        self.checks = checks if checks is not None else dispatcher.bind(ledger, view)
        self.quiet: QuietRegion = dispatcher.quiet(ledger, view, report)
        """Where the policies cannot fire: they are not called there."""
        self.count: Callable[[bytes, str], int] = ledger.count_named if ledger.names_tools else ledger.count_call
        """How the ledger counts a call (``count_named`` where the configuration names tools)."""
        self.polls: Callable[[str | None], bool] | None = ledger.polls if ledger.polls_any else None
        """Whether a tool's outcome is recorded with its result (``None``: no stateful tool)."""
        self.collect0, self.collect1, self.collect2 = dispatcher.collect0, dispatcher.collect1, dispatcher.collect2

    # -- the steps; the quiet region is tested here only ----------------------------------------

    def cycle(self) -> Found:
        """A model request: counted, then every cycle hook asked."""
        self.ledger.begin_cycle()
        impls = self.checks.cycle
        return self.collect0(CHECK_CYCLE, impls, self.report) if impls else ()

    def call(self, digest: bytes, call: ToolCall) -> Found:
        """A tool call: counted (its sequence number is then the ledger's ``checks``), then the
        hooks that can fire asked: inside the quiet region only the plugins without a
        ``quiet_rule``, else every one. This is the call-side quiet test: past the region's
        ``calls``, the rules are asked again (``QuietRegion.reasked``) and the check tested on
        the region they name."""
        ledger, quiet = self.ledger, self.quiet
        self.count(digest, call.name)
        if (ledger.tool_calls <= quiet.calls and ledger.streak_length < quiet.streak
                and ledger.max_key_repeat < quiet.repeat) or quiet.reasked():
            impls = quiet.call
            if not impls:
                return ()
        else:
            impls = self.checks.call
        return self.collect1(CHECK_CALL, impls, self.report, call)

    def record(self, seq: int, name: str, outcome: Outcome, result: bytes | None = None) -> bool | None:
        """Check ``seq``'s outcome credited in check order (``Ledger.record_outcome``; a stateful
        tool's with its ``result`` digest, ``record_polled``): whether the outcome hooks are due
        wherever the counts are (an ended streak's stop, a stateful tool's repeat that made the
        turn stuck)."""
        polls = self.polls
        if polls is not None and polls(name):
            return self.ledger.record_polled(seq, outcome, result)
        return self.ledger.record_outcome(seq, outcome)

    def outcome(self, seq: int, call: ToolCall, outcome: Outcome, result: bytes | None = None) -> Found:
        """An outcome: recorded (``record``), then the hooks that can fire asked: every one once
        the stop count can have reached a stop level, or when the outcome is due."""
        ledger, quiet, polls = self.ledger, self.quiet, self.polls
        if polls is not None and polls(call.name):  # (``record``, inlined: shadows run this per call)
            due = ledger.record_polled(seq, outcome, result)
        else:
            due = ledger.record_outcome(seq, outcome)
        if ledger.stop_count < quiet.stop_count and not due:
            impls = quiet.outcome
            if not impls:
                return ()
        else:
            impls = self.checks.outcome
        return self.collect2(CHECK_OUTCOME, impls, self.report, call, outcome)

    def unreported(self) -> list[LoopDetectedEvent]:
        """The detections reached that no report carried before the turn ended
        (``cycle_repeat.unreported``, where that policy is one of this dispatcher's): for the
        caller to tell as the turn ends, so every level reached is heard once."""
        if not any(impl.fn is cycle_repeat.turnguard_check_outcome for impl in self.dispatcher.check_outcome):
            return []
        return [verdict.event for verdict in cycle_repeat.unreported(self.ledger) if verdict.event is not None]

    def combine(self, hook: str, found: Found) -> tuple[Verdict | None, list[LoopDetectedEvent]]:
        """``Dispatcher.combine`` on this ledger: the winner (``None``: nothing stands), every event."""
        return self.dispatcher.combine(hook, found, self.ledger, self.report)


def summarize(ledger: Ledger, reason: str, halt: Verdict | None, *, final: bool = True) -> TurnSummary:
    """How ``ledger``'s turn ended: its stateful calls still waiting settled, and ``stuck`` as the
    cap says (``cap.summary_stuck``: the ledger records facts, the cap decides what is stuck).
    ``final``: no outcome can come any more (not a turn put aside), so the calls still waiting are
    given up and the outcomes behind them settle (``settle_lost``)."""
    if final:
        ledger.settle_lost()
    ledger.settle_polled()
    return ledger.summary(reason=reason, halt=halt, stuck=cap.summary_stuck(ledger))

