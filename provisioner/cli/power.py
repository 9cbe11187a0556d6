"""``provisioner node power NODE on|off|soft-off|cycle|status`` and
``provisioner node bootdev NODE pxe|disk|http|bios [--persistent] [--legacy]`` and
``provisioner node bmc NODE rotate``: an operator
drives a node's BMC through the API (operator token; recorded in the node's history).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import Json, api_client, api_options, node_path

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

POWER_ACTIONS = ("on", "off", "soft-off", "cycle", "status")
BOOT_DEVICES = ("pxe", "disk", "http", "bios")


def add_commands(node: Subcommands) -> None:
    """Under the ``node`` group: ``power``, ``bootdev`` and ``bmc``."""
    api = api_options()
    power = node.add_parser("power", parents=[api], allow_abbrev=False,
                            help="power a node on/off/cycle through its BMC, or read it")
    power.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    power.add_argument("action", choices=POWER_ACTIONS, metavar="ACTION",
                       help=", ".join(POWER_ACTIONS))
    power.add_argument("--yes", action="store_true", help="confirm powering off or cycling "
                       "a node that Slurm reports running jobs")
    power.add_argument("--json", action="store_true", help="the API's JSON")
    power.set_defaults(command=cmd_node_power)

    bootdev = node.add_parser("bootdev", parents=[api], allow_abbrev=False,
                              help="set a node's boot device through its BMC")
    bootdev.add_argument("node", metavar="NODE")
    bootdev.add_argument("device", choices=BOOT_DEVICES, metavar="DEVICE",
                         help=", ".join(BOOT_DEVICES))
    bootdev.add_argument("--persistent", action="store_true",
                         help="for every boot (default: the next boot only)")
    bootdev.add_argument("--legacy", action="store_true", help="legacy BIOS, not UEFI")
    bootdev.add_argument("--json", action="store_true", help="the API's JSON")
    bootdev.set_defaults(command=cmd_node_bootdev)

    bmc = node.add_parser("bmc", parents=[api], allow_abbrev=False,
                          help="BMC credentials: rotate the node's BMC password")
    bmc.add_argument("node", metavar="NODE")
    bmc.add_argument("action", choices=("rotate",), metavar="ACTION", help="rotate")
    bmc.add_argument("--json", action="store_true", help="the API's JSON")
    bmc.set_defaults(command=cmd_node_bmc)


def cmd_node_power(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {"action": args.action}
    if args.yes:
        body["confirm"] = True
    reply = api_client(args).post(node_path(args.node, "power"), body)
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    node = reply.get("node") or {}
    name = node.get("hostname") or node.get("serial") or node.get("id")
    verb = "is" if args.action == "status" else f"{args.action} done; now"
    print(f"{name}: power {verb} {reply.get('power_state')}")
    return 0


def cmd_node_bootdev(args: argparse.Namespace) -> int:
    body = {"device": args.device, "persistent": bool(args.persistent),
            "uefi": not args.legacy}
    reply = api_client(args).post(node_path(args.node, "bootdev"), body)
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    node = reply.get("node") or {}
    name = node.get("hostname") or node.get("serial") or node.get("id")
    how = "persistent" if args.persistent else "next boot"
    print(f"{name}: boot device {args.device} ({how}, {'legacy' if args.legacy else 'UEFI'})")
    return 0


def cmd_node_bmc(args: argparse.Namespace) -> int:
    reply = api_client(args).post(node_path(args.node, "bmc", args.action))
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    name = reply.get("hostname") or reply.get("serial") or reply.get("id")
    print(f"{name}: BMC password rotated (a fresh login with the new one worked; it is "
          "stored encrypted and never shown)")
    return 0
