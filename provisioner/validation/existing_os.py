"""The existing-OS hold: an inspection that finds data on a node's disks (a partition table,
a file system, an LVM label: the ramdisk's ``disks`` facts, ``provisioner/agent/collect.py``)
holds the node in ``inspected`` before any deploy, as MAAS and Ironic do not but an operator
adopting a brownfield rack needs: a machine that already runs an OS is registered as running
(``register-running``), not re-imaged by the auto-deploy policy. Pure.

The hold ends when the node's profile allows overwriting (``[lifecycle] allow_overwrite``, a
list of profile names, ``*`` for all) or an operator allows it for the node (the
``allow-overwrite`` action, with a reason: ``node.facts[OVERRIDE_KEY]``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

OVERRIDE_KEY: Final = "overwrite_allowed"
"""``node.facts[OVERRIDE_KEY]``: ``{"by", "at", "reason"}`` of the operator's permission."""
OVERRIDE_EVENT: Final = "overwrite_allowed"
ALL: Final = "*"


def data_on_disks(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """One line per disk that holds data, from the inspection's facts."""
    disks = facts.get("disks")
    found: list[str] = []
    for disk in disks if isinstance(disks, list) else ():
        if not isinstance(disk, Mapping):
            continue
        what = []
        if signature := disk.get("signature"):
            what.append(f"{signature} signature")
        if isinstance(parts := disk.get("partitions"), int) and parts > 0:
            what.append(f"{parts} partition{'s' if parts != 1 else ''}")
        if what:
            found.append(f"disk {disk.get('name', '?')}: {', '.join(what)}")
    return tuple(found)


def held_for_existing_os(facts: Mapping[str, Any], profile: str | None,
                         allow_overwrite: Collection[str]) -> tuple[str, ...]:
    """Why a deploy would destroy an existing installation; ``()``: free to go."""
    if ALL in allow_overwrite or (profile is not None and profile in allow_overwrite):
        return ()
    if isinstance(facts.get(OVERRIDE_KEY), Mapping):
        return ()
    found = data_on_disks(facts)
    if not found:
        return ()
    return (f"an existing OS or data was found ({'; '.join(found)})",)
