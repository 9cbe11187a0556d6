"""An operator's BMC requests outside the steps: power, boot device, a power state read out
of band, BMC work on an idle node (password rotation). A mixin of ``Conductor``: it works
under the conductor's per-node locks."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from provisioner.bmc.base import Bmc, BootDevice, PowerAction, PowerState
from provisioner.domain import Node
from provisioner.errors import Conflict, InvalidRequest
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.power import SYNC_ACTOR, apply_power
from provisioner.lifecycle.states import IN_FLIGHT
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

T = TypeVar("T")


class BmcRequests:
    _repo: NodeRepo
    _ports: Ports
    _locks: defaultdict[str, asyncio.Lock]

    async def record_power(self, node_id: str, state: str, *, actor: str = SYNC_ACTOR,
                           against: str | None = None) -> Node | None:
        """Record a power state read from the node's BMC. A change goes into the history
        (event ``power_sync``); None when nothing was recorded: no change, or a step is in
        flight (it owns the power), or (``against``: the recorded state the reading was
        taken against, ``""`` for none) another state was recorded while the BMC was read,
        so the reading may be older than it (an operator's power on during a sync's
        read). A first reading is stored without a history row."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.state in IN_FLIGHT or node.power_state == state:
                return None
            if against is not None and (node.power_state or "") != against:
                return None
            if node.power_state is None:
                await self._repo.note_power(node_id, state)
                return None
            reason = f"power {node.power_state}\u2192{state} out of band"
            node = await self._repo.record_power(node, state, event="power_sync", actor=actor,
                                                 reason=reason)
        log.info("node %s: %s (seen by %s)", node_id, reason, actor)
        return node

    async def power(self, node_id: str, action: PowerAction, *,
                    actor: str) -> tuple[Node, PowerState]:
        """An operator's power request. ``status`` reads, even while a step runs; the others
        need an idle node (Conflict while a step owns the BMC) and go into the history."""
        if action is PowerAction.STATUS:
            node = await self._repo.get(node_id)
            state = await self._with_bmc(node, lambda bmc: apply_power(bmc, action))
            await self.record_power(node_id, str(state), actor=actor)
            return await self._repo.get(node_id), state
        async with self._no_step(node_id, f"power {action}") as node:
            soft_off = self._ports.soft_off(node)
            state = await self._with_bmc(node, lambda bmc: apply_power(
                bmc, action, soft_off=soft_off))
            node = await self._repo.record_power(
                node, str(state), event="power_" + str(action).replace("-", "_"), actor=actor,
                reason=f"power {action} requested")
        log.info("node %s: power %s by %s", node_id, action, actor)
        return node, state

    async def set_boot_device(self, node_id: str, device: BootDevice, *, persistent: bool,
                              uefi: bool, actor: str) -> Node:
        """An operator's boot-device request; needs an idle node; goes into the history."""
        how = f"{'persistent' if persistent else 'once'}, {'UEFI' if uefi else 'legacy'}"
        async with self._no_step(node_id, "boot device") as node:
            uri = self._ports.http_boot_uri(node) if device is BootDevice.HTTP else None
            how += f", from {uri}" if uri else ""
            await self._with_bmc(node, lambda bmc: bmc.set_boot_device(
                device, persistent=persistent, uefi=uefi, http_uri=uri))
            node = await self._repo.transition(node, to_state=node.state, event="bootdev",
                                               actor=actor, reason=f"boot device {device} "
                                               f"({how})", reset_checkpoint=False)
        log.info("node %s: boot device %s (%s) by %s", node_id, device, how, actor)
        return node

    async def while_idle(self, node_id: str, what: str,
                         fn: Callable[[Node], Awaitable[T]]) -> T:
        """Run ``fn(node)`` under the node's lock, refused (Conflict) while a step owns the
        BMC: for BMC work outside the steps (password rotation)."""
        async with self._no_step(node_id, what) as node:
            return await fn(node)

    @asynccontextmanager
    async def _no_step(self, node_id: str, what: str) -> AsyncIterator[Node]:
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.state in IN_FLIGHT:
                raise Conflict(f"node {node_id} is {node.state}: its step owns the BMC; "
                               f"{what} refused until the step ends (or abort it)")
            yield node

    async def _with_bmc(self, node: Node, fn: Callable[[Bmc], Awaitable[T]]) -> T:
        if node.bmc is None:
            raise InvalidRequest(f"node {node.id} has no BMC endpoint")
        bmc = self._ports.bmc(node.id, node.bmc, await self._repo.credentials(node.id))
        try:
            return await fn(bmc)
        finally:
            await bmc.aclose()
