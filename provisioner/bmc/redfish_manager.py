"""A BMC's own settings through Redfish (issue 25), for the ``bmc_settings`` servicing step,
on the ``redfish`` driver's session.

Where each comes from:

* the Manager: ``/redfish/v1/Managers``' first member (a server has one BMC);
  ``DateTimeLocalOffset`` is PATCHed on it (sushy-tools and real BMCs take it there);
* ``NetworkProtocol`` (its link on the Manager): IPMI, SSH, NTP ``ProtocolEnabled`` and
  ``NTPServers``, PATCHed on it;
* vendor manager attributes: the resources ``Links.Oem.Dell.DellAttributes`` names (iDRAC:
  ``iDRAC.Embedded.1``, ``System.Embedded.1``, ``LifecycleController.Embedded.1``), else
  ``<Manager>/Attributes`` where the BMC answers it; pending values go to the resource
  its ``@Redfish.Settings.SettingsObject`` names, with ``@Redfish.SettingsApplyTime``
  ``Immediate`` where listed in ``SupportedApplyTimes`` (iDRAC lists ``Immediate`` and
  ``AtMaintenanceWindowStart``), else ``OnReset`` followed by ``Manager.Reset``;
* their registry: the ``AttributeRegistry`` the resource names (``ManagerAttributeRegistry.
  v1_0_0``) found under ``/redfish/v1/Registries`` by its name without the version (iDRAC
  files it as ``ManagerAttributeRegistry``, Registry ``ManagerAttributeRegistry.1.0``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from provisioner.bmc.base import BmcUnsupported
from provisioner.bmc.redfish import JsonObject, RedfishClient, _dig
from provisioner.validation.bmc_settings import Applied, BmcValue, BmcView, patch_bodies

NO_MANAGER = "this BMC has no Redfish Manager"
_VERSION = re.compile(r"\.v?\d+[._]\d+.*$")


@dataclass(frozen=True, slots=True)
class AttributeResource:
    uri: str
    settings_uri: str
    apply_times: tuple[str, ...]
    names: frozenset[str]
    registry: str


def _members(collection: JsonObject) -> list[str]:
    found = collection.get("Members")
    return [str(m["@odata.id"]) for m in found if isinstance(m, dict)
            and isinstance(m.get("@odata.id"), str)] if isinstance(found, list) else []


class RedfishManager:
    """One BMC's Manager, read and written through ``client``."""

    def __init__(self, client: RedfishClient) -> None:
        self._client = client

    async def _get(self, path: str) -> JsonObject:
        return (await self._client.request("GET", path))[0]

    async def _manager(self) -> tuple[str, JsonObject]:
        root = await self._get("/redfish/v1/")
        uri = _dig(root, "Managers", "@odata.id")
        members = _members(await self._get(uri)) if isinstance(uri, str) else []
        if not members:
            raise BmcUnsupported(f"BMC {self._client.url}: {NO_MANAGER}: BMC settings "
                                 "cannot be read or applied")
        return members[0], await self._get(members[0])

    async def _attribute_resources(self, uri: str,
                                   manager: JsonObject) -> list[tuple[AttributeResource,
                                                                      JsonObject]]:
        links = _dig(manager, "Links", "Oem", "Dell", "DellAttributes")
        uris = [str(x["@odata.id"]) for x in links if isinstance(x, dict)
                and isinstance(x.get("@odata.id"), str)] if isinstance(links, list) else []
        if not uris:
            status, data, _ = await self._client.exchange("GET", f"{uri}/Attributes")
            if status == 200 and isinstance(data.get("Attributes"), dict):
                return [(_resource(f"{uri}/Attributes", data), data)]
            return []
        found = []
        for link in uris:
            data = await self._get(link)
            found.append((_resource(link, data), data))
        return found

    async def view(self, *, registry: bool) -> tuple[BmcView, list[AttributeResource]]:
        """The BMC's settings now; its attribute registry read only when ``registry``."""
        uri, manager = await self._manager()
        resources = await self._attribute_resources(uri, manager)
        attributes: dict[str, object] = {}
        for _, data in resources:
            attributes.update(data.get("Attributes") or {})  # type: ignore[call-overload]
        protocol_uri = _dig(manager, "NetworkProtocol", "@odata.id")
        protocol = await self._get(protocol_uri) if isinstance(protocol_uri, str) else None
        found: Mapping[str, object] | None = None
        if registry and resources:
            found = await self._registry(resources[0][0].registry)
        return BmcView(attributes, found, protocol, manager), [r for r, _ in resources]

    async def _registry(self, name: str) -> Mapping[str, object]:
        if not name:
            raise BmcUnsupported(f"BMC {self._client.url}: the manager attributes name no "
                                 "AttributeRegistry: settings cannot be validated")
        bare = _VERSION.sub("", name)
        members = _members(await self._get("/redfish/v1/Registries"))
        # the member named like the registry first: iDRAC files dozens of registries
        members.sort(key=lambda m: not m.rstrip("/").endswith("/" + bare))
        for member in members:
            entry = await self._get(member)
            keys = {_VERSION.sub("", str(entry.get(k) or "")) for k in ("Id", "Registry")}
            if bare not in keys and not member.rstrip("/").endswith("/" + bare):
                continue
            for location in entry.get("Location") or []:  # type: ignore[attr-defined]
                where = location.get("Uri") if isinstance(location, dict) else None
                if isinstance(where, str):
                    return await self._get(where)
        raise BmcUnsupported(f"BMC {self._client.url}: attribute registry {name} not found "
                             "under /redfish/v1/Registries: settings cannot be validated")

    async def apply(self, changes: Mapping[str, BmcValue]) -> Applied:
        vendor, protocol, manager = patch_bodies(changes)
        _, resources = await self.view(registry=False)
        uri, current = await self._manager()
        times: list[str] = []
        if manager:
            await self._client.request("PATCH", uri, manager)
            times.append("Immediate")
        for resource in resources:
            mine = {k: v for k, v in vendor.items() if k in resource.names}
            if not mine:
                continue
            body: JsonObject = {"Attributes": mine}
            when = _apply_time(resource.apply_times)
            if when:
                body["@Redfish.SettingsApplyTime"] = {"ApplyTime": when}
            await self._client.request("PATCH", resource.settings_uri, body)
            times.append(when or "the BMC's default")
        left = set(vendor) - {n for r in resources for n in r.names}
        if left:  # check_bmc refused these already; a BMC that changed in between
            raise BmcUnsupported(f"BMC {self._client.url}: no attribute resource holds "
                                 + ", ".join(sorted(left)))
        if protocol:  # last: a BMC restarts its network services for it (the step waits)
            link = _dig(current, "NetworkProtocol", "@odata.id")
            await self._client.request("PATCH", str(link), protocol)  # type: ignore[arg-type]
            times.append("Immediate")
        ordered = sorted(set(times))
        return Applied(", ".join(ordered), "OnReset" in ordered)

    async def reset(self) -> str:
        """``Manager.Reset``: GracefulRestart where offered, else ForceRestart; the type
        used."""
        _, manager = await self._manager()
        action = _dig(manager, "Actions", "#Manager.Reset")
        if not isinstance(action, dict) or not isinstance(action.get("target"), str):
            raise BmcUnsupported(f"BMC {self._client.url}: the Manager has no Reset action: "
                                 "settings applied OnReset cannot take effect")
        allowed = action.get("ResetType@Redfish.AllowableValues")
        kinds = [str(k) for k in allowed] if isinstance(allowed, list) else []
        kind = next((k for k in ("GracefulRestart", "ForceRestart") if k in kinds),
                    kinds[0] if kinds else "GracefulRestart")
        await self._client.request("POST", str(action["target"]), {"ResetType": kind})
        return kind


def _resource(uri: str, data: JsonObject) -> AttributeResource:
    settings = _dig(data, "@Redfish.Settings", "SettingsObject", "@odata.id")
    times = _dig(data, "@Redfish.Settings", "SupportedApplyTimes")
    attributes = data.get("Attributes")
    return AttributeResource(
        uri, settings if isinstance(settings, str) else uri,
        tuple(str(t) for t in times) if isinstance(times, list) else (),
        frozenset(attributes) if isinstance(attributes, dict) else frozenset(),
        str(data.get("AttributeRegistry") or ""))


def _apply_time(supported: tuple[str, ...]) -> str:
    """Immediate where offered; OnReset where that is all there is; '' (the BMC's default,
    no apply time sent) where the BMC lists none."""
    if not supported or "Immediate" in supported:
        return "Immediate" if supported else ""
    return "OnReset" if "OnReset" in supported else supported[0]
