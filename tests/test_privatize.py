"""tools/privatize.py, the mechanical plan of issue 32 item 5: every internal module renamed to
``_name`` and every reference rewritten, telemetry names that look like module paths left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

import privatize


@pytest.fixture
def package(tmp_path) -> tuple[Path, Path]:
    """A facade, a documented telemetry package, internal packages (one kept in place) and
    internal modules."""
    root = tmp_path / "src" / "turnguard"
    for folder in ("telemetry", "calibrate", "assets", "agents"):
        (root / folder).mkdir(parents=True)
    files = {
        "__init__.py": 'from turnguard.guard import Guard\n__all__ = ["Guard"]\n',
        "guard.py": "import time\nclass Guard: ...\n",
        "shadow.py": "def plugin_for(config):\n    policy = 1\n    return policy\n",
        "ledger.py": "X = 1\n",
        "snapshot.py": "X = 1\n",
        "telemetry/__init__.py": '__all__ = ["configure"]\ndef configure(): ...\n',
        "telemetry/names.py": 'POLICY = "turnguard.shadow.policy"\n',
        "calibrate/__init__.py": "",
        "calibrate/run.py": "from turnguard.telemetry import names\n",
        "assets/__init__.py": "",
        "agents/__init__.py": "",
        "agents/client.py": "X = 1\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "api.md").write_text("::: turnguard.Guard\n\n::: turnguard.telemetry.configure\n")
    return tmp_path / "src", reference


def test_a_package_without_public_modules_moves_whole_and_other_internal_modules_alone(package):
    assert privatize.renames(*package) == {
        "turnguard.calibrate": "turnguard._calibrate",
        "turnguard.guard": "turnguard._guard",
        "turnguard.ledger": "turnguard._ledger",
        "turnguard.shadow": "turnguard._shadow",
        "turnguard.snapshot": "turnguard._snapshot",
        "turnguard.telemetry.names": "turnguard.telemetry._names",
        "turnguard.assets": "turnguard._assets",
    }


def test_a_package_a_path_outside_python_names_keeps_its_name(package):
    """``turnguard/agents/client.py`` is written into each agent's settings by its path."""
    assert "turnguard.agents" in privatize.public_surface.KEPT_IN_PLACE
    assert not any(old.startswith("turnguard.agents") for old in privatize.renames(*package))
    assert privatize.public_surface.unmarked_internal_modules(*package) == [
        "turnguard.calibrate.run", "turnguard.guard", "turnguard.ledger", "turnguard.shadow", "turnguard.snapshot",
        "turnguard.telemetry.names"]


@pytest.mark.parametrize(("before", "after"), [
    ("from turnguard.guard import Guard", "from turnguard._guard import Guard"),
    ("from turnguard.telemetry import names, configure", "from turnguard.telemetry import _names as names, configure"),
    ("from turnguard import guard as g", "from turnguard import _guard as g"),
    ('"import sys\\nfrom turnguard import guard\\n"', '"import sys\\nfrom turnguard import _guard as guard\\n"'),
    ('mock.patch("turnguard.guard.time.monotonic")', 'mock.patch("turnguard._guard.time.monotonic")'),
    ("python -m turnguard.calibrate.run", "python -m turnguard._calibrate.run"),
    ('import_module(f"turnguard.calibrate.{name}")', 'import_module(f"turnguard._calibrate.{name}")'),
    ("`turnguard.shadow` runs the shadows", "`turnguard._shadow` runs the shadows"),
    ("the attribute `turnguard.shadow.policy`", "the attribute `turnguard.shadow.policy`"),
    ("every `turnguard.shadow.*` attribute", "every `turnguard.shadow.*` attribute"),
    ("[tool.turnguard.shadow]", "[tool.turnguard.shadow]"),
    ("turnguard.Guard and turnguard.telemetry.configure", "turnguard.Guard and turnguard.telemetry.configure"),
    ('"rules" = "turnguard/assets/rules"', '"rules" = "turnguard/_assets/rules"'),
    ("src/turnguard/calibrate/run.py and src/turnguard/telemetry/names.py",
     "src/turnguard/_calibrate/run.py and src/turnguard/telemetry/_names.py"),
    ('SRC / "turnguard" / "ledger.py", test_ledger.py', 'SRC / "turnguard" / "_ledger.py", test_ledger.py'),
    ("~/.cache/turnguard/otelcol-1", "~/.cache/turnguard/otelcol-1"),
    ("import turnguard as tg\ntg.guard.Guard, tg.Guard, tg.shadow.policy",
     "import turnguard as tg\ntg._guard.Guard, tg.Guard, tg.shadow.policy"),
    ("tg.guard without the import", "tg.guard without the import"),
    ('P = ("turnguard.snapshot", {"probe": 1})', 'P = ("turnguard.snapshot", {"probe": 1})'),
], ids=lambda text: text[:40])
def test_references_to_moved_modules_are_rewritten_and_nothing_else(package, before, after):
    src, reference = package
    moved = privatize.renames(src, reference)
    assert privatize.rewrite(before, moved, privatize.unique_stems(moved, src), src) == after
