"""The fleet's firmware against each profile's baseline (issue 25): per node its drift
status (``validation.drift``) from the FirmwareInventory as last read (``facts["firmware"]``,
kept by the ``firmware_inventory`` and ``firmware_update`` steps; nothing is read from a BMC
here), its NVLink domain (the clique its validation record names) and rack. Nodes whose
profile has no firmware baseline are not part of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from provisioner.domain import Node, NodeState
from provisioner.lifecycle.service_ports import Servicing
from provisioner.lifecycle.service_step import FIRMWARE_KEY, components_out
from provisioner.validation.drift import STATUSES, Difference, firmware_drift
from provisioner.validation.record import ValidationRecord


@dataclass(frozen=True, slots=True)
class NodeFirmware:
    node_id: str
    name: str
    profile: str
    rack: str | None
    domain: str | None
    state: str
    maintenance: bool
    status: str
    differences: tuple[Difference, ...]
    read_at: str | None


def domain_of(node: Node) -> str | None:
    record = ValidationRecord.from_facts(node.facts)
    return record.clique if record is not None else None


def node_firmware(node: Node, servicing: Servicing) -> NodeFirmware | None:
    """None: the node's profile has no firmware baseline."""
    baseline = servicing.baseline(node).firmware
    if not baseline or not node.profile:
        return None
    raw = node.facts.get(FIRMWARE_KEY)
    read = isinstance(raw, dict) and isinstance(raw.get("components"), list)
    drift = firmware_drift(str(node.state), components_out(node.facts) if read else None,
                           baseline)
    return NodeFirmware(node.id, node.hostname or node.id, node.profile, node.rack,
                        domain_of(node), str(node.state), node.maintenance, drift.status,
                        drift.differences,
                        str(raw.get("at")) if isinstance(raw, dict) and raw.get("at") else None)


async def read_fleet(nodes: FleetReader, servicing: Servicing) -> list[NodeFirmware]:
    """Every node with a firmware baseline, by name."""
    found = [node_firmware(n, servicing) for n in await nodes.in_states(NodeState)]
    return sorted((f for f in found if f is not None), key=lambda f: (f.name, f.node_id))


async def fleet_counts(nodes: FleetReader, servicing: Servicing
                       ) -> dict[tuple[str, str], int]:
    """``counts(read_fleet(...))`` (the /metrics gauge) from each node's firmware facts
    alone, taken out by the database: no node's other facts are read or parsed."""
    found = [node_firmware(n, servicing)
             for n in await nodes.with_facts_key(NodeState, FIRMWARE_KEY)]
    return counts([f for f in found if f is not None])


class FleetReader(Protocol):
    """What ``read_fleet`` and ``fleet_counts`` need from the store (``NodeRepo`` has
    it)."""

    async def in_states(self, states: Iterable[NodeState]) -> list[Node]: ...

    async def with_facts_key(self, states: Iterable[NodeState], key: str) -> list[Node]: ...


def keep(fleet: Iterable[NodeFirmware], *, profile: str | None = None,
         rack: str | None = None, domain: str | None = None,
         status: str | None = None) -> list[NodeFirmware]:
    return [f for f in fleet if (profile is None or f.profile == profile)
            and (rack is None or f.rack == rack) and (domain is None or f.domain == domain)
            and (status is None or f.status == status)]


def counts(fleet: Sequence[NodeFirmware]) -> dict[tuple[str, str], int]:
    """(status, profile) -> nodes; every status of every profile present, 0 included."""
    seen: Counter[tuple[str, str]] = Counter((f.status, f.profile) for f in fleet)
    return {(s, p): seen[s, p] for p in sorted({f.profile for f in fleet}) for s in STATUSES}


def by_status(fleet: Sequence[NodeFirmware]) -> Mapping[str, int]:
    seen = Counter(f.status for f in fleet)
    return {s: seen[s] for s in STATUSES}
