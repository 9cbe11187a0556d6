"""Composition root: settings → store → drivers → conductor → servers.

Owns the event loop's TaskGroup, signals and systemd notifications. Nothing imports it
except the CLI's ``serve`` command.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass

from aiohttp import web
from sqlalchemy.engine import make_url

from provisioner.api.app import EVENTS_PATH, make_app
from provisioner.bmc.base import SoftOff
from provisioner.bmc.fake import fake_bmc_factory
from provisioner.bmc.ipmi import IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.registry import BmcRegistry
from provisioner.boot.stack import base_url, build_boot, http_boot_uris
from provisioner.config import BmcProfile, BmcSettings, Settings
from provisioner.domain import Node
from provisioner.errors import ConfigError, Conflict, NotFound, SchemaError
from provisioner.httpguard import GuardedSite, HttpLimits, guarded_runner
from provisioner.install.base import (
    AgentEndpoint,
    ComposedInstaller,
    InstallEvent,
    OnEvent,
)
from provisioner.install.images import AgentImageWriter, AgentJobs, SeedSource
from provisioner.install.installer import AnsibleInstaller
from provisioner.kube.client import KubeClient
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.release import KubeOnlyHandoff
from provisioner.kube.sync import KubeSync, OnChange
from provisioner.lifecycle.agents import AgentTokens, FactsMailbox
from provisioner.lifecycle.callbacks import BootCallbacks
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery
from provisioner.lifecycle.fleet import FleetMember, Singleton, Work
from provisioner.lifecycle.ports import (
    BootWaiter,
    Inspector,
    Installer,
    KubeJoiner,
    NoBootWait,
    Ports,
    SlurmRegistrar,
    Validator,
)
from provisioner.lifecycle.power import PowerSync
from provisioner.lifecycle.rack_limit import RackBmcLimit
from provisioner.lifecycle.rotation import BmcRotation, generated_password
from provisioner.lifecycle.routing import (
    RoutedInspector,
    RoutedInstaller,
    RoutedKube,
    RoutedSlurm,
    RoutedValidator,
    Unavailable,
)
from provisioner.lifecycle.stagger import PowerOnStagger
from provisioner.lifecycle.sweeps import ExpirySweeps
from provisioner.lifecycle.validation import FactsValidator
from provisioner.log import setup_logging
from provisioner.metrics import Metrics
from provisioner.sdnotify import SystemdNotifier, watchdog_interval_s
from provisioner.simulation.drivers import (
    FakeInspector,
    FakeInstaller,
    FakeKube,
    FakeSlurm,
    FakeValidator,
)
from provisioner.simulation.rack import simulated_nodes
from provisioner.simulation.world import SimWorld
from provisioner.slurm.client import make_slurm_client
from provisioner.slurm.handoff import SlurmHandoff
from provisioner.slurm.maintenance import SlurmFirstKube
from provisioner.slurm.model import SlurmClient
from provisioner.slurm.sync import SlurmSync
from provisioner.store.exclusive import lock_sqlite
from provisioner.store.leases import LeaseRepo
from provisioner.store.notify import Listener, NodeChanged
from provisioner.store.store import Store, open_store
from provisioner.topology_live.build import build_live_topology
from provisioner.topology_live.live import LiveTopology

log = logging.getLogger(__name__)


def run(settings: Settings) -> int:
    """Run the daemon until SIGTERM or SIGINT; return the process exit code."""
    setup_logging(settings.log.level)
    try:
        return asyncio.run(Daemon(settings).serve())
    except (ConfigError, SchemaError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1


def build_bmc(settings: Settings, world: SimWorld) -> BmcManager:
    """BMC drivers by each node's driver name, behind breakers and limits. IPMI runs in
    worker processes (pyghmi blocks and keeps process-wide state); ``aclose()`` at
    shutdown logs every session out and stops them."""
    bmc = settings.bmc
    ipmi = IpmiDriver(ipmi_workers(bmc), timeout_s=bmc.timeout_s)
    redfish = RedfishDriver(timeout_s=bmc.timeout_s, verify_tls=bmc.redfish_verify_tls,
                            ca_file=bmc.redfish_ca_file)
    fake = fake_bmc_factory(world, delay_s=settings.simulation.step_delay_s)
    registry = BmcRegistry({"fake": fake, "ipmi": ipmi, "redfish": redfish},
                           closers=[ipmi.aclose, redfish.aclose])
    return BmcManager(registry, bmc)


@dataclass(frozen=True, slots=True)
class RealDrivers:
    """The drivers for real (not simulated) nodes; ``Unavailable`` where not configured."""

    inspector: Inspector
    installer: Installer
    kube: KubeJoiner
    validator: Validator
    slurm: SlurmRegistrar


def build_ports(settings: Settings, world: SimWorld, bmc: BmcManager, real: RealDrivers,
                boots: BootWaiter | None = None,
                rotation: BmcRotation | None = None) -> Ports:
    """Pick the drivers per node: simulated nodes (fake BMC) act on the simulated rack, real
    ones use ``real``."""
    delay_s, fail_rate = settings.simulation.step_delay_s, settings.simulation.fail_rate
    return Ports(
        bmc=bmc,
        stagger=PowerOnStagger(settings.bmc.power_on_per_rack_per_s,
                               exempt={"fake"}),  # simulated nodes have no PDUs
        rack_bmc=RackBmcLimit(settings.bmc.per_rack_concurrency,
                              settings.bmc.profile_rack_concurrency),
        inspector=RoutedInspector(
            FakeInspector(world, delay_s=delay_s, fail_rate=fail_rate), real.inspector),
        installer=RoutedInstaller(
            FakeInstaller(world, delay_s=delay_s, fail_rate=fail_rate), real.installer),
        kube=RoutedKube(FakeKube(world, delay_s=delay_s, fail_rate=fail_rate), real.kube),
        validator=RoutedValidator(
            FakeValidator(world, delay_s=delay_s, fail_rate=fail_rate), real.validator),
        slurm=RoutedSlurm(FakeSlurm(world, delay_s=delay_s, fail_rate=fail_rate), real.slurm),
        boots=boots or NoBootWait(),
        http_boot_uri=http_boot_uris(settings),
        soft_off=lambda node: soft_off_for(settings.bmc.profile(node.profile)),
        rotate_bmc=None if rotation is None else rotate_if_opted_in(settings.bmc, rotation),
    )


def build_rotation(settings: BmcSettings, store: Store, bmc: BmcManager) -> BmcRotation:
    site = settings.rotation_password
    return BmcRotation(store.nodes, store.bmc_secrets, bmc, effective=bmc.credentials_for,
                       passwords=generated_password if site is None
                       else lambda _node: site.get_secret_value())


async def _settle_rotations(rotation: BmcRotation) -> None:
    outcome = await rotation.settle_all(actor="startup")
    if outcome:
        log.info("BMC password rotations a stop had interrupted: %s", outcome)


def rotate_if_opted_in(settings: BmcSettings,
                       rotation: BmcRotation) -> Callable[[Node], Awaitable[None]]:
    async def rotate(node: Node) -> None:
        if settings.profile(node.profile).rotate_credentials:
            await rotation.rotate(node, actor="inspect")

    return rotate


def ipmi_workers(bmc: BmcSettings) -> IpmiWorkers:
    return IpmiWorkers(count=bmc.ipmi_workers, threads=bmc.ipmi_worker_threads,
                       heartbeat_timeout_s=bmc.ipmi_heartbeat_timeout_s,
                       grace_s=bmc.ipmi_hang_grace_s)


def soft_off_for(profile: BmcProfile) -> SoftOff:
    return SoftOff(profile.soft_off_timeout_s, profile.hard_off_fallback)


def _ansible_to_history(conductor: Conductor) -> OnEvent:
    """Ansible task events (changes, failures, recaps) -> history rows, no state change."""

    async def on_event(node_id: str, event: InstallEvent) -> None:
        await conductor.record(node_id, "ansible", actor="ansible", reason=event.summary())

    return on_event


def _maintenance_from(actor: str, store: Store, conductor: Conductor) -> OnChange:
    """Kubernetes or Slurm -> daemon: a cordon, a long NotReady or a drain made there
    becomes the maintenance flag (with its reason and a history row by ``actor``), without
    draining again. Nodes that are not ours are ignored."""

    async def on_change(hostname: str, maintenance: bool, reason: str) -> None:
        try:
            node = await store.nodes.find(hostname)
        except NotFound:
            return
        await conductor.set_maintenance(node.id, maintenance, actor=actor, reason=reason,
                                        propagate=False)

    return on_change


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._stop = asyncio.Event()
        self._notifier = SystemdNotifier()

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        async with AsyncExitStack() as stack:
            self._settings.state_dir.mkdir(parents=True, exist_ok=True)
            sqlite_lock = lock_sqlite(self._settings.sqlalchemy_url)  # ConfigError: exit 2
            if sqlite_lock is not None:
                stack.callback(sqlite_lock.release)
            store = await asyncio.to_thread(open_store, self._settings)
            stack.callback(store.close)
            world = SimWorld(self._settings.state_dir / "simworld.sqlite")
            stack.callback(world.close)
            metrics = Metrics()
            mailbox = FactsMailbox()
            kube_client = await self._connect_kube(stack)
            agent_tokens = AgentTokens(store.tokens,
                                       ttl_s=self._settings.boot.agent_token_ttl_s)
            # ConfigError (exit 2) without ansible-playbook
            ansible = self._ansible(stack, agent_tokens)
            joiner = None
            if kube_client is not None:
                joiner = KubeNodeJoiner(kube_client, self._settings.kube,
                                        run_join=ansible.run_join)
            topology = build_live_topology(self._settings, store, kube_client)
            stack.push_async_callback(topology.aclose)
            slurm_client = await self._connect_slurm(stack)
            jobs = AgentJobs()
            callbacks = BootCallbacks(timeout_s=self._settings.deploy.callback_timeout_s,
                                      installer_profiles=frozenset(self._settings.installers))
            images = self._image_writer(jobs, agent_tokens) or Unavailable(
                "OS image deploy", "set http.listen (the agent that writes images reaches "
                "the daemon over the boot HTTP server)")
            kube, slurm = self._kube_and_slurm(joiner, kube_client, slurm_client, topology)
            real = RealDrivers(
                inspector=mailbox, installer=ComposedInstaller(images, ansible), kube=kube,
                validator=FactsValidator(store.nodes, self._settings.validation), slurm=slurm)
            bmc = self._bmc(stack, world)
            rotation = build_rotation(self._settings.bmc, store, bmc)
            ports = build_ports(self._settings, world, bmc, real, callbacks, rotation)
            conductor = Conductor(store.nodes, ports, self._settings.lifecycle,
                                  observer=metrics.observe_transition,
                                  ownership=store.ownership)
            stack.push_async_callback(self._leave, store)  # after the conductor stopped
            # leases renewed from the first claim on (recovery and seeding claim nodes),
            # until the conductor's steps stopped
            fleet = FleetMember(conductor, store.ownership, api_listen=self._settings.api.listen)
            await store.ownership.heartbeat(self._settings.api.listen)
            fleet_task = asyncio.create_task(fleet.run(), name="fleet")
            stack.push_async_callback(_cancel, fleet_task)
            conductor.add_observer(topology.observe)
            ansible.set_event_sink(_ansible_to_history(conductor))
            stack.push_async_callback(conductor.stop, self._settings.daemon.shutdown_timeout_s)
            runner = await self._start_api(store, conductor, metrics, topology, rotation)
            stack.push_async_callback(runner.cleanup)  # runs first: no new requests, then drain
            await self._start_boot(stack, store, conductor, mailbox, agent_tokens, jobs,
                                   callbacks)
            resumed = await conductor.recover()  # before any new work starts
            await self._seed_simulation(store, conductor)
            log.info("ready: api on %s, instance %s, %d in-flight nodes resumed",
                     self._settings.api.listen, store.instance, resumed)
            self._notifier.ready(f"serving; {resumed} nodes resumed")
            async with asyncio.TaskGroup() as group:
                children = [group.create_task(self._watchdog(), name="watchdog")]
                power_sync = PowerSync(store.nodes, bmc, conductor.record_power,
                                       self._settings.bmc)
                children.append(group.create_task(  # rotations a crash left open
                    _settle_rotations(rotation), name="bmc-rotation-settle"))
                works: list[tuple[str, Work]] = [("power-sync", power_sync.run)]
                if kube_client is not None:
                    sync = KubeSync(kube_client, _maintenance_from("kubernetes", store, conductor),
                                    grace_s=self._settings.kube.not_ready_grace_s,
                                    interval_s=self._settings.kube.sync_interval_s)
                    works.append(("kube-sync", sync.run))
                if slurm_client is not None and self._settings.slurm.sync_interval_s > 0:
                    from_slurm = _maintenance_from("slurm", store, conductor)
                    slurm_sync = SlurmSync(slurm_client, from_slurm,
                                           interval_s=self._settings.slurm.sync_interval_s,
                                           reason_prefix=self._settings.slurm.reason_prefix)
                    works.append(("slurm-sync", slurm_sync.run))
                works.append(("topology", topology.run))
                sweeps = ExpirySweeps(LeaseRepo(store.engine, store.pool), store.tokens,
                                      interval_s=store.ownership.lease_s,
                                      instance=store.instance)
                works.append(("expiry-sweeps", sweeps.run))
                # fleet-wide work runs on the one daemon that leads "fleet" (docs/ha.md)
                singleton = Singleton(store.ownership, "fleet", works)
                children.append(group.create_task(singleton.run(), name="singletons"))
                await self._stop.wait()
                for child in children:
                    child.cancel()
            self._notifier.stopping()
            log.info("stopping: letting running sub-steps checkpoint")
        log.info("stopped")
        return 0

    @staticmethod
    async def _leave(store: Store) -> None:
        """A clean stop frees our leases and lead: another daemon resumes at once."""
        try:
            freed = await store.ownership.release_all()
        except Exception as exc:  # the database may be gone; the leases then expire
            log.warning("leases not released (%s); they expire after ha.lease_s",
                        type(exc).__name__)
            return
        if freed:
            log.info("released %d node leases", freed)

    def _bmc(self, stack: AsyncExitStack, world: SimWorld) -> BmcManager:
        """The BMC drivers; at stop, after the conductor's steps ended: BMC sessions
        logged out, then the IPMI workers stopped."""
        bmc = build_bmc(self._settings, world)
        stack.push_async_callback(bmc.aclose)
        return bmc

    async def _connect_slurm(self, stack: AsyncExitStack) -> SlurmClient | None:
        if not self._settings.slurm.enabled:
            return None
        client = make_slurm_client(self._settings.slurm)
        stack.push_async_callback(client.aclose)
        return client

    def _kube_and_slurm(self, joiner: KubeNodeJoiner | None, kube_client: KubeClient | None,
                        slurm_client: SlurmClient | None,
                        topology: LiveTopology) -> tuple[KubeJoiner, SlurmRegistrar]:
        """The ``kube`` and ``slurm`` drivers of real nodes. With Slurm, the hand-off
        releases the GPU operands (through the joiner) and maintenance drains in Slurm
        before Kubernetes evicts."""
        kube: KubeJoiner = joiner or Unavailable("Kubernetes join", "set kube.kubeconfig")
        if slurm_client is None:  # no Slurm: registering hands the node to Kubernetes only
            return kube, KubeOnlyHandoff(joiner)
        handoff = SlurmHandoff(
            slurm_client, self._settings.slurm, kube=kube_client,
            topology_spec=lambda node: topology.spec_for(node.hostname or ""),
            gpu_ready=joiner.release_operands if joiner is not None else None,
            nodesets=kube_client)
        return SlurmFirstKube(kube, handoff), handoff

    async def _connect_kube(self, stack: AsyncExitStack) -> KubeClient | None:
        settings = self._settings.kube
        if settings.kubeconfig is None:
            return None
        pool = ThreadPoolExecutor(settings.max_concurrency, thread_name_prefix="kube")
        stack.callback(pool.shutdown, wait=False)
        client = await KubeClient.connect(settings, executor=pool)
        stack.push_async_callback(client.aclose)
        return client

    def _ansible(self, stack: AsyncExitStack, agent_tokens: AgentTokens) -> AnsibleInstaller:
        """The "install" pool (runs take tens of minutes) and the Ansible installer; its
        ``facts`` role posts to the boot server's agent API with a node's agent token."""
        settings = self._settings.install
        pool = ThreadPoolExecutor(settings.max_concurrency, thread_name_prefix="install")
        stack.callback(pool.shutdown, wait=False)
        agent = None
        if self._settings.http.listen is not None:
            # a controller token: the facts role posts from this host, not from the node
            agent = AgentEndpoint(base_url(self._settings), agent_tokens.issue_controller_token)
        return AnsibleInstaller.create(settings, state_dir=self._settings.state_dir, pool=pool,
                                       agent=agent)

    def _request_stop(self, sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        self._stop.set()

    async def _start_api(self, store: Store, conductor: Conductor, metrics: Metrics,
                         topology: LiveTopology, rotation: BmcRotation) -> web.AppRunner:
        app = make_app(conductor=conductor, nodes=store.nodes, tokens=store.tokens,
                       metrics=metrics, settings=self._settings.api, topology=topology,
                       rotation=rotation, ownership=store.ownership)
        # slow clients, floods from one address (httpguard); the event stream lives on
        limits = HttpLimits(streaming_paths=frozenset({EVENTS_PATH}))
        runner = guarded_runner(app, limits)
        await runner.setup()
        host, port = self._settings.api.host_port
        await GuardedSite(runner, host, port, limits=limits, reuse_address=True).start()
        return runner

    def _image_writer(self, jobs: AgentJobs,
                      agent_tokens: AgentTokens) -> AgentImageWriter | None:
        """Images are written by the nodes' agents, which need the boot HTTP server; the
        cloud-init seed's callback goes there too, with the node's agent token."""
        if self._settings.http.listen is None:
            return None
        url = base_url(self._settings)
        return AgentImageWriter(jobs, self._settings.images, f"{url}/artefacts",
                                seeds=SeedSource(self._settings.deploy, url,
                                                 agent_tokens.issue_token))

    async def _start_boot(self, stack: AsyncExitStack, store: Store, conductor: Conductor,
                          mailbox: FactsMailbox, agent_tokens: AgentTokens,
                          jobs: AgentJobs, callbacks: BootCallbacks) -> None:
        """The boot services that are configured: HTTP (scripts, artefacts, agent), DHCP,
        TFTP. Each binds before READY=1; a port in use stops the start."""
        caches: list[Discovery] = []
        boot = build_boot(self._settings, store, conductor, mailbox, agent_tokens, jobs,
                          callbacks, caches=caches)
        self._listen_for_changes(stack, store, caches, conductor)
        for server in boot:
            await server.start()
            stack.push_async_callback(server.stop)

    def _listen_for_changes(self, stack: AsyncExitStack, store: Store,
                            caches: list[Discovery], conductor: Conductor) -> None:
        """PostgreSQL: other daemons' node writes drop entries from our MAC caches, and a
        maintenance flag set there parks the node's step running here."""
        url = make_url(self._settings.sqlalchemy_url)
        if not url.drivername.startswith("postgresql"):
            return

        def changed(notice: NodeChanged) -> None:
            for cache in caches:
                cache.forget(notice.macs)
            conductor.remote_change(notice.node_id)

        def reconnected() -> None:
            for cache in caches:
                cache.forget_all()

        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        listener = Listener(conninfo, store.instance, asyncio.get_running_loop(), changed,
                            reconnected)
        listener.start()
        stack.callback(listener.stop)

    async def _seed_simulation(self, store: Store, conductor: Conductor) -> None:
        """Enroll the simulated rack's nodes that are not in the store yet (idempotent, so a
        daemon killed half-way through seeding completes it on the next start)."""
        sim = self._settings.simulation
        if sim.nodes == 0:
            return
        known = await store.nodes.serials()
        missing = [new for new in simulated_nodes(sim) if new.serial not in known]
        if missing:
            log.info("enrolling %d simulated nodes", len(missing))
        for new in missing:
            try:
                await conductor.enroll(new, actor="simulation", reason="simulated rack")
            except Conflict:  # another daemon on the same database enrolled it meanwhile
                continue

    async def _watchdog(self) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            self._notifier.watchdog()
            await asyncio.sleep(interval)
