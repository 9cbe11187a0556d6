"""Expected-inventory import: serial -> hostname, rack, profile, BMC. New serials are enrolled;
known ones get their metadata updated (never their state)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from provisioner.domain import BmcEndpoint, NewNode
from provisioner.errors import ProvisionerError
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import NodeState
from provisioner.store.repo import NodeChange, NodeRepo


@dataclass(frozen=True, slots=True)
class ExpectedMachine:
    serial: str
    hostname: str | None = None
    rack: str | None = None
    position: str | None = None
    profile: str | None = None
    macs: tuple[str, ...] = ()
    bmc: BmcEndpoint | None = None
    bmc_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ImportReport:
    created: list[str]
    updated: list[str]
    errors: list[str]


async def import_machines(
    machines: Iterable[ExpectedMachine], *, conductor: Conductor, repo: NodeRepo, actor: str
) -> ImportReport:
    created: list[str] = []
    updated: list[str] = []
    errors: list[str] = []
    for machine in machines:
        try:
            node = await repo.find_by_serial(machine.serial)
            if node is None:
                node = await conductor.enroll(_new_node(machine), actor=actor,
                                              reason="expected-inventory import")
                created.append(node.id)
                continue
            await repo.update_meta(node.id, NodeChange(
                hostname=machine.hostname, profile=machine.profile, rack=machine.rack,
                position=machine.position, bmc=machine.bmc, bmc_password=machine.bmc_password))
            updated.append(node.id)
        except ProvisionerError as exc:
            errors.append(f"serial {machine.serial}: {exc}")
    return ImportReport(created=created, updated=updated, errors=errors)


def _new_node(machine: ExpectedMachine) -> NewNode:
    return NewNode(state=NodeState.ENROLLED, hostname=machine.hostname, serial=machine.serial,
                   macs=machine.macs, profile=machine.profile, rack=machine.rack,
                   position=machine.position, bmc=machine.bmc,
                   bmc_password=machine.bmc_password)
