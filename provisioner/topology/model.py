"""The fleet graph: GPUs and their NVLink domain, InfiniBand devices, links, switches, findings.

Parsers produce the raw records (``IbScan``, ``LocalCa``, ``GpuReport``); ``fabric`` and
``fleet`` turn them into ``Fabric`` and ``Fleet``. Every value is a frozen, slotted dataclass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from provisioner.errors import InvalidRequest
from provisioner.topology.rate import LinkRate as LinkRate  # re-exported

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class TopologyParseError(InvalidRequest):
    """Input a parser cannot read: names the source, the 1-based line and the reason."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        super().__init__(f"{source}: line {line}: {reason}")


# -- InfiniBand records --------------------------------------------------------------------


class NodeKind(StrEnum):
    CA = "ca"
    SWITCH = "switch"
    ROUTER = "router"


class PortState(StrEnum):
    """The logical port state (IBA PortInfo.PortState)."""

    DOWN = "down"
    INIT = "init"
    ARMED = "armed"
    ACTIVE = "active"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, text: str) -> PortState:
        """``Active``, ``4: ACTIVE``, ``Down``, ``ActDefer`` and so on; unknown words map to
        UNKNOWN rather than failing (a new tool version must not break parsing)."""
        word = text.split(":")[-1].strip().lower()
        return _PORT_STATES.get(word, cls.UNKNOWN)


_PORT_STATES = {"down": PortState.DOWN, "init": PortState.INIT, "initialize": PortState.INIT,
                "initializing": PortState.INIT,  # ibstat's word (infiniband-diags ibstat.c)
                "armed": PortState.ARMED, "active": PortState.ACTIVE,
                "actdefer": PortState.ACTIVE, "active_defer": PortState.ACTIVE}

@dataclass(frozen=True, slots=True)
class IbNode:
    """A device as a tool reported it. ``guid`` is 16 lower-case hex digits (the node GUID,
    or the port GUID in formats that only give that), or ``lid-<n>`` when a format names a
    peer only by its LID."""

    guid: str
    kind: NodeKind
    description: str
    ports: int | None = None
    lid: int | None = None


@dataclass(frozen=True, slots=True, order=True)
class PortRef:
    guid: str
    port: int


@dataclass(frozen=True, slots=True)
class IbLink:
    """A cable between two ports, as seen (``state`` is the state of the link, not a port)."""

    a: PortRef
    b: PortRef
    rate: LinkRate | None = None
    state: PortState = PortState.ACTIVE

    def key(self) -> tuple[PortRef, PortRef]:
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)


@dataclass(frozen=True, slots=True)
class IbPortStatus:
    """A port with no peer in the scan (unused, unplugged or disabled)."""

    ref: PortRef
    state: PortState
    physical: str = ""


@dataclass(frozen=True, slots=True)
class IbScan:
    """One fabric discovery (ibnetdiscover, iblinkinfo, ...): devices, links, idle ports."""

    nodes: tuple[IbNode, ...]
    links: tuple[IbLink, ...] = ()
    idle_ports: tuple[IbPortStatus, ...] = ()
    source: str = ""


@dataclass(frozen=True, slots=True)
class PortErrors:
    """Error counters above threshold on one port (``port`` None = the ``ALL`` summary)."""

    guid: str
    description: str
    port: int | None
    counters: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class LocalPort:
    number: int
    state: PortState
    physical: str = ""
    rate: LinkRate | None = None
    lid: int | None = None
    port_guid: str | None = None
    link_layer: str = ""

    @property
    def is_infiniband(self) -> bool:
        return self.link_layer.lower() in ("infiniband", "ib")


@dataclass(frozen=True, slots=True)
class LocalCa:
    """One HCA as its host sees it (ibstat or /sys/class/infiniband)."""

    name: str
    ports: tuple[LocalPort, ...]
    ca_type: str = ""
    node_guid: str | None = None
    firmware: str = ""
    description: str = ""


# -- GPUs and the NVLink domain ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FabricHealth:
    """``<fabric><health>`` of ``nvidia-smi -q -x`` (DTD v12: bandwidth, route_recovery_in_
    progress, route_unhealthy, access_timeout_recovery; v13 adds summary,
    incorrect_configuration, partition_assigned) and the ``Fabric / Health`` rows of
    ``nvidia-smi -q``. nvidia-smi's words (``Healthy``, ``Degraded``, ``True``, ``N/A``);
    ``""`` when the driver does not write the field."""

    summary: str = ""
    bandwidth: str = ""
    route_recovery_in_progress: str = ""
    route_unhealthy: str = ""
    access_timeout_recovery: str = ""
    incorrect_configuration: str = ""
    partition_assigned: str = ""

    def problems(self) -> tuple[str, ...]:
        """What makes this GPU's NVLink fabric unusable: the health summary Unhealthy, a
        route unhealthy or recovering, an access timeout recovery, an incorrect
        configuration, no partition. A degraded bandwidth (or summary Limited Capacity) is
        ``degraded()``, not a problem: a profile may accept it."""
        found = []
        if _norm(self.summary) == "unhealthy":
            found.append("health summary Unhealthy")
        for name, value in (("route unhealthy", self.route_unhealthy),
                            ("route recovery in progress", self.route_recovery_in_progress),
                            ("access timeout recovery", self.access_timeout_recovery)):
            if _norm(value) == "true":
                found.append(name)
        if _norm(self.incorrect_configuration) not in _NO_FABRIC | {"none", "false"}:
            found.append(f"incorrect configuration {self.incorrect_configuration}")
        if _norm(self.partition_assigned) == "false":
            found.append("no NVLink partition assigned")
        return tuple(found)

    def degraded(self) -> str | None:
        """``bandwidth Degraded`` / ``health summary Limited Capacity``, or None."""
        if _norm(self.bandwidth) == "degraded":
            return "bandwidth Degraded"
        if _norm(self.summary) == "limited capacity":
            return "health summary Limited Capacity"
        return None


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU; fabric fields keep nvidia-smi's words (``Completed``, ``N/A``), ``""`` when
    the driver does not report them. ``index``: nvidia-smi's index (the GPU's place in its
    report, the order of ``nvidia-smi -L``), not the device's minor number."""

    uuid: str
    product: str
    bus_id: str = ""
    index: int | None = None
    fabric_state: str = ""
    fabric_status: str = ""
    cluster_uuid: str = ""
    clique_id: str = ""
    mig_enabled: bool = False
    mig_devices: int = 0
    health: FabricHealth = FabricHealth()
    recovery_action: str = ""
    """``<gpu_recovery_action>`` (driver >= 570): ``None``, or what the GPU waits for
    (``GPU_RESET``, ``NODE_REBOOT``, ``DRAIN_P2P``, ``DRAIN_AND_RESET``; some drivers
    write ``Reset``, ``Reboot``); ``""`` when the driver does not write it."""

    def pending_recovery(self) -> str | None:
        """The recovery action the GPU waits for, in nvidia-smi's words; None for none."""
        action = " ".join(self.recovery_action.split())
        return None if action.lower() in _NO_FABRIC | {"none"} else action


@dataclass(frozen=True, slots=True)
class GpuReport:
    hostname: str
    gpus: tuple[Gpu, ...]
    driver_version: str = ""
    source: str = ""


class NvlinkScope(StrEnum):
    MULTI_NODE = "multi-node"      # a clique: ClusterUUID.CliqueId
    SINGLE_NODE = "single-node"    # fabric up, zero or no ClusterUUID (HGX/DGX NVSwitch)
    NOT_READY = "not-ready"        # fabric still training, or failed: no clique yet
    INCONSISTENT = "inconsistent"  # GPUs disagree: no clique, an operator must look
    NONE = "none"                  # no NVLink fabric (N/A: PCIe cards, no Fabric Manager)


@dataclass(frozen=True, slots=True)
class NvlinkDomain:
    scope: NvlinkScope
    clique: str | None = None
    reason: str = ""


_NO_FABRIC = {"", "n/a", "not supported", "notsupported"}
_CLIQUE = re.compile(r"^[0-9]{1,10}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def nvlink_domain(gpus: Sequence[Gpu]) -> NvlinkDomain:
    """GFD's rule (DESIGN §6): clique ``<ClusterUUID>.<CliqueId>`` only when every GPU reports
    fabric state Completed, status Success, a non-zero ClusterUUID, and all GPUs agree; and no
    GPU's fabric health names a problem (``FabricHealth.problems``: a tray whose fabric is
    Completed/Success but Unhealthy, route unhealthy, gets no clique); and no GPU waits for
    a recovery action (``Gpu.pending_recovery``: after a partition change a GB200 GPU keeps
    its old CliqueId until it is reset)."""
    if not gpus:
        return NvlinkDomain(NvlinkScope.NONE, reason="no GPUs reported")
    for gpu in gpus:  # its clique is stale until the reset/reboot: not published
        if (action := gpu.pending_recovery()) is not None:
            return NvlinkDomain(NvlinkScope.NOT_READY,
                                reason=f"{gpu.uuid}: GPU recovery action {action} pending")
    if all(_norm(g.fabric_state) in _NO_FABRIC for g in gpus):
        return NvlinkDomain(NvlinkScope.NONE, reason="no NVLink fabric (fabric state N/A)")
    for gpu in gpus:
        if _norm(gpu.fabric_state) != "completed":
            return NvlinkDomain(NvlinkScope.NOT_READY,
                                reason=f"{gpu.uuid}: fabric state {gpu.fabric_state or 'absent'}")
        if _norm(gpu.fabric_status) != "success":
            return NvlinkDomain(NvlinkScope.NOT_READY,
                                reason=f"{gpu.uuid}: fabric status {gpu.fabric_status or 'absent'}")
        if problems := gpu.health.problems():
            return NvlinkDomain(NvlinkScope.NOT_READY,
                                reason=f"{gpu.uuid}: fabric {', '.join(problems)}")
    uuids = {_cluster_uuid(g.cluster_uuid) for g in gpus}
    if uuids == {None}:
        return NvlinkDomain(NvlinkScope.SINGLE_NODE,
                            reason="ClusterUUID zero or absent: single-node NVLink only")
    cliques = {g.clique_id.strip() for g in gpus}
    if len(uuids) > 1 or len(cliques) > 1 or None in uuids:
        return NvlinkDomain(NvlinkScope.INCONSISTENT, reason=(
            f"GPUs disagree: ClusterUUIDs {sorted(str(u) for u in uuids)}, "
            f"CliqueIds {sorted(cliques)}"))
    (uuid,), (clique,) = uuids, cliques
    if not _CLIQUE.match(clique):
        return NvlinkDomain(NvlinkScope.INCONSISTENT, reason=f"CliqueId {clique!r} is not a number")
    if uuid is None or not _UUID.match(uuid):
        return NvlinkDomain(NvlinkScope.INCONSISTENT, reason=f"ClusterUUID {uuid!r} is not a UUID")
    return NvlinkDomain(NvlinkScope.MULTI_NODE, clique=f"{uuid}.{clique}")


def _cluster_uuid(text: str) -> str | None:
    value = text.strip().lower()
    if _norm(value) in _NO_FABRIC or value.replace("-", "").strip("0") == "":
        return None
    return value


# -- findings and the built graph ----------------------------------------------------------


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Code(StrEnum):
    UNNAMED_HCA = "unnamed-hca"          # node description names no host: not guessed
    UNKNOWN_HOST = "unknown-host"        # names a host outside the known set
    HOST_MISSING = "host-missing"        # a known host is absent from the fabric
    SWITCH_UNNAMED = "switch-unnamed"
    DUPLICATE_NAME = "duplicate-name"
    MULTI_HOMED = "multi-homed"          # a host cabled to several leaves
    PORT_DOWN = "port-down"
    RATE_DEGRADED = "rate-degraded"
    UPLINKS_MISSING = "uplinks-missing"  # fewer uplinks/downlinks than the switch's peers
    LINK_MISSING = "link-missing"        # a link of the baseline is gone
    NODE_MISSING = "node-missing"        # a device of the baseline is gone
    PORT_ERRORS = "port-errors"
    NO_TIER = "no-tier"                  # a switch no leaf reaches
    NO_LEAF = "no-leaf"                  # a GPU host that is not in the fabric
    NVLINK = "nvlink"                    # no clique, with GFD's reason
    BLOCK_TOO_SMALL = "block-too-small"
    UNREADABLE = "unreadable"             # a stored report that does not parse: left out


@dataclass(frozen=True, slots=True)
class Finding:
    code: Code
    subject: str
    detail: str
    severity: Severity = Severity.WARNING

    def __str__(self) -> str:
        return f"{self.severity}: {self.subject}: {self.detail} [{self.code}]"


@dataclass(frozen=True, slots=True)
class Switch:
    """A switch with its tier (1 = leaf, upward) and its neighbours by name."""

    guid: str
    name: str
    description: str = ""
    model: str = ""
    tier: int | None = None
    hosts: tuple[str, ...] = ()      # hostnames cabled to it (leaves only)
    children: tuple[str, ...] = ()   # switches one tier down
    parents: tuple[str, ...] = ()    # switches one tier up


@dataclass(frozen=True, slots=True)
class Hca:
    """A CA port cabled into the fabric; ``hostname`` is None when its description names
    no host (the finding says why)."""

    guid: str
    description: str
    hostname: str | None
    device: str = ""
    port: int = 1
    switch: str | None = None
    rate: LinkRate | None = None
    state: PortState = PortState.ACTIVE


class Health(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    DOWN = "down"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Fabric:
    switches: tuple[Switch, ...]
    hcas: tuple[Hca, ...]
    links: tuple[IbLink, ...]
    findings: tuple[Finding, ...] = ()
    expected_host_rate: LinkRate | None = None
    expected_switch_rate: LinkRate | None = None

    def switch(self, name: str) -> Switch | None:
        return next((s for s in self.switches if s.name == name), None)

    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({h.hostname for h in self.hcas if h.hostname}))

    @property
    def health(self) -> Health:
        bad = {Code.PORT_DOWN, Code.RATE_DEGRADED, Code.UPLINKS_MISSING, Code.LINK_MISSING,
               Code.NODE_MISSING, Code.HOST_MISSING, Code.PORT_ERRORS}
        return Health.DEGRADED if any(f.code in bad for f in self.findings) else Health.OK


@dataclass(frozen=True, slots=True)
class Node:
    """A compute host: where it sits in the fabric and which NVLink domain it is in."""

    hostname: str
    leaf: str | None = None
    path: tuple[str, ...] = ()       # one switch per tier, leaf first (see fleet.py)
    nvlink: NvlinkDomain = field(default_factory=lambda: NvlinkDomain(NvlinkScope.NONE))
    gpus: tuple[Gpu, ...] = ()
    hcas: tuple[Hca, ...] = ()
    health: Health = Health.UNKNOWN

    @property
    def clique(self) -> str | None:
        return self.nvlink.clique


@dataclass(frozen=True, slots=True)
class Fleet:
    nodes: tuple[Node, ...]
    fabric: Fabric | None = None
    findings: tuple[Finding, ...] = ()

    def node(self, hostname: str) -> Node | None:
        return next((n for n in self.nodes if n.hostname == hostname), None)
