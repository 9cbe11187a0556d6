"""``provisioner audit``: the fleet's history (who did what to which node, when), newest first,
filtered by ``--since``/``--until`` (ISO 8601, or an age: ``30m``, ``12h``, ``7d``),
``--actor`` (``token:*`` for every token), ``--event`` (repeat for any of several) and
``--node``; ``GET /api/v1/history``, following its pages up to ``--limit`` rows. ``--oldest``
lists oldest first; ``--after ID`` starts past a row (a script resumes from the last
``#ID`` it printed)."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from provisioner.cli.client import API, ApiClient, Json, ParamValue, api_client, api_options

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

_AGE: Final = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PAGE: Final = 500


def add_commands(sub: Subcommands) -> None:
    audit = sub.add_parser(
        "audit", parents=[api_options()], allow_abbrev=False,
        help="the fleet's history: who did what to which node, when (newest first)")
    audit.add_argument("--since", type=moment, metavar="WHEN",
                       help="at or after: ISO 8601 (2026-11-27T10:00Z) or an age (30m, 12h, 7d)")
    audit.add_argument("--until", type=moment, metavar="WHEN", help="before (same forms)")
    audit.add_argument("--actor", help="who: exact (token:alice, conductor) or a prefix*")
    audit.add_argument("--event", action="append", metavar="EVENT",
                       help="only this event (repeat for any of several)")
    audit.add_argument("--node", metavar="NODE", help="one node's (id or hostname)")
    audit.add_argument("--limit", type=_positive, default=100, metavar="N",
                       help="at most N rows (default 100)")
    audit.add_argument("--oldest", action="store_true", help="oldest first")
    audit.add_argument("--after", type=_positive, metavar="ID",
                       help="start past this row (its #ID), in the order listed")
    audit.add_argument("--json", action="store_true", help="one JSON object a line")
    audit.set_defaults(command=cmd_audit)


def moment(text: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (no offset: UTC) or an age before ``now``."""
    if match := _AGE.match(text.strip()):
        ago = timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])
        return (now or datetime.now(UTC)) - ago
    try:
        found = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time or an age such as 12h or 7d, got {text!r}") from None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number above 0, got {text!r}")
    return int(text)


def cmd_audit(args: argparse.Namespace) -> int:
    for row in rows(api_client(args), args):
        print(line(row, as_json=bool(args.json)), flush=True)
    return 0


def rows(api: ApiClient, args: argparse.Namespace) -> list[dict[str, Json]]:
    params: dict[str, ParamValue] = {
        "since": args.since.isoformat() if args.since else None,
        "until": args.until.isoformat() if args.until else None,
        "actor": args.actor, "event": args.event, "node": args.node,
        "order": "oldest" if args.oldest else "newest", "cursor": args.after}
    found: list[dict[str, Json]] = []
    while len(found) < args.limit:
        params["limit"] = min(PAGE, args.limit - len(found))
        page = api.get(f"{API}/history", params)
        if not isinstance(page, dict) or not isinstance(page.get("items"), list):
            raise TypeError("the daemon's answer is not a page of history")
        found += [item for item in page["items"] if isinstance(item, dict)]
        cursor = page.get("next_cursor")
        if not isinstance(cursor, int):
            break
        params["cursor"] = cursor
    return found


def line(row: dict[str, Json], *, as_json: bool) -> str:
    """``#57 2026-11-27T13:21:41 gpu-00 (3f2a…) maintenance_on (active) by token:alice:
    RMA 1234``."""
    if as_json:
        return json.dumps(row, sort_keys=True)
    before, state = row.get("from_state"), row.get("to_state")
    change = f"{before} --{row.get('event')}--> {state}" if before and before != state else (
        f"{row.get('event')} ({state})")
    reason = f": {row['reason']}" if row.get("reason") else ""
    text = (f"#{row.get('transition')} {str(row.get('at', ''))[:19]} "
            f"{row.get('hostname') or '-'} ({row.get('id')}) {change} by {row.get('actor')}"
            f"{reason}")
    # a reason may quote what a machine sent: it cannot forge a second line
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
