"""Zero-touch boot: ``[dhcp]``, ``[tftp]``, ``[http]`` and ``[boot]``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from provisioner.config.section import Section, check_optional_listen


class DhcpSettings(Section):
    mode: Literal["authoritative", "proxy", "off"] = Field(
        "off", description="authoritative: our subnet and leases; proxy: PXE-only beside "
        "the site's DHCP; off: site DHCP points at us")
    interface: str | None = Field(None, description="Interface to serve on (SO_BINDTODEVICE)")
    server_address: str | None = Field(None, description="Our address on the boot network")
    pool: str | None = Field(None, description="FIRST-LAST addresses for discovery leases")
    netmask: str = Field("255.255.255.0", description="Subnet mask handed out")
    router: str | None = Field(None, description="Default gateway handed out (option 3)")
    dns_servers: list[str] = Field(default_factory=list, description="Option 6")
    domain_name: str | None = Field(None, description="Option 15")
    lease_time_s: int = Field(3600, ge=60, description="Lease time handed out")
    port: int = Field(67, ge=1, le=65535, description="Server port (tests use a high one)")
    proxy_port: int = Field(4011, ge=1, le=65535, description="PXE proxy port")
    discovery_rate_per_s: float = Field(
        5.0, gt=0, description="Unknown MACs turned into discovered nodes per second")
    discovery_burst: int = Field(50, ge=1, description="Burst of new MACs accepted at once")
    router_advertisements: bool = Field(
        True, description="Answer IPv6 router solicitations on `interface` (ends iPXE's "
        "13 s IPv6 wait; announces no router)")
    decline_hold_s: int = Field(
        600, ge=0, description="An address a client declined (in use) is not offered again "
        "for this long")
    workers: int | None = Field(
        None, ge=0, le=32, description="Processes that answer DHCP in authoritative mode "
        "beside the daemon's loop, which answers too: each on its own SO_REUSEPORT socket, "
        "a client's requests steered to one of them by its MAC, each handing new clients "
        "addresses from its own part of the pool; default: one per CPU less one (the "
        "daemon's loop), at most 4 (on 2 CPUs: the loop and one process); 0: only the "
        "daemon's loop (docs/performance.md \"DHCP\")")
    cache_threshold: float = Field(
        0.25, ge=0, lt=1, description="A renewal less than this fraction of a lease time "
        "after the lease was last written is answered with the time it has left and not "
        "written (Kea's cache-threshold; 0: every renewal is written)")


class TftpSettings(Section):
    listen: str | None = Field(None, description="HOST:PORT for TFTP (e.g. 0.0.0.0:69); "
                               "unset: no TFTP server")
    timeout_s: float = Field(2.0, gt=0, description="Retransmit timeout per block")
    retries: int = Field(5, ge=1, description="Retransmits before a transfer is dropped")
    max_transfers: int = Field(1000, ge=1, description="Concurrent transfers")
    workers: int | None = Field(None, ge=1, description="Processes that serve transfers; "
                                "default: one per CPU less one (the daemon's own loop), "
                                "at least 1, at most 8; 1: in the daemon's process")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        return check_optional_listen(value)


class HttpSettings(Section):
    listen: str | None = Field(None, description="HOST:PORT of the boot HTTP server (iPXE "
                               "scripts, kernels, images, agent); unset: no boot HTTP")
    public_url: str | None = Field(None, description="URL nodes use to reach it; default "
                                   "http://<dhcp.server_address>:<port>")
    sendfile_threads: int = Field(3, ge=0, description="Threads that copy kernels, initrds "
                                  "and images to clients (sendfile) beside the event loop; "
                                  "0: in the loop's thread")
    sendfile_pumps: bool = Field(True, description="Those threads each own their downloads "
                                 "and wait on their own epoll for room (as nginx workers do) "
                                 "instead of a trip through the event loop for every chunk; "
                                 "docs/performance.md \"Boot storm\"")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        return check_optional_listen(value)


class BootSettings(Section):
    assets_dir: Path | None = Field(None, description="iPXE binaries for TFTP; default "
                                    "Debian's /usr/lib/ipxe")
    artefacts_dir: Path | None = Field(None, description="Kernels, initrds, images served "
                                       "over HTTP; default <state_dir>/artefacts")
    arm64_bootfile: str = Field("grubaa64.efi", description="Boot file for UEFI arm64 clients")
    inspection_kernel: str = Field("inspect/vmlinuz", description="Under artefacts_dir")
    inspection_initrd: str = Field("inspect/initrd.gz", description="Under artefacts_dir")
    kernel_args: str = Field("console=ttyS0", description="Extra kernel command line")
    inspection_kernel_arm64: str = Field("inspect/arm64/vmlinuz",
                                         description="arm64 (Grace) ramdisk kernel, under "
                                         "artefacts_dir")
    inspection_initrd_arm64: str = Field("inspect/arm64/initrd.gz",
                                         description="arm64 (Grace) ramdisk, under "
                                         "artefacts_dir")
    kernel_args_arm64: str = Field("console=ttyAMA0", description="Extra kernel command "
                                   "line of arm64 nodes (Grace and qemu virt: PL011 UART)")
    ramdisk_build: Literal["auto", "off"] = Field(
        "auto", description="auto: serve builds a missing or stale inspection ramdisk in the "
        "background at start (when the Debian packages are present); off: never")
    ramdisk_arches: list[Literal["x86_64", "arm64"]] = Field(
        ["x86_64", "arm64"], description="Architectures whose ramdisk serve builds")
    cache_dir: Path | None = Field(None, description="Downloaded .debs and unpacked sysroots "
                                   "of foreign-architecture ramdisks; default <state_dir>/cache")
    agent_token_ttl_s: int = Field(3600, ge=60, description="Lifetime of a node's agent token")
