"""``PROFILES``: named configurations an operator can start from, each backed by evidence.

``"seed"`` is the defaults (the seeds' semantics, which stay the defaults). ``"recommended"`` is
the smallest change from them that, on the recorded corpus and the generated long turns, halts no
resolved run but the degenerate ``jib-4035`` and catches every run of 8 or more identical calls in
a row (docs/stuck-signals.md, "Profiles", has the table and the command that produced it;
``tests/test_profiles.py`` asserts it). It also turns ``cycle_repeat`` on at 5 and 8 repetitions:
replayed by calibrate and run through the live guard, the corpus's resolved runs never repeat a
cycle twice (1.5 times at most), and it halts 2 more runs, both unresolved loops
(``tests/test_policies_cycle_repeat.py``).

No profile lists a polling tool (``stateful_tools``): which tools poll is the host's to say, on top
of a profile (``PROFILES["recommended"].replace(stateful_tools=("ci_status",))``); under
``recommended`` an unlisted tool polled eight times with identical arguments halts an unattended
turn whatever it returns (docs/polling.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from turnguard._config import GuardConfig

PROFILES: Mapping[str, GuardConfig] = MappingProxyType({
    "seed": GuardConfig(),
    "recommended": GuardConfig(name="recommended", stuck_signal="stale_repeat", streak_stop_on="any",
                                cycle_repeat_warn_at=5, cycle_repeat_stop_at=8),
})
"""Read-only: name -> ``GuardConfig`` (frozen). Derive with ``PROFILES[name].replace(...)``. A
profile other than the defaults carries its name as ``GuardConfig.name`` (``turnguard.policy``),
so its figures are a series of their own."""
