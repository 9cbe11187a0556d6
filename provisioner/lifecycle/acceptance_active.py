"""Fabric acceptance of an *active* NVLink domain (issue 26): its nodes are in Slurm, so the
tests run inside a Slurm maintenance reservation on exactly the domain's nodes.

``Reservations`` is the port (``provisioner.slurm.reservation.SlurmMaintenance`` implements
it). The order: reserve (``flags=maint,ignore_jobs``: running jobs go on, no new one starts
there), wait until the jobs there ended (bounded: ``jobs_wait_s``; past it nothing is tested,
the reservation is released and the run is ``interrupted``), run and judge the tests, then
release the reservation on a pass; on a failure it stays: the domain is *held* (no job
lands on it, and the live topology leaves its nodes out of the published blocks, so the
domain's block shrinks) until a later run passes and releases it.

No node state is written here: the nodes stay ``active``; the hold is the reservation and
the run's row (``result["reservation"]``), read by ``AcceptanceRepo.held_nodes``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Final, Protocol

from provisioner.errors import ProvisionerError

#: the key of a run's result that names its reservation and whether it holds the domain
RESERVATION_KEY: Final = "reservation"


class Reservations(Protocol):
    async def reserve(self, name: str, nodes: Sequence[str]) -> None:
        """A maintenance reservation (maint, ignore_jobs) on exactly ``nodes``; an existing
        one of that name is set to them."""
        ...

    async def release(self, name: str) -> bool: ...

    async def busy(self, nodes: Sequence[str]) -> list[str]:
        """Those of ``nodes`` that still run (or end) a job."""
        ...


class JobsStillRunning(ProvisionerError):
    """The nodes could not be had for the tests (their jobs did not end within
    ``jobs_wait_s``, or Slurm refused the reservation): nothing was tested."""


def reservation_name(domain: str) -> str:
    """``provisioner-acceptance-<domain>``, in the characters Slurm takes in a name."""
    return "provisioner-acceptance-" + re.sub(r"[^A-Za-z0-9_.-]", "-", domain)[:64]


async def hold(reservations: Reservations, name: str, nodes: Sequence[str], *,
               wait_s: float, poll_s: float) -> None:
    """Reserve ``nodes`` and wait until no job runs on them; JobsStillRunning past
    ``wait_s`` (the caller releases the reservation)."""
    await reservations.reserve(name, nodes)
    deadline = time.monotonic() + wait_s
    while busy := await reservations.busy(nodes):
        if time.monotonic() >= deadline:
            raise JobsStillRunning(
                f"jobs still running on {', '.join(busy)} after {wait_s:g} s in reservation "
                f"{name}: released, nothing was tested")
        await asyncio.sleep(poll_s)


def reservation_result(name: str, held: bool) -> dict[str, object]:
    return {RESERVATION_KEY: {"name": name, "held": held}}
