"""turnguard: bound an AI agent's turn without killing its productive long turns.

The public API is re-exported here; everything else is private to the package.
"""

from turnguard.config import STREAK_STOP_ON, STUCK_SIGNALS, ConfigError, GuardConfig, Probe
from turnguard.guard import Guard, Turn
from turnguard.hookspecs import hookimpl, hookspec
from turnguard.ledger import Ledger, LedgerView
from turnguard.model import (
    Action,
    Answer,
    IgnoredOutcome,
    Level,
    LoopDetected,
    LoopDetectedEvent,
    Outcome,
    Threshold,
    ToolCall,
    TurnSummary,
    Verdict,
)
from turnguard.probe import Cohort
from turnguard.profiles import PROFILES
from turnguard.snapshot import SnapshotError
from turnguard.task_results import ResultStatus

__all__ = [
    "PROFILES",
    "STREAK_STOP_ON",
    "STUCK_SIGNALS",
    "Action",
    "Answer",
    "Cohort",
    "ConfigError",
    "Guard",
    "GuardConfig",
    "IgnoredOutcome",
    "Ledger",
    "LedgerView",
    "Level",
    "LoopDetected",
    "LoopDetectedEvent",
    "Outcome",
    "Probe",
    "ResultStatus",
    "SnapshotError",
    "Threshold",
    "ToolCall",
    "Turn",
    "TurnSummary",
    "Verdict",
    "hookimpl",
    "hookspec",
]
__version__ = "0.1.0"
