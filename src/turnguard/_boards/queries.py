"""Reading the generated dashboards back: every panel, every query, and Grafana's macros resolved.

Grafana substitutes ``$__rate_interval``, ``$__range``, ``$__interval`` and template variables
before a query reaches Prometheus (which rejects them); ``resolve`` does the same so the queries
can be run against a real Prometheus in tests and by operators checking a deployment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnguard import _assets as assets

BOARDS = assets.root() / "dashboards"
MACRO = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)")
"""``$name`` or ``${name}`` / ``${name:format}``; ``$1`` is a regex group reference (label_replace), not a variable."""


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel of one board."""

    board_uid: str
    panel_id: int
    title: str
    ref_id: str
    expr: str
    instant: bool
    format: str
    legend: str = ""
    """The target's legend format (a table column's name)."""


def boards(directory: Path = BOARDS) -> dict[str, dict[str, Any]]:
    """Board uid -> dashboard JSON, for every ``*.json`` dashboard in ``directory``."""
    found = {}
    for path in sorted(directory.glob("*.json")):
        board = json.loads(path.read_text())
        found[board["uid"]] = board
    return found


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and panels nested in collapsed rows."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(board: Mapping[str, Any]) -> Iterator[PanelQuery]:
    for panel in panels(board):
        for target in panel.get("targets") or []:
            yield PanelQuery(
                board_uid=board["uid"],
                panel_id=panel["id"],
                title=panel.get("title", ""),
                ref_id=target.get("refId", ""),
                expr=target.get("expr", ""),
                instant=bool(target.get("instant")) and not target.get("range"),
                format=target.get("format", "time_series"),
                legend=target.get("legendFormat", ""),
            )


def macros(expr: str) -> set[str]:
    """The Grafana variables and macros ``expr`` uses (``__rate_interval``, ``datasource``...)."""
    return {a or b for a, b in MACRO.findall(expr)}


def resolve(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every ``$name`` / ``${name}`` replaced; an unknown name is an error."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return MACRO.sub(substitute, expr)
