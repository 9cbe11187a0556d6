"""The drivers each node gets: BMC drivers behind breakers and limits, and the lifecycle's
ports routed per node (simulated nodes act on the simulated rack, real ones on ``real``);
BMC password rotation."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from provisioner.bmc.base import SoftOff
from provisioner.bmc.fake import fake_bmc_factory
from provisioner.bmc.ipmi import IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.bmc.registry import BmcRegistry
from provisioner.boot.stack import http_boot_uris
from provisioner.config import BmcProfile, BmcSettings, Settings
from provisioner.daemon.preflight import firmware_dir
from provisioner.daemon.store_retry import while_store_away
from provisioner.domain import BmcCredentials, Node
from provisioner.lifecycle.ports import (
    Acceptance,
    BootWaiter,
    Inspector,
    Installer,
    KubeJoiner,
    NoAcceptance,
    NoBootWait,
    NoRepairs,
    Ports,
    Repairer,
    SlurmRegistrar,
    Validator,
)
from provisioner.lifecycle.rack_limit import RackBmcLimit
from provisioner.lifecycle.rotation import BmcRotation, generated_password
from provisioner.lifecycle.routing import (
    RoutedInspector,
    RoutedInstaller,
    RoutedKube,
    RoutedRepairs,
    RoutedServicing,
    RoutedSlurm,
    RoutedValidator,
)
from provisioner.lifecycle.service_ports import NoServicing, Servicing
from provisioner.lifecycle.stagger import PowerOnStagger
from provisioner.simulation.drivers import (
    FakeInspector,
    FakeInstaller,
    FakeKube,
    FakeRepairs,
    FakeSlurm,
    FakeValidator,
    machine_key,
)
from provisioner.simulation.firmware import SimServiceBmc
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store

log = logging.getLogger(__name__)


def build_bmc(settings: Settings, world: SimWorld) -> BmcManager:
    """BMC drivers by each node's driver name, behind breakers and limits. IPMI runs in
    worker processes (pyghmi blocks and keeps process-wide state); ``aclose()`` at
    shutdown logs every session out and stops them."""
    bmc = settings.bmc
    ipmi = IpmiDriver(ipmi_workers(bmc), timeout_s=bmc.timeout_for("ipmi"))
    redfish = RedfishDriver(timeout_s=bmc.timeout_for("redfish"), verify_tls=bmc.redfish_verify_tls,
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
    repairs: Repairer = field(default_factory=NoRepairs)
    acceptance: Acceptance = field(default_factory=NoAcceptance)
    """Fabric acceptance of NVLink domains (``lifecycle/acceptance.py``); simulated nodes'
    profiles ask for none."""
    servicing: Servicing = field(default_factory=NoServicing)
    """Runbooks over Redfish (``bmc/redfish_service.py``)."""


def build_servicing(settings: Settings, bmc: BmcManager, store: Store) -> Servicing:
    """``[servicing]`` over the ``redfish`` driver's sessions, with each node's credentials
    (the site's defaults filled in)."""
    redfish = bmc.driver("redfish")
    if not isinstance(redfish, RedfishDriver):
        return NoServicing()

    async def credentials(node: Node) -> BmcCredentials:
        return bmc.credentials_for(await store.nodes.credentials(node.id))

    return SiteServicing(settings.servicing, redfish, credentials, firmware_dir(settings))


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
        repairs=RoutedRepairs(FakeRepairs(world, delay_s=delay_s, fail_rate=fail_rate),
                              real.repairs),
        boots=boots or NoBootWait(),
        http_boot_uri=http_boot_uris(settings),
        soft_off=lambda node: soft_off_for(settings.bmc.profile(node.profile)),
        rotate_bmc=None if rotation is None else rotate_if_opted_in(settings.bmc, rotation),
        acceptance=real.acceptance,
        servicing=RoutedServicing(real.servicing, lambda node: SimServiceBmc(
            world, machine_key(node), delay_s=delay_s)),
    )


def build_rotation(settings: BmcSettings, store: Store, bmc: BmcManager) -> BmcRotation:
    site = settings.rotation_password
    return BmcRotation(store.nodes, store.bmc_secrets, bmc, effective=bmc.credentials_for,
                       passwords=generated_password if site is None
                       else lambda _node: site.get_secret_value())


async def settle_rotations(rotation: BmcRotation) -> None:
    """At start, the rotations a crash left open; waited for while the database is away."""
    outcome = await while_store_away("start-up: BMC password rotations",
                                     lambda: rotation.settle_all(actor="startup"))
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
