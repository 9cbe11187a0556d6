"""RunContext: what a step sees. It checkpoints sub-steps so a resumed step skips them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from provisioner.bmc.base import Bmc
from provisioner.domain import Node
from provisioner.errors import FatalError, StoreUnavailable
from provisioner.lifecycle.ports import Ports
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

_RUN_PREFIX = "run:"

Recorder = Callable[[str, str, str, int | None], Awaitable[object]]
"""(node id, event, reason, fence) -> one history row that changes no state
(``Conductor.record``), refused (Fenced) unless the lease with that fencing number is still
ours (None: no leases, one daemon)."""


class RunContext:
    def __init__(
        self,
        node: Node,
        ports: Ports,
        repo: NodeRepo,
        gate: Callable[[str], AbstractAsyncContextManager[None]],
        *,
        recorder: Recorder,
        keyed: bool = True,
        fence: int | None = None,
    ) -> None:
        """``keyed``: the step's drivers key their work by the run id, so it is
        checkpointed before the first sub-step (other steps save that write)."""
        self._node = node
        self._ports = ports
        self._repo = repo
        self._gate = gate
        self._recorder = recorder
        self._done = list(node.checkpoint)
        self._bmc: Bmc | None = None
        run = next((item for item in self._done if item.startswith(_RUN_PREFIX)), None)
        self._run_id = run.removeprefix(_RUN_PREFIX) if run else f"{node.id}:{node.history_seq}"
        self._run_saved = run is not None or not keyed
        self._power: str | None = None  # set by the running sub-step, saved with its end
        self._fence = fence  # the node's lease we hold (several daemons): checked per save

    @property
    def node(self) -> Node:
        return self._node

    @property
    def ports(self) -> Ports:
        return self._ports

    @property
    def run_id(self) -> str:
        return self._run_id

    async def bmc(self) -> Bmc:
        if self._bmc is None:
            endpoint = self._node.bmc
            if endpoint is None:
                raise FatalError(f"node {self._node.id} has no BMC endpoint")
            credentials = await self._repo.credentials(self._node.id)
            self._bmc = self._ports.rack_bmc.wrap(
                self._ports.bmc(self._node.id, endpoint, credentials), self._node)
        return self._bmc

    async def substep(self, name: str, action: Callable[[], Awaitable[None]]) -> None:
        if name in self._done:
            return
        async with self._gate(self._node.id):  # waits out maintenance; counts as busy in it
            if not self._run_saved:
                await self._save(f"{_RUN_PREFIX}{self._run_id}")
                self._run_saved = True
            await action()
            await self._save(name)

    def finished(self, name: str) -> bool:
        return name in self._done

    # the step's writes besides its checkpoints, fenced like them: a daemon whose lease was
    # taken over (paused past it, cut off) writes neither facts nor history for the node

    async def merge_facts(self, facts: dict[str, Any]) -> None:
        self._node = await self._repo.merge_facts(self._node.id, facts, fence=self._fence)

    async def update_facts(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._node = await self._repo.update_fact(self._node.id, change, fence=self._fence)

    async def record(self, event: str, reason: str) -> None:
        await self._recorder(self._node.id, event, reason, self._fence)

    async def note_power(self, state: str) -> None:
        """Kept until the sub-step's checkpoint, which stores it in the same write."""
        self._power = state

    async def aclose(self) -> None:
        if self._power is not None:  # the sub-step failed after it set the power
            power, self._power = self._power, None
            try:
                await self._repo.note_power(self._node.id, power)
            except StoreUnavailable as exc:  # the step stops anyway; power sync catches up
                log.warning("node %s: power %s not recorded: %s", self._node.id, power, exc)
        if self._bmc is not None:
            bmc, self._bmc = self._bmc, None
            await bmc.aclose()

    async def _save(self, item: str) -> None:
        self._done.append(item)
        self._node = await self._repo.save_checkpoint(self._node, self._done,
                                                      power_state=self._power,
                                                      fence=self._fence)
        self._power = None  # saved (a failed save leaves it to aclose)
