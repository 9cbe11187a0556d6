"""The Redfish boot override decision (``bmc/redfish_boot.py``) and the UEFI HTTP boot URI
of a node (``boot.policy.uefi_http_boot_uri``): pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.bmc.base import BmcUnsupported, BootDevice, BootSetting
from provisioner.bmc.redfish_boot import boot_patch, has_http_boot_uri, read_boot
from provisioner.boot.policy import uefi_http_boot_uri

URI = "http://10.77.0.1:8080/ipxe/snponly.efi"
TARGETS = "BootSourceOverrideTarget@Redfish.AllowableValues"
ENABLED = "BootSourceOverrideEnabled@Redfish.AllowableValues"
FULL: dict[str, Any] = {"BootSourceOverrideTarget": "None",
                        "BootSourceOverrideEnabled": "Disabled",
                        "BootSourceOverrideMode": "UEFI", "HttpBootUri": None,
                        TARGETS: ["None", "Pxe", "Hdd", "UefiHttp", "BiosSetup"],
                        ENABLED: ["Disabled", "Once", "Continuous"]}


def test_uefi_http_with_uri_where_the_bmc_has_http_boot_uri() -> None:
    patch = boot_patch(FULL, BootDevice.HTTP, persistent=False, uefi=True, http_uri=URI,
                       where="bmc")
    assert patch.body == {"BootSourceOverrideTarget": "UefiHttp",
                          "BootSourceOverrideEnabled": "Once",
                          "BootSourceOverrideMode": "UEFI", "HttpBootUri": URI}
    assert patch.notes == ()


def test_uefi_http_is_always_uefi_mode() -> None:
    patch = boot_patch(FULL, BootDevice.HTTP, persistent=True, uefi=False, http_uri=None,
                       where="bmc")
    assert patch.body["BootSourceOverrideMode"] == "UEFI"
    assert patch.body["BootSourceOverrideEnabled"] == "Continuous"
    assert "HttpBootUri" not in patch.body  # no URI asked for: none sent


def test_no_http_boot_uri_property_means_dhcp_gives_the_uri() -> None:
    boot = {k: v for k, v in FULL.items() if k != "HttpBootUri"}
    patch = boot_patch(boot, BootDevice.HTTP, persistent=False, uefi=True, http_uri=URI,
                       where="bmc")
    assert "HttpBootUri" not in patch.body
    assert patch.body["BootSourceOverrideTarget"] == "UefiHttp"
    assert any("from DHCP" in note for note in patch.notes)
    annotated = {**boot, "HttpBootUri@Redfish.AllowableValues": []}
    assert has_http_boot_uri(annotated)


def test_pxe_fallback_where_uefi_http_is_not_offered() -> None:
    boot = {**FULL, TARGETS: ["Pxe", "Hdd"]}
    patch = boot_patch(boot, BootDevice.HTTP, persistent=False, uefi=True, http_uri=URI,
                       where="bmc")
    assert patch.body["BootSourceOverrideTarget"] == "Pxe"
    assert "HttpBootUri" not in patch.body  # a URI means nothing to PXE
    assert any("no UefiHttp" in note for note in patch.notes)
    with pytest.raises(BmcUnsupported, match="BiosSetup not offered"):
        boot_patch(boot, BootDevice.BIOS, persistent=False, uefi=True, http_uri=None,
                   where="bmc")


@pytest.mark.parametrize(("allowed", "persistent", "want"), [
    (["Continuous"], False, "Continuous"), (["Once"], True, "Once"),
    (["Disabled"], False, "Once"), (None, True, "Continuous")],
    ids=["no-once", "no-continuous", "neither", "no-list"])
def test_enabled_substitutes_what_is_offered(allowed: list[str] | None, persistent: bool,
                                            want: str) -> None:
    boot = {k: v for k, v in FULL.items() if k != ENABLED}
    if allowed is not None:
        boot[ENABLED] = allowed
    patch = boot_patch(boot, BootDevice.PXE, persistent=persistent, uefi=True, http_uri=None,
                       where="bmc")
    assert patch.body["BootSourceOverrideEnabled"] == want


def test_mode_only_where_the_bmc_has_it_and_offers_it() -> None:
    bare: dict[str, Any] = {}
    assert boot_patch(bare, BootDevice.DISK, persistent=True, uefi=False, http_uri=None,
                      where="bmc").body == {"BootSourceOverrideTarget": "Hdd",
                                            "BootSourceOverrideEnabled": "Continuous"}
    uefi_only = {**FULL, "BootSourceOverrideMode@Redfish.AllowableValues": ["UEFI"]}
    patch = boot_patch(uefi_only, BootDevice.DISK, persistent=True, uefi=False,
                       http_uri=None, where="bmc")
    assert "BootSourceOverrideMode" not in patch.body and patch.notes


@pytest.mark.parametrize("uri", ["tftp://x/y", "http://a b/c", "", "http://x/" + "a" * 3000])
def test_bad_uris_are_refused_clearly(uri: str) -> None:
    if not uri:  # empty: no URI, nothing to refuse
        assert "HttpBootUri" not in boot_patch(FULL, BootDevice.HTTP, persistent=False,
                                               uefi=True, http_uri=uri, where="b").body
        return
    with pytest.raises(BmcUnsupported, match="not an http"):
        boot_patch(FULL, BootDevice.HTTP, persistent=False, uefi=True, http_uri=uri,
                   where="bmc")


@pytest.mark.parametrize(("boot", "want"), [
    ({}, BootSetting(None)),
    ({"BootSourceOverrideTarget": "UefiHttp", "BootSourceOverrideEnabled": "Once",
      "BootSourceOverrideMode": "UEFI", "HttpBootUri": URI},
     BootSetting(BootDevice.HTTP, False, True, URI)),
    ({"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Continuous",
      "HttpBootUri": URI}, BootSetting(BootDevice.PXE, True, None, None)),
    ({"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Disabled"},
     BootSetting(None, False, None)),
    ({"BootSourceOverrideTarget": "Usb", "BootSourceOverrideEnabled": "Once"},
     BootSetting(None, False, None)),
    ({"BootSourceOverrideTarget": 7, "BootSourceOverrideEnabled": None,
      "BootSourceOverrideMode": ["x"]}, BootSetting(None)),
], ids=["empty", "http-with-uri", "stale-uri-ignored", "disabled", "unknown-target",
        "malformed"])
def test_read_boot(boot: dict[str, Any], want: BootSetting) -> None:
    assert read_boot(boot) == want


@pytest.mark.parametrize(("arch", "want"), [
    ("x86_64", "http://h:8080/ipxe/snponly.efi"), ("amd64", "http://h:8080/ipxe/snponly.efi"),
    ("aarch64", "http://h:8080/ipxe/grubaa64.efi"), ("arm64", "http://h:8080/ipxe/grubaa64.efi"),
    (None, None), ("riscv64", None)])
def test_uefi_http_boot_uri_by_architecture(arch: str | None, want: str | None) -> None:
    assert uefi_http_boot_uri("http://h:8080/", arch, arm64_bootfile="grubaa64.efi") == want
