"""A node's facts as display sections: lists of objects become tables, objects key/value
lists. Untrusted text throughout (the templates escape it); large blobs (an nvidia-smi
XML report) are summarised by size, never shown whole."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

_FIRST: Final = ("system", "cpu", "memory_mib", "disks", "nics", "gpus", "infiniband")
_SKIP: Final = frozenset({"validation", "last_report"})
_TITLES: Final = {"cpu": "CPU", "memory_mib": "Memory", "nics": "NICs", "gpus": "GPUs",
                  "infiniband": "InfiniBand", "disks": "Disks", "system": "System"}
MAX_TEXT: Final = 512
MAX_ROWS: Final = 256


@dataclass(frozen=True, slots=True)
class Section:
    key: str
    title: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()
    text: str = ""


def text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return ""
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else f"({len(value):,} characters, not shown)"
    if isinstance(value, int | float):
        return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(text(v) for v in value[:16]) + (" …" if len(value) > 16 else "")
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={text(v)}" for k, v in list(value.items())[:16])
    return str(value)[:MAX_TEXT]


def section(key: str, value: Any) -> Section:
    title = _TITLES.get(key, key.replace("_", " "))
    if key == "memory_mib" and isinstance(value, int) and not isinstance(value, bool):
        return Section(key, title, text=f"{value / 1024:,.0f} GiB ({value:,} MiB)")
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        columns: list[str] = []
        for item in value[:MAX_ROWS]:
            columns += [str(k) for k in item if str(k) not in columns]
        rows = tuple(tuple(text(item.get(c)) for c in columns) for item in value[:MAX_ROWS])
        return Section(key, f"{title} ({len(value)})", columns=tuple(columns), rows=rows)
    if isinstance(value, Mapping):
        return Section(key, title, pairs=tuple((str(k), text(v)) for k, v in value.items()))
    return Section(key, title, text=text(value))


def sections(facts: Mapping[str, Any]) -> list[Section]:
    keys = [k for k in _FIRST if k in facts]
    keys += sorted(k for k in facts if k not in _FIRST and k not in _SKIP)
    return [section(k, facts[k]) for k in keys]
