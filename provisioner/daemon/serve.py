"""The daemon's run: settings → store → drivers → conductor → servers, in one exit stack
that stops them in reverse; the event loop's TaskGroup, signals and systemd notifications.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections import deque
from contextlib import AsyncExitStack

from provisioner.api import FEED
from provisioner.bmc.managed import BmcManager
from provisioner.config import Settings
from provisioner.daemon.clients import (
    ansible_installer,
    connect_kube,
    connect_slurm,
    image_writer,
    kube_and_slurm,
)
from provisioner.daemon.drivers import (
    RealDrivers,
    build_bmc,
    build_ports,
    build_rotation,
    build_servicing,
    settle_rotations,
)
from provisioner.daemon.hooks import (
    ansible_to_history,
    findings_from,
    fresh,
    maintenance_from,
)
from provisioner.daemon.preflight import preflight
from provisioner.daemon.servers import start_api, start_boot
from provisioner.daemon.store_retry import while_store_away
from provisioner.errors import ConfigError, Conflict, SchemaError
from provisioner.gc_tuning import tune_gc
from provisioner.health.records import Origin
from provisioner.install.acceptance import AnsibleAcceptance
from provisioner.install.base import ComposedInstaller
from provisioner.install.images import AgentJobs
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.sync import KubeSync
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.acceptance_sweep import ReacceptSweep, ask_acceptance
from provisioner.lifecycle.agents import AgentTokens, FactsMailbox
from provisioner.lifecycle.bmc_health import BmcHealthPoll
from provisioner.lifecycle.callbacks import BootCallbacks
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.fleet import FleetMember, Singleton, Work
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.inband import InbandIntake
from provisioner.lifecycle.power import PowerSync
from provisioner.lifecycle.repair import RepairService, ladder_listener, repair_timer
from provisioner.lifecycle.repair_domains import RepairHolds, RepairRejoin, combine
from provisioner.lifecycle.routing import Unavailable
from provisioner.lifecycle.sweeps import ExpirySweeps, HistoryRetention
from provisioner.lifecycle.validation import FactsValidator, validation_passed
from provisioner.lifecycle.waves import WaveDriver
from provisioner.log import NODE_NAMES, setup_logging
from provisioner.metrics import Metrics
from provisioner.sdnotify import SystemdNotifier, watchdog_interval_s
from provisioner.simulation.rack import simulated_nodes
from provisioner.simulation.world import SimWorld
from provisioner.slurm.client import make_maintenance
from provisioner.slurm.handoff import SlurmHandoff
from provisioner.slurm.repair import SiteRepairs
from provisioner.slurm.sync import SlurmSync
from provisioner.store.exclusive import lock_sqlite
from provisioner.store.files import private_dir
from provisioner.store.leases import LeaseRepo
from provisioner.store.store import Store, open_store
from provisioner.topology_live.build import build_live_topology

log = logging.getLogger("provisioner.daemon")  # operators and the journald test read it
SEED_CHUNK = 100  # simulated nodes enrolled between two looks at what is enrolled already


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
        checks = preflight(self._settings)  # ConfigError: exit 2, as `config check` says
        for note in checks.notes:
            log.warning("%s", note)
        async with AsyncExitStack() as stack:
            private_dir(self._settings.state_dir)
            sqlite_lock = lock_sqlite(self._settings.sqlalchemy_url)  # ConfigError: exit 2
            if sqlite_lock is not None:
                stack.callback(sqlite_lock.release)
            store = await asyncio.to_thread(open_store, self._settings)
            stack.callback(store.close)
            world = SimWorld(self._settings.state_dir / "simworld.sqlite")
            stack.callback(world.close)
            metrics = Metrics(instance=store.instance)
            metrics.fleet_view(lambda: False)  # the fleet's gauges: once we lead (below)
            mailbox = FactsMailbox()
            kube_client = await connect_kube(self._settings, stack)
            # issued on the boot servers' store thread: a node's iPXE script waits for its
            # token write, not for a storm's queue of enrolments on the main store thread
            agent_tokens = AgentTokens(store.boot_tokens,
                                       ttl_s=self._settings.boot.agent_token_ttl_s)
            # ConfigError (exit 2) without ansible-playbook
            ansible = ansible_installer(self._settings, stack, agent_tokens,
                                        store.tokens)
            metrics.watch_pool("install", lambda: ansible.runner.hung_runs)
            if kube_client is not None:
                client = kube_client
                metrics.watch_pool("kube", lambda: client.hung_calls)
            joiner = None
            if kube_client is not None:
                joiner = KubeNodeJoiner(kube_client, self._settings.kube,
                                        run_join=ansible.run_join,
                                        validated=validation_passed)
            topology = build_live_topology(self._settings, store, kube_client)
            stack.push_async_callback(topology.aclose)
            slurm_client = await connect_slurm(self._settings, stack)
            jobs = AgentJobs()
            callbacks = BootCallbacks(timeout_s=self._settings.deploy.callback_timeout_s,
                                      installer_profiles=frozenset(self._settings.installers))
            images = image_writer(self._settings, jobs, agent_tokens) or Unavailable(
                "OS image deploy", "set http.listen (the agent that writes images reaches "
                "the daemon over the boot HTTP server)")
            kube, slurm = kube_and_slurm(self._settings, joiner, kube_client, slurm_client,
                                         topology)
            repairs = SiteRepairs(ansible, kube=joiner,
                                  handoff=slurm if isinstance(slurm, SlurmHandoff) else None,
                                  os_up_timeout_s=self._settings.health.os_up_timeout_s)
            acceptance = DomainAcceptance(
                store.nodes, store.acceptance,
                AnsibleAcceptance(ansible, self._settings.install,
                                  results_dir=self._settings.state_dir / "acceptance"),
                self._settings.validation, instance=store.instance,  # ConfigError: exit 2
                reservations=(make_maintenance(self._settings.slurm, slurm_client)
                              if slurm_client is not None else None),
                on_hold=topology.invalidate)
            repair_holds = RepairHolds(store.nodes, self._settings.validation,
                                       last_passes=acceptance.last_passes)
            # a held active domain, a domain held by a tray's repair, a repaired tray whose
            # domain checks have not passed again: out of the blocks
            topology.hold_with(combine(acceptance.held_nodes, repair_holds.held))
            stack.push_async_callback(acceptance.aclose)  # after the conductor stopped
            bmc = self._bmc(stack, world)
            real = RealDrivers(
                inspector=mailbox, installer=ComposedInstaller(images, ansible), kube=kube,
                validator=FactsValidator(store.nodes, self._settings.validation), slurm=slurm,
                repairs=repairs, acceptance=acceptance,
                servicing=build_servicing(self._settings, bmc, store))
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
            rejoin = RepairRejoin(self._settings.validation, lambda node: ask_acceptance(
                acceptance, node, requested_by=f"repair of {node.hostname or node.id}"))
            conductor.add_observer(rejoin.observe)
            conductor.add_observer(repair_timer(metrics.observe_repair))
            stack.push_async_callback(rejoin.aclose)
            conductor.add_observer(lambda node, _event, _before: NODE_NAMES.remember(
                node.id, node.hostname))  # other modules' "node <id>" lines: the hostname
            ansible.set_event_sink(ansible_to_history(conductor))
            stack.push_async_callback(conductor.stop, self._settings.daemon.shutdown_timeout_s)
            repair_service = RepairService(conductor, store.nodes, self._settings.health,
                                           breakers=store.findings)
            health = HealthFindings(store.findings, conductor,
                                    detected=metrics.observe_detect)
            health.add_listener(ladder_listener(repair_service))  # a finding → its ladder
            lead: list[Singleton] = []  # the fleet singleton, made below: it drives waves
            waves = WaveDriver(store.waves, store.nodes, conductor, lead=lambda: (
                (store.instance, lead[0].fence) if lead and lead[0].fence is not None
                else None))
            runner = await start_api(self._settings, store, conductor, metrics, topology,
                                     rotation, repair_service, acceptance, health,
                                     slurm=slurm_client, kube=joiner, waves=waves)
            stack.push_async_callback(runner.cleanup)  # runs first: no new requests, then drain
            await start_boot(self._settings, stack, store, conductor, mailbox, agent_tokens,
                             jobs, callbacks, on_remote=runner.app[FEED].wake,
                             inband=InbandIntake(store.nodes, store.tokens, health,
                                                 self._settings.health))
            resumed = await self._resume(store, conductor)  # before any new work starts
            log.info("ready: api on %s, instance %s, %d in-flight nodes resumed",
                     self._settings.api.listen, store.instance, resumed)
            tune_gc()
            self._notifier.ready(f"serving; {resumed} nodes resumed")
            async with asyncio.TaskGroup() as group:
                children = [group.create_task(self._watchdog(), name="watchdog")]
                power_sync = PowerSync(store.nodes, bmc, conductor.record_power,
                                       self._settings.bmc)
                children.append(group.create_task(  # rotations a crash left open
                    settle_rotations(rotation), name="bmc-rotation-settle"))
                works: list[tuple[str, Work]] = [("power-sync", power_sync.run)]
                bmc_health = BmcHealthPoll(store.nodes, health, bmc, self._settings.health)
                works.append(("bmc-health", bmc_health.run))
                if kube_client is not None and self._settings.kube.sync_interval_s > 0:
                    sync = KubeSync(kube_client, maintenance_from("kubernetes", store, conductor),
                                    grace_s=self._settings.kube.not_ready_grace_s,
                                    interval_s=self._settings.kube.sync_interval_s,
                                    on_findings=findings_from(health, Origin.KUBERNETES))
                    works.append(("kube-sync", fresh(health, Origin.KUBERNETES, sync.run)))
                if slurm_client is not None and self._settings.slurm.sync_interval_s > 0:
                    from_slurm = maintenance_from("slurm", store, conductor)
                    slurm_sync = SlurmSync(slurm_client, from_slurm,
                                           interval_s=self._settings.slurm.sync_interval_s,
                                           reason_prefix=self._settings.slurm.reason_prefix,
                                           on_findings=findings_from(health, Origin.SLURM))
                    works.append(("slurm-sync", fresh(health, Origin.SLURM, slurm_sync.run)))
                works.append(("topology", topology.run))
                sweeps = ExpirySweeps(LeaseRepo(store.engine, store.boot_pool), store.tokens,
                                      interval_s=store.ownership.lease_s,
                                      instance=store.instance)
                works.append(("expiry-sweeps", sweeps.run))
                if self._settings.store.history_retention_days > 0:
                    retention = HistoryRetention(
                        store.nodes, days=self._settings.store.history_retention_days)
                    works.append(("history-retention", retention.run))
                reaccept = ReacceptSweep(acceptance, store.nodes, store.acceptance,
                                         self._settings.validation)
                if reaccept.enabled and slurm_client is not None:
                    works.append(("reaccept-sweep", reaccept.run))
                elif reaccept.enabled:
                    log.warning("acceptance.reaccept_interval_days is set but slurm is not "
                                "enabled: active domains are not re-accepted on a schedule")
                # fleet-wide work runs on the one daemon that leads "fleet" (docs/ha.md)
                works.append(("firmware-waves", waves.run))
                singleton = Singleton(store.ownership, "fleet", works)
                lead.append(singleton)
                metrics.fleet_view(lambda: singleton.leading)  # docs/ha.md, "Metrics"
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

    def _request_stop(self, sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        self._stop.set()

    async def _resume(self, store: Store, conductor: Conductor) -> int:
        """Resume the in-flight nodes, then seed the simulated rack; return how many
        resumed (0 when a stop came while the database was away)."""
        async def resume() -> int:
            for known in await store.nodes.summaries():  # log lines name them by hostname
                NODE_NAMES.remember(known.id, known.hostname)
            resumed = await conductor.recover()
            await self._seed_simulation(store, conductor)
            return resumed

        return await while_store_away("start-up: resuming nodes", resume, self._stop) or 0

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
        # Daemons started together on one database take the rack in chunks, each in an
        # order of its own, and first ask which of a chunk's serials are enrolled already;
        # one that finds another enrolling its chunk leaves it the rest (checked again last).
        # Each tried every node in the same order before: two of three enrolments failed.
        chunks = deque(missing[i:i + SEED_CHUNK] for i in range(0, len(missing), SEED_CHUNK))
        random.shuffle(chunks)
        while chunks:
            chunk = chunks.popleft()
            enrolled = await store.nodes.serials(among=[new.serial or "" for new in chunk])
            todo = [new for new in chunk if new.serial not in enrolled]
            for i, new in enumerate(todo):
                try:
                    await conductor.enroll(new, actor="simulation", reason="simulated rack")
                except Conflict:  # another daemon on the same database enrolled it meanwhile
                    if todo[i + 1:]:
                        chunks.append(todo[i + 1:])
                    break

    async def _watchdog(self) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            self._notifier.watchdog()
            await asyncio.sleep(interval)
