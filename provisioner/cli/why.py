"""``provisioner node why NODE``: is the node schedulable, and if not, why. One line per check
(``ok``, ``blocking`` or ``unknown``, its name, its evidence, and what to do for one that
blocks), the daemon's ``GET /api/v1/nodes/{id}/why``; ``--json`` prints that answer.

Exit status: 0 schedulable, 3 not schedulable (a script can ask ``node why -q``), 1 an API
failure.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from provisioner.cli.client import Json, api_client, api_options, node_path

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

NOT_SCHEDULABLE = 3


def add_node_commands(node: Subcommands) -> None:
    why = node.add_parser("why", parents=[api_options()], allow_abbrev=False,
                          help="why the node is (not) schedulable, one line per check",
                          description="Exit 0: schedulable; 3: not schedulable.")
    why.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    why.add_argument("--json", action="store_true", help="the API's JSON")
    why.add_argument("-q", "--quiet", action="store_true",
                     help="print nothing: the exit status answers")
    why.set_defaults(command=cmd_node_why)


def cmd_node_why(args: argparse.Namespace) -> int:
    answer = api_client(args).get(node_path(args.node, "why"))
    if not isinstance(answer, dict):
        raise TypeError("the daemon's answer is not an object")
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    elif not args.quiet:
        print("\n".join(lines(answer)))
    return 0 if answer.get("schedulable") else NOT_SCHEDULABLE


def lines(answer: dict[str, Json]) -> list[str]:
    """``gpu-00 (3f2a…): not schedulable (first blocking: maintenance)``, then one line a
    check: ``blocking  maintenance  in maintenance: RMA 1234 — do: maintenance-off …``."""
    name = answer.get("hostname") or "-"
    first = answer.get("first_blocking")
    verdict = "schedulable" if answer.get("schedulable") else (
        f"not schedulable (first blocking: {first})")
    out = [f"{name} ({answer.get('id')}), {answer.get('state')}: {verdict}"]
    steps = answer.get("steps")
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        mark = "blocking" if step.get("blocking") else (
            "unknown" if step.get("status") == "unknown" else "ok")
        todo = f" -- do: {step['todo']}" if step.get("blocking") and step.get("todo") else ""
        text = f"{mark:<9}{step.get('key')!s:<12}{step.get('evidence')}{todo}"
        # evidence may quote what a machine sent: it cannot forge a second line
        out.append("".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text))
    return out
