"""Firmware drift per node and a wave's plan (provisioner.validation.drift, pure)."""

from __future__ import annotations

from provisioner.validation.baseline import Component, Wanted
from provisioner.validation.drift import (
    Candidate,
    Difference,
    Limits,
    firmware_drift,
    plan_wave,
)

BASELINE = (Wanted("BIOS", "1.2.0", "bios-1.2.0.bin"), Wanted("NIC.*", "22.41.1", "nic.bin"))
AT_BASELINE = [Component("BIOS", "1.2.0"), Component("NIC.Slot.1", "22.41.1"),
               Component("BMC", "5.10")]


def test_status_from_the_state_then_the_last_read() -> None:
    assert firmware_drift("active", AT_BASELINE, BASELINE).status == "conforming"
    assert firmware_drift("servicing", AT_BASELINE, BASELINE).status == "updating"
    assert firmware_drift("service_failed", AT_BASELINE, BASELINE).status == "failed"
    assert firmware_drift("active", None, BASELINE).status == "unknown"
    old = firmware_drift("active", [Component("BIOS", "1.0.0"), Component("BMC", "5.10")],
                         BASELINE)
    assert old.status == "drifted"
    assert old.differences == (Difference("BIOS", "1.0.0", "1.2.0"),
                               Difference("NIC.*", "", "22.41.1"))  # not reported at all


def _fleet(domains: int, per: int) -> list[Candidate]:
    return [Candidate(f"n{d}-{i}", f"d{d}-n{i:02d}", f"clique-{d}", f"rack-{d}")
            for d in range(domains) for i in range(per)]


def test_plan_keeps_max_nodes_and_each_domains_share() -> None:
    fleet = _fleet(3, 18)
    sizes = {f"clique-{d}": 18 for d in range(3)}
    racks = {f"rack-{d}": 18 for d in range(3)}
    limits = Limits(max_nodes=10, max_domain_share=0.25, max_rack_share=1.0)
    chosen = plan_wave(fleet, running=0, busy=[], domain_sizes=sizes, rack_sizes=racks,
                       limits=limits)
    per_domain = {d: sum(1 for c in chosen if c.domain == d) for d in sizes}
    assert per_domain == {"clique-0": 4, "clique-1": 4, "clique-2": 2}  # floor(18 * .25)
    # nodes serviced for another reason count against the share; running against N
    chosen = plan_wave(fleet, running=7, busy=[("clique-0", "rack-0")] * 3,
                       domain_sizes=sizes, rack_sizes=racks, limits=limits)
    assert [c.domain for c in chosen] == ["clique-0", "clique-1", "clique-1"]


def test_plan_finishes_begun_domains_first_and_a_tiny_share_still_moves() -> None:
    fleet = _fleet(2, 4)
    limits = Limits(max_nodes=1, max_domain_share=0.01, max_rack_share=0.01)
    chosen = plan_wave(fleet, running=0, busy=[], domain_sizes={"clique-0": 4, "clique-1": 4},
                       rack_sizes={"rack-0": 4, "rack-1": 4}, limits=limits,
                       started_domains={"clique-1"})
    assert [c.node_id for c in chosen] == ["n1-0"]
    none = plan_wave(fleet, running=0, busy=[("clique-0", None), (None, "rack-1")],
                     domain_sizes={"clique-0": 4, "clique-1": 4},
                     rack_sizes={"rack-0": 4, "rack-1": 4}, limits=Limits(5, 0.01, 0.01))
    assert none == []
