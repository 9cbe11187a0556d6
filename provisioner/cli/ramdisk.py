"""``provisioner ramdisk build``: the inspection ramdisk of one architecture, into the state
dir's artefacts (local; what ``serve`` also does by itself at start)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.cli.client import add_group, load_config

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

ARCHES = ("x86_64", "arm64")


def add_commands(sub: Subcommands) -> None:
    group = add_group(sub, "ramdisk", "inspection ramdisks (local)")
    build = group.add_parser("build", allow_abbrev=False,
                             help="build (or check the cache of) one architecture's ramdisk")
    build.add_argument("--arch", choices=ARCHES, required=True,
                       help="x86_64 (HGX/DGX) or arm64 (Grace GB200/GB300)")
    build.add_argument("--state-dir", type=Path, metavar="DIR",
                       help="state directory (default: the configuration's state_dir)")
    build.set_defaults(command=cmd_ramdisk_build)


def cmd_ramdisk_build(args: argparse.Namespace) -> int:
    settings = load_config(args)
    from provisioner.ramdisk.build import build
    from provisioner.ramdisk.sysroot import arch_named
    from provisioner.ramdisk.targets import cache_dir, target_for

    if args.state_dir is not None:
        settings = settings.model_copy(update={"state_dir": args.state_dir.resolve()})
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    arch = arch_named(args.arch)
    target = build(arch, target_for(settings, arch), cache_dir(settings))
    print(target.kernel)
    print(target.initrd)
    return 0
