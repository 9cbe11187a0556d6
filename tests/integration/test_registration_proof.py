"""Registration proof against a real Slurm 22.05 (slurmctld with ``GresTypes=gpu``, dynamic
``slurmd -Z``) and a real kube-apiserver with kwok Nodes.

A GPU node whose slurmd registered without its GRES (``Gres=(null)``, the Slinky failure of
SlurmProject/slurm-operator#106) is held with the reason; with the ``--conf`` and gres.conf line
the daemon writes (``provisioner.slurm.agree``; the gres.conf ``File=`` are character devices
with /dev/null's numbers, which slurmd accepts as GPUs) it registers ``Gres=gpu:h100:2`` and the
node goes ``active``. A Kubernetes Node whose ``nvidia.com/gpu.count`` disagrees holds it too.
A slurmd whose GPUs carry the type Slurm's ``AutoDetect=nvml`` gives them
(``nvidia_h100_80gb_hbm3``) registers as the node's; with fewer GPUs it is held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from provisioner.config import LifecycleSettings, SlurmSettings
from provisioner.errors import FatalError
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import Event, NodeState
from provisioner.slurm.agree import Inventory, gres_conf_line, inventory, nvml_type, slurmd_conf
from provisioner.slurm.handoff import SlurmHandoff
from provisioner.slurm.rest import RestSlurm
from provisioner.slurm.scontrol import ScontrolSlurm
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.kube_support import connected, domain_node, kube_settings
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin
from tests.peers.slurm import (
    Slurm,
    jwt_extra,
    open_workdir,
    running_munged,
    running_slurmctld,
    running_slurmd,
    running_slurmrestd,
    slurm_token,
    slurm_unavailable_reason,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]
H100 = {"vendor": "0x10de", "device": "0x2330", "name": "NVIDIA H100 80GB HBM3"}
FACTS = {"gpus": [dict(H100, pci_address=f"0000:{0x17 + i:02x}:00.0") for i in range(2)]}
BASE_CONF = "CPUs=2 RealMemory=2000"
NVML = nvml_type(H100["name"])  # nvidia_h100_80gb_hbm3


@dataclasses.dataclass
class Cluster:
    slurm: Slurm
    workdir: Path
    url: str


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with open_workdir("slurm-gres-") as workdir, running_munged() as sock, \
            running_slurmctld(workdir, [], None, sock, plugin="topology/none",
                              extra=jwt_extra(workdir) | {"GresTypes": "gpu"}) as slurm, \
            running_slurmrestd(slurm, workdir) as url:
        for index in range(2):  # the "GPUs": character devices numbered as /dev/null
            os.mknod(workdir / f"nvidia{index}", 0o666 | 0o020000, os.makedev(1, 3))
        yield Cluster(slurm, workdir, url)


@contextmanager
def slurmd(cluster: Cluster, name: str, *, with_gres: bool) -> Iterator[None]:
    """A dynamic slurmd: bare (what a Slinky pod without GPU config runs), or with what the
    daemon writes for the node (``--conf`` additions and its gres.conf line)."""
    have = inventory(FACTS)
    conf = BASE_CONF
    if with_gres:
        conf += " " + slurmd_conf(have, ["gpu-worker"])
        line = gres_conf_line(have, name, files=f"{cluster.workdir}/nvidia[0-{{last}}]")
        (cluster.workdir / "gres.conf").write_text(line + "\n")
    with running_slurmd(cluster.slurm, cluster.workdir, name, conf=conf):
        yield


@contextmanager
def typed_slurmd(cluster: Cluster, name: str, gpus: int, kind: str = NVML) -> Iterator[None]:
    """A dynamic slurmd with ``gpus`` GPUs of type ``kind``: by default the one
    AutoDetect=nvml gives an ``NVIDIA H100 80GB HBM3``."""
    have = Inventory(gpus, H100["name"])
    line = gres_conf_line(have, name, files=f"{cluster.workdir}/nvidia[0-{{last}}]", kind=kind)
    (cluster.workdir / "gres.conf").write_text(line + "\n")
    with running_slurmd(cluster.slurm, cluster.workdir, name,
                        conf=f"{BASE_CONF} {slurmd_conf(have, [], kind)}"):
        yield


def settings() -> SlurmSettings:
    return SlurmSettings(register_timeout_s=30, drain_timeout_s=20, poll_interval_s=0.2)


def test_the_daemon_writes_gres_and_features() -> None:
    have = inventory(FACTS)
    assert slurmd_conf(have, ["gpu-worker"]) == "Gres=gpu:h100:2 Feature=gpu-worker,h100"
    assert gres_conf_line(have, "n1") == "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-1]"


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
async def test_gres_null_is_held_and_the_written_gres_registers(cluster: Cluster,
                                                                backend: str) -> None:
    name = f"gres-{backend}"
    token = SecretStr(slurm_token(cluster.slurm))
    writer = ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20)
    client = writer if backend == "scontrol" else RestSlurm(cluster.url, user="root",
                                                            token=token, writer=writer)
    handoff = SlurmHandoff(client, settings())
    node = domain_node(name, facts=FACTS)
    try:
        with slurmd(cluster, name, with_gres=False):
            with pytest.raises(FatalError) as held:
                await handoff.register(node)
            assert str(held.value) == (f"Slurm node {name} registered, but Slurm registered "
                                       "Gres=(null), node has 2× NVIDIA H100 80GB HBM3")
        with slurmd(cluster, name, with_gres=True):
            await handoff.register(node)
            found = await client.node(name)
            assert found is not None and found.gres.startswith("gpu:h100:2")
            assert found.features == {"gpu-worker", "h100"}
    finally:
        await client.aclose()


async def test_register_step_holds_then_goes_active(cluster: Cluster, store: Store,
                                                    world: Any, make_node: Any) -> None:
    """Through the conductor's ``registering`` step: register_failed with the reason, then,
    after the node's slurmd runs with the daemon's Gres, ``retry`` ends ``active``."""
    name = "gres-step"
    handoff = SlurmHandoff(ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20),
                           settings())
    ports = dataclasses.replace(fake_ports(world), slurm=handoff)
    cond = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False,
                                                           auto_deploy=False))
    node = await make_node(NodeState.REGISTERING, hostname=name, profile="gpu-worker")
    await store.nodes.merge_facts(node.id, FACTS)
    with slurmd(cluster, name, with_gres=False):
        await cond.recover()
        failed = await wait_for_state(store, node.id, NodeState.REGISTER_FAILED, timeout_s=40)
        assert failed.last_error == (f"Slurm node {name} registered, but Slurm registered "
                                     "Gres=(null), node has 2× NVIDIA H100 80GB HBM3")
    with slurmd(cluster, name, with_gres=True):
        await cond.fire(node.id, Event.RETRY, actor="op")
        await wait_for_state(store, node.id, NodeState.ACTIVE, timeout_s=40)
    await cond.stop()


async def test_kubernetes_gpu_count_disagreeing_is_held(cluster: Cluster,
                                                        kube_cluster: KubeCluster) -> None:
    name = "gres-kube-01"
    admin = KubeAdmin(kube_cluster)
    await asyncio.to_thread(admin.create_node, name, labels={
        "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    node = domain_node(name, facts=FACTS)
    async with connected(kube_settings(kube_cluster)) as kube:
        handoff = SlurmHandoff(ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20),
                               settings(), kube=kube)
        with slurmd(cluster, name, with_gres=True):
            with pytest.raises(FatalError) as held:
                await handoff.register(node)
            assert str(held.value) == (f"Slurm node {name} registered, but Kubernetes label "
                                       "nvidia.com/gpu.count=1, node has 2× NVIDIA H100 "
                                       "80GB HBM3")
            await asyncio.to_thread(admin.patch_node, name, {"metadata": {"labels": {
                "nvidia.com/gpu.count": "2"}}})
            await asyncio.to_thread(admin.patch_node, name, {"status": {
                "capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}},
                status=True)
            await handoff.register(node)  # all three agree now


async def test_handoff_writes_gres_into_the_nodeset_and_slurm_registers_it(
        cluster: Cluster, kube_cluster: KubeCluster) -> None:
    """Slinky's way: the hand-off merges ``Gres``/``Feature`` into the NodeSet's
    ``extraConf`` (keeping the operator's other words); the test plays the operator and starts
    slurmd with ``--conf <extraConf>``; the node registers with its GPUs and agrees."""
    from tests.integration.test_slurm_slinky import NAMESPACE, install_nodeset

    name = "gres-slinky-01"
    admin = KubeAdmin(kube_cluster)
    nodeset = await asyncio.to_thread(install_nodeset, admin, "gres-h100")
    nodeset_name = nodeset["metadata"]["name"]
    await asyncio.to_thread(admin.create_node, name)
    node = domain_node(name, facts=FACTS, profile="gpu-worker")
    slurm_settings = SlurmSettings(nodesets={"gpu-worker": nodeset_name},
                                   nodeset_namespace=NAMESPACE, register_timeout_s=30,
                                   poll_interval_s=0.2)
    async with connected(kube_settings(kube_cluster)) as kube:
        await kube.set_nodeset_extra_conf(NAMESPACE, nodeset_name, "Weight=10 Feature=old")
        handoff = SlurmHandoff(ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20),
                               slurm_settings, kube=kube, nodesets=kube)
        register = asyncio.create_task(handoff.register(node))
        extra = ""
        for _ in range(100):
            extra = await kube.nodeset_extra_conf(NAMESPACE, nodeset_name) or ""
            if "Gres=" in extra:
                break
            await asyncio.sleep(0.1)
        assert extra == f"Weight=10 Gres=gpu:h100:2 Feature={nodeset_name},h100"
        line = gres_conf_line(inventory(FACTS), name,
                              files=f"{cluster.workdir}/nvidia[0-{{last}}]")
        (cluster.workdir / "gres.conf").write_text(line + "\n")
        with running_slurmd(cluster.slurm, cluster.workdir, name,
                            conf=f"{BASE_CONF} {extra}"):
            await asyncio.wait_for(register, 40)
            assert "Gres=gpu:h100:2" in cluster.slurm.scontrol("show", "node", name)


async def test_nvml_named_gres_goes_active_and_fewer_gpus_are_held(
        cluster: Cluster, store: Store, world: Any, make_node: Any) -> None:
    """Through ``registering``: Slurm's AutoDetect type for 1 of the node's 2 GPUs holds it
    (``register_failed``); for both, ``retry`` ends ``active``."""
    name = "gres-nvml"
    handoff = SlurmHandoff(ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20),
                           settings())
    ports = dataclasses.replace(fake_ports(world), slurm=handoff)
    cond = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False,
                                                           auto_deploy=False))
    node = await make_node(NodeState.REGISTERING, hostname=name, profile="gpu-worker")
    await store.nodes.merge_facts(node.id, FACTS)
    with typed_slurmd(cluster, name, gpus=1):
        await cond.recover()
        failed = await wait_for_state(store, node.id, NodeState.REGISTER_FAILED, timeout_s=40)
        assert failed.last_error is not None and failed.last_error.startswith(
            f"Slurm node {name} registered, but Slurm registered "
            "Gres=gpu:nvidia_h100_80gb_hbm3:1")
        assert failed.last_error.endswith(", node has 2× NVIDIA H100 80GB HBM3")
    with typed_slurmd(cluster, name, gpus=2):
        await cond.fire(node.id, Event.RETRY, actor="op")
        await wait_for_state(store, node.id, NodeState.ACTIVE, timeout_s=40)
        registered = cluster.slurm.scontrol("show", "node", name)
        assert "Gres=gpu:nvidia_h100_80gb_hbm3:2" in registered
    await cond.stop()


async def test_the_sites_own_type_for_the_profile(cluster: Cluster) -> None:
    """``slurm.gres_types``: a type the site chose (``hopper``) registers only where the
    node's profile is configured with it."""
    name = "gres-site"
    client = ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20)
    node = domain_node(name, facts=FACTS, profile="gpu-worker")
    site = SlurmHandoff(client, SlurmSettings(gres_types={"gpu-worker": "hopper"},
                                              register_timeout_s=30, poll_interval_s=0.2))
    with typed_slurmd(cluster, name, gpus=2, kind="hopper"):
        await site.register(node)
        with pytest.raises(FatalError) as held:
            await SlurmHandoff(client, settings()).register(node)
        assert "(type hopper), node has 2× NVIDIA H100 80GB HBM3" in str(held.value)
