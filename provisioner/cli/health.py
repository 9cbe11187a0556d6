"""``provisioner health classify FILE...``: findings in saved evidence (local, no daemon, no
config): a kernel log or ``dmesg``, ``nvidia-smi -q``, ``ipmitool sel elist``, ``dcgmi diag``
or ``dcgmi health -c`` (text or ``-j``), ``ibstat``. One line per finding,
``<class>\\t<recommended action>\\t<evidence>``.

Exit status: 0 nothing found, 1 at least one finding, 2 a file that cannot be read or parsed
(the other files are still classified).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.cli.client import PROG, add_group
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
