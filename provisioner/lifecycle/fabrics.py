"""Fabric scans posted by nodes (``POST /agent/v1/fabric``): parsed at once, stored, and
recorded in the reporting node's history.

Who may post one: the scan replaces what the live topology publishes to Slurm and
Kubernetes, so only a scan the daemon asked for is taken. That is the ``facts`` role of the
daemon's own configure run: a controller token (issued to the Ansible run on the daemon's
host, never sent to a node, accepted only from that host) of a node in ``configuring``.
A token a node holds (the one its boot script or seed carries, which anyone on the
provisioning network may have got) is refused (``FabricRefused``), as is a node in any
other state: a made-up discovered machine never replaces a fabric. Each node may hold at
most ``MAX_FABRICS_PER_NODE`` fabrics' scans (one row per fabric: a new scan replaces the
fabric's previous one); the boot server bounds the rate and the size of the posts.

A scan that does not parse is refused with the line that is wrong, and the refusal is a
history row of the node that sent it (an operator sees why its fabric is not placed). An
accepted scan replaces the fabric's previous one; its history row (``fabric_reported``) also
tells the conductor's observers, so the live topology recomputes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import Executor
from dataclasses import dataclass

from provisioner.domain import NodeState, TokenInfo
from provisioner.errors import InvalidRequest, ProvisionerError
from provisioner.lifecycle.agent_binding import RefusalLog
from provisioner.lifecycle.agents import CONTROLLER_TOKEN_PREFIX
from provisioner.lifecycle.conductor import Conductor
from provisioner.store.repo import NodeRepo
from provisioner.store.topology import TopologyRepo
from provisioner.topology.model import IbScan, NodeKind, TopologyParseError
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover

log = logging.getLogger(__name__)
FABRIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_FABRIC = "default"
MAX_FABRICS_PER_NODE = 2
#: where the daemon runs the ``facts`` role, which scans the fabric
SCANNING_STATES = frozenset({NodeState.CONFIGURING})


class FabricRefused(ProvisionerError):
    """The token may not post fabric scans (403): not the daemon's own configure run."""


@dataclass(frozen=True, slots=True)
class FabricAccepted:
    fabric: str
    switches: int
    cas: int
    links: int
    sha256: str


class FabricReports:
    def __init__(self, conductor: Conductor, repo: TopologyRepo, nodes: NodeRepo, *,
                 executor: Executor | None = None,
                 max_per_node: int = MAX_FABRICS_PER_NODE) -> None:
        self._conductor = conductor
        self._repo = repo
        self._nodes = nodes
        self._executor = executor
        self._max_per_node = max_per_node
        self._refusals = RefusalLog()

    async def entitle(self, info: TokenInfo, remote: str | None) -> None:
        """``FabricRefused`` unless ``info`` is a controller token of a node the daemon is
        configuring (see the module's doc); a refusal is a history row of the node,
        coalesced per source (``RefusalLog``)."""
        assert info.node_id is not None
        node = await self._nodes.get(info.node_id)
        if not info.name.startswith(CONTROLLER_TOKEN_PREFIX):
            why = ("a fabric scan is taken only from the daemon's configure run (its "
                   "controller token), not with a token the node holds")
        elif node.state not in SCANNING_STATES:
            why = f"node {node.id} is {node.state}, not configuring: no scan was asked for"
        else:
            return
        if (since := self._refusals.note(node.id, "fabric_refused", remote or "")) is not None:
            reason = why + (f" ({since} more refused from there since the last row)"
                            if since else "") + f"; from {remote or 'an unknown address'}"
            await self._conductor.record(node.id, "fabric_refused", actor="network",
                                         reason=reason, level=logging.WARNING)
        raise FabricRefused(why)

    async def report(self, node_id: str, fabric: str, text: str) -> FabricAccepted:
        """Parse and store one node's ``ibnetdiscover``; InvalidRequest says why not."""
        if not FABRIC_NAME.match(fabric):
            raise InvalidRequest(f"fabric: {fabric[:70]!r} is not a name (letters, digits, "
                                 "'.', '_', '-'; at most 64)")
        source = f"ibnetdiscover of fabric {fabric}"
        try:
            scan = await asyncio.get_running_loop().run_in_executor(
                self._executor, parse_ibnetdiscover, text, source)
        except TopologyParseError as exc:
            await self._conductor.record(node_id, "fabric_rejected", actor="agent",
                                         reason=str(exc), level=logging.WARNING)
            raise InvalidRequest(str(exc)) from None
        saved = await self._repo.save(fabric, text, reporter_node_id=node_id,
                                      max_per_reporter=self._max_per_node)
        accepted = _summary(fabric, scan, saved.sha256)
        await self._conductor.record(
            node_id, "fabric_reported", actor="agent",
            reason=f"fabric {fabric}: {accepted.switches} switches, {accepted.cas} CAs, "
                   f"{accepted.links} links (sha256 {saved.sha256[:12]})")
        return accepted


def _summary(fabric: str, scan: IbScan, digest: str) -> FabricAccepted:
    switches = sum(1 for n in scan.nodes if n.kind is NodeKind.SWITCH)
    cas = sum(1 for n in scan.nodes if n.kind is NodeKind.CA)
    return FabricAccepted(fabric, switches, cas, len(scan.links), digest)
