"""Zero-touch discovery: a MAC never seen that boots becomes a ``discovered`` node.

Rate-limited (a token bucket), so a flood of fake MACs cannot fill the store. Implements the
boot servers' ``BootInventory``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from provisioner.domain import KnownNode, MacChanges, NewNode, Node
from provisioner.errors import Conflict, NotFound
from provisioner.ids import normalize_mac
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import NodeState
from provisioner.store.mac_lookup import MacLookup
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class Discovery:
    """Also a MAC -> node cache for the boot servers' hot path. The conductor, the only
    writer of node state, puts the node as written after each of its transitions."""

    def __init__(self, repo: NodeRepo, conductor: Conductor, bucket: TokenBucket,
                 *, macs: MacLookup | None = None, cache_size: int = 100_000,
                 unknown_ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._repo = repo
        self._macs = macs  # the boot servers' look-ups, one read per burst
        self._conductor = conductor
        self._bucket = bucket
        self._refused = 0
        self._cache: dict[str, Node] = {}
        self._owners: dict[str, KnownNode] = {}  # what ``lookup`` found through ``macs``
        self._cache_size = cache_size
        # MACs the store does not know, until when. Every MAC reaches the store through the
        # conductor (enroll, adopt), which clears them; the TTL covers other daemons sharing
        # a PostgreSQL store.
        self._unknown: dict[str, float] = {}
        self._unknown_ttl_s = unknown_ttl_s
        self._clock = clock
        self._listeners: list[Callable[[MacChanges | None], None]] = []
        conductor.add_observer(self._refresh)

    def add_listener(self, listener: Callable[[MacChanges | None], None]) -> None:
        """``listener(changes)`` whenever what ``lookup`` answers for some MACs changed:
        MAC -> its answer now, as the conductor wrote it, or None (ask the store again);
        ``changes`` None: any MAC. The DHCP worker processes' caches follow this one."""
        self._listeners.append(listener)

    def _changed(self, changes: MacChanges | None) -> None:
        for listener in self._listeners:
            listener(changes)

    async def lookup(self, mac: str) -> KnownNode | None:
        """The boot servers' question, from the caches first; a miss is asked through
        ``macs`` (one read for a burst) when the daemon gave one."""
        if (node := self._cache.get(mac)) is not None:
            return KnownNode(node.id, node.hostname, str(node.state))
        if (known := self._owners.get(mac)) is not None:
            return known
        if self._unknown.get(mac, 0.0) > self._clock():
            return None
        if self._macs is None:
            node = await self._find(mac)
            return None if node is None else KnownNode(node.id, node.hostname, str(node.state))
        owner = await self._macs.owner(normalize_mac(mac))
        if owner is None:
            self._remember_unknown(mac)
            return None
        if len(self._owners) >= self._cache_size:
            self._owners.clear()
        known = self._owners[mac] = KnownNode(owner.node_id, owner.hostname, owner.state)
        return known

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        await self.ensure_node(mac, client)

    async def ensure_node(self, mac: str, client: str = "") -> Node | None:
        """The node owning ``mac``; enrolls a ``discovered`` one for a new MAC unless the
        discovery rate is exceeded (then None: the caller tells the machine to retry)."""
        mac = normalize_mac(mac)
        node = await self._find(mac)
        if node is not None:
            return node
        if not self._bucket.take():
            self._refused += 1
            if self._refused % 100 == 1:
                log.warning("discovery rate exceeded: %d unknown MACs deferred so far",
                            self._refused)
            return None
        try:
            node = await self._conductor.enroll(
                NewNode(state=NodeState.DISCOVERED, macs=(mac,)), actor="discovery",
                reason=f"unknown MAC {mac} booted ({client or 'http'})")
        except Conflict:  # the DHCP and HTTP servers raced for the same MAC
            return await self._find(mac)
        return node

    async def _find(self, mac: str) -> Node | None:
        if (node := self._cache.get(mac)) is not None:
            return node
        if self._unknown.get(mac, 0.0) > self._clock():
            return None
        try:
            node = await self._repo.find(mac)
        except NotFound:
            self._remember_unknown(mac)
            return None
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        for known in node.macs:
            self._cache[known] = node
        return node

    async def current(self, node: Node) -> Node:
        """The node as stored now: what a step wrote since the cache's copy (its facts; the
        cache follows only the conductor's transitions)."""
        return await self._repo.get(node.id)

    def _remember_unknown(self, mac: str) -> None:
        if len(self._unknown) >= self._cache_size:
            self._unknown.clear()
        self._unknown[mac] = self._clock() + self._unknown_ttl_s

    def _refresh(self, node: Node, _event: str, _before: NodeState) -> None:
        """The conductor wrote ``node``: its MACs now answer with it, with no read (in a
        boot storm the iPXE script of every new node came right after its enrolment and
        auto-inspection, each of which used to drop it from the cache)."""
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        known = KnownNode(node.id, node.hostname, str(node.state))
        changes: MacChanges = {}
        for mac in node.macs:
            self._owners.pop(mac, None)
            self._unknown.pop(mac, None)
            cached = self._cache.get(mac)
            if cached is None or cached.version <= node.version:
                self._cache[mac] = node
                changes[mac] = known
            else:  # an older write reported late: the workers read what is newer
                changes[mac] = None
        self._changed(changes)

    def forget(self, macs: Iterable[str]) -> None:
        """Drop these MACs from both caches (a node changed, here or on another daemon)."""
        changes: MacChanges = {}
        for mac in macs:
            self._cache.pop(mac, None)
            self._owners.pop(mac, None)
            self._unknown.pop(mac, None)
            changes[mac] = None
        self._changed(changes)

    def forget_all(self) -> None:
        """Notices from other daemons may have been missed (the listen connection was
        lost): start both caches afresh."""
        self._cache.clear()
        self._owners.clear()
        self._unknown.clear()
        self._changed(None)
