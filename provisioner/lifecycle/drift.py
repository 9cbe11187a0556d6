"""The fleet's firmware, BIOS and BMC settings against each profile's baseline (issue 25):
per node its drift status (``validation.drift``) from what was last read: the
FirmwareInventory (``facts["firmware"]``, kept by the ``firmware_inventory`` and
``firmware_update`` steps), the BIOS attributes (``facts["bios_settings"]``, kept by
``bios_settings`` and ``firmware_inventory``) and the BMC settings
(``facts["bmc_settings"]``, kept by ``bmc_settings`` and ``firmware_inventory``); nothing is
read from a BMC here. ``status`` is the node's over all three; ``firmware_status``,
``bios_status`` and ``bmc_status`` each part's (None: the profile has no such baseline).
Each node has its NVLink domain (the clique its validation record names) and rack. Nodes
whose profile has none of the three baselines are not part of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from provisioner.domain import Node, NodeState
from provisioner.lifecycle.service_ports import Servicing
from provisioner.lifecycle.service_step import BIOS_KEY, FIRMWARE_KEY, components_out
from provisioner.validation.drift import (
    STATUSES,
    Difference,
    Drift,
    combine,
    firmware_drift,
    settings_drift,
)
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
    firmware_status: str | None = None
    bios_status: str | None = None
    bmc_status: str | None = None
    bios_read_at: str | None = None
    bmc_read_at: str | None = None


def domain_of(node: Node) -> str | None:
    record = ValidationRecord.from_facts(node.facts)
    return record.clique if record is not None else None


BMC_KEY = "bmc_settings"  # lifecycle.service_bmc.BMC_KEY (which imports the steps)


def _kept(facts: Mapping[str, object], key: str, field: str) -> tuple[
        Mapping[str, object] | None, str | None]:
    raw = facts.get(key)
    values = raw.get(field) if isinstance(raw, dict) else None
    at = raw.get("at") if isinstance(raw, dict) else None
    return (values if isinstance(values, dict) else None), (str(at) if at else None)


def node_firmware(node: Node, servicing: Servicing) -> NodeFirmware | None:
    """None: the node's profile has no firmware, BIOS or BMC settings baseline."""
    baseline = servicing.baseline(node)
    if not (baseline.firmware or baseline.bios or baseline.bmc) or not node.profile:
        return None
    state = str(node.state)
    raw = node.facts.get(FIRMWARE_KEY)
    read = isinstance(raw, dict) and isinstance(raw.get("components"), list)
    firmware = firmware_drift(state, components_out(node.facts) if read else None,
                              baseline.firmware) if baseline.firmware else None
    bios_values, bios_at = _kept(node.facts, BIOS_KEY, "attributes")
    bios = settings_drift(state, bios_values, baseline.bios, "bios") if baseline.bios \
        else None
    bmc_values, bmc_at = _kept(node.facts, BMC_KEY, "values")
    bmc = settings_drift(state, bmc_values, baseline.bmc, "bmc") if baseline.bmc else None
    drift = combine([p for p in (firmware, bios, bmc) if p is not None])
    return NodeFirmware(node.id, node.hostname or node.id, node.profile, node.rack,
                        domain_of(node), state, node.maintenance, drift.status,
                        drift.differences,
                        str(raw.get("at")) if isinstance(raw, dict) and raw.get("at") else None,
                        _status(firmware), _status(bios), _status(bmc), bios_at, bmc_at)


def _status(part: Drift | None) -> str | None:
    return part.status if part is not None else None


async def read_fleet(nodes: FleetReader, servicing: Servicing) -> list[NodeFirmware]:
    """Every node with a firmware baseline, by name."""
    found = [node_firmware(n, servicing) for n in await nodes.in_states(NodeState)]
    return sorted((f for f in found if f is not None), key=lambda f: (f.name, f.node_id))


async def gauge_fleet(nodes: FleetReader, servicing: Servicing) -> list[NodeFirmware]:
    """``read_fleet`` for the /metrics gauges (``counts``, ``part_counts``): each node with
    only the facts the drift reads, taken out by the database; no node's other facts are
    read or parsed, and no NVLink domain (the gauges do not name it)."""
    found = [node_firmware(n, servicing) for n in await nodes.with_facts_keys(
        NodeState, (FIRMWARE_KEY, BIOS_KEY, BMC_KEY))]
    return [f for f in found if f is not None]


class FleetReader(Protocol):
    """What ``read_fleet`` and ``gauge_fleet`` need from the store (``NodeRepo`` has
    it)."""

    async def in_states(self, states: Iterable[NodeState]) -> list[Node]: ...

    async def with_facts_keys(self, states: Iterable[NodeState], keys: Sequence[str]
                              ) -> list[Node]: ...


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


def part_counts(fleet: Sequence[NodeFirmware]) -> dict[tuple[str, str, str], int]:
    """(part, status, profile) -> nodes, part firmware, bios or bmc; every status of every
    profile with that part's baseline, 0 included."""
    seen: Counter[tuple[str, str, str]] = Counter()
    present: set[tuple[str, str]] = set()
    for f in fleet:
        for part, status in (("firmware", f.firmware_status), ("bios", f.bios_status),
                             ("bmc", f.bmc_status)):
            if status is not None:
                seen[part, status, f.profile] += 1
                present.add((part, f.profile))
    return {(part, s, p): seen[part, s, p] for part, p in sorted(present) for s in STATUSES}


def by_status(fleet: Sequence[NodeFirmware]) -> Mapping[str, int]:
    seen = Counter(f.status for f in fleet)
    return {s: seen[s] for s in STATUSES}
