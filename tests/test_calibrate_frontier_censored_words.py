"""Every frontier sentence that quotes a value's turns at risk says how many of them a limit of the
probe's own halted (``censored``) and how many its loop detector cut (``cut``), as
docs/calibration.md promises: a value that "halts 3 of 120 turns that succeeded" reads very
differently when 77 of the 120 were cut off by the probe's own cap before their end."""

from __future__ import annotations

import re

import pytest

from ladders import ladder_of
from turnguard._calibrate.evidence import SETTINGS, Ladder, Scale, frontier

TOLERANCE = 0.1
UNITS = {"soft": 2, "explicit": 20}
LIVE = {"backstop": 10, "stuck": 6, "streak": 8, "soft": 20, "cycles": 38, "explicit": 200}
HORIZON = 40
"""The probe's own limit, in ladder steps."""


def _frontier(threshold: str, ladder: Ladder):
    unit = UNITS.get(threshold, 1)
    return frontier(threshold, ladder, LIVE[threshold], TOLERANCE, Scale(1000, 1000, 100_000), HORIZON * unit, unit)


def _quoted(sentence: str) -> tuple[int, int]:
    """The censored and cut counts the sentence states (0 where it states none)."""
    censored = re.search(r"([\d,]+) of (?:them|the [\d,]+) halted at the probe's own limit", sentence)
    cut = re.search(r"([\d,]+) of them halted by the probe's own loop detector", sentence)
    return tuple(int(m[1].replace(",", "")) if m else 0 for m in (censored, cut))  # type: ignore[return-value]


@pytest.mark.parametrize("threshold", sorted(SETTINGS))
@pytest.mark.parametrize(("censored", "cut"), [(200, 0), (0, 1), (200, 1), (37, 0)])
def test_a_recommended_value_that_halts_productive_turns_says_what_the_probe_cut_off(threshold, censored, cut):
    turns = ladder_of((12, "resolved", 3), (HORIZON - 1, "censored", censored), (HORIZON - 1, "cut", cut),
                    (HORIZON - 1, "unresolved", 200 - censored))
    f = _frontier(threshold, turns)
    assert f.recommended is not None, f.sentence
    r = f.rung(f.recommended)
    assert r.productive == 3 and (r.censored, r.cut) == (censored, cut)
    assert f.sentence.startswith(f"set {SETTINGS[threshold]} = {f.recommended}: it halts 3 of the {r.at_risk:,}")
    assert _quoted(f.sentence) == (censored, cut), f.sentence


@pytest.mark.parametrize("threshold", sorted(SETTINGS))
@pytest.mark.parametrize(("censored", "cut"), [(40, 0), (0, 5), (40, 5)])
def test_productive_turns_up_to_the_probes_limit_say_what_the_probe_cut_off(threshold, censored, cut):
    f = _frontier(threshold, ladder_of((HORIZON - 1, "resolved", 10), (HORIZON - 1, "censored", censored),
                                     (HORIZON - 1, "cut", cut)))
    assert f.recommended is None
    last = f.rung((HORIZON - 1) * UNITS.get(threshold, 1))
    assert f.sentence.startswith(f"no value of {SETTINGS[threshold]} up to ")
    assert f"(10 of {last.at_risk:,}" in f.sentence
    assert _quoted(f.sentence) == (censored, cut), f.sentence


@pytest.mark.parametrize("threshold", sorted(SETTINGS))
def test_a_sentence_with_nothing_cut_off_says_nothing_of_it(threshold):
    f = _frontier(threshold, ladder_of((12, "resolved", 3), (HORIZON - 1, "unresolved", 200)))
    assert f.recommended is not None and _quoted(f.sentence) == (0, 0)
    assert "probe's own" not in f.sentence
