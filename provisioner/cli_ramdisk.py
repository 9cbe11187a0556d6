"""``provisioner ramdisk build``: the inspection ramdisk of one architecture, into the state
dir's artefacts (local; what ``serve`` also does by itself at start)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioner.config import Settings

ARCHES = ("x86_64", "arm64")


def add_ramdisk_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       load: Callable[[argparse.Namespace], Settings]) -> None:
    group = sub.add_parser("ramdisk", help="inspection ramdisks (local)", allow_abbrev=False)
    commands = group.add_subparsers(dest="ramdisk_command", metavar="COMMAND", required=True)
    build = commands.add_parser("build", allow_abbrev=False,
                                help="build (or check the cache of) one architecture's ramdisk")
    build.add_argument("--arch", choices=ARCHES, required=True,
                       help="x86_64 (HGX/DGX) or arm64 (Grace GB200/GB300)")
    build.add_argument("--state-dir", type=Path, metavar="DIR",
                       help="state directory (default: the configuration's state_dir)")

    def run(args: argparse.Namespace) -> int:
        return cmd_ramdisk_build(args, load(args))

    build.set_defaults(command=run)


def cmd_ramdisk_build(args: argparse.Namespace, settings: Settings) -> int:
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
