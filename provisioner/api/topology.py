"""``GET /api/v1/topology``: the live fabric topology (switches and tiers, NVLink domains,
each node's place, link-health issues, what was published and when)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from provisioner.api import TOPOLOGY
from provisioner.api.nodes import PREFIX
from provisioner.api.openapi import Route
from provisioner.api.schemas import respond
from provisioner.api.schemas_topology import TopologyOut, topology_out
from provisioner.domain import Role


async def show_topology(request: web.Request) -> web.Response:
    live = request.app.get(TOPOLOGY)
    if live is None:
        raise web.HTTPServiceUnavailable(text="the live topology is not running in this daemon")
    return respond(topology_out(await live.view()))


ROUTES: Final = (
    Route("GET", f"{PREFIX}/topology", show_topology,
          "The live fabric topology: switches and tiers, NVLink domains, each node's leaf "
          "and domain, link-health issues, the last publication", Role.VIEWER, TopologyOut,
          errors=(503,)),
)
