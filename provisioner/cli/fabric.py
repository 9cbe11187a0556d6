"""``provisioner fabric judge``: saved outputs of the acceptance tools against a fabric class's
floors (offline: no daemon, no config).

    provisioner fabric judge --class CLASS [--tolerance F] FILE...
    provisioner fabric judge --list-classes
    provisioner fabric accept DOMAIN        (the daemon: rerun a held domain's acceptance)
    provisioner fabric acceptance DOMAIN    (the daemon: its last result, figure by figure)

Each FILE is nccl-tests stdout, ``nvbandwidth`` stdout, ``dcgmi diag -j`` JSON or an
``ib_write_bw`` report (``-`` reads stdin); the kind is recognised from the text. One line per
figure on stdout: ``<test> <figure> <value> floor <floor> PASS|FAIL <reason>``. Exit codes: 0
every figure passed, 1 some figure failed (an empty, cut or unrecognised output is a failed
figure), 2 a usage error or an unreadable file.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import API, UsageError, add_group, api_client, api_options

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

_MAX_FILE_BYTES = 64 * 1024 * 1024


def add_commands(sub: Subcommands) -> None:
    commands = add_group(sub, "fabric", "fabric acceptance (judge saved tool outputs)")
    judge = commands.add_parser(
        "judge", allow_abbrev=False,
        help="judge saved nccl-tests / nvbandwidth / dcgmi diag -j / ib_write_bw outputs "
             "against a fabric class's floors")
    judge.add_argument("--class", dest="fabric_class", metavar="CLASS",
                       help="the fabric class (see --list-classes)")
    judge.add_argument("--list-classes", action="store_true",
                       help="name the classes with their floors and sources")
    judge.add_argument("--tolerance", type=_fraction, metavar="F",
                       help="tolerance for every floor, 0 to 0.5 (default: the class's)")
    judge.add_argument("files", nargs="*", type=Path, metavar="FILE")
    judge.set_defaults(command=cmd_fabric_judge)

    api = api_options()
    accept = commands.add_parser(
        "accept", parents=[api], allow_abbrev=False,
        help="rerun a held domain's fabric acceptance after a repair (its validate_failed "
             "nodes are retried; the domain is accepted anew once all passed), or accept an "
             "active domain inside a Slurm maintenance reservation")
    accept.add_argument("domain", metavar="DOMAIN",
                        help="NVLink domain (ClusterUUID.CliqueId) or a lone node's hostname")
    accept.add_argument("--json", action="store_true", help="the API's JSON")
    accept.set_defaults(command=cmd_fabric_accept)
    show = commands.add_parser("acceptance", parents=[api], allow_abbrev=False,
                               help="a domain's last fabric acceptance, figure by figure")
    show.add_argument("domain", metavar="DOMAIN")
    show.add_argument("--json", action="store_true", help="the API's JSON")
    show.set_defaults(command=cmd_fabric_acceptance)


def _domain_path(domain: str) -> str:
    return f"{API}/fabric/domains/{urllib.parse.quote(domain, safe='')}/acceptance"


def cmd_fabric_accept(args: argparse.Namespace) -> int:
    reply = api_client(args).post(_domain_path(args.domain))
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    retried = reply.get("retried") or []
    if reply.get("reservation"):
        print(f"{args.domain}: accepting {', '.join(map(str, retried))} inside Slurm "
              f"reservation {reply['reservation']} (released on a pass; provisioner fabric "
              f"acceptance {args.domain})")
        return 0
    print(f"{args.domain}: retried {', '.join(map(str, retried))}; the domain's acceptance "
          f"runs again once they passed their own checks (provisioner fabric acceptance "
          f"{args.domain})")
    return 0


def cmd_fabric_acceptance(args: argparse.Namespace) -> int:
    """Exit 0 when the last run passed, 1 otherwise (running, failed, interrupted)."""
    reply = api_client(args).get(_domain_path(args.domain))
    if args.json:
        print(formatting.dump_json(reply))
        return 0 if reply.get("status") == "passed" else 1
    print(f"{reply.get('domain')} ({reply.get('fabric_class')}): {reply.get('status')} "
          f"run {reply.get('id')} started {reply.get('started_at')}")
    print(reply.get("summary"))
    for node in reply.get("results") or []:
        for figure in node.get("figures") or []:
            verdict = "PASS" if figure.get("passed") else "FAIL"
            print(f"{node.get('node')}: {figure.get('test')} {figure.get('figure')} "
                  f"{figure.get('value')} floor {figure.get('floor')} {verdict} "
                  f"{figure.get('reason')}")
    return 0 if reply.get("status") == "passed" else 1


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction such as 0.1, got {text!r}") from None
    if not 0 <= value <= 0.5:
        raise argparse.ArgumentTypeError(f"expected 0 to 0.5, got {text}")
    return value


def cmd_fabric_judge(args: argparse.Namespace) -> int:
    from provisioner.acceptance.classes import CLASSES
    from provisioner.acceptance.judge import judge_text, passed

    if args.list_classes:
        for cls in CLASSES.values():
            print(f"{cls.name}: {cls.description}")
            for label, floor in (("all_reduce busbw", cls.nccl_busbw),
                                 ("nvbandwidth host<->device", cls.nvbw_host),
                                 ("nvbandwidth GPU<->GPU", cls.nvbw_p2p),
                                 ("ib_write_bw average", cls.ib_bw)):
                if floor is not None:
                    print(f"  {label} >= {floor.text()} [{floor.source}]")
            if cls.algorithm:
                print(f"  all_reduce algorithm {cls.algorithm}")
            if cls.mndiag:
                print("  dcgmi mndiag over the domain: exit status 0 (where DCGM has it)")
        return 0
    if not args.fabric_class:
        raise UsageError("fabric judge: --class CLASS is required (or --list-classes)")
    if args.fabric_class not in CLASSES:
        raise UsageError(f"fabric judge: unknown class {args.fabric_class!r}; one of "
                         f"{', '.join(CLASSES)}")
    cls = CLASSES[args.fabric_class]
    if not args.files:
        raise UsageError("fabric judge: name at least one FILE")
    if args.tolerance is not None:
        cls = cls.with_tolerance(args.tolerance)
    figures = []
    for path in args.files:
        text = _read(path)
        for figure in judge_text(cls, text, path.name):
            print(f"{path}: {figure.line()}" if len(args.files) > 1 else figure.line())
            figures.append(figure)
    ok = passed(figures)
    print(f"{cls.name}: {'PASS' if ok else 'FAIL'} "
          f"({sum(not f.passed for f in figures)} of {len(figures)} figures failed)")
    return 0 if ok else 1


def _read(path: Path) -> str:
    try:
        if str(path) == "-":
            return sys.stdin.read(_MAX_FILE_BYTES)
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(_MAX_FILE_BYTES)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
