"""The daemon's servers: the API (behind the HTTP guard), the boot services that are
configured, and the PostgreSQL change listener that keeps several daemons' caches and
maintenance holds in step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack

from aiohttp import web
from sqlalchemy.engine import make_url

from provisioner.api.app import EVENTS_PATH, make_app
from provisioner.boot.stack import build_boot
from provisioner.config import Settings
from provisioner.config.profiles import profile_registry
from provisioner.httpguard import GuardedSite, HttpLimits, guarded_runner
from provisioner.install.images import AgentJobs
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.agents import AgentTokens, FactsMailbox
from provisioner.lifecycle.callbacks import BootCallbacks
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.inband import InbandIntake
from provisioner.lifecycle.repair import RepairService
from provisioner.lifecycle.rotation import BmcRotation
from provisioner.lifecycle.waves import WaveDriver
from provisioner.metrics import Metrics
from provisioner.slurm.model import SlurmClient
from provisioner.store.notify import Listener, NodeChanged
from provisioner.store.store import Store
from provisioner.topology_live.live import LiveTopology


async def start_api(settings: Settings, store: Store, conductor: Conductor, metrics: Metrics,
                    topology: LiveTopology, rotation: BmcRotation,
                    repairs: RepairService | None = None,
                    acceptance: DomainAcceptance | None = None,
                    health: HealthFindings | None = None,
                    slurm: SlurmClient | None = None,
                    kube: KubeNodeJoiner | None = None,
                    waves: WaveDriver | None = None) -> web.AppRunner:
    """The API, listening (behind the HTTP guard) before READY=1."""
    app = make_app(conductor=conductor, nodes=store.nodes, tokens=store.tokens,
                   metrics=metrics, settings=settings.api, topology=topology,
                   rotation=rotation, ownership=store.ownership, repairs=repairs,
                   acceptance=acceptance, health=health,
                   profiles=profile_registry(settings), slurm=slurm, kube=kube,
                   waves=waves)
    # slow clients, floods from one address (httpguard); the event stream lives on
    limits = HttpLimits(streaming_paths=frozenset({EVENTS_PATH}))
    runner = guarded_runner(app, limits, name="API")
    await runner.setup()
    host, port = settings.api.host_port
    await GuardedSite(runner, host, port, limits=limits, reuse_address=True).start()
    return runner


async def start_boot(settings: Settings, stack: AsyncExitStack, store: Store,
                     conductor: Conductor, mailbox: FactsMailbox, agent_tokens: AgentTokens,
                     jobs: AgentJobs, callbacks: BootCallbacks,
                     on_remote: Callable[[], None] | None = None,
                     inband: InbandIntake | None = None) -> None:
    """The boot services that are configured: HTTP (scripts, artefacts, agent), DHCP,
    TFTP. Each binds before READY=1; a port in use stops the start. ``on_remote``: called
    when another daemon wrote a node (the event feed reads at once)."""
    caches: list[Discovery] = []
    boot = build_boot(settings, store, conductor, mailbox, agent_tokens, jobs,
                      callbacks, caches=caches, inband=inband)
    listen_for_changes(settings, stack, store, caches, conductor, on_remote)
    for server in boot:
        await server.start()
        stack.push_async_callback(server.stop)


def listen_for_changes(settings: Settings, stack: AsyncExitStack, store: Store,
                       caches: list[Discovery], conductor: Conductor,
                       on_remote: Callable[[], None] | None = None) -> None:
    """PostgreSQL: other daemons' node writes drop entries from our MAC caches, and a
    maintenance flag set there parks the node's step running here."""
    url = make_url(settings.sqlalchemy_url)
    if not url.drivername.startswith("postgresql"):
        return

    def changed(notice: NodeChanged) -> None:
        for cache in caches:
            cache.forget(notice.macs)
        conductor.remote_change(notice.node_id)
        if on_remote is not None:
            on_remote()

    def reconnected() -> None:
        for cache in caches:
            cache.forget_all()

    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    listener = Listener(conninfo, store.instance, asyncio.get_running_loop(), changed,
                        reconnected)
    listener.start()
    stack.callback(listener.stop)
