"""Domain values shared by the store, the conductor and the API: frozen, slotted, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from provisioner.ids import NodeId


class NodeState(StrEnum):
    """Where a node stands (DESIGN §2); the transition table is ``lifecycle.states``.

    Stable states wait for a request or a policy; in-flight states (gerunds) run one step;
    every in-flight state has a ``*_failed`` twin that records why it stopped."""

    # stable
    DISCOVERED = "discovered"
    ENROLLED = "enrolled"
    INSPECTED = "inspected"
    ACTIVE = "active"
    RETIRED = "retired"
    SERVICE_REQUIRED = "service_required"  # the repair ladder ran out of rungs: a person
    # in flight
    INSPECTING = "inspecting"
    DEPLOYING = "deploying"
    CONFIGURING = "configuring"
    JOINING = "joining"
    VALIDATING = "validating"
    REGISTERING = "registering"
    RETIRING = "retiring"
    REPAIRING = "repairing"
    SERVICING = "servicing"  # a runbook (firmware, BIOS): onboarding or on a drained node
    # failed twins (stable)
    INSPECT_FAILED = "inspect_failed"
    DEPLOY_FAILED = "deploy_failed"
    CONFIGURE_FAILED = "configure_failed"
    JOIN_FAILED = "join_failed"
    VALIDATE_FAILED = "validate_failed"
    REGISTER_FAILED = "register_failed"
    RETIRE_FAILED = "retire_failed"
    REPAIR_FAILED = "repair_failed"
    SERVICE_FAILED = "service_failed"


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    AGENT = "agent"

    def allows(self, needed: Role) -> bool:
        """Whether this role may do what ``needed`` may (admin ⊃ operator ⊃ viewer)."""
        order = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
        if self is Role.AGENT or needed is Role.AGENT:
            return self is needed
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class KnownNode:
    """What the boot servers learn of the node that owns a MAC (``boot.inventory``)."""

    node_id: str
    hostname: str | None
    state: str


#: MAC -> what the boot servers should answer for it now, or None: ask the store again
#: (``lifecycle.discovery.Discovery.add_listener``; the DHCP worker processes follow it).
MacChanges = dict[str, KnownNode | None]


@dataclass(frozen=True, slots=True)
class BmcEndpoint:
    driver: str
    address: str
    port: int | None = None
    username: str | None = None
    password_set: bool = False


@dataclass(frozen=True, slots=True)
class BmcCredentials:
    """Decrypted credentials, handed only to BMC drivers. Never logged: repr hides them."""

    username: str | None
    password: str | None = field(repr=False)
    site_default: bool = False
    """The password is the site default (``bmc.default_password``), entered for no BMC in
    particular: drivers never send it in clear text (Redfish over plain http)."""


@dataclass(frozen=True, slots=True)
class BmcTarget:
    """What the power-state sync needs of a node with a BMC, without its facts (parsing
    every node's facts every period cost a fleet at rest more than the BMC reads)."""

    id: NodeId
    state: NodeState
    bmc: BmcEndpoint
    credentials: BmcCredentials
    power_state: str | None


@dataclass(frozen=True, slots=True)
class Node:
    id: NodeId
    state: NodeState
    hostname: str | None
    serial: str | None
    macs: tuple[str, ...]
    maintenance: bool
    maintenance_reason: str
    profile: str | None
    rack: str | None
    position: str | None
    facts: dict[str, Any]
    last_error: str
    checkpoint: tuple[str, ...]
    version: int
    history_seq: int
    bmc: BmcEndpoint | None
    created_at: datetime
    updated_at: datetime
    power_state: str | None = None
    bmc_mac: str | None = None


@dataclass(frozen=True, slots=True)
class NewNode:
    """What enrolment (operator, import or discovery) knows about a machine."""

    state: NodeState
    hostname: str | None = None
    serial: str | None = None
    macs: tuple[str, ...] = ()
    profile: str | None = None
    rack: str | None = None
    position: str | None = None
    bmc: BmcEndpoint | None = None
    bmc_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    node_id: NodeId
    seq: int
    event: str
    from_state: str
    to_state: str
    actor: str
    reason: str
    at: datetime
    instance: str | None = None  # the daemon that wrote it (several daemons, one database)
    fence: int | None = None  # the fencing number of its lease, for a step's writes


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """A history row of any node, with its fleet-wide id (``provisioner events``, the SSE
    stream's ``id:``): every daemon on the database sees the same ids. ``hostname``,
    ``maintenance``, ``maintenance_reason`` and ``last_error`` are the node's now (a
    replaced chassis, which gave its hostname up: the hostname it had)."""

    id: int
    entry: HistoryEntry
    hostname: str | None
    maintenance: bool
    maintenance_reason: str
    last_error: str


@dataclass(frozen=True, slots=True)
class NodeFilter:
    """Nodes matching every field given; a tuple matches any of its values."""

    state: str | tuple[str, ...] | None = None
    rack: str | tuple[str, ...] | None = None
    profile: str | tuple[str, ...] | None = None
    maintenance: bool | None = None
    query: str | None = None


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    name: str
    role: Role
    node_id: NodeId | None
    expires_at: datetime | None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """What the console's fleet view shows of every node: no facts, no history."""

    id: NodeId
    hostname: str | None
    state: str
    maintenance: bool
    rack: str | None
    position: str | None
    profile: str | None = None
    power_state: str | None = None
    last_error: str = ""
    maintenance_reason: str = ""


@dataclass(frozen=True, slots=True)
class DiskErasure:
    """One disk's result, as the agent reported it."""

    device: str
    model: str
    serial: str
    method: str
    verified: bool
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.verified and not self.error

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> DiskErasure:
        return cls(str(report.get("device", "?"))[:64], str(report.get("model", ""))[:80],
                   str(report.get("serial", ""))[:80], str(report.get("method", ""))[:40],
                   report.get("verified") is True, float(report.get("seconds", 0) or 0),
                   str(report.get("error", ""))[:600])

    def describe(self) -> str:
        who = " ".join(part for part in (self.model, f"serial {self.serial}" if self.serial
                                         else "") if part)
        head = f"{self.device}" + (f" ({who})" if who else "")
        if self.ok:
            return (f"{head}: erased by {self.method}, verified by sampled reads, "
                    f"{self.seconds:.1f} s")
        tried = f" after {self.method}" if self.method else ""
        return f"{head}: not erased{tried}: {self.error or 'not verified'}"


@dataclass(frozen=True, slots=True)
class Sanitised:
    """The agent's answer to a ``sanitise`` job."""

    disks: tuple[DiskErasure, ...]
    error: str = ""

    @classmethod
    def from_report(cls, body: Mapping[str, Any]) -> Sanitised:
        disks = body.get("disks")
        found = tuple(DiskErasure.from_report(d) for d in disks if isinstance(d, Mapping)) \
            if isinstance(disks, Sequence) else ()
        error = "" if body.get("ok") is True else str(body.get("error") or "failed")[:1000]
        return cls(found, error)
