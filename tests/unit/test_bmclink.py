"""Zero-touch BMC linking rules (``lifecycle/bmclink.py``): link a node without a BMC, follow
a BMC that moved (same MAC), never overwrite what an operator enrolled."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from provisioner.domain import BmcEndpoint, Node, NodeId
from provisioner.lifecycle.bmclink import BmcLinkPolicy, reported_bmc
from provisioner.lifecycle.states import NodeState

LINK = BmcLinkPolicy(driver="ipmi", has_default_credentials=True,
                     subnets=(ipaddress.ip_network("10.0.0.0/24"),))
NOW = datetime(2026, 11, 21, tzinfo=UTC)
NODE = Node(id=NodeId("n1"), state=NodeState.INSPECTING, hostname=None, serial="S1",
            macs=("52:54:00:00:00:01",), maintenance=False, maintenance_reason="",
            profile=None, rack=None, position=None, facts={}, last_error="", checkpoint=(),
            version=1, history_seq=1, bmc=None, created_at=NOW, updated_at=NOW)
ENROLLED = BmcEndpoint(driver="redfish", address="10.0.0.5", port=8443, username="ops",
                       password_set=True)


def report(ip: str | None, mac: str | None = "aa:bb:cc:00:00:01") -> dict[str, object]:
    return {"bmc": {k: v for k, v in (("ip", ip), ("mac", mac)) if v is not None}}


def test_a_node_without_a_bmc_is_linked_with_the_site_defaults() -> None:
    link = reported_bmc(NODE, report("10.0.0.9"), LINK)
    assert link is not None and link.endpoint == BmcEndpoint(driver="ipmi", address="10.0.0.9")
    assert link.mac == "aa:bb:cc:00:00:01" and "site default credentials" in link.reason


@pytest.mark.parametrize(("policy", "needle"), [
    (BmcLinkPolicy(driver="ipmi", has_default_credentials=False), "no site default"),
    (BmcLinkPolicy(driver=None, has_default_credentials=True), "linking is off"),
])
def test_no_link_without_credentials_or_when_turned_off(policy: BmcLinkPolicy,
                                                         needle: str) -> None:
    link = reported_bmc(NODE, report("10.0.0.9"), policy)
    assert link is not None and link.endpoint is None and needle in link.reason
    assert link.mac == "aa:bb:cc:00:00:01"  # remembered: a later move is recognised


@pytest.mark.parametrize("address", ["10.0.1.9", "192.0.2.66", "fd00::9"])
def test_a_reported_bmc_outside_the_allowed_subnets_is_held(address: str) -> None:
    """Security: the site default credentials go only where the operator allowed."""
    link = reported_bmc(NODE, report(address), LINK)
    assert link is not None and link.endpoint is None and link.mac is None
    assert "held for an operator" in link.reason
    nothing_allowed = BmcLinkPolicy(driver="ipmi", has_default_credentials=True)
    held = reported_bmc(NODE, report("10.0.0.9"), nothing_allowed)
    assert held is not None and held.endpoint is None


def test_a_moved_bmc_outside_the_subnets_is_followed_only_to_our_own_lease() -> None:
    node = replace(NODE, bmc=ENROLLED, bmc_mac="aa:bb:cc:00:00:01")
    held = reported_bmc(node, report("192.0.2.66"), LINK)
    assert held is not None and held.endpoint is None and "held" in held.reason
    leased = reported_bmc(node, report("192.0.2.66"), LINK, dhcp_bound=True)
    assert leased is not None and leased.endpoint == replace(ENROLLED, address="192.0.2.66")


def test_a_bmc_that_moved_is_followed_keeping_driver_port_and_credentials() -> None:
    node = replace(NODE, bmc=ENROLLED, bmc_mac="aa:bb:cc:00:00:01")
    link = reported_bmc(node, report("10.0.0.77"), LINK)
    assert link is not None and link.endpoint == replace(ENROLLED, address="10.0.0.77")
    assert link.reason == "BMC moved 10.0.0.5 \u2192 10.0.0.77 (same MAC aa:bb:cc:00:00:01)"


@pytest.mark.parametrize("bmc_mac", [None, "aa:bb:cc:00:00:99"])
def test_an_enrolled_bmc_is_never_overwritten(bmc_mac: str | None) -> None:
    node = replace(NODE, bmc=ENROLLED, bmc_mac=bmc_mac)
    link = reported_bmc(node, report("10.0.0.77"), LINK)
    assert link is not None and link.endpoint is None
    assert link.reason == "inspection report names BMC 10.0.0.77; enrolled 10.0.0.5 kept"


@pytest.mark.parametrize("facts", [
    {}, {"bmc": "10.0.0.9"}, report(None, None), report("0.0.0.0", None),
    report("not-an-ip", None), report("10.0.0.5", None),
])
def test_nothing_to_do(facts: dict[str, object]) -> None:
    assert reported_bmc(replace(NODE, bmc=ENROLLED), facts, LINK) is None


def test_same_address_only_remembers_a_new_mac_quietly() -> None:
    link = reported_bmc(replace(NODE, bmc=ENROLLED), report("10.0.0.5"), LINK)
    assert link is not None and (link.endpoint, link.reason) == (None, "")
    assert link.mac == "aa:bb:cc:00:00:01"
    # a known BMC MAC is never replaced by a report (a later "move" would follow it)
    known = replace(NODE, bmc=ENROLLED, bmc_mac="aa:bb:cc:00:00:02")
    assert reported_bmc(known, report("10.0.0.5"), LINK) is None
