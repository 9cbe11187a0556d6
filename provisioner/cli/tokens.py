"""``provisioner token create``: a new API token, printed once (local)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from provisioner.cli.client import add_group, load_config

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

ROLES = ("viewer", "operator", "admin")


def add_commands(sub: Subcommands) -> None:
    token = add_group(sub, "token", "API tokens (local)")
    create = token.add_parser("create", help="create an API token; prints it once",
                              allow_abbrev=False)
    create.add_argument("--role", choices=ROLES, required=True)
    create.add_argument("--name", required=True)
    create.set_defaults(command=cmd_token_create)


def cmd_token_create(args: argparse.Namespace) -> int:
    from provisioner import admin

    token = admin.create_token(load_config(args), str(args.role), str(args.name))
    print(f"created {args.role} token {args.name!r}; it is shown once, store it now",
          file=sys.stderr)
    print(token)
    return 0
