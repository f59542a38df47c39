"""The module map in ``turnguard._calibrate``'s docstring names every module of the package, once."""

from __future__ import annotations

import re
from pathlib import Path

import turnguard._calibrate as calibrate


def test_the_module_map_lists_every_calibrate_module_once():
    listed = re.findall(r"^- ``(\w+)``:", calibrate.__doc__ or "", re.M)
    modules = {p.stem for p in Path(calibrate.__file__).parent.glob("*.py")} - {"__init__"}
    assert sorted(listed) == sorted(modules)
