"""Node leases for the conductor (several daemons on one database, docs/ha.md): claiming,
renewing and taking over the leases of in-flight nodes. A mixin of ``Conductor``: it works
on the conductor's running steps and fencing numbers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, Final

from provisioner.config import LifecycleSettings
from provisioner.domain import Node
from provisioner.errors import Conflict, Fenced, NotFound
from provisioner.lifecycle.states import IN_FLIGHT, NodeState
from provisioner.store.ownership import OwnershipRepo
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

WAITING: Final = (NodeState.DISCOVERED, NodeState.ENROLLED, NodeState.INSPECTED)


class LeasedSteps:
    _repo: NodeRepo
    _own: OwnershipRepo | None
    _fences: dict[str, int]  # node id -> fencing number of the lease we hold
    _settings: LifecycleSettings
    _running: dict[str, tuple[NodeState, asyncio.Task[None]]]

    def _start(self, node: Node) -> None:
        raise NotImplementedError

    def _hold(self, node_id: str, on: bool) -> None:
        raise NotImplementedError

    async def _apply_policy(self, node: Node) -> None:
        raise NotImplementedError

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        raise NotImplementedError

    def remote_change(self, node_id: str) -> None:
        """Another daemon wrote this node (NOTIFY): if we run its step, pick up a
        maintenance flag set or cleared there (the step parks or goes on here)."""
        if node_id in self._running:
            self._spawn_task(self._refresh_hold(node_id), f"hold:{node_id}")

    async def _refresh_hold(self, node_id: str) -> None:
        try:
            node = await self._repo.get(node_id)
        except NotFound:
            return
        self._hold(node_id, node.maintenance)

    async def take_over(self, *, limit: int | None) -> int:
        """Resume in-flight nodes nobody drives: at start, ours from before a restart (all
        of them, without leases); with leases, those whose lease is free or expired (a dead
        or cut-off daemon's), claimed first."""
        if self._own is None:
            in_flight = await self._repo.in_states(IN_FLIGHT)
        else:  # claim first: a round that finds nothing reads no node
            claimed = await self._own.claim_orphans(
                [str(st) for st in IN_FLIGHT], limit if limit is not None else 1_000_000)
            if not claimed:
                return 0
            self._fences.update(claimed)
            in_flight = []
            for node_id, fence in claimed.items():
                try:
                    node = await self._repo.get(node_id)
                except NotFound:  # adopted (deleted) meanwhile
                    self._fences.pop(node_id, None)
                    continue
                if node.state in IN_FLIGHT:
                    in_flight.append(node)
                else:  # left flight between the claim and the read
                    self._fences.pop(node_id, None)
                    await self._own.release(node_id, fence)
        for node in in_flight:
            self._hold(node.id, node.maintenance)
            log.info("node %s: resuming %s after %s%s", node.id, node.state,
                     ", ".join(node.checkpoint) or "nothing done",
                     f" (lease fence {self._fences[node.id]})" if node.id in self._fences
                     else "")
            self._start(node)
        return len(in_flight)

    async def renew_leases(self) -> int:
        """Extend the leases of our running steps; a step whose lease was lost (we were cut
        off longer than the lease, another daemon took the node) is cancelled at once: its
        writes would be refused anyway. Returns the number lost."""
        if self._own is None or not self._fences:
            return 0
        held = dict(self._fences)
        ours = await self._own.renew(held)
        lost = 0
        for node_id in held.keys() - ours:
            if self._fences.get(node_id) != held[node_id]:
                continue  # released or claimed anew while we renewed
            del self._fences[node_id]
            lost += 1
            log.warning("node %s: lease (fence %d) lost to another daemon; stopping its step",
                        node_id, held[node_id])
            if (running := self._running.get(node_id)) is not None:
                running[1].cancel()
        return lost

    def stand_down(self, unconfirmed_s: float) -> int:
        """The database has not confirmed our leases for ``unconfirmed_s``: they may expire
        and another daemon take the nodes over while it cannot tell us. Stop driving them now,
        before that can happen (a BMC call after it would be a second side effect); their
        leases expire and are taken over (by us too) once the database answers. Returns the
        number of steps stopped."""
        held, self._fences = self._fences, {}
        stopped = 0
        for node_id in held:
            if (running := self._running.get(node_id)) is not None:
                running[1].cancel()
                stopped += 1
        if held:
            log.warning("leases not confirmed for %.1f s (the database does not answer): "
                        "stopped driving %d nodes (%d steps) before another daemon may take "
                        "them over", unconfirmed_s, len(held), stopped)
        return stopped

    async def apply_stale_policies(self, older_than_s: float) -> int:
        """Apply the policy to waiting nodes untouched for ``older_than_s``: a daemon that
        died between a step's end and the next step's start left them waiting."""
        horizon = datetime.now(UTC).timestamp() - older_than_s
        done = 0
        acting = [st for st, on in ((NodeState.DISCOVERED, self._settings.auto_inspect),
                                    (NodeState.ENROLLED, self._settings.auto_inspect),
                                    (NodeState.INSPECTED, self._settings.auto_deploy)) if on]
        for node_id, (_state, updated) in (await self._repo.stamps(acting)).items():
            stamp = updated if updated.tzinfo is not None else updated.replace(tzinfo=UTC)
            if stamp.timestamp() > horizon or node_id in self._running:
                continue
            node = await self._repo.get(node_id)
            if not node.maintenance:
                await self._apply_policy(node)
                done += 1
        return done

    async def _lease(self, node_id: str, *, step: bool, needed: bool,
                     force: bool) -> tuple[int | None, bool]:
        """The fencing number for a write that starts, ends or belongs to a step, and
        whether we claimed it just now. A step's own outcome never claims: if its lease was
        lost, the write is refused (Fenced). An operator's abort takes the lease from the
        daemon driving the node (that daemon's writes are refused from then on)."""
        if self._own is None or not needed:
            return None, False
        if (held := self._fences.get(node_id)) is not None:
            return held, False
        if step:
            raise Fenced(f"node {node_id}: this daemon no longer holds its lease")
        fence = await self._own.claim(node_id, force=force)
        if fence is None:
            raise Conflict(f"node {node_id} is driven by another daemon; retry later")
        self._fences[node_id] = fence
        return fence, True
