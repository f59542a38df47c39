"""A turn whose recording lists fewer calls than it made is never replayed as a shorter turn that
ended on its own. Its listed calls stop early (``calls_dropped``: past the recorder's bound, tool
spans lost after the first ones): a row that does not halt it within them counts it censored,
never "not halted" and never "saved". Its listed calls are not its start (``calls_unrecorded``:
resumed from a snapshot without the recorder's section; tool spans without the first call): it
is left out of the replay, censored for every row, its counts, end and result still counted.

Checked against an oracle (each row's replay of each whole turn, alone) on a fleet run through a
real guard whose recording is then cut at random places, on every output (``--json``, the table,
``--html``, ``calibrate merge`` of parts, ``--jobs 2``), and on the two producers of such
recordings: the recorder resuming a turn without its section, and real OTLP spans with spans
lost, a retried request and a suspended turn."""

from __future__ import annotations

import dataclasses
import io
import json
import random
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import turnguard as tg
from collector_lines import collector_lines, run_turns
from planted_fleet import LIVE, Work, run_fleet
from turnguard._calibrate import cli
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.records import RecordedCall, RecordedTurn
from turnguard._calibrate.replay import cycle_starts
from turnguard._calibrate.stats import halt_ended
from turnguard._config import GuardConfig
from turnguard.telemetry._testing import InMemoryTelemetry

GRID = ["--soft-caps", "10,20", "--multipliers", "5,10,20", "--stuck-repeats", "3,6", "--streaks", "5:8,3:0",
        "--explicit-caps", "30,300", "--cycle-caps", "0,40", "--key-modes", "canonical", "--no-peers"]
SPEC = dict(soft_caps=(10, 20), multipliers=(5, 10, 20), stuck_repeats=(3, 6), streaks=((5, 8), (3, 0)),
            explicit_caps=(30, 300), cycle_caps=(0, 40), key_modes=("canonical",), peers=False)
MODES = ("unattended", "attended")
MIX = {Work.SHORT: 30, Work.LONG: 10, Work.BEYOND: 5, Work.EDIT_RERUN: 8, Work.RETRY: 8, Work.RUNAWAY: 5,
       Work.STUCK: 6}
"""Every kind of the planted fleet's turns, fewer of them (the oracle replays each turn alone)."""


def run_cli(*arguments: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*map(str, arguments)], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_json(paths: list[Path], config: Path, *flags: str) -> dict:
    code, out, err = run_cli(*paths, "--config", config, *GRID, *flags, "--json", "-")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    """A fleet's recorder lines (results in the line, no late-result records) and its config."""
    folder = tmp_path_factory.mktemp("fleet")
    fleet = run_fleet(folder / "turns.jsonl", seed=3, mix=MIX)
    lines = []
    for text in (folder / "turns.jsonl").read_text().splitlines():
        line = json.loads(text)
        if "result_for" in line:
            continue
        line["resolved"] = fleet.turns[line["id"]].done
        lines.append(line)
    config = folder / "turnguard.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in LIVE.items()))
    return lines, config


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def cut_recording(lines: list[dict], seed: int) -> tuple[list[dict], dict[str, int], dict[str, int]]:
    """The lines with about a third cut short (their first p calls listed, the rest counted in
    ``calls_dropped``) and a sixth recorded in part (their first u calls counted in
    ``calls_unrecorded``, the rest listed): (lines, p by turn id, u by turn id)."""
    rng = random.Random(seed)
    out, short, part = [], {}, {}
    for line in lines:
        n = len(line["calls"])
        line = dict(line)
        draw = rng.random()
        if n and draw < 0.33:
            p = rng.choice([0, n - 1, rng.randrange(n)])
            short[line["id"]] = p
            line["calls"], line["calls_dropped"] = line["calls"][:p], n - p
        elif n and draw < 0.5:
            u = rng.randint(1, n)
            part[line["id"]] = u
            line["calls"], line["calls_unrecorded"] = line["calls"][u:], u
        out.append(line)
    assert short and part
    return out, short, part


def oracle(lines: list[dict], config: Path, short: dict[str, int], part: dict[str, int]) -> dict[str, dict]:
    """What each row and mode must say of the cut recording, from each row's replay of each whole
    turn alone: a cut-short turn is halted when the whole turn's halt is within its listed calls,
    else censored; a turn recorded in part is censored; nothing else changes."""
    policies = build_grid(GridSpec(**SPEC, base=GuardConfig.load(str(config))))
    cal = Calibrator(policies, group=False)
    whole = list(read_turns([write(config.parent / "whole.jsonl", lines)], print))
    expected: dict[str, dict] = {}
    for idx, policy in enumerate(policies):
        for mode in MODES:
            e = expected.setdefault(f"{policy.name}/{mode}", {"halted": 0, "censored": 0, "known_not_halted": 0,
                                                            "saved_unresolved": 0, "ids": set(), "cut_short": 0})
            for turn in whole:
                result = cal.results(turn)[idx].get(mode)
                h = result.halt_call if result is not None and result.halted else None
                if turn.id in part:
                    e["censored"] += 1
                    continue
                if turn.id in short and h is not None and h > short[turn.id]:
                    h = None  # the halt is past the listed calls: not in the recording
                at_halt = halt_ended(turn.ended_by)
                if h is None:
                    if at_halt or turn.id in short:
                        e["censored"] += 1
                        e["cut_short"] += turn.id in short and not at_halt
                    else:
                        e["known_not_halted"] += 1
                    continue
                e["halted"] += 1
                if not at_halt:
                    e["ids"].add(turn.id)
                    if turn.resolved is False:
                        e["saved_unresolved"] += len(turn.calls) - h + 1
    return expected


def check_rows(data: dict, expected: dict[str, dict]) -> None:
    for p in data["policies"]:
        for mode in MODES:
            m, e = p[mode], expected[f"{p['name']}/{mode}"]
            where = (p["name"], mode)
            assert m["halted"] == e["halted"], where
            assert m["censored"] == e["censored"] == sum(m["censored_by_cause"].values()), where
            assert data["turns"] - m["halted"] - m["censored"] == e["known_not_halted"], where
            assert m["censored_by_cause"]["cut_short"] == e["cut_short"], where
            assert m["saved_unresolved"] == e["saved_unresolved"], where
            assert set(m["resolved_ids"]) | set(m["unresolved_ids"]) <= e["ids"], where


@pytest.fixture(scope="module", params=[1, 2])
def cut(recorded, request) -> dict[str, Any]:
    lines, config = recorded
    cut_lines, short, part = cut_recording(lines, seed=request.param)
    path = write(config.parent / f"cut{request.param}.jsonl", cut_lines)
    return {"lines": cut_lines, "path": path, "short": short, "part": part,
            "expected": oracle(lines, config, short, part), "json": run_json([path], config),
            "whole": run_json([write(config.parent / "whole.jsonl", lines)], config)}


def test_no_turn_with_missing_calls_is_counted_not_halted_or_saved_at_any_row(cut) -> None:
    check_rows(cut["json"], cut["expected"])


def test_turns_recorded_in_part_are_counted_and_named_but_never_replayed(cut) -> None:
    data, part, short = cut["json"], cut["part"], cut["short"]
    assert sum(data["recorded_in_part"].values()) == len(part)
    assert set(data["recorded_in_part_ids"]) == set(part)
    assert sum(data["cut_short"].values()) == sum(1 for t in short if not halt_ended(
        next(line for line in cut["lines"] if line["id"] == t)["ended_by"]))
    for p in data["policies"]:
        for mode in MODES:
            assert p[mode]["censored_by_cause"]["recorded_in_part"] == len(part)
            assert not set(part) & (set(p[mode]["resolved_ids"]) | set(p[mode]["unresolved_ids"]))


def test_the_turn_facts_of_incomplete_recordings_are_those_of_the_whole_turns(cut) -> None:
    """Counts, results, ends and the Kaplan-Meier figures come from the turns' true call counts."""
    data, whole = cut["json"], cut["whole"]
    for key in ("turns", "calls", "resolved", "unresolved", "calls_per_turn", "calls_per_turn_resolved",
                "survival"):
        assert data[key] == whole[key], key
    probe, whole_probe = data["probe"], whole["probe"]
    for key in ("turns", "calls", "resolved", "unresolved", "censored"):
        assert probe[key] == whole_probe[key], key
    assert probe["past_main"] + probe["main_untold"] <= probe["turns"]
    assert probe["main_untold"] > 0


def test_jobs_and_merged_parts_give_the_same_figures(cut, recorded, tmp_path) -> None:
    _, config = recorded
    code, one, _ = run_cli(cut["path"], "--config", config, *GRID, "--json", "-", "--jobs", "1")
    code2, two, err = run_cli(cut["path"], "--config", config, *GRID, "--json", "-", "--jobs", "2")
    assert code == code2 == 0, err
    assert one == two  # byte for byte
    parts = []
    for i in range(3):
        part = write(tmp_path / f"part{i}.jsonl", cut["lines"][i::3])
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_text(json.dumps(run_json([part], config)))
    code, out, err = run_cli("merge", *parts, "--json", "-")
    assert code == 0, err
    merged = json.loads(out)
    check_rows(merged, cut["expected"])
    for key in ("cut_short", "recorded_in_part", "halt_ended", "survival", "turns", "calls"):
        assert merged[key] == cut["json"][key], key
    assert set(merged["recorded_in_part_ids"]) == set(cut["part"])


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """The figures table (``--wide``) as {row name: {column: cell}}, by the columns' dashes."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("policy") and "censored" in line)
    spans = [m.span() for m in re.finditer(r"-+", lines[at + 1])]
    names = [lines[at][a:b].strip() for a, b in spans]
    out = {}
    for line in lines[at + 2:]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in spans]
        out[cells[0].removeprefix("* ")] = dict(zip(names, cells, strict=True))
    return out


def test_the_table_says_how_many_turns_are_cut_short_and_left_out_and_why(cut, recorded) -> None:
    _, config = recorded
    code, text, err = run_cli(cut["path"], "--config", config, *GRID, "--wide")
    assert code == 0, err
    flat = " ".join(text.split())
    n_part = len(cut["part"])
    n_short = sum(cut["json"]["cut_short"].values())
    assert f"{n_part:,} turn{'s are' if n_part > 1 else ' is'} recorded in part" in flat
    assert f"{n_short:,} {'turns list only their' if n_short > 1 else 'turn lists only its'} first calls" in flat
    assert "not replayed" in flat
    assert "Turns recorded in part (not replayed):" in text
    rows = table_rows(text)
    for p in cut["json"]["policies"]:
        assert rows[p["name"]]["censored"] == f"{p['unattended']['censored']:,}", p["name"]


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_figures = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and dict(attrs).get("id") == "figures":
            self._in_figures = True
        elif self._in_figures and tag == "tr":
            self.rows.append([])
        elif self._in_figures and tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_figures = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_the_html_page_says_so_and_its_rows_count_them_censored(cut, recorded, tmp_path) -> None:
    _, config = recorded
    page = tmp_path / "report.html"
    code, _, err = run_cli(cut["path"], "--config", config, *GRID, "--html", page)
    assert code == 0, err
    text = page.read_text()
    flat = " ".join(text.split())
    assert "recorded in part" in flat and "only their first calls" in flat and "not replayed" in flat
    parser = _Cells()
    parser.feed(text)
    cells = {row[0]: row for row in parser.rows if row}
    for p in cut["json"]["policies"]:
        row = cells[p["name"]]
        assert (row[3], row[4]) == (f"{p['unattended']['halted']:,}", f"{p['unattended']['censored']:,}"), p["name"]


# -- older lines, hostile lines -----------------------------------------------------------------


def test_a_line_counting_more_calls_than_it_lists_without_saying_why_is_recorded_in_part(tmp_path) -> None:
    """An older recorder line (before ``calls_unrecorded``): ``tool_calls`` above the listed and
    dropped calls means calls are missing somewhere: not replayed."""
    calls = [{"tool": "t", "args": f"a{i}", "outcome": "ok"} for i in range(40)]
    lines = [{"id": "old", "calls": calls[10:], "tool_calls": 40, "ended_by": "completed", "resolved": False},
             {"id": "fine", "calls": calls, "tool_calls": 40, "ended_by": "completed", "resolved": False}]
    (tmp_path / "c.toml").write_text("soft_cap = 10\n")
    data = run_json([write(tmp_path / "t.jsonl", lines)], tmp_path / "c.toml")
    assert data["recorded_in_part"] == {"unrecorded": 1} and data["recorded_in_part_ids"] == ["old"]
    assert data["calls"] == 80
    x30 = next(p for p in data["policies"] if p["name"] == "explicit 30")["unattended"]
    assert x30["halted"] == 1 and x30["censored"] == 1 and x30["unresolved_ids"] == ["fine"]
    assert x30["saved_unresolved"] == 40 - 31 + 1


@pytest.mark.parametrize("key,value", [("calls_dropped", -1), ("calls_unrecorded", "3"), ("calls_dropped", 1.5),
                                       ("calls_unrecorded", True)])
def test_a_malformed_count_is_reported_and_left_out(tmp_path, key, value) -> None:
    line = {"id": "x", "calls": [{"tool": "t", "args": "a", "outcome": "ok"}], key: value}
    problems: list = []
    (turn,) = read_turns([write(tmp_path / "t.jsonl", [line])], problems.append)
    assert (turn.calls_dropped, turn.calls_unrecorded) == (0, 0)
    assert len(problems) == 1 and key in problems[0].message


@pytest.mark.parametrize("per_call", [False, True], ids=["total", "per call"])
def test_a_cut_turns_requests_fall_before_its_listed_calls_as_in_the_whole_turn(per_call) -> None:
    """The model requests a cut-short turn's replay sees before each listed call are the whole
    turn's there (a cycle cap halts it at the same call), and none after its last listed call
    (they come among the calls not listed)."""
    rng = random.Random(9)
    for _ in range(400):
        n = rng.randint(1, 40)
        cycles = rng.randint(0, 90)
        calls = tuple(RecordedCall("t", i, cycle=(min(cycles, 1 + i * cycles // n) if per_call else None))
                      for i in range(n))
        whole = RecordedTurn(id="w", calls=calls, cycles=cycles)
        p = rng.randrange(n)
        cut = dataclasses.replace(whole, calls=calls[:p], calls_dropped=n - p)
        assert cycle_starts(cut) == [*cycle_starts(whole)[:p], 0], (n, cycles, p)


# -- the recorder: a turn resumed from a snapshot without the recorder's section ----------------


def test_a_turn_resumed_without_the_recorders_section_is_left_out_of_the_replay(tmp_path) -> None:
    """The real recorder writes ``calls_unrecorded``; calibrate counts the turn (its calls, its
    result, its end) but replays none of it: the calls after the resume alone would be a short
    turn that no row halts, while the explicit 30 cap would halt the whole one."""
    path = tmp_path / "b.jsonl"
    first = tg.Guard(tg.GuardConfig(load_entrypoints=False, soft_cap=10, hard_multiplier=10), environ={})
    turn = first.turn(turn_id="resumed", durable=True)
    for i in range(30):
        call = tg.ToolCall("read", {"p": i})
        turn.check_call(call)
        turn.record_outcome(call, "ok")
    second = tg.Guard(tg.GuardConfig(load_entrypoints=False, soft_cap=10, hard_multiplier=10, recorder_path=str(path),
                                     disable_plugins=("otel", "shadow")), environ={})
    resumed = second.resume(json.loads(json.dumps(turn.suspend())))
    for i in range(5):
        call = tg.ToolCall("write", {"q": i})
        resumed.check_call(call)
        resumed.record_outcome(call, "ok")
    resumed.report_result(False)
    resumed.end()
    line = json.loads(path.read_text())
    assert (line["tool_calls"], len(line["calls"]), line["calls_unrecorded"]) == (35, 5, 30)
    (tmp_path / "c.toml").write_text("soft_cap = 10\n")
    data = run_json([path], tmp_path / "c.toml")
    assert (data["turns"], data["calls"], data["unresolved"]) == (1, 35, 1)
    assert sum(data["recorded_in_part"].values()) == 1 and data["recorded_in_part_ids"] == ["resumed"]
    assert data["survival"] == run_json([write(tmp_path / "whole.jsonl", [
        {**line, "calls": [{"tool": "t", "args": f"a{i}", "outcome": "ok"} for i in range(35)],
         "calls_unrecorded": 0}])], tmp_path / "c.toml")["survival"]
    for p in data["policies"]:
        for mode in MODES:
            m = p[mode]
            assert (m["halted"], m["censored"], m["saved_unresolved"], m["unresolved_ids"]) == (0, 1, 0, []), p["name"]


# -- OTLP spans -----------------------------------------------------------------------------------


def _spans_by_turn(spans: list) -> dict[str, list]:
    out: dict[str, list] = {}
    trace_turn = {s.context.trace_id: dict(s.attributes).get("turnguard.turn.id") for s in spans
                  if "turnguard.turn.id" in dict(s.attributes or {})}
    for s in spans:
        out.setdefault(trace_turn.get(s.context.trace_id, "?"), []).append(s)
    return out


def _index(span: Any) -> int | None:
    return dict(span.attributes or {}).get("turnguard.call.index")


@pytest.fixture(scope="module")
def otlp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Real spans of 30 turns, and the same with spans taken out of some: a gap at a random call
    (cut short there), the first call's span missing (in part), and more than the turn's."""
    rng = random.Random(4)
    specs = []
    for t in range(30):
        n = rng.randint(5, 70)
        stuck = rng.random() < 0.4
        specs.append((f"t{t}", [("read", {"p": 1 if stuck and i > 8 else i}, "error" if stuck else "ok")
                                for i in range(n)]))
    spans = run_turns(specs, soft_cap=10, hard_multiplier=5).spans()
    by_turn = _spans_by_turn(spans)
    gaps, firsts, kept = {}, set(), []
    for turn_id, own in by_turn.items():
        tools = sorted(i for i in map(_index, own) if i is not None)
        draw = rng.random()
        drop: set[int] = set()
        if draw < 0.3 and len(tools) > 2:
            gap = rng.randint(2, len(tools))
            gaps[turn_id] = gap - 1
            drop = {gap} | ({gap + 1} if rng.random() < 0.5 else set())
        elif draw < 0.45:
            firsts.add(turn_id)
            drop = {1}
        kept += [s for s in own if _index(s) not in drop]
    kept.sort(key=lambda s: s.end_time)
    folder = tmp_path_factory.mktemp("otlp")
    whole, lossy = folder / "whole.jsonl", folder / "lossy.jsonl"
    whole.write_text("\n".join(collector_lines([spans[i:i + 7] for i in range(0, len(spans), 7)])) + "\n")
    lossy.write_text("\n".join(collector_lines([kept[i:i + 7] for i in range(0, len(kept), 7)])) + "\n")
    assert gaps and firsts
    return {"whole": whole, "lossy": lossy, "gaps": gaps, "firsts": firsts}


def test_tool_spans_after_a_gap_are_dropped_and_without_the_first_the_turn_is_in_part(otlp) -> None:
    whole = {t.id: t for t in read_turns([otlp["whole"]], print)}
    lossy = {t.id: t for t in read_turns([otlp["lossy"]], print)}
    assert set(whole) == set(lossy)
    for turn_id, turn in lossy.items():
        full = whole[turn_id]
        assert turn.needed_calls == full.needed_calls, turn_id
        assert not full.in_part and not full.cut_short, turn_id
        if turn_id in otlp["gaps"]:
            listed = otlp["gaps"][turn_id]
            assert turn.calls == full.calls[:listed] and turn.calls_dropped == len(full.calls) - listed, turn_id
            assert turn.cut_short, turn_id
        elif turn_id in otlp["firsts"]:
            assert turn.in_part and turn.calls == full.calls[1:] and turn.calls_unrecorded == 1, turn_id
        else:
            assert dataclasses.replace(turn, origin=full.origin) == full, turn_id


def test_lossy_spans_are_censored_on_every_row_alike_with_any_jobs(otlp, tmp_path) -> None:
    (tmp_path / "c.toml").write_text("soft_cap = 10\nhard_multiplier = 5\n")
    config = tmp_path / "c.toml"
    one = run_cli(otlp["lossy"], "--config", config, *GRID, "--json", "-", "--jobs", "1")
    two = run_cli(otlp["lossy"], "--config", config, *GRID, "--json", "-", "--jobs", "2")
    assert one[0] == two[0] == 0 and one[1] == two[1]
    data, whole = json.loads(one[1]), run_json([otlp["whole"]], config)
    halted_at_own = sum(whole["halt_ended"].values())
    assert sum(data["recorded_in_part"].values()) == len(otlp["firsts"])
    assert sum(data["cut_short"].values()) + sum(data["halt_ended"].values()) >= len(otlp["gaps"])
    assert data["survival"] == whole["survival"] and data["calls"] == whole["calls"]
    for mine, theirs in zip(data["policies"], whole["policies"], strict=True):
        for mode in MODES:
            m, w = mine[mode], theirs[mode]
            assert m["halted"] <= w["halted"], mine["name"]  # missing calls only take halts away...
            assert data["turns"] - m["halted"] - m["censored"] <= whole["turns"] - w["halted"] - w["censored"], \
                mine["name"]  # ... into censored, never into "not halted"
            assert m["saved_unresolved"] <= w["saved_unresolved"], mine["name"]
    assert halted_at_own >= 0


def test_a_retried_requests_rolled_back_spans_are_left_out_of_the_listing(tmp_path) -> None:
    """A retry rolls back the request's calls; their spans stay exported under the same call
    numbers, and the re-sent calls' spans say how many retries came before them: the turn's span
    of a number is the one with more, and the listing is the turn's whole."""
    telemetry = InMemoryTelemetry()
    guard = tg.Guard(tg.GuardConfig(disable_plugins=("recorder", "shadow"), load_entrypoints=False), environ={},
                     **telemetry.providers())
    turn = guard.turn(turn_id="retried", promptable=False)
    turn.begin_cycle()
    for i in range(3):
        call = tg.ToolCall("t", {"i": i})
        turn.check_call(call)
        turn.record_outcome(call, "ok")
    turn.begin_cycle()
    turn.check_call(tg.ToolCall("t", {"lost": 0}))  # no outcome: its span ends with the turn
    turn.retry()
    turn.begin_cycle()
    for i in range(2):
        call = tg.ToolCall("t", {"k": i})
        turn.check_call(call)
        turn.record_outcome(call, "ok")
    turn.end()
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    (read,) = read_turns([path], print)
    assert (len(read.calls), read.calls_dropped, read.needed_calls, read.cut_short) == (5, 0, 5, False)
    assert [call.retries for call in read.calls] == [0, 0, 0, 1, 1]


def test_a_suspended_turns_spans_make_one_turn_recorded_in_part(tmp_path) -> None:
    """The span of the part before a suspend (``suspended``) is no turn; the resumed part's span
    lists calls from after the resume: one turn, recorded in part, of the whole turn's calls."""
    telemetry = InMemoryTelemetry()
    options = dict(disable_plugins=("recorder", "shadow"), load_entrypoints=False, soft_cap=10)
    first = tg.Guard(tg.GuardConfig(**options), environ={}, **telemetry.providers())
    turn = first.turn(turn_id="paused", durable=True, promptable=False)
    for i in range(4):
        call = tg.ToolCall("t", {"i": i})
        turn.check_call(call)
        turn.record_outcome(call, "ok")
    second = tg.Guard(tg.GuardConfig(**options), environ={}, **telemetry.providers())
    resumed = second.resume(json.loads(json.dumps(turn.suspend())))
    for i in range(3):
        call = tg.ToolCall("t", {"j": i})
        resumed.check_call(call)
        resumed.record_outcome(call, "ok")
    resumed.end()
    path = tmp_path / "otlp.jsonl"
    path.write_text("\n".join(collector_lines([telemetry.spans()])) + "\n")
    (tmp_path / "c.toml").write_text("soft_cap = 10\n")
    data = run_json([path], tmp_path / "c.toml")
    assert (data["turns"], data["calls"], data["suspended_parts"]) == (1, 7, 1)
    assert data["recorded_in_part_ids"] == ["paused"]


def test_tool_spans_whose_turn_span_is_lost_are_a_turn_cut_short_never_one_that_ended(otlp, tmp_path) -> None:
    """Without its turn span (lost with its export batch) a turn's tool spans say neither how many
    calls it made nor how it ended: replayed on them, a row that does not halt it there counts it
    censored, and its end is unknown to the survival estimate."""
    lines = [json.loads(line) for line in otlp["whole"].read_text().splitlines()]
    lost = set()
    for doc in lines:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                keep = []
                for span in ss["spans"]:
                    attrs = {a["key"]: a["value"] for a in span.get("attributes", [])}
                    turn_id = attrs.get("turnguard.turn.id", {}).get("stringValue")
                    if turn_id is not None and "turnguard.call.index" not in attrs and int(turn_id[1:]) % 3 == 0:
                        lost.add(turn_id)
                        continue
                    keep.append(span)
                ss["spans"] = keep
    path = tmp_path / "lost.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    (tmp_path / "c.toml").write_text("soft_cap = 10\nhard_multiplier = 5\n")
    config = tmp_path / "c.toml"
    one = run_cli(path, "--config", config, *GRID, "--json", "-", "--jobs", "1")
    two = run_cli(path, "--config", config, *GRID, "--json", "-", "--jobs", "2")
    assert one[0] == two[0] == 0 and one[1] == two[1]
    data = json.loads(one[1])
    assert sum(data["cut_short"].values()) == len(lost) and data["survival"]["unknown_end"] == len(lost)
    policies = build_grid(GridSpec(**SPEC, base=GuardConfig.load(str(config))))
    cal = Calibrator(policies, group=False)
    whole = list(read_turns([otlp["whole"]], print))
    for idx, p in enumerate(data["policies"]):
        for mode in MODES:
            results = [cal.results(t)[idx].get(mode) for t in whole]
            not_halted = sum(1 for t, r in zip(whole, results, strict=True) if t.id not in lost
                             and not halt_ended(t.ended_by) and not (r is not None and r.halted))
            m = p[mode]
            assert data["turns"] - m["halted"] - m["censored"] == not_halted, (p["name"], mode)
            assert m["censored_by_cause"]["cut_short"] + sum(m["halted_cut_short_by_cohort"].values()) == len(lost)
