"""Image deploy through the agent: the real agent code fetches its ``deploy`` job from the
real boot HTTP server, streams the image (raw, gzip or qcow2 made by ``qemu-img``) onto a
file that stands in for the node's disk, checks the sha256, grows the last partition, writes
the cloud-init seed and reboots (the node has no BMC). The test then plays the booted OS: it
reads the seed back from the disk (``isoinfo``) and posts ``booted`` with the seed's token and
hostname, and the conductor takes the node on to ``active``. A wrong checksum fails the step
with the reason and leaves no bootable disk; a wrong hostname in the callback fails it too."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cache
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import DeploySettings, ImageSettings, LifecycleSettings
from provisioner.domain import NewNode, Role
from provisioner.errors import FatalError
from provisioner.install.base import ComposedInstaller
from provisioner.install.images import AgentImageWriter, AgentJobs, SeedSource, choose_disk
from provisioner.lifecycle.agents import AgentService, AgentTokens, FactsMailbox
from provisioner.lifecycle.callbacks import BootCallbacks
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
DISK = 16 << 20
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA ops@mgmt"
needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("sfdisk", "qemu-img", "isoinfo")),
    reason="needs sfdisk, qemu-img and isoinfo (fdisk qemu-utils genisoimage: setup.sh)")


@cache
def served() -> dict[str, bytes]:
    """A 4 MiB image with an MBR and one partition (data, then zeros), as raw, gzip and
    qcow2 (made by qemu-img)."""
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"image-deploy-{os.getpid()}"
    work.mkdir(exist_ok=True)
    raw = work / "os.raw"
    raw.write_bytes(os.urandom(3 << 20) + b"\0" * (1 << 20))
    subprocess.run(["sfdisk", "-q", str(raw)], input=b"label: dos\n2048,,83,*\n", check=True)
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "os.qcow2")],
                   check=True)
    image = raw.read_bytes()
    found = {"os.raw": image, "os.raw.gz": gzip.compress(image, mtime=0),
             "os.qcow2": (work / "os.qcow2").read_bytes()}
    shutil.rmtree(work)
    return found


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Rig:
    def __init__(self, url: str, store: Store, conductor: Conductor, work: Path) -> None:
        self.url, self.store, self.conductor, self.work = url, store, conductor, work
        self.disk = work / "dev" / "vdb"

    def seed(self) -> dict[str, str]:
        """The seed partition's files, read back from the disk as the booted OS would."""
        table = json.loads(subprocess.run(["sfdisk", "--json", str(self.disk)],
                                          capture_output=True, check=True).stdout)
        seed = table["partitiontable"]["partitions"][-1]
        iso = self.work / "seed.iso"
        with self.disk.open("rb") as disk:
            disk.seek(seed["start"] * 512)
            iso.write_bytes(disk.read(seed["size"] * 512))
        return {name: subprocess.run(["isoinfo", "-R", "-i", str(iso), "-x", f"/{name}"],
                                     capture_output=True, check=True, text=True).stdout
                for name in ("meta-data", "user-data", "provisioner.env")}

    async def boot_os(self, hostname: str | None = None) -> dict[str, object]:
        """Play the deployed OS: post ``booted`` with the seed's URL, token and hostname."""
        files = await asyncio.to_thread(self.seed)
        env = dict(line.split("=", 1) for line in files["provisioner.env"].splitlines())
        url, token = env["PROVISIONER_CALLBACK_URL"].strip("'"), env["PROVISIONER_TOKEN"].strip("'")
        name = hostname or json.loads(files["meta-data"])["local-hostname"]
        async with aiohttp.ClientSession() as session, session.post(
                url, json={"event": "booted", "hostname": name},
                headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status == 200, await response.text()
            reply = await response.json()
            assert isinstance(reply, dict)
            return reply


MakeRig = Callable[[ImageSettings], Awaitable[Rig]]


@pytest.fixture
async def make_rig(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[MakeRig]:
    made: list[tuple[Conductor, web.AppRunner]] = []

    async def make(settings: ImageSettings) -> Rig:
        artefacts = tmp_path / "artefacts"
        (artefacts / "images").mkdir(parents=True, exist_ok=True)
        for name, data in served().items():
            (artefacts / "images" / name).write_bytes(data)
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev" / "vdb").write_bytes(b"\xff" * DISK)  # the old disk contents
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        jobs, mailbox = AgentJobs(), FactsMailbox()
        tokens = AgentTokens(store.tokens, ttl_s=600)
        callbacks = BootCallbacks(timeout_s=30)
        base = fake_ports(world)
        writer = AgentImageWriter(jobs, {"p1": settings}, f"{url}/artefacts", seeds=SeedSource(
            DeploySettings(ssh_authorized_keys=[KEY]), url, tokens.issue_token))
        ports = Ports(bmc=base.bmc, inspector=mailbox, kube=base.kube, slurm=base.slurm,
                      installer=ComposedInstaller(writer, base.installer), boots=callbacks)
        conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_deploy=False))
        agents = AgentService(conductor, store.nodes, store.tokens, mailbox, token_ttl_s=600,
                              jobs=jobs, agent_tokens=tokens, callbacks=callbacks)
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


@needs_tools
@pytest.mark.parametrize("name", ["os.raw", "os.raw.gz", "os.qcow2"], ids=["raw", "gzip", "qcow2"])
async def test_image_streamed_grown_seeded_and_booted(make_rig: MakeRig, name: str) -> None:
    rig = await make_rig(ImageSettings(url=f"images/{name}", sha256=sha(served()[name]),
                                       root_disk="smallest", root_disk_nonrotational=True))
    node_id, powered = await deploy(rig)
    assert powered == ["reboot"]  # no BMC: the agent boots the written disk itself
    script = await get_script(rig, MAC)  # firmware that PXE-boots first gets a local boot
    assert "sanboot" in script and "kernel" not in script
    image, disk = served()["os.raw"], rig.disk.read_bytes()
    assert disk[:446] == image[:446] and disk[512:len(image)] == image[512:]
    assert disk[len(image):len(image) + (1 << 20)] == b"\xff" * (1 << 20)  # not rewritten
    files = await asyncio.to_thread(rig.seed)
    assert json.loads(files["meta-data"])["local-hostname"] == "gpu-img"
    assert KEY in files["user-data"] and "/agent/v1/callback" in files["user-data"]
    assert (await rig.store.nodes.get(node_id)).state is S.DEPLOYING  # waits for the OS
    assert (await rig.boot_os())["recorded"] is True
    await wait_for_state(rig.store, node_id, S.ACTIVE, timeout_s=30)
    history = await rig.store.nodes.history(node_id)
    written = next(h for h in history if h.event == "image_written")
    assert f"sha256 {sha(served()[name])} verified" in written.reason
    assert "partition 1 grown" in written.reason and "seed partition 2" in written.reason
    booted = next(h for h in history if h.event == "booted")
    assert booted.reason == "hostname 'gpu-img' from 127.0.0.1" and booted.actor == "node"
    # where the OS called from is where Ansible finds it at configuring
    assert (await rig.store.nodes.get(node_id)).facts["address"] == "127.0.0.1"
    # the token in the seed (plain text on the node's disk) is revoked once it was used
    files = await asyncio.to_thread(rig.seed)
    env = dict(line.split("=", 1) for line in files["provisioner.env"].splitlines())
    async with aiohttp.ClientSession() as session, session.post(
            env["PROVISIONER_CALLBACK_URL"].strip("'"),
            json={"event": "booted", "hostname": "gpu-img"},
            headers={"Authorization": f"Bearer {env['PROVISIONER_TOKEN'].strip(chr(39))}"},
    ) as response:
        assert response.status == 401


@needs_tools
async def test_an_os_with_another_hostname_fails_the_deploy(make_rig: MakeRig) -> None:
    rig = await make_rig(ImageSettings(url="images/os.raw", sha256=sha(served()["os.raw"])))
    node_id, _ = await deploy(rig)
    await rig.boot_os(hostname="localhost")
    failed = await wait_for_state(rig.store, node_id, S.DEPLOY_FAILED, timeout_s=30)
    assert "reported hostname 'localhost', not 'gpu-img'" in failed.last_error


@needs_tools
async def test_a_checksum_mismatch_fails_and_leaves_no_bootable_disk(make_rig: MakeRig) -> None:
    rig = await make_rig(ImageSettings(url="images/os.raw", sha256="0" * 64,
                                       root_disk="name:vdb"))
    node_id, powered = await deploy(rig)
    failed = await wait_for_state(rig.store, node_id, S.DEPLOY_FAILED, timeout_s=30)
    assert "sha256 mismatch" in failed.last_error and "boot area was wiped" in failed.last_error
    assert powered == ["poweroff"]  # no reboot into a bad disk
    disk = rig.disk.read_bytes()
    assert disk[: 1 << 20] == bytes(1 << 20)  # no partition table, no boot code
    assert disk[-(1 << 20):] == bytes(1 << 20)  # no GPT backup either
    assert "image_written" not in [h.event for h in await rig.store.nodes.history(node_id)]


async def test_callback_refusals(make_rig: MakeRig) -> None:
    rig = await make_rig(ImageSettings(url="images/os.raw", sha256="0" * 64))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{rig.url}/agent/v1/callback",
                                json={"event": "booted"}) as response:
            assert response.status == 401
        node = await rig.conductor.enroll(NewNode(state=S.ENROLLED, macs=(MAC,)), actor="op")
        token = await rig.store.tokens.create("t", Role.AGENT, node_id=node.id)
        for body, status in (({"event": "rebooted"}, 422), ({"event": "booted",
                             "hostname": 7}, 422), ({"event": "installed"}, 200)):
            async with session.post(f"{rig.url}/agent/v1/callback", json=body,
                                    headers={"Authorization": f"Bearer {token[1]}"}) as reply:
                assert reply.status == status, await reply.text()
    # no deploy waits for it: ignored (a coalesced row), the address not taken from it
    assert [h.event for h in await rig.store.nodes.history(node.id)][-1] == "callback_ignored"
    assert "address" not in (await rig.store.nodes.get(node.id)).facts


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
