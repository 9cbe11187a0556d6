"""``main`` and the top-level parser: each group module adds its commands, ``main`` runs the
one chosen and turns its errors into an exit code and one line on stderr.

Exit codes: 0 ok, 1 an API or runtime failure, 2 a usage or config error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from provisioner import __version__
from provisioner.cli import (
    audit,
    completion,
    config,
    db,
    events,
    fabric,
    firmware,
    formatting,
    health,
    inventory,
    node_admin,
    nodes,
    power,
    ramdisk,
    repair,
    serve,
    servicing,
    tokens,
    topology,
    why,
)
from provisioner.cli.client import PROG, ApiError, UsageError
from provisioner.errors import ConfigError, ProvisionerError

Command = Callable[[argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad arguments, 0 for --help and --version
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    command: Command = args.command
    try:
        return command(args)
    except UsageError as exc:
        return fail(f"{PROG}: error: {exc}", 2)
    except ConfigError as exc:
        return fail(f"{PROG}: config error: {exc}", 2)
    except ApiError as exc:
        reason = formatting.api_reason(exc.status, exc.detail, exc.problem)
        return fail(f"{PROG}: error: {reason}", 1)
    except ProvisionerError as exc:
        return fail(f"{PROG}: error: {exc}", 1)
    except KeyboardInterrupt:
        return fail("", 130)
    except BrokenPipeError:  # `provisioner node list | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def fail(message: str, code: int) -> int:
    if message:
        print(message, file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    """Every command, in the order ``--help`` lists them."""
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False,
                                     description="Bare-metal provisioning for GPU clusters.")
    _add_config_option(parser, default=None)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    serve.add_commands(sub)
    db.add_commands(sub)
    config.add_commands(sub)
    tokens.add_commands(sub)
    node_group = nodes.add_commands(sub)
    node_admin.add_commands(node_group)  # edit, delete, replace; --filter on node action
    power.add_commands(node_group)  # node power|bootdev|bmc after node history
    repair.add_node_commands(node_group)
    servicing.add_node_commands(node_group)
    health.add_node_commands(node_group)
    why.add_node_commands(node_group)
    events.add_commands(sub)
    audit.add_commands(sub)
    inventory.add_commands(sub)
    topology.add_commands(sub)
    fabric.add_commands(sub)
    firmware.add_commands(sub)
    ramdisk.add_commands(sub)
    health.add_commands(sub)
    repair.add_commands(sub)
    completion.add_commands(sub, parser)
    for command in _subcommands(parser):
        _add_config_option(command, default=argparse.SUPPRESS)
    return parser


def _add_config_option(parser: argparse.ArgumentParser, *, default: object) -> None:
    """``--config``, on the top-level parser (default None) and on every command: a
    command's leaves the namespace alone unless given (SUPPRESS), so that ``provisioner
    --config F serve`` and ``provisioner serve --config F`` mean the same."""
    parser.add_argument("--config", type=Path, metavar="FILE", default=default,
                        help="config file (default: /etc/provisioner/provisioner.toml); "
                             "before or after the command")


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser`` (groups and their commands), each once."""
    found: dict[int, argparse.ArgumentParser] = {}
    pending = [parser]
    while pending:
        for action in pending.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    if id(child) not in found:
                        found[id(child)] = child
                        pending.append(child)
    return list(found.values())
