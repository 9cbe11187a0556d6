"""Builds the boot services the configuration asks for: HTTP (iPXE scripts, artefacts, agent
API), DHCP and TFTP. Used by ``daemon.py`` only."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.install_http import InstallerHttp
from provisioner.boot.policy import uefi_http_boot_uri
from provisioner.boot.render import Renderer
from provisioner.config import BmcSettings, Settings, parse_host_port
from provisioner.domain import Node
from provisioner.errors import ConfigError
from provisioner.httpguard import GuardedSite, HttpLimits, guarded_runner
from provisioner.install.images import AgentJobs
from provisioner.install.unattended import UnattendedInstalls
from provisioner.lifecycle.agent_binding import AgentBinding
from provisioner.lifecycle.agents import AgentService, AgentTokens, FactsMailbox
from provisioner.lifecycle.bmclink import BmcLinkPolicy
from provisioner.lifecycle.callbacks import BootCallbacks
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.fabrics import FabricReports
from provisioner.lifecycle.inband import InbandIntake
from provisioner.lifecycle.ports import HttpBootUri, no_http_boot_uri
from provisioner.ramdisk.netboot import stage_ipxe
from provisioner.ramdisk.service import BuildJob, RamdiskBuilder
from provisioner.ramdisk.sysroot import arch_named
from provisioner.ramdisk.targets import cache_dir, target_for
from provisioner.store.leases import LeaseRepo
from provisioner.store.mac_lookup import MacLookup
from provisioner.store.store import Store

log = logging.getLogger(__name__)
DEBIAN_IPXE = Path("/usr/lib/ipxe")


class Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HttpServer:
    def __init__(self, app: web.Application, listen: str,
                 limits: HttpLimits | None = None) -> None:
        self._limits = limits or HttpLimits()
        # slow clients and floods from one address (httpguard)
        self._runner = guarded_runner(app, self._limits, name=f"boot HTTP {listen}")
        self._host, self._port = parse_host_port(listen)

    async def start(self) -> None:
        await self._runner.setup()
        await GuardedSite(self._runner, self._host, self._port, limits=self._limits,
                          reuse_address=True).start()
        log.info("boot HTTP on %s:%d", self._host, self._port)

    async def stop(self) -> None:
        await self._runner.cleanup()


def base_url(settings: Settings) -> str:
    """The URL nodes use to reach the boot HTTP server."""
    if settings.http.public_url:
        return settings.http.public_url.rstrip("/")
    assert settings.http.listen is not None
    host, port = parse_host_port(settings.http.listen)
    if host in ("0.0.0.0", "::", ""):
        if settings.dhcp.server_address is None:
            raise ConfigError("http.public_url: needed when http.listen is a wildcard and "
                              "dhcp.server_address is unset")
        host = settings.dhcp.server_address
    return f"http://{host}:{port}"


def build_boot(settings: Settings, store: Store, conductor: Conductor,
               mailbox: FactsMailbox, agent_tokens: AgentTokens,
               jobs: AgentJobs, callbacks: BootCallbacks | None = None,
               caches: list[Discovery] | None = None,
               inband: InbandIntake | None = None) -> list[Server]:
    """``caches``: gets the MAC caches, for invalidation by other daemons' writes;
    ``inband``: the in-band probes' intake (``POST /agent/v1/health``)."""
    servers: list[Server] = []
    dhcp = settings.dhcp
    discovery = Discovery(store.nodes, conductor,
                          TokenBucket(dhcp.discovery_rate_per_s, dhcp.discovery_burst),
                          macs=MacLookup(store.engine, store.boot_pool))
    if caches is not None:
        caches.append(discovery)
    assets = netboot_dir(settings)
    stage_ipxe(settings.boot.assets_dir or DEBIAN_IPXE, assets)
    # authoritative DHCP: the lease store, which also binds agent tokens (agent_binding.py)
    leases = (LeaseRepo(store.engine, store.boot_pool, cache_threshold=dhcp.cache_threshold)
              if dhcp.mode == "authoritative" else None)
    if settings.http.listen is not None:
        agents = AgentService(conductor, store.nodes, store.tokens, mailbox,
                              token_ttl_s=settings.boot.agent_token_ttl_s,
                              agent_tokens=agent_tokens, jobs=jobs, callbacks=callbacks,
                              bmc_link=bmc_link_policy(settings.bmc),
                              binding=AgentBinding(leases, authoritative=True))
        config = BootHttpConfig(
            base_url=base_url(settings),
            artefacts_dir=settings.boot.artefacts_dir or settings.state_dir / "artefacts",
            assets_dir=assets, kernel=settings.boot.inspection_kernel,
            initrd=settings.boot.inspection_initrd, kernel_args=settings.boot.kernel_args,
            kernel_arm64=settings.boot.inspection_kernel_arm64,
            initrd_arm64=settings.boot.inspection_initrd_arm64,
            kernel_args_arm64=settings.boot.kernel_args_arm64,
            sendfile_threads=settings.http.sendfile_threads,
            sendfile_pumps=settings.http.sendfile_pumps)
        builder = ramdisk_builder(settings, config.base_url, assets)
        if builder is not None:  # without it, serve's preflight told of a missing ramdisk
            servers.append(builder)
        renderer = Renderer()
        installer = None
        if settings.installers:  # profiles installed by autoinstall, preseed, kickstart
            installer = InstallerHttp(
                UnattendedInstalls(settings.installers, base_url=config.base_url,
                                   site_keys=settings.deploy.ssh_authorized_keys,
                                   login_user=settings.install.ssh_user),
                base_url=config.base_url, nodes=store.nodes, tokens=store.tokens,
                renderer=renderer, agents=agents)
        http = BootHttp(config, discovery=discovery, agents=agents, tokens=store.tokens,
                        renderer=renderer, installer=installer,
                        fabrics=FabricReports(conductor, store.topology, store.nodes),
                        max_fabric_bytes=settings.topology.max_fabric_bytes, inband=inband)
        servers.append(HttpServer(http.app(), settings.http.listen))
    servers += _network_servers(settings, discovery, assets, leases)
    return servers


def http_boot_uris(settings: Settings) -> HttpBootUri:
    """A node's ``HttpBootUri`` for a ``http`` boot override: the first stage for its
    architecture (facts ``cpu.arch``) on the boot HTTP server; None without that server
    or before inspection (the firmware then asks DHCP)."""
    if settings.http.listen is None and not settings.http.public_url:
        return no_http_boot_uri
    url, bootfile = base_url(settings), settings.boot.arm64_bootfile

    def uri(node: Node) -> str | None:
        cpu = node.facts.get("cpu")
        arch = cpu.get("arch") if isinstance(cpu, dict) else None
        return uefi_http_boot_uri(url, arch if isinstance(arch, str) else None,
                                  arm64_bootfile=bootfile)

    return uri


def netboot_dir(settings: Settings) -> Path:
    """The TFTP root (and ``/ipxe/`` over HTTP): copies of the iPXE binaries and the arm64
    GRUB image the daemon builds (``ramdisk/netboot.py``)."""
    return settings.state_dir / "netboot"


def ramdisk_builder(settings: Settings, url: str, netboot: Path) -> RamdiskBuilder | None:
    """The background builds of ``boot.ramdisk_arches``; None when ``ramdisk_build=off``."""
    boot = settings.boot
    if boot.ramdisk_build == "off":
        return None
    jobs = []
    for name in dict.fromkeys(boot.ramdisk_arches):
        target = target_for(settings, arch_named(name))
        grub = None
        if name == "arm64" and not (boot.assets_dir and
                                    (boot.assets_dir / boot.arm64_bootfile).is_file()):
            grub = netboot / boot.arm64_bootfile  # the operator's own image wins
        jobs.append(BuildJob(name, target.kernel, target.initrd, cache_dir(settings),
                             grub=grub, base_url=url))
    return RamdiskBuilder(jobs)


def _network_servers(settings: Settings, discovery: Discovery, assets: Path,
                     leases: LeaseRepo | None) -> list[Server]:
    """DHCP and TFTP, when configured."""
    servers: list[Server] = []
    if settings.dhcp.mode != "off":
        from provisioner.boot.dhcp import DhcpServer

        if settings.http.listen is None:
            raise ConfigError("http.listen: needed when dhcp.mode is not off (iPXE scripts)")
        from provisioner.boot.dhcp_workers import DhcpProcesses, worker_count

        if (count := worker_count(settings.dhcp)) > 0 and leases is not None:
            servers.append(DhcpProcesses(
                settings.dhcp, settings.boot, http_base_url=base_url(settings),
                database_url=settings.sqlalchemy_url, inventory=discovery, changes=discovery,
                count=count, leases=leases))
        else:
            servers.append(DhcpServer(settings.dhcp, settings.boot,
                                      http_base_url=base_url(settings), inventory=discovery,
                                      leases=leases))
        if settings.dhcp.router_advertisements and settings.dhcp.interface:
            from provisioner.boot.ra import RouterAdvertiser

            servers.append(RouterAdvertiser(settings.dhcp.interface))
    if settings.tftp.listen is not None:
        from provisioner.boot.tftp import TftpServer

        servers.append(TftpServer(settings.tftp, assets))
    return servers


def bmc_link_policy(bmc: BmcSettings) -> BmcLinkPolicy:
    """Zero-touch BMC linking as configured (``lifecycle/bmclink.py``)."""
    driver = None if bmc.discovered_driver == "none" else bmc.discovered_driver
    return BmcLinkPolicy(driver=driver, has_default_credentials=bmc.default_username is not None,
                         subnets=tuple(bmc.link_subnets))
