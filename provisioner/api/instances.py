"""``GET /api/v1/instances``: the live daemons sharing this database (several daemons on one
PostgreSQL, docs/ha.md), how many node leases each holds, and which one leads the
fleet-wide singletons."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from aiohttp import web
from pydantic import BaseModel

from provisioner.api import OWNERSHIP
from provisioner.api.nodes import PREFIX
from provisioner.api.openapi import Route
from provisioner.api.schemas import respond
from provisioner.domain import Role


class InstanceOut(BaseModel):
    id: str
    api_listen: str
    started_at: datetime
    heartbeat_at: datetime
    leases: int  # nodes whose in-flight step it drives now
    singletons: list[str]  # the singletons it leads ("fleet": topology, syncs, sweeps)
    this: bool  # the daemon that answered


class InstancesOut(BaseModel):
    items: list[InstanceOut]
    singleton_holder: str | None  # the instance leading "fleet", None between two leaders
    lease_s: float


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


async def list_instances(request: web.Request) -> web.Response:
    own = request.app.get(OWNERSHIP)
    if own is None:
        raise web.HTTPServiceUnavailable(text="this daemon runs without leases")
    items = [InstanceOut(id=i.id, api_listen=i.api_listen, started_at=_utc(i.started_at),
                         heartbeat_at=_utc(i.heartbeat_at), leases=i.leases,
                         singletons=list(i.singletons), this=i.id == own.instance)
             for i in await own.instances()]
    holder = next((i.id for i in items if "fleet" in i.singletons), None)
    return respond(InstancesOut(items=items, singleton_holder=holder, lease_s=own.lease_s))


ROUTES: Final = (
    Route("GET", f"{PREFIX}/instances", list_instances,
          "The live daemons on this database, their node leases and the singleton holder",
          Role.VIEWER, InstancesOut, errors=(503,)),
)
