"""A node's own NVSwitch fabric and its GPUs' recovery actions, from ``nvidia-smi -q -x``.
Pure; no profile option asks for these checks, the GPUs do.

- **Fabric.** Every GPU that reports a fabric state other than ``N/A`` (an HGX/DGX
  H100/H200/B200 baseboard with NVSwitches, a GB200/GB300 tray) must report ``Completed``
  with status ``Success``; Fabric Manager down (``Not Started``, ``In Progress`` forever),
  ``Insufficient Resources``, ``Unknown Error``... hold the node with the state and status
  named. A zero ``ClusterUUID`` is what a healthy single-node HGX reports: it passes. The
  DTD v13 health block is judged by ``checks.check_fabric_health`` alongside.
- **Transient.** ``In Progress`` is what every GPU reports while Fabric Manager trains the
  fabric: a ``FabricFault`` says so (``transient``), and the validating step re-collects
  the facts until it clears or the step's settle deadline passes.
- **Recovery actions.** A GPU whose ``gpu_recovery_action`` is not ``None`` (``GPU_RESET``
  after an NVLink partition change, ``NODE_REBOOT``, ``DRAIN_P2P``, ``DRAIN_AND_RESET``)
  holds the node, naming the action; ``topology.model.nvlink_domain`` gives it no clique.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.topology.model import Gpu, GpuReport

_NOT_REPORTED = frozenset({"", "n/a", "not supported", "notsupported"})
_SETTLING_STATUS = frozenset({"", "n/a", "not supported", "in progress", "success"})
_WHAT_TO_DO = {
    "gpu_reset": "reset the GPU (nvidia-smi --gpu-reset)",
    "reset": "reset the GPU (nvidia-smi --gpu-reset)",
    "node_reboot": "reboot the node",
    "reboot": "reboot the node",
    "drain_p2p": "drain peer-to-peer work, then reset",
    "drain_and_reset": "drain the GPU, then reset it",
}


@dataclass(frozen=True, slots=True)
class FabricFault:
    """One GPU's fabric failure line; ``transient``: the fabric is still training."""

    line: str
    transient: bool = False


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def gpu_name(gpu: Gpu) -> str:
    """nvidia-smi's index and the UUID: ``3 (GPU-…)``."""
    return f"{gpu.index} ({gpu.uuid})" if gpu.index is not None else gpu.uuid


def has_fabric(gpu: Gpu) -> bool:
    """The GPU takes part in an NVLink fabric (its fabric state is not N/A)."""
    return _norm(gpu.fabric_state) not in _NOT_REPORTED


def fabric_done(gpu: Gpu) -> bool:
    return _norm(gpu.fabric_state) == "completed" and _norm(gpu.fabric_status) == "success"


def fabric_faults(gpus: GpuReport, *, every_gpu: bool = False) -> list[FabricFault]:
    """One line per GPU whose fabric is not Completed/Success. ``every_gpu``: a GPU without
    a fabric (N/A) fails too (a multi-node domain needs every GPU in it); otherwise only the
    GPUs that report a fabric are judged (a PCIe card has none to judge)."""
    faults = []
    for gpu in gpus.gpus:
        if fabric_done(gpu) or not (every_gpu or has_fabric(gpu)):
            continue
        state, status = gpu.fabric_state or "absent", gpu.fabric_status or "absent"
        transient = (_norm(gpu.fabric_state) == "in progress"
                     and _norm(gpu.fabric_status) in _SETTLING_STATUS)
        faults.append(FabricFault(
            f"nvlink-fabric: GPU {gpu_name(gpu)}: fabric state {state}, status {status}, "
            "expected Completed, Success", transient))
    return faults


def reports_fabric(gpus: GpuReport) -> bool:
    return any(has_fabric(g) for g in gpus.gpus)


def check_recovery(gpus: GpuReport) -> list[str]:
    """One line per GPU that waits for a recovery action, naming it."""
    failures = []
    for gpu in gpus.gpus:
        if (action := gpu.pending_recovery()) is None:
            continue
        todo = _WHAT_TO_DO.get(_norm(action).replace(" ", "_"), "recover the GPU")
        failures.append(f"gpu-recovery: GPU {gpu_name(gpu)}: recovery action {action} "
                        f"pending ({todo}), expected None")
    return failures


def reports_recovery(gpus: GpuReport) -> bool:
    return any(g.recovery_action.strip() for g in gpus.gpus)
