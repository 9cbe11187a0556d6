"""``provisioner config show``: the effective configuration, secrets masked;
``provisioner config check``: the checks ``serve`` runs before it binds anything (local)."""

from __future__ import annotations

import argparse
import sys
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
    check = config.add_parser(
        "check", allow_abbrev=False,
        help="run the checks serve runs before it starts: exit 2 with serve's message, "
             "0 and \"ok\" when it would start")
    check.add_argument("-v", "--verbose", action="store_true", help="list what was checked")
    check.set_defaults(command=cmd_config_check)


def cmd_config_show(args: argparse.Namespace) -> int:
    from provisioner import admin
    from provisioner.daemon.preflight import preflight
    from provisioner.errors import ConfigError

    settings = load_config(args)
    print(admin.show_config(settings, as_json=bool(args.json)))
    try:  # what loads may still stop serve: say so (config check exits 2 on it)
        preflight(settings)
    except ConfigError as exc:
        print(f"provisioner: warning: serve would not start: {exc}", file=sys.stderr)
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """A ConfigError (from loading or a check) reaches ``main``: exit 2, its message."""
    from provisioner.daemon.preflight import preflight

    checks = preflight(load_config(args))
    for line in checks.checked if args.verbose else ():
        print(f"checked {line}")
    for note in checks.notes:
        print(f"warning: {note}")
    print("ok")
    return 0
