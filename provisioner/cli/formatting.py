"""Text output of the CLI for people: aligned tables and ``key: value`` blocks (pure)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Json = Any
MISSING = "-"
FACT_WIDTH = 60


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart; the last one is not padded."""
    body = [[_one_line(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [list(headers), *body]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


#: column name -> the API field it shows (``node list --columns``, ``--sort``)
NODE_COLUMNS: dict[str, str] = {
    "id": "id", "hostname": "hostname", "serial": "serial", "state": "state",
    "step": "step_status", "maint": "maintenance", "power": "power_state", "rack": "rack",
    "position": "position", "profile": "profile", "hardware": "hardware",
    "error": "last_error", "macs": "macs", "updated": "updated_at",
}
DEFAULT_COLUMNS = ("id", "hostname", "serial", "state", "step", "maint", "power", "rack",
                   "profile", "hardware", "error")
ERROR_WIDTH = 60


def node_table(nodes: Iterable[Mapping[str, Json]],
               columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
    rows = [tuple(_cell(name, node) for name in columns) for node in nodes]
    return table([name.upper() for name in columns], rows)


def _cell(column: str, node: Mapping[str, Json]) -> str:
    value = node.get(NODE_COLUMNS[column])
    if column == "id":
        return str(value or "")[:8]
    if column == "updated":
        return timestamp(value)
    if column == "error":
        out = text(" ".join(str(value or "").split()))
        return out if len(out) <= ERROR_WIDTH else out[: ERROR_WIDTH - 3] + "..."
    return text(value)


def sort_nodes(nodes: Sequence[Mapping[str, Json]], key: str) -> list[Mapping[str, Json]]:
    """By a column (``-column``: descending); nodes without a value last."""
    column = key.removeprefix("-")
    field = NODE_COLUMNS[column]
    present = [node for node in nodes if node.get(field) not in (None, "")]
    missing = [node for node in nodes if node.get(field) in (None, "")]
    present.sort(key=lambda node: _natural(str(node.get(field))), reverse=key.startswith("-"))
    return present + missing


def _natural(value: str) -> list[tuple[int, int | str]]:
    """``gpu-2`` before ``gpu-10``."""
    return [(0, int(part)) if part.isdigit() else (1, part.lower())
            for part in re.split(r"(\d+)", value) if part]


HISTORY_HEADERS = ("SEQ", "AT", "EVENT", "FROM", "TO", "ACTOR", "REASON")


def history_table(entries: Iterable[Mapping[str, Json]]) -> str:
    rows = [
        (
            text(entry.get("seq")),
            timestamp(entry.get("at")),
            text(entry.get("event")),
            text(entry.get("from_state")),
            text(entry.get("to_state")),
            text(entry.get("actor")),
            text(entry.get("reason")),
        )
        for entry in entries
    ]
    return table(HISTORY_HEADERS, rows)


_DETAIL_FIELDS = (
    "id", "hostname", "serial", "macs", "state", "step_status", "last_error", "maintenance",
    "maintenance_reason", "power_state", "hardware", "profile", "rack", "position", "bmc",
    "allowed_actions",
    "checkpoint", "created_at", "updated_at",
)


def node_detail(node: Mapping[str, Json]) -> str:
    """``key: value`` lines, then a facts summary and the history table."""
    width = max(len(name) for name in _DETAIL_FIELDS) + 1
    lines = [f"{name + ':':<{width}} {_field(name, node.get(name))}" for name in _DETAIL_FIELDS
             if name in node]
    facts = node.get("facts")
    lines += ["", "facts:"]
    if isinstance(facts, Mapping) and facts:
        lines += [f"  {line}" for line in facts_summary(facts)]
    else:
        lines.append("  (none)")
    history = node.get("history")
    if isinstance(history, list):
        lines += ["", "history:"]
        lines.append(history_table(history) if history else "  (none)")
    return "\n".join(lines)


def facts_summary(facts: Mapping[str, Json]) -> list[str]:
    """One line per top-level fact; nested values are summarised, not dumped."""
    width = max(len(str(key)) for key in facts) + 1
    return [f"{str(key) + ':':<{width}} {_summarise(value)}" for key, value in facts.items()]


def _summarise(value: Json) -> str:
    if isinstance(value, Mapping):
        if all(not isinstance(v, Mapping | list) for v in value.values()):
            out = ", ".join(f"{k}={text(v)}" for k, v in value.items())
        else:
            out = f"{len(value)} keys: " + ", ".join(str(k) for k in value)
    elif isinstance(value, list):
        if all(not isinstance(v, Mapping | list) for v in value):
            out = ", ".join(text(v) for v in value)
        else:
            out = _counted_items(value)
    else:
        out = text(value)
    return out if len(out) <= FACT_WIDTH else out[: FACT_WIDTH - 3] + "..."


def _counted_items(items: list[Json]) -> str:
    """``8× NVIDIA H100 80GB HBM3`` for items with a name (or model), else ``N items``."""
    names: dict[str, int] = {}
    for item in items:
        name = item.get("name") or item.get("model") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not name:
            return f"{len(items)} item" + ("" if len(items) == 1 else "s")
        names[name] = names.get(name, 0) + 1
    return ", ".join(f"{count}× {name}" for name, count in names.items())


def _field(name: str, value: Json) -> str:
    if name == "bmc":
        return bmc_summary(value)
    if name in ("created_at", "updated_at"):
        return timestamp(value)
    if name == "maintenance":
        return "yes" if value else "no"
    return text(value)


def bmc_summary(bmc: Json) -> str:
    if not isinstance(bmc, Mapping):
        return MISSING
    where = text(bmc.get("address"))
    if bmc.get("port"):
        where += f":{bmc['port']}"
    user = bmc.get("username")
    password = "password set" if bmc.get("password_set") else "no password"
    who = f"user {user}, {password}" if user else password
    return f"{text(bmc.get('driver'))} {where} ({who})"


def text(value: Json) -> str:
    """A cell: ``-`` for nothing, comma-joined lists, compact JSON for anything nested."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(text(item) for item in value) if value else MISSING
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), sort_keys=True) if value else MISSING
    return str(value)


def timestamp(value: Json) -> str:
    """``2024-05-01T12:00:00.123+00:00`` → ``2024-05-01 12:00:00``."""
    if not isinstance(value, str) or len(value) < 19 or value[10] != "T":
        return text(value)
    return value[:10] + " " + value[11:19]


def api_reason(status: int, detail: str, problem: Mapping[str, Json]) -> str:
    """The one-line reason for a failed request, with a hint where one helps."""
    state = problem.get("state")
    if status == 409 and state and str(state) not in detail:
        detail += f" (state {state})"
    if status == 401:
        detail += " (set PROVISIONER_TOKEN, or pass --token-file)"
    return detail


def _one_line(cell: str) -> str:
    return " ".join(cell.split()) if "\n" in cell or "\t" in cell else cell


def dump_json(value: Json) -> str:
    return json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False)
