"""What ``serve`` checks before it opens the store or binds a socket, and all that
``provisioner config check`` checks: one code path, so the check says exactly what a start
would say. Each check raises ``ConfigError`` naming the key; none writes anything.

Notes (``Preflight.notes``) are what would not stop a start but an operator should know
(an inspection ramdisk not built yet): ``serve`` logs them at INFO, ``config check`` prints
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from provisioner.config import Settings
from provisioner.errors import ConfigError


@dataclass
class Preflight:
    checked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def preflight(settings: Settings) -> Preflight:
    """Run every check ``serve`` runs before binding; ConfigError on the first failure."""
    result = Preflight()
    _install(settings, result)
    _boot(settings, result)
    _kube(settings, result)
    _acceptance(settings, result)
    check_firmware_images(settings, result)
    _secret_key(settings.state_dir / "secret.key", result)
    return result


def _install(settings: Settings, result: Preflight) -> None:
    from provisioner.install.ansible import find_ansible_playbook
    from provisioner.install.workdir import find_playbooks

    result.checked.append(f"ansible-playbook: {find_ansible_playbook()}")
    result.checked.append(f"playbooks: {find_playbooks(settings.install.playbooks_dir)}")
    key = settings.install.ssh_private_key_file
    if key is not None and not key.is_file():
        raise ConfigError(f"install.ssh_private_key_file: {key} does not exist")


def _boot(settings: Settings, result: Preflight) -> None:
    from provisioner.boot.stack import base_url

    dhcp = settings.dhcp
    if dhcp.mode != "off":
        if settings.http.listen is None:
            raise ConfigError("http.listen: needed when dhcp.mode is not off (iPXE scripts)")
        if dhcp.server_address is None:
            raise ConfigError(f"dhcp.server_address is required in {dhcp.mode} mode")
        if dhcp.mode == "authoritative":
            from provisioner.store.leases import AddressRange

            if dhcp.pool is None:
                raise ConfigError("dhcp.pool (and the lease store) are required in "
                                  "authoritative mode")
            AddressRange.parse(dhcp.pool, dhcp.netmask)
    if settings.http.listen is None:
        return
    result.checked.append(f"boot HTTP base URL: {base_url(settings)}")
    boot = settings.boot
    if boot.ramdisk_build != "off":
        return  # serve builds the ramdisk in the background
    artefacts = boot.artefacts_dir or settings.state_dir / "artefacts"
    for kernel, initrd, arch in ((boot.inspection_kernel, boot.inspection_initrd, "x86_64"),
                                 (boot.inspection_kernel_arm64, boot.inspection_initrd_arm64,
                                  "arm64")):
        missing = [name for name in (kernel, initrd) if not (artefacts / name).is_file()]
        if missing:
            result.notes.append(
                f"{arch} inspection ramdisk missing in {artefacts} ({', '.join(missing)}): "
                f"such nodes will not boot into inspection; build it with: "
                f"provisioner ramdisk build --arch {arch}")


def _kube(settings: Settings, result: Preflight) -> None:
    kubeconfig = settings.kube.kubeconfig
    if kubeconfig is None:
        return
    if not kubeconfig.is_file():
        raise ConfigError(f"kube.kubeconfig {kubeconfig}: no such file")
    result.checked.append(f"kubeconfig: {kubeconfig}")


def _acceptance(settings: Settings, result: Preflight) -> None:
    from provisioner.lifecycle.acceptance import check_fabric_classes

    check_fabric_classes(settings.validation)
    if settings.validation.profiles:
        result.checked.append(f"validation profiles: {', '.join(settings.validation.profiles)}")


def firmware_dir(settings: Settings) -> Path | None:
    """Where the firmware images are on this host: the artefact directory that
    ``image_base_url`` (ending in ``/artefacts/<dir>``) serves; None when it is not ours."""
    base = (settings.servicing.image_base_url or "").rstrip("/")
    marker = "/artefacts/"
    if marker not in base:
        return None
    return (settings.boot.artefacts_dir or settings.state_dir / "artefacts") \
        / base.split(marker, 1)[1]


def check_firmware_images(settings: Settings, result: Preflight) -> None:
    """Firmware images served by our boot HTTP server (``image_base_url`` ending in
    ``/artefacts/<dir>``) must be there: a BMC fetching a 404 fails its update task with a
    message of its own, an hour later, on every node of the profile."""
    servicing = settings.servicing
    base = (servicing.image_base_url or "").rstrip("/")
    served = firmware_dir(settings)
    if served is None:
        return
    missing = sorted({f"{name}: {part.image}" for name, profile in servicing.profiles.items()
                      for part in profile.firmware
                      if not part.image.startswith(("http://", "https://"))
                      and not (served / part.image.lstrip("/")).is_file()})
    if missing:
        raise ConfigError(f"servicing: firmware images missing in {served} (served as "
                          f"{base}): {'; '.join(missing)}")
    if servicing.profiles:
        result.checked.append(f"firmware images: {served}")


def _secret_key(path: Path, result: Preflight) -> None:
    """An existing key file must be private and valid; a missing one is created at start."""
    if not path.exists():
        return
    from provisioner.store.secretbox import SecretBox

    SecretBox.from_key_file(path)
    result.checked.append(f"secret key: {path}")
