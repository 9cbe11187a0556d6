"""The repair ladder against the real peers (issue 24's first proof), at integration level:
the conductor with the real Slurm and Kubernetes clients (a real slurmctld with a dynamic
``slurmd -Z``, a real kube-apiserver with kwok), the Slurm sync as the health source.

An ``active`` node's slurmd is killed → slurmctld marks it ``NOT_RESPONDING``/``DOWN`` → the
Slurm sync's finding (``unresponsive``) starts the ladder → the node is drained in Slurm and
cordoned in Kubernetes with the same text (read back with scontrol and the kube API) → the
``restart_os`` rung (here: the node's slurmd started again, as a rebooted OS would) → the
conductor is stopped hard while the gate runs → a new conductor resumes at the gate (no rung
climbed twice, no second drain) → the gate passes → undrained, uncordoned, ``active``, and the
finding clears. The in-band rungs are the only stand-in: a real reboot is the qemu e2e's.
SlurmdTimeout is 6 s here (slurmctld pings every 2 s) so the test stays short."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from provisioner.config import LifecycleSettings, SlurmSettings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint, NewNode, Node
from provisioner.health.record import RepairRecord
from provisioner.health.records import Origin
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import ANNOTATION_CORDON
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService, ladder_listener
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import validation_passed
from provisioner.simulation.drivers import FakeInstaller, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.slurm.handoff import SlurmHandoff
from provisioner.slurm.repair import SiteRepairs
from provisioner.slurm.scontrol import ScontrolSlurm
from provisioner.slurm.sync import SlurmSync
from provisioner.store.findings import FindingFilter
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.integration.kube_support import connected, kube_settings
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin, wait_until
from tests.peers.slurm import Slurm, dynamic_cluster, running_slurmd, slurm_unavailable_reason

pytestmark = [pytest.mark.root, pytest.mark.timeout(150)]
NODE = "gpu-repair-01"
PREFIX = "provisioner: "


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Slurm, Path]]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with dynamic_cluster("slurm-repair-", {"SlurmdTimeout": "6"}) as found:
        yield found


class SlurmdRemedies:
    """The in-band rungs of a node whose "OS" is its ``slurmd -Z``: a restart starts the
    slurmd again and returns once slurmctld has it registered (as ``wait-os.yml`` waits for
    SSH); a GPU reset has nothing to reset."""

    def __init__(self, slurm: Slurm, workdir: Path, client: ScontrolSlurm,
                 procs: ExitStack) -> None:
        self._slurm, self._workdir, self._client, self._procs = slurm, workdir, client, procs
        self.restarts = 0

    async def reset_gpus(self, node: Node) -> None:
        return None

    async def restart_os(self, node: Node, timeout_s: float) -> None:
        self.restarts += 1
        self._procs.enter_context(running_slurmd(self._slurm, self._workdir, NODE))
        await self.wait_os(node, timeout_s)

    async def wait_os(self, node: Node, timeout_s: float) -> None:
        async def registered() -> bool:
            seen = await self._client.node(NODE)
            return seen is not None and seen.registered and "NOT_RESPONDING" not in \
                seen.state_text and "DOWN" not in seen.state_text

        await until(registered, "the restarted slurmd to register", timeout_s)


class GateInstaller(FakeInstaller):
    """The simulated installer, whose first facts collection (the gate after the rung)
    hangs until the conductor running it is stopped hard."""

    def __init__(self, world: SimWorld, entered: asyncio.Event, *, hang: bool) -> None:
        super().__init__(world, delay_s=0.0, fail_rate=0.0)
        self._entered, self._hang = entered, hang

    async def collect_facts(self, node: Node, generation: str) -> None:
        self._entered.set()
        if self._hang:
            await asyncio.Event().wait()  # cancelled by the hard stop
        await super().collect_facts(node, generation)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.5)


async def test_killed_slurmd_drained_cordoned_repaired_and_resumed_after_a_hard_stop(
        cluster: tuple[Slurm, Path], kube_cluster: KubeCluster, store: Store,
        world: SimWorld) -> None:
    slurm, workdir = cluster
    admin = KubeAdmin(kube_cluster)
    await asyncio.to_thread(admin.create_node, NODE)
    await asyncio.to_thread(wait_until, lambda: admin.node_ready(NODE), what="kwok Node Ready")
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    handoff = SlurmHandoff(client, SlurmSettings(reason_prefix=PREFIX, poll_interval_s=0.5,
                                                 drain_timeout_s=20.0))
    node = await store.nodes.create(NewNode(
        state=NodeState.ACTIVE, hostname=NODE, serial="R1", profile="gpu",
        bmc=BmcEndpoint(driver="fake", address="R1"), bmc_password="pw"), actor="t")
    await store.nodes.merge_facts(node.id, simulated_facts("R1", "R1"))
    await world.ensure("R1", "boot", "power", "on")

    async def registered() -> bool:
        seen = await client.node(NODE)
        return seen is not None and seen.registered

    async with connected(kube_settings(kube_cluster)) as kube:
        joiner = KubeNodeJoiner(kube, kube_settings(kube_cluster), run_join=_never,
                                validated=validation_passed)
        with ExitStack() as procs:
            remedies = SlurmdRemedies(slurm, workdir, client, procs)
            site = SiteRepairs(remedies, handoff=handoff, kube=joiner, os_up_timeout_s=30.0)
            entered = asyncio.Event()

            def conductor(*, hang: bool) -> Conductor:
                ports = dataclasses.replace(fake_ports(world), repairs=site,
                                            installer=GateInstaller(world, entered, hang=hang))
                return Conductor(store.nodes, ports,
                                 LifecycleSettings(auto_inspect=False, auto_deploy=False))

            first = conductor(hang=True)
            health = HealthFindings(store.findings, first)
            service = RepairService(first, store.nodes, HealthSettings(max_repairing_fraction=1.0))
            health.add_listener(ladder_listener(service))

            async def ignore(host: str, on: bool, reason: str) -> None:
                return None

            sync = SlurmSync(client, ignore, interval_s=1.0, reason_prefix=PREFIX,
                             on_findings=lambda found: health.sync(Origin.SLURM, found))
            started = time.monotonic()
            slurmd = procs.enter_context(running_slurmd(slurm, workdir, NODE))
            await until(registered, "slurmd to register")
            slurmd.kill()
            slurmd.wait(5)

            async def repairing() -> bool:
                await sync.sync_once()
                return (await store.nodes.get(node.id)).state == NodeState.REPAIRING

            await until(repairing, "the killed slurmd's finding to start the ladder")
            [finding] = (await store.findings.list(FindingFilter(node_id=node.id)))[0]
            assert (finding.cls, finding.subject) == ("unresponsive", "slurmd")
            async with asyncio.timeout(40):
                await entered.wait()  # drained, the rung climbed, the gate running
            # the same text in both, read back from each
            seen = await client.node(NODE)
            k8s = await asyncio.to_thread(admin.node, NODE)
            reason = k8s.metadata.annotations[ANNOTATION_CORDON]
            assert seen is not None and seen.draining and k8s.spec.unschedulable is True
            assert seen.reason == reason and reason.startswith(PREFIX + "health unresponsive")
            assert "NOT_RESPONDING" in reason or "DOWN" in reason, reason
            await first.stop()  # hard: the gate's sub-step is cancelled mid-way

            second = conductor(hang=False)
            assert await second.recover() == 1
            try:
                for _ in range(40):  # the ladder ends, then the Slurm sync clears the finding
                    await sync.sync_once()
                    done = await store.nodes.get(node.id)
                    if done.state == NodeState.ACTIVE and not (await store.findings.list(
                            FindingFilter(node_id=node.id)))[0]:
                        break
                    await asyncio.sleep(0.5)
                assert done.state == NodeState.ACTIVE
                assert not (await store.findings.list(FindingFilter(node_id=node.id)))[0]
            finally:
                await second.stop()
            elapsed = time.monotonic() - started
            back = await client.node(NODE)
            k8s = await asyncio.to_thread(admin.node, NODE)
            assert back is not None and not back.draining and back.registered
            assert not k8s.spec.unschedulable and ANNOTATION_CORDON not in (
                k8s.metadata.annotations or {})
            record = RepairRecord.from_facts(done.facts)
            assert record is not None and record.outcome == "passed"
            assert [(r.rung, r.result) for r in record.tried] == [("restart_os", "passed")]
            history = [(h.event, h.reason) for h in await store.nodes.history(node.id)]
            rungs = [r for e, r in history if e == "repair_rung"]
            assert rungs == ["restart_os: done; validating again",
                             "restart_os: validation passed"], rungs
            assert [e for e, _ in history].count("repair_drain") == 1
            assert remedies.restarts == 1  # resumed at the gate: the rung not climbed again
            assert elapsed < 90, elapsed


async def _never(ticket: object, node: object) -> None:
    raise AssertionError("no join expected")
