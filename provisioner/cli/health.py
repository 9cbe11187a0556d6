"""``provisioner health list`` and ``health silence NODE`` and ``node health NODE``: the
daemon's health findings through the API. ``provisioner health classify FILE...``: findings
in saved evidence (local, no daemon, no config): a kernel log or ``dmesg``,
``nvidia-smi -q``, ``ipmitool sel elist``, ``dcgmi diag`` or ``dcgmi health -c`` (text or
``-j``), ``ibstat``. One line per finding, ``<class>\\t<recommended action>\\t<evidence>``.

Exit status: 0 nothing found, 1 at least one finding, 2 a file that cannot be read or parsed
(the other files are still classified).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import (
    PROG,
    Json,
    ParamValue,
    UsageError,
    add_group,
    api_client,
    api_options,
    node_path,
)
from provisioner.errors import InvalidRequest
from provisioner.health.classify import classify

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands


def add_commands(sub: Subcommands) -> None:
    group = add_group(sub, "health", "health findings from saved evidence (local)")
    parser = group.add_parser(
        "classify", allow_abbrev=False,
        help="classify saved tool output: kernel log, nvidia-smi -q, SEL, dcgmi, ibstat",
        description="Print one line per finding: <class> TAB <recommended action> TAB "
                    "<evidence>. Exit 0: nothing found; 1: findings; 2: unreadable input.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="saved output ('-': stdin)")
    parser.set_defaults(command=cmd_health_classify)

    api = api_options()
    ls = group.add_parser("list", parents=[api], allow_abbrev=False,
                          help="the fleet's open findings (the daemon's)")
    ls.add_argument("--class", dest="cls", metavar="CLASS", help="only this class")
    ls.add_argument("--origin", help="bmc, in-band, slurm, kubernetes, external, alertmanager")
    ls.add_argument("--node", help="only this node (id, hostname, serial or MAC)")
    ls.add_argument("--all", action="store_true", help="cleared findings too")
    ls.add_argument("--limit", type=int, default=100)
    ls.add_argument("--json", action="store_true", help="the API's JSON")
    ls.set_defaults(command=cmd_health_list)

    silence = group.add_parser("silence", parents=[api], allow_abbrev=False,
                               help="silence a class of findings (or one finding) on a node")
    silence.add_argument("node", metavar="NODE")
    target = silence.add_mutually_exclusive_group(required=True)
    target.add_argument("--class", dest="cls", metavar="CLASS")
    target.add_argument("--finding", type=int, metavar="ID")
    silence.add_argument("--for", dest="duration", required=True, metavar="DURATION",
                         help="e.g. 90m, 2h, 3d (or seconds)")
    silence.add_argument("--reason", required=True)
    silence.add_argument("--json", action="store_true", help="the API's JSON")
    silence.set_defaults(command=cmd_health_silence)


def add_node_commands(node: Subcommands) -> None:
    """Under the ``node`` group: ``health NODE``."""
    parser = node.add_parser("health", parents=[api_options()], allow_abbrev=False,
                             help="a node's health findings")
    parser.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    parser.add_argument("--all", action="store_true", help="cleared findings too")
    parser.add_argument("--json", action="store_true", help="the API's JSON")
    parser.set_defaults(command=cmd_node_health)


HEADERS = ("ID", "NODE", "CLASS", "ACTION", "ORIGIN", "SUBJECT", "LAST SEEN", "COUNT", "STATE",
           "EVIDENCE")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> int:
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    if not number.isdigit():
        raise UsageError(f"--for {text!r}: a number with s, m, h or d (90m, 2h, 3d)")
    return int(number) * _UNITS[unit]


def findings_table(items: list[Json]) -> str:
    rows = []
    for item in items:
        if not isinstance(item, dict):
            continue
        state = "open" if item.get("open") else "cleared"
        if item.get("silenced"):
            state = f"silenced until {formatting.timestamp(item.get('silenced_until'))}"
        rows.append([formatting.text(item.get(key)) for key in (
            "id", "hostname", "class", "action", "origin", "subject")]
            + [formatting.timestamp(item.get("last_seen")), formatting.text(item.get("count")),
               state, formatting.text(item.get("evidence"))])
    return formatting.table(HEADERS, rows)


def _show(reply: Json, as_json: bool) -> int:
    items = reply.get("items", []) if isinstance(reply, dict) else []
    print(formatting.dump_json(reply) if as_json else findings_table(items))
    return 0


def cmd_health_list(args: argparse.Namespace) -> int:
    params: dict[str, ParamValue] = {"limit": args.limit}
    for name, value in (("class", args.cls), ("origin", args.origin), ("node", args.node)):
        if value:
            params[name] = value
    if args.all:
        params["all"] = "true"
    return _show(api_client(args).get("/api/v1/health/findings", params), args.json)


def cmd_node_health(args: argparse.Namespace) -> int:
    params = {"all": "true"} if args.all else None
    return _show(api_client(args).get(node_path(args.node, "health"), params), args.json)


def cmd_health_silence(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {"duration_s": duration_s(args.duration), "reason": args.reason}
    if args.cls:
        body["class"] = args.cls
    else:
        body["finding_id"] = args.finding
    reply = api_client(args).post(node_path(args.node, "health", "silence"), body)
    if args.json or not isinstance(reply, dict):
        print(formatting.dump_json(reply))
        return 0
    items = reply.get("items")
    print(f"{args.node}: silenced until {formatting.timestamp(reply.get('silenced_until'))} "
          f"({len(items) if isinstance(items, list) else 0} findings now)")
    return 0


def cmd_health_classify(args: argparse.Namespace) -> int:
    found = unreadable = False
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            findings = classify(text)
        except (OSError, UnicodeDecodeError, InvalidRequest) as exc:
            print(f"{PROG}: {name}: {exc}", file=sys.stderr)
            unreadable = True
            continue
        for finding in findings:
            print(finding.line())
        found = found or bool(findings)
    return 2 if unreadable else 1 if found else 0
