"""``provisioner db upgrade``: apply the pending schema migrations (local)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisioner.cli.client import add_group, load_config

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands


def add_commands(sub: Subcommands) -> None:
    db = add_group(sub, "db", "database schema (local)")
    db.add_parser("upgrade", help="apply pending migrations",
                  allow_abbrev=False).set_defaults(command=cmd_db_upgrade)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from provisioner import admin

    print(admin.db_upgrade(load_config(args)))
    return 0
