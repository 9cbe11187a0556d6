"""A boot HTTP server with the real agent service and lease store, and a client that can
speak from any loopback address (one per "machine" on the provisioning segment)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import LifecycleSettings
from provisioner.httpguard import GuardedSite, HttpLimits, guarded_runner
from provisioner.lifecycle.agent_binding import AgentBinding
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.ports import Ports
from provisioner.simulation.world import SimWorld
from provisioner.store.leases import LeaseRepo
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.peers.ports import free_tcp_port

MAC = "52:54:00:77:01:10"


class Segment:
    def __init__(self, url: str, store: Store, conductor: Conductor, leases: LeaseRepo) -> None:
        self.url, self.store, self.conductor, self.leases = url, store, conductor, leases

    async def call(self, source: str, method: str, path: str, *, token: str = "",
                   body: object = None) -> tuple[int, Any]:
        """One HTTP request from ``source`` (a loopback address of our choice)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connector = aiohttp.TCPConnector(local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session, session.request(
                method, f"{self.url}{path}", json=body, headers=headers) as response:
            text = await response.text()
            return response.status, text

    async def script(self, source: str, mac: str = MAC) -> tuple[int, str]:
        status, text = await self.call(source, "GET", f"/boot/{mac}.ipxe")
        return status, text

    async def history(self, mac: str = MAC) -> list[tuple[str, str]]:
        node = await self.store.nodes.find(mac)
        return [(h.event, h.reason) for h in await self.store.nodes.history(node.id)]


@asynccontextmanager
async def running_segment(store: Store, world: SimWorld, tmp_path: Path,
                          limits: HttpLimits | None = None,
                          discovery_burst: int = 5) -> AsyncIterator[Segment]:
    """The boot HTTP server on 127.0.0.1 with the real agent service, its address binding
    backed by the real lease store, behind the daemon's HTTP limits (``httpguard``)."""
    mailbox = FactsMailbox()
    base = fake_ports(world)
    ports = Ports(bmc=base.bmc, inspector=mailbox, installer=base.installer, kube=base.kube,
                  slurm=base.slurm)
    conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_deploy=False))
    leases = LeaseRepo(store.engine, store.pool)
    agents = AgentService(conductor, store.nodes, store.tokens, mailbox, token_ttl_s=600,
                          binding=AgentBinding(leases))
    discovery = Discovery(store.nodes, conductor, TokenBucket(rate_per_s=0.001,
                                                          burst=discovery_burst))
    port = free_tcp_port()  # known before the start: scripts carry absolute URLs (GRUB's)
    http = BootHttp(BootHttpConfig(base_url=f"http://127.0.0.1:{port}",
                                   artefacts_dir=tmp_path, assets_dir=tmp_path,
                                   kernel="inspect/vmlinuz", initrd="inspect/initrd.gz",
                                   kernel_args="console=ttyS0"),
                    discovery=discovery, agents=agents, tokens=store.tokens,
                    renderer=Renderer())
    limits = limits or HttpLimits()
    runner = guarded_runner(http.app(), limits)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", port, limits=limits)
    await site.start()
    try:
        yield Segment(f"http://127.0.0.1:{port}", store, conductor, leases)
    finally:
        await conductor.stop()
        await runner.cleanup()
