"""Concurrency budgets: work past a budget waits its turn; it is never rejected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from provisioner.config import LifecycleSettings
from provisioner.lifecycle.states import NodeState


class Budgets:
    def __init__(self, settings: LifecycleSettings) -> None:
        self._total = asyncio.Semaphore(settings.max_in_flight)
        self._per_state = {
            NodeState.INSPECTING: asyncio.Semaphore(settings.max_inspecting),
            NodeState.DEPLOYING: asyncio.Semaphore(settings.max_deploying),
        }

    @asynccontextmanager
    async def slot(self, state: NodeState) -> AsyncIterator[None]:
        per_state = self._per_state.get(state)
        if per_state is None:
            async with self._total:
                yield
            return
        async with per_state, self._total:
            yield
