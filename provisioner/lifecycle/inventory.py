"""Expected-inventory import: serial -> hostname, rack, profile, BMC. New serials are enrolled;
known ones get their metadata updated (never their state).

A row that changes a known node's BMC (endpoint, user or password) is a credential change:
it needs ``may_change_bmc`` (the admin role), and one that moves the endpoint of a node with
a stored password must bring the password for the new address (a stored password is never
sent to an address other than the one it was entered for). Such rows fail alone."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from provisioner.domain import BmcEndpoint, NewNode, Node
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
    machines: Iterable[ExpectedMachine], *, conductor: Conductor, repo: NodeRepo, actor: str,
    may_change_bmc: bool = True,
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
            if (refused := await _bmc_change_refused(node, machine, repo,
                                                     may_change_bmc)) is not None:
                errors.append(f"serial {machine.serial}: {refused}")
                continue
            await repo.update_meta(node.id, NodeChange(
                hostname=machine.hostname, profile=machine.profile, rack=machine.rack,
                position=machine.position, bmc=machine.bmc, bmc_password=machine.bmc_password))
            updated.append(node.id)
        except ProvisionerError as exc:
            errors.append(f"serial {machine.serial}: {exc}")
    return ImportReport(created=created, updated=updated, errors=errors)


async def _bmc_change_refused(node: Node, machine: ExpectedMachine, repo: NodeRepo,
                              may_change_bmc: bool) -> str | None:
    """Why this row may not change the node's BMC; None when it may (or changes nothing)."""
    wanted, current = machine.bmc, node.bmc
    moved = wanted is not None and (
        current is None or (wanted.driver, wanted.address, wanted.port)
        != (current.driver, current.address, current.port))
    changed = moved or (wanted is not None and current is not None
                        and wanted.username != current.username)
    if machine.bmc_password is not None and not changed:
        stored = (await repo.credentials(node.id)).password
        changed = stored != machine.bmc_password
    if not changed:
        return None
    if not may_change_bmc:
        return (f"changing the BMC of node {node.id} (endpoint or credentials) needs the "
                "admin role")
    if moved and current is not None and current.password_set \
            and machine.bmc_password is None and wanted is not None:
        return (f"the BMC of node {node.id} moves from {current.address} to "
                f"{wanted.address}: give bmc_password for the new address (the stored one "
                "is never sent to another address)")
    return None


def _new_node(machine: ExpectedMachine) -> NewNode:
    return NewNode(state=NodeState.ENROLLED, hostname=machine.hostname, serial=machine.serial,
                   macs=machine.macs, profile=machine.profile, rack=machine.rack,
                   position=machine.position, bmc=machine.bmc,
                   bmc_password=machine.bmc_password)
