"""``provisioner serve``: run the daemon in the foreground until SIGTERM (local)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisioner.cli.client import load_config

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands


def add_commands(sub: Subcommands) -> None:
    serve = sub.add_parser("serve", help="run the daemon until SIGTERM", allow_abbrev=False)
    serve.set_defaults(command=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_config(args)
    from provisioner.daemon import run

    return run(settings)
