"""Firmware drift and firmware waves (issue 25). Pure: the standard library and the
baseline matcher only.

* ``firmware_drift``: one node's firmware as last read (``facts["firmware"]``, written by
  the ``firmware_inventory`` and ``firmware_update`` steps) against its profile's baseline:
  ``conforming``, ``drifted`` (with each component's have and want), ``updating`` (a
  runbook runs on it), ``failed`` (its last runbook failed) or ``unknown`` (never read).
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
    ('' where it reported no component matching ``component``, the baseline's pattern)."""

    component: str
    have: str
    want: str


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
