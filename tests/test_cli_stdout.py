"""``-`` is standard output for every output of every ``turnguard`` command: the output takes the
place of the table the command prints, no file named ``-`` is made, at most one output is ``-``,
and an output that cannot be one stream (``assets``' folder) refuses it in one line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from turnguard import _cli as cli

LINE = json.dumps({"id": "t1", "calls": [{"tool": "read", "args": {"p": 1}, "outcome": "error"}] * 9, "cycles": 1})


def html_page(out: str) -> None:
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>"), out[:200]


def json_value(out: str) -> None:
    assert json.loads(out)["turns"] == 1


def turn_lines(out: str) -> None:
    lines = out.splitlines()
    assert lines and all(json.loads(line)["source"] == "turnguard" for line in lines), out[:200]


OUTPUTS = {
    ("calibrate", "--json"): (["calibrate", "{corpus}"], json_value),
    ("calibrate", "--html"): (["calibrate", "{corpus}"], html_page),
    ("calibrate-merge", "--json"): (["calibrate", "merge", "{result}"], json_value),
    ("calibrate-merge", "--html"): (["calibrate", "merge", "{result}"], html_page),
    ("demo", "--record"): (["demo", "soft-stuck", "runaway"], turn_lines),
}
"""Each output option, how its command runs, and what standard output must then hold (alone)."""
REFUSED = {("assets", "directory")}
"""Outputs that cannot be one stream."""


@pytest.fixture
def inputs(tmp_path, monkeypatch) -> dict[str, str]:
    corpus = tmp_path / "in" / "turns.jsonl"
    corpus.parent.mkdir()
    corpus.write_text(LINE + "\n")
    result = tmp_path / "in" / "result.json"
    assert cli.main(["calibrate", str(corpus), "--json", str(result), "--jobs", "1"]) == 0
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return {"corpus": str(corpus), "result": str(result)}


def output_options() -> set[tuple[str, str]]:
    """Every option or argument of every subcommand that names a file or folder to write."""
    root = cli.parser()
    found = set()
    for name in cli.SUBCOMMANDS:
        for action in cli._subparser(root, name)._actions:
            writes = (action.help or "").lower().startswith(("write", "append", "where to write"))
            if writes and not isinstance(action, argparse._StoreTrueAction):
                found.add((name, action.option_strings[0] if action.option_strings else action.dest))
    return found


def test_every_output_is_known_here_as_taking_standard_output_or_refusing_it():
    assert output_options() == set(OUTPUTS) | REFUSED


@pytest.mark.parametrize("output", list(OUTPUTS), ids=[" ".join(o) for o in OUTPUTS])
def test_an_output_given_as_a_dash_goes_to_standard_output_in_place_of_the_table(output, inputs, capsys):
    argv, holds = OUTPUTS[output]
    status = cli.main([*(a.format(**inputs) for a in argv), output[1], "-"])
    out, err = capsys.readouterr()
    assert status == 0, err
    holds(out)
    assert not Path("-").exists() and "wrote" not in err


@pytest.mark.parametrize("command", ["calibrate", "calibrate-merge"])
def test_two_outputs_given_as_a_dash_are_refused_in_one_line_before_any_work(command, inputs, capsys):
    argv, _ = OUTPUTS[(command, "--json")]
    status = cli.main([*(a.format(**inputs) for a in argv), "--json", "-", "--html", "-"])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and "only one of --json and --html can be '-'" in err


def test_assets_refuses_a_dash_for_its_folder(inputs, capsys):
    assert cli.main(["assets", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("turnguard assets: DIR is '-'") and err.count("\n") == 1
    assert not Path("-").exists()


@pytest.mark.parametrize("output", list(OUTPUTS), ids=[" ".join(o) for o in OUTPUTS])
def test_a_file_still_gets_the_output_and_the_table_is_printed(output, inputs, capsys):
    argv, holds = OUTPUTS[output]
    assert cli.main([*(a.format(**inputs) for a in argv), output[1], "out.txt"]) == 0
    out, _ = capsys.readouterr()
    holds(Path("out.txt").read_text())
    assert out.strip() and not out.startswith(("<!DOCTYPE", "{"))
