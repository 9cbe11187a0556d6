"""The Debian installer itself, in a qemu VM (TCG), boots with the kernel line our iPXE script
gives it and fetches its preseed.cfg from the boot HTTP server with the node's token.

The kernel and initrd are Debian's (``debian-installer-12-netboot-amd64``), served from the
artefacts dir; qemu loads them with ``-kernel``/``-initrd`` (the iPXE step itself is covered by
tests/e2e/test_pxe_qemu.py) and reaches the server through its user-mode network, where
10.0.2.2 is the host's loopback. Done = the server served ``preseed.cfg`` to the installer
(about 80 s under TCG on a busy 2-core machine)."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.install_http import InstallerHttp
from provisioner.boot.render import Renderer
from provisioner.config import InstallerSettings, LifecycleSettings
from provisioner.domain import NewNode
from provisioner.install.unattended import UnattendedInstalls
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.peers.ports import free_tcp_port

DI = Path("/usr/lib/debian-installer/images/12/amd64/text/debian-installer/amd64")
MAC = "52:54:00:12:34:56"
DEADLINE_S = 240


def _missing() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (scripts/setup.sh installs it)"
    if not (DI / "linux").is_file():
        return "debian-installer-12-netboot-amd64 is not installed (scripts/setup.sh does)"
    return None


@pytest.fixture
async def server(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[str]:
    """The boot HTTP server on 127.0.0.1:<port>, telling nodes it is http://10.0.2.2:<port>."""
    if (reason := _missing()) is not None:
        pytest.skip(reason)
    artefacts = tmp_path / "artefacts"
    (artefacts / "debian-12").mkdir(parents=True)
    for name in ("linux", "initrd.gz"):
        shutil.copy(DI / name, artefacts / "debian-12" / name)  # links out are refused
    port = free_tcp_port()
    url = f"http://10.0.2.2:{port}"
    installers = {"debian": InstallerSettings(
        method="preseed", kernel="debian-12/linux", initrd="debian-12/initrd.gz",
        repo_url="http://deb.debian.org/debian", kernel_args="console=ttyS0")}
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_deploy=False, auto_inspect=False))
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(), token_ttl_s=900)
    renderer = Renderer()
    http = BootHttp(
        BootHttpConfig(base_url=url, artefacts_dir=artefacts, assets_dir=tmp_path,
                       kernel="inspect/vmlinuz", initrd="inspect/initrd.gz", kernel_args=""),
        discovery=Discovery(store.nodes, conductor, TokenBucket(rate_per_s=1, burst=5)),
        agents=agents, tokens=store.tokens, renderer=renderer,
        installer=InstallerHttp(UnattendedInstalls(installers, base_url=url), base_url=url,
                                nodes=store.nodes, tokens=store.tokens, renderer=renderer))
    runner = web.AppRunner(http.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await conductor.stop()
    await runner.cleanup()


async def test_debian_installer_fetches_its_preseed_with_the_token(
        server: str, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = await store.nodes.create(NewNode(
        state=NodeState.DEPLOYING, hostname="gpu-042.lab.example", serial="DI-1", macs=(MAC,),
        profile="debian"), actor="test")
    await store.nodes.merge_facts(node.id, {"disks": [{"name": "vda", "size_bytes": 8 * 10**9,
                                                       "rotational": True}]})
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server}/boot/{MAC}.ipxe") as response:
            script = await response.text()
        kernel = next(line for line in script.splitlines() if line.startswith("kernel "))
        kernel_url, append = kernel.split(" ", 2)[1:]
        # the kernel iPXE would fetch is the one the artefacts route serves
        async with session.get(kernel_url.replace("10.0.2.2", "127.0.0.1")) as response:
            assert response.status == 200
            assert await response.read() == (DI / "linux").read_bytes()
    assert re.search(r"url=http://10\.0\.2\.2:\d+/install/pvt_[\w-]+/preseed\.cfg", append)
    caplog.set_level(logging.INFO, logger="provisioner.boot.install_http")
    log_path = tmp_path / "qemu.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            "qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "qemu64", "-m", "1024",
            "-smp", "1", "-nographic", "-vga", "none", "-no-reboot",
            "-kernel", str(DI / "linux"), "-initrd", str(DI / "initrd.gz"),
            "-append", append.removeprefix("initrd=initrd.gz "),
            "-netdev", "user,id=n0", "-device", f"virtio-net-pci,netdev=n0,mac={MAC}",
            stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=asyncio.subprocess.STDOUT)
        try:
            served = await _wait_for_preseed(caplog, node.id)
        finally:
            proc.kill()
            await proc.wait()
    console = log_path.read_bytes().decode(errors="replace")
    assert served, f"no preseed.cfg fetch in {DEADLINE_S} s; console tail:\n{console[-3000:]}"
    assert "Configuring the network with DHCP" in console


async def _wait_for_preseed(caplog: pytest.LogCaptureFixture, node_id: str) -> bool:
    wanted = f"node {node_id}: served installer preseed.cfg"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        if any(record.getMessage() == wanted for record in caplog.records):
            return True
        await asyncio.sleep(1)
    return False
