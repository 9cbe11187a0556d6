"""A small Redfish BMC for BMC (manager) settings (aiohttp, in-process, basic auth), built
from a recorded Dell iDRAC (tests/fixtures/redfish-bmc-settings): its Manager, its
``NetworkProtocol``, its three ``DellAttributes`` resources with their ``Settings`` objects
(``SupportedApplyTimes`` Immediate and AtMaintenanceWindowStart, as recorded), the
``ManagerAttributeRegistry`` file entry and Dell's sample manager attribute registry at the
entry's ``Location``. What a recording cannot show, it adds as the iDRAC behaves:

* a PATCH naming an attribute the resource does not have, or a NetworkProtocol section or
  property it does not have, is refused (400) and changes nothing;
* ``Immediate`` takes effect at once; ``OnReset`` (offered when ``apply_times`` says so)
  waits for ``Manager.Reset``, after which the BMC answers ``down_after_reset`` requests
  with 503 (it is restarting);
* a change to ``NetworkProtocol`` makes the BMC answer ``down_after_protocol`` requests
  with 503 (it restarts its network services);
* ``ignored`` names are accepted and never take effect (a BMC that drops a setting).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.sim.basic_auth import basic_auth_ok

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish-bmc-settings"
MANAGER = "/redfish/v1/Managers/iDRAC.Embedded.1"
DELL = f"{MANAGER}/Oem/Dell/DellAttributes"
REGISTRY_FILE = "/redfish/v1/Registries/ManagerAttributeRegistry"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@dataclass
class ManagerSim:
    user: str = "admin"
    password: str = "password"
    with_attributes: bool = True  # False: no DellAttributes links (standard resources only)
    apply_times: list[str] | None = None  # None: as recorded
    down_after_reset: int = 2
    down_after_protocol: int = 0
    ignored: set[str] = field(default_factory=set)
    manager: dict[str, Any] = field(default_factory=lambda: _load("manager.json"))
    protocol: dict[str, Any] = field(default_factory=lambda: _load("network_protocol.json"))
    attributes: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        d["@odata.id"]: d for d in (_load("attributes_idrac.json"),
                                    _load("attributes_system.json"),
                                    _load("attributes_lc.json"))})
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)
    down: int = 0
    refused: int = 0  # requests answered 503 while down

    def value(self, name: str) -> Any:
        for resource in self.attributes.values():
            if name in resource["Attributes"]:
                return resource["Attributes"][name]
        raise KeyError(name)


SIM = web.AppKey("manager_sim", ManagerSim)


def _error(message: str, status: int = 400, message_id: str = "Base.1.8.GeneralError"
           ) -> web.Response:
    return web.json_response({"error": {"code": message_id, "message": message,
                                        "@Message.ExtendedInfo": [
                                            {"MessageId": message_id, "Message": message}]}},
                             status=status)


@web.middleware
async def _gate(request: web.Request, handler: Any) -> web.StreamResponse:
    sim = request.app[SIM]
    if sim.down > 0:
        sim.down -= 1
        sim.refused += 1
        return _error("the BMC is restarting", 503)
    if request.path.rstrip("/") != "/redfish/v1" and \
            not basic_auth_ok(request, sim.user, sim.password):
        return _error("unauthorized", 401)
    response: web.StreamResponse = await handler(request)
    return response


async def root(_request: web.Request) -> web.Response:
    return web.json_response({"@odata.id": "/redfish/v1/", "RedfishVersion": "1.11.0",
                              "Managers": {"@odata.id": "/redfish/v1/Managers"},
                              "Registries": {"@odata.id": "/redfish/v1/Registries"}})


async def managers(_request: web.Request) -> web.Response:
    return web.json_response({"@odata.id": "/redfish/v1/Managers",
                              "Members": [{"@odata.id": MANAGER}]})


async def manager(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    if request.method == "PATCH":
        body = await request.json()
        sim.patches.append((request.path, body))
        unknown = sorted(set(body) - {"DateTimeLocalOffset"})
        if unknown:
            return _error(f"The property {unknown[0]} is not in the list of valid "
                          "properties for the resource.", 400, "Base.1.8.PropertyUnknown")
        sim.manager.update(body)
        return web.Response(status=204)
    shown = copy.deepcopy(sim.manager)
    if not sim.with_attributes:
        shown["Links"].pop("Oem", None)
    return web.json_response(shown)


async def network_protocol(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    if request.method == "GET":
        return web.json_response(sim.protocol)
    body = await request.json()
    sim.patches.append((request.path, body))
    for proto, values in body.items():
        section = sim.protocol.get(proto)
        if not isinstance(section, dict) or not isinstance(values, dict):
            return _error(f"The property {proto} is not in the list of valid properties "
                          "for the resource.", 400, "Base.1.8.PropertyUnknown")
        for prop, value in values.items():
            if prop not in section:
                return _error(f"The property {prop} is not in the list of valid "
                              "properties for the resource.", 400, "Base.1.8.PropertyUnknown")
            slots = section.get(prop)
            if prop == "NTPServers" and isinstance(slots, list) and len(value) > len(slots):
                return _error(f"The value for {prop} is out of range.", 400,
                              "Base.1.8.PropertyValueOutOfRange")
    for proto, values in body.items():
        for prop, value in values.items():
            if f"NetworkProtocol.{proto}.{prop}" in sim.ignored:
                continue
            if prop == "NTPServers":  # iDRAC keeps its three slots, "" where unset
                slots = len(sim.protocol[proto][prop])
                value = (list(value) + [""] * slots)[:slots]
            sim.protocol[proto][prop] = value
    sim.down = sim.down_after_protocol
    return web.Response(status=204)


def _resource(sim: ManagerSim, fqdd: str) -> dict[str, Any] | None:
    found = sim.attributes.get(f"{DELL}/{fqdd}")
    if found is None:
        return None
    shown = copy.deepcopy(found)
    if sim.apply_times is not None:
        shown["@Redfish.Settings"]["SupportedApplyTimes"] = list(sim.apply_times)
    return shown


async def attributes(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    shown = _resource(sim, request.match_info["fqdd"]) if sim.with_attributes else None
    if shown is None:
        return _error("resource not found", 404, "Base.1.8.ResourceMissingAtURI")
    return web.json_response(shown)


async def attribute_settings(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    uri = f"{DELL}/{request.match_info['fqdd']}"
    resource = sim.attributes.get(uri)
    if resource is None or not sim.with_attributes:
        return _error("resource not found", 404, "Base.1.8.ResourceMissingAtURI")
    if request.method == "GET":  # the recorded System Settings object, re-pointed
        shown = {**_load("attributes_system_settings.json"), "@odata.id": f"{uri}/Settings"}
        return web.json_response({**shown, "Attributes": sim.pending.get(uri, {})})
    body = await request.json()
    sim.patches.append((request.path, body))
    changes = body.get("Attributes") or {}
    unknown = sorted(set(changes) - set(resource["Attributes"]))
    if unknown:
        return _error(f"The property {unknown[0]} is not in the list of valid properties "
                      "for the resource.", 400, "Base.1.8.PropertyUnknown")
    when = (body.get("@Redfish.SettingsApplyTime") or {}).get("ApplyTime", "")
    offered = (sim.apply_times if sim.apply_times is not None
               else resource["@Redfish.Settings"]["SupportedApplyTimes"])
    if when and when not in offered:
        return _error(f"The value {when} for ApplyTime is not supported.", 400,
                      "Base.1.8.PropertyValueNotInList")
    taken = {k: v for k, v in changes.items() if k not in sim.ignored}
    if when == "Immediate" or (not when and "Immediate" in offered):
        resource["Attributes"].update(taken)
    else:
        sim.pending.setdefault(uri, {}).update(taken)
    return web.Response(status=200 if when == "Immediate" else 202)


async def reset(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    kind = (await request.json()).get("ResetType")
    allowed = sim.manager["Actions"]["#Manager.Reset"]["ResetType@Redfish.AllowableValues"]
    if kind not in allowed:
        return _error(f"The value {kind} for ResetType is not in the list of acceptable "
                      "values.", 400, "Base.1.8.ActionParameterValueNotInList")
    sim.resets.append(kind)
    for uri, changes in sim.pending.items():
        sim.attributes[uri]["Attributes"].update(changes)
    sim.pending.clear()
    sim.down = sim.down_after_reset
    return web.Response(status=204)


async def registries(_request: web.Request) -> web.Response:
    return web.json_response(_load("registries.json"))


async def registry_file(_request: web.Request) -> web.Response:
    return web.json_response(_load("registry_file_manager.json"))


async def registry(_request: web.Request) -> web.Response:
    return web.json_response(_load("manager_attribute_registry.json"))


def make_app(sim: ManagerSim) -> web.Application:
    app = web.Application(middlewares=[_gate])
    app[SIM] = sim
    for path in ("/redfish/v1", "/redfish/v1/"):
        app.router.add_get(path, root)
    app.router.add_get("/redfish/v1/Managers", managers)
    app.router.add_route("*", MANAGER, manager)
    app.router.add_route("*", f"{MANAGER}/NetworkProtocol", network_protocol)
    app.router.add_get(DELL + "/{fqdd}", attributes)
    app.router.add_route("*", DELL + "/{fqdd}/Settings", attribute_settings)
    app.router.add_post(f"{MANAGER}/Actions/Manager.Reset", reset)
    app.router.add_get("/redfish/v1/Registries", registries)
    app.router.add_get(REGISTRY_FILE, registry_file)
    app.router.add_get(f"{REGISTRY_FILE}/ManagerAttributeRegistry.v1_0_0.json", registry)
    return app
