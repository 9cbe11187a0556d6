"""Fabric acceptance of an NVLink domain end to end (issue 26): three SSH nodes (the Debian
root of tests/peers/sshd.py, each in its own namespace), whose GPU tools are test doubles:
small scripts on the node that print recorded real outputs (tests/fixtures/acceptance/ and
tests/fixtures/dcgm/). The real conductor, FactsValidator (domain gate), DomainAcceptance,
and AnsibleAcceptance running playbooks/acceptance.yml through ansible-runner over SSH.

- Healthy on two nodes, slow NCCL on the third: the domain is held, every node in
  ``validate_failed`` with the result naming the slow node as the slowest, the run stored
  with each figure and floor. The "repair" (the double prints the healthy output again) and a
  rerun (``DomainAcceptance.rerun``, what ``provisioner fabric accept`` calls) release the
  whole domain to ``registering`` and on.
- A hung test is killed at its deadline on the node, with what it started, and fails.
- A node without a required tool fails; it never passes.

The doubles change recorded outputs in one figure only, each said where it is done: the slow
all-reduce is the H200 capture with its bus bandwidth lowered, the healthy ``dcgmi diag -j``
is the GB10 capture with its one ``Fail`` turned ``Pass`` (as tests/unit do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from provisioner.api.app import make_app
from provisioner.config import (
    AcceptanceProfile,
    ApiSettings,
    LifecycleSettings,
    ValidationProfile,
    ValidationSettings,
)
from provisioner.domain import Role
from provisioner.install.acceptance import AnsibleAcceptance
from provisioner.install.base import ComposedInstaller
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.validation import FactsValidator
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.ansible_support import Nothing, make_installer, short_dir, target_settings
from tests.peers.debootstrap import debootstrap_unavailable_reason
from tests.peers.sshd import NODE_ADDRESS, SshNode, ssh_node
from tests.topology_support import nvsmi

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]
S, E = NodeState, Event
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCCL = (FIXTURES / "acceptance" / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt"
        ).read_text()
# One figure changed: the capture's bus bandwidth (476.96/476.98, average 476.967) lowered
# to 301, below hgx-h200's 431 GB/s floor: a node with a slow NVLink.
SLOW_NCCL = (NCCL.replace("476.96", "301.12").replace("476.98", "301.14")
             .replace("476.967", "301.130"))
# The real GB10 document with its one Fail turned Pass: a healthy DCGM run (exit status 0).
DCGM = (FIXTURES / "dcgm" / "dcgmi-diag-r1-j.dcgm-4.2.3.gb10.json").read_text().replace(
    '"Fail"', '"Pass"')
DOUBLE = """#!/bin/sh
# A test double of an acceptance tool: prints the recorded output kept for it.
tool=$(basename "$0")
[ -f /opt/doubles/$tool.sleep ] && sleep "$(cat /opt/doubles/$tool.sleep)"
cat /opt/doubles/$tool.out
"""
CLIQUE = f"{nvsmi.CLUSTER_A}.1"


def profile(**acceptance: Any) -> ValidationProfile:
    values: dict[str, Any] = {"fabric_class": "hgx-h200", "tests": ["dcgm", "nccl"],
                              "nccl_scope": "node", "test_deadline_s": 60}
    values.update(acceptance)
    return ValidationProfile(gpu_count=4, nvlink_domain=True, nvlink_domain_nodes=3,
                             acceptance=AcceptanceProfile(**values))


@pytest.fixture(autouse=True)
def _needs_target() -> None:
    if (reason := debootstrap_unavailable_reason()) is not None:
        pytest.skip(reason)


def doubles(nccl: str = NCCL, tools: tuple[str, ...] = ("dcgmi", "all_reduce_perf")
            ) -> dict[str, tuple[str, int]]:
    files = {f"/usr/local/bin/{tool}": (DOUBLE, 0o755) for tool in tools}
    files["/opt/doubles/dcgmi.out"] = (DCGM, 0o644)
    files["/opt/doubles/all_reduce_perf.out"] = (nccl, 0o644)
    return files


@contextmanager
def domain(work: Path, files: list[dict[str, tuple[str, int]]]) -> Iterator[list[SshNode]]:
    """One SSH node per entry of ``files``; all trust the first node's client key."""
    with ExitStack() as stack:
        nodes = [stack.enter_context(ssh_node(work / f"n{i}", f)) for i, f in enumerate(files)]
        key = Path(f"{nodes[0].key}.pub").read_text().strip()
        for node in nodes[1:]:
            done = node.run("sh", "-c", "echo " + shlex.quote(key)
                            + " >> /etc/ssh/provisioner-test/authorized_keys")
            assert done.returncode == 0, done.stderr
        yield nodes


def put(node: SshNode, path: str, text: str) -> None:
    """Change a file on the running node (the repair: the double prints anew)."""
    done = node.run("sh", "-c", f"cat > {shlex.quote(path)} <<'EOF'\n{text}EOF\n")
    assert done.returncode == 0, done.stderr


@dataclasses.dataclass
class Rig:
    conductor: Conductor
    acceptance: DomainAcceptance
    pool: ThreadPoolExecutor


def rig(store: Store, world: SimWorld, work: Path, first: SshNode,
        validation: ValidationSettings) -> Rig:
    # Every node answers at 10.77.0.2 in its own namespace: the node's address is that
    # namespace's name, and ssh reaches it through `ip netns exec %h`.
    proxy = f"ip netns exec %h socat STDIO TCP:{NODE_ADDRESS}:%p"
    args = (f"-o ProxyCommand={shlex.quote(proxy)} -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o ConnectTimeout=5 -o LogLevel=ERROR")
    settings = target_settings(first, ssh_common_args=args)
    installer, pool = make_installer(settings, work / "state")
    launcher = AnsibleAcceptance(installer, settings, results_dir=work / "results")
    acceptance = DomainAcceptance(store.nodes, store.acceptance, launcher, validation,
                                  poll_s=0.2)
    base, nothing = fake_ports(world), Nothing()
    ports = Ports(bmc=base.bmc, inspector=base.inspector,
                  installer=ComposedInstaller(nothing, installer), kube=nothing,
                  slurm=nothing, validator=FactsValidator(store.nodes, validation),
                  acceptance=acceptance)
    conductor = Conductor(store.nodes, ports,
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    return Rig(conductor, acceptance, pool)


async def enrol(store: Store, make_node, targets: list[SshNode]) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for i, target in enumerate(targets, start=1):
        node = await make_node(S.VALIDATING, profile="nvl", hostname=f"nvl-{i:02d}",
                               serial=f"ACC{i}")
        await store.nodes.merge_facts(node.id, {
            "address": target.namespace,
            "last_report": {"nvidia_smi_xml": nvsmi.xml(nvsmi.gpus(i, count=4))}})
        ids.append(node.id)
    return ids


async def settle(store: Store, ids: list[str], states: set[NodeState]) -> dict[str, Any]:
    async with asyncio.timeout(240):
        while True:
            nodes = {i: await store.nodes.get(i) for i in ids}
            if all(n.state in states for n in nodes.values()):
                return nodes
            await asyncio.sleep(0.2)


async def test_a_slow_node_holds_its_domain_until_repaired_and_rerun(
        store: Store, world: SimWorld, make_node, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """Held, then rerun through the API (``POST``/``GET /api/v1/fabric/domains/{id}/
    acceptance``, what ``provisioner fabric accept``/``acceptance`` call)."""
    validation = ValidationSettings(profiles={"nvl": profile()}, domain_poll_interval_s=0.2)
    with short_dir() as work, domain(work, [doubles(), doubles(), doubles(SLOW_NCCL)]) as nodes:
        r = rig(store, world, work, nodes[0], validation)
        client = await aiohttp_client(make_app(
            conductor=r.conductor, nodes=store.nodes, tokens=store.tokens, metrics=Metrics(),
            settings=ApiSettings(), acceptance=r.acceptance))
        viewer = {"Authorization": f"Bearer {(await store.tokens.create('v', Role.VIEWER))[1]}"}
        operator = {"Authorization":
                    f"Bearer {(await store.tokens.create('o', Role.OPERATOR))[1]}"}
        path = f"/api/v1/fabric/domains/{CLIQUE}/acceptance"
        assert (await client.get(path, headers=viewer)).status == 404  # never ran
        ids = await enrol(store, make_node, nodes)
        await r.conductor.recover()
        held = await settle(store, ids, {S.VALIDATE_FAILED, S.ACTIVE})
        for node in held.values():
            assert node.state is S.VALIDATE_FAILED, node.last_error
            print(node.last_error)
            assert node.last_error.startswith(
                f"fabric acceptance of {CLIQUE} (hgx-h200) failed on 1 of 3: slowest nvl-03; "
                "nvl-03: "), node.last_error
            assert "busbw 301.12GB/s (floor 431GB/s): below 431.00GB/s" in node.last_error
        run = await r.acceptance.latest(CLIQUE)
        assert run is not None and run.status == "failed" and run.slowest == "nvl-03"
        figures = {n["node"]: n["figures"] for n in run.result["nodes"]}
        assert set(figures) == {"nvl-01", "nvl-02", "nvl-03"}
        busbw = {name: next(f for f in fig if f["figure"] == "busbw")
                 for name, fig in figures.items()}
        assert busbw["nvl-01"]["value"] == "476.96GB/s" and busbw["nvl-01"]["passed"]
        assert busbw["nvl-03"]["value"] == "301.12GB/s" and not busbw["nvl-03"]["passed"]
        assert all(f["floor"] == "431GB/s" for f in busbw.values())
        dcgm = [f for fig in figures.values() for f in fig if f["test"] == "dcgmi-diag"]
        assert len(dcgm) == 3 and all(f["passed"] for f in dcgm)
        shown = await client.get(path, headers=viewer)
        assert shown.status == 200
        body = await shown.json()
        assert body["status"] == "failed" and body["slowest"] == "nvl-03"
        assert body["nodes"] == ["nvl-01", "nvl-02", "nvl-03"]
        (slow,) = [f for n in body["results"] if n["node"] == "nvl-03" for f in n["figures"]
                   if f["figure"] == "busbw"]
        assert (slow["value"], slow["floor"], slow["passed"]) == ("301.12GB/s", "431GB/s",
                                                                  False)
        assert (await client.post(path, headers=viewer)).status == 403

        put(nodes[2], "/opt/doubles/all_reduce_perf.out", NCCL)  # the tray is reseated
        rerun = await client.post(path, headers=operator)
        assert rerun.status == 202, await rerun.text()
        assert (await rerun.json())["retried"] == ["nvl-01", "nvl-02", "nvl-03"]
        done = await settle(store, ids, {S.ACTIVE, S.VALIDATE_FAILED})
        for node in done.values():
            assert node.state is S.ACTIVE, node.last_error
            assert node.facts["fabric_acceptance"]["passed"] is True
            went = [h.to_state for h in await store.nodes.history(node.id)]
            assert went[-2:] == ["registering", "active"]
        again = await (await client.get(path, headers=viewer)).json()
        assert again["id"] != run.id and again["status"] == "passed"
        assert again["summary"].startswith(f"fabric acceptance of {CLIQUE} (hgx-h200) passed")
        refused = await client.post(path, headers=operator)  # nothing held: an active domain
        assert refused.status == 409 and "maintenance reservation" in await refused.text()
        await r.conductor.stop()
        await r.acceptance.aclose()
        r.pool.shutdown()


async def test_a_hung_test_is_killed_and_a_missing_tool_fails(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    validation = ValidationSettings(profiles={"nvl": profile(test_deadline_s=3)},
                                    domain_poll_interval_s=0.2)
    hung = doubles() | {"/opt/doubles/all_reduce_perf.sleep": ("600\n", 0o644)}
    missing = doubles(tools=("all_reduce_perf",))  # no dcgmi on this node
    with short_dir() as work, domain(work, [doubles(), hung, missing]) as nodes:
        r = rig(store, world, work, nodes[0], validation)
        ids = await enrol(store, make_node, nodes)
        await r.conductor.recover()
        await settle(store, ids, {S.VALIDATE_FAILED, S.ACTIVE})
        run = await r.acceptance.latest(CLIQUE)
        assert run is not None and run.status == "failed"
        result = {n["node"]: n for n in run.result["nodes"]}
        assert result["nvl-01"]["passed"]
        (killed,) = [f for f in result["nvl-02"]["figures"] if not f["passed"]]
        assert killed["figure"] == "deadline" and killed["floor"] == "3s"
        (absent,) = [f for f in result["nvl-03"]["figures"] if not f["passed"]]
        assert absent["figure"] == "tool" and absent["reason"].startswith("dcgmi not found")
        left = nodes[1].run("sh", "-c", "ps -eo args | grep '[s]leep 600' || true")
        assert left.stdout == "", f"the hung double outlived its deadline: {left.stdout}"
        await r.conductor.stop()
        await r.acceptance.aclose()
        for node_id in ids:
            await wait_for_state(store, node_id, S.VALIDATE_FAILED)
        r.pool.shutdown()
