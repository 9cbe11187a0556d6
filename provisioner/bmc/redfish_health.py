"""Redfish health reads (``RedfishBmc.read_health``): the system's ``Status``, new entries
of its ``LogServices`` (SEL and event logs), and the leak detectors of every chassis that
has ``ThermalSubsystem/LeakDetection`` (GB200/GB300 trays) or the newer
``Chassis/{id}/LeakDetectors``. Where the BMC has them: a missing link is no error.

The URIs found (log services, detectors) are kept per client, so a poll after the first is
the system, one GET per log service's entries, and one per detector. The cursor is a JSON
object ``{"logs": {service: {"created", "ids"}}}`` (``health.bmc.log_cursor``).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from provisioner.bmc.base import BmcHealth, BmcUnsupported
from provisioner.health.bmc import (
    Event,
    leak_finding,
    log_cursor,
    log_events,
    new_log_entries,
    status_finding,
)
from provisioner.health.model import Finding

if TYPE_CHECKING:
    from provisioner.bmc.redfish import RedfishClient

MAX_CHASSIS: Final = 16
MAX_DETECTORS: Final = 64
MAX_ENTRIES: Final = 200  # entries read per log service and poll (expanded members)


@dataclass
class _Found:
    system: str | None
    logs: list[str]
    detectors: list[str]


_FOUND: weakref.WeakKeyDictionary[Any, _Found] = weakref.WeakKeyDictionary()


async def read_health(client: RedfishClient, cursor: str | None) -> BmcHealth:
    found = _FOUND.get(client)
    if found is None:
        found = _FOUND[client] = await _discover(client)
    resource = await _get(client, found.system) if found.system else {}
    states: list[Finding] = []
    if (status := status_finding("system", resource)) is not None:
        states.append(status)
    before = _load(cursor)
    logs: dict[str, Any] = {}
    events: list[Event] = []
    baseline = 0
    for uri in found.logs:
        entries = await _entries(client, uri)
        seen = before.get(uri)
        fresh = new_log_entries(entries, seen)
        baseline += len(entries) if seen is None else 0
        events += log_events(fresh)
        logs[uri] = log_cursor(entries, seen)
    for uri in found.detectors:
        detector = await _get(client, uri)
        if detector and (leak := leak_finding(detector)) is not None:
            states.append(leak)
    return BmcHealth(tuple(events), tuple(states),
                     json.dumps({"logs": logs}, separators=(",", ":")), baseline)


async def _discover(client: RedfishClient) -> _Found:
    """The first system (its Reset action is not needed here), its log services, the leak
    detectors of the chassis."""
    systems = _members(await _get(client, "/redfish/v1/Systems"))
    system = await _get(client, systems[0]) if systems else {}
    logs: list[str] = []
    if (uri := _link(system, "LogServices")) is not None:
        for service_uri in _members(await _get(client, uri)):
            service = await _get(client, service_uri)
            if (entries := _link(service, "Entries")) is not None:
                logs.append(entries)
    detectors: list[str] = []
    for chassis_uri in _members(await _get(client, "/redfish/v1/Chassis"))[:MAX_CHASSIS]:
        chassis = await _get(client, chassis_uri)
        collection = _link(chassis, "LeakDetectors")
        if collection is None and (thermal := _link(chassis, "ThermalSubsystem")):
            leak = _link(await _get(client, thermal), "LeakDetection")
            collection = _link(await _get(client, leak), "LeakDetectors") if leak else None
        if collection is not None:
            detectors += _members(await _get(client, collection))
    return _Found(systems[0] if systems else None, logs, detectors[:MAX_DETECTORS])


async def _entries(client: RedfishClient, uri: str) -> list[Mapping[str, Any]]:
    members = (await _get(client, uri)).get("Members")
    entries = [m for m in members if isinstance(m, Mapping)] if isinstance(members, list) \
        else []
    entries = entries[-MAX_ENTRIES:] if len(entries) > MAX_ENTRIES else entries
    return [m if "Created" in m or "Severity" in m else await _get(client, str(m.get(
        "@odata.id", ""))) for m in entries]


async def _get(client: RedfishClient, uri: str) -> dict[str, Any]:
    """The resource, or {} where the BMC has none (404, not JSON): optional parts."""
    if not uri:
        return {}
    try:
        data, _ = await client.request("GET", uri)
    except BmcUnsupported:
        return {}
    return data


def _link(resource: Mapping[str, Any], key: str) -> str | None:
    value = resource.get(key)
    uri = value.get("@odata.id") if isinstance(value, Mapping) else None
    return uri if isinstance(uri, str) and uri else None


def _members(collection: Mapping[str, Any]) -> list[str]:
    members = collection.get("Members")
    if not isinstance(members, list):
        return []
    return [m["@odata.id"] for m in members
            if isinstance(m, Mapping) and isinstance(m.get("@odata.id"), str)]


def _load(cursor: str | None) -> dict[str, Any]:
    try:
        value = json.loads(cursor) if cursor else {}
    except ValueError:
        return {}
    logs = value.get("logs") if isinstance(value, dict) else None
    return logs if isinstance(logs, dict) else {}
