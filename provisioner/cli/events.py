"""``provisioner events``: the fleet's transitions, one line each, from every daemon.

Each line starts with the transition's fleet-wide id: ``--since ID`` prints what came after
it (a script resumes where it stopped), ``--follow`` keeps printing as the fleet changes and,
when the connection drops (a daemon restarts), reconnects with ``Last-Event-ID`` so that no
transition is missed or printed twice. Without ``--since`` it starts with the newest
``--last`` transitions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from provisioner.cli.client import API, ApiError, Json, api_client, api_options

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

RECONNECT_S = 2.0


def add_commands(sub: Subcommands) -> None:
    events = sub.add_parser(
        "events", parents=[api_options()], allow_abbrev=False,
        help="the fleet's transitions, one line each (--follow to watch, --since to resume)")
    events.add_argument("--since", type=_whole, metavar="ID",
                        help="only transitions after this id (the first column)")
    events.add_argument("--last", type=_whole, default=20, metavar="N",
                        help="without --since: start with the newest N (default 20)")
    events.add_argument("--node", metavar="NODE", help="one node's (id or hostname)")
    events.add_argument("-f", "--follow", action="store_true",
                        help="keep printing as transitions happen (Ctrl-C stops)")
    events.add_argument("--json", action="store_true", help="one JSON object a line")
    events.set_defaults(command=cmd_events)


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def cmd_events(args: argparse.Namespace) -> int:
    api = api_client(args)
    if args.follow:
        api.timeout_s = max(api.timeout_s, 60.0)  # the server sends a keep-alive every 15 s
    since: int | None = args.since
    params: dict[str, str | int | bool | None] = {
        "node": args.node, "follow": bool(args.follow),
        "last": args.last if since is None else None}
    while True:
        try:
            for frame in api.events(f"{API}/events", params, last_event_id=since):
                if frame.event == "dropped":
                    raise ApiError(0, "the daemon dropped this stream (too slow)")
                if frame.event != "transition" or frame.id is None:
                    continue
                print(_line(json.loads(frame.data), as_json=bool(args.json)), flush=True)
                since = frame.id
        except ApiError as exc:
            if not args.follow or exc.status:
                raise
            print(f"provisioner: {exc}; reconnecting", file=sys.stderr)
            time.sleep(RECONNECT_S)
        else:
            if not args.follow:
                return 0
            time.sleep(RECONNECT_S)  # the daemon ended the stream (it stops): resume
        params["last"] = None  # from now on: after the last one printed


def _line(event: Json, *, as_json: bool) -> str:
    """``#57 2026-11-27T13:21:41 gpu-00 (3f2a…) enrolled --inspect--> inspecting by policy:
    auto_inspect [daemon-a]``."""
    if as_json:
        return json.dumps(event, sort_keys=True)
    name = event.get("hostname") or "-"
    at = str(event.get("at", ""))[:19]
    before, state, what = event.get("before"), event.get("state"), event.get("event")
    change = f"{before} --{what}--> {state}" if before and before != state else (
        f"{what} ({state})")
    reason = f": {event['reason']}" if event.get("reason") else ""
    instance = f" [{event['instance']}]" if event.get("instance") else ""
    text = (f"#{event.get('transition')} {at} {name} ({event.get('id')}) {change} "
            f"by {event.get('actor')}{reason}{instance}")
    # a reason may quote what a machine sent: it cannot forge a second line
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
