"""Servicing through Redfish (issue 25): BIOS with its attribute registry, the firmware
inventory, ``UpdateService.SimpleUpdate`` and its task monitor, on the ``redfish`` driver's
session (``RedfishClient``). ``SiteServicing`` is the daemon's ``Servicing`` port.

Where each comes from:

* the BIOS resource: the System's ``Bios`` link; pending settings go to the resource its
  ``@Redfish.Settings.SettingsObject`` names (the BIOS resource itself where there is none),
  with ``@Redfish.SettingsApplyTime`` ``OnReset`` where the BMC lists it as supported
  (``SupportedApplyTimes``), else no apply time (the BMC's default: the next reset);
* the attribute registry: ``AttributeRegistry`` (an Id) looked up in ``/redfish/v1/Registries``
  (its ``Location[].Uri``), as sushy-tools and Dell, HPE, Lenovo BMCs publish it;
* firmware: ``UpdateService`` → ``FirmwareInventory`` members; ``SimpleUpdate`` with
  ``ImageURI``, ``Targets`` and ``TransferProtocol``, or a push to ``MultipartHttpPushUri``
  (``redfish_push``; which one: ``validation.baseline.choose_transfer``); the task from the
  answer's body (``@odata.id``, a Task) or ``Location`` header (``_task_uri``).

A BMC of another driver (IPMI) has none of this: ``bmc()`` fails with "this BMC has no
Redfish UpdateService", never skips.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from provisioner.bmc import redfish_push, redfish_storage
from provisioner.bmc.base import BmcUnsupported
from provisioner.bmc.redfish import JsonObject, RedfishClient, RedfishDriver, _dig
from provisioner.bmc.redfish_errors import _check
from provisioner.bmc.redfish_manager import RedfishManager
from provisioner.config.servicing import ServicingSettings
from provisioner.domain import BmcCredentials, Node
from provisioner.errors import InvalidRequest
from provisioner.validation.baseline import (
    Baseline,
    BiosValue,
    BmcSetting,
    Component,
    TaskLimits,
    TaskState,
    UpdateImage,
    Wanted,
    choose_transfer,
)
from provisioner.validation.bmc_settings import Applied, BmcView, normalise
from provisioner.validation.storage import Controller, WantedVolume

NO_UPDATE_SERVICE: Final = "this BMC has no Redfish UpdateService"


class RedfishService:
    """One node's BMC, for servicing (errors: the ``redfish`` driver's, with the BMC's
    message)."""

    def __init__(self, client: RedfishClient) -> None:
        self._client = client
        self._manager = RedfishManager(client)

    async def _get(self, path: str) -> JsonObject:
        return (await self._client.request("GET", path))[0]

    async def _bios_uri(self) -> str:
        system = await self._get((await self._client.system()).uri)
        uri = _dig(system, "Bios", "@odata.id")
        if not isinstance(uri, str):
            raise BmcUnsupported(f"BMC {self._client.url}: the System has no Bios resource")
        return uri

    async def bios_registry(self) -> Mapping[str, object]:
        bios = await self._get(await self._bios_uri())
        name = bios.get("AttributeRegistry")
        if not isinstance(name, str):
            raise BmcUnsupported(f"BMC {self._client.url}: the Bios resource names no "
                                 "AttributeRegistry: settings cannot be validated")
        registries = await self._get("/redfish/v1/Registries")
        for member in _members(registries):
            entry = await self._get(member)
            if name not in (entry.get("Id"), entry.get("Registry")) and not member.endswith(
                    "/" + name) and not _same_registry(entry, name):
                continue
            for location in entry.get("Location") or []:  # type: ignore[attr-defined]
                uri = location.get("Uri") if isinstance(location, dict) else None
                if isinstance(uri, str):
                    return await self._get(uri)
        raise BmcUnsupported(f"BMC {self._client.url}: attribute registry {name} not found "
                             "under /redfish/v1/Registries")

    async def bios_attributes(self) -> Mapping[str, object]:
        attributes = (await self._get(await self._bios_uri())).get("Attributes")
        return attributes if isinstance(attributes, dict) else {}

    async def apply_bios(self, changes: Mapping[str, BiosValue]) -> str:
        bios = await self._get(await self._bios_uri())
        settings = _dig(bios, "@Redfish.Settings", "SettingsObject", "@odata.id")
        target = settings if isinstance(settings, str) else await self._bios_uri()
        supported = _dig(bios, "@Redfish.Settings", "SupportedApplyTimes")
        body: JsonObject = {"Attributes": dict(changes)}
        when = "OnReset (the BMC's default)"
        if isinstance(supported, list) and "OnReset" in supported:
            body["@Redfish.SettingsApplyTime"] = {"ApplyTime": "OnReset"}
            when = "OnReset"
        _, etag = await self._client.request("GET", target)
        await self._client.request("PATCH", target, body, etag=etag)
        return when

    async def bmc_view(self, *, registry: bool) -> BmcView:
        return (await self._manager.view(registry=registry))[0]

    async def apply_bmc(self, changes: Mapping[str, BmcSetting]) -> Applied:
        return await self._manager.apply(changes)

    async def reset_bmc(self) -> str:
        return await self._manager.reset()

    async def _update_service(self) -> JsonObject:
        root = await self._get("/redfish/v1/")
        uri = _dig(root, "UpdateService", "@odata.id")
        if not isinstance(uri, str):
            raise BmcUnsupported(f"BMC {self._client.url}: {NO_UPDATE_SERVICE}")
        return await self._get(uri)

    async def firmware_inventory(self) -> list[Component]:
        service = await self._update_service()
        uri = _dig(service, "FirmwareInventory", "@odata.id")
        if not isinstance(uri, str):
            raise BmcUnsupported(f"BMC {self._client.url}: UpdateService lists no "
                                 "FirmwareInventory")
        return [Component.from_redfish(await self._get(member))
                for member in _members(await self._get(uri))]

    async def transfer(self, image: UpdateImage) -> str:
        service = await self._update_service()
        action = _dig(service, "Actions", "#UpdateService.SimpleUpdate")
        protocols: list[str] | None = None  # no SimpleUpdate
        if isinstance(action, dict) and isinstance(action.get("target"), str):
            allowed = action.get("TransferProtocol@Redfish.AllowableValues")
            protocols = [str(p) for p in allowed] if isinstance(allowed, list) else []
        push_uri = service.get("MultipartHttpPushUri")
        try:
            return choose_transfer(image, protocols,
                                   push_uri if isinstance(push_uri, str) else None)
        except ValueError as exc:
            raise BmcUnsupported(f"BMC {self._client.url}: {exc}") from None

    async def push_update(self, path: str, targets: list[str]) -> str:
        data, headers = await redfish_push.push(self._client, await self._update_service(),
                                                Path(path), targets)
        return _task_uri(data, headers)

    async def simple_update(self, image_uri: str, targets: list[str]) -> str:
        service = await self._update_service()
        action = _dig(service, "Actions", "#UpdateService.SimpleUpdate")
        if not isinstance(action, dict) or not isinstance(action.get("target"), str):
            raise BmcUnsupported(f"BMC {self._client.url}: UpdateService has no SimpleUpdate")
        body: JsonObject = {"ImageURI": image_uri, "Targets": targets}
        protocols = action.get("TransferProtocol@Redfish.AllowableValues")
        if isinstance(protocols, list):
            wanted = "HTTPS" if image_uri.startswith("https:") else "HTTP"
            if wanted in protocols:
                body["TransferProtocol"] = wanted
        what = f"POST {action['target']}"
        status, data, headers = await self._client.exchange("POST", str(action["target"]), body)
        _check(status, data, self._client.url, what)
        return _task_uri(data, headers)

    async def task(self, uri: str) -> TaskState:
        status, data, _ = await self._client.exchange("GET", uri)
        if status == 404:
            return TaskState("", gone=True)
        _check(status, data, self._client.url, f"GET {uri}")
        messages = tuple(str(m.get("Message", "")) for m in data.get("Messages") or []  # type: ignore[attr-defined]
                         if isinstance(m, dict) and m.get("Message"))
        percent = data.get("PercentComplete")
        state = data.get("TaskState")
        if status == 202 and not isinstance(state, str):
            state = "Running"  # a task monitor answers 202 while the task runs
        return TaskState(str(state or "Completed"),
                         percent if isinstance(percent, int) else None, messages)

    async def _tasks_uri(self) -> str | None:
        root = await self._get("/redfish/v1/")
        service_uri = _dig(root, "Tasks", "@odata.id")
        if not isinstance(service_uri, str):
            return None
        tasks_uri = _dig(await self._get(service_uri), "Tasks", "@odata.id")
        return tasks_uri if isinstance(tasks_uri, str) else None

    async def task_ids(self) -> list[str] | None:
        tasks_uri = await self._tasks_uri()
        if tasks_uri is None:
            return None
        return [_local(m) for m in _members(await self._get(tasks_uri))][-_KNOWN:]

    async def tasks_for(self, image_uri: str,
                        known: Sequence[str] | None = None) -> list[str] | None:
        tasks_uri = await self._tasks_uri()
        if tasks_uri is None:
            return None
        push_uri = (await self._update_service()).get("MultipartHttpPushUri") \
            if known is not None else None
        named, running = [], []
        for member in _members(await self._get(tasks_uri))[-_TASKS_READ:]:
            if known is not None and _local(member) in known:
                continue  # there before the push was asked for: not its task
            status, data, _ = await self._client.exchange("GET", member)
            if status >= 400 or not isinstance(data, dict):
                continue
            found = data.get("Payload")
            payload = found if isinstance(found, dict) else {}
            if image_uri in json.dumps(payload) or (
                    push_uri and _local(str(payload.get("TargetUri", ""))) == push_uri):
                named.append(_local(member))
            elif not TaskState(str(data.get("TaskState") or "Completed")).finished:
                running.append(_local(member))
        return named or running

    async def change_tasks(self, method: str, target: str,
                           known: Sequence[str]) -> list[str] | None:
        tasks_uri = await self._tasks_uri()
        if tasks_uri is None:
            return None
        found = []
        for member in _members(await self._get(tasks_uri))[-_TASKS_READ:]:
            if _local(member) in known:
                continue
            status, data, _ = await self._client.exchange("GET", member)
            payload = data.get("Payload") if status < 400 else None
            if isinstance(payload, dict) and payload.get("HttpOperation") == method \
                    and _local(str(payload.get("TargetUri", ""))) == target:
                found.append(_local(member))
        return found

    async def storage(self) -> list[Controller]:
        return await redfish_storage.controllers(self._client)

    async def create_volume(self, controller: Controller, name: str, raid: str,
                            drives: Sequence[str]) -> str:
        return await redfish_storage.create_volume(self._client, controller, name, raid,
                                                   drives)

    async def delete_volume(self, controller: Controller, uri: str) -> str:
        return await redfish_storage.delete_volume(self._client, controller, uri)

    async def aclose(self) -> None:
        """Nothing: the session belongs to the driver."""


_TASKS_READ: Final = 32
"""The newest tasks a resumed update reads (a BMC keeps its finished tasks for a while)."""
_KNOWN: Final = 256
"""The most tasks a push's intent keeps (the BMC's newest)."""


def _task_uri(data: JsonObject, headers: Mapping[str, str]) -> str:
    """The Task an update's answer names: its body's ``@odata.id`` where that is a Task
    (bmcweb: the Task in the body, its monitor in ``Location``; the Task reports the state
    and the BMC's messages, a monitor only 202 then 204), else ``Location``, else the
    body's ``TaskMonitor``; '' where none (done in the call)."""
    task = _dig(data, "@odata.id")
    if isinstance(task, str) and "/TaskService/Tasks/" in task:
        return _local(task)
    location = headers.get("Location") or _dig(data, "TaskMonitor")
    return _local(str(location)) if location else ""


def _members(collection: JsonObject) -> list[str]:
    found = collection.get("Members")
    return [str(m["@odata.id"]) for m in found if isinstance(m, dict)
            and isinstance(m.get("@odata.id"), str)] if isinstance(found, list) else []


def _same_registry(entry: JsonObject, name: str) -> bool:
    """sushy-tools and some BMCs name the file ``BiosAttributeRegistry.v1_0_0`` but the
    Bios resource ``BiosAttributeRegistryP89.v1_0_0``: any BIOS attribute registry file."""
    registry = entry.get("Registry")
    return isinstance(registry, str) and registry.startswith("BiosAttributeRegistry") \
        and name.startswith("BiosAttributeRegistry")


def _local(uri: str) -> str:
    return "/" + uri.split("://", 1)[1].split("/", 1)[1] if "://" in uri else uri


Credentials = Callable[[Node], Awaitable[BmcCredentials]]


class SiteServicing:
    """The daemon's ``Servicing``: ``[servicing]`` and the ``redfish`` driver."""

    def __init__(self, settings: ServicingSettings, driver: RedfishDriver,
                 credentials: Credentials, image_dir: Path | None = None) -> None:
        """``image_dir``: where the images named relative to ``image_base_url`` are on
        this host (the artefact directory it serves; a push streams them from there)."""
        self._settings = settings
        self._driver = driver
        self._credentials = credentials
        self._image_dir = image_dir

    def runbook(self, name: str) -> tuple[str, ...]:
        found = self._settings.runbooks.get(name)
        if found is None:
            raise InvalidRequest(f"unknown runbook {name!r}; runbooks: "
                                 + (", ".join(sorted(self._settings.runbooks)) or "none"))
        return tuple(found.steps)

    def onboarding(self, node: Node) -> str | None:
        profile = self._settings.profiles.get(node.profile or "")
        return profile.onboarding_runbook if profile is not None else None

    def baseline(self, node: Node) -> Baseline:
        profile = self._settings.profiles.get(node.profile or "")
        if profile is None:
            return Baseline()
        return Baseline(dict(profile.bios), tuple(Wanted(f.id, f.version, f.image)
                                                  for f in profile.firmware),
                        tuple(WantedVolume(v.name, v.raid, v.count, v.kind,
                                           int(v.min_size_gb * 1e9), v.via)
                              for v in profile.storage), profile.storage_replace,
                        normalise(profile.bmc_settings()))

    def wave_runbook(self, profile: str) -> str | None:
        found = self._settings.profiles.get(profile)
        return found.wave_runbook if found is not None else None

    def image_uri(self, image: str) -> str:
        return self._settings.image_uri(image)

    def update_image(self, node: Node, image: str) -> UpdateImage:
        profile = self._settings.profiles.get(node.profile or "")
        path = None
        if self._image_dir is not None and not image.startswith(("http://", "https://")):
            path = str(self._image_dir / image.lstrip("/"))
        return UpdateImage(self._settings.image_uri(image), path,
                           profile.firmware_transfer if profile is not None else "auto")

    @property
    def limits(self) -> TaskLimits:
        s = self._settings
        return TaskLimits(s.task_timeout_s, s.task_poll_s, s.task_stall_s, s.bmc_good_reads,
                          s.drain_deadline_s)

    async def bmc(self, node: Node) -> RedfishService:
        endpoint = node.bmc
        if endpoint is None or endpoint.driver != "redfish":
            driver = endpoint.driver if endpoint is not None else "no BMC"
            raise BmcUnsupported(f"node {node.id}: {NO_UPDATE_SERVICE} (driver {driver}), "
                                 "nor Redfish Bios or Manager settings: firmware, BIOS and "
                                 "BMC settings servicing need a Redfish BMC")
        bmc = self._driver(node.id, endpoint, await self._credentials(node))
        return RedfishService(bmc.client)
