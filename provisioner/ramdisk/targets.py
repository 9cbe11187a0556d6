"""Where the configuration puts each architecture's inspection ramdisk."""

from __future__ import annotations

from pathlib import Path

from provisioner.config import Settings
from provisioner.ramdisk.build import Target
from provisioner.ramdisk.sysroot import Arch


def artefacts_dir(settings: Settings) -> Path:
    return settings.boot.artefacts_dir or settings.state_dir / "artefacts"


def cache_dir(settings: Settings) -> Path:
    return settings.boot.cache_dir or settings.state_dir / "cache"


def target_for(settings: Settings, arch: Arch) -> Target:
    base, boot = artefacts_dir(settings), settings.boot
    if arch.name == "arm64":
        return Target(base / boot.inspection_kernel_arm64, base / boot.inspection_initrd_arm64)
    return Target(base / boot.inspection_kernel, base / boot.inspection_initrd)
