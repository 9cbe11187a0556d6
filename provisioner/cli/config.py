"""``provisioner config show``: the effective configuration, secrets masked (local)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisioner.cli.client import add_group, load_config

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands


def add_commands(sub: Subcommands) -> None:
    config = add_group(sub, "config", "configuration (local)")
    show = config.add_parser("show", help="print the effective config, secrets masked",
                             allow_abbrev=False)
    show.add_argument("--json", action="store_true", help="JSON instead of TOML")
    show.set_defaults(command=cmd_config_show)


def cmd_config_show(args: argparse.Namespace) -> int:
    from provisioner import admin

    print(admin.show_config(load_config(args), as_json=bool(args.json)))
    return 0
