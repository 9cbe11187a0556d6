"""A profile's storage layout against what a node has (issue 25). Pure: the standard library
and ``errors`` only.

* ``Drive`` / ``Volume``: a Redfish ``Storage`` controller's ``Drives`` and ``Volumes``
  members (``Protocol``, ``MediaType``, ``CapacityBytes``; ``RAIDType``, ``Links.Drives``),
  or an inspected disk (``facts["disks"]``) for a software (mdadm) layout.
* ``plan_volumes``: the wanted volumes against those present: a volume of the same RAID type
  over drives the selector accepts, in the wanted number, is kept (left alone); the others
  are created from free drives; volumes outside the layout are deleted only with
  ``replace`` (else their drives are not free, and a layout that needs them fails, naming
  them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from provisioner.errors import FatalError

RAID_MIN_DRIVES: Final = {"None": 1, "RAID0": 2, "RAID1": 2, "RAID5": 3, "RAID6": 4,
                          "RAID10": 4}
MDADM_LEVELS: Final = {"RAID0": "0", "RAID1": "1", "RAID5": "5", "RAID6": "6", "RAID10": "10"}


@dataclass(frozen=True, slots=True)
class Drive:
    """A drive (Redfish) or an inspected disk (mdadm): ``ref`` is what the layout names it by
    (the Drive's URI, the disk's kernel name)."""

    ref: str
    capacity_bytes: int
    media: str  # "NVMe", "SSD", "HDD" or "" (unknown)

    @classmethod
    def from_redfish(cls, data: Mapping[str, Any]) -> Drive:
        protocol, kind = data.get("Protocol"), data.get("MediaType")
        media = "NVMe" if protocol == "NVMe" else str(kind) if kind in ("SSD", "HDD") else ""
        size = data.get("CapacityBytes")
        return cls(str(data.get("@odata.id", "")), size if isinstance(size, int) else 0, media)

    @classmethod
    def from_disk(cls, disk: Mapping[str, Any]) -> Drive:
        name = str(disk.get("name", ""))
        rotational = disk.get("rotational")
        media = "NVMe" if name.startswith("nvme") else "HDD" if rotational is True else \
            "SSD" if rotational is False else ""
        size = disk.get("size_bytes")
        return cls(name, size if isinstance(size, int) else 0, media)


@dataclass(frozen=True, slots=True)
class Volume:
    ref: str
    name: str
    raid: str
    drives: tuple[str, ...]

    @classmethod
    def from_redfish(cls, data: Mapping[str, Any]) -> Volume:
        links = data.get("Links")
        drives = links.get("Drives") if isinstance(links, dict) else None
        refs = tuple(str(d["@odata.id"]) for d in drives or [] if isinstance(d, dict)
                     and isinstance(d.get("@odata.id"), str))
        return cls(str(data.get("@odata.id", "")), str(data.get("Name", "")),
                   str(data.get("RAIDType") or "None"), refs)


@dataclass(frozen=True, slots=True)
class Controller:
    """One ``Storage`` member: its drives and volumes, and how changes apply."""

    uri: str
    volumes_uri: str
    drives: tuple[Drive, ...]
    volumes: tuple[Volume, ...]
    apply_times: tuple[str, ...] = ()

    @property
    def apply_time(self) -> str:
        """``Immediate`` where listed (or nothing is listed: the BMC's default), else
        ``OnReset``."""
        if not self.apply_times or "Immediate" in self.apply_times:
            return "Immediate"
        return "OnReset" if "OnReset" in self.apply_times else self.apply_times[0]


@dataclass(frozen=True, slots=True)
class WantedVolume:
    """One volume of a profile's layout: ``count`` None is every drive the selector
    accepts."""

    name: str
    raid: str
    count: int | None = None
    media: str | None = None
    min_bytes: int = 0
    via: str = "redfish"

    def accepts(self, drive: Drive) -> bool:
        return (self.media is None or drive.media.lower() == self.media.lower()) \
            and drive.capacity_bytes >= self.min_bytes

    def describe(self) -> str:
        what = f"{self.count}" if self.count is not None else "all"
        return (f"{self.name} ({self.raid} over {what} {self.media or ''} drives".replace(
            "  ", " ") + (f" of at least {self.min_bytes / 1e9:g} GB" if self.min_bytes
                          else "") + ")")


@dataclass(frozen=True, slots=True)
class VolumePlan:
    kept: tuple[tuple[WantedVolume, Volume], ...] = ()
    create: tuple[tuple[WantedVolume, tuple[Drive, ...]], ...] = ()
    delete: tuple[Volume, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return bool(self.create or self.delete)


def _satisfies(volume: Volume, wanted: WantedVolume, drives: Mapping[str, Drive]) -> bool:
    if volume.raid != wanted.raid or not volume.drives:
        return False
    if not all(ref in drives and wanted.accepts(drives[ref]) for ref in volume.drives):
        return False
    want = wanted.count if wanted.count is not None else sum(
        1 for d in drives.values() if wanted.accepts(d))
    return len(volume.drives) == want


def pick(wanted: WantedVolume, drives: Sequence[Drive], taken: set[str]) -> tuple[Drive, ...]:
    """The drives a new volume is made of: the selector's free drives, smallest first (the
    larger left for later volumes), in the wanted number; FatalError when too few."""
    fit = sorted((d for d in drives if wanted.accepts(d) and d.ref not in taken),
                 key=lambda d: (d.capacity_bytes, d.ref))
    want = wanted.count if wanted.count is not None else len(fit)
    need = max(want, RAID_MIN_DRIVES.get(wanted.raid, 1))
    if len(fit) < need:
        raise FatalError(f"storage layout: volume {wanted.describe()} needs {need} free "
                         f"drives, {len(fit)} fit and are free")
    return tuple(fit[:want])


def plan_volumes(wanted: Sequence[WantedVolume], volumes: Sequence[Volume],
                 drives: Sequence[Drive], *, replace: bool) -> VolumePlan:
    by_ref = {d.ref: d for d in drives}
    kept: list[tuple[WantedVolume, Volume]] = []
    left = list(volumes)
    todo: list[WantedVolume] = []
    for item in wanted:
        named = [v for v in left if v.name == item.name and _satisfies(v, item, by_ref)]
        found = named or [v for v in left if _satisfies(v, item, by_ref)]
        if found:
            kept.append((item, found[0]))
            left.remove(found[0])
        else:
            todo.append(item)
    delete = tuple(left) if replace and todo else ()
    taken = {ref for _, v in kept for ref in v.drives}
    if not replace or not todo:
        taken |= {ref for v in left for ref in v.drives}
    create: list[tuple[WantedVolume, tuple[Drive, ...]]] = []
    for item in todo:
        try:
            chosen = pick(item, drives, taken)
        except FatalError as exc:
            busy = ", ".join(f"{v.name or v.ref} ({v.raid})" for v in left)
            raise FatalError(f"{exc}" + (f"; drives held by volumes outside the layout: "
                                         f"{busy} (storage_replace = true deletes them)"
                                         if busy and not replace else "")) from exc
        taken |= {d.ref for d in chosen}
        create.append((item, chosen))
    notes = tuple(f"left alone: {v.name or v.ref} ({v.raid}) not in the layout"
                  for v in left) if not delete else ()
    return VolumePlan(tuple(kept), tuple(create), delete, notes)
