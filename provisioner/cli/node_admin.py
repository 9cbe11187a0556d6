"""``provisioner node edit|delete|replace`` and the bulk form of ``node action`` (issue 30)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import (
    API,
    Json,
    UsageError,
    action_succeeded,
    api_client,
    api_options,
    node_path,
    wait_until_rest,
)

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

EDIT_FIELDS = ("hostname", "rack", "position", "profile")
#: what ``--filter`` may name (``state=a,state=b``: either)
FILTER_KEYS = ("state", "rack", "profile", "maintenance", "q")
MULTI_KEYS = ("state", "rack", "profile")


def add_commands(node: Subcommands) -> None:
    """``node edit|delete|replace``, and ``--filter`` on the ``node action`` the nodes group
    defined (its command stays the one for a single node)."""
    action = node.choices["action"]
    add_bulk_options(action)
    single = action.get_default("command")

    def one_or_many(args: argparse.Namespace) -> int:
        return cmd_bulk_action(args) if args.filters else int(single(args))

    action.set_defaults(command=one_or_many)
    api = api_options()
    edit = node.add_parser("edit", parents=[api], allow_abbrev=False,
                           help="change a node's hostname, rack, position or profile")
    edit.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    for name in EDIT_FIELDS:
        edit.add_argument(f"--{name}", help=f"the new {name} ('' clears it)")
    edit.add_argument("--reason", default="", help="recorded in the node's history")
    edit.add_argument("--force", action="store_true",
                      help="rename or re-profile an active or in-flight node")
    edit.add_argument("--json", action="store_true", help="the API's JSON")
    edit.set_defaults(command=cmd_node_edit)

    delete = node.add_parser("delete", parents=[api], allow_abbrev=False,
                             help="delete a retired node (admin); its history is written out")
    delete.add_argument("node", metavar="NODE")
    delete.add_argument("--history-file", type=Path, metavar="FILE",
                        help="write the node and its history there as JSON (default: stdout)")
    delete.set_defaults(command=cmd_node_delete)

    replace = node.add_parser("replace", parents=[api], allow_abbrev=False,
                              help="a new chassis takes the hostname and place of a retired node")
    replace.add_argument("node", metavar="OLD", help="the retired node")
    replace.add_argument("--with", dest="new", required=True, metavar="NEW",
                         help="the new chassis (id, hostname, serial or MAC)")
    replace.add_argument("--reason", default="", help="recorded in both histories")
    replace.add_argument("--json", action="store_true", help="the API's JSON")
    replace.set_defaults(command=cmd_node_replace)


def add_bulk_options(action: argparse.ArgumentParser) -> None:
    action.add_argument("--filter", dest="filters", action="append", metavar="K=V[,K=V]",
                        help="act on every node matching (keys: " + ", ".join(FILTER_KEYS)
                             + "; a repeated key matches either value); no NODE then")
    action.add_argument("--dry-run", action="store_true",
                        help="with --filter: list the nodes it would act on, change nothing")
    action.add_argument("--max", type=int, default=None, metavar="N",
                        help="with --filter: refuse when more than N nodes match (default 20)")


def parse_filter(texts: list[str]) -> dict[str, Json]:
    """``state=a,rack=r12`` (repeatable) → the API's filter object."""
    found: dict[str, Json] = {}
    for text in texts:
        for part in filter(None, (piece.strip() for piece in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in FILTER_KEYS or not value:
                raise UsageError(f"--filter {part!r}: expected KEY=VALUE with KEY one of "
                                 + ", ".join(FILTER_KEYS))
            if key in MULTI_KEYS:
                found.setdefault(key, []).append(value)
            elif key in found:
                raise UsageError(f"--filter: {key} given twice")
            elif key == "maintenance":
                if value not in ("true", "false"):
                    raise UsageError("--filter maintenance=true|false")
                found[key] = value == "true"
            else:
                found[key] = value
    return found


def cmd_bulk_action(args: argparse.Namespace) -> int:
    if args.node is not None:
        raise UsageError("give either NODE or --filter, not both")
    if args.wait and (args.json or args.dry_run):
        raise UsageError("--wait with --filter prints a line per node: not with --json or "
                         "--dry-run")
    body: dict[str, Json] = {"filter": parse_filter(args.filters), "action": args.action,
                             "dry_run": args.dry_run}
    if args.reason is not None:
        body["reason"] = args.reason
    if args.max is not None:
        body["max"] = args.max
    result = api_client(args).post(f"{API}/nodes/actions", body)
    if args.json:
        print(formatting.dump_json(result))
        return 0
    total, matched = int(result["total"]), result["matched"]
    if args.dry_run:
        print(f"dry run: {args.action} would apply to {total} node(s)"
              + (f" (first {len(matched)} shown; over --max {result['max']})"
                 if total > len(matched) else ""))
        rows = [(formatting.text(n.get("hostname")), str(n["id"])[:8], formatting.text(
            n.get("state"))) for n in matched]
        print(formatting.table(("HOSTNAME", "ID", "STATE"), rows))
        return 0
    for node in result["applied"]:
        print(f"{node.get('hostname') or node['id']}: {args.action} accepted; "
              f"state {node['state']}", flush=True)
    for node in result["failed"]:
        print(f"{node.get('hostname') or node['id']}: {node['error']}", file=sys.stderr)
    unfinished = _wait_for_all(args, result["applied"]) if args.wait else 0
    return 1 if result["failed"] or unfinished else 0


def _wait_for_all(args: argparse.Namespace, applied: list[Json]) -> int:
    """``--wait`` with ``--filter``: each node the action applied to until it rests (one
    deadline for all), one line each; how many did not end where the action leads."""
    api = api_client(args)
    deadline = time.monotonic() + float(args.wait_timeout)
    unfinished = 0
    for node in applied:
        name = node.get("hostname") or node["id"]
        rested = wait_until_rest(api, node, args.action, max(deadline - time.monotonic(), 0.0))
        state = str(rested.get("state"))
        if action_succeeded(args.action, state):
            print(f"{name}: {state}", flush=True)
        else:
            unfinished += 1
            print(f"{name}: {args.action} ended in {state}: "
                  f"{rested.get('last_error') or 'no error recorded'}", file=sys.stderr)
    return unfinished


def cmd_node_edit(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {name: getattr(args, name) or None for name in EDIT_FIELDS
                             if getattr(args, name) is not None}
    if not body:
        raise UsageError("nothing to change: give --hostname, --rack, --position or --profile")
    body |= {"reason": args.reason, "force": args.force}
    node = api_client(args).patch(node_path(args.node), body)
    if args.json:
        print(formatting.dump_json(node))
    else:
        changed = ", ".join(f"{name} {formatting.text(node.get(name))}" for name in EDIT_FIELDS
                            if name in body)
        print(f"{node.get('hostname') or node['id']}: {changed}")
    return 0


def cmd_node_delete(args: argparse.Namespace) -> int:
    deleted = api_client(args).delete(node_path(args.node))
    record = json.dumps(deleted, indent=2, ensure_ascii=False)
    node = deleted["node"]
    name = node.get("hostname") or node.get("serial") or node["id"]
    if args.history_file is not None:
        args.history_file.write_text(record + "\n", encoding="utf-8")
        print(f"deleted {name} (id {node['id']}); its {len(deleted['history'])} history "
              f"rows are in {args.history_file}")
    else:
        print(record)
        print(f"deleted {name} (id {node['id']})", file=sys.stderr)
    return 0


def cmd_node_replace(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {"with": args.new, "reason": args.reason}
    result = api_client(args).post(node_path(args.node, "replace"), body)
    if args.json:
        print(formatting.dump_json(result))
        return 0
    old, new = result["old"], result["new"]
    print(f"{new.get('hostname') or new['id']}: now node {new['id']} (serial "
          f"{formatting.text(new.get('serial'))}, rack {formatting.text(new.get('rack'))}, "
          f"position {formatting.text(new.get('position'))}); retired node {old['id']} "
          "gave up its hostname, serial and MACs")
    return 0
