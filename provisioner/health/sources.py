"""What Slurm and Kubernetes already tell the syncs, as health reports (pure).

Slurm: a node ``DOWN`` or ``NOT_RESPONDING`` (slurmd stopped answering) is ``unresponsive``;
a node drained, or set down, by someone else (NHC, an operator, a prolog) is classed by its
reason's words and is ``reported`` when none matches. Kubernetes: ``Ready`` not ``True`` past
the grace period is ``unresponsive``; any other condition that is ``True`` (the problem
conditions of node-problem-detector and of NVIDIA's GPU health tools: ``KernelDeadlock``,
``ReadonlyFilesystem``, ``GpuXidError``...) is classed by its type, reason and message, except
the kubelet's own pressure conditions, which evict pods and are no hardware fault; fewer
allocatable ``nvidia.com/gpu`` than the node's GPU count is ``gpu-lost``.

The inputs are plain values (no Slurm or Kubernetes types): the syncs pass what they read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

from provisioner.health.model import Action, HealthClass
from provisioner.health.records import Report
from provisioner.health.xid import lookup

C = HealthClass

# first match wins: the more specific words first
_WORDS: tuple[tuple[re.Pattern[str], HealthClass], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cls) for pattern, cls in (
        (r"fallen off|fell off|gpu.{0,20}(lost|missing|not found)|gpu count|"
         r"no devices were found", C.GPU_LOST),
        (r"leak", C.LEAK),
        (r"nvlink", C.NVLINK),
        (r"nvswitch|fabric ?manager|\bimex\b", C.FABRIC),
        (r"\becc\b|dbe|sbe|row.?remap|retired.?page|hbm", C.GPU_MEMORY),
        (r"\bxid\b|\bgpu|dcgm|nvidia", C.GPU),
        (r"infiniband|\bib\b|\bhca\b|mlx5|\bport.{0,20}(down|width|rate)", C.INFINIBAND),
        (r"temp|therm|fan|cool", C.THERMAL),
        (r"power|\bpsu\b|voltage", C.POWER),
        (r"dimm|\bedac\b|memory", C.HOST_MEMORY),
        (r"driver|firmware|module", C.DRIVER),
        (r"disk|nvme|raid|filesystem|cpu|processor|deadlock|hardware", C.HARDWARE),
    ))
_XID = re.compile(r"\bxid\D{0,5}(\d{1,3})\b", re.IGNORECASE)
KUBELET_PRESSURE = frozenset({"MemoryPressure", "DiskPressure", "PIDPressure"})


def by_words(text: str, default: HealthClass = C.REPORTED) -> tuple[HealthClass, Action]:
    """The class a free-text reason names (an XID number: the catalogue's class and action)
    and ``drain``: whoever wrote it wanted the node out of service."""
    if (xid := _XID.search(text)) is not None:
        entry = lookup(int(xid.group(1)))
        return entry.cls, max(entry.action, Action.DRAIN, key=lambda a: a.rank)
    for pattern, cls in _WORDS:
        if pattern.search(text):
            return cls, Action.DRAIN
    return default, Action.DRAIN


def slurm_reports(state: str, flags: Iterable[str], reason: str, reason_user: str,
                  own_prefixes: tuple[str, ...]) -> list[Report]:
    """A Slurm node's state (base ``DOWN``..., flags ``DRAIN``, ``NOT_RESPONDING``...) as
    reports. Reasons starting with ``own_prefixes`` are the daemon's (or Slinky's) own."""
    flagged = frozenset(flags)
    text = f"{state}+{'+'.join(sorted(flagged))}" if flagged else state
    reports: list[Report] = []
    ours = bool(reason) and reason.startswith(own_prefixes)
    who = f" by {reason_user}" if reason_user else ""
    if "NOT_RESPONDING" in flagged or (state == "DOWN" and not ours and (
            not reason or "not responding" in reason.lower())):
        why = f": {reason}" if reason else ""
        reports.append(Report(C.UNRESPONSIVE, Action.RESTART_OS,
                              f"Slurm: node {text}{why}", "slurmd"))
    elif (state == "DOWN" or "DRAIN" in flagged or "FAIL" in flagged) and not ours:
        cls, action = by_words(reason)
        verb = "set DOWN" if state == "DOWN" else "drained"
        reports.append(Report(cls, action, f"Slurm: {verb}{who} ({text}): "
                              f"{reason or 'no reason given'}", "slurm-reason"))
    return reports


def kube_reports(conditions: Iterable[tuple[str, str, str, str, datetime | None]],
                 *, now: datetime, grace_s: float, allocatable_gpus: int | None,
                 gpu_count: int | None) -> list[Report]:
    """A Node's conditions ``(type, status, reason, message, last transition)`` and its
    allocatable ``nvidia.com/gpu`` against its GPU count, as reports."""
    reports: list[Report] = []
    for kind, status, reason, message, since in conditions:
        detail = ", ".join(part for part in (reason, message) if part)
        detail = f" ({detail})" if detail else ""
        if kind == "Ready":
            down_s = (now - since).total_seconds() if since is not None else grace_s + 1
            if status != "True" and down_s > grace_s:
                reports.append(Report(C.UNRESPONSIVE, Action.RESTART_OS,
                                      f"Kubernetes: Ready={status} for {down_s:.0f} s"
                                      f"{detail}", "kubelet", since))
        elif status == "True" and kind not in KUBELET_PRESSURE:
            cls, action = by_words(f"{kind} {reason} {message}")
            reports.append(Report(cls, action, f"Kubernetes: condition {kind}=True{detail}",
                                  f"condition/{kind}", since))
    if gpu_count is not None and allocatable_gpus is not None and allocatable_gpus < gpu_count:
        reports.append(Report(C.GPU_LOST, Action.RESET_GPU,
                              f"Kubernetes: allocatable nvidia.com/gpu {allocatable_gpus} "
                              f"< the node's {gpu_count} GPUs", "nvidia.com/gpu"))
    return reports
