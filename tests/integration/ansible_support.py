"""Shared pieces of the Ansible tests: a short state dir, the installer for a target, no-op
drivers for the steps around ``configuring``, a boot HTTP server for fact posts."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import InstallSettings, LifecycleSettings
from provisioner.domain import Node, Sanitised
from provisioner.install.base import AgentEndpoint, ComposedInstaller, InstallEvent
from provisioner.install.installer import AnsibleInstaller
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.ports import AcceptAll, Ports, Validator
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.peers.sshd import SshNode

# The target shares the test host's kernel: files and unit enablement only (see sshd.py).
TARGET_VARS: dict[str, Any] = {"provisioner_runtime": False, "facts_extra_interfaces": ["eth0"]}


@contextmanager
def short_dir(prefix: str = "pv") -> Iterator[Path]:
    """A directory with a short path (ssh ControlMaster sockets must fit in 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def target_settings(node: SshNode, **overrides: Any) -> InstallSettings:
    values: dict[str, Any] = {"ssh_private_key_file": node.key,
                              "ssh_common_args": node.ssh_common_args(),
                              "install_packages": False, "extra_vars": dict(TARGET_VARS)}
    values.update(overrides)
    return InstallSettings(**values)


def make_installer(settings: InstallSettings, state_dir: Path,
                   agent: AgentEndpoint | None = None) -> tuple[AnsibleInstaller,
                                                               ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2, thread_name_prefix="install")
    return AnsibleInstaller.create(settings, state_dir=state_dir, pool=pool, agent=agent), pool


class Nothing:
    """Image writer, Kubernetes and Slurm drivers that succeed at once (the steps around
    ``configuring`` are not under test here)."""

    async def deploy_image(self, node: Node, generation: str) -> None:
        return None

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        return Sanitised(())

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        return {"ok": True, "arrays": []}

    async def join(self, node: Node) -> None:
        return None

    async def maintenance(self, node: Node, on: bool, reason: str) -> None:
        return None

    async def remove(self, node: Node) -> None:
        return None

    async def register(self, node: Node) -> None:
        return None


def conductor_with(store: Store, world: SimWorld, installer: AnsibleInstaller,
                   validator: Validator | None = None) -> Conductor:
    base, nothing = fake_ports(world), Nothing()
    ports = Ports(bmc=base.bmc, inspector=base.inspector,
                  installer=ComposedInstaller(nothing, installer), kube=nothing, slurm=nothing,
                  validator=validator or AcceptAll())
    conductor = Conductor(store.nodes, ports,
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))

    async def record(node_id: str, event: InstallEvent) -> None:  # what daemon.py wires
        await conductor.record(node_id, "ansible", actor="ansible", reason=event.summary())

    installer.set_event_sink(record)
    return conductor


@dataclass(frozen=True)
class AgentApi:
    url: str
    agents: AgentService



@asynccontextmanager
async def agent_api(store: Store, conductor: Conductor, tmp: Path,
                    port: int) -> AsyncIterator[AgentApi]:
    """The real boot HTTP server (agent API) on 127.0.0.1, as the facts role posts to it."""
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(), token_ttl_s=600)
    http = BootHttp(BootHttpConfig(base_url="", artefacts_dir=tmp, assets_dir=tmp,
                                   kernel="k", initrd="i", kernel_args=""),
                    discovery=Discovery(store.nodes, conductor, TokenBucket(0.001, 1)),
                    agents=agents, tokens=store.tokens, renderer=Renderer())
    runner = web.AppRunner(http.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield AgentApi(f"http://127.0.0.1:{port}", agents)
    finally:
        await runner.cleanup()
