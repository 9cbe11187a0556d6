"""Zero-touch BMC linking: the inspection report names the node's BMC (``facts.bmc``: the
address and MAC its LAN channel reports), and that links the node to it. Pure.

A report is unauthenticated data: credentials only ever go to an address the operator
allowed (``bmc.link_subnets``) or, for a BMC that moved, the address our own DHCP server
bound for that BMC's known MAC. Anything else is held for an operator, with a history row.

- A node without a BMC gets the reported one, on the site's driver for discovered BMCs,
  with the site default credentials (``bmc.default_username``/``default_password``), when
  the address is in ``bmc.link_subnets``; with no default credentials configured, nothing
  is linked (calls could only fail) and the report says why.
- A node whose BMC kept its MAC but moved (a DHCP'd BMC) follows the new address when it
  is in ``bmc.link_subnets`` or our DHCP server leased it to that MAC; driver, port and
  enrolled credentials stay.
- Any other disagreement with what an operator or an import enrolled is reported and left
  alone: the enrolment wins. A BMC MAC once known is never replaced by a report.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from provisioner.domain import BmcEndpoint, Node


@dataclass(frozen=True, slots=True)
class BmcLinkPolicy:
    driver: str | None
    """Driver for a BMC learned from a report; None: never link."""
    has_default_credentials: bool
    subnets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    """Where reported BMCs may be linked (``bmc.link_subnets``); empty: held, every one."""

    def allows(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip.version == net.version and ip in net for net in self.subnets)


@dataclass(frozen=True, slots=True)
class BmcLink:
    endpoint: BmcEndpoint | None
    """The endpoint to store; None: leave the node's BMC as it is."""
    mac: str | None
    reason: str
    """The history line; empty when nothing worth a row happened."""


def reported_bmc(node: Node, facts: dict[str, Any], policy: BmcLinkPolicy, *,
                 dhcp_bound: bool = False) -> BmcLink | None:
    """What the report's ``bmc`` changes for ``node``; None when nothing. ``dhcp_bound``:
    our DHCP server leased the reported address to the node's known BMC MAC."""
    bmc = facts.get("bmc")
    if not isinstance(bmc, dict):
        return None
    address, mac = _address(bmc.get("ip")), bmc.get("mac") or None
    if address is None:
        return None if mac is None or node.bmc_mac is not None else BmcLink(None, mac, "")
    current = node.bmc
    if current is None:
        if policy.driver is None:
            return BmcLink(None, mac, f"BMC {address} reported; linking is off "
                                      "(bmc.discovered_driver = none)")
        if not policy.has_default_credentials:
            return BmcLink(None, mac, f"BMC {address} reported, not linked: no site default "
                                      "credentials (bmc.default_username); enroll it with "
                                      "credentials")
        if not policy.allows(address):
            return BmcLink(None, None, f"BMC {address} reported, held for an operator: not "
                                       "in bmc.link_subnets, so the site default "
                                       "credentials are not sent to it; enroll it or allow "
                                       "its subnet")
        return BmcLink(BmcEndpoint(driver=policy.driver, address=address), mac,
                       f"BMC {address} ({policy.driver}) linked from the inspection report; "
                       "site default credentials")
    if current.address == address:
        return None if mac is None or node.bmc_mac is not None else BmcLink(None, mac, "")
    if mac is not None and mac == node.bmc_mac and current.driver != "fake":
        if not (dhcp_bound or policy.allows(address)):
            return BmcLink(None, None, f"BMC of MAC {mac} reported at {address}, held for "
                                       f"an operator: {current.address} kept (not in "
                                       "bmc.link_subnets, not leased to that MAC by our "
                                       "DHCP server)")
        moved = BmcEndpoint(driver=current.driver, address=address, port=current.port,
                            username=current.username, password_set=current.password_set)
        return BmcLink(moved, mac, f"BMC moved {current.address} \u2192 {address} (same MAC "
                                   f"{mac})")
    return BmcLink(None, None, f"inspection report names BMC {address}; enrolled "
                               f"{current.address} kept")


def _address(value: object) -> str | None:
    try:
        address = ipaddress.ip_address(str(value or ""))
    except ValueError:
        return None
    return None if address.is_unspecified else str(address)
