"""Fabric acceptance of an *active* NVLink domain (issue 26) against a real slurmctld and
real slurmds (one ``slurmd -N`` per node on this host, tests/peers/slurm.py
``static_cluster``): ``DomainAcceptance.rerun`` (what ``provisioner fabric accept`` calls)
through ``SlurmMaintenance`` over ``ScontrolSlurm``.

- A job runs on a domain node when the operator asks (``provisioner fabric accept DOMAIN``
  against the API, which names the reservation): the reservation is made at once on
  exactly the domain's two nodes (maint, ignore_jobs) and the tests start only after that
  job ended.
- While the tests run, read back from Slurm: ``scontrol show reservation`` names exactly
  the domain's nodes; a job submitted to a domain node stays pending, one to the node
  outside the domain runs.
- One node slow: the run fails, the reservation stays, the domain is held (both nodes out
  of the live topology's blocks) and the nodes stay ``active`` (no state written here).
- After the "repair", a second run passes: the reservation is gone, the blocks are back.

The launcher here hands back recorded real outputs (tests/fixtures/acceptance and
tests/fixtures/dcgm): the SSH path that produces them is proven by test_fabric_acceptance.py;
what is proven here is the Slurm side. The slow all-reduce is the H200 capture with its bus
bandwidth lowered (one figure), the healthy DCGM document the GB10 capture with its one
``Fail`` turned ``Pass``, as in test_fabric_acceptance.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from provisioner.acceptance.domain import ToolRun
from provisioner.api.app import make_app
from provisioner.cli.entry import main
from provisioner.config import (
    AcceptanceProfile,
    ApiSettings,
    LifecycleSettings,
    TopologySettings,
    ValidationProfile,
    ValidationSettings,
)
from provisioner.domain import Node, Role
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.acceptance_sweep import ReacceptSweep
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import NodeState
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.slurm.reservation import SlurmMaintenance
from provisioner.slurm.scontrol import ScontrolSlurm
from provisioner.store.store import Store
from provisioner.topology.emit import block_of
from provisioner.topology_live.live import LiveTopology
from provisioner.validation.record import ValidationRecord
from tests.conftest import fake_ports
from tests.integration.test_fabric_reaccept import past_run
from tests.peers.slurm import Slurm, slurm_unavailable_reason, static_cluster
from tests.topology_support import nvsmi

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCCL = (FIXTURES / "acceptance" / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt"
        ).read_text()
SLOW_NCCL = (NCCL.replace("476.96", "301.12").replace("476.98", "301.14")
             .replace("476.967", "301.130"))  # below hgx-h200's 431 GB/s floor
DCGM = (FIXTURES / "dcgm" / "dcgmi-diag-r1-j.dcgm-4.2.3.gb10.json").read_text().replace(
    '"Fail"', '"Pass"')
DOMAIN_NODES = ("acc-01", "acc-02")
OUTSIDE = "acc-03"
CLIQUE = f"{nvsmi.CLUSTER_A}.1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Slurm, Path]]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with static_cluster("slurm-accept-", [*DOMAIN_NODES, OUTSIDE]) as found:
        yield found


def run(slurm: Slurm, *args: str) -> str:
    done = subprocess.run(list(args), env=slurm.env(), capture_output=True, text=True,
                          timeout=30, check=True)
    return done.stdout


def sbatch(slurm: Slurm, node: str, seconds: int) -> str:
    out = run(slurm, "sbatch", "-w", node, "-o", "/dev/null", "--wrap", f"sleep {seconds}")
    return out.split()[-1]


def job_state(slurm: Slurm, job: str) -> tuple[str, str]:
    """(state, reason) from ``scontrol show job``; ("GONE", "") once purged."""
    try:
        out = slurm.scontrol("show", "job", "-o", job)
    except RuntimeError:
        return "GONE", ""
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    return fields.get("JobState", ""), fields.get("Reason", "")


def until(check: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


async def reserved(slurm: Slurm, name: str) -> str:
    """``scontrol show reservation NAME`` once it exists (the run's task makes it)."""
    async with asyncio.timeout(10):
        while True:
            try:
                return await asyncio.to_thread(slurm.scontrol, "show", "reservation", "-o",
                                               name)
            except RuntimeError:
                await asyncio.sleep(0.1)


class RecordedLauncher:
    """Hands back recorded outputs per node; on each launch it looks at Slurm as the tests
    would run: the reservation, the job that ran before, a job sent to each side."""

    def __init__(self, slurm: Slurm, slow: set[str], before: str) -> None:
        self.slurm = slurm
        self.slow = slow
        self.before = before
        self.seen: list[dict[str, Any]] = []

    def budget_s(self, profile: AcceptanceProfile) -> float:
        return 60.0

    async def launch(self, run_id: str, domain: str, nodes: Sequence[Node],
                     profile: AcceptanceProfile, class_gpus: int | None) -> list[ToolRun]:
        self.seen.append(await asyncio.to_thread(self._look, domain))
        return [r for n in nodes for r in (
            ToolRun(n.hostname or n.id, "dcgm", 0, DCGM),
            ToolRun(n.hostname or n.id, "nccl", 0,
                    SLOW_NCCL if n.hostname in self.slow else NCCL))]

    def _look(self, domain: str) -> dict[str, Any]:
        slurm = self.slurm
        text = slurm.scontrol("show", "reservation", "-o")
        fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
        inside = sbatch(slurm, DOMAIN_NODES[1], 1)
        outside = sbatch(slurm, OUTSIDE, 1)
        until(lambda: job_state(slurm, outside)[0] in ("RUNNING", "COMPLETED", "GONE"),
              "the job outside the domain to run")
        state, reason = job_state(slurm, inside)
        run(slurm, "scancel", inside)
        return {"name": fields.get("ReservationName"),
                "nodes": run(slurm, "scontrol", "show", "hostnames",
                             fields.get("Nodes", "")).split(),
                "flags": set(fields.get("Flags", "").split(",")),
                "before": job_state(slurm, self.before)[0],
                "inside": (state, reason), "outside": job_state(slurm, outside)[0]}


async def finished(acceptance: DomainAcceptance, domain: str = CLIQUE) -> Any:
    async with asyncio.timeout(60):
        while True:
            latest = await acceptance.latest(domain)
            if latest is not None and latest.status != "running":
                return latest
            await asyncio.sleep(0.2)


async def test_an_active_domain_is_accepted_inside_a_maintenance_reservation(
        cluster: tuple[Slurm, Path], store: Store, world: SimWorld, make_node,  # type: ignore[no-untyped-def]
        aiohttp_client, capsys: pytest.CaptureFixture[str]) -> None:
    slurm, _ = cluster
    profile = AcceptanceProfile(fabric_class="hgx-h200", tests=["dcgm", "nccl"],
                                nccl_scope="node", jobs_wait_s=30)
    validation = ValidationSettings(profiles={"nvl": ValidationProfile(
        gpu_count=4, nvlink_domain=True, nvlink_domain_nodes=2, acceptance=profile)})
    ids = []
    for i, name in enumerate(DOMAIN_NODES, start=1):
        node = await make_node(NodeState.ACTIVE, profile="nvl", hostname=name,
                               serial=f"RES{i}")
        record = ValidationRecord(passed=True, at="2026-11-27T00:00:00+00:00", clique=CLIQUE,
                                  domain_nodes=2)  # what its validating step wrote
        await store.nodes.merge_facts(node.id, {
            "last_report": {"nvidia_smi_xml": nvsmi.xml(nvsmi.gpus(i, count=4))},
            "validation": record.to_facts()})
        ids.append(node.id)
    topology = LiveTopology(store.topology, TopologySettings(format="block"))
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    before = sbatch(slurm, DOMAIN_NODES[0], 4)  # a user's job on the domain
    until(lambda: job_state(slurm, before)[0] == "RUNNING", "the user's job to run")
    launcher = RecordedLauncher(slurm, slow={DOMAIN_NODES[1]}, before=before)
    acceptance = DomainAcceptance(store.nodes, store.acceptance, launcher, validation,
                                  poll_s=0.2, reservations=SlurmMaintenance(client, client),
                                  on_hold=topology.invalidate)
    topology.hold_with(acceptance.held_nodes)
    try:
        blocks = block_of((await topology.refresh(publish=False)).snapshot.blocks)
        assert set(DOMAIN_NODES) <= set(blocks), blocks

        async def no_retry(node_id: str) -> object:
            raise AssertionError(f"an active node is never retried ({node_id})")

        conductor = Conductor(store.nodes, fake_ports(world),
                              LifecycleSettings(auto_inspect=False, auto_deploy=False))
        api = await aiohttp_client(make_app(
            conductor=conductor, nodes=store.nodes, tokens=store.tokens, metrics=Metrics(),
            settings=ApiSettings(), acceptance=acceptance))
        token = (await store.tokens.create("ops", Role.OPERATOR))[1]
        base = str(api.make_url("")).rstrip("/")
        code = await asyncio.to_thread(main, ["fabric", "accept", CLIQUE, "--url", base,
                                              "--token", token])
        name = f"provisioner-acceptance-{CLIQUE}"
        assert code == 0 and capsys.readouterr().out == (
            f"{CLIQUE}: accepting acc-01, acc-02 inside Slurm reservation {name} (released "
            f"on a pass; provisioner fabric acceptance {CLIQUE})\n")
        shown = await reserved(slurm, name)  # made at once, while the user's job runs
        assert "Nodes=acc-[01-02]" in shown and job_state(slurm, before)[0] == "RUNNING"
        failed = await finished(acceptance)
        (seen,) = launcher.seen
        assert seen["name"] == name and seen["nodes"] == list(DOMAIN_NODES)
        assert {"MAINT", "IGNORE_JOBS"} <= seen["flags"]
        assert seen["before"] in ("COMPLETED", "GONE"), "the tests began before the job ended"
        assert seen["inside"][0] == "PENDING" and "ReqNodeNotAvail" in seen["inside"][1], seen
        assert seen["outside"] in ("RUNNING", "COMPLETED", "GONE")

        assert failed.status == "failed" and failed.slowest == DOMAIN_NODES[1], failed.summary
        assert failed.result["reservation"] == {"name": name, "held": True}
        assert failed.requested_by.endswith(f" (reservation {name})")
        assert "Nodes=acc-[01-02]" in slurm.scontrol("show", "reservation", "-o", name)
        assert await acceptance.held_nodes() == set(DOMAIN_NODES)
        held = block_of((await topology.refresh(publish=False)).snapshot.blocks)
        assert not set(DOMAIN_NODES) & set(held), held  # the domain's block is gone
        for node_id in ids:  # the conductor's states: untouched
            assert (await store.nodes.get(node_id)).state is NodeState.ACTIVE

        launcher.slow.clear()  # the tray is reseated
        launcher.before = sbatch(slurm, OUTSIDE, 1)
        again = await acceptance.rerun(CLIQUE, no_retry)
        assert again.reservation == name
        passed = await finished(acceptance)
        assert passed.status == "passed" and passed.id != failed.id, passed.summary
        assert passed.result["reservation"] == {"name": name, "held": False}
        assert launcher.seen[1]["nodes"] == list(DOMAIN_NODES)
        with pytest.raises(RuntimeError):
            slurm.scontrol("show", "reservation", name)
        assert await acceptance.held_nodes() == set()
        restored = block_of((await topology.refresh(publish=False)).snapshot.blocks)
        assert set(DOMAIN_NODES) <= set(restored), restored
    finally:
        await acceptance.aclose()
        await topology.aclose()
        await client.aclose()


async def test_jobs_that_do_not_end_in_time_release_the_reservation_untested(
        cluster: tuple[Slurm, Path], store: Store, make_node) -> None:  # type: ignore[no-untyped-def]
    """Past ``jobs_wait_s`` nothing is tested: the run is interrupted, naming the busy node,
    and the reservation is released (the domain is not held)."""
    slurm, _ = cluster
    profile = AcceptanceProfile(fabric_class="hgx-h200", tests=["dcgm", "nccl"],
                                nccl_scope="node", jobs_wait_s=1)
    validation = ValidationSettings(profiles={"nvl": ValidationProfile(
        gpu_count=4, nvlink_domain=True, nvlink_domain_nodes=2, acceptance=profile)})
    for i, name in enumerate(DOMAIN_NODES, start=1):
        node = await make_node(NodeState.ACTIVE, profile="nvl", hostname=name,
                               serial=f"RES{i}")
        record = ValidationRecord(passed=True, at="2026-11-27T00:00:00+00:00", clique=CLIQUE,
                                  domain_nodes=2)
        await store.nodes.merge_facts(node.id, {"validation": record.to_facts()})
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    long_job = sbatch(slurm, DOMAIN_NODES[1], 60)
    until(lambda: job_state(slurm, long_job)[0] == "RUNNING", "the long job to run")
    launcher = RecordedLauncher(slurm, slow=set(), before=long_job)
    acceptance = DomainAcceptance(store.nodes, store.acceptance, launcher, validation,
                                  poll_s=0.2, reservations=SlurmMaintenance(client, client))
    try:
        started = await acceptance.rerun(CLIQUE, lambda node_id: asyncio.sleep(0))
        gave_up = await finished(acceptance)
        assert gave_up.status == "interrupted", gave_up.summary
        assert f"jobs still running on {DOMAIN_NODES[1]} after 1 s" in gave_up.summary
        assert gave_up.result["reservation"] == {"name": started.reservation, "held": False}
        assert launcher.seen == []  # nothing was tested
        with pytest.raises(RuntimeError):
            slurm.scontrol("show", "reservation", str(started.reservation))
        assert await acceptance.held_nodes() == set()
        assert job_state(slurm, long_job)[0] == "RUNNING"  # the user's job is left alone
    finally:
        run(slurm, "scancel", long_job)
        await acceptance.aclose()
        await client.aclose()


async def test_a_domain_slurm_does_not_know_is_not_tested_nor_held(
        cluster: tuple[Slurm, Path], store: Store, make_node) -> None:  # type: ignore[no-untyped-def]
    """slurmctld refuses the reservation (a node it does not know): interrupted with
    Slurm's words, nothing tested, nothing held."""
    slurm, _ = cluster
    profile = AcceptanceProfile(fabric_class="hgx-h200", tests=["dcgm", "nccl"],
                                nccl_scope="node", jobs_wait_s=5)
    validation = ValidationSettings(profiles={"nvl": ValidationProfile(
        gpu_count=4, nvlink_domain=True, nvlink_domain_nodes=2, acceptance=profile)})
    for i, name in enumerate(("acc-01", "acc-99"), start=1):
        node = await make_node(NodeState.ACTIVE, profile="nvl", hostname=name,
                               serial=f"RES{i}")
        record = ValidationRecord(passed=True, at="2026-11-27T00:00:00+00:00", clique=CLIQUE,
                                  domain_nodes=2)
        await store.nodes.merge_facts(node.id, {"validation": record.to_facts()})
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    launcher = RecordedLauncher(slurm, slow=set(), before="0")
    acceptance = DomainAcceptance(store.nodes, store.acceptance, launcher, validation,
                                  poll_s=0.2, reservations=SlurmMaintenance(client, client))
    try:
        await acceptance.rerun(CLIQUE, lambda node_id: asyncio.sleep(0))
        refused = await finished(acceptance)
        assert refused.status == "interrupted", refused.summary
        assert "could not reserve the nodes in Slurm" in refused.summary
        assert "Invalid node name specified" in refused.summary
        assert refused.result["reservation"]["held"] is False and launcher.seen == []
        assert await acceptance.held_nodes() == set()
    finally:
        await acceptance.aclose()
        await client.aclose()


class ReservationLauncher:
    """Healthy recorded outputs; notes the reservation each launch ran inside."""

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm
        self.seen: list[tuple[str, list[str]]] = []

    def budget_s(self, profile: AcceptanceProfile) -> float:
        return 60.0

    async def launch(self, run_id: str, domain: str, nodes: Sequence[Node],
                     profile: AcceptanceProfile, class_gpus: int | None) -> list[ToolRun]:
        text = await asyncio.to_thread(self.slurm.scontrol, "show", "reservation", "-o")
        fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
        hosts = await asyncio.to_thread(run, self.slurm, "scontrol", "show", "hostnames",
                                        fields.get("Nodes", ""))
        self.seen.append((fields.get("ReservationName", ""), hosts.split()))
        return [r for n in nodes for r in (ToolRun(n.hostname or n.id, "dcgm", 0, DCGM),
                                           ToolRun(n.hostname or n.id, "nccl", 0, NCCL))]


async def test_the_reaccept_sweep_reserves_one_due_domain_at_a_time(
        cluster: tuple[Slurm, Path], store: Store, make_node) -> None:  # type: ignore[no-untyped-def]
    """Two active domains whose last pass is older than 7 days (an NVLink pair and an HGX
    node alone), at most one at once: the older pass first, inside its own reservation;
    the second only once the first passed; then nothing is due."""
    slurm, _ = cluster
    profile = AcceptanceProfile(fabric_class="hgx-h200", tests=["dcgm", "nccl"],
                                nccl_scope="node", jobs_wait_s=10, reaccept_interval_days=7)
    validation = ValidationSettings(reaccept_max_concurrent=1, profiles={
        "nvl": ValidationProfile(gpu_count=4, nvlink_domain=True, acceptance=profile)})
    pair = []
    for i, name in enumerate([*DOMAIN_NODES, OUTSIDE], start=1):
        node = await make_node(NodeState.ACTIVE, profile="nvl", hostname=name,
                               serial=f"SWP{i}")
        record = ValidationRecord(passed=True, at="2026-11-01T00:00:00+00:00",
                                  clique=CLIQUE if name != OUTSIDE else None,
                                  domain_nodes=2 if name != OUTSIDE else None)
        await store.nodes.merge_facts(node.id, {"validation": record.to_facts()})
        pair.append(node)
    now = datetime.now(UTC)
    past_run(store, CLIQUE, pair[:2], "passed", days_ago=20, now=now)
    past_run(store, OUTSIDE, pair[2:], "passed", days_ago=10, now=now)
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    launcher = ReservationLauncher(slurm)
    acceptance = DomainAcceptance(store.nodes, store.acceptance, launcher, validation,
                                  poll_s=0.2, reservations=SlurmMaintenance(client, client))
    sweep = ReacceptSweep(acceptance, store.nodes, store.acceptance, validation)
    try:
        assert await sweep.sweep() == [CLIQUE]
        assert await sweep.sweep() == []  # the cap: one domain under a run at once
        first = await finished(acceptance)
        assert first.status == "passed", first.summary
        assert first.requested_by.startswith("reaccept-sweep (last pass ")
        assert await sweep.sweep() == [OUTSIDE]
        lone = await finished(acceptance, OUTSIDE)
        assert lone.status == "passed", lone.summary
        assert launcher.seen == [(f"provisioner-acceptance-{CLIQUE}", list(DOMAIN_NODES)),
                                 (f"provisioner-acceptance-{OUTSIDE}", [OUTSIDE])]
        assert "ReservationName" not in slurm.scontrol("show", "reservation", "-o")
        assert await sweep.sweep() == []  # both passed just now
    finally:
        await acceptance.aclose()
        await client.aclose()
