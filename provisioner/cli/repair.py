"""``provisioner node repair NODE start|stop|skip|show`` and ``provisioner repair breaker
[show|reset]``: an operator drives the repair ladder through the API (operator token;
recorded in the node's history)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import UsageError, add_group, api_client, api_options, node_path

if TYPE_CHECKING:
    from provisioner.cli.client import Json, Subcommands

REPAIR_ACTIONS = ("start", "stop", "skip", "show")
RUNGS = ("reset_gpu", "restart_os", "power_cycle", "reimage")


def add_node_commands(node: Subcommands) -> None:
    """Under the ``node`` group: ``repair``."""
    repair = node.add_parser(
        "repair", parents=[api_options()], allow_abbrev=False,
        help="start, stop or skip a rung of a node's repair ladder, or show its record")
    repair.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    repair.add_argument("action", choices=REPAIR_ACTIONS, metavar="ACTION",
                        help=", ".join(REPAIR_ACTIONS))
    repair.add_argument("--class", dest="health_class", metavar="CLASS",
                        help="start: the finding's class (default: the last record's)")
    repair.add_argument("--from", dest="first", metavar="ACTION", default="drain",
                        help="start: the recommended action to start from (default drain: "
                             "the class's first rung)")
    repair.add_argument("--evidence", help="start: the evidence line")
    repair.add_argument("--subject", default="", help="start: the part (GPU 3, 0000:18:00)")
    repair.add_argument("--rung", choices=RUNGS, help="skip: the rung to skip")
    repair.add_argument("--reason", default="", help="recorded in the node's history")
    repair.add_argument("--json", action="store_true", help="the API's JSON")
    repair.set_defaults(command=cmd_node_repair)


def add_commands(sub: Subcommands) -> None:
    group = add_group(sub, "repair", "the repair ladder's circuit breaker (through the API)")
    breaker = group.add_parser("breaker", parents=[api_options()], allow_abbrev=False,
                               help="show the circuit breaker, or reset it")
    breaker.add_argument("action", nargs="?", choices=("show", "reset"), default="show")
    breaker.add_argument("--reason", default="", help="reset: recorded with the reset")
    breaker.add_argument("--json", action="store_true", help="the API's JSON")
    breaker.set_defaults(command=cmd_repair_breaker)


def cmd_node_repair(args: argparse.Namespace) -> int:
    client = api_client(args)
    reply: Json
    if args.action == "show":
        reply = client.get(node_path(args.node, "repair"))
    elif args.action == "stop":
        reply = client.post(node_path(args.node, "repair", "stop"), {"reason": args.reason})
    elif args.action == "skip":
        if args.rung is None:
            raise UsageError("skip needs --rung")
        reply = client.post(node_path(args.node, "repair", "skip"),
                            {"rung": args.rung, "reason": args.reason})
    else:
        body: dict[str, Json] = {"action": args.first, "reason": args.reason,
                                 "subject": args.subject}
        if args.health_class is not None:
            body["class"] = args.health_class
        if args.evidence:
            body["evidence"] = args.evidence
        reply = client.post(node_path(args.node, "repair"), body)
    print(formatting.dump_json(reply) if args.json else _line(args, reply))
    return 0


def _line(args: argparse.Namespace, reply: Json) -> str:
    assert isinstance(reply, dict)
    if args.action == "show":
        record = reply.get("record")
        if not isinstance(record, dict):
            return f"{args.node}: no repair record (state {reply.get('state')})"
        tried = "; ".join(f"{r.get('rung')}: {r.get('result')}" for r in record.get("tried", [])
                          if isinstance(r, dict)) or "no rung tried yet"
        return (f"{args.node}: {record.get('class')} ({record.get('subject') or 'node'}), "
                f"state {reply.get('state')}, outcome {record.get('outcome') or 'open'}; "
                f"serial {record.get('serial') or '?'}; plan {', '.join(record.get('plan', []))}"
                f"; {tried}")
    node = reply.get("node", reply)
    assert isinstance(node, dict)
    state = node.get("state")
    if args.action == "start":
        return f"{args.node}: repair {reply.get('outcome')}: {reply.get('reason')}; state {state}"
    return f"{args.node}: repair {args.action} accepted; state {state}"


def cmd_repair_breaker(args: argparse.Namespace) -> int:
    client = api_client(args)
    if args.action == "reset":
        if not args.reason:
            raise UsageError("reset needs --reason")
        reply = client.post("/api/v1/health/breaker/reset", {"reason": args.reason})
    else:
        reply = client.get("/api/v1/health/breaker")
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    assert isinstance(reply, dict)
    if reply.get("tripped"):
        print(f"open since {reply.get('since')}: {reply.get('reason')}; held: "
              + (", ".join(str(n) for n in reply.get("held", [])) or "none"))
    else:
        print("closed: automatic repairs may start")
    return 0
