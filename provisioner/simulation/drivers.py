"""Fake inspector, installer, Kubernetes and Slurm drivers over a SimWorld.

They stand in until the real drivers exist, and stay for demos and scale runs. Each is
idempotent the way the real thing must be: an image already on disk for this deployment is
not written again, a node already in Kubernetes is not joined twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final

from provisioner.domain import DiskErasure, Node, Sanitised
from provisioner.errors import RetryableError
from provisioner.simulation.world import SimWorld
from provisioner.validation.record import ValidationRecord

H100_SXM = {"vendor": "0x10de", "device": "0x2330", "name": "NVIDIA H100 80GB HBM3"}


def machine_key(node: Node) -> str:
    """The simulated machine behind a node: its BMC address, else serial, else id."""
    if node.bmc is not None and node.bmc.driver == "fake":
        return node.bmc.address
    return node.serial or node.id


class _Sim:
    def __init__(self, world: SimWorld, *, delay_s: float, fail_rate: float,
                 rng: random.Random | None = None) -> None:
        self._world = world
        self._delay_s = delay_s
        self._fail_rate = fail_rate
        self._rng = rng or random.Random()

    async def _work(self, what: str, node: Node) -> None:
        await asyncio.sleep(self._delay_s)
        if self._fail_rate and self._rng.random() < self._fail_rate:
            raise RetryableError(f"simulated {what} failure on {machine_key(node)}")


class FakeInspector(_Sim):
    async def inspect(self, node: Node) -> dict[str, Any]:
        await self._work("inspection", node)
        facts = simulated_facts(machine_key(node), node.serial)
        if await self._world.get(machine_key(node), "disk"):  # an image is on it: the
            facts["disks"] = [dict(disk, partitions=2, signature="gpt")  # ramdisk sees a
                              for disk in facts["disks"]]  # partition table
        return facts


class FakeInstaller(_Sim):
    async def deploy_image(self, node: Node, generation: str) -> None:
        await self._work("image write", node)
        await self._world.ensure(machine_key(node), "image_write", "disk", generation)

    async def configure(self, node: Node, generation: str) -> None:
        await self._work("configuration", node)
        await self._world.ensure(machine_key(node), "configure", "configured", generation)

    async def collect_facts(self, node: Node, generation: str) -> None:
        await self._work("facts collection", node)  # simulated facts never change

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        """The simulated disks, each erased by the simulation (method ``simulated``)."""
        await self._work("sanitise", node)
        await self._world.ensure(machine_key(node), "wipe", "disk", "")
        disks = simulated_facts(machine_key(node), node.serial)["disks"]
        return Sanitised(tuple(
            DiskErasure(str(d["name"]), str(d.get("model", "")), str(d.get("serial", "")),
                        "simulated", True, self._delay_s)
            for d in disks if d["name"] not in skip))

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        """Each array made once over its members (state ``clean``, simulated)."""
        await self._work("storage", node)
        reports = []
        for array in arrays:
            key, attr = machine_key(node), f"md:{array['name']}"
            there = bool(await self._world.get(key, attr))
            if not there:
                await self._world.ensure(key, attr, attr, ",".join(array["members"]))
            reports.append({"name": array["name"], "array": f"/dev/md/{array['name']}",
                            "level": f"raid{array['level']}", "members": array["members"],
                            "state": "clean", "created": not there})
        return {"ok": True, "arrays": reports, "mdstat": ""}


class FakeKube(_Sim):
    async def join(self, node: Node) -> None:
        await self._work("kubeadm join", node)
        await self._world.ensure(machine_key(node), "kube_join", "kube", node.hostname or "")

    async def remove(self, node: Node) -> None:
        await self._world.ensure(machine_key(node), "kube_remove", "kube", "")

    async def maintenance(self, node: Node, on: bool, reason: str) -> None:
        await self._world.ensure(machine_key(node), "kube_cordon", "cordoned",
                                 reason if on else "")


class FakeSlurm(_Sim):
    async def register(self, node: Node) -> None:
        await self._work("slurmd registration", node)
        await self._world.ensure(machine_key(node), "slurm_register", "slurm",
                                 node.hostname or "")

    async def remove(self, node: Node) -> None:
        await self._world.ensure(machine_key(node), "slurm_remove", "slurm", "")


#: a simulated fault (``SimWorld`` attribute ``fault``) names the mildest rung that clears
#: it: ``reset_gpu``, ``restart_os``, ``power_cycle``; ``never`` (a part to replace)
FAULT: Final = "fault"
_CLEARS: Final = {"reset_gpu": ("reset_gpu", "restart_os", "power_cycle"),
                  "restart_os": ("restart_os", "power_cycle"), "power_cycle": ("power_cycle",)}


class FakeRepairs(_Sim):
    """The repair ladder's reach into a simulated machine: drains and cordons are recorded
    (``slurm_drain``/``kube_cordon``, the reason as the value); a rung clears the machine's
    simulated fault when it is strong enough (``FAULT``)."""

    async def drain(self, node: Node, reason: str, wait_jobs_s: float) -> str:
        key = machine_key(node)
        await self._world.ensure(key, "slurm_drain", "slurm_reason", reason)
        await self._world.ensure(key, "kube_cordon", "cordoned", reason)
        return ""

    async def undrain(self, node: Node) -> None:
        key = machine_key(node)
        await self._world.ensure(key, "slurm_resume", "slurm_reason", "")
        await self._world.ensure(key, "kube_uncordon", "cordoned", "")

    async def reset_gpus(self, node: Node) -> None:
        await self._rung("reset_gpu", node)

    async def restart_os(self, node: Node) -> None:
        await self._rung("restart_os", node)

    async def wait_os(self, node: Node) -> None:
        await self._rung("power_cycle", node)  # called after the BMC's off and on

    async def _rung(self, rung: str, node: Node) -> None:
        await self._work(rung, node)
        key = machine_key(node)
        await self._world.ensure(key, rung, f"last_{rung}", str(uuid.uuid4()))
        if rung in _CLEARS.get(await self._world.get(key, FAULT), ()):
            await self._world.ensure(key, "fault_cleared", FAULT, "")


#: a simulated machine's NVLink domain (an NVL72 tray's clique); unset: HGX, none
CLIQUE: Final = "clique"


class FakeValidator(_Sim):
    """Simulated machines are what their profile asks for: they pass (after the simulated
    delay, or fail at ``fail_rate`` to rehearse a held node), unless a simulated fault is
    on them (``FAULT``). Their NVLink domain is the machine's ``CLIQUE`` (none: HGX)."""

    async def check(self, node: Node) -> ValidationRecord:
        await self._work("validation", node)
        fault = await self._world.get(machine_key(node), FAULT)
        clique = await self._world.get(machine_key(node), CLIQUE)
        return ValidationRecord(passed=not fault, at=datetime.now(UTC).isoformat(),
                                checks=("simulated",), clique=clique or None,
                                failures=(f"simulated fault ({fault})",) if fault else ())

    async def wait_domain(self, node: Node, record: ValidationRecord,
                          note: Callable[[str, str], Awaitable[None]]) -> None:
        return None

    async def check_sku(self, node: Node) -> ValidationRecord:
        return ValidationRecord(passed=True, at=datetime.now(UTC).isoformat(),
                                checks=("simulated",))

    async def settle(self, node: Node, record: ValidationRecord, since: datetime,
                     recollect: Callable[[ValidationRecord], Awaitable[Node]],
                     note: Callable[[str, str], Awaitable[None]]) -> ValidationRecord:
        return record  # a simulated fabric never trains


def simulated_facts(key: str, serial: str | None) -> dict[str, Any]:
    """Deterministic facts for a simulated HGX H100 node."""
    digest = hashlib.sha256(key.encode()).digest()
    mac_base = "02:" + ":".join(f"{b:02x}" for b in digest[:4])
    return {
        "system": {"vendor": "Simulated", "model": "HGX H100 8-GPU", "serial": serial or key,
                   "uuid": str(uuid.UUID(bytes=digest[:16]))},
        "cpu": {"model": "Intel Xeon Platinum 8480+", "sockets": 2, "cores": 112},
        "memory_mib": 2 * 1024 * 1024,
        "disks": [{"name": "nvme0n1", "size_bytes": 3_840_000_000_000, "rotational": False}],
        "nics": [{"mac": f"{mac_base}:{i:02x}", "driver": "mlx5_core", "speed_mbps": 200_000}
                 for i in range(2)],
        "gpus": [dict(H100_SXM, pci_address=f"0000:{0x18 + 0x10 * i:02x}:00.0")
                 for i in range(8)],
        "infiniband": [{"device": f"mlx5_{i}", "node_guid": f"0x{digest[8 + i % 8]:02x}"
                        f"{int.from_bytes(digest[:6], 'big'):012x}{i:02x}",
                        "rate_gbps": 400, "state": "ACTIVE"} for i in range(8)],
    }
