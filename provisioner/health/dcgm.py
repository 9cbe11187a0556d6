"""``dcgmi diag`` and ``dcgmi health -c`` output, as text tables or ``-j`` JSON → findings.

Text: both print a two-column table; a row with an empty left cell continues the row above
(DCGM wraps long messages mid-word, so the pieces are joined as they are)::

    | GPU Memory                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |
    |                           | Fail - GPU: 0                                  |
    | Error                     | GPU 3 has uncorrectable memory errors and row  |
    |                           |  remappings are pending                        |
    | GPU ID: 0                 | Warning                                        |
    |                           | PCIe system: Warning - Detected more than 8 PCIe |

JSON: ``dcgmi diag -j`` (``test_categories[].tests[].results[]`` with ``status`` and
``warnings``); for ``dcgmi health -c -j`` every string that starts with Warning or Failure,
under whatever keys name its GPU and system.

A failed test → its class (by the test's name and message) and that class's first rung; a
warning → the class, ``none``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from provisioner.health.model import Action, Finding, HealthClass, Source, dedupe

_RESULT = re.compile(r"^(pass|fail|warn|warning|skip|failure)\b", re.IGNORECASE)
_SYSTEM = re.compile(r"^([A-Za-z][\w ]*? system): (warning|failure)\b", re.IGNORECASE)
_MESSAGE_ROWS = frozenset({"error", "warning", "info"})
_WORDS: tuple[tuple[tuple[str, ...], HealthClass], ...] = (
    (("nvlink", "nvswitch"), HealthClass.NVLINK),
    (("memory", "ecc", "remap", "retire", "sram", "dram"), HealthClass.GPU_MEMORY),
    (("thermal", "temperature"), HealthClass.THERMAL),
    (("power",), HealthClass.POWER),
    (("persistence", "software", "driver", "library", "denylist", "blacklist",
      "permission", "cuda"), HealthClass.DRIVER),
)
_FIRST_RUNG: dict[HealthClass, Action] = {
    HealthClass.THERMAL: Action.DRAIN,
    HealthClass.POWER: Action.DRAIN,
    HealthClass.DRIVER: Action.REIMAGE,
}


def classify_dcgm_text(text: str) -> list[Finding]:
    items: list[list[str]] = []   # [name, status, message]
    name = ""
    for raw in text.splitlines():
        cells = raw.split("|")
        if not raw.lstrip().startswith("|") or len(cells) < 4:
            continue
        left, right = cells[1].strip(), cells[2][1:].rstrip()
        body = right.strip()
        if left.startswith("---") or not body and not left or body == "Result":
            continue
        if left:
            if left.lower() in _MESSAGE_ROWS:
                items.append([name, left.lower(), body])
                continue
            name = left
        if (system := _SYSTEM.match(body)) is not None:
            items.append([f"{name} {system[1]}", system[2].lower(), body])
        elif (result := _RESULT.match(body)) is not None:
            items.append([name, result[1].lower(), body])
        elif items and not left:
            items[-1][2] += right
    return dedupe([f for item in items if (f := _finding(*item)) is not None])


def classify_dcgm_json(text: str) -> list[Finding]:
    document = json.loads(text)
    return dedupe([f for name, status, message in _walk(document, "")
                   if (f := _finding(name, status, message)) is not None])


def _walk(node: Any, name: str) -> Iterator[tuple[str, str, str]]:
    if isinstance(node, dict):
        here = str(node.get("name", name))
        status = node.get("status")
        if isinstance(status, str) and _RESULT.match(status) and (
                "entity_id" in node or "gpu_ids" in node or "warnings" in node):
            yield here, status.lower(), _warnings(node.get("warnings"), node)
        for key, value in node.items():
            if isinstance(value, str) and key not in ("status", "name"):
                if re.match(r"^(warning|failure)\b", value, re.IGNORECASE) and \
                        "overall" not in key.lower():
                    yield f"{here} {key}", value.split()[0].lower(), f"{key}: {value}"
            elif isinstance(value, dict | list):
                yield from _walk(value, here if key not in ("body",) else name)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value, name)


def _warnings(warnings: Any, node: dict[str, Any]) -> str:
    if isinstance(warnings, str):
        texts = [warnings]
    elif isinstance(warnings, list):
        texts = [str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in warnings]
    else:
        texts = []
    who = node.get("entity_id", node.get("gpu_ids", ""))
    return f"{node.get('status')} - GPU {who}: {' '.join(texts)}".strip()


def _finding(name: str, status: str, message: str) -> Finding | None:
    if status in ("pass", "skip", "info"):
        return None
    cls = _class(message) if status in ("error", "warning") else HealthClass.GPU
    if cls is HealthClass.GPU:
        cls = _class(f"{name} {message}")
    failed = status in ("fail", "failure", "error")
    action = _FIRST_RUNG.get(cls, Action.RESET_GPU) if failed else Action.NONE
    evidence = f"{name}: {message}" if name and not message.startswith(name) else message
    return Finding(cls, action, evidence, Source.DCGM, f"{name} {status} {message[:40]}")


def _class(text: str) -> HealthClass:
    lowered = text.lower()
    for words, cls in _WORDS:
        if any(word in lowered for word in words):
            return cls
    return HealthClass.GPU
