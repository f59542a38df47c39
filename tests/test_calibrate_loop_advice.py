"""The loop detectors' probe rows in words: the stuck threshold D and the streak stop each read,
for every outcome of their row, as the sentence the report prints (word for word, figures
formatted), so that the two detectors share one path without either's wording moving."""

from __future__ import annotations

import pytest

from turnguard._calibrate.advice import Context, recommendation
from turnguard._calibrate.evidence import Passed, ProbeEvidence
from turnguard._calibrate.recording import Recording
from turnguard._calibrate.records import Limits, RecordedTurn

S = 1_000

ROWS = {
    "none": Passed(),
    "no_evidence": Passed(3, 0, 0, 0, 3_000),
    "within": Passed(60, 0, 60, 0, 1_234_567),
    "undecided": Passed(10, 0, 10, 0, 10_000),
    "above": Passed(20, 15, 5, 0, 20_000),
}
"""A row for each outcome against a tolerance of 10%."""

STUCK = {
    "none": "No probe turn would have been halted as stuck (D=6, past S=1,000): no evidence about D yet.",
    "no_evidence": "3 probe turns would have been halted as stuck (D=6), none has a result yet.",
    "within": "60 probe turns would have been halted as stuck (D=6): 0 resolved, 60 unresolved (95% interval of "
              "the share that would have succeeded 0%-6%): within the tolerance of 10%: keep D=6; going on cost "
              "1,234,567 calls past the would-be halts.",
    "undecided": "10 probe turns would have been halted as stuck (D=6): 0 resolved, 10 unresolved (95% interval of "
                 "the share that would have succeeded 0%-28%): not decided against the tolerance of 10%: about 25 "
                 "more probe turns past D=6 with a known fate decide it, about 2.5 days at the observed traffic.",
    "above": "20 probe turns would have been halted as stuck (D=6): 15 resolved, 5 unresolved (95% interval of the "
             "share that would have succeeded 53%-89%): above the tolerance of 10%: D=6 halts turns that would have "
             "succeeded; raise D or try stuck_signal='stale_repeat' (it spares edit-and-rerun), at 20,000 calls past "
             "the would-be halts.",
    "censored": "The probe's own D (6) is not past the main one (6): no probe turn halted as stuck can be seen past "
                "it; raise the probe's stuck_repeat_threshold to see past D=6.",
}
STREAK = {
    "none": "No probe turn would have been halted by the streak stop (8 identical failures): no evidence about it "
            "yet.",
    "no_evidence": "3 probe turns would have been halted by the streak stop (8), none has a result yet.",
    "within": "60 probe turns would have been halted by the streak stop (8): 0 resolved, 60 unresolved (95% "
              "interval of the share that would have succeeded 0%-6%): within the tolerance of 10%: keep "
              "streak_stop_at=8.",
    "undecided": "10 probe turns would have been halted by the streak stop (8): 0 resolved, 10 unresolved (95% "
                 "interval of the share that would have succeeded 0%-28%): not decided against the tolerance of "
                 "10%: about 25 more probe turns past the streak stop 8 with a known fate decide it, about 2.5 days "
                 "at the observed traffic.",
    "above": "20 probe turns would have been halted by the streak stop (8): 15 resolved, 5 unresolved (95% interval "
             "of the share that would have succeeded 53%-89%): above the tolerance of 10%: the streak stop halts "
             "retries that would have succeeded; raise streak_stop_at, at 20,000 calls past the would-be halts.",
    "censored": "The probe's own streak stop (8) is not past the main one (8): no probe turn can be seen past it; "
                "raise the probe's streak_stop_at to see past 8.",
}


def probe_recording(stuck_repeat: int, streak_stop: int) -> Recording:
    """One day of probe turns under the probe's own D and streak stop."""
    r = Recording()
    limits = Limits("adaptive", S, 20 * S, stuck_repeat, 5, streak_stop, 0)
    r.add(RecordedTurn("a", (), limits=limits, started_at=1000.0, ended_at=1000.0 + 86400), "probe")
    return r


def loop_lines(row: Passed, recording: Recording) -> tuple[str, str]:
    """The stuck and streak sentences of the recommendation, both rows ``row``, main D=6, stop 8."""
    e = ProbeEvidence(S, 10, 6, 8)
    e.turns = 100
    e.stuck, e.streak = row, row
    _, stuck, streak, *_ = recommendation(e, Context(0.1, recording))
    return stuck, streak


@pytest.mark.parametrize("outcome", ROWS)
def test_each_loop_detectors_row_reads_as_its_outcome_says(outcome):
    assert loop_lines(ROWS[outcome], probe_recording(12, 16)) == (STUCK[outcome], STREAK[outcome])


@pytest.mark.parametrize("outcome", ROWS)
def test_a_loop_detector_the_probe_does_not_see_past_says_so_whatever_its_row(outcome):
    assert loop_lines(ROWS[outcome], probe_recording(6, 8)) == (STUCK["censored"], STREAK["censored"])


def test_without_a_streak_stop_there_is_no_streak_sentence():
    e = ProbeEvidence(S, 10, 6, None)
    e.turns = 100
    lines = recommendation(e, Context(0.1, probe_recording(12, 16)))
    assert lines[1] == STUCK["none"]
    assert not any("streak stop" in line for line in lines)
