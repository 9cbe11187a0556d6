"""Which boot file a network-booting client gets (DESIGN §4). Pure: stdlib only.

``classify`` names the client from its DHCP fingerprint (option 93 architecture, option 60
vendor class, option 77 user class, option 175); ``boot_reply`` picks what to serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

BIOS_BOOTFILE = "undionly.kpxe"
UEFI_X64_BOOTFILE = "snponly.efi"
IPXE_USER_CLASS = "iPXE"
# Option 175 (iPXE encapsulated), sub-option 176 "no-pxedhcp" = 1: iPXE then skips its
# ~3 s wait for ProxyDHCP offers.
IPXE_NO_PXEDHCP = b"\xb0\x01\x01"
OPT_VENDOR_CLASS = 60
OPT_IPXE_ENCAP = 175

# RFC 4578 / IANA processor architecture types (option 93).
ARCH_BIOS = 0
ARCH_EFI_X64 = 7
ARCH_EFI_BC = 9  # EFI byte code: firmware that reports it runs x86-64 images
ARCH_EFI_ARM64 = 11
ARCH_EFI_X64_HTTP = 16
ARCH_EFI_ARM64_HTTP = 19


class ClientClass(StrEnum):
    BIOS = "bios"
    UEFI_X64 = "uefi_x64"
    UEFI_ARM64 = "uefi_arm64"
    UEFI_HTTP_X64 = "uefi_http_x64"
    UEFI_HTTP_ARM64 = "uefi_http_arm64"
    IPXE = "ipxe"


_BY_ARCH = {
    ARCH_BIOS: ClientClass.BIOS,
    ARCH_EFI_X64: ClientClass.UEFI_X64,
    ARCH_EFI_BC: ClientClass.UEFI_X64,
    ARCH_EFI_ARM64: ClientClass.UEFI_ARM64,
    ARCH_EFI_X64_HTTP: ClientClass.UEFI_HTTP_X64,
    ARCH_EFI_ARM64_HTTP: ClientClass.UEFI_HTTP_ARM64,
}


@dataclass(frozen=True, slots=True)
class BootRequest:
    """What the policy needs from one DHCP request (built by the DHCP server)."""

    mac: str
    message_type: int
    client_arch: int | None = None
    vendor_class: str | None = None
    user_class: str | None = None
    ipxe_options: bool = False  # option 175 present
    giaddr: str | None = None

    @property
    def is_ipxe(self) -> bool:
        return self.user_class == IPXE_USER_CLASS or self.ipxe_options

    @property
    def arch(self) -> int | None:
        """Option 93, else the ``Arch:NNNNN`` field of a PXEClient/HTTPClient vendor class."""
        if self.client_arch is not None:
            return self.client_arch
        parts = (self.vendor_class or "").split(":")
        if len(parts) >= 3 and parts[1] == "Arch" and parts[2].isdigit():
            return int(parts[2])
        return None

    @property
    def is_network_boot(self) -> bool:
        """A PXE ROM, UEFI PXE/HTTP boot or iPXE, as opposed to an OS's DHCP client."""
        vendor = self.vendor_class or ""
        return (self.is_ipxe or self.client_arch is not None
                or vendor.startswith(("PXEClient", "HTTPClient")))


@dataclass(frozen=True, slots=True)
class BootReply:
    client_class: ClientClass
    bootfile_name: str  # a TFTP file name or a full http:// URL
    next_server: str | None  # siaddr: the TFTP server, None for HTTP
    vendor_class: str | None = None  # option 60 to echo (UEFI HTTP boot needs HTTPClient)
    extra_options: tuple[tuple[int, bytes], ...] = ()


def classify(request: BootRequest) -> ClientClass | None:
    """The client class; None for a client that is not network-booting, or an architecture
    we have nothing for (e.g. 32-bit EFI)."""
    if not request.is_network_boot:
        return None
    if request.is_ipxe:
        return ClientClass.IPXE
    arch = request.arch
    if arch is None:
        return None
    if (request.vendor_class or "").startswith("HTTPClient") and arch == ARCH_EFI_X64:
        return ClientClass.UEFI_HTTP_X64
    return _BY_ARCH.get(arch)


def ipxe_script_url(http_base_url: str, mac: str) -> str:
    """The URL of a node's iPXE script, ``mac`` as ``aa:bb:cc:dd:ee:ff``."""
    return f"{http_base_url.rstrip('/')}/boot/{mac}.ipxe"


def http_asset_url(http_base_url: str, name: str) -> str:
    """Where the boot HTTP server serves ``boot.assets_dir`` (``/ipxe/<name>``)."""
    return f"{http_base_url.rstrip('/')}/ipxe/{name}"


X86_64_ARCHES = frozenset({"x86_64", "amd64"})
ARM64_ARCHES = frozenset({"aarch64", "arm64"})


def uefi_http_boot_uri(http_base_url: str, arch: str | None, *,
                       arm64_bootfile: str) -> str | None:
    """The boot file a node's firmware fetches when its BMC is told to UEFI HTTP boot it
    (Redfish ``HttpBootUri``): the same first stage the DHCP server hands an HTTPClient
    (``snponly.efi``, which then chains the node's per-MAC iPXE script; on arm64 the GRUB
    image, which loads the node's per-MAC grub.cfg). ``arch`` is ``uname -m`` from the
    node's facts; None while it is unknown (the firmware then takes the URI from DHCP,
    which knows the architecture from option 93)."""
    name = (arch or "").lower()
    if name in X86_64_ARCHES:
        return http_asset_url(http_base_url, UEFI_X64_BOOTFILE)
    if name in ARM64_ARCHES:
        return http_asset_url(http_base_url, arm64_bootfile)
    return None


def boot_reply(request: BootRequest, node_known: bool, *, ipxe_script_url: str,
               tftp_server: str, http_base_url: str, arm64_bootfile: str) -> BootReply | None:
    """What to serve ``request``; None for clients that get no boot file.

    Known and unknown nodes get the same first stage: the per-MAC iPXE script decides
    between inspection (unknown), the node's current step, or a local boot.
    ``node_known`` is accepted so the table can grow a per-state row without a signature
    change; today no row depends on it.
    """
    del node_known
    client = classify(request)
    if client is None:
        return None
    if client is ClientClass.IPXE:
        return BootReply(client, ipxe_script_url, tftp_server,
                         extra_options=((OPT_IPXE_ENCAP, IPXE_NO_PXEDHCP),))
    if client is ClientClass.UEFI_HTTP_X64:
        return BootReply(client, http_asset_url(http_base_url, UEFI_X64_BOOTFILE), None,
                         vendor_class="HTTPClient")
    if client is ClientClass.UEFI_HTTP_ARM64:
        return BootReply(client, http_asset_url(http_base_url, arm64_bootfile), None,
                         vendor_class="HTTPClient")
    files = {ClientClass.BIOS: BIOS_BOOTFILE, ClientClass.UEFI_X64: UEFI_X64_BOOTFILE,
             ClientClass.UEFI_ARM64: arm64_bootfile}
    return BootReply(client, files[client], tftp_server)


def grub_url(url: str) -> str:
    """An ``http://host:port/path`` URL as GRUB names it: ``(http,host:port)/path``.
    GRUB speaks plain HTTP only; anything else is a ValueError."""
    scheme, sep, rest = url.partition("://")
    host_port, slash, path = rest.partition("/")
    if scheme != "http" or not sep or not host_port or any(c in url for c in " '\"\\;$"):
        raise ValueError(f"GRUB fetches over plain http only, not {url!r}")
    if ":" not in host_port.rpartition("]")[2]:
        host_port += ":80"
    return f"(http,{host_port}){slash}{path}"
