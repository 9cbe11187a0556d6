"""``provisioner node service NODE RUNBOOK`` and ``provisioner node firmware NODE``: start a
runbook, list a node's firmware against its baseline (through the API)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import api_client, api_options, node_path

if TYPE_CHECKING:
    from provisioner.cli.client import Json, Subcommands


def add_node_commands(node: Subcommands) -> None:
    service = node.add_parser(
        "service", parents=[api_options()], allow_abbrev=False,
        help="run a runbook on a node (an active node is drained first)")
    service.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    service.add_argument("runbook", metavar="RUNBOOK", help="a [servicing.runbooks] name")
    service.add_argument("--reason", default="", help="recorded in the node's history")
    service.add_argument("--json", action="store_true", help="the API's JSON")
    service.set_defaults(command=cmd_node_service)
    firmware = node.add_parser(
        "firmware", parents=[api_options()], allow_abbrev=False,
        help="a node's firmware components with the baseline's version beside each")
    firmware.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    firmware.add_argument("--json", action="store_true", help="the API's JSON")
    firmware.set_defaults(command=cmd_node_firmware)


def cmd_node_service(args: argparse.Namespace) -> int:
    reply = api_client(args).post(node_path(args.node, "service"),
                                  {"runbook": args.runbook, "reason": args.reason})
    if args.json:
        print(formatting.dump_json(reply))
    else:
        assert isinstance(reply, dict)
        print(f"{reply.get('id')}: {reply.get('state')} (runbook {args.runbook})")
    return 0


def cmd_node_firmware(args: argparse.Namespace) -> int:
    reply: Json = api_client(args).get(node_path(args.node, "firmware"))
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    assert isinstance(reply, dict)
    components = reply.get("components")
    rows = components if isinstance(components, list) else []
    if not rows:
        print(f"{args.node}: no firmware inventory yet (run a runbook with firmware_inventory)")
        return 0
    print(f"{'COMPONENT':32} {'VERSION':20} {'BASELINE':20} STATUS")
    for row in rows:
        assert isinstance(row, dict)
        status = {True: "ok", False: "drifted", None: "-"}[row.get("conforming")]
        print(f"{str(row.get('id')):32} {str(row.get('version')):20} "
              f"{str(row.get('baseline_version') or '-'):20} {status}")
    missing = reply.get("missing")
    if isinstance(missing, list) and missing:
        print("not reported by the BMC: " + ", ".join(map(str, missing)))
    return 0
