"""The repair ladder per health class: how to drain, which rungs, mildest first. Pure.

A node with a finding is drained first: in Slurm and cordoned in Kubernetes with the finding
as the reason. A class whose hardware is gone (``gpu-lost``, a ``leak``) drains at once;
the others let running jobs end, up to the class's deadline (``[health] drain_deadline_s``
overrides it per class). Then the rungs the class allows, from the finding's recommended
action on (NVIDIA Health Validation's ladder, ``reset_gpu`` → ``restart_os`` →
``service_required``, with our BMC and deploy rungs between): after each rung the
validation gate again; a pass returns the node to service, no rung left means
``service_required``.

Why these rungs per class:

* a GPU reset (``nvidia-smi -r``) clears what lives in the GPU: pending row remaps, a
  contained ECC error, NVLink errors, a hung GPU; a GPU off the bus needs at least an OS
  restart and often a power cycle (XID 79: NVIDIA's catalogue says so);
* the NVSwitch fabric and InfiniBand recover with the OS (fabric manager, the HCA driver)
  or a cold start of the tray;
* driver and configuration faults are fixed by software: an OS restart, then a reimage;
* cooling, power, leaks and host memory are parts to replace: drain, then a person
  (``service_required``) at once; no reboot makes a fan turn;
* ``application`` faults leave the node healthy: no ladder (``none``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from provisioner.health.model import Action, HealthClass

#: the rungs a ladder may climb, mildest first (``Action``'s order)
RUNGS: Final[tuple[Action, ...]] = (Action.RESET_GPU, Action.RESTART_OS, Action.POWER_CYCLE,
                                    Action.REIMAGE)

H, A = HealthClass, Action
_HOUR: Final = 3600.0


@dataclass(frozen=True, slots=True)
class ClassLadder:
    drain_at_once: bool
    """Drain without waiting for running jobs (the hardware they run on is gone)."""
    drain_deadline_s: float
    """How long running jobs may go on before the first rung (0 with ``drain_at_once``)."""
    rungs: tuple[Action, ...]
    """The rungs this class allows, mildest first; empty: drain, then ``service_required``."""


def _at_once(*rungs: Action) -> ClassLadder:
    return ClassLadder(True, 0.0, rungs)


def _after_jobs(deadline_s: float, *rungs: Action) -> ClassLadder:
    return ClassLadder(False, deadline_s, rungs)


#: the ladder of each class (``application`` has none: the node stays in service)
LADDERS: Final[Mapping[HealthClass, ClassLadder]] = {
    H.GPU_LOST: _at_once(A.RESET_GPU, A.RESTART_OS, A.POWER_CYCLE),
    H.GPU_MEMORY: _after_jobs(4 * _HOUR, A.RESET_GPU, A.RESTART_OS, A.POWER_CYCLE),
    H.GPU: _after_jobs(4 * _HOUR, A.RESET_GPU, A.RESTART_OS, A.POWER_CYCLE, A.REIMAGE),
    H.NVLINK: _after_jobs(4 * _HOUR, A.RESET_GPU, A.RESTART_OS, A.POWER_CYCLE),
    H.FABRIC: _after_jobs(_HOUR, A.RESTART_OS, A.POWER_CYCLE),
    H.INFINIBAND: _after_jobs(4 * _HOUR, A.RESTART_OS, A.POWER_CYCLE),
    H.THERMAL: _after_jobs(_HOUR),
    H.POWER: _after_jobs(_HOUR),
    H.LEAK: _at_once(),
    H.HOST_MEMORY: _after_jobs(4 * _HOUR),
    H.HARDWARE: _after_jobs(4 * _HOUR, A.POWER_CYCLE),
    H.DRIVER: _after_jobs(4 * _HOUR, A.RESTART_OS, A.REIMAGE),
    # slurmd or the kubelet stopped answering: its jobs are lost already
    H.UNRESPONSIVE: _at_once(A.RESTART_OS, A.POWER_CYCLE),
    # an outside verdict naming no class (NHC's drain reason): drained, an operator decides
    H.REPORTED: _after_jobs(4 * _HOUR),
}


@dataclass(frozen=True, slots=True)
class Plan:
    cls: HealthClass
    drain_at_once: bool
    drain_deadline_s: float
    rungs: tuple[Action, ...]


def plan(cls: HealthClass, action: Action, *,
         deadlines: Mapping[str, float] | None = None) -> Plan | None:
    """The ladder for a finding of ``cls`` whose recommended first action is ``action``:
    the class's rungs from ``action`` on (all of them for ``drain``, none for
    ``service_required``). None: nothing to do (``none``, or a class without a ladder)."""
    ladder = LADDERS.get(cls)
    if ladder is None or action is Action.NONE:
        return None
    rungs = tuple(rung for rung in ladder.rungs if rung.rank >= action.rank)
    deadline = 0.0 if ladder.drain_at_once else (deadlines or {}).get(
        str(cls), ladder.drain_deadline_s)
    return Plan(cls, ladder.drain_at_once, deadline, rungs)


# -- the circuit breaker --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Peer:
    """A node as the breaker sees it: where it is, and whether a ladder has it drained."""

    node_id: str
    rack: str | None
    domain: str | None
    repairing: bool


@dataclass(frozen=True, slots=True)
class BreakerLimits:
    fleet: float
    rack: float
    domain: float
    floor: int = 1
    """Always allowed per group, however small the fraction (a one-node rack can repair)."""


def breaker(candidate: Peer, peers: Sequence[Peer], limits: BreakerLimits) -> str | None:
    """Why one more node may not be drained now (the fleet, its rack or its NVLink domain
    would have too many repairing at once); None: it may. ``peers``: the nodes in service
    or under repair, the candidate among them or not."""
    others = [p for p in peers if p.node_id != candidate.node_id]
    groups: list[tuple[str, list[Peer], float, str]] = [
        ("the fleet", others, limits.fleet, "max_repairing_fraction")]
    if candidate.rack:
        groups.append((f"rack {candidate.rack}", [p for p in others if p.rack == candidate.rack],
                       limits.rack, "max_repairing_fraction_rack"))
    if candidate.domain:
        groups.append((f"NVLink domain {candidate.domain}",
                       [p for p in others if p.domain == candidate.domain],
                       limits.domain, "max_repairing_fraction_domain"))
    for name, members, fraction, key in groups:
        size = len(members) + 1
        repairing = sum(1 for p in members if p.repairing) + 1
        allowed = max(limits.floor, int(fraction * size))
        if repairing > allowed:
            return (f"{name}: {repairing} of {size} nodes would be under repair, over "
                    f"[health] {key} = {fraction:g} ({allowed} allowed)")
    return None


def cooling_down(last_class: str | None, last_ended_at: float | None, cls: HealthClass,
                 now: float, cooldown_s: float) -> bool:
    """A finding of the class whose ladder ended on this node less than ``cooldown_s``
    ago: it came back (or flaps); the ladder does not start twice in a row."""
    return (last_class == str(cls) and last_ended_at is not None
            and now - last_ended_at < cooldown_s)
