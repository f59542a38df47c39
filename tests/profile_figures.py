"""What every shipped profile does to the recorded corpus, turn by turn, as ``turnguard calibrate``'s
engine replays it: the figures ``tests/test_calibrate_profiles_unchanged.py`` holds to.

    PYTHONPATH=<checkout>/src python tests/profile_figures.py ../shared/corpus/*.jsonl > tests/data/profile_figures.json

``tests/data/profile_figures.json`` was written so on the code before ``stateful_tools``
(commit 83881dd): the profiles list no stateful tool, and the recorded runs must give the same
figures with results replayed as they gave before results existed. ``recommended`` turned
``cycle_repeat`` on later: the stored figures are compared with it off (``cycle_repeat=False``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import Policy
from turnguard._calibrate.inputs import read_turns
from turnguard._profiles import PROFILES

SOFT_CAPS = (100, 20)
"""As shipped, and at the calibration grid's smallest soft cap (the corpus never passes 59 calls)."""


def figures(paths: Sequence[str], *, cycle_repeat: bool = True) -> dict[str, dict[str, list[list[object]]]]:
    """By profile (and soft cap) and mode: [turn id, halt call, threshold, asks] of each turn the
    policy halted or asked about; ``cycle_repeat=False``: with that policy off in every profile (as
    they were when the stored figures were written)."""
    off = {} if cycle_repeat else {"cycle_repeat_warn_at": 0, "cycle_repeat_stop_at": 0}
    grid = [Policy(f"{name} S={cap}", config.replace(soft_cap=cap, load_entrypoints=False, **off), is_default=not i)
            for i, (name, cap, config) in enumerate((n, s, c) for n, c in PROFILES.items() for s in SOFT_CAPS)]
    calibrator = Calibrator(grid)
    out: dict[str, dict[str, list[list[object]]]] = {p.name: {"unattended": [], "attended": []} for p in grid}
    for turn in read_turns(paths, lambda problem: None):
        for policy, per_mode in zip(grid, calibrator.results(turn), strict=True):
            for mode, result in per_mode.items():
                if result.halt_call or result.asks:
                    out[policy.name][mode].append([turn.id, result.halt_call, result.threshold, list(result.asks)])
    return out


if __name__ == "__main__":
    json.dump(figures(sys.argv[1:]), sys.stdout, indent=None, separators=(",", ":"))
    print()
