"""A profile's BMC (manager) settings baseline against what a BMC reports (issue 25). Pure:
the standard library and the BIOS baseline's registry reader only.

Settings are named in one flat namespace, as the step, the record and the drift show them:

* a vendor manager attribute by its own name (Dell iDRAC: ``IPMILan.1.Enable``,
  ``LCD.1.ChassisIdentifyDuration``), checked against the BMC's manager attribute registry
  (``ManagerAttributeRegistry``: unknown, read-only, disallowed value);
* a standard Redfish property as ``NetworkProtocol.<Protocol>.<Property>``
  (``NetworkProtocol.IPMI.ProtocolEnabled``, ``NetworkProtocol.SSH.ProtocolEnabled``,
  ``NetworkProtocol.NTP.ProtocolEnabled``, ``NetworkProtocol.NTP.NTPServers``) or
  ``Manager.DateTimeLocalOffset``, checked against the resource the BMC serves (the
  protocol must be there, the value of its type, an allowable value where the BMC lists
  them, no more NTP servers than the BMC has slots for).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from provisioner.validation.baseline import BmcSetting, registry_attributes, value_problem

BmcValue = BmcSetting
PROTOCOL = "NetworkProtocol."
MANAGER = "Manager."
_OFFSET = re.compile(r"^[+-](0\d|1[0-4]):[0-5]\d$")


@dataclass(frozen=True, slots=True)
class BmcView:
    """What the BMC reports: its manager attributes (name -> value; {} where it has none),
    their registry (None: the BMC publishes no attribute resource), its NetworkProtocol
    resource (None: none) and its Manager resource."""

    attributes: Mapping[str, object] = field(default_factory=dict)
    registry: Mapping[str, object] | None = None
    protocol: Mapping[str, object] | None = None
    manager: Mapping[str, object] = field(default_factory=dict)

    def value(self, name: str) -> object:
        """The current value of a flat name; None where the BMC does not report it."""
        if name.startswith(PROTOCOL):
            proto, _, prop = name.removeprefix(PROTOCOL).partition(".")
            section = (self.protocol or {}).get(proto)
            found = section.get(prop) if isinstance(section, Mapping) else None
            return _servers(found) if prop == "NTPServers" else found
        if name.startswith(MANAGER):
            return self.manager.get(name.removeprefix(MANAGER))
        return self.attributes.get(name)


@dataclass(frozen=True, slots=True)
class Applied:
    """How BMC settings were written: the apply time(s) used, and whether the Manager must
    be reset for them to take effect."""

    when: str
    reset: bool


def _servers(value: object) -> tuple[str, ...] | None:
    """An NTPServers list as compared: the empty slots a BMC pads it with dropped (iDRAC
    reports three, ``""`` where unset)."""
    if not isinstance(value, list):
        return None
    return tuple(str(v) for v in value if v)


def normalise(wanted: Mapping[str, object]) -> dict[str, BmcValue]:
    """The baseline's values as compared (lists become tuples)."""
    return {k: tuple(str(x) for x in v) if isinstance(v, list | tuple) else v  # type: ignore[misc]
            for k, v in wanted.items()}


def check_bmc(wanted: Mapping[str, BmcValue], view: BmcView) -> list[str]:
    """Every reason ``wanted`` cannot be applied to this BMC, at once; [] when it can."""
    errors: list[str] = []
    vendor = {k: v for k, v in wanted.items()
              if not k.startswith((PROTOCOL, MANAGER))}
    if vendor:
        errors += _check_attributes(vendor, view)
    for name, value in wanted.items():
        if name.startswith(PROTOCOL):
            errors += _check_protocol(name, value, view)
        elif name.startswith(MANAGER):
            errors += _check_manager(name, value, view)
    return errors


def _check_attributes(wanted: Mapping[str, BmcValue], view: BmcView) -> list[str]:
    if view.registry is None:
        return [f"{', '.join(sorted(wanted))}: this BMC has no Redfish manager attributes "
                "(no attribute resource on its Manager)"]
    known = registry_attributes(view.registry)
    if not known:
        return ["the BMC's manager attribute registry lists no attributes"]
    errors: list[str] = []
    for name, value in sorted(wanted.items()):
        entry = known.get(name)
        if entry is None:
            errors.append(f"{name}: unknown attribute (not in registry "
                          f"{view.registry.get('Id', '?')})")
        elif any(entry.get(k) is True for k in ("ReadOnly", "Readonly", "Immutable")):
            errors.append(f"{name}: read-only in the registry")
        elif isinstance(value, tuple):
            errors.append(f"{name}: a list is no attribute value")
        elif entry.get("Type") == "Enumeration" and _display_name(entry, value):
            continue  # Dell lists ValueName "1", its attributes read "Enabled"
        elif problem := value_problem(entry, value):
            errors.append(f"{name}: {problem}")
    return errors


def _display_name(entry: Mapping[str, object], value: BmcValue) -> bool:
    values = entry.get("Value")
    return isinstance(values, list) and any(
        isinstance(v, Mapping) and v.get("ValueDisplayName") == value for v in values)


def _check_protocol(name: str, value: BmcValue, view: BmcView) -> list[str]:
    proto, _, prop = name.removeprefix(PROTOCOL).partition(".")
    if view.protocol is None:
        return [f"{name}: this BMC has no Redfish NetworkProtocol resource"]
    section = view.protocol.get(proto)
    if not isinstance(section, Mapping):
        return [f"{name}: the BMC's NetworkProtocol has no {proto}"]
    allowed = section.get(f"{prop}@Redfish.AllowableValues")
    if prop == "NTPServers":
        if not isinstance(value, tuple):
            return [f"{name}: a list of servers"]
        slots = section.get(prop)
        if isinstance(slots, list) and slots and len(value) > len(slots):
            return [f"{name}: {len(value)} servers, the BMC has {len(slots)} slots"]
        return []
    if prop not in section:
        return [f"{name}: the BMC's NetworkProtocol {proto} has no {prop}"]
    current = section.get(prop)
    if isinstance(current, bool) and not isinstance(value, bool):
        return [f"{name}: {value!r} is not a boolean"]
    if isinstance(allowed, list) and value not in allowed:
        return [f"{name}: {value!r} not allowed (allowed: {', '.join(map(str, allowed))})"]
    return []


def _check_manager(name: str, value: BmcValue, view: BmcView) -> list[str]:
    prop = name.removeprefix(MANAGER)
    if prop != "DateTimeLocalOffset":
        return [f"{name}: not a Manager property the baseline sets (DateTimeLocalOffset)"]
    if prop not in view.manager:
        return [f"{name}: the BMC's Manager has no {prop}"]
    if not isinstance(value, str) or not _OFFSET.match(value):
        return [f"{name}: {value!r} is not an offset like +00:00"]
    return []


def bmc_changes(wanted: Mapping[str, BmcValue], view: BmcView) -> dict[str, BmcValue]:
    """The settings whose current value differs from the wanted one."""
    return {name: value for name, value in wanted.items() if view.value(name) != value}


def differences(wanted: Mapping[str, object],
                current: Mapping[str, object]) -> list[tuple[str, object, object]]:
    """(name, have, want) for each setting whose last read value differs (``current``: the
    values as kept in the facts, lists for NTP servers)."""
    out = []
    for name, value in sorted(wanted.items()):
        have = current.get(name)
        if isinstance(have, list):
            have = tuple(str(x) for x in have)
        if have != value:
            out.append((name, have, value))
    return out


def patch_bodies(changes: Mapping[str, BmcValue]) -> tuple[dict[str, BmcValue],
                                                           dict[str, dict[str, object]],
                                                           dict[str, object]]:
    """(vendor attributes, NetworkProtocol PATCH body, Manager PATCH body)."""
    vendor: dict[str, BmcValue] = {}
    protocol: dict[str, dict[str, object]] = {}
    manager: dict[str, object] = {}
    for name, value in changes.items():
        if name.startswith(PROTOCOL):
            proto, _, prop = name.removeprefix(PROTOCOL).partition(".")
            protocol.setdefault(proto, {})[prop] = list(value) if isinstance(
                value, tuple) else value
        elif name.startswith(MANAGER):
            manager[name.removeprefix(MANAGER)] = value
        else:
            vendor[name] = value
    return vendor, protocol, manager


def as_facts(values: Mapping[str, object]) -> dict[str, object]:
    """Values as JSON keeps them (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
