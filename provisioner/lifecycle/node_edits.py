"""An operator's edits of node records (issue 30): edit, delete a retired node, replace a
retired chassis. A mixin of ``Conductor``: it works under the conductor's per-node locks, so
no edit races a transition."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Final

from provisioner.domain import HistoryEntry, Node, NodeState
from provisioner.errors import Conflict, InvalidRequest
from provisioner.lifecycle.states import IN_FLIGHT
from provisioner.store.node_admin import EDIT_EVENT, REPLACED_BY_EVENT, REPLACES_EVENT
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

#: fields whose change on a live node reaches outside the daemon (DNS, Slurm, Kubernetes,
#: the image it runs): refused on an active or in-flight node without ``force``
GUARDED: Final = ("hostname", "profile")


def live(node: Node) -> bool:
    """Active or in flight: a rename or re-profile would go unseen by what runs on it."""
    return node.state is NodeState.ACTIVE or node.state in IN_FLIGHT


class NodeEdits:
    _repo: NodeRepo
    _locks: defaultdict[str, asyncio.Lock]
    _observers: list[Callable[[Node, str, NodeState], None]]

    async def edit_node(self, node_id: str, changes: Mapping[str, str | None], *, actor: str,
                   reason: str = "", force: bool = False) -> Node:
        """Change a node's hostname, rack, position or profile (one history row per field,
        with ``actor``). Renaming or re-profiling a live node needs ``force``."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            guarded = [name for name in GUARDED
                       if name in changes and changes[name] != getattr(node, name)]
            if guarded and live(node) and not force:
                raise Conflict(f"node {node.hostname or node.id} is {node.state}: changing "
                               f"its {' and '.join(guarded)} needs force (it is not "
                               "re-imaged, renamed in Slurm or Kubernetes by this edit)")
            after = await self._repo.edit(node, changes, actor=actor, reason=reason)
        if after.version != node.version:
            log.info("node %s: edited by %s: %s", after.hostname or after.id, actor,
                     ", ".join(sorted(changes)))
            self._tell(after, EDIT_EVENT)
        return after

    async def delete_node(self, node_id: str, *, actor: str) -> tuple[Node, list[HistoryEntry]]:
        """Delete a retired node; returns it and the history it had (the API answers with
        both, so that the record leaves with the caller)."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.state is not NodeState.RETIRED:
                raise Conflict(f"node {node.hostname or node.id} is {node.state}: only a "
                               "retired node can be deleted (retire it first)")
            history = await self._repo.delete(node)
        self._locks.pop(node_id, None)
        log.warning("node %s (id %s, serial %s): deleted by %s with its %d history rows",
                    node.hostname or "-", node.id, node.serial or "-", actor, len(history))
        return node, history

    async def replace_node(self, old_id: str, new_id: str, *, actor: str,
                      reason: str = "") -> tuple[Node, Node]:
        """The chassis ``new_id`` takes the place (hostname, rack, position) of the retired
        ``old_id``, which frees its hostname, serial and MACs."""
        if old_id == new_id:
            raise InvalidRequest("a node cannot replace itself")
        first, second = sorted((old_id, new_id))
        async with self._locks[first], self._locks[second]:
            old = await self._repo.get(old_id)
            new = await self._repo.get(new_id)
            if old.state is not NodeState.RETIRED:
                raise Conflict(f"node {old.hostname or old.id} is {old.state}: only a retired "
                               "node can be replaced (retire it first)")
            if live(new):
                raise Conflict(f"node {new.hostname or new.id} is {new.state}: the "
                               "replacement must not be active or in flight")
            old, new = await self._repo.replace(old, new, actor=actor, reason=reason)
        log.info("node %s: replaced by %s (serial %s) by %s", new.hostname or new.id,
                 new.id, new.serial or "-", actor)
        self._tell(old, REPLACED_BY_EVENT)
        self._tell(new, REPLACES_EVENT)
        return old, new

    def _tell(self, node: Node, event: str) -> None:
        for observer in self._observers:
            observer(node, event, node.state)
