"""turnguard: bound an AI agent's turn without killing its productive long turns.

The public API is re-exported here; everything else is private to the package. This module, the
top of the package's core, also registers the built-in plugins whose modules sit above the guard
(the shadows, telemetry) with the plugin registry below it (``plugins.register_factory``): no
lower module names an upper one.
"""

from typing import Any

from turnguard import _plugins as _plugins
from turnguard import _shadow as _shadow
from turnguard._config import STREAK_STOP_ON, STUCK_SIGNALS, ConfigError, GuardConfig, Probe
from turnguard._guard import Guard, Turn
from turnguard._ledger import Ledger, LedgerView
from turnguard._model import (
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
from turnguard._probe import Cohort
from turnguard._profiles import PROFILES
from turnguard._snapshot import SnapshotError
from turnguard._task_results import ResultStatus
from turnguard.hookspecs import hookimpl, hookspec

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


def _otel_plugin(config: GuardConfig, **providers: Any) -> object | None:
    """The ``otel`` built-in: telemetry is imported when a guard first needs it (one that cannot
    be imported is left out, as a plugin that fails to start is)."""
    from turnguard.telemetry import _otel as otel

    return otel.plugin_for(config, scope_version=__version__, **providers)


def _recorder_plugin(config: GuardConfig, **providers: Any) -> object | None:
    """The ``recorder`` built-in (imported as ``otel`` is)."""
    from turnguard.telemetry import _recorder as recorder

    return recorder.plugin_for(config, **providers)


_plugins.register_factory("otel", _otel_plugin)
_plugins.register_factory("recorder", _recorder_plugin)
_plugins.register_factory("shadow", _shadow.plugin_for)
