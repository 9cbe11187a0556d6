"""A health finding: what is wrong (class), what to do first (action), and the line that says so.

Classes are the keys the repair ladder will use; there are few on purpose. They follow NVIDIA
NICo's split of health reports (hardware vs sensor vs software) at the grain a repair can act
on: a lost GPU, GPU memory, the GPU otherwise, NVLink, the NVSwitch fabric, InfiniBand,
cooling, power, a leak, host memory, other hardware, the driver, and application faults that
leave the node healthy.

Actions are the rungs of NVIDIA's recommended-action ladder (Health Validation: drain, then
``reset_gpu`` → ``restart_os`` → ``service_required``) with our BMC rungs between them, in
escalating order. ``none`` means "record it, do nothing": NVIDIA's ``IGNORE`` and
``RESTART_APP`` (the application restarts, the node keeps its work).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class HealthClass(StrEnum):
    GPU_LOST = "gpu-lost"            # fallen off the bus, not enumerated
    GPU_MEMORY = "gpu-memory"        # ECC, row remapping, page retirement, contained/uncontained
    GPU = "gpu"                      # other GPU faults: GSP, firmware, init, timeouts, PCIe
    NVLINK = "nvlink"                # GPU NVLink errors (XID 74, 144-150, ...)
    FABRIC = "fabric"                # NVSwitch SXids, fabric manager state, recovery of the fabric
    INFINIBAND = "infiniband"        # HCA port down, rate or width degraded
    THERMAL = "thermal"              # temperature thresholds, fans, thermal violations
    POWER = "power"                  # PSU failure, AC lost, redundancy lost, power violations
    LEAK = "leak"                    # liquid-cooling leak detection
    HOST_MEMORY = "host-memory"      # DIMM ECC in the SEL
    HARDWARE = "hardware"            # other critical BMC events (processor, chassis, drive)
    DRIVER = "driver"                # driver, firmware or configuration: fixed by software
    APPLICATION = "application"      # faults of one application; the node stays healthy
    UNRESPONSIVE = "unresponsive"    # slurmd or kubelet not answering (Slurm DOWN, NotReady)
    REPORTED = "reported"            # an outside tool's verdict we cannot place (NHC, NPD)


class Action(StrEnum):
    """Recommended first action, mildest first (``ORDER``)."""

    NONE = "none"
    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    RESTART_OS = "restart_os"
    POWER_CYCLE = "power_cycle"
    REIMAGE = "reimage"
    SERVICE_REQUIRED = "service_required"

    @property
    def rank(self) -> int:
        return ORDER.index(self)


ORDER: tuple[Action, ...] = tuple(Action)


class Source(StrEnum):
    """The kind of evidence a finding came from (what ``classify`` detected)."""

    KERNEL_LOG = "kernel-log"
    NVIDIA_SMI = "nvidia-smi"
    IPMI_SEL = "ipmi-sel"
    DCGM = "dcgm"
    IBSTAT = "ibstat"


@dataclass(frozen=True, slots=True)
class Finding:
    cls: HealthClass
    action: Action
    evidence: str
    source: Source | str  # what ``classify`` read, or a stored finding's origin
    subject: str = ""   # what it is about: a PCI address, "GPU 3", "mlx5_0/1", a sensor

    def line(self) -> str:
        """``<class>\\t<action>\\t<evidence>``: the CLI's output, one line, no tabs inside."""
        evidence = " ".join(self.evidence.split())
        return f"{self.cls}\t{self.action}\t{evidence}"


def worst(findings: list[Finding] | tuple[Finding, ...]) -> Action:
    return max((f.action for f in findings), key=lambda a: a.rank, default=Action.NONE)


def dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (class, action, subject, kind of evidence): the first line stays."""
    seen: set[tuple[str, ...]] = set()
    kept: list[Finding] = []
    for finding in findings:
        key = (finding.cls, finding.action, finding.subject, finding.source)
        if key not in seen:
            seen.add(key)
            kept.append(finding)
    return kept
