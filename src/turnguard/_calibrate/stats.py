"""The figures a calibration run accumulates, and how partial runs merge.

Everything is a counter or a histogram keyed by small integers, so memory grows with the grid and
the longest turn, never with the number of turns (``bounds.py``); ids of halted turns are kept up
to ``bounds.ids_per_policy``. ``to_json``/``from_json`` round-trip exactly, so split runs merge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnguard._calibrate.advice import (
    DEFAULT_TOLERANCE,
    Context,
    assess,
    frontiers,
    probe_hard_cap,
    recommendation,
    tool_list_warning,
    valid_tolerance,
)
from turnguard._calibrate.bounds import (
    COHORT_KEYS,
    MAX_IDS,
    Key,
    add_count,
    add_counts,
    call_count_key,
    cohort_key,
    count,
    dump,
    halt_bucket,
    hist,
    ids_per_policy,
    key_in,
    load,
    shown,
)
from turnguard._calibrate.duplicates import SKETCH, TurnPrints
from turnguard._calibrate.evidence import ProbeEvidence
from turnguard._calibrate.recording import Recording
from turnguard._calibrate.records import TOOL_LIST_KEYS
from turnguard._calibrate.replay import TurnResult, calls_saved, decile, relative_position
from turnguard._calibrate.survival import Survival, estimate
from turnguard._model import MAX_ID_LENGTH, PLUGIN_ERROR_THRESHOLD, Threshold, halt_threshold

FORMAT = "turnguard-_calibrate/2"
"""Version 2 adds what the recording cannot tell (censored counts, survival); results of version 1
are refused: run the parts again."""
MODES = ("unattended", "attended")
HaltEffect = tuple[str, int, int]
"""A halt's threshold label, the calls it saved and the tenth of the turn it landed in."""


HALT_ENDS = frozenset({*(str(t) for t in Threshold), "halted", PLUGIN_ERROR_THRESHOLD})
"""``ended_by`` values of a turn whose recording ends at a halt of its own (live or probe): what it
would have done past the halt is not recorded (right-censored there)."""
SOURCES = ("probe", "attended", "live", "unrecorded")
"""Where a halt's evidence comes from (the recording goes on past it): a probe turn, a live turn
answered "continue", another live turn, or a recording without a cohort."""


def halt_ended(ended_by: str | None) -> bool:
    """Whether a turn's recording ends at a halt of its own (``HALT_ENDS``)."""
    return ended_by in HALT_ENDS


def halt_effect(result: TurnResult, calls: int) -> HaltEffect | None:
    """What a result adds to the halt figures (``None``: it did not halt)."""
    if not result.halt_call:
        return None
    return (str(halt_threshold(result.threshold)), calls_saved(result, calls),
            decile(relative_position(result.halt_call, calls)))


@dataclass
class ModeStats:
    """One policy in one mode (unattended: ``promptable=False``; attended: ``True``)."""

    halted: int = 0
    by_threshold: dict[str, int] = field(default_factory=dict)
    halted_resolved: int = 0
    resolved_ids: list[str] = field(default_factory=list)
    halted_unresolved: int = 0
    unresolved_ids: list[str] = field(default_factory=list)
    saved_unresolved: int = 0
    halted_unknown: int = 0
    saved_unknown: int = 0
    halt_calls: dict[int, list[int]] = field(default_factory=dict)
    """Histogram of the call index each halt prevented: by ``bounds.halt_bucket``, ``[halts, lowest
    call, highest call]`` (a bucket whose halts all fell on one call says so exactly)."""
    max_ids: int = 0
    """Ids of halted turns kept (0 in the attended mode: the report names the unattended ones)."""
    halt_deciles: list[int] = field(default_factory=lambda: [0] * 11)
    """Where halts land: tenths of the turn (index 10: after its last call)."""
    asks: int = 0
    turns_with_asks: int = 0
    asks_resolved: int = 0
    """Asks seen in turns that were resolved (the user was interrupted on a good run)."""
    halted_censored: dict[str, int] = field(default_factory=dict)
    """By cohort: halts of turns whose recording ends at a halt of their own, at or after this one:
    their future is not recorded, so they are neither resolved nor unresolved halts."""
    saved_censored: int = 0
    """The recorded calls those halts come before."""
    evidence: dict[str, int] = field(default_factory=dict)
    """By source (``SOURCES``): the halts whose turn's recording goes on past them to its own end,
    the only ones whose result says whether the halt was a false positive."""
    halted_cut_short: dict[str, int] = field(default_factory=dict)
    """By cohort: halts within the listed calls of turns cut short: evidence like any other."""

    def add(self, turn_id: str, calls: int, resolved: bool | None, result: TurnResult) -> None:
        self.add_effect(turn_id, resolved, result, halt_effect(result, calls))

    def add_effect(self, turn_id: str, resolved: bool | None, result: TurnResult, effect: HaltEffect | None,
                   cut: str | None = None, source: str = "unrecorded", short: str | None = None) -> None:
        """``add`` with the halt's figures computed once for a replay group: ``cut`` and ``short`` the
        cohort keys of a turn ending at a halt of its own or cut short, ``source`` from ``SOURCES``."""
        asks = result.asks
        if asks:
            self.asks += len(asks)
            self.turns_with_asks += 1
            if resolved:
                self.asks_resolved += len(asks)
        if effect is None:
            return
        label, saved, tenth = effect
        self.halted += 1
        by_threshold = self.by_threshold
        by_threshold[label] = by_threshold.get(label, 0) + 1
        add_halt_call(self.halt_calls, result.halt_call)
        self.halt_deciles[tenth] += 1
        if cut is not None:
            add_count(self.halted_censored, cut)
            self.saved_censored += saved
            return
        if short is not None:
            add_count(self.halted_cut_short, short)
        add_count(self.evidence, source)
        if resolved is True:
            self.halted_resolved += 1
            if len(self.resolved_ids) < self.max_ids:
                self.resolved_ids.append(turn_id)
        elif resolved is False:
            self.halted_unresolved += 1
            self.saved_unresolved += saved
            if len(self.unresolved_ids) < self.max_ids:
                self.unresolved_ids.append(turn_id)
        else:
            self.halted_unknown += 1
            self.saved_unknown += saved

    @property
    def evidence_halts(self) -> int:
        """Halts whose turn was recorded to its own end (resolved, unresolved or of unknown result)."""
        return self.halted_resolved + self.halted_unresolved + self.halted_unknown

    def censored(self, halt_ended: dict[str, int], cut_short: dict[str, int] | None = None,
                 in_part: dict[str, int] | None = None) -> dict[str, int]:
        """By cohort: the turns whose recording stops before their end that this policy does not halt
        within it, and those recorded in part: censored, neither halted nor not."""
        out: dict[str, int] = {}
        for c, n in halt_ended.items():
            add_count(out, c, n - self.halted_censored.get(c, 0))
        for c, n in (cut_short or {}).items():
            add_count(out, c, n - self.halted_cut_short.get(c, 0))
        for c, n in (in_part or {}).items():
            add_count(out, c, n)
        return out

    def censored_by_cause(self, halt_ended: dict[str, int], cut_short: dict[str, int] | None = None,
                          in_part: dict[str, int] | None = None) -> dict[str, int]:
        """``censored``, summed by why the recording cannot tell what a row does to a turn: it ends
        at a halt of its own; its listed calls stop before its end; it is recorded in part."""
        return {
            "halt_ended": sum(n - self.halted_censored.get(c, 0) for c, n in halt_ended.items()),
            "cut_short": sum(n - self.halted_cut_short.get(c, 0) for c, n in (cut_short or {}).items()),
            "recorded_in_part": sum((in_part or {}).values()),
        }

    def merge(self, other: ModeStats) -> None:
        for name in _MODE_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("by_threshold", "halted_censored", "evidence", "halted_cut_short"):
            add_counts(getattr(self, name), getattr(other, name))
        self.resolved_ids.extend(other.resolved_ids[: max(0, self.max_ids - len(self.resolved_ids))])
        self.unresolved_ids.extend(other.unresolved_ids[: max(0, self.max_ids - len(self.unresolved_ids))])
        for k, (n, lo, hi) in other.halt_calls.items():
            mine = self.halt_calls.get(k)
            self.halt_calls[k] = [n, lo, hi] if mine is None else [mine[0] + n, min(mine[1], lo), max(mine[2], hi)]
        self.halt_deciles = [a + b for a, b in zip(self.halt_deciles, other.halt_deciles, strict=True)]

    def to_json(self, halt_ended: dict[str, int] | None = None, cut_short: dict[str, int] | None = None,
                in_part: dict[str, int] | None = None) -> dict[str, Any]:
        censored = self.censored(halt_ended or {}, cut_short, in_part)
        return dump(self, _MODE_KEYS, censored=sum(censored.values()), censored_by_cohort=censored,
                    censored_by_cause=self.censored_by_cause(halt_ended or {}, cut_short, in_part))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModeStats:
        """One mode of a ``--json`` result, checked like any input: counts are whole numbers in
        range, ids within ``MAX_ID_LENGTH``, and the counts add up (``ValueError`` when not)."""
        if not isinstance(data, dict):
            raise ValueError(f"a mode's figures must be an object, got {shown(data)}")
        s = cls(**load(data, _MODE_KEYS))
        halted, at_calls = s.halted, sum(v[0] for v in s.halt_calls.values())
        if not (sum(s.by_threshold.values()) == at_calls == sum(s.halt_deciles) == halted
                == s.evidence_halts + sum(s.halted_censored.values()) and sum(s.evidence.values()) == s.evidence_halts):
            raise ValueError("inconsistent figures: the halts by threshold, call, tenth, evidence and censoring do not "
                             f"add up to the {shown(halted)} halted")
        if len(s.resolved_ids) > s.halted_resolved or len(s.unresolved_ids) > s.halted_unresolved:
            raise ValueError("inconsistent figures: more ids than halts")
        if sum(s.halted_cut_short.values()) > s.evidence_halts:
            raise ValueError("inconsistent figures: more halts of turns cut short than halts with evidence")
        return s


def add_halt_call(hist: dict[int, list[int]], call: int) -> None:
    key = halt_bucket(call)
    entry = hist.get(key)
    if entry is None:
        hist[key] = [1, call, call]
    else:
        entry[0] += 1
        if call < entry[1]:
            entry[1] = call
        elif call > entry[2]:
            entry[2] = call


def _halt_calls(data: Any, what: str = "halt_calls") -> dict[int, list[int]]:
    """A result's halt-call histogram: ``{bucket: [halts, lowest, highest]}``, each call in its bucket."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object, got {shown(data)}")
    out = {}
    for key, value in data.items():
        bucket = call_count_key(key)
        if not isinstance(value, list) or len(value) != 3:
            raise ValueError(f"halt_calls[{shown(key)}] must be [halts, lowest call, highest call]")
        n, lo, hi = (count(v, "halt_calls") for v in value)
        if not n or lo > hi or halt_bucket(lo) != bucket or halt_bucket(hi) != bucket:
            raise ValueError(f"halt_calls[{shown(key)}]: {shown(value)} is not a bucket of halt calls")
        out[bucket] = [n, lo, hi]
    return out


def _label(key: Any) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_ID_LENGTH:
        raise ValueError(f"a threshold label must be a text of at most {MAX_ID_LENGTH} characters, got {shown(key)}")
    return key


_source = key_in(SOURCES, "an evidence source")


def _ids(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_IDS or not all(
            isinstance(i, str) and len(i) <= MAX_ID_LENGTH for i in value):
        raise ValueError(f"{what} must be a list of at most {MAX_IDS} ids of at most {MAX_ID_LENGTH} characters")
    return list(value)


def _deciles(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) != 11:
        raise ValueError(f"{what} must have 11 entries")
    return [count(v, what) for v in value]


_MODE_KEYS = (
    Key("halted"), Key("censored", into=None), Key("censored_by_cohort", into=None),
    Key("censored_by_cause", into=None),
    hist("halted_cut_short_by_cohort", cohort_key, "halted_cut_short", {}),
    Key("halted_censored", out=lambda h: sum(h.values()), into=None),
    hist("halted_censored_by_cohort", cohort_key, "halted_censored"),
    Key("saved_censored"), Key("evidence_halts", into=None),
    hist("evidence_by_source", _source, "evidence"),
    hist("by_threshold", _label),
    Key("halted_resolved"), Key("resolved_ids", out=list, into=_ids),
    Key("halted_unresolved"), Key("unresolved_ids", out=list, into=_ids),
    Key("saved_unresolved"), Key("halted_unknown"), Key("saved_unknown"),
    Key("halt_calls", out=lambda h: {str(k): list(v) for k, v in sorted(h.items())}, into=_halt_calls),
    Key("halt_deciles", out=list, into=_deciles),
    Key("asks"), Key("turns_with_asks"), Key("asks_resolved"),
)
"""``ModeStats`` as a result holds it (the censored figures depend on the run's counts)."""
_MODE_COUNTS = tuple(k.name for k in _MODE_KEYS if k.into is count)
"""``ModeStats``'s plain counters: summed by ``merge``."""


@dataclass
class RunStats:
    """Everything one run (or a merge of runs) found."""

    policies: list[dict[str, Any]]
    """Each policy's name, parameters and whether it is the default (same order as ``modes``)."""
    modes: list[dict[str, ModeStats]]
    turns: int = 0
    calls: int = 0
    resolved: int = 0
    unresolved: int = 0
    problems: int = 0
    replays: int = 0
    """Replays actually run (after grouping); for the benchmark's honesty."""
    calls_per_turn: dict[int, int] = field(default_factory=dict)
    calls_per_turn_resolved: dict[int, int] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    probe: ProbeEvidence = field(default_factory=lambda: ProbeEvidence(None, None, None))
    """Probe turns against the default policy's thresholds (``evidence.py``)."""
    halt_ended: dict[str, int] = field(default_factory=dict)
    """By cohort (``COHORT_KEYS``): turns replayed whose recording ends at a halt of their own."""
    cut_short: dict[str, int] = field(default_factory=dict)
    """By cohort: turns replayed that ended on their own but whose listed calls stop before their
    end (``RecordedTurn.cut_short``): a row that does not halt one within them censors it."""
    recorded_in_part: dict[str, int] = field(default_factory=dict)
    """By cohort: turns whose listed calls are not the turn's start (``RecordedTurn.in_part``):
    not replayed, censored for every row; their call count, end and result still count."""
    in_part_ids: list[str] = field(default_factory=list)
    """The first ``MAX_IDS`` of them, to name them."""
    suspended_parts: int = 0
    """Turn spans ending a part of a turn (``suspended``): not turns (the span that ends the turn
    counts it, as the recorder writes its line only then)."""
    recording: Recording = field(default_factory=Recording)
    """The policies, limits and times the turns were recorded with (``recording.py``)."""
    tolerance: float = DEFAULT_TOLERANCE
    """What the probe rows are decided against (``decision.py``)."""
    probe_rate: float | None = None
    """The probe's configured rate (the base configuration's), to scale its cost to the fleet."""
    survival: Survival = field(default_factory=Survival)
    """The turns' call counts as events and censorings (``survival.py``)."""
    duplicates: int = 0
    """Readings of a turn already counted (same id, same turn), dropped (``duplicates.py``)."""
    prints: TurnPrints = field(default_factory=TurnPrints)
    """Every counted turn's id and content hashes, to find repeats (not in ``--json``)."""
    sketch: list[str] = field(default_factory=list)
    """A read result's id sketch (``duplicates.SKETCH``); a run's comes from ``prints``."""

    @classmethod
    def empty(cls, policies: list[dict[str, Any]]) -> RunStats:
        default = next((p["params"] for p in policies if p["default"]), None)
        ids = ids_per_policy(len(policies))
        return cls(policies=policies, modes=[{"unattended": ModeStats(max_ids=ids), "attended": ModeStats()}
                                             for _ in policies], probe=ProbeEvidence.for_policy(default))

    @property
    def unknown(self) -> int:
        """Turns whose recording does not say whether the task was solved."""
        return self.turns - self.resolved - self.unresolved

    @property
    def default_params(self) -> dict[str, Any] | None:
        return next((p["params"] for p in self.policies if p["default"]), None)

    def context(self) -> Context:
        """What the probe rows are read against."""
        cycles = (self.default_params or {}).get("cycles")
        return Context(self.tolerance, self.recording, self.probe_rate, cycles if isinstance(cycles, int) else None)

    def censored(self, mode: ModeStats) -> dict[str, int]:
        """``mode``'s censored turns by cohort, from this run's counts."""
        return mode.censored(self.halt_ended, self.cut_short, self.recorded_in_part)

    def add_in_part(self, turn_id: str, cohort: str) -> None:
        """A turn recorded in part (not replayed)."""
        add_count(self.recorded_in_part, cohort)
        if len(self.in_part_ids) < MAX_IDS:
            self.in_part_ids.append(turn_id)

    def add_turn(self, calls: int, resolved: bool | None) -> None:
        self.turns += 1
        self.calls += calls
        add_count(self.calls_per_turn, calls)
        if resolved is True:
            self.resolved += 1
            add_count(self.calls_per_turn_resolved, calls)
        elif resolved is False:
            self.unresolved += 1

    def merge(self, other: RunStats) -> None:
        if [p["name"] for p in other.policies] != [p["name"] for p in self.policies] or [
            p["params"] for p in other.policies
        ] != [p["params"] for p in self.policies]:
            raise ValueError("cannot merge results of different grids (run every part with the same flags)")
        for mine, theirs in zip(self.modes, other.modes, strict=True):
            for m in MODES:
                mine[m].merge(theirs[m])
        for name in _RUN_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("calls_per_turn", "calls_per_turn_resolved", *_BY_COHORT):
            add_counts(getattr(self, name), getattr(other, name))
        self.in_part_ids.extend(other.in_part_ids[: max(0, MAX_IDS - len(self.in_part_ids))])
        self.prints.merge(other.prints)
        self.sketch = sorted({*self.sketch, *other.sketch})[:SKETCH]
        self.inputs.extend(i for i in other.inputs if i not in self.inputs)
        self.probe.merge(other.probe)
        self.recording.merge(other.recording)
        self.survival.merge(other.survival)

    def horizon(self) -> tuple[int | None, str]:
        """How far the survival estimate reaches: the highest cap turns ran under (``"limits"``), else
        the largest call count seen (``"data"``); ``None`` without turns."""
        caps = [lim.hard_cap for cohort in COHORT_KEYS for lim, _ in self.recording.limits_of(cohort)]
        if caps and None not in caps:
            return max(c for c in caps if c is not None), "limits"
        largest = self.survival.largest()
        return (largest or None), "data"

    def caps(self) -> dict[str, int | None]:
        """The live cap (the one most live turns ran under) and the probe's highest, when recorded."""
        live = self.recording.limits_of("live")
        return {"live": live[0][0].hard_cap if live else None, "probe": probe_hard_cap(self.recording)}

    def warnings(self) -> list[str]:
        """What makes the figures untrustworthy as run: the recording's tool lists not --config's."""
        warning = tool_list_warning(self.recording, self.default_params)
        return [] if warning is None else [warning]

    def survival_json(self) -> dict[str, Any]:
        """The survival histograms and the estimate read from them."""
        params = self.default_params or {}
        base = params.get("hard_cap") if params.get("cap_mode") == "adaptive" else None
        horizon, source = self.horizon()
        return {**self.survival.to_json(),
                **estimate(self.survival, base, params.get("multiplier") if base else None, horizon, source)}

    def probe_json(self) -> dict[str, Any]:
        """The probe evidence: its counts, each row's decision against the tolerance beside its
        interval, and the recommendation in words."""
        data = self.probe.to_json()
        ctx = self.context()
        decisions = assess(self.probe, ctx) if self.probe.soft_cap is not None else {}
        for key, decision in decisions.items():
            row = data["passed_multiple"][key] if key not in ("stuck", "streak") else data[f"passed_{key}"]
            row.update(decision.to_json())
        data["tolerance"] = self.tolerance
        data["configured_rate"] = self.probe_rate
        data["recommendation"] = recommendation(self.probe, ctx, turns=self.turns, calls=self.calls,
                                                default_limits=default_limits(self.default_params))
        data["frontier"] = {f.threshold: f.to_json() for f in frontiers(self.probe, ctx, self.turns, self.calls)}
        return data

    def to_json(self) -> dict[str, Any]:
        return dump(self, _RUN_KEYS, format=FORMAT, turn_sketch=self.id_sketch(), policies=[
            {**p, **{m: modes[m].to_json(self.halt_ended, self.cut_short, self.recorded_in_part) for m in MODES}}
            for p, modes in zip(self.policies, self.modes, strict=True)
        ], probe=self.probe_json(), survival=self.survival_json(), warnings=self.warnings())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunStats:
        """A ``--json`` result, checked like any input (``ValueError`` naming what is wrong)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a turnguard calibrate --json result (expected format {FORMAT!r})")
        raw = data["policies"]
        if not isinstance(raw, list) or not raw:
            raise ValueError("'policies' must be a non-empty list")
        policies = [_policy_info(p) for p in raw]
        modes = [{m: ModeStats.from_json(p[m]) for m in MODES} for p in raw]
        ids = ids_per_policy(len(policies))
        for mode in modes:
            mode["unattended"].max_ids = ids
            if any(len(m.resolved_ids) > m.max_ids or len(m.unresolved_ids) > m.max_ids for m in mode.values()):
                raise ValueError(f"more ids than a grid of {len(policies)} policies keeps ({ids} per policy, none "
                                 "attended)")
        probe = data["probe"]
        stats = cls(policies=policies, modes=modes, **load(data, _RUN_KEYS),
                    probe_rate=_rate(probe.get("configured_rate") if isinstance(probe, dict) else None))
        stats.check()
        return stats

    def id_sketch(self) -> list[str]:
        """The smallest id hashes of the turns counted (``duplicates.SKETCH``)."""
        return sorted({*self.sketch, *self.prints.sketch()})[:SKETCH]

    def check(self) -> None:
        """``ValueError`` when the counts do not add up (a tampered or truncated result)."""
        problems = []
        if self.resolved + self.unresolved > self.turns:
            problems.append("more results than turns")
        if sum(self.calls_per_turn.values()) != self.turns or sum(
                k * v for k, v in self.calls_per_turn.items()) != self.calls:
            problems.append("the calls per turn do not add up to the turns and calls")
        if sum(self.calls_per_turn_resolved.values()) != self.resolved or any(
                v > self.calls_per_turn.get(k, 0) for k, v in self.calls_per_turn_resolved.items()):
            problems.append("the resolved turns' calls are not among the turns'")
        if sum(sum(getattr(self, name).values()) for name in _BY_COHORT) > self.turns:
            problems.append("more turns ended at a halt, cut short or recorded in part than turns")
        if len(self.in_part_ids) > sum(self.recorded_in_part.values()):
            problems.append("more ids of turns recorded in part than turns recorded in part")
        problems += [f"{info['name']} ({m}) halts more turns than there are"
                     for info, modes in zip(self.policies, self.modes, strict=True) for m in MODES
                     if not self._halts_fit(modes[m])]
        if self.probe.turns + self.probe.live_turns > self.turns:
            problems.append("more probe and live turns than turns")
        if self.survival.turns + self.survival.unknown_end != self.turns:
            problems.append("the survival histograms do not hold every turn")
        if problems:
            raise ValueError("inconsistent figures: " + "; ".join(problems[:3]))

    def _halts_fit(self, mode: ModeStats) -> bool:
        """Whether ``mode`` halts no more turns than the run has, of every kind it counts apart."""
        return mode.halted <= self.turns and all(
            v <= self.halt_ended.get(c, 0) for c, v in mode.halted_censored.items()) and all(
            v <= self.cut_short.get(c, 0) for c, v in mode.halted_cut_short.items())


_RUN_KEYS = (
    Key("format", into=None), Key("inputs", out=list, into=lambda v, _: _inputs(v)),
    *map(Key, ("turns", "calls", "resolved", "unresolved", "problems", "replays")),
    hist("calls_per_turn", call_count_key), hist("calls_per_turn_resolved", call_count_key),
    hist("halt_ended", cohort_key), hist("cut_short", cohort_key, missing={}),
    hist("recorded_in_part", cohort_key, missing={}),
    Key("recorded_in_part_ids", "in_part_ids", list, _ids, []),
    Key("suspended_parts", missing=0), Key("duplicates", missing=0),
    Key("turn_sketch", "sketch", into=lambda v, _: _sketch(v), missing=[]),
    Key("tolerance", into=lambda v, _: valid_tolerance(v)),
    Key("recording", out=Recording.to_json, into=lambda v, _: Recording.from_json(v)),
    Key("policies", into=None), Key("probe", into=lambda v, _: ProbeEvidence.from_json(v)),
    Key("survival", into=lambda v, _: Survival.from_json(v)), Key("warnings", into=None),
)
"""``RunStats`` as a result holds it (``to_json`` gives the derived keys)."""
_RUN_COUNTS = tuple(k.name for k in _RUN_KEYS if k.into is count)
"""``RunStats``' plain counters: summed by ``merge``."""
_BY_COHORT = ("halt_ended", "cut_short", "recorded_in_part")
"""``RunStats``' counts by cohort of the turns whose recording stops before their end (disjoint)."""


def _sketch(value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > SKETCH or not all(
            isinstance(h, str) and len(h) == 16 and all(c in "0123456789abcdef" for c in h) for h in value):
        raise ValueError(f"'turn_sketch' must be a list of at most {SKETCH} 16-digit hex hashes")
    return sorted(set(value))


def _policy_info(p: Any) -> dict[str, Any]:
    if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not isinstance(p.get("default"), bool) or \
            not isinstance(p.get("family"), str) or not isinstance(p.get("params"), dict):
        raise ValueError(f"a policy needs a name, default, family and params: {shown(p)}")
    if len(p["name"]) > 4 * MAX_ID_LENGTH:
        raise ValueError(f"a policy name must be at most {4 * MAX_ID_LENGTH} characters")
    return {k: p[k] for k in ("name", "default", "family", "params")}


def _inputs(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(i, str) and len(i) <= 4096 for i in value):
        raise ValueError("'inputs' must be a list of file names")
    return list(value)


def _rate(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= 1:
        raise ValueError(f"the probe's configured rate must be from 0 to 1, got {shown(value)}")
    return float(value)


def default_limits(params: dict[str, Any] | None) -> dict[str, object] | None:
    """The default policy's limits in the recording's words (``records.Limits`` fields), the cap's
    settings only under an adaptive cap (where they decide) and without the tool lists (they have
    a warning of their own: ``tool_list_warning``). A result of an older turnguard (``--json``,
    ``merge``) describes fewer of them: the others are not compared."""
    if params is None:
        return None
    given = params.get("limits")
    if isinstance(given, dict):
        limits = {k: v for k, v in given.items() if k not in TOOL_LIST_KEYS}
    else:
        limits = {"cap_mode": params.get("cap_mode"), "hard_cap": params.get("hard_cap"),
                  "streak_stop_at": params.get("streak_stop_at"), "soft_cap": params.get("soft_cap"),
                  "stuck_repeat_threshold": params.get("stuck_repeat")}
    if limits.get("cap_mode") != "adaptive":
        limits = {k: v for k, v in limits.items() if k not in ADAPTIVE_KEYS}
    return limits


ADAPTIVE_KEYS = ("soft_cap", "stuck_repeat_threshold", "stuck_signal")
"""The limits that decide only under an adaptive cap."""
