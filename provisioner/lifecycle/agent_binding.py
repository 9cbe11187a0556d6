"""Where a node's agent token may be used from (docs/security.md, "provisioning network").

The provisioning network is hostile: ``GET /boot/<mac>.ipxe`` hands the node's agent token to
whoever asks with that MAC. So a token is bound to its node *and* to a source address:

- **a DHCP lease** (``dhcp.mode = authoritative``): the addresses our DHCP server gave the
  node's MACs. The boot script (which carries the token) is served only to them (and to
  nobody while the node has no lease: no first use), and every agent call (facts, command,
  result, seed, callback, fabric) must come from one of them. No client message removes a
  known node's lease (a DECLINE is ignored for it, ``LeaseRepo.decline``).
- **no lease** (proxy DHCP, a relay to a site's DHCP, ``dhcp.mode = off``): trust on first
  use. The first address a token is used from is the only one it works from afterwards
  (per token: a fresh token issued meanwhile never moves an older one's binding). When
  the agent reports the image written, the node reboots into its OS, whose address may differ:
  the binding is released and the OS's first call binds again. A binding unused for
  ``idle_rebind_s`` (the agent polls every few seconds while it runs; a node that reboots
  is silent for minutes) goes too, so a node the site's DHCP gave a new address after a
  reboot is not locked out until its token rotates.

A refusal is an error with a clear message; the caller writes it to the node's history.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from provisioner.errors import ProvisionerError

_MAX_BINDINGS = 100_000
IDLE_REBIND_S = 120.0


class SourceRefused(ProvisionerError):
    """A boot script or an agent call came from an address the node's token is not bound to."""


class LeasedAddresses(Protocol):
    """The address the DHCP server bound for a MAC (its last lease), or None: no lease."""

    async def leased_address(self, mac: str) -> str | None: ...


def canonical_ip(text: str | None) -> str | None:
    """An IP address in its canonical form (IPv4-mapped IPv6 unwrapped), else None."""
    try:
        address = ipaddress.ip_address(text or "")
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


class RefusalLog:
    """Which refusals get a history row: the first from a (node, event, source), then one per
    interval that counts those refused in between. The interval starts at ``interval_s`` and
    doubles while the refusals go on, up to ``max_interval_s`` (back to the start after a
    quiet interval): a source that never stops costs a few dozen rows a day, not one every
    ``interval_s``, and no refusal goes unaccounted for."""

    def __init__(self, *, interval_s: float = 10.0, max_interval_s: float = 3600.0,
                 max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s, self._max_interval_s = interval_s, max_interval_s
        self._max_keys, self._clock = max_keys, clock
        # key -> (time of the last row, refusals since, the interval now)
        self._seen: OrderedDict[tuple[str, str, str], tuple[float, int, float]] = OrderedDict()

    def note(self, node_id: str, event: str, source: str) -> int | None:
        """None: no row now (counted for the next one); else how many were refused since
        the previous row."""
        key, now = (node_id, event, source), self._clock()
        last = self._seen.pop(key, None)
        if last is not None and now - last[0] < last[2]:
            self._seen[key] = (last[0], last[1] + 1, last[2])
            return None
        interval = self._interval_s
        if last is not None and last[1] and now - last[0] < 2 * last[2]:  # it went on
            interval = min(self._max_interval_s, 2 * last[2])
        self._seen[key] = (now, 0, interval)
        while len(self._seen) > self._max_keys:
            self._seen.popitem(last=False)
        return last[1] if last is not None else 0


class AgentBinding:
    """The address rule above, for one daemon. First-use bindings live in memory, one per
    token (a restart binds each token again at its next call; a fresh token never moves the
    binding of an older one); lease bindings are read from the lease store each time.
    ``authoritative``: our DHCP server gives the addresses, so a boot script, which carries
    the token, goes only to a leased address: a node without a lease gets none (no first use
    for a token a script hands out)."""

    def __init__(self, leases: LeasedAddresses | None = None, *, authoritative: bool = False,
                 max_bindings: int = _MAX_BINDINGS, idle_rebind_s: float = IDLE_REBIND_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._leases = leases
        self._authoritative = authoritative and leases is not None
        self._max = max_bindings
        self._idle_rebind_s = idle_rebind_s
        self._clock = clock
        # sha256 of a token -> (node id, address it was first used from, last used)
        self._first_use: OrderedDict[str, tuple[str, str, float]] = OrderedDict()

    async def leased(self, macs: tuple[str, ...]) -> set[str]:
        if self._leases is None:
            return set()
        found = set()
        for mac in macs:
            address = canonical_ip(await self._leases.leased_address(mac))
            if address is not None:
                found.add(address)
        return found

    async def check_boot(self, node_id: str, macs: tuple[str, ...], remote: str | None) -> None:
        """A boot script (with the token in it) goes only to a leased address, if any (in
        authoritative mode, only to one)."""
        leased = await self.leased(macs)
        address = canonical_ip(remote)
        if leased and address not in leased:
            raise SourceRefused(
                f"boot script of node {node_id} asked for from {address or 'an unknown address'}"
                f"; the DHCP server bound {', '.join(sorted(leased))} for its MAC")
        if not leased and self._authoritative:
            raise SourceRefused(
                f"boot script of node {node_id} asked for from {address or 'an unknown address'}"
                "; the DHCP server bound no address for its MAC")

    async def check_call(self, node_id: str, macs: tuple[str, ...], token: str,
                         remote: str | None) -> None:
        """An agent call with the node's valid token: refused (``SourceRefused``) from an
        address the token is not bound to."""
        address = canonical_ip(remote)
        shown = address or "an unknown address"
        leased = await self.leased(macs)
        if leased:
            if address not in leased:
                raise SourceRefused(
                    f"agent token of node {node_id} used from {shown}; the DHCP server "
                    f"bound {', '.join(sorted(leased))} for its MAC")
            return
        if address is None:
            raise SourceRefused(f"agent token of node {node_id} used from {shown}")
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        bound = self._first_use.get(digest)
        if bound is not None and bound[1] != address and now - bound[2] < self._idle_rebind_s:
            raise SourceRefused(
                f"agent token of node {node_id} used from {shown}; it is bound to "
                f"{bound[1]}, the first address it was used from")
        # first use, the same address, or a binding idle long enough
        self._first_use[digest] = (node_id, address, now)
        self._first_use.move_to_end(digest)
        while len(self._first_use) > self._max:
            self._first_use.popitem(last=False)

    def release(self, node_id: str) -> None:
        """The node reboots into another system (its image is written): its next call binds
        its tokens again (first-use rule only; a lease binding stays)."""
        for digest in [d for d, (owner, _, _) in self._first_use.items() if owner == node_id]:
            del self._first_use[digest]
