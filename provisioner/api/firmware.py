"""The fleet's firmware, BIOS and BMC settings drift and firmware waves (issue 25):
``GET /api/v1/firmware/drift``,
``POST /api/v1/firmware/waves`` (start), ``GET …/waves``, ``GET …/waves/{id}``, ``POST
…/waves/{id}/stop``. Drift is read from each node's FirmwareInventory, BIOS attributes and
BMC settings as last read (``lifecycle.drift``); a wave is driven by the ``fleet``
singleton's leader."""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from provisioner.api import CONDUCTOR, NODES, WAVES, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import parse_json, respond
from provisioner.domain import Role
from provisioner.errors import InvalidRequest
from provisioner.lifecycle.drift import by_status, keep, read_fleet
from provisioner.lifecycle.waves import WaveDriver
from provisioner.store.waves import Wave, WaveRepo

PREFIX: Final = "/api/v1/firmware"
Status = Literal["conforming", "drifted", "updating", "failed", "unknown"]


class DriftQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = Field(None, max_length=128)
    rack: str | None = Field(None, max_length=128)
    domain: str | None = Field(None, max_length=128, description="NVLink domain (clique)")
    status: Status | None = None


class DifferenceOut(BaseModel):
    component: str = Field(description="FirmwareInventory Id (the baseline's pattern where "
                                       "the BMC reported no such component); for a BIOS or "
                                       "BMC setting, its name")
    have: str = Field(description="the version (or the setting's value) the BMC reported; "
                                  "'' when none")
    want: str
    kind: Literal["firmware", "bios", "bmc"] = Field(
        "firmware", description="firmware: a component's version; bios: a BIOS attribute; "
        "bmc: a BMC setting")


class DriftNodeOut(BaseModel):
    id: str
    name: str
    profile: str
    rack: str | None
    domain: str | None
    state: str
    status: Status = Field(description="over the firmware, BIOS and BMC settings baselines "
                           "the profile has")
    read_at: str | None = Field(description="when the FirmwareInventory was last read")
    differences: list[DifferenceOut]
    firmware_status: Status | None = Field(None, description="null: no firmware baseline")
    bios_status: Status | None = Field(None, description="null: no BIOS baseline")
    bmc_status: Status | None = Field(None, description="null: no BMC settings baseline")
    bios_read_at: str | None = None
    bmc_read_at: str | None = None


class DriftOut(BaseModel):
    counts: dict[str, int] = Field(description="nodes per status")
    profiles: dict[str, dict[str, int]] = Field(description="profile -> status -> nodes")
    drifted: list[DriftNodeOut] = Field(description="the drifted nodes, with each component "
                                                    "they have against the one they want")
    nodes: list[DriftNodeOut] = Field(description="every node that matched the filters")


class WaveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(min_length=1, max_length=128)
    runbook: str | None = Field(None, min_length=1, max_length=64,
                                description="default: the profile's wave_runbook")
    max_nodes: int = Field(1, ge=1, le=10_000, description="nodes serviced at once")
    max_domain_share: float = Field(0.25, gt=0, le=1, description="of one NVLink domain, "
                                    "at any moment (at least one node)")
    max_rack_share: float = Field(0.25, gt=0, le=1, description="of one rack, at any moment")
    stop_after_failures: int = Field(1, ge=1, description="no node started once this many "
                                     "of the wave's failed")


class WaveNodeOut(BaseModel):
    id: str
    name: str
    status: str = Field(description="pending, starting, running, passed, failed, skipped")
    domain: str | None
    rack: str | None


class WaveOut(BaseModel):
    id: str
    profile: str
    runbook: str
    status: Literal["running", "stopped", "failed", "done"]
    reason: str
    max_nodes: int
    max_domain_share: float
    max_rack_share: float
    stop_after_failures: int
    failures: int
    counts: dict[str, int] = Field(description="the wave's nodes per status")
    nodes: list[WaveNodeOut]
    started_by: str
    created_at: datetime | None
    finished_at: datetime | None


class WaveList(BaseModel):
    items: list[WaveOut]


def wave_out(wave: Wave) -> WaveOut:
    counts: dict[str, int] = {}
    for entry in wave.nodes.values():
        counts[entry.status] = counts.get(entry.status, 0) + 1
    return WaveOut(
        id=wave.id, profile=wave.profile, runbook=wave.runbook,
        status=wave.status,
        reason=wave.reason, max_nodes=wave.max_nodes, max_domain_share=wave.max_domain_share,
        max_rack_share=wave.max_rack_share, stop_after_failures=wave.stop_after_failures,
        failures=wave.failures, counts=counts, started_by=wave.started_by,
        nodes=[WaveNodeOut(id=i, name=w.name, status=w.status, domain=w.domain, rack=w.rack)
               for i, w in sorted(wave.nodes.items(), key=lambda kv: kv[1].name)],
        created_at=wave.created_at, finished_at=wave.finished_at)


async def drift(request: web.Request) -> web.Response:
    query = DriftQuery.model_validate(dict(request.query))
    fleet = keep(await read_fleet(request.app[NODES], request.app[CONDUCTOR].servicing),
                 profile=query.profile, rack=query.rack, domain=query.domain,
                 status=query.status)
    rows = [DriftNodeOut(id=f.node_id, name=f.name, profile=f.profile, rack=f.rack,
                         domain=f.domain, state=f.state,
                         status=f.status,
                         read_at=f.read_at,
                         differences=[DifferenceOut(component=d.component, have=d.have,
                                                    want=d.want, kind=d.kind)
                                      for d in f.differences],
                         firmware_status=f.firmware_status,
                         bios_status=f.bios_status,
                         bmc_status=f.bmc_status,
                         bios_read_at=f.bios_read_at, bmc_read_at=f.bmc_read_at)
            for f in fleet]
    profiles = {p: dict(by_status([f for f in fleet if f.profile == p]))
                for p in sorted({f.profile for f in fleet})}
    return respond(DriftOut(counts=dict(by_status(fleet)), profiles=profiles, nodes=rows,
                            drifted=[r for r in rows if r.status == "drifted"]))


def _driver(request: web.Request) -> WaveDriver:
    found = request.app.get(WAVES)
    if found is None:
        raise InvalidRequest("firmware waves are not available in this daemon")
    return found


def _repo(request: web.Request) -> WaveRepo:
    return _driver(request).repo


async def start_wave(request: web.Request) -> web.Response:
    body = WaveRequest.model_validate(parse_json(await request.read()))
    wave = await _driver(request).start(
        body.profile, actor=actor(request), runbook=body.runbook, max_nodes=body.max_nodes,
        max_domain_share=body.max_domain_share, max_rack_share=body.max_rack_share,
        stop_after_failures=body.stop_after_failures)
    return respond(wave_out(wave), status=201)


async def list_waves(request: web.Request) -> web.Response:
    return respond(WaveList(items=[wave_out(w) for w in await _repo(request).list()]))


async def show_wave(request: web.Request) -> web.Response:
    return respond(wave_out(await _repo(request).get(request.match_info["id"])))


async def stop_wave(request: web.Request) -> web.Response:
    wave = await _repo(request).stop(request.match_info["id"], actor=actor(request))
    return respond(wave_out(wave))


_ID: Final = ("id", "the wave's id")

ROUTES: Final = (
    Route("GET", f"{PREFIX}/drift", drift,
          "Each node's firmware (its FirmwareInventory as last read) against its profile's "
          "baseline: counts per status and per profile, the drifted nodes with component, "
          "have and want", Role.VIEWER, DriftOut, query=DriftQuery, errors=(422,)),
    Route("POST", f"{PREFIX}/waves", start_wave,
          "Start a firmware wave: the profile's drifted active nodes back to the baseline "
          "through its runbook, at most max_nodes at once and a share of one NVLink domain "
          "or rack, stopped after stop_after_failures failures", Role.OPERATOR, WaveOut,
          status=201, body=WaveRequest, errors=(400, 409, 413, 422)),
    Route("GET", f"{PREFIX}/waves", list_waves, "Firmware waves, newest first", Role.VIEWER,
          WaveList),
    Route("GET", f"{PREFIX}/waves/{{id}}", show_wave, "A firmware wave and its nodes",
          Role.VIEWER, WaveOut, path_params=(_ID,), errors=(404,)),
    Route("POST", f"{PREFIX}/waves/{{id}}/stop", stop_wave,
          "Stop a wave: no node is started after it (those being serviced finish)",
          Role.OPERATOR, WaveOut, body_required=False, path_params=(_ID,), errors=(404, 409)),
)
