"""Damaged turn states for the adapters that keep a section of their own in one (pydantic-ai's
``pydantic_ai``, openai-agents' ``openai_agents``: the calls a question asked about and held).

``section_mutants`` damages such a section every way a stored state may come back: the whole
section of another type, each field of another type, each field's entries of another type, a
field past its bound, an unknown field; each with the field a ``tg.SnapshotError`` must name.
``state_mutants`` damages the whole state the section sits in. A resume of any of them must be
refused naming that field, before any turn is opened: the correct state resumed afterwards, in
the same guard, keeps the turn's id (``resumed_from`` ``None``), as it does in a fresh guard."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import turnguard as tg
from turnguard.integrations._common import MAX_SECTION_CALLS

NOT_AN_OBJECT = (None, [], ["x"], "x", 5, 1.5, True)
NOT_AN_ARRAY = (None, {}, {"x": "y"}, "x", 5, 1.5, True)
NOT_A_CALL_ID = (5, None, "", ["x"], {"x": 1}, True, 1.5)
"""Entries that are no call id (a non-empty string) and no tool name."""


def section_mutants(key: str, section: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """``(what, field named, the damaged section)`` for an adapter's section at ``state[key]``."""
    for value in (*NOT_AN_OBJECT, [section]):
        yield f"{key} = {value!r}"[:60], key, value
    yield "an unknown field", f"{key}.zz", {**section, "zz": 1}
    for name, value in section.items():
        path = f"{key}.{name}"
        if isinstance(value, list):
            yield from _array_mutants(path, section, name, value)
        else:
            yield from _object_mutants(path, section, name, value)


def _array_mutants(path: str, section: dict, name: str, value: list) -> Iterator[tuple[str, str, Any]]:
    for wrong in NOT_AN_ARRAY:
        yield f"{path} = {wrong!r}", path, {**section, name: wrong}
    for entry in NOT_A_CALL_ID:
        yield f"{path} holds {entry!r}", f"{path}[{len(value)}]", {**section, name: [*value, entry]}
    yield f"{path} past its bound", path, {**section, name: [f"c{i}" for i in range(MAX_SECTION_CALLS + 1)]}


def _object_mutants(path: str, section: dict, name: str, value: dict) -> Iterator[tuple[str, str, Any]]:
    """A call id -> tool name object."""
    for wrong in NOT_AN_OBJECT:
        yield f"{path} = {wrong!r}", path, {**section, name: wrong}
    for entry in NOT_A_CALL_ID:
        yield f"{path} maps to {entry!r}", f"{path}.bad", {**section, name: {**value, "bad": entry}}
    yield f"{path} has an empty call id", f"{path}.", {**section, name: {**value, "": "tool"}}
    oversized = {f"c{i}": "tool" for i in range(MAX_SECTION_CALLS + 1)}
    yield f"{path} past its bound", path, {**section, name: oversized}


def state_mutants(key: str, section: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """By name, ``(field named, how to damage a state)``: ``section_mutants`` (a function of the
    state, returning the damaged copy), and the whole state of another type (``kind`` named)."""
    def damage(value: Any) -> Any:
        def damaged(state: dict) -> Any:
            return {**copy.deepcopy(state), key: copy.deepcopy(value)}
        return damaged

    mutants: dict[str, tuple[str, Any]] = {what: (field, damage(value))
                                           for what, field, value in section_mutants(key, section)}
    for value in ("x", 5, []):
        mutants[f"the state = {value!r}"] = ("kind", lambda state, value=value: value)
    mutants["the state in a list"] = ("kind", lambda state: [state])
    return mutants


class Summaries:
    """A plugin that keeps each ended turn's summary, and the guard these tests resume in."""

    def __init__(self) -> None:
        self.summaries: list[tg.TurnSummary] = []

    @tg.hookimpl
    def turnguard_turn_ended(self, turn, summary) -> None:
        self.summaries.append(summary)

    def guard(self) -> tg.Guard:
        guard = tg.Guard(tg.GuardConfig(disable_plugins=("otel", "recorder"), load_entrypoints=False), environ={})
        guard.register(self, "summaries")
        return guard
