"""Shared fixtures: settings in a temp state dir, a real SQLite store, a simulated world,
a conductor on the fake drivers, and a loop guard that fails tests which block the loop."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from provisioner.bmc.fake import fake_bmc_factory
from provisioner.config import LifecycleSettings, Settings
from provisioner.domain import NewNode, Node
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.drivers import (
    FakeInspector,
    FakeInstaller,
    FakeKube,
    FakeRepairs,
    FakeSlurm,
    FakeValidator,
)
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store, open_store

# Debug mode on every loop: asyncio then logs callbacks slower than 0.1 s, which loop_guard
# turns into failures (HA's block_async_io idea).
os.environ.setdefault("PYTHONASYNCIODEBUG", "1")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state")


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    opened = open_store(settings)
    yield opened
    opened.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[SimWorld]:
    sim = SimWorld(tmp_path / "world.sqlite")
    yield sim
    sim.close()


def fake_ports(world: SimWorld, *, delay_s: float = 0.0, fail_rate: float = 0.0) -> Ports:
    kw = {"delay_s": delay_s, "fail_rate": fail_rate}
    return Ports(bmc=fake_bmc_factory(world), inspector=FakeInspector(world, **kw),
                 installer=FakeInstaller(world, **kw), kube=FakeKube(world, **kw),
                 slurm=FakeSlurm(world, **kw), validator=FakeValidator(world, **kw),
                 repairs=FakeRepairs(world, **kw))


@pytest.fixture
async def conductor(store: Store, world: SimWorld) -> AsyncIterator[Conductor]:
    """A conductor whose policy does nothing on its own: tests fire every event."""
    lifecycle = LifecycleSettings(auto_inspect=False, auto_deploy=False)
    cond = Conductor(store.nodes, fake_ports(world), lifecycle)
    yield cond
    await cond.stop()


async def wait_for_state(store: Store, node_id: str, state: NodeState,
                         timeout_s: float = 10.0) -> Node:
    async with asyncio.timeout(timeout_s):
        while True:
            node = await store.nodes.get(node_id)
            if node.state == state:
                return node
            await asyncio.sleep(0.02)


@pytest.fixture
def make_node(store: Store):  # type: ignore[no-untyped-def]
    """Write a node row directly in a given state (tests only; production uses fire())."""
    counter = iter(range(1, 1_000_000))

    async def make(state: NodeState = NodeState.ENROLLED, **fields: object) -> Node:
        n = next(counter)
        values: dict[str, object] = {"hostname": f"node-{n:03d}", "serial": f"SER{n:05d}",
                                     "macs": (f"52:54:00:00:{n >> 8:02x}:{n & 0xff:02x}",)}
        values.update(fields)
        return await store.nodes.create(NewNode(state=state, **values),  # type: ignore[arg-type]
                                        actor="test")

    return make


class _SlowCallbackDetector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.slow: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and "took" in message:
            self.slow.append(message)


@pytest.fixture(autouse=True)
def loop_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test in which asyncio reports a callback that blocked the loop (> 0.1 s)."""
    detector = _SlowCallbackDetector()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(detector)
    try:
        yield
    finally:
        asyncio_log.removeHandler(detector)
    if detector.slow:
        pytest.fail("event loop blocked: " + "; ".join(detector.slow[:3]))
