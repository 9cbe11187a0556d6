"""Memory and disks against a profile (the SKU gate's and the validation gate's). Pure.

Memory is the kernel's ``MemTotal`` (``memory_mib`` in a facts report), which is below the
installed size (firmware and kernel reservations): a profile names the least it accepts.
Disks are the report's block devices (the collectors leave out loop, RAM and optical ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_GIB = 1 << 30


def check_memory(report: Mapping[str, Any], min_gib: float) -> list[str]:
    mib = report.get("memory_mib")
    if not isinstance(mib, int) or isinstance(mib, bool):
        return [f"memory: the report has no memory size, expected at least {min_gib:g} GiB"]
    if mib < min_gib * 1024:
        return [f"memory: saw {mib / 1024:.1f} GiB, expected at least {min_gib:g} GiB"]
    return []


def check_disks(report: Mapping[str, Any], count: int | None, min_gb: float | None
                ) -> list[str]:
    """``count`` disks of at least ``min_gb`` GB (10^9 bytes, as disks are sold) each; with
    only ``min_gb``, at least one such disk."""
    listed = report.get("disks")
    disks = [(str(d.get("name", "?")), d.get("size_bytes"))
             for d in (listed if isinstance(listed, list) else []) if isinstance(d, Mapping)]
    sized = [(name, size if isinstance(size, int) and not isinstance(size, bool) else 0)
             for name, size in disks]
    big = [(name, size) for name, size in sized
           if min_gb is None or size >= min_gb * 1e9]
    failures = []
    seen = ", ".join(f"{name} {size / 1e9:g} GB" for name, size in sized) or "none"
    want = f" of at least {min_gb:g} GB" if min_gb is not None else ""
    if count is not None and len(big) != count:
        failures.append(f"disks: saw {len(big)} disks{want} ({seen}), expected {count}")
    elif count is None and min_gb is not None and not big:
        failures.append(f"disks: no disk{want} ({seen})")
    return failures
