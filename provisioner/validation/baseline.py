"""A profile's servicing baseline against what a BMC reports (issue 25). Pure: the standard
library only.

* ``check_bios``: wanted BIOS attributes against the BMC's attribute registry (Redfish
  ``AttributeRegistry``, ``RegistryEntries.Attributes``): every unknown attribute, read-only
  one and disallowed value at once, before anything is applied.
  Dell spells the flag ``Readonly``; both count.
* ``match_firmware``: the baseline's components (an Id pattern and a version) against the
  BMC's ``UpdateService/FirmwareInventory`` members.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Final

from provisioner.validation.storage import WantedVolume

BiosValue = str | int | bool
BmcSetting = str | int | bool | tuple[str, ...]
"""A BMC settings baseline value (``validation.bmc_settings``: NTP servers are a tuple)."""


@dataclass(frozen=True, slots=True)
class Component:
    """One FirmwareInventory member."""

    id: str
    version: str
    uri: str = ""
    name: str = ""
    updateable: bool = True

    @classmethod
    def from_redfish(cls, member: Mapping[str, object]) -> Component:
        def text(key: str) -> str:
            value = member.get(key)
            return value if isinstance(value, str) else ""
        updateable = member.get("Updateable")
        return cls(id=text("Id"), version=text("Version"), uri=text("@odata.id"),
                   name=text("Name"), updateable=updateable is not False)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One baseline component: an Id pattern, its version and its image."""

    pattern: str
    version: str
    image: str


@dataclass(frozen=True, slots=True)
class FirmwareMatch:
    component: Component
    wanted: Wanted

    @property
    def conforming(self) -> bool:
        return self.component.version == self.wanted.version


@dataclass(frozen=True, slots=True)
class FirmwareView:
    """The baseline against an inventory: matched pairs, baseline entries no component
    matched, components no baseline entry names."""

    matches: tuple[FirmwareMatch, ...]
    unmatched: tuple[Wanted, ...]
    extra: tuple[Component, ...]

    @property
    def drifted(self) -> tuple[FirmwareMatch, ...]:
        return tuple(m for m in self.matches if not m.conforming)

    @property
    def conforming(self) -> bool:
        return not self.drifted and not self.unmatched


def match_firmware(components: Iterable[Component], baseline: Sequence[Wanted]) -> FirmwareView:
    """Each component is matched by the first baseline entry whose pattern its Id fits
    (case-sensitive, like Redfish Ids); a baseline entry that matches nothing is
    ``unmatched`` (the BMC does not report that part: the operator should know)."""
    matches: list[FirmwareMatch] = []
    extra: list[Component] = []
    used: set[int] = set()
    for component in components:
        for index, wanted in enumerate(baseline):
            if fnmatchcase(component.id, wanted.pattern):
                matches.append(FirmwareMatch(component, wanted))
                used.add(index)
                break
        else:
            extra.append(component)
    unmatched = tuple(w for i, w in enumerate(baseline) if i not in used)
    return FirmwareView(tuple(matches), unmatched, tuple(extra))


# -- BIOS -------------------------------------------------------------------------------------


def registry_attributes(registry: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    """AttributeName -> its registry entry."""
    entries = registry.get("RegistryEntries")
    found = entries.get("Attributes") if isinstance(entries, Mapping) else None
    out: dict[str, Mapping[str, object]] = {}
    for entry in found if isinstance(found, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("AttributeName"), str):
            out[str(entry["AttributeName"])] = entry
    return out


def check_bios(wanted: Mapping[str, BiosValue], registry: Mapping[str, object]) -> list[str]:
    """Every reason ``wanted`` cannot be applied, at once; [] when it can."""
    known = registry_attributes(registry)
    if not known:
        return ["the BMC's BIOS attribute registry lists no attributes"]
    errors: list[str] = []
    for name, value in wanted.items():
        entry = known.get(name)
        if entry is None:
            errors.append(f"{name}: unknown attribute (not in registry "
                          f"{registry.get('Id', '?')})")
            continue
        if any(entry.get(k) is True for k in ("ReadOnly", "Readonly", "Immutable")):
            errors.append(f"{name}: read-only in the registry")
            continue
        problem = value_problem(entry, value)
        if problem:
            errors.append(f"{name}: {problem}")
    return errors


def value_problem(entry: Mapping[str, object], value: BiosValue) -> str:
    """Why ``value`` does not fit a registry entry ('' when it does)."""
    kind = entry.get("Type")
    if kind == "Enumeration":
        allowed = [v.get("ValueName") for v in entry.get("Value") or []  # type: ignore[attr-defined]
                   if isinstance(v, Mapping)]
        if value not in allowed:
            return f"{value!r} not allowed (allowed: {', '.join(map(str, allowed))})"
    elif kind == "Boolean":
        if not isinstance(value, bool):
            return f"{value!r} is not a boolean"
    elif kind == "Integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
        low, high = entry.get("LowerBound"), entry.get("UpperBound")
        if isinstance(low, int) and value < low or isinstance(high, int) and value > high:
            return f"{value} outside {low}..{high}"
    elif kind in ("String", "Password"):
        if not isinstance(value, str):
            return f"{value!r} is not a string"
        longest = entry.get("MaxLength")
        if isinstance(longest, int) and len(value) > longest:
            return f"longer than {longest} characters"
    return ""


def bios_changes(wanted: Mapping[str, BiosValue],
                 current: Mapping[str, object]) -> dict[str, BiosValue]:
    """The attributes whose current value differs from the wanted one."""
    return {name: value for name, value in wanted.items() if current.get(name) != value}


# -- servicing values the BMC side and the lifecycle share -------------------------------


@dataclass(frozen=True, slots=True)
class TaskState:
    """A Redfish Task as its monitor reports it; ``gone``: the BMC answered 404."""

    state: str
    percent: int | None = None
    messages: tuple[str, ...] = ()
    gone: bool = False

    @property
    def finished(self) -> bool:
        return self.gone or self.state in ("Completed", "Exception", "Killed", "Cancelled")

    @property
    def ok(self) -> bool:
        return self.state == "Completed"


@dataclass(frozen=True, slots=True)
class Baseline:
    bios: Mapping[str, BiosValue] = field(default_factory=dict)
    firmware: tuple[Wanted, ...] = ()
    storage: tuple[WantedVolume, ...] = ()
    storage_replace: bool = False
    bmc: Mapping[str, BmcSetting] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskLimits:
    timeout_s: float = 3600.0
    poll_s: float = 5.0
    stall_s: float = 900.0
    good_reads: int = 3
    drain_deadline_s: float = 3600.0


SIMPLE_UPDATE: Final = "SimpleUpdate"
MULTIPART_PUSH: Final = "MultipartHttpPushUri"
TRANSFERS: Final = ("auto", "simple", "multipart")


@dataclass(frozen=True, slots=True)
class UpdateImage:
    """A firmware image as an update sends it: ``uri`` where a BMC fetches it
    (``SimpleUpdate``'s ``ImageURI``; also its name in the servicing record), ``path`` the
    file in our artefact directory (``MultipartHttpPushUri`` streams it; None when the image
    is a URL elsewhere), ``transfer`` the profile's ``firmware_transfer``."""

    uri: str
    path: str | None = None
    transfer: str = "auto"


def choose_transfer(image: UpdateImage, simple_protocols: Sequence[str] | None,
                    push_uri: str | None) -> str:
    """The transfer an update uses, or ValueError saying why none fits.

    ``simple_protocols``: the ``TransferProtocol`` values ``SimpleUpdate`` allows (``()``:
    any; None: no SimpleUpdate). ``auto`` prefers ``SimpleUpdate`` when it takes our image
    URL's protocol (the BMC pulls from our HTTP server: nothing streams through the daemon,
    and the BMC retries its own transfer), else ``MultipartHttpPushUri`` (OpenBMC's bmcweb,
    which compiles SimpleUpdate out or allows HTTPS only, iLO 6, newer iDRAC and Supermicro
    X13/H13); ``simple`` and ``multipart`` force one (``multipart``: BMCs that cannot reach
    our HTTP server)."""
    scheme = "HTTPS" if image.uri.startswith("https:") else "HTTP"
    simple_why = ("the UpdateService has no SimpleUpdate" if simple_protocols is None else
                  f"its SimpleUpdate does not take {scheme} (allowed: "
                  f"{', '.join(simple_protocols)})"
                  if simple_protocols and scheme not in simple_protocols else "")
    push_why = ("the UpdateService has no MultipartHttpPushUri" if not push_uri else
                f"a push needs the image in our artefact directory ({image.uri} is not)"
                if image.path is None else "")
    if image.transfer != "multipart" and not simple_why:
        return SIMPLE_UPDATE
    if image.transfer != "simple" and not push_why:
        return MULTIPART_PUSH
    reasons = [why for kind, why in (("simple", simple_why), ("multipart", push_why))
               if image.transfer in ("auto", kind)]
    raise ValueError(f"firmware_transfer {image.transfer}: no way to send {image.uri}: "
                     + "; ".join(reasons))
