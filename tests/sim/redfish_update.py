"""A small Redfish BMC for servicing (aiohttp, in-process, basic auth), for what sushy-tools'
fake driver cannot do: a ``Bios`` resource with pending ``Settings`` applied at the next
reset, its attribute registry under ``/redfish/v1/Registries`` (sushy-tools' own registry,
tests/fixtures/redfish-servicing), ``UpdateService/FirmwareInventory``, ``SimpleUpdate`` and
(``multipart = True``) a ``MultipartHttpPushUri`` shaped as OpenBMC's bmcweb offers and
parses it, each update's task running over a few polls, and the faults real BMCs show: a
task that disappears (404), one that never progresses, one that ends in ``Exception`` with
the BMC's message; with ``redfish_storage.attach_storage``, DMTF's ``Storage``/``Volumes``
mockup besides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import BodyPartReader, web

from tests.sim.basic_auth import basic_auth_ok
from tests.sim.redfish_storage import STORAGE, STORAGE_SIM

SYSTEM = "/redfish/v1/Systems/1"
BIOS = f"{SYSTEM}/Bios"
REGISTRY = (Path(__file__).resolve().parents[1] / "fixtures" / "redfish-servicing"
            / "bios_registry.json")
TASKS = "/redfish/v1/TaskService/Tasks"
PUSH = "/redfish/v1/UpdateService/update-multipart"  # bmcweb's MultipartHttpPushUri


@dataclass
class UpdateSim:
    user: str = "admin"
    password: str = "password"
    power: str = "Off"
    bios: dict[str, Any] = field(default_factory=lambda: {
        "ProcTurboMode": "Disabled", "BootMode": "Bios", "QuietBoot": False, "NumCores": 10})
    pending: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=lambda: {
        "BIOS": "1.0.0", "BMC": "5.10", "NIC.Slot.1": "22.31.6"})
    task_polls: int = 2  # polls a task answers Running before Completed
    task_fault: str = ""  # "", "vanish", "stall", "exception"
    hold: asyncio.Event | None = None  # while set-able and unset, tasks stay Running
    # while set-able and unset, SimpleUpdate makes its task, then keeps its answer back (a
    # daemon that dies in that window never hears the task's URI)
    answer_hold: asyncio.Event | None = None
    # likewise for ComputerSystem.Reset: the machine resets, the answer is kept back
    reset_hold: asyncio.Event | None = None
    fetch_images: bool = False  # fetch ImageURI as a BMC does; a failed transfer fails the task
    # what the UpdateService offers: SimpleUpdate (with these TransferProtocol values), a
    # MultipartHttpPushUri (bmcweb's shape: tests/fixtures/redfish-servicing/README.md)
    simple_protocols: list[str] | None = field(default_factory=lambda: ["HTTP", "HTTPS"])
    multipart: bool = False
    max_image_bytes: int = 64 << 20
    pushes: list[dict[str, Any]] = field(default_factory=list)  # each push as it arrived
    # while set-able and unset, a push waits before reading its body; a client gone by
    # then leaves a broken upload: no task, counted in ``broken``
    push_hold: asyncio.Event | None = None
    arrived: int = 0  # pushes whose request reached the BMC
    broken: int = 0
    fetched: dict[str, bytes] = field(default_factory=dict)  # ImageURI -> the bytes it got
    updates: list[dict[str, Any]] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)


SIM = web.AppKey("update_sim", UpdateSim)


def _json(body: dict[str, Any], status: int = 200, **headers: str) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def _error(message: str, status: int = 400) -> web.Response:
    return _json({"error": {"code": "Base.1.8.GeneralError", "message": message}}, status)


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    sim = request.app[SIM]
    if request.path.rstrip("/") != "/redfish/v1" and \
            not basic_auth_ok(request, sim.user, sim.password):
        return _error("unauthorized", 401)
    response: web.StreamResponse = await handler(request)
    return response


async def root(_request: web.Request) -> web.Response:
    return _json({"@odata.id": "/redfish/v1/", "RedfishVersion": "1.15.0",
                  "Systems": {"@odata.id": "/redfish/v1/Systems"},
                  "Registries": {"@odata.id": "/redfish/v1/Registries"},
                  "UpdateService": {"@odata.id": "/redfish/v1/UpdateService"},
                  "Tasks": {"@odata.id": "/redfish/v1/TaskService"}})


async def task_service(_request: web.Request) -> web.Response:
    return _json({"@odata.id": "/redfish/v1/TaskService", "Id": "TaskService",
                  "Tasks": {"@odata.id": TASKS}})


async def tasks(request: web.Request) -> web.Response:
    ids = [*request.app[SIM].tasks, *(request.app[STORAGE_SIM].tasks
                                      if STORAGE_SIM in request.app else ())]
    return _json({"@odata.id": TASKS, "Members": [{"@odata.id": f"{TASKS}/{tid}"}
                                                  for tid in ids]})


async def systems(_request: web.Request) -> web.Response:
    return _json({"Members": [{"@odata.id": SYSTEM}]})


async def system(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    storage = {"Storage": {"@odata.id": STORAGE}} if STORAGE_SIM in request.app else {}
    return _json({**storage, "@odata.id": SYSTEM, "Id": "1", "PowerState": sim.power,
                  "BiosVersion": sim.versions["BIOS"], "Bios": {"@odata.id": BIOS},
                  "Actions": {"#ComputerSystem.Reset": {
                      "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                      "ResetType@Redfish.AllowableValues": ["On", "ForceOff",
                                                            "ForceRestart"]}}})


async def reset(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    kind = (await request.json()).get("ResetType")
    sim.resets.append(kind)
    if kind not in ("On", "ForceOff", "ForceRestart"):
        return _error(f"ResetType {kind} not supported")
    sim.power = "Off" if kind == "ForceOff" else "On"
    if kind in ("On", "ForceRestart") and STORAGE_SIM in request.app:
        request.app[STORAGE_SIM].reset()
    if kind in ("On", "ForceRestart") and sim.pending:  # the BIOS applies pending settings
        sim.bios.update(sim.pending)
        sim.pending.clear()
    if sim.reset_hold is not None:
        await sim.reset_hold.wait()
    return web.Response(status=204)


async def bios(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    return _json({"@odata.id": BIOS, "Id": "BIOS",
                  "AttributeRegistry": "BiosAttributeRegistryP89.v1_0_0",
                  "Attributes": sim.bios,
                  "@Redfish.Settings": {"SettingsObject": {"@odata.id": f"{BIOS}/Settings"},
                                        "SupportedApplyTimes": ["OnReset"]}},
                 ETag='W/"bios"')


async def bios_settings(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    if request.method == "GET":
        return _json({"@odata.id": f"{BIOS}/Settings", "Attributes": sim.pending},
                     ETag='W/"pending"')
    body = await request.json()
    sim.patches.append(body)
    sim.pending.update(body.get("Attributes", {}))
    return web.Response(status=204)


async def registries(_request: web.Request) -> web.Response:
    return _json({"Members": [{"@odata.id": "/redfish/v1/Registries/BiosAttributeRegistry"}]})


async def registry_file(_request: web.Request) -> web.Response:
    return _json({"Id": "BiosAttributeRegistry", "Registry": "BiosAttributeRegistryP89.v1_0_0",
                  "Location": [{"Language": "en", "Uri": "/redfish/v1/Registries/Bios/en"}]})


async def registry(_request: web.Request) -> web.Response:
    return _json(json.loads(REGISTRY.read_text()))


async def update_service(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    body: dict[str, Any] = {
        "@odata.id": "/redfish/v1/UpdateService", "@odata.type":
        "#UpdateService.v1_11_1.UpdateService", "Id": "UpdateService", "ServiceEnabled": True,
        "FirmwareInventory": {"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory"}}
    if sim.simple_protocols is not None:
        body["Actions"] = {"#UpdateService.SimpleUpdate": {
            "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            "TransferProtocol@Redfish.AllowableValues": sim.simple_protocols}}
    if sim.multipart:  # as bmcweb's handleUpdateServiceGet answers
        body |= {"HttpPushUri": "/redfish/v1/UpdateService/update",
                 "MultipartHttpPushUri": PUSH, "MaxImageSizeBytes": sim.max_image_bytes,
                 "MultipartHttpPushUri@Redfish.OperationApplyTimeSupport": {
                     "@odata.type": "#Settings.v1_3_3.OperationApplyTimeSupport",
                     "SupportedValues": ["OnReset", "Immediate"]}}
    return _json(body)


async def inventory(request: web.Request) -> web.Response:
    return _json({"Members": [{"@odata.id": f"/redfish/v1/UpdateService/FirmwareInventory/{c}"}
                              for c in request.app[SIM].versions]})


async def component(request: web.Request) -> web.Response:
    cid = request.match_info["cid"]
    version = request.app[SIM].versions.get(cid)
    if version is None:
        return _error("no such component", 404)
    return _json({"@odata.id": f"/redfish/v1/UpdateService/FirmwareInventory/{cid}",
                  "Id": cid, "Name": cid, "Version": version, "Updateable": True})


async def simple_update(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    body = await request.json()
    sim.updates.append(body)
    if not body.get("ImageURI") or not body.get("Targets"):
        return _error("Missing ImageURI and/or Targets.")
    target = str(body["Targets"][0]).rsplit("/", 1)[-1]
    if target not in sim.versions:
        return _error(f"unknown target {target}")
    tid = _new_task(sim, target, str(body["ImageURI"]), {
        "HttpOperation": "POST", "JsonBody": json.dumps(body),
        "TargetUri": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"})
    if sim.fetch_images:
        uri = str(body["ImageURI"])
        async with aiohttp.ClientSession() as session, session.get(uri) as got:
            if got.status == 200:
                sim.fetched[uri] = await got.read()
            else:  # DMTF's Update registry: TransferFailed, "The transfer of the image
                # '%1' to '%2' failed."
                sim.tasks[tid]["transfer"] = (f"The transfer of the image '{uri}' to "
                                              f"'{target}' failed.")
    if sim.answer_hold is not None:
        await sim.answer_hold.wait()
    return web.Response(status=202, headers={"Location": f"{TASKS}/{tid}"})


def _new_task(sim: UpdateSim, target: str, image: str, payload: dict[str, Any]) -> str:
    version = image.rsplit("/", 1)[-1].removesuffix(".bin").split("-")[-1]
    tid = str(len(sim.tasks) + 1)
    sim.tasks[tid] = {"target": target, "version": version, "polls": 0,
                      "payload": payload, "transfer": ""}
    return tid


async def push(request: web.Request) -> web.Response:
    """A multipart push as bmcweb takes it (``updateMultipartContext``): the parts found by
    their Content-Disposition name, ``UpdateParameters`` JSON with at most one target (a
    FirmwareInventory member), ``UpdateFile`` required; the image streamed, its size and
    sha256 kept; answered 202 with the Task in the body, its monitor in ``Location``."""
    sim = request.app[SIM]
    seen: dict[str, Any] = {"parts": [], "size": 0, "chunks": 0}
    digest = hashlib.sha256()
    sim.arrived += 1
    if sim.push_hold is not None:
        await sim.push_hold.wait()
    try:
        return await _parse_push(request, sim, seen, digest)
    except (aiohttp.ClientError, ConnectionError, asyncio.CancelledError):
        sim.broken += 1  # the upload broke off (the server cancels its handler when the
        # client goes): a BMC discards it, makes no task
        raise


async def _parse_push(request: web.Request, sim: UpdateSim, seen: dict[str, Any],
                      digest: Any) -> web.Response:
    async for part in await request.multipart():
        if not isinstance(part, BodyPartReader):
            return _error("nested multipart not supported")
        seen["parts"].append((part.name, part.headers.get("Content-Type")))
        if part.name == "UpdateParameters":
            seen["parameters"] = json.loads(await part.text())
        elif part.name == "UpdateFile":
            seen["filename"] = part.filename
            while chunk := await part.read_chunk(1 << 16):
                digest.update(chunk)
                seen["size"] += len(chunk)
                seen["chunks"] += 1
    seen["sha256"] = digest.hexdigest()
    sim.pushes.append(seen)
    if "filename" not in seen:  # bmcweb: messages::propertyMissing(res, "UpdateFile")
        return _error("The property UpdateFile is a required property and must be included "
                      "in the request.")
    targets = seen.get("parameters", {}).get("Targets") or []
    cid = str(targets[0]).rsplit("/", 1)[-1] if len(targets) == 1 else ""
    if cid not in sim.versions:  # bmcweb: messages::propertyValueFormatError(.., "Targets")
        return _error(f"The value '{targets}' for the property Targets is not a format that "
                      "the property can accept.")
    tid = _new_task(sim, cid, str(seen["filename"]), {
        "HttpOperation": "POST", "TargetUri": PUSH, "JsonBody": "",
        "HttpHeaders": [f"Content-Length: {request.content_length}"]})
    if sim.answer_hold is not None:
        await sim.answer_hold.wait()
    return web.json_response({"@odata.id": f"{TASKS}/{tid}", "@odata.type": "#Task.v1_4_3.Task",
                              "Id": tid, "TaskState": "Running", "TaskStatus": "OK",
                              "Name": f"Task {tid}", "Messages": []}, status=202, headers={
        "Location": f"/redfish/v1/TaskService/TaskMonitors/{tid}", "Retry-After": "30"})


async def task(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    tid = request.match_info["tid"]
    if STORAGE_SIM in request.app and (staged := request.app[STORAGE_SIM].task(tid)):
        return _json(staged)
    state = sim.tasks.get(tid)
    if state is None or sim.task_fault == "vanish":
        if state is not None:
            sim.versions[state["target"]] = state["version"]  # it did finish, then forgot
        return _error("task not found", 404)
    # as the DMTF Task schema and real BMCs give it: the request that made the task
    body = {"@odata.id": f"{TASKS}/{tid}", "Id": tid, "Payload": state["payload"]}
    if sim.task_fault == "stall" or (sim.hold is not None and not sim.hold.is_set()):
        return _json({**body, "TaskState": "Running", "PercentComplete": 10})
    state["polls"] += 1
    if state["polls"] <= sim.task_polls:
        return _json({**body, "TaskState": "Running",
                      "PercentComplete": 100 * state["polls"] // (sim.task_polls + 1)})
    if state.get("transfer"):
        return _json({**body, "TaskState": "Exception", "TaskStatus": "Critical",
                      "Messages": [{"MessageId": "Update.1.0.TransferFailed",
                                    "Message": state["transfer"]}]})
    if sim.task_fault == "exception":
        return _json({**body, "TaskState": "Exception", "TaskStatus": "Critical",
                      "Messages": [{"MessageId": "Update.1.0.VerificationFailed",
                                    "Message": "Verification of image 'bios.bin' at "
                                               "'BIOS' failed."}]})
    sim.versions[state["target"]] = state["version"]
    return _json({**body, "TaskState": "Completed", "TaskStatus": "OK",
                  "PercentComplete": 100})


def make_app(sim: UpdateSim) -> web.Application:
    app = web.Application(middlewares=[_auth])
    app[SIM] = sim
    for path in ("/redfish/v1", "/redfish/v1/"):
        app.router.add_get(path, root)
    app.router.add_get("/redfish/v1/Systems", systems)
    app.router.add_get(SYSTEM, system)
    app.router.add_post(f"{SYSTEM}/Actions/ComputerSystem.Reset", reset)
    app.router.add_get(BIOS, bios)
    app.router.add_route("*", f"{BIOS}/Settings", bios_settings)
    app.router.add_get("/redfish/v1/Registries", registries)
    app.router.add_get("/redfish/v1/Registries/BiosAttributeRegistry", registry_file)
    app.router.add_get("/redfish/v1/Registries/Bios/en", registry)
    app.router.add_get("/redfish/v1/UpdateService", update_service)
    app.router.add_get("/redfish/v1/UpdateService/FirmwareInventory", inventory)
    app.router.add_get("/redfish/v1/UpdateService/FirmwareInventory/{cid}", component)
    app.router.add_post("/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                        simple_update)
    app.router.add_post(PUSH, push)
    app.router.add_get("/redfish/v1/TaskService", task_service)
    app.router.add_get(TASKS, tasks)
    app.router.add_get(TASKS + "/{tid}", task)
    return app
