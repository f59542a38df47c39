"""The recorded runs give the same figures under every shipped profile now that calibrate replays
their result digests (``stateful_tools``) as they gave before results existed: turn by turn, the
same halts at the same calls by the same thresholds, and the same asks (``tests/profile_figures.py``
says how the stored figures were made)."""

from __future__ import annotations

import json
from pathlib import Path

import profile_figures
from conftest import corpus_files
from turnguard._calibrate.inputs import read_turns

STORED = Path(__file__).parent / "data" / "profile_figures.json"
CHANGED = {100: (2, 4), 20: (0, 3)}
"""By soft cap: the turns ``cycle_repeat`` changes under ``recommended``, (unattended, attended)."""


STALE_REPEAT_CHANGED = {
    "deepseek-coder-v2/fasterxml__jackson-databind-4132": None,
    "deepseek-coder-v2/fasterxml__jackson-databind-4360": (41, "soft_stuck"),
    "deepseek-coder-v2/google__gson-1391": (21, "soft_stuck"),
    "doubao-pro-128k/fasterxml__jackson-databind-4609": (24, "soft_stuck"),
    "doubao-pro-128k/googlecontainertools__jib-2536": (21, "soft_stuck"),
}
"""The turns ``recommended S=20`` (``stuck_signal="stale_repeat"``) halts elsewhere since the stale
count reaches back over a loop's first round (issue 7's audit): by turn id, its (halt call,
threshold) in both modes now, ``None``: not halted. All five are unresolved; the stored figures
keep the halts before that change, so that everything else is still held to them."""


Figures = dict[str, dict[str, list[list[object]]]]


def with_stale_repeat_change(figures: Figures) -> Figures:
    """The stored figures with ``STALE_REPEAT_CHANGED`` applied to ``recommended S=20`` (an ask
    stays an ask; a turn neither halted nor asked about leaves the list)."""
    out = json.loads(json.dumps(figures))
    for mode, rows in out["recommended S=20"].items():
        by_id = {row[0]: row for row in rows}
        for turn_id, now in STALE_REPEAT_CHANGED.items():
            asks = by_id[turn_id][3] if turn_id in by_id else []
            row = [turn_id, *(now or (0, None)), asks]
            by_id[turn_id] = row if (now or asks) and (mode == "attended" or now) else None
        order = [row[0] for row in rows] + [t for t in STALE_REPEAT_CHANGED if t not in {r[0] for r in rows}]
        out["recommended S=20"][mode] = [by_id[t] for t in sorted(dict.fromkeys(order)) if by_id.get(t)]
    return out


def test_every_profile_halts_and_asks_the_recorded_runs_as_before_results_were_replayed():
    files = corpus_files()
    assert all('"result"' in path.read_text(encoding="utf-8")[:100_000] for path in files)  # results are there
    before = with_stale_repeat_change(json.loads(STORED.read_text(encoding="utf-8")))
    now = json.loads(json.dumps(profile_figures.figures([str(p) for p in files], cycle_repeat=False)))
    assert set(now) == set(before) and len(now) == 4
    for policy in before:
        assert sorted(now[policy]["unattended"]) == sorted(before[policy]["unattended"]), policy
        assert sorted(now[policy]["attended"]) == sorted(before[policy]["attended"]), policy
    assert sum(len(v["unattended"]) for v in now.values()) > 100  # halts enough to tell a change


def test_cycle_repeat_changes_recommended_only_on_unresolved_runs_it_halts_or_asks_about():
    """``recommended``'s ``cycle_repeat`` (5, 8) against the same profile without it, as calibrate
    replays the corpus: every other turn is halted and asked about as before; the changed ones are
    unresolved, halted or asked about by ``cycle_repeat`` (at S=20 the soft cap halts the two loops
    first)."""
    files = [str(p) for p in corpus_files()]
    on, off = profile_figures.figures(files), profile_figures.figures(files, cycle_repeat=False)
    resolved = {turn.id: turn.resolved for turn in read_turns(files, lambda problem: None)}
    assert on["seed S=100"] == off["seed S=100"] and on["seed S=20"] == off["seed S=20"]
    for cap in profile_figures.SOFT_CAPS:
        policy = f"recommended S={cap}"
        changed = {}
        for mode in ("unattended", "attended"):
            before = {row[0]: row for row in off[policy][mode]}
            after = {row[0]: row for row in on[policy][mode]}
            changed[mode] = {turn for turn in before.keys() | after.keys() if before.get(turn) != after.get(turn)}
            assert all(resolved[turn] is False for turn in changed[mode]), (policy, mode)
        assert all(row[2] == "cycle_repeat" for row in on[policy]["unattended"] if row[0] in changed["unattended"])
        assert (len(changed["unattended"]), len(changed["attended"])) == CHANGED[cap], policy
