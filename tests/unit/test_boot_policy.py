"""The boot policy, table-driven: one row per architecture x client type x user class
(DESIGN §4's table)."""

from __future__ import annotations

import pytest

from provisioner.boot.policy import (
    IPXE_NO_PXEDHCP,
    BootReply,
    BootRequest,
    ClientClass,
    boot_reply,
    classify,
    ipxe_script_url,
)

MAC = "52:54:00:77:00:10"
HTTP = "http://10.77.0.1:8080"
SCRIPT = f"{HTTP}/boot/{MAC}.ipxe"
TFTP = "10.77.0.1"
ARM64 = "grubaa64.efi"
IPXE_175 = ((175, IPXE_NO_PXEDHCP),)
C = ClientClass

PXE = "PXEClient:Arch:{:05d}:UNDI:003000"
HTTPC = "HTTPClient:Arch:{:05d}:UNDI:003000"

# id: (arch (opt 93), vendor class (opt 60), user class (opt 77), opt 175 present,
#      expected class, expected boot file, next server, echoed vendor class)
ROWS: dict[str, tuple[int | None, str | None, str | None, bool, ClientClass | None,
                      str | None, str | None, str | None]] = {
    "bios-pxe-rom": (0, "PXEClient:Arch:00000:UNDI:002001", None, False, C.BIOS,
                     "undionly.kpxe", TFTP, None),
    "bios-ipxe-rom": (0, "PXEClient:Arch:00000:UNDI:002001", "iPXE", True, C.IPXE,
                      SCRIPT, TFTP, None),
    "bios-ipxe-userclass-only": (0, "PXEClient:Arch:00000:UNDI:002001", "iPXE", False,
                                 C.IPXE, SCRIPT, TFTP, None),
    "bios-ipxe-175-only": (0, "PXEClient:Arch:00000:UNDI:002001", None, True, C.IPXE,
                           SCRIPT, TFTP, None),
    "bios-other-userclass": (0, PXE.format(0), "gPXE", False, C.BIOS, "undionly.kpxe",
                             TFTP, None),
    "uefi-x64-pxe": (7, PXE.format(7), None, False, C.UEFI_X64, "snponly.efi", TFTP, None),
    "uefi-x64-pxe-arch9": (9, PXE.format(9), None, False, C.UEFI_X64, "snponly.efi", TFTP,
                           None),
    "uefi-x64-ipxe": (7, "PXEClient:Arch:00007:UNDI:003010", "iPXE", True, C.IPXE, SCRIPT,
                      TFTP, None),
    "uefi-x64-arch-from-vendor-class": (None, PXE.format(7), None, False, C.UEFI_X64,
                                        "snponly.efi", TFTP, None),
    "uefi-arm64-pxe": (11, PXE.format(11), None, False, C.UEFI_ARM64, ARM64, TFTP, None),
    "uefi-arm64-ipxe": (11, PXE.format(11), "iPXE", True, C.IPXE, SCRIPT, TFTP, None),
    "uefi-http-x64": (16, HTTPC.format(16), None, False, C.UEFI_HTTP_X64,
                      f"{HTTP}/ipxe/snponly.efi", None, "HTTPClient"),
    "uefi-http-x64-vendor-only": (None, HTTPC.format(16), None, False, C.UEFI_HTTP_X64,
                                  f"{HTTP}/ipxe/snponly.efi", None, "HTTPClient"),
    "uefi-http-arm64": (19, HTTPC.format(19), None, False, C.UEFI_HTTP_ARM64,
                        f"{HTTP}/ipxe/{ARM64}", None, "HTTPClient"),
    "uefi-http-ipxe": (16, HTTPC.format(16), "iPXE", True, C.IPXE, SCRIPT, TFTP, None),
    "uefi-ia32-unsupported": (6, PXE.format(6), None, False, None, None, None, None),
    "os-dhclient": (None, None, None, False, None, None, None, None),
    "os-udhcpc": (None, "udhcp 1.35.0", None, False, None, None, None, None),
    "os-with-userclass": (None, None, "linux", False, None, None, None, None),
}


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("known", [True, False], ids=["known", "unknown"])
def test_boot_table(row: str, known: bool) -> None:
    arch, vendor, user, has_175, client, bootfile, next_server, echo = ROWS[row]
    request = BootRequest(mac=MAC, message_type=1, client_arch=arch, vendor_class=vendor,
                          user_class=user, ipxe_options=has_175)
    assert classify(request) == client
    reply = boot_reply(request, known, ipxe_script_url=ipxe_script_url(HTTP, MAC),
                       tftp_server=TFTP, http_base_url=HTTP, arm64_bootfile=ARM64)
    if client is None:
        assert reply is None
        return
    extra = IPXE_175 if client is C.IPXE else ()
    assert reply == BootReply(client, bootfile, next_server, echo, extra)  # type: ignore[arg-type]


def test_script_url_format() -> None:
    assert ipxe_script_url("http://10.0.0.1:8080/", MAC) == (
        "http://10.0.0.1:8080/boot/52:54:00:77:00:10.ipxe")


def test_relay_and_message_type_do_not_change_the_file() -> None:
    base = BootRequest(mac=MAC, message_type=1, client_arch=7, vendor_class=PXE.format(7))
    relayed = BootRequest(mac=MAC, message_type=3, client_arch=7, vendor_class=PXE.format(7),
                          giaddr="10.1.2.1")
    assert classify(base) == classify(relayed) == C.UEFI_X64

