"""Expected-inventory import: serial -> hostname, rack, profile, MACs, BMC. New serials are
enrolled (or, with ``state=active``, registered as the running machines they are: no
inspection, no disk write); known ones get their metadata updated, each change in the node's
history with the actor (event ``import``).

Safe by default, as an operator of MAAS or Ironic expects:

- ``dry_run``: every row is planned and reported, nothing is written;
- a node that is active or in flight (joined to Slurm and Kubernetes, or being installed) is
  never renamed or re-profiled without ``allow_live_changes``: the row is refused;
- a row's ``macs`` are added to a known node; a MAC the row does not list is removed only
  with ``prune_macs``;
- a password the daemon rotated (``provisioner/lifecycle/rotation.py``) is never put back:
  the row's older password is ignored, with a note;
- a row that changes a known node's BMC (endpoint, user or password) is a credential change:
  it needs ``may_change_bmc`` (the admin role), and one that moves the endpoint of a node with
  a stored password must bring the password for the new address (a stored password is never
  sent to an address other than the one it was entered for). Such rows fail alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from provisioner.domain import BmcEndpoint, NewNode, Node
from provisioner.errors import ProvisionerError
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.rotation import RECOVERED, ROTATED
from provisioner.lifecycle.states import IN_FLIGHT, Event, NodeState
from provisioner.store.repo import NodeChange, NodeRepo

IMPORT_EVENT = "import"
#: states of a node in service or being installed: no rename or re-profile by an import
LIVE = frozenset({NodeState.ACTIVE, NodeState.SERVICE_REQUIRED, *IN_FLIGHT})
#: states from which ``state=active`` registers a known node as running (brownfield)
REGISTRABLE = frozenset({NodeState.ENROLLED, NodeState.INSPECTED, NodeState.INSPECT_FAILED})


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
    state: NodeState | None = None
    """``active``: the machine already runs its OS (brownfield adoption)."""


@dataclass(frozen=True, slots=True)
class ImportOptions:
    dry_run: bool = False
    allow_live_changes: bool = False
    prune_macs: bool = False
    may_change_bmc: bool = True


@dataclass(frozen=True, slots=True)
class Planned:
    """What an import does (or, dry, would do) to one machine."""

    serial: str
    action: str  # create, update, unchanged, refused
    node: str | None = None
    changes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ImportReport:
    created: list[str]
    updated: list[str]
    errors: list[str]
    planned: list[Planned] = field(default_factory=list)


class _Refused(Exception):
    pass


async def import_machines(
    machines: Iterable[ExpectedMachine], *, conductor: Conductor, repo: NodeRepo, actor: str,
    options: ImportOptions = ImportOptions(),
) -> ImportReport:
    report = ImportReport(created=[], updated=[], errors=[])
    for machine in machines:
        try:
            planned = await _one(machine, conductor, repo, actor, options)
        except (_Refused, ProvisionerError) as exc:
            report.errors.append(f"serial {machine.serial}: {exc}")
            report.planned.append(Planned(machine.serial, "refused", notes=(str(exc),)))
            continue
        report.planned.append(planned)
        if options.dry_run:
            continue  # created and updated list what was written
        if planned.action == "create" and planned.node is not None:
            report.created.append(planned.node)
        elif planned.action == "update" and planned.node is not None:
            report.updated.append(planned.node)
    return report


async def _one(machine: ExpectedMachine, conductor: Conductor, repo: NodeRepo, actor: str,
               options: ImportOptions) -> Planned:
    node = await repo.find_by_serial(machine.serial)
    if node is None:
        return await _create(machine, conductor, actor, options.dry_run)
    notes: list[str] = []
    change, changes = _meta_changes(node, machine)
    live = node.state in LIVE
    if live and (change.hostname or change.profile) and not options.allow_live_changes:
        what = " and ".join(name for name in ("hostname", "profile")
                            if getattr(change, name) is not None)
        raise _Refused(f"node {node.id} is {node.state}: changing its {what} "
                       f"({'; '.join(changes)}) needs allow_live_changes "
                       "(--allow-live-changes)")
    add = tuple(mac for mac in machine.macs if mac not in node.macs)
    gone = tuple(mac for mac in node.macs if machine.macs and mac not in machine.macs)
    changes += [f"macs: +{mac}" for mac in add]
    if gone and options.prune_macs:
        changes += [f"macs: -{mac}" for mac in gone]
    elif gone:
        notes.append(f"kept MACs the row does not list: {', '.join(gone)} "
                     "(prune_macs / --prune-macs removes them)")
    password = await _password(node, machine, repo, notes)
    bmc_changes = await _bmc_changes(node, machine, password, repo, options.may_change_bmc)
    changes += bmc_changes
    if bmc_changes:
        change = NodeChange(hostname=change.hostname, profile=change.profile,
                            rack=change.rack, position=change.position, bmc=machine.bmc,
                            bmc_password=password)
    register = _registration(node, machine, notes)
    if register:
        changes.append(f"state: {node.state} -> active (register running: no disk write)")
    if not changes:
        return Planned(machine.serial, "unchanged", node.id, notes=tuple(notes))
    if not options.dry_run:
        meta = [text for text in changes if not text.startswith("state:")]
        if meta:
            await conductor.edit(node.id, lambda fresh: repo.edit_recorded(
                fresh, change, event=IMPORT_EVENT, actor=actor, reason="; ".join(meta),
                add_macs=add, remove_macs=gone if options.prune_macs else ()),
                event=IMPORT_EVENT)
        if register:
            await conductor.fire(node.id, Event.REGISTER_RUNNING, actor=actor,
                                 reason="import: state=active (already runs its OS)")
    return Planned(machine.serial, "update", node.id, tuple(changes), tuple(notes))


async def _create(machine: ExpectedMachine, conductor: Conductor, actor: str,
                  dry_run: bool) -> Planned:
    active = machine.state is NodeState.ACTIVE
    what = ("register running as active (no inspection, no disk write)" if active
            else "enroll")
    changes = [what, *(f"{name}: {value}" for name in ("hostname", "profile", "rack",
                                                          "position")
                       if (value := getattr(machine, name)) is not None)]
    changes += [f"macs: +{mac}" for mac in machine.macs]
    if machine.bmc is not None:
        changes.append(f"bmc: {machine.bmc.driver} {machine.bmc.address}")
    if dry_run:
        return Planned(machine.serial, "create", None, tuple(changes))
    reason = ("expected-inventory import: registered running (brownfield adoption)" if active
              else "expected-inventory import")
    node = await conductor.enroll(_new_node(machine), actor=actor, reason=reason)
    return Planned(machine.serial, "create", node.id, tuple(changes))


def _meta_changes(node: Node, machine: ExpectedMachine) -> tuple[NodeChange, list[str]]:
    values: dict[str, str | None] = dict.fromkeys(("hostname", "profile", "rack", "position"))
    changes: list[str] = []
    for name in ("hostname", "profile", "rack", "position"):
        wanted, current = getattr(machine, name), getattr(node, name)
        if wanted is not None and wanted != current:
            values[name] = wanted
            changes.append(f"{name}: {current or '(none)'} -> {wanted}")
    return NodeChange(hostname=values["hostname"], profile=values["profile"],
                      rack=values["rack"], position=values["position"]), changes


async def _password(node: Node, machine: ExpectedMachine, repo: NodeRepo,
                    notes: list[str]) -> str | None:
    """The row's password, unless it would put back one the daemon rotated away."""
    if machine.bmc_password is None or node.bmc is None or machine.bmc is None:
        return machine.bmc_password
    if (machine.bmc.driver, machine.bmc.address, machine.bmc.port) != (
            node.bmc.driver, node.bmc.address, node.bmc.port):
        return machine.bmc_password  # a new address: the rotated one is not for it
    if (await repo.credentials(node.id)).password == machine.bmc_password:
        return machine.bmc_password
    rotations = [entry for entry in await repo.history(node.id)
                 if entry.event in (ROTATED, RECOVERED)]
    if not rotations:
        return machine.bmc_password
    notes.append(f"bmc_password ignored: the daemon rotated this BMC's password "
                 f"({rotations[-1].at:%Y-%m-%d %H:%M}Z); the stored one is kept")
    return None


async def _bmc_changes(node: Node, machine: ExpectedMachine, password: str | None,
                       repo: NodeRepo, may_change_bmc: bool) -> list[str]:
    """What this row changes of the node's BMC (never a secret); _Refused when it may not."""
    wanted, current = machine.bmc, node.bmc
    changes: list[str] = []
    moved = wanted is not None and (
        current is None or (wanted.driver, wanted.address, wanted.port)
        != (current.driver, current.address, current.port))
    if moved and wanted is not None:
        old = f"{current.driver} {current.address}" if current is not None else "(none)"
        changes.append(f"bmc: {old} -> {wanted.driver} {wanted.address}")
    if wanted is not None and current is not None and wanted.username != current.username \
            and not moved:
        changes.append(f"bmc_username: {current.username} -> {wanted.username}")
    if password is not None and not moved \
            and (await repo.credentials(node.id)).password != password:
        changes.append("bmc_password: changed")
    if not changes:
        return []
    if not may_change_bmc:
        raise _Refused(f"changing the BMC of node {node.id} (endpoint or credentials) needs "
                       "the admin role")
    if moved and current is not None and current.password_set and password is None \
            and wanted is not None:
        raise _Refused(f"the BMC of node {node.id} moves from {current.address} to "
                       f"{wanted.address}: give bmc_password for the new address (the "
                       "stored one is never sent to another address)")
    return changes


def _registration(node: Node, machine: ExpectedMachine, notes: list[str]) -> bool:
    if machine.state is not NodeState.ACTIVE or node.state is NodeState.ACTIVE:
        return False
    if node.state in REGISTRABLE:
        return True
    notes.append(f"state=active ignored: node {node.id} is {node.state}")
    return False


def _new_node(machine: ExpectedMachine) -> NewNode:
    state = NodeState.ACTIVE if machine.state is NodeState.ACTIVE else NodeState.ENROLLED
    return NewNode(state=state, hostname=machine.hostname, serial=machine.serial,
                   macs=machine.macs, profile=machine.profile, rack=machine.rack,
                   position=machine.position, bmc=machine.bmc,
                   bmc_password=machine.bmc_password)
