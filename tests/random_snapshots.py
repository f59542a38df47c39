"""What the snapshot-damage tests build their random turns from: the keys their calls are drawn
from, and a guard with low streak levels (warn 3, stop 5) and no exporters, so that short turns
reach streaks and levels worth damaging."""

from __future__ import annotations

from typing import Any

import turnguard as tg

KEYS = (("run", {"t": 1}), ("ls", "a"), ("run", {"t": 2}), ("cat", 1))
"""Two calls of a tool ``run`` (stateful where a test makes it so), one of ``ls`` and one of ``cat``."""


def guard(options: dict[str, Any]) -> tg.Guard:
    """A guard at streak levels 3 and 5, ``options`` over them."""
    settings = {"streak_warn_at": 3, "streak_stop_at": 5, **options}
    return tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False, **settings),
                    environ={})


def facts_of(state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The facts a damage test breaks, and their path: the shadow's where the snapshot holds one
    (its guard runs the other stuck signal), else the live turn's."""
    shadow = state.get("plugins", {}).get("shadow", {}).get("runs", {}).get("sh")
    if shadow is not None:
        return shadow["facts"], "plugins.shadow.runs.sh.facts"
    return state["facts"], "facts"
