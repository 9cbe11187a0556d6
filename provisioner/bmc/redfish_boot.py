"""Redfish boot override, decided from the System's ``Boot`` object: no I/O.

``boot_patch`` turns a request (device, once or persistent, UEFI or legacy, an HTTP boot
URI) into the ``Boot`` PATCH this BMC accepts, substituting what it does not offer:

- ``UefiHttp`` only where ``BootSourceOverrideTarget@Redfish.AllowableValues`` lists it
  (or the BMC lists nothing); otherwise network boot (``Pxe``), logged;
- ``HttpBootUri`` (ComputerSystem 1.9+) only with ``UefiHttp`` and only where the BMC has
  the property (present in ``Boot``, or annotated ``HttpBootUri@...``); otherwise the
  firmware takes the boot file URI from DHCP (our DHCP server answers ``HTTPClient``);
- ``Once`` where offered, else ``Continuous`` (and the reverse), logged;
- ``BootSourceOverrideMode`` only where the BMC has it and offers the wanted mode.

``read_boot`` is the read-back: the override as the BMC reports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from provisioner.bmc.base import BmcUnsupported, BootDevice, BootSetting

TARGETS: Final = {BootDevice.PXE: "Pxe", BootDevice.HTTP: "UefiHttp",
                  BootDevice.DISK: "Hdd", BootDevice.BIOS: "BiosSetup"}
DEVICES: Final = {target: device for device, target in TARGETS.items()}
MAX_URI_LENGTH: Final = 2048


@dataclass(frozen=True, slots=True)
class BootPatch:
    """The ``Boot`` object to PATCH, and what was substituted (one line each, for the log)."""

    body: dict[str, object]
    notes: tuple[str, ...] = ()


def boot_patch(boot: Mapping[str, object], device: BootDevice, *, persistent: bool,
               uefi: bool, http_uri: str | None, where: str) -> BootPatch:
    """The PATCH for ``device``; BmcUnsupported when this BMC cannot boot it at all."""
    notes: list[str] = []
    target = _target(boot, device, notes, where)
    body: dict[str, object] = {"BootSourceOverrideTarget": target,
                               "BootSourceOverrideEnabled": _enabled(boot, persistent, notes)}
    mode = "UEFI" if uefi or target == "UefiHttp" else "Legacy"
    if "BootSourceOverrideMode" in boot:
        modes = _allowed(boot, "BootSourceOverrideMode")
        if modes and mode not in modes:
            notes.append(f"boot mode {mode} not offered ({', '.join(modes)}); mode unchanged")
        else:
            body["BootSourceOverrideMode"] = mode
    if target == "UefiHttp" and http_uri:
        _check_uri(http_uri)
        if has_http_boot_uri(boot):
            body["HttpBootUri"] = http_uri
        else:
            notes.append("no HttpBootUri on this BMC; the firmware takes the boot file URI "
                         "from DHCP")
    return BootPatch(body, tuple(notes))


def read_boot(boot: Mapping[str, object]) -> BootSetting:
    """The override as reported: device None when disabled or unknown; the URI only for
    ``UefiHttp`` (a stale ``HttpBootUri`` under another target means nothing)."""
    target = boot.get("BootSourceOverrideTarget")
    enabled = boot.get("BootSourceOverrideEnabled")
    mode = boot.get("BootSourceOverrideMode")
    device = DEVICES.get(target) if isinstance(target, str) and enabled != "Disabled" \
        else None
    uri = boot.get("HttpBootUri")
    return BootSetting(
        device,
        enabled == "Continuous" if isinstance(enabled, str) else None,
        mode == "UEFI" if isinstance(mode, str) else None,
        uri if device is BootDevice.HTTP and isinstance(uri, str) and uri else None)


def has_http_boot_uri(boot: Mapping[str, object]) -> bool:
    """Whether the BMC has ``Boot.HttpBootUri`` (the property, or an annotation of it)."""
    return any(key == "HttpBootUri" or key.startswith("HttpBootUri@") for key in boot)


def hides_uefi_http(boot: Mapping[str, object]) -> bool:
    """Whether a Legacy-mode BMC lists targets without UefiHttp, which it may offer once
    the mode is UEFI (the mode must be patchable and UEFI an allowed mode)."""
    targets = _allowed(boot, "BootSourceOverrideTarget")
    modes = _allowed(boot, "BootSourceOverrideMode")
    return (boot.get("BootSourceOverrideMode") == "Legacy" and bool(targets)
            and "UefiHttp" not in targets and (not modes or "UEFI" in modes))


def _allowed(boot: Mapping[str, object], name: str) -> tuple[str, ...]:
    values = boot.get(f"{name}@Redfish.AllowableValues")
    return tuple(v for v in values if isinstance(v, str)) if isinstance(values, list) else ()


def _target(boot: Mapping[str, object], device: BootDevice, notes: list[str],
            where: str) -> str:
    target = TARGETS[device]
    allowed = _allowed(boot, "BootSourceOverrideTarget")
    if not allowed or target in allowed:
        return target
    if device is BootDevice.HTTP and "Pxe" in allowed:
        notes.append("no UefiHttp boot target; using network boot (Pxe)")
        return "Pxe"
    raise BmcUnsupported(f"BMC {where}: boot target {target} not offered "
                         f"(offered: {', '.join(allowed)})")


def _enabled(boot: Mapping[str, object], persistent: bool, notes: list[str]) -> str:
    want = "Continuous" if persistent else "Once"
    allowed = _allowed(boot, "BootSourceOverrideEnabled")
    if not allowed or want in allowed:
        return want
    other = "Once" if persistent else "Continuous"
    if other in allowed:
        notes.append(f"BMC offers no {'persistent' if persistent else 'one-time'} boot "
                     f"override; using {other}")
        return other
    return want  # the list offers neither: ask, and let the BMC answer


def _check_uri(uri: str) -> None:
    if (not uri.startswith(("http://", "https://")) or len(uri) > MAX_URI_LENGTH
            or any(c.isspace() or ord(c) < 32 for c in uri)):
        raise BmcUnsupported(f"HTTP boot URI {uri[:80]!r} is not an http(s) URL")
