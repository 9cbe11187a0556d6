"""Storage volumes through Redfish (issue 25's storage layout), on the ``redfish`` driver's
session: the System's ``Storage`` collection, each controller's ``Drives`` (links) and
``Volumes`` collection; a volume is created by a POST to that collection (``Name``,
``RAIDType``, ``Links.Drives``) and deleted by a DELETE of the volume, each with
``@Redfish.OperationApplyTime`` where the collection lists it (``Immediate`` preferred,
else ``OnReset``: the change waits for the next reset). The BMC answers 201 (done, the
volume's URI in ``Location``), 204, or 202 with a task monitor in ``Location`` (followed by
the servicing step's task polling, as a firmware update's).

Shapes as DMTF's public mockup ``public-localstorage`` (tests/fixtures/redfish-storage) and
sushy-tools' ``Volumes`` collection publish them.
"""

from __future__ import annotations

from collections.abc import Sequence

from provisioner.bmc.base import BmcUnsupported
from provisioner.bmc.redfish import JsonObject, RedfishClient, _dig
from provisioner.bmc.redfish_errors import _check
from provisioner.validation.storage import Controller, Drive, Volume

NO_STORAGE = "this BMC offers no Redfish Storage with a Volumes collection"


def _members(collection: JsonObject, key: str = "Members") -> list[str]:
    found = collection.get(key)
    return [str(m["@odata.id"]) for m in found if isinstance(m, dict)
            and isinstance(m.get("@odata.id"), str)] if isinstance(found, list) else []


def _local(uri: str) -> str:
    return "/" + uri.split("://", 1)[1].split("/", 1)[1] if "://" in uri else uri


async def controllers(client: RedfishClient) -> list[Controller]:
    """The System's storage controllers that have a Volumes collection; BmcUnsupported
    when there is none."""
    system, _ = await client.request("GET", (await client.system()).uri)
    storage_uri = _dig(system, "Storage", "@odata.id")
    if not isinstance(storage_uri, str):
        raise BmcUnsupported(f"BMC {client.url}: {NO_STORAGE} (the System has no Storage)")
    found: list[Controller] = []
    for member in _members((await client.request("GET", storage_uri))[0]):
        storage, _ = await client.request("GET", member)
        volumes_uri = _dig(storage, "Volumes", "@odata.id")
        if not isinstance(volumes_uri, str):
            continue
        drives = tuple([Drive.from_redfish((await client.request("GET", uri))[0])
                        for uri in _members(storage, "Drives")])
        collection, _ = await client.request("GET", volumes_uri)
        volumes = tuple([Volume.from_redfish((await client.request("GET", uri))[0])
                         for uri in _members(collection)])
        times = _dig(collection, "@Redfish.OperationApplyTimeSupport", "SupportedValues")
        found.append(Controller(member, volumes_uri, drives, volumes,
                                tuple(str(t) for t in times) if isinstance(times, list)
                                else ()))
    if not found:
        raise BmcUnsupported(f"BMC {client.url}: {NO_STORAGE}")
    return found


async def create_volume(client: RedfishClient, controller: Controller, name: str, raid: str,
                        drives: Sequence[str]) -> str:
    """POST the volume; returns the task monitor's URI, '' when the BMC made it at once."""
    body: JsonObject = {"Name": name, "RAIDType": raid,
                        "Links": {"Drives": [{"@odata.id": ref} for ref in drives]}}
    if controller.apply_times:
        body["@Redfish.OperationApplyTime"] = controller.apply_time
    return await _change(client, "POST", controller.volumes_uri, body)


async def delete_volume(client: RedfishClient, controller: Controller, uri: str) -> str:
    body: JsonObject | None = ({"@Redfish.OperationApplyTime": controller.apply_time}
                               if controller.apply_times else None)
    return await _change(client, "DELETE", uri, body)


async def _change(client: RedfishClient, method: str, uri: str,
                  body: JsonObject | None) -> str:
    status, data, headers = await client.exchange(method, uri, body)
    _check(status, data, client.url, f"{method} {uri}")
    if status != 202:
        return ""
    location = headers.get("Location") or _dig(data, "@odata.id")
    return _local(str(location)) if location else ""
