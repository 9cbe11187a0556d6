"""``nvidia-smi -q`` (text, whole or ``-d ECC,ROW_REMAPPER,PAGE_RETIREMENT``) → findings.

Read by indentation: a line without ``:`` opens a section, ``Key : Value`` lines belong to the
sections above them. ``GPU 00000000:3B:00.0`` starts a GPU. What we flag, per GPU:

* ``ECC Errors / Volatile``: an uncorrectable (or double-bit) count above 0 → ``gpu-memory``,
  ``reset_gpu`` (the pages are retired or rows remapped at the next reset);
  ``SRAM Threshold Exceeded: Yes`` → ``service_required``;
* ``ECC Errors / Aggregate``: uncorrectable above 0 with nothing volatile → ``gpu-memory``,
  ``none`` (lifetime history: kept in the record, acted on by nothing);
* ``Retired Pages / Pending Page Blacklist`` (or ``Pending Page Retirement``),
  ``Channel/TPC Repair Pending``, ``Remapped Rows / Pending`` = Yes → ``reset_gpu``;
* ``Remapped Rows / Remapping Failure Occurred: Yes`` → ``service_required`` (NVIDIA's
  row-remapping guide: a failed remap is an RMA);
* ``GPU Recovery Action`` other than None → the action it names;
* ``Fabric / State`` not Completed or ``Status`` not Success (N/A is a GPU without a fabric)
  → ``fabric``, ``restart_os``; ``Fabric / Health / Summary`` not Healthy → ``fabric``, ``drain``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from provisioner.health import xid
from provisioner.health.model import Action, Finding, HealthClass, Source, dedupe

_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KV = re.compile(r"^(\S.*?)\s*:\s*(.*)$")
_ABSENT = frozenset({"n/a", "", "not supported", "[not supported]", "[n/a]"})
M = HealthClass.GPU_MEMORY
Make = Callable[[HealthClass, Action, str], Finding]


def classify_nvsmi(text: str) -> list[Finding]:
    findings: list[Finding] = []
    gpu = ""
    stack: list[tuple[int, str]] = []
    volatile_seen: set[str] = set()
    for raw in text.splitlines():
        if not raw.strip() or raw.strip() == "[...]" or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        if (head := _GPU.match(line)) is not None:
            gpu, stack = head[1], []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        pair = _KV.match(line)
        if pair is None:
            stack.append((indent, line.lower()))
            continue
        key, value = pair[1].strip().lower(), pair[2].strip()
        path = tuple(name for _, name in stack)
        evidence = f"GPU {gpu or '?'}: {' / '.join(path + (key,))}: {value}"
        finding = _check(path, key, value, evidence, gpu)
        if finding is not None:
            if "volatile" in path:
                volatile_seen.add(gpu)
            elif "aggregate" in path and gpu in volatile_seen:
                continue
            findings.append(finding)
    return dedupe(findings)


def _check(path: tuple[str, ...], key: str, value: str, evidence: str,
           gpu: str) -> Finding | None:
    lowered = value.lower()
    yes = lowered == "yes"

    def found(cls: HealthClass, action: Action, what: str) -> Finding:
        return Finding(cls, action, evidence, Source.NVIDIA_SMI, f"GPU {gpu} {what}")

    if path and path[0] == "ecc errors":
        if key == "sram threshold exceeded" and yes:
            return found(M, Action.SERVICE_REQUIRED, "sram threshold")
        double = "double bit" in path or key == "double bit"
        if ("uncorrectable" in key or double) and _positive(value):
            if "aggregate uncorrectable sram sources" in path:
                return None
            if "volatile" in path:
                return found(M, Action.RESET_GPU, "volatile uncorrectable")
            if "aggregate" in path:
                return found(M, Action.NONE, "aggregate uncorrectable")
        return None
    if path and path[0] == "retired pages" and key.startswith("pending") and yes:
        return found(M, Action.RESET_GPU, "pending page retirement")
    if key in ("channel repair pending", "tpc repair pending") and yes:
        return found(HealthClass.GPU, Action.RESET_GPU, key)
    if path and path[0] == "remapped rows":
        if key == "pending" and yes:
            return found(M, Action.RESET_GPU, "row remap pending")
        if key == "remapping failure occurred" and yes:
            return found(M, Action.SERVICE_REQUIRED, "row remap failure")
        return None
    if not path and key == "gpu recovery action" and lowered not in _ABSENT:
        action = xid.recovery_action(value)
        if action is not Action.NONE:
            return found(HealthClass.GPU, action or Action.DRAIN, "recovery action")
        return None
    if path and path[0] == "fabric":
        return _fabric(path, key, lowered, found)
    return None


def _fabric(path: tuple[str, ...], key: str, lowered: str, make: Make) -> Finding | None:
    if lowered in _ABSENT:
        return None
    if len(path) == 1 and key == "state" and lowered != "completed":
        return make(HealthClass.FABRIC, Action.RESTART_OS, "fabric state")
    if len(path) == 1 and key == "status" and lowered != "success":
        return make(HealthClass.FABRIC, Action.RESTART_OS, "fabric status")
    if "health" in path and key == "summary" and lowered != "healthy":
        return make(HealthClass.FABRIC, Action.DRAIN, "fabric health")
    return None


def _positive(value: str) -> bool:
    try:
        return int(value.split()[0]) > 0
    except (ValueError, IndexError):
        return False
