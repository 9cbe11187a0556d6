"""Slurm as a health source against a real slurmctld and a dynamic ``slurmd -Z`` (PEERS.md
§7): the slurmd is killed, slurmctld marks the node ``NOT_RESPONDING`` and then ``DOWN``, and
the Slurm sync's next pass turns it into an ``unresponsive`` finding of the (active) node,
with a history row; a new slurmd registers, the node returns to service, and the finding
clears. SlurmdTimeout is 6 s here (slurmctld pings every 2 s) so the test stays short."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from provisioner.config import LifecycleSettings
from provisioner.domain import NewNode
from provisioner.health.records import Origin
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.slurm.scontrol import ScontrolSlurm
from provisioner.slurm.sync import SlurmSync
from provisioner.store.findings import FindingFilter
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.peers.slurm import (
    Slurm,
    dynamic_cluster,
    running_slurmd,
    slurm_unavailable_reason,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(150)]
NODE = "gpu-health-01"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Slurm, Path]]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with dynamic_cluster("slurm-health-", {"SlurmdTimeout": "6"}) as found:
        yield found


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(1.0)


async def test_killed_slurmd_becomes_a_finding_and_clears_when_back(
        cluster: tuple[Slurm, Path], store: Store, world: SimWorld) -> None:
    slurm, workdir = cluster
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    health = HealthFindings(store.findings, conductor)
    node = await store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname=NODE), actor="t")

    async def ignore(host: str, on: bool, reason: str) -> None:
        return None

    sync = SlurmSync(client, ignore, interval_s=1.0, reason_prefix="provisioner: ",
                     on_findings=lambda found: health.sync(Origin.SLURM, found))

    async def registered() -> bool:
        seen = await client.node(NODE)
        return seen is not None and seen.registered

    async def open_findings() -> int:
        await sync.sync_once()
        return (await store.findings.list(FindingFilter(node_id=node.id)))[1]

    try:
        with running_slurmd(slurm, workdir, NODE) as slurmd:
            await until(registered, "slurmd to register")
            assert await open_findings() == 0
            slurmd.kill()
            slurmd.wait(5)
            await until(lambda: open_findings_at_least(open_findings, 1),
                        "the killed slurmd to become a finding")
            [finding] = (await store.findings.list(FindingFilter(node_id=node.id)))[0]
            assert (finding.origin, finding.cls, finding.action, finding.subject) == (
                "slurm", "unresponsive", "restart_os", "slurmd")
            assert "NOT_RESPONDING" in finding.evidence or "DOWN" in finding.evidence
            history = await store.nodes.history(node.id)
            assert (history[-1].event, history[-1].actor) == ("health_finding", "sync:slurm")
            with running_slurmd(slurm, workdir, NODE):  # the node's slurmd is back
                await until(registered, "the new slurmd to register")
                await until(lambda: open_findings_at_least(open_findings, 0, exact=True),
                            "the finding to clear")
            cleared = (await store.findings.list(FindingFilter(node_id=node.id,
                                                               open_only=False)))[0]
            assert [f.id for f in cleared] == [finding.id] and cleared[0].cleared_at
            assert (await store.nodes.history(node.id))[-1].event == "health_cleared"
    finally:
        await conductor.stop()


async def open_findings_at_least(count: Callable[[], Awaitable[int]], wanted: int, *,
                                 exact: bool = False) -> bool:
    found = await count()
    return found == wanted if exact else found >= wanted
