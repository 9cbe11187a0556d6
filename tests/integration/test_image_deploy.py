"""Image deploy through the agent: the real agent code fetches its ``deploy`` job from the
real boot HTTP server, streams the image (raw or gzip) onto a file that stands in for the
node's disk, checks the sha256, and the conductor takes the node on to ``active``. A wrong
checksum fails the step with the reason and leaves no bootable disk."""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import ImageSettings, LifecycleSettings
from provisioner.domain import NewNode
from provisioner.errors import FatalError
from provisioner.install.base import ComposedInstaller
from provisioner.install.images import AgentImageWriter, AgentJobs, choose_disk
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_boot_http import (
    MAC,
    agent_args,
    agent_thread,
    get_script,
    host_facts,
)

S = NodeState
IMAGE = os.urandom(3 << 20) + b"\0" * (1 << 20)  # 4 MiB, partly compressible
SERVED = {"os.raw": IMAGE, "os.raw.gz": gzip.compress(IMAGE, mtime=0)}
DISK = 8 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Rig:
    def __init__(self, url: str, store: Store, conductor: Conductor, work: Path) -> None:
        self.url, self.store, self.conductor, self.work = url, store, conductor, work
        self.disk = work / "dev" / "vdb"


MakeRig = Callable[[ImageSettings], Awaitable[Rig]]


@pytest.fixture
async def make_rig(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[MakeRig]:
    made: list[tuple[Conductor, web.AppRunner]] = []

    async def make(settings: ImageSettings) -> Rig:
        artefacts = tmp_path / "artefacts"
        (artefacts / "images").mkdir(parents=True)
        for name, data in SERVED.items():
            (artefacts / "images" / name).write_bytes(data)
        (tmp_path / "dev").mkdir()
        (tmp_path / "dev" / "vdb").write_bytes(b"\xff" * DISK)  # the old disk contents
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        jobs, mailbox = AgentJobs(), FactsMailbox()
        base = fake_ports(world)
        writer = AgentImageWriter(jobs, {"p1": settings}, f"{url}/artefacts")
        ports = Ports(bmc=base.bmc, inspector=mailbox, kube=base.kube, slurm=base.slurm,
                      installer=ComposedInstaller(writer, base.installer))
        conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_deploy=False))
        agents = AgentService(conductor, store.nodes, store.tokens, mailbox, token_ttl_s=600,
                              jobs=jobs)
        http = BootHttp(BootHttpConfig(base_url=url, artefacts_dir=artefacts,
                                       assets_dir=tmp_path, kernel="k", initrd="i",
                                       kernel_args=""),
                        discovery=Discovery(store.nodes, conductor, TokenBucket(10, 10)),
                        agents=agents, tokens=store.tokens, renderer=Renderer())
        runner = web.AppRunner(http.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        made.append((conductor, runner))
        return Rig(url, store, conductor, tmp_path)

    yield make
    for conductor, runner in made:
        await conductor.stop()
        await runner.cleanup()


async def deploy(rig: Rig) -> tuple[str, list[str]]:
    """An inspected node with two disks is deployed; its agent runs until powered off."""
    node = await rig.conductor.enroll(NewNode(state=S.ENROLLED, macs=(MAC,), serial="IMG-1",
                                              hostname="gpu-img", profile="p1"), actor="op")
    await rig.store.nodes.merge_facts(node.id, {"disks": [
        {"name": "vda", "size_bytes": 1 << 30, "rotational": True},
        {"name": "vdb", "size_bytes": DISK, "rotational": False}]})
    await rig.store.nodes.transition(await rig.store.nodes.get(node.id), to_state=S.INSPECTED,
                                     event="done", actor="test")
    await rig.conductor.fire(node.id, Event.DEPLOY, actor="op")
    args = agent_args(await get_script(rig, MAC)) | {"url": rig.url}  # type: ignore[arg-type]
    powered = await agent_thread(args, host_facts(MAC, "IMG-1"), device_dir=rig.work / "dev")
    return node.id, powered


@pytest.mark.parametrize("name", ["os.raw", "os.raw.gz"], ids=["raw", "gzip"])
async def test_image_streamed_to_the_chosen_disk(make_rig: MakeRig, name: str) -> None:
    rig = await make_rig(ImageSettings(url=f"images/{name}", sha256=sha(SERVED[name]),
                                       root_disk="smallest", root_disk_nonrotational=True))
    node_id, powered = await deploy(rig)
    await wait_for_state(rig.store, node_id, S.ACTIVE, timeout_s=30)
    assert powered == ["poweroff"]
    disk = rig.disk.read_bytes()
    assert disk[:len(IMAGE)] == IMAGE  # decompressed as it streamed
    assert disk[len(IMAGE):] == b"\xff" * (DISK - len(IMAGE))
    events = [h.event for h in await rig.store.nodes.history(node_id)]
    assert events[-5:] == ["deploy", "done", "done", "done", "done"]


async def test_a_checksum_mismatch_fails_and_leaves_no_bootable_disk(make_rig: MakeRig) -> None:
    rig = await make_rig(ImageSettings(url="images/os.raw", sha256="0" * 64,
                                       root_disk="name:vdb"))
    node_id, powered = await deploy(rig)
    failed = await wait_for_state(rig.store, node_id, S.DEPLOY_FAILED, timeout_s=30)
    assert "sha256 mismatch" in failed.last_error and "boot area was wiped" in failed.last_error
    assert powered == ["poweroff"]
    disk = rig.disk.read_bytes()
    assert disk[: 1 << 20] == bytes(1 << 20)  # no partition table, no boot code
    assert disk[-(1 << 20):] == bytes(1 << 20)  # no GPT backup either


@pytest.mark.parametrize(("rule", "kwargs", "expected"), [
    ("smallest", {}, "vdb"), ("largest", {}, "vda"), ("name:vda", {}, "vda"),
    ("serial:S-2", {}, "vdb"), ("smallest", {"root_disk_min_gb": 1}, "vda"),
    ("largest", {"root_disk_nonrotational": True}, "vdb"),
])
def test_root_disk_rules(rule: str, kwargs: dict[str, object], expected: str) -> None:
    disks = [{"name": "vda", "size_bytes": 2 << 30, "rotational": True, "serial": "S-1"},
             {"name": "vdb", "size_bytes": 8 << 20, "rotational": False, "serial": "S-2"}]
    settings = ImageSettings(url="x.raw", sha256="0" * 64, root_disk=rule, **kwargs)
    assert choose_disk(disks, settings) == expected


def test_no_fitting_disk_names_the_rule_and_the_disks() -> None:
    settings = ImageSettings(url="x.raw", sha256="0" * 64, root_disk_min_gb=200)
    with pytest.raises(FatalError, match=r"min 200 GB.*vda \(1 GB\)"):
        choose_disk([{"name": "vda", "size_bytes": 10**9}], settings)
