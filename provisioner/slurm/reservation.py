"""Slurm maintenance reservations for the fabric acceptance of an active NVLink domain
(issue 26): ``SlurmMaintenance`` implements the lifecycle's ``Reservations`` port over the
``SlurmClient`` the daemon already has.

The reservation is ``scontrol create reservation ... flags=maint,ignore_jobs starttime=now
duration=infinite`` on exactly the domain's nodes: ``ignore_jobs`` lets it be created while
jobs still run there (they run to their end; no new job starts on those nodes), ``maint``
marks the nodes MAINT in Slurm's own views. Writes go through scontrol even with slurmrestd
(as the node writes slurmrestd v0.0.38 lacks do: ``ScontrolSlurm``), reads of the nodes'
states through the client (slurmrestd or scontrol).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from provisioner.slurm.model import SlurmClient, SlurmRejected

#: node states and flags that mean a job is still there
_BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


@dataclass(frozen=True, slots=True)
class Reservation:
    name: str
    nodes: str  # as Slurm prints it: a hostlist expression (``gpu-[01-02]``)
    flags: frozenset[str]
    state: str


def reservation_from_scontrol(text: str) -> Reservation | None:
    """``scontrol show reservation NAME -o``: one ``Key=Value`` line."""
    line = next((li for li in text.splitlines() if li.startswith("ReservationName=")), "")
    if not line:
        return None
    fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
    flags = frozenset(f for f in fields.get("Flags", "").split(",") if f and f != "(null)")
    return Reservation(fields["ReservationName"], fields.get("Nodes", ""), flags,
                       fields.get("State", ""))


class ReservationWriter(SlurmClient, Protocol):
    """``ScontrolSlurm``: the client that writes reservations."""

    async def create_reservation(self, name: str, nodes: Sequence[str], users: str) -> None: ...

    async def update_reservation(self, name: str, nodes: Sequence[str]) -> None: ...

    async def reservation(self, name: str) -> Reservation | None: ...

    async def delete_reservation(self, name: str) -> bool: ...


class SlurmMaintenance:
    """The ``Reservations`` port: ``reads`` answers the nodes' states, ``writer`` holds the
    reservations (the same client without slurmrestd)."""

    def __init__(self, reads: SlurmClient, writer: ReservationWriter, *,
                 users: str = "root") -> None:
        self._reads = reads
        self._writer = writer
        self._users = users

    async def reserve(self, name: str, nodes: Sequence[str]) -> None:
        """Create the reservation, or set its nodes when it is there already (a held domain
        accepted again keeps its one reservation)."""
        if await self._writer.reservation(name) is None:
            await self._writer.create_reservation(name, nodes, self._users)
        else:
            await self._writer.update_reservation(name, nodes)

    async def release(self, name: str) -> bool:
        return await self._writer.delete_reservation(name)

    async def busy(self, nodes: Sequence[str]) -> list[str]:
        """The nodes that still run (or end) a job; a node Slurm does not know is an error
        (the reservation could not hold it)."""
        busy = []
        for name in nodes:
            found = await self._reads.node(name)
            if found is None:
                raise SlurmRejected(f"node {name} is not in Slurm: no reservation holds it")
            if found.state in _BUSY_STATES or "COMPLETING" in found.flags:
                busy.append(name)
        return busy
