"""The recorded runs give the same figures under every shipped profile now that calibrate replays
their result digests (``stateful_tools``) as they gave before results existed: turn by turn, the
same halts at the same calls by the same thresholds, and the same asks (``tests/profile_figures.py``
says how the stored figures were made)."""

from __future__ import annotations

import json
from pathlib import Path

import profile_figures
from conftest import corpus_files

STORED = Path(__file__).parent / "data" / "profile_figures.json"


def test_every_profile_halts_and_asks_the_recorded_runs_as_before_results_were_replayed():
    files = corpus_files()
    assert all('"result"' in path.read_text(encoding="utf-8")[:100_000] for path in files)  # results are there
    before = json.loads(STORED.read_text(encoding="utf-8"))
    now = json.loads(json.dumps(profile_figures.figures([str(p) for p in files])))
    assert set(now) == set(before) and len(now) == 4
    for policy in before:
        assert now[policy] == before[policy], policy
    assert sum(len(v["unattended"]) for v in now.values()) > 100  # halts enough to tell a change
