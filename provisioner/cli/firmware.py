"""``provisioner firmware``: the fleet's firmware drift and firmware waves (through the API).

    provisioner firmware drift [--profile P] [--rack R] [--domain D] [--status S] [--json]
    provisioner firmware wave start --profile P [--max-nodes N] [--max-domain-share F]
        [--max-rack-share F] [--stop-after-failures K] [--runbook R] [--json]
    provisioner firmware wave status [WAVE] [--json]     (no WAVE: every wave, newest first)
    provisioner firmware wave stop WAVE [--json]
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import API, add_group, api_client, api_options

if TYPE_CHECKING:
    from provisioner.cli.client import Json, Subcommands

_STATUSES = ("conforming", "drifted", "updating", "failed", "unknown")


def add_commands(sub: Subcommands) -> None:
    commands = add_group(sub, "firmware", "firmware drift against the baselines, and waves")
    drift = commands.add_parser(
        "drift", parents=[api_options()], allow_abbrev=False,
        help="each node's firmware against its profile's baseline: counts, drifted nodes")
    drift.add_argument("--profile", help="only this profile")
    drift.add_argument("--rack", help="only this rack")
    drift.add_argument("--domain", help="only this NVLink domain (clique)")
    drift.add_argument("--status", choices=_STATUSES, help="only nodes with this status")
    drift.add_argument("--json", action="store_true", help="the API's JSON")
    drift.set_defaults(command=cmd_drift)
    waves = commands.add_parser("wave", allow_abbrev=False, help="firmware waves")
    wave = waves.add_subparsers(dest="wave_command", metavar="COMMAND", required=True)
    start = wave.add_parser(
        "start", parents=[api_options()], allow_abbrev=False,
        help="bring a profile's drifted active nodes back to the baseline, a few at a time")
    start.add_argument("--profile", required=True)
    start.add_argument("--max-nodes", type=int, default=1, metavar="N",
                       help="nodes serviced at once (default 1)")
    start.add_argument("--max-domain-share", type=float, default=0.25, metavar="F",
                       help="of one NVLink domain at any moment (default 0.25; at least one)")
    start.add_argument("--max-rack-share", type=float, default=0.25, metavar="F",
                       help="of one rack at any moment (default 0.25; at least one)")
    start.add_argument("--stop-after-failures", type=int, default=1, metavar="K",
                       help="start no node once K of the wave's failed (default 1)")
    start.add_argument("--runbook", help="default: the profile's wave_runbook")
    start.add_argument("--json", action="store_true", help="the API's JSON")
    start.set_defaults(command=cmd_wave_start)
    status = wave.add_parser("status", parents=[api_options()], allow_abbrev=False,
                             help="a wave and its nodes; without WAVE, every wave")
    status.add_argument("wave", metavar="WAVE", nargs="?", help="the wave's id")
    status.add_argument("--json", action="store_true", help="the API's JSON")
    status.set_defaults(command=cmd_wave_status)
    stop = wave.add_parser("stop", parents=[api_options()], allow_abbrev=False,
                           help="start no more nodes (those being serviced finish)")
    stop.add_argument("wave", metavar="WAVE", help="the wave's id")
    stop.add_argument("--json", action="store_true", help="the API's JSON")
    stop.set_defaults(command=cmd_wave_stop)


def cmd_drift(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("profile", args.profile), ("rack", args.rack),
                                ("domain", args.domain), ("status", args.status)) if v}
    reply = api_client(args).get(f"{API}/firmware/drift", params)
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    assert isinstance(reply, dict)
    profiles = reply.get("profiles")
    rows = [[str(p)] + [str(c.get(s, 0)) for s in _STATUSES]
            for p, c in (profiles.items() if isinstance(profiles, dict) else [])
            if isinstance(c, dict)]
    if not rows:
        print("no node has a profile with a firmware, BIOS or BMC settings baseline")
        return 0
    print(formatting.table(["PROFILE", *(s.upper() for s in _STATUSES)], rows))
    drifted = [n for n in reply.get("drifted") or [] if isinstance(n, dict)]
    if drifted:
        print()
        print(formatting.table(["NODE", "PROFILE", "DOMAIN", "KIND", "COMPONENT", "HAVE",
                                "WANT"], [
            [str(n.get("name")), str(n.get("profile")), str(n.get("domain") or "-"),
             str(d.get("kind") or "firmware"), str(d.get("component")),
             str(d.get("have") or "(none)"), str(d.get("want"))]
            for n in drifted for d in n.get("differences") or [] if isinstance(d, dict)]))
    return 0


def cmd_wave_start(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {
        "profile": args.profile, "max_nodes": args.max_nodes,
        "max_domain_share": args.max_domain_share, "max_rack_share": args.max_rack_share,
        "stop_after_failures": args.stop_after_failures}
    if args.runbook:
        body["runbook"] = args.runbook
    return _show(args, api_client(args).post(f"{API}/firmware/waves", body))


def cmd_wave_status(args: argparse.Namespace) -> int:
    client = api_client(args)
    if args.wave:
        return _show(args, client.get(_wave_path(args.wave)))
    reply = client.get(f"{API}/firmware/waves")
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    assert isinstance(reply, dict)
    items = [w for w in reply.get("items") or [] if isinstance(w, dict)]
    print(formatting.table(["WAVE", "PROFILE", "STATUS", "NODES", "FAILURES", "REASON"], [
        [str(w.get("id")), str(w.get("profile")), str(w.get("status")),
         _counts(w.get("counts")), str(w.get("failures")), str(w.get("reason") or "")]
        for w in items]))
    return 0


def cmd_wave_stop(args: argparse.Namespace) -> int:
    return _show(args, api_client(args).post(_wave_path(args.wave) + "/stop"))


def _wave_path(wave: str) -> str:
    return f"{API}/firmware/waves/{urllib.parse.quote(wave, safe='')}"


def _counts(value: Json) -> str:
    if not isinstance(value, Mapping):
        return ""
    return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))


def _show(args: argparse.Namespace, reply: Json) -> int:
    if args.json:
        print(formatting.dump_json(reply))
        return 0
    assert isinstance(reply, dict)
    print(f"wave {reply.get('id')}: profile {reply.get('profile')}, runbook "
          f"{reply.get('runbook')}, {reply.get('status')}"
          + (f" ({reply.get('reason')})" if reply.get("reason") else ""))
    print(f"limits: {reply.get('max_nodes')} at once, {reply.get('max_domain_share')} of a "
          f"domain, {reply.get('max_rack_share')} of a rack, stop after "
          f"{reply.get('stop_after_failures')} failures; nodes: {_counts(reply.get('counts'))}")
    return 0
