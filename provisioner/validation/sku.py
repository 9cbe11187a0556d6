"""The SKU gate: a profile's hardware checked on the inspection ramdisk's facts, before
anything is installed. Pure.

At the end of ``inspecting`` the node's facts get a record under ``node.facts["sku"]`` (a
``ValidationRecord``: every failure line at once, as the validation gate writes after the OS
is up). A failed record holds the node in ``inspected``: the deploy policy skips it and an
operator's ``deploy`` is refused with the reasons, until an operator overrides the gate for
that node (``node.facts["sku_override"]``: who, when, why), or a new inspection passes.

Checked here: GPU count and model (from PCI: no driver in the ramdisk; named through
``provisioner.agent.gpu_ids``), InfiniBand port count and rate of the ports whose link layer
is InfiniBand (not the port state: a subnet manager may not have brought a port up yet; when
the ramdisk loaded no InfiniBand driver the check is not run and the record's ``notes`` and a
``sku_not_checked`` history row say "InfiniBand not checked at inspection: no driver"),
memory and disks. NVLink fabric and DCGM need the driver: they stay with the validation
gate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from provisioner.validation.checks import Expectation
from provisioner.validation.record import ValidationRecord

KEY: Final = "sku"
"""``node.facts[KEY]``: the SKU gate's record of the last inspection."""
OVERRIDE_KEY: Final = "sku_override"
"""``node.facts[OVERRIDE_KEY]``: ``{"by", "at", "reason"}`` of the operator's override."""
HELD_EVENT: Final = "sku_held"
"""The history row an inspection writes when the node does not match its profile."""
OVERRIDE_EVENT: Final = "sku_override"
NOTE_EVENT: Final = "sku_not_checked"
"""The history row of a check the ramdisk's facts cannot answer (no InfiniBand driver)."""
CHECKED: Final = "sku-gate"
"""The inspecting step's sub-step that writes the record."""


def sku_expectation(expect: Expectation) -> Expectation:
    """What of a profile the ramdisk can show: the hardware, not the driver's view."""
    return dataclasses.replace(expect, nvlink_domain=False, nvlink_domain_nodes=None,
                               require_dcgm=False, ib_require_active=False, imex=None)


def asks_anything(expect: Expectation) -> bool:
    return any(value is not None for value in (
        expect.gpu_count, expect.gpu_model, expect.ib_rate_gbps, expect.ib_port_count,
        expect.memory_min_gib, expect.disk_count, expect.disk_min_gb))


def inspection_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The ramdisk's own facts (the OS-level report and the records are left out)."""
    return {key: value for key, value in facts.items()
            if key not in ("last_report", "validation", KEY, OVERRIDE_KEY)}


def held_reasons(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """Why the node may not be deployed: the failures of its last SKU record, unless an
    operator overrode the gate after that record was written. ``()``: free to go."""
    record = ValidationRecord.from_facts({"validation": facts.get(KEY)})
    if record is None or record.passed:
        return ()
    override = facts.get(OVERRIDE_KEY)
    if isinstance(override, Mapping) and _not_before(str(override.get("at", "")), record.at):
        return ()
    return record.failures or ("SKU check failed",)


def _not_before(at: str, since: str) -> bool:
    """ISO 8601 times compared as times (``…21+00:00`` is before ``…21.5+00:00``)."""
    try:
        return datetime.fromisoformat(at) >= datetime.fromisoformat(since)
    except ValueError:
        return False


def override_entry(actor: str, reason: str, at: str) -> dict[str, str]:
    return {"by": actor, "at": at, "reason": reason}
