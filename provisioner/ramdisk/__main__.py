"""``python -m provisioner.ramdisk``: what ``provisioner serve`` runs in a child process to
build a missing ramdisk (and the arm64 GRUB image) without blocking its event loop. Paths are
explicit; operators use ``provisioner ramdisk build``. Exit 0, or 1 with one line on stderr."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from provisioner.ramdisk.build import Target, build
from provisioner.ramdisk.netboot import build_arm64_grub
from provisioner.ramdisk.sysroot import RamdiskError, arch_named, sysroot_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisioner.ramdisk")
    parser.add_argument("--arch", required=True)
    parser.add_argument("--kernel", type=Path, required=True)
    parser.add_argument("--initrd", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--grub", type=Path, help="also build the arm64 GRUB image here")
    parser.add_argument("--base-url", help="the boot HTTP URL the GRUB image asks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        arch = arch_named(args.arch)
        build(arch, Target(args.kernel, args.initrd), args.cache_dir)
        if args.grub is not None and args.base_url:
            build_arm64_grub(sysroot_for(arch, args.cache_dir), args.base_url, args.grub)
    except RamdiskError as exc:
        print(f"ramdisk: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
