"""Fabric scans posted by nodes (``POST /agent/v1/fabric``): parsed at once, stored, and
recorded in the reporting node's history.

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

from provisioner.errors import InvalidRequest
from provisioner.lifecycle.conductor import Conductor
from provisioner.store.topology import TopologyRepo
from provisioner.topology.model import IbScan, NodeKind, TopologyParseError
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover

log = logging.getLogger(__name__)
FABRIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_FABRIC = "default"


@dataclass(frozen=True, slots=True)
class FabricAccepted:
    fabric: str
    switches: int
    cas: int
    links: int
    sha256: str


class FabricReports:
    def __init__(self, conductor: Conductor, repo: TopologyRepo, *,
                 executor: Executor | None = None) -> None:
        self._conductor = conductor
        self._repo = repo
        self._executor = executor

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
        saved = await self._repo.save(fabric, text, reporter_node_id=node_id)
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
