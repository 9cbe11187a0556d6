"""Every NVLink domain's members, for the fabric page: the validation gate's view
(``member_of``), read cheaply. Refreshed at most every ``interval_s``; it reads only nodes
whose facts name a clique (a fleet without multi-node NVLink reads none) and, of those,
only the ones whose (state, ``updated_at``) changed, in bulk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final

from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import member_of
from provisioner.store.repo import NodeRepo
from provisioner.validation.domain import Member

#: the states ``member_of`` judges
STATES: Final = (NodeState.VALIDATING, NodeState.VALIDATE_FAILED, NodeState.REGISTERING,
                 NodeState.ACTIVE)
_CHUNK: Final = 500


class DomainIndex:
    def __init__(self, repo: NodeRepo, *, interval_s: float = 2.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._repo = repo
        self._interval_s = interval_s
        self._now = now
        self._lock = asyncio.Lock()
        self._taken: float | None = None
        self._cache: dict[str, tuple[tuple[str, datetime], Member | None]] = {}

    async def members(self) -> tuple[Member, ...]:
        async with self._lock:
            if self._taken is None or self._now() - self._taken >= self._interval_s:
                await self._refresh()
                self._taken = self._now()
        return tuple(m for _, m in self._cache.values() if m is not None)

    async def _refresh(self) -> None:
        stamps = await self._repo.clique_stamps(STATES)
        cache = {i: known for i, known in self._cache.items()
                 if stamps.get(i) == known[0]}
        changed = [i for i in stamps if i not in cache]
        for start in range(0, len(changed), _CHUNK):
            for node in await self._repo.get_many(changed[start:start + _CHUNK]):
                cache[node.id] = ((str(node.state), node.updated_at), member_of(node))
        self._cache = cache
