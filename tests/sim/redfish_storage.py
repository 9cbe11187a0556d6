"""Redfish ``Storage`` for the servicing BMC (tests/sim/redfish_update.py): DMTF's public
mockup ``public-localstorage`` (tests/fixtures/redfish-storage: one RAID controller, four SAS
drives, three volumes) served as published, with what a static mockup cannot do: the
``Volumes`` collection accepts a POST (``Name``, ``RAIDType``, ``Links.Drives``; 201 and the
new volume's ``Location``) and a volume a DELETE (204), as sushy-tools' ``Volumes``
collection answers them. A POST naming a drive another volume holds, or an unknown drive, is
refused with DMTF's Base registry messages (``ResourceInUse``, ``ResourceMissingAtURI``).

With ``apply_times = ["OnReset"]`` the collection lists that apply time and each change
answers 202 with a task (``/redfish/v1/TaskService/Tasks/vol<n>``) that stays ``Pending``
until the host's next reset applies it, as BMCs that stage RAID changes for the next boot do.

``attach_storage(app)`` adds the routes and links the System to the collection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish-storage"
STORAGE = "/redfish/v1/Systems/437XR1138R2/Storage"
VOLUMES = f"{STORAGE}/1/Volumes"
TASKS = "/redfish/v1/TaskService/Tasks"


def _load() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(FIXTURES.glob("*.json")):
        body = json.loads(path.read_text())
        found[body["@odata.id"]] = body
    return found


@dataclass
class StorageSim:
    resources: dict[str, dict[str, Any]] = field(default_factory=_load)
    posts: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    # listed as the Volumes collection's @Redfish.OperationApplyTimeSupport; ["OnReset"]:
    # each change answers 202 with a task that stays Pending until the next reset applies it
    apply_times: list[str] = field(default_factory=list)
    pending: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> TaskState
    payloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> Payload
    resets: int = 0
    # (method, event): a change by that method makes its task, then keeps its answer back
    # until the event is set (a daemon that dies in that window never hears the task)
    hold: tuple[str, asyncio.Event] | None = None

    def reset(self) -> None:
        """The host's reset: the pending changes take effect, their tasks complete."""
        self.resets += 1
        for tid, uri, body in self.pending:
            if body:
                self.resources[uri] = body
            else:
                self.resources.pop(uri, None)
            self.tasks[tid] = "Completed"
        self.pending.clear()

    def task(self, tid: str) -> dict[str, Any] | None:
        state = self.tasks.get(tid)
        if state is None:
            return None
        return {"@odata.id": f"{TASKS}/{tid}", "Id": tid, "TaskState": state,
                "TaskStatus": "OK", "Payload": self.payloads[tid],
                **({"PercentComplete": 100} if state == "Completed" else {})}

    async def later(self, request: web.Request, uri: str,
                    body: dict[str, Any]) -> web.Response:
        """A change staged for the next reset: its task (the DMTF Task's ``Payload``: the
        request that made it, as bmcweb and other BMCs keep it)."""
        tid = f"vol{len(self.tasks) + 1}"
        self.tasks[tid] = "Pending"
        self.payloads[tid] = {"HttpOperation": request.method, "TargetUri": request.path,
                              "JsonBody": json.dumps(self.posts[-1]) if body else ""}
        self.pending.append((tid, uri, body))
        if self.hold is not None and self.hold[0] == request.method:
            await self.hold[1].wait()
        return web.Response(status=202, headers={"Location": f"{TASKS}/{tid}"})

    def volumes(self) -> list[dict[str, Any]]:
        return [body for uri, body in self.resources.items()
                if uri.startswith(VOLUMES + "/")]

    def held(self) -> dict[str, str]:
        return {d["@odata.id"]: v["@odata.id"] for v in self.volumes()
                for d in v.get("Links", {}).get("Drives", [])}


STORAGE_SIM = web.AppKey("storage_sim", StorageSim)


def _error(message_id: str, message: str, status: int) -> web.Response:
    return web.json_response({"error": {"code": "Base.1.8.GeneralError", "message": message,
                                        "@Message.ExtendedInfo": [{
                                            "MessageId": f"Base.1.8.{message_id}",
                                            "Message": message}]}}, status=status)


async def resource(request: web.Request) -> web.Response:
    sim = request.app[STORAGE_SIM]
    path = request.path.rstrip("/")
    if path == VOLUMES:
        return await _collection(request, sim)
    body = sim.resources.get(path)
    if body is None:
        return _error("ResourceMissingAtURI", f"The resource at the URI '{path}' was not "
                      "found.", 404)
    if request.method == "DELETE" and path.startswith(VOLUMES + "/"):
        sim.deletes.append(path)
        if sim.apply_times == ["OnReset"]:
            return await sim.later(request, path, {})
        del sim.resources[path]
        return web.Response(status=204)
    return web.json_response(body)


async def _collection(request: web.Request, sim: StorageSim) -> web.Response:
    if request.method == "GET":
        listed = dict(sim.resources[VOLUMES])
        members = [{"@odata.id": v["@odata.id"]} for v in sim.volumes()]
        times = {"@Redfish.OperationApplyTimeSupport": {
            "SupportedValues": sim.apply_times}} if sim.apply_times else {}
        return web.json_response(listed | times | {"Members": members,
                                                   "Members@odata.count": len(members)})
    body = await request.json()
    sim.posts.append(body)
    drives = [d.get("@odata.id") for d in body.get("Links", {}).get("Drives", [])]
    held = sim.held()
    for ref in drives:
        if ref not in sim.resources:
            return _error("ResourceMissingAtURI", f"The resource at the URI '{ref}' was not "
                          "found.", 400)
        if ref in held:
            return _error("ResourceInUse", "The change to the requested resource failed "
                          "because the resource is in use or in transition.", 409)
    ids = [int(v["Id"]) for v in sim.volumes() if str(v.get("Id", "")).isdigit()]
    vid = str(max(ids, default=0) + 1 + len(sim.pending))
    uri = f"{VOLUMES}/{vid}"
    volume: dict[str, Any] = {
        "@odata.type": "#Volume.v1_10_2.Volume", "@odata.id": uri, "Id": vid,
        "Name": body.get("Name", f"Volume {vid}"), "Status": {"State": "Enabled", "Health": "OK"},
        "RAIDType": body.get("RAIDType"),
        "Links": {"Drives": [{"@odata.id": ref} for ref in drives]}}
    if sim.apply_times == ["OnReset"]:
        return await sim.later(request, uri, volume)
    sim.resources[uri] = volume
    return web.Response(status=201, headers={"Location": uri})


def attach_storage(app: web.Application, sim: StorageSim) -> StorageSim:
    app[STORAGE_SIM] = sim
    for prefix in (STORAGE, "/redfish/v1/Chassis/1U/Drives"):
        app.router.add_route("*", prefix, resource)
        app.router.add_route("*", prefix + "/{tail:.*}", resource)
    return sim
