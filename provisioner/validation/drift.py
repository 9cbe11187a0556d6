"""Firmware, BIOS and BMC settings drift, and firmware waves (issue 25). Pure: the standard
library and the baseline matchers only.

* ``firmware_drift``: one node's firmware as last read (``facts["firmware"]``, written by
  the ``firmware_inventory`` and ``firmware_update`` steps) against its profile's baseline:
  ``conforming``, ``drifted`` (with each component's have and want), ``updating`` (a
  runbook runs on it), ``failed`` (its last runbook failed) or ``unknown`` (never read).
* ``settings_drift``: the same for the BIOS attributes (``facts["bios_settings"]``, kept by
  ``bios_settings`` and ``firmware_inventory``) or the BMC settings (``facts["bmc_settings"]``)
  as last read: each setting whose value differs is a difference (name, have, want);
  pending settings show as ``updating`` while the runbook that wrote them runs.
* ``combine``: a node's status over its parts: updating or failed as its state says, else
  drifted when any part drifted, unknown when any part was never read, else conforming.
* ``plan_wave``: which drifted nodes a wave starts now, so that at most ``max_nodes`` of
  its nodes are being serviced at once and no NVLink domain or rack has more than its
  share being serviced at any moment (nodes serviced for any reason count).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from provisioner.validation.baseline import Component, Wanted, match_firmware
from provisioner.validation.bmc_settings import differences as setting_differences

CONFORMING = "conforming"
DRIFTED = "drifted"
UPDATING = "updating"
FAILED = "failed"
UNKNOWN = "unknown"
STATUSES: tuple[str, ...] = (CONFORMING, DRIFTED, UPDATING, FAILED, UNKNOWN)

SERVICING_STATE = "servicing"
SERVICE_FAILED_STATE = "service_failed"


@dataclass(frozen=True, slots=True)
class Difference:
    """One baseline component the node does not have: ``have`` is what the BMC reported
    ('' where it reported no component matching ``component``, the baseline's pattern).
    ``kind``: ``firmware`` (a component and its version), ``bios`` or ``bmc`` (a setting
    and its value, as text)."""

    component: str
    have: str
    want: str
    kind: str = "firmware"


@dataclass(frozen=True, slots=True)
class Drift:
    status: str
    differences: tuple[Difference, ...] = ()


def firmware_drift(state: str, components: Sequence[Component] | None,
                   baseline: Sequence[Wanted]) -> Drift:
    """``components``: the last FirmwareInventory read, None when never read."""
    if state == SERVICING_STATE:
        return Drift(UPDATING)
    if state == SERVICE_FAILED_STATE:
        return Drift(FAILED)
    if components is None:
        return Drift(UNKNOWN)
    view = match_firmware(components, baseline)
    differences = tuple(
        [Difference(m.component.id, m.component.version, m.wanted.version)
         for m in view.drifted]
        + [Difference(w.pattern, "", w.version) for w in view.unmatched])
    return Drift(DRIFTED if differences else CONFORMING, differences)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple | list):
        return ", ".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_drift(state: str, current: Mapping[str, object] | None,
                   wanted: Mapping[str, object], kind: str) -> Drift:
    """``current``: the settings as last read, None when never read."""
    if state == SERVICING_STATE:
        return Drift(UPDATING)
    if state == SERVICE_FAILED_STATE:
        return Drift(FAILED)
    if current is None:
        return Drift(UNKNOWN)
    found = tuple(Difference(name, _text(have), _text(want), kind)
                  for name, have, want in setting_differences(wanted, current))
    return Drift(DRIFTED if found else CONFORMING, found)


def combine(parts: Sequence[Drift]) -> Drift:
    """One node's status over its parts (firmware, BIOS, BMC settings)."""
    statuses = {p.status for p in parts}
    for status in (UPDATING, FAILED, DRIFTED, UNKNOWN):
        if status in statuses:
            return Drift(status, tuple(d for p in parts for d in p.differences))
    return Drift(CONFORMING)


# -- waves ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    max_nodes: int
    max_domain_share: float
    max_rack_share: float

    def per_group(self, size: int, share: float) -> int:
        """How many of a group of ``size`` may be serviced at once: ``share`` of it rounded
        down, at least one (a share too small for one node would never start any)."""
        return max(1, math.floor(size * share + 1e-9))


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    name: str
    domain: str | None
    rack: str | None


def plan_wave(candidates: Iterable[Candidate], *, running: int,
              busy: Iterable[tuple[str | None, str | None]],
              domain_sizes: Mapping[str, int], rack_sizes: Mapping[str, int],
              limits: Limits, started_domains: Iterable[str] = ()) -> list[Candidate]:
    """The candidates to start now. ``running``: the wave's nodes being serviced now;
    ``busy``: (domain, rack) of every node being serviced now, the wave's and others';
    ``started_domains``: domains the wave has touched (finished first, so a domain's trays
    end with equal firmware as soon as possible)."""
    in_domain: Counter[str] = Counter()
    in_rack: Counter[str] = Counter()
    for domain, rack in busy:
        if domain:
            in_domain[domain] += 1
        if rack:
            in_rack[rack] += 1
    begun = set(started_domains)
    order = sorted(candidates, key=lambda c: (c.domain not in begun, c.domain or "",
                                              c.rack or "", c.name, c.node_id))
    chosen: list[Candidate] = []
    for cand in order:
        if running + len(chosen) >= limits.max_nodes:
            break
        if cand.domain and in_domain[cand.domain] >= limits.per_group(
                domain_sizes.get(cand.domain, 1), limits.max_domain_share):
            continue
        if cand.rack and in_rack[cand.rack] >= limits.per_group(
                rack_sizes.get(cand.rack, 1), limits.max_rack_share):
            continue
        chosen.append(cand)
        if cand.domain:
            in_domain[cand.domain] += 1
        if cand.rack:
            in_rack[cand.rack] += 1
    return chosen
