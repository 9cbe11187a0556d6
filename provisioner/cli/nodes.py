"""``provisioner node list|show|enroll|action|history``: nodes through the API (edit, delete,
replace and bulk actions: ``node_admin``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from provisioner.cli import formatting
from provisioner.cli.client import (
    API,
    Json,
    ParamValue,
    UsageError,
    action_succeeded,
    add_group,
    api_client,
    api_options,
    node_path,
    read_secret,
    wait_until_rest,
)
from provisioner.errors import ProvisionerError

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

ACTIONS = ("inspect", "deploy", "retire", "retry", "abort", "maintenance-on", "maintenance-off",
           "sku-override", "adopt", "register-running", "allow-overwrite")
BMC_DRIVERS = ("ipmi", "redfish", "fake")


class _RefuseSecret(argparse.Action):
    """Rejects a secret given on the command line without echoing it back."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> NoReturn:
        parser.error(f"{option_string} is not accepted on the command line (it would show "
                     f"in ps and shell history): use {option_string}-file FILE")


def add_commands(sub: Subcommands) -> Subcommands:
    """The ``node`` group; returns its commands, so that other groups can add theirs."""
    node = add_group(sub, "node", "nodes (through the API)")
    api = api_options()
    ls = node.add_parser("list", parents=[api], help="list nodes", allow_abbrev=False)
    for name in ("state", "rack", "profile"):
        ls.add_argument(f"--{name}", action="append", metavar=name.upper(),
                        help="repeat, or separate with commas, to match any of several")
    ls.add_argument("--maintenance", action=argparse.BooleanOptionalAction, default=None,
                    help="only nodes in (or out of) maintenance")
    ls.add_argument("-q", dest="query", metavar="TEXT", help="search hostname, serial, MAC")
    ls.add_argument("--limit", type=_int_in(1))
    ls.add_argument("--offset", type=_int_in(0))
    ls.add_argument("--all", action="store_true", help="follow pagination to the end")
    ls.add_argument("--json", action="store_true", help="a JSON array of the nodes")
    ls.add_argument("--columns", type=_columns, default=formatting.DEFAULT_COLUMNS,
                    metavar="C,C", help="columns to show, from: "
                    + ", ".join(formatting.NODE_COLUMNS) + " (default: "
                    + ",".join(formatting.DEFAULT_COLUMNS) + ")")
    ls.add_argument("--sort", type=_sort_key, metavar="[-]COLUMN",
                    help="sort the rows listed by a column (- for descending)")
    ls.set_defaults(command=cmd_node_list)

    show = node.add_parser("show", parents=[api], help="one node, with facts and history",
                           allow_abbrev=False)
    show.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    show.add_argument("--json", action="store_true", help="the API's JSON")
    show.set_defaults(command=cmd_node_show)

    enroll = node.add_parser("enroll", parents=[api], help="enroll a node", allow_abbrev=False)
    enroll.add_argument("--hostname")
    enroll.add_argument("--serial")
    enroll.add_argument("--mac", dest="macs", action="append", required=True,
                        metavar="MAC", help="a MAC address (repeat for each NIC)")
    enroll.add_argument("--profile")
    enroll.add_argument("--rack")
    enroll.add_argument("--position", metavar="U")
    enroll.add_argument("--bmc-driver", choices=BMC_DRIVERS)
    enroll.add_argument("--bmc-address", metavar="ADDR")
    enroll.add_argument("--bmc-port", type=_int_in(1, 65535), metavar="PORT")
    enroll.add_argument("--bmc-username", metavar="USER")
    enroll.add_argument("--bmc-password-file", type=Path, metavar="FILE",
                        help="file holding the BMC password (a trailing newline is dropped)")
    enroll.add_argument("--bmc-password", action=_RefuseSecret, nargs="?",
                        help=argparse.SUPPRESS)
    enroll.add_argument("--json", action="store_true", help="the API's JSON")
    enroll.set_defaults(command=cmd_node_enroll)

    action = node.add_parser("action", parents=[api], help="request a lifecycle action",
                             allow_abbrev=False)
    action.add_argument("node", metavar="NODE", nargs="?",
                        help="the node (leave out with --filter)")
    action.add_argument("action", choices=ACTIONS, metavar="ACTION",
                        help=", ".join(ACTIONS))
    action.add_argument("--reason", default=None, help="recorded in the node's history")
    action.add_argument("--yes", action="store_true",
                        help="confirm what loses data: deploy (re-image) of an active node")
    action.add_argument("--json", action="store_true", help="the API's JSON")
    action.add_argument("--wait", action="store_true",
                        help="wait until the node (with --filter: each) is in a stable "
                             "state: exit 0 on the one "
                             "the action leads to, 1 with the node's last error otherwise")
    action.add_argument("--wait-timeout", type=_int_in(1), default=3600, metavar="S",
                        help="with --wait: give up after S seconds (default 3600)")
    action.set_defaults(command=cmd_node_action)

    history = node.add_parser("history", parents=[api], help="a node's transitions",
                              allow_abbrev=False)
    history.add_argument("node", metavar="NODE")
    history.add_argument("--json", action="store_true", help="a JSON array of the entries")
    history.set_defaults(command=cmd_node_history)
    return node


def _columns(text: str) -> tuple[str, ...]:
    names = tuple(name.strip().lower() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in formatting.NODE_COLUMNS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown column(s) {', '.join(unknown) or text!r}; "
                                         "from: " + ", ".join(formatting.NODE_COLUMNS))
    return names


def _sort_key(text: str) -> str:
    if text.removeprefix("-").lower() not in formatting.NODE_COLUMNS:
        raise argparse.ArgumentTypeError(f"unknown column {text!r}; from: "
                                         + ", ".join(formatting.NODE_COLUMNS))
    return text.lower()


def _many(values: list[str] | None) -> list[str] | None:
    """``--state a,b --state c`` → [a, b, c]."""
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _int_in(low: int, high: int = 2**63) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low}, got {text!r}"
                                             if high == 2**63 else f"expected {low}-{high}")
        return int(text)

    return parse


def cmd_node_list(args: argparse.Namespace) -> int:
    api = api_client(args)
    params: dict[str, ParamValue] = {
        "state": _many(args.state), "rack": _many(args.rack), "profile": _many(args.profile),
        "maintenance": args.maintenance, "q": args.query, "limit": args.limit,
        "offset": args.offset,
    }
    page = api.get(f"{API}/nodes", params)
    items: list[Json] = list(page["items"])
    total = int(page.get("total", len(items)))
    offset = int(page.get("offset") or 0)
    while args.all and page["items"] and offset + len(items) < total:
        params["offset"] = offset + len(items)
        page = api.get(f"{API}/nodes", params)
        items.extend(page["items"])
    if args.json:
        print(formatting.dump_json(items))
        return 0
    if args.sort:
        items = formatting.sort_nodes(items, args.sort)
    print(formatting.node_table(items, args.columns))
    if offset + len(items) < total or offset:
        print(f"({len(items)} of {total} nodes from offset {offset}; --all lists every one)",
              file=sys.stderr)
    return 0


def cmd_node_show(args: argparse.Namespace) -> int:
    node = api_client(args).get(node_path(args.node))
    print(formatting.dump_json(node) if args.json else formatting.node_detail(node))
    return 0


def cmd_node_enroll(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {"macs": list(args.macs)}
    for name in ("hostname", "serial", "profile", "rack", "position"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    bmc = _bmc_body(args)
    if bmc is not None:
        body["bmc"] = bmc
    node = api_client(args).post(f"{API}/nodes", body)
    if args.json:
        print(formatting.dump_json(node))
    else:
        print(f"enrolled {node.get('hostname') or node.get('serial') or node['id']}: "
              f"id {node['id']}, state {node.get('state')}")
    return 0


def _bmc_body(args: argparse.Namespace) -> dict[str, Json] | None:
    given = [args.bmc_address, args.bmc_port, args.bmc_username, args.bmc_password_file]
    if args.bmc_driver is None:
        if any(value is not None for value in given):
            raise UsageError("--bmc-* options need --bmc-driver")
        return None
    if not args.bmc_address:
        raise UsageError("--bmc-driver needs --bmc-address")
    bmc: dict[str, Json] = {"driver": args.bmc_driver, "address": args.bmc_address}
    if args.bmc_port is not None:
        bmc["port"] = args.bmc_port
    if args.bmc_username is not None:
        bmc["username"] = args.bmc_username
    if args.bmc_password_file is not None:
        bmc["password"] = read_secret(args.bmc_password_file, "--bmc-password-file")
    return bmc


def cmd_node_action(args: argparse.Namespace) -> int:
    """One node's action (``--filter``: ``node_admin`` takes the command over)."""
    if args.node is None:
        raise UsageError("give the NODE, or --filter to act on every node it matches")
    if args.dry_run or args.max is not None:
        raise UsageError("--dry-run and --max go with --filter")
    body: dict[str, Json] = {} if args.reason is None else {"reason": args.reason}
    if args.yes:
        body["confirm"] = True
    api = api_client(args)
    node = api.post(node_path(args.node, "actions", args.action), body or None)
    name = node.get("hostname") or node.get("serial") or node.get("id")
    if not args.json:
        print(f"{name}: {args.action} accepted; state {node.get('state')}", flush=True)
    if args.wait:
        node = wait_until_rest(api, node, args.action, float(args.wait_timeout))
    if args.json:
        print(formatting.dump_json(node))
    if args.wait and not action_succeeded(args.action, str(node.get("state"))):
        error = node.get("last_error") or "no error recorded"
        raise ProvisionerError(f"{name}: {args.action} ended in {node.get('state')}: {error}")
    if args.wait and not args.json:
        print(f"{name}: {node.get('state')}")
    return 0


def cmd_node_history(args: argparse.Namespace) -> int:
    items = api_client(args).get(node_path(args.node, "history"))["items"]
    print(formatting.dump_json(items) if args.json else formatting.history_table(items))
    return 0
