"""The public surface (tools/public_surface.py): the facade's ``__all__`` and the ``__all__`` of each
module the API reference documents. It may not grow, or shrink, unannounced: the checked-in list
(tools/public_surface.txt) changes with it, in the same commit."""

from __future__ import annotations

import importlib

import pytest

import public_surface
import turnguard


def test_the_surface_is_the_checked_in_list():
    kept = public_surface.SURFACE.read_text(encoding="utf-8").splitlines()
    now = public_surface.surface()
    assert now == kept, (f"the public surface changed: added {sorted(set(now) - set(kept))}, removed "
                         f"{sorted(set(kept) - set(now))}. If on purpose: `{public_surface.UPDATE}`, a CHANGELOG "
                         "line, and the API reference (docs/reference/) for each added name.")


def test_every_public_module_declares_what_it_exports_and_the_reference_documents_nothing_else():
    assert public_surface.problems() == []


def test_every_internal_module_says_so_by_its_name():
    """pluggy's way: a module outside the surface is ``_``-named (``tools/privatize.py`` renames
    them), but for the packages a path outside Python names (``public_surface.KEPT_IN_PLACE``)."""
    assert public_surface.unmarked_internal_modules() == []


def test_the_facade_exports_what_it_declares():
    assert all(hasattr(turnguard, name) for name in turnguard.__all__)
    assert {f"turnguard.{name}" for name in turnguard.__all__} <= set(public_surface.surface())


@pytest.mark.parametrize("module", [m for m in public_surface.public_modules(public_surface.reference_targets())
                                    if m != "turnguard"])
def test_each_public_module_exports_what_it_declares(module):
    if module.startswith("turnguard.integrations."):
        pytest.importorskip(module, exc_type=ImportError)
    imported = importlib.import_module(module)
    assert all(hasattr(imported, name) for name in imported.__all__)


@pytest.fixture
def package(tmp_path):
    """A package of three modules, one of them documented, and its reference page."""
    (tmp_path / "src" / "turnguard" / "integrations").mkdir(parents=True)
    (tmp_path / "src" / "turnguard" / "__init__.py").write_text('from turnguard.core import A\n__all__ = ["A"]\n')
    (tmp_path / "src" / "turnguard" / "core.py").write_text("A = 1\nB = 2\n")
    (tmp_path / "src" / "turnguard" / "integrations" / "__init__.py").write_text("")
    (tmp_path / "src" / "turnguard" / "integrations" / "x.py").write_text('__all__ = ["run"]\ndef run(): ...\n')
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "api.md").write_text("# API\n\n::: turnguard.A\n\n::: turnguard.integrations.x.run\n")
    return tmp_path / "src", tmp_path / "reference"


def test_a_documented_module_is_public_through_its_all_and_the_rest_internal(package):
    src, reference = package
    assert public_surface.surface(src, reference) == ["turnguard.A", "turnguard.integrations.x.run"]
    assert public_surface.internal_modules(src, reference) == ["turnguard.core"]
    assert public_surface.problems(src, reference) == []


def test_a_documented_name_outside_all_and_a_module_without_one_are_problems(package):
    src, reference = package
    (reference / "more.md").write_text("::: turnguard.integrations.x.walk\n\n::: turnguard.core.B\n")
    assert public_surface.problems(src, reference) == [
        "turnguard.core: documented in docs/reference/ but has no __all__",
        "turnguard.integrations.x.walk: documented in docs/reference/ but not in its module's __all__",
        "turnguard.core.B: documented in docs/reference/ but not in its module's __all__",
    ]
    (src / "turnguard" / "integrations" / "x.py").write_text('__all__ = ["run", "gone"]\ndef run(): ...\n')
    public_surface.parsed.cache_clear()
    assert "turnguard.integrations.x.gone: in __all__ but not defined there" in public_surface.problems(src, reference)


def test_check_fails_with_the_difference_and_the_command_that_updates_the_list(tmp_path, monkeypatch, capsys):
    listed = tmp_path / "public_surface.txt"
    listed.write_text("".join(f"{name}\n" for name in public_surface.surface() if name != "turnguard.Guard"))
    monkeypatch.setattr(public_surface, "SURFACE", listed)
    assert public_surface.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "+turnguard.Guard\n" in out and public_surface.UPDATE in out
    assert public_surface.main(["--write"]) == 0 and public_surface.main(["--check"]) == 0
